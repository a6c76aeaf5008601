"""Profile lifecycle: persistence, payback and the decision log."""

from __future__ import annotations

import json
import math

import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.report.lifecycle import (
    COMMUNICATOR_REBUILD_S,
    LifecyclePolicy,
    ProfileLifecycle,
    balance_bound_gain,
    load_records,
    payback,
    run_lifecycle,
    synthetic_drift,
)

PRED = {"stage:0": 0.020, "stage:1": 0.020, "stage:2": 0.020, "stage:3": 0.020,
        "collective:all_to_all:ep": 0.005, "bubble": 0.10}


def _lc(total=10_000, **policy):
    pol = LifecyclePolicy(threshold=0.10, persistence=3, step_time_s=1.0, **policy)
    return ProfileLifecycle(PRED, total, pol, gain_fn=lambda means, pred: 0.1, migration_fn=lambda m, p: 10e9)


def test_single_spike_does_not_replan():
    lc = _lc()
    for step in range(20):
        obs = dict(PRED)
        if step == 7:
            obs["stage:2"] *= 3.0  # one spike
        lc.observe(step, obs)
    actions = [d.action for d in lc.log]
    assert actions[7] == "watch"
    assert "replan" not in actions and "hold" not in actions
    assert lc.replans == 0


def test_two_separated_spikes_do_not_replan():
    lc = _lc()
    for step in range(12):
        obs = dict(PRED)
        if step in (3, 5, 7):  # above threshold but never k consecutive
            obs["collective:all_to_all:ep"] *= 1.5
        lc.observe(step, obs)
    assert lc.replans == 0


def test_persistent_error_triggers_replan_after_k_steps():
    lc = _lc()
    for step in range(10):
        obs = dict(PRED)
        if step >= 4:
            obs["stage:3"] *= 1.3
        lc.observe(step, obs)
    actions = [d.action for d in lc.log]
    assert actions[:4] == ["ok"] * 4
    assert actions[4:6] == ["watch", "watch"]
    assert actions[6] == "replan"  # third consecutive miss
    assert actions[7:] == ["ok"] * 3  # predictions updated to the observed profile
    assert lc.replans == 1
    d = lc.log[6]
    assert d.payback is not None and d.payback.worthwhile
    assert lc.predicted["stage:3"] == pytest.approx(0.026)
    assert lc.charged_s == pytest.approx(d.payback.cost_s)
    df = lc.decisions()
    assert list(df["action"]) == actions
    assert lc.history_table()["error"].abs().max() == pytest.approx(0.3)


def test_payback_hand_example():
    # 0.1 s/step saved over 1000 steps = 100 s; cost = 2 s profiling + 10 GB / 50 GB/s + 30 s = 32.2 s
    pb = payback(0.1, 1000, profiling_s=2.0, migration_bytes=10e9, bandwidth_bytes_per_s=50e9, rebuild_s=30.0)
    assert pb.migration_s == pytest.approx(0.2)
    assert pb.cost_s == pytest.approx(32.2)
    assert pb.expected_gain_s == pytest.approx(100.0)
    assert pb.net_s == pytest.approx(67.8)
    assert pb.payback_steps == pytest.approx(322.0)
    assert pb.worthwhile
    none = payback(0.0, 1000, profiling_s=1.0, migration_bytes=0, bandwidth_bytes_per_s=1e9)
    assert math.isinf(none.payback_steps) and not none.worthwhile
    assert none.rebuild_s == COMMUNICATOR_REBUILD_S


def test_lifecycle_payback_matches_hand_example_and_holds_near_the_end():
    lc = _lc(total=1009, profiling_steps=2.0, communicator_rebuild_s=30.0, migration_bytes_per_s=50e9)
    for step in range(9):
        obs = dict(PRED)
        if step >= 6:
            obs["stage:1"] *= 1.5
        lc.observe(step, obs, step_time_s=1.0)
    d = lc.log[8]
    assert d.action == "replan"
    assert d.payback.remaining_steps == 1000
    assert d.payback.cost_s == pytest.approx(32.2)
    assert d.payback.payback_steps == pytest.approx(322.0)
    # the same persistent error with 100 steps left does not pay back: hold
    late = _lc(total=109)
    for step in range(9):
        obs = dict(PRED)
        if step >= 6:
            obs["stage:1"] *= 1.5
        late.observe(step, obs)
    assert late.log[8].action == "hold" and late.replans == 0
    assert late.predicted["stage:1"] == pytest.approx(0.03)  # profile updated, partition kept


def test_default_gain_is_the_balance_bound():
    assert balance_bound_gain({"stage:0": 1.0, "stage:1": 2.0, "bubble": 9.0}, 4) == pytest.approx(4 * 0.5)
    lc = ProfileLifecycle(PRED, 100, LifecyclePolicy(step_time_s=1.0, microbatches=4))
    for step in range(3):
        lc.observe(step, dict(PRED, **{"stage:0": 0.04}))
    d = lc.log[-1]
    assert d.action in ("replan", "hold")
    assert "perfect-balance" in d.reason
    assert d.payback.gain_per_step_s == pytest.approx(4 * (0.04 - 0.025))


def test_records_round_trip_and_bad_input(tmp_path):
    recs = synthetic_drift(PRED, 12, drift_key="stage:0", drift_factor=1.4, start=5, noise=0.0)
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"steps": recs}))
    lc = run_lifecycle(load_records(path), 10_000, LifecyclePolicy(), gain_fn=lambda m, p: 1.0)
    assert [d.action for d in lc.log][5:8] == ["watch", "watch", "replan"]
    with pytest.raises(ConfigError):
        ProfileLifecycle({"stage:0": 0.0}, 10)
    with pytest.raises(ConfigError):
        LifecyclePolicy(persistence=0)
    with pytest.raises(ConfigError):
        load_records([{"step": 0}])
    with pytest.raises(ConfigError, match="step time"):
        lc2 = ProfileLifecycle(PRED, 100)
        for s in range(3):
            lc2.observe(s, dict(PRED, **{"stage:0": 0.05}))


def test_plan_hooks_use_the_partitioner(qwen3_next):
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.report.lifecycle import plan_hooks, plan_predictions
    from tessera_lab.plan.make import make_plan

    model = qwen3_next.with_changes(num_layers=12)
    plan = make_plan(model, ParallelConfig(pp=4, microbatches=8, seq_len=1024), method="dp", baselines=())
    pred = plan_predictions(plan)
    hooks = plan_hooks(plan)
    recs = synthetic_drift(pred, 10, drift_key="stage:1", drift_factor=1.5, start=3, noise=0.0)
    lc = run_lifecycle(recs, 50_000, LifecyclePolicy(), **hooks)
    replans = [d for d in lc.log if d.action == "replan"]
    assert len(replans) == 1 and replans[0].step == 5
    pb = replans[0].payback
    assert pb.gain_per_step_s > 0 and pb.migration_s > 0
    assert lc.as_dict()["costs"]["kind"] == "analytic"  # the plan's cost source travels with its lifecycle


# ---------------------------------------------------------------------- the runner's observation store
from tessera_lab.report import lifecycle as lc  # noqa: E402
def _store(observed_stage1, *, step_time=0.1, in_sample_run=False):
    """A hand-made store: one run from a plan predicting stage:0 = stage:1 = 10 ms per micro-batch,
    iteration 100 ms, m = 4; stage:1 observed as given per step, everything else on the prediction."""
    pred = {"stage:0": 0.010, "stage:1": 0.010, "iteration": 0.100}
    steps = [{"step": i, "predicted": dict(pred), "step_time_s": step_time,
              "observed": {"stage:0": 0.010, "stage:1": s1, "iteration": 0.100}}
             for i, s1 in enumerate(observed_stage1)]
    runs = [{"date": "d1", "microbatches": 4, "predictions": "plan (before the run)", "lifecycle": {"steps": steps}}]
    if in_sample_run:
        runs.insert(0, {"date": "d0", "microbatches": 4, "predictions": "in-sample (this run's medians)",
                        "lifecycle": {"steps": steps}})
    return {"schema_version": 1, "kind": "runner_observations", "runs": runs}


def test_store_persistent_error_replans_when_payback_fits(tmp_path):
    """stage:1 runs 15 ms instead of 10 ms for 3 steps (+50% > 10%, persistence 3). Hand-worked payback:
    gain = m x (max - mean) = 4 x (0.015 - 0.0125) = 0.010 s/step; 1000 steps left -> 10 s; cost = profiling
    2 steps x 0.1 s + rebuild 30 s = 30.2 s > 10 s -> no payback: re-measure (hold). With 5000 steps left:
    50 s > 30.2 s -> re-plan."""
    from tessera_lab.io import write_json

    path = tmp_path / "store.json"
    write_json(path, _store([0.015] * 3, in_sample_run=True))
    res = lc.store_lifecycle(path, 1000)
    assert res["action"] == "hold" and res["verdict"] == "re-measure"
    assert res["info"] == {"runs": 1, "skipped_in_sample": 1, "microbatches": 4,
                           "keys": ["iteration", "stage:0", "stage:1"]}
    d = res["decisions"][0]
    assert d["step"] == 2 and d["gain_per_step_s"] == pytest.approx(0.010)
    assert d["cost_s"] == pytest.approx(2 * 0.1 + 30.0) and d["remaining_steps"] == 1000
    res = lc.store_lifecycle(path, 5000)
    assert res["verdict"] == "re-plan" and res["decisions"][0]["expected_gain_s"] == pytest.approx(50.0)
    assert res["decisions"][0]["payback_steps"] == pytest.approx(30.2 / 0.010)
    assert res["mean_abs_error"]["stage:1"] == pytest.approx(0.5)


def test_store_transient_error_holds():
    """One step at +50% then on the prediction: streak 1 < 3, nothing triggered: hold."""
    res = lc.store_lifecycle(_store([0.010, 0.015, 0.010, 0.010]), 5000)
    assert res["verdict"] == "hold" and res["decisions"] == []
    assert [d["action"] for d in res["lifecycle"]["decisions"]] == ["ok", "watch", "ok", "ok"]


def test_store_cli_prints_the_decision_and_bad_store_exits_2(tmp_path, capsys):
    from tessera_lab.cli.main import main
    from tessera_lab.io import write_json

    path = tmp_path / "store.json"
    write_json(path, _store([0.015] * 3))
    assert main(["report", "--lifecycle", str(path), "--remaining-steps", "5000"]) == 0
    out = capsys.readouterr().out
    assert "decision: re-plan" in out and "stage:1 50.0%" in out
    write_json(path, {"kind": "runner_observations", "runs": [{"predictions": "in-sample (this run's medians)"}]})
    assert main(["report", "--lifecycle", str(path)]) == 2
    assert "no run executed from a plan" in capsys.readouterr().err


def test_plan_lifecycle_carries_bubble_and_all_to_all_predictions():
    """The plan's stage F + B, bubble and EP all-to-all predictions replace the in-sample ones, for the keys
    the run observed (an ep = 1 run observes no all-to-all, so none is compared)."""
    from tessera_lab.runner.launch.results import plan_lifecycle

    pred = {"predicted_s": 0.1, "stage_f_s": [0.01, 0.02], "stage_b_s": [0.02, 0.03], "bubble_s": 0.05,
            "ep_a2a_s": 0.04}
    obs = {"stage:0": 0.03, "stage:1": 0.05, "bubble": 0.06, "iteration": 0.11, "collective:ep_all_to_all": 0.05}
    out = plan_lifecycle(pred, {"steps": [{"step": 0, "observed": obs, "predicted": {}, "step_time_s": 0.11}]})
    assert out["steps"][0]["predicted"] == pytest.approx({"stage:0": 0.03, "stage:1": 0.05, "iteration": 0.1,
                                                          "bubble": 0.05, "collective:ep_all_to_all": 0.04})
    no_a2a = {k: v for k, v in obs.items() if not k.startswith("collective")}
    out = plan_lifecycle(pred, {"steps": [{"step": 0, "observed": no_a2a, "predicted": {}}]})
    assert "collective:ep_all_to_all" not in out["steps"][0]["predicted"]
