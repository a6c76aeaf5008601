"""Per-segment stage costs and memory for the partitioner and the evaluator (seconds, bytes per GPU).

:class:`StageCostModel` turns per-layer times (:class:`~tessera_lab.cost.analytic.LayerCost`), per-layer memory
and, for the overlapped schedule, layer-pair makespans after overlap into segment functions
``f/b/w/fb/cost/memory_bytes(s, i, j)`` of (virtual) stage ``s`` owning decoder layers ``i .. j-1``.
:func:`build_stage_model` builds one under a cost source: the analytic overlap scheduler, or a measured profile.
:func:`layer_pair_costs` is the one place analytic layer-pair makespans come from (the capacity report's recipes
use :func:`analytic_pair` too, so both see the same issue order).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

from tessera_lab.cost.analytic import CostModel, LayerCost
from tessera_lab.cost.memory import LayerMemory, fsdp_buffer_bytes, layer_memory
from tessera_lab.cost.sync import MLP_NODE_TASKS, host_waits, own_stream_hidden_s, paired_exposed_s, planner_per_layer_s
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import decompose, layer_tasks
from tessera_lab.overlap.core import Bundle, bundle, layer_kind_examples, schedule_pair, stage_pair_cost
from tessera_lab.plan.vschedules import plan_in_flight

#: candidate orders the overlap scheduler evaluates per layer-kind pair while planning
PAIR_SEARCH_BUDGET = 300
#: schedules whose steady state runs (F;B) pairs, so a stage costs its pair makespans
OVERLAPPED_SCHEDULES = ("overlapped", "interleaved-overlapped")


def _prefix(values: Sequence[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out


#: stage pair-cost sums by (layer kinds, pair costs): stage models of layouts that share their pair costs (a
#: search's candidates, re-plans) share the sums of :meth:`StageCostModel.fb`
_FB_CACHES: dict[tuple, dict[tuple[int, int], float]] = {}


def _fb_cache(kinds: list[str], pair_costs: dict | None) -> dict[tuple[int, int], float]:
    """The memo of :meth:`StageCostModel.fb`'s pair sums for ``(kinds, pair_costs)`` (a fresh one without pairs)."""
    if pair_costs is None:
        return {}
    key = (tuple(kinds), tuple(sorted(pair_costs.items())))
    got = _FB_CACHES.get(key)
    if got is None:
        if len(_FB_CACHES) >= 64:
            _FB_CACHES.clear()
        got = _FB_CACHES[key] = {}
    return got


class StageCostModel:
    """Per-layer times and memory turned into segment functions for the partitioner.

    Index convention: decoder layer ``l`` is entry ``l + 1`` of ``layer_costs`` / ``memory`` (entry 0 is the
    embedding, the last entry the LM head and loss); the embedding counts toward (virtual) stage 0 and the head
    toward the last one (``pp * vpp - 1``).

    ``host_sync``: seconds per micro-batch added to decoder layer ``l``'s forward (entry ``l``; the host/device
    synchronisation of :mod:`tessera_lab.cost.sync` on MoE layers), included in :meth:`f`, :meth:`standalone`
    and :meth:`cost` and reported by :meth:`sync`; ``None`` = none.

    ``rank_extra_bytes``: bytes every pipeline rank holds once whatever its layers (Megatron FSDP's unsharded
    buffers, :func:`tessera_lab.cost.memory.fsdp_buffer_bytes`), charged to each rank's first chunk.

    ``mlp_queued``: seconds of decoder layer ``l``'s backward ``mlp`` node (entry ``l``, :func:`mlp_node_b_s`): a
    paired forward's host waits hide behind the paired backward layer's value, and the rest,
    :func:`~tessera_lab.cost.sync.paired_exposed_s`, is added to that pair's makespan (``pair_costs`` as given stay
    the pairs without it, ``self.pair_costs`` holds them with it); ``None`` = 0 for every layer.
    """

    def __init__(self, layer_costs: Sequence[LayerCost], memory: Sequence[LayerMemory], parallel: ParallelConfig,
                 pair_costs: dict[tuple[str, str], float] | None = None, host_sync: Sequence[float] | None = None,
                 rank_extra_bytes: float = 0.0, mlp_queued: Sequence[float] | None = None):
        self.costs = list(layer_costs)
        self.host_sync = list(host_sync) if host_sync is not None and any(host_sync) else None
        self.memory = list(memory)
        self.parallel = parallel
        self.raw_pair_costs = pair_costs
        self.mlp_queued = list(mlp_queued) if mlp_queued is not None else None
        self.num_layers = len(self.costs) - 2
        self.num_stages = parallel.pp * parallel.vpp
        self.kinds = [c.kind for c in self.costs[1:-1]]
        self.pair_costs = self._with_paired_sync(pair_costs)
        self._fb_cache = _fb_cache(self.kinds, self.pair_costs)
        body = self.costs[1:-1]
        self._psync = _prefix(self.host_sync or [0.0] * len(body))
        self._pf = _prefix([c.F.time + x for c, x in zip(body, self.host_sync or [0.0] * len(body))])
        self._pb = _prefix([c.B.time + c.W.time for c in body])
        self._pw = _prefix([c.W.time for c in body])
        self._pparam = _prefix([mm.param_bytes for mm in self.memory[1:-1]])
        self._pact = _prefix([mm.activation_bytes for mm in self.memory[1:-1]])
        # per-stage constants (the embedding / head a stage owns, micro-batches in flight), computed once
        S = self.num_stages
        self._extras = [{a: self._extra_sum(s, a) for a in ("f", "b", "w")} for s in range(S)]
        self.rank_extra_bytes = rank_extra_bytes
        self._end_param = [sum(self.memory[e].param_bytes for e in self._ends(s)) + (rank_extra_bytes if s < parallel.pp
                                                                                    else 0.0) for s in range(S)]
        self._end_act = [sum(self.memory[e].activation_bytes for e in self._ends(s)) for s in range(S)]
        p = parallel
        self._in_flight = [plan_in_flight(p.schedule, p.pp, s % p.pp, p.microbatches, p.vpp) for s in range(S)]

    def _with_paired_sync(self, pairs: dict[tuple[str, str], float] | None) -> dict[tuple[str, str], float] | None:
        """``pairs`` with each pair's exposed host waits added (:func:`~tessera_lab.cost.sync.paired_exposed_s` of
        the forward kind's waits and the backward kind's ``mlp`` node; a kind's values are its first layer's)."""
        self._exposed = None
        if pairs is None or self.host_sync is None:
            return pairs
        first: dict[str, int] = {}
        for idx, kind in enumerate(self.kinds):
            first.setdefault(kind, idx)
        queued = self.mlp_queued or [0.0] * self.num_layers
        self._exposed = {(kf, kb): paired_exposed_s(self.host_sync[first[kf]], queued[first[kb]])
                         if kf in first and kb in first else 0.0 for kf, kb in pairs}
        return {key: v + self._exposed[key] for key, v in pairs.items()}

    def paired_sync(self, s: int, i: int, j: int) -> float:
        """Host/sync seconds per micro-batch inside :meth:`fb` of the segment (the exposed part of its paired
        forwards' waits, in the pairs of :func:`~tessera_lab.overlap.core.stage_pair_cost`); 0 without pairs or
        the term."""
        return 0.0 if self._exposed is None else stage_pair_cost(self.kinds[i:j], self._exposed)

    def _ends(self, s: int) -> list[int]:
        """Entries (0 = embedding, -1 = head) that stage ``s`` owns besides its decoder layers."""
        return ([0] if s == 0 else []) + ([-1] if s == self.num_stages - 1 else [])

    def _extra(self, s: int, attr: str) -> float:
        return self._extras[s][attr]

    def _extra_sum(self, s: int, attr: str) -> float:
        total = 0.0
        for e in self._ends(s):
            c = self.costs[e]
            total += {"f": c.F.time, "b": c.B.time + c.W.time, "w": c.W.time}[attr]
        return total

    def f(self, s: int, i: int, j: int) -> float:
        """Forward of the segment, seconds per micro-batch."""
        return self._pf[j] - self._pf[i] + self._extra(s, "f")

    def sync(self, s: int, i: int, j: int) -> float:
        """Host/sync seconds per micro-batch in the segment's forward (part of :meth:`f`; 0 without the term)."""
        return self._psync[j] - self._psync[i]

    def without_sync(self) -> "StageCostModel":
        """The same stage costs with no host/sync term (to state what the term adds)."""
        return StageCostModel(self.costs, self.memory, self.parallel, self.raw_pair_costs,
                              rank_extra_bytes=self.rank_extra_bytes, mlp_queued=self.mlp_queued)

    def b(self, s: int, i: int, j: int) -> float:
        """Full backward (B + W) of the segment, seconds per micro-batch."""
        return self._pb[j] - self._pb[i] + self._extra(s, "b")

    def w(self, s: int, i: int, j: int) -> float:
        """Weight-gradient part of the backward, seconds per micro-batch."""
        return self._pw[j] - self._pw[i] + self._extra(s, "w")

    def standalone(self, s: int, i: int, j: int) -> float:
        """Standalone time per micro-batch (F + B + W) of stage s owning layers i..j-1."""
        return self.f(s, i, j) + self.b(s, i, j)

    def fb(self, s: int, i: int, j: int) -> float:
        """Time per micro-batch after overlap (docs/concepts.md, "Stage cost after overlap"): the steady state of overlapped 1F1B pairs
        layer ``i+k``'s forward with layer ``j-1-k``'s full backward (B then W); the stage costs the sum of the
        pair makespans plus its extras (embedding on the first stage, LM head and loss on the last), which
        run standalone. Requires ``pair_costs``."""
        if self.pair_costs is None:
            raise ConfigError("overlap-aware stage costs need pair costs (plan with schedule 'overlapped')")
        core = self._fb_cache.get((i, j))
        if core is None:
            core = self._fb_cache[(i, j)] = stage_pair_cost(self.kinds[i:j], self.pair_costs)
        return core + self._extra(s, "f") + self._extra(s, "b")

    def cost(self, s: int, i: int, j: int) -> float:
        """The stage cost the schedule's steady state sees: after overlap for ``overlapped``, else standalone."""
        if self.pair_costs is not None and self.parallel.schedule in OVERLAPPED_SCHEDULES:
            return self.fb(s, i, j)
        return self.standalone(s, i, j)

    def cost_table(self, s: int, segments) -> list[float]:
        """:meth:`cost` of stage ``s`` for every ``(i, j)`` of ``segments``, the same numbers computed in one loop
        (a partition solve weighs every feasible segment of every stage)."""
        if self.pair_costs is not None and self.parallel.schedule in OVERLAPPED_SCHEDULES:
            cache, kinds, pairs = self._fb_cache, self.kinds, self.pair_costs
            ef, eb = self._extra(s, "f"), self._extra(s, "b")
            out = []
            for i, j in segments:
                core = cache.get((i, j))
                if core is None:
                    core = cache[(i, j)] = stage_pair_cost(kinds[i:j], pairs)
                out.append(core + ef + eb)
            return out
        pf, pb, ef, eb = self._pf, self._pb, self._extra(s, "f"), self._extra(s, "b")
        return [(pf[j] - pf[i] + ef) + (pb[j] - pb[i] + eb) for i, j in segments]

    def memory_row(self, s: int, i: int, js) -> list[float]:
        """:meth:`memory_bytes` of stage ``s`` starting at layer ``i`` for every end ``j`` of ``js``, the same
        numbers computed in one loop."""
        pp, pa, f = self._pparam, self._pact, self._in_flight[s]
        p0, a0, ep, ea = pp[i], pa[i], self._end_param[s], self._end_act[s]
        return [(pp[j] - p0 + ep) + (pa[j] - a0 + ea) * f for j in js]

    def params(self, s: int, i: int, j: int) -> float:
        """Parameter and training-state bytes per GPU of the segment."""
        return self._pparam[j] - self._pparam[i] + self._end_param[s]

    def activations(self, s: int, i: int, j: int) -> float:
        """Activation bytes per micro-batch of the segment."""
        return self._pact[j] - self._pact[i] + self._end_act[s]

    def memory_bytes(self, s: int, i: int, j: int) -> float:
        """Parameters and training state plus activations times micro-batches in flight (bytes); for virtual
        stages the rank's memory is the sum over its chunks."""
        return self.params(s, i, j) + self.activations(s, i, j) * self._in_flight[s]


def _lane_bundle(model: ModelSpec, layer: int, phase: str, parallel: ParallelConfig, name: str) -> Bundle:
    """:func:`~tessera_lab.overlap.core.bundle` without its tasks on streams of their own
    (:attr:`~tessera_lab.model.graph.Task.own_stream`), which the two-lane pair model does not run."""
    b = bundle(model, layer, phase, parallel, name=name)
    if not any(t.own_stream for t in b.tasks):
        return b
    return Bundle.from_tasks(name, [t for t in b.tasks if not t.own_stream], model=model, parallel=parallel,
                             layer=b.layer, phase=phase, kind=b.kind, expert_load=b.expert_load)


@lru_cache(maxsize=256)
def _pair_result(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, kind_f: str, kind_b: str, budget: int):
    cm = CostModel(cluster, parallel)
    ex = layer_kind_examples(model)
    a = _lane_bundle(model, ex[kind_f], "F", parallel, "F")
    b = _lane_bundle(model, ex[kind_b], "BW", parallel, "BW")
    return a, b, schedule_pair(a, b, cost_model=cm, budget=budget)


def analytic_pair(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, kind_f: str, kind_b: str,
                  budget: int = PAIR_SEARCH_BUDGET):
    """``(bundle F, bundle BW, PairSchedule)``: the forward of a ``kind_f`` layer with the full backward (B then
    W) of a ``kind_b`` layer in the best issue order the overlap scheduler finds under the analytic cost model
    (memoised; the makespan is in seconds). Tasks on streams of their own (Megatron FSDP's collectives) are not in
    the bundles: :func:`layer_pair_costs` adds them."""
    return _pair_result(model, parallel, cluster, kind_f, kind_b, budget)


def layer_pair_costs(model: ModelSpec, parallel: ParallelConfig, cost_model: CostModel,
                     budget: int = PAIR_SEARCH_BUDGET) -> dict[tuple[str, str], float]:
    """Analytic makespan (seconds) of every (forward kind, backward kind) pair of the model's layer kinds
    (:func:`analytic_pair`), with the two layers' tasks on streams of their own beside it
    (:meth:`~tessera_lab.cost.analytic.CostModel.own_stream_time`)."""
    ex = layer_kind_examples(model)
    side = {}
    for kind, layer in ex.items():
        lt = layer_tasks(model, layer, parallel)
        side[kind] = ([t for t in lt.F if t.own_stream], [t for t in lt.B + lt.W if t.own_stream])
    return {(kf, kb): cost_model.own_stream_time(analytic_pair(model, parallel, cost_model.cluster, kf, kb,
                                                               budget)[2].makespan, side[kf][0] + side[kb][1])
            for kf in ex for kb in ex}


#: layer costs, memory and pair costs by ``(model, cost-relevant parallel sizes, cluster)``: a re-plan that changes
#: only what the costs do not see (micro-batches in bf16) builds its stage model from here (no pair search)
_COSTS: dict[tuple, tuple] = {}
_COSTS_MAX = 64
COST_CACHE_STATS = {"hits": 0, "builds": 0}


def cost_key_parallel(parallel: ParallelConfig) -> ParallelConfig:
    """The parallel sizes as the per-layer costs and pair costs see them: micro-batches enter only FP8 weight-cast
    amortisation (:meth:`~tessera_lab.cost.analytic.CostModel.fp8_cast_bytes`, :func:`tessera_lab.cost.host.
    task_kernels`), so outside FP8 they are normalised to 1; the pipeline size, the virtual stages and (without
    FSDP, whose per-layer gathers run over it) the data-parallel size enter no layer task, nor the placement of
    the TP, CP and EP groups the links price (:func:`~tessera_lab.model.layout.slowest_group`: the worst of them
    on a given world does not depend on how it splits into stages and replicas), so they are normalised to 1, and the schedule to whether it pairs layers (``overlapped``) or not
    (``1f1b``). Memory, which the data-parallel size shards, is rebuilt from the cached tasks on every call."""
    changes = {"pp": 1, "vpp": 1, **({} if parallel.fsdp else {"dp": 1}),
               "schedule": "overlapped" if parallel.schedule in OVERLAPPED_SCHEDULES else "1f1b"}
    if parallel.precision != "fp8":
        changes["microbatches"] = 1
    return parallel.replace(**changes)


def build_stage_model(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, profile=None
                      ) -> tuple[CostModel, StageCostModel]:
    """Cost model and per-segment stage costs/memory for a model on a cluster (pair costs after overlap
    included when the schedule is overlapped: from a measured ``profile`` (a
    :class:`tessera_lab.overlap.profiles.Profile`) when given, else from the analytic overlap scheduler).

    Without a profile the layer costs, memory and pair costs are memoised by ``(model, parallel sizes the costs
    see, cluster)`` (:func:`cost_key_parallel`; counts in ``COST_CACHE_STATS``). Without a profile every MoE
    layer's forward also carries :func:`tessera_lab.cost.sync.planner_per_layer_s` (0 where its rule says), less
    what Megatron FSDP's own-stream collectives hide (:func:`layer_host_sync`)."""
    cost_model = CostModel(cluster, parallel)
    key = (model, cost_key_parallel(parallel), cluster) if profile is None else None
    held = _COSTS.get(key) if key is not None else None
    if held is not None:
        COST_CACHE_STATS["hits"] += 1
        layer_costs, tasks, pairs, queued = held
        return cost_model, StageCostModel(layer_costs, layer_memory(model, parallel, tasks), parallel, pairs,
                                          layer_host_sync(model, parallel, layer_costs, profile is None),
                                          rank_extra_bytes=fsdp_buffer_bytes(model, parallel), mlp_queued=queued)
    COST_CACHE_STATS["builds"] += 1
    tasks = decompose(model, parallel)
    layer_costs = [cost_model.layer_cost(lt) for lt in tasks]
    mem = layer_memory(model, parallel, tasks)
    pairs = None
    if parallel.schedule in OVERLAPPED_SCHEDULES:
        if profile is not None:
            from tessera_lab.overlap.profiles import profile_stage_pair_costs

            pairs = profile_stage_pair_costs(profile, model, parallel, cost_model, budget=PAIR_SEARCH_BUDGET)
        else:  # pair makespans see what the layer costs see: searched once per cost key
            pairs = layer_pair_costs(model, key[1], CostModel(cluster, key[1]))
    queued = [mlp_node_b_s(cost_model, lt) for lt in tasks[1:-1]] if pairs is not None else None
    if key is not None:
        if len(_COSTS) >= _COSTS_MAX:
            _COSTS.clear()
        _COSTS[key] = (layer_costs, tasks, pairs, queued)
    return cost_model, StageCostModel(layer_costs, mem, parallel, pairs,
                                      layer_host_sync(model, parallel, layer_costs, profile is None),
                                      rank_extra_bytes=fsdp_buffer_bytes(model, parallel), mlp_queued=queued)


def layer_host_sync(model: ModelSpec, parallel: ParallelConfig, layer_costs: Sequence, analytic: bool
                    ) -> list[float] | None:
    """Host/sync seconds per micro-batch each decoder layer's forward carries (``None``: none): a MoE layer's
    :func:`~tessera_lab.cost.sync.planner_per_layer_s`, less what collectives on streams of their own hide
    (:func:`~tessera_lab.cost.sync.own_stream_hidden_s`, from the layer's F and W ``lane_slack``: Megatron FSDP);
    ``layer_costs``: embedding, decoder layers, head, as :meth:`~tessera_lab.cost.analytic.CostModel.model_costs`."""
    c = planner_per_layer_s(parallel, analytic=analytic, model=model)
    if c <= 0:
        return None
    waits = host_waits(parallel, model)
    per_wait = c / len(waits)
    return [max(0.0, c - own_stream_hidden_s(waits, per_wait, lc.F.lane_slack, lc.W.lane_slack))
            if ly.ffn == "moe" else 0.0 for ly, lc in zip(model.stack.layers, layer_costs[1:-1])]


def mlp_node_b_s(cost_model: CostModel, lt) -> float:
    """Seconds of one layer's backward ``mlp`` node (the input-gradient tasks of
    :data:`~tessera_lab.cost.sync.MLP_NODE_TASKS`: routed experts and their activation, or a dense MLP), standalone
    analytic times summed: the GPU work queued before a paired forward's host wait (:mod:`tessera_lab.cost.sync`)."""
    return sum(cost_model.task_time(t) for t in lt.B if t.name in MLP_NODE_TASKS and not t.is_comm)


def accounted_boundaries(num_layers: int, stages: int, *, embedding: bool, loss: bool) -> list[int]:
    """Megatron-Core's ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``
    (``get_num_layers_to_build``, ``megatron/core/transformer/transformer_block.py``): the embedding and the loss
    each count as one layer slot, every one of the ``stages`` virtual stages (``pp * vpp``) gets ``slots =
    (num_layers + embedding + loss) / stages`` of them, the embedding taking one on the first virtual stage and the
    loss one on the last (either may be left with no decoder layer, as Megatron allows). Returns the
    ``stages + 1`` decoder-layer boundaries.

    Raises:
        ConfigError: ``stages`` not dividing ``num_layers + embedding + loss`` (Megatron refuses that layout), or a
            stage left with fewer than zero layers.
    """
    total = num_layers + int(embedding) + int(loss)
    slots, rest = divmod(total, stages)
    if rest or slots < 1:
        raise ConfigError(f"field 'pp x vpp' = {stages} does not split {num_layers} layers"
                          f"{' + embedding' if embedding else ''}{' + loss' if loss else ''} = {total} slots evenly; "
                          f"allowed: a pp x vpp dividing {total}")
    counts = [slots - (embedding and s == 0) - (loss and s == stages - 1) for s in range(stages)]
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return bounds
