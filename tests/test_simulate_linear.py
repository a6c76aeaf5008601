"""The simulator's linear pass (pipeline/linear.py) against its event loop: for every hand-written schedule, random
per-stage times and p2p times, the timelines are identical (every event, its predecessor on the critical path,
exposure, peaks). The event loop runs when sends are blocking, which without explicit SEND/RECV actions has the
same semantics, so ``blocking_sends=True`` gives an independent reference."""

from __future__ import annotations

import random

import pytest

from tessera_lab.errors import DeadlockError
from tessera_lab.pipeline.actions import Action, ActionType
from tessera_lab.pipeline.schedules import SCHEDULE_NAMES, build_schedule
from tessera_lab.pipeline.simulate import simulate, stage_durations


def _same(a, b):
    assert a.events == b.events
    assert a.iteration_time == b.iteration_time
    assert a.exposed_comm == b.exposed_comm
    assert a.peak_activations == b.peak_activations
    assert [str(e) for e in a.critical_path] == [str(e) for e in b.critical_path]
    assert a.per_rank_busy == b.per_rank_busy


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
@pytest.mark.parametrize("seed", range(3))
def test_linear_pass_equals_event_loop(name, seed):
    rng = random.Random(seed)
    pp, vpp = (4, 2) if name in ("interleaved",) else (4, 1)
    m = 8
    sched = build_schedule(name, pp, m, vpp)
    S = sched.num_stages
    f = [rng.uniform(0.5, 1.5) for _ in range(S)]
    b = [rng.uniform(1.0, 3.0) for _ in range(S)]
    w = [x * rng.uniform(0.2, 0.5) for x in b]
    d = stage_durations(f, b, w, fb=[x + y * 0.8 for x, y in zip(f, b)])
    p2p = rng.choice([0.0, 0.05, 0.3])
    comm = [(r, "dp_grad_sync", 0.7, sched.actions[r][-1]) for r in range(sched.num_ranks)]
    fast = simulate(sched, d, p2p_time=lambda s, t: p2p * (1 + (s % 2)), comm=comm)
    ref = simulate(sched, d, p2p_time=lambda s, t: p2p * (1 + (s % 2)), comm=comm, blocking_sends=True)
    _same(fast, ref)
    again = simulate(sched, d, p2p_time=lambda s, t: p2p * (1 + (s % 2)), comm=comm)  # compiled once, reused
    _same(fast, again)


def test_changed_schedule_is_compiled_again():
    sched = build_schedule("1f1b", 2, 2)
    d = stage_durations([1.0, 1.0], [2.0, 2.0], [0.0, 0.0])
    t1 = simulate(sched, d).iteration_time
    sched.actions[0].reverse()  # the same list object, other actions order: a deadlock now
    with pytest.raises(DeadlockError):
        simulate(sched, d)
    sched.actions[0].reverse()
    assert simulate(sched, d).iteration_time == t1


def test_deadlock_still_reported():
    F, B = ActionType.F, ActionType.B
    s = build_schedule("gpipe", 2, 1)
    s.actions[0] = [Action(0, B, 0), Action(0, F, 0)]  # the backward before its own forward
    with pytest.raises(DeadlockError):
        simulate(s, stage_durations([1.0, 1.0], [1.0, 1.0], [0.0, 0.0]))
