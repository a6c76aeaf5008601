"""Analytic cost model: roofline time for compute tasks, alpha-beta time for collectives; a bundle's time is the
pair makespan (:func:`tessera_lab.cost.lanes.pair_makespan`, compute and communication streams with contention).

Formulas:

* compute task: ``t = max(launch + max(flops / (peak * eff_op), bytes / (hbm_bw * eff_hbm)), t_host)`` (roofline,
  Williams et al., CACM 2009; ``t_host`` the eager host issue time of its kernels, :mod:`tessera_lab.cost.host`); for GEMM tasks ``eff_op`` is the shape-aware efficiency of
  :mod:`tessera_lab.cost.gemm` (tokens per expert, K, N, grouped-GEMM implementation, bf16 or FP8 peak),
  for the attention and linear-attention cores the efficiencies of ``data/hardware/cost_model.json``.
* collective: ``t = alpha + S * factor(n) / (B * eff_bus)`` with nccl-tests' bus-bandwidth factors
  (``all_reduce`` 2(n-1)/n, ``all_to_all``/``all_gather``/``reduce_scatter`` (n-1)/n, ``p2p`` 1;
  NVIDIA nccl-tests ``doc/PERFORMANCE.md``). For an all-to-all whose group spans nodes, the bytes that
  stay in the node go over NVLink and the rest over the inter-node link; the slower part sets the time.
* contention from shared resources (:mod:`tessera_lab.cost.contention`, :meth:`CostModel.demand`): while both
  lanes are busy, each (compute task, collective) pair runs at the rates their demands on the SMs, HBM and the
  one host thread give (:func:`~tessera_lab.cost.contention.shared_rates`; integrated exactly between events).
  A cost model given an explicit :class:`Contention` (a measured fit) uses its class constants instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Mapping, Sequence

from tessera_lab.cost.contention import Contention, Demand, comm_sms_for, kernel_class, kernel_contention
from tessera_lab.cost.gemm import gemms_efficiency
from tessera_lab.cost.host import host_issue_time
from tessera_lab.cost.lanes import pair_makespan, side_stream_makespan
from tessera_lab.errors import ConfigError
from tessera_lab.model.ep_traffic import limited_destinations
from tessera_lab.model.hardware import Cluster, Link, ParallelConfig, cost_assumptions
from tessera_lab.model.layout import ranks_per_node, slowest_group
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import Collective, LayerTasks, Task, decompose, p2p_activation_bytes

#: a task's fields but its layer index: what :meth:`CostModel.phase_cost` is keyed by (no term of a task's time or
#: demand reads the index)
_content = attrgetter(*(f.name for f in fields(Task) if f.name != "layer"))


BUS_FACTOR = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "p2p": lambda n: 1.0,
}


def bus_efficiency(link: Link, assumptions: dict[str, float] | None = None) -> float:
    """The share of ``link``'s line rate NCCL's bus bandwidth reaches (``data/hardware/cost_model.json``, each cited
    there): ``nccl_bus_efficiency_inter_node`` across nodes (InfiniBand NDR: 46-48 of 50 GB/s), else
    ``nccl_bus_efficiency`` (NVLink: about 80%). ``assumptions``: a cost model's values (default the shipped)."""
    a = cost_assumptions() if assumptions is None else assumptions
    return a["nccl_bus_efficiency_inter_node" if link.inter_node else "nccl_bus_efficiency"]


def spanning_bus_bytes_per_s(ranks_per_node: int, nic_bytes_per_s: float, nvlink_bytes_per_s: float) -> float:
    """Bus bandwidth (bytes/s per direction; pass rates at NCCL's efficiency for the effective one) of a ring or tree
    collective (all-reduce, reduce-scatter, all-gather) whose group spans nodes with ``ranks_per_node`` ranks in each (the fewest, when
    uneven): ``min(ranks_per_node x NIC, NVLink)``.

    Each GPU has its own NIC (DGX/HGX: one per GPU; :attr:`~tessera_lab.model.hardware.GPUSpec.nic_bytes_per_s`),
    and NCCL builds its rings and trees over several channels that leave a node through different GPUs' NICs, so
    a group with ``g`` ranks in a node moves its inter-node bytes over ``g`` NICs at once (every data-parallel group
    of a layout syncs at the same time, each over its own ranks' NICs, so no NIC is counted twice); the intra-node
    hops of the same rings run on NVLink, which caps the sum. Sources: NVIDIA/nccl#812 (AddyLaddy: "On an
    Nvidia DGX-A100 system we have 8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW", i.e. eight NICs'
    worth of bus bandwidth for eight ranks per node); NVIDIA/nccl#412 (sjeaugey: more NICs give "more
    bandwidth, up to 160GB/s which is the NVLink intra-node bandwidth of your system"). The all-to-all is priced
    per rank instead (:meth:`CostModel.collective_time`): each rank sends its own share over its own NIC."""
    return min(max(1, ranks_per_node) * nic_bytes_per_s, nvlink_bytes_per_s)


def deepep_link_shares(routing: tuple, ranks: int, nodes: int) -> tuple[float, float]:
    """Inter-node and intra-node bytes of a DeepEP dispatch across ``nodes`` nodes, as shares of its
    ``Collective.bytes`` (one copy per token and destination rank, ``D_rank`` copies a token).

    DeepEP's internode kernels send one copy per token and destination *node* over RDMA and forward it to the
    node's ranks over NVLink (DeepEP README: "forwarding data from NVLink domain to RDMA domain"). With
    ``D_node`` the expected distinct nodes of a token's experts (:func:`expected_destinations` over ``nodes``),
    the remote ones are ``D_node (nodes - 1) / nodes`` copies over the inter-node link; the NVLink carries the
    forwarded copies ``D_rank (g - 1) / g`` (``g`` ranks a node). Example: E = 256, k = 8, 32 ranks on 4 nodes:
    D_rank = 7.15, D_node = 3.60; inter share 2.70 / 7.15 = 0.378 (an ``alltoall`` dispatcher sends 24/32 = 0.75
    of its 8 copies across nodes). Group-limited routing (``routing[4:6] = (n_group, topk_group)``, DeepSeek-V3's
    "at most 4 nodes" per token) limits both counts (:func:`tessera_lab.model.ep_traffic.limited_destinations`).
    """
    experts, top_k = routing[1], routing[2]
    n_group, topk_group = (routing[4], routing[5]) if len(routing) > 5 else (1, 1)
    d_rank = limited_destinations(experts, top_k, ranks, n_group, topk_group)
    d_node = limited_destinations(experts, top_k, nodes, n_group, topk_group) if experts % nodes == 0 else d_rank
    g = ranks / nodes
    return d_node * (nodes - 1) / nodes / d_rank, (g - 1) / g


@dataclass(frozen=True)
class PhaseCost:
    """Standalone cost of one layer's F, B or W bundle on one rank, seconds.

    ``time``: makespan of the bundle in program order on two lanes; ``compute``: sum of compute task
    times; ``comm``: sum of communication times; ``exposed_comm``: communication time not overlapped by
    the bundle's own compute; ``comm_by_collective``: communication seconds per ``<kind>:<group>``;
    ``lane_slack``: seconds the lanes may stand idle (a host wait drains the compute stream) without lengthening
    the bundle, because collectives on streams of their own bind it (:meth:`CostModel.phase_cost`; 0 without them).
    """

    time: float
    compute: float
    comm: float
    exposed_comm: float
    comm_by_collective: dict[str, float] = field(default_factory=dict)
    lane_slack: float = 0.0


@dataclass(frozen=True)
class LayerCost:
    """F, B and W costs of one layer (or the embedding / LM head), seconds per micro-batch."""

    layer: int
    kind: str
    F: PhaseCost
    B: PhaseCost
    W: PhaseCost

    @property
    def total(self) -> float:
        return self.F.time + self.B.time + self.W.time


class CostModel:
    """Analytic times of tasks and collectives on a cluster.

    Args:
        cluster: nodes, GPU type and links.
        parallel: parallel sizes and rank placement (which link each group uses).
        assumptions: overrides of ``data/hardware/cost_model.json`` values (same keys).
        contention: slowdowns while compute and communication overlap by kernel class (a measured fit); default:
            none given, so overlaps are priced per task pair from shared resources (:meth:`demand`), and
            ``self.contention`` holds the class summary of the same physics (:meth:`class_contention`).
    """

    def __init__(
        self,
        cluster: Cluster,
        parallel: ParallelConfig,
        assumptions: Mapping[str, float] | None = None,
        contention: Contention | None = None,
    ) -> None:
        self.cluster = cluster
        self.parallel = parallel
        a = dict(cost_assumptions())
        if assumptions:
            unknown = set(assumptions) - set(a)
            if unknown:
                raise ConfigError(f"unknown cost assumption(s) {sorted(unknown)}; allowed: {sorted(a)}")
            a.update(assumptions)
        self.a = a
        #: overlaps are priced from each task's demands on shared resources unless a contention fit was given
        self.shared = contention is None
        self._sm_share: dict[tuple[str, str], float] = {}
        self._phase_costs: dict[tuple, PhaseCost] = {}
        self._task_memo: dict[tuple, tuple[float, Demand | None]] = {}
        self._coll_times: dict[Collective, float] = {}
        self.contention = contention or self.class_contention()

    def class_contention(self) -> Contention:
        """Kernel-class contention of this cluster and plan: the EP communication kernel's SMs (NCCL inside a
        node or across nodes, or DeepEP's) and the HBM share of traffic at the EP group's effective link rate
        (:func:`tessera_lab.cost.contention.kernel_contention`)."""
        p, gpu = self.parallel, self.cluster.gpu
        ranks = self.group_link_ranks("ep") if p.ep > 1 else [0]
        spans = len(ranks_per_node(ranks, self.cluster.gpus_per_node)) > 1
        link = self.cluster.inter_link() if spans else self.cluster.intra_link()
        return kernel_contention(
            sms=gpu.sms, comm_sms=comm_sms_for(p.dispatcher, spans, self.a),
            link_bytes_per_s=link.bytes_per_s * bus_efficiency(link, self.a),
            hbm_bytes_per_s=gpu.hbm_bytes_per_s * self.a["hbm_efficiency"], params=self.a)

    def demand(self, task: Task) -> Demand:
        """What ``task`` asks of the resources the two streams share (:class:`~tessera_lab.cost.contention.Demand`,
        seconds): a compute task its :meth:`gpu_terms` and :meth:`host_time`; a collective its time, its HBM
        traffic (``comm_hbm_bytes_per_link_byte`` x the bytes it moves per rank, at the effective HBM bandwidth),
        one kernel's host issue and the SMs its kernel holds (:meth:`comm_sm_share`)."""
        if not task.is_comm:
            t = self.gpu_terms(task)
            return Demand(self.compute_time(task), t["compute"], t["hbm"], t["cast"], self.host_time(task), t["launch"])
        time = self.collective_time(task.collective)
        c = task.collective
        if time <= 0:
            return Demand(0.0)
        moved = c.bytes * BUS_FACTOR[c.kind](c.group_size) * self.a["comm_hbm_bytes_per_link_byte"]
        hbm = moved / (self.cluster.gpu.hbm_bytes_per_s * self.a["hbm_efficiency"])
        return Demand(time, hbm=min(hbm, time), host=self.host_time(task), sm_share=self.comm_sm_share(c))

    def comm_sm_share(self, coll: Collective) -> float:
        """Share of the SMs a collective's kernel holds: the EP dispatcher's (DeepEP's configured count, or NCCL's)
        for the EP all-to-all, NCCL's for any other group; NCCL's count inside a node or across nodes by where the
        group's ranks sit (``data/hardware/cost_model.json``, ``comm_sms_*``)."""
        key = (coll.group, coll.kind)
        if key not in self._sm_share:
            ranks = self.group_link_ranks(coll.group) if coll.group != "pp" else [0]
            spans = len(ranks_per_node(ranks, self.cluster.gpus_per_node)) > 1
            dispatcher = self.parallel.dispatcher if coll.group == "ep" and coll.kind == "all_to_all" else "alltoall"
            self._sm_share[key] = comm_sms_for(dispatcher, spans, self.a) / self.cluster.gpu.sms
        return self._sm_share[key]

    def demands(self, tasks: Mapping[str, Task]) -> dict[str, Demand] | None:
        """:meth:`demand` of every task by key, or ``None`` when this model was given a contention fit (its class
        constants then price overlaps)."""
        return {k: self.demand(t) for k, t in tasks.items()} if self.shared else None

    def gemm_efficiency(self, task: Task) -> float:
        """Shape-aware efficiency of a GEMM task in its phase (:func:`tessera_lab.cost.gemm.gemms_efficiency`)."""
        p = self.parallel
        return gemms_efficiency(task.gemms, task.phase, groups=task.groups, sms=self.cluster.gpu.sms,
                                precision=p.precision, impl=p.grouped_gemm, params=self.a)

    # ------------------------------------------------------------------ single tasks
    def compute_time(self, task: Task) -> float:
        """Time of a compute task, seconds: its GPU time (:meth:`gpu_time`) or, when longer, the host's eager
        issue time of its kernels (:meth:`host_time`)."""
        return max(self.gpu_time(task), self.host_time(task))

    def gpu_time(self, task: Task) -> float:
        """Roofline time of a compute task on the GPU, seconds: GEMMs at their shape-aware efficiency of the
        ``precision`` peak (``sequential`` and ``multistream`` expert GEMMs add one launch per expert and GEMM),
        attention cores at bf16."""
        t = self.gpu_terms(task)
        return t["launch"] + max(t["compute"], t["hbm"]) + t["cast"]

    def gpu_terms(self, task: Task) -> dict[str, float]:
        """The terms of :meth:`gpu_time`, seconds: ``launch`` (GPU launch overhead of its kernels), ``compute``
        (FLOPs at the efficient peak), ``hbm`` (HBM bytes at the efficient bandwidth) and ``cast`` (FP8
        quantization bytes); ``gpu_time = launch + max(compute, hbm) + cast``."""
        gpu = self.cluster.gpu
        launches = 1
        if task.gemms:
            eff = self.gemm_efficiency(task)
            peak = gpu.peak_for(self.parallel.precision)
            if self.parallel.grouped_gemm in ("sequential", "multistream") and task.groups > 1:
                launches = task.groups * len(task.gemms)
        else:
            eff = {
                "attention": self.a["attention_efficiency"],
                "linear_attention": self.a["linear_attention_efficiency"],
            }.get(task.op, self.a["gemm_efficiency"])
            peak = gpu.peak_flops
        t_math = task.flops / (peak * eff)
        hbm = gpu.hbm_bytes_per_s * self.a["hbm_efficiency"]
        t_bytes = task.bytes / hbm
        t_cast = self.fp8_cast_bytes(task) / hbm
        return {"launch": self.a["kernel_launch_s"] * launches, "compute": t_math, "hbm": t_bytes, "cast": t_cast}

    def host_time(self, task: Task) -> float:
        """Host seconds to issue a task's kernels in eager mode (:func:`tessera_lab.cost.host.host_issue_time`);
        a compute task takes at least this long."""
        p = self.parallel
        return host_issue_time(task, precision=p.precision, grouped_impl=p.grouped_gemm, params=self.a,
                               microbatches=max(1, int(p.microbatches)))

    def host_excess(self, task: Task) -> float:
        """Seconds a compute task waits on the host beyond its GPU time (0 when the GPU is the bound)."""
        if task.is_comm:
            return 0.0
        return max(0.0, self.host_time(task) - self.gpu_time(task))

    def fp8_cast_bytes(self, task: Task) -> float:
        """HBM bytes of the FP8 quantization kernels a GEMM task needs (0 in bf16): ``fp8_cast_bytes_per_element``
        per element of the forward input and weight (F), of the output gradient (B); W reuses them. The weight is
        cast once per step and cached (TE ``is_first_microbatch``, :mod:`tessera_lab.cost.host`): its bytes are
        amortised over the ``m`` micro-batches (``k n / m`` per micro-batch)."""
        if self.parallel.precision != "fp8" or not task.gemms:
            return 0.0
        per = self.a["fp8_cast_bytes_per_element"]
        mb = max(1, int(self.parallel.microbatches))
        total = 0.0
        for m, k, n in task.gemms:
            if task.phase == "F":
                total += (m * k + k * n / mb) * task.groups
            elif task.phase == "B":
                total += m * n * task.groups
        return per * total

    def group_link_ranks(self, group: str) -> list[int]:
        """Ranks of the group of this kind that the links serve worst (:func:`slowest_group`): the groups of a
        stage run the collective in lockstep, so the slowest sets that stage's time. One cost model prices every
        stage, so a stage whose own groups all sit inside a domain is priced as the worst one (conservative; on
        nodes of 8 with power-of-two sizes every group is placed alike and nothing changes)."""
        return list(slowest_group(self.parallel, self.cluster.gpus_per_node, group))

    def collective_time(self, coll: Collective, link: Link | None = None) -> float:
        """Alpha-beta time of a collective, seconds (0 for a group of one or zero bytes); memoised per cost model
        by the collective when its link follows from the group's placement (``link`` None)."""
        if link is not None:
            return self._collective_time(coll, link)
        got = self._coll_times.get(coll)
        if got is None:
            got = self._coll_times[coll] = self._collective_time(coll, None)
        return got

    def _collective_time(self, coll: Collective, link: Link | None) -> float:
        n = coll.group_size
        if n <= 1 or coll.bytes <= 0:
            return 0.0
        if coll.kind not in BUS_FACTOR:
            raise ConfigError(f"collective kind {coll.kind!r} is unknown; allowed: {', '.join(BUS_FACTOR)}")
        if link is not None:
            return link.latency_s + coll.bytes * BUS_FACTOR[coll.kind](n) / (link.bytes_per_s
                                                                             * bus_efficiency(link, self.a))
        if coll.group == "pp":
            raise ConfigError("a pp collective needs an explicit link (see p2p_time)")
        ranks = self.group_link_ranks(coll.group)
        intra, inter = self.cluster.intra_link(), self.cluster.inter_link()
        # effective rates: each link at the share of its line rate NCCL reaches on it
        intra_bw, inter_bw = (lk.bytes_per_s * bus_efficiency(lk, self.a) for lk in (intra, inter))
        per_node = ranks_per_node(ranks, self.cluster.gpus_per_node)
        if len(per_node) == 1:
            return intra.latency_s + coll.bytes * BUS_FACTOR[coll.kind](n) / intra_bw
        if coll.kind == "all_to_all":
            g = min(per_node.values())
            inter_share, intra_share = (n - g) / n, (g - 1) / n
            if coll.routing is not None and coll.routing[3] == "deepep":
                inter_share, intra_share = deepep_link_shares(coll.routing, n, len(per_node))
            return inter.latency_s + max(coll.bytes * intra_share / intra_bw, coll.bytes * inter_share / inter_bw)
        return inter.latency_s + coll.bytes * BUS_FACTOR[coll.kind](n) / spanning_bus_bytes_per_s(
            min(per_node.values()), inter_bw, intra_bw)

    def task_time(self, task: Task) -> float:
        """Standalone time of any task, seconds."""
        return self.collective_time(task.collective) if task.is_comm else self.compute_time(task)

    def p2p_time(self, model: ModelSpec, stage: int) -> float:
        """Time to send one micro-batch's activations (or gradients) from ``stage`` to ``stage + 1``."""
        p = self.parallel
        src, dst = p.rank(stage), p.rank(min(stage + 1, p.pp - 1))
        link = self.cluster.link_for([src, dst])
        coll = Collective("p2p", p2p_activation_bytes(model, p), "pp", 2)
        return self.collective_time(coll, link)

    # ------------------------------------------------------------------ bundles
    def own_stream_time(self, lanes_s: float, side: Sequence[Task]) -> float:
        """Seconds of a bundle whose two lanes take ``lanes_s`` beside ``side``, collectives on streams of their own
        (:attr:`~tessera_lab.model.graph.Task.own_stream`: Megatron FSDP's gathers and reduce-scatters, prefetched so
        nothing in the layer waits on them; the gathers and reduce-scatters of one data-parallel group share its
        communicator): :func:`~tessera_lab.cost.lanes.side_stream_makespan` of each one's time and the share of the
        SMs its kernel holds (:meth:`comm_sm_share`)."""
        return side_stream_makespan(lanes_s, [(self.task_time(t), self.comm_sm_share(t.collective)) for t in side])

    def phase_cost(self, tasks: Sequence[Task], contention: Contention | None = None, *,
                   lanes_before_s: float = 0.0) -> PhaseCost:
        """Standalone cost of a bundle run in program order on two lanes, tasks on streams of their own beside them
        (:meth:`own_stream_time`). ``lanes_before_s``: lane seconds of a bundle run just before this one that the
        own-stream tasks overlap too (a layer's B before its W, :meth:`layer_cost`); the bundle's time is what it
        adds after those seconds.

        Memoised per cost model by the tasks' content without their layer index (no term of a task's time or
        demand reads it), so the layers of one kind are priced once; the cached :class:`PhaseCost` is shared."""
        side = [t for t in tasks if t.own_stream]
        if side:
            lanes = self.phase_cost([t for t in tasks if not t.own_stream], contention)
            side_s = [self.task_time(t) for t in side]  # (a B and a W task may share a name)
            by_coll = dict(lanes.comm_by_collective)
            for t, d in zip(side, side_s):
                key = f"{t.collective.kind}:{t.collective.group}"
                by_coll[key] = by_coll.get(key, 0.0) + d
            time = self.own_stream_time(lanes_before_s + lanes.time, side) - lanes_before_s
            exposed = lanes.exposed_comm + max(0.0, sum(side_s) - lanes_before_s - lanes.time)
            # the own streams' time beyond the lanes and the SMs their kernels take from them: a lane may idle that
            # long (nothing on the own streams waits on it) and the bundle ends no later
            slack = max(0.0, sum(side_s) - lanes_before_s - lanes.time
                        - sum(d * self.comm_sm_share(t.collective) for t, d in zip(side, side_s)))
            return PhaseCost(time, lanes.compute, lanes.comm + sum(side_s), exposed, by_coll, slack)
        if not tasks:
            return PhaseCost(0.0, 0.0, 0.0, 0.0, {})
        if contention is not None:
            return self._phase_cost(tasks, contention)
        key = tuple(_content(t) for t in tasks)
        got = self._phase_costs.get(key)
        if got is None:
            got = self._phase_costs[key] = self._phase_cost(tasks, None)
        return got

    def _task_terms(self, task: Task) -> tuple[float, Demand | None]:
        """(:meth:`task_time`, :meth:`demand` or ``None`` under a contention fit) of a task, memoised per cost model
        by the task's content without its layer index (the phases of one layer kind under different recompute
        settings share most of their tasks)."""
        key = _content(task)
        got = self._task_memo.get(key)
        if got is None:
            got = self._task_memo[key] = (self.task_time(task), self.demand(task) if self.shared else None)
        return got

    def _phase_cost(self, tasks: Sequence[Task], contention: Contention | None) -> PhaseCost:
        terms = {t.name: self._task_terms(t) for t in tasks}
        durations = {k: v[0] for k, v in terms.items()}
        lanes = {t.name: "comm" if t.is_comm else "compute" for t in tasks}
        deps = {t.name: t.deps for t in tasks}
        classes = {t.name: kernel_class(t.op, t.is_comm) for t in tasks}
        demands = {k: v[1] for k, v in terms.items()} if contention is None and self.shared else None
        res = pair_makespan([t.name for t in tasks], durations, lanes, deps, contention=contention or self.contention,
                            classes=classes, demands=demands)
        comm = sum(d for k, d in durations.items() if lanes[k] == "comm")
        compute = sum(d for k, d in durations.items() if lanes[k] == "compute")
        by_coll: dict[str, float] = {}
        for t in tasks:
            if t.is_comm:
                key = f"{t.collective.kind}:{t.collective.group}"
                by_coll[key] = by_coll.get(key, 0.0) + durations[t.name]
        exposed = comm * (1.0 - res.comm_hidden_fraction())
        return PhaseCost(res.makespan, compute, comm, exposed, by_coll)

    def layer_cost(self, lt: LayerTasks) -> LayerCost:
        """F, B and W costs of one layer. Tasks on streams of their own in B and W (Megatron FSDP's gather before
        the backward and reduce-scatter after it, one layer's apart from the next only by the prefetch) run beside
        the whole backward: they are priced with W over B and W's lanes together (:meth:`own_stream_time`), so W
        carries what they add."""
        side = [t for t in lt.B if t.own_stream]
        if not side:
            return LayerCost(lt.layer, lt.kind, self.phase_cost(lt.F), self.phase_cost(lt.B), self.phase_cost(lt.W))
        b = self.phase_cost([t for t in lt.B if not t.own_stream])
        w = self.phase_cost(list(lt.W) + side, lanes_before_s=b.time)
        return LayerCost(lt.layer, lt.kind, self.phase_cost(lt.F), b, w)

    def model_costs(self, model: ModelSpec, *, expert_load: float = 1.0) -> list[LayerCost]:
        """Costs of the embedding, every decoder layer and the LM head, in order (len = layers + 2)."""
        return [self.layer_cost(lt) for lt in decompose(model, self.parallel, expert_load=expert_load)]
