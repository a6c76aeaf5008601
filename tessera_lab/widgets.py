"""ipywidgets dashboards. Each callback is a thin shell over a pure function that tests call directly.

ipywidgets, matplotlib and IPython are imported inside the panel builders, so importing this module
costs nothing where they are absent.
"""

from __future__ import annotations

from typing import Any

from .hardware import ParallelConfig
from .models import load_model
from .plan import Plan, make_plan


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
        ConfigError / PartitionError: as :func:`tessera_lab.plan.make_plan`.
    """
    spec = load_model(model)
    current = {"attention_ratio": spec.attention_ratio, "moe_intermediate_size": spec.moe_intermediate_size,
               "num_experts_per_tok": spec.num_experts_per_tok}
    changes = {k: v for k, v in {"attention_ratio": attention_ratio, "moe_intermediate_size": expert_width,
                                 "num_experts_per_tok": top_k}.items() if v is not None and v != current[k]}
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


def quickstart_panel(model: str = "qwen3-next-80b-a3b", **defaults: Any):
    """A small re-planning panel: attention ratio, expert width, pp and micro-batches.

    Returns:
        ``(panel, controls, state)``: the ``ipywidgets.VBox`` to display, a dict of the controls (set
        their ``.value`` to re-plan, as the tests do) and a dict holding the latest ``summary``
        (:func:`plan_summary`) or ``error`` text.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import pandas as pd
    from IPython.display import display

    from .errors import TesseraError
    from .plots import stage_cost_bars

    spec = load_model(model)
    controls = {
        "attention_ratio": w.IntSlider(value=defaults.get("attention_ratio", spec.attention_ratio or 3), min=0, max=11,
                                       description="attn ratio", continuous_update=False,
                                       disabled=spec.attention_ratio is None),
        "expert_width": w.Dropdown(options=[128, 256, 512, 1024, 2048],
                                   value=defaults.get("expert_width", spec.moe_intermediate_size or 512),
                                   description="expert width"),
        "pp": w.Dropdown(options=[2, 4, 8, 12, 16], value=defaults.get("pp", 8), description="pp"),
        "microbatches": w.IntSlider(value=defaults.get("microbatches", 32), min=1, max=128,
                                    description="micro-batches", continuous_update=False),
    }
    output = w.Output()
    state: dict[str, Any] = {}

    def update(_change=None) -> None:
        output.clear_output(wait=True)
        state.clear()
        with output:
            try:
                plan = replan(
                    model,
                    attention_ratio=controls["attention_ratio"].value if spec.attention_ratio is not None else None,
                    expert_width=controls["expert_width"].value,
                    pp=controls["pp"].value,
                    microbatches=controls["microbatches"].value,
                )
            except TesseraError as exc:
                state["error"] = str(exc)
                print(f"cannot plan: {exc}")
                return
            state["summary"] = plan_summary(plan)
            display(pd.DataFrame(state["summary"]).T.drop(columns="layers_per_stage"))
            ax = stage_cost_bars(plan)
            plt.show()
            plt.close(ax.figure)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    panel = w.VBox([w.HBox(list(controls.values())[:2]), w.HBox(list(controls.values())[2:]), output])
    return panel, controls, state


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
        ``(plan, table)``: the :class:`~tessera_lab.plan.Plan` and a pandas DataFrame with one row per
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
            "MFU": ev.mfu,
            "overlap-aware speed-up": ev.iteration_time_s / plan.chosen.iteration_time_s,
            "fits memory": ev.fits_memory,
        })
    return plan, pd.DataFrame(rows).set_index("partition")


def partition_panel(model: str = "qwen3-next-80b-a3b", **defaults: Any):
    """Notebook 06's panel: attention ratio, expert width, top-k, stages and micro-batches.

    Returns:
        ``(panel, controls, state)`` like :func:`quickstart_panel`; ``state["table"]`` holds the latest
        :func:`compare_partitions` table or ``state["error"]`` the reason it could not plan.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    from .errors import TesseraError
    from .plots import standalone_vs_overlap_bars

    spec = load_model(model)
    controls = {
        "attention_ratio": w.IntSlider(value=defaults.get("attention_ratio", spec.attention_ratio or 3), min=0, max=11,
                                       description="attn ratio", continuous_update=False),
        "expert_width": w.Dropdown(options=[128, 256, 512, 1024, 2048],
                                   value=defaults.get("expert_width", spec.moe_intermediate_size), description="expert width"),
        "top_k": w.IntSlider(value=defaults.get("top_k", spec.num_experts_per_tok), min=1, max=32,
                             description="top-k", continuous_update=False),
        "pp": w.Dropdown(options=[2, 4, 8, 12, 16], value=defaults.get("pp", 8), description="stages"),
        "microbatches": w.IntSlider(value=defaults.get("microbatches", 32), min=1, max=128,
                                    description="micro-batches", continuous_update=False),
    }
    output = w.Output()
    state: dict[str, Any] = {}

    def update(_change=None) -> None:
        output.clear_output(wait=True)
        state.clear()
        with output:
            try:
                plan, table = compare_partitions(model, **{k: c.value for k, c in controls.items()})
            except TesseraError as exc:
                state["error"] = str(exc)
                print(f"cannot plan: {exc}")
                return
            state["table"] = table
            display(table)
            ax = standalone_vs_overlap_bars(plan)
            plt.show()
            plt.close(ax.figure)

    for c in controls.values():
        c.observe(update, names="value")
    update()
    items = list(controls.values())
    return w.VBox([w.HBox(items[:3]), w.HBox(items[3:]), output]), controls, state
