"""What the pipeline pays, as a partition objective, and simulator-in-the-loop refinement (docs/design-notes.md, "Planner").

**Schedule-aware objective** (``schedule``). For a schedule with one stage per rank, rank ``s`` owning layers
``i .. j-1`` cannot finish its part of the iteration before

    ``pre(s, i) + busy(s, i, j) + max(sync(s, i, j), post(s, i))``

where ``pre`` is the time the first micro-batch's forward needs to reach it (the forward of layers ``0 .. i-1``
with the embedding, plus one p2p transfer per hop), ``busy`` its own work (overlapped 1F1B: ``k_s`` warm-up
forwards and ``k_s`` cool-down backwards run apart, ``k_s = min(2 (p - 1 - s) + 1, m)``, the other ``m - k_s``
micro-batches run as (F;B) pairs at the stage cost after overlap; other schedules: ``m (F + B + W)``), ``post``
the time the last backward needs to travel back to rank 0 (backward of layers ``0 .. i-1`` plus p2p), and
``sync`` the rank's DP gradient synchronisation, which starts after its last action. Every term is a function
of the segment ``(s, i, j)`` alone (standalone times are additive over layers), so the bottleneck DP and ILP
minimise ``max_s`` of it exactly. It is a lower bound of the simulated iteration (dependency waits in the
steady state are not in it), which is why the planner then refines by simulation.

**Refinement** (:func:`refine`): first-improvement local search over the boundaries, moving one boundary by
one or two layers at a time, each candidate simulated with :func:`tessera_lab.plan.evaluate.evaluate`; the best
simulated partition is kept (never worse than the start). Bounded by a number of simulations.
"""

from __future__ import annotations

from typing import Callable, Sequence

from tessera_lab.cost.analytic import CostModel
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.plan.evaluate import grad_sync
from tessera_lab.plan.stages import OVERLAPPED_SCHEDULES, StageCostModel

SegmentFn = Callable[[int, int, int], float]
#: simulations the refinement may spend per plan (each about 5-10 ms at pp=8, m=32)
REFINE_BUDGET = 80


def warmup_forwards(schedule: str, pp: int, stage: int, m: int) -> int:
    """Micro-batches rank ``stage`` runs apart (warm-up forwards, and as many cool-down backwards) before and
    after its steady state: ``min(2 (p - 1 - s) + 1, m)`` in overlapped 1F1B, ``m`` (all) otherwise."""
    if schedule in OVERLAPPED_SCHEDULES:
        return min(2 * (pp - 1 - stage) + 1, m)
    return m


def schedule_path_cost(model: ModelSpec, parallel: ParallelConfig, cost_model: CostModel,
                       sm: StageCostModel) -> SegmentFn:
    """The per-segment lower bound of the module docstring (seconds), for the bottleneck DP / ILP.

    Needs one stage per rank (``vpp = 1``).
    """
    p = parallel
    P, m = p.pp, p.microbatches
    hop = [cost_model.p2p_time(model, s) for s in range(P)]
    hops = [0.0]
    for h in hop:
        hops.append(hops[-1] + h)
    sync_cache: dict[tuple[int, int, int], float] = {}
    gs = grad_sync(model, cost_model)

    def sync(s: int, i: int, j: int) -> float:
        key = (s, i, j)
        if key not in sync_cache:
            sync_cache[key] = gs.time(s, range(i, j))
        return sync_cache[key]

    def cost(s: int, i: int, j: int) -> float:
        k = warmup_forwards(p.schedule, P, s, m)
        apart = sm.standalone(s, i, j)
        busy = k * apart + (m - k) * (sm.fb(s, i, j) if sm.pair_costs is not None else apart)
        pre = 0.0 if s == 0 else sm.f(0, 0, i) + hops[s]
        post = 0.0 if s == 0 else sm.b(0, 0, i) + hops[s]
        return pre + busy + max(sync(s, i, j), post)

    return cost


def neighbours(boundaries: Sequence[int], steps: Sequence[int] = (1, -1, 2, -2)) -> list[list[int]]:
    """Partitions one boundary move away (every stage keeps at least one layer)."""
    b = list(boundaries)
    out = []
    for step in steps:
        for k in range(1, len(b) - 1):
            nb = b.copy()
            nb[k] += step
            if nb[k - 1] < nb[k] < nb[k + 1]:
                out.append(nb)
    return out


def refine(start: Sequence[int], simulate_time: Callable[[list[int]], float | None], *,
           budget: int = REFINE_BUDGET) -> tuple[list[int], float, int]:
    """First-improvement local search from ``start``.

    Args:
        start: boundaries to start from.
        simulate_time: boundaries -> simulated iteration time in seconds, or ``None`` when the partition is
            not allowed (memory).
        budget: the most simulations to spend (the start counts as one).

    Returns:
        ``(best boundaries, its iteration time, simulations spent)``; the time is never above the start's.
    """
    seen: dict[tuple[int, ...], float | None] = {}

    def time_of(b: list[int]) -> float | None:
        key = tuple(b)
        if key not in seen:
            seen[key] = simulate_time(b)
        return seen[key]

    best = list(start)
    best_t = time_of(best)
    if best_t is None:
        raise ValueError("refine: the start partition is not allowed")
    improved = True
    while improved and len(seen) < budget:
        improved = False
        for nb in neighbours(best):
            if len(seen) >= budget:
                break
            if tuple(nb) in seen:
                continue
            t = time_of(nb)
            if t is not None and t < best_t * (1 - 1e-12):
                best, best_t, improved = nb, t, True
                break
    return best, best_t, len(seen)
