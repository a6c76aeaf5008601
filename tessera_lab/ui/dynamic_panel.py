"""Notebook 07's panel: routing skew, static plan and seed -> static vs dynamic (W moved into predicted bubbles).

:func:`dynamic_panel` is :func:`tessera_lab.ui.panel.panel` over ``run_dynamic`` of :mod:`tessera_lab.dynamic`;
the table gives the job's iteration times (s, the stage costs' unit), idle time removed, the throughput gain
(:func:`tessera_lab.report.headline.dynamic_gain`) and each EP group's choice; the figures show EP group 0: the
routing of layer 0, the per-EP-rank load and both Gantt charts (titled by the choice, see :func:`dynamic_titles`).
"""

from __future__ import annotations

from typing import Any

from tessera_lab.report.headline import dynamic_gain
from tessera_lab.ui.panel import LABEL_STYLE, View, panel


def dynamic_summary(r: Any, uniform: Any = None) -> dict[str, Any]:
    """Headline numbers of a :class:`~tessera_lab.dynamic.evaluate.DynamicResult` for the whole job (all its EP
    groups: the iteration is the slowest group's; times in the stage costs' seconds), plus each group's choice.

    With ``uniform`` (the same job under uniform routing) the gain is split as ``tessera-lab simulate --dynamic``
    splits it: the *static part* is the gain without skew (every whole B split into I then W and W moved into the
    schedule's own bubbles: a better static plan), the *dynamic part* the rest (what reacting to this step's
    routing adds or costs)."""
    n = len(r.groups)
    job = f"job of {n} EP group{'s' if n > 1 else ''}"
    out = {f"static iteration (s), {job}": r.iteration_static_s,
           f"dynamic iteration (s), {job}": r.iteration_dynamic_s,
           "idle removed per rank (s)": r.idle_removed_s, "idle removed (share)": r.idle_removed_share,
           "throughput gain": dynamic_gain(r)}
    if uniform is not None:
        static_part = dynamic_gain(uniform)
        out["gain, static part (the same without skew)"] = static_part
        out["gain, dynamic part (from reacting to the skew)"] = dynamic_gain(r) - static_part
    for i, g in enumerate(r.groups):
        out[f"choice (EP group {i})"] = str(g.plan.choice)
    return out


def costs_caption(costs: Any, gpu: str | None = None) -> str:
    """Where a panel's stage times come from, as caption items: the model, the GPU and the cost source.

    Synthetic :class:`~tessera_lab.dynamic.durations.StageCosts` (no ``model`` in ``costs.extras``) name no model
    and no GPU: their seconds are chosen by hand. Costs from
    :meth:`~tessera_lab.dynamic.durations.StageCosts.from_model` name the model, the GPU (``gpu``, else the one
    their description names: ``... analytic costs on N x G GPU, ...``) and the analytic cost model's version
    (the hash of ``data/hardware/cost_model.json``)."""
    import re

    from tessera_lab.ui.panel import CAPTION_SEP

    model = costs.extras.get("model")
    if model is None:
        return CAPTION_SEP.join(["model none (synthetic stage times, seconds chosen by hand)", "GPU none",
                                 f"costs {costs.description}"])
    from tessera_lab.cost.source import analytic_source

    if gpu is None:
        found = re.search(r" on \d+ x \d+ (\S+),", costs.description)
        gpu = found.group(1) if found else "unknown"
    return CAPTION_SEP.join([f"model {model}", f"GPU {gpu}",
                             f"costs {analytic_source().describe()}: {costs.description}"])


def dynamic_titles(choice: str, group: int = 0) -> tuple[str, str]:
    """Titles of the two Gantt charts of EP group ``group``: the lower one names what the optimizer chose
    (``static`` keeps the static order: nothing was moved)."""
    what = {"static": "static order kept (no candidate was faster)",
            "fill": "dynamic (W moved into predicted bubbles)",
            "defer+fill": "dynamic (W deferred, then moved into predicted bubbles)"}.get(choice, f"dynamic ({choice})")
    return (f"EP group {group}, static", f"EP group {group}, {what}")


def dynamic_panel(costs: Any, *, ep: int, microbatches: int, skew: float = 1.0, schedule: str = "1f1b",
                  seed: int = 0, groups: int = 1, gpu: str | None = None):
    """Skew S (``zipf:S`` routing), static plan (1F1B, ZB-H1, ZB-H2) and routing seed.

    Args:
        costs: :class:`~tessera_lab.dynamic.durations.StageCosts` of the pipeline.
        ep: EP ranks (white lines in the routing heatmap).
        microbatches: micro-batches per step.
        groups: EP groups in the job (the table is the job's, the figures are EP group 0's).
        gpu: the GPU the costs were computed for (:func:`costs_caption`; default: the one their description names).

    The caption under the table and the figures names the model, the GPU and the cost source
    (:func:`costs_caption`), then the controls' settings.

    Returns:
        ``(panel, controls, state)``; ``state["result"]`` holds the DynamicResult.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import pandas as pd

    from tessera_lab.dynamic import routing as rt
    from tessera_lab.report.headline import dynamic_api
    from tessera_lab.ui.plots import gantt_pair, rank_load_bars, routing_heatmap

    controls = {
        "skew": w.FloatSlider(value=skew, min=0.0, max=2.0, step=0.1, description="skew S", style=LABEL_STYLE,
                              continuous_update=False),
        "schedule": w.Dropdown(options=["1f1b", "zb-h1", "zb-h2"], value=schedule, description="static plan",
                               style=LABEL_STYLE),
        "seed": w.IntSlider(value=seed, min=0, max=9, description="seed", style=LABEL_STYLE, continuous_update=False),
    }

    run_dynamic = dynamic_api()[1]

    uniform: dict[str, Any] = {}

    def compute(v: dict[str, Any]):
        kw = dict(schedule=v["schedule"], microbatches=microbatches, seed=v["seed"], groups=groups)
        key = (v["schedule"], v["seed"])
        if key not in uniform:  # the same job without skew: the static part of the gain
            uniform.clear()
            uniform[key] = run_dynamic(costs, "uniform", **kw)
        r = run_dynamic(costs, f"zipf:{v['skew']:.1f}", **kw)
        state_uniform[0] = uniform[key]
        return r

    state_uniform: list[Any] = [None]

    def render(r: Any) -> View:
        g = r.groups[0]
        fig, axes = plt.subplots(1, 2, figsize=(13, 3.0), layout="constrained",
                                 gridspec_kw={"width_ratios": [3, 1.2]})
        routing_heatmap(g.counts[0], ax=axes[0], ep=ep,
                        title=f"EP group 0, layer 0, zipf:{controls['skew'].value:.1f}")
        rank_load_bars(rt.ep_rank_load(g.counts[0], ep), ax=axes[1], title="EP group 0, per-EP-rank load")
        table = pd.Series(dynamic_summary(r, state_uniform[0]), name="simulated").to_frame()
        info = [f"table: the whole job ({len(r.groups)} EP group(s), the slowest group sets the iteration); "
                "figures: EP group 0"] if len(r.groups) > 1 else []
        info.append("skew S: the Zipf exponent of expert popularity (0: every expert equally likely)" + (
            "; at S = 0 the routing is still drawn (multinomial, with jitter) while the static part's uniform "
            "routing is exact, so the dynamic part is the draw's" if controls["skew"].value == 0 else ""))
        notes = []
        # a reading, not a validity flag; at S = 0 both runs draw from the same distribution, and a difference
        # under the table's 0.1-point precision is not one
        if (state_uniform[0] is not None and controls["skew"].value > 0
                and dynamic_gain(state_uniform[0]) - dynamic_gain(r) >= 0.001):
            info.append("the gain without skew (static part) exceeds the gain with it: splitting B into I and W "
                        "helps any schedule; the skew itself costs more than reacting to it wins back")
        if r.throughput_gain < 0:
            notes.append("the realised step is slower than static (stale metadata): the guard only holds on the "
                         "prediction")
        return View(table, [fig, gantt_pair(g.static, g.dynamic, titles=dynamic_titles(str(g.plan.choice)))], notes, info)

    from tessera_lab.ui.panel import CAPTION_SEP, settings_caption

    source = costs_caption(costs, gpu)
    return panel(controls, compute, render, caption=lambda r: source + CAPTION_SEP + settings_caption(controls))
