"""The event engine's pieces against independent references: the array form of the exposure computation against the
interval helpers (random intervals, touching and empty ones included), the timeline's lazily made events and
critical path, the Walk's agenda in both tie orders (hand examples) and deadlock report, the processor-sharing policy by hand, the
compiled ops against the data-flow and memory rules, the communication-lane rule by hand."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.errors import ConfigError, DeadlockError
from tessera_lab.pipeline.engine import ACTIVATION_CHANGE, Walk, action_inputs, action_outputs, serial_lanes
from tessera_lab.pipeline.programs import _OP_COMPUTE, _compile_programs
from tessera_lab.pipeline.schedules import ActionType, build_schedule
from tessera_lab.pipeline.simulate import simulate, uniform_durations
from tessera_lab.pipeline.timeline import (_Lazy, _exposed_by_rank, _peaks_in_lane_order, interval_gaps,
                                           merge_intervals, overlap_length)

_times = st.integers(0, 12).map(lambda x: x * 0.25)  # a coarse grid: ties, touching and empty intervals are common
_lane = st.lists(st.tuples(_times, _times), max_size=8)  # (gap before, duration) of each compute interval
_comm = st.lists(st.tuples(_times, st.integers(0, 6)), max_size=8)  # (start, quarters) of each comm interval


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_lane, _comm), min_size=1, max_size=4), st.integers(0, 8), st.randoms())
def test_exposure_on_arrays_equals_the_interval_helpers(ranks, tail, rnd):
    """Per rank, compute intervals in lane order (each starts at or after the previous end), comm intervals anywhere
    (overlapping, touching, empty, in any order, ranks mixed): the array computation for all ranks at once gives
    the float of the helpers exactly, rank by rank."""
    lanes, comms = [], []
    for r, (gaps_durs, comm) in enumerate(ranks):
        t = 0.0
        for gap, dur in gaps_durs:
            lanes.append((r, t + gap, t + gap + dur))
            t += gap + dur
        comms += [(r, s, s + 0.25 * k) for s, k in comm]
    rnd.shuffle(comms)
    R = len(ranks)
    T = max([0.0] + [e for _, _, e in lanes + comms]) + 0.25 * tail
    want = [overlap_length(merge_intervals((s, e) for q, s, e in comms if q == r),
                           interval_gaps(merge_intervals((s, e) for q, s, e in lanes if q == r), T)) for r in range(R)]
    cr, cs, ce = (np.array([x[i] for x in lanes], dtype=float if i else np.int64) for i in range(3))
    qr, qs, qe = (np.array([x[i] for x in comms], dtype=float if i else np.int64) for i in range(3))
    assert _exposed_by_rank(np, cr, cs, ce, T, qr, qs, qe, R) == want


def test_exposure_by_hand():
    """Rank 0 computes [0, 1] and [3, 4] in [0, 6]: idle (1, 3) and (4, 6). Transfers (0.5, 2) and (1.5, 3.5) merge
    into (0.5, 3.5): 2 s idle under them; (5, 7) is cut at T = 6 (the caller's): (5, 6) gives 1 more -> 3. Rank 1
    computes nothing: its transfer (2, 2.5) is all exposed; rank 2 has no transfer."""
    got = _exposed_by_rank(np, np.array([0, 0]), np.array([0.0, 3.0]), np.array([1.0, 4.0]), 6.0,
                           np.array([0, 1, 0, 0]), np.array([0.5, 2.0, 1.5, 5.0]), np.array([2.0, 2.5, 3.5, 7.0]), 3)
    assert got == [3.0, 0.5, 0.0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(_times, _times, st.integers(0, 2), st.integers(0, 2)), max_size=8), min_size=1,
                max_size=4))
def test_peaks_in_lane_order_equal_the_sorted_deltas(ranks):
    """Per rank, actions in lane order (gap, duration, activations taken at the start, freed at the end; zero
    durations and ties common): the peak equals the count over the (time, delta) pairs sorted with frees first at
    equal times, as the event list's analysis counts it."""
    r_, cs, ce, plus, minus, want = [], [], [], [], [], []
    for r, acts in enumerate(ranks):
        t, deltas = 0.0, []
        for gap, dur, p, m in acts:
            r_.append(r)
            cs.append(t + gap)
            ce.append(t + gap + dur)
            plus.append(p)
            minus.append(m)
            deltas += [(t + gap, p), (t + gap + dur, -m)]
            t += gap + dur
        live = peak = 0
        for _, d in sorted(x for x in deltas if x[1]):
            live += d
            peak = max(peak, live)
        want.append(peak)
    a = (np.array(x, dtype=np.int64) for x in (r_, plus, minus))
    r_a, plus_a, minus_a = a
    assert _peaks_in_lane_order(np, r_a, np.array(cs, dtype=float), np.array(ce, dtype=float), plus_a, minus_a,
                                len(ranks)) == want


def test_timeline_events_are_made_when_first_read_and_shared_with_the_critical_path(monkeypatch):
    from tessera_lab.pipeline import engine

    monkeypatch.setattr(engine, "ARRAY_TIMELINE_MIN_ACTIONS", 0)  # the array path, as for long schedules
    s = build_schedule("1f1b", 4, 8)
    # the event loop (blocking sends: same semantics without SEND/RECV actions) as the reference; a schedule's first
    # simulation runs the event loop, which records the order the fast path then packs; without latency the closed
    # form of 1F1B, (m + p - 1)(F + B)
    ref = simulate(s, uniform_durations(1.0, 2.0), p2p_latency=0.1, blocking_sends=True)
    assert not isinstance(ref.__dict__.get("_events"), _Lazy)
    tl = simulate(s, uniform_durations(1.0, 2.0), p2p_latency=0.1)
    assert isinstance(tl.__dict__["_events"], _Lazy) and isinstance(tl.__dict__["_critical_path"], _Lazy)
    assert tl.iteration_time == ref.iteration_time
    assert simulate(s, uniform_durations(1.0, 2.0)).iteration_time == (8 + 4 - 1) * 3.0
    ev = tl.events
    assert len(ev) == 2 * 4 * 8 + 2 * 3 * 8  # compute events + one transfer per boundary, direction and micro-batch
    assert all(any(x is e for e in ev) for x in tl.critical_path)
    assert tl.critical_path[-1].end == tl.iteration_time
    back = pickle.loads(pickle.dumps(tl))
    assert back.events == ev and back.summary() == tl.summary() and copy.deepcopy(tl).events == ev


def test_walk_agenda_by_hand():
    """Rank 0 runs two 1 s actions and its second one's output reaches rank 1 0.25 s after it ends; rank 1 then runs
    a 0.5 s action. The policy hook sees ranks in clock order (ties: lower rank first); rank 1 parks on the missing
    input and is due again at its own clock (0) once it is produced, then starts at the arrival (2.25) and ends at
    2.75. Order: r0@0, r1@0 (parks), r0@1 (produces), r1@0 (runs), r0@2 (done), r1@2.75 (done)."""
    w = Walk(2)
    seen = []
    work = {0: [1.0, 1.0], 1: [0.5]}

    def step(r):
        seen.append((r, w.clock[r]))
        if r == 1 and work[1]:
            if ("x",) not in w.arrival:
                w.park(1, ("x",))
                return False
            w.clock[1] = max(w.clock[1], w.arrival[("x",)])
        if work[r]:
            w.clock[r] += work[r].pop(0)
            if r == 0 and not work[0]:
                w.produce(("x",), w.clock[0] + 0.25)
            w.resume(r)
        return False

    w.run(step)
    assert seen == [(0, 0.0), (1, 0.0), (0, 1.0), (1, 0.0), (0, 2.0), (1, 2.75)]
    with pytest.raises(DeadlockError, match="ranks \\[1\\]"):
        Walk.check_finished("demo", [["a"], ["b", "c"]], [1, 1])


def test_walk_stack_order_by_hand():
    """The event loop's tie order: a stack. Ranks 0..2 start due and are taken last first (2, 1, 0); rank 2 parks on
    ``x``, rank 1 produces it (rank 2 due again, taken next, before rank 0) and goes on at once once (``True``);
    a rank already due is not queued twice."""
    w = Walk(3, by_clock=False)
    seen, table = [], {}

    def step(r):
        seen.append(r)
        if r == 2 and ("x",) not in w.arrival:
            table.setdefault(("x",), []).append(2)
            return False
        if r == 1 and ("x",) not in w.arrival:
            w.arrival[("x",)] = 1.0
            w.wake(("x",), table)
            w.resume(0)  # already due: no second entry
            return True
        return False

    w.run(step)
    assert seen == [2, 1, 1, 2, 0] and not table and w.agenda == []


def test_serial_lanes_by_hand():
    """Tasks (ready, order, rank, seconds): rank 0's two tasks ready at 1 and 0 run 0-2 then 2-3 (by ready time); a
    tie at ready 5 on rank 1 goes by order; each starts at the later of ready and the lane's previous end."""
    got = serial_lanes([(1.0, 0, 0, 1.0), (0.0, 1, 0, 2.0), (5.0, 3, 1, 1.0), (5.0, 2, 1, 0.5)], 2)
    assert [(s, e, t[1]) for s, e, t in got] == [(0.0, 2.0, 1), (2.0, 3.0, 0), (5.0, 5.5, 2), (5.5, 6.5, 3)]


@pytest.mark.parametrize("name,vpp", [("1f1b", 1), ("zb-h1", 1), ("overlapped", 1), ("dualpipev", 2),
                                      ("interleaved", 2), ("zb-v", 2)])
def test_compiled_ops_follow_the_rules(name, vpp):
    """The compile phase inlines the data-flow rule: every compute op needs exactly :func:`action_inputs` (from
    another rank or not), produces each non-W leaf's output once, sent on to the consumer :func:`action_outputs`
    names on another rank (a stage-0 backward's gradient, which nothing reads, only locally), and takes and frees the activations :data:`ACTIVATION_CHANGE` gives."""
    sched = build_schedule(name, 4, 8, vpp)
    S, s2r = sched.num_stages, sched.stage_to_rank
    programs, _, _ = _compile_programs(sched)
    for r, prog in enumerate(programs):
        for op in prog:
            assert op[0] == _OP_COMPUTE
            a, needs, produces, plus, minus = op[1], op[2], op[3], op[9], op[10]
            assert list(needs) == [(s2r[src] != r, (k, src, i)) for k, src, i, _ in action_inputs(a, S)]
            want = []
            for x in a.sub_actions or (a,):
                if x.type is ActionType.W:
                    continue  # a W produces nothing; any other leaf its output, sent on to a consumer elsewhere
                key = ("F" if x.type is ActionType.F else "G", x.stage, x.microbatch)
                outs = action_outputs(x, S)
                assert all(o[:3] == key for o in outs)
                cross = [d for *_, d in outs if s2r[d] != r]
                want.append((key, cross[0] if cross else -1))
            assert [p for p in produces] == want
            changes = [ACTIVATION_CHANGE[x.type] for x in a.sub_actions or (a,)]
            assert (plus, minus) == (sum(c for c in changes if c > 0), -sum(c for c in changes if c < 0))


def test_run_shared_by_hand():
    """Two ranks, one action each (2 and 1 CPU-seconds, no inputs) on one core shared equally (speed 1/2 while both
    compute): rank 1 ends at 2 s, rank 0 then runs alone and ends at 2 + 1 = 3 s."""
    spent = []
    t, busy = Walk(2).run_shared([[((), (), 2.0, 0.0)], [((), (), 1.0, 0.0)]],
                                 lambda computing, waiting: 1.0 / max(1, computing), lambda dt, n: spent.append((dt, n)))
    assert t == 3.0 and busy == [3.0, 2.0] and spent == [(2.0, 2), (1.0, 1)]
    with pytest.raises(ConfigError, match="no rank can progress"):
        Walk(1).run_shared([[((("F", 0, 0, False),), (), 1.0, 0.0)]], lambda c, w: 1.0, lambda dt, n: None)


def test_action_inputs_rule():
    s = build_schedule("zb-h1", 3, 3)
    acts = {str(a): a for a in s.actions[1]}
    assert action_inputs(acts["1F0"], 3) == [("F", 0, 0, 1)]
    assert action_inputs(acts["1I0"], 3) == [("F", 1, 0, 1), ("G", 2, 0, 1)]
    assert action_inputs(acts["1W0"], 3) == [("G", 1, 0, 1)] and action_inputs(acts["1W0"], 3, weight=False) == []
    assert acts["1W0"].type is ActionType.W


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-h2", "overlapped", "dualpipev", "interleaved", "gpipe"])
@pytest.mark.parametrize("p2p", [0.0, 0.05, 0.3])
def test_array_timeline_equals_the_event_list_timeline(name, p2p, monkeypatch):
    """The linear pass's timeline analysed on arrays (long schedules) and from its event list (short ones, and with
    comm tasks) are the same, bit for bit: forced onto each path for the same short schedules."""
    import random

    from tessera_lab.pipeline import engine
    from tessera_lab.pipeline.simulate import stage_durations

    rng = random.Random(hash((name, p2p)) % 1000)
    p, vpp = (3, 2) if name == "interleaved" else (4, 1)
    sched = build_schedule(name, p, 8, vpp)
    S = sched.num_stages
    f = [rng.uniform(0.5, 1.5) for _ in range(S)]
    b = [rng.uniform(1.0, 3.0) for _ in range(S)]
    d = stage_durations(f, b, [x * 0.3 for x in b], fb=[x + y * 0.8 for x, y in zip(f, b)])
    pt = lambda a, c: 0.01 * abs(a - c)  # noqa: E731
    runs = []
    for threshold in (10**9, 0):
        monkeypatch.setattr(engine, "ARRAY_TIMELINE_MIN_ACTIONS", threshold)
        tl = simulate(sched, d, p2p_latency=p2p, p2p_time=pt)
        runs.append((tl.summary(), tl.bubble_fraction, tl.bubble_overhead, tl.events, tl.critical_path,
                     simulate(sched, d, p2p_latency=p2p, p2p_time=pt, time_only=True)))
    assert runs[0] == runs[1]
    assert runs[0][5] == runs[0][0]["makespan"]


@pytest.mark.parametrize("name,vpp", [("1f1b", 1), ("zb-h1", 1), ("overlapped", 1), ("dualpipev", 2),
                                      ("interleaved", 2)])
@pytest.mark.parametrize("weight", [True, False])
def test_what_actions_produce_is_what_actions_consume(name, vpp, weight):
    """The producer side of the data-flow rule matches its consumer side on whole schedules: every input some
    action needs is produced by exactly one leaf, and nothing is produced that no action needs."""
    sched = build_schedule(name, 4, 8, vpp)
    S = sched.num_stages
    acts = [a for r in range(sched.num_ranks) for a in sched.actions[r]]
    needed = [k for a in acts for k in action_inputs(a, S, weight=weight)]
    made = [k for a in acts for x in (a.sub_actions or (a,)) for k in action_outputs(x, S, weight=weight)]
    assert len(made) == len(set(made)) and sorted(set(needed)) == sorted(made)
    # by hand, stage 1 of 3: a forward feeds its own backward and stage 2; an I feeds stage 0 and its own W
    leaf = {t: next(a for a in build_schedule("zb-h1", 3, 3).actions[1] if a.type is t)
            for t in (ActionType.F, ActionType.I, ActionType.W)}
    assert action_outputs(leaf[ActionType.F], 3) == [("F", 1, 0, 1), ("F", 1, 0, 2)]
    assert action_outputs(leaf[ActionType.I], 3) == [("G", 1, 0, 0), ("G", 1, 0, 1)]
    assert action_outputs(leaf[ActionType.W], 3) == []

