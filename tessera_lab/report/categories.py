"""Capacity categories and per-action recipes: what one action's predicted time is made of.

The category names, labels and definitions of the capacity report (:mod:`tessera_lab.report.capacity`,
docs/concepts.md), :func:`lane_breakdown` (a bundle's two-lane makespan split into categories) and the recipes of an
evaluated plan (:func:`evaluation_recipes`: per stage and action type, built from the same per-layer tasks and
the same analytic pair orders the planner used, :func:`tessera_lab.plan.stages.analytic_pair`). Seconds on one
rank. Never imports torch.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tessera_lab.cost.analytic import Contention, CostModel
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.cost.contention import kernel_class
from tessera_lab.model.hardware import Cluster, ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import MODEL_FLOP_OPS, Task, decompose
from tessera_lab.overlap.core import Bundle, layer_kind_examples, pair_graph
from tessera_lab.pipeline.simulate import merge_intervals, overlap_length
from tessera_lab.plan.stages import PAIR_SEARCH_BUDGET, analytic_pair

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

#: rows that appear only when nonzero (after the row named): FP8 GEMMs faster than the bf16 peak MFU is measured
#: against; :data:`DOCUMENTED` lists them in place for ``report --help`` and docs/cli.md
CONDITIONAL = {"beyond_bf16_peak": "kernel_efficiency"}
DOCUMENTED = tuple(x for c in CATEGORIES for x in (c, *[k for k, after in CONDITIONAL.items() if after == c]))

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
    "beyond_bf16_peak": "faster than bf16 peak (FP8)",
    "overlap_contention": "overlap contention",
    "residual": "residual",
    "compute_unsplit": "compute beyond model FLOPs at peak (unsplit)",
}

DEFINITIONS = {
    "stage_imbalance": ("idle while the busiest rank does more work: each rank's idle time, up to the nominal "
                        "compute it has less than the busiest rank"),
    "exposed_ep_all_to_all": "EP dispatch/combine all-to-all time with no compute kernel running",
    "exposed_pp_p2p": "idle compute lane covered by a stage-to-stage transfer into the rank",
    "exposed_tp": "TP all-reduce time with no compute kernel running",
    "exposed_dp_grad_sync": "idle compute lane covered by the end-of-iteration gradient sync",
    "bubble": "rest of the idle time: pipeline fill/drain and schedule dependency waits",
    "routing_variance": "actions beyond their nominal (uniform-routing) time, plus idle beyond the nominal idle",
    "memory_wait": "compute-lane memory_wait events (none in simulation)",
    "runtime_overhead": ("kernel launch/tail per compute task, host/sync of MoE layer forwards (all of it run apart, "
                         "beyond the paired expert backward when paired); observed beyond predicted time for runs"),
    "non_model_work": "router, norms, element-wise, permute, embedding, loss, recompute: not model FLOPs",
    "kernel_efficiency": "model-FLOP kernels below peak: their time minus their FLOPs at peak",
    "beyond_bf16_peak": ("model-FLOP kernels faster than their FLOPs at the dense bf16 peak (FP8 GEMMs): their time "
                         "minus their FLOPs at that peak, negative; a row only when some kernel is"),
    "overlap_contention": "compute slowed down beside communication kernels (contention)",
    "residual": "lost time minus the sum of the rows above",
    "compute_unsplit": "compute time minus model FLOPs at peak, without a per-task prediction to split it",
}

#: each row's formula (GPU-seconds per iteration; G = GPUs / pp: the GPUs one simulated rank stands for; the
#: lost time is iteration time x GPUs x (1 - MFU)); printed by ``report --help`` and in docs/cli.md
FORMULAS = {
    "stage_imbalance": ("G x sum_r min(idle_r', busy0_max - busy0_r), idle_r' = idle time left after exposed "
                        "communication and memory wait, busy0 = compute time at nominal durations"),
    "exposed_ep_all_to_all": "G x sum over actions of the time only the EP all-to-all runs (no compute kernel)",
    "exposed_pp_p2p": "G x idle compute-lane time covered by a RECV_F / RECV_B into the rank",
    "exposed_tp": "G x sum over actions of the time only the TP all-reduce runs",
    "exposed_dp_grad_sync": "G x idle compute-lane time covered by the end-of-iteration gradient sync",
    "bubble": "G x idle time left after the rows above (fill, drain, dependency waits)",
    "routing_variance": "G x sum (duration - nominal duration) + idle beyond the nominal idle T0 - busy0_r, T0 = the "
                         "nominal iteration time",
    "memory_wait": "G x compute-lane memory_wait events (0 in simulation)",
    "runtime_overhead": "G x (kernel_launch_s per compute task + host issue beyond GPU time + host/sync per MoE "
                        "layer forward run apart + max(0, host/sync - paired expert backward) per paired one)",
    "non_model_work": "G x time of compute that is not model FLOPs (+ uncounted model-op FLOPs at peak)",
    "kernel_efficiency": "G x sum over model-FLOP kernels of max(0, time without launch - model FLOPs / peak FLOP/s)",
    "beyond_bf16_peak": "G x sum over model-FLOP kernels of min(0, time without launch - model FLOPs / bf16 peak)",
    "overlap_contention": "G x sum over compute spans of (time beside communication - standalone time)",
    "residual": "lost time - sum of the rows above",
}


def categories_help() -> str:
    """The capacity report's rows, each with its label, definition and formula (``report --help``)."""
    lines = ["capacity report rows (GPU-seconds per iteration; lost time = iteration time x GPUs x (1 - MFU), MFU = "
             "model FLOPs / (iteration time x GPUs x peak dense bf16)):"]
    for k in DOCUMENTED:
        lines.append(f"  {LABELS[k]}: {DEFINITIONS[k]}; = {FORMULAS[k]}")
    return "\n".join(lines)

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
    host_excess: Mapping[str, float] | None = None,
    demands: Mapping[str, Any] | None = None,
) -> ActionBreakdown:
    """Split the makespan of tasks run on the two lanes into capacity categories (seconds, one rank).

    Runs :func:`tessera_lab.cost.lanes.pair_makespan` and attributes: per compute task its launch time
    (``min(launch_s, duration)``) to ``runtime_overhead``; the rest to ``model_at_peak`` (FLOPs / peak) and
    ``kernel_efficiency`` for model-FLOP ops (:data:`tessera_lab.model.tasks.MODEL_FLOP_OPS`), else to
    ``non_model_work``; its span beyond its duration to ``overlap_contention``; per communication task the
    part of its span with no compute running to the collective's exposed row. The compute lane runs one task
    at a time and at every instant one lane is busy, so the parts sum to the makespan.

    Args:
        order: issue order (keys); durations: standalone seconds per key; lanes: ``compute``/``comm``;
        deps: key -> keys it waits for; tasks: key -> :class:`~tessera_lab.model.tasks.Task` (op, FLOPs, collective).
        contention: the cost model's contention; peak_flops: FLOP/s; launch_s: seconds per compute kernel.
        host_excess: key -> seconds a compute task waits on the host's eager kernel issue beyond its GPU time
            (:meth:`tessera_lab.cost.analytic.CostModel.host_excess`), also ``runtime_overhead``.
        demands: key -> the task's demand on shared resources (:meth:`tessera_lab.cost.analytic.CostModel.demands`;
            ``None``: the class constants of ``contention``).
    """
    classes = {k: kernel_class(t.op, t.is_comm) for k, t in tasks.items()}  # as the cost model runs them
    res = pair_makespan(tuple(order), durations, lanes, deps, contention=contention, classes=classes, demands=demands)
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
            launch = min(launch_s + (host_excess or {}).get(k, 0.0), d)
            parts["runtime_overhead"] += launch
            rest = d - launch
            if t.op in MODEL_FLOP_OPS:
                at_peak = t.flops / peak_flops
                parts["model_at_peak"] += at_peak
                # an FP8 GEMM can beat the bf16 peak MFU is measured against: the gain is its own (negative) row
                parts["kernel_efficiency" if rest >= at_peak else "beyond_bf16_peak"] += rest - at_peak
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
                              peak_flops=self.peak, launch_s=self.launch,
                              host_excess={k: self.cm.host_excess(t) for k, t in tasks.items()},
                              demands=self.cm.demands(tasks))

    def _own_streams(self, bd: ActionBreakdown, side: Sequence[Task], before_s: float = 0.0) -> ActionBreakdown:
        """``bd`` (a bundle's two lanes) with ``side``, tasks on streams of their own beside them
        (:meth:`tessera_lab.cost.analytic.CostModel.own_stream_time`, the lanes of ``before_s`` seconds of an earlier
        bundle included): what they add is their collectives' exposed rows where the link binds, else the SM share
        their kernels take from the lanes (``overlap_contention``)."""
        if not side:
            return bd
        out = bd.copy()
        times = [self.cm.task_time(t) for t in side]  # (a B and a W task may share a name)
        link = sum(times)
        total = self.cm.own_stream_time(before_s + bd.total, side) - before_s
        extra = total - bd.total
        binds = before_s + total <= link * (1 + 1e-12)  # the link outlasts the lanes (with the SM share they lose)
        for t, d in zip(side, times):
            key = f"{t.collective.kind}:{t.collective.group}"
            out.comm[key] = out.comm.get(key, 0.0) + d
            if binds:
                cat = collective_category(key)
                out.parts[cat] = out.parts.get(cat, 0.0) + extra * d / link
        if not binds:
            out.parts["overlap_contention"] = out.parts.get("overlap_contention", 0.0) + extra
        out.total = total
        return out

    def phase(self, entry: int, phase: str) -> ActionBreakdown:
        """Breakdown of a standalone F/B/W bundle in program order; ``entry`` indexes ``decompose`` (0 =
        embedding, ``l + 1`` = decoder layer l, last = LM head). Same execution as
        :meth:`tessera_lab.cost.analytic.CostModel.layer_cost` (tasks on streams of their own beside the lanes, a
        layer's backward ones priced with its W)."""
        key = (entry, phase)
        if key not in self._phase:
            lt = self.layer_tasks[entry]
            tasks = [t for t in getattr(lt, phase) if not t.own_stream]
            # as CostModel.layer_cost: F's own-stream tasks beside F, the backward's (B's and W's) beside B then W
            side = {"F": [t for t in lt.F if t.own_stream], "B": [],
                    "W": [t for t in lt.B + lt.W if t.own_stream]}[phase]
            before = self.phase(entry, "B").total if side and phase == "W" else 0.0
            names = [t.name for t in tasks]
            known = set(names)
            self._phase[key] = self._run(
                names, {t.name: self.cm.task_time(t) for t in tasks},
                {t.name: "comm" if t.is_comm else "compute" for t in tasks},
                {t.name: tuple(d for d in t.deps if d in known) for t in tasks},
                {t.name: t for t in tasks})
            self._phase[key] = self._own_streams(self._phase[key], side, before)
        return self._phase[key]

    def pair(self, kind_f: str, kind_b: str) -> ActionBreakdown:
        """Breakdown of the forward of a ``kind_f`` layer run with the full backward of a ``kind_b`` layer in
        the overlap scheduler's best order (the planner's :func:`tessera_lab.plan.stages.analytic_pair`)."""
        key = (kind_f, kind_b)
        if key not in self._pair:
            a, b, res = analytic_pair(self.model, self.parallel, self.cluster, kind_f, kind_b, self.budget)
            graph = pair_graph(a, b)
            tasks, durations = {}, {}
            for bd in (a, b):
                for t in bd.tasks:
                    k = f"{bd.name}/{Bundle.task_id(t)}"
                    tasks[k] = t
                    durations[k] = self.cm.task_time(t)
            bd = self._run(res.order, durations, graph.lanes, graph.deps, tasks)
            ex = layer_kind_examples(self.model)
            side = [t for t in self.layer_tasks[ex[kind_f] + 1].F if t.own_stream] + \
                [t for t in self.layer_tasks[ex[kind_b] + 1].B + self.layer_tasks[ex[kind_b] + 1].W if t.own_stream]
            self._pair[key] = self._own_streams(bd, side)
        return self._pair[key]

    def stage(self, s: int, layers: Sequence[int], overlapped: bool) -> dict[str, ActionBreakdown]:
        """Recipes of stage ``s`` owning ``layers``: ``F``, ``B`` (full backward), ``W``, ``I`` (= B - W) and,
        when ``overlapped``, ``OVERLAP_F_B``."""
        p = self.parallel
        last = len(self.layer_tasks) - 1
        extras = ([0] if s == 0 else []) + ([last] if s == p.pp * p.vpp - 1 else [])
        F, B, W = ActionBreakdown(), ActionBreakdown(), ActionBreakdown()
        for e in [l + 1 for l in layers] + extras:
            F.add(self.phase(e, "F"))
            B.add(self.phase(e, "B")).add(self.phase(e, "W"))
            W.add(self.phase(e, "W"))
        out = {"F": F, "B": B, "W": W, "I": B.copy().add(W, -1.0)}
        if overlapped:
            kinds = [self.model.stack.layers[l].kind for l in layers]
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
    (:class:`tessera_lab.plan.make.Evaluation`), one per stage and F / B / I / W / OVERLAP_F_B; a stage's
    host/sync seconds (``StagePlan.host_sync_s``, :mod:`tessera_lab.cost.sync`) go to the F recipe's
    ``runtime_overhead``, the exposed part of its paired forwards' (``StagePlan.paired_host_sync_s``) to the
    OVERLAP_F_B recipe's."""
    builder = builder or _RecipeBuilder(model, parallel, cluster)
    overlapped = any(st.overlap_s is not None for st in evaluation.stages)
    out = {}
    for st in evaluation.stages:
        for typ, bd in builder.stage(st.index, st.layers, overlapped).items():
            out[(st.index, typ)] = bd
        sync = getattr(st, "host_sync_s", 0.0)
        if sync:  # the host/sync term in the stage's forward (cost/sync.py): the host, not the GPU, sets that time
            out[(st.index, "F")].add(ActionBreakdown({"runtime_overhead": sync}, {}, sync))
        paired = getattr(st, "paired_host_sync_s", 0.0)
        if paired and (st.index, "OVERLAP_F_B") in out:  # the part of the paired forwards' waits left exposed
            out[(st.index, "OVERLAP_F_B")].add(ActionBreakdown({"runtime_overhead": paired}, {}, paired))
    return out


