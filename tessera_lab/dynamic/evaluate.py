"""Planned dynamic filling evaluated on a job of EP groups: static vs dynamic on the routing that happens.

:func:`run_dynamic` simulates one step: each EP group routes its own data, predicts with the metadata of step
``step - lag`` (``lag = 0`` is exact metadata of this step: an *oracle*, an upper bound, labelled so), decides
with :func:`tessera_lab.dynamic.planner.plan_dynamic` and is realised with the routing of step ``step``. The job's
iteration ends when its slowest group ends (the data-parallel gradient synchronisation waits for all). Idle time
per rank is iteration time minus busy time; filling does not change the work, so the idle time removed per rank
equals the iteration time saved. :func:`gap_error` compares predicted and realised gaps.

The controller that decides during the step, from counts already routed and a stated predictor, is
:mod:`tessera_lab.dynamic.online`. Times are float seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tessera_lab.dynamic.durations import RoutedDurations, StageCosts, slowest_loads
from tessera_lab.dynamic.planner import DynamicPlan, plan_dynamic
from tessera_lab.dynamic.routing import DEFAULT_JITTER, RoutingSpec, parse_routing, token_counts
from tessera_lab.dynamic.routing_log import load_routing_log
from tessera_lab.errors import ConfigError
from tessera_lab.pipeline import passes
from tessera_lab.pipeline.schedules import Schedule, build_schedule, canonical_name
from tessera_lab.pipeline.simulate import Timeline, overlap_length

__all__ = ["DynamicJob", "GroupResult", "DynamicResult", "run_dynamic", "gap_error", "routing_counts", "schedule_for", "stages_per_rank"]


@dataclass
class GroupResult:
    """One EP group: its routing, its decision and the realised timelines (seconds)."""

    group: int
    counts: np.ndarray
    loads: np.ndarray
    predicted_loads: np.ndarray
    plan: DynamicPlan
    static: Timeline
    dynamic: Timeline

    @property
    def idle_removed_s(self) -> float:
        """Mean idle time removed per rank inside this group's own iteration (= its time saved)."""
        R = len(self.static.per_rank_idle)
        return (sum(self.static.per_rank_idle) - sum(self.dynamic.per_rank_idle)) / R


@dataclass
class DynamicResult:
    """Static vs dynamic for a whole job of ``groups`` EP groups (all times in seconds).

    The job's iteration time is the slowest group's; per-rank idle time is that minus the rank's busy time.
    """

    routing: str
    schedule: str
    costs: StageCosts
    groups: list[GroupResult]
    microbatches: int
    seed: int = 0
    step: int = 0
    lag: int = 0
    capacity_factor: float | None = None

    @property
    def iteration_static_s(self) -> float:
        return max(g.static.iteration_time for g in self.groups)

    @property
    def iteration_dynamic_s(self) -> float:
        return max(g.dynamic.iteration_time for g in self.groups)

    def _idle(self, which: str) -> float:
        T = self.iteration_static_s if which == "static" else self.iteration_dynamic_s
        busy = [b for g in self.groups for b in getattr(g, which).per_rank_busy]
        return sum(T - b for b in busy) / len(busy)

    @property
    def idle_static_s(self) -> float:
        """Mean idle seconds per rank in the static job."""
        return self._idle("static")

    @property
    def idle_dynamic_s(self) -> float:
        return self._idle("dynamic")

    @property
    def idle_removed_s(self) -> float:
        """Idle seconds removed per rank (mean over all ranks of all groups)."""
        return self.idle_static_s - self.idle_dynamic_s

    @property
    def idle_removed_share(self) -> float:
        """Share of the static idle time that filling removed."""
        return self.idle_removed_s / self.idle_static_s if self.idle_static_s > 0 else 0.0

    @property
    def throughput_gain(self) -> float:
        """``T_static / T_dynamic - 1`` (tokens per iteration unchanged)."""
        return self.iteration_static_s / self.iteration_dynamic_s - 1.0 if self.iteration_dynamic_s > 0 else 0.0

    @property
    def mean_imbalance(self) -> float:
        """Mean busiest-rank load over groups, layers and micro-batches."""
        return float(np.mean([g.loads.mean() for g in self.groups]))

    def summary(self) -> dict[str, Any]:
        """JSON-ready numbers."""
        return {
            "routing": self.routing, "schedule": self.schedule, "groups": len(self.groups),
            "stages": self.costs.num_stages, "microbatches": self.microbatches, "ep": self.costs.ep,
            "gpus": (self.groups[0].plan.static.num_ranks * self.costs.ep * len(self.groups)) if self.groups else 0,
            "seed": self.seed, "step": self.step, "prediction_lag": self.lag, "oracle": self.lag == 0,
            "capacity_factor": self.capacity_factor,
            "busiest_rank_load_mean": self.mean_imbalance,
            "busiest_rank_load_max": float(max(g.loads.max() for g in self.groups)),
            "iteration_static_s": self.iteration_static_s, "iteration_dynamic_s": self.iteration_dynamic_s,
            "idle_static_s": self.idle_static_s, "idle_dynamic_s": self.idle_dynamic_s,
            "idle_removed_s": self.idle_removed_s, "idle_removed_share": self.idle_removed_share,
            "group_idle_removed_s": float(np.mean([g.idle_removed_s for g in self.groups])),
            "throughput_gain": self.throughput_gain,
            "choices": [g.plan.choice for g in self.groups],
            "w_moves": [g.plan.moves for g in self.groups],
            "memory_cap": self.groups[0].plan.memory_cap if self.groups else [],
            "peak_activations_static": [max(g.static.peak_activations) for g in self.groups],
            "peak_activations_dynamic": [max(g.dynamic.peak_activations) for g in self.groups],
            "never_slower": all(g.dynamic.iteration_time <= g.static.iteration_time * (1 + 1e-12) for g in self.groups),
        }

    def rows(self) -> list[dict[str, Any]]:
        """Per-group table rows."""
        return [{
            "group": g.group, "busiest load (mean)": float(g.loads.mean()), "choice": g.plan.choice,
            "W moves": g.plan.moves, "static (s)": g.static.iteration_time, "dynamic (s)": g.dynamic.iteration_time,
            "idle removed/rank (s)": g.idle_removed_s,
        } for g in self.groups]


def routing_counts(spec: RoutingSpec, costs: StageCosts, microbatches: int, *, seed: int, group: int, step: int,
                    jitter: float, log_cache: dict) -> np.ndarray:
    """``[layers, microbatches, E]`` counts for one group and step (replay: cycled from the log)."""
    L = max(1, costs.num_layers)
    if spec.kind == "replay":
        log = log_cache.get(spec.path)
        if log is None:
            log = log_cache[spec.path] = load_routing_log(spec.path)
        groups = log.groups
        arr = log.group_counts(groups[group % len(groups)])  # [steps, layers, mb, E]
        a = arr[step % arr.shape[0]]
        li = np.arange(L) % a.shape[0]
        mi = np.arange(microbatches) % a.shape[1]
        return a[li][:, mi]
    return token_counts(spec, num_experts=costs.num_experts, tokens=costs.tokens, top_k=costs.top_k,
                        microbatches=microbatches, layers=L, seed=seed, group=group, first_step=step, jitter=jitter)


def stages_per_rank(name: str, vpp: int = 1) -> int:
    """Model chunks (stages) each rank holds in schedule ``name``: ``vpp`` for interleaved and zb-auto (1, or 2 for
    its V placement), 2 for DualPipeV and ZB-V, else 1."""
    name = canonical_name(name)
    if name in ("interleaved", "zb-auto"):
        return vpp
    return 2 if name in ("dualpipev", "zb-v") else 1


def schedule_for(costs: StageCosts, schedule: str | Schedule, microbatches: int, vpp: int = 1) -> Schedule:
    """The static schedule for ``costs``: a :class:`Schedule` as given, or built from its name with
    ``costs.num_stages / stages_per_rank`` ranks.

    Raises:
        ConfigError: the stage counts do not match.
    """
    if isinstance(schedule, Schedule):
        sched = schedule
    else:
        name = canonical_name(schedule)
        per_rank = stages_per_rank(name, vpp)
        if costs.num_stages % per_rank:
            raise ConfigError(f"field 'vpp' = {vpp}: {costs.num_stages} stages cannot be split into {per_rank} per rank")
        sched = build_schedule(name, costs.num_stages // per_rank, microbatches, vpp=vpp if name in ("interleaved", "zb-auto") else 1)
    if sched.num_stages != costs.num_stages:
        raise ConfigError(f"schedule {sched.name!r} has {sched.num_stages} stages but the stage costs cover "
                          f"{costs.num_stages}; allowed: equal counts")
    return sched


@dataclass(frozen=True)
class DynamicJob:
    """The job a dynamic run simulates, shared by :func:`run_dynamic` and
    :func:`tessera_lab.dynamic.online.run_online` (which take these fields as keyword arguments).

    Attributes:
        schedule: the static plan: a schedule name (built with ``costs.num_stages / vpp`` ranks) or a
            :class:`Schedule`. Default ``zb-h1`` (W already placed in the cool-down, so only routing-induced
            gaps are left); ``1f1b`` (W right after its I) also lets filling remove the warm-up/cool-down
            bubble.
        microbatches: micro-batches per step; vpp: chunks per rank.
        groups: EP groups in the job (the data-parallel replicas of an EP-coupled pipeline).
        seed: routing seed.
        capacity_factor: drop tokens above ``ceil(cf * tokens * k / E)`` per expert (``None``: no drops).
        memory_cap: live micro-batches per rank (:func:`tessera_lab.pipeline.passes.memory_caps`; default
            ``"max"``: the most activation memory the static plan needs on any rank).
        p2p_latency: seconds per stage-to-stage hop.
        jitter: per-micro-batch routing noise (:func:`~tessera_lab.dynamic.routing.token_counts`).
        w_chunks: parts each stage's W is split into for filling; default one per MoE layer of the stage
            (per-layer weight-gradient tasks), at least 1.
    """

    schedule: str | Schedule = "zb-h1"
    microbatches: int = 16
    vpp: int = 1
    groups: int = 1
    seed: int = 0
    capacity_factor: float | None = None
    memory_cap: int | Sequence[int] | str | None = "max"
    p2p_latency: float = 0.0
    jitter: float = DEFAULT_JITTER
    w_chunks: int | None = None

    def chunks(self, costs: StageCosts) -> int:
        """Parts per W: ``w_chunks``, or the most MoE layers of a stage (at least 1)."""
        return self.w_chunks if self.w_chunks is not None else max(1, max(len(ls) for ls in costs.stage_layers))


def run_dynamic(
    costs: StageCosts,
    routing: str | RoutingSpec = "zipf:1.0",
    *,
    step: int = 1,
    lag: int = 1,
    counts: Sequence[np.ndarray] | None = None,
    **job: Any,
) -> DynamicResult:
    """Simulate one step of a job with ``groups`` EP groups, static vs dynamic.

    Each group routes its own data (``token_counts(..., group=g)``), predicts with the metadata of step
    ``step - lag`` (default 1: the previous step's; ``lag = 0``: exact metadata of this step, an oracle, reported
    as ``"oracle": true``), decides with :func:`plan_dynamic` and is
    realised with the routing of step ``step``.

    Args:
        costs: stage times (:class:`StageCosts`); its stage count must match the schedule's.
        routing: ``uniform``, ``zipf:S``, ``drift:S[:R]`` or ``replay:PATH``.
        step, lag: step index, and how many steps old the prediction's metadata is.
        job: the fields of :class:`DynamicJob` (schedule, microbatches, vpp, groups, seed, capacity_factor,
            memory_cap, p2p_latency, jitter, w_chunks).
        counts: optional explicit ``[layers, microbatches, E]`` counts per group (overrides ``routing``
            for both prediction and realisation).

    Raises:
        ConfigError / ScheduleError: bad sizes, schedules or routing.
    """
    spec = parse_routing(routing)
    j = DynamicJob(**job)
    groups, seed, capacity_factor, jitter = j.groups, j.seed, j.capacity_factor, j.jitter
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"field 'groups' = {groups!r} is out of range; allowed: an integer >= 1")
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0 or lag > step:
        raise ConfigError(f"field 'lag' = {lag!r} is out of range; allowed: 0 to step = {step}")
    sched = schedule_for(costs, j.schedule, j.microbatches, j.vpp)
    microbatches = sched.num_microbatches
    chunks = j.chunks(costs)
    cache: dict = {}
    out = []
    for g in range(groups):
        if counts is not None:
            real = np.asarray(counts[g % len(counts)])
            pred = real
        else:
            real = routing_counts(spec, costs, microbatches, seed=seed, group=g, step=step, jitter=jitter, log_cache=cache)
            pred = real if lag == 0 else routing_counts(spec, costs, microbatches, seed=seed, group=g,
                                                         step=step - lag, jitter=jitter, log_cache=cache)
        kw: dict[str, Any] = {}
        if capacity_factor is not None:
            k = costs.top_k
            if spec.kind == "replay" and counts is None:
                k = cache[spec.path].top_k or k
            kw = dict(tokens=max(1, int(real.sum(-1).max() // k)), top_k=k, capacity_factor=capacity_factor)
        x_real = slowest_loads(real, costs.ep, **kw)
        x_pred = slowest_loads(pred, costs.ep, **kw)
        d_real = RoutedDurations(costs, x_real)
        d_pred = d_real if pred is real else RoutedDurations(costs, x_pred)
        plan = plan_dynamic(sched, d_pred, grad_sync=costs.grad_sync if any(costs.grad_sync) else None,
                            memory_cap=j.memory_cap, activation_bytes=costs.activation_bytes,
                            p2p_latency=j.p2p_latency, w_chunks=chunks)
        st, dy = plan.realise(d_real)
        out.append(GroupResult(g, real, x_real, x_pred, plan, st, dy))
    return DynamicResult(str(spec), sched.name, costs, out, microbatches, seed, step, lag, capacity_factor)


def _interval_overlap(a: list[passes.Gap], b: list[passes.Gap]) -> float:
    """Seconds shared by two ranks' gap lists (each sorted and disjoint, as :func:`idle_gaps` returns)."""
    return overlap_length([(g.start, g.end) for g in a], [(g.start, g.end) for g in b])


def gap_error(predicted: Timeline, realised: Timeline) -> dict[str, float]:
    """Compare predicted and realised idle gaps of the same order (seconds).

    Returns ``gap_mae_s`` (mean absolute length error over gaps matched by rank and the action that ends
    them; a gap missing on one side counts with length 0), ``idle_mae_s`` (per-rank total idle),
    ``makespan_error`` (relative), ``recall`` (share of realised gap time inside predicted gaps) and
    ``precision`` (share of predicted gap time that is realised idle).
    """
    gp, gr = passes.idle_gaps(predicted), passes.idle_gaps(realised)
    errs = []
    overlap = pred_total = real_total = 0.0
    for r in set(gp) | set(gr):
        a = {g.before: g.length for g in gp.get(r, [])}
        b = {g.before: g.length for g in gr.get(r, [])}
        for key in set(a) | set(b):
            errs.append(abs(a.get(key, 0.0) - b.get(key, 0.0)))
        overlap += _interval_overlap(gp.get(r, []), gr.get(r, []))
        pred_total += sum(g.length for g in gp.get(r, []))
        real_total += sum(g.length for g in gr.get(r, []))
    idle_err = [abs(p - q) for p, q in zip(predicted.per_rank_idle, realised.per_rank_idle)]
    return {
        "gap_mae_s": float(np.mean(errs)) if errs else 0.0,
        "gaps_predicted": sum(len(v) for v in gp.values()),
        "gaps_realised": sum(len(v) for v in gr.values()),
        "idle_mae_s": float(np.mean(idle_err)) if idle_err else 0.0,
        "makespan_error": (predicted.iteration_time - realised.iteration_time) / realised.iteration_time
        if realised.iteration_time else 0.0,
        "recall": overlap / real_total if real_total > 0 else 1.0,
        "precision": overlap / pred_total if pred_total > 0 else 1.0,
    }
