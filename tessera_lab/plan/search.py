"""Parallel-configuration search: every layout Megatron-Core can run for a model on N GPUs, pruned by memory and by
a lower bound on the iteration, the survivors planned by :func:`tessera_lab.plan.make.make_plan` (the planner of
``tessera-lab plan``: overlap-aware partition, schedule simulation, objective ``auto``).

Dimensions (:class:`~tessera_lab.plan.search_space.Layout`, enumerated by
:func:`~tessera_lab.plan.search_space.enumerate_layouts`): TP (dividing every head count and the GPUs of a node;
sequence parallel on), EP (dividing the routed experts; expert TP 1; with TP > 1 the EP group either sits on one TP
rank, or spans the TP ranks as Megatron's expert grid allows, ``ep_spans_tp``), CP (:func:`cp_choices`; the EP groups
span the CP ranks as Megatron-Core's expert grid does), PP with VPP, the data-parallel replicas with the distributed
optimizer or Megatron FSDP, micro-batch size and count making the global batch, recompute (none, selective with
this project's default module set (core_attn, moe_act) or a listed one, full), schedule (the EP-overlap ones only
where Megatron-Core's ``TransformerConfig`` accepts them, :func:`overlap_rule_breaks`) and dispatcher.

Pruning, in this order (counts per rule in :class:`SearchResult`):

* ``rules``: structural (world size, divisibility, ``m >= pp``, ``m`` a multiple of ``pp`` for the interleaved
  schedules as Megatron-Core requires, ``pp x vpp`` at most the layers);
* ``memory``: a lower bound on the busiest rank's memory over every partition (:func:`memory_lower_bound`) above
  the GPU's capacity;
* ``bound``: the candidates are planned in increasing order of a lower bound on the iteration
  (:func:`time_lower_bound`); once ``top`` plans are known, a candidate whose bound is not below the ``top``-th
  best planned iteration is never planned (nor any later one: the order is by bound).

Both bounds are computed from the per-layer costs and memory of :mod:`tessera_lab.plan.stages` (one decomposition
per group of layouts that share TP, CP, EP, micro-batch size, recompute and dispatcher: those costs do not see PP, DP,
VPP or the schedule), so a pruned candidate costs microseconds and a planned one a full planner run.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from tessera_lab.cost.memory import memory_capacity
from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.model.hardware import Cluster, selective_modules
from tessera_lab.model.spec import ModelSpec
from tessera_lab.plan.ilp import IlpBudget
from tessera_lab.plan.make import make_plan
# the search space (layouts, what is enumerated) lives in search_space; its names are the search's too
from tessera_lab.plan.search_space import (Layout, cp_choices, enumerate_layouts, fewest_gpus,  # noqa: F401
                                            gpu_count_ok, gpu_counts_above, gpu_step, overlap_rule_breaks,
                                            nearest_global_batch, param_key, param_memory_bytes, param_shares,
                                            recompute_choices,
                                            too_few_gpus, tp_choices)
from tessera_lab.plan.search_bounds import (  # noqa: F401  (the search's bounds, re-exported for its callers)
    SPLIT_SCHEDULES, _Bounds, _Group, _group, bubble_factor, kind_tasks, memory_lower_bound, time_lower_bound)

#: candidates planned between two updates of the pruning threshold (fixed, so that ``jobs`` never changes which
#: candidates are planned)
BATCH = 8
#: the planner options the search plans with: ``plan``'s defaults except the partition method (the exact DP; the
#: ILP finds the same optimum, more slowly) and the baselines: the uniform one only (``plan`` also balances on
#: standalone times and on parameter bytes, two more DP solves and simulations; the search's other candidates are
#: its comparison)
PLAN_OPTIONS = {"method": "dp", "objective": "auto", "baselines": ("uniform",)}
#: the partition method with virtual stages (the DP balances one stage at a time; a rank sums non-adjacent chunks)
#: and its limit per solve: a deterministic work budget, never a wall-clock limit, so that the ranking does not move
#: with the machine's load (at the budget the planner keeps the better of the ILP's incumbent and its heuristic plan,
#: and says so in the row's ``solver_status``). Measured on the acceptance search (docs/search.md): HiGHS' root node
#: alone costs 0.03-0.6 CPU s on its 1,194-4,500-binary models (48 layers on 8-16 virtual stages) and finds no plan
#: there; the budget solves the small models only, within a few hundredths of a CPU second each.
VIRTUAL_METHOD = "ilp"
VIRTUAL_ILP_BUDGET = IlpBudget(max_binaries=400, max_nodes=10)


@dataclass
class Candidate:
    """A layout with its bounds and, once planned, the planner's result (``plan`` keys as :meth:`as_dict`)."""

    layout: Layout
    lower_bound_s: float
    memory_bound_bytes: float
    result: dict[str, Any] | None = None
    #: whether ``lower_bound_s`` is :meth:`~tessera_lab.plan.search_bounds._Bounds.tight_time` (set when the search
    #: reaches the candidate, which it does in the order of :meth:`~tessera_lab.plan.search_bounds._Bounds.time`)
    tight_bound: bool = False

    def as_dict(self, moe: bool = True) -> dict[str, Any]:
        """The layout's fields (``recompute_modules``: the modules recomputed as planned, the default set written out
        for a bare ``selective``, less the MoE ones where ``moe`` is false), its bounds and the planner's result."""
        lay = self.layout
        return {**asdict(lay), "recompute_modules": list(selective_modules(lay.recompute, lay.recompute_modules, moe)),
                "lower_bound_s": self.lower_bound_s,
                "memory_bound_gib": self.memory_bound_bytes / 2**30, **(self.result or {})}


@dataclass
class SearchResult:
    """What :func:`search` found: every planned candidate (fastest first), counts of enumerated, pruned (by rule)
    and planned layouts, and the CPU seconds spent."""

    model: str
    gpus: int
    gpu: str
    seq_len: int
    global_batch: int
    top: int
    planned: list[Candidate]
    enumerated: int
    pruned: dict[str, int]
    errors: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    memory_capacity_bytes: float = 0.0
    #: planner refusals counted by what they prove (:func:`refusal_kind`), most frequent first
    error_kinds: dict[str, int] = field(default_factory=dict)
    #: smallest time bound among the candidates left unplanned at the ``max_plans`` budget (None: none left)
    unplanned_bound_s: float | None = None
    #: CPU seconds of the planner processes (``jobs > 1``; ``getrusage(RUSAGE_CHILDREN)``), beside ``cpu_s`` (this
    #: process's)
    children_cpu_s: float = 0.0
    #: whether the model has MoE layers (EP and the dispatcher mean something)
    moe: bool = True
    #: the largest context-parallel size among the layouts considered
    max_cp: int = 1
    #: GiB per GPU held back from the HBM (the cluster's reserve: the caller's or the data file's)
    memory_reserve_gib: float = 0.0
    #: whether the caller gave that reserve (``search(memory_reserve_gib=...)``), not the data file
    memory_reserve_given: bool = False
    #: where no planned layout fits: the fewest GPUs above ``gpus`` (up to 4x, at most 64 GPU steps more) at which some
    #: layout passes both memory bounds (:func:`~tessera_lab.plan.search_space.fewest_gpus`), ``None`` when none does or layouts were given
    fewest_fitting_gpus: int | None = None

    @property
    def planned_per_cpu_s(self) -> float:
        """Full planner runs per CPU second of the whole search (this process and its planner processes)."""
        return len(self.planned) / max(self.cpu_s + self.children_cpu_s, 1e-9)

    @property
    def settled(self) -> int:
        """Layouts the search decided: planned, or ruled out by a rule that is a proof (parameter memory, the memory
        bound, the time bound); those left at the ``max_plans`` budget (``pruned["budget"]``) are not settled."""
        return len(self.planned) + sum(v for k, v in self.pruned.items() if k != "budget")

    @property
    def settled_per_cpu_s(self) -> float:
        """:attr:`settled` layouts per CPU second of the whole search (this process and its planner processes)."""
        return self.settled / max(self.cpu_s + self.children_cpu_s, 1e-9)

    @property
    def ranked(self) -> list[Candidate]:
        """Planned candidates that fit memory, fastest first (ties by layout, deterministic)."""
        ok = [c for c in self.planned if c.result and c.result["fits"]]
        return sorted(ok, key=lambda c: (c.result["iteration_time_s"], c.layout))

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "gpus": self.gpus, "gpu": self.gpu, "seq_len": self.seq_len,
                "global_batch_sequences": self.global_batch, "global_batch_tokens": self.global_batch * self.seq_len,
                "top": self.top, "enumerated": self.enumerated, "pruned": self.pruned,
                "evaluated": len(self.planned), "planner_errors": self.errors, "cpu_s": self.cpu_s,
                "children_cpu_s": self.children_cpu_s, "planned_per_cpu_s": self.planned_per_cpu_s,
                "settled": self.settled, "unsettled": self.pruned.get("budget", 0),
                "settled_per_cpu_s": self.settled_per_cpu_s,
                "memory_capacity_gib": self.memory_capacity_bytes / 2**30,
                "memory_reserve_gib": self.memory_reserve_gib,
                "unplanned_bound_s": self.unplanned_bound_s,
                "candidates": [c.as_dict(self.moe) for c in self.ranked]
                + [c.as_dict(self.moe) for c in self.planned if not (c.result and c.result["fits"])]}


def refusal_kind(exc: Exception) -> str:
    """What a planner refusal proves, by its type: ``no partition fits memory (proven)``
    (:class:`~tessera_lab.errors.InfeasiblePlanError`), ``ILP work budget reached with no plan that fits (not
    proven infeasible)`` (:class:`~tessera_lab.errors.SolverLimitError`), else the message up to its first ``:``."""
    from tessera_lab.errors import InfeasiblePlanError, SolverLimitError

    if isinstance(exc, InfeasiblePlanError):
        return "no partition fits memory (proven)"
    if isinstance(exc, SolverLimitError):
        return "ILP work budget reached with no plan that fits (not proven infeasible)"
    return str(exc).split(":", 1)[0].strip()


def _search_words(exc: TesseraError) -> str:
    """The refusal's first line, its advice in the search's terms: the search has no ILP limit options (it solves
    every layout at :data:`VIRTUAL_ILP_BUDGET`), so an ILP limit is raised by planning that layout alone."""
    from tessera_lab.errors import SolverLimitError

    line = str(exc).splitlines()[0]
    if isinstance(exc, SolverLimitError) and "; allowed:" in line:
        b = VIRTUAL_ILP_BUDGET
        line = (f"{line.split('; allowed:', 1)[0]}; the search solves every layout at a fixed ILP work budget "
                f"({b.max_binaries} binaries, {b.max_nodes} nodes); allowed: this layout planned alone with "
                "tessera-lab plan and a larger --ilp-max-binaries / --ilp-max-nodes or a --time-limit")
    return line


def plan_layout(model: ModelSpec, layout: Layout, seq_len: int, cluster: Cluster,
                boundaries: list[int] | None = None) -> dict[str, Any]:
    """Plan one layout with the planner of ``tessera-lab plan`` (:data:`PLAN_OPTIONS`); the row the search writes
    (``tokens_per_s``, ``iteration_time_s``, ``mfu``, ``peak_memory_gib``, ``fits``, ...) or ``{"error": line}``.
    ``boundaries``: a fixed pipeline split (``pp * vpp + 1`` layer boundaries, e.g. Megatron's embedding/loss-accounted
    one, :func:`~tessera_lab.plan.stages.accounted_boundaries`) instead of the planner's partition."""
    try:
        opts = dict(PLAN_OPTIONS, **({"method": VIRTUAL_METHOD, "limit": VIRTUAL_ILP_BUDGET}
                                     if layout.vpp > 1 else {}))
        if boundaries is not None:
            opts.update(method="uniform", baselines=(), boundaries=boundaries)
        pl = make_plan(model, layout.parallel(seq_len), cluster, **opts)
    except TesseraError as exc:
        return {"error": _search_words(exc), "error_kind": refusal_kind(exc), "fits": False}
    ev = pl.chosen
    peak = max(ev.rank_memory(layout.pp))
    return {"iteration_time_s": ev.iteration_time_s, "tokens_per_s": ev.tokens_per_s, "mfu": ev.mfu,
            "bubble_fraction": ev.bubble_fraction, "peak_memory_gib": peak / 2**30,
            "headroom_gib": (pl.memory_capacity_bytes - peak) / 2**30, "fits": bool(ev.fits_memory),
            "slowest_stage_ms": max(st.time_s for st in ev.stages) * 1e3,
            "boundaries": list(ev.partition.boundaries), "solver_status": ev.partition.status or "Optimal",
            "cpu_s": pl.timing.get("cpu_s", 0.0)}


def _plan_batch(args) -> list[dict[str, Any]]:
    model, layouts, seq_len, cluster = args
    return [plan_layout(model, lay, seq_len, cluster) for lay in layouts]


def search_cluster(gpu: str, gpus: int, memory_reserve_gib: float | None = None) -> Cluster:
    """The cluster a search of ``gpus`` GPUs of type ``gpu`` plans on: the fewest NVLink domains holding them (as
    :func:`~tessera_lab.model.hardware.cluster_for` gives ``plan``), a partial last domain when ``gpus`` is not a
    multiple of the domain (16 GB200 GPUs: one NVL72 rack, 16 of its GPUs used); ``memory_reserve_gib`` as
    :attr:`~tessera_lab.model.hardware.Cluster.memory_reserve_gib`."""
    from tessera_lab.model.hardware import GPUSpec

    return Cluster.dgx(gpu, max(1, -(-gpus // GPUSpec.named(gpu).nvlink_domain)), memory_reserve_gib)


def memory_bound_of(model: ModelSpec, seq_len: int, cluster: Cluster) -> Callable[[Layout], float]:
    """The search's lower bound on a layout's busiest rank memory (bytes: parameter state and saved activations,
    :func:`memory_lower_bound`) on ``cluster``, for a caller that names GPU counts as the search does
    (:func:`~tessera_lab.plan.search_space.fewest_gpus`)."""
    return _Bounds(model, seq_len, cluster).memory


def with_gpu_count(exc: Exception, model: ModelSpec, parallel, cluster: Cluster,
                   command: str | None = None) -> Exception | None:
    """A memory refusal of :func:`~tessera_lab.plan.make.make_plan` (one schedule's, or ``--schedule auto``'s) whose
    layout's GPUs cannot hold the model's parameter state in any layout: the refusal's finding with the GPU count
    that could (:func:`~tessera_lab.plan.search_space.parameter_state_hint`, at the search's default global batch
    and with its memory bound) in place of its advice, which recompute, schedule or sequence cannot make true; a new
    exception of the same type. ``None`` for any other error, or where some layout of those GPUs holds the state.
    ``command``: the search command to name (``plan``'s), ``None`` in a panel."""
    from tessera_lab.errors import InfeasiblePlanError
    from tessera_lab.plan.make import AUTO_ADVICE, AUTO_REFUSAL
    from tessera_lab.plan.problem import without_advice
    from tessera_lab.plan.search_space import parameter_state_hint

    text = str(exc)
    auto = text.startswith(AUTO_REFUSAL)
    if not (isinstance(exc, InfeasiblePlanError) or auto):
        return None
    hint = parameter_state_hint(model, parallel.world_size, DEFAULT_GLOBAL_SEQUENCES, parallel.seq_len,
                                cluster.gpu.nvlink_domain, memory_capacity(cluster),
                                memory_bound_of(model, parallel.seq_len, cluster), command)
    if not hint:
        return None
    return type(exc)((text.split(AUTO_ADVICE, 1)[0] if auto else without_advice(text)) + hint)


def plan_or_gpu_count(model: ModelSpec, parallel, *, gpu: str, **opts):
    """:func:`~tessera_lab.plan.make.make_plan` of ``model`` on ``parallel`` (``gpu``; ``opts`` as make_plan's);
    a refusal for GPUs too few for the parameter state raised as :func:`with_gpu_count` words it (no command: a
    panel's).

    Raises:
        PartitionError / ConfigError: as make_plan."""
    from tessera_lab.errors import PartitionError
    from tessera_lab.model.hardware import cluster_for

    try:
        return make_plan(model, parallel, gpu=gpu, **opts)
    except PartitionError as exc:
        counted = with_gpu_count(exc, model, parallel, cluster_for(parallel, gpu))
        if counted is None:
            raise
        raise counted from None


def check_search_inputs(model: ModelSpec, gpus: int, seq_len: int, global_batch_tokens: int,
                        cluster_node: int) -> int:
    """The global batch in sequences, after the checks ``search`` makes before any work.

    Raises:
        ConfigError: ``gpus`` not a count :func:`gpu_count_ok` accepts (a multiple of :func:`gpu_step` of the NVLink
            domain ``cluster_node``, or part of one node), or a global
            batch that is not a whole number of sequences of ``seq_len`` tokens.
    """
    step = gpu_step(cluster_node)
    if not gpu_count_ok(gpus, cluster_node):
        part = ", ".join(str(n) for n in range(1, step) if step % n == 0)
        allowed = (f"{part} (part of one node) or a multiple of the {cluster_node} GPUs of an NVLink domain (a node; "
                   f"whole nodes)" if step == cluster_node else
                   f"{part} (part of one node) or a multiple of {step} GPUs: {step}, {2 * step}, ..., {cluster_node} "
                   f"inside one NVLink domain of {cluster_node}, or several domains, the last one partial")
        below = max([n for n in range(1, gpus) if gpu_count_ok(n, cluster_node)], default=None)
        above = gpu_counts_above(gpus, cluster_node, gpus + step)[0]
        near = [n for n in (below, above) if n is not None]
        raise ConfigError(f"--gpus = {gpus} is out of range; allowed: {allowed} (nearest: "
                          f"{' or '.join(str(n) for n in near)})")
    if global_batch_tokens < seq_len or global_batch_tokens % seq_len:
        raise ConfigError(f"--global-batch-tokens = {global_batch_tokens:,} is not a whole number of sequences of "
                          f"--seq-len {seq_len:,} tokens; allowed: a multiple of {seq_len:,}"
                          f"{_batch_example(model, gpus, global_batch_tokens / seq_len, cluster_node, seq_len)}")
    return global_batch_tokens // seq_len


def _batch_example(model: ModelSpec, gpus: int, sequences: float, node: int, seq_len: int) -> str:
    """' (nearest that some layout makes: N tokens, k sequences; ...)', or '' when no layout structure exists. The
    nearest may suit few layouts (244 sequences on 256 GPUs: only data-parallel sizes dividing 244), so the nearest
    multiple of the GPU count, which every layout's data-parallel size divides, is named beside it when it differs."""
    k = nearest_global_batch(model, gpus, sequences, gpus_per_node=node, seq_len=seq_len)
    if k is None:
        return ""
    text = (f" (nearest that a micro-batching of {gpus} GPUs makes: {k * seq_len:,}, "
            f"{k:,} sequence{'s' if k != 1 else ''}")
    every = max(1, round(sequences / gpus)) * gpus
    if every != k:
        text += (f"; the nearest multiple of the {gpus} GPUs, which every layout's data-parallel size divides: "
                 f"{every * seq_len:,}, {every:,} sequences")
    return text + ")"


#: default global batch, in sequences of ``--seq-len``
DEFAULT_GLOBAL_SEQUENCES = 1024


def _first_pass(model: ModelSpec, layouts: list[Layout], seq_len: int, capacity: float,
                bounds: _Bounds) -> tuple[list[Candidate], int, float]:
    """Candidates that pass the parameter-memory rule with their time bounds, sorted by bound (ties by layout);
    the count pruned by the rule and the lightest parameter share per GPU seen (bytes)."""
    params = param_shares(model, layouts, seq_len)
    out, pruned, lightest = [], 0, min(params.values(), default=math.inf)
    for lay in layouts:
        if params[param_key(lay)] > capacity:
            pruned += 1
            continue
        out.append(Candidate(lay, bounds.time(lay), 0.0))
    out.sort(key=lambda c: (c.lower_bound_s, c.layout))
    return out, pruned, lightest


def _structure(lay: Layout) -> tuple:
    return (lay.tp, lay.cp, lay.ep, lay.ep_spans_tp, lay.pp, lay.dp)


def _canonical_first(cands: list[Candidate], bounds: _Bounds, capacity: float) -> list[Candidate]:
    """The candidates reordered: first, per structure (TP, CP, EP, PP, DP) in bound order, its plain layout
    (micro-batch size 1, alltoall, the default module set; the distributed optimizer, else Megatron FSDP where only
    FSDP's sharding fits; the lightest recompute whose memory bound fits, and of those the schedule with the smallest
    bound), so that every structure that fits is planned once before the knobs of the best ones: those that fit with
    the distributed optimizer in bound order, then those that fit only with FSDP; then the rest in bound order
    (``cands`` are in bound order)."""
    order = {"none": 0, "selective": 1, "full": 2}
    best: dict[tuple, Candidate] = {}
    for c in cands:
        lay = c.layout
        if lay.micro_batch_size != 1 or lay.dispatcher != "alltoall" or lay.recompute_modules:
            continue
        k = _structure(lay)
        have = best.get(k)
        if have is not None and ((have.layout.fsdp, order[have.layout.recompute])
                                 <= (lay.fsdp, order[lay.recompute])):
            continue
        c.memory_bound_bytes = bounds.memory(lay)
        if c.memory_bound_bytes <= capacity:
            best[k] = c
    # the structures that fit with the distributed optimizer first: an FSDP-only one is the nearer to its memory
    # bound, so more often refused by the planner
    first = sorted(best.values(), key=lambda c: (c.layout.fsdp, c.lower_bound_s, c.layout))
    chosen = {id(c) for c in first}
    return first + [c for c in cands if id(c) not in chosen]


def _threshold(planned: list[Candidate], top: int) -> float:
    """The ``top``-th best planned iteration among the candidates that fit (infinite while fewer fit)."""
    times = sorted(c.result["iteration_time_s"] for c in planned if c.result and c.result["fits"])
    return times[top - 1] if len(times) >= top else math.inf


def _next_batch(cands: list[Candidate], i: int, threshold: float, bounds: _Bounds, capacity: float,
                skipped: list[Candidate]) -> tuple[list[Candidate], int]:
    """Up to :data:`BATCH` candidates to plan from position ``i`` on; those whose memory bound exceeds the
    capacity are passed over (their ``memory_bound_bytes`` says so), those whose time bound reaches ``threshold``
    are appended to ``skipped``, first the bound they were sorted by, then, once reached, their tight bound
    (:meth:`~tessera_lab.plan.search_bounds._Bounds.tight_time`, built only for the candidates reached; the order
    stays that of the first bound, since the tight one leaves out the pipeline bubble of virtual stages and would
    put layouts with a large bubble first). Returns the batch and the next position."""
    batch = []
    while len(batch) < BATCH and i < len(cands):
        c = cands[i]
        i += 1
        if c.result is not None:
            continue
        if c.lower_bound_s >= threshold:
            skipped.append(c)
            continue
        if not c.memory_bound_bytes:
            c.memory_bound_bytes = bounds.memory(c.layout)
        if c.memory_bound_bytes > capacity:
            continue
        if not c.tight_bound:  # the bound from the layout's own costs, built only for the candidates reached
            c.tight_bound, c.lower_bound_s = True, bounds.tight_time(c.layout)
            if c.lower_bound_s >= threshold:
                skipped.append(c)
                continue
        batch.append(c)
    return batch, i


#: full planner runs a search makes at most by default (about 0.06-0.1 CPU s each)
DEFAULT_MAX_PLANS = 210


# params: one per 'tessera-lab search' flag (keyword-only after the GPU count), plus the progress hook and the layouts
def search(model: ModelSpec, gpus: int, *, gpu: str = "H200", seq_len: int = 4096,
           global_batch_tokens: int | None = None, top: int = 10, jobs: int = 1, max_plans: int = DEFAULT_MAX_PLANS,
           progress: Callable[[int, int], None] | None = None, layouts: Sequence[Layout] | None = None,
           memory_reserve_gib: float | None = None) -> SearchResult:
    """Search the layouts of ``model`` on ``gpus`` GPUs of type ``gpu`` (module docstring).

    Args:
        global_batch_tokens: tokens per iteration (default :data:`DEFAULT_GLOBAL_SEQUENCES` sequences).
        top: how many of the best plans the bound pruning keeps exact (the ``top``-th best sets its threshold in
            the second planning pass; #1 comes from the first, which prunes against the best plan whatever ``top``).
        jobs: processes planning candidates at once (the same candidates are planned, and the same result
            returned, for any ``jobs``).
        max_plans: full planner runs; candidates are planned in batches of up to 8 and planning stops at the first
            batch that reaches the budget, so up to 7 more are planned (a batch is short where a pass runs out of
            candidates); candidates left then are counted as ``budget`` with the smallest
            bound among them (:attr:`SearchResult.unplanned_bound_s`).
        progress: called with (candidates looked at, candidates after the parameter-memory rule).
        layouts: the layouts to consider instead of :func:`enumerate_layouts`' (tests, studies).
        memory_reserve_gib: GiB per GPU held back from the HBM every layout may fill (``None``: the data file's
            reserve, :func:`~tessera_lab.cost.memory.memory_reserve_gib`).

    Raises:
        ConfigError: bad ``gpus`` or global batch (:func:`check_search_inputs`), a global batch no micro-batching
            of the GPUs makes; :class:`~tessera_lab.errors.TooFewGPUsError` (a ConfigError) GPUs too few for the
            model's parameters in any layout, with the fewest that hold them as ``needed``.
    """
    t0 = time.process_time()
    from tessera_lab.model.hardware import GPUSpec

    node = GPUSpec.named(gpu).nvlink_domain
    seqs = check_search_inputs(model, gpus, seq_len, global_batch_tokens or DEFAULT_GLOBAL_SEQUENCES * seq_len,
                               node)
    cluster = search_cluster(gpu, gpus, memory_reserve_gib)
    capacity = memory_capacity(cluster)
    layouts_given = layouts
    if layouts is None:
        layouts = enumerate_layouts(model, gpus, seqs, gpus_per_node=node, seq_len=seq_len)
    if not layouts:
        raise ConfigError(f"--global-batch-tokens = {seqs * seq_len:,} ({seqs:,} sequence{'s' if seqs != 1 else ''})"
                          f" cannot be split over {gpus} GPUs by any micro-batching; allowed: a multiple of "
                          f"{seq_len:,} tokens whose sequence count the data-parallel replicas divide"
                          f"{_batch_example(model, gpus, seqs, node, seq_len)}")
    bounds = _Bounds(model, seq_len, cluster)
    cands, by_params, lightest = _first_pass(model, list(layouts), seq_len, capacity, bounds)
    if not cands:
        raise too_few_gpus(model, gpus, seqs, seq_len, node, capacity, lightest, bounds.memory)
    cands = _canonical_first(cands, bounds, capacity)
    children = _children_cpu_s()
    planned, rest = _plan_all(cands, bounds, capacity, (top, jobs, max_plans), progress)
    over = sum(1 for c in cands if c.result is None and c.memory_bound_bytes > capacity)
    pruned = {"memory (parameter state)": by_params, "memory": over,
              "bound": len(cands) - len(planned) - over - len(rest), "budget": len(rest)}
    errors: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for c in planned:
        if "error" in c.result:
            errors[c.result["error"]] = errors.get(c.result["error"], 0) + 1
            kinds[c.result["error_kind"]] = kinds.get(c.result["error_kind"], 0) + 1
    res = SearchResult(model.name, gpus, cluster.gpu.name, seq_len, seqs, top, planned, len(layouts), pruned,
                       errors=errors, cpu_s=time.process_time() - t0, memory_capacity_bytes=capacity)
    res.error_kinds = dict(sorted(kinds.items(), key=lambda kv: -kv[1]))
    res.children_cpu_s = _children_cpu_s() - children
    res.unplanned_bound_s = min((c.lower_bound_s for c in rest), default=None)
    res.moe, res.max_cp = model.has_moe, max(lay.cp for lay in layouts)
    from tessera_lab.cost.memory import cluster_reserve_gib

    res.memory_reserve_gib, res.memory_reserve_given = cluster_reserve_gib(cluster), memory_reserve_gib is not None
    if not res.ranked and layouts_given is None:  # nothing fits: the fewest GPUs at which some layout could
        got = fewest_gpus(model, gpus, seqs, seq_len, node, capacity, min(4 * gpus, gpus + 64 * gpu_step(node)),
                          bounds.memory)
        res.fewest_fitting_gpus = got[0] if got else None
    return res


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's finished (waited-for) child processes (``getrusage``)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _plan_all(cands, bounds: _Bounds, capacity: float, limits: tuple[int, int, int],
              progress) -> tuple[list[Candidate], list[Candidate]]:
    """Plan the candidates in order, batch by batch, updating the pruning threshold between batches (``limits``:
    top, jobs, max_plans), in two passes: the first prunes against the best planned iteration (so the budget finds
    #1 whatever ``top``), the second, with the budget left, plans the candidates the first passed over whose bound
    is below the ``top``-th best. Returns the planned candidates and those left unplanned at ``max_plans`` whose bound
    is below the ``top``-th best (neither pruned by memory nor planned). Memory-pruned candidates keep their
    ``memory_bound_bytes`` above ``capacity`` and no result."""
    top, jobs, max_plans = limits
    planned: list[Candidate] = []
    pool = None
    if jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork"))
    try:
        skipped: list[Candidate] = []
        _plan_pass(cands, bounds, capacity, planned, (1, pool, jobs, max_plans), skipped, progress)
        if top > 1:
            again = [c for c in skipped if c.lower_bound_s < _threshold(planned, top)]
            _plan_pass(again, bounds, capacity, planned, (top, pool, jobs, max_plans), [], None)
    finally:
        if pool is not None:
            pool.shutdown()
    threshold = _threshold(planned, top)
    rest = [c for c in cands if c.result is None and c.lower_bound_s < threshold and
            not c.memory_bound_bytes > capacity]
    return planned, rest


def _plan_pass(cands, bounds: _Bounds, capacity: float, planned: list[Candidate], limits: tuple,
               skipped: list[Candidate], progress) -> None:
    """One pass of :func:`_plan_all` over ``cands`` (``limits``: top, process pool or None, its processes,
    max_plans), appending
    to ``planned`` and to ``skipped`` (passed over by the bound)."""
    top, pool, jobs, max_plans = limits
    model, seq_len, cluster = bounds.model, bounds.seq_len, bounds.cluster
    i = 0
    while i < len(cands) and len(planned) < max_plans:
        batch, i = _next_batch(cands, i, _threshold(planned, top), bounds, capacity, skipped)
        if pool is None or len(batch) < 2:
            rows = [plan_layout(model, c.layout, seq_len, cluster) for c in batch]
        else:
            parts = [batch[k::jobs] for k in range(jobs)]
            outs = list(pool.map(_plan_batch, [(model, [c.layout for c in part], seq_len, cluster)
                                               for part in parts]))
            done = {id(c): r for part, out in zip(parts, outs) for c, r in zip(part, out)}
            rows = [done[id(c)] for c in batch]
        for c, r in zip(batch, rows):
            c.result = r
        planned += batch
        if progress is not None:
            progress(i, len(cands))
