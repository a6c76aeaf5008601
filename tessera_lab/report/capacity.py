"""Capacity report (where the lost MFU goes) and the model-change diff (docs/concepts.md, "Capacity report").

Capacity report
===============

MFU follows docs/concepts.md ("Model FLOPs and MFU"): model FLOPs per iteration in Megatron-LM's convention
(:func:`tessera_lab.model.tasks.model_flops_per_iteration`: 3 x forward GEMM and attention-core FLOPs, causal
attention at half, MoE through top-k x expert width plus the shared expert, no recomputation) divided by
``iteration time x GPUs x peak dense bf16 FLOP/s``. The **lost time** of one iteration is
``iteration time x GPUs x (1 - MFU)`` GPU-seconds, i.e. the GPU time not spent on model FLOPs at peak.

The simulator runs one pipeline of ``pp`` ranks; each pipeline rank stands for ``G = GPUs / pp`` GPUs
(the ``ep x dp x tp`` ranks of its stage) that do the same work, so rank-seconds become GPU-seconds by
multiplying by ``G``. The lost time is split into the categories below; every part is computed, and the
last row, ``residual``, is the lost time minus the sum of the parts (floating-point noise for simulated
plans; it is reported, never hidden).

Busy time of a rank (its compute lane) is split per action with a *recipe*: the action's predicted time
decomposed over the layer-task bundles it runs, each bundle executed on the two-lane (compute stream +
communication stream) model of :func:`tessera_lab.cost.lanes.pair_makespan` in the order the plan uses
(program order for a standalone F / B / W, the overlap scheduler's best order for an overlapped F&B pair).
A bundle's makespan is exactly the sum of its compute tasks' span times and the time only communication
runs, so each recipe sums to the action's time.

Categories (GPU-seconds per iteration):

``stage_imbalance``
    Idle time a rank spends because the busiest rank has more work per iteration:
    ``sum_r min(idle_r', busy0_max - busy0_r)`` where ``busy0_r`` is rank r's compute time with every action
    at its nominal duration and ``idle_r'`` its idle time left after exposed communication and memory wait.
    For a stage-per-rank schedule with uniform actions this is ``(slowest stage's per-micro-batch time -
    this stage's) x micro-batches`` summed over ranks.
``exposed_ep_all_to_all``, ``exposed_tp``
    Time inside a rank's actions when only the EP dispatch/combine all-to-all (respectively the TP
    all-reduce) runs and no compute kernel does (the part of the collective the bundle's or pair's compute
    does not hide).
``exposed_pp_p2p``, ``exposed_dp_grad_sync``
    Idle compute-lane time of a rank covered by a stage-to-stage transfer into that rank (``RECV_F`` /
    ``RECV_B``) or by the end-of-iteration gradient synchronisation. Instants covered by several
    collectives are split equally between them. Other collectives found in a timeline get their own
    ``exposed_<name>`` row.
``bubble``
    The rest of the idle time: pipeline fill and drain (warm-up / cool-down) and the schedule's dependency
    waits, after exposed communication, memory wait, stage imbalance and routing variance.
``routing_variance``
    Busy part: ``sum (duration - nominal duration)`` over actions (signed), nominal = the planned duration
    at uniform routing (or what the caller supplies: e.g. the median observed duration of that stage and
    action type). Idle part, only when a nominal iteration time ``T0`` is known: the idle time a rank has
    beyond its nominal idle ``T0 - busy0_r``, within what is left after the categories above.
``memory_wait``
    Compute-lane events typed ``memory_wait`` (an observed run may record allocator / offload waits). The
    simulator models none: 0 for simulated plans.
``runtime_overhead``
    Kernel launch and tail time (``kernel_launch_s`` of ``data/hardware/cost_model.json`` per compute task),
    the time a compute task waits on the host's eager kernel issue beyond its GPU time
    (:mod:`tessera_lab.cost.host`), the host/device synchronisation of each MoE layer's forward in schedules
    without the EP overlap (:mod:`tessera_lab.cost.sync`), plus, for observed runs, the nominal observed time of each action beyond its predicted time
    (framework, Python, allocator), minus any time compute events overlap each other.
``non_model_work``
    Compute that is not model FLOPs: router, norms, element-wise ops, permute/unpermute, convolution,
    embedding, loss (their full kernel time without launch overhead), recomputation, plus the FLOPs of
    model-op kernels that the Megatron convention does not count (router weight-gradient GEMM, duplicated
    work), at peak.
``kernel_efficiency``
    Model-FLOP kernels (GEMMs, grouped expert GEMMs, attention and linear-attention cores) running below
    peak: their time without launch overhead minus their FLOPs at peak (roofline efficiency, memory-bound
    shapes); a kernel faster than its FLOPs at the bf16 peak adds nothing here.
``beyond_bf16_peak``
    Only when nonzero: model-FLOP kernels finishing faster than their FLOPs at the dense bf16 peak MFU is measured
    against (FP8 GEMMs), their time minus those FLOPs at that peak. Negative: time gained, so the lost time can
    fall below the sum of the other rows.
``overlap_contention``
    Compute kernels slowed down while a communication kernel runs beside them (the contention term of the
    cost model): the compute spans' time beyond their standalone time.
``residual``
    Lost time minus the sum of the rows above.

Model-change diff
=================

:func:`model_diff` plans two variants at the same (or a changed) parallel configuration and puts the
partition, per-stage cost, exposed communication per collective, memory headroom and MFU side by side. The
iteration-time difference per GPU splits exactly into the change of model work at peak plus the change of
every lost-time category (``T = (model FLOPs / peak + sum of categories) / GPUs``); the headline names the
largest term. Each plan keeps its cost source; reports and the diff name it (``costs``).

Layout: category names and per-action recipes in :mod:`tessera_lab.report.categories`, the accounting in
:mod:`tessera_lab.report.breakdown` (both re-exported here); this module builds reports from plans, the diff and
the ``report --plot`` figures. Never imports torch; pandas is imported only by the table methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, ParallelConfig, layout_text
from tessera_lab.model.knobs import MODEL_KNOBS
from tessera_lab.model.spec import ModelSpec, layer_summary
from tessera_lab.report.breakdown import (MFU_CONVENTION, CapacityReport, capacity_breakdown, capacity_from_observed,
                                          capacity_from_runner, nominal_from_timeline)
from tessera_lab.report.diff import diff_headline
from tessera_lab.plan.proof import partition_label
from tessera_lab.report.categories import (CATEGORIES, DEFINITIONS, GIB, LABELS, ActionBreakdown, collective_category,
                                           evaluation_recipes, lane_breakdown)

__all__ = ["CATEGORIES", "DEFINITIONS", "LABELS", "MFU_CONVENTION", "ActionBreakdown", "CapacityReport", "DiffReport",
           "apply_changes", "capacity_breakdown", "capacity_from_observed", "capacity_from_runner", "capacity_report",
           "collective_category", "diff_contributions", "evaluation_recipes", "lane_breakdown", "memory_headroom",
           "model_diff", "nominal_from_timeline", "parse_changes", "plan_caption"]


def capacity_report(plan: Any, evaluation: Any | str | None = None, *, timeline: Any = None,
                    nominal_iteration_s: float | None = None) -> CapacityReport:
    """Capacity report of a :class:`~tessera_lab.plan.make.Plan`'s chosen evaluation (or a baseline by name).

    Args:
        plan: the plan.
        evaluation: an :class:`~tessera_lab.plan.make.Evaluation`, a baseline name (``uniform``, ...) or ``None``
            (the chosen plan).
        timeline: another timeline of the same partition (e.g. with per-micro-batch routing durations from the
            dynamic module, or observed); default the evaluation's simulated timeline.
        nominal_iteration_s: nominal iteration time for ``timeline`` (default: the evaluation's simulated
            iteration time when a different timeline is given).
    """
    ev = plan.chosen if evaluation is None else (
        plan.baselines[evaluation] if isinstance(evaluation, str) else evaluation)
    if isinstance(evaluation, str) and evaluation not in plan.baselines:
        raise ConfigError(f"baseline {evaluation!r} is not in the plan; allowed: {', '.join(plan.baselines)}")
    recipes = evaluation_recipes(plan.model, plan.parallel, plan.cluster, ev)
    tl = ev.timeline if timeline is None else timeline
    if timeline is not None and nominal_iteration_s is None:
        nominal_iteration_s = ev.iteration_time_s
    notes = []
    # the recipes must reproduce the simulated action times
    worst = 0.0
    for st in ev.stages:
        for typ, want in (("F", st.f_s), ("B", st.b_s), ("OVERLAP_F_B", st.overlap_s)):
            if want is None:
                continue
            worst = max(worst, abs(recipes[(st.index, typ)].total - want) / max(want, 1e-30))
    if worst > 1e-9:
        notes.append(f"recipes differ from the simulated stage times by up to {worst:.2e} (relative); the "
                     "difference shows in the residual"
                     + ("" if plan.costs.kind == "analytic" else
                        f" (recipes split the analytic model's times; the plan's costs are {plan.costs.describe()})"))
    p = plan.parallel
    part = partition_label(plan, ev)
    src = (f"simulated plan: {plan.model.name}, {part}, {p.schedule}, {layout_text(p, plan.model.has_moe)}, "
           f"m={p.microbatches}" if timeline is None else f"timeline of {plan.model.name}, {part}")
    rep = capacity_breakdown(tl, recipes, gpus=p.world_size, model_flops=plan.model_flops,
                             peak_flops=plan.cluster.gpu.peak_flops, nominal_iteration_s=nominal_iteration_s,
                             source=src, notes=notes)
    rep.costs = plan.costs.as_dict()
    if not plan.model.has_moe:  # rows that are zero by construction without MoE layers are left out, and said so
        gone = [k for k in ("exposed_ep_all_to_all", "routing_variance")
                if k in rep.parts and abs(rep.parts[k]) <= 1e-12 * max(1.0, rep.gpu_time_s)]
        for k in gone:
            del rep.parts[k]
        if gone:
            rep.notes.append("no MoE layers: no " + " or ".join(LABELS[k] for k in gone) + " row (nothing is routed)")
    return rep


# ---------------------------------------------------------------------- model-change diff
PARALLEL_CHANGES = {"seq_len": "seq_len", "context_length": "seq_len", "dtype": "dtype", "precision": "dtype",
                    "micro_batch_size": "micro_batch_size", "microbatches": "microbatches"}
#: model knobs a change may set: :data:`tessera_lab.model.knobs.MODEL_KNOBS` (the one mapping)
MODEL_CHANGES = MODEL_KNOBS


def parse_changes(text: str) -> dict[str, Any]:
    """``"expert_width=256,top_k=4,seq_len=8192,dtype=fp8"`` -> dict (integers where they parse).

    Raises:
        ConfigError: an item without ``=``, an unknown key, a key given twice with different values, or two keys
            that set the same setting (``top_k`` and ``num_experts_per_tok``).
    """
    out: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        k, sep, v = item.partition("=")
        k = k.strip().replace("-", "_")
        if not sep or k not in {**PARALLEL_CHANGES, **MODEL_CHANGES}:
            raise ConfigError(f"change {item!r} is invalid; allowed: KEY=VALUE with KEY in "
                              f"{', '.join(sorted({**PARALLEL_CHANGES, **MODEL_CHANGES}))}")
        v = v.strip()
        try:
            v = int(v)
        except ValueError:
            pass
        if k in out and out[k] != v:
            raise ConfigError(f"change {k!r} is given twice ({out[k]!r} and {v!r}); allowed: each KEY once")
        target = PARALLEL_CHANGES.get(k) or MODEL_CHANGES[k]
        alias = next((o for o in out if o != k and (PARALLEL_CHANGES.get(o) or MODEL_CHANGES[o]) == target), None)
        if alias is not None:
            raise ConfigError(f"change {k!r} = {v!r} sets the same setting ({target}) as {alias!r} = {out[alias]!r}; "
                              "allowed: one key per setting")
        out[k] = v
    return out


#: ``with_changes`` keywords that need routed experts (a dense model has none to change)
_EXPERT_KNOBS = frozenset({"moe_intermediate_size", "num_experts_per_tok", "num_experts",
                           "shared_expert_intermediate_size", "shared_experts"})


def apply_changes(model: ModelSpec, parallel: ParallelConfig, changes: Mapping[str, Any]) -> tuple[ModelSpec, ParallelConfig]:
    """Apply model knobs (attention ratio, expert width, top-k, experts, layers) and run knobs (context
    length ``seq_len``, precision ``dtype``, micro-batch size, micro-batches) to a model and its parallel
    config. Precision changes activation and communication bytes; compute is still timed at the bf16 peak.

    Raises:
        ConfigError: unknown key or a value out of range (from the model / parallel validation).
    """
    mk, pk = {}, {}
    for k, v in changes.items():
        if k in MODEL_CHANGES and MODEL_CHANGES[k] in _EXPERT_KNOBS and not model.has_moe:
            raise ConfigError(f"change {k} = {v}: model {model.name} has no routed experts (a dense model); allowed: "
                              f"leave {k} out, or diff a MoE model")
        if k in MODEL_CHANGES:
            mk[MODEL_CHANGES[k]] = v
        elif k in PARALLEL_CHANGES:
            pk[PARALLEL_CHANGES[k]] = v
        else:
            raise ConfigError(f"change {k!r} is unknown; allowed: {', '.join(sorted({**PARALLEL_CHANGES, **MODEL_CHANGES}))}")
    return (model.with_changes(**mk) if mk else model), (parallel.replace(**pk) if pk else parallel)


@dataclass
class DiffReport:
    """Two variants side by side (see :func:`model_diff`). ``plans`` and ``capacity`` are (a, b) pairs."""

    labels: tuple[str, str]
    plans: tuple[Any, Any]
    capacity: tuple[CapacityReport, CapacityReport]
    headline: str
    contributions_ms_per_gpu: dict[str, float]

    def summary_rows(self) -> list[dict[str, Any]]:
        """Metric rows: iteration time, tokens/s, MFU, bubble, slowest stage, memory headroom, exposed
        communication per collective (ms per GPU per iteration)."""
        rows = []

        def row(metric, a, b, unit=""):
            rows.append({"metric": metric, self.labels[0]: a, self.labels[1]: b,
                         "change": (b - a) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None,
                         "unit": unit})

        (pa, pb), (ca, cb) = self.plans, self.capacity
        row("iteration time", pa.chosen.iteration_time_s, pb.chosen.iteration_time_s, "s")
        row("tokens per second", pa.chosen.tokens_per_s, pb.chosen.tokens_per_s, "tokens/s")
        row("MFU", ca.mfu, cb.mfu, "")
        row("bubble fraction", pa.chosen.bubble_fraction, pb.chosen.bubble_fraction, "")
        row("slowest stage per micro-batch", max(s.time_s for s in pa.chosen.stages) * 1e3,
            max(s.time_s for s in pb.chosen.stages) * 1e3, "ms")
        row("memory headroom (tightest stage)", memory_headroom(pa) / GIB, memory_headroom(pb) / GIB, "GiB")
        for k in dict.fromkeys(list(ca.exposed_comm_gpu_s) + list(cb.exposed_comm_gpu_s)):
            row(LABELS.get(k, k), ca.parts.get(k, 0.0) / ca.gpus * 1e3, cb.parts.get(k, 0.0) / cb.gpus * 1e3,
                "ms/GPU")
        row("EP comm hidden", ca.ep_hidden_fraction, cb.ep_hidden_fraction, "")
        row("costs", pa.costs.describe(), pb.costs.describe(), "")
        return rows

    def summary(self):
        import pandas as pd

        return pd.DataFrame(self.summary_rows())

    def stage_rows(self) -> list[dict[str, Any]]:
        """Per stage: layers, time per micro-batch (ms) and memory (GiB) of both variants."""
        a, b = self.plans[0].chosen.stages, self.plans[1].chosen.stages
        rows = []
        for s in range(max(len(a), len(b))):
            r: dict[str, Any] = {"stage": s}
            for lab, st in (("a", a[s] if s < len(a) else None), ("b", b[s] if s < len(b) else None)):
                r[f"layers {lab}"] = layer_summary(st.layers, st.kinds) if st else "-"
                r[f"ms/mb {lab}"] = st.time_s * 1e3 if st else None
                r[f"GiB {lab}"] = st.memory_bytes / GIB if st else None
            rows.append(r)
        return rows

    def stages(self):
        import pandas as pd

        return pd.DataFrame(self.stage_rows())

    def as_dict(self) -> dict[str, Any]:
        return {"labels": list(self.labels), "headline": self.headline,
                "contributions_ms_per_gpu": self.contributions_ms_per_gpu,
                "summary": self.summary_rows(), "stages": self.stage_rows(),
                "plans": [p.as_dict() for p in self.plans], "capacity": [c.as_dict() for c in self.capacity]}

    def format(self) -> str:
        from tessera_lab.report.formatting import diff_summary_rows
        from tessera_lab.textable import simple_table

        rows = diff_summary_rows(self.summary_rows(), self.labels)  # shares in %, fitting digits per unit
        return "\n".join([
            f"model-change diff: {self.labels[0]}  vs  {self.labels[1]}",
            simple_table(rows, disable_numparse=True, colalign=("left", "right", "right", "right", "left")), "",
            f"per stage (a = {self.labels[0]}, b = {self.labels[1]}; ms/mb: time per micro-batch as the schedule "
            "sees it)",
            simple_table(self.stage_rows(), floatfmt=".3f"), "",
            self.headline])


def memory_headroom(plan: Any) -> float:
    """Bytes left on the tightest stage: memory capacity per GPU minus the largest stage memory."""
    return plan.memory_capacity_bytes - max(st.memory_bytes for st in plan.chosen.stages)


def diff_contributions(a: CapacityReport, b: CapacityReport) -> dict[str, float]:
    """Change of iteration time per GPU, seconds, split exactly into ``model work at peak`` and every
    capacity category: ``T = (model FLOPs / peak + sum(parts)) / GPUs`` for each variant."""
    out = {"model work at peak": b.useful_gpu_s / b.gpus - a.useful_gpu_s / a.gpus}
    for k in dict.fromkeys(list(a.parts) + list(b.parts)):
        out[LABELS.get(k, k)] = b.parts.get(k, 0.0) / b.gpus - a.parts.get(k, 0.0) / a.gpus
    return out


def model_diff(
    base: ModelSpec,
    variant: ModelSpec | Mapping[str, Any],
    parallel: ParallelConfig | None = None,
    cluster: Cluster | None = None,
    *,
    variant_parallel: ParallelConfig | None = None,
    labels: tuple[str, str] | None = None,
    method: str = "ilp",
    gpu: str = "H200",
    plans: tuple[Any, Any] | None = None,
) -> DiffReport:
    """Plan a baseline and a changed model at a target scale and compare them.

    Args:
        base: the baseline model.
        variant: the changed model, or a dict of changes for :func:`apply_changes` (``attention_ratio``,
            ``expert_width``, ``top_k``, ``num_experts``, ``seq_len``/``context_length``, ``dtype``/``precision``).
        parallel: parallel configuration of the baseline (default :class:`ParallelConfig()`).
        cluster: the cluster (default: the smallest that fits each configuration).
        variant_parallel: parallel configuration of the variant (default: ``parallel`` with the run changes).
        labels: names of the two columns (default the model names, plus run changes).
        method: partition method for both plans (``ilp``, ``dp``, ``uniform``).
        plans: already made plans (a, b) to compare instead of planning.

    Raises:
        ConfigError / PartitionError: as :func:`tessera_lab.plan.make.make_plan`.
    """
    from tessera_lab.plan.make import make_plan

    parallel = parallel or ParallelConfig()
    if plans is None:
        if isinstance(variant, Mapping):
            changes = dict(variant)
            vm, vp = apply_changes(base, parallel, changes)
            if labels is None:
                run = [f"{k}={v}" for k, v in changes.items() if k in PARALLEL_CHANGES]
                labels = (base.name, vm.name + (f" ({', '.join(run)})" if run else ""))
        else:
            vm, vp = variant, parallel
        vp = variant_parallel or vp
        pa = make_plan(base, parallel, cluster, method=method, baselines=(), gpu=gpu)
        pb = make_plan(vm, vp, cluster, method=method, baselines=(), gpu=gpu)
    else:
        pa, pb = plans
    labels = labels or (pa.model.name, pb.model.name if pb.model.name != pa.model.name else pb.model.name + " (b)")
    if labels[0] == labels[1]:
        labels = (labels[0] + " (a)", labels[1] + " (b)")
    ca, cb = capacity_report(pa), capacity_report(pb)
    contrib = diff_contributions(ca, cb)
    headline = diff_headline(labels, ca.iteration_time_s, cb.iteration_time_s, ca.mfu, cb.mfu, contrib)
    if pa.parallel.tokens_per_iteration != pb.parallel.tokens_per_iteration:
        headline += (f"; tokens per iteration differ ({pa.parallel.tokens_per_iteration} vs "
                     f"{pb.parallel.tokens_per_iteration}): compare tokens/s")
    if pa.parallel.dtype != pb.parallel.dtype:
        headline += "; precision changes bytes moved, compute is timed at the bf16 peak"
    return DiffReport((labels[0], labels[1]), (pa, pb), (ca, cb), headline, {k: v * 1e3 for k, v in contrib.items()})


# ---------------------------------------------------------------------- CLI entry
def plan_caption(plan: Any, evaluation: Any = None, *, name: str | None = None, sep: str = ": ") -> str:
    """Name a plan's model and configuration for figure titles: ``"<model> on <GPUs> x <GPU><sep><partition>,
    <schedule>, pp= ep= tp= dp=, m=, seq, dtype"`` (``name`` replaces the model name; ``sep="\\n"`` gives two
    lines)."""
    ev = plan.chosen if evaluation is None else evaluation
    p = plan.parallel
    return (f"{name or plan.model.name} on {p.world_size} x {plan.cluster.gpu.name}{sep}{partition_label(plan, ev)}, "
            f"{p.schedule}, {layout_text(p, plan.model.has_moe)}, m={p.microbatches}, seq {p.seq_len}, {p.dtype}")
