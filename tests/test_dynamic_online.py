"""The per-EP-group controller and the online executor: agreement with the simulator, hand examples, invariants
(W after its I, W in micro-batch order per stage, the memory cap), no oracle, the CLI acceptance commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cli.main import main
from tessera_lab.dynamic.controller import GapController, WaitPredictor, parse_predictor
from tessera_lab.dynamic.durations import ChunkedDurations, PairDurations, RoutedDurations, StageCosts
from tessera_lab.dynamic.online import _gap_errors, StepRecord, execute, run_online
from tessera_lab.dynamic.planner import check_dependencies
from tessera_lab.errors import ConfigError
from tessera_lab.pipeline import passes
from tessera_lab.pipeline.schedules import build_schedule
from tessera_lab.pipeline.simulate import simulate

SCHEDULES = [("1f1b", 1), ("zb-h1", 1), ("zb-h2", 1), ("overlapped", 1), ("dualpipev", 1), ("interleaved", 2),
             ("gpipe", 1)]


def _split(name, p, m, vpp, chunks):
    base = passes.split_backward(build_schedule(name, p, m, vpp=vpp), 0)
    return base, passes.chunk_weight_gradients(base, chunks)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(SCHEDULES), st.integers(2, 4), st.integers(0, 3), st.integers(1, 3), st.integers(0, 10**6),
       st.sampled_from([0.0, 0.05]))
def test_static_execution_matches_the_simulator(sched, p, extra_m, chunks, seed, lat):
    """Without a controller the executor runs the order as given: same makespan as simulate()."""
    name, vpp = sched
    m = 2 * p + extra_m if name == "dualpipev" else p * (2 if name == "interleaved" else 1) + extra_m
    base, chunked = _split(name, p, m, vpp, chunks)
    S = base.num_stages
    costs = StageCosts.synthetic(S, 1.0, 2.0, 1.0, layers_per_stage=2, fb=2.5)
    d = RoutedDurations(costs, np.random.default_rng(seed).uniform(0.5, 2.0, size=(2 * S, m)))
    dd = PairDurations(d, chunked)
    tl = simulate(chunked, ChunkedDurations(dd, chunks) if chunks > 1 else dd, p2p_latency=lat)
    mine, _ = execute(chunked, d, w_chunks=chunks, p2p_latency=lat)
    assert mine.iteration_time == pytest.approx(tl.iteration_time, rel=1e-12, abs=1e-12)
    assert mine.per_rank_busy == pytest.approx(tl.per_rank_busy)


def test_predictors_by_hand():
    h = [3.0, 1.0, 2.0]
    assert WaitPredictor("last-step").predict(h) == 2.0
    assert parse_predictor("moving-average:2").predict(h) == 1.5
    assert parse_predictor("minimum:3").predict(h) == 1.0
    assert parse_predictor("minimum").window == 4 and str(parse_predictor("moving-average:3")) == "moving-average:3"
    assert WaitPredictor().predict([]) == 0.0  # no history: nothing predicted, the static order runs
    for bad in ("oracle", "last-step:2", "minimum:0", "moving-average:x", ""):
        with pytest.raises(ConfigError, match="predictor"):
            parse_predictor(bad)
    with pytest.raises(ConfigError, match="margin"):
        GapController(margin=1.0)


def test_controller_decisions_by_hand():
    c = GapController("last-step", margin=0.5)
    c.end_step({0: 0.0, 2: 4.0, 5: 1.0}, tail=2.0)
    c.begin_step([0, 2, 5])
    assert c.predicted == {0: 0.0, 2: 4.0, 5: 1.0}
    # fill: seconds <= (1 - 0.5) * 4 - elapsed
    assert c.fits(2, 0.0, 2.0) and not c.fits(2, 0.0, 2.5)
    assert c.fits(2, 1.0, 1.0) and not c.fits(2, 1.0, 1.5)
    assert not c.fits(0, 0.0, 0.1)  # no wait predicted at slot 0
    # defer: displaced seconds <= 0.5 * (waits still ahead + tail): from position 0: 0 + 4 + 1 + 2 = 7
    assert c.may_defer(0, 3.5) and not c.may_defer(0, 3.6)
    assert c.may_defer(2, 1.5) and not c.may_defer(2, 1.6)  # position 2: slot 5's 1.0 + tail 2.0
    assert c.may_defer(3, 1.0) and not c.may_defer(3, 1.1)  # only the tail left
    assert c.decisions["fill"] == 2 and c.decisions["defer"] == 3
    # the policy as the executors call it
    assert c.at_w_place(0, 1.0, 1.0, next_ready=True, live=3, cap=4)
    assert not c.at_w_place(0, 1.0, 1.0, next_ready=False, live=3, cap=4)  # a wait is coming: run W now
    assert not c.at_w_place(0, 1.0, 1.0, next_ready=True, live=4, cap=4)  # no memory left to hold it
    assert not c.at_w_place(0, 3.0, 1.0, next_ready=True, live=3, cap=4)  # 4 s displaced > 3.5 s budget
    assert c.in_wait(2, 0.0, ("W(0,1)", 9.0), ("W(1,0)", 1.0)) == "W(0,1)"  # displaced work first, always
    assert c.in_wait(2, 0.0, None, ("W(1,0)", 1.0)) == "W(1,0)"
    assert c.in_wait(2, 0.0, None, ("W(1,0)", 3.0)) is None
    assert c.in_wait(2, 0.0, None, ("W(1,0)", 1.0), later_slot=0) == "W(1,0)"  # its own place is busy: pull
    assert c.in_wait(2, 0.0, None, ("W(1,0)", 1.0), later_slot=5) is None  # a wait follows its place anyway
    assert c.in_wait(2, 0.0, None, ("W(1,0)", 1.0), later_slot=-1) is None  # it sits in the predicted tail
    assert c.must_free(4, 1, 4) and not c.must_free(3, 1, 4)


def test_gap_errors_by_hand():
    a = StepRecord(waits={0: 1.0, 1: 0.0, 2: 3.0}, predicted={0: 2.0, 1: 0.0, 2: 3.0})
    b = StepRecord(waits={0: 0.0}, predicted={0: 1.0})
    mae, rel = _gap_errors([a, b])
    assert mae == pytest.approx((1.0 + 0.0 + 1.0) / 3)  # slots where both sides are 0 are left out
    assert rel == pytest.approx(2.0 / 4.0)


def test_1f1b_uniform_learns_the_zero_bubble_placement():
    """1F1B p=4, m=8, F=1, I=1, W=1 (one part): unsplit 1F1B takes (m + p - 1)(F + B) = 33; with each B as I then
    W right away the gradient leaves earlier and the step takes 30 (the static baseline). ZB-H1 on the same sizes,
    with its own W placement, simulates to 27 and no order can beat m (F + B) = 24 on rank 0. From step 0's
    waits the controller defers W within the worst rank's memory (4 micro-batches on every rank) and holds 28."""
    c = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=1)
    r = run_online(c, "uniform", schedule="1f1b", microbatches=8, steps=4)
    assert [s["static_s"] for s in r.steps] == [30.0] * 4
    assert r.steps[0]["dynamic_s"] == 30.0  # no history yet: the static order
    assert all(27.0 <= s["dynamic_s"] <= 28.0 for s in r.steps[1:])
    assert r.never_slower and r.throughput_gain == pytest.approx(30 / 28 - 1)


@pytest.mark.parametrize("name,vpp", SCHEDULES[:6])
@pytest.mark.parametrize("routing", ["zipf:1.2", "walk:1.2"])
def test_invariants_on_every_schedule(name, vpp, routing):
    p, m = 4, 8
    S = p * (2 if name in ("dualpipev", "interleaved") else 1)
    c = StageCosts.synthetic(S, 1.0, 2.0, 1.0, layers_per_stage=2)
    r = run_online(c, routing, schedule=name, microbatches=m, vpp=vpp, steps=3, seed=1)
    tl = r.timelines["dynamic"]
    assert check_dependencies(tl) == []  # every W after its I
    seen: dict[int, list[int]] = {}
    for e in sorted((e for e in tl.events if e.type == "W"), key=lambda e: e.start):
        seen.setdefault(e.stage, []).append(e.microbatch)
    assert all(v == sorted(v) for v in seen.values())  # W in micro-batch order per stage: same accumulation order
    assert all(n == 2 * m for n in map(len, seen.values()))  # every W part ran exactly once (2 parts per W)
    assert all(pk <= cap for pk, cap in zip(tl.peak_activations, r.memory_cap))
    s = r.summary()
    assert s["slower_steps"] == [x["step"] for x in r.evaluated if x["dynamic_s"] > x["static_s"] * (1 + 1e-12)]
    assert s["predictor"] == "last-step" and s["prediction_lag_steps"] == 1


def test_no_oracle_the_future_routing_does_not_change_earlier_decisions():
    """Steps 0..2 decide identically whether or not step 3 exists (decisions never read later routing)."""
    c = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=2)
    a = run_online(c, "walk:1.5", schedule="1f1b", microbatches=8, steps=3, seed=3)
    b = run_online(c, "walk:1.5", schedule="1f1b", microbatches=8, steps=4, seed=3)
    assert [s["dynamic_s"] for s in a.steps] == [s["dynamic_s"] for s in b.steps[:3]]


def test_never_slower_over_seeds_or_listed():
    """Small version of benchmarks/bench_dynamic.py (200 seeds): every losing step is listed with its loss."""
    c = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=2)
    losses = []
    gains = []
    for seed in range(6):
        r = run_online(c, "zipf:1.2", schedule="overlapped", microbatches=8, steps=3, seed=seed)
        gains.append(r.throughput_gain)
        losses += [(seed, s["step"], s["gain"]) for s in r.evaluated if s["gain"] < -1e-12]
    assert np.mean(gains) > 0
    assert all(g > -0.01 for _, _, g in losses), losses


def test_walk_skew_gives_a_dynamic_part_over_zb_h1():
    """ZB-H1 with two micro-batches of extra activation memory: no gain at uniform routing (its W placement is
    already zero-bubble there), a positive extra under per-layer drifting skew."""
    c = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=2)
    uni = run_online(c, "uniform", schedule="zb-h1", microbatches=16, steps=4, memory_cap="max+2")
    walk = [run_online(c, "walk:1.5", schedule="zb-h1", microbatches=16, steps=4, memory_cap="max+2", seed=s)
            for s in (0, 2)]
    assert uni.throughput_gain == pytest.approx(0.0, abs=1e-12)
    assert all(w.throughput_gain > 0 for w in walk)


def test_run_online_rejects_bad_input():
    c = StageCosts.synthetic(2, 1.0, 2.0, 1.0)
    with pytest.raises(ConfigError, match="steps"):
        run_online(c, "uniform", schedule="1f1b", microbatches=4, steps=1, warmup=1)
    with pytest.raises(ConfigError, match="predictor"):
        run_online(c, "uniform", schedule="1f1b", microbatches=4, predictor="oracle")
    with pytest.raises(ConfigError, match="memory_cap"):
        run_online(c, "uniform", schedule="1f1b", microbatches=4, memory_cap="max+x")


ACCEPT = ["simulate", "--stages", "8", "--microbatches", "32", "--f", "1", "--b", "2", "--w", "1",
          "--routing", "zipf:1.2", "--dynamic", "--json", "-"]


@pytest.mark.parametrize("schedule", ["overlapped", "dualpipev", "1f1b", "zb-h1"])
def test_cli_acceptance_command(capsys, schedule):
    argv = ACCEPT if schedule == "overlapped" else [a if a != "32" else "16" for a in ACCEPT]
    assert main(argv[:1] + ["--schedule", schedule] + argv[1:]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schedule"] == schedule and out["dynamic"] is True
    # the static part is the controller's gain under uniform routing: a run of its own says what it is
    uniform = [a if a != "zipf:1.2" else "uniform" for a in argv]
    assert main(uniform[:1] + ["--schedule", schedule] + uniform[1:]) == 0
    control = json.loads(capsys.readouterr().out)
    assert out["gain_static_part"] == control["throughput_gain"] and control["gain_dynamic_part"] == 0.0
    assert isinstance(out["slower_steps"], list) and out["never_slower"] == (not out["slower_steps"])
    assert out["predictor"] == "last-step" and out["gap_mae_s"] >= 0


def test_group_decisions_come_from_the_count_exchange():
    """Each EP rank appends its observed waits to its count row; after the exchange every rank holds the same
    rows, hence the same group waits and the same picks (no extra collective, no central controller)."""
    from tessera_lab.dynamic.controller import pack_waits, pick_in_wait, unpack_waits

    slots = [0, 3, 4]
    rows = [pack_waits([5, 3], {3: 0.002, 4: 0.001}, slots), pack_waits([2, 6], {3: 0.001, 4: 0.004}, slots)]
    assert rows[0] == [5, 3, 0, 2000, 1000]
    counts, waits = unpack_waits(rows, 2, slots)
    assert counts == [[5, 3], [2, 6]] and waits == {0: 0.0, 3: 0.002, 4: 0.004}
    picks = []
    for _rank in range(2):
        ctl = GapController("last-step", margin=0.5)
        ctl.end_step(unpack_waits(rows, 2, slots)[1], tail=0.0)
        ctl.begin_step(slots)
        picks.append(pick_in_wait(ctl, 4, 0.0, [("W(1,0)", 0.0008), ("W(1,1)", 0.0008), ("RS(1)", 0.001)]))
    assert picks[0] == picks[1] == ["W(1,0)", "W(1,1)"]  # 1.6 ms fits in half of 4 ms; the RS chunk does not
    with pytest.raises(ConfigError, match="rows"):
        unpack_waits([[1, 2]], 2, slots)


def test_replay_of_a_recorded_routing_log(tmp_path):
    """Replayed counts (tokens per expert per layer per micro-batch, several steps) drive the online run."""
    from tessera_lab.dynamic.routing import token_counts
    from tessera_lab.dynamic.routing_log import write_routing_log

    counts = token_counts("walk:1.5", num_experts=64, tokens=1024, top_k=8, microbatches=8, layers=8, steps=3)
    path = write_routing_log(tmp_path / "routing.json", counts, top_k=8, tokens=1024)
    c = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=2, tokens=1024)
    r = run_online(c, f"replay:{path}", schedule="1f1b", microbatches=8, steps=3)
    assert r.routing == f"replay:{path}" and r.busiest_rank_load_mean > 1.0
    assert len({s["static_s"] for s in r.steps}) == 3  # each step replays its own recorded routing


@pytest.mark.parametrize("extra, needle", [
    (["--predictor", "oracle"], "predictor"),
    (["--margin", "1.5"], "margin"),
    (["--steps", "1"], "steps"),
    (["--memory-cap", "max+x"], "memory_cap"),
])
def test_cli_dynamic_bad_input_exits_2(capsys, extra, needle):
    argv = ["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2",
            "--w", "1", "--routing", "zipf:1", "--dynamic"] + extra
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(SCHEDULES[:6]), st.sampled_from(["uniform", "zipf:1.5", "walk:1.5", "drift:1"]),
       st.sampled_from(["last-step", "moving-average:2", "minimum:2"]), st.floats(0.0, 0.9), st.integers(0, 50),
       st.sampled_from(["max", "rank", "max+1"]))
def test_dynamic_runs_keep_dependencies_order_and_memory(sched, routing, pred, margin, seed, cap):
    name, vpp = sched
    S = 3 * (2 if name in ("dualpipev", "interleaved") else 1)
    c = StageCosts.synthetic(S, 1.0, 2.0, 1.0, layers_per_stage=2)
    r = run_online(c, routing, schedule=name, microbatches=6, vpp=vpp, steps=3, seed=seed, predictor=pred,
                   margin=margin, memory_cap=cap)
    tl = r.timelines["dynamic"]
    assert check_dependencies(tl) == []
    order: dict[int, list[int]] = {}
    for e in sorted((e for e in tl.events if e.type == "W"), key=lambda e: e.start):
        order.setdefault(e.stage, []).append(e.microbatch)
    assert all(v == sorted(v) and len(v) == 2 * 6 for v in order.values())
    assert all(pk <= cp for pk, cp in zip(tl.peak_activations, r.memory_cap))
    busy_static = sum(r.timelines["static"].per_rank_busy)
    assert sum(tl.per_rank_busy) == pytest.approx(busy_static)  # the same work, only moved


def test_grad_sync_takes_stages_in_the_order_they_become_final():
    """Interleaved p=2, v=2: rank 0 holds stages 0 and 2; stage 2's last W ends before stage 0's, so its
    reduce-scatter goes first on the comm lane, starting exactly at that W's end (the lane is free), and stage 0's
    starts at max(stage 2's RS end, stage 0's last W end). Dynamic exposes less sync tail than static."""
    from tessera_lab.cli.simulate import sync_tail

    c = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=1, grad_sync=3.0)
    r = run_online(c, "uniform", schedule="interleaved", vpp=2, microbatches=4, steps=3)
    tl = r.timelines["dynamic"]
    for rank in range(2):
        w_end = {s: max(e.end for e in tl.events if e.rank == rank and e.stage == s and e.type in ("W", "B"))
                 for s in {e.stage for e in tl.events if e.rank == rank and e.type in ("W", "B")}}
        rs = sorted((e for e in tl.events if e.rank == rank and e.type == passes.GRAD_RS), key=lambda e: e.start)
        assert [e.stage for e in rs] == sorted(w_end, key=w_end.get)
        free = 0.0
        for e in rs:
            assert e.start == pytest.approx(max(free, w_end[e.stage])) and e.end - e.start == pytest.approx(3.0)
            free = e.end
    assert sync_tail(tl) < sync_tail(r.timelines["static"]) == pytest.approx(6.0)  # static: 2 x 3 after compute
