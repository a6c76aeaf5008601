"""The one evaluation path: a partition under its cost source -> schedule, durations, p2p, gradient sync ->
simulated timeline and metrics.

:func:`evaluate` is what the planner (:func:`tessera_lab.plan.make.make_plan`), the plan loader
(:func:`tessera_lab.plan.load.load_plan`), topology (per-stage devices and speed factors) and the widgets use.
Inputs: the model, parallel sizes, one ``(CostModel, StageCostModel)`` per (virtual) stage (or one for all),
the partition (``pp * vpp + 1`` boundaries in virtual-stage order), optional per-stage speed factors. Output: an
:class:`Evaluation` (seconds, bytes per GPU, tokens/s, MFU). MFU = model FLOPs / (iteration time x GPUs x peak
dense bf16 FLOP/s), with the peak of each stage's GPU when stages differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from tessera_lab.cost.analytic import CostModel
from tessera_lab.cost.memory import gpu_params, memory_capacity
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import Collective
from tessera_lab.pipeline.actions import ActionType
from tessera_lab.pipeline.engine import compile_schedule
from tessera_lab.pipeline.simulate import Timeline, simulate, stage_durations
from tessera_lab.plan.partition import Partition
from tessera_lab.plan.stages import StageCostModel
from tessera_lab.plan.vschedules import plan_schedule


@dataclass
class StagePlan:
    """One pipeline stage: its layers, per-micro-batch times (seconds) and memory (bytes per GPU); ``host_sync_s``:
    the host/sync seconds (:mod:`tessera_lab.cost.sync`) included in ``f_s``; ``overlap_s``: the makespan of one
    forward paired with one backward on this stage (layer-pair costs), ``None`` without pair costs;
    ``paired_host_sync_s``: the host/sync seconds included in ``overlap_s`` (the paired forwards' waits the paired
    backwards' ``mlp`` nodes do not hide, :func:`tessera_lab.cost.sync.paired_exposed_s`); ``paired``:
    whether the simulated schedule runs any backward of this stage in an ``OVERLAP_F_B`` pair (``False``, e.g. with
    one micro-batch: nothing can pair, so :attr:`time_s` is the standalone time)."""

    index: int
    layers: list[int]
    kinds: list[str]
    f_s: float
    b_s: float
    w_s: float
    memory_bytes: float
    param_bytes: float
    activation_bytes: float
    overlap_s: float | None = None
    host_sync_s: float = 0.0
    paired: bool = True
    paired_host_sync_s: float = 0.0

    @property
    def standalone_s(self) -> float:
        """Forward + full backward (input and weight gradient) per micro-batch run one after the other, seconds."""
        return self.f_s + self.b_s

    @property
    def time_s(self) -> float:
        """Time per micro-batch as the schedule sees it: after overlap (pair costs and a schedule that pairs this
        stage's backwards) or standalone, seconds."""
        return self.overlap_s if self.overlap_s is not None and self.paired else self.standalone_s

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "layers": self.layers, "kinds": self.kinds, "time_s": self.time_s,
                "standalone_s": self.standalone_s, "overlap_s": self.overlap_s, "f_s": self.f_s, "b_s": self.b_s,
                "w_s": self.w_s, "memory_bytes": self.memory_bytes, "param_bytes": self.param_bytes,
                "activation_bytes": self.activation_bytes,
                **({"host_sync_s": self.host_sync_s} if self.host_sync_s else {}),
                **({"paired_host_sync_s": self.paired_host_sync_s} if self.paired_host_sync_s else {}),
                **({"paired": False} if self.overlap_s is not None and not self.paired else {})}


@dataclass
class Evaluation:
    """A partition evaluated by the simulator."""

    method: str
    partition: Partition
    stages: list[StagePlan]
    timeline: Timeline
    iteration_time_s: float
    tokens_per_s: float
    mfu: float
    bubble_fraction: float
    exposed_comm_s: dict[str, float]
    fits_memory: bool = True

    def rank_memory(self, pp: int) -> list[float]:
        """Bytes per pipeline rank: its virtual stages' memory summed (stage ``s`` runs on rank ``s mod pp``,
        Megatron's interleaved placement); one entry per stage without virtual stages."""
        out = [0.0] * pp
        for st in self.stages:
            out[st.index % pp] += st.memory_bytes
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method, "boundaries": self.partition.boundaries,
            "stages": [s.as_dict() for s in self.stages], "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s, "mfu": self.mfu, "bubble_fraction": self.bubble_fraction,
            "bubble_overhead": self.timeline.bubble_overhead, "exposed_comm_s": self.exposed_comm_s,
            "fits_memory": self.fits_memory, "solver": self.partition.solver,
            "solver_status": self.partition.status, "solve_time_s": self.partition.solve_time_s,
        }


def dp_grad_sync_time(model: ModelSpec, cost_model: CostModel, stage: StagePlan, *,
                      num_stages: int | None = None) -> float:
    """Gradient synchronisation at the end of the iteration on one stage, seconds.

    Non-expert gradients are reduced over the ``ep * dp`` data-parallel ranks, expert gradients over
    ``dp``: a reduce-scatter plus all-gather of the bf16 parameters with a distributed optimizer
    (together the bus volume of one all-reduce), else an all-reduce of the gradients. ``num_stages``
    (default ``pp``) tells which stage holds the LM head.
    """
    return grad_sync(model, cost_model).time(stage.index, stage.layers, num_stages)


class GradSync:
    """:func:`dp_grad_sync_time` with the per-entry parameter counts (:func:`gpu_params`) looked up once and
    collective times memoised by ``(bytes, group, size)``; one per ``(model, cost model)`` (:func:`grad_sync`)."""

    def __init__(self, model: ModelSpec, cost_model: CostModel):
        self.model, self.cost_model = model, cost_model
        p = cost_model.parallel
        self._params = {idx: gpu_params(model, p, idx) for idx in range(-1, model.num_layers + 1)}
        self._coll: dict[tuple[float, str, int], float] = {}
        self._times: dict[tuple, float] = {}  # memo of :meth:`time` by its arguments

    def time(self, index: int, layers, num_stages: int | None = None) -> float:
        """Seconds of the gradient sync of (virtual) stage ``index`` owning decoder ``layers``."""
        key = (index, tuple(layers), num_stages)
        got = self._times.get(key)
        if got is None:
            got = self._times[key] = self._time(index, layers, num_stages)
        return got

    def _time(self, index: int, layers, num_stages: int | None) -> float:
        model, p = self.model, self.cost_model.parallel
        last = (num_stages or p.pp) - 1
        # with FSDP the decoder layers' gradients are reduce-scattered every micro-batch (their W tasks,
        # tessera_lab.model.tasks); only the embedding's and head's are left to the end of the iteration
        entries = ([] if p.fsdp else list(layers)) + ([-1] if index == 0 else []) + \
            ([model.num_layers] if index == last else [])
        dense = expert = 0.0
        params = self._params
        for idx in entries:
            d, e = params[idx] if idx in params else gpu_params(model, p, idx)
            dense, expert = dense + d, expert + e
        t = 0.0
        for n_params, group, size in ((dense, "edp", p.dense_shard_dp), (expert, "dp", p.expert_dp)):
            if size > 1 and n_params > 0:
                nbytes = n_params * p.grad_sync_bytes_per_param
                key = (nbytes, group, size)
                c = self._coll.get(key)
                if c is None:
                    c = self._coll[key] = self.cost_model.collective_time(Collective("all_reduce", nbytes, group, size))
                t += c
        return t


def grad_sync(model: ModelSpec, cost_model: CostModel) -> GradSync:
    """The :class:`GradSync` of ``(model, cost_model)``, kept on the cost model (built once per pair)."""
    held = cost_model.__dict__.get("_grad_sync")
    if held is None or held.model is not model:
        held = cost_model.__dict__["_grad_sync"] = GradSync(model, cost_model)
    return held


#: schedules the planner searches on the stage times (built per evaluation; the others depend on (pp, m, vpp) only)
DURATION_DEPENDENT_SCHEDULES = ("zb-auto",)


@lru_cache(maxsize=64)
def _fixed_schedule(name: str, pp: int, m: int, vpp: int):
    """``(schedule, compiled program)`` of a schedule that depends on ``(name, pp, m, vpp)`` only, built and
    compiled once (private to :func:`evaluate`, which never changes it)."""
    schedule = plan_schedule(name, pp, m, vpp)
    return schedule, compile_schedule(schedule)


@lru_cache(maxsize=256)
def stage_action_counts(name: str, pp: int, m: int, vpp: int) -> tuple[tuple[int, int, int, int, int], ...]:
    """Per virtual stage ``s`` of the fixed schedule ``name`` (one that depends on ``(pp, m, vpp)`` only, not
    :data:`DURATION_DEPENDENT_SCHEDULES`): how many actions the simulator charges stage ``s``'s times, as
    ``(OVERLAP_F_B pairs whose backward runs on s, F, B, I, W run alone)``. A pair runs for its backward stage's
    pair makespan (:func:`~tessera_lab.pipeline.simulate.stage_durations`), so a forward inside a pair is charged
    nothing of its own; a rank runs its actions one after another, so a rank's busy time is the sum of these
    counts times its stages' action times (:func:`tessera_lab.plan.search_bounds.busy_lower_bound`)."""
    schedule, _ = _fixed_schedule(name, pp, m, vpp)
    col = {ActionType.F: 1, ActionType.B: 2, ActionType.I: 3, ActionType.W: 4}
    out = [[0] * 5 for _ in range(pp * vpp)]
    for acts in schedule.actions.values():
        for a in acts:
            if a.type is ActionType.OVERLAP_F_B:
                out[a.sub_actions[1].stage][0] += 1
            elif a.type in col:
                out[a.stage][col[a.type]] += 1
    return tuple(tuple(row) for row in out)


def stage_p2p_times(model: ModelSpec, per: Sequence[tuple[CostModel, StageCostModel]], S: int, pp: int
                    ) -> list[float]:
    """Seconds of one micro-batch's transfer from virtual stage ``s`` to ``s + 1``, per ``s < S`` (``pp`` ranks,
    ``per[s]`` the costs of stage ``s``): a transfer runs on the slower of the two ends' links
    (:meth:`~tessera_lab.cost.analytic.CostModel.p2p_time`)."""
    return [max(per[s][0].p2p_time(model, s % pp), per[min(s + 1, S - 1)][0].p2p_time(model, s % pp))
            for s in range(S)]


def _shared_p2p(model: ModelSpec, cost_model: CostModel, S: int, pp: int) -> list[float]:
    """:func:`stage_p2p_times` with one cost model for every stage, kept on the cost model (a planner run simulates
    many partitions of one layout; the transfer times do not depend on the partition)."""
    held = cost_model.__dict__.setdefault("_p2p_by_stages", {})
    key = (id(model), S, pp)
    got = held.get(key)
    if got is None or got[0] is not model:
        got = held[key] = (model, stage_p2p_times(model, [(cost_model, None)] * S, S, pp))
    return list(got[1])


def stage_plans(model: ModelSpec, stage_models: Sequence[StageCostModel], boundaries: Sequence[int],
                speed: Sequence[float] | None = None) -> list[StagePlan]:
    """Per-(virtual-)stage times and memory of a partition (``stage_models[s]`` costs stage ``s``; times are
    multiplied by ``speed[s]``)."""
    out = []
    for s, sm in enumerate(stage_models):
        i, j = boundaries[s], boundaries[s + 1]
        k = 1.0 if speed is None else float(speed[s])
        out.append(StagePlan(
            index=s, layers=list(range(i, j)), kinds=sm.kinds[i:j],
            f_s=sm.f(s, i, j) * k, b_s=sm.b(s, i, j) * k, w_s=sm.w(s, i, j) * k,
            memory_bytes=sm.memory_bytes(s, i, j), param_bytes=sm.params(s, i, j),
            activation_bytes=sm.activations(s, i, j),
            overlap_s=sm.fb(s, i, j) * k if sm.pair_costs is not None else None,
            host_sync_s=sm.sync(s, i, j) * k, paired_host_sync_s=sm.paired_sync(s, i, j) * k))
    return out


def evaluate(
    model: ModelSpec,
    parallel: ParallelConfig,
    cost_model: CostModel,
    stage_model: StageCostModel,
    partition: Partition,
    method: str,
    model_flops: float,
    *,
    per_stage: Sequence[tuple[CostModel, StageCostModel]] | None = None,
    speed: Sequence[float] | None = None,
    time_only: bool = False,
) -> Evaluation | float:
    """Simulate a partition with the parallel config's schedule and compute the metrics.

    Args:
        model, parallel: the model and its parallel sizes (``parallel.schedule`` is simulated, ``vpp`` chunks).
        cost_model, stage_model: costs of every stage (ignored where ``per_stage`` is given).
        partition: ``pp * vpp + 1`` boundaries in virtual-stage order.
        method: label of the evaluation; model_flops: model FLOPs per iteration (Megatron-LM convention).
        per_stage: one ``(CostModel, StageCostModel)`` per virtual stage (devices, links that differ by stage).
        speed: per-stage time multipliers (> 0), e.g. observed / predicted.
        time_only: return only the simulated iteration time (float seconds; the same number as the
            evaluation's ``iteration_time_s``), for searches over many partitions.
    """
    p = parallel
    S = p.pp * p.vpp
    per = list(per_stage) if per_stage is not None else [(cost_model, stage_model)] * S
    b = partition.boundaries
    stages = stage_plans(model, [sm for _, sm in per], b, speed)
    p2p = stage_p2p_times(model, per, S, p.pp) if per_stage is not None else _shared_p2p(model, cost_model, S, p.pp)
    compiled = None
    if p.schedule in DURATION_DEPENDENT_SCHEDULES:
        schedule = plan_schedule(p.schedule, p.pp, p.microbatches, p.vpp, f=[st.f_s for st in stages],
                                 i=[st.b_s - st.w_s for st in stages], w=[st.w_s for st in stages], p2p=max(p2p))
    else:
        schedule, compiled = _fixed_schedule(p.schedule, p.pp, p.microbatches, p.vpp)
    overlapped = all(st.overlap_s is not None for st in stages)
    durations = stage_durations([st.f_s for st in stages], [st.b_s for st in stages], [st.w_s for st in stages],
                                fb=[st.overlap_s for st in stages] if overlapped else None)
    sync_by_rank: dict[int, float] = {}
    for s, st in enumerate(stages):
        rank = schedule.stage_to_rank[s]
        sync_by_rank[rank] = sync_by_rank.get(rank, 0.0) + dp_grad_sync_time(model, per[s][0], st, num_stages=S)
    comm = [(r, "dp_grad_sync", t, schedule.actions[r][-1]) for r, t in sorted(sync_by_rank.items()) if t > 0]
    timeline = simulate(schedule, durations, p2p_time=lambda src, dst: p2p[min(src, dst)], comm=comm, compiled=compiled,
                        time_only=time_only)
    if time_only:
        return timeline
    if overlapped:  # a stage whose backwards the schedule never pairs (one micro-batch, say) runs standalone
        paired = {a.sub_actions[1].stage for acts in schedule.actions.values() for a in acts
                  if a.type is ActionType.OVERLAP_F_B}
        for st in stages:
            st.paired = st.index in paired
    T = timeline.iteration_time
    exposed = dict(timeline.exposed_comm)
    # EP all-to-all and TP all-reduce not hidden inside the stage's own bundles (per rank, summed over ranks)
    for st, (_, sm) in zip(stages, per):
        for l in st.layers:
            c = sm.costs[l + 1]
            for ph in (c.F, c.B):
                share = ph.exposed_comm / ph.comm if ph.comm > 0 else 0.0
                for key, sec in ph.comm_by_collective.items():
                    exposed[key] = exposed.get(key, 0.0) + sec * share * p.microbatches
    gpus_per_stage = p.world_size / p.pp / p.vpp
    peak = sum(cm.cluster.gpu.peak_flops * gpus_per_stage for cm, _ in per)
    rank_mem: dict[int, float] = {}
    rank_cap: dict[int, float] = {}
    for s, st in enumerate(stages):
        r = schedule.stage_to_rank[s]
        rank_mem[r] = rank_mem.get(r, 0.0) + st.memory_bytes
        rank_cap[r] = memory_capacity(per[s][0].cluster)
    return Evaluation(
        method=method, partition=partition, stages=stages, timeline=timeline, iteration_time_s=T,
        tokens_per_s=p.tokens_per_iteration / T, mfu=model_flops / (T * peak),
        bubble_fraction=timeline.bubble_fraction, exposed_comm_s=exposed,
        fits_memory=all(rank_mem[r] <= rank_cap[r] * (1 + 1e-12) for r in rank_mem),
    )
