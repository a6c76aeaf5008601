"""The ILP partitioner (PuLP; HiGHS through ``highspy`` first, CBC second; always with a time limit).

One binary per feasible (stage, segment) pair, linked as a path from layer 0 to layer L (flow conservation
between consecutive stages); segments that cannot be in an optimal plan because their cost already exceeds a
known feasible plan's objective are left out. With virtual stages (``vpp > 1``) a rank's cost and memory are sums
over its non-contiguous chunks (constraints per rank), which the DP cannot express.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import replace

from tessera_lab.errors import PartitionError, TesseraError
from tessera_lab.plan.dp import fast_path_ok, solve_dp, solve_monotone
from tessera_lab.plan.problem import Partition, PartitionProblem, infeasible_error, score_boundaries, uniform_boundaries

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
            # HiGHS' presolve probing does not watch the time limit (seen: 9 s of probing under a 3 s limit on
            # a 22k-binary virtual-stage model); switching it off keeps the limit (HiGHS' own advice)
            extra = {"presolve_rule_off": 32768} if name == "HiGHS" else {}
            return pulp.getSolver(name, msg=False, timeLimit=time_limit_s, **extra)
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
    by_stage: list[list[tuple[int, int, float]]] = [[] for _ in range(S)]
    for (s, i, j), c in costs.items():
        by_stage[s].append((i, j, c))
    fwd = [dict() for _ in range(S + 1)]
    fwd[0][0] = 0.0
    for s in range(S):
        for i, j, c in by_stage[s]:
            if i in fwd[s] and fwd[s][i] + c < fwd[s + 1].get(j, math.inf):
                fwd[s + 1][j] = fwd[s][i] + c
    bwd = [dict() for _ in range(S + 1)]
    bwd[S][L] = 0.0
    for s in range(S - 1, -1, -1):
        for i, j, c in by_stage[s]:
            if j in bwd[s + 1] and bwd[s + 1][j] + c < bwd[s].get(i, math.inf):
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

    Time: both passes share ``time_limit_s`` (the second gets what the first left). When the limit stops the
    first pass, the better of its incumbent and the best heuristic plan (greedy, uniform, or for ``vpp > 1`` the
    exact DP over virtual stages scored per rank) is returned, with ``status`` saying so.

    Raises:
        InfeasiblePlanError: the ILP is infeasible (memory / layer-count constraints).
        PartitionError: no solver available (use ``solve_dp``), or the time limit hit with no solution and no
            feasible heuristic plan.
    """
    import pulp

    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    slv = available_solver(time_limit_s, solver)
    if slv is None:
        raise PartitionError("no ILP solver available (install highspy, or use method 'dp')")
    S, L, m = problem.num_stages, problem.num_layers, problem.microbatches
    all_seg = {(s, i, j): problem.cost(s, i, j) for s in range(S) for i, j in problem.segments(s)}
    if not all_seg:
        raise infeasible_error(problem)
    ub, best_heuristic = math.inf, None
    for b in (greedy_upper_bound(problem, all_seg) if problem.vpp == 1 else _virtual_dp(problem),
              uniform_boundaries(L, S)):
        if b is not None and all((s, b[s], b[s + 1]) in all_seg for s in range(S)):
            h = score_boundaries(problem, b, "ilp")
            if all(problem.memory_ok_rank(x) for x in h.rank_memory) and h.objective < ub:
                ub, best_heuristic = h.objective, h
    # exact pruning: the objective of any plan using segment k is at least lower_bound(k)
    fwd, bwd = _path_bounds(problem, all_seg)

    def lower_bound(k: tuple[int, int, int], c: float) -> float:
        s, i, j = k
        before, after = fwd[s].get(i, math.inf), bwd[s + 1].get(j, math.inf)
        if problem.objective == "bottleneck":
            return c if before < math.inf and after < math.inf else math.inf
        return before + c + after + (m - 1) * c

    def model(seg: dict[tuple[int, int, int], float], phase2_bound: float | None):
        if deadline - time.perf_counter() <= 0.01:  # the limit is spent before the model is built
            return "NotSolved", None, {}
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
        T = new_var("T", 0, ub * (1 + 1e-9) + 1e-15 if problem.objective == "bottleneck" and ub < math.inf
                    and problem.vpp == 1 else None)  # vpp > 1: T also bounds vpp x each chunk (below), above ub
        stage_cost = {s: pulp.LpAffineExpression([(u[k], seg[k]) for k in by_stage[s]]) for s in range(S)}
        if problem.objective == "bottleneck":
            objective_expr = pulp.LpAffineExpression([(T, 1.0)])
        else:
            objective_expr = pulp.LpAffineExpression([(u[k], c) for k, c in seg.items()] + [(T, m - 1.0)])
        P = problem.num_ranks
        for s in range(S):
            prob += pulp.LpAffineExpression([(u[k], 1.0) for k in by_stage[s]]) == 1, f"one_segment_{s}"
        for r in range(P):
            chunks = range(r, S, P)
            prob += T >= pulp.lpSum(stage_cost[c] for c in chunks), f"bottleneck_{r}"
        if problem.vpp > 1 and problem.objective == "bottleneck":
            # a rank runs its chunks in turns of p micro-batches, each chunk waiting on the chunk before it on the
            # previous rank: a short chunk next to a long one leaves the rank idle, so rank sums alone reward
            # splits the schedule cannot run at that rate (seen: rank-sum optimum 0.4% below the balanced split,
            # simulated 49% slower). T also bounds vpp x every chunk: balanced chunks first, rank sums second.
            for s in range(S):
                prob += T >= problem.vpp * stage_cost[s], f"chunk_{s}"
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
        seconds = deadline - time.perf_counter()  # what is left once the model is built
        if seconds <= 0.01:
            return "NotSolved", prob, u
        with _native_stdout_silenced():
            prob.solve(available_solver(seconds, solver))
        # PuLP reports a time-limited HiGHS run as status "Optimal"; the solution status tells them apart
        if prob.sol_status == pulp.LpSolutionOptimal:
            st = "Optimal"
        elif prob.sol_status == pulp.LpSolutionIntegerFeasible:
            st = "TimeLimit (feasible, not proven optimal)"
        else:
            st = pulp.LpStatus[prob.status] if prob.status != pulp.LpStatusOptimal else "NotSolved"
        return st, prob, u

    seg = {k: c for k, c in all_seg.items() if lower_bound(k, c) <= ub * (1 + 1e-9) + 1e-15}
    status, prob, u = model(seg, None)
    if status == "Infeasible" and best_heuristic is None:
        raise infeasible_error(problem)
    found = status == "Optimal" or any((v.value() or 0) > 0.5 for v in u.values())
    boundaries = _read_boundaries(u, S) if found else None
    if boundaries is not None:
        cand = score_boundaries(problem, boundaries, "ilp")
        if status != "Optimal" and best_heuristic is not None and best_heuristic.objective < cand.objective:
            boundaries, status = None, status + " (heuristic plan kept: better than the incumbent)"
    if boundaries is None:
        if best_heuristic is None:
            raise PartitionError(f"ILP stopped with status {status} and no solution within {time_limit_s} s")
        boundaries = best_heuristic.boundaries
        if "heuristic" not in status:
            status += " (time limit: best heuristic plan)"
    elif status == "Optimal" and deadline - time.perf_counter() > 0.05 * time_limit_s:
        # second pass: smallest spread among optimal plans (only segments no costlier than the optimum)
        bound = pulp.value(prob.objective) * (1 + 1e-9) + 1e-15
        seg2 = {k: c for k, c in seg.items() if lower_bound(k, c) <= bound}
        status2, _, u2 = model(seg2, bound)
        if status2 == "Optimal":
            boundaries = _read_boundaries(u2, S)
    part = score_boundaries(problem, boundaries, "ilp", solver=type(slv).__name__, status=status,
                            gap=0.0 if status == "Optimal" else None, num_variables=len(seg) + 1)
    part.solve_time_s = time.perf_counter() - t0
    return part


def _virtual_dp(problem: PartitionProblem) -> list[int] | None:
    """A feasible plan for ``vpp > 1`` (a bound for pruning): the exact bottleneck DP over the virtual stages as
    if each were a rank; ``None`` when it finds none."""
    flat = replace(problem, vpp=1, objective="bottleneck")
    try:
        return (solve_monotone(flat) if flat.monotone and fast_path_ok(flat) else solve_dp(flat)).boundaries
    except TesseraError:
        return None


def _read_boundaries(u: dict, S: int) -> list[int]:
    chosen = sorted((k for k, v in u.items() if (v.value() or 0) > 0.5))
    b = [0] + [k[2] for k in chosen]
    if len(b) != S + 1:
        raise PartitionError(f"ILP returned {len(chosen)} segments for {S} stages")
    return b


