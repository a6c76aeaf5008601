"""Widget panels of the teaching notebooks (01 collectives, 02 TP vs PP, 03 bubbles, 04 MoE all-to-all, 05 overlap).

Each is :func:`tessera_lab.ui.panel.panel` over one pure, tested function: ``compute`` calls it, ``render``
returns a :class:`~tessera_lab.ui.panel.View` (table, figure, validity notes). Every panel returns
``(panel, controls, state)``; set ``controls[name].value`` to recompute, read ``state``. ipywidgets and matplotlib
are imported inside the builders.
"""

from __future__ import annotations

from typing import Any, Sequence

from tessera_lab.teach.collectives import collective_cost_table
from tessera_lab.teach.figures import _style, plot_cost_bars, plot_moe
from tessera_lab.teach.moe import AllToAllVolumes, moe_all_to_all
from tessera_lab.teach.tp_pp import TpPpVolumes, _as_model, tp_vs_pp_volumes
from tessera_lab.ui.panel import GPU_CHOICES, LABEL_STYLE, View, panel


def collective_cost_panel(n: int = 8, gpu: str = "H100", message_mib: float = 64.0, *, show_figure: bool = True):
    """Notebook 01's panel: a message-size slider (1 KiB to 4 GiB), the group size and the GPU.
    ``state["table"]`` holds the latest :func:`~tessera_lab.teach.collectives.collective_cost_table`."""
    import ipywidgets as w

    controls = {
        "message_mib": w.FloatLogSlider(value=message_mib, base=2, min=-10, max=12, step=0.5,
                                        description="S (MiB)", style=LABEL_STYLE, continuous_update=False,
                                        readout_format=".4g"),
        "n": w.IntSlider(value=n, min=2, max=64, description="ranks n", style=LABEL_STYLE,
                         continuous_update=False),
        "gpu": w.Dropdown(options=list(GPU_CHOICES), value=gpu, description="GPU", style=LABEL_STYLE),
    }

    def compute(v: dict[str, Any]):
        return collective_cost_table(v["message_mib"] * 2**20, v["n"], v["gpu"])

    def render(table) -> View:
        fig = plot_cost_bars(table, title=f"S = {controls['message_mib'].value:.4g} MiB, "
                                          f"n = {controls['n'].value}, {controls['gpu'].value}") if show_figure else None
        return View(table[["formula", "factor", "NVLink (us)", "InfiniBand (us)", "IB / NVLink"]], fig)

    return panel(controls, compute, render, state_key="table")


def tp_pp_panel(model: str = "qwen3-8b", tp: int = 8, pp: int = 4, seq_len: int = 4096, gpu: str = "H100", *,
                show_figure: bool = True):
    """Notebook 02's panel: tp, pp, sequence length and GPU; :func:`~tessera_lab.teach.tp_pp.tp_vs_pp_volumes` as a
    table and a bar chart of the communication time per stage and micro-batch. ``state["result"]`` holds it."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    spec = _as_model(model)
    pps = sorted({p for p in (1, 2, 4, 8, 16, pp) if p <= spec.num_layers})
    controls = {
        "tp": w.Dropdown(options=sorted({1, 2, 4, 8, 16, 32, tp}), value=tp, description="tp", style=LABEL_STYLE),
        "pp": w.Dropdown(options=pps, value=pp, description="pp", style=LABEL_STYLE),
        "seq_len": w.Dropdown(options=sorted({1024, 2048, 4096, 8192, 16384, seq_len}), value=seq_len,
                              description="seq len", style=LABEL_STYLE),
        "gpu": w.Dropdown(options=list(GPU_CHOICES), value=gpu, description="GPU", style=LABEL_STYLE),
    }

    def compute(v: dict[str, Any]) -> TpPpVolumes:
        return tp_vs_pp_volumes(spec, v["tp"], v["pp"], seq_len=v["seq_len"], gpu=v["gpu"])

    def render(res: TpPpVolumes) -> View:
        table = pd.Series(res.summary(), name=f"tp={res.tp}, pp={res.pp} on {res.nodes} node(s)").to_frame()
        if not show_figure:
            return View(table)
        frame = res.frame().reset_index()
        with _style():
            fig, ax = plt.subplots(figsize=(8, 3), facecolor="white", layout="constrained")
            sns.barplot(data=frame, y="communication", x="time per stage per micro-batch (ms)",
                        hue="parallelism", palette="colorblind", ax=ax)
            ax.axvline(res.compute_per_stage_s * 1e3, color="grey", linestyle="--", label="compute per stage")
            ax.legend(fontsize=8)
            ax.set_ylabel("")
        return View(table, fig)

    return panel(controls, compute, render)


def moe_panel(model: str = "qwen3-30b-a3b", ep: int = 8, top_k: int | None = None, skew: float = 1.0,
              tokens_per_rank: int = 4096, *, seed: int = 0, jitter: float | None = None, show_figure: bool = True):
    """Notebook 04's panel: top-k, EP size and routing skew; :func:`~tessera_lab.teach.moe.moe_all_to_all` as a
    table and :func:`~tessera_lab.teach.figures.plot_moe`. ``state["result"]`` holds the AllToAllVolumes."""
    import ipywidgets as w
    import pandas as pd

    spec = _as_model(model)
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if spec.moe.num_experts % e == 0]
    controls = {
        "top_k": w.IntSlider(value=top_k or spec.moe.num_experts_per_tok, min=1, max=min(spec.moe.num_experts, 32),
                             description="top-k", style=LABEL_STYLE, continuous_update=False),
        "ep": w.Dropdown(options=sorted(set(eps) | {ep}), value=ep, description="ep", style=LABEL_STYLE),
        "skew": w.FloatSlider(value=skew, min=0.0, max=2.0, step=0.1, description="skew", style=LABEL_STYLE,
                              continuous_update=False),
    }

    def compute(v: dict[str, Any]) -> AllToAllVolumes:
        return moe_all_to_all(spec, ep=v["ep"], top_k=v["top_k"], skew=v["skew"], tokens_per_rank=tokens_per_rank,
                              seed=seed, jitter=jitter)

    def render(res: AllToAllVolumes) -> View:
        fig = plot_moe(res, title=f"{spec.name}: top-k {controls['top_k'].value}, ep {controls['ep'].value}, "
                                  f"skew {controls['skew'].value:.1f}") if show_figure else None
        return View(pd.Series(res.summary(), name=spec.name).to_frame(), fig)

    return panel(controls, compute, render)


#: notebook 03's metric names with their units (the stage-time sliders are in seconds)
_BUBBLE_METRICS = {"makespan": "makespan (s)", "bubble_per_rank": "bubble per rank (s)",
                   "bubble_fraction": "bubble fraction (share of the makespan)",
                   "bubble_overhead": "bubble overhead (bubble / useful work)"}
#: the row comparing the simulated bubble per rank with a published formula, by schedule
#: (DualPipe README's PP is DualPipe's rank count; DualPipeV is DualPipe on 2p ranks cut in half onto p ranks,
#: so PP = 2p here: (p - 1)(F&B + B - 3W), 4.5 s at p = 4 with F&B + B - 3W = 1.5 s)
_PUBLISHED_BUBBLE = {"dualpipev": "bubble per rank vs DualPipe README (PP/2 - 1)(F&B + B - 3W), PP = 2p (s)",
                     "zb-h2": "bubble per rank vs ZB paper (p - 1)(F + I - 2W) (s)"}


def _snap(x: float, scale: float, rel: float = 1e-9) -> float:
    """``x`` with float round-off (``|x| <= rel * scale``) set to 0, so a difference of two equal times reads 0."""
    return 0.0 if abs(x) <= rel * max(abs(scale), 1.0) else x


def bubble_table(result: dict[str, Any]):
    """Notebook 03's table of a :func:`~tessera_lab.pipeline.simulate.compare_with_closed_form` result: one
    labelled row per metric with its unit (:data:`_BUBBLE_METRICS`), columns ``simulated``, ``closed form``,
    ``difference``; values within float round-off of zero (e.g. ``-1.1e-13`` s) are 0."""
    import pandas as pd

    name = getattr(result.get("schedule"), "name", "")
    labels = {**_BUBBLE_METRICS,
              "published_bubble": _PUBLISHED_BUBBLE.get(name, "bubble per rank vs published formula (s)")}
    rows = []
    for row in result["rows"]:
        scale = max(abs(row["simulated"]), abs(row["closed_form"]))
        rows.append({"metric": labels.get(row["metric"], row["metric"]),
                     "simulated": _snap(row["simulated"], scale), "closed form": _snap(row["closed_form"], scale),
                     "difference": _snap(row["difference"], scale)})
    return pd.DataFrame(rows).set_index("metric")


def uses_w(schedule: Any) -> bool:
    """Whether a :class:`~tessera_lab.pipeline.ir.Schedule` runs a separate weight-gradient action W (so the W
    time changes its timeline)."""
    from tessera_lab.pipeline.actions import ActionType

    return any(a.type is ActionType.W or any(x.type is ActionType.W for x in (a.sub_actions or ()))
               for acts in schedule.actions.values() for a in acts)


def uses_fb(schedule: Any) -> bool:
    """Whether a schedule runs overlapped forward-backward pairs (so the F&B time changes its timeline)."""
    from tessera_lab.pipeline.actions import ActionType

    return any(a.type is ActionType.OVERLAP_F_B for acts in schedule.actions.values() for a in acts)


def bubble_panel(schedule: str = "1f1b", pp: int = 4, microbatches: int = 8, vpp: int = 2, f: float = 1.0,
                 b: float = 2.0, w: float = 1.0, fb: float = 2.6, p2p_latency: float = 0.0):
    """Notebook 03's panel: schedule, ranks, micro-batches, chunks, stage times (s) and p2p latency (s); the
    simulated bubble beside the closed form (:func:`~tessera_lab.pipeline.simulate.compare_with_closed_form`)
    and the Gantt chart. ``state["result"]`` holds that function's result; a schedule that cannot run with the
    settings (1F1B with fewer micro-batches than stages, ...) gives ``state["error"]``."""
    import ipywidgets as wd

    from tessera_lab.pipeline.schedules import SCHEDULE_NAMES
    from tessera_lab.pipeline.simulate import compare_with_closed_form
    from tessera_lab.ui.plots import gantt

    def slider(value, lo, hi, step, label):
        return wd.FloatSlider(value=value, min=lo, max=hi, step=step, description=label, style=LABEL_STYLE,
                              continuous_update=False)

    controls = {
        "schedule": wd.Dropdown(options=list(SCHEDULE_NAMES), value=schedule, description="schedule",
                                style=LABEL_STYLE),
        "pp": wd.IntSlider(value=pp, min=1, max=8, description="ranks p", style=LABEL_STYLE, continuous_update=False),
        "m": wd.IntSlider(value=microbatches, min=1, max=32, description="micro-batches", style=LABEL_STYLE,
                          continuous_update=False),
        "vpp": wd.IntSlider(value=vpp, min=2, max=4, description="chunks v", style=LABEL_STYLE,
                            continuous_update=False),
        "f": slider(f, 0.1, 4, 0.1, "F (s)"), "b": slider(b, 0.1, 8, 0.1, "B (s)"),
        "w": slider(w, 0.0, 4, 0.1, "W (s)"), "fb": slider(fb, 0.1, 12, 0.1, "F&B (s)"),
        "latency": slider(p2p_latency, 0.0, 1.0, 0.05, "p2p (s)"),
    }

    def compute(v: dict[str, Any]) -> dict[str, Any]:
        return compare_with_closed_form(v["schedule"], v["pp"], v["m"], v["f"], v["b"], min(v["w"], v["b"]),
                                        max(v["fb"], 1e-9), vpp=v["vpp"] if v["schedule"] == "interleaved" else 1,
                                        p2p_latency=v["latency"])

    def render(r: dict[str, Any]) -> View:
        notes = []
        sched = controls["schedule"].value
        if sched == "dualpipev":
            notes.append("chunks v applies to the interleaved schedule only (DualPipeV always runs two chunks per "
                         "rank, folded into a V)")
        elif sched != "interleaved":
            notes.append(f"chunks v applies to the interleaved schedule only ({sched} runs one chunk per rank)")
        if sched == "dualpipev":
            notes.append("PP in the DualPipe README formula counts DualPipe's ranks; DualPipeV is DualPipe on 2p "
                         f"ranks cut in half onto p ranks, so PP = 2p = {2 * controls['pp'].value} here")
        unused = [name for name, used in (("W (s)", uses_w(r["schedule"])), ("F&B (s)", uses_fb(r["schedule"])))
                  if not used]
        if unused:
            notes.append(f"{' and '.join(unused)} do{'es' if len(unused) == 1 else ''} not affect {sched}: "
                         + ("it runs the full backward B, no separate W" if "W (s)" in unused else "")
                         + ("; " if len(unused) == 2 else "")
                         + ("it overlaps no F with a B" if "F&B (s)" in unused else ""))
        if controls["w"].value > controls["b"].value:
            notes.append(f"W is capped at B = {controls['b'].value:.1f} s (W is part of the backward)")
        outside = [a["assumption"] for a in r.get("assumptions", []) if not a["holds"]]
        if outside:
            notes.append("outside the closed form's assumptions, so it is only a guide here: " + "; ".join(outside))
        return View(bubble_table(r), gantt(r["timeline"]), notes)

    names = list(controls)
    return panel(controls, compute, render, rows=[names[:4], names[4:]], error_prefix="cannot run")


def overlap_panel(model: str = "qwen3-next-80b-a3b", ep: int = 16, expert_width: int = 512, top_k: int = 10, *,
                  budget: int = 400, models: Sequence[str] | None = None):
    """Notebook 05's panel: routed expert width and top-k of one F/BW layer pair with EP over ``ep`` ranks; the
    pair's times and the hidden share of its EP communication (analytic,
    :func:`~tessera_lab.overlap.core.overlap_point`: the first MoE layer's forward with its backward). Efficiency
    above 1 or below 0 is flagged (outside the range where it means "share of the shorter bundle hidden").
    ``models``: a model choice (a dropdown, last control); a dense model says it has no expert knob.
    ``state["result"]`` holds the point."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import pandas as pd

    from tessera_lab.cost.source import analytic_source
    from tessera_lab.model.hardware import ParallelConfig, cluster_for
    from tessera_lab.overlap.core import overlap_point
    from tessera_lab.ui.panel import CAPTION_SEP, settings_caption

    spec = _as_model(model)
    parallel = ParallelConfig(ep=ep, pp=1)
    cluster = cluster_for(parallel)  # the cluster overlap_point's analytic cost model prices the pair on
    widths = sorted({64, 128, 256, 512, 1024, 2048, expert_width})
    controls = {
        "expert_width": w.SelectionSlider(options=widths, value=expert_width, description="expert width",
                                          style=LABEL_STYLE, continuous_update=False),
        "top_k": w.IntSlider(value=top_k, min=1, max=16, description="top-k", style=LABEL_STYLE,
                             continuous_update=False),
    }

    if models:
        controls["model"] = w.Dropdown(options=list(dict.fromkeys([model, *models])), value=model,
                                       description="model", style=LABEL_STYLE)
    chosen = {model: spec}

    def compute(v: dict[str, Any]) -> dict[str, float]:
        name = v.get("model", model)
        m = chosen.setdefault(name, _as_model(name))
        return overlap_point(m, parallel, expert_width=v["expert_width"], top_k=v["top_k"], budget=budget)

    def render(p: dict[str, float]) -> View:
        from tessera_lab.report.headline import efficiency_note

        notes = [n for n in [efficiency_note(p["efficiency"])] if n]
        table = pd.Series({"forward expert GEMM (us)": p["expert_gemm_s"] * 1e6,
                           "pair communication (ms)": p["comm_s"] * 1e3,
                           "F alone (ms)": p["t_f"] * 1e3, "BW alone (ms)": p["t_b"] * 1e3,
                           "pair together (ms)": p["t_pair"] * 1e3,
                           "EP communication hidden (share)": p["comm_hidden_fraction"],
                           "overlap efficiency e": p["efficiency"]}, name="analytic").to_frame()
        fig, ax = plt.subplots(figsize=(7, 2.4), layout="constrained", facecolor="white")
        parts = {"F alone": p["t_f"], "BW alone": p["t_b"], "F + BW, one after the other": p["t_f"] + p["t_b"],
                 "pair together": p["t_pair"]}
        ax.barh(list(parts), [v * 1e3 for v in parts.values()], color=["#4c72b0", "#dd8452", "#999999", "#55a868"])
        ax.invert_yaxis()
        ax.set_xlabel("time (ms)")
        name = controls["model"].value if "model" in controls else spec.name
        ax.set_title(f"{name}, EP={ep}: {p['comm_hidden_fraction']:.0%} of EP communication hidden", fontsize=10)
        return View(table, fig, notes)

    def caption(_p: dict[str, float]) -> str:
        """Provenance first (simulated, the cost source, GPU and EP), then the controls' settings."""
        return CAPTION_SEP.join([
            f"simulated, costs {analytic_source().describe()}",
            f"GPU {cluster.gpu.name} ({cluster.num_nodes} x {cluster.gpus_per_node})", f"EP {ep}",
            settings_caption(controls)])

    return panel(controls, compute, render, caption=caption)
