"""Sizing a measurement to a time budget, and the successive-halving rule of the harness (torch-free).

The harness (:mod:`tessera_lab.runner.measure.harness`) measures each pair of layer kinds in *rounds*; one round
runs an untimed forward of micro-batch 0 (so its backward has activations) and then either each side alone (the
forward of micro-batch 1, the backward of micro-batch 0) or both together in one candidate order. A round of the
pair ``(kind_f, kind_b)`` therefore costs about ``F[kind_b] + F[kind_f] + B[kind_b]`` seconds, with ``F`` and ``B``
the forward and backward times the probe measured on this machine now (wall clock, so the load is in them).

Rounds of one pair (:func:`pair_rounds`, the harness's loop counted exactly): ``warmup + repeats`` alone, the same
for program order, ``warmup + repeats`` for each other candidate in the first halving round, then halving rounds
with doubled repeats (:func:`halve`) until two candidates remain.

:func:`plan_work` picks the largest work that fits the time left: it walks a ladder of reductions (fewer repeats,
then fewer candidate orders with the repeats tried from the top again; the caller halves the size factor and
probes again when even the ladder's end does not fit) and never reduces what the user set explicitly. Seconds throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

__all__ = ["FIT_STEP", "halve", "pair_rounds", "round_cost", "WorkPlan", "plan_work", "MIN_REPEATS", "MIN_KEEP",
           "default_ep"]

#: grid step of the contention fits made while measuring (coarse grid, then a 10x finer one around its best)
FIT_STEP = 0.1
#: the fewest timed repeats the budget may reduce to (quartiles of three samples)
MIN_REPEATS = 3
#: the fewest candidate orders per pair the budget may reduce to (program order and one challenger)
MIN_KEEP = 2


def halve(alive: Sequence[int], medians: Mapping[int, float]) -> list[int]:
    """One successive-halving round: the ``max(2, ceil(n / 2))`` candidates with the lowest medians (ties to
    the lower index), program order (candidate 0) always among them in place of the worst kept; fewer than
    ``n`` whenever ``n >= 3``, so halving ends."""
    ranked = sorted(alive, key=lambda i: (medians[i], i))
    kept = ranked[:max(2, (len(ranked) + 1) // 2)]
    if 0 in alive and 0 not in kept:
        kept = kept[:-1] + [0]
    return sorted(kept)


def pair_rounds(keep: int, repeats: int, warmup: int) -> int:
    """Rounds (timed and untimed) the harness runs for one pair with ``keep`` candidate orders: alone and program
    order ``warmup + repeats`` each, the other candidates ``warmup + repeats`` in the first halving round, then
    ``2^j * repeats`` per survivor in halving round ``j`` until two remain (hand example: keep 4, repeats 3,
    warmup 1: 4 + 4 + 3 * 4 + 2 * 6 = 32)."""
    rounds = 2 * (warmup + repeats) + (keep - 1) * (warmup + repeats)
    alive, n_rep = keep, repeats
    while alive > 2:
        alive, n_rep = max(2, (alive + 1) // 2), n_rep * 2
        rounds += alive * n_rep
    return rounds


def round_cost(fwd: Mapping[str, float], bwd: Mapping[str, float], kind_f: str, kind_b: str) -> float:
    """Seconds of one round of the pair ``(kind_f, kind_b)``: ``F[kind_b] + F[kind_f] + B[kind_b]`` (the untimed
    forward, then both sides; together they take at most their sum)."""
    return fwd[kind_b] + fwd[kind_f] + bwd[kind_b]


@dataclass
class WorkPlan:
    """Repeats, warm-up rounds and candidate orders per pair, the estimated seconds, and what was reduced."""

    repeats: int
    warmup: int
    keep: int
    estimate_s: float
    fits: bool
    reductions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"repeats": self.repeats, "warmup": self.warmup, "keep": self.keep,
                "estimate_s": round(self.estimate_s, 3), "fits": self.fits, "reductions": list(self.reductions)}


def plan_work(costs: Sequence[float], seconds_left: float, *, repeats: int, warmup: int, keep: int,
              fixed: frozenset[str] = frozenset()) -> WorkPlan:
    """The most work that fits ``seconds_left`` for pairs whose rounds cost ``costs`` seconds each.

    Ladder (an option in ``fixed``, e.g. ``{"repeats"}`` when the user gave ``--repeats``, keeps its value): for
    ``keep`` from the requested value down to :data:`MIN_KEEP`, ``repeats`` from the requested value down to
    :data:`MIN_REPEATS`; the first step that fits wins (more candidate orders are preferred to more repeats once
    repeats reach the minimum, and repeats go back up when fewer orders free the time). Returns that step, else the
    last one with ``fits`` False (the caller then reduces the size factor, or goes on and says the budget is
    exceeded).
    """
    per_round = float(sum(costs))
    ks = [keep] if "keep" in fixed else list(range(keep, min(keep, MIN_KEEP) - 1, -1))
    rs = [repeats] if "repeats" in fixed else list(range(repeats, min(repeats, MIN_REPEATS) - 1, -1))
    step = None
    for k in ks:
        for r in rs:
            est = per_round * pair_rounds(k, r, warmup)
            notes = ([f"repeats {repeats} -> {r}"] if r != repeats else []) + (
                [f"candidate orders per pair {keep} -> {k}"] if k != keep else [])
            step = WorkPlan(r, warmup, k, est, est <= seconds_left, notes)
            if step.fits:
                return step
    return step


def default_ep(num_experts: int, devices: int) -> int:
    """The EP group a measuring backend uses by default: the largest divisor of ``num_experts`` that is at most
    ``min(8, devices)`` (CPU: cores, one single-threaded process per core; CUDA: GPUs)."""
    cap = max(1, min(8, devices))
    return max(d for d in range(1, cap + 1) if num_experts % d == 0)
