"""Sizing a measurement to a budget (runner/measure/sizing.py): rounds counted by hand, the reduction ladder,
the default EP group; and the harness's halving loop run on fake medians counts the same rounds."""

from __future__ import annotations

import pytest

from tessera_lab.runner.measure.sizing import (
    MIN_KEEP, MIN_REPEATS, default_ep, halve, pair_rounds, plan_work, round_cost,
)


@pytest.mark.parametrize("keep, repeats, warmup, rounds", [
    (4, 3, 1, 32),   # alone 4 + program 4 + 3 others x 4, then 2 survivors x 6
    (4, 5, 1, 50),   # 6 + 6 + 3 x 6, then 2 x 10
    (2, 3, 1, 12),   # 4 + 4 + 1 x 4, no halving round
    (5, 2, 0, 40),   # 2 + 2 + 4 x 2, then 3 x 4, then 2 x 8
    (3, 3, 0, 24),   # 3 + 3 + 2 x 3, then 2 x 6
])
def test_pair_rounds_by_hand(keep, repeats, warmup, rounds):
    assert pair_rounds(keep, repeats, warmup) == rounds


@pytest.mark.parametrize("keep", [2, 3, 4, 5, 7, 9])
@pytest.mark.parametrize("repeats, warmup", [(1, 0), (3, 1), (5, 2)])
def test_pair_rounds_equals_the_halving_loop(keep, repeats, warmup):
    """The harness's loop (ranks.measure_rank), replayed with halve() on fake medians, runs as many rounds."""
    rounds = 2 * (warmup + repeats)  # alone, program order
    alive, n_rep, first = list(range(keep)), repeats, True
    while True:
        for r in range(n_rep + (warmup if first else 0)):
            rounds += sum(1 for i in alive if not (i == 0 and first))
        first = False
        if len(alive) <= 2:
            break
        alive = halve(alive, {i: float(-i) for i in alive})  # fastest last: program order is kept in place
        n_rep *= 2
    assert pair_rounds(keep, repeats, warmup) == rounds


def test_round_cost_is_the_untimed_forward_then_both_sides():
    fw, bw = {"a": 1.0, "b": 2.0}, {"a": 10.0, "b": 20.0}
    assert round_cost(fw, bw, "a", "b") == 2.0 + 1.0 + 20.0


def test_plan_work_walks_the_ladder():
    # one pair, 1 s per round; defaults repeats 5, 4 orders, warm-up 1: 50 rounds
    full = plan_work([1.0], 60, repeats=5, warmup=1, keep=4)
    assert (full.repeats, full.keep, full.fits, full.reductions, full.estimate_s) == (5, 4, True, [], 50.0)
    r3 = plan_work([1.0], 40, repeats=5, warmup=1, keep=4)  # 5 -> 4 needs 41 rounds, 3 needs 32
    assert (r3.repeats, r3.keep, r3.fits, r3.estimate_s) == (3, 4, True, 32.0) and r3.reductions == ["repeats 5 -> 3"]
    # two pairs at 0.5 s: keep 3 needs 44, 36, 28 rounds at repeats 5, 4, 3; keep 2 at repeats 5 needs 18
    k2 = plan_work([0.5, 0.5], 20, repeats=5, warmup=1, keep=4)
    assert (k2.repeats, k2.keep, k2.fits, k2.estimate_s) == (5, 2, True, 18.0)
    assert k2.reductions == ["candidate orders per pair 4 -> 2"]
    k2r4 = plan_work([1.0], 15, repeats=5, warmup=1, keep=4)  # keep 2: 18, 15 rounds at repeats 5, 4
    assert (k2r4.repeats, k2r4.keep) == (4, 2)
    assert k2r4.reductions == ["repeats 5 -> 4", "candidate orders per pair 4 -> 2"]
    fixed = plan_work([1.0], 20, repeats=5, warmup=1, keep=4, fixed=frozenset({"repeats"}))  # k 3: 44, k 2: 18
    assert (fixed.repeats, fixed.keep, fixed.fits) == (5, 2, True)
    none = plan_work([1.0], 5, repeats=5, warmup=1, keep=4)
    assert (none.repeats, none.keep, none.fits, none.estimate_s) == (MIN_REPEATS, MIN_KEEP, False, 12.0)
    both = plan_work([1.0], 5, repeats=5, warmup=1, keep=4, fixed=frozenset({"repeats", "keep"}))
    assert (both.repeats, both.keep, both.fits, both.reductions) == (5, 4, False, [])


def test_default_ep_divides_the_experts_and_fits_the_devices():
    assert default_ep(512, 2) == 2 and default_ep(512, 64) == 8 and default_ep(512, 1) == 1
    assert default_ep(6, 8) == 6 and default_ep(7, 4) == 1 and default_ep(12, 5) == 4
