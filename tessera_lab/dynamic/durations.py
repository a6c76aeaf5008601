"""Routing-dependent durations: stage times and how MoE layers slow down with the busiest EP rank's load.

The EP ranks of a stage exchange tokens by all-to-all, so each layer's expert GEMMs and all-to-alls finish when
the *busiest* rank of the group does: a rank receiving ``x`` times its uniform share of assignments does ``x``
times the expert GEMM work and receives ``x`` times the bytes. Per MoE layer and micro-batch the slowest rank's
relative load ``x = max_rank load / uniform share`` (:func:`slowest_loads`, from counts of
:mod:`tessera_lab.dynamic.routing`, after capacity drops) sets the layer's time; a stage sums its layers.

* :class:`StageCosts`: per-stage F/I/W at uniform routing plus ``layer_delta(layer, x)``, either from the
  analytic cost model (:meth:`StageCosts.from_model`) or a synthetic split (:meth:`StageCosts.synthetic`).
* :class:`RoutedDurations`: ``durations(stage, microbatch, type) -> seconds`` for the simulator from stage
  costs and loads ``[layers, microbatches]``; overlapped pairs use the pair's own forward and backward.
* :class:`ChunkedDurations`: W divided into equal parts (one per chunk of a chunked W).
* :class:`StagePairModel` / :class:`PairDurations`: an overlapped F+B pair priced by the one pair model,
  :func:`tessera_lab.cost.lanes.pair_makespan` (two streams, contention), from each side's compute and exposed
  communication seconds.

Times are float seconds; loads are dimensionless (1.0 = the uniform share). numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from tessera_lab.cost.contention import Contention
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.dynamic.routing import apply_capacity, ep_rank_load
from tessera_lab.errors import ConfigError, ScheduleError
from tessera_lab.pipeline.schedules import ActionType, Schedule

__all__ = ["StageCosts", "slowest_loads", "RoutedDurations", "routed_durations", "ChunkedDurations", "PairDurations",
           "StagePairModel"]

_F, _B, _I, _W, _OV = ActionType.F, ActionType.B, ActionType.I, ActionType.W, ActionType.OVERLAP_F_B


@dataclass(frozen=True)
class StagePairModel:
    """How an overlapped pair of a forward and a backward runs on one rank, from the lanes of its two sides.

    Attributes:
        lanes: per stage, ``{"F": (compute, exposed), "I": (...), "W": (...)}`` seconds per micro-batch at uniform
            routing: the phase's compute-stream time and its communication not hidden under its own compute (the
            phase's time is their sum).
        contention: slowdowns while one side's exposed communication runs beside the other side's compute.

    :meth:`pair` builds each side as its compute task followed by its exposed communication, scales both to the
    side's routed seconds, and returns the :func:`~tessera_lab.cost.lanes.pair_makespan` (``streams``) of the
    better of the two issue orders (backward first, forward first), as the planner's pair search takes the best
    order. A side with no exposed communication cannot overlap: the pair costs the two sides' sum.
    """

    lanes: tuple
    contention: Contention = Contention()

    def side(self, stage: int, phases: Sequence[str], seconds: float) -> tuple[float, float]:
        """``(compute, exposed)`` seconds of a side made of ``phases`` of ``stage``, scaled to ``seconds``."""
        ln = self.lanes[stage]
        c = sum(ln[p][0] for p in phases)
        e = sum(ln[p][1] for p in phases)
        if c + e <= 0:
            return float(seconds), 0.0
        k = seconds / (c + e)
        return c * k, e * k

    def pair(self, f_side: tuple[float, float], b_side: tuple[float, float]) -> float:
        """Makespan (s) of a forward ``(compute, exposed)`` beside a backward ``(compute, exposed)``."""
        durations = {"b.c": b_side[0], "b.e": b_side[1], "f.c": f_side[0], "f.e": f_side[1]}
        lanes = {"b.c": "compute", "b.e": "comm", "f.c": "compute", "f.e": "comm"}
        deps = {"b.e": ("b.c",), "f.e": ("f.c",)}
        return min(pair_makespan(order, durations, lanes, deps, contention=self.contention).makespan
                   for order in (("b.c", "b.e", "f.c", "f.e"), ("f.c", "f.e", "b.c", "b.e")))


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
        pairs: how an overlapped F+B pair runs (:class:`StagePairModel`); ``None``: every phase is compute, so
            a pair costs the sum of its parts.
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
    pairs: StagePairModel | None = None

    @property
    def num_stages(self) -> int:
        return len(self.f)

    @property
    def num_layers(self) -> int:
        """Routing layers the loads array must provide (max index + 1)."""
        return 1 + max((l for ls in self.stage_layers for l in ls), default=-1)

    @classmethod
    # params: keyword settings with defaults, most of them the StageCosts fields of the same name
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
        fb: float | None = None,
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
            fb: makespan of an overlapped F+B pair at uniform routing (``None``: ``f + b``, no overlap gain),
                in ``[max(f, b), f + b]``: the backward's input-gradient part then carries ``f + b - fb`` seconds
                of exposed communication that the forward's compute hides (:class:`StagePairModel`).

        Raises:
            ConfigError: out-of-range values (``w > b``, fraction outside [0, 1], ``fb`` outside its range, ...).
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
        exposed = 0.0 if fb is None else f + b - float(fb)
        if fb is not None and not (max(f, b) <= fb <= f + b and exposed <= i):
            raise ConfigError(f"field 'fb' = {fb!r} is out of range; allowed: max(f, b) = {max(f, b):g} to f + b = "
                              f"{f + b:g}, and f + b - fb <= b - w = {i:g} (the overlap hides the backward's exposed "
                              f"communication)")
        L = layers_per_stage
        per = (expert_fraction * f / L, expert_fraction * i / L, expert_fraction * w / L)
        lanes = tuple({"F": (float(f), 0.0), "I": (i - exposed, exposed), "W": (float(w), 0.0)} for _ in range(stages))

        def delta(layer: int, x: float) -> tuple[float, float, float]:
            return ((x - 1.0) * per[0], (x - 1.0) * per[1], (x - 1.0) * per[2])

        return cls(
            [float(f)] * stages, [float(i)] * stages, [float(w)] * stages,
            [list(range(s * L, (s + 1) * L)) for s in range(stages)], delta, [float(grad_sync)] * stages, ep,
            f"synthetic: {stages} stages x {L} MoE layers, F={f:g} I={i:g} W={w:g} s, "
            f"{expert_fraction:.0%} of each scales with the busiest EP rank's load",
            num_experts, top_k, tokens, pairs=StagePairModel(lanes),
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
        """Stage times of a real model from the analytic cost model (docs/concepts.md).

        Stage F/I/W at uniform routing are the planner's (embedding on the first stage, LM head and loss on
        the last); the extra time of a MoE layer at busiest-rank load ``x`` is ``cost(x) - cost(1)`` of
        :func:`~tessera_lab.model.tasks.layer_tasks` with ``expert_load = x`` and its EP all-to-all bytes times
        ``x`` (the busiest rank receives ``x`` times its share), costed by
        :class:`~tessera_lab.cost.analytic.CostModel` and cached per layer kind and ``x`` rounded to
        ``load_resolution``. Gradient reduce-scatter per stage: :func:`tessera_lab.plan.make.dp_grad_sync_time`.

        Args:
            model: a :class:`~tessera_lab.model.spec.ModelSpec`.
            parallel: a :class:`~tessera_lab.model.hardware.ParallelConfig` (default: pp=8, ep=8, m=32 with the
                ``zb-h1`` schedule; an ``overlapped`` schedule is replaced by ``zb-h1``: filling needs W tasks). Its
                ``host_sync_s`` (:mod:`tessera_lab.cost.sync`) is 0 unless set: these stage times describe the
                dynamic runtime, not the eager dispatcher's host sync the planner adds to schedules without EP
                overlap by default.
            cluster: default :func:`~tessera_lab.model.hardware.cluster_for`.
            plan: a :class:`~tessera_lab.plan.make.Plan` whose boundaries to use.
            boundaries: stage boundaries (``pp + 1`` ints); default: the DP partition that minimises the
                slowest stage.

        Raises:
            ConfigError: bad sizes or boundaries.
        """
        from tessera_lab.model.hardware import cluster_for
        from tessera_lab.plan.make import build_stage_model

        parallel = _dynamic_parallel(parallel)
        cluster = cluster or cluster_for(parallel)
        if not (0 < load_resolution <= 1):
            raise ConfigError(f"field 'load_resolution' = {load_resolution} is out of range; allowed: (0, 1]")
        b = _stage_boundaries(model, parallel, cluster, plan, boundaries)
        cost_model, sm = build_stage_model(model, parallel, cluster)
        f, i, w, sync, lanes = _uniform_stage_costs(model, parallel, b, cost_model, sm)
        stage_layers, delta = _moe_delta(model, parallel, b, cost_model, load_resolution)
        E, k = model.moe.num_experts, model.moe.num_experts_per_tok
        return cls(
            f, i, w, stage_layers, delta, sync, parallel.ep,
            f"{model.name}: analytic costs on {cluster.num_nodes} x {cluster.gpus_per_node} {cluster.gpu.name}, "
            f"pp={parallel.pp} ep={parallel.ep}, boundaries {b}",
            E, k, parallel.tokens_per_microbatch * parallel.ep,
            [sm.activations(s, b[s], b[s + 1]) for s in range(parallel.pp)],
            {"boundaries": b, "model": model.name, "microbatches": parallel.microbatches,
             "tokens_per_iteration": parallel.tokens_per_iteration},
            StagePairModel(tuple(lanes), cost_model.contention),
        )


def _dynamic_parallel(parallel):
    """The :class:`~tessera_lab.model.hardware.ParallelConfig` :meth:`StageCosts.from_model` costs stages under:
    one chunk per rank, loads relative to the mean rank, no host sync unless set (see its Args)."""
    from tessera_lab.model.hardware import ParallelConfig

    parallel = parallel or ParallelConfig(schedule="zb-h1")
    if parallel.schedule in ("overlapped", "dualpipev", "interleaved"):  # one chunk per rank: pp stage costs
        parallel = parallel.replace(schedule="zb-h1", vpp=1)
    # loads x here are relative to the mean rank (the routing sets the busiest rank), so the plan's own
    # busiest-rank assumption is replaced by the mean: cost(1) = uniform routing, cost(x) = busiest at x
    parallel = parallel.replace(expert_load=1.0)
    if parallel.host_sync_s is None:  # the planner's host/sync term only when asked for (see Args)
        parallel = parallel.replace(host_sync_s=0.0)
    return parallel


def _stage_boundaries(model, parallel, cluster, plan, boundaries) -> list[int]:
    """The plan's boundaries, the given ones, or the DP partition minimising the slowest stage; checked.

    Raises:
        ConfigError: not ``pp + 1`` non-decreasing ints from 0 to the model's layers.
    """
    from tessera_lab.plan.make import make_plan

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
    return b


def _uniform_stage_costs(model, parallel, b: list[int], cost_model, sm) -> tuple[list, list, list, list, list]:
    """Per stage at uniform routing: F, I, W seconds (embedding and head included), gradient-sync seconds
    (:func:`tessera_lab.plan.make.dp_grad_sync_time`) and the compute/comm lanes of each phase."""
    from tessera_lab.plan.make import StagePlan, dp_grad_sync_time

    f, i, w, sync, lanes = [], [], [], [], []
    for s in range(parallel.pp):
        fs, bs, ws = sm.f(s, b[s], b[s + 1]), sm.b(s, b[s], b[s + 1]), sm.w(s, b[s], b[s + 1])
        f.append(fs)
        i.append(bs - ws)
        w.append(ws)
        lanes.append(_stage_lanes(sm, s, b[s], b[s + 1], {"F": fs, "I": bs - ws, "W": ws}))
        st = StagePlan(s, list(range(b[s], b[s + 1])), [], fs, bs, ws, 0.0, 0.0, 0.0)
        sync.append(dp_grad_sync_time(model, cost_model, st))
    return f, i, w, sync, lanes


def _moe_delta(model, parallel, b: list[int], cost_model, load_resolution: float) -> tuple[list[list[int]], Callable]:
    """Each stage's MoE layers (as routing-layer indices) and ``delta(layer, x) -> (dF, dI, dW)``: the extra
    seconds of that MoE layer at busiest-rank load ``x``, ``cost(x) - cost(1)``, its EP all-to-all bytes scaled by
    ``x``; costs cached per layer kind and ``x`` rounded to ``load_resolution``."""
    from tessera_lab.model.tasks import layer_tasks

    moe_layers = [l.index for l in model.stack.layers if l.ffn == "moe"]
    ordinal = {idx: n for n, idx in enumerate(moe_layers)}
    stage_layers = [[ordinal[l] for l in range(b[s], b[s + 1]) if l in ordinal] for s in range(parallel.pp)]
    cache: dict[tuple, tuple[float, float, float]] = {}

    def scaled_cost(idx: int, q: int) -> tuple[float, float, float]:
        layer = model.stack.layers[idx]
        key = (layer.kind, layer.attention, q)  # layer.kind carries window, chunk, MTP and dense width
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

    return stage_layers, delta


def _stage_lanes(sm, s: int, i: int, j: int, totals: dict[str, float]) -> dict[str, tuple[float, float]]:
    """``{"F"|"I"|"W": (compute, exposed)}`` of stage ``s`` owning layers ``i..j-1`` of a
    :class:`~tessera_lab.plan.stages.StageCostModel`: exposed = each phase's makespan less its compute-stream time,
    summed over the stage's layers (and embedding / head), compute = the phase's total less that."""
    entries = [l + 1 for l in range(i, j)] + [e if e >= 0 else len(sm.costs) - 1 for e in sm._ends(s)]
    out = {}
    for phase, attr in (("F", "F"), ("I", "B"), ("W", "W")):
        exposed = sum(max(0.0, getattr(sm.costs[e], attr).time - getattr(sm.costs[e], attr).compute) for e in entries)
        exposed = min(exposed, totals[phase])
        out[phase] = (totals[phase] - exposed, exposed)
    return out


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
        self.pair_model = costs.pairs

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

class ChunkedDurations:
    """``base`` durations with every W divided by ``chunks`` (one part of a chunked W)."""

    def __init__(self, base, chunks: int):
        self.base, self.chunks = base, chunks
        self.pair_model = getattr(base, "pair_model", None)

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        d = self.base(stage, microbatch, type)
        return d / self.chunks if type is _W else d


class PairDurations:
    """``base`` durations with every overlapped pair priced from its own sub-actions by the pair model.

    The simulator asks for an ``OVERLAP_F_B`` pair with its backward's (stage, micro-batch) only; a pair
    ``(F(s', i'); B|I(s, i))`` then takes :meth:`StagePairModel.pair` of its forward side (``base(s', i', F)``
    seconds) and its backward side (``base(s, i, B|I)``), both split into compute and exposed communication as
    ``base.pair_model`` (:class:`StagePairModel`, from :attr:`StageCosts.pairs`) splits their stages; without one,
    the sum of the two. So a pair whose backward was split into I no longer carries its W. Other actions pass
    through. Pair times are memoised by their inputs.

    Raises:
        ScheduleError: a pair asked for that is not in ``schedule``.
    """

    def __init__(self, base, schedule: Schedule):
        if isinstance(base, PairDurations):
            base = base.base
        self.base = base
        self.model: StagePairModel | None = getattr(base, "pair_model", None)
        self._memo: dict[tuple, float] = {}
        self.pairs: dict[tuple[int, int], tuple] = {}
        for acts in schedule.actions.values():
            for a in acts:
                if a.sub_actions:
                    fwd = next((x for x in a.sub_actions if x.type is _F), None)
                    bwd = next((x for x in a.sub_actions if x.type is not _F), None)
                    if fwd is not None and bwd is not None:
                        self.pairs[(bwd.stage, bwd.microbatch)] = (fwd, bwd)

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        if type is not _OV:
            return self.base(stage, microbatch, type)
        pair = self.pairs.get((stage, microbatch))
        if pair is None:
            return self.base(stage, microbatch, type)
        f, b = pair
        tf, tb = self.base(f.stage, f.microbatch, _F), self.base(b.stage, b.microbatch, b.type)
        if self.model is None:
            return tf + tb
        key = (f.stage, b.stage, b.type is _I, tf, tb)
        got = self._memo.get(key)
        if got is None:
            phases = ("I",) if b.type is _I else ("I", "W")
            got = self._memo[key] = self.model.pair(self.model.side(f.stage, ("F",), tf),
                                                    self.model.side(b.stage, phases, tb))
        return got
