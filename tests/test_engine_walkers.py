"""The walks over action lists that run on the pipeline engine reproduce, bit for bit, the outputs recorded before
they moved onto it (tests/data/walkers_golden.json, from tests/_walkers_cases.py): the dynamic controller's
step-by-step execution (static and with controllers over three steps: events, waits, predictions, decisions) and
the CPU testbed's processor sharing (iteration, busy, rates, CPU)."""

from __future__ import annotations

import json

from _walkers_cases import GOLDEN, execute_outputs, shared_outputs


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_online_execution_reproduces_the_recorded_outputs():
    got = json.loads(json.dumps(execute_outputs()))  # same JSON round trip as the recording
    want = _golden()["execute"]
    assert sorted(got) == sorted(want)
    for case in want:
        assert got[case] == want[case], case


def test_processor_sharing_reproduces_the_recorded_outputs():
    got = json.loads(json.dumps(shared_outputs()))
    want = _golden()["shared"]
    assert sorted(got) == sorted(want)
    for case in want:
        assert got[case] == want[case], case


def test_walk_replay_hand_example_and_deadlock():
    """Two stages on two ranks, one micro-batch, 0.5 s per hop: F0 ends 1, F1 runs 1.5-3.5, I1 3.5-6.5, W1 ends 7.5;
    I0 starts at 6.5 + 0.5 = 7 and ends 10, W0 ends 11.5; both stages on one rank run back to back (1 + 2 + 3 + 3 +
    1 + 1.5). An order whose I0 precedes F0 cannot run: None."""
    from tessera_lab.pipeline.actions import Action, ActionType
    from tessera_lab.pipeline.engine import Walk

    F, I, W = ActionType.F, ActionType.I, ActionType.W
    lists = [[Action(0, F, 0), Action(0, I, 0), Action(0, W, 0)], [Action(1, F, 0), Action(1, I, 0), Action(1, W, 0)]]
    f, i, w = [1.0, 2.0], [3.0, 3.0], [1.5, 1.0]
    assert Walk(2, by_clock=False).replay(lists, [0, 1], 1, f, i, w, 0.5) == 11.5
    one = [[Action(0, F, 0), Action(1, F, 0), Action(1, I, 0), Action(0, I, 0), Action(1, W, 0), Action(0, W, 0)]]
    assert Walk(1, by_clock=False).replay(one, [0, 0], 1, f, i, w, 0.5) == 11.5  # one rank: no hop, back to back
    stuck = [[Action(0, I, 0), Action(0, F, 0), Action(0, W, 0)], lists[1]]
    assert Walk(2, by_clock=False).replay(stuck, [0, 1], 1, f, i, w, 0.5) is None


def test_pruned_search_replay_equals_the_simulator():
    """The pruned search's replay (the engine's replay policy behind an activation-budget check) gives the
    simulator's float for one-stage-per-rank orders, and ``None`` past the budget."""
    from tessera_lab.pipeline.durations import stage_durations
    from tessera_lab.pipeline.engine import simulate
    from tessera_lab.pipeline.generators import zb_h1
    from tessera_lab.pipeline.zbsingle import replay_single

    for p, m in ((2, 3), (4, 8), (5, 7)):
        sched = zb_h1(p, m)
        f = [1.0 + 0.1 * s for s in range(p)]
        i, w = [1.3 - 0.05 * s for s in range(p)], [0.7] * p
        d = stage_durations(f, [a + b for a, b in zip(i, w)], w)
        got = replay_single(sched.actions, m, f, i, w, 0.03, 10**9)
        assert got == simulate(sched, d, p2p_time=0.03).iteration_time and got > 0
        assert replay_single(sched.actions, m, f, i, w, 0.03, p - 1) is None  # ZB-H1 holds p on its first rank
