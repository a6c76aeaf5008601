"""Dynamic bubble optimizer: routing-dependent durations, bubble prediction and filling (DESIGN section 7).

At scale the tokens each expert receives change every micro-batch and every step, so the pipeline's
per-(stage, micro-batch) times vary and a static action order leaves short, unpredictable idle gaps.
Tessera reads the routing metadata before a step, predicts the gaps and moves deferrable work into them,
independently in every expert-parallel (EP) group (reported: 641 ms less idle time and +3.4% throughput on
6,144 GPUs; ``data/paper/tessera_paper_reported.json``, ``ablation``). This module rebuilds that loop in
simulation:

**(a) Variable durations** (:class:`StageCosts`, :func:`slowest_loads`, :class:`RoutedDurations`). The EP
ranks of a stage exchange tokens by all-to-all, so each layer's expert GEMMs and all-to-alls finish when the
*busiest* rank of the group does: a rank receiving ``x`` times its uniform share of assignments does ``x``
times the expert GEMM work and receives ``x`` times the bytes. Per MoE layer and micro-batch the slowest
rank's relative load ``x = max_rank load / uniform share`` (from :mod:`tessera_lab.dynamic.routing`, after capacity
drops) sets the layer's time; a stage sums its layers. Times come either from the analytic cost model
(:meth:`StageCosts.from_model`: :func:`~tessera_lab.model.tasks.layer_tasks` with ``expert_load = x`` and the
EP all-to-all bytes scaled by ``x``, costed by :class:`~tessera_lab.cost.analytic.CostModel`, cached per layer kind
and load rounded to ``load_resolution``) or from a synthetic split (:meth:`StageCosts.synthetic`: a fixed
fraction of every F, I and W scales with ``x``).

**(b) Bubble prediction** (:func:`predict_gaps`, :func:`idle_gaps`). Simulate the static order with the
durations that the routing metadata known before the step implies, and list each rank's idle gaps
(start, end, length in seconds, and the action that ends the gap).

**(c) Filling** (:func:`plan_dynamic`). The backward is split into I (input gradient, on the critical path)
and W (weight gradient, deferrable) (:func:`split_backward`; ZB-H1 and ZB-H2 already are), and each W into
``w_chunks`` equal parts (:func:`chunk_weight_gradients`; by default one per MoE layer of the stage, as
Tessera defers per-layer weight-gradient tasks: finer work fits shorter gaps). Candidates:

* ``static``: the given order, whole W tasks, gradient reduce-scatter after the rank's last action;
* ``fill``: the static order with W parts pulled back into predicted gaps (:func:`fill_gaps`): a part moves
  before action ``X`` only if its I runs before ``X`` and it fits in the gap (plus ``X``'s slack, the time
  ``X`` could slip without lengthening the iteration, :func:`action_slack`); passes repeat until nothing
  moves, and a pass that would lengthen the predicted iteration is redone without slack;
* ``defer+fill``: every W first deferred as late as the memory cap allows (:func:`defer_weight_gradients`;
  a deferred W keeps its micro-batch's activations alive; caps per rank from :func:`memory_caps`, by default
  the most activation memory the static plan needs on any rank), then pulled back into gaps.

In the dynamic candidates each stage's gradient reduce-scatter is issued on the communication lane as soon as
that stage (model chunk)'s last W has run, instead of after the rank's last action (this matters for
interleaved schedules, whose chunks finish at different times). Each EP group simulates the candidates with
*its own* predicted durations and keeps the fastest; the static order wins ties and any candidate over the
memory cap is discarded, so the decision is never slower than the static plan on the prediction (there is no
central controller: groups share nothing but the schedule). W never runs before its I
(:func:`check_dependencies`).

**(d) Evaluation** (:func:`run_dynamic`, :func:`skew_sweep`, :func:`group_sweep`,
:func:`prediction_study`, :func:`paper_comparison`). The job's iteration ends when its slowest EP group ends
(the data-parallel gradient synchronisation waits for all). Idle time per rank is iteration time minus busy
time; filling does not change the work, so the idle time removed per rank equals the iteration time saved.

Times are float seconds; loads are dimensionless (1.0 = the uniform share).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from tessera_lab.errors import ConfigError, ScheduleError
from tessera_lab.dynamic.routing import (
    RoutingSpec,
    apply_capacity,
    ep_rank_load,
    load_routing_log,
    parse_routing,
    token_counts,
    DEFAULT_JITTER,
)
from tessera_lab.pipeline import passes
from tessera_lab.pipeline.schedules import Action, ActionType, Schedule, build_schedule, canonical_name
from tessera_lab.pipeline.simulate import Timeline, overlap_length, simulate

__all__ = [
    "StageCosts",
    "slowest_loads",
    "RoutedDurations",
    "routed_durations",
    "Gap",
    "idle_gaps",
    "predict_gaps",
    "split_backward",
    "defer_weight_gradients",
    "fill_gaps",
    "action_slack",
    "grad_sync_tasks",
    "chunk_weight_gradients",
    "ChunkedDurations",
    "peak_live_activations",
    "memory_caps",
    "DynamicPlan",
    "plan_dynamic",
    "check_dependencies",
    "GroupResult",
    "DynamicResult",
    "run_dynamic",
    "skew_sweep",
    "group_sweep",
    "prediction_study",
    "paper_comparison",
    "simulate_cli",
    "SKEW_LEVELS",
]

_F, _B, _I, _W, _OV = ActionType.F, ActionType.B, ActionType.I, ActionType.W, ActionType.OVERLAP_F_B
GRAD_RS = "grad_reduce_scatter"
#: the three routing regimes of the evaluation (Zipf exponents on 512 experts over 8 EP ranks give a busiest
#: rank of about 1.0x, 1.25x and 1.75x its uniform share)
SKEW_LEVELS = {"uniform": "uniform", "moderate": "zipf:0.5", "heavy": "zipf:1.0"}


# ================================================================================ (a) durations
@dataclass
class StageCosts:
    """Per-stage times at uniform routing and how MoE layers slow down with the busiest EP rank's load.

    Attributes:
        f, i, w: forward, input-gradient and weight-gradient seconds per micro-batch of each global stage at
            uniform routing (load 1.0 on every layer).
        stage_layers: per stage, the routing-layer indices (rows of the loads array) of its MoE layers.
        layer_delta: ``layer_delta(layer, x) -> (dF, dI, dW)``: extra seconds of that MoE layer when its
            busiest EP rank carries ``x`` times its uniform share (``(0, 0, 0)`` at ``x = 1``).
        grad_sync: seconds of each stage's data-parallel gradient reduce-scatter (0: none).
        ep: EP ranks per stage.
        description: where the numbers come from.
        num_experts, top_k, tokens: the routing group (``tokens`` per micro-batch per EP group).
        activation_bytes: activation bytes kept per micro-batch by each stage (``None``: equal), for the
            memory cap.
    """

    f: list[float]
    i: list[float]
    w: list[float]
    stage_layers: list[list[int]]
    layer_delta: Callable[[int, float], tuple[float, float, float]]
    grad_sync: list[float]
    ep: int
    description: str = ""
    num_experts: int = 64
    top_k: int = 8
    tokens: int = 4096 * 8
    activation_bytes: list[float] | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def num_stages(self) -> int:
        return len(self.f)

    @property
    def num_layers(self) -> int:
        """Routing layers the loads array must provide (max index + 1)."""
        return 1 + max((l for ls in self.stage_layers for l in ls), default=-1)

    @classmethod
    def synthetic(
        cls,
        stages: int,
        f: float,
        b: float,
        w: float,
        *,
        expert_fraction: float = 0.5,
        layers_per_stage: int = 4,
        ep: int = 8,
        num_experts: int = 64,
        top_k: int = 8,
        tokens: int = 4096 * 8,
        grad_sync: float = 0.0,
    ) -> "StageCosts":
        """Uniform stages of ``layers_per_stage`` MoE layers; a fraction ``expert_fraction`` of every layer's
        F, I and W (expert GEMMs and EP all-to-alls) scales with the layer's busiest-rank load.

        Args:
            stages: global stages.
            f, b, w: seconds per stage and micro-batch at uniform routing: forward, full backward (I + W)
                and its weight-gradient part (``I = b - w``).
            expert_fraction: in [0, 1].
            layers_per_stage: MoE layers per stage (each with its own routing).
            ep, num_experts, top_k, tokens: routing-group shape (``tokens`` per micro-batch per EP group).
            grad_sync: seconds of each stage's gradient reduce-scatter.

        Raises:
            ConfigError: out-of-range values (``w > b``, fraction outside [0, 1], ...).
        """
        for name, v in (("f", f), ("b", b), ("w", w), ("grad_sync", grad_sync)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"field '{name}' = {v!r} is out of range; allowed: finite seconds >= 0")
        if w > b:
            raise ConfigError(f"field 'w' = {w} is out of range; allowed: <= b = {b} (b is the full backward)")
        if not (0.0 <= expert_fraction <= 1.0):
            raise ConfigError(f"field 'expert_fraction' = {expert_fraction} is out of range; allowed: 0 to 1")
        for name, v in (("stages", stages), ("layers_per_stage", layers_per_stage), ("ep", ep),
                        ("num_experts", num_experts), ("top_k", top_k), ("tokens", tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"field '{name}' = {v!r} is out of range; allowed: an integer >= 1")
        if num_experts % ep:
            raise ConfigError(f"field 'ep' = {ep} must divide num_experts = {num_experts}")
        i = b - w
        L = layers_per_stage
        per = (expert_fraction * f / L, expert_fraction * i / L, expert_fraction * w / L)

        def delta(layer: int, x: float) -> tuple[float, float, float]:
            return ((x - 1.0) * per[0], (x - 1.0) * per[1], (x - 1.0) * per[2])

        return cls(
            [float(f)] * stages, [float(i)] * stages, [float(w)] * stages,
            [list(range(s * L, (s + 1) * L)) for s in range(stages)], delta, [float(grad_sync)] * stages, ep,
            f"synthetic: {stages} stages x {L} MoE layers, F={f:g} I={i:g} W={w:g} s, "
            f"{expert_fraction:.0%} of each scales with the busiest EP rank's load",
            num_experts, top_k, tokens,
        )

    @classmethod
    def from_model(
        cls,
        model,
        parallel=None,
        cluster=None,
        *,
        plan=None,
        boundaries: Sequence[int] | None = None,
        load_resolution: float = 1.0 / 64,
    ) -> "StageCosts":
        """Stage times of a real model from the analytic cost model (DESIGN sections 3 and 5).

        Stage F/I/W at uniform routing are the planner's (embedding on the first stage, LM head and loss on
        the last); the extra time of a MoE layer at busiest-rank load ``x`` is ``cost(x) - cost(1)`` of
        :func:`~tessera_lab.model.tasks.layer_tasks` with ``expert_load = x`` and its EP all-to-all bytes times
        ``x`` (the busiest rank receives ``x`` times its share), costed by
        :class:`~tessera_lab.cost.analytic.CostModel` and cached per layer kind and ``x`` rounded to
        ``load_resolution``. Gradient reduce-scatter per stage: :func:`tessera_lab.plan.make.dp_grad_sync_time`.

        Args:
            model: a :class:`~tessera_lab.model.spec.ModelSpec`.
            parallel: a :class:`~tessera_lab.model.hardware.ParallelConfig` (default: pp=8, ep=8, m=32 with the
                ``zb-h1`` schedule; an ``overlapped`` schedule is replaced by ``zb-h1``: filling needs W tasks).
            cluster: default :func:`~tessera_lab.model.hardware.cluster_for`.
            plan: a :class:`~tessera_lab.plan.make.Plan` whose boundaries to use.
            boundaries: stage boundaries (``pp + 1`` ints); default: the DP partition that minimises the
                slowest stage.

        Raises:
            ConfigError: bad sizes or boundaries.
        """
        from tessera_lab.model.hardware import ParallelConfig, cluster_for
        from tessera_lab.plan.make import StagePlan, build_stage_model, dp_grad_sync_time, make_plan
        from tessera_lab.model.tasks import layer_tasks

        parallel = parallel or ParallelConfig(schedule="zb-h1")
        if parallel.schedule in ("overlapped", "dualpipev", "interleaved"):
            parallel = parallel.replace(schedule="zb-h1", vpp=1)
        cluster = cluster or cluster_for(parallel)
        if not (0 < load_resolution <= 1):
            raise ConfigError(f"field 'load_resolution' = {load_resolution} is out of range; allowed: (0, 1]")
        if plan is not None:
            boundaries = plan.chosen.partition.boundaries
        if boundaries is None:
            boundaries = make_plan(model, parallel, cluster, method="dp", baselines=(), objective="bottleneck"
                                   ).chosen.partition.boundaries
        b = list(boundaries)
        if len(b) != parallel.pp + 1 or b[0] != 0 or b[-1] != model.num_layers or any(
                b[s] > b[s + 1] for s in range(parallel.pp)):
            raise ConfigError(f"field 'boundaries' = {b} is out of range; allowed: pp + 1 = {parallel.pp + 1} "
                              f"non-decreasing ints from 0 to {model.num_layers}")
        cost_model, sm = build_stage_model(model, parallel, cluster)
        f, i, w, sync = [], [], [], []
        # stage extras (embedding, head) are in sm.f/b/w; activations per micro-batch for the memory cap
        for s in range(parallel.pp):
            fs, bs, ws = sm.f(s, b[s], b[s + 1]), sm.b(s, b[s], b[s + 1]), sm.w(s, b[s], b[s + 1])
            f.append(fs)
            i.append(bs - ws)
            w.append(ws)
            st = StagePlan(s, list(range(b[s], b[s + 1])), [], fs, bs, ws, 0.0, 0.0, 0.0)
            sync.append(dp_grad_sync_time(model, cost_model, st))
        moe_layers = [l.index for l in model.layers if l.ffn == "moe"]
        ordinal = {idx: n for n, idx in enumerate(moe_layers)}
        stage_layers = [[ordinal[l] for l in range(b[s], b[s + 1]) if l in ordinal] for s in range(parallel.pp)]
        cache: dict[tuple, tuple[float, float, float]] = {}

        def scaled_cost(idx: int, q: int) -> tuple[float, float, float]:
            layer = model.layers[idx]
            key = (layer.mixer, layer.attention, layer.ffn, q)
            if key not in cache:
                x = q * load_resolution
                lt = layer_tasks(model, layer, parallel, expert_load=x)
                scale = max(1.0, x)

                def fix(tasks):
                    return tuple(replace(t, collective=replace(t.collective, bytes=t.collective.bytes * scale))
                                 if t.collective is not None and t.collective.kind == "all_to_all"
                                 and t.collective.group == "ep" else t for t in tasks)

                lt = replace(lt, F=fix(lt.F), B=fix(lt.B), W=fix(lt.W))
                c = cost_model.layer_cost(lt)
                cache[key] = (c.F.time, c.B.time, c.W.time)
            return cache[key]

        one = int(round(1.0 / load_resolution))

        def delta(layer: int, x: float) -> tuple[float, float, float]:
            idx = moe_layers[layer % len(moe_layers)]
            q = max(0, int(round(x / load_resolution)))
            a, base = scaled_cost(idx, q), scaled_cost(idx, one)
            return (a[0] - base[0], a[1] - base[1], a[2] - base[2])

        E, k = model.num_experts, model.num_experts_per_tok
        return cls(
            f, i, w, stage_layers, delta, sync, parallel.ep,
            f"{model.name}: analytic costs on {cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name}, "
            f"pp={parallel.pp} ep={parallel.ep}, boundaries {b}",
            E, k, parallel.tokens_per_microbatch * parallel.ep,
            [sm.activations(s, b[s], b[s + 1]) for s in range(parallel.pp)],
            {"boundaries": b, "model": model.name, "microbatches": parallel.microbatches,
             "tokens_per_iteration": parallel.tokens_per_iteration},
        )


def slowest_loads(counts: np.ndarray, ep: int, *, tokens: int | None = None, top_k: int | None = None,
                  capacity_factor: float | None = None) -> np.ndarray:
    """Relative load of the busiest EP rank per (layer, micro-batch): shape ``counts.shape[:-1]``.

    ``x = max_rank(kept assignments) / (all assignments / ep)``: the uniform share is taken before capacity
    drops, so dropping tokens lowers ``x`` (and never below the busiest rank's kept work).

    Args:
        counts: assignments ``[..., E]`` (e.g. ``[layers, microbatches, E]``).
        ep: EP ranks (divides E).
        tokens, top_k, capacity_factor: apply capacity first (all three needed for dropping).

    Raises:
        ConfigError: ``ep`` not dividing E, or bad capacity arguments.
    """
    c = np.asarray(counts, dtype=np.int64)
    kept = c
    if capacity_factor is not None:
        if tokens is None or top_k is None:
            raise ConfigError("field 'capacity_factor' needs 'tokens' and 'top_k' to compute the capacity")
        kept = apply_capacity(c, tokens, top_k, capacity_factor).kept
    share = c.sum(axis=-1) / ep
    rank = ep_rank_load(kept, ep).max(axis=-1)
    return np.divide(rank, share, out=np.ones(share.shape), where=share > 0)


class RoutedDurations:
    """``durations(stage, microbatch, type) -> seconds`` for the simulator, from stage costs and loads.

    ``F[s][j] = f[s] + sum over the stage's MoE layers l of dF(l, x[l, j])`` and likewise for I and W;
    ``B = I + W``; ``OVERLAP_F_B`` = ``F + B`` of the backward's stage and micro-batch (no overlap credit).
    Micro-batches beyond the loads' micro-batch axis and layers beyond its layer axis are taken cyclically
    (a short replay log on a longer pipeline).

    Attributes:
        F, I, W: arrays ``[stages, microbatches]`` in seconds (``microbatches`` = the loads' axis).
        loads: ``[layers, microbatches]`` busiest-rank loads used.
    """

    def __init__(self, costs: StageCosts, loads: np.ndarray):
        x = np.asarray(loads, dtype=float)
        if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
            raise ConfigError(f"field 'loads' has shape {x.shape}; allowed: [layers, microbatches]")
        if not np.isfinite(x).all() or (x < 0).any():
            raise ConfigError("field 'loads' must be finite and >= 0")
        S, M = costs.num_stages, x.shape[1]
        L = x.shape[0]
        self.loads = x
        self.F = np.empty((S, M))
        self.I = np.empty((S, M))
        self.W = np.empty((S, M))
        memo: dict[tuple[int, float], tuple[float, float, float]] = {}
        for s in range(S):
            for j in range(M):
                df = di = dw = 0.0
                for l in costs.stage_layers[s]:
                    key = (l, float(x[l % L, j]))
                    d = memo.get(key)
                    if d is None:
                        d = memo[key] = costs.layer_delta(*key)
                    df, di, dw = df + d[0], di + d[1], dw + d[2]
                self.F[s, j] = max(0.0, costs.f[s] + df)
                self.I[s, j] = max(0.0, costs.i[s] + di)
                self.W[s, j] = max(0.0, costs.w[s] + dw)
        self._M = M

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        j = microbatch % self._M
        if type is _F:
            return float(self.F[stage, j])
        if type is _I:
            return float(self.I[stage, j])
        if type is _W:
            return float(self.W[stage, j])
        if type is _B:
            return float(self.I[stage, j] + self.W[stage, j])
        if type is _OV:
            return float(self.F[stage, j] + self.I[stage, j] + self.W[stage, j])
        raise ScheduleError(f"RoutedDurations: no time for action type {type}")


def routed_durations(costs: StageCosts, loads: np.ndarray) -> RoutedDurations:
    """Shorthand for :class:`RoutedDurations`."""
    return RoutedDurations(costs, loads)


# ================================================================================ (b) prediction
@dataclass(frozen=True)
class Gap:
    """An idle interval of one rank's compute lane (seconds).

    Attributes:
        rank: pipeline rank.
        start, end: seconds from the start of the iteration.
        before: label of the compute action that ends the gap (``None``: the iteration's tail).
    """

    rank: int
    start: float
    end: float
    before: str | None

    @property
    def length(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "start": self.start, "end": self.end, "length": self.length, "before": self.before}


def idle_gaps(timeline: Timeline, *, min_length: float = 0.0, tail: bool = True) -> dict[int, list[Gap]]:
    """Each rank's idle gaps in time order, ``{rank: [Gap, ...]}``.

    A gap is a stretch of the iteration ``[0, iteration_time]`` where the rank's compute lane is idle (the
    head before its first action included; the tail after its last action when ``tail``). Gaps no longer
    than ``min_length`` seconds are left out. The lengths of all gaps (with the tail) add up to the rank's
    ``per_rank_idle``.
    """
    R = timeline.num_ranks or (1 + max((e.rank for e in timeline.events), default=-1))
    by_rank: dict[int, list] = {r: [] for r in range(R)}
    for e in timeline.events:
        if e.lane == "compute":
            by_rank[e.rank].append(e)
    T = timeline.iteration_time
    out: dict[int, list[Gap]] = {}
    for r in range(R):
        evs = sorted(by_rank[r], key=lambda e: (e.start, e.end))
        gaps, cur = [], 0.0
        for e in evs:
            if e.start - cur > min_length and e.start > cur:
                gaps.append(Gap(r, cur, e.start, e.label))
            cur = max(cur, e.end)
        if tail and T - cur > min_length and T > cur:
            gaps.append(Gap(r, cur, T, None))
        out[r] = gaps
    return out


def predict_gaps(schedule: Schedule, durations, *, min_length: float = 0.0, **sim: Any) -> tuple[Timeline, dict[int, list[Gap]]]:
    """Simulate ``schedule`` with ``durations`` (from the routing metadata known before the step) and return
    ``(timeline, gaps per rank)``. Extra keywords go to :func:`~tessera_lab.simulate.simulate`."""
    tl = simulate(schedule, durations, **sim)
    return tl, idle_gaps(tl, min_length=min_length)


# ================================================================================ (c) filling
def split_backward(schedule: Schedule) -> Schedule:
    """:func:`tessera_lab.pipeline.passes.split_backward` with ``W`` right after its ``I``, for the filler.

    Raises:
        ScheduleError: the schedule runs backwards inside overlapped F&B pairs (``overlapped``, DualPipeV),
            which the filler cannot split yet.
    """
    for acts in schedule.actions.values():
        for a in acts:
            if a.type is _OV:
                raise ScheduleError(
                    f"dynamic filling needs separate I and W actions; schedule {schedule.name!r} runs backwards inside "
                    f"overlapped F&B pairs ({a}); allowed schedules: zb-h1, zb-h2, 1f1b, gpipe, interleaved")
    out = passes.split_backward(schedule, w_lag=0)
    return Schedule(schedule.name, out.num_ranks, out.num_stages, out.num_microbatches, out.actions,
                    dict(out.stage_to_rank), dict(schedule.meta))


class _Live:
    """Live micro-batch activations on one rank while walking an order: +1 at a forward, -1 when the
    backward of that micro-batch is complete (a B, or the last of the ``chunks`` W parts of a split one)."""

    def __init__(self, chunks: int = 1):
        self.chunks = chunks
        self.left: dict[tuple[int, int], int] = {}
        self.live = 0
        self.peak = 0

    def add(self, a: Action) -> None:
        for x in a.leaves():  # a pair starts its F before its backward frees anything
            if x.type is _F:
                self.live += 1
                self.peak = max(self.peak, self.live)
        for x in a.leaves():
            if x.type is _B:
                self.live -= 1
            elif x.type is _W:
                key = (x.stage, x.microbatch)
                n = self.left.get(key, self.chunks) - 1
                self.left[key] = n
                if n == 0:
                    self.live -= 1


def _order_peak(acts: Sequence[Action], chunks: int = 1) -> int:
    live = _Live(chunks)
    for a in acts:
        live.add(a)
    return live.peak


def peak_live_activations(timeline: Timeline, w_chunks: int = 1) -> list[int]:
    """Per rank, the most micro-batches whose forward has started and whose backward is not complete
    (B ended, or the last of its ``w_chunks`` W parts ended); frees count first at equal times. Equals the
    simulator's ``peak_activations`` for unchunked schedules."""
    R = timeline.num_ranks or (1 + max((e.rank for e in timeline.events), default=-1))
    deltas: list[list[tuple[float, int]]] = [[] for _ in range(R)]
    w_end: dict[tuple[int, int, int], list[float]] = {}
    for e in timeline.events:
        if e.lane != "compute":
            continue
        if e.type == "OVERLAP_F_B":
            deltas[e.rank].append((e.start, 1))
            deltas[e.rank].append((e.end, -1))
        elif e.type == "F":
            deltas[e.rank].append((e.start, 1))
        elif e.type == "B":
            deltas[e.rank].append((e.end, -1))
        elif e.type == "W":
            w_end.setdefault((e.rank, e.stage, e.microbatch), []).append(e.end)
    for (r, _, _), ends in w_end.items():
        ends.sort()
        for k in range(w_chunks - 1, len(ends), w_chunks):
            deltas[r].append((ends[k], -1))
    peaks = []
    for r in range(R):
        live = peak = 0
        for _, d in sorted(deltas[r]):
            live += d
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def chunk_weight_gradients(schedule: Schedule, chunks: int) -> Schedule:
    """Each W action replaced by ``chunks`` consecutive W parts (same label), to be simulated with
    :class:`ChunkedDurations` (each part takes ``W / chunks``). Finer deferrable work fits smaller gaps:
    Tessera defers per-layer weight-gradient tasks, not a stage's whole W."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ConfigError(f"field 'w_chunks' = {chunks!r} is out of range; allowed: an integer >= 1")
    if chunks == 1:
        return schedule
    lists = {r: [y for a in acts for y in ([a] * chunks if a.type is _W else [a])] for r, acts in schedule.actions.items()}
    return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches, lists,
                    dict(schedule.stage_to_rank), {**schedule.meta, "w_chunks": chunks})


class ChunkedDurations:
    """``base`` durations with every W divided by ``chunks`` (one part of a chunked W)."""

    def __init__(self, base, chunks: int):
        self.base, self.chunks = base, chunks

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        d = self.base(stage, microbatch, type)
        return d / self.chunks if type is _W else d


def memory_caps(schedule: Schedule, memory_cap: int | Sequence[int] | str | None = "max", *,
                activation_bytes: Sequence[float] | None = None, chunks: int = 1) -> list[int]:
    """Live micro-batch activations allowed per rank.

    Args:
        schedule: the static order the caps are measured on.
        memory_cap: ``"rank"`` (or ``None``): each rank's own peak in the static order, so no rank ever
            needs more activation memory than in the static plan; ``"max"`` (default): the most activation
            memory the static plan needs on any rank, in bytes, allowed on every rank (GPUs are provisioned
            for the worst rank; 1F1B's later ranks have that headroom): ``floor(max_r' peak_r' a_r' / a_r)``;
            an int (the same count on every rank) or one int per rank.
        activation_bytes: activation bytes per micro-batch of each stage (default: equal); a rank holding
            several stages uses their mean.
        chunks: W parts per micro-batch in ``schedule``.

    Raises:
        ConfigError: an unknown policy, a wrong-length list or a cap below 1.
    """
    R = schedule.num_ranks
    if memory_cap is None or memory_cap == "rank":
        return [max(1, _order_peak(schedule.actions.get(r, []), chunks)) for r in range(R)]
    if memory_cap == "max":
        peaks = [_order_peak(schedule.actions.get(r, []), chunks) for r in range(R)]
        if activation_bytes is None:
            act = [1.0] * R
        else:
            if len(activation_bytes) != schedule.num_stages:
                raise ConfigError(f"field 'activation_bytes' has {len(activation_bytes)} entries; allowed: one per "
                                  f"stage ({schedule.num_stages})")
            act = []
            for r in range(R):
                st = [s for s, rr in schedule.stage_to_rank.items() if rr == r]
                act.append(float(np.mean([activation_bytes[s] for s in st])) if st else 1.0)
        budget = max(p * a for p, a in zip(peaks, act))
        return [max(peaks[r], int(math.floor(budget / act[r] * (1 + 1e-9)))) if act[r] > 0 else peaks[r]
                for r in range(R)]
    if isinstance(memory_cap, str):
        raise ConfigError(f"field 'memory_cap' = {memory_cap!r} is unknown; allowed: 'max', 'rank', an integer >= 1 "
                          "or one integer per rank")
    if isinstance(memory_cap, (int, np.integer)) and not isinstance(memory_cap, bool):
        caps = [int(memory_cap)] * R
    else:
        caps = [int(c) for c in memory_cap]
        if len(caps) != R:
            raise ConfigError(f"field 'memory_cap' has {len(caps)} entries; allowed: one per rank ({R})")
    if any(c < 1 for c in caps):
        raise ConfigError(f"field 'memory_cap' = {memory_cap!r} is out of range; allowed: micro-batches >= 1 per rank")
    return caps


def defer_weight_gradients(schedule: Schedule, memory_cap: int | Sequence[int] | str | None = "rank", *,
                           w_chunks: int = 1) -> Schedule | None:
    """Move every W as late as the memory cap allows (W tasks go last; a W runs earlier only when the next
    forward would exceed the cap of live micro-batch activations on its rank).

    Args:
        schedule: a split schedule (I and W actions).
        memory_cap: live micro-batches per rank (a policy or counts, see :func:`memory_caps`); default
            ``"rank"``: each rank's peak in the given order, so the result never needs more activation
            memory than the input.
        w_chunks: W parts per micro-batch in ``schedule`` (:func:`chunk_weight_gradients`); a micro-batch's
            activations are freed by its last part.

    Returns:
        the deferred schedule, or ``None`` if a rank cannot meet its cap (fewer pending W tasks than needed).
    """
    caps = memory_caps(schedule, memory_cap, chunks=w_chunks)
    lists: dict[int, list[Action]] = {}
    for r in range(schedule.num_ranks):
        acts = schedule.actions.get(r, [])
        pending: list[Action] = []  # oldest I first; each stands for its w_chunks W parts
        out: list[Action] = []
        live = _Live(w_chunks)
        for a in acts:
            if a.type is _W:
                continue
            if any(x.type is _F for x in a.leaves()):
                while live.live + 1 > caps[r] and pending:
                    wa = pending.pop(0)
                    for _ in range(w_chunks):
                        out.append(wa)
                        live.add(wa)
                if live.live + 1 > caps[r]:
                    return None
            out.append(a)
            live.add(a)
            for x in a.leaves():
                if x.type is _I:
                    pending.append(Action(x.stage, _W, x.microbatch))
        out.extend(wa for wa in pending for _ in range(w_chunks))
        lists[r] = out
    return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches, lists,
                    dict(schedule.stage_to_rank), {**schedule.meta, "w_deferred": True})


def action_slack(timeline: Timeline, schedule: Schedule, *, p2p_latency: float = 0.0,
                 p2p_time: float | Callable[[int, int], float] | None = None) -> dict[int, float]:
    """Slack of every compute event (seconds): how much later it could start without making the iteration
    longer, with the ranks' orders fixed (critical-path method over the timeline's events).

    Edges: consecutive actions of a rank; ``F(s, i) -> F(s+1, i)`` and ``I|B(s+1, i) -> I|B(s, i)`` with the
    transfer time between ranks; ``F(s, i) -> I|B(s, i)``; ``I(s, i) -> W(s, i)``; a gradient reduce-scatter
    after its W. Returns ``{event index: slack}`` (0 on the critical path).
    """
    from tessera_lab.pipeline.simulate import _transfer_fn

    xfer = _transfer_fn(p2p_latency, p2p_time)
    s2r = schedule.stage_to_rank
    ev = timeline.events
    T = timeline.iteration_time
    prod: dict[tuple[str, int, int], int] = {}
    ws: dict[tuple[int, int], list[int]] = {}
    last_w: dict[int, int] = {}
    by_rank: dict[int, list[int]] = {}
    for n, e in enumerate(ev):
        if e.lane != "compute":
            continue
        by_rank.setdefault(e.rank, []).append(n)
        if e.type == "F":
            prod[("F", e.stage, e.microbatch)] = n
        elif e.type in ("I", "B"):
            prod[("G", e.stage, e.microbatch)] = n
        if e.type == "W":
            ws.setdefault((e.stage, e.microbatch), []).append(n)
        if e.type in ("W", "B"):
            last_w[e.stage] = n if e.stage not in last_w or ev[last_w[e.stage]].end <= e.end else last_w[e.stage]
    succ: dict[int, list[tuple[int, float]]] = {}

    def edge(u: int | None, v: int, lag: float) -> None:
        if u is not None:
            succ.setdefault(u, []).append((v, lag))

    for r, idx in by_rank.items():
        idx.sort(key=lambda n: (ev[n].start, n))
        for u, v in zip(idx, idx[1:]):
            edge(u, v, 0.0)
    S = schedule.num_stages
    for n, e in enumerate(ev):
        if e.lane != "compute":
            if e.type == GRAD_RS and e.stage in last_w:
                edge(last_w[e.stage], n, 0.0)
            continue
        s, i = e.stage, e.microbatch
        if e.type == "F" and s > 0:
            edge(prod.get(("F", s - 1, i)), n, xfer(s - 1, s) if s2r[s - 1] != s2r[s] else 0.0)
        elif e.type in ("I", "B"):
            edge(prod.get(("F", s, i)), n, 0.0)
            if s < S - 1:
                edge(prod.get(("G", s + 1, i)), n, xfer(s + 1, s) if s2r[s + 1] != s2r[s] else 0.0)
        elif e.type == "W":
            edge(prod.get(("G", s, i)), n, 0.0)
    lf = [T] * len(ev)
    for n in range(len(ev) - 1, -1, -1):  # events are appended in a topological order
        for v, lag in succ.get(n, ()):
            lf[n] = min(lf[n], lf[v] - (ev[v].end - ev[v].start) - lag)
    return {n: max(0.0, lf[n] - ev[n].end) for n, e in enumerate(ev) if e.lane == "compute"}


def _fill_pass(schedule: Schedule, timeline: Timeline, durations, tol: float,
               slack: dict[int, float] | None = None) -> tuple[Schedule, int]:
    gaps = idle_gaps(timeline, tail=False)
    ev_index = {}
    if slack is not None:
        for n, e in enumerate(timeline.events):
            if e.lane == "compute" and e.type != "W":
                ev_index[(e.rank, e.label)] = n
    moved_total = 0
    lists: dict[int, list[Action]] = {}
    for r in range(schedule.num_ranks):
        acts = list(schedule.actions.get(r, []))
        pos = {str(a): n for n, a in enumerate(acts) if a.is_compute and a.type is not _W}
        i_pos = {(x.stage, x.microbatch): n for n, a in enumerate(acts) for x in a.leaves() if x.type is _I}
        w_list = [(n, a) for n, a in enumerate(acts) if a.type is _W]
        taken: set[int] = set()
        insert: dict[int, list[Action]] = {}
        for g in gaps.get(r, []):
            px = pos.get(g.before)
            if px is None:
                continue
            room = g.length
            if slack is not None:
                room += slack.get(ev_index.get((r, g.before), -1), 0.0)
            for n, a in w_list:
                if n <= px or n in taken:
                    continue
                ip = i_pos.get((a.stage, a.microbatch))
                if ip is None or ip >= px:
                    continue
                d = durations(a.stage, a.microbatch, _W)
                if d <= 0 or d > room + tol:
                    continue
                taken.add(n)
                insert.setdefault(px, []).append(a)
                room -= d
        moved_total += len(taken)
        if taken:
            out = []
            for n, a in enumerate(acts):
                out.extend(insert.get(n, ()))
                if n not in taken:
                    out.append(a)
            lists[r] = out
        else:
            lists[r] = acts
    if not moved_total:
        return schedule, 0
    return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches, lists,
                    dict(schedule.stage_to_rank), dict(schedule.meta)), moved_total


def fill_gaps(schedule: Schedule, durations, *, max_passes: int = 64, use_slack: bool = True,
              **sim: Any) -> tuple[Schedule, Timeline, int]:
    """Pull W tasks back into the predicted idle gaps of each rank, repeatedly, until nothing moves.

    One pass simulates the order, lists each rank's gaps (:func:`idle_gaps`) and, for every gap before
    action ``X``, moves W tasks that sit after ``X`` in the rank's order and whose I runs before ``X`` to just
    before ``X``, in order, while their predicted durations fit in the gap. A W that fits runs in time the
    rank would have idled, so no action starts later than before: the iteration never gets longer, and W
    never precedes its I. With ``use_slack`` a W may also use ``X``'s slack (:func:`action_slack`: delaying
    an action off the critical path costs nothing); a slack pass that would lengthen the predicted
    iteration (slack is shared between actions) is replaced by a fit-only pass. A moved W frees its
    activations earlier, so memory never grows.

    Returns:
        ``(schedule, timeline, moves)``: the filled order, its simulated timeline and how many W moves
        were made over all passes.
    """
    tl = simulate(schedule, durations, **sim)
    total = 0
    slack_on = use_slack
    for _ in range(max_passes):
        tol = 1e-9 * max(tl.iteration_time, 1e-30)
        moved = 0
        if slack_on:
            sl = action_slack(tl, schedule, p2p_latency=sim.get("p2p_latency", 0.0), p2p_time=sim.get("p2p_time"))
            new, moved = _fill_pass(schedule, tl, durations, tol, sl)
            if moved:
                new_tl = simulate(new, durations, **sim)
                if new_tl.iteration_time > tl.iteration_time * (1 + 1e-12):
                    moved = 0
                    slack_on = False  # slack is shared: fall back to moves that provably never hurt
        if not moved:
            new, moved = _fill_pass(schedule, tl, durations, tol)
            if not moved:
                break
            new_tl = simulate(new, durations, **sim)
            if new_tl.iteration_time > tl.iteration_time * (1 + 1e-9):  # pragma: no cover - see the argument above
                break
        schedule, tl, total = new, new_tl, total + moved
    return schedule, tl, total


def grad_sync_tasks(schedule: Schedule, seconds: Sequence[float] | None, *, placement: str = "static") -> list[tuple]:
    """Gradient reduce-scatter per stage as communication-lane tasks for :func:`simulate` (``comm=``).

    ``placement="static"``: after the rank's last action (the static plan). ``"dynamic"``: after the stage's
    last W (or B) in the rank's order, so one model chunk's reduce-scatter overlaps the rank's remaining
    compute. Zero-second tasks are left out.

    Raises:
        ConfigError: an unknown placement, or one entry per stage missing.
    """
    if not seconds:
        return []
    if placement not in ("static", "dynamic"):
        raise ConfigError(f"field 'placement' = {placement!r}; allowed: static, dynamic")
    if len(seconds) != schedule.num_stages:
        raise ConfigError(f"field 'grad_sync' has {len(seconds)} entries; allowed: one per stage ({schedule.num_stages})")
    tasks = []
    for s in range(schedule.num_stages):
        sec = float(seconds[s])
        if sec <= 0:
            continue
        r = schedule.stage_to_rank[s]
        acts = [a for a in schedule.actions.get(r, []) if a.is_compute]
        if not acts:
            continue
        if placement == "static":
            after = acts[-1]
        else:
            last = [a for a in acts if a.type in (_W, _B) and a.stage == s]
            after = last[-1] if last else acts[-1]
        tasks.append((r, GRAD_RS, sec, after))
    return tasks


@dataclass
class DynamicPlan:
    """One EP group's decision (all on *predicted* durations).

    Attributes:
        static: the static order (backward split into I and W).
        schedule: the chosen order (``static`` itself when nothing beats it; W actions repeated
            ``w_chunks`` times otherwise).
        choice: ``static``, ``fill`` or ``defer+fill``.
        candidates: candidate -> predicted iteration time (seconds); ``None`` for a discarded candidate.
        static_comm, comm: gradient reduce-scatter tasks of the static and the chosen plan.
        memory_cap: live micro-batch activations allowed per rank.
        predicted_static, predicted: simulated timelines of both on the prediction.
        moves: W-part moves made by the chosen candidate's filling.
        w_chunks: parts each W is split into in the chosen order (1 for ``static``).
    """

    static: Schedule
    schedule: Schedule
    choice: str
    candidates: dict[str, float | None]
    static_comm: list
    comm: list
    memory_cap: list[int]
    predicted_static: Timeline
    predicted: Timeline
    moves: int = 0
    w_chunks: int = 1
    sim: dict = field(default_factory=dict)

    @property
    def predicted_gain(self) -> float:
        """Predicted throughput gain ``static / dynamic - 1``."""
        T = self.predicted.iteration_time
        return self.predicted_static.iteration_time / T - 1.0 if T else 0.0

    def realise(self, durations) -> tuple[Timeline, Timeline]:
        """Simulate the static and the chosen order with the durations that actually happen."""
        st = simulate(self.static, durations, comm=self.static_comm, **self.sim)
        dur = ChunkedDurations(durations, self.w_chunks) if self.w_chunks > 1 else durations
        dy = _simulate_chunked(self.schedule, dur, self.comm, self.w_chunks, self.sim)
        return st, dy


def _simulate_chunked(schedule: Schedule, durations, comm: list, chunks: int, sim: dict) -> Timeline:
    tl = simulate(schedule, durations, comm=comm, **sim)
    if chunks > 1:
        tl.peak_activations = peak_live_activations(tl, chunks)
    return tl


def plan_dynamic(
    schedule: Schedule,
    predicted,
    *,
    grad_sync: Sequence[float] | None = None,
    memory_cap: int | Sequence[int] | str | None = "max",
    activation_bytes: Sequence[float] | None = None,
    w_chunks: int = 4,
    p2p_latency: float = 0.0,
    p2p_time: float | Callable[[int, int], float] | None = None,
    max_passes: int = 64,
) -> DynamicPlan:
    """Decide one EP group's order from its predicted durations (see the module docstring, part (c)).

    Args:
        schedule: the static schedule (B actions are split into I and W).
        predicted: durations from the routing metadata known before the step.
        grad_sync: gradient reduce-scatter seconds per stage (``None``: none).
        memory_cap: live micro-batches per rank: ``"max"`` (default), ``"rank"``, an int or one per rank
            (:func:`memory_caps`, measured on the static order).
        activation_bytes: activation bytes per micro-batch of each stage (for ``"max"``).
        w_chunks: parts each W is split into for filling (e.g. one per layer of the stage); 1 = whole.
        p2p_latency, p2p_time: as :func:`~tessera_lab.simulate.simulate`.
        max_passes: fill passes per candidate.

    Returns:
        :class:`DynamicPlan`; its predicted iteration time is never above the static one.

    Raises:
        ScheduleError: a schedule with overlapped F&B pairs.
        ConfigError: a bad memory cap, ``w_chunks`` or grad_sync list.
    """
    sim = {"p2p_latency": p2p_latency, "p2p_time": p2p_time}
    base = split_backward(schedule)
    caps = memory_caps(base, memory_cap, activation_bytes=activation_bytes)
    chunked = chunk_weight_gradients(base, w_chunks)
    pdur = ChunkedDurations(predicted, w_chunks) if w_chunks > 1 else predicted
    static_comm = grad_sync_tasks(base, grad_sync, placement="static")
    static_tl = simulate(base, predicted, comm=static_comm, **sim)
    best = ("static", base, static_comm, static_tl, 0)
    cands: dict[str, float | None] = {"static": static_tl.iteration_time}
    starts = [("fill", chunked), ("defer+fill", defer_weight_gradients(chunked, caps, w_chunks=w_chunks))]
    for name, start in starts:
        if start is None:
            cands[name] = None
            continue
        filled, _, moves = fill_gaps(start, pdur, max_passes=max_passes, **sim)
        comm = grad_sync_tasks(filled, grad_sync, placement="dynamic")
        tl = _simulate_chunked(filled, pdur, comm, w_chunks, sim)
        if any(p > c for p, c in zip(tl.peak_activations, caps)):
            cands[name] = None
            continue
        cands[name] = tl.iteration_time
        if tl.iteration_time < best[3].iteration_time * (1 - 1e-12):
            best = (name, filled, comm, tl, moves)
    name, sched, comm, tl, moves = best
    return DynamicPlan(base, sched, name, cands, static_comm, comm, caps, static_tl, tl, moves,
                       1 if name == "static" else w_chunks, sim)


def check_dependencies(timeline: Timeline, tol: float = 1e-12) -> list[str]:
    """Dependency violations in a timeline (empty list = none).

    Checks: every W starts after its I (same stage and micro-batch) has ended; every gradient
    reduce-scatter of a stage starts after that stage's last W (or B) has ended.
    """
    i_end: dict[tuple[int, int], float] = {}
    last_w: dict[int, float] = {}
    for e in timeline.events:
        if e.lane != "compute":
            continue
        if e.type in ("I", "B"):
            i_end[(e.stage, e.microbatch)] = e.end
        if e.type in ("W", "B"):
            last_w[e.stage] = max(last_w.get(e.stage, 0.0), e.end)
    bad = []
    for e in timeline.events:
        if e.lane == "compute" and e.type == "W":
            end = i_end.get((e.stage, e.microbatch))
            if end is None:
                bad.append(f"{e.label} has no I")
            elif e.start < end - tol:
                bad.append(f"{e.label} starts at {e.start:.6g} s before its I ends at {end:.6g} s")
        if e.lane == "comm" and e.type == GRAD_RS and e.stage >= 0:
            lw = last_w.get(e.stage, 0.0)
            if e.start < lw - tol:
                bad.append(f"{GRAD_RS} of stage {e.stage} starts at {e.start:.6g} s before its last W ends at {lw:.6g} s")
    return bad


# ================================================================================ (d) evaluation
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
            "seed": self.seed, "step": self.step, "prediction_lag": self.lag,
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


def _routing_counts(spec: RoutingSpec, costs: StageCosts, microbatches: int, *, seed: int, group: int, step: int,
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


def _check_schedule_stages(sched: Schedule, costs: StageCosts) -> None:
    if sched.num_stages != costs.num_stages:
        raise ConfigError(f"schedule {sched.name!r} has {sched.num_stages} stages but the stage costs cover "
                          f"{costs.num_stages}; allowed: equal counts")


def run_dynamic(
    costs: StageCosts,
    routing: str | RoutingSpec = "zipf:1.0",
    *,
    schedule: str | Schedule = "zb-h1",
    microbatches: int = 16,
    vpp: int = 1,
    groups: int = 1,
    seed: int = 0,
    step: int = 1,
    lag: int = 0,
    capacity_factor: float | None = None,
    memory_cap: int | Sequence[int] | str | None = "max",
    p2p_latency: float = 0.0,
    jitter: float = DEFAULT_JITTER,
    w_chunks: int | None = None,
    counts: Sequence[np.ndarray] | None = None,
) -> DynamicResult:
    """Simulate one step of a job with ``groups`` EP groups, static vs dynamic.

    Each group routes its own data (``token_counts(..., group=g)``), predicts with the metadata of step
    ``step - lag`` (``lag = 0``: exact metadata of this step), decides with :func:`plan_dynamic` and is
    realised with the routing of step ``step``.

    Args:
        costs: stage times (:class:`StageCosts`); its stage count must match the schedule's.
        routing: ``uniform``, ``zipf:S``, ``drift:S[:R]`` or ``replay:PATH``.
        schedule: the static plan: a schedule name (built with ``costs.num_stages / vpp`` ranks) or a
            :class:`Schedule`. Default ``zb-h1`` (W already placed in the cool-down, so only routing-induced
            gaps are left); ``1f1b`` (W right after its I) also lets filling remove the warm-up/cool-down
            bubble.
        microbatches: micro-batches per step.
        groups: EP groups in the job (the data-parallel replicas of an EP-coupled pipeline).
        seed, step, lag: routing seed, step index, and how many steps old the prediction's metadata is.
        capacity_factor: drop tokens above ``ceil(cf * tokens * k / E)`` per expert (``None``: no drops).
        memory_cap: live micro-batches per rank (:func:`memory_caps`; default ``"max"``: the most
            activation memory the static plan needs on any rank).
        p2p_latency: seconds per stage-to-stage hop.
        jitter: per-micro-batch routing noise (:func:`~tessera_lab.dynamic.routing.token_counts`).
        w_chunks: parts each stage's W is split into for filling; default one per MoE layer of the stage
            (per-layer weight-gradient tasks), at least 1.
        counts: optional explicit ``[layers, microbatches, E]`` counts per group (overrides ``routing``
            for both prediction and realisation).

    Raises:
        ConfigError / ScheduleError: bad sizes, schedules or routing.
    """
    spec = parse_routing(routing)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ConfigError(f"field 'groups' = {groups!r} is out of range; allowed: an integer >= 1")
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0 or lag > step:
        raise ConfigError(f"field 'lag' = {lag!r} is out of range; allowed: 0 to step = {step}")
    if isinstance(schedule, Schedule):
        sched = schedule
        microbatches = sched.num_microbatches
    else:
        name = canonical_name(schedule)
        per_rank = vpp if name == "interleaved" else (2 if name == "dualpipev" else 1)
        if costs.num_stages % per_rank:
            raise ConfigError(f"field 'vpp' = {vpp}: {costs.num_stages} stages cannot be split into {per_rank} per rank")
        sched = build_schedule(name, costs.num_stages // per_rank, microbatches, vpp=vpp if name == "interleaved" else 1)
    _check_schedule_stages(sched, costs)
    chunks = w_chunks if w_chunks is not None else max(1, max(len(ls) for ls in costs.stage_layers))
    cache: dict = {}
    out = []
    for g in range(groups):
        if counts is not None:
            real = np.asarray(counts[g % len(counts)])
            pred = real
        else:
            real = _routing_counts(spec, costs, microbatches, seed=seed, group=g, step=step, jitter=jitter, log_cache=cache)
            pred = real if lag == 0 else _routing_counts(spec, costs, microbatches, seed=seed, group=g,
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
                            memory_cap=memory_cap, activation_bytes=costs.activation_bytes,
                            p2p_latency=p2p_latency, w_chunks=chunks)
        st, dy = plan.realise(d_real)
        out.append(GroupResult(g, real, x_real, x_pred, plan, st, dy))
    return DynamicResult(str(spec), sched.name, costs, out, microbatches, seed, step, lag, capacity_factor)


def skew_sweep(costs: StageCosts, skews: Iterable[float] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25), *,
               seeds: Iterable[int] = (0, 1, 2), include_uniform: bool = True, **kw: Any) -> list[dict[str, Any]]:
    """Idle removed and throughput gain vs Zipf skew (means over ``seeds``); one row per skew.

    Keywords go to :func:`run_dynamic` (``schedule``, ``microbatches``, ``groups``, ...).
    """
    specs = (["uniform"] if include_uniform else []) + [f"zipf:{s:g}" for s in skews]
    rows = []
    for spec in specs:
        res = [run_dynamic(costs, spec, seed=sd, **kw) for sd in (seeds if spec != "uniform" else [0])]
        rows.append(_mean_row(spec, res))
    return rows


def _mean_row(label: str, res: Sequence[DynamicResult]) -> dict[str, Any]:
    def m(f):
        return float(np.mean([f(r) for r in res]))

    return {
        "routing": label, "runs": len(res),
        "busiest_rank_load": m(lambda r: r.mean_imbalance),
        "iteration_static_s": m(lambda r: r.iteration_static_s),
        "iteration_dynamic_s": m(lambda r: r.iteration_dynamic_s),
        "idle_static_s": m(lambda r: r.idle_static_s),
        "idle_removed_s": m(lambda r: r.idle_removed_s),
        "idle_removed_share": m(lambda r: r.idle_removed_share),
        "throughput_gain": m(lambda r: r.throughput_gain),
        "group_idle_removed_s": m(lambda r: float(np.mean([g.idle_removed_s for g in r.groups]))),
        "never_slower": all(r.summary()["never_slower"] for r in res),
    }


def group_sweep(costs: StageCosts, groups: Iterable[int] = (1, 2, 4, 8), routing: str = "zipf:1.0", *,
                seeds: Iterable[int] = (0, 1, 2), **kw: Any) -> list[dict[str, Any]]:
    """Idle removed and throughput gain vs the number of EP groups (each deciding alone); one row per count."""
    rows = []
    for G in groups:
        row = _mean_row(routing, [run_dynamic(costs, routing, groups=G, seed=sd, **kw) for sd in seeds])
        rows.append({"groups": G, **row})
    return rows


def _interval_overlap(a: list[Gap], b: list[Gap]) -> float:
    """Seconds shared by two ranks' gap lists (each sorted and disjoint, as :func:`idle_gaps` returns)."""
    return overlap_length([(g.start, g.end) for g in a], [(g.start, g.end) for g in b])


def gap_error(predicted: Timeline, realised: Timeline) -> dict[str, float]:
    """Compare predicted and realised idle gaps of the same order (seconds).

    Returns ``gap_mae_s`` (mean absolute length error over gaps matched by rank and the action that ends
    them; a gap missing on one side counts with length 0), ``idle_mae_s`` (per-rank total idle),
    ``makespan_error`` (relative), ``recall`` (share of realised gap time inside predicted gaps) and
    ``precision`` (share of predicted gap time that is realised idle).
    """
    gp, gr = idle_gaps(predicted), idle_gaps(realised)
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


def prediction_study(costs: StageCosts, routing: str = "drift:1.0", *, steps: Iterable[int] = (1, 2, 3, 4),
                     lag: int = 1, seed: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """Predicted vs realised gaps when the prediction uses the routing of step ``t - lag`` and the step runs
    with the routing of step ``t`` (under ``drift`` the hot experts have moved in between).

    One row per step: gap errors of the static order (:func:`gap_error`), the realised gain of the plan
    decided on stale metadata, the gain with exact metadata, and whether the stale plan ended up slower
    than static (the guard holds on the prediction, not on a wrong prediction).
    """
    rows = []
    for t in steps:
        stale = run_dynamic(costs, routing, step=t, lag=lag, seed=seed, **kw)
        exact = run_dynamic(costs, routing, step=t, lag=0, seed=seed, **kw)
        g = stale.groups[0]
        err = gap_error(g.plan.predicted_static, g.static)
        load_err = float(np.mean(np.abs(g.predicted_loads - g.loads)))
        rows.append({
            "step": t, "routing": str(parse_routing(routing)), "lag": lag, **err, "load_mae": load_err,
            "gain_stale": stale.throughput_gain, "gain_exact": exact.throughput_gain,
            "idle_removed_stale_s": stale.idle_removed_s, "idle_removed_exact_s": exact.idle_removed_s,
            "stale_slower_than_static": stale.iteration_dynamic_s > stale.iteration_static_s * (1 + 1e-12),
        })
    return rows


def paper_comparison(result: DynamicResult | Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows with the paper's reported dynamic-only ablation beside a simulated result (labelled).

    Reported values come from ``data/paper/tessera_paper_reported.json`` (``ablation``: 641 ms idle removed,
    +3.4% throughput, 6,144 GPUs, internal model). Simulated values are this library's, on public configs
    and an analytic cost model: compare the shape, not the digits.
    """
    import json

    from tessera_lab.paths import data_dir

    rep = json.loads((data_dir() / "paper" / "tessera_paper_reported.json").read_text())["ablation"]
    s = result.summary() if isinstance(result, DynamicResult) else dict(result)
    return [
        {"metric": "idle time removed per rank (ms)", "reported (paper)": rep["dynamic_only_idle_reduction_ms"],
         "simulated (tessera-lab)": 1e3 * s["idle_removed_s"]},
        {"metric": "throughput gain (%)", "reported (paper)": 100 * rep["dynamic_only_throughput_gain"],
         "simulated (tessera-lab)": 100 * s["throughput_gain"]},
        {"metric": "share of idle time removed (%)", "reported (paper)": None,
         "simulated (tessera-lab)": 100 * s["idle_removed_share"]},
        {"metric": "GPUs", "reported (paper)": rep["dynamic_only_job_gpus"],
         "simulated (tessera-lab)": s.get("gpus")},
    ]


# ================================================================================ CLI
def simulate_cli(
    *,
    schedule: str,
    stages: int,
    microbatches: int,
    f: float,
    b: float,
    w: float | None,
    routing: str | None = None,
    dynamic: bool = False,
    vpp: int = 1,
    ep: int = 8,
    experts: int = 64,
    top_k: int = 8,
    tokens: int = 4096,
    layers_per_stage: int = 4,
    expert_fraction: float = 0.5,
    groups: int = 1,
    seed: int = 0,
    capacity_factor: float | None = None,
    grad_sync: float = 0.0,
    p2p_latency: float = 0.0,
    memory_cap: int | str | None = "max",
) -> tuple[dict[str, Any], str, dict[str, Timeline]]:
    """What ``tessera-lab simulate --routing ... [--dynamic]`` runs: returns ``(result, text, timelines)``.

    ``f``, ``b``, ``w`` are per stage (chunk) at uniform routing; ``tokens`` per EP rank and micro-batch (the
    EP group routes ``ep * tokens``). Without ``dynamic`` the static order is simulated under the routing;
    with it, static and dynamic are compared. ``memory_cap``: ``max``, ``rank`` or a count (text is
    accepted).

    Raises:
        ConfigError: ``dynamic`` without ``w`` (nothing deferrable), bad sizes, routing or memory cap.
        ScheduleError: a schedule the filler cannot use.
    """
    from tabulate import tabulate

    spec = parse_routing(routing or "uniform")
    if isinstance(memory_cap, str) and memory_cap not in ("max", "rank"):
        try:
            memory_cap = int(memory_cap)
        except ValueError:
            raise ConfigError(f"field 'memory_cap' = {memory_cap!r} is unknown; allowed: max, rank or an integer >= 1"
                              ) from None
    if dynamic and not w:
        raise ConfigError("field 'w' is required with --dynamic and must be > 0: the weight-gradient part of b is "
                          "the deferrable work that fills bubbles")
    name = canonical_name(schedule)
    per_rank = vpp if name == "interleaved" else (2 if name == "dualpipev" else 1)
    costs = StageCosts.synthetic(stages * per_rank, f, b, w or 0.0, expert_fraction=expert_fraction,
                                 layers_per_stage=layers_per_stage, ep=ep, num_experts=experts, top_k=top_k,
                                 tokens=tokens * ep, grad_sync=grad_sync)
    if not dynamic:
        sched = build_schedule(name, stages, microbatches, vpp=vpp)
        if sched.num_stages != costs.num_stages:  # pragma: no cover - guarded by per_rank above
            raise ConfigError("stage count mismatch")
        cnt = _routing_counts(spec, costs, microbatches, seed=seed, group=0, step=1, jitter=DEFAULT_JITTER, log_cache={})
        kw = {} if capacity_factor is None else dict(tokens=tokens * ep, top_k=top_k, capacity_factor=capacity_factor)
        x = slowest_loads(cnt, ep, **kw)
        tl = simulate(sched, RoutedDurations(costs, x), p2p_latency=p2p_latency)
        result = {"schedule": sched.name, "stages": stages, "microbatches": microbatches, "vpp": vpp,
                  "routing": str(spec), "busiest_rank_load_mean": float(x.mean()),
                  "busiest_rank_load_max": float(x.max()), "makespan": tl.iteration_time,
                  "bubble_fraction": tl.bubble_fraction, "bubble_overhead": tl.bubble_overhead,
                  "per_rank_idle": tl.per_rank_idle, "per_rank_busy": tl.per_rank_busy,
                  "peak_activations": tl.peak_activations}
        rows = [{"rank": r, "busy (s)": tl.per_rank_busy[r], "idle (s)": tl.per_rank_idle[r],
                 "peak activations (micro-batches)": tl.peak_activations[r]} for r in range(len(tl.per_rank_busy))]
        text = (tabulate(rows, headers="keys", floatfmt=".4g") +
                f"\nrouting {spec}: busiest EP rank carries {x.mean():.3f}x its share on average (max {x.max():.3f}x; "
                f"ep={ep}, {experts} experts, top-{top_k})\nmakespan {tl.iteration_time:.6g} s  "
                f"bubble_fraction {tl.bubble_fraction:.4f} (idle share of rank-time)  "
                f"bubble_overhead {tl.bubble_overhead:.4f} (idle / busy)")
        return result, text, {"static": tl}
    res = run_dynamic(costs, spec, schedule=name, microbatches=microbatches, vpp=vpp, groups=groups, seed=seed,
                      capacity_factor=capacity_factor, p2p_latency=p2p_latency, memory_cap=memory_cap)
    s = res.summary()
    result = {"schedule": res.schedule, "stages": stages, "microbatches": microbatches, "vpp": vpp,
              "routing": str(spec), "dynamic": True, **{k: v for k, v in s.items() if k not in ("schedule", "routing")},
              "groups_detail": res.rows()}
    rows = [
        {"plan": "static", "iteration (s)": res.iteration_static_s, "idle per rank (s)": res.idle_static_s,
         "bubble (% of iteration)": 100 * res.idle_static_s / res.iteration_static_s if res.iteration_static_s else 0.0},
        {"plan": "dynamic", "iteration (s)": res.iteration_dynamic_s, "idle per rank (s)": res.idle_dynamic_s,
         "bubble (% of iteration)": 100 * res.idle_dynamic_s / res.iteration_dynamic_s if res.iteration_dynamic_s else 0.0},
    ]
    text = (tabulate(rows, headers="keys", floatfmt=".5g") +
            f"\nrouting {spec}: busiest EP rank carries {s['busiest_rank_load_mean']:.3f}x its share on average "
            f"(max {s['busiest_rank_load_max']:.3f}x; ep={ep}, {experts} experts, top-{top_k}, {groups} EP group(s))"
            f"\ndynamic: idle time removed {s['idle_removed_s']:.5g} s per rank ({100 * s['idle_removed_share']:.1f}% "
            f"of the static idle time), iteration {s['iteration_static_s']:.5g} s -> {s['iteration_dynamic_s']:.5g} s, "
            f"throughput {100 * s['throughput_gain']:+.2f}%; choice per group: {', '.join(s['choices'])}"
            "\n(times in seconds if --f, --b and --w are seconds)")
    return result, text, {"static": res.groups[0].static, "dynamic": res.groups[0].dynamic}
