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


