"""Feasible plans found without the ILP: they bound its model (segments above the best plan's objective are left
out) and stand in for it at its limit (:func:`tessera_lab.plan.ilp.solve_ilp`). A greedy linear-partition probe with
one stage per rank; with virtual stages the exact bottleneck DP over the virtual stages, which also proves a layout
infeasible when not even one chunk per rank fits, and :func:`memory_repair` of it and of the even split, where a rank's
chunks together exceed the memory limit (docs/design-notes.md)."""

from __future__ import annotations

import math
from dataclasses import replace

from tessera_lab.errors import InfeasiblePlanError, TesseraError
from tessera_lab.plan.dp import fast_path_ok, solve_dp, solve_monotone
from tessera_lab.plan.problem import Partition, PartitionProblem, infeasible_error, score_boundaries, uniform_boundaries


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


def heuristic_start(problem: PartitionProblem, all_seg: dict[tuple[int, int, int], float]
                     ) -> tuple[float, Partition | None]:
    """``(objective, plan)`` of the best heuristic plan that fits memory (greedy, or for ``vpp > 1`` the exact DP
    over virtual stages scored per rank, and the uniform plan): the ILP's upper bound and its fallback at the limit;
    ``(inf, None)`` when none fits."""
    S = problem.num_stages
    ub, best_heuristic = math.inf, None
    starts = [greedy_upper_bound(problem, all_seg) if problem.vpp == 1 else virtual_dp(problem),
              uniform_boundaries(problem.num_layers, S)]
    if problem.vpp > 1:  # the flat DP and the even split may stack a rank's chunks over the limit: repair them
        starts += [memory_repair(problem, b) for b in starts]
    for b in starts:
        if b is not None and all((s, b[s], b[s + 1]) in all_seg for s in range(S)):
            h = score_boundaries(problem, b, "ilp")
            if all(problem.memory_ok_rank(x) for x in h.rank_memory) and h.objective < ub:
                ub, best_heuristic = h.objective, h
    return ub, best_heuristic


def memory_repair(problem: PartitionProblem, boundaries: list[int] | None,
                  max_moves: int | None = None) -> list[int] | None:
    """A plan whose every rank fits memory, from ``boundaries`` whose ranks may not (``vpp > 1``: a rank's memory is
    the sum of its chunks'), or ``None``. Steepest descent on the largest rank memory: a move hands one layer of a
    chunk of the fullest rank along the pipeline to another virtual stage (the stages between keep their counts),
    at most ``max_moves`` (default: the virtual stages) times; a heuristic (docs/design-notes.md)."""
    if boundaries is None or problem.memory is None:
        return None
    S, pp = problem.num_stages, problem.num_stages // problem.vpp
    b = list(boundaries)

    def stage_mem(bs: list[int], s: int) -> float | None:
        i, j = bs[s], bs[s + 1]
        return problem.memory(s, i, j) if problem.length_ok(s, i, j) and problem.memory_ok(s, i, j) else None

    mem = [stage_mem(b, s) for s in range(S)]
    if any(x is None for x in mem):
        return None
    for _ in range(max_moves if max_moves is not None else S):
        rank = [sum(mem[s] for s in range(r, S, pp)) for r in range(pp)]
        worst = max(range(pp), key=rank.__getitem__)
        if problem.memory_ok_rank(rank[worst]):
            return b
        best = None
        for s in range(worst, S, pp):
            for t in range(S):
                if t % pp == worst:
                    continue
                lo, hi, d = (s + 1, t + 1, -1) if t > s else (t + 1, s + 1, 1)  # boundaries lo..hi-1 move by d
                nb = b[:lo] + [x + d for x in b[lo:hi]] + b[hi:]
                new = {u: stage_mem(nb, u) for u in range(min(s, t), max(s, t) + 1)}
                if any(x is None for x in new.values()):
                    continue
                r = list(rank)
                for u, x in new.items():
                    r[u % pp] += x - mem[u]
                if best is None or max(r) < best[0]:
                    best = (max(r), nb, new)
        if best is None or best[0] >= rank[worst]:
            return None
        _, b, new = best
        for u, x in new.items():
            mem[u] = x
    rank = [sum(mem[s] for s in range(r, S, pp)) for r in range(pp)]
    return b if all(problem.memory_ok_rank(x) for x in rank) else None


def virtual_dp(problem: PartitionProblem) -> list[int] | None:
    """A feasible plan for ``vpp > 1`` (a bound for pruning): the exact bottleneck DP over the virtual stages as
    if each were a rank; ``None`` when it finds none for another reason than memory.

    Raises:
        InfeasiblePlanError: no virtual stage split fits memory even one chunk per rank, so none fits at all.
    """
    flat = replace(problem, vpp=1, objective="bottleneck")
    try:
        return (solve_monotone(flat) if flat.monotone and fast_path_ok(flat) else solve_dp(flat)).boundaries
    except InfeasiblePlanError:
        # a rank's memory is the sum of its chunks, so every chunk of a feasible plan fits alone: no flat plan,
        # no plan at all (proven here, before the ILP spends its time limit looking)
        raise infeasible_error(problem) from None
    except TesseraError:
        return None
