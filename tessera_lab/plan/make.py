"""The main job: model -> tasks -> costs -> partition -> schedule -> simulate -> metrics.

:func:`make_plan` turns a :class:`~tessera_lab.model.spec.ModelSpec`, a :class:`~tessera_lab.model.hardware.ParallelConfig`
and a :class:`~tessera_lab.model.hardware.Cluster` into a :class:`Plan`: stage boundaries chosen by the requested method
and objective, each stage's time per micro-batch and memory, the simulated iteration, tokens/s, MFU and bubble, the
same numbers for baseline partitions evaluated with the same schedule and simulator (a fair comparison), and the
:class:`~tessera_lab.cost.source.CostSource` the costs came from. With the default objective ``auto`` the chosen plan
is never slower in simulation than a baseline that fits memory. ``schedule="auto"`` tries every schedule the planner
can simulate (the EP-overlap ones where Megatron-Core runs them) and keeps the fastest that fits (each is reported).

MFU = model FLOPs per iteration / (iteration time x GPUs x peak dense bf16 FLOP/s), with model FLOPs
in Megatron-LM's convention (:func:`tessera_lab.model.tasks.model_flops_per_iteration`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from tessera_lab.cost.analytic import LayerCost
from tessera_lab.cost.memory import memory_capacity
from tessera_lab.cost.source import CostSource, analytic_source, profile_source
from tessera_lab.defaults import DEFAULT_GPU, DEFAULT_MODEL
from tessera_lab.errors import ConfigError, InfeasiblePlanError, PartitionError, TesseraError
from tessera_lab.checks import check_work, divisors_text
from tessera_lab.model.hardware import RECOMPUTE_MODULES, Cluster, ParallelConfig, check_fits, cluster_for
from tessera_lab.model.spec import DENSE, FULL_ATTENTION, NO_FFN, NO_MIXER, ModelSpec, model_from_name, shipped_models
from tessera_lab.model.tasks import model_flops_per_iteration
from tessera_lab.plan.evaluate import Evaluation, StagePlan, dp_grad_sync_time, evaluate
from tessera_lab.plan.ilp import DEFAULT_ILP_BUDGET, IlpBudget, limit_text, limit_word
from tessera_lab.plan.notes import plan_notes, sync_note
from tessera_lab.plan.objective import REFINE_BUDGET, refine, schedule_path_cost
from tessera_lab.plan.problem import LAYER_COUNT_REFUSAL, without_schedule_hint
from tessera_lab.plan.partition import (Partition, PartitionProblem, check_memory, score_boundaries, solve,
                                       uniform_boundaries)
from tessera_lab.plan.stages import OVERLAPPED_SCHEDULES, PAIR_SEARCH_BUDGET, StageCostModel, build_stage_model, layer_pair_costs

__all__ = ["BASELINES", "DEFAULT_GPU", "DEFAULT_MODEL", "Evaluation", "OBJECTIVES", "PAIR_SEARCH_BUDGET",
           "PLAN_SCHEDULES", "Plan", "StageCostModel", "StagePlan", "build_stage_model", "dp_grad_sync_time",
           "evaluate", "layer_pair_costs", "make_plan", "planning_problem"]

#: baselines evaluated beside the chosen plan, all with the same schedule and simulator:
#: the ``--schedule auto`` refusal's opening, and where its advice begins (after every schedule's finding)
AUTO_REFUSAL, AUTO_ADVICE = "schedule auto: no schedule fits; ", "; advice: "
#: ``uniform`` (layer counts as even as possible), ``standalone`` (balanced on standalone F+B+W sums: what a
#: planner without overlap measurement picks), ``parameters`` (balanced on parameter bytes, DeepSpeed's default).
BASELINES = ("uniform", "standalone", "parameters")
OBJECTIVES = ("auto", "bottleneck", "schedule")
#: schedules the planner simulates: one stage per pipeline rank, or ``interleaved`` / ``interleaved-overlapped``
#: (:data:`tessera_lab.pipeline.schedules.SCHEDULES`) with ``vpp >= 2``
PLAN_SCHEDULES = ("overlapped", "1f1b", "gpipe", "zb-h1", "zb-h2", "interleaved", "interleaved-overlapped", "zb-auto")
VIRTUAL_SCHEDULES = ("interleaved-overlapped", "interleaved")
#: what ``schedule="auto"`` tries with one stage per rank
AUTO_SCHEDULES = ("overlapped", "1f1b", "zb-h1", "zb-h2", "gpipe", "zb-auto")
#: simulations the refinement spends on ``zb-auto`` (each runs the schedule search again)
ZB_AUTO_REFINE_BUDGET = 8


def check_parallel_for_model(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> None:
    """Parallel sizes the model and cluster can run (Megatron-LM's rules for tensor parallelism).

    Raises:
        ConfigError: ``tp`` not dividing the attention heads, the key-value heads or the linear-attention heads,
            ``tp`` not dividing the GPUs of a node (TP stays inside a node), ``ep`` not dividing the experts, a
            schedule the planner cannot simulate, or ``vpp`` that the schedule does not take.
    """
    tp = parallel.tp
    if parallel.schedule not in PLAN_SCHEDULES + ("auto",):
        raise ConfigError(f"field 'schedule' = {parallel.schedule!r} cannot be planned; allowed: "
                          f"{', '.join(PLAN_SCHEDULES)}, auto")
    if (parallel.vpp > 1) != (parallel.schedule in VIRTUAL_SCHEDULES) and parallel.schedule != "auto":
        raise ConfigError(f"field 'vpp' = {parallel.vpp} does not fit schedule {parallel.schedule!r}; allowed: vpp >= 2 "
                          f"with {' or '.join(VIRTUAL_SCHEDULES)}, vpp = 1 with the others")
    heads = {"num_attention_heads": model.attention.num_attention_heads, "num_key_value_heads": model.attention.num_key_value_heads}
    if model.linear.linear_num_key_heads:
        heads["linear_num_key_heads"] = model.linear.linear_num_key_heads
    # layers with their own head counts (MiMo-V2-Flash's sliding-window layers): each distinct count
    for key, own in (("a layer's heads", {l.heads for l in model.stack.layers}),
                     ("a layer's kv_heads", {l.kv_heads for l in model.stack.layers})):
        for v in sorted(own - set(heads.values()) - {0}):
            heads[f"{key} ({v})"] = v
    import math

    common = math.gcd(cluster.gpus_per_node, *heads.values())
    tp_allowed = (f"allowed: {divisors_text(common).split(': ', 1)[1]} (the divisors of every head count "
                  f"({', '.join(f'{k} {v}' for k, v in heads.items())}) and of the {cluster.gpus_per_node} GPUs of a node)")
    for name, n in heads.items():
        if n % tp:
            raise ConfigError(f"field 'tp' = {tp} must divide {name} = {n}; {tp_allowed}")
    if cluster.gpus_per_node % tp:
        raise ConfigError(f"field 'tp' = {tp} must divide the {cluster.gpus_per_node} GPUs of a node "
                          f"(tensor parallelism stays on NVLink); {tp_allowed}")
    if parallel.cp > 1:  # head-sharded mixers need their heads per TP rank divisible by cp (model/context_parallel.py)
        from tessera_lab.model.context_parallel import check_heads

        for attention in sorted({layer.attention for layer in model.stack.layers}):
            check_heads(model, attention, tp, parallel.cp)
    if model.has_moe and model.moe.num_experts % parallel.ep:
        raise ConfigError(f"field 'ep' = {parallel.ep} must divide num_experts = {model.moe.num_experts}; allowed: "
                          f"{divisors_text(model.moe.num_experts)}")
    stages = parallel.pp * parallel.vpp  # the partition weighs every (stage, segment) pair the layer counts allow
    check_work("partition_segments", stages * max(1, model.num_layers - stages + 1),
               field=f"pipeline stages {stages} x (layers {model.num_layers} - stages + 1)")
    missing = [mod for mod in parallel.recompute_modules if not model_has_module(model, mod)]
    if missing:
        have = [mod for mod in RECOMPUTE_MODULES if model_has_module(model, mod)]
        raise ConfigError(f"field 'recompute_modules' names {', '.join(missing)}, which {model.name} does not have "
                          f"({'; '.join(_MODULE_NEEDS[mod] for mod in missing)}): recomputing it would do nothing; "
                          f"allowed for this model: {', '.join(have) or 'none'}")


#: what each Megatron recompute module needs in the model (``recompute_modules`` check)
_MODULE_NEEDS = {"core_attn": "needs a full-attention layer", "mla_up_proj": "needs MLA attention",
                 "mlp": "needs a dense-FFN layer", "moe_act": "needs an MoE layer", "moe": "needs an MoE layer",
                 "layernorm": "needs a decoder layer with a norm", "shared_experts": "needs a shared expert"}


def model_has_module(model: ModelSpec, module: str) -> bool:
    """Whether a Megatron ``--recompute-modules`` name has anything to recompute in ``model``."""
    layers = model.stack.layers
    if module == "core_attn":
        return any(layer.mixer == FULL_ATTENTION for layer in layers)
    if module == "mla_up_proj":
        return any(layer.attention in ("mla", "mla_sparse") for layer in layers)
    if module == "mlp":
        return any(layer.ffn == DENSE for layer in layers)
    if module == "layernorm":
        return any(layer.mixer != NO_MIXER or layer.ffn != NO_FFN for layer in layers)
    if module == "shared_experts":
        return model.has_moe and bool(model.moe.shared_expert_intermediate_size)
    return model.has_moe


@dataclass
class Plan:
    """Result of :func:`make_plan`: the chosen evaluation plus baselines, the inputs and the cost source."""

    model: ModelSpec
    parallel: ParallelConfig
    cluster: Cluster
    chosen: Evaluation
    baselines: dict[str, Evaluation]
    layer_costs: list[LayerCost]
    model_flops: float
    memory_capacity_bytes: float
    notes: list[str] = field(default_factory=list)
    costs: CostSource = field(default_factory=analytic_source)
    #: ``schedule="auto"``: one dict per schedule tried (``schedule``, ``iteration_time_s`` or ``error``)
    schedule_trials: list[dict[str, Any]] = field(default_factory=list)
    #: set by :func:`tessera_lab.plan.load.load_plan`: how the plan was re-evaluated (and any change of source)
    reevaluation: list[str] = field(default_factory=list)
    #: objective ``auto``: where the simulator refinement started (``start``, ``start_boundaries``,
    #: ``start_iteration_time_s``), how many partitions it simulated and the gain in seconds
    refinement: dict[str, Any] = field(default_factory=dict)
    #: how long :func:`make_plan` took (measured): ``wall_s``, ``cpu_s`` (this process's CPU seconds), and what its
    #: caches spared: ``pair_searches`` run and ``pair_searches_cached``, ``stage_model`` ``"cached"`` or ``"built"``
    #: (not part of :meth:`as_dict`: it describes this run, not the plan)
    timing: dict[str, Any] = field(default_factory=dict)
    #: where the chosen partition comes from when it is not the solver's own result: ``"baseline parameters"``
    #: (kept, or the start of the simulator refinement, because it simulates faster); empty when it is the solver's
    partition_from: str = ""
    #: seconds the host/sync term (:mod:`tessera_lab.cost.sync`, a FITTED value unless set) adds to the chosen
    #: plan's simulated iteration (with - without, same partition); 0 where the planner's rule gives no term
    host_sync_added_s: float = 0.0
    #: the solver's own (unguarded) result when :attr:`partition_from` is set, reported beside the chosen plan
    solver_result: Evaluation | None = None

    def _named_model_is_this(self) -> bool:
        """True when the model's name alone rebuilds it (a shipped model, or a variant of one written as
        ``name[key=value]``): the same spec, not merely the same name (a config.json named like a shipped model)."""
        if self.model.name.split("[", 1)[0] not in shipped_models():
            return False
        try:
            return model_from_name(self.model.name) == self.model
        except TesseraError:
            return False

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the keys of the CLI contract (``model``, ``method``, ``stages``, ``costs``, ...)."""
        d = {
            "model": self.model.name,
            **self.chosen.as_dict(),
            "costs": self.costs.as_dict(),
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
        if self.model.approximate:  # unknown config fields ignored: every export made from the plan says so
            d["approximate"] = self.model.approximate
        if self.model.path:
            d["model_path"] = self.model.path
        # layout and memory fields, written only when set (plans without them read as before)
        defaults = ParallelConfig()
        for k in ("ep_placement", "ep_spans_tp", "sequence_parallel", "adam_moment_dtype", "recompute_modules",
                  "host_sync_s", "cp", "fsdp"):
            v = getattr(self.parallel, k)
            if v != getattr(defaults, k):
                d["parallel"][k] = list(v) if isinstance(v, tuple) else v
        if self.cluster.memory_reserve_gib is not None:  # a reserve of the user's (--memory-reserve-gib)
            d["memory_reserve_gib"] = self.cluster.memory_reserve_gib
        if self.schedule_trials:
            d["schedule_trials"] = self.schedule_trials
        if self.reevaluation:
            d["reevaluation"] = self.reevaluation
        if self.refinement:
            d["refinement"] = self.refinement
        if self.model.raw and not self._named_model_is_this():
            # a model from a config.json path: the plan carries its (resolved) config, so that report --plan
            # rebuilds it anywhere, without the file
            d["hf_config"] = dict(self.model.raw)
            d["hf_config_options"] = {"plan_mtp": self.model.stack.plan_mtp,
                                      "allow_unknown_fields": self.model.allow_unknown_fields,
                                      "allow_structural_fields": self.model.allow_structural_fields}
        if self.partition_from and self.solver_result is not None:
            r = self.solver_result
            d["partition_from"] = self.partition_from
            d["solver_result"] = {"method": r.method, "boundaries": list(r.partition.boundaries),
                                  "iteration_time_s": r.iteration_time_s, "fits_memory": r.fits_memory,
                                  "solver": r.partition.solver, "solver_status": r.partition.status or "Optimal"}
        return d


def planning_problem(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, *, objective: str = "bottleneck"
                     ) -> tuple[PartitionProblem, StageCostModel]:
    """The partition problem the planner solves for ``objective`` (``bottleneck``: the stage cost as the
    schedule's steady state sees it; ``schedule``: the schedule-aware per-rank path cost of
    :mod:`tessera_lab.plan.objective`), with the GPU's memory limit."""
    cm, sm = build_stage_model(model, parallel, cluster)
    return _problem(model, parallel, cm, sm, objective), sm


def _problem(model: ModelSpec, parallel: ParallelConfig, cm, sm: StageCostModel, objective: str, cost=None,
             given_split: bool = False) -> PartitionProblem:
    if cost is None:
        cost = (schedule_path_cost(model, parallel, cm, sm) if objective == "schedule" and parallel.vpp == 1
                else sm.cost)
    return PartitionProblem(model.num_layers, parallel.pp * parallel.vpp, cost, memory=sm.memory_bytes,
                            memory_limit=memory_capacity(cm.cluster), objective="bottleneck",
                            microbatches=parallel.microbatches, vpp=parallel.vpp, has_experts=model.has_moe,
                            given_split=given_split, recompute=parallel.recompute, schedule=parallel.schedule)


# params: the planner's public options, one per 'tessera-lab plan' flag (keyword-only after the cluster)
def make_plan(
    model: ModelSpec,
    parallel: ParallelConfig | None = None,
    cluster: Cluster | None = None,
    *,
    method: str = "ilp",
    baselines: Sequence[str] = BASELINES,
    limit: float | IlpBudget | None = None,
    objective: str = "auto",
    gpu: str = DEFAULT_GPU,
    profile=None,
    refine_budget: int = REFINE_BUDGET,
    boundaries: Sequence[int] | None = None,
    memory_reserve_gib: float | None = None,
) -> Plan:
    """Plan a pipeline for ``model``.

    Args:
        model: the model.
        parallel: parallel sizes (default :class:`ParallelConfig()`: pp=8, ep=8, m=32, seq 4096, mbs 1); its
            ``schedule`` may be ``auto`` (try every pair of :func:`auto_candidates`).
        cluster: the cluster; default the smallest DGX cluster of ``gpu`` holding the world size, holding back
            ``memory_reserve_gib`` GiB per GPU (``None``: the data file's reserve; ignored when ``cluster`` is given,
            which carries its own).
        method: ``ilp`` (default), ``dp`` or ``uniform``.
        baselines: other partitions to evaluate with the same schedule (:data:`BASELINES`).
        limit: ILP limit: an :class:`~tessera_lab.plan.ilp.IlpBudget` (a deterministic budget of binaries and
            branch-and-bound nodes: the same partition under any machine load), or seconds of wall clock (where the
            solver stops then depends on the load). None (default): :data:`~tessera_lab.plan.ilp.DEFAULT_ILP_BUDGET`,
            with ``schedule="auto"`` :data:`AUTO_ILP_BUDGET` per schedule.
        objective: ``bottleneck`` (minimise the slowest stage's steady-state cost; ties to the smaller spread),
            ``schedule`` (minimise the schedule-aware per-rank path cost: warm-up/cool-down, p2p, DP sync tail;
            :mod:`tessera_lab.plan.objective`), or ``auto`` (default): solve both, start from the fastest in
            simulation among them and the baselines that fit memory, and refine by simulation
            (``refine_budget`` simulations); the result is never slower than those starts, and the notes say
            where it started and why.
        boundaries: with ``method = "uniform"``, a given split instead of the even one (``pp * vpp + 1`` layer
            indices from 0 to ``num_layers``, e.g. a recipe's Megatron layout); checked against memory the same way.
        profile: a measured overlap profile (:func:`tessera_lab.overlap.profiles.load_profile`); layer-pair costs then
            come from it (measured efficiency transferred onto this model's scale) and the plan's ``costs`` name it.

    Raises:
        ConfigError: bad parallel sizes, schedule or objective, or a world size larger than the cluster.
        PartitionError / InfeasiblePlanError: more stages than layers, or nothing fits in memory.
    """
    import time

    from tessera_lab.overlap.search import search_cache_info
    from tessera_lab.plan.stages import COST_CACHE_STATS

    t_wall, t_cpu = time.perf_counter(), time.process_time()
    searches, cached, built = (search_cache_info()["searches"], search_cache_info()["hits"],
                               COST_CACHE_STATS["builds"])
    pl = _make_plan(model, parallel, cluster, method=method, baselines=baselines, limit=limit,
                    objective=objective, gpu=gpu, profile=profile, refine_budget=refine_budget, boundaries=boundaries,
                    memory_reserve_gib=memory_reserve_gib)
    info = search_cache_info()
    pl.timing = {"wall_s": time.perf_counter() - t_wall, "cpu_s": time.process_time() - t_cpu,
                 "pair_searches": info["searches"] - searches, "pair_searches_cached": info["hits"] - cached,
                 "stage_model": "built" if COST_CACHE_STATS["builds"] > built else "cached"}
    return pl


# params: make_plan's options, passed through
def _make_plan(model, parallel, cluster, *, method, baselines, limit, objective, gpu, profile, refine_budget,
               boundaries, memory_reserve_gib=None) -> Plan:
    parallel = parallel or ParallelConfig()
    cluster = cluster or cluster_for(parallel, gpu, memory_reserve_gib)
    check_fits(parallel, cluster)
    check_parallel_for_model(model, parallel, cluster)
    if objective not in OBJECTIVES:
        raise ConfigError(f"field 'objective' = {objective!r} is unknown; allowed: {', '.join(OBJECTIVES)}")
    if parallel.schedule == "auto":
        return _auto_schedule(model, parallel, cluster, method=method, baselines=baselines,
                              limit=limit, objective=objective, profile=profile,
                              refine_budget=refine_budget)
    limit = DEFAULT_ILP_BUDGET if limit is None else limit
    S = parallel.pp * parallel.vpp
    _check_split(model, S, method, boundaries)
    cost_model, sm = build_stage_model(model, parallel, cluster, profile)
    capacity = memory_capacity(cluster)
    flops = model_flops_per_iteration(model, parallel)
    source = profile_source(profile) if profile is not None else analytic_source()
    notes = plan_notes(model, parallel, cluster, profile)

    def run(part: Partition, label: str) -> Evaluation:
        return evaluate(model, parallel, cost_model, sm, part, label, flops)

    objectives = ("schedule", "bottleneck") if objective == "auto" else (objective,)
    if method == "uniform" or parallel.vpp > 1:
        objectives = ("bottleneck",)  # the same problem either way (the path cost needs one stage per rank)
    candidates = []
    for obj in objectives:
        if boundaries is not None:  # a given (recipe) split, scored and memory-checked as the even one is
            problem = _problem(model, parallel, cost_model, sm, obj, given_split=True)
            part = score_boundaries(problem, boundaries, method)
            check_memory(problem, part)
        else:
            part = solve(_problem(model, parallel, cost_model, sm, obj), method, limit=limit)
        candidates.append((run(part, method), f"{_result_word(part, method)} ({obj} objective)"))
    out: dict[str, Evaluation] = {}
    # a given split may hold more virtual stages than layers (embedding-only and loss-only stages)
    steady = _problem(model, parallel, cost_model, sm, "bottleneck", given_split=boundaries is not None)
    if baselines and S > model.num_layers:  # no other split has a layer on every stage
        notes.append(f"baselines skipped: {S} virtual stages for {model.num_layers} layers, only the given split exists")
        baselines = ()
    for name in baselines:
        if name not in BASELINES:
            raise ConfigError(f"baseline {name!r} is unknown; allowed: {', '.join(BASELINES)}")
        if name == "uniform":
            part = score_boundaries(steady, uniform_boundaries(model.num_layers, S), "uniform")
            if note := _over_memory_note(part.rank_memory, capacity, parallel.vpp):
                notes.append(note)
        else:
            if name == "standalone" and sm.pair_costs is None:
                continue  # identical to the bottleneck optimum: the schedule sees standalone costs
            cost = sm.standalone if name == "standalone" else sm.params
            # a planner without rank sums balances every (virtual) stage on its own: the DP over virtual stages
            part = solve(replace(_problem(model, parallel, cost_model, sm, "bottleneck", cost=cost), vpp=1), "dp")
            part = score_boundaries(steady, part.boundaries, name, solver=part.solver, status=part.status,
                                    solve_time_s=part.solve_time_s)
        out[name] = run(part, name)
    if len(candidates) > 1:
        notes.append("objective auto: " + ", ".join(
            f"{label} simulates to {ev.iteration_time_s:.4f} s" for ev, label in candidates))
    chosen = solver_best = min(candidates, key=lambda c: c[0].iteration_time_s)[0]
    refinement: dict[str, Any] = {}
    if objective == "auto" and method != "uniform":
        chosen, refinement = _refine(model, parallel, cost_model, sm, steady, candidates, out, method, flops, notes,
                                     min(refine_budget, ZB_AUTO_REFINE_BUDGET) if parallel.schedule == "zb-auto"
                                     else refine_budget)
    elif method != "uniform":
        chosen = _never_slower_than_baselines(chosen, out, method, notes)
    sync_added = 0.0
    if sm.host_sync is not None:
        text, sync_added = sync_note(model, parallel, cost_model, sm, chosen, flops)
        notes.append(text)
    origin = _partition_origin(chosen, solver_best, out, refinement) if method != "uniform" else ""
    return Plan(model, parallel, cluster, chosen, out, sm.costs, flops, capacity, notes, costs=source,
                refinement=refinement, partition_from=origin, solver_result=solver_best if origin else None,
                host_sync_added_s=sync_added)


def _check_split(model: ModelSpec, S: int, method: str, boundaries: Sequence[int] | None) -> None:
    """Refuse ``S`` (virtual) stages for the model's layers, and a given split that is not ``S + 1`` non-decreasing
    layer indices from 0 to ``num_layers`` under method ``uniform``.

    Raises:
        PartitionError: too many stages; ConfigError: a bad given split (the field, its value, the allowed form).
    """
    # a given split may leave the first and last virtual stage only the embedding and the loss (Megatron's
    # account_for_embedding/loss_in_pipeline_split with one slot per virtual stage)
    L = model.num_layers
    if S > L + (2 if boundaries is not None else 0):
        raise PartitionError(f"field 'pp' x 'vpp' = {S} is out of range; allowed: 1 to the number of layers "
                             f"({L}){', + 2 with a given split' if boundaries is not None else ''}")
    if boundaries is not None and (method != "uniform" or len(boundaries) != S + 1 or list(boundaries) != sorted(
            boundaries) or boundaries[0] != 0 or boundaries[-1] != L):
        raise ConfigError(f"field 'boundaries' = {list(boundaries)} is out of range; allowed: with method "
                          f"'uniform', {S + 1} non-decreasing layer indices from 0 to {L}")


def _partition_origin(chosen: Evaluation, solver_best: Evaluation, baselines: dict[str, Evaluation],
                      refinement: dict[str, Any]) -> str:
    """``"baseline NAME"`` when the chosen partition is a baseline's (kept by the never-slower rule, or the start
    of the simulator refinement), with ``", moved by simulator refinement"`` when the refinement moved it; ``""``
    when it is the solver's own result (moved by the refinement or not)."""
    start = refinement.get("start", "")
    if start.startswith("baseline"):
        return start + (", moved by simulator refinement" if refinement.get("gain_s", 0.0) > 0 else "")
    if refinement or list(chosen.partition.boundaries) == list(solver_best.partition.boundaries):
        return ""
    return next((f"baseline {name}" for name, ev in baselines.items()
                 if list(ev.partition.boundaries) == list(chosen.partition.boundaries)), "")


def _never_slower_than_baselines(chosen: Evaluation, baselines: dict[str, Evaluation], method: str,
                                 notes: list[str]) -> Evaluation:
    """The planner's rule: never return a plan slower in simulation than a baseline it computed that fits memory.
    A faster fitting baseline's partition is kept (copied under ``method``, its solver bookkeeping from the
    solver's result), with a note naming both times."""
    fitting = [(name, ev) for name, ev in baselines.items() if ev.fits_memory]
    if not fitting:
        return chosen
    name, best = min(fitting, key=lambda c: c[1].iteration_time_s)
    if best.iteration_time_s >= chosen.iteration_time_s:
        return chosen
    ref = chosen.partition
    notes.append(f"baseline {name} simulates faster ({best.iteration_time_s:.4f} s) than the "
                 f"{_result_word(ref, method)} ({chosen.iteration_time_s:.4f} s): the solver's objective misses part "
                 f"of what the simulated schedule pays, so the plan keeps the baseline's partition (objective auto "
                 f"also refines it by simulation)")
    return replace(best, method=method, partition=replace(best.partition, method=method, solver=ref.solver,
                                                          status=ref.status, solve_time_s=ref.solve_time_s))


def _over_memory_note(rank_memory: list[float], capacity: float, vpp: int) -> str | None:
    """The uniform baseline's pipeline ranks over ``capacity`` (bytes), each with its memory summed over its
    ``vpp`` chunks; ``None`` when every rank fits."""
    over = [r for r, mm in enumerate(rank_memory) if mm > capacity]
    if not over:
        return None
    where = ", ".join(f"{r} ({rank_memory[r] / 2**30:.2f} GiB)" for r in over)
    return (f"uniform baseline exceeds memory on pipeline rank(s) {where}"
            + (f", each summed over its {vpp} chunks (the stage tables list each chunk)" if vpp > 1 else "")
            + f"; {capacity / 2**30:.2f} GiB available")


def _result_word(part: Partition, method: str) -> str:
    """``ilp optimum`` for a proven optimum, else what the solver returned: ``ilp best feasible plan (HiGHS stopped
    at its work budget, not proven optimal)`` (or ``time limit``) or the heuristic plan kept at the limit."""
    if part.proven:
        return f"{method} optimum"
    word = limit_word(part.status)
    if "heuristic" in (part.status or ""):
        return (f"{method} {word.replace(' ', '-')} fallback (a heuristic plan; {part.solver or 'the solver'} stopped "
                "at its limit)")
    return f"{method} best feasible plan ({part.solver or 'solver'} stopped at its {word}, not proven optimal)"


# params: the planning context (model, sizes, cost and stage models, FLOPs) that _make_plan owns
def _refine(model, parallel, cost_model, sm, steady: PartitionProblem, candidates, baselines, method: str,
            flops: float, notes: list[str], budget: int) -> tuple[Evaluation, dict[str, Any]]:
    """Refine by simulation from the fastest simulated start (a solver candidate or a fitting baseline) and, when
    that start is a baseline, from the solver's best candidate too (a local search ends where it starts; seen:
    Qwen3.5 interleaved, 1.9107 s from the baseline, 1.8925 s from the ILP optimum); keep the faster end (the first
    start on a tie), and explain. ``budget``: simulations per start."""
    starts = list(candidates) + [(ev, f"baseline {name}") for name, ev in baselines.items() if ev.fits_memory]
    start_ev, start_label = min(starts, key=lambda c: c[0].iteration_time_s)
    solver_start = min(candidates, key=lambda c: c[0].iteration_time_s)
    best_solver = solver_start[0]
    if start_label.startswith("baseline"):
        what = "solver optimum" if best_solver.partition.proven else (
            f"solver's best plan ({_result_word(best_solver.partition, method)})")
        notes.append(f"{start_label} simulates faster ({start_ev.iteration_time_s:.4f} s) than the {what} "
                     f"({best_solver.iteration_time_s:.4f} s): the solver's objective misses part of what the "
                     "simulated schedule pays, so the refinement starts from both")
    cache = {}
    times: dict[tuple[int, ...], float | None] = {}
    known = {tuple(ev.partition.boundaries): ev for ev, _ in starts if ev.fits_memory}

    def sim(b: list[int]) -> float | None:
        key = tuple(b)
        if key in known:
            return known[key].iteration_time_s
        if key not in times:  # shared by the starts: a partition is simulated once
            part = score_boundaries(steady, b, method)
            if not all(steady.memory_ok_rank(m) for m in part.rank_memory):
                times[key] = None
            else:
                cache[key] = part  # the full evaluation is built for the partition kept only
                times[key] = evaluate(model, parallel, cost_model, sm, part, method, flops, time_only=True)
        return times[key]

    known[tuple(start_ev.partition.boundaries)] = start_ev
    runs = []
    for ev0, label in [(start_ev, start_label)] + ([solver_start] if start_label.startswith("baseline") else []):
        b, t, spent = refine(ev0.partition.boundaries, sim, budget=budget)
        runs.append((t, ev0, label, b, spent))
        notes.append(f"simulator refinement from the {label}: {spent} partition{'s' if spent != 1 else ''} simulated, "
                     + (f"boundaries {ev0.partition.boundaries} -> {b}, {(ev0.iteration_time_s - t) * 1e3:.2f} ms "
                        f"faster ({t:.4f} s)" if ev0.iteration_time_s - t > 0 else "no neighbour simulates faster"))
    t, start_ev, start_label, b, spent = min(runs, key=lambda r: r[0])  # the first on a tie
    if len(runs) > 1:
        notes.append(f"kept the refinement from the {start_label} ({t:.4f} s)")
    ref = best_solver.partition
    found = known.get(tuple(b))  # may be a baseline's own evaluation: copy, never relabel it
    if found is None:
        found = evaluate(model, parallel, cost_model, sm, cache[tuple(b)], method, flops)
    ev = replace(found, method=method, partition=replace(found.partition, method=method, solver=ref.solver,
                                                         status=ref.status, solve_time_s=ref.solve_time_s))
    gain = start_ev.iteration_time_s - t
    return ev, {"start": start_label, "start_boundaries": list(start_ev.partition.boundaries),
                "start_iteration_time_s": start_ev.iteration_time_s, "simulations": sum(r[4] for r in runs),
                "gain_s": gain}


#: ILP limit per schedule under ``schedule="auto"`` (it solves one ILP per schedule and objective) by default: a work
#: budget, so the choice among schedules does not move with the machine's load. Sized on the documented ``--schedule
#: auto`` commands (measured 2026-12-03, HiGHS 1.16): their one-chunk models have 8-558 binaries (1 node at most);
#: with 2 virtual stages per rank the models HiGHS proved optimal within 2 s at idle have 498-1,698 binaries
#: (0.26-1.6 CPU s), those it did not 1,999-6,862 (it kept the heuristic plan): a budget between the two keeps every
#: one of these plans, with fewer nodes than a single schedule's plan gets (:data:`DEFAULT_ILP_BUDGET`)
AUTO_ILP_BUDGET = IlpBudget(max_binaries=1800, max_nodes=10)
#: the cap on a wall-clock ``limit`` per schedule under ``schedule="auto"`` (opt-in seconds), s
AUTO_TIME_LIMIT_S = 2.0
#: virtual stages per rank ``schedule="auto"`` tries the interleaved schedules with when given ``vpp = 1``
AUTO_VPP = 2


def auto_candidates(model: ModelSpec, parallel: ParallelConfig) -> list[tuple[str, int]]:
    """``(schedule, vpp)`` pairs ``schedule="auto"`` tries: with ``vpp = 1`` every one-chunk schedule of
    :data:`AUTO_SCHEDULES`, then :data:`VIRTUAL_SCHEDULES` at ``vpp = AUTO_VPP`` (2) when ``pp x 2`` stages fit in the
    layers; with ``vpp >= 2`` those at that ``vpp``; the EP-overlap ones only with MoE layers and EP > 1 (Megatron's)."""
    skip = () if model.has_moe and parallel.ep > 1 else OVERLAPPED_SCHEDULES
    if parallel.vpp > 1:
        return [(name, parallel.vpp) for name in VIRTUAL_SCHEDULES if name not in skip]
    out = [(name, 1) for name in AUTO_SCHEDULES if name not in skip]
    if parallel.pp > 1 and parallel.pp * AUTO_VPP <= model.num_layers:
        out += [(name, AUTO_VPP) for name in VIRTUAL_SCHEDULES if name not in skip]
    return out


def _auto_schedule(model, parallel, cluster, **kwargs) -> Plan:
    """``schedule="auto"``: plan every ``(schedule, vpp)`` of :func:`auto_candidates`, keep the fastest that fits
    memory; each trial is recorded in ``Plan.schedule_trials`` (``schedule``, ``vpp``, ``iteration_time_s`` and
    ``fits_memory``, or ``error``: the full first line of the refusal, with ``fits_memory`` False when the refusal
    is that no partition fits memory). Each trial's ILP gets ``limit`` when it is
    an :class:`~tessera_lab.plan.ilp.IlpBudget`, :data:`AUTO_ILP_BUDGET` when it is None, and
    ``min(limit, AUTO_TIME_LIMIT_S)`` seconds when it is seconds."""
    limit = kwargs.get("limit")
    kwargs["limit"] = (AUTO_ILP_BUDGET if limit is None else limit if isinstance(limit, IlpBudget)
                       else min(limit, AUTO_TIME_LIMIT_S))
    trials, plans = [], []
    for name, vpp in auto_candidates(model, parallel):
        try:
            pl = make_plan(model, parallel.replace(schedule=name, vpp=vpp), cluster, **kwargs)
        except TesseraError as exc:
            # a memory refusal (no partition fits) is a plan that does not fit: fits_memory False
            memory = isinstance(exc, InfeasiblePlanError) and not str(exc).startswith(LAYER_COUNT_REFUSAL)
            trials.append({"schedule": name, "vpp": vpp, "error": str(exc).splitlines()[0],
                           **({"fits_memory": False} if memory else {})})
            continue
        trials.append({"schedule": name, "vpp": vpp, "iteration_time_s": pl.chosen.iteration_time_s,
                       "fits_memory": pl.chosen.fits_memory, "boundaries": pl.chosen.partition.boundaries,
                       "host_sync_s": pl.host_sync_added_s})
        if pl.chosen.fits_memory:
            plans.append(pl)

    def label(t):
        return t["schedule"] + (f" vpp {t['vpp']}" if t["vpp"] > 1 else "")

    if not plans:
        errors = [(label(t), t.get("error", "exceeds memory")) for t in trials]
        # each refusal's advice (after its first '; ') once, in order, less the schedule advice (all were tried);
        # more pipeline stages of a one-chunk schedule are more pipeline ranks, as the interleaved advice says
        advice = list(dict.fromkeys(without_schedule_hint(e.split("; ", 1)[1]).replace(
            "add pipeline stages, ", "add pipeline ranks, ") for _, e in errors if "; " in e))
        raise PartitionError(AUTO_REFUSAL + "; ".join(
            f"{name}: {e.split('; ', 1)[0]}" for name, e in errors) + (AUTO_ADVICE + "; ".join(advice)
                                                                          if advice else ""))
    best = min(plans, key=lambda pl: pl.chosen.iteration_time_s)
    best.schedule_trials = trials
    best.notes.append("schedule auto: " + ", ".join(
        f"{label(t)} {t['iteration_time_s']:.4f} s" if "iteration_time_s" in t else f"{label(t)} refused"
        for t in trials) + f"; kept {label({'schedule': best.parallel.schedule, 'vpp': best.parallel.vpp})}"
        f" (ILP limit {limit_text(kwargs['limit'])} per schedule)")
    return best
