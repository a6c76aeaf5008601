"""The simulator's fast path (the linear pass of pipeline/linear.py: one loop over flat lists, starts, predecessors
and analyses derived on arrays) against its general path (the event loop, which runs when sends are blocking:
without SEND/RECV actions the same semantics, so an independent reference) on random schedules and times: every
event, predecessor, critical path, exposure, peak, busy time and the makespan are the same floats. Times come from
a coarse grid (ties, zero durations, zero transfers common) or are uniform, per stage, micro-batch and type."""

from __future__ import annotations

import random

import pytest

from tessera_lab.pipeline import engine
from tessera_lab.pipeline.schedules import build_schedule
from tessera_lab.pipeline.simulate import simulate

_GRID = (0.0, 0.5, 1.0, 1.5, 2.0)


def _random_case(name: str, seed: int):
    rng = random.Random(f"{name}-{seed}")
    p = rng.randint(2, 5)
    if name == "interleaved":
        vpp = rng.randint(2, 3)
        m = p * rng.randint(1, 3)
    else:
        vpp = 1
        m = rng.randint(2 * p if name == "dualpipev" else p, 3 * p)
        if name == "dualpipev":
            m += m % 2
    sched = build_schedule(name, p, m, vpp)
    grid = rng.random() < 0.5
    table: dict = {}

    def durations(stage, mb, kind):
        key = (stage, mb, kind)
        if key not in table:
            table[key] = rng.choice(_GRID) if grid else rng.uniform(0.1, 3.0)
        return table[key]

    pair: dict = {}

    def p2p_time(src, dst):
        if (src, dst) not in pair:
            pair[(src, dst)] = rng.choice((0.0, 0.0, 0.25, 0.5)) if grid else rng.uniform(0.0, 0.4)
        return pair[(src, dst)]

    latency = rng.choice((0.0, 0.0, 0.125)) if grid else rng.uniform(0.0, 0.05)
    return sched, durations, dict(p2p_latency=latency, p2p_time=p2p_time)


def _facts(tl):
    return (tl.iteration_time, tl.events, [str(e) for e in tl.critical_path], [(e.start, e.end) for e in tl.critical_path],
            tl.exposed_comm, tl.peak_activations, tl.per_rank_busy, tl.per_rank_idle, tl.bubble_fraction,
            tl.bubble_overhead)


@pytest.mark.parametrize("name", ["1f1b", "interleaved", "zb-h1", "zb-h2", "dualpipev", "overlapped", "gpipe"])
@pytest.mark.parametrize("seed", range(6))
def test_fast_path_equals_the_event_loop(name, seed, monkeypatch):
    sched, durations, kw = _random_case(name, seed)
    ref = simulate(sched, durations, blocking_sends=True, **kw)  # the event loop
    for threshold in (0, 10**9):  # the fast path analysed on arrays, and from its event list
        monkeypatch.setattr(engine, "ARRAY_TIMELINE_MIN_ACTIONS", threshold)
        fast = simulate(sched, durations, **kw)
        assert _facts(fast) == _facts(ref)
        assert simulate(sched, durations, time_only=True, **kw) == ref.iteration_time
    rng = random.Random(seed)
    comm = [(r, "dp_grad_sync", rng.choice((0.0, 0.75, 40.0)), rng.choice(sched.actions[r] + [None]))
            for r in range(sched.num_ranks) for _ in range(2)]  # after any action (pairs: a sub-action), or none
    for r in range(sched.num_ranks):
        pairs = [a for a in sched.actions[r] if a.sub_actions]
        if pairs:
            comm.append((r, "ep_a2a", 0.5, rng.choice(pairs).sub_actions[1]))
    if seed == 5:  # a collective named as the p2p transfers count (their lane): the event list's analysis
        comm.append((0, "pp_p2p", 0.5, None))
    with_comm = simulate(sched, durations, comm=comm, blocking_sends=True, **kw)
    for threshold in (0, 10**9):
        monkeypatch.setattr(engine, "ARRAY_TIMELINE_MIN_ACTIONS", threshold)
        got = simulate(sched, durations, comm=comm, **kw)
        assert _facts(got) == _facts(with_comm)
        assert list(got.exposed_comm) == list(with_comm.exposed_comm)  # the same order of collectives
        assert simulate(sched, durations, comm=comm, time_only=True, **kw) == with_comm.iteration_time


def test_fast_path_by_hand():
    """1F1B on 2 ranks, 2 micro-batches, F 1 s, B 2 s, transfers 0.5 s: rank 0 runs F0 [0, 1], F1 [1, 2]; rank 1
    F0 [1.5, 2.5], B0 [2.5, 4.5], F1 [4.5, 5.5] (F1 arrived at 2.5), B1 [5.5, 7.5]; rank 0 B0 waits for the gradient
    (4.5 + 0.5) [5, 7], B1 [8, 10]. Makespan 10."""
    sched = build_schedule("1f1b", 2, 2)
    d = lambda s, i, k: 1.0 if k.value == "F" else 2.0  # noqa: E731
    tl = simulate(sched, d, p2p_latency=0.5)
    got = {(e.rank, str(e.label)): (e.start, e.end) for e in tl.events if e.lane == "compute"}
    assert got == {(0, "0F0"): (0.0, 1.0), (0, "0F1"): (1.0, 2.0), (1, "1F0"): (1.5, 2.5), (1, "1B0"): (2.5, 4.5),
                   (1, "1F1"): (4.5, 5.5), (1, "1B1"): (5.5, 7.5), (0, "0B0"): (5.0, 7.0), (0, "0B1"): (8.0, 10.0)}
    assert tl.iteration_time == 10.0
    assert [e.label for e in tl.critical_path] == ["0F0", "1RECV_F0", "1F0", "1B0", "1F1", "1B1", "0RECV_B1", "0B1"]


def test_batch_durations_equal_the_calls():
    """The makers' ``batch`` (the simulator's one call for every action) returns what calling them returns, and a
    stage without times raises the call's error."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.pipeline.actions import ActionType
    from tessera_lab.pipeline.simulate import stage_durations, uniform_durations

    rng = random.Random(5)
    kinds = [ActionType.F, ActionType.B, ActionType.I, ActionType.W, ActionType.OVERLAP_F_B]
    stages = [rng.randrange(4) for _ in range(200)]
    mbs = [rng.randrange(9) for _ in range(200)]
    types = [rng.choice(kinds) for _ in range(200)]
    for d in (uniform_durations(1.0, 2.5, w=0.75, fb=3.0),
              stage_durations([1.0, 2.0, 3.0, 4.0], [2.0, 3.0, 4.0, 5.0], [0.5, 1.0, 1.5, 2.0], fb=max)):
        assert d.batch(stages, mbs, types) == [d(s, i, k) for s, i, k in zip(stages, mbs, types)]
    short = stage_durations([1.0], [2.0])
    with pytest.raises(ConfigError, match="no times for stage 3"):
        short.batch([0, 3], [0, 0], [ActionType.F, ActionType.F])


def test_time_only_with_comm_tasks_reports_the_same_errors():
    """The fast path's iteration time with extra collectives finds their actions on the plan: a task after an action
    that does not run on its rank, and a malformed task, raise the errors of the full simulation."""
    from tessera_lab.errors import ConfigError

    sched = build_schedule("1f1b", 2, 2)
    d = lambda s, i, k: 1.0  # noqa: E731
    for comm, match in (([(0, "x", 1.0, "1F0")], "does not run on rank 0"), ([(0, "x", 1.0)], "expected"),
                        ([(5, "x", 1.0, None)], "rank=5 is out of range")):
        for time_only in (False, True):
            with pytest.raises(ConfigError, match=match):
                simulate(sched, d, comm=comm, time_only=time_only)
    assert simulate(sched, d, comm=[(0, "x", 0.0, "0B1")], time_only=True) == 6.0  # a zero-second task: a no-op
    assert simulate(sched, d, comm=[(0, "x", 2.5, "0B1")], time_only=True) == 8.5


def _random_order_schedule(rng: random.Random):
    """Stages placed on ranks at random (several per rank, neighbours on the same rank or not), each micro-batch's
    backward full (B) or split (I, W), and every rank's list in the order of one random valid execution: an
    executable schedule unlike the generators'."""
    from tessera_lab.pipeline.actions import Action, ActionType
    from tessera_lab.pipeline.ir import Schedule

    F, B, I, W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
    R = rng.randint(1, 4)
    S = rng.randint(R, 2 * R + 1)
    s2r = {s: (s if s < R else rng.randrange(R)) for s in range(S)}
    m = rng.randint(1, 5)
    split = {(s, i): rng.random() < 0.5 for s in range(S) for i in range(m)}
    done: set = set()

    def ready(a):
        s, i, k = a.stage, a.microbatch, a.type
        if k is F:
            return s == 0 or ("F", s - 1, i) in done
        if k is W:
            return ("G", s, i) in done
        return ("F", s, i) in done and (s == S - 1 or ("G", s + 1, i) in done)

    todo = [Action(s, F, i) for s in range(S) for i in range(m)]
    todo += [a for s in range(S) for i in range(m)
             for a in ((Action(s, I, i), Action(s, W, i)) if split[(s, i)] else (Action(s, B, i),))]
    lists = {r: [] for r in range(R)}
    while todo:
        a = rng.choice([x for x in todo if ready(x)])
        todo.remove(a)
        lists[s2r[a.stage]].append(a)
        done.add(("F" if a.type is F else "G" if a.type in (B, I) else "W", a.stage, a.microbatch))
    return Schedule("random-order", R, S, m, lists, s2r)


@pytest.mark.parametrize("seed", range(40))
def test_fast_path_equals_the_event_loop_on_random_orders(seed, monkeypatch):
    rng = random.Random(seed)
    sched = _random_order_schedule(rng)
    grid = seed % 2 == 0
    table: dict = {}

    def durations(stage, mb, kind):
        if (stage, mb, kind) not in table:
            table[(stage, mb, kind)] = rng.choice(_GRID) if grid else rng.uniform(0.0, 2.0)
        return table[(stage, mb, kind)]

    kw = dict(p2p_latency=rng.choice((0.0, 0.25)), p2p_time=lambda a, b: 0.125 * ((a + 2 * b) % 3))
    ref = simulate(sched, durations, blocking_sends=True, **kw)
    for threshold in (0, 10**9):
        monkeypatch.setattr(engine, "ARRAY_TIMELINE_MIN_ACTIONS", threshold)
        assert _facts(simulate(sched, durations, **kw)) == _facts(ref)
    assert simulate(sched, durations, time_only=True, **kw) == ref.iteration_time
