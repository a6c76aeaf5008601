"""Capacity report (where the lost MFU goes) and the model-change diff (DESIGN sections 3 and 9).

Capacity report
===============

MFU follows DESIGN section 3: model FLOPs per iteration in Megatron-LM's convention
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
communication stream) model of :func:`tessera_lab.cost.analytic.two_lane_makespan` in the order the plan uses
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
    Kernel launch and tail time (``kernel_launch_s`` of ``data/hardware/cost_model.json`` per compute task)
    plus, for observed runs, the nominal observed time of each action beyond its predicted time
    (framework, Python, allocator), minus any time compute events overlap each other.
``non_model_work``
    Compute that is not model FLOPs: router, norms, element-wise ops, permute/unpermute, convolution,
    embedding, loss (their full kernel time without launch overhead), recomputation, plus the FLOPs of
    model-op kernels that the Megatron convention does not count (router weight-gradient GEMM, duplicated
    work), at peak.
``kernel_efficiency``
    Model-FLOP kernels (GEMMs, grouped expert GEMMs, attention and linear-attention cores) running below
    peak: their time without launch overhead minus their FLOPs at peak (roofline efficiency, memory-bound
    shapes).
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
largest term.

This module never imports torch; pandas is imported only by the table methods.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tessera_lab.cost.analytic import Contention, CostModel, two_lane_makespan
from tessera_lab.cost.contention import kernel_class
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, ParallelConfig, cluster_for
from tessera_lab.model.spec import ModelSpec, layer_summary, load_model
from tessera_lab.pipeline.simulate import interval_gaps, merge_intervals, overlap_length
from tessera_lab.model.tasks import MODEL_FLOP_OPS, Task, decompose

GIB = 2**30

#: rows of the capacity table, in display order (``exposed_<other>`` rows for other collectives are added
#: after ``exposed_dp_grad_sync`` when a timeline has them)
CATEGORIES = (
    "stage_imbalance",
    "exposed_ep_all_to_all",
    "exposed_pp_p2p",
    "exposed_tp",
    "exposed_dp_grad_sync",
    "bubble",
    "routing_variance",
    "memory_wait",
    "runtime_overhead",
    "non_model_work",
    "kernel_efficiency",
    "overlap_contention",
    "residual",
)

LABELS = {
    "stage_imbalance": "stage imbalance",
    "exposed_ep_all_to_all": "exposed EP all-to-all",
    "exposed_pp_p2p": "exposed PP p2p",
    "exposed_tp": "exposed TP all-reduce",
    "exposed_dp_grad_sync": "exposed DP gradient sync",
    "bubble": "warm-up/cool-down bubble",
    "routing_variance": "routing variance",
    "memory_wait": "memory wait",
    "runtime_overhead": "runtime overhead",
    "non_model_work": "non-model work",
    "kernel_efficiency": "kernel efficiency",
    "overlap_contention": "overlap contention",
    "residual": "residual",
    "compute_unsplit": "compute beyond model FLOPs at peak (unsplit)",
}

DEFINITIONS = {
    "stage_imbalance": "idle while the busiest rank does more work: sum_r min(idle left, busy0_max - busy0_r)",
    "exposed_ep_all_to_all": "EP dispatch/combine all-to-all time with no compute kernel running",
    "exposed_pp_p2p": "idle compute lane covered by a stage-to-stage transfer into the rank",
    "exposed_tp": "TP all-reduce time with no compute kernel running",
    "exposed_dp_grad_sync": "idle compute lane covered by the end-of-iteration gradient sync",
    "bubble": "rest of the idle time: pipeline fill/drain and schedule dependency waits",
    "routing_variance": "actions beyond their nominal (uniform-routing) time, plus idle beyond the nominal idle",
    "memory_wait": "compute-lane memory_wait events (none in simulation)",
    "runtime_overhead": "kernel launch/tail per compute task; observed beyond predicted time for runs",
    "non_model_work": "router, norms, element-wise, permute, embedding, loss, recompute: not model FLOPs",
    "kernel_efficiency": "model-FLOP kernels below peak: their time minus their FLOPs at peak",
    "overlap_contention": "compute slowed down beside communication kernels (contention)",
    "residual": "lost time minus the sum of the rows above",
    "compute_unsplit": "compute time minus model FLOPs at peak, without a per-task prediction to split it",
}

_COLLECTIVE_CATEGORY = {
    "all_to_all:ep": "exposed_ep_all_to_all",
    "all_reduce:tp": "exposed_tp",
    "pp_p2p": "exposed_pp_p2p",
    "RECV_F": "exposed_pp_p2p",
    "RECV_B": "exposed_pp_p2p",
    "dp_grad_sync": "exposed_dp_grad_sync",
    "ep_a2a": "exposed_ep_all_to_all",  # the runner's comm-lane name
}

MEMORY_WAIT_TYPES = frozenset({"memory_wait", "MEMORY_WAIT"})


def collective_category(name: str) -> str:
    """The capacity row of a collective name (``all_to_all:ep`` -> ``exposed_ep_all_to_all``; unknown names
    become ``exposed_<name>`` with non-alphanumerics replaced by ``_``)."""
    if name in _COLLECTIVE_CATEGORY:
        return _COLLECTIVE_CATEGORY[name]
    if name.endswith(":tp"):
        return "exposed_tp"
    return "exposed_" + re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").lower()


# ---------------------------------------------------------------------- action recipes
@dataclass
class ActionBreakdown:
    """Predicted time of one action (or bundle) split into capacity categories, seconds on one rank.

    Attributes:
        parts: category -> seconds; ``model_at_peak`` is the model-op FLOPs at peak (the useful part), the
            other keys are :data:`CATEGORIES` names. ``sum(parts) == total``.
        comm: collective (``all_to_all:ep``, ``all_reduce:tp``) -> standalone communication seconds issued
            by the action, hidden or not (for hidden fractions; not part of ``total``).
        total: the action's predicted time, seconds.
    """

    parts: dict[str, float] = field(default_factory=dict)
    comm: dict[str, float] = field(default_factory=dict)
    total: float = 0.0

    def add(self, other: "ActionBreakdown", sign: float = 1.0) -> "ActionBreakdown":
        for k, v in other.parts.items():
            self.parts[k] = self.parts.get(k, 0.0) + sign * v
        for k, v in other.comm.items():
            self.comm[k] = self.comm.get(k, 0.0) + sign * v
        self.total += sign * other.total
        return self

    def copy(self) -> "ActionBreakdown":
        return ActionBreakdown(dict(self.parts), dict(self.comm), self.total)


def lane_breakdown(
    order: Sequence[str],
    durations: Mapping[str, float],
    lanes: Mapping[str, str],
    deps: Mapping[str, Sequence[str]],
    tasks: Mapping[str, Task],
    *,
    contention: Contention,
    peak_flops: float,
    launch_s: float,
) -> ActionBreakdown:
    """Split the makespan of tasks run on the two lanes into capacity categories (seconds, one rank).

    Runs :func:`tessera_lab.cost.analytic.two_lane_makespan` and attributes: per compute task its launch time
    (``min(launch_s, duration)``) to ``runtime_overhead``; the rest to ``model_at_peak`` (FLOPs / peak) and
    ``kernel_efficiency`` for model-FLOP ops (:data:`tessera_lab.model.tasks.MODEL_FLOP_OPS`), else to
    ``non_model_work``; its span beyond its duration to ``overlap_contention``; per communication task the
    part of its span with no compute running to the collective's exposed row. The compute lane runs one task
    at a time and at every instant one lane is busy, so the parts sum to the makespan.

    Args:
        order: issue order (keys); durations: standalone seconds per key; lanes: ``compute``/``comm``;
        deps: key -> keys it waits for; tasks: key -> :class:`~tessera_lab.model.tasks.Task` (op, FLOPs, collective).
        contention: the cost model's contention; peak_flops: FLOP/s; launch_s: seconds per compute kernel.
    """
    classes = {k: kernel_class(t.op, t.is_comm) for k, t in tasks.items()}  # as the cost model runs them
    res = two_lane_makespan(tuple(order), durations, lanes, deps, contention, classes)
    parts: dict[str, float] = defaultdict(float)
    comm_total: dict[str, float] = defaultdict(float)
    comp_iv = []
    comm_spans = []
    for k in order:
        s, e = res.spans[k]
        d = float(durations[k])
        t = tasks[k]
        if lanes[k] == "compute":
            comp_iv.append((s, e))
            parts["overlap_contention"] += (e - s) - d
            launch = min(launch_s, d)
            parts["runtime_overhead"] += launch
            rest = d - launch
            if t.op in MODEL_FLOP_OPS:
                at_peak = min(t.flops / peak_flops, rest)
                parts["model_at_peak"] += at_peak
                parts["kernel_efficiency"] += rest - at_peak
            else:
                parts["non_model_work"] += rest
        else:
            key = f"{t.collective.kind}:{t.collective.group}" if t.collective else t.op
            comm_total[key] += d
            comm_spans.append((key, s, e))
    merged = merge_intervals(comp_iv)
    for key, s, e in comm_spans:
        if e > s:
            parts[collective_category(key)] += (e - s) - overlap_length([(s, e)], merged)
    return ActionBreakdown(dict(parts), dict(comm_total), res.makespan)


class _RecipeBuilder:
    """Per-layer phase and pair breakdowns of a plan's model, memoised."""

    def __init__(self, model: ModelSpec, parallel: ParallelConfig, cluster: Cluster):
        from tessera_lab.plan.make import PAIR_SEARCH_BUDGET

        self.model, self.parallel, self.cluster = model, parallel, cluster
        self.cm = CostModel(cluster, parallel)
        self.peak = cluster.gpu.peak_flops
        self.launch = self.cm.a["kernel_launch_s"]
        self.layer_tasks = decompose(model, parallel)  # embedding, layers..., head
        self.budget = PAIR_SEARCH_BUDGET
        self._phase: dict[tuple[int, str], ActionBreakdown] = {}
        self._pair: dict[tuple[str, str], ActionBreakdown] = {}

    def _run(self, order, durations, lanes, deps, tasks) -> ActionBreakdown:
        return lane_breakdown(order, durations, lanes, deps, tasks, contention=self.cm.contention,
                              peak_flops=self.peak, launch_s=self.launch)

    def phase(self, entry: int, phase: str) -> ActionBreakdown:
        """Breakdown of a standalone F/B/W bundle in program order; ``entry`` indexes ``decompose`` (0 =
        embedding, ``l + 1`` = decoder layer l, last = LM head). Same execution as
        :meth:`tessera_lab.cost.analytic.CostModel.phase_cost`."""
        key = (entry, phase)
        if key not in self._phase:
            tasks = getattr(self.layer_tasks[entry], phase)
            names = [t.name for t in tasks]
            known = set(names)
            self._phase[key] = self._run(
                names, {t.name: self.cm.task_time(t) for t in tasks},
                {t.name: "comm" if t.is_comm else "compute" for t in tasks},
                {t.name: tuple(d for d in t.deps if d in known) for t in tasks},
                {t.name: t for t in tasks})
        return self._phase[key]

    def pair(self, kind_f: str, kind_b: str) -> ActionBreakdown:
        """Breakdown of the forward of a ``kind_f`` layer run with the full backward of a ``kind_b`` layer in
        the overlap scheduler's best order (as :func:`tessera_lab.plan.make.layer_pair_costs`)."""
        key = (kind_f, kind_b)
        if key not in self._pair:
            from tessera_lab.overlap.core import Bundle, bundle, layer_kind_examples, pair_graph, schedule_pair

            ex = layer_kind_examples(self.model)
            a = bundle(self.model, ex[kind_f], "F", self.parallel, name="F")
            b = bundle(self.model, ex[kind_b], "BW", self.parallel, name="BW")
            res = schedule_pair(a, b, cost_model=self.cm, budget=self.budget)
            graph = pair_graph(a, b)
            tasks, durations = {}, {}
            for bd in (a, b):
                for t in bd.tasks:
                    k = f"{bd.name}/{Bundle.task_id(t)}"
                    tasks[k] = t
                    durations[k] = self.cm.task_time(t)
            self._pair[key] = self._run(res.order, durations, graph.lanes, graph.deps, tasks)
        return self._pair[key]

    def stage(self, s: int, layers: Sequence[int], overlapped: bool) -> dict[str, ActionBreakdown]:
        """Recipes of stage ``s`` owning ``layers``: ``F``, ``B`` (full backward), ``W``, ``I`` (= B - W) and,
        when ``overlapped``, ``OVERLAP_F_B``."""
        p = self.parallel
        last = len(self.layer_tasks) - 1
        extras = ([0] if s == 0 else []) + ([last] if s == p.pp - 1 else [])
        F, B, W = ActionBreakdown(), ActionBreakdown(), ActionBreakdown()
        for e in [l + 1 for l in layers] + extras:
            F.add(self.phase(e, "F"))
            B.add(self.phase(e, "B")).add(self.phase(e, "W"))
            W.add(self.phase(e, "W"))
        out = {"F": F, "B": B, "W": W, "I": B.copy().add(W, -1.0)}
        if overlapped:
            kinds = [self.model.layers[l].kind for l in layers]
            n = len(kinds)
            ov = ActionBreakdown()
            for k in range(n):
                ov.add(self.pair(kinds[k], kinds[n - 1 - k]))
            for e in extras:
                ov.add(self.phase(e, "F")).add(self.phase(e, "B")).add(self.phase(e, "W"))
            out["OVERLAP_F_B"] = ov
        return out


def evaluation_recipes(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, evaluation: Any,
                       *, builder: _RecipeBuilder | None = None) -> dict[tuple[int, str], ActionBreakdown]:
    """Recipes ``{(stage, action type): ActionBreakdown}`` of an evaluated plan
    (:class:`tessera_lab.plan.make.Evaluation`), one per stage and F / B / I / W / OVERLAP_F_B."""
    builder = builder or _RecipeBuilder(model, parallel, cluster)
    overlapped = any(st.overlap_s is not None for st in evaluation.stages)
    out = {}
    for st in evaluation.stages:
        for typ, bd in builder.stage(st.index, st.layers, overlapped).items():
            out[(st.index, typ)] = bd
    return out


# ---------------------------------------------------------------------- the report
@dataclass
class CapacityReport:
    """MFU and the lost time of one iteration split into categories (module docstring).

    Attributes:
        source: what was decomposed (``simulated plan: ...`` or ``observed run``).
        iteration_time_s: seconds.
        gpus: GPUs of the job (world size).
        peak_flops: dense bf16 peak per GPU, FLOP/s.
        model_flops: model FLOPs per iteration (Megatron-LM convention).
        parts: category -> GPU-seconds per iteration, in display order; sums to ``lost_gpu_s`` with
            ``residual`` included.
        ep_comm_gpu_s: EP all-to-all time issued in the iteration (standalone, hidden or not), GPU-seconds.
        comm_gpu_s: the same for every in-action collective (``all_to_all:ep``, ``all_reduce:tp``).
        per_rank: per pipeline rank: busy, idle and the idle split, seconds (one GPU of that rank).
        notes: assumptions and caveats.
    """

    source: str
    iteration_time_s: float
    gpus: int
    peak_flops: float
    model_flops: float
    parts: dict[str, float]
    ep_comm_gpu_s: float = 0.0
    comm_gpu_s: dict[str, float] = field(default_factory=dict)
    per_rank: list[dict[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_time_s(self) -> float:
        """Iteration time x GPUs, GPU-seconds."""
        return self.iteration_time_s * self.gpus

    @property
    def useful_gpu_s(self) -> float:
        """Model FLOPs at peak, GPU-seconds: ``model_flops / peak_flops``."""
        return self.model_flops / self.peak_flops

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs / (iteration time x GPUs x peak)."""
        return self.useful_gpu_s / self.gpu_time_s if self.gpu_time_s > 0 else 0.0

    @property
    def lost_gpu_s(self) -> float:
        """``iteration time x GPUs x (1 - MFU)``, GPU-seconds."""
        return self.gpu_time_s - self.useful_gpu_s

    @property
    def exposed_comm_gpu_s(self) -> dict[str, float]:
        """Exposed-communication rows only, GPU-seconds."""
        return {k: v for k, v in self.parts.items() if k.startswith("exposed_")}

    @property
    def ep_hidden_fraction(self) -> float:
        """Share of the EP all-to-all time hidden under compute: ``1 - exposed / issued`` (0 without EP)."""
        if self.ep_comm_gpu_s <= 0:
            return 0.0
        return 1.0 - self.parts.get("exposed_ep_all_to_all", 0.0) / self.ep_comm_gpu_s

    @property
    def ep_exposed_share(self) -> float:
        """Exposed EP all-to-all as a share of the iteration's GPU time."""
        return self.parts.get("exposed_ep_all_to_all", 0.0) / self.gpu_time_s if self.gpu_time_s > 0 else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """One dict per category: ``category``, ``label``, ``gpu_s``, ``ms_per_gpu``, ``share_of_lost``,
        ``share_of_gpu_time``, ``definition``."""
        lost, total = self.lost_gpu_s, self.gpu_time_s
        out = []
        for k, v in self.parts.items():
            out.append({
                "category": k, "label": LABELS.get(k, k.replace("_", " ")), "gpu_s": v,
                "ms_per_gpu": v / self.gpus * 1e3 if self.gpus else 0.0,
                "share_of_lost": v / lost if lost else 0.0,
                "share_of_gpu_time": v / total if total else 0.0,
                "definition": DEFINITIONS.get(k, f"idle compute lane covered by collective {k[8:]}"
                                              if k.startswith("exposed_") else ""),
            })
        return out

    def table(self):
        """The breakdown as a pandas DataFrame (rows of :meth:`rows`)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "iteration_time_s": self.iteration_time_s, "gpus": self.gpus,
            "peak_flops": self.peak_flops, "model_flops": self.model_flops, "mfu": self.mfu,
            "gpu_time_s": self.gpu_time_s, "useful_gpu_s": self.useful_gpu_s, "lost_gpu_s": self.lost_gpu_s,
            "parts_gpu_s": dict(self.parts), "ep_comm_gpu_s": self.ep_comm_gpu_s,
            "ep_hidden_fraction": self.ep_hidden_fraction, "ep_exposed_share": self.ep_exposed_share,
            "comm_gpu_s": dict(self.comm_gpu_s), "per_rank": self.per_rank, "notes": self.notes,
            "mfu_convention": MFU_CONVENTION,
        }

    def format(self) -> str:
        """Readable text: the headline numbers and the table."""
        from tabulate import tabulate

        head = (f"capacity report ({self.source}): iteration {self.iteration_time_s:.4f} s x {self.gpus} GPUs = "
                f"{self.gpu_time_s:.4g} GPU-s; model FLOPs at peak {self.useful_gpu_s:.4g} GPU-s; "
                f"MFU {self.mfu:.1%}; lost {self.lost_gpu_s:.4g} GPU-s")
        tiny = 1e-12 * max(1.0, self.gpu_time_s)  # float noise shows as 0 in the text (kept in the data)
        rows = [{"category": r["label"], "GPU-s": 0.0 if abs(r["gpu_s"]) < tiny else r["gpu_s"],
                 "ms/GPU": 0.0 if abs(r["gpu_s"]) < tiny else r["ms_per_gpu"],
                 "of lost": f"{r['share_of_lost']:.1%}", "of GPU time": f"{r['share_of_gpu_time']:.1%}"}
                for r in self.rows()]
        total = sum(self.parts.values())
        rows.append({"category": "sum", "GPU-s": total, "ms/GPU": total / self.gpus * 1e3 if self.gpus else 0.0,
                     "of lost": f"{total / self.lost_gpu_s:.1%}" if self.lost_gpu_s else "-",
                     "of GPU time": f"{total / self.gpu_time_s:.1%}" if self.gpu_time_s else "-"})
        lines = [head, tabulate(rows, headers="keys", floatfmt=".4g", tablefmt="simple")]
        if self.ep_comm_gpu_s > 0:
            lines.append(f"EP all-to-all: {self.ep_hidden_fraction:.1%} hidden under compute; exposed part "
                         f"{self.ep_exposed_share:.1%} of the iteration's GPU time")
        lines.append("MFU: " + MFU_CONVENTION)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


MFU_CONVENTION = ("Megatron-LM model FLOPs (3 x forward GEMM + attention-core FLOPs, causal at half, MoE via top-k x "
                  "expert width + shared expert, no recompute) / (iteration time x GPUs x peak dense bf16 FLOP/s)")


def _events_and_span(timeline: Any) -> tuple[list[Any], float, int]:
    """(events, iteration time, ranks) of a :class:`~tessera_lab.pipeline.simulate.Timeline` or a list of event
    dicts / objects with ``rank, stage, type, start, end, lane`` (times shifted so the first starts at 0)."""
    if hasattr(timeline, "events") and hasattr(timeline, "iteration_time"):
        events = list(timeline.events)
        ranks = timeline.num_ranks or (1 + max((e.rank for e in events), default=-1))
        return events, float(timeline.iteration_time), int(ranks)
    from types import SimpleNamespace

    raw = list(timeline)
    if not raw:
        raise ConfigError("field 'timeline' is empty; allowed: a Timeline or a non-empty list of events")
    events = []
    for n, e in enumerate(raw):
        get = e.get if isinstance(e, Mapping) else (lambda k, _e=e: getattr(_e, k, None))
        try:
            ev = SimpleNamespace(rank=int(get("rank")), stage=int(get("stage") if get("stage") is not None else -1),
                                 microbatch=get("microbatch"), type=str(get("type")), start=float(get("start")),
                                 end=float(get("end")), lane=str(get("lane") or "compute"), label=str(get("label") or ""))
        except (TypeError, ValueError):
            raise ConfigError(f"event {n} needs rank, stage, type, start and end; got {e!r}") from None
        if not (math.isfinite(ev.start) and math.isfinite(ev.end)) or ev.end < ev.start:
            raise ConfigError(f"event {n}: start={ev.start}, end={ev.end}; allowed: finite with end >= start")
        events.append(ev)
    t0 = min(e.start for e in events)
    for e in events:
        e.start -= t0
        e.end -= t0
    return events, max(e.end for e in events), 1 + max(e.rank for e in events)


def capacity_breakdown(
    timeline: Any,
    recipes: Mapping[tuple[int, str], ActionBreakdown | float],
    *,
    gpus: int,
    model_flops: float,
    peak_flops: float,
    nominal: Mapping[tuple[int, str], float] | None = None,
    nominal_iteration_s: float | None = None,
    source: str = "timeline",
    notes: Sequence[str] = (),
) -> CapacityReport:
    """Split the lost time of one iteration into the categories of the module docstring.

    Works for a simulated :class:`~tessera_lab.pipeline.simulate.Timeline` and for an observed run given in the same
    event format (a Timeline or a list of dicts with ``rank, stage, microbatch, type, start, end, lane,
    label``; comm-lane events name their collective in ``type``: ``RECV_F``/``RECV_B`` for stage-to-stage
    transfers, ``dp_grad_sync``, ...).

    Args:
        timeline: the iteration.
        recipes: predicted breakdown per ``(stage, action type)`` (:class:`ActionBreakdown`), or a plain
            predicted time in seconds (then compute beyond model FLOPs at peak is one ``compute_unsplit`` row).
        gpus: GPUs of the job; each of the timeline's ranks stands for ``gpus / ranks`` GPUs.
        model_flops: model FLOPs per iteration; peak_flops: FLOP/s per GPU.
        nominal: nominal duration per ``(stage, type)``, seconds (default: the recipe's predicted time); for
            an observed run, e.g. the median observed duration (see :func:`nominal_from_timeline`).
        nominal_iteration_s: the iteration time with every action at its nominal duration (separates the
            idle part of routing variance; without it that idle counts as bubble).

    Raises:
        ConfigError: a compute action without a recipe, ``gpus`` < ranks, non-positive peak.
    """
    events, T, R = _events_and_span(timeline)
    if gpus < R:
        raise ConfigError(f"field 'gpus' = {gpus} is out of range; allowed: >= the timeline's {R} ranks")
    if not peak_flops > 0:
        raise ConfigError(f"field 'peak_flops' = {peak_flops} is out of range; allowed: > 0")
    G = gpus / R
    parts: dict[str, float] = defaultdict(float)
    comm_total: dict[str, float] = defaultdict(float)
    model_at_peak = 0.0
    unsplit = False
    busy_sum = [0.0] * R
    busy0 = [0.0] * R
    comp_iv: list[list[tuple[float, float]]] = [[] for _ in range(R)]
    mem_iv: list[list[tuple[float, float]]] = [[] for _ in range(R)]
    comm_ev: list[list[tuple[float, float, str]]] = [[] for _ in range(R)]
    for e in events:
        if e.lane != "compute":
            name = "pp_p2p" if e.type in ("RECV_F", "RECV_B") else e.type
            if e.end > e.start:
                comm_ev[e.rank].append((e.start, e.end, name))
            continue
        if e.type in MEMORY_WAIT_TYPES:
            mem_iv[e.rank].append((e.start, e.end))
            continue
        key = (int(e.stage), str(e.type))
        if key not in recipes:
            raise ConfigError(f"no predicted breakdown for action type {key[1]!r} on stage {key[0]} "
                              f"(event {e.label or key}); allowed: the keys of 'recipes'")
        rec = recipes[key]
        d = e.end - e.start
        if isinstance(rec, ActionBreakdown):
            p0 = rec.total
            for k, v in rec.parts.items():
                if k == "model_at_peak":
                    model_at_peak += v
                else:
                    parts[k] += v
            for k, v in rec.comm.items():
                comm_total[k] += v
        else:
            p0 = float(rec)
            parts["compute_unsplit"] += p0
            unsplit = True
        d0 = float(nominal[key]) if nominal is not None and key in nominal else p0
        parts["runtime_overhead"] += d0 - p0
        parts["routing_variance"] += d - d0
        busy_sum[e.rank] += d
        busy0[e.rank] += d0
        comp_iv[e.rank].append((e.start, e.end))
    busy0_max = max(busy0) if busy0 else 0.0
    per_rank = []
    for r in range(R):
        merged = merge_intervals(comp_iv[r])
        union = sum(b - a for a, b in merged)
        parts["runtime_overhead"] -= busy_sum[r] - union  # compute events overlapping each other
        gaps = interval_gaps(merged, T)
        mem = merge_intervals(mem_iv[r])
        mem_wait = overlap_length(gaps, mem)
        parts["memory_wait"] += mem_wait
        idle_iv = _subtract(gaps, mem)
        idle = sum(b - a for a, b in idle_iv)
        exposed = _attribute(idle_iv, comm_ev[r])
        exp_total = 0.0
        for name, v in exposed.items():
            parts[collective_category(name)] += v
            exp_total += v
        rem = max(0.0, idle - exp_total)
        imb = min(rem, max(0.0, busy0_max - busy0[r]))
        rv_idle = 0.0
        if nominal_iteration_s is not None:
            excess = (idle + mem_wait) - (nominal_iteration_s - busy0[r])
            rv_idle = min(rem - imb, max(0.0, excess))
        bubble = rem - imb - rv_idle
        parts["stage_imbalance"] += imb
        parts["routing_variance"] += rv_idle
        parts["bubble"] += bubble
        # exposed comm can exceed idle only by float noise; keep the sum exact through ``bubble``
        if idle - exp_total < 0:
            parts["bubble"] += idle - exp_total
        per_rank.append({"rank": r, "busy_s": union, "idle_s": idle, "memory_wait_s": mem_wait,
                         "exposed_comm_s": exp_total, "stage_imbalance_s": imb, "routing_variance_idle_s": rv_idle,
                         "bubble_s": bubble + min(0.0, idle - exp_total)})
    useful = model_flops / peak_flops
    scaled = {k: v * G for k, v in parts.items()}
    if unsplit:
        scaled["compute_unsplit"] = scaled.get("compute_unsplit", 0.0) + model_at_peak * G - useful
    else:
        scaled["non_model_work"] = scaled.get("non_model_work", 0.0) + model_at_peak * G - useful
    ordered: dict[str, float] = {}
    std = [c for c in CATEGORIES if c != "residual"]
    extra_exposed = sorted(k for k in scaled if k.startswith("exposed_") and k not in std)
    names = std[:5] + extra_exposed + std[5:] + (["compute_unsplit"] if unsplit else [])
    for k in names:
        ordered[k] = scaled.get(k, 0.0)
    leftovers = [k for k in scaled if k not in ordered]
    for k in leftovers:
        ordered[k] = scaled[k]
    lost = T * gpus - useful
    ordered["residual"] = lost - math.fsum(ordered.values())
    all_notes = list(notes)
    if not mem_iv or not any(mem_iv):
        all_notes.append("memory wait: no memory_wait events in this timeline (the simulator models none)")
    if nominal_iteration_s is None and nominal is not None:
        all_notes.append("routing variance: idle caused by slow micro-batches counts as bubble (no nominal "
                         "iteration time given)")
    return CapacityReport(
        source=source, iteration_time_s=T, gpus=int(gpus), peak_flops=peak_flops, model_flops=model_flops,
        parts=ordered, ep_comm_gpu_s=comm_total.get("all_to_all:ep", 0.0) * G,
        comm_gpu_s={k: v * G for k, v in comm_total.items()}, per_rank=per_rank, notes=all_notes)


def _subtract(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged intervals ``a`` minus merged intervals ``b``."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def _attribute(idle: Sequence[tuple[float, float]], comm: Sequence[tuple[float, float, str]]) -> dict[str, float]:
    """Seconds of the idle intervals covered by each collective; instants covered by k collectives give
    1/k to each (sweep over interval end points)."""
    out: dict[str, float] = defaultdict(float)
    if not idle or not comm:
        return out
    points = sorted({p for s, e, _ in comm for p in (s, e)} | {p for s, e in idle for p in (s, e)})
    for a, b in zip(points, points[1:]):
        if b <= a:
            continue
        mid = 0.5 * (a + b)
        if not any(s <= mid < e for s, e in idle):
            continue
        active = [n for s, e, n in comm if s <= mid < e]
        if active:
            share = (b - a) / len(active)
            for n in active:
                out[n] += share
    return out


def nominal_from_timeline(timeline: Any, statistic: str = "median") -> dict[tuple[int, str], float]:
    """Nominal duration per ``(stage, action type)`` of a timeline's compute events: the ``median``
    (default) or ``mean`` over its micro-batches, seconds (for observed runs)."""
    import statistics

    if statistic not in ("median", "mean"):
        raise ConfigError(f"field 'statistic' = {statistic!r} is unknown; allowed: median, mean")
    events, _, _ = _events_and_span(timeline)
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    for e in events:
        if e.lane == "compute" and e.type not in MEMORY_WAIT_TYPES:
            groups[(int(e.stage), str(e.type))].append(e.end - e.start)
    fn = statistics.median if statistic == "median" else statistics.fmean
    return {k: float(fn(v)) for k, v in groups.items()}


def capacity_from_observed(timeline: Any, predicted: Mapping[tuple[int, str], ActionBreakdown | float], *,
                           gpus: int, model_flops: float, peak_flops: float,
                           nominal_iteration_s: float | None = None, statistic: str = "median") -> CapacityReport:
    """Capacity report of an observed run (e.g. the runner's per-action timings in the event format of
    :func:`capacity_breakdown`): nominal durations are the ``statistic`` (median by default) of the observed
    durations per (stage, action type), so the run's systematic deviation from ``predicted`` counts as runtime
    overhead and its per-micro-batch spread as routing variance.

    Args:
        timeline: observed events; predicted: per ``(stage, type)`` predicted time (seconds) or breakdown;
        gpus, model_flops, peak_flops: as :func:`capacity_breakdown` (FLOPs per iteration, FLOP/s per GPU).
    """
    return capacity_breakdown(timeline, predicted, gpus=gpus, model_flops=model_flops, peak_flops=peak_flops,
                              nominal=nominal_from_timeline(timeline, statistic),
                              nominal_iteration_s=nominal_iteration_s, source="observed run")


def capacity_from_runner(job: Mapping[str, Any], *, model_flops: float, peak_flops: float,
                         step: int | None = None) -> CapacityReport:
    """Capacity report of one step of a runner job (a job dict of :mod:`tessera_lab.runner`: ``events`` with
    ``step, rank, lane, type, stage, microbatch, start, end, label``; ``timing.durations`` with the per-stage
    ``f``, ``b``, ``w``, ``fb`` medians over the observed steps).

    Every timeline rank is one GPU (the runner records each global rank). Predicted and nominal times per
    (stage, action type) are the runner's medians, so compute beyond model FLOPs at peak is one
    ``compute_unsplit`` row, the step's deviation from the medians is routing variance, receive waits are
    exposed PP p2p and idle time under ``ep_a2a`` events is exposed EP all-to-all.

    Args:
        job: the runner's job result; model_flops: model FLOPs of one step of the run (FLOPs);
        peak_flops: peak FLOP/s of the device the run used; step: which step (default the last).

    Raises:
        ConfigError: a job without events or timing, or an unknown step.
    """
    events = job.get("events") if isinstance(job, Mapping) else None
    timing = job.get("timing") if isinstance(job, Mapping) else None
    if not events or not timing or "durations" not in timing:
        raise ConfigError("field 'job' needs 'events' and 'timing.durations' (a tessera_lab.runner job result)")
    steps = sorted({e["step"] for e in events})
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ConfigError(f"field 'step' = {step} is out of range; allowed: {', '.join(map(str, steps))}")
    evs = [e for e in events if e["step"] == step and e["lane"] in ("compute", "comm")]
    d = timing["durations"]
    pred: dict[tuple[int, str], float] = {}
    for s_, f in enumerate(d["f"]):
        b = d["b"][s_]
        w = d["w"][s_] if d.get("w") else 0.0
        pred[(s_, "F")] = f
        pred[(s_, "B")] = b
        pred[(s_, "I")] = b - w
        pred[(s_, "W")] = w
        if d.get("fb"):
            pred[(s_, "OVERLAP_F_B")] = d["fb"][s_]
    gpus = 1 + max(e["rank"] for e in evs)
    return capacity_breakdown(evs, pred, gpus=gpus, model_flops=model_flops, peak_flops=peak_flops,
                              source=f"runner job {job.get('name', '')!s} step {step}".replace("  ", " "),
                              notes=["predicted = the runner's median action times (no cost-model split)"])


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
                     "difference shows in the residual")
    p = plan.parallel
    src = (f"simulated plan: {plan.model.name}, {ev.method} partition, {p.schedule}, pp={p.pp} ep={p.ep} "
           f"tp={p.tp} dp={p.dp}, m={p.microbatches}" if timeline is None else
           f"timeline of {plan.model.name}, {ev.method} partition")
    return capacity_breakdown(tl, recipes, gpus=p.world_size, model_flops=plan.model_flops,
                              peak_flops=plan.cluster.gpu.peak_flops, nominal_iteration_s=nominal_iteration_s,
                              source=src, notes=notes)


# ---------------------------------------------------------------------- plans from JSON and from options
_VARIANT = re.compile(r"^(?P<base>[^\[]+)\[(?P<changes>[^\]]*)\]$")
_VARIANT_KEYS = {"ratio": "attention_ratio", "expert": "moe_intermediate_size", "topk": "num_experts_per_tok",
                 "experts": "num_experts", "shared": "shared_expert_intermediate_size", "layers": "num_layers"}


def model_from_name(name: str) -> ModelSpec:
    """A shipped model or config path, or a variant name as :meth:`ModelSpec.with_changes` writes it
    (``qwen3-next-80b-a3b[expert=256,topk=4]``).

    Raises:
        ConfigError: unknown model or change key.
    """
    m = _VARIANT.match(name.strip())
    if not m:
        return load_model(name)
    base = load_model(m.group("base"))
    changes = {}
    for item in filter(None, m.group("changes").split(",")):
        k, _, v = item.partition("=")
        if k not in _VARIANT_KEYS:
            raise ConfigError(f"field 'model' = {name!r}: change {k!r} is unknown; allowed: {', '.join(_VARIANT_KEYS)}")
        try:
            changes[_VARIANT_KEYS[k]] = int(v)
        except ValueError:
            raise ConfigError(f"field 'model' = {name!r}: {k}={v!r} is not an integer") from None
    return base.with_changes(**changes, name=name)


PARALLEL_KEYS = ("pp", "vpp", "tp", "ep", "dp", "microbatches", "micro_batch_size", "seq_len", "dtype",
                 "distributed_optimizer", "schedule", "dispatcher", "recompute", "precision", "grad_reduce_dtype",
                 "expert_load", "grouped_gemm", "fused_cross_entropy")


def _check_plan_consistency(data: Mapping[str, Any], parallel: Any, b: list[int], where: str) -> None:
    """The plan's recorded sizes agree with its parallel settings and boundaries: ``gpus`` is pp x dp x ep x tp and
    each recorded stage holds exactly the layers its boundaries give (every layer once)."""
    gpus = data.get("gpus")
    if gpus is not None and gpus != parallel.world_size:
        raise ConfigError(f"{where}: field 'gpus' = {gpus!r} disagrees with pp x dp x ep x tp = {parallel.world_size}")
    stages = data.get("stages")
    if stages is None:
        return
    if not isinstance(stages, list) or len(stages) != len(b) - 1:
        raise ConfigError(f"{where}: field 'stages' must list {len(b) - 1} stages (one per pipeline stage)")
    for s, st in enumerate(stages):
        layers = st.get("layers") if isinstance(st, Mapping) else None
        if layers is not None and layers != list(range(b[s], b[s + 1])):
            raise ConfigError(f"{where}: field 'stages[{s}].layers' disagrees with 'boundaries' "
                              f"(layers {b[s]} to {b[s + 1] - 1}); every layer belongs to exactly one stage")


def plan_from_json(data: Mapping[str, Any] | str | Path) -> Any:
    """Rebuild a :class:`~tessera_lab.plan.make.Plan` from ``tessera-lab plan --json`` output (keys ``model``,
    ``parallel``, ``boundaries``, ``gpu``, ``nodes``): the recorded partition is re-evaluated with the
    current cost model and simulator (baselines are not rebuilt).

    Raises:
        ConfigError: missing keys, a malformed file, or boundaries that do not partition the model's layers.
    """
    from tessera_lab.plan.partition import Partition
    from tessera_lab.plan.make import Plan, build_stage_model, evaluate
    from tessera_lab.cost.memory import memory_capacity
    from tessera_lab.model.tasks import model_flops_per_iteration

    where = "plan"
    if not isinstance(data, Mapping):
        path = Path(data)
        where = f"plan '{path}'"
        if not path.is_file():
            raise ConfigError(f"field 'plan' = {str(path)!r} is not a file; allowed: a JSON file from "
                              "'tessera-lab plan --json'")
        from tessera_lab.io import read_json

        data = read_json(path, "plan")
    if not isinstance(data, Mapping):
        raise ConfigError("field 'plan' must be a JSON object from 'tessera-lab plan --json'")
    for key in ("model", "parallel", "boundaries"):
        if key not in data:
            raise ConfigError(f"field 'plan.{key}' is missing; allowed: the output of 'tessera-lab plan --json'")
    model = model_from_name(str(data["model"]))
    par = data["parallel"]
    if not isinstance(par, Mapping):
        raise ConfigError("field 'plan.parallel' must be an object with pp, ep, tp, dp, ...")
    unknown = set(par) - set(PARALLEL_KEYS)
    if unknown:
        raise ConfigError(f"field 'plan.parallel' has unknown keys {sorted(unknown)}; allowed: {', '.join(PARALLEL_KEYS)}")
    from tessera_lab.checks import WORK_LIMITS, check_int, check_work

    for key in ("pp", "vpp", "tp", "ep", "dp", "microbatches", "micro_batch_size", "seq_len"):
        if key in par:  # type, range and work limits before any planning work
            check_int(par[key], f"parallel.{key}", where=where, limit=key if key in WORK_LIMITS else None)
    parallel = ParallelConfig(**par)
    check_work("world_size", parallel.world_size, field="field 'parallel' world size pp x dp x ep x tp", where=where)
    check_work("actions", parallel.pp * parallel.vpp * parallel.microbatches,
               field="field 'parallel' pp x vpp x microbatches", where=where)
    gpu = data.get("gpu", "H200")
    nodes = check_int(data["nodes"], "nodes", where=where, limit="nodes") if data.get("nodes") is not None else None
    cluster = Cluster.dgx(gpu, nodes) if nodes else cluster_for(parallel, gpu)
    b = data["boundaries"]
    L = model.num_layers
    if (not isinstance(b, list) or len(b) != parallel.pp + 1 or not all(isinstance(x, int) for x in b)
            or b[0] != 0 or b[-1] != L or any(y < x for x, y in zip(b, b[1:]))):
        raise ConfigError(f"field 'plan.boundaries' = {b!r} is invalid; allowed: {parallel.pp + 1} non-decreasing "
                          f"integers from 0 to {L}")
    _check_plan_consistency(data, parallel, b, where)
    cost_model, sm = build_stage_model(model, parallel, cluster)
    costs = [sm.cost(s, b[s], b[s + 1]) for s in range(parallel.pp)]
    part = Partition(list(b), costs, max(costs), max(costs), str(data.get("method", "from-json")),
                     stage_memory=[sm.memory_bytes(s, b[s], b[s + 1]) for s in range(parallel.pp)])
    flops = model_flops_per_iteration(model, parallel)
    ev = evaluate(model, parallel, cost_model, sm, part, part.method, flops)
    return Plan(model, parallel, cluster, ev, {}, sm.costs, flops, memory_capacity(cluster),
                notes=["re-evaluated from plan JSON"])


# ---------------------------------------------------------------------- model-change diff
PARALLEL_CHANGES = {"seq_len": "seq_len", "context_length": "seq_len", "dtype": "dtype", "precision": "dtype",
                    "micro_batch_size": "micro_batch_size", "microbatches": "microbatches"}
MODEL_CHANGES = {"attention_ratio": "attention_ratio", "expert_width": "moe_intermediate_size",
                 "moe_intermediate_size": "moe_intermediate_size", "top_k": "num_experts_per_tok",
                 "num_experts_per_tok": "num_experts_per_tok", "num_experts": "num_experts",
                 "shared_expert_intermediate_size": "shared_expert_intermediate_size", "layers": "num_layers",
                 "num_layers": "num_layers"}


def parse_changes(text: str) -> dict[str, Any]:
    """``"expert_width=256,top_k=4,seq_len=8192,dtype=fp8"`` -> dict (integers where they parse).

    Raises:
        ConfigError: an item without ``=`` or an unknown key.
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
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


def apply_changes(model: ModelSpec, parallel: ParallelConfig, changes: Mapping[str, Any]) -> tuple[ModelSpec, ParallelConfig]:
    """Apply model knobs (attention ratio, expert width, top-k, experts, layers) and run knobs (context
    length ``seq_len``, precision ``dtype``, micro-batch size, micro-batches) to a model and its parallel
    config. Precision changes activation and communication bytes; compute is still timed at the bf16 peak.

    Raises:
        ConfigError: unknown key or a value out of range (from the model / parallel validation).
    """
    mk, pk = {}, {}
    for k, v in changes.items():
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
        from tabulate import tabulate

        rows = [{k: v for k, v in r.items()} for r in self.summary_rows()]
        return "\n".join([
            f"model-change diff: {self.labels[0]}  vs  {self.labels[1]}",
            tabulate(rows, headers="keys", floatfmt=".4g", tablefmt="simple"), "",
            f"per stage (a = {self.labels[0]}, b = {self.labels[1]}; ms/mb: time per micro-batch as the schedule "
            "sees it)",
            tabulate(self.stage_rows(), headers="keys", floatfmt=".3f", tablefmt="simple"), "",
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
    dT = cb.iteration_time_s - ca.iteration_time_s
    top = max(contrib, key=lambda k: abs(contrib[k]))
    share = contrib[top] / dT if dT else float("nan")
    direction = "longer" if dT > 0 else ("shorter" if dT < 0 else "unchanged")
    headline = (
        f"{labels[1]} vs {labels[0]}: iteration {ca.iteration_time_s:.4f} -> {cb.iteration_time_s:.4f} s "
        f"({dT / ca.iteration_time_s:+.1%}, {direction}), MFU {ca.mfu:.1%} -> {cb.mfu:.1%}; the difference is dominated "
        f"by {top} ({contrib[top] * 1e3:+.2f} ms of {dT * 1e3:+.2f} ms per GPU"
        + (f", {share:.0%}" if math.isfinite(share) else "") + ")")
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
    return (f"{name or plan.model.name} on {p.world_size} x {plan.cluster.gpu.name}{sep}{ev.method} partition, "
            f"{p.schedule}, pp={p.pp} ep={p.ep} tp={p.tp} dp={p.dp}" + (f" vpp={p.vpp}" if p.vpp > 1 else "")
            + f", m={p.microbatches}, seq {p.seq_len}, {p.dtype}")


def report_figure(plan: Any, report: CapacityReport | None = None, diff: DiffReport | None = None) -> Any:
    """The ``report --plot`` figure: the waterfall of ``plan`` titled with its model and configuration; with
    a ``diff``, both variants' waterfalls side by side on one y scale under the diff's headline. Returns the
    matplotlib ``Figure``."""
    from tessera_lab.ui.plots import waterfall, waterfall_pair

    if diff is None:
        rep = report or capacity_report(plan)
        ax = waterfall(rep, title=f"{plan_caption(plan)}\nwhere the iteration goes: MFU {rep.mfu:.1%}, "
                                  f"lost {1 - rep.mfu:.1%}")
        return ax.figure
    titles = [f"{plan_caption(pl, name=label, sep=chr(10))}\nMFU {cap.mfu:.1%}, iteration {cap.iteration_time_s:.4f} s"
              for label, pl, cap in zip(diff.labels, diff.plans, diff.capacity)]
    return waterfall_pair(diff.capacity, titles=titles, suptitle=diff.headline)


def save_report_figure(path: str | Path, plan: Any, report: CapacityReport | None = None,
                       diff: DiffReport | None = None) -> Path:
    """Write :func:`report_figure` to ``path`` (PNG, 120 dpi); returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = report_figure(plan, report, diff)
    from tessera_lab.io import save_figure

    save_figure(fig, path)
    plt.close(fig)
    return path
