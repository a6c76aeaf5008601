"""The planner optimises what the pipeline pays and keeps its cost source: the schedule-aware path cost, simulator refinement, never slower than a baseline or random partitions,
virtual stages, ``--schedule auto``, and plan JSON that round-trips under its profile."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cli.main import main
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.paths import data_dir
from tessera_lab.pipeline.schedules import build_schedule
from tessera_lab.pipeline.simulate import simulate, uniform_durations
from tessera_lab.plan.evaluate import evaluate
from tessera_lab.plan.make import _problem, make_plan
from tessera_lab.plan.objective import refine, schedule_path_cost, warmup_forwards
from tessera_lab.plan.partition import score_boundaries
from tessera_lab.plan.stages import build_stage_model

PROFILE = data_dir() / "profiles" / "cpu-qwen3-next-small.json"


class _Uniform:
    """Stage costs of equal layers: F = 1, B + W = 2 per layer, no extras, no pair costs."""

    pair_costs = None

    def f(self, s, i, j):
        return 1.0 * (j - i)

    def b(self, s, i, j):
        return 2.0 * (j - i)

    def standalone(self, s, i, j):
        return self.f(s, i, j) + self.b(s, i, j)


class _NoP2P:
    def __init__(self, parallel):
        self.parallel = parallel

    def p2p_time(self, model, s):
        return 0.0


def test_path_cost_equals_the_1f1b_makespan_for_equal_stages(qwen3_next):
    """p = 4 stages of one layer (F = 1, B = 2), m = 8, no p2p, no DP sync (ep = dp = 1): the slowest rank's path
    cost is (m + p - 1)(F + B) = 33, the worked 1F1B makespan of docs/concepts.md ("Bubble"), which the simulator gives too."""
    par = ParallelConfig(pp=4, ep=1, dp=1, microbatches=8, schedule="1f1b")
    cost = schedule_path_cost(qwen3_next, par, _NoP2P(par), _Uniform())
    b = [0, 1, 2, 3, 4]
    assert max(cost(s, b[s], b[s + 1]) for s in range(4)) == pytest.approx(33.0)
    assert cost(0, 0, 1) == pytest.approx(8 * 3.0)  # rank 0: its own work only
    assert simulate(build_schedule("1f1b", 4, 8), uniform_durations(1.0, 2.0)).iteration_time == pytest.approx(33.0)


def test_overlapped_runs_2p_minus_1_micro_batches_apart_on_the_first_rank():
    assert [warmup_forwards("overlapped", 4, s, 32) for s in range(4)] == [7, 5, 3, 1]
    assert warmup_forwards("overlapped", 4, 0, 5) == 5
    assert warmup_forwards("1f1b", 4, 0, 8) == 8


@settings(max_examples=30)
@given(st.lists(st.floats(0.1, 10.0), min_size=12, max_size=12), st.integers(0, 10**6))
def test_refine_never_ends_above_its_start(weights, seed):
    """Local search on an arbitrary (noisy) objective keeps the best it simulated: never above the start."""
    rng = random.Random(seed)
    noise = {}

    def sim(b):
        key = tuple(b)
        if key not in noise:
            noise[key] = rng.random()
        return max(sum(weights[b[s]:b[s + 1]]) for s in range(len(b) - 1)) + 0.1 * noise[key]

    start = [0, 3, 6, 9, 12]
    best, t, spent = refine(start, sim, budget=40)
    assert t <= sim(start) and t == pytest.approx(sim(best)) and spent <= 40
    assert best[0] == 0 and best[-1] == 12 and all(x < y for x, y in zip(best, best[1:]))


CASES = {
    "default": ({}, {}, "H200"),
    "B200, seq 8192": ({}, {"seq_len": 8192}, "B200"),
    "attention ratio 1, pp 4": ({"attention_ratio": 1}, {"pp": 4, "microbatches": 16}, "H200"),
    "top-k 4, pp 4": ({"num_experts_per_tok": 4}, {"pp": 4, "microbatches": 16}, "H200"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chosen_plan_beats_baselines_and_200_random_partitions(qwen3_next, case):
    """The chosen plan simulates no slower than every baseline that fits memory and than the
    best of 200 random valid (memory-feasible) partitions, all under the same schedule and simulator."""
    knobs, par, gpu = CASES[case]
    model = qwen3_next.with_changes(**knobs) if knobs else qwen3_next
    plan = make_plan(model, ParallelConfig(**par), gpu=gpu)
    T = plan.chosen.iteration_time_s
    for name, ev in plan.baselines.items():
        if ev.fits_memory:
            assert T <= ev.iteration_time_s * (1 + 1e-12), name
    cm, sm = build_stage_model(model, plan.parallel, plan.cluster)
    steady = _problem(model, plan.parallel, cm, sm, "bottleneck")
    rng, L, P = random.Random(0), model.num_layers, plan.parallel.pp
    best, n = float("inf"), 0
    while n < 200:
        part = score_boundaries(steady, [0] + sorted(rng.sample(range(1, L), P - 1)) + [L], "random")
        if all(steady.memory_ok_rank(x) for x in part.rank_memory):
            n += 1
            best = min(best, evaluate(model, plan.parallel, cm, sm, part, "random", plan.model_flops).iteration_time_s)
    assert T <= best


def _weak_solver(monkeypatch):
    """Make the planner's solver return the uniform partition (a solver whose objective misses what the schedule
    pays), so that a baseline simulates faster than the solver's answer."""
    import tessera_lab.plan.make as mk

    real = mk.solve

    def weak(problem, method="ilp", **kw):
        return real(problem, "uniform") if method == "ilp" else real(problem, method, **kw)

    monkeypatch.setattr(mk, "solve", weak)


def test_a_faster_baseline_becomes_the_choice_and_the_notes_say_why(qwen3_next, monkeypatch):
    _weak_solver(monkeypatch)
    # host/sync term off: the case needs a baseline that simulates faster than the uniform split
    plan = make_plan(qwen3_next.with_changes(num_layers=16), ParallelConfig(pp=4, microbatches=8, seq_len=1024,
                                                                            grouped_gemm="grouped", host_sync_s=0.0))
    assert plan.chosen.iteration_time_s <= min(ev.iteration_time_s for ev in plan.baselines.values())
    assert any("simulates faster" in n and "the refinement starts from both" in n for n in plan.notes)
    # both starts are refined and the faster end is kept: its start is the one the refinement record names
    ends = [n for n in plan.notes if n.startswith("simulator refinement from the ")]
    assert len(ends) == 2 and any("baseline " in n for n in ends)
    kept = next(n for n in plan.notes if n.startswith("kept the refinement from the "))
    assert plan.refinement["start"] in kept and f"({plan.chosen.iteration_time_s:.4f} s)" in kept


def test_vpp2_interleaved_plan_writes_two_virtual_stages_per_rank(tmp_path, capsys):
    out = tmp_path / "v.json"
    assert main(["plan", "--pp", "4", "--vpp", "2", "--schedule", "interleaved", "-m", "8", "--seq-len", "1024",
                 "--layers", "16", "--time-limit", "5", "--export", str(out)]) == 0
    d = json.loads(out.read_text())
    groups = d["exports"]["megatron_pipeline_model_parallel_layout"].split("|")
    assert len(groups) == 8 and d["parallel"]["vpp"] == 2  # 4 ranks x 2 virtual stages, virtual-stage order
    assert sum(g.count("t") for g in groups) == 16
    assert "rank" in capsys.readouterr().out


def test_vpp_refused_with_a_one_chunk_schedule(capsys):
    assert main(["plan", "--vpp", "2", "--schedule", "1f1b"]) == 2
    assert "vpp" in capsys.readouterr().err


def test_schedule_auto_tries_each_and_keeps_the_fastest_that_fits(capsys):
    assert main(["plan", "--pp", "4", "-m", "8", "--seq-len", "1024", "--layers", "16", "--schedule", "auto",
                 "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    trials = d["schedule_trials"]
    assert [(t["schedule"], t["vpp"]) for t in trials] == [
        (s, 1) for s in ["overlapped", "1f1b", "zb-h1", "zb-h2", "gpipe", "zb-auto"]
    ] + [("interleaved-overlapped", 2), ("interleaved", 2)]  # 4 x 2 virtual stages fit in 16 layers
    fitting = [t["iteration_time_s"] for t in trials if t.get("fits_memory")]
    assert d["iteration_time_s"] == pytest.approx(min(fitting))
    assert d["parallel"]["schedule"] in {t["schedule"] for t in trials}
    best = min((t for t in trials if t.get("fits_memory")), key=lambda t: t["iteration_time_s"])
    assert (d["parallel"]["schedule"], d["parallel"]["vpp"]) == (best["schedule"], best["vpp"])


def test_schedule_auto_prints_every_refusal_whole_and_tries_the_given_vpp():
    """A refused schedule's reason is printed in full on its own line (never cut mid-word); with ``vpp >= 2`` auto
    tries the two interleaved schedules at that vpp only."""
    from tessera_lab.cli.plan import format_plan
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import auto_candidates, make_plan

    m = load_model("qwen3-next-80b-a3b")
    assert auto_candidates(m, ParallelConfig(pp=8, vpp=3, schedule="auto")) == [
        ("interleaved-overlapped", 3), ("interleaved", 3)]
    assert m.num_layers == 48
    assert auto_candidates(m, ParallelConfig(pp=24))[-2:] == [("interleaved-overlapped", 2), ("interleaved", 2)]
    assert all(v == 1 for _, v in auto_candidates(m, ParallelConfig(pp=32)))  # 32 x 2 > 48 layers
    small = make_plan(m, ParallelConfig(pp=8), method="uniform", baselines=())
    reason = "no partition fits in memory: " + "word " * 40 + "GiB available"
    small.schedule_trials = [{"schedule": "gpipe", "vpp": 1, "error": reason},
                             {"schedule": "interleaved", "vpp": 2, "iteration_time_s": 1.5, "fits_memory": True}]
    text = format_plan(small)
    assert f"refused gpipe: {reason}" in text.splitlines()
    assert any(line.split()[:3] == ["interleaved", "2", "1.500"] for line in text.splitlines())


def test_profile_plan_round_trips_and_a_change_of_source_is_asked_for(tmp_path, capsys):
    """``plan --profile P --export X`` then ``report --plan X --json -`` gives the same
    iteration time and a ``costs`` field naming the profile; ``--costs analytic`` re-evaluates and says so; a
    missing profile refuses (exit 2) instead of silently re-costing analytically."""
    from tessera_lab.overlap.profiles import STALE_FIELDS, current_environment

    prof = json.loads(PROFILE.read_text())  # the shipped CPU profile, re-dated to this machine (not stale here)
    env = current_environment("cpu")
    for meta in [prof["environment"]] + [e["metadata"] for e in prof["entries"].values()]:
        meta.update({f: env[f] for f in STALE_FIELDS if f in env and f in meta})
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(prof))
    x = tmp_path / "x.json"
    assert main(["plan", "--profile", str(profile)]) == 2  # a CPU profile for an H200 plan: refused unless allowed
    assert "cpu backend" in capsys.readouterr().err
    assert main(["plan", "--profile", str(profile), "--allow-stale-profile", "--export", str(x)]) == 0
    assert f"costs: measured profile {profile}" in capsys.readouterr().out
    planned = json.loads(x.read_text())
    assert main(["report", "--plan", str(x), "--json", "-"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["costs"]["kind"] == "profile" and rep["costs"]["path"] == str(profile)
    assert rep["plan"]["iteration_time_s"] == planned["iteration_time_s"]
    assert rep["capacity"]["iteration_time_s"] == planned["iteration_time_s"]
    assert main(["report", "--plan", str(x), "--costs", "analytic"]) == 0
    out = capsys.readouterr().out
    assert "re-evaluated under analytic" in out and "costs: analytic" in out
    moved = dict(planned, costs=dict(planned["costs"], path=str(tmp_path / "gone.json")))
    y = tmp_path / "y.json"
    y.write_text(json.dumps(moved))
    assert main(["report", "--plan", str(y)]) == 2
    assert "--costs analytic" in capsys.readouterr().err
    profile.write_text(json.dumps(dict(prof, updated="2026-12-01T00:00:00+00:00")))  # the file changed since
    assert main(["report", "--plan", str(x)]) == 2
    assert "would change the plan's cost source" in capsys.readouterr().err


@pytest.mark.parametrize("pp, vpp, m", [(4, 2, 8), (8, 2, 32), (4, 3, 12), (2, 2, 4)])
def test_interleaved_overlapped_matches_interleaved_without_overlap_and_its_memory_model(pp, vpp, m):
    """With pair time F + B the overlapped interleaved schedule takes exactly interleaved 1F1B's makespan; with real
    overlap it is shorter; its peak live activations per rank equal the planner's memory model (one chunk-micro-batch
    more than interleaved; m a multiple of pp, Megatron's case)."""
    from tessera_lab.pipeline.schedules import interleaved_overlapped
    from tessera_lab.plan.vschedules import plan_in_flight

    s = interleaved_overlapped(pp, vpp, m)
    s.validate()
    base = simulate(build_schedule("interleaved", pp, m, vpp), uniform_durations(1.0, 2.0)).iteration_time
    assert simulate(s, uniform_durations(1.0, 2.0, fb=3.0)).iteration_time == pytest.approx(base)
    tl = simulate(s, uniform_durations(1.0, 2.0, fb=2.2))
    assert tl.iteration_time < base
    assert tl.peak_activations == [plan_in_flight("interleaved-overlapped", pp, r, m, vpp) * vpp for r in range(pp)]


def test_vpp2_interleaved_overlapped_plan(capsys):
    assert main(["plan", "--pp", "4", "--vpp", "2", "--schedule", "interleaved-overlapped", "-m", "8",
                 "--seq-len", "1024", "--layers", "16", "--time-limit", "5", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["boundaries"]) == 9 and all(s["overlap_s"] is not None for s in d["stages"])


def test_refinement_is_recorded_and_baselines_keep_their_labels(qwen3_next, monkeypatch):
    _weak_solver(monkeypatch)
    plan = make_plan(qwen3_next.with_changes(num_layers=16), ParallelConfig(pp=4, microbatches=8, seq_len=1024,
                                                                            grouped_gemm="grouped", host_sync_s=0.0))
    d = plan.as_dict()
    start = d["refinement"]["start"].split()[-1]
    assert d["refinement"]["simulations"] >= 1 and start in d["baselines"]
    assert d["method"] == "ilp" and d["baselines"][start]["method"] == start


def test_zb_auto_plan_is_searched_on_the_partitions_own_times(qwen3_next):
    """``plan --schedule zb-auto``: the schedule search runs on each partition's F, I, W and p2p times within
    2p - 1 micro-batches, ZB-H2 among its candidates, so on the ZB-H2 plan's own partition it is never slower than
    ZB-H2 by its own timing; the planner's simulation adds each rank's DP gradient sync after its last action, which
    the search does not time, so there the two may differ by that tail: within 1% here (0.2% measured, host/sync
    term in the forwards)."""
    from tessera_lab.plan.vschedules import plan_in_flight

    model = qwen3_next.with_changes(num_layers=16)
    par = ParallelConfig(pp=4, microbatches=8, seq_len=1024, schedule="zb-h2")
    h2 = make_plan(model, par, baselines=(), objective="schedule")
    auto_par = par.replace(schedule="zb-auto")
    cm, sm = build_stage_model(model, auto_par, h2.cluster)
    steady = _problem(model, auto_par, cm, sm, "bottleneck")
    ev = evaluate(model, auto_par, cm, sm, score_boundaries(steady, h2.chosen.partition.boundaries, "x"), "x",
                  h2.model_flops)
    assert ev.iteration_time_s <= h2.chosen.iteration_time_s * 1.01
    assert [plan_in_flight("zb-auto", 4, r, 8) for r in range(4)] == [7.0] * 4


def test_refinement_from_the_solver_start_too_when_a_baseline_starts_faster():
    """Qwen3.5-35B-A3B, interleaved vpp 2: the parameters baseline simulates faster than the ILP optimum, but the
    refinement from the ILP optimum ends faster (1.8925 s against 1.9107 s from the baseline): the plan keeps it,
    and ``report`` (the same make_plan) agrees."""
    import re

    from tessera_lab.model.spec import load_model

    # the host/sync term pinned at 3.33 ms per MoE layer: the case this test was built on (the mechanism, not the
    # term's fitted value, is what it checks)
    plan = make_plan(load_model("qwen3.5-35b-a3b"), ParallelConfig(pp=8, ep=8, vpp=2, schedule="interleaved",
                                                                    host_sync_s=3.33e-3))
    ends = [float(re.search(r"\(([0-9.]+) s\)$", n).group(1)) if "faster (" in n else None
            for n in plan.notes if n.startswith("simulator refinement from the ")]
    assert len(ends) == 2 and all(e is not None for e in ends)
    assert plan.chosen.iteration_time_s == pytest.approx(min(ends), abs=5e-5)
    assert ends[1] < ends[0]  # the second start (the solver's) ends faster here
    assert not plan.refinement["start"].startswith("baseline") and plan.partition_from == ""
