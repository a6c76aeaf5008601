"""Tests for tessera_lab.pipeline.simulate (and trace.py, plots.gantt): values worked by hand or taken
from the published closed forms, not from the code's own output."""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tessera_lab.errors import ConfigError, DeadlockError, ScheduleError
from tessera_lab.pipeline.passes import with_comms
from tessera_lab.pipeline.schedules import (
    ActionType,
    build_schedule,
    dualpipev,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    overlapped_1f1b,
    schedule_from_lists,
    zb_h1,
    zb_h2,
)
from tessera_lab.pipeline.simulate import (
    Timeline,
    closed_form,
    compare_with_closed_form,
    override_durations,
    simulate,
    stage_durations,
    uniform_durations,
)

approx = pytest.approx
times = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])


# ----------------------------------------------------------------------------------------------
# 1F1B / GPipe
# ----------------------------------------------------------------------------------------------


def test_one_f_one_b_worked_example():
    # p=4, m=8, F=1, B=2: (m + p - 1)(F + B) = 11 * 3 = 33; each rank works m(F+B) = 24, idles 9.
    tl = simulate(one_f_one_b(4, 8), uniform_durations(1.0, 2.0))
    assert tl.iteration_time == approx(33.0)
    assert tl.per_rank_busy == approx([24.0] * 4)
    assert tl.per_rank_idle == approx([9.0] * 4)
    assert tl.bubble_fraction == approx(9 / 33)
    assert tl.bubble_overhead == approx(0.375)  # (p - 1)/m
    assert tl.makespan == tl.iteration_time


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 6), extra=st.integers(0, 10), f=times, b=times, name=st.sampled_from(["gpipe", "1f1b"]))
def test_gpipe_and_1f1b_makespan_closed_form(p, extra, f, b, name):
    m = p + extra
    tl = simulate(build_schedule(name, p, m), uniform_durations(f, b))
    assert tl.iteration_time == approx((m + p - 1) * (f + b))
    assert tl.bubble_overhead == approx((p - 1) / m)
    assert tl.per_rank_idle == approx([(p - 1) * (f + b)] * p)


def test_gpipe_single_microbatch_runs():
    tl = simulate(gpipe(3, 1), uniform_durations(1.0, 2.0))
    assert tl.iteration_time == approx(9.0)  # three forwards then three backwards in a chain


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 14))
def test_peak_activations(p, m):
    assume(m >= p)
    tl = simulate(one_f_one_b(p, m), uniform_durations(1.0, 2.0))
    assert tl.peak_activations == [min(p - s, m) for s in range(p)]
    assert simulate(gpipe(p, m), uniform_durations(1.0, 2.0)).peak_activations == [m] * p


# ----------------------------------------------------------------------------------------------
# interleaved, zero bubble, DualPipeV, overlapped
# ----------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 5), v=st.integers(2, 3), k=st.integers(1, 3), f=times, b=times)
def test_interleaved_bubble_overhead(p, v, k, f, b):
    m = k * p  # Megatron's setting: micro-batches a multiple of pp
    tl = simulate(interleaved_1f1b(p, v, m), uniform_durations(f, b))  # f, b per chunk
    assert tl.bubble_overhead == approx((p - 1) / (v * m))
    assert tl.iteration_time == approx(v * m * (f + b) + (p - 1) * (f + b))


def test_zb_h1_worked_example():
    # p=2, m=2, F=I=W=1 (B = I + W = 2). Rank 0: F0[0,1] F1[1,2] I0[3,4] W0[4,5] I1[5,6] W1[6,7];
    # rank 1: F0[1,2] I0[2,3] F1[3,4] I1[4,5] W0[5,6] W1[6,7]. Makespan 7 = m(F+B) + (p-1)(F+I-W).
    tl = simulate(zb_h1(2, 2), uniform_durations(1.0, 2.0, w=1.0))
    assert tl.iteration_time == approx(7.0)
    assert tl.per_rank_idle == approx([1.0, 1.0])


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 6), extra=st.integers(0, 8), f=times, i=times, w=times)
def test_zb_h1_bubble(p, extra, f, i, w):
    # Zero Bubble (Qi et al., ICLR 2024): bubble (p-1)(T_F + T_B - T_W) with their T_B = our I,
    # derived for T_W <= T_F and T_W <= T_B.
    assume(w <= f and w <= i)
    m = p + extra
    tl = simulate(zb_h1(p, m), uniform_durations(f, i + w, w=w))
    assert tl.per_rank_idle == approx([(p - 1) * (f + i - w)] * p)
    assert tl.peak_activations[0] == p  # same memory as 1F1B on the first stage


def test_zb_h2_unit_times_reach_the_single_iteration_bound():
    # With F = I = W = 1 every rank has 3m of work and rank p-1 cannot start before (p-1)F,
    # so no schedule beats 3m + p - 1 in one iteration; ZB-H2 reaches it (and so does ZB-H1).
    for p, m in [(2, 3), (4, 8), (4, 12), (5, 9)]:
        tl = simulate(zb_h2(p, m), uniform_durations(1.0, 2.0, w=1.0))
        assert tl.iteration_time == approx(3 * m + p - 1)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 5), extra=st.integers(0, 8), f=times, i=times, w=times)
def test_zb_h2_bubble(p, extra, f, i, w):
    # Paper: ZB-H2 bubble (p-1)(T_F + T_B - 2 T_W); within one iteration it cannot drop below the
    # start-up skew (p-1) T_F, which the paper hides across iterations (post-validation).
    assume(w <= f and w <= i)
    m = 2 * p - 1 + extra
    d = uniform_durations(f, i + w, w=w)
    tl = simulate(zb_h2(p, m), d)
    assert tl.iteration_time == approx(m * (f + i + w) + (p - 1) * max(f, f + i - 2 * w))
    assert tl.iteration_time <= simulate(zb_h1(p, m), d).iteration_time + 1e-9
    assert max(tl.peak_activations) < 3 * p


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 5), extra=st.integers(0, 6), f=times, w=times, gain=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_dualpipev_published_bubble(p, extra, f, w, gain):
    # DeepSeek DualPipe README, DualPipeV row: bubble (PP/2 - 1)(F&B + B - 3W) with PP = 2p stages
    # and per-chunk F, B (full backward), W, F&B. Its derivation assumes input-gradient time = F.
    assume(w <= f)
    b = f + w  # I = F
    fb = max(f, b) + gain * (f + b - max(f, b))
    m = 2 * p + extra
    tl = simulate(dualpipev(p, m), uniform_durations(f, b, w=w, fb=fb))
    bubble = (p - 1) * (fb + b - 3 * w)
    assert max(tl.per_rank_idle) == approx(bubble)
    assert tl.per_rank_idle[-1] == approx(bubble)  # the last rank is the most idle
    assert max(tl.peak_activations) <= 2 * p + 1  # README: PP + 1 activations


def test_overlapped_with_no_overlap_gain_is_1f1b():
    for p, m in [(2, 2), (2, 4), (3, 7), (4, 8), (4, 16)]:
        for f, b in [(1.0, 2.0), (2.0, 1.0), (0.5, 2.0)]:
            plain = simulate(one_f_one_b(p, m), uniform_durations(f, b)).iteration_time
            over = simulate(overlapped_1f1b(p, m), uniform_durations(f, b, fb=f + b)).iteration_time
            assert over == approx(plain)


def test_overlapped_worked_example_is_faster():
    # p=2, m=4, F=1, B=2, F&B = max(F, B) = 2. Rank 0: F0[0,1] F1[1,2] F2[2,3] (F3;B0)[4,6]
    # B1[6,8] B2[8,10] B3[10,12]; rank 1: F0[1,2] (F1;B0)[2,4] (F2;B1)[4,6] (F3;B2)[6,8] B3[8,10].
    # Makespan 12, against 1F1B's (m + p - 1)(F + B) = 15.
    tl = simulate(overlapped_1f1b(2, 4), uniform_durations(1.0, 2.0, fb=2.0))
    assert tl.iteration_time == approx(12.0)
    assert simulate(one_f_one_b(2, 4), uniform_durations(1.0, 2.0)).iteration_time == approx(15.0)
    labels0 = [e.label for e in tl.events if e.rank == 0]
    assert "(0F3;0B0)OVERLAP_F_B" in labels0
    pair = next(e for e in tl.events if e.label == "(0F3;0B0)OVERLAP_F_B")
    assert (pair.start, pair.end) == (approx(4.0), approx(6.0))
    assert pair.type == "OVERLAP_F_B" and pair.microbatch == 0


def test_overlap_durations_called_with_backward_stage_and_microbatch():
    calls = []

    def d(stage, mb, kind):
        calls.append((stage, mb, kind))
        return 1.0

    simulate(dualpipev(2, 4), d)
    pairs = [c for c in calls if c[2] is ActionType.OVERLAP_F_B]
    sched = dualpipev(2, 4)
    expected = [
        (a.sub_actions[1].stage, a.sub_actions[1].microbatch, ActionType.OVERLAP_F_B)
        for r in range(2) for a in sched.actions[r] if a.sub_actions
    ]
    assert sorted(pairs) == sorted(expected) and pairs


# ----------------------------------------------------------------------------------------------
# communication
# ----------------------------------------------------------------------------------------------


def test_p2p_latency_two_stage_worked_example():
    # 1F1B, p=2, m=2, F=1, B=2, latency 0.5 per hop.
    # rank 0: F0[0,1] F1[1,2] B0[5,7] B1[8,10]; rank 1: F0[1.5,2.5] B0[2.5,4.5] F1[4.5,5.5] B1[5.5,7.5]
    tl = simulate(one_f_one_b(2, 2), uniform_durations(1.0, 2.0), p2p_latency=0.5)
    assert tl.iteration_time == approx(10.0)  # 9 + 2 hops * 0.5 on the critical path
    starts = {e.label: e.start for e in tl.events if e.lane == "compute"}
    assert starts["1F0"] == approx(1.5) and starts["0B0"] == approx(5.0) and starts["0B1"] == approx(8.0)
    # transfers into an idle rank are exposed: F0 -> rank 1 [1,1.5]; B0 -> rank 0 [4.5,5];
    # B1 -> rank 0 [7.5,8]; F1 -> rank 1 [2,2.5] overlaps rank 1's compute.
    assert tl.exposed_comm == {"pp_p2p": approx(1.5)}
    assert sum(1 for e in tl.events if e.lane == "comm") == 4
    # GPipe, one micro-batch: F(1) + 0.5 + F(1) + B(2) + 0.5 + B(2) = 7
    assert simulate(gpipe(2, 1), uniform_durations(1.0, 2.0), p2p_latency=0.5).iteration_time == approx(7.0)


def test_p2p_time_callable_and_same_rank_transfers_free():
    seen = []

    def p2p(src, dst):
        seen.append((src, dst))
        return 0.25

    tl = simulate(dualpipev(2, 4), uniform_durations(1.0, 2.0, w=1.0), p2p_time=p2p)
    # V placement: stages 1 and 2 share rank 1, so 1 <-> 2 never crosses ranks
    assert seen and all({src, dst} != {1, 2} for src, dst in seen)
    assert tl.iteration_time > simulate(dualpipev(2, 4), uniform_durations(1.0, 2.0, w=1.0)).iteration_time


def test_zero_time_transfers_are_no_ops():
    tl = simulate(one_f_one_b(3, 4), uniform_durations(1.0, 2.0), p2p_latency=0.0, p2p_time=0.0)
    assert all(e.lane == "compute" for e in tl.events)
    assert tl.exposed_comm == {}


def test_explicit_comms_match_implicit_ones():
    s = one_f_one_b(3, 5)
    d = uniform_durations(1.0, 2.0)
    a = simulate(s, d, p2p_latency=0.3)
    b = simulate(with_comms(s), d, p2p_latency=0.3)
    assert b.iteration_time == approx(a.iteration_time)


def _send_first_order():
    # Two ranks, 2 micro-batches, GPipe-like: each rank posts a send before the receive the
    # other rank is waiting in. Fine with non-blocking sends, a deadlock with rendezvous sends:
    # rank 0 blocks in 0SEND_F1 (rank 1 has not posted 1RECV_F1), rank 1 blocks in 1SEND_B0
    # (rank 0 has not posted 0RECV_B0).
    return schedule_from_lists(
        "send-first",
        {
            0: ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"],
            1: ["1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"],
        },
    )


def test_blocking_sends_deadlock_is_reported():
    s = _send_first_order().validate()  # the compute order itself is fine
    d = uniform_durations(1.0, 2.0)
    assert simulate(s, d, p2p_latency=0.1).iteration_time > 0  # non-blocking: runs
    with pytest.raises(DeadlockError) as exc:
        simulate(s, d, p2p_latency=0.1, blocking_sends=True)
    assert exc.value.stuck == {0: "0SEND_F1", 1: "1SEND_B0"}
    assert "rank 0" in str(exc.value) and "rank 1" in str(exc.value)
    # zero-time transfers still rendezvous: the order still deadlocks
    with pytest.raises(DeadlockError):
        simulate(s, d, blocking_sends=True)


def test_blocking_sends_in_a_safe_order_wait_for_the_receiver():
    # GPipe, p=2, m=3, stage 0: F=1, stage 1: F=2, B=1 everywhere, explicit comms.
    # Non-blocking: rank 0 runs F0[0,1] F1[1,2] F2[2,3]. Rendezvous: 0SEND_F1 (posted at 2) waits
    # until rank 1 posts 1RECV_F1 after 1F0[1,3], so 0F2 starts at 3. Both end at 11:
    # rank 1 F0[1,3] F1[3,5] F2[5,7] B0[7,8] B1[8,9] B2[9,10]; rank 0 B0[8,9] B1[9,10] B2[10,11].
    s = schedule_from_lists(
        "gpipe-comms",
        {
            0: ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0F2", "0SEND_F2",
                "0RECV_B0", "0B0", "0RECV_B1", "0B1", "0RECV_B2", "0B2"],
            1: ["1RECV_F0", "1F0", "1RECV_F1", "1F1", "1RECV_F2", "1F2",
                "1B0", "1SEND_B0", "1B1", "1SEND_B1", "1B2", "1SEND_B2"],
        },
    ).validate()
    d = stage_durations([1.0, 2.0], [1.0, 1.0])
    free = simulate(s, d)
    rendezvous = simulate(s, d, blocking_sends=True)
    start = lambda tl, label: next(e.start for e in tl.events if e.label == label)  # noqa: E731
    assert start(free, "0F2") == approx(2.0)
    assert start(rendezvous, "0F2") == approx(3.0)
    assert free.iteration_time == approx(11.0) and rendezvous.iteration_time == approx(11.0)


def test_compute_cycle_is_a_deadlock_not_a_hang():
    s = schedule_from_lists("cycle", {0: ["0B0", "0F0"], 1: ["1F0", "1B0"]})
    with pytest.raises(DeadlockError) as exc:
        simulate(s, uniform_durations(1.0, 2.0))
    assert exc.value.stuck == {0: "0B0", 1: "1F0"}


def test_extra_collectives_exposed_only_when_compute_idles():
    # 1F1B p=2, m=2, F=1, B=2: rank 0 F0[0,1] F1[1,2] B0[4,6] B1[7,9];
    # rank 1 F0[1,2] B0[2,4] F1[4,5] B1[5,7]. Makespan 9.
    s = one_f_one_b(2, 2)
    d = uniform_durations(1.0, 2.0)
    comm = [
        (1, "dp_allreduce", 1.5, "1B1"),  # [7, 8.5] on rank 1, idle after 7 -> 1.5 exposed
        (0, "dp_allreduce", 1.0, "0B0"),  # [6, 7] on rank 0, idle [6,7] -> 1.0 exposed
        (0, "ep_all_to_all", 0.5, "0F0"),  # [1, 1.5] while rank 0 runs F1 -> hidden
        (0, "noop", 0.0, "0F0"),  # zero-size: no event
    ]
    tl = simulate(s, d, comm=comm)
    assert tl.iteration_time == approx(9.0)
    assert tl.exposed_comm["dp_allreduce"] == approx(2.5)
    assert tl.exposed_comm["ep_all_to_all"] == approx(0.0)
    assert "noop" not in tl.exposed_comm
    tl2 = simulate(s, d, comm=[{"rank": 0, "collective": "dp", "seconds": 2.0, "after": "0B1"}])
    assert tl2.iteration_time == approx(11.0)  # a tail collective extends the iteration
    assert tl2.exposed_comm["dp"] == approx(2.0)
    assert tl2.per_rank_idle[0] == approx(11.0 - 6.0)
    with pytest.raises(ConfigError, match="does not run on rank 1"):
        simulate(s, d, comm=[(1, "dp", 1.0, "0B0")])


# ----------------------------------------------------------------------------------------------
# durations, metrics, outputs
# ----------------------------------------------------------------------------------------------


def test_duration_helpers():
    d = uniform_durations(1.0, 3.0, w=1.0)
    assert [d(0, 0, k) for k in (ActionType.F, ActionType.B, ActionType.I, ActionType.W, ActionType.OVERLAP_F_B)] == [
        1.0, 3.0, 2.0, 1.0, 4.0]
    assert uniform_durations(1.0, 2.0)(0, 0, ActionType.W) == 0.0
    sd = stage_durations([1.0, 2.0], [2.0, 4.0], w=[0.5, 1.0], fb=max)
    assert sd(1, 5, ActionType.I) == 3.0 and sd(1, 5, ActionType.OVERLAP_F_B) == 4.0
    assert stage_durations([1.0], [2.0], fb=[2.5])(0, 0, ActionType.OVERLAP_F_B) == 2.5
    for bad in [lambda: uniform_durations(-1.0, 2.0), lambda: uniform_durations(1.0, 2.0, w=3.0),
                lambda: stage_durations([1.0, 2.0], [1.0]), lambda: uniform_durations(float("nan"), 1.0)]:
        with pytest.raises(ConfigError):
            bad()


def test_per_stage_and_per_microbatch_durations():
    # 1F1B p=2, m=2 with a slow second stage (F=2, B=4): stage 1 is the bottleneck:
    # rank 1: F0[1,3] B0[3,7] F1[7,9] B1[9,13]; rank 0: B0[7,9] ... B1[13,15].
    tl = simulate(one_f_one_b(2, 2), stage_durations([1.0, 2.0], [2.0, 4.0]))
    assert tl.iteration_time == approx(15.0)
    # variable routing: micro-batch 1's forward on stage 1 takes 3 instead of 2 -> +1
    slow = override_durations(stage_durations([1.0, 2.0], [2.0, 4.0]), {(1, 1, "F"): 3.0})
    assert simulate(one_f_one_b(2, 2), slow).iteration_time == approx(16.0)
    with pytest.raises(ConfigError):
        override_durations(slow, {(0, 0, "Q"): 1.0})


def test_negative_duration_from_callable_is_rejected():
    with pytest.raises(ScheduleError, match="returned"):
        simulate(gpipe(2, 1), lambda s, m, k: -1.0)


def test_critical_path_spans_the_iteration():
    tl = simulate(one_f_one_b(4, 8), uniform_durations(1.0, 2.0), p2p_latency=0.1)
    path = tl.critical_path
    assert path[0].start == approx(0.0)
    assert path[-1].end == approx(tl.iteration_time)
    for a, b in zip(path, path[1:]):
        assert b.start == approx(a.end)  # tight chain: each event starts when its binder ends
    assert any(e.lane == "comm" for e in path)  # latency sits on the critical path


def test_dataframe_and_chrome_trace(tmp_path):
    tl = simulate(one_f_one_b(2, 3), uniform_durations(1e-3, 2e-3), p2p_latency=1e-4)
    df = tl.to_dataframe()
    assert list(df.columns) == ["rank", "stage", "microbatch", "type", "start", "end", "duration", "lane", "label"]
    assert len(df) == len(tl.events)
    out = tl.to_chrome_trace(tmp_path / "sub" / "trace.json")
    data = json.loads(out.read_text())
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tl.events)
    first = next(e for e in xs if e["name"] == "0F0")
    assert first["ts"] == approx(0.0) and first["dur"] == approx(1000.0)  # microseconds
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["trace.json"]
    assert tl.summary()["makespan"] == tl.iteration_time


@pytest.mark.parametrize("style", ["default", "dark_background"])
def test_gantt_draws(style):
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    from tessera_lab.ui.plots import gantt

    with plt.style.context(style):
        for sched in (one_f_one_b(3, 4), dualpipev(2, 4), interleaved_1f1b(2, 2, 4)):
            tl = simulate(sched, uniform_durations(1.0, 2.0, w=1.0, fb=2.5), p2p_latency=0.1)
            ax = gantt(tl)
            assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(sched.num_ranks)]
            assert any(t.get_text() == "0" for t in ax.texts)  # micro-batch numbers on bars
            plt.close(ax.figure)


def test_gantt_writes_two_digit_labels_where_they_fit():
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    from tessera_lab.ui.plots import gantt

    tl = simulate(one_f_one_b(4, 16), uniform_durations(1.0, 2.0))
    ax = gantt(tl)
    ax.figure.canvas.draw()
    shown = [t for t in ax.texts if getattr(t, "shown", False)]
    assert {t.get_text() for t in shown} == {str(m) for m in range(16)}  # 10-15 as well as 0-9
    assert len(shown) == 2 * 4 * 16  # every F and B bar of every rank is labelled
    plt.close(ax.figure)
    # bars far too narrow for any label: labels are skipped, not drawn over the neighbours
    ax = gantt(simulate(one_f_one_b(2, 400), uniform_durations(1.0, 2.0)))
    ax.figure.canvas.draw()
    assert not any(getattr(t, "shown", False) and len(t.get_text()) == 3 for t in ax.texts)
    plt.close(ax.figure)


# ----------------------------------------------------------------------------------------------
# closed forms
# ----------------------------------------------------------------------------------------------


def test_closed_form_textbook_values():
    cf = closed_form("1f1b", 4, 8, 1.0, 2.0)
    assert cf["makespan"] == 33.0 and cf["bubble_overhead"] == approx(0.375) and cf["exact"]
    assert cf["bubble_fraction"] == approx(9 / 33)
    cf = closed_form("interleaved", 4, 8, 1.0, 2.0, vpp=2)
    assert cf["bubble_overhead"] == approx(3 / 16)
    cf = closed_form("zb-h1", 4, 8, 1.0, 2.0, w=1.0)
    assert cf["bubble_per_rank"] == approx(3.0)  # (p-1)(F + I - W) = 3 * 1
    cf = closed_form("dualpipev", 4, 8, 1.0, 2.0, w=1.0, fb=2.0)
    assert cf["bubble_per_rank"] == approx(3 * (2.0 + 2.0 - 3.0))
    cf = closed_form("zb-h2", 4, 8, 1.0, 2.5, w=0.5)
    assert cf["published_bubble"] == approx(3 * (1.0 + 2.0 - 1.0))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "dualpipev", "overlapped"])
def test_compare_with_closed_form_agrees_when_exact(name):
    vpp = 2 if name == "interleaved" else 1
    res = compare_with_closed_form(name, 4, 8, 1.0, 2.0, w=1.0, fb=2.5, vpp=vpp)
    assert res["exact"]
    for row in res["rows"]:
        if row["metric"] != "published_bubble" or name == "dualpipev":
            assert row["difference"] == approx(0.0, abs=1e-9), row
    assert isinstance(res["timeline"], Timeline)
    # per-rank times: interleaved chunks take f / vpp
    res2 = compare_with_closed_form(name, 4, 8, 1.0, 2.0, w=1.0, fb=2.5, vpp=vpp, per_rank_times=True)
    assert res2["simulated"]["makespan"] == approx(res2["closed_form"]["makespan"])


def test_closed_forms_state_their_assumptions_and_flag_inputs_outside_them():
    """Interleaved with m < p and overlapped with p2p time: the closed form is off, and its assumptions say so."""
    from tessera_lab.pipeline.simulate import compare_with_closed_form

    r = compare_with_closed_form("interleaved", 4, 2, 1.0, 2.0, vpp=2)
    outside = [a["assumption"] for a in r["assumptions"] if not a["holds"]]
    assert not r["exact"] and len(outside) == 1 and outside[0].startswith("m is a multiple of p")
    assert r["simulated"]["makespan"] > r["closed_form"]["makespan"]
    r = compare_with_closed_form("overlapped", 4, 8, 1.0, 2.0, fb=2.5, p2p_latency=0.1)
    outside = [a["assumption"] for a in r["assumptions"] if not a["holds"]]
    assert not r["exact"] and len(outside) == 1 and outside[0].startswith("no p2p transfer time")
    r = compare_with_closed_form("zb-h1", 4, 8, 1.0, 2.0, 1.0)
    assert r["exact"] and all(a["holds"] for a in r["assumptions"])
    assert r["simulated"]["makespan"] == pytest.approx(r["closed_form"]["makespan"])
