"""Partitioning layers into contiguous pipeline stages: uniform, exact DP and ILP (PuLP).

All methods work on the same *segment costs*: ``cost(s, i, j)`` is the time per micro-batch of stage
``s`` owning layers ``i .. j-1`` (seconds; this lets a stage's cost depend on its layers jointly, e.g.
after overlap, and on its index, e.g. the embedding on the first stage and the LM head on the last).
An optional ``memory(s, i, j)`` in bytes with a ``memory_limit`` excludes segments that do not fit.

Objectives:
    ``bottleneck``: minimise the slowest stage ``max_s cost_s``.
    ``schedule``: minimise ``sum_s cost_s + (m - 1) * max_s cost_s`` (the 1F1B iteration-time shape).
Tie-break (both methods, second pass): among optimal plans, the smallest ``sum_s cost_s^2`` (the
smallest spread).

The ILP uses one binary per feasible (stage, segment) pair, linked as a path from layer 0 to layer L
(flow conservation between consecutive stages); segments that cannot be in an optimal plan because
their cost already exceeds a known feasible plan's objective are left out. Solver: HiGHS through
``highspy`` when installed, else CBC; always with a time limit. The exact DP over the same costs is
the cross-check and the fallback when no solver is available.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from tessera_lab.errors import InfeasiblePlanError, PartitionError

SegmentFn = Callable[[int, int, int], float]
GIB = 2**30


@dataclass(frozen=True)
class PartitionProblem:
    """A contiguous partition problem.

    Attributes:
        num_layers: L (>= 1).
        num_stages: S (1 <= S <= L).
        cost: ``cost(s, i, j)`` seconds per micro-batch of stage s owning layers i..j-1.
        memory: ``memory(s, i, j)`` bytes on stage s, or None (no memory constraint).
        memory_limit: bytes available per GPU (required with ``memory``).
        objective: ``"bottleneck"`` or ``"schedule"``.
        microbatches: m, used by the ``schedule`` objective.
        min_layers / max_layers: per-stage layer-count bounds.
        first_stage_layers / last_stage_layers: pinned layer counts of the first / last stage.
        sum_cost: cost entering the sum term of the ``schedule`` objective (default: ``cost``). The
            planner uses it for overlapped 1F1B, whose warm-up and cool-down run F and B apart (standalone)
            while the steady state runs pairs (``cost``).
        vpp: virtual stages per pipeline rank. ``num_stages`` then counts virtual stages (``p * vpp``);
            virtual stage ``s`` runs on rank ``s % p`` (Megatron-LM's interleaved placement), a rank's
            cost and memory are the sums over its virtual stages, and the objective is taken over ranks.
    """

    num_layers: int
    num_stages: int
    cost: SegmentFn
    memory: SegmentFn | None = None
    memory_limit: float | None = None
    objective: str = "bottleneck"
    microbatches: int = 1
    min_layers: int = 1
    max_layers: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    vpp: int = 1
    sum_cost: SegmentFn | None = None

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise PartitionError(f"field 'layers' = {self.num_layers} is out of range; allowed: >= 1")
        if not 1 <= self.num_stages <= self.num_layers:
            raise PartitionError(
                f"field 'stages' = {self.num_stages} is out of range; allowed: 1 to the number of layers ({self.num_layers})"
            )
        if self.objective not in ("bottleneck", "schedule"):
            raise PartitionError(f"field 'objective' = {self.objective!r} is unknown; allowed: bottleneck, schedule")
        if self.memory is not None and self.memory_limit is None:
            raise PartitionError("field 'memory_limit' is required when a memory function is given")
        if self.min_layers < 1:
            raise PartitionError(f"field 'min_layers' = {self.min_layers} is out of range; allowed: >= 1")
        if self.max_layers is not None and self.max_layers < self.min_layers:
            raise PartitionError(f"field 'max_layers' = {self.max_layers} is out of range; allowed: >= min_layers")
        if self.vpp < 1 or self.num_stages % self.vpp:
            raise PartitionError(
                f"field 'vpp' = {self.vpp} is out of range; allowed: a divisor of the virtual stage count {self.num_stages}"
            )
        if self.microbatches < 1:
            raise PartitionError(f"field 'microbatches' = {self.microbatches} is out of range; allowed: >= 1")

    # ---------------------------------------------------------------- feasibility of one segment
    def length_ok(self, s: int, i: int, j: int) -> bool:
        n = j - i
        if n < self.min_layers or (self.max_layers is not None and n > self.max_layers):
            return False
        if s == 0 and self.first_stage_layers is not None and n != self.first_stage_layers:
            return False
        if s == self.num_stages - 1 and self.last_stage_layers is not None and n != self.last_stage_layers:
            return False
        # room for the other stages: each needs at least min_layers
        if i < s * self.min_layers or self.num_layers - j < (self.num_stages - 1 - s) * self.min_layers:
            return False
        return True

    def memory_ok(self, s: int, i: int, j: int) -> bool:
        return self.memory is None or self.memory(s, i, j) <= self.memory_limit * (1 + 1e-12)

    def segments(self, s: int) -> list[tuple[int, int]]:
        """Feasible (i, j) of stage s (length bounds, pins, memory)."""
        L, S = self.num_layers, self.num_stages
        lo_i = 0 if s == 0 else s * self.min_layers
        hi_i = 0 if s == 0 else L - (S - s) * self.min_layers
        out = []
        for i in range(lo_i, hi_i + 1):
            j_end = L if s == S - 1 else L - (S - 1 - s) * self.min_layers
            j_start = L if s == S - 1 else i + self.min_layers
            for j in range(j_start, j_end + 1):
                if self.length_ok(s, i, j) and self.memory_ok(s, i, j):
                    out.append((i, j))
        return out

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks (``num_stages / vpp``)."""
        return self.num_stages // self.vpp

    def rank_values(self, per_stage: Sequence[float]) -> list[float]:
        """Per-rank sums of per-virtual-stage values (identity when vpp = 1)."""
        out = [0.0] * self.num_ranks
        for s, v in enumerate(per_stage):
            out[s % self.num_ranks] += v
        return out

    def objective_value(self, stage_costs: Sequence[float], sum_costs: Sequence[float] | None = None) -> float:
        """Objective of per-(virtual-)stage costs, taken over ranks (``sum_costs`` default ``stage_costs``)."""
        ranks = self.rank_values(stage_costs)
        if self.objective == "bottleneck":
            return max(ranks)
        total = sum(sum_costs) if sum_costs is not None else sum(ranks)
        return total + (self.microbatches - 1) * max(ranks)

    def summed(self, s: int, i: int, j: int) -> float:
        """The segment's contribution to the sum term of the ``schedule`` objective."""
        return self.sum_cost(s, i, j) if self.sum_cost is not None else self.cost(s, i, j)


@dataclass
class Partition:
    """A partition of layers into stages.

    Attributes:
        boundaries: S + 1 increasing layer indices; stage s owns layers ``boundaries[s] .. boundaries[s+1]-1``.
        stage_costs: seconds per micro-batch of each stage.
        bottleneck: the slowest stage, seconds.
        objective: value of the problem's objective, seconds.
        method: ``uniform``, ``dp``, ``ilp`` (or a baseline name).
        solver / status / gap / solve_time_s / num_variables: ILP bookkeeping (``dp`` reports its own time).
        stage_memory: bytes per stage when a memory model was given.
    """

    boundaries: list[int]
    stage_costs: list[float]
    bottleneck: float
    objective: float
    method: str
    solver: str = ""
    status: str = ""
    gap: float | None = None
    solve_time_s: float = 0.0
    num_variables: int = 0
    stage_memory: list[float] = field(default_factory=list)
    rank_costs: list[float] = field(default_factory=list)
    rank_memory: list[float] = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return len(self.boundaries) - 1

    def stage_layers(self) -> list[list[int]]:
        return [list(range(self.boundaries[s], self.boundaries[s + 1])) for s in range(self.num_stages)]

    def layer_counts(self) -> list[int]:
        return [self.boundaries[s + 1] - self.boundaries[s] for s in range(self.num_stages)]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layer_counts"] = self.layer_counts()
        return d


def _evaluate(problem: PartitionProblem, boundaries: list[int], method: str, **extra) -> Partition:
    S = problem.num_stages
    costs = [problem.cost(s, boundaries[s], boundaries[s + 1]) for s in range(S)]
    mem = [problem.memory(s, boundaries[s], boundaries[s + 1]) for s in range(S)] if problem.memory else []
    ranks = problem.rank_values(costs)
    sums = [problem.summed(s, boundaries[s], boundaries[s + 1]) for s in range(S)] if problem.sum_cost else None
    return Partition(list(boundaries), costs, max(ranks), problem.objective_value(costs, sums), method, stage_memory=mem,
                     rank_costs=ranks, rank_memory=problem.rank_values(mem) if mem else [], **extra)


def uniform_boundaries(num_layers: int, num_stages: int) -> list[int]:
    """Layer counts as even as possible; the earlier stages take the remainder (``[13, 13, 12, 12]``)."""
    if not 1 <= num_stages <= num_layers:
        raise PartitionError(
            f"field 'stages' = {num_stages} is out of range; allowed: 1 to the number of layers ({num_layers})"
        )
    q, r = divmod(num_layers, num_stages)
    b = [0]
    for s in range(num_stages):
        b.append(b[-1] + q + (1 if s < r else 0))
    return b


def check_memory(problem: PartitionProblem, part: Partition) -> None:
    """Raise InfeasiblePlanError naming the first stage over the memory limit and the shortfall in GiB."""
    if problem.memory is None:
        return
    for r, mem in enumerate(part.rank_memory):
        if mem > problem.memory_limit * (1 + 1e-12):
            where = (f"stage {r} (layers {part.boundaries[r]}-{part.boundaries[r + 1] - 1})" if problem.vpp == 1
                     else f"rank {r} (virtual stages {list(range(r, problem.num_stages, problem.num_ranks))})")
            raise InfeasiblePlanError(
                f"{where} needs {mem / GIB:.2f} GiB, "
                f"{(mem - problem.memory_limit) / GIB:.2f} GiB more than the {problem.memory_limit / GIB:.2f} GiB available"
            )


def _infeasible(problem: PartitionProblem) -> InfeasiblePlanError:
    """The error for a problem with no feasible partition: among partitions that satisfy the
    layer-count rules, the one whose worst memory excess is smallest names its worst stage and the
    shortfall in GiB (a min-max DP over memory excess)."""
    if problem.memory is None:
        return InfeasiblePlanError("no partition satisfies the layer-count constraints")
    if problem.vpp > 1:
        return InfeasiblePlanError(
            f"no partition into {problem.num_stages} virtual stages fits {problem.memory_limit / GIB:.2f} GiB on every "
            f"rank; add pipeline ranks, shard further (ep, dp) or shorten the sequence"
        )
    S, L, limit = problem.num_stages, problem.num_layers, problem.memory_limit
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (-math.inf, (0,))}
    for s in range(S):
        nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
        for i, (worst, path) in best.items():
            for j in range(i + 1, L + 1):
                if not problem.length_ok(s, i, j):
                    continue
                v = max(worst, problem.memory(s, i, j) - limit)
                if j not in nxt or v < nxt[j][0]:
                    nxt[j] = (v, path + (j,))
        best = nxt
    if L not in best:
        return InfeasiblePlanError("no partition satisfies the layer-count constraints")
    b = list(best[L][1])
    excess = [problem.memory(s, b[s], b[s + 1]) - limit for s in range(S)]
    s = max(range(S), key=lambda k: excess[k])
    need = excess[s] + limit
    return InfeasiblePlanError(
        f"no partition fits in memory: even the closest one puts stage {s} (layers {b[s]}-{b[s + 1] - 1}) at "
        f"{need / GIB:.2f} GiB, {excess[s] / GIB:.2f} GiB more than the {limit / GIB:.2f} GiB available; "
        f"add pipeline stages, shard further (ep, dp with a distributed optimizer) or shorten the sequence"
    )


def uniform(problem: PartitionProblem) -> Partition:
    """The uniform baseline (layer counts as even as possible), evaluated on the problem's costs."""
    return _evaluate(problem, uniform_boundaries(problem.num_layers, problem.num_stages), "uniform")


# ---------------------------------------------------------------------- exact DP
def solve_dp(problem: PartitionProblem) -> Partition:
    """Exact dynamic program over (stage, end layer), O(S L^2) segment evaluations.

    Bottleneck objective: ``best[s][j] = min_i max(best[s-1][i], cost(s, i, j))``. Schedule objective:
    for every candidate bottleneck value B (a segment cost), minimise the sum of stage costs with all
    stages <= B, and take the best ``sum + (m-1) B``. Then a second pass minimises ``sum cost^2`` among
    plans within 1e-12 (relative) of the optimum.

    Raises:
        InfeasiblePlanError: no partition satisfies memory and layer-count constraints.
    """
    if problem.vpp > 1:
        raise PartitionError("method 'dp' needs vpp = 1 (a rank's cost sums non-adjacent chunks); use method 'ilp'")
    t0 = time.perf_counter()
    S, L = problem.num_stages, problem.num_layers
    seg = [problem.segments(s) for s in range(S)]
    cost = [{(i, j): problem.cost(s, i, j) for i, j in seg[s]} for s in range(S)]
    scost = cost if problem.sum_cost is None else [{(i, j): problem.sum_cost(s, i, j) for i, j in seg[s]} for s in range(S)]

    def min_bottleneck() -> float:
        INF = math.inf
        best = {0: 0.0}
        for s in range(S):
            nxt: dict[int, float] = {}
            for (i, j), c in cost[s].items():
                if i in best:
                    v = max(best[i], c)
                    if v < nxt.get(j, INF):
                        nxt[j] = v
            best = nxt
        return best.get(L, INF)

    def min_sum(cap: float, squared: bool) -> tuple[float, list[int]] | None:
        """Minimise the sum of sum-costs (or of cost^2) with every stage's cost <= cap; returns (value, boundaries)."""
        best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, (0,))}
        for s in range(S):
            nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
            for (i, j), c in cost[s].items():
                if c > cap or i not in best:
                    continue
                v = best[i][0] + (c * c if squared else scost[s][(i, j)])
                if j not in nxt or v < nxt[j][0]:
                    nxt[j] = (v, best[i][1] + (j,))
            best = nxt
        return (best[L][0], list(best[L][1])) if L in best else None

    tol = 1e-12
    if problem.objective == "bottleneck":
        b = min_bottleneck()
        if b is math.inf:
            raise _infeasible(problem)
        res = min_sum(b * (1 + tol) + 1e-300, squared=True)
        assert res is not None
        boundaries = res[1]
    else:
        b_min = min_bottleneck()
        if b_min is math.inf:
            raise _infeasible(problem)
        total_min = min_sum(math.inf, squared=False)[0]
        candidates = sorted({c for cs in cost for c in cs.values() if c >= b_min * (1 - tol)})
        best_obj, best_cap = math.inf, None
        for cap in candidates:
            if total_min + (problem.microbatches - 1) * cap >= best_obj * (1 - tol):
                break  # every larger cap is worse (sum >= total_min)
            res = min_sum(cap * (1 + tol), squared=False)
            if res is None:
                continue
            obj = res[0] + (problem.microbatches - 1) * cap
            if obj < best_obj * (1 - tol):
                best_obj, best_cap = obj, cap
        if best_cap is None:
            raise _infeasible(problem)
        boundaries = min_sum(best_cap * (1 + tol), squared=False)[1]
    part = _evaluate(problem, boundaries, "dp", solver="dp", status="Optimal")
    part.solve_time_s = time.perf_counter() - t0
    return part


# ---------------------------------------------------------------------- ILP
@contextlib.contextmanager
def _native_stdout_silenced():
    """Send file descriptor 1 to /dev/null while a native solver runs (HiGHS prints a banner from C++
    when a solver object is created, before PuLP can switch its output off), so ``--json -`` stays valid and
    notebooks (whose kernels forward fd 1 into cell output) stay clean."""
    try:
        sys.stdout.flush()
    except (AttributeError, ValueError):  # pragma: no cover - a closed or odd stream
        pass
    try:
        saved = os.dup(1)
    except OSError:  # pragma: no cover - no fd 1 at all
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def available_solver(time_limit_s: float, prefer: str | None = None):
    """A PuLP solver: HiGHS (``highspy``) first, CBC second; ``None`` when neither is usable."""
    try:
        import pulp
    except ImportError:  # pragma: no cover - pulp is a hard dependency, but DP still works without it
        return None
    names = [prefer] if prefer else ["HiGHS", "PULP_CBC_CMD"]
    available = set(pulp.listSolvers(onlyAvailable=True))
    for name in names:
        if name in available:
            return pulp.getSolver(name, msg=False, timeLimit=time_limit_s)
    return None


def greedy_upper_bound(problem: PartitionProblem, costs: dict[tuple[int, int, int], float]) -> list[int] | None:
    """A feasible plan from a primal heuristic (used only to prune the ILP, never as its answer).

    For a cap C, walk the stages and give each the longest feasible segment with cost <= C that leaves
    room for the rest; bisect C over the distinct segment costs. Exact for additive costs without
    memory limits (the classical linear-partition probe), a heuristic otherwise. ``None`` if no cap works.
    """
    S, L = problem.num_stages, problem.num_layers
    ends: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for (s, i, j), c in costs.items():
        ends.setdefault((s, i), []).append((j, c))
    for v in ends.values():
        v.sort(reverse=True)

    def probe(cap: float) -> list[int] | None:
        b = [0]
        for s in range(S):
            nxt = next((j for j, c in ends.get((s, b[-1]), []) if c <= cap), None)
            if nxt is None:
                return None
            b.append(nxt)
        return b if b[-1] == L else None

    values = sorted(set(costs.values()))
    lo, hi, best = 0, len(values) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        b = probe(values[mid])
        if b is not None:
            best, hi = b, mid - 1
        else:
            lo = mid + 1
    return best


def _path_bounds(problem: PartitionProblem, costs: dict[tuple[int, int, int], float]):
    """Least sum of stage costs before each (stage, start layer) and after each (stage, end layer):
    forward and backward min-sum DPs over the feasible segments (infinite where unreachable)."""
    S, L = problem.num_stages, problem.num_layers
    fwd = [dict() for _ in range(S + 1)]
    fwd[0][0] = 0.0
    for s in range(S):
        for (s_, i, j), c in costs.items():
            if s_ == s and i in fwd[s] and fwd[s][i] + c < fwd[s + 1].get(j, math.inf):
                fwd[s + 1][j] = fwd[s][i] + c
    bwd = [dict() for _ in range(S + 1)]
    bwd[S][L] = 0.0
    for s in range(S - 1, -1, -1):
        for (s_, i, j), c in costs.items():
            if s_ == s and j in bwd[s + 1] and bwd[s + 1][j] + c < bwd[s].get(i, math.inf):
                bwd[s][i] = bwd[s + 1][j] + c
    return fwd, bwd


def solve_ilp(problem: PartitionProblem, *, time_limit_s: float = 10.0, solver: str | None = None) -> Partition:
    """Integer linear program over (stage, segment) binaries, solved with PuLP.

    Variables ``u[s,i,j]`` (stage s owns layers i..j-1) for feasible segments, ``T`` (bottleneck).
    Constraints: one segment per stage; stage 0 starts at layer 0 and stage S-1 ends at L; stage s+1
    starts where stage s ends (``sum_i u[s,i,k] = sum_j u[s+1,k,j]`` for every k); ``T >= cost_s``.
    Objective: ``T`` or ``sum_s cost_s + (m-1) T``; then, with the objective fixed at its optimum, a
    second solve minimises ``sum_s cost_s^2`` (tie-break to the smaller spread).

    Pruning (exact): a segment of cost c forces the objective >= c (bottleneck) or >= m c (schedule,
    since the sum is at least the max); segments above the objective of a feasible plan found by
    :func:`greedy_upper_bound` (or the uniform plan, whichever is better) are left out. The second pass
    keeps only segments no costlier than the optimal bottleneck.

    Raises:
        InfeasiblePlanError: the ILP is infeasible (memory / layer-count constraints).
        PartitionError: no solver available (use ``solve_dp``) or the time limit hit with no solution.
    """
    import pulp

    t0 = time.perf_counter()
    slv = available_solver(time_limit_s, solver)
    if slv is None:
        raise PartitionError("no ILP solver available (install highspy, or use method 'dp')")
    S, L, m = problem.num_stages, problem.num_layers, problem.microbatches
    all_seg = {(s, i, j): problem.cost(s, i, j) for s in range(S) for i, j in problem.segments(s)}
    if not all_seg:
        raise _infeasible(problem)
    all_sum = all_seg if problem.sum_cost is None else {k: problem.sum_cost(*k) for k in all_seg}
    ub = math.inf
    heuristic = greedy_upper_bound(problem, all_seg) if problem.vpp == 1 else None
    for b in (heuristic, uniform_boundaries(L, S)):
        if b is not None and all((s, b[s], b[s + 1]) in all_seg for s in range(S)):
            keys = [(s, b[s], b[s + 1]) for s in range(S)]
            ub = min(ub, problem.objective_value([all_seg[k] for k in keys], [all_sum[k] for k in keys]))
    # exact pruning: the objective of any plan using segment k is at least lower_bound(k)
    fwd, bwd = _path_bounds(problem, all_sum)

    def lower_bound(k: tuple[int, int, int], c: float) -> float:
        s, i, j = k
        before, after = fwd[s].get(i, math.inf), bwd[s + 1].get(j, math.inf)
        if problem.objective == "bottleneck":
            return c if before < math.inf and after < math.inf else math.inf
        return before + all_sum[k] + after + (m - 1) * c

    def model(seg: dict[tuple[int, int, int], float], phase2_bound: float | None):
        by_stage: dict[int, list] = {s: [] for s in range(S)}
        ending: dict[tuple[int, int], list] = {}
        starting: dict[tuple[int, int], list] = {}
        for k in seg:
            by_stage[k[0]].append(k)
            ending.setdefault((k[0], k[2]), []).append(k)
            starting.setdefault((k[0], k[1]), []).append(k)
        prob = pulp.LpProblem("tessera_partition", pulp.LpMinimize)
        new_var = getattr(prob, "add_variable", None) or (  # PuLP >= 3.3 owns variables per model
            lambda name, lowBound=None, upBound=None, cat="Continuous": pulp.LpVariable(name, lowBound, upBound, cat))
        u = {k: new_var(f"u_{k[0]}_{k[1]}_{k[2]}", 0, 1, cat="Binary") for k in seg}
        T = new_var("T", 0, None)
        stage_cost = {s: pulp.LpAffineExpression([(u[k], seg[k]) for k in by_stage[s]]) for s in range(S)}
        if problem.objective == "bottleneck":
            objective_expr = pulp.LpAffineExpression([(T, 1.0)])
        else:
            objective_expr = pulp.LpAffineExpression([(u[k], all_sum[k]) for k in seg] + [(T, m - 1.0)])
        P = problem.num_ranks
        for s in range(S):
            prob += pulp.LpAffineExpression([(u[k], 1.0) for k in by_stage[s]]) == 1, f"one_segment_{s}"
        for r in range(P):
            chunks = range(r, S, P)
            prob += T >= pulp.lpSum(stage_cost[c] for c in chunks), f"bottleneck_{r}"
            if problem.vpp > 1 and problem.memory is not None:
                prob += (pulp.LpAffineExpression([(u[k], problem.memory(*k)) for c in chunks for k in by_stage[c]])
                         <= problem.memory_limit, f"memory_rank_{r}")
        for s in range(S - 1):
            for k_ in range(L + 1):
                a, b = ending.get((s, k_), []), starting.get((s + 1, k_), [])
                if a or b:
                    prob += (pulp.LpAffineExpression([(u[k], 1.0) for k in a] + [(u[k], -1.0) for k in b]) == 0,
                             f"contiguous_{s}_{k_}")
        if phase2_bound is None:
            prob += objective_expr
        else:
            prob += objective_expr <= phase2_bound, "objective_fixed"
            prob += pulp.LpAffineExpression([(u[k], c * c) for k, c in seg.items()])
        with _native_stdout_silenced():
            prob.solve(slv)
        return pulp.LpStatus[prob.status], prob, u

    seg = {k: c for k, c in all_seg.items() if lower_bound(k, c) <= ub * (1 + 1e-9) + 1e-15}
    status, prob, u = model(seg, None)
    if status == "Infeasible":
        raise _infeasible(problem)
    if status != "Optimal" and not any((v.value() or 0) > 0.5 for v in u.values()):
        raise PartitionError(f"ILP stopped with status {status} and no solution within {time_limit_s} s")
    first_obj = pulp.value(prob.objective)
    boundaries = _read_boundaries(u, S)
    # second pass: smallest spread among optimal plans (only segments no costlier than the optimum)
    bound = first_obj * (1 + 1e-9) + 1e-15
    seg2 = {k: c for k, c in seg.items() if lower_bound(k, c) <= bound}
    status2, _, u2 = model(seg2, bound)
    if status2 == "Optimal":
        boundaries = _read_boundaries(u2, S)
    part = _evaluate(problem, boundaries, "ilp", solver=type(slv).__name__, status=status,
                     gap=0.0 if status == "Optimal" else None, num_variables=len(seg) + 1)
    part.solve_time_s = time.perf_counter() - t0
    return part


def _read_boundaries(u: dict, S: int) -> list[int]:
    chosen = sorted((k for k, v in u.items() if (v.value() or 0) > 0.5))
    b = [0] + [k[2] for k in chosen]
    if len(b) != S + 1:
        raise PartitionError(f"ILP returned {len(chosen)} segments for {S} stages")
    return b


# ---------------------------------------------------------------------- front door
METHODS = ("uniform", "dp", "ilp")


def solve(problem: PartitionProblem, method: str = "ilp", *, time_limit_s: float = 10.0) -> Partition:
    """Partition with ``uniform``, ``dp`` or ``ilp``; ``ilp`` falls back to ``dp`` (and says so in
    ``solver``) when no ILP solver is installed.

    Raises:
        PartitionError: unknown method; InfeasiblePlanError: nothing fits.
    """
    if method == "uniform":
        part = uniform(problem)
        check_memory(problem, part)
        return part
    if method == "dp":
        return solve_dp(problem)
    if method == "ilp":
        if available_solver(time_limit_s) is None:
            part = solve_dp(problem)
            part.method, part.solver = "ilp", "dp (no ILP solver installed)"
            return part
        return solve_ilp(problem, time_limit_s=time_limit_s)
    raise PartitionError(f"field 'method' = {method!r} is unknown; allowed: {', '.join(METHODS)}")


def additive_problem(costs: Sequence[float], num_stages: int, **kwargs) -> PartitionProblem:
    """A problem whose stage cost is the sum of per-layer costs (prefix sums, O(1) per segment).

    Raises:
        PartitionError: an empty list or a negative / non-finite cost (names its index).
    """
    costs = [float(c) for c in costs]
    if not costs:
        raise PartitionError("field 'costs' is empty; allowed: one non-negative number per layer")
    for idx, c in enumerate(costs):
        if not math.isfinite(c) or c < 0:
            raise PartitionError(f"field 'costs[{idx}]' = {c} is out of range; allowed: a finite number >= 0")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    return PartitionProblem(len(costs), num_stages, lambda s, i, j: prefix[j] - prefix[i], **kwargs)


def partition_costs(costs: Sequence[float], num_stages: int, method: str = "ilp", **kwargs) -> Partition:
    """Partition a plain per-layer cost list (``tessera-lab partition --costs ...``)."""
    time_limit_s = kwargs.pop("time_limit_s", 10.0)
    return solve(additive_problem(costs, num_stages, **kwargs), method, time_limit_s=time_limit_s)
