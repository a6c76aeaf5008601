"""Partitioning layers into contiguous pipeline stages: uniform, exact DP and ILP (HiGHS).

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
their cost already exceeds a known feasible plan's objective are left out. Solver: HiGHS through its
``highspy`` bindings (the model passed as a sparse matrix, no modelling layer); always with a time limit. The
exact DP over the same costs is the cross-check and the fallback when highspy is not installed.
"""

from __future__ import annotations

import math
from typing import Sequence

from tessera_lab.errors import PartitionError
from tessera_lab.plan.dp import solve_dp
from tessera_lab.plan.ilp import DEFAULT_ILP_BUDGET, IlpBudget, available_solver, solve_ilp
from tessera_lab.plan.problem import (GIB, Partition, PartitionProblem, SegmentFn, check_memory,
                                      score_boundaries, uniform, uniform_boundaries)

__all__ = ["GIB", "METHODS", "Partition", "PartitionProblem", "SegmentFn", "additive_problem", "available_solver",
           "check_memory", "partition_costs", "score_boundaries", "solve", "solve_dp", "solve_ilp", "uniform",
           "uniform_boundaries"]


# ---------------------------------------------------------------------- front door
METHODS = ("uniform", "dp", "ilp")


#: (stage, segment) pairs above which ``ilp`` with one stage per rank returns the exact DP's answer instead (the
#: model alone would take longer than a time limit allows; the ILP's extra is virtual stages)
ILP_MAX_SEGMENTS = 60_000


def ilp_size(problem: PartitionProblem) -> int:
    """An upper bound of the ILP's segment variables: ``S x (L - S + 1) (L - S + 2) / 2``."""
    free = problem.num_layers - problem.num_stages + 1
    return problem.num_stages * free * (free + 1) // 2


def solve(problem: PartitionProblem, method: str = "ilp", *, limit: float | IlpBudget = DEFAULT_ILP_BUDGET
          ) -> Partition:
    """Partition with ``uniform``, ``dp`` or ``ilp``; ``ilp`` falls back to ``dp`` (and says so in ``solver``) when
    highspy (the ILP solver) is not installed, or, with one stage per rank, when the ILP would have more than
    :data:`ILP_MAX_SEGMENTS` segment variables (the DP is exact there and bounded in time and memory).
    ``limit``: the ILP's limit, a deterministic :class:`~tessera_lab.plan.ilp.IlpBudget` (default
    :data:`~tessera_lab.plan.ilp.DEFAULT_ILP_BUDGET`) or float seconds of wall clock (load-dependent).

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
        reason = ("no ILP solver installed (highspy)" if available_solver() is None else
                  f"ILP too large: {ilp_size(problem)} > {ILP_MAX_SEGMENTS} segments"
                  if problem.vpp == 1 and ilp_size(problem) > ILP_MAX_SEGMENTS else None)
        if reason and problem.vpp > 1:  # the DP sums adjacent stages only: no fallback for virtual stages
            raise PartitionError(f"field 'vpp' = {problem.vpp} needs the ILP partitioner and {reason}; allowed: vpp 1, "
                                 "or install highspy (a dependency of tessera-lab)")
        if reason:
            part = solve_dp(problem)
            part.method, part.solver = "ilp", f"dp ({reason})"
            return part
        return solve_ilp(problem, limit=limit)
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
    kwargs.setdefault("monotone", True)  # sums of non-negative costs never shrink when a segment grows
    return PartitionProblem(len(costs), num_stages, lambda s, i, j: prefix[j] - prefix[i], **kwargs)


def partition_costs(costs: Sequence[float], num_stages: int, method: str = "ilp", **kwargs) -> Partition:
    """Partition a plain per-layer cost list (``tessera-lab partition --costs ...``); ``limit`` (keyword, an
    :class:`~tessera_lab.plan.ilp.IlpBudget`, default :data:`~tessera_lab.plan.ilp.DEFAULT_ILP_BUDGET`, or float
    seconds) as :func:`solve`'s, the other keywords :func:`additive_problem`'s."""
    limit = kwargs.pop("limit", DEFAULT_ILP_BUDGET)
    return solve(additive_problem(costs, num_stages, **kwargs), method, limit=limit)
