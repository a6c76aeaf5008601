"""The main job: model -> tasks -> costs -> partition -> schedule -> simulate -> metrics.

:func:`make_plan` turns a :class:`~tessera_lab.model.spec.ModelSpec`, a
:class:`~tessera_lab.model.hardware.ParallelConfig` and a :class:`~tessera_lab.model.hardware.Cluster` into a
:class:`Plan`: stage boundaries chosen by the requested method, each stage's time per micro-batch and
memory, the simulated iteration, tokens/s, MFU and bubble, and the same numbers for baseline partitions
evaluated with the same schedule and simulator (a fair comparison).

MFU = model FLOPs per iteration / (iteration time x GPUs x peak dense bf16 FLOP/s), with model FLOPs
in Megatron-LM's convention (:func:`tessera_lab.model.tasks.model_flops_per_iteration`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tessera_lab.cost.analytic import CostModel, LayerCost
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, ParallelConfig, check_fits, cluster_for
from tessera_lab.cost.memory import LayerMemory, gpu_params, in_flight, layer_memory, memory_capacity
from tessera_lab.model.spec import ModelSpec
from tessera_lab.plan.partition import Partition, PartitionProblem, solve, uniform_boundaries
from tessera_lab.pipeline.schedules import build_schedule
from tessera_lab.pipeline.simulate import Timeline, simulate, stage_durations
from tessera_lab.model.tasks import Collective, decompose, model_flops_per_iteration, routing_load_note

DEFAULT_MODEL = "qwen3-next-80b-a3b"
DEFAULT_GPU = "H200"
#: baselines evaluated beside the chosen plan, all with the same schedule and simulator:
#: ``uniform`` (layer counts as even as possible), ``standalone`` (balanced on standalone F+B+W sums: what a
#: planner without overlap measurement picks), ``parameters`` (balanced on parameter bytes, DeepSpeed's default).
BASELINES = ("uniform", "standalone", "parameters")
#: candidate orders the overlap scheduler evaluates per layer-kind pair while planning
PAIR_SEARCH_BUDGET = 300
OBJECTIVES = ("auto", "bottleneck", "schedule")
#: schedules the planner simulates (one stage per pipeline rank)
PLAN_SCHEDULES = ("overlapped", "1f1b", "gpipe", "zb-h1", "zb-h2")


def check_parallel_for_model(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> None:
    """Parallel sizes the model and cluster can run (Megatron-LM's rules for tensor parallelism).

    Raises:
        ConfigError: ``tp`` not dividing the attention heads, the key-value heads or the linear-attention heads,
            ``tp`` not dividing the GPUs of a node (TP stays inside a node), ``ep`` not dividing the experts, or a
            schedule the planner cannot simulate.
    """
    tp = parallel.tp
    if parallel.schedule not in PLAN_SCHEDULES:
        raise ConfigError(f"field 'schedule' = {parallel.schedule!r} cannot be planned; allowed: "
                          f"{', '.join(PLAN_SCHEDULES)} (one stage per pipeline rank)")
    heads = {"num_attention_heads": model.num_attention_heads, "num_key_value_heads": model.num_key_value_heads}
    if model.linear_num_key_heads:
        heads["linear_num_key_heads"] = model.linear_num_key_heads
    for name, n in heads.items():
        if n % tp:
            raise ConfigError(f"field 'tp' = {tp} must divide {name} = {n}")
    if cluster.gpus_per_node % tp:
        raise ConfigError(f"field 'tp' = {tp} must divide the {cluster.gpus_per_node} GPUs of a node "
                          f"(tensor parallelism stays on NVLink)")
    if model.has_moe and model.num_experts % parallel.ep:
        raise ConfigError(f"field 'ep' = {parallel.ep} must divide num_experts = {model.num_experts}")


@dataclass
class StagePlan:
    """One pipeline stage: its layers, per-micro-batch times (seconds) and memory (bytes per GPU)."""

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

    @property
    def standalone_s(self) -> float:
        """Forward + full backward (input and weight gradient) per micro-batch run one after the other, seconds."""
        return self.f_s + self.b_s

    @property
    def time_s(self) -> float:
        """Time per micro-batch as the schedule sees it: after overlap (overlapped 1F1B) or standalone."""
        return self.overlap_s if self.overlap_s is not None else self.standalone_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "layers": self.layers,
            "kinds": self.kinds,
            "time_s": self.time_s,
            "standalone_s": self.standalone_s,
            "overlap_s": self.overlap_s,
            "f_s": self.f_s,
            "b_s": self.b_s,
            "w_s": self.w_s,
            "memory_bytes": self.memory_bytes,
            "param_bytes": self.param_bytes,
            "activation_bytes": self.activation_bytes,
        }


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

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "boundaries": self.partition.boundaries,
            "stages": [s.as_dict() for s in self.stages],
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction,
            "bubble_overhead": self.timeline.bubble_overhead,
            "exposed_comm_s": self.exposed_comm_s,
            "fits_memory": self.fits_memory,
            "solver": self.partition.solver,
            "solver_status": self.partition.status,
            "solve_time_s": self.partition.solve_time_s,
        }


@dataclass
class Plan:
    """Result of :func:`make_plan`: the chosen evaluation plus baselines and the inputs."""

    model: ModelSpec
    parallel: ParallelConfig
    cluster: Cluster
    chosen: Evaluation
    baselines: dict[str, Evaluation]
    layer_costs: list[LayerCost]
    model_flops: float
    memory_capacity_bytes: float
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the keys of the CLI contract (``model``, ``method``, ``stages``, ...)."""
        d = self.chosen.as_dict()
        d = {
            "model": self.model.name,
            **d,
            "baselines": {name: ev.as_dict() for name, ev in self.baselines.items()},
            "model_flops_per_iteration": self.model_flops,
            "tokens_per_iteration": self.parallel.tokens_per_iteration,
            "gpus": self.parallel.world_size,
            "gpu": self.cluster.gpu.name,
            "nodes": self.cluster.num_nodes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "parallel": {k: getattr(self.parallel, k) for k in (
                "pp", "vpp", "tp", "ep", "dp", "microbatches", "micro_batch_size", "seq_len", "dtype",
                "distributed_optimizer", "schedule", "dispatcher", "recompute", "precision", "grad_reduce_dtype",
                "expert_load", "grouped_gemm", "fused_cross_entropy")},
            "notes": self.notes,
        }
        return d


class StageCostModel:
    """Per-layer times and memory turned into segment functions for the partitioner.

    Index convention: decoder layer ``l`` is entry ``l + 1`` of ``layer_costs`` / ``memory`` (entry 0
    is the embedding, the last entry the LM head and loss); the embedding counts toward stage 0 and
    the head toward the last stage.
    """

    def __init__(self, layer_costs: Sequence[LayerCost], memory: Sequence[LayerMemory], parallel: ParallelConfig,
                 pair_costs: dict[tuple[str, str], float] | None = None):
        self.costs = list(layer_costs)
        self.memory = list(memory)
        self.parallel = parallel
        self.pair_costs = pair_costs
        n = len(self.costs) - 2
        self.num_layers = n
        self.kinds = [c.kind for c in self.costs[1:-1]]
        self._fb_cache: dict[tuple[int, int], float] = {}
        self._pf = self._prefix([c.F.time for c in self.costs[1:-1]])
        self._pb = self._prefix([c.B.time + c.W.time for c in self.costs[1:-1]])
        self._pw = self._prefix([c.W.time for c in self.costs[1:-1]])
        self._pparam = self._prefix([mm.param_bytes for mm in self.memory[1:-1]])
        self._pact = self._prefix([mm.activation_bytes for mm in self.memory[1:-1]])

    @staticmethod
    def _prefix(values: Sequence[float]) -> list[float]:
        out = [0.0]
        for v in values:
            out.append(out[-1] + v)
        return out

    def _extra(self, s: int, attr: str) -> float:
        total = 0.0
        emb, head = self.costs[0], self.costs[-1]
        if s == 0:
            total += {"f": emb.F.time, "b": emb.B.time + emb.W.time, "w": emb.W.time}[attr]
        if s == self.parallel.pp - 1:
            total += {"f": head.F.time, "b": head.B.time + head.W.time, "w": head.W.time}[attr]
        return total

    def f(self, s: int, i: int, j: int) -> float:
        return self._pf[j] - self._pf[i] + self._extra(s, "f")

    def b(self, s: int, i: int, j: int) -> float:
        """Full backward (B + W) of the segment, seconds per micro-batch."""
        return self._pb[j] - self._pb[i] + self._extra(s, "b")

    def w(self, s: int, i: int, j: int) -> float:
        return self._pw[j] - self._pw[i] + self._extra(s, "w")

    def standalone(self, s: int, i: int, j: int) -> float:
        """Standalone time per micro-batch (F + B + W) of stage s owning layers i..j-1."""
        return self.f(s, i, j) + self.b(s, i, j)

    def fb(self, s: int, i: int, j: int) -> float:
        """Time per micro-batch after overlap (DESIGN section 3): the steady state of overlapped 1F1B pairs
        layer ``i+k``'s forward with layer ``j-1-k``'s full backward (B then W); the stage costs the sum of the
        pair makespans plus its extras (embedding on the first stage, LM head and loss on the last), which
        run standalone. Requires ``pair_costs``."""
        if self.pair_costs is None:
            raise ConfigError("overlap-aware stage costs need pair costs (plan with schedule 'overlapped')")
        core = self._fb_cache.get((i, j))
        if core is None:
            from tessera_lab.overlap.core import stage_pair_cost

            core = self._fb_cache[(i, j)] = stage_pair_cost(self.kinds[i:j], self.pair_costs)
        return core + self._extra(s, "f") + self._extra(s, "b")

    def cost(self, s: int, i: int, j: int) -> float:
        """The stage cost the schedule sees: after overlap for ``overlapped``, else standalone."""
        if self.parallel.schedule == "overlapped":
            return self.fb(s, i, j)
        return self.standalone(s, i, j)

    def params(self, s: int, i: int, j: int) -> float:
        extra = (self.memory[0].param_bytes if s == 0 else 0.0) + (
            self.memory[-1].param_bytes if s == self.parallel.pp - 1 else 0.0)
        return self._pparam[j] - self._pparam[i] + extra

    def activations(self, s: int, i: int, j: int) -> float:
        """Activation bytes per micro-batch of the segment."""
        extra = (self.memory[0].activation_bytes if s == 0 else 0.0) + (
            self.memory[-1].activation_bytes if s == self.parallel.pp - 1 else 0.0)
        return self._pact[j] - self._pact[i] + extra

    def memory_bytes(self, s: int, i: int, j: int) -> float:
        """Parameters and training state plus activations times micro-batches in flight (bytes)."""
        p = self.parallel
        return self.params(s, i, j) + self.activations(s, i, j) * in_flight(p.schedule, p.pp, s, p.microbatches, p.vpp)


def dp_grad_sync_time(model: ModelSpec, cost_model: CostModel, stage: StagePlan) -> float:
    """Gradient synchronisation at the end of the iteration on one stage, seconds.

    Non-expert gradients are reduced over the ``ep * dp`` data-parallel ranks, expert gradients over
    ``dp``: a reduce-scatter plus all-gather of the bf16 parameters with a distributed optimizer
    (together the bus volume of one all-reduce), else an all-reduce of the gradients.
    """
    p = cost_model.parallel
    entries = list(stage.layers) + ([-1] if stage.index == 0 else []) + ([model.num_layers] if stage.index == p.pp - 1 else [])
    dense = expert = 0.0
    for idx in entries:
        d, e = gpu_params(model, p, idx)
        dense, expert = dense + d, expert + e
    t = 0.0
    for params, group, size in ((dense, "edp", p.ep * p.dp), (expert, "dp", p.dp)):
        if size > 1 and params > 0:
            t += cost_model.collective_time(Collective("all_reduce", params * p.grad_sync_bytes_per_param, group, size))
    return t


def evaluate(
    model: ModelSpec,
    parallel: ParallelConfig,
    cost_model: CostModel,
    stage_model: StageCostModel,
    partition: Partition,
    method: str,
    model_flops: float,
) -> Evaluation:
    """Simulate a partition with the parallel config's schedule and compute the metrics."""
    p = parallel
    b = partition.boundaries
    stages = []
    for s in range(p.pp):
        i, j = b[s], b[s + 1]
        stages.append(StagePlan(
            index=s,
            layers=list(range(i, j)),
            kinds=[model.layers[l].kind for l in range(i, j)],
            f_s=stage_model.f(s, i, j),
            b_s=stage_model.b(s, i, j),
            w_s=stage_model.w(s, i, j),
            memory_bytes=stage_model.memory_bytes(s, i, j),
            param_bytes=stage_model.params(s, i, j),
            activation_bytes=stage_model.activations(s, i, j),
            overlap_s=stage_model.fb(s, i, j) if stage_model.pair_costs is not None else None,
        ))
    schedule = build_schedule(p.schedule, p.pp, p.microbatches, p.vpp)  # one stage per rank (PLAN_SCHEDULES)
    fb = [st.overlap_s for st in stages] if stage_model.pair_costs is not None else None
    durations = stage_durations([st.f_s for st in stages], [st.b_s for st in stages], [st.w_s for st in stages], fb=fb)
    p2p = [cost_model.p2p_time(model, s) for s in range(p.pp)]
    comm = []
    for s, st in enumerate(stages):
        rank = schedule.stage_to_rank[s]
        sync = dp_grad_sync_time(model, cost_model, st)
        if sync > 0:
            comm.append((rank, "dp_grad_sync", sync, schedule.actions[rank][-1]))
    timeline = simulate(schedule, durations, p2p_time=lambda src, dst: p2p[min(src, dst)], comm=comm)
    T = timeline.iteration_time
    exposed = dict(timeline.exposed_comm)
    # EP all-to-all and TP all-reduce not hidden inside the stage's own bundles (per rank, summed over ranks)
    for st in stages:
        for l in st.layers:
            c = stage_model.costs[l + 1]
            for ph in (c.F, c.B):
                share = ph.exposed_comm / ph.comm if ph.comm > 0 else 0.0
                for key, sec in ph.comm_by_collective.items():
                    exposed[key] = exposed.get(key, 0.0) + sec * share * p.microbatches
    return Evaluation(
        method=method,
        partition=partition,
        stages=stages,
        timeline=timeline,
        iteration_time_s=T,
        tokens_per_s=p.tokens_per_iteration / T,
        mfu=model_flops / (T * p.world_size * cost_model.cluster.gpu.peak_flops),
        bubble_fraction=timeline.bubble_fraction,
        exposed_comm_s=exposed,
        fits_memory=max(st.memory_bytes for st in stages) <= memory_capacity(cost_model.cluster) * (1 + 1e-12),
    )


def layer_pair_costs(model: ModelSpec, parallel: ParallelConfig, cost_model: CostModel,
                     budget: int = PAIR_SEARCH_BUDGET) -> dict[tuple[str, str], float]:
    """Analytic makespan (seconds) of the forward of a ``kind_f`` layer run together with the full backward
    (B then W) of a ``kind_b`` layer, for every pair of layer kinds of the model, each in the best issue
    order the overlap scheduler finds (:func:`tessera_lab.overlap.core.schedule_pair`)."""
    from tessera_lab.overlap.core import bundle, layer_kind_examples, schedule_pair

    ex = layer_kind_examples(model)
    out = {}
    for kf, lf in ex.items():
        for kb, lb in ex.items():
            res = schedule_pair(bundle(model, lf, "F", parallel, name="F"), bundle(model, lb, "BW", parallel, name="BW"),
                                cost_model=cost_model, budget=budget)
            out[(kf, kb)] = res.makespan
    return out


def build_stage_model(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, profile=None
                      ) -> tuple[CostModel, StageCostModel]:
    """Cost model and per-segment stage costs/memory for a model on a cluster (pair costs after overlap
    included when the schedule is ``overlapped``: from a measured ``profile`` (a
    :class:`tessera_lab.overlap.profiles.Profile`) when given, else from the analytic overlap scheduler)."""
    cost_model = CostModel(cluster, parallel)
    tasks = decompose(model, parallel)
    layer_costs = [cost_model.layer_cost(lt) for lt in tasks]
    mem = layer_memory(model, parallel, tasks)
    pairs = None
    if parallel.schedule == "overlapped":
        if profile is not None:
            from tessera_lab.overlap.profiles import profile_stage_pair_costs

            pairs = profile_stage_pair_costs(profile, model, parallel, cost_model, budget=PAIR_SEARCH_BUDGET)
        else:
            pairs = layer_pair_costs(model, parallel, cost_model)
    return cost_model, StageCostModel(layer_costs, mem, parallel, pairs)


def planning_problem(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, *, objective: str = "bottleneck"
                     ) -> tuple[PartitionProblem, StageCostModel]:
    """The partition problem the planner solves (stage cost as the schedule sees it, memory limit of the GPU)."""
    _, sm = build_stage_model(model, parallel, cluster)
    return _problem(model, parallel, sm, sm.cost, memory_capacity(cluster), objective), sm


def _problem(model: ModelSpec, parallel: ParallelConfig, sm: StageCostModel, cost, capacity: float,
             objective: str) -> PartitionProblem:
    # overlapped 1F1B: the steady state runs pairs (stage cost after overlap), warm-up and cool-down run F and
    # B apart, so the schedule objective sums standalone stage times: sum_s standalone + (m - 1) max_s cost
    sum_cost = sm.standalone if (parallel.schedule == "overlapped" and cost == sm.cost) else None
    return PartitionProblem(model.num_layers, parallel.pp, cost, memory=sm.memory_bytes, memory_limit=capacity,
                            objective=objective, microbatches=parallel.microbatches, sum_cost=sum_cost)


def make_plan(
    model: ModelSpec,
    parallel: ParallelConfig | None = None,
    cluster: Cluster | None = None,
    *,
    method: str = "ilp",
    baselines: Sequence[str] = BASELINES,
    time_limit_s: float = 10.0,
    objective: str = "auto",
    gpu: str = DEFAULT_GPU,
    profile=None,
) -> Plan:
    """Plan a pipeline for ``model``.

    Args:
        model: the model.
        parallel: parallel sizes (default :class:`ParallelConfig()`: pp=8, ep=8, m=32, seq 4096, mbs 1).
        cluster: the cluster; default the smallest DGX cluster of ``gpu`` holding the world size.
        method: ``ilp`` (default), ``dp`` or ``uniform``.
        baselines: other partitions to evaluate with the same schedule (``uniform``).
        time_limit_s: ILP time limit, seconds.
        profile: a measured overlap profile (:func:`tessera_lab.overlap.profiles.load_profile`); layer-pair costs then
            come from it (measured efficiency transferred onto this model's scale) instead of the analytic model.
        objective: ``bottleneck`` (minimise the slowest stage; ties to the smaller spread), ``schedule``
            (``sum_s standalone_s + (m-1) max_s cost_s``, the iteration-time shape of (overlapped) 1F1B), or
            ``auto`` (default): solve both and keep the one that simulates faster (both are recorded in notes).

    Raises:
        ConfigError: bad parallel sizes or a world size larger than the cluster.
        PartitionError / InfeasiblePlanError: more stages than layers, or nothing fits in memory.
    """
    parallel = parallel or ParallelConfig()
    cluster = cluster or cluster_for(parallel, gpu)
    check_fits(parallel, cluster)
    check_parallel_for_model(model, parallel, cluster)
    if parallel.pp > model.num_layers:
        from tessera_lab.errors import PartitionError

        raise PartitionError(
            f"field 'pp' = {parallel.pp} is out of range; allowed: 1 to the number of layers ({model.num_layers})"
        )
    cost_model, stage_model = build_stage_model(model, parallel, cluster, profile)
    layer_costs = stage_model.costs
    capacity = memory_capacity(cluster)

    def problem_for(cost, obj: str = "bottleneck") -> PartitionProblem:
        return _problem(model, parallel, stage_model, cost, capacity, obj)

    if objective not in OBJECTIVES:
        raise ConfigError(f"field 'objective' = {objective!r} is unknown; allowed: {', '.join(OBJECTIVES)}")
    flops = model_flops_per_iteration(model, parallel)
    notes = []
    if model.has_moe and parallel.ep > 1:
        notes.append(routing_load_note(model, parallel))
    if profile is not None:
        env = profile.environment
        notes.append(f"layer-pair costs from profile {profile.path or '(in memory)'}: backend {profile.backend}, "
                     f"device {env.get('device', '?')}, size factor {profile.size_factor:g}; its measured overlap "
                     f"efficiency is transferred onto this model's analytic standalone times")
        if profile.backend != "cuda":
            notes.append(f"the profile was measured with the {profile.backend} backend, not on a {cluster.gpu.name}: "
                         "its efficiencies describe that device")
    objectives = ("bottleneck", "schedule") if objective == "auto" and method != "uniform" else (
        ("bottleneck",) if objective == "auto" else (objective,))
    candidates = []
    for obj in objectives:
        problem = problem_for(stage_model.cost, obj)
        part = solve(problem, method, time_limit_s=time_limit_s)
        candidates.append((evaluate(model, parallel, cost_model, stage_model, part, method, flops), obj))
    chosen, chosen_obj = min(candidates, key=lambda c: c[0].iteration_time_s)
    if len(candidates) > 1:
        notes.append("objective auto: " + ", ".join(
            f"{obj} optimum simulates to {ev.iteration_time_s:.4f} s" for ev, obj in candidates)
            + f"; kept the {chosen_obj} optimum")
    out: dict[str, Evaluation] = {}
    for name in baselines:
        if name not in BASELINES:
            raise ConfigError(f"baseline {name!r} is unknown; allowed: {', '.join(BASELINES)}")
        if name == "uniform":
            b = uniform_boundaries(model.num_layers, parallel.pp)
            costs = [stage_model.cost(s, b[s], b[s + 1]) for s in range(parallel.pp)]
            part = Partition(b, costs, max(costs), problem.objective_value(costs), "uniform",
                             stage_memory=[stage_model.memory_bytes(s, b[s], b[s + 1]) for s in range(parallel.pp)])
            over = [s for s, mm in enumerate(part.stage_memory) if mm > capacity]
            if over:
                notes.append(f"uniform baseline exceeds memory on stage(s) {over}")
        else:
            if name == "standalone" and parallel.schedule != "overlapped":
                continue  # identical to the chosen plan: the schedule sees standalone costs
            cost = stage_model.standalone if name == "standalone" else stage_model.params
            part = solve(problem_for(cost), "dp")
            part.method = name
        out[name] = evaluate(model, parallel, cost_model, stage_model, part, name, flops)
    return Plan(model, parallel, cluster, chosen, out, layer_costs, flops, capacity, notes)
