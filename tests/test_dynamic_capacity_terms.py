"""The capacity report's routing variance and bubble after dynamic correction come from a dynamic simulation or
run (``report --dynamic FILE``), with provenance, and print ``not measured`` when absent."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cli.main import main
from tessera_lab.errors import ConfigError
from tessera_lab.report.routing_terms import NOT_MEASURED, RoutingTerms, load_routing_terms, routing_terms

SIM = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "routing": "zipf:1.2", "dynamic": True,
       "costs": "analytic (synthetic --f/--b/--w per stage)", "predictor": "last-step", "steps": 4,
       "iteration_static_s": 12.0, "iteration_dynamic_s": 11.0, "routing_variance_s": 2.0,
       "bubble_after_dynamic_s": 1.1, "idle_removed_s": 0.5}


def _run(routing, static, dynamic, idle_static, idle_dynamic, ranks=4):
    q = lambda m: {"median_s": m, "q1_s": m - 0.01, "q3_s": m + 0.01, "samples": 21}  # noqa: E731
    return {"kind": "runner_dynamic", "provenance": "observed", "schedule": "overlapped+defer-w", "routing": routing,
            "trials": 3, "steps": 8, "world": {"pp": 2, "ep": 2, "dp": 1, "ranks": ranks},
            "static": {"step_time": q(static), "host_idle_per_step": q(idle_static)},
            "dynamic": {"step_time": q(dynamic), "host_idle_per_step": q(idle_dynamic)}}


def test_simulation_terms_hand_worked():
    t = routing_terms(SIM)
    assert t.provenance == "simulated" and t.measured and t.units == "units of --f/--b/--w"
    assert t.iteration_uniform_s == 10.0  # 12 static under the routing - 2 routing variance
    assert t.routing_variance_share == pytest.approx(0.2)  # 2 / 10
    assert t.bubble_after_dynamic_share == pytest.approx(0.1)  # 1.1 / 11
    assert t.scaled(5.0) == pytest.approx({"routing_variance_s": 1.0, "bubble_after_dynamic_s": 0.5})
    text = t.format(5.0)
    assert "simulated" in text and "routing zipf:1.2" in text and "20.00% of the uniform static" in text
    assert NOT_MEASURED not in text
    # synthetic --f/--b/--w units of a toy pipeline are never scaled onto a plan's seconds (finding 12)
    assert "1000 ms" not in text and "not scaled to this plan's iteration (5 s)" in text
    assert "simulated terms (a simulation, not an observation)" in text and "measured (observed) terms" not in text
    # a simulation in seconds (not synthetic) is scaled: 20% of 5 s = 1000 ms, 10% of 5 s = 500 ms
    secs = routing_terms(dict(SIM, costs="profile data/profiles/x.json"))
    assert not secs.synthetic and "1000 ms" in secs.format(5.0) and "500 ms" in secs.format(5.0)


def test_run_terms_with_control_hand_worked():
    run = _run("zipf:1.5", static=0.30, dynamic=0.28, idle_static=0.8, idle_dynamic=0.6)
    ctl = _run("model router (no skew)", static=0.25, dynamic=0.25, idle_static=0.5, idle_dynamic=0.5)
    t = routing_terms(run, ctl)
    assert t.provenance == "observed" and "control" in t.source
    assert t.routing_variance_s == pytest.approx(0.05)  # 0.30 - 0.25
    assert t.routing_variance_share == pytest.approx(0.2)  # 0.05 / 0.25
    assert t.bubble_after_dynamic_s == pytest.approx(0.15)  # 0.6 summed over 4 ranks
    assert t.idle_removed_s == pytest.approx(0.05)  # (0.8 - 0.6) / 4
    assert not any("not significant" in n for n in t.notes)  # IQRs 0.29-0.31 vs 0.24-0.26
    assert t.routing_variance_significant is True and "(not significant)" not in t.format(1.0)
    close = routing_terms(run, _run("uniform", static=0.295, dynamic=0.29, idle_static=0.5, idle_dynamic=0.5))
    assert any("not significant" in n for n in close.notes) and close.routing_variance_significant is False
    assert "routing variance: 0.005 s (1.69% of the uniform static iteration) (not significant)" in close.format()


def test_run_without_control_leaves_routing_variance_not_measured():
    t = routing_terms(_run("zipf:1.5", 0.3, 0.28, 0.8, 0.6))
    assert t.routing_variance_s is None and t.bubble_after_dynamic_s == pytest.approx(0.15)
    d = t.as_dict()
    assert d["routing_variance_s_status"] == NOT_MEASURED and "bubble_after_dynamic_s_status" not in d
    assert f"routing variance: {NOT_MEASURED}" in t.format(1.0)


def test_absent_is_not_measured_never_zero():
    t = routing_terms(None)
    assert not t.measured and t.provenance is None
    d = t.as_dict()
    assert d["routing_variance_s"] is None and d["bubble_after_dynamic_s_status"] == NOT_MEASURED
    assert t.format(1.0).count(NOT_MEASURED) >= 3 and "scaled" not in t.format(1.0)


def test_bad_sources_are_one_clear_error():
    with pytest.raises(ConfigError, match="neither"):
        routing_terms({"makespan": 3.0})
    with pytest.raises(ConfigError, match="iteration_dynamic_s"):
        routing_terms({k: v for k, v in SIM.items() if k != "iteration_dynamic_s"})
    with pytest.raises(ConfigError, match="ranks"):
        routing_terms(_run("zipf:1.5", 0.3, 0.28, 0.8, 0.6), _run("uniform", 0.25, 0.25, 0.5, 0.5, ranks=8))
    with pytest.raises(ConfigError, match="own uniform-routing control"):
        routing_terms(SIM, SIM)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 5.0), st.floats(0.1, 10.0), st.floats(0.0, 3.0), st.floats(0.01, 100.0))
def test_scaled_terms_are_shares_of_the_target(rv, uniform, bubble, target):
    d = dict(SIM, iteration_static_s=uniform + rv, routing_variance_s=rv, bubble_after_dynamic_s=bubble,
             iteration_dynamic_s=uniform + rv)
    sc = routing_terms(d).scaled(target)
    assert math.isclose(sc["routing_variance_s"], rv / uniform * target, rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(sc["bubble_after_dynamic_s"], bubble / (uniform + rv) * target, rel_tol=1e-9, abs_tol=1e-12)


def test_load_two_runs_finds_the_control_in_either_order(tmp_path):
    a, b = tmp_path / "skew.json", tmp_path / "uni.json"
    a.write_text(json.dumps(_run("zipf:1.5", 0.30, 0.28, 0.8, 0.6)))
    b.write_text(json.dumps(_run("uniform", 0.25, 0.25, 0.5, 0.5)))
    for order in ([str(a), str(b)], [str(b), str(a)]):
        assert load_routing_terms(order).routing_variance_s == pytest.approx(0.05)
    assert load_routing_terms([]) == RoutingTerms()
    with pytest.raises(ConfigError, match="exactly one"):
        load_routing_terms([str(a), str(a)])


def test_report_cli_reads_a_simulation(tmp_path, capsys):
    sim, rep = tmp_path / "sim.json", tmp_path / "rep.json"
    assert main(["simulate", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2",
                 "--w", "1", "--routing", "zipf:1.2", "--dynamic", "--json", str(sim)]) == 0
    s = json.loads(sim.read_text())
    assert main(["report", "--dynamic", str(sim), "--json", str(rep)]) == 0
    r = json.loads(rep.read_text())["routing_dynamic"]
    assert r["provenance"] == "simulated" and r["routing"] == "zipf:1.2"
    assert r["routing_variance_s"] == s["routing_variance_s"] > 0  # zipf skew slows the static plan
    assert r["bubble_after_dynamic_s"] == s["bubble_after_dynamic_s"]
    assert r["iteration_uniform_s"] == pytest.approx(s["iteration_static_s"] - s["routing_variance_s"])
    capsys.readouterr()
    assert main(["report", "--dynamic", str(rep)]) == 2  # a report is not a dynamic source
    assert "neither" in capsys.readouterr().err


def test_uniform_simulation_measures_zero_routing_variance(tmp_path):
    sim = tmp_path / "sim.json"
    assert main(["simulate", "--schedule", "1f1b", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2",
                 "--w", "1", "--routing", "uniform", "--dynamic", "--json", str(sim)]) == 0
    t = load_routing_terms([str(sim)])
    assert t.measured and t.routing_variance_s == 0.0  # measured 0, not "not measured"
    assert f"routing variance: {NOT_MEASURED}" not in t.format()


def test_shipped_runner_measurements_give_observed_terms():
    from tessera_lab.paths import data_dir

    runs = data_dir() / "runs"
    t = load_routing_terms([str(runs / "runner_dynamic_overlapped_zipf1.5.json"),
                            str(runs / "runner_dynamic_overlapped_uniform.json")])
    assert t.provenance == "observed" and t.routing == "zipf:1.5" and t.routing_variance_s is not None
    assert t.routing_variance_significant is not None and t.bubble_after_dynamic_s > 0


def _job(**over):
    job = {"pp": 2, "ep": 2, "dp": 1, "schedule": "overlapped", "vpp": 1, "microbatches": 4, "micro_batch_size": 2,
           "steps": 8, "lr": 0.01, "pair_exec": "scheduled", "pair_order": None, "model": {"hidden_size": 32}}
    return job | over


def test_control_must_be_the_same_job_in_all_but_routing(tmp_path, capsys):
    run = _run("zipf:1.5", 0.30, 0.28, 0.8, 0.6) | {"job": _job()}
    ok = routing_terms(run, _run("uniform", 0.25, 0.25, 0.5, 0.5) | {"job": _job()})
    assert ok.routing_variance_s == pytest.approx(0.05)
    assert "pair handler scheduled" in ok.source and "control: routing uniform, pair handler scheduled" in ok.source
    with pytest.raises(ConfigError, match=r"pair handler \(pair_exec\) = 'threads', the run's 'scheduled'"):
        routing_terms(run, _run("uniform", 0.25, 0.25, 0.5, 0.5) | {"job": _job(pair_exec="threads")})
    with pytest.raises(ConfigError, match=r"'model.hidden_size' = 64, the run's 32"):
        routing_terms(run, _run("uniform", 0.25, 0.25, 0.5, 0.5) | {"job": _job(model={"hidden_size": 64})})
    with pytest.raises(ConfigError, match=r"'trials' = 8, the run's 3"):
        routing_terms(run, _run("uniform", 0.25, 0.25, 0.5, 0.5) | {"job": _job(), "trials": 8})
    # a control without the job block: what cannot be compared is said, not silently passed
    old = routing_terms(run, _run("uniform", 0.25, 0.25, 0.5, 0.5))
    assert any("not checked" in n and "pair_exec" in n for n in old.notes) and "pair handler not recorded" in old.source
    # the user's pairing: node-level scheduled pairs (5 trials) against the threads control (8 trials) -> exit 2
    from tessera_lab.paths import data_dir

    runs = data_dir() / "runs"
    capsys.readouterr()
    assert main(["report", "--dynamic", str(runs / "runner_dynamic_overlapped_scheduled_zipf1.5.json"),
                 "--dynamic", str(runs / "runner_dynamic_overlapped_uniform.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pair handler (pair_exec) = 'threads', the run's 'scheduled'" in err[0]
    assert "'trials' = 8, the run's 5" in err[0]


def test_observed_text_shows_verdicts_and_provenance_once():
    q = lambda m, h=0.01: {"median_s": m, "q1_s": m - h, "q3_s": m + h, "samples": 21}  # noqa: E731
    run = _run("zipf:1.5", 0.30, 0.28, 0.8, 0.6) | {"gain": 0.0667, "gain_verdict": "not significant"}
    run["static"]["host_idle_per_step"] = q(0.8, 0.3)  # IQR 0.5-1.1 overlaps the dynamic 0.59-0.61
    t = routing_terms(run, _run("uniform", 0.25, 0.25, 0.5, 0.5))
    text = t.format(2.0)
    assert "provenance observed; source: run --dynamic" in text and "observed: observed" not in text
    assert t.idle_removed_significant is False and "idle removed per rank: 0.05 s (not significant)" in text
    assert "+6.67% (gain_verdict: not significant" in text
    assert "the lines above are the measured (observed) terms" in text
    # 0.05 / 0.25 = 20% of the uniform static iteration; IQRs 0.29-0.31 vs 0.24-0.26 apart; the tiny CPU model's
    # share is not applied to the 2 s plan (would be 400 ms)
    assert "routing variance: 0.05 s (20.00% of the uniform static iteration) (significant)" in text
    assert "400 ms" not in text


def test_zero_shares_print_without_a_minus_sign():
    from tessera_lab.report.routing_terms import _pct

    assert _pct(-1e-17) == "0.00%" and _pct(-0.0) == "0.00%" and _pct(-0.0004) == "-0.04%"
    t = routing_terms(dict(SIM, routing_variance_s=-0.0, iteration_static_s=10.0))
    assert "-0.0" not in t.format(1.0) and "routing variance: 0 units of --f/--b/--w (0.00% of" in t.format(1.0)


def test_report_table_zero_rows_print_0_percent(capsys):
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("routing variance "))
    assert "-0.0%" not in out and row.split()[-2:] == ["0.0%", "0.0%"]


def test_observed_runner_shares_are_not_scaled_onto_another_models_plan():
    """A run of the runner's tiny CPU model says what it lost of its own iteration; applying that share to a
    64-GPU plan of another model would pass a CPU observation off as the plan's seconds (finding 12)."""
    run = _run("zipf:1.5", static=0.30, dynamic=0.28, idle_static=0.8, idle_dynamic=0.6)
    ctl = _run("model router (no skew)", static=0.25, dynamic=0.25, idle_static=0.5, idle_dynamic=0.5)
    text = routing_terms(run, ctl).format(2.0)
    assert "not scaled to this plan's iteration (2 s)" in text and "tiny model" in text
    assert "400 ms" not in text  # 20% of 2 s: the number an estimate scaled onto the plan would have printed
