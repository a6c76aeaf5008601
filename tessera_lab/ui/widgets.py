"""The planning panels (notebooks 00 and 06) and the pure functions behind them.

Each panel is :func:`tessera_lab.ui.panel.panel` over one pure function that tests call directly (:func:`replan` /
:func:`plan_summary`, :func:`compare_partitions`). Tables name every partition that does not fit in GPU memory and
flag a planned MFU above the published runs. ipywidgets and matplotlib are imported inside the panel builders."""

from __future__ import annotations

from typing import Any

from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.plan.make import Plan
from tessera_lab.report.headline import memory_note, mfu_line, mfu_note
from tessera_lab.ui.panel import GPU_CHOICES, LABEL_STYLE, View, panel
from tessera_lab.ui.suggest import panel_schedule, pp_ep_terms, stage_terms, suggest_action

__all__ = ["LABEL_STYLE", "panel", "replan", "plan_summary", "summary_table", "plan_notes", "quickstart_panel",
           "compare_partitions", "partition_panel", "MODEL_LAYOUTS", "QUICKSTART_PARAMETERS", "model_knobs",
           "plan_caption", "bottleneck_bounds", "control_options", "valid_value", "model_variant", "GPU_CHOICES",
           "suggest_action"]

def replan(  # params: one keyword per control of the notebooks' re-planning panel
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
    tp: int = 1,
    recompute: str = "none",
) -> Plan:
    """Plan a variant of a shipped model (pure function behind the quick-start panel).

    Args:
        model: shipped model name.
        attention_ratio: linear-attention layers per full-attention layer (hybrid models only).
        expert_width: routed expert intermediate size.
        top_k: routed experts per token.
        pp, ep, microbatches, seq_len: parallel sizes and batch shape.
        recompute: activation recomputation, ``none``, ``selective`` (attention core and routed experts' SwiGLU) or
            ``full`` (Megatron-LM's ``--recompute-granularity``; the CLI's ``--recompute``).

    Raises:
        ConfigError / PartitionError: as make_plan (GPUs too few for the parameter state: the count, plan_or_gpu_count).
    """
    from tessera_lab.plan.search import plan_or_gpu_count

    spec = model_variant(model, attention_ratio=attention_ratio, expert_width=expert_width, top_k=top_k)
    parallel = ParallelConfig(pp=pp, ep=ep, tp=tp, microbatches=microbatches, seq_len=seq_len, recompute=recompute,
                              schedule=panel_schedule(spec, ep, recompute))
    return plan_or_gpu_count(spec, parallel, method=method, gpu=gpu)


def model_variant(model: str, *, attention_ratio: int | None = None, expert_width: int | None = None,
                  top_k: int | None = None):
    """The shipped model ``model`` with the knobs given (``None``: its own value) changed
    (:meth:`~tessera_lab.model.spec.ModelSpec.with_changes`; the model itself where nothing changes).

    Raises:
        ConfigError: a knob value the model's family cannot place.
    """
    from tessera_lab.model.knobs import model_changes

    spec = load_model(model)
    asked = model_changes({"attention_ratio": attention_ratio, "expert_width": expert_width, "top_k": top_k})
    changes = {k: v for k, v in asked.items() if v != spec.value(k)}
    return spec.with_changes(**changes) if changes else spec


#: the model choice of notebooks 05 and 06 -> a layout it fits at on H200 with 4,096-token sequences (pp, ep, tp)
MODEL_LAYOUTS: dict[str, tuple[int, int, int]] = {
    "qwen3-next-80b-a3b": (8, 8, 1), "kimi-linear-48b-a3b": (4, 8, 1), "minimax-m1": (16, 32, 1),
    "nemotron-h-56b": (4, 1, 8), "jamba-1.5-mini": (4, 8, 1), "qwen3.5-35b-a3b": (4, 8, 1),
    "nemotron-3-nano-30b-a3b": (4, 8, 1)}


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
    """Validity notes of a plan: partitions that do not fit in memory, MFU above the published runs."""
    notes, p = [], plan.parallel
    flag = mfu_note(plan.chosen.mfu, moe=plan.model.moe.num_experts > 0, model=plan.model, gpu=plan.cluster.gpu.name,
                    precision=p.precision, grouped_gemm=getattr(p, "grouped_gemm", None))
    for ev in [plan.chosen, *plan.baselines.values()]:
        name = "overlap-aware (ilp)" if ev is plan.chosen else ev.method
        for note in (memory_note(name, ev, plan.memory_capacity_bytes), flag if ev is plan.chosen else None):
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
                     "tokens/s per GPU": s["tokens_per_s"] / plan.parallel.world_size,
                     "MFU (%)": 100 * s["mfu"], "bubble fraction": s["bubble_fraction"],
                     "slowest stage (ms)": s["slowest_stage_ms"], "layers per stage": s["layers_per_stage"],
                     "fits memory": "yes" if ev.fits_memory else "NO"})
    return pd.DataFrame(rows).set_index("partition")


#: the parameters :func:`quickstart_panel` takes (notebook 00's parameters cell passes each); others are refused
QUICKSTART_PARAMETERS = ("gpu", "pp", "ep", "microbatches", "seq_len", "recompute", "attention_ratio",
                         "expert_width", "top_k")
PP_CHOICES = (1, 2, 4, 8, 12, 16)
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
SEQ_CHOICES = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def model_knobs(spec) -> dict[str, bool]:
    """Which model knobs apply to a model: ``attention_ratio`` where it has both linear (or other sub-quadratic)
    and full-attention mixers and the ratio can be changed, ``expert_width``/``top_k`` where it has experts."""
    mixers = {layer.mixer for layer in spec.stack.layers}
    return {"attention_ratio": spec.attention_ratio is not None and len(mixers) > 1,
            "expert_width": bool(spec.has_moe), "top_k": bool(spec.has_moe)}


def _with(options: tuple, value) -> list:
    """``options`` with ``value`` added in order (a parameter outside the usual choices is kept, not replaced)."""
    return sorted(set(options) | {value}) if value is not None else list(options)


def _expert_widths(width: int) -> list[int]:
    return sorted({max(32, width // 4), max(32, width // 2), width, width * 2})


def control_options(spec) -> dict[str, list[int]]:
    """Values of the planning panels' model-dependent controls that the planner accepts for ``spec``.

    ``pp``: :data:`PP_CHOICES` up to the model's layer count (more stages than layers cannot be partitioned);
    ``ep``: the divisors of its routed experts among :data:`EP_CHOICES` (``check_parallel_for_model``'s rule),
    ``[1]`` without routed experts; ``top_k``: 1 to its routed experts (``[]`` without experts; only the model's
    own value where its family cannot rebuild the config with another, e.g. a config that states top-k twice);
    ``attention_ratio``: the ratios 0-11 its family's rule can place (``ModelSpec.with_changes`` accepts them;
    ``[]`` where the model has no ratio to change). The GPU count follows (``cluster_for`` sizes the cluster).
    """
    from tessera_lab.errors import TesseraError

    ratios = []
    if model_knobs(spec)["attention_ratio"]:
        for r in range(12):
            try:
                spec.with_changes(attention_ratio=r)
            except TesseraError:
                continue
            ratios.append(r)
    top_k = list(range(1, spec.moe.num_experts + 1)) if spec.has_moe else []
    other = next((k for k in top_k if k != spec.moe.num_experts_per_tok), None)
    if other is not None:
        try:
            spec.with_changes(num_experts_per_tok=other)
        except TesseraError:
            top_k = [spec.moe.num_experts_per_tok]
    return {"pp": [p for p in PP_CHOICES if p <= spec.num_layers],
            "ep": [e for e in EP_CHOICES if spec.moe.num_experts % e == 0] if spec.has_moe else [1],
            "top_k": top_k,
            "attention_ratio": ratios}


def valid_value(value: Any, options: list, prefer: Any = None) -> Any:
    """``value`` if it is one of ``options``, else ``prefer`` if it is, else the largest option below ``value``
    (the smallest option when none is below)."""
    if value in options:
        return value
    if prefer in options:
        return prefer
    below = [o for o in options if o < value]
    return below[-1] if below else options[0]


def plan_caption(plan: Plan, seconds: float | None = None, cpu_seconds: float | None = None) -> str:
    """What a panel planned: that its figures are simulated and from which costs (``plan.costs``, e.g. the
    analytic cost model and its version, or a measured profile), model, GPU, GPU count, pp/ep/dp (tp, vpp when set;
    a model without routed experts has no EP group: pp/dp with its ep ranks counted as data-parallel replicas),
    sequence, micro-batches, schedule, recomputation, and the time the re-plan took, measured: ``seconds`` wall
    and ``cpu_seconds`` of this process (a panel passes what it timed around the whole change), else
    ``plan.timing`` (:func:`~tessera_lab.plan.make.make_plan`'s own ``wall_s`` / ``cpu_s``)."""
    from tessera_lab.ui.panel import CAPTION_SEP

    p, c = plan.parallel, plan.cluster
    tp = f" x tp {p.tp}" if p.tp > 1 else ""
    layout = (f"pp {p.pp} x ep {p.ep} x dp {p.dp}{tp}" if plan.model.has_moe  # no EP group without routed experts
              else f"pp {p.pp} x dp {p.dense_dp}{tp} (no MoE)") + (f", vpp {p.vpp}" if p.vpp > 1 else "")
    parts = [f"simulated, costs {plan.costs.describe()}", f"{plan.model.name} on {p.world_size} {c.gpu.name} GPUs ({c.num_nodes} x {c.gpus_per_node})", layout,
             f"sequence {p.seq_len}", f"{p.microbatches} micro-batches of {p.micro_batch_size}",
             f"schedule {p.schedule}", f"recompute {p.recompute}"]
    if seconds is None and cpu_seconds is None:
        seconds, cpu_seconds = plan.timing.get("wall_s"), plan.timing.get("cpu_s")
    if seconds is not None:
        cpu = f", {cpu_seconds:.2f} s CPU" if cpu_seconds is not None else ""
        parts.append(f"re-planned in {seconds:.2f} s wall{cpu} (measured)")
    return CAPTION_SEP.join(parts)


def bottleneck_bounds(plan: Plan) -> str:
    """The slowest stage's largest bounds per task kind and host/sync (plan/notes.py), as `plan`'s bound line."""
    from tessera_lab.plan.notes import bottleneck_kinds

    s, kinds = bottleneck_kinds(plan)
    big = [f"{k.kind} {k.bound}" for k in kinds if k.time_s > 0.05 * plan.chosen.stages[s].time_s][:4]
    return f"bottleneck stage {s} is bound by: " + ", ".join(big)


def _quickstart_controls(spec: Any, model: str, params: dict[str, Any]) -> dict[str, Any]:
    """The controls of :func:`quickstart_panel` for ``spec`` (the shipped model ``model``), started at the
    notebook's ``params``."""
    import ipywidgets as w

    from tessera_lab.model.hardware import RECOMPUTE
    from tessera_lab.model.spec import shipped_models

    valid = control_options(spec)
    gpu = str(params.get("gpu", "H200"))
    width = params.get("expert_width", spec.moe.moe_intermediate_size or 512)
    slider = dict(style=LABEL_STYLE, continuous_update=False)
    return {
        "model": w.Dropdown(options=_with(tuple(shipped_models()), model), value=model, description="model",
                            style=LABEL_STYLE),
        "gpu": w.Dropdown(options=_with(GPU_CHOICES, gpu), value=gpu, description="GPU", style=LABEL_STYLE),
        "pp": w.Dropdown(options=_with(tuple(valid["pp"]), params.get("pp")),
                         value=params.get("pp", valid_value(8, valid["pp"])), description="pp", style=LABEL_STYLE),
        "ep": w.Dropdown(options=_with(tuple(valid["ep"]), params.get("ep")),
                         value=params.get("ep", valid_value(8, valid["ep"])), description="ep", style=LABEL_STYLE),
        "microbatches": w.IntSlider(value=params.get("microbatches", 32), min=min(1, params.get("microbatches", 32)),
                                    max=128, description="micro-batches", **slider),
        "seq_len": w.Dropdown(options=_with(SEQ_CHOICES, params.get("seq_len", 4096)),
                              value=params.get("seq_len", 4096), description="sequence", style=LABEL_STYLE),
        "recompute": w.Dropdown(options=list(RECOMPUTE), value=params.get("recompute", "none"),
                                description="recompute", style=LABEL_STYLE),
        "attention_ratio": w.IntSlider(value=params.get("attention_ratio", spec.attention_ratio or 3), min=0,
                                       max=max(valid["attention_ratio"] or [11]), description="attn ratio", **slider),
        "expert_width": w.Dropdown(options=_expert_widths(width), value=width, description="expert width",
                                   style=LABEL_STYLE),
        "top_k": w.IntSlider(value=params.get("top_k", spec.moe.num_experts_per_tok or 1), min=min(valid["top_k"] or [1]),
                             max=max(valid["top_k"] or [1]), description="top-k", **slider),
    }


def _new_model(controls: dict[str, Any], current: dict[str, Any], start: dict[str, int]) -> None:
    """:func:`quickstart_panel` after a new model is picked: its own knob values and ranges, and the pp and ep it
    accepts (values it cannot take moved; ``current["moved"]`` says so for the caption)."""
    new = load_model(controls["model"].value)
    options = control_options(new)
    current.update(spec=new, knobs=model_knobs(new), moved=[])
    if options["attention_ratio"]:
        controls["attention_ratio"].max = max(options["attention_ratio"])
        controls["attention_ratio"].value = new.attention_ratio
    if new.has_moe:
        controls["expert_width"].options = _expert_widths(new.moe.moe_intermediate_size)
        controls["expert_width"].value = new.moe.moe_intermediate_size
        controls["top_k"].max = max(options["top_k"][-1], controls["top_k"].min)
        controls["top_k"].min = options["top_k"][0]
        controls["top_k"].max = options["top_k"][-1]
        controls["top_k"].value = new.moe.num_experts_per_tok
    for name in ("pp", "ep"):  # only values the planner accepts for this model (control_options)
        old = controls[name].value
        back = start[name] if name == "ep" and old == 1 and start[name] != 1 else None  # back from a dense model
        value = valid_value(old, options[name], prefer=None) if back is None else valid_value(back, options[name])
        controls[name].options = options[name]
        controls[name].value = value
        if value != old and back is None:
            why = (f"{new.moe.num_experts} routed experts" if name == "ep" and new.has_moe else
                   "no routed experts" if name == "ep" else f"{new.num_layers} layers")
            current["moved"].append(f"{name} {old} -> {value} ({new.name} has {why})")


def _quickstart_suggestion(controls: dict[str, Any], current: dict[str, Any]):
    """Notebook 00's "suggest a layout that fits": the layouts of the panel's GPU count with tp 1, dp 1 and pp, ep
    and micro-batches its controls offer; applied to pp, ep, micro-batches and recompute."""
    def setting(v: dict[str, Any]):
        k = current["knobs"]
        spec = model_variant(v["model"], **{n: v[n] for n in k if k[n]})
        return spec, ParallelConfig(pp=v["pp"], ep=v["ep"], microbatches=v["microbatches"], seq_len=v["seq_len"],
                                    recompute=v["recompute"]), v["gpu"]

    def settable(lay, v: dict[str, Any], par) -> bool:
        return (lay.tp == 1 and lay.dp == 1 and not lay.ep_spans_tp and lay.pp in controls["pp"].options
                and lay.ep in controls["ep"].options and lay.microbatches <= controls["microbatches"].max)

    def apply(lay, v: dict[str, Any]) -> dict[str, Any]:
        return {"pp": lay.pp, "ep": lay.ep, "microbatches": lay.microbatches, "recompute": lay.recompute}

    return suggest_action(setting, settable, apply, pp_ep_terms)


def quickstart_panel(model: str = "qwen3-next-80b-a3b", **params: Any):  # long: its callbacks close over the controls
    """Notebook 00's re-planning panel: model, GPU, pp, ep, micro-batches, sequence, activation recomputation and
    the model knobs that apply.

    Args:
        model: the shipped model to start from; the dropdown lists every shipped model (``tessera-lab models``).
        params: the notebook's parameters, each one of :data:`QUICKSTART_PARAMETERS` (``gpu``, ``pp``, ``ep``,
            ``microbatches``, ``seq_len``, ``recompute``, ``attention_ratio``, ``expert_width``, ``top_k``); they
            set the controls' start values.

    Returns:
        ``(panel, controls, state)``: the ``ipywidgets.VBox`` to display, a dict of the controls (set
        their ``.value`` to re-plan, as the tests do) and a dict holding the latest ``summary``
        (:func:`plan_summary`), ``plan``, ``seconds`` (wall time of the re-plan) and ``caption``, or the
        ``error`` text (built by :func:`panel`).

    Raises:
        ConfigError: a parameter that is not one of :data:`QUICKSTART_PARAMETERS` (before anything is built).
    """
    import time

    from tessera_lab.errors import ConfigError
    from tessera_lab.model.hardware import RECOMPUTE
    from tessera_lab.ui.panel import CAPTION_SEP
    from tessera_lab.ui.plots import stage_cost_bars

    unknown = sorted(set(params) - set(QUICKSTART_PARAMETERS))
    if unknown:
        raise ConfigError(f"quickstart_panel: parameter(s) {', '.join(unknown)} unknown; allowed: "
                          f"{', '.join(QUICKSTART_PARAMETERS)}")
    if params.get("recompute", "none") not in RECOMPUTE:
        raise ConfigError(f"quickstart_panel: recompute = {params['recompute']!r} is unknown; allowed: "
                          f"{', '.join(RECOMPUTE)}")
    spec = load_model(model)
    knobs = model_knobs(spec)
    controls = _quickstart_controls(spec, model, params)
    controls["microbatches"].min = min(controls["pp"].value, controls["microbatches"].value)
    current: dict[str, Any] = {"spec": spec, "knobs": knobs, "moved": []}
    start = {"pp": controls["pp"].value, "ep": controls["ep"].value if spec.has_moe else 8}

    def show_knobs() -> None:
        for name, on in current["knobs"].items():
            controls[name].layout.display = None if on else "none"

    def on_change(name: str) -> None:
        """A new model: its own knob values and ranges, only the knobs that apply, the pp and ep it accepts
        (values it cannot take moved, the caption says so); micro-batches at least pp (the 1F1B rule)."""
        if name == "model":
            new_model()
        if name in ("model", "pp"):
            mb, pp = controls["microbatches"], controls["pp"].value
            if mb.value < pp:
                current["moved"].append(f"micro-batches {mb.value} -> {pp} (at least pp for the 1F1B schedules)")
            mb.min = 1  # the slider clamps a value below its minimum
            mb.value = max(mb.value, pp)
            mb.min = pp

    def new_model() -> None:
        _new_model(controls, current, start)
        show_knobs()

    def compute(v: dict[str, Any]) -> dict[str, Any]:
        k = current["knobs"]
        moved, current["moved"] = current["moved"], []
        t0, c0 = time.perf_counter(), time.process_time()
        plan = replan(v["model"], attention_ratio=v["attention_ratio"] if k["attention_ratio"] else None,
                      expert_width=v["expert_width"] if k["expert_width"] else None,
                      top_k=v["top_k"] if k["top_k"] else None, pp=v["pp"], ep=v["ep"],
                      microbatches=v["microbatches"], seq_len=v["seq_len"], gpu=v["gpu"], recompute=v["recompute"])
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        caption = plan_caption(plan, seconds, cpu) + "".join(CAPTION_SEP + m for m in moved)
        return {"summary": plan_summary(plan), "plan": plan, "seconds": seconds, "cpu_seconds": cpu,
                "caption": caption, "bounds": bottleneck_bounds(plan)}

    def render(res: dict[str, Any]) -> View:
        p = res["plan"].parallel  # the GPU count moves with pp and ep: say it beside the table, not only in the caption
        return View(summary_table(res["plan"]), stage_cost_bars(res["plan"]), plan_notes(res["plan"]), [
            f"{p.world_size} GPUs (pp {p.pp} x ep {p.ep} x dp {p.dp}{f' x tp {p.tp}' if p.tp > 1 else ''})",
            mfu_line(res["plan"])])

    def caption(res: dict[str, Any]) -> str:
        return res["caption"] + CAPTION_SEP + res["bounds"]

    show_knobs()
    return panel(controls, compute, render,
                 rows=[["model", "gpu", "pp", "ep"], ["microbatches", "seq_len", "recompute"],
                       ["attention_ratio", "expert_width", "top_k"]],
                 state_key=None, error_prefix="cannot plan", caption=caption, on_change=on_change,
                 actions=[_quickstart_suggestion(controls, current)])


def compare_partitions(
    model: str = "qwen3-next-80b-a3b",
    *,
    attention_ratio: int | None = None,
    expert_width: int | None = None,
    top_k: int | None = None,
    pp: int | None = None,
    microbatches: int = 32,
    ep: int | None = None,
    tp: int | None = None,
    seq_len: int = 4096,
    recompute: str = "none",
):
    """The overlap-aware plan beside the uniform, standalone-balanced and parameter-balanced partitions, all
    simulated with the panel's schedule (:func:`panel_schedule`, plan's default; pure function behind notebook 06's
    panel). ``pp``/``ep``/``tp`` left ``None``: the :data:`MODEL_LAYOUTS` layout (else pp 8, ep 8, tp 1); ``seq_len`` tokens per
    sequence (the attention ratio matters at long sequences, where full attention's quadratic core grows);
    ``recompute`` as :func:`replan`.

    Returns:
        ``(plan, table)``: the :class:`~tessera_lab.plan.make.Plan` and a pandas DataFrame with one row per
        partition: layers per stage, slowest stage after overlap (ms), iteration time (s), tokens/s, MFU, and
        the speed-up of the overlap-aware plan over that row ("overlap-aware speed-up over this row": its
        iteration time over the overlap-aware one; 1.000 on the overlap-aware row itself).
    """
    import pandas as pd

    lay = MODEL_LAYOUTS.get(model, (8, 8, 1))
    plan = replan(model, attention_ratio=attention_ratio, expert_width=expert_width, top_k=top_k,
                  pp=lay[0] if pp is None else pp, ep=lay[1] if ep is None else ep, tp=lay[2] if tp is None else tp,
                  microbatches=microbatches, seq_len=seq_len, recompute=recompute)
    rows = []
    for ev in [plan.chosen, *plan.baselines.values()]:
        rows.append({
            "partition": "overlap-aware (ilp)" if ev is plan.chosen else ev.method,
            "layers per stage": [len(st.layers) for st in ev.stages],
            "slowest stage (ms)": max(st.time_s for st in ev.stages) * 1e3,
            "iteration (s)": ev.iteration_time_s,
            "tokens/s": ev.tokens_per_s,
            "MFU (%)": 100 * ev.mfu,
            "overlap-aware speed-up over this row": ev.iteration_time_s / plan.chosen.iteration_time_s,
            "fits memory": ev.fits_memory,
        })
    return plan, pd.DataFrame(rows).set_index("partition")


def _given(defaults: dict[str, Any], name: str, sentinel: str) -> Any:
    """A panel default, or ``sentinel`` (the model's own value) where it is not given."""
    value = defaults.get(name)
    return sentinel if value is None else value


#: the values :func:`partition_panel` offers for each model knob (those the model accepts)
_PARTITION_KNOB_VALUES = {"attention_ratio": list(range(0, 12)), "expert_width": [128, 256, 512, 1024, 2048, 4096],
                          "top_k": list(range(1, 17))}


def _own_value(spec, name: str) -> Any:
    """The model's own value of a knob (``None`` where it has none)."""
    return {"attention_ratio": spec.attention_ratio, "expert_width": spec.moe.moe_intermediate_size or None,
            "top_k": spec.moe.num_experts_per_tok or None}[name]


def _knob_options(spec, name: str, keep: Any = None) -> list:
    """``("config (V)", "config")`` first -- ipywidgets shows a None-valued option as no selection, so "config"
    stands for the model's own value V -- then the other values the planner accepts for this model
    (:func:`control_options`; V itself would be the same plan twice; none for a knob the model lacks)."""
    own = _own_value(spec, name)
    label = "config" if own is None else f"config ({own})"
    if not model_knobs(spec)[name]:
        return [(label, "config")]
    valid = control_options(spec).get(name)
    values = [v for v in _PARTITION_KNOB_VALUES[name] if valid is None or v in valid]
    return [(label, "config")] + [(str(v), v) for v in sorted(set(values) | ({keep} - {None, "config"}))
                                  if v != own]


def _pp_options(spec, keep: Any = None) -> list:
    """``("model's layout", "layout")`` then the stage counts the model has layers for."""
    valid = control_options(spec)["pp"]
    return [("model's layout", "layout")] + [(str(n), n) for n in sorted({2, 4, 8, 12, 16} & set(valid) |
                                                                         ({keep} - {None, "layout"}))]


def _partition_controls(spec: Any, model: str, choices: list, defaults: dict[str, Any]) -> dict[str, Any]:
    """The controls of :func:`partition_panel` for ``spec`` (the model ``model``, one of ``choices``), started
    at the notebook's ``defaults``."""
    import ipywidgets as w

    return {
        "model": w.Dropdown(options=choices, value=model, description="model", style=LABEL_STYLE),
        "attention_ratio": w.Dropdown(options=_knob_options(spec, "attention_ratio", defaults.get("attention_ratio")),
                                      value=_given(defaults, "attention_ratio", "config"), description="attn ratio",
                                      style=LABEL_STYLE),
        "expert_width": w.Dropdown(options=_knob_options(spec, "expert_width", defaults.get("expert_width")),
                                   value=_given(defaults, "expert_width", "config"), description="expert width",
                                   style=LABEL_STYLE),
        "top_k": w.Dropdown(options=_knob_options(spec, "top_k", defaults.get("top_k")),
                            value=_given(defaults, "top_k", "config"), description="top-k", style=LABEL_STYLE),
        "pp": w.Dropdown(options=_pp_options(spec, defaults.get("pp")), value=_given(defaults, "pp", "layout"),
                         description="stages", style=LABEL_STYLE),
        "microbatches": w.IntSlider(value=defaults.get("microbatches", 32), min=1, max=128,
                                    description="micro-batches", style=LABEL_STYLE, continuous_update=False),
        "seq_len": w.Dropdown(options=_with(SEQ_CHOICES[:5], defaults.get("seq_len", 4096)),
                              value=defaults.get("seq_len", 4096), description="sequence", style=LABEL_STYLE),
        "recompute": w.Dropdown(options=["none", "selective", "full"], value=defaults.get("recompute", "none"),
                                description="recompute", style=LABEL_STYLE),
    }


def partition_panel(model: str = "qwen3-next-80b-a3b", **defaults: Any):
    """Notebook 06's panel: the model (the choices of :data:`MODEL_LAYOUTS`, each at its layout), attention ratio,
    expert width, top-k (each "config" or a value), stages, micro-batches and sequence length.

    Returns:
        ``(panel, controls, state)`` like :func:`quickstart_panel`; ``state["table"]`` and ``state["plan"]``
        hold the latest :func:`compare_partitions` result or ``state["error"]`` the reason it could not plan.
    """
    from tessera_lab.ui.plots import standalone_vs_overlap_bars

    choices = list(MODEL_LAYOUTS) + ([model] if model not in MODEL_LAYOUTS else [])
    spec = load_model(model)
    controls = _partition_controls(spec, model, choices, defaults)
    for knob, on in model_knobs(spec).items():  # a knob the model lacks is not shown
        controls[knob].layout.display = None if on else "none"
    moved: list[str] = []

    def compute(v: dict[str, Any]) -> dict[str, Any]:
        import time

        v = {k: None if x in ("config", "layout") else x for k, x in v.items()}
        t0, c0 = time.perf_counter(), time.process_time()
        plan, table = compare_partitions(v.pop("model"), **v)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        notes, moved[:] = list(moved), []
        return {"table": table, "plan": plan, "seconds": seconds, "cpu_seconds": cpu, "moved": notes}

    def render(res: dict[str, Any]) -> View:
        table = res["table"].assign(**{"fits memory": res["table"]["fits memory"].map({True: "yes", False: "NO"})})
        return View(table, standalone_vs_overlap_bars(res["plan"]), plan_notes(res["plan"]), [mfu_line(res["plan"])])

    def caption(res: dict[str, Any]) -> str:
        from tessera_lab.ui.panel import CAPTION_SEP

        return CAPTION_SEP.join([plan_caption(res["plan"], res["seconds"], res["cpu_seconds"]), *res["moved"],
                                 bottleneck_bounds(res["plan"])])

    def on_change(name: str) -> None:
        """A new model: its own knob values as "config (V)", the other values it accepts after it (values it cannot
        take moved, the caption says so); micro-batches at least the stages (the 1F1B schedules' rule)."""
        if name == "model":
            new_model()
        if name in ("model", "pp"):
            mb, pp = controls["microbatches"], controls["pp"].value
            if pp == "layout":
                pp = MODEL_LAYOUTS.get(controls["model"].value, (8, 8, 1))[0]
            if mb.value < pp:
                moved.append(f"micro-batches {mb.value} -> {pp} (at least the stages for the 1F1B schedules)")
            mb.min = 1  # the slider clamps a value below its minimum
            mb.value = max(mb.value, pp)
            mb.min = pp

    def new_model() -> None:
        new = load_model(controls["model"].value)
        moved.clear()
        for knob in _PARTITION_KNOB_VALUES:  # model knobs start at the new model's own values, as in notebook 00
            value = controls[knob].value
            controls[knob].options = _knob_options(new, knob)
            controls[knob].value = "config"
            own, on = _own_value(new, knob), model_knobs(new)[knob]
            if value not in ("config", own):
                why = "a new model starts at its own values" if on else f"not valid for {new.name}"
                moved.append(f"{controls[knob].description} {value} -> config{f' ({own})' if on else ''} ({why})")
            controls[knob].layout.display = None if model_knobs(new)[knob] else "none"
        value = controls["pp"].value  # stages: kept where the new model has the layers for them
        controls["pp"].options = _pp_options(new)
        controls["pp"].value = value if value in [v for _, v in controls["pp"].options] else "layout"
        if controls["pp"].value != value:
            moved.append(f"{controls['pp'].description} {value} -> layout (not valid for {new.name})")

    names = list(controls)
    return panel(controls, compute, render, rows=[names[:4], names[4:]], state_key=None, error_prefix="cannot plan",
                 caption=caption, on_change=on_change, actions=[_partition_suggestion()])


def _partition_suggestion():
    """Notebook 06's "suggest a layout that fits": its pp, ep and tp (its GPU count; the model's layout,
    :data:`MODEL_LAYOUTS`, where ``pp`` is "layout") with every recompute and the micro-batches of its global batch."""
    def setting(v: dict[str, Any]):
        pp, ep, tp = MODEL_LAYOUTS.get(v["model"], (8, 8, 1))
        spec = model_variant(v["model"], **{k: None if v[k] == "config" else v[k] for k in _PARTITION_KNOB_VALUES})
        return spec, ParallelConfig(pp=pp if v["pp"] == "layout" else v["pp"], ep=ep, tp=tp, seq_len=v["seq_len"],
                                    microbatches=v["microbatches"], recompute=v["recompute"]), "H200"

    return suggest_action(setting, lambda lay, v, par: (lay.pp, lay.ep, lay.tp, lay.dp, lay.ep_spans_tp) == (
        par.pp, par.ep, par.tp, 1, False) and lay.microbatches <= 128,
        lambda lay, v: {"microbatches": lay.microbatches, "recompute": lay.recompute}, stage_terms)
