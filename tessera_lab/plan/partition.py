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

import math
import time
from typing import Sequence

from tessera_lab.errors import PartitionError
from tessera_lab.plan.ilp import available_solver, solve_ilp
from tessera_lab.plan.problem import (GIB, Partition, PartitionProblem, SegmentFn, check_memory, infeasible_error,
                                      score_boundaries, uniform, uniform_boundaries)

__all__ = ["GIB", "METHODS", "Partition", "PartitionProblem", "SegmentFn", "additive_problem", "available_solver",
           "check_memory", "partition_costs", "score_boundaries", "solve", "solve_dp", "solve_ilp", "uniform",
           "uniform_boundaries"]


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
        """Minimise the sum of costs (or of cost^2) with every stage's cost <= cap; returns (value, boundaries)."""
        best: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, (0,))}
        for s in range(S):
            nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
            for (i, j), c in cost[s].items():
                if c > cap or i not in best:
                    continue
                v = best[i][0] + (c * c if squared else c)
                if j not in nxt or v < nxt[j][0]:
                    nxt[j] = (v, best[i][1] + (j,))
            best = nxt
        return (best[L][0], list(best[L][1])) if L in best else None

    tol = 1e-12
    if problem.objective == "bottleneck":
        b = min_bottleneck()
        if b is math.inf:
            raise infeasible_error(problem)
        res = min_sum(b * (1 + tol) + 1e-300, squared=True)
        assert res is not None
        boundaries = res[1]
    else:
        b_min = min_bottleneck()
        if b_min is math.inf:
            raise infeasible_error(problem)
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
            raise infeasible_error(problem)
        boundaries = min_sum(best_cap * (1 + tol), squared=False)[1]
    part = score_boundaries(problem, boundaries, "dp", solver="dp", status="Optimal")
    part.solve_time_s = time.perf_counter() - t0
    return part


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
