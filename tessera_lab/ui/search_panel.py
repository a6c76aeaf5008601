"""The layout-search panel (notebook 11).

It runs :func:`tessera_lab.plan.search.search` (the search of ``tessera-lab search``, docs/search.md) on every
layout it enumerates, with a planning budget (``max_plans``) small enough to answer a change in seconds, said in
its caption (the planning panels' "suggest a layout that fits" is :mod:`tessera_lab.ui.suggest`). The chosen
layout's timeline is the planner's simulation of the partition the search planned (its boundaries scored
again, not re-solved), so its iteration is the table's. ipywidgets and matplotlib are imported inside the builders.
"""

from __future__ import annotations

import textwrap
import time
from typing import Any

from tessera_lab.errors import TooFewGPUsError
from tessera_lab.plan.search import DEFAULT_GLOBAL_SEQUENCES, DEFAULT_MAX_PLANS, Candidate, SearchResult
from tessera_lab.ui.panel import LABEL_STYLE, Action, View, panel

#: full planner runs the panel allows per search by default (the CLI's ``--max-plans`` default is
#: :data:`~tessera_lab.plan.search.DEFAULT_MAX_PLANS`); the caption says how many layouts the budget left
PANEL_MAX_PLANS = 48
#: the budgets the panel offers
BUDGETS = (16, 48, 96, DEFAULT_MAX_PLANS)
#: layouts the table lists (the search keeps this many exact: its ``top``)
TOP = 10
#: GPU counts the panel offers per NVLink domain size: on 8-GPU nodes half a node (a 4-GPU workstation) and whole
#: nodes; on 72-GPU NVL72 racks a compute tray's 4 GPUs, part of a rack in 8-GPU steps, and whole racks
GPU_COUNTS = {8: (4, 8, 16, 32, 64, 128, 256, 512, 1024), 72: (4, 8, 16, 32, 64, 72, 144, 288, 576, 1152)}


def gpu_counts(gpu: str) -> list[int]:
    """GPU counts the panel offers for ``gpu``, all of which the search accepts: :data:`GPU_COUNTS` by the NVLink
    domain's size (else 1 to 16 domains)."""
    from tessera_lab.model.hardware import GPUSpec

    node = GPUSpec.named(gpu).nvlink_domain
    return list(GPU_COUNTS.get(node, tuple(node * k for k in (1, 2, 4, 8, 16))))


def layout_search(model: str, gpus: int, *, gpu: str = "H200", seq_len: int = 4096,
                  attention_ratio: int | None = None, expert_width: int | None = None, top_k: int | None = None,
                  max_plans: int = PANEL_MAX_PLANS, top: int = TOP) -> SearchResult:
    """:func:`tessera_lab.plan.search.search` of a variant of a shipped model (pure function behind the panel):
    ``gpus`` GPUs of type ``gpu``, the CLI's default global batch (1,024 sequences of ``seq_len`` tokens),
    at most ``max_plans`` full planner runs, the ``top`` best kept exact.

    Raises:
        ConfigError: a bad knob value (:meth:`ModelSpec.with_changes`) or what :func:`search` refuses (GPUs not
            a count :func:`~tessera_lab.plan.search_space.gpu_count_ok` refuses, too few for the model's parameters).
    """
    from tessera_lab.plan.search import search
    from tessera_lab.ui.widgets import model_variant

    spec = model_variant(model, attention_ratio=attention_ratio, expert_width=expert_width, top_k=top_k)
    return search(spec, gpus, gpu=gpu, seq_len=seq_len, top=top, max_plans=max_plans)


def top_table(res: SearchResult, k: int = TOP, shown: int | None = None):
    """The ``k`` fastest planned layouts that fit, fastest first, as a DataFrame indexed by rank (``#``): layout
    columns (:meth:`~tessera_lab.plan.search_space.Layout.columns`, as ``tessera-lab search`` prints them) and the
    planner's tokens/s, iteration (s), MFU (%), bubble (%), peak memory and headroom (GiB); with ``shown``, a
    ``timeline`` column marks that rank's row (the layout drawn under the table)."""
    import pandas as pd

    from tessera_lab.plan.search_export import schedule_label

    moe = getattr(res, "moe", True)
    rows = []
    for i, c in enumerate(res.ranked[:k], start=1):
        r = c.result
        cols = c.layout.columns(moe)
        cols["schedule"] = schedule_label(c.layout.schedule)  # marked as tessera-lab search marks it
        # spaces let the cell wrap (selective(layernorm,moe_act,shared_experts) pushed the table past the panel)
        cols["recompute"] = str(cols["recompute"]).replace("(", " (").replace(",", ", ")
        cols["m x mbs"] = str(cols["m x mbs"]).replace(" ", "\u00a0")  # "16 x 4" on one line (it wrapped after "x")
        rows.append({"#": i, **({"timeline": "drawn" if i == shown else ""} if shown else {}), **cols,
                     "tokens/s": r["tokens_per_s"], "iteration (s)": r["iteration_time_s"], "MFU (%)": 100 * r["mfu"],
                     "bubble (%)": 100 * r["bubble_fraction"], "peak (GiB)": r["peak_memory_gib"],
                     "headroom (GiB)": r["headroom_gib"]})
    return pd.DataFrame(rows).set_index("#") if rows else pd.DataFrame()


def pp_ep_grid(res: SearchResult):
    """Tokens/s of the best planned layout that fits per (pp, ep), over every other choice (TP, DP, VPP,
    micro-batching, schedule, recompute, dispatcher): a DataFrame with pp as rows and ep as columns; NaN where
    no layout of that pp and ep was planned and fits (pruned by memory or by the time bound, left at the budget,
    or over memory)."""
    import pandas as pd

    best: dict[tuple[int, int], float] = {}
    for c in res.ranked:
        key = (c.layout.pp, c.layout.ep)
        best[key] = max(best.get(key, 0.0), c.result["tokens_per_s"])
    pps = sorted({c.layout.pp for c in res.planned})
    eps = sorted({c.layout.ep for c in res.planned})
    grid = pd.DataFrame([[best.get((p, e), float("nan")) for e in eps] for p in pps], index=pps, columns=eps,
                        dtype=float)
    grid.index.name, grid.columns.name = "pp", "ep"
    return grid


def layout_plan(res: SearchResult, cand: Candidate, spec=None):
    """The planner's :class:`~tessera_lab.plan.make.Plan` of a planned candidate's partition: its boundaries
    scored and simulated again (``make_plan(method="uniform", boundaries=...)``, no solver), so the timeline is
    the one the search's row describes. ``spec``: the searched model (default: the shipped model named
    ``res.model``)."""
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import make_plan
    from tessera_lab.plan.search import search_cluster

    spec = spec or load_model(res.model)
    cluster = search_cluster(res.gpu, res.gpus)
    return make_plan(spec, cand.layout.parallel(res.seq_len), cluster, method="uniform", baselines=(),
                     boundaries=cand.result["boundaries"])


def search_heatmap(grid, chosen: tuple[int, int] | None = None, ax=None, title: str | None = None):
    """Seaborn heatmap of :func:`pp_ep_grid` (tokens/s in thousands, annotated; blank where nothing was
    planned); ``chosen`` (pp, ep) is outlined. Returns the Axes."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(2.6 + 0.9 * max(1, grid.shape[1]), 1.3 + 0.45 * max(1, grid.shape[0])),
                             layout="constrained", facecolor="white")
    from matplotlib.ticker import StrMethodFormatter

    # the colour bar's ticks written out like the cells (no "1e6" offset above it, where it met the title)
    sns.heatmap(grid / 1e3, annot=True, fmt=",.0f", cmap="viridis", mask=grid.isna(), ax=ax, linewidths=0.5,
                linecolor="white", cbar_kws={"label": "tokens/s (thousands)", "format": StrMethodFormatter("{x:,.0f}")},
                annot_kws={"fontsize": 8})
    ax.set_facecolor("#eeeeee")  # cells with no planned layout that fits
    ax.tick_params(axis="y", rotation=0)
    if chosen is not None and chosen[0] in grid.index and chosen[1] in grid.columns:
        ax.add_patch(Rectangle((list(grid.columns).index(chosen[1]), list(grid.index).index(chosen[0])), 1, 1,
                               fill=False, edgecolor="crimson", linewidth=2.5))
    ax.set_title(title or "best tokens/s per (pp, ep) over the other choices\n(grey: none planned that fits)",
                 fontsize=9)  # two lines: one is wider than a small grid's figure
    return ax


def search_caption(res: SearchResult, budget: int, seconds: float, cpu: float, reused: bool) -> str:
    """What the panel searched and how: model, GPUs, sequence, global batch, the counts per pruning rule, the
    planning budget (against the CLI's default) and the wall and CPU seconds of the last change (measured)."""
    from tessera_lab.cost.source import analytic_source
    from tessera_lab.ui.panel import CAPTION_SEP

    pr = res.pruned
    unplanned = pr.get("budget", 0)
    left = (f"{unplanned:,} left unplanned at the budget (time bounds from {res.unplanned_bound_s:.3f} s)"
            if unplanned else "none left at the budget")
    when = "search reused (same settings), layout re-simulated" if reused else "searched"
    return CAPTION_SEP.join([
        f"simulated, costs {analytic_source().describe()}",
        f"search of {res.model} on {res.gpus} {res.gpu}", f"sequence {res.seq_len:,}",
        f"global batch {res.global_batch:,} sequences", f"{res.enumerated:,} layouts enumerated",
        f"pruned {pr.get('memory (parameter state)', 0) + pr.get('memory', 0):,} by memory, {pr.get('bound', 0):,} "
        "by the time bound",
        f"{len(res.planned)} planned: panel budget {budget} plans (tessera-lab search: {DEFAULT_MAX_PLANS}; planned "
        "in batches of up to 8, up to 7 more)",
        left, f"{when} in {seconds:.2f} s wall, {cpu:.2f} s CPU (measured)"])


def _search_controls(model: str, gpu: str, gpus: int, seq_len: int, max_plans: int) -> dict[str, Any]:
    import ipywidgets as w

    from tessera_lab.model.spec import load_model, shipped_models
    from tessera_lab.ui.widgets import GPU_CHOICES, SEQ_CHOICES, _knob_options, _with, model_knobs

    spec = load_model(model)
    controls = {
        "model": w.Dropdown(options=_with(tuple(shipped_models()), model), value=model, description="model"),
        "gpu": w.Dropdown(options=_with(GPU_CHOICES, gpu), value=gpu, description="GPU"),
        "gpus": w.Dropdown(options=_with(tuple(gpu_counts(gpu)), gpus), value=gpus, description="GPUs"),
        "seq_len": w.Dropdown(options=_with(SEQ_CHOICES, seq_len), value=seq_len, description="sequence"),
        "attention_ratio": w.Dropdown(options=_knob_options(spec, "attention_ratio"), value="config",
                                      description="attn ratio"),
        "expert_width": w.Dropdown(options=_knob_options(spec, "expert_width"), value="config",
                                   description="expert width"),
        "top_k": w.Dropdown(options=_knob_options(spec, "top_k"), value="config", description="top-k"),
        "max_plans": w.Dropdown(options=_with(BUDGETS, max_plans), value=max_plans, description="planning budget"),
        "show": w.Dropdown(options=[(f"#{i}", i) for i in range(1, TOP + 1)], value=1, description="timeline of"),
    }
    for name, on in model_knobs(spec).items():
        controls[name].layout.display = None if on else "none"
    for c in controls.values():
        c.style.description_width = LABEL_STYLE["description_width"]
    return controls


def search_panel(model: str = "qwen3-next-80b-a3b", *, gpu: str = "H200", gpus: int = 64, seq_len: int = 4096,
                 max_plans: int = PANEL_MAX_PLANS):
    """Notebook 11's panel: model, GPU type, GPU count, sequence length, the model knobs that apply (attention
    ratio, expert width, top-k; "config" is the model's own), the planning budget and which of the top layouts
    to draw. Shows the top layouts (:func:`top_table`), a heatmap of tokens/s over (pp, ep) (:func:`pp_ep_grid`)
    and the chosen layout's timeline (:func:`layout_plan`).

    Where the search refuses the GPU count as too few for the model's memory, or no planned layout fits, a button
    searches again on the GPU count the refusal names (added to the GPUs list when it is not there).

    Returns:
        ``(panel, controls, state)`` (:func:`~tessera_lab.ui.panel.panel`); ``state`` holds ``result`` (the
        :class:`SearchResult`), ``plan`` (the chosen layout's Plan), ``table``, ``grid``, ``seconds``,
        ``cpu_seconds`` and ``caption``, or ``error``.

    Raises:
        ConfigError: ``gpu`` unknown (:meth:`GPUSpec.named`), before anything is built.
    """
    from tessera_lab.model.spec import load_model
    from tessera_lab.ui.widgets import _knob_options, model_knobs

    controls = _search_controls(model, gpu, gpus, seq_len, max_plans)
    cache: dict[tuple, SearchResult] = {}
    refused: dict[str, int | None] = {}  # the GPU count the last refusal named (TooFewGPUsError.needed)

    def on_change(name: str) -> None:
        if name == "gpu":  # the counts offered for the new GPU, and the current one: the search takes the same
            # counts on every GPU type (gpu_count_ok: gpu_step is 8 on nodes of 8 and on NVL72 racks alike)
            old = controls["gpus"].value
            controls["gpus"].options = sorted({*gpu_counts(controls["gpu"].value), old})
            controls["gpus"].value = old
        if name == "model":
            spec = load_model(controls["model"].value)
            for knob, on in model_knobs(spec).items():
                controls[knob].options = _knob_options(spec, knob)
                controls[knob].value = "config"
                controls[knob].layout.display = None if on else "none"
        if name != "show":
            controls["show"].value = 1

    def compute(v: dict[str, Any]) -> dict[str, Any]:
        t0, c0 = time.perf_counter(), time.process_time()
        knobs = {k: None if v[k] == "config" else v[k] for k in ("attention_ratio", "expert_width", "top_k")}
        key = (v["model"], v["gpu"], v["gpus"], v["seq_len"], v["max_plans"], tuple(knobs.values()))
        reused = key in cache
        refused.clear()
        try:  # too few GPUs for the parameter state, or no planned layout fits: the count that could
            if not reused:
                res = layout_search(v["model"], v["gpus"], gpu=v["gpu"], seq_len=v["seq_len"],
                                    max_plans=v["max_plans"], **knobs)
                cache.clear()  # one search kept: the settings of the last change
                cache[key] = res
            return _search_state(cache[key], v, knobs, (t0, c0, reused))
        except TooFewGPUsError as exc:
            refused["needed"] = exc.needed
            raise

    def render(s: dict[str, Any]) -> View:
        return View(s["table"], s["figures"], s["notes"], s["info"])

    more = _refusal_action(controls, refused)
    return panel(controls, compute, render,
                 rows=[["model", "gpu", "gpus", "seq_len"], ["attention_ratio", "expert_width", "top_k"],
                       ["max_plans", "show"]],
                 state_key=None, error_prefix="cannot search", caption=lambda s: s["caption"], on_change=on_change,
                 actions=[more])


def _refusal_action(controls: dict[str, Any], refused: dict[str, int | None]) -> Action:
    """The panel's button for a refusal that names a GPU count (``refused["needed"]``, set by its compute): adds the
    count to the GPUs list where it is not there, selects it and searches again."""
    def use_needed(values: dict[str, Any]) -> tuple[dict[str, Any], str]:
        n = refused["needed"]
        if n not in controls["gpus"].options:
            controls["gpus"].options = tuple(sorted({*controls["gpus"].options, n}))
        return {"gpus": n}, (f"GPUs {values['gpus']} -> {n}: the count the refusal named, where some layout passes "
                             "both memory bounds (computed; the planner may need more)")

    return Action("search on the GPUs the refusal names", use_needed,
                  when=lambda s: "error" in s and refused.get("needed") is not None, busy="searching")


def _search_state(res: SearchResult, v: dict[str, Any], knobs: dict[str, Any], timing: tuple) -> dict[str, Any]:
    """The panel's state for one search result: table, grid, the chosen layout's plan, figures, notes, caption."""
    from tessera_lab.ui.plots import gantt
    from tessera_lab.ui.widgets import model_variant

    t0, c0, reused = timing
    grid = pp_ep_grid(res)
    notes, info = [], []
    if not res.ranked:
        n = res.fewest_fitting_gpus
        more = (f"more GPUs ({n}: the next count at which some layout passes both memory bounds, computed)"
                if n else "more GPUs")
        budget = " or a larger budget" if res.pruned.get("budget") else ""
        raise TooFewGPUsError(f"no planned layout of {res.model} on {res.gpus} {res.gpu} fits memory "
                              f"({len(res.planned)} planned); allowed: {more}, a shorter sequence{budget}", n)
    show = min(v["show"], len(res.ranked))  # fewer layouts fit than the one asked for: the last that fits
    table = top_table(res, shown=show)
    cand = res.ranked[show - 1]
    plan = layout_plan(res, cand, model_variant(v["model"], **knobs))
    from tessera_lab.report.headline import mfu_text
    from tessera_lab.ui.widgets import plan_notes

    mfu = mfu_text(plan.chosen.mfu, moe=plan.model.has_moe, model=plan.model, gpu=plan.cluster.gpu.name,
                   precision=plan.parallel.precision)
    notes[:0] = plan_notes(plan)  # the same validity notes as the planning panels (MFU above the published band)
    info.append(f"MFU of #{show} (simulated): {mfu}")
    info.append(f"global batch: {res.global_batch:,} sequences of {res.seq_len:,} tokens = "
                f"{res.global_batch * res.seq_len:,} tokens per iteration (tessera-lab search's default; its "
                "--global-batch-tokens sets another), so the iteration grows with the sequence length")
    from tessera_lab.plan.search_export import MEGATRON_SCHEDULES, selective_note

    if any(c.layout.schedule not in MEGATRON_SCHEDULES for c in res.ranked[:TOP]):
        info.append("table: (†) marks a zero-bubble schedule Megatron-Core does not run (this project's simulator "
                    "and runner do)")
    if sel := selective_note([c.layout for c in res.ranked[:TOP]], getattr(res, "moe", True)):
        info.append(f"table: {sel}")
    if getattr(res, "moe", True):
        info.append("table: dp counts the replicas of one EP group (GPUs = tp x cp x pp x ep x dp, TP counted once "
                    "when EP spans it: ep N*); DP (Megatron) is GPUs / (tp x cp x pp), what --data-parallel-size "
                    "means to Megatron")
    if res.pruned.get("budget"):  # a caveat only where an unplanned layout's bound is below #1 (the CLI's "not proven")
        bound, first = res.unplanned_bound_s, res.ranked[0].result["iteration_time_s"]
        text = (f"planning budget {v['max_plans']} of {DEFAULT_MAX_PLANS} (tessera-lab search's default): "
                f"{res.pruned['budget']:,} layouts left unplanned, ")
        if bound is not None and bound < first:
            larger = ("a larger budget may find faster ones" if v["max_plans"] < max(BUDGETS) else
                      "`tessera-lab search --max-plans N` plans more than the panel's largest budget")
            notes.append(text + f"with time bounds from {bound:.3f} s, below #1's {first:.3f} s (a bound, not a "
                         f"plan): {larger}")
        else:
            info.append(text + "none of which can beat #1 (their time bounds are not below it)")
    head = f"#{show}: {cand.layout.text(plan.model.has_moe)}: iteration {plan.chosen.iteration_time_s:.3f} s (simulated)"
    figs = [search_heatmap(grid, (cand.layout.pp, cand.layout.ep)),
            gantt(plan.chosen.timeline, title=textwrap.fill(head, 90))]
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    caption = search_caption(res, v["max_plans"], seconds, cpu, reused)
    return {"result": res, "plan": plan, "table": table, "grid": grid, "figures": figs, "notes": notes, "info": info,
            "seconds": seconds, "cpu_seconds": cpu, "caption": caption, "shown": show}


__all__ = ["layout_search", "top_table", "pp_ep_grid", "layout_plan", "search_heatmap", "search_panel",
           "gpu_counts", "PANEL_MAX_PLANS"]
