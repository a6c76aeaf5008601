"""The layout search's lower bounds (:mod:`tessera_lab.plan.search`): on the iteration
(:func:`time_lower_bound`) and on the busiest rank's memory (:func:`memory_lower_bound`), over every partition of a
layout, from per-entry costs and memory shared by the layouts of one cost group (:class:`_Bounds`). A bound above
the planner's result would prune a layout the planner could pick: ``tests/test_search_bound.py`` checks both
(docs/search.md, "Pruning")."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tessera_lab.cost.memory import layer_memory
from tessera_lab.model.hardware import Cluster, ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.plan.search_space import Layout
from tessera_lab.plan.stages import OVERLAPPED_SCHEDULES
from tessera_lab.plan.vschedules import plan_in_flight


@dataclass
class _Group:
    """Per-entry costs shared by the layouts of one :meth:`Layout.cost_group` (entries: embedding, layers, head)."""

    compute: list[float]  # F+B+W compute seconds per micro-batch, per entry
    comm: list[float] = field(default_factory=list)  # F+B+W communication seconds per micro-batch, per entry
    #: per entry: (F, I, W) phase times (``PhaseCost.time``, seconds per micro-batch, host/sync not included) and the
    #: decoder layer's kind (``None``: embedding, head)
    phases: list[tuple[float, float, float]] = field(default_factory=list)
    kinds: list[str | None] = field(default_factory=list)
    #: per layer kind: its backward ``mlp`` node, seconds (:func:`~tessera_lab.plan.stages.mlp_node_b_s`)
    mlp_queued: dict[str, float] = field(default_factory=dict)
    #: per entry: the F and W ``lane_slack`` (seconds a host wait hides behind own-stream collectives: Megatron FSDP)
    slack: list[tuple[float, float]] = field(default_factory=list)

    @property
    def mlp_queued_max(self) -> float:
        """The longest backward ``mlp`` node of the layer kinds, seconds: no paired forward's host waits hide behind
        more."""
        return max(self.mlp_queued.values(), default=0.0)

    def sums(self) -> tuple[float, float, float]:
        """(sum of compute, of communication, the largest entry's compute), seconds."""
        if not hasattr(self, "_sums"):
            self._sums = (sum(self.compute), sum(self.comm), max(self.compute))
        return self._sums

    def phase_sums(self) -> tuple[float, float, float]:
        """(sum of F+B+W phase times, of F+B phase times (W deferred), the largest entry's F+B+W phase time),
        seconds."""
        if not hasattr(self, "_phase_sums"):
            whole = [f + i + w for f, i, w in self.phases]
            self._phase_sums = (sum(whole), sum(f + i for f, i, _ in self.phases), max(whole))
        return self._phase_sums


def kind_tasks(model: ModelSpec, parallel: ParallelConfig) -> list:
    """:func:`~tessera_lab.model.tasks.decompose` built once per layer kind: layers of one kind have the same
    tasks but for their index (the planner's pair costs assume as much; the tests compare with ``decompose``)."""
    from tessera_lab.model.tasks import embedding_tasks, head_tasks, layer_tasks

    by_kind: dict[str, Any] = {}
    body = []
    for layer in model.stack.layers:
        rep = by_kind.get(layer.kind)
        if rep is None:
            rep = by_kind[layer.kind] = layer_tasks(model, layer, parallel)
        body.append(rep if rep.layer == layer.index else replace(rep, layer=layer.index))
    return [embedding_tasks(model, parallel), *body, head_tasks(model, parallel)]


def _group(model: ModelSpec, layout: Layout, seq_len: int, cluster: Cluster, cost_models: dict | None = None
           ) -> _Group:
    """Costs of one group: the analytic cost model's :meth:`~tessera_lab.cost.analytic.CostModel.layer_cost` of the
    embedding, the head and one layer of each kind (layers of one kind have the same tasks but for their index,
    :func:`kind_tasks`, and no cost reads the index); ``cost_models`` keeps cost models by the parallel sizes without
    recompute (recompute changes tasks, no cost), so groups that differ in recompute share their common tasks'
    phase costs."""
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.tasks import embedding_tasks, head_tasks, layer_tasks

    par = layout.parallel(seq_len).replace(schedule="1f1b", vpp=1)
    key = par.replace(recompute="none", recompute_modules=())
    cms = {} if cost_models is None else cost_models
    cm = cms[key] = cms.get(key) or CostModel(cluster, key)
    from tessera_lab.plan.stages import mlp_node_b_s

    by_kind: dict[str, Any] = {}
    queued: dict[str, float] = {}
    for layer in model.stack.layers:
        if layer.kind not in by_kind:
            lt = layer_tasks(model, layer, par)
            by_kind[layer.kind] = cm.layer_cost(lt)
            queued[layer.kind] = mlp_node_b_s(cm, lt)
    costs = [cm.layer_cost(embedding_tasks(model, par)), *(by_kind[ly.kind] for ly in model.stack.layers),
             cm.layer_cost(head_tasks(model, par))]
    return _Group([c.F.compute + c.B.compute + c.W.compute for c in costs],
                  [c.F.comm + c.B.comm + c.W.comm for c in costs], [(c.F.time, c.B.time, c.W.time) for c in costs],
                  [None, *(ly.kind for ly in model.stack.layers), None], queued,
                  [(c.F.lane_slack, c.W.lane_slack) for c in costs])


#: schedules that split the backward and may defer W past a rank's last B
SPLIT_SCHEDULES = ("zb-h1", "zb-h2", "zb-auto")


def bubble_factor(pp: int, microbatches: int) -> float:
    """Lower bound of iteration / (``m`` x per-micro-batch work over ``pp``) with one model chunk per rank.

    Rank ``r`` starts after micro-batch 0's forward has passed ranks ``0 .. r-1``, and after its last backward
    that micro-batch's backward passes them again, so ``T >= m u_r + sum_{s<r} u_s`` (``u_s``: stage ``s``'s
    work per micro-batch). The partition minimising the largest right-hand side makes them all equal,
    ``u_r = u_0 (1 - 1/m)^r``, so ``T >= W / (1 - (1 - 1/m)^pp)`` (``W``: all stages' work per micro-batch);
    returned over ``m W / pp`` (>= 1; 1 for ``pp = 1``)."""
    if pp <= 1:
        return 1.0
    m = microbatches
    return pp / m / (1.0 - (1.0 - 1.0 / m) ** pp)


def time_lower_bound(group: _Group, layout: Layout, sync_s: float = 0.0) -> float:
    """Seconds no partition of ``layout`` can beat in the simulator (``group``: the layout's costs, its recompute
    included; ``sync_s``: the host/sync seconds per micro-batch in the MoE layers' forwards,
    :mod:`~tessera_lab.cost.sync`).

    Without EP overlap (every schedule but :data:`~tessera_lab.plan.stages.OVERLAPPED_SCHEDULES`) the simulator
    (:mod:`tessera_lab.plan.evaluate`, :mod:`tessera_lab.pipeline.engine`) runs a rank's actions one after another,
    each charged its stage's phase time (:class:`~tessera_lab.plan.stages.StageCostModel`: its entries'
    :attr:`~tessera_lab.cost.analytic.PhaseCost.time` summed, sync in F, an I and its W costing B + W), so the
    busiest rank needs ``m P / pp`` (``P``: every entry's F+B+W phase time plus ``sync_s``). With EP overlap an F and
    a B run as one pair whose makespan is no sum of phase times, but compute kernels still run one after another on
    the compute lane and collectives on the communication lane (contention only slows them), and the pair's
    makespan carries the waits the paired backward's ``mlp`` node does not hide, a forward run apart all of them:
    ``m (max(C, M) + sync_s) / pp`` (``C``: F+B+W compute; ``M``: communication; :class:`_Bounds` passes as
    ``sync_s`` each MoE layer's :func:`~tessera_lab.cost.sync.paired_exposed_s` against the longest ``mlp`` node of
    the model's layer kinds, which every forward carries at least, paired or not). With one chunk per rank times
    :func:`bubble_factor` on the path F+B (+W unless the schedule may defer it, :data:`SPLIT_SCHEDULES`); the rank
    holding the heaviest entry needs ``m x`` its time. P2P transfers and the gradient sync only add."""
    m, pp = layout.microbatches, layout.pp
    if layout.schedule in OVERLAPPED_SCHEDULES:
        c, comm, top = group.sums()
        total = max(c, comm) + sync_s
        path = total
    else:
        ph, fb, top = group.phase_sums()
        total = ph + sync_s
        path = (fb + sync_s) if layout.schedule in SPLIT_SCHEDULES else total
    busy = total / pp
    if layout.vpp == 1:
        busy = max(busy, path / pp * bubble_factor(pp, m))
    return m * max(busy, top)


def pair_shares(pairs: dict[tuple[str, str], float]) -> dict[str, float]:
    """Per layer kind ``k``, seconds ``a(k) + b(k)`` with ``a(kf) + b(kb) <= pairs[(kf, kb)]`` for every pair of
    kinds (``pairs``: pair makespans, seconds, keyed (forward kind, backward kind)): ``b(kb)`` is half the cheapest
    pair with that backward, ``a(kf)`` the most the pairs with that forward leave. A stage's steady state pairs
    each of its layers' forwards with one of its layers' backwards
    (:func:`~tessera_lab.overlap.table.stage_pair_cost`), so its pair sum is at least its layers' shares summed,
    whatever the partition; with one kind the share is that kind's pair exactly."""
    kinds = sorted({k for pair in pairs for k in pair})
    b = {kb: min(pairs[(kf, kb)] for kf in kinds) / 2 for kb in kinds}
    a = {kf: min(pairs[(kf, kb)] - b[kb] for kb in kinds) for kf in kinds}
    return {k: a[k] + b[k] for k in kinds}


def busy_lower_bound(group: _Group, layout: Layout, shares: dict[str, float], sync: list[float],
                       counts: tuple[tuple[int, int, int, int, int], ...]) -> float:
    """Seconds the busiest rank of ``layout`` is busy at least, over every partition.

    The simulator runs a rank's actions one after another (:mod:`tessera_lab.pipeline.engine`); an
    ``OVERLAP_F_B`` pair is charged its backward stage's pair makespan, the stage's layer pairs plus its embedding or
    head run alone (:meth:`~tessera_lab.plan.stages.StageCostModel.fb`), and an F, B, I or W run alone its phase
    times (F with its host/sync). So the ranks together are busy ``sum_s n_s . t_s`` (``counts[s]``: stage ``s``'s
    pairs and lone F, B, I, W, :func:`~tessera_lab.plan.evaluate.stage_action_counts`; ``t_s``: their times), a sum
    of per-layer terms in which a layer's pair time is at least its kind's share (``shares``,
    :func:`pair_shares`, host waits the paired backward does not hide included; empty without pairs); a layer may
    sit on any stage, so it adds at least its least term over the stages, the embedding its term on stage 0 and
    the head on the last. The busiest rank holds at least the mean over ``pp`` ranks. ``group``: the layout's
    per-entry phase times (its own cost group: Megatron FSDP's collectives included) and kinds; ``sync``:
    host/sync seconds per entry's forward."""
    last = len(counts) - 1

    def term(n, f, i, w, pair):
        return n[0] * pair + n[1] * f + n[2] * (i + w) + n[3] * i + n[4] * w

    total, memo = 0.0, {}
    for e, ((f, i, w), kind, x) in enumerate(zip(group.phases, group.kinds, sync)):
        if kind is None:  # the embedding (stage 0) or the head (the last stage): its pair time is its F + B + W
            n = counts[0 if e == 0 else last]
            total += term(n, f, i, w, f + i + w)
            continue
        key = (kind, x)
        if key not in memo:
            memo[key] = min(term(n, f + x, i, w, shares.get(kind, 0.0)) for n in set(counts))
        total += memo[key]
    return total / layout.pp


def memory_lower_bound(model: ModelSpec, tasks: list, layout: Layout, seq_len: int) -> float:
    """Bytes the busiest rank holds at least, over every partition (``tasks``: :func:`kind_tasks` of the layout's
    cost group). Rank ``r`` keeps ``f_r`` micro-batches of its entries' activations in flight
    (:func:`tessera_lab.plan.vschedules.plan_in_flight`), so an entry ``l`` costs it ``c_lr = p_l + f_r a_l``
    (training state + saved activations) and the busiest rank holds ``M >= max_r sum_{l on r} c_lr``. For any
    weights ``w_r >= 0`` summing to 1, ``M >= sum_r w_r mem_r >= sum_l min_r w_r c_lr``; with ``w_r`` proportional
    to ``1 / (p + f_r a)`` at the mean entry this is, for equal entries, the exact fractional optimum
    ``n / sum_r 1 / (p + f_r a)``; kept beside the even share at the fewest in flight and the first and last stage
    with the embedding or the LM head at their own in-flight counts (docs/search.md)."""
    par = layout.parallel(seq_len)
    mem = layer_memory(model, par, tasks)
    f = [plan_in_flight(layout.schedule, layout.pp, r, layout.microbatches, layout.vpp) for r in range(layout.pp)]
    P, A = sum(x.param_bytes for x in mem), sum(x.activation_bytes for x in mem)
    even = (P + min(f) * A) / layout.pp
    h = [(P + fr * A) / len(mem) for fr in f]  # rank r's cost of the mean entry
    weighted = sum(min((x.param_bytes + fr * x.activation_bytes) / hr for fr, hr in zip(f, h)) for x in mem) / sum(
        1 / hr for hr in h) if all(hr > 0 for hr in h) else 0.0
    last = f[(layout.pp * layout.vpp - 1) % layout.pp]
    ends = max(mem[0].param_bytes + f[0] * mem[0].activation_bytes,
               mem[-1].param_bytes + last * mem[-1].activation_bytes)
    return max(even, weighted, ends)


class _Bounds:
    """Bounds of layouts from lazily built groups: the time bound from the costs of the layout's TP, CP, EP,
    micro-batch size, recompute and dispatcher with the distributed optimizer (:func:`time_lower_bound`; Megatron
    FSDP only adds its gathers and reduce-scatters on streams of their own, which lengthen a phase and never shorten
    it, :meth:`~tessera_lab.cost.analytic.CostModel.own_stream_time`; checked by the tests), the memory bound from
    the layout's own saved activations (:func:`memory_lower_bound`)."""

    def __init__(self, model: ModelSpec, seq_len: int, cluster: Cluster):
        self.model, self.seq_len, self.cluster = model, seq_len, cluster
        self.groups: dict[tuple, _Group] = {}
        self.tasks: dict[tuple, list] = {}
        self.sync: dict[tuple, float] = {}
        self.pairs: dict[tuple, tuple[dict[str, float], list[float]]] = {}  # tight_time's, by cost group
        self.cost_models: dict = {}
        self.moe_layers = sum(1 for ly in model.stack.layers if ly.ffn == "moe")

    def group(self, layout: Layout) -> _Group:
        key = layout.cost_group()
        if key not in self.groups:
            self.groups[key] = _group(self.model, layout, self.seq_len, self.cluster, self.cost_models)
        return self.groups[key]

    def time(self, layout: Layout) -> float:
        from tessera_lab.cost.sync import planner_per_layer_s

        from tessera_lab.cost.sync import paired_exposed_s

        group = self.groups.get(layout.cost_group()[:-2] + (False, 0))  # the FSDP-free group, without a copy
        if group is None:
            group = self.group(replace(layout, fsdp=False))
        key = (layout.ep, layout.schedule, layout.dispatcher, layout.recompute, layout.recompute_modules,
               group.mlp_queued_max)
        if key not in self.sync:  # EP overlap: how many forwards run apart depends on the partition; each forward
            # carries at least its waits less the longest mlp node a backward could pair it with
            waits = planner_per_layer_s(layout.parallel(self.seq_len), model=self.model)
            self.sync[key] = self.moe_layers * (paired_exposed_s(waits, group.mlp_queued_max)
                                                if layout.schedule in OVERLAPPED_SCHEDULES else waits)
        return time_lower_bound(group, layout, self.sync[key])

    def tight_time(self, layout: Layout) -> float:
        """:meth:`time`, raised to :func:`busy_lower_bound` with the layout's own costs (its cost group with Megatron
        FSDP's gathers and reduce-scatters where it has them), its schedule's action counts and, for an EP-overlap
        schedule, the layer pair costs (:func:`~tessera_lab.plan.stages.layer_pair_costs`); built on first use, so
        the search asks only for the candidates it reaches."""
        from tessera_lab.cost.analytic import CostModel
        from tessera_lab.cost.sync import host_waits, own_stream_hidden_s, paired_exposed_s, planner_per_layer_s
        from tessera_lab.plan.evaluate import DURATION_DEPENDENT_SCHEDULES, stage_action_counts
        from tessera_lab.plan.stages import cost_key_parallel, layer_pair_costs

        loose = self.time(layout)
        group = self.group(layout)
        gkey = (layout.cost_group(), layout.schedule in OVERLAPPED_SCHEDULES)
        got = self.pairs.get(gkey)
        if got is None:
            par = layout.parallel(self.seq_len)
            waits = planner_per_layer_s(par, model=self.model)
            names = host_waits(par, self.model)  # less what own-stream collectives hide (as the planner does)
            sync = [0.0, *(max(0.0, waits - own_stream_hidden_s(names, waits / len(names), *sl)) if ly.ffn == "moe"
                           else 0.0 for ly, sl in zip(self.model.stack.layers, group.slack[1:-1])), 0.0]
            shares: dict[str, float] = {}
            if gkey[1]:
                key = cost_key_parallel(par)
                pairs = layer_pair_costs(self.model, key, CostModel(self.cluster, key))
                kind_sync = {}  # a MoE kind's waits after own-stream hiding (its layers share one cost)
                for ly, x in zip(self.model.stack.layers, sync[1:-1]):
                    if ly.ffn == "moe":
                        kind_sync.setdefault(ly.kind, x)
                shares = pair_shares({(kf, kb): v + (paired_exposed_s(kind_sync[kf], group.mlp_queued[kb])
                                                     if kf in kind_sync else 0.0) for (kf, kb), v in pairs.items()})
            got = self.pairs[gkey] = (shares, sync)
        m, S = layout.microbatches, layout.pp * layout.vpp
        counts = (((0, m, m, 0, 0),) * S if layout.schedule in DURATION_DEPENDENT_SCHEDULES
                  else stage_action_counts(layout.schedule, layout.pp, m, layout.vpp))
        return max(loose, busy_lower_bound(group, layout, got[0], got[1], counts))

    def memory(self, layout: Layout) -> float:
        key = layout.cost_group()
        if key not in self.tasks:
            par = layout.parallel(self.seq_len).replace(schedule="1f1b", vpp=1)
            self.tasks[key] = kind_tasks(self.model, par)
        return memory_lower_bound(self.model, self.tasks[key], layout, self.seq_len)
