"""Topology: ranks on nodes, each group's link, weak links and mixed GPU types per stage, and admission
(docs/design-notes.md, "Reports").

* **Placement** follows :meth:`tessera_lab.model.hardware.ParallelConfig.rank` (TP innermost, then EP, DP, PP) on
  nodes of ``gpus_per_node`` GPUs (8 on DGX): rank ``r`` sits on node ``r // 8``, local GPU ``r % 8``.
* **Links**: a group whose ranks share a node talks over NVLink (the GPU's per-direction figure), a group
  that spans nodes over the inter-node link (InfiniBand NDR, 50 GB/s per GPU per direction, times the
  cluster's ``weak_link_factor``) — :meth:`tessera_lab.model.hardware.Cluster.link_for`, the same rule the cost
  model's :meth:`~tessera_lab.cost.analytic.CostModel.collective_time` applies.
* **Weak links and mixed GPUs per stage** feed the cost model and the partitioner: each stage gets its own
  cluster (its GPU type from ``data/hardware/hardware.json``, its inter-node ``weak_link_factor``), hence its
  own task times, pair makespans after overlap and memory capacity; an optional per-stage speed factor
  multiplies the stage's times (e.g. observed / predicted from the lifecycle). The partitioner then
  balances the stages' real costs (memory is normalised to the reference GPU's capacity), and the
  simulator runs the result. The topology-unaware plan (the homogeneous partition run on the same devices)
  is evaluated beside it.
* **Admission** ranks candidate allocations by predicted completion time = wait + remaining tokens /
  predicted throughput (tokens/s).

This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tessera_lab.cost.source import CostSource, analytic_source
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, GPUSpec, ParallelConfig, cluster_for
from tessera_lab.plan.ilp import DEFAULT_ILP_BUDGET, IlpBudget

GROUP_KINDS = ("tp", "ep", "dp", "edp", "pp")


@dataclass(frozen=True)
class GroupLink:
    """The link one communication group uses.

    Attributes:
        kind: ``tp``, ``ep``, ``dp``, ``edp`` (non-expert data-parallel) or ``pp``.
        size: ranks in the group.
        ranks: the ranks of the first group of this kind (groups of one kind are placed alike).
        nodes: nodes those ranks sit on.
        link: ``NVLink`` or ``InfiniBand``.
        bytes_per_s: per-GPU bandwidth per direction, bytes/s; latency_s: base latency, seconds.
    """

    kind: str
    size: int
    ranks: tuple[int, ...]
    nodes: tuple[int, ...]
    link: str
    bytes_per_s: float
    latency_s: float

    @property
    def crosses_nodes(self) -> bool:
        return len(self.nodes) > 1


def group_link(parallel: ParallelConfig, cluster: Cluster | None, kind: str) -> GroupLink:
    """The link of the ``kind`` group containing rank 0 (see module docstring).

    Raises:
        ConfigError: unknown kind, or a world size larger than the cluster.
    """
    from tessera_lab.model.hardware import check_fits

    if kind not in GROUP_KINDS:
        raise ConfigError(f"field 'kind' = {kind!r} is unknown; allowed: {', '.join(GROUP_KINDS)}")
    cluster = cluster or cluster_for(parallel)
    check_fits(parallel, cluster)
    ranks = tuple(parallel.group_ranks(kind))
    nodes = tuple(sorted({cluster.node_of(r) for r in ranks}))
    link = cluster.link_for(list(ranks))
    return GroupLink(kind, len(ranks), ranks, nodes, link.name, link.bytes_per_s, link.latency_s)


def links_table(parallel: ParallelConfig, cluster: Cluster | None = None):
    """Every group kind's link as a pandas DataFrame (kind, size, nodes spanned, link, GB/s, latency µs)."""
    import pandas as pd

    rows = []
    for kind in GROUP_KINDS:
        g = group_link(parallel, cluster, kind)
        rows.append({"group": kind, "size": g.size, "first ranks": _short(g.ranks), "nodes": len(g.nodes),
                     "link": g.link if g.size > 1 else "-", "GB/s per GPU": g.bytes_per_s / 1e9,
                     "latency (us)": g.latency_s * 1e6})
    return pd.DataFrame(rows)


def _short(ranks: Sequence[int]) -> str:
    return ",".join(map(str, ranks)) if len(ranks) <= 6 else f"{ranks[0]},{ranks[1]},...,{ranks[-1]}"


def placement(parallel: ParallelConfig, cluster: Cluster | None = None):
    """Every rank's node, local GPU and coordinates (pp, dp, ep, tp) as a pandas DataFrame."""
    import pandas as pd

    cluster = cluster or cluster_for(parallel)
    p = parallel
    rows = []
    for pp_i in range(p.pp):
        for dp_i in range(p.dp):
            for ep_i in range(p.grid.ep):  # ep / tp grid positions when the EP group spans the TP ranks
                for tp_i in range(p.tp):
                    r = p.rank(pp_i, dp_i, ep_i, tp_i)
                    rows.append({"rank": r, "node": cluster.node_of(r), "local_gpu": r % cluster.gpus_per_node,
                                 "pp": pp_i, "dp": dp_i, "ep": ep_i, "tp": tp_i})
    return pd.DataFrame(rows).sort_values("rank").reset_index(drop=True)


# ---------------------------------------------------------------------- heterogeneous stages
@dataclass
class FactorPlan:
    """A partition that knows each stage's devices, beside the topology-unaware one (seconds, bytes).

    Attributes:
        stage_gpus: GPU type per stage; link_factors: inter-node link factor per stage; speed_factors:
            extra time multiplier per stage.
        boundaries_aware / boundaries_unaware: partitions with and without the per-stage costs.
        stage_times_aware / stage_times_unaware: time per micro-batch of each stage on its devices.
        iteration_aware_s / iteration_unaware_s: simulated iteration times on the devices.
        mfu_aware / mfu_unaware: MFU with the peak of each stage's GPU type.
        migration_bytes: training-state bytes the busiest GPU sends or receives to go from the unaware to the
            aware partition.
    """

    stage_gpus: list[str]
    link_factors: list[float]
    speed_factors: list[float]
    boundaries_aware: list[int]
    boundaries_unaware: list[int]
    stage_times_aware: list[float]
    stage_times_unaware: list[float]
    iteration_aware_s: float
    iteration_unaware_s: float
    mfu_aware: float
    mfu_unaware: float
    migration_bytes: float
    notes: list[str] = field(default_factory=list)
    costs: CostSource = field(default_factory=analytic_source)

    @property
    def speedup(self) -> float:
        return self.iteration_unaware_s / self.iteration_aware_s if self.iteration_aware_s > 0 else float("nan")

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for s in range(len(self.stage_gpus)):
            out.append({"stage": s, "gpu": self.stage_gpus[s], "link factor": self.link_factors[s],
                        "speed factor": self.speed_factors[s],
                        "layers (unaware)": self.boundaries_unaware[s + 1] - self.boundaries_unaware[s],
                        "ms (unaware)": self.stage_times_unaware[s] * 1e3,
                        "layers (aware)": self.boundaries_aware[s + 1] - self.boundaries_aware[s],
                        "ms (aware)": self.stage_times_aware[s] * 1e3})
        return out

    def table(self):
        import pandas as pd

        return pd.DataFrame(self.rows())

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "stage_gpus", "link_factors", "speed_factors", "boundaries_aware", "boundaries_unaware",
            "stage_times_aware", "stage_times_unaware", "iteration_aware_s", "iteration_unaware_s", "mfu_aware",
            "mfu_unaware", "migration_bytes", "notes")} | {"speedup": self.speedup, "costs": self.costs.as_dict()}


class _StageModels:
    """One (CostModel, StageCostModel) per distinct (GPU type, link factor), indexed by stage."""

    def __init__(self, model, parallel: ParallelConfig, cluster: Cluster, stage_gpus: Sequence[str],
                 link_factors: Sequence[float], base: Any = None):
        from tessera_lab.plan.make import build_stage_model

        self.by_key: dict[tuple[str, float], tuple[Any, Any, Cluster]] = {}
        self.stage_keys = []
        for s in range(parallel.pp):
            spec = GPUSpec.named(stage_gpus[s])
            key = (spec.name, float(link_factors[s]))
            if key not in self.by_key:
                cl = Cluster(gpu=spec, num_nodes=cluster.num_nodes, gpus_per_node=cluster.gpus_per_node,
                             inter_node_bytes_per_s=cluster.inter_node_bytes_per_s,
                             weak_link_factor=cluster.weak_link_factor * float(link_factors[s]))
                if base is not None and cl == cluster:
                    self.by_key[key] = (*base, cl)
                else:
                    self.by_key[key] = (*build_stage_model(model, parallel, cl), cl)
            self.stage_keys.append(key)

    def cm(self, s: int):
        return self.by_key[self.stage_keys[s]][0]

    def sm(self, s: int):
        return self.by_key[self.stage_keys[s]][1]

    def cluster(self, s: int) -> Cluster:
        return self.by_key[self.stage_keys[s]][2]


def _check_per_stage(name: str, values: Sequence[Any] | None, pp: int, default: Any) -> list[Any]:
    if values is None:
        return [default] * pp
    values = list(values)
    if len(values) != pp:
        raise ConfigError(f"field '{name}' has {len(values)} entries; allowed: one per stage ({pp})")
    return values


def _simulate(model, parallel: ParallelConfig, models: _StageModels, boundaries: Sequence[int],
              speed: Sequence[float]) -> tuple[float, list[float], float]:
    """Iteration time, stage times per micro-batch and MFU of a partition on per-stage devices (the one
    evaluation path, :func:`tessera_lab.plan.evaluate.evaluate`, with per-stage cost models and speed factors)."""
    from tessera_lab.model.tasks import model_flops_per_iteration
    from tessera_lab.plan.evaluate import evaluate
    from tessera_lab.plan.partition import Partition

    per = [(models.cm(s), models.sm(s)) for s in range(parallel.pp)]
    part = Partition(list(boundaries), [0.0] * parallel.pp, 0.0, 0.0, "topology")
    ev = evaluate(model, parallel, per[0][0], per[0][1], part, "topology", model_flops_per_iteration(model, parallel),
                  per_stage=per, speed=speed)
    return ev.iteration_time_s, [st.time_s for st in ev.stages], ev.mfu


def migration_bytes(stage_model: Any, old: Sequence[int], new: Sequence[int]) -> float:
    """Training-state bytes (weights, gradients, optimizer shards: the per-GPU parameter bytes of the memory
    model) the busiest GPU sends or receives when layers move from partition ``old`` to ``new``: per stage
    ``max(bytes of layers leaving, bytes of layers arriving)``, the maximum over stages (all stages move in
    parallel, each GPU sends its own shard)."""
    pp = len(old) - 1

    def owner(bounds):
        out = {}
        for s in range(pp):
            for l in range(bounds[s], bounds[s + 1]):
                out[l] = s
        return out

    a, b = owner(old), owner(new)
    send = [0.0] * pp
    recv = [0.0] * pp
    for l, s in a.items():
        if b[l] != s:
            nbytes = stage_model.memory[l + 1].param_bytes
            send[s] += nbytes
            recv[b[l]] += nbytes
    return max((max(x, y) for x, y in zip(send, recv)), default=0.0)


# params: per-stage factor lists and solve()'s options, keyword-only, as the panel and CLI pass them
def partition_with_factors(model, parallel: ParallelConfig | None = None, cluster: Cluster | None = None, *,
                           stage_gpus: Sequence[str] | None = None, link_factors: Sequence[float] | None = None,
                           speed_factors: Sequence[float] | None = None, method: str = "ilp",
                           objective: str = "bottleneck", limit: float | IlpBudget = DEFAULT_ILP_BUDGET,
                           unaware_boundaries: Sequence[int] | None = None, _base: Any = None,
                           costs: CostSource | None = None) -> FactorPlan:
    """Partition with per-stage devices and compare with the topology-unaware partition.

    Args:
        model: the model; parallel: sizes (default :class:`ParallelConfig()`); cluster: reference cluster
            (default the smallest H200 DGX cluster that fits).
        stage_gpus: GPU type per stage (``H100``, ``H200``, ``B200``; default the cluster's).
        link_factors: inter-node link speed per stage in (0, 1] (a weak NIC / cable on that stage's node).
        speed_factors: extra time multiplier per stage (> 0; e.g. 1.25 = 25% slower, from observations).
        method, objective: as :func:`tessera_lab.plan.partition.solve`; limit: its ``limit`` (a
            deterministic :class:`~tessera_lab.plan.ilp.IlpBudget`, or seconds of wall clock).
        unaware_boundaries: the partition the topology-unaware planner would run (default: solved on the
            reference cluster with no factors).
        costs: the cost source to report (default analytic: per-stage devices are costed analytically).

    Raises:
        ConfigError: lists of the wrong length, unknown GPU names, factors out of range.
        PartitionError / InfeasiblePlanError: from the partitioner.
    """
    from tessera_lab.cost.memory import memory_capacity
    from tessera_lab.plan.partition import PartitionProblem, solve

    parallel = parallel or ParallelConfig()
    cluster = cluster or cluster_for(parallel)
    p = parallel
    gpus = _check_per_stage("stage_gpus", stage_gpus, p.pp, cluster.gpu.name)
    links = [float(x) for x in _check_per_stage("link_factors", link_factors, p.pp, 1.0)]
    speed = [float(x) for x in _check_per_stage("speed_factors", speed_factors, p.pp, 1.0)]
    for s, x in enumerate(links):
        if not 0 < x <= 1:
            raise ConfigError(f"field 'link_factors[{s}]' = {x} is out of range; allowed: (0, 1]")
    for s, x in enumerate(speed):
        if not x > 0:
            raise ConfigError(f"field 'speed_factors[{s}]' = {x} is out of range; allowed: > 0")
    models = _StageModels(model, p, cluster, gpus, links, base=_base)
    ref_cap = memory_capacity(cluster)
    caps = [memory_capacity(models.cluster(s)) for s in range(p.pp)]

    def cost(s, i, j):
        return models.sm(s).cost(s, i, j) * speed[s]

    def mem(s, i, j):
        return models.sm(s).memory_bytes(s, i, j) * ref_cap / caps[s]

    problem = PartitionProblem(model.num_layers, p.pp, cost, memory=mem, memory_limit=ref_cap, objective=objective,
                               microbatches=p.microbatches)
    aware = solve(problem, method, limit=limit).boundaries
    notes = []
    if unaware_boundaries is None:
        if _base is not None:
            ref_sm = _base[1]
        else:
            from tessera_lab.plan.make import build_stage_model

            ref_sm = build_stage_model(model, p, cluster)[1]
        ref_problem = PartitionProblem(model.num_layers, p.pp, ref_sm.cost, memory=ref_sm.memory_bytes,
                                       memory_limit=ref_cap, objective=objective, microbatches=p.microbatches)
        unaware = solve(ref_problem, method, limit=limit).boundaries
    else:
        unaware = list(unaware_boundaries)
    over = [s for s in range(p.pp) if models.sm(s).memory_bytes(s, unaware[s], unaware[s + 1]) > caps[s]]
    if over:
        notes.append(f"the topology-unaware partition exceeds memory on stage(s) {over} of their devices")
    t_a, times_a, mfu_a = _simulate(model, p, models, aware, speed)
    t_u, times_u, mfu_u = _simulate(model, p, models, unaware, speed)
    mig = migration_bytes(models.sm(0), unaware, aware)
    return FactorPlan(gpus, links, speed, list(aware), list(unaware), times_a, times_u, t_a, t_u, mfu_a, mfu_u, mig,
                      notes, costs=costs or analytic_source())


def factor_plan(plan: Any, speed_factors: Sequence[float], **kwargs: Any) -> FactorPlan:
    """:func:`partition_with_factors` for an existing :class:`~tessera_lab.plan.make.Plan`: its cluster, its chosen
    partition as the unaware one, its cost model reused for the reference devices."""
    from tessera_lab.plan.make import build_stage_model

    base = kwargs.pop("_base", None) or build_stage_model(plan.model, plan.parallel, plan.cluster)
    out = partition_with_factors(plan.model, plan.parallel, plan.cluster, speed_factors=speed_factors,
                                 unaware_boundaries=plan.chosen.partition.boundaries, _base=base, **kwargs)
    if plan.costs.kind != "analytic":
        out.notes.append(f"the plan's costs are {plan.costs.describe()}; topology re-costs every stage's devices "
                         "with the analytic model")
    return out


# ---------------------------------------------------------------------- admission
@dataclass(frozen=True)
class Allocation:
    """A candidate allocation for a job.

    Attributes:
        name: label; wait_s: seconds until it is available; tokens_per_s: predicted throughput;
        gpus: GPUs in it (informational); note: how the throughput was predicted.
    """

    name: str
    wait_s: float
    tokens_per_s: float
    gpus: int | None = None
    note: str = ""

    def completion_s(self, remaining_tokens: float) -> float:
        """Predicted completion time: ``wait_s + remaining_tokens / tokens_per_s``, seconds."""
        return self.wait_s + remaining_tokens / self.tokens_per_s


def admission(candidates: Sequence[Allocation], remaining_tokens: float) -> list[dict[str, Any]]:
    """Rank candidate allocations by predicted completion time (earliest first).

    Returns:
        one dict per candidate: ``rank``, ``name``, ``gpus``, ``wait_s``, ``tokens_per_s``, ``run_s``
        (remaining tokens / throughput), ``completion_s``, ``note``.

    Raises:
        ConfigError: no candidates, negative wait or remaining tokens, non-positive throughput.
    """
    if not candidates:
        raise ConfigError("field 'candidates' is empty; allowed: at least one allocation")
    if not remaining_tokens >= 0:
        raise ConfigError(f"field 'remaining_tokens' = {remaining_tokens} is out of range; allowed: >= 0")
    rows = []
    for c in candidates:
        if not c.wait_s >= 0:
            raise ConfigError(f"allocation {c.name!r}: field 'wait_s' = {c.wait_s} is out of range; allowed: >= 0")
        if not c.tokens_per_s > 0:
            raise ConfigError(f"allocation {c.name!r}: field 'tokens_per_s' = {c.tokens_per_s} is out of range; allowed: > 0")
        run = remaining_tokens / c.tokens_per_s
        rows.append({"name": c.name, "gpus": c.gpus, "wait_s": c.wait_s, "tokens_per_s": c.tokens_per_s,
                     "run_s": run, "completion_s": c.wait_s + run, "note": c.note})
    rows.sort(key=lambda r: r["completion_s"])
    for k, r in enumerate(rows):
        r["rank"] = k + 1
    return [{"rank": r.pop("rank"), **r} for r in rows]


def allocation_from_plan(name: str, wait_s: float, plan: Any) -> Allocation:
    """An :class:`Allocation` whose throughput is a plan's simulated tokens/s."""
    return Allocation(name, float(wait_s), plan.chosen.tokens_per_s, plan.parallel.world_size,
                      f"simulated: {plan.model.name} pp={plan.parallel.pp} ep={plan.parallel.ep} dp={plan.parallel.dp} "
                      f"on {plan.cluster.gpu.name}")
