"""The exact dynamic program over (stage, end layer) for contiguous partitions (one stage per rank).

See :mod:`tessera_lab.plan.partition` for the objectives; the ILP (:mod:`tessera_lab.plan.ilp`) is cross-checked
against it and falls back to it.
"""

from __future__ import annotations

import math
import time

from tessera_lab.errors import PartitionError
from tessera_lab.plan.problem import Partition, PartitionProblem, infeasible_error, score_boundaries

def solve_dp(problem: PartitionProblem) -> Partition:
    """Exact dynamic program over (stage, end layer), O(S L^2) segment evaluations.

    Bottleneck objective: ``best[s][j] = min_i max(best[s-1][i], cost(s, i, j))``. Schedule objective:
    for every candidate bottleneck value B (a segment cost), minimise the sum of stage costs with all
    stages <= B, and take the best ``sum + (m-1) B``. Then a second pass minimises ``sum cost^2`` among
    plans within 1e-12 (relative) of the optimum.

    Large monotone bottleneck problems (:func:`fast_path`) go to :func:`solve_monotone` instead.

    Raises:
        InfeasiblePlanError: no partition satisfies memory and layer-count constraints.
    """
    if problem.vpp > 1:
        raise PartitionError("method 'dp' needs vpp = 1 (a rank's cost sums non-adjacent chunks); use method 'ilp'")
    if fast_path(problem):
        return solve_monotone(problem)
    t0 = time.perf_counter()
    S, L = problem.num_stages, problem.num_layers
    seg = [problem.segments(s) for s in range(S)]
    cost = [dict(zip(seg[s], problem.segment_costs(s, seg[s]))) for s in range(S)]

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




#: segment evaluations (``S x L^2``) above which a monotone bottleneck problem takes :func:`solve_monotone`
FAST_DP_MIN = 2_000_000


def fast_path_ok(problem: PartitionProblem) -> bool:
    """Whether :func:`solve_monotone` is exact for ``problem``: monotone costs, the bottleneck objective, one stage
    per rank, at least one layer per stage, no other layer-count rule and no memory limit (with ``min_layers > 1``,
    or a memory model that depends on the stage index, the best bottleneck of a prefix can fall as the prefix
    grows, e.g. costs 0, 0, 1, 1, 0 with two layers per stage)."""
    return (problem.monotone and problem.objective == "bottleneck" and problem.vpp == 1 and problem.min_layers == 1
            and problem.memory is None and problem.first_stage_layers is None and problem.last_stage_layers is None
            and problem.max_layers is None)


def fast_path(problem: PartitionProblem) -> bool:
    """Whether :func:`solve_dp` hands ``problem`` to :func:`solve_monotone`: :func:`fast_path_ok` and more than
    :data:`FAST_DP_MIN` segments (smaller problems keep the general DP's spread tie-break)."""
    return fast_path_ok(problem) and problem.num_stages * problem.num_layers ** 2 > FAST_DP_MIN


def solve_monotone(problem: PartitionProblem) -> Partition:
    """Exact bottleneck DP for monotone costs and memory in O(S L log L) segment evaluations and O(S L) memory.

    ``best[s][j] = min_i max(best[s-1][i], cost(s, i, j))``: ``best[s-1][i]`` never decreases with ``i`` and
    ``cost(s, i, j)`` never increases, so the minimum sits where they cross (binary search); memory feasibility
    holds for ``i`` at or above a threshold (binary search). No spread tie-break (the status says so).

    Raises:
        InfeasiblePlanError: nothing satisfies the memory and layer-count constraints.
    """
    t0 = time.perf_counter()
    S, L, k = problem.num_stages, problem.num_layers, problem.min_layers
    INF = math.inf
    prev = [INF] * (L + 1)
    prev[0] = 0.0
    back: list[list[int]] = []
    for s in range(S):
        cur = [INF] * (L + 1)
        arg = [-1] * (L + 1)
        j_lo, j_hi = ((L, L) if s == S - 1 else ((s + 1) * k, L - (S - 1 - s) * k))
        for j in range(j_lo, j_hi + 1):
            i_lo, i_hi = (0, 0) if s == 0 else (s * k, j - k)
            if i_lo > i_hi or not problem.memory_ok(s, i_hi, j):
                continue
            lo, hi = i_lo, i_hi  # smallest i with memory_ok(s, i, j)
            while lo < hi:
                mid = (lo + hi) // 2
                if problem.memory_ok(s, mid, j):
                    hi = mid
                else:
                    lo = mid + 1
            a, b = lo, i_hi  # smallest i in [a, b] with prev[i] >= cost(s, i, j)
            while a < b:
                mid = (a + b) // 2
                if prev[mid] >= problem.cost(s, mid, j):
                    b = mid
                else:
                    a = mid + 1
            for i in {a, a - 1} if a - 1 >= lo else {a}:
                v = max(prev[i], problem.cost(s, i, j))
                if v < cur[j]:
                    cur[j], arg[j] = v, i
        back.append(arg)
        prev = cur
    if prev[L] is INF:
        raise infeasible_error(problem)
    b = [L]
    for s in range(S - 1, -1, -1):
        b.append(back[s][b[-1]])
    part = score_boundaries(problem, b[::-1], "dp", solver="dp", status="Optimal (monotone fast path, no spread tie-break)")
    part.solve_time_s = time.perf_counter() - t0
    return part
