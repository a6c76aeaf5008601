"""Zero-bubble schedules (tessera_lab.pipeline.zerobubble): ZB-H2 within 2p - 1 micro-batches, the memory model's
in-flight count against the simulated peaks, the zb-auto search's never-slower rules, ZB-V, and ZB-H1 with m < p."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tessera_lab.cost.memory import in_flight
from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.schedules import ActionType, build_schedule, zb_auto, zb_h1, zb_h2, zb_v
from tessera_lab.pipeline.simulate import closed_form, simulate, stage_durations, uniform_durations
from tessera_lab.pipeline.zbsingle import greedy_single
from tessera_lab.pipeline.zerobubble import POLICIES, Policy, greedy_order, peak_memory

EXAMPLES = int(os.environ.get("TESSERA_ZB_EXAMPLES", "12"))


def _grid():
    for p in range(2, 9):
        for m in sorted({p, p + 1, 2 * p - 1, 2 * p, 3 * p}):
            yield p, m


@pytest.mark.parametrize("p, m", list(_grid()))
def test_zb_h2_peak_within_2p_minus_1_and_memory_model_agrees(p, m):
    sched = zb_h2(p, m).validate()
    for d in (uniform_durations(1.0, 2.0, 1.0), uniform_durations(1.5, 2.0, 0.4), uniform_durations(1.0, 3.0, 1.0)):
        peaks = simulate(sched, d).peak_activations
        assert max(peaks) <= 2 * p - 1
        # the planner's memory model (cost.memory.in_flight) equals the simulated peak on every rank
        assert [in_flight("zb-h2", p, s, m) for s in range(p)] == [float(x) for x in peaks]


@pytest.mark.parametrize("p, m", [(2, 3), (3, 5), (4, 7), (4, 12), (6, 11), (8, 15), (8, 24)])
@pytest.mark.parametrize("f, b, w", [(1.0, 2.0, 1.0), (1.0, 2.0, 0.5), (1.5, 2.0, 0.7), (2.0, 3.0, 1.0)])
def test_zb_h2_keeps_the_paper_makespan(p, m, f, b, w):
    # hand formula (Qi et al.): m (F + B) + (p - 1) max(F, F + I - 2W), exact for m >= 2p - 1 and W <= min(F, I)
    i = b - w
    expected = m * (f + b) + (p - 1) * max(f, f + i - 2 * w)
    assert simulate(zb_h2(p, m), uniform_durations(f, b, w)).iteration_time == pytest.approx(expected)
    assert closed_form("zb-h2", p, m, f, b, w)["makespan"] == pytest.approx(expected)


def test_zb_h2_first_rank_warm_up_is_2p_minus_1_forwards():
    order = zb_h2(4, 12).compute_order(0)
    assert order[:8] == [f"0F{i}" for i in range(7)] + ["0I0"]


@pytest.mark.parametrize("p, m", [(2, 1), (3, 2), (4, 1), (4, 3), (5, 4)])
def test_zb_h1_accepts_fewer_microbatches_than_stages(p, m):
    sched = zb_h1(p, m).validate()
    tl = simulate(sched, uniform_durations(1.0, 2.0, 1.0))
    assert tl.peak_activations == [m] * p  # min(p, m): every micro-batch is in flight before the first W
    assert [in_flight("zb-h1", p, s, m) for s in range(p)] == [float(m)] * p



stage_times = st.lists(st.floats(0.2, 3.0), min_size=10, max_size=10)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(2, 5), extra=st.integers(0, 8), f=stage_times, i=stage_times, w=stage_times,
       p2p=st.sampled_from([0.0, 0.01, 0.1, 0.5]), kfrac=st.floats(0.0, 1.0))
def test_zb_auto_never_slower_than_zb_h1_and_zb_h2_and_fits_budget(p, extra, f, i, w, p2p, kfrac):
    m = p + extra
    f, i, w = f[:p], i[:p], w[:p]
    d = stage_durations(f, [a + b for a, b in zip(i, w)], w)
    h1 = simulate(zb_h1(p, m), d, p2p_time=p2p).iteration_time
    h2 = simulate(zb_h2(p, m), d, p2p_time=p2p).iteration_time
    for K in (p, 2 * p - 1, p + kfrac * (p - 1)):
        sched = zb_auto(p, m, f, i, w, p2p=p2p, memory_budget=K)
        tl = simulate(sched, d, p2p_time=p2p)
        assert tl.iteration_time == pytest.approx(sched.meta["makespan"])
        assert max(peak_memory(sched, tl)) <= K + 1e-9
        assert all(a.type in (ActionType.F, ActionType.I, ActionType.W) for r in range(p) for a in sched.actions[r])
        if K >= p:
            assert tl.iteration_time <= h1 * (1 + 1e-12)
        if K >= 2 * p - 1:
            assert tl.iteration_time <= h2 * (1 + 1e-12)


near_one = st.lists(st.sampled_from([0.8, 0.9, 1.0, 1.1, 1.25]), min_size=6, max_size=6)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=st.integers(3, 5), rounds=st.sampled_from([2, 3]), f=near_one, i=near_one, w=near_one,
       p2p=st.sampled_from([0.0, 0.05, 0.2]), data=st.data())
def test_zb_auto_strictly_shorter_between_p_and_2p_minus_1(p, rounds, f, i, w, p2p, data):
    """Budgets strictly between ZB-H1's p and ZB-H2's 2p - 1, non-uniform per-stage times (within 25 %):
    zb-auto is strictly shorter than ZB-H1 (the hand schedule that fits; ZB-H2 does not fit the budget), unless
    ZB-H1 already meets the lower bound max_r (sum_{s<r} (F_s + p2p) + m (F_r + I_r + W_r)): rank r cannot start
    before its first input arrives and then has all its work to do (hypothesis found such cases: a heavier last
    stage makes ZB-H1 optimal)."""
    m = rounds * p
    f, i, w = f[:p], i[:p], [x * 0.7 for x in w[:p]]
    assume(len(set(f)) > 1 or len(set(i)) > 1 or len(set(w)) > 1)
    K = data.draw(st.integers(p + 1, 2 * p - 2))
    d = stage_durations(f, [a + b for a, b in zip(i, w)], w)
    h1 = simulate(zb_h1(p, m), d, p2p_time=p2p).iteration_time
    tl_h2 = simulate(zb_h2(p, m), d, p2p_time=p2p)
    assert max(tl_h2.peak_activations) > K
    sched = zb_auto(p, m, f, i, w, p2p=p2p, memory_budget=K)
    bound = max(sum(f[s] + p2p for s in range(r)) + m * (f[r] + i[r] + w[r]) for r in range(p))
    assert sched.meta["makespan"] >= bound * (1 - 1e-9)
    assert sched.meta["makespan"] < h1 * (1 - 1e-9) or h1 <= bound * (1 + 1e-9)


def test_zb_auto_hand_example_uniform_times():
    # uniform F = I = W = 1, no p2p: at K = 2p - 1 the search matches ZB-H2's m (F + B) + (p - 1) F exactly,
    # at K = p it matches ZB-H1's m (F + B) + (p - 1)(F + I - W)
    p, m = 4, 8
    assert zb_auto(p, m, memory_budget=2 * p - 1).meta["makespan"] == pytest.approx(m * 3 + (p - 1) * 1)
    assert zb_auto(p, m, memory_budget=p).meta["makespan"] == pytest.approx(m * 3 + (p - 1) * 1)
    assert build_schedule("zb-auto", p, m, memory_budget=p).name == "zb-auto"


def test_zb_auto_rejects_bad_input():
    with pytest.raises(ScheduleError, match="memory_budget"):
        zb_auto(4, 8, memory_budget=0.5)
    with pytest.raises(ScheduleError, match="one per stage"):
        zb_auto(4, 8, f=[1.0, 2.0])
    with pytest.raises(ScheduleError, match="vpp"):
        zb_auto(4, 8, vpp=3)
    with pytest.raises(ScheduleError, match="p2p"):
        zb_auto(4, 8, p2p=-1.0)


@pytest.mark.parametrize("p, m", [(2, 4), (3, 6), (4, 8), (4, 5), (6, 12)])
def test_zb_v_two_chunks_v_placement_within_1f1b_memory(p, m):
    sched = zb_v(p, m).validate()
    assert sched.num_stages == 2 * p
    assert all(sched.rank_stages(r) == [r, 2 * p - 1 - r] for r in range(p))
    tl = simulate(sched, uniform_durations(1.0, 2.0, 1.0))
    assert max(peak_memory(sched, tl)) <= p  # 1F1B's peak: p micro-batches of a rank's activations
    # same model, same memory: shorter than 1F1B and ZB-H1 with each rank's two chunks merged into one stage
    merged = uniform_durations(2.0, 4.0, 2.0)
    assert tl.iteration_time < simulate(zb_h1(p, m), merged).iteration_time
    if m >= p:
        assert tl.iteration_time < simulate(build_schedule("1f1b", p, m), uniform_durations(2.0, 4.0)).iteration_time


def _cli_makespan(tmp_path, *args):
    from tessera_lab.cli.main import main
    import json

    out = tmp_path / "out.json"
    assert main(["simulate", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2.2", "--w", "0.8",
                 "--p2p-latency", "0.05", "--json", str(out), *args]) == 0
    return json.loads(out.read_text())


def test_cli_simulate_zb_auto_never_slower(tmp_path, capsys):
    from tessera_lab.cli.main import main

    h1 = _cli_makespan(tmp_path, "--schedule", "zb-h1")["makespan"]
    h2 = _cli_makespan(tmp_path, "--schedule", "zb-h2")["makespan"]
    at_p = _cli_makespan(tmp_path, "--schedule", "zb-auto", "--memory-budget", "4")
    at_2p = _cli_makespan(tmp_path, "--schedule", "zb-auto", "--memory-budget", "7")
    between = _cli_makespan(tmp_path, "--schedule", "zb-auto", "--memory-budget", "5")
    assert at_p["makespan"] <= h1 and at_2p["makespan"] <= h2 and between["makespan"] <= h1
    assert max(between["peak_activations"]) <= 5 and between["memory_budget"] == 5
    capsys.readouterr()
    assert main(["simulate", "--schedule", "zb-auto", "--memory-budget", "0.5", "--stages", "4", "--microbatches",
                 "8", "--f", "1", "--b", "2"]) == 2
    assert "memory_budget" in capsys.readouterr().err
    assert main(["simulate", "--schedule", "1f1b", "--memory-budget", "3", "--stages", "4", "--microbatches", "8",
                 "--f", "1", "--b", "2"]) == 2


@settings(max_examples=EXAMPLES, deadline=None)
@given(p=st.integers(2, 5), extra=st.integers(0, 5), f=stage_times, i=stage_times, w=stage_times,
       p2p=st.sampled_from([0.0, 0.03, 0.4]), vpp=st.sampled_from([1, 2]))
def test_candidate_replay_equals_the_simulator(p, extra, f, i, w, p2p, vpp):
    from tessera_lab.pipeline.zerobubble import _replay

    m, S = p + extra, p * vpp
    f, i, w = f[:S], i[:S], w[:S]
    d = stage_durations(f, [a + b for a, b in zip(i, w)], w)
    scheds = [zb_auto(p, m, f, i, w, p2p=p2p, vpp=vpp)] + ([zb_h1(p, m), zb_h2(p, m)] if vpp == 1 and m >= p else [])
    for sched in scheds:
        assert _replay(sched, d, p2p, 10**9) == simulate(sched, d, p2p_time=p2p).iteration_time


@settings(max_examples=max(4, EXAMPLES // 2), deadline=None)
@given(p=st.integers(2, 4), extra=st.integers(0, 4), f=stage_times, i=stage_times, w=stage_times,
       p2p=st.sampled_from([0.0, 0.05, 0.3]))
def test_zb_auto_v_placement_never_slower_than_zb_v(p, extra, f, i, w, p2p):
    m, S = p + extra, 2 * p
    f, i, w = f[:S], i[:S], w[:S]
    d = stage_durations(f, [a + b for a, b in zip(i, w)], w)
    sched = zb_auto(p, m, f, i, w, p2p=p2p, memory_budget=p, vpp=2)
    tl = simulate(sched, d, p2p_time=p2p)
    assert max(peak_memory(sched, tl)) <= p + 1e-9
    assert tl.iteration_time <= simulate(zb_v(p, m), d, p2p_time=p2p).iteration_time * (1 + 1e-12)


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 3, 5, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2),
                                           ("zb-h1", 4, 3, 1), ("zb-h2", 4, 9, 1), ("dualpipev", 3, 6, 2),
                                           ("overlapped", 4, 8, 1), ("zb-v", 3, 6, 2), ("zb-auto", 4, 8, 1)])
def test_order_peak_equals_simulated_peak(name, p, m, v):
    from tessera_lab.pipeline.zerobubble import order_peak

    sched = build_schedule(name, p, m, vpp=v)
    for d in (uniform_durations(1.0, 2.0, 1.0, 2.5), uniform_durations(0.3, 2.0, 0.1, 1.0)):
        assert order_peak(sched) == simulate(sched, d).peak_activations


@settings(max_examples=max(4, EXAMPLES // 2), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p=st.integers(2, 5), extra=st.integers(0, 6), f=st.floats(0.1, 3.0), b=st.floats(0.2, 6.0),
       wfrac=st.floats(0.0, 1.0), lat=st.sampled_from([0.0, 0.02, 0.3]), kfrac=st.floats(0.0, 1.0))
def test_cli_zb_auto_never_slower_random(tmp_path, p, extra, f, b, wfrac, lat, kfrac):
    """``simulate --schedule zb-auto --memory-budget K`` against ``--schedule zb-h1`` / ``zb-h2`` runs."""
    from tessera_lab.cli.main import main
    import json

    def run(*args):
        out = tmp_path / "o.json"
        assert main(["simulate", "--stages", str(p), "--microbatches", str(p + extra), "--f", repr(f), "--b", repr(b),
                     "--w", repr(b * wfrac), "--p2p-latency", repr(lat), "--json", str(out), *args]) == 0
        return json.loads(out.read_text())

    h1, h2 = run("--schedule", "zb-h1")["makespan"], run("--schedule", "zb-h2")["makespan"]
    for K in (p, 2 * p - 1, p + kfrac * (p - 1)):
        res = run("--schedule", "zb-auto", "--memory-budget", repr(K))
        assert max(res["peak_activations"]) <= K + 1e-9
        assert res["makespan"] <= h1 * (1 + 1e-12)
        if K >= 2 * p - 1:
            assert res["makespan"] <= h2 * (1 + 1e-12)


_PINNED = json.loads((Path(__file__).parent / "data" / "zb_auto_makespans.json").read_text())["cases"]


def test_zb_auto_never_longer_than_the_pinned_makespans():
    """The makespans of the exhaustive candidate search (revision 89dd0f4, tests/data/zb_auto_makespans.json: the
    304 searches of bench_schedules.py's profiles at pp 4, 6, 8, 12) are an upper bound on every case."""
    worse = []
    for c in _PINNED:
        T = zb_auto(c["pp"], c["m"], c["f"], c["i"], c["w"], p2p=c["p2p"], memory_budget=c["K"]).meta["makespan"]
        if T > c["makespan"] * (1 + 1e-12):
            worse.append((c["pp"], c["m"], c["profile"], c["p2p"], c["K"], T, c["makespan"]))
    assert not worse, worse


@settings(max_examples=4 * EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 9), st.integers(0, 20), st.lists(st.floats(0.2, 2.0), min_size=27, max_size=27),
       st.sampled_from([0.0, 0.05, 0.7]), st.floats(0.5, 2.5), st.sampled_from(POLICIES))
def test_inlined_single_stage_greedy_gives_the_general_loops_orders(p, extra, t, p2p, kfrac, pol):
    """The inlined loop (one stage per rank) against the general list scheduler: the same order on every rank."""
    m = max(1, p + extra - 5)
    f, i, w = t[:p], t[9:9 + p], [x if x > 0.5 else 0.0 for x in t[18:18 + p]]
    s2r = {s: s for s in range(p)}
    kw = dict(p2p=p2p, memory_budget=max(1.0, kfrac * p), policy=pol)
    fast, slow = greedy_order(s2r, m, f, i, w, **kw), greedy_order(s2r, m, f, i, w, inline=False, **kw)
    assert (fast is None) == (slow is None)
    if fast is not None:
        assert {r: list(map(str, a)) for r, a in fast.items()} == {r: list(map(str, a)) for r, a in slow.items()}
    if not pol.fit:  # no W ran where fit would wait: the fit policy's order is the same
        stats: dict = {}
        greedy_single(m, f, i, w, p2p, kw["memory_budget"], pol, stats)
        fit = greedy_order(s2r, m, f, i, w, inline=False, **dict(kw, policy=Policy(pol.f_first, pol.stagger, True)))
        if not stats["fit_differs"]:
            assert (fit is None) == (slow is None)
            if fit is not None:
                assert {r: list(map(str, a)) for r, a in fit.items()} == {r: list(map(str, a)) for r, a in slow.items()}


def test_pruned_search_is_the_default_and_exhaustive_is_reported_beside_it():
    """On the pinned cases with p2p 0.05 and budget 2p - 1 (bench_schedules.py's nine sail-sg cases among them) the
    pruned search equals the exhaustive one; the exhaustive search reproduces the pinned makespans exactly."""
    for c in _PINNED:
        if c["p2p"] != 0.05 or c["K"] != 2 * c["pp"] - 1 or c["pp"] > 8:
            continue
        args = (c["pp"], c["m"], c["f"], c["i"], c["w"])
        pr = zb_auto(*args, p2p=c["p2p"], memory_budget=c["K"])
        ex = zb_auto(*args, p2p=c["p2p"], memory_budget=c["K"], search="exhaustive")
        assert pr.meta["search"] == "pruned" and ex.meta["search"] == "exhaustive"
        assert ex.meta["makespan"] == c["makespan"]
        assert pr.meta["makespan"] == pytest.approx(c["makespan"], rel=1e-12)
        assert pr.meta["makespan"] == simulate(pr, stage_durations(c["f"], [a + b for a, b in zip(c["i"], c["w"])],
                                                                   c["w"]), p2p_time=c["p2p"]).iteration_time
    with pytest.raises(ScheduleError, match="search='fast'"):
        zb_auto(4, 8, search="fast")
