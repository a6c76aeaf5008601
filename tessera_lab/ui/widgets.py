"""The planning panels (notebooks 00 and 06) and the pure functions behind them.

Each panel is :func:`tessera_lab.ui.panel.panel` over one pure function that tests call directly
(:func:`replan` / :func:`plan_summary`, :func:`compare_partitions`). Tables name every partition that does not
fit in GPU memory and flag a planned MFU above any published run. ipywidgets and matplotlib are imported inside
the panel builders, so importing this module costs nothing where they are absent.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.plan.make import Plan, make_plan
from tessera_lab.report.headline import memory_note, mfu_note
from tessera_lab.ui.panel import LABEL_STYLE, View, panel

__all__ = ["LABEL_STYLE", "panel", "replan", "plan_summary", "summary_table", "plan_notes", "quickstart_panel",
           "compare_partitions", "partition_panel"]

def replan(
    model: str = "qwen3-next-80b-a3b",
    *,
    attention_ratio: int | None = None,
    expert_width: int | None = None,
    top_k: int | None = None,
    pp: int = 8,
    ep: int = 8,
    microbatches: int = 32,
    seq_len: int = 4096,
    gpu: str = "H200",
    method: str = "ilp",
) -> Plan:
    """Plan a variant of a shipped model (pure function behind the quick-start panel).

    Args:
        model: shipped model name.
        attention_ratio: linear-attention layers per full-attention layer (hybrid models only).
        expert_width: routed expert intermediate size.
        top_k: routed experts per token.
        pp, ep, microbatches, seq_len: parallel sizes and batch shape.

    Raises:
        ConfigError / PartitionError: as :func:`tessera_lab.plan.make.make_plan`.
    """
    from tessera_lab.model.knobs import model_changes

    spec = load_model(model)
    asked = model_changes({"attention_ratio": attention_ratio, "expert_width": expert_width, "top_k": top_k})
    changes = {k: v for k, v in asked.items() if v != getattr(spec, k)}
    if changes:
        spec = spec.with_changes(**changes)
    parallel = ParallelConfig(pp=pp, ep=ep, microbatches=microbatches, seq_len=seq_len)
    return make_plan(spec, parallel, method=method, gpu=gpu)


def plan_summary(plan: Plan) -> dict[str, Any]:
    """Headline numbers of a plan: per partition, iteration time (s), tokens/s, MFU, bubble fraction and
    the slowest stage (ms)."""
    out = {}
    for ev in [plan.chosen, *plan.baselines.values()]:
        out[ev.method] = {
            "iteration_time_s": ev.iteration_time_s,
            "tokens_per_s": ev.tokens_per_s,
            "mfu": ev.mfu,
            "bubble_fraction": ev.bubble_fraction,
            "slowest_stage_ms": max(st.time_s for st in ev.stages) * 1e3,
            "layers_per_stage": [len(st.layers) for st in ev.stages],
        }
    return out


def plan_notes(plan: Plan) -> list[str]:
    """Validity notes of a plan: partitions that do not fit in memory, MFU above any published run."""
    notes = []
    for ev in [plan.chosen, *plan.baselines.values()]:
        name = "overlap-aware (ilp)" if ev is plan.chosen else ev.method
        for note in (memory_note(name, ev, plan.memory_capacity_bytes),
                     mfu_note(ev.mfu, moe=plan.model.num_experts > 0, model=plan.model,
                              grouped_gemm=getattr(plan.parallel, "grouped_gemm", None)) if ev is plan.chosen else None):
            if note:
                notes.append(note)
    return notes


def summary_table(plan: Plan):
    """:func:`plan_summary` as a table for people: one row per partition, units in the column names and a
    ``fits memory`` column (``"NO"`` where a stage exceeds the GPU's memory)."""
    import pandas as pd

    rows = []
    for name, s in plan_summary(plan).items():
        ev = plan.chosen if name == plan.chosen.method else plan.baselines[name]
        rows.append({"partition": "overlap-aware (ilp)" if ev is plan.chosen else name,
                     "iteration (s)": s["iteration_time_s"], "tokens/s (M)": s["tokens_per_s"] / 1e6,
                     "MFU (%)": 100 * s["mfu"], "bubble fraction": s["bubble_fraction"],
                     "slowest stage (ms)": s["slowest_stage_ms"], "layers per stage": s["layers_per_stage"],
                     "fits memory": "yes" if ev.fits_memory else "NO"})
    return pd.DataFrame(rows).set_index("partition")


def quickstart_panel(model: str = "qwen3-next-80b-a3b", **defaults: Any):
    """A small re-planning panel: attention ratio, expert width, pp and micro-batches.

    Returns:
        ``(panel, controls, state)``: the ``ipywidgets.VBox`` to display, a dict of the controls (set
        their ``.value`` to re-plan, as the tests do) and a dict holding the latest ``summary``
        (:func:`plan_summary`) and ``plan``, or the ``error`` text (built by :func:`panel`).
    """
    import ipywidgets as w

    from tessera_lab.ui.plots import stage_cost_bars

    spec = load_model(model)
    controls = {
        "attention_ratio": w.IntSlider(value=defaults.get("attention_ratio", spec.attention_ratio or 3), min=0, max=11,
                                       description="attn ratio", style=LABEL_STYLE, continuous_update=False,
                                       disabled=spec.attention_ratio is None),
        "expert_width": w.Dropdown(options=[128, 256, 512, 1024, 2048],
                                   value=defaults.get("expert_width", spec.moe_intermediate_size or 512),
                                   description="expert width", style=LABEL_STYLE),
        "pp": w.Dropdown(options=[2, 4, 8, 12, 16], value=defaults.get("pp", 8), description="pp", style=LABEL_STYLE),
        "microbatches": w.IntSlider(value=defaults.get("microbatches", 32), min=1, max=128,
                                    description="micro-batches", style=LABEL_STYLE, continuous_update=False),
    }

    def compute(v: dict[str, Any]) -> dict[str, Any]:
        plan = replan(model, attention_ratio=v["attention_ratio"] if spec.attention_ratio is not None else None,
                      expert_width=v["expert_width"], pp=v["pp"], microbatches=v["microbatches"])
        return {"summary": plan_summary(plan), "plan": plan}

    def render(res: dict[str, Any]) -> View:
        return View(summary_table(res["plan"]), stage_cost_bars(res["plan"]), plan_notes(res["plan"]))

    return panel(controls, compute, render, rows=[["attention_ratio", "expert_width"], ["pp", "microbatches"]],
                 state_key=None, error_prefix="cannot plan")


def compare_partitions(
    model: str = "qwen3-next-80b-a3b",
    *,
    attention_ratio: int | None = None,
    expert_width: int | None = None,
    top_k: int | None = None,
    pp: int = 8,
    microbatches: int = 32,
):
    """The overlap-aware plan beside the uniform, standalone-balanced and parameter-balanced partitions, all
    simulated with overlapped 1F1B (pure function behind notebook 06's panel).

    Returns:
        ``(plan, table)``: the :class:`~tessera_lab.plan.make.Plan` and a pandas DataFrame with one row per
        partition: layers per stage, slowest stage after overlap (ms), iteration time (s), tokens/s, MFU, and
        the speed-up of the overlap-aware plan over it.
    """
    import pandas as pd

    plan = replan(model, attention_ratio=attention_ratio, expert_width=expert_width, top_k=top_k, pp=pp,
                  microbatches=microbatches)
    rows = []
    for ev in [plan.chosen, *plan.baselines.values()]:
        rows.append({
            "partition": "overlap-aware (ilp)" if ev is plan.chosen else ev.method,
            "layers per stage": [len(st.layers) for st in ev.stages],
            "slowest stage (ms)": max(st.time_s for st in ev.stages) * 1e3,
            "iteration (s)": ev.iteration_time_s,
            "tokens/s": ev.tokens_per_s,
            "MFU (%)": 100 * ev.mfu,
            "overlap-aware speed-up": ev.iteration_time_s / plan.chosen.iteration_time_s,
            "fits memory": ev.fits_memory,
        })
    return plan, pd.DataFrame(rows).set_index("partition")


def partition_panel(model: str = "qwen3-next-80b-a3b", **defaults: Any):
    """Notebook 06's panel: attention ratio, expert width, top-k, stages and micro-batches.

    Returns:
        ``(panel, controls, state)`` like :func:`quickstart_panel`; ``state["table"]`` and ``state["plan"]``
        hold the latest :func:`compare_partitions` result or ``state["error"]`` the reason it could not plan.
    """
    import ipywidgets as w

    from tessera_lab.ui.plots import standalone_vs_overlap_bars

    spec = load_model(model)
    controls = {
        "attention_ratio": w.IntSlider(value=defaults.get("attention_ratio", spec.attention_ratio or 3), min=0, max=11,
                                       description="attn ratio", style=LABEL_STYLE, continuous_update=False),
        "expert_width": w.Dropdown(options=[128, 256, 512, 1024, 2048],
                                   value=defaults.get("expert_width", spec.moe_intermediate_size),
                                   description="expert width", style=LABEL_STYLE),
        "top_k": w.IntSlider(value=defaults.get("top_k", spec.num_experts_per_tok), min=1, max=32,
                             description="top-k", style=LABEL_STYLE, continuous_update=False),
        "pp": w.Dropdown(options=[2, 4, 8, 12, 16], value=defaults.get("pp", 8), description="stages", style=LABEL_STYLE),
        "microbatches": w.IntSlider(value=defaults.get("microbatches", 32), min=1, max=128,
                                    description="micro-batches", style=LABEL_STYLE, continuous_update=False),
    }

    def compute(v: dict[str, Any]) -> dict[str, Any]:
        plan, table = compare_partitions(model, **v)
        return {"table": table, "plan": plan}

    def render(res: dict[str, Any]) -> View:
        table = res["table"].assign(**{"fits memory": res["table"]["fits memory"].map({True: "yes", False: "NO"})})
        return View(table, standalone_vs_overlap_bars(res["plan"]), plan_notes(res["plan"]))

    names = list(controls)
    return panel(controls, compute, render, rows=[names[:3], names[3:]], state_key=None, error_prefix="cannot plan")
