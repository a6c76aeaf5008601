"""``simulate --dynamic`` names its static plan and shows the schedule as built beside it (finding 1 of the
second pass: plain 1F1B printed 33, ``--dynamic`` "static" 30); ``--steps`` states its real lower bound (finding
8); the run report's mean observed wait and the zero predictor's |error| are over the same slots (finding 9)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cli.main import main

BASE = ["simulate", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2", "--w", "1"]


def _json(capsys, argv):
    capsys.readouterr()
    assert main(argv + ["--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("extra, built, split", [
    # 1F1B p=4 m=8 F=1 B=2: (m + p - 1)(F + B) = 33 with B whole; split I=1 then W=1 at once the gradient goes
    # upstream after I: m(F + B) + (p - 1)(F + I) = 24 + 6 = 30
    (["--schedule", "1f1b"], 33.0, 30.0),
    # + a reduce-scatter of 3 after each rank's last action: rank 0 ends last in both -> +3 each
    (["--schedule", "1f1b", "--grad-sync", "3"], 36.0, 33.0),
    # interleaved v=2: busy v m (F + B) = 48 per rank, bubble (p - 1)(F + B) = 9 -> 57; split (p - 1)(F + I) = 6
    (["--schedule", "interleaved", "--vpp", "2"], 57.0, 54.0),
])
def test_dynamic_shows_the_plain_makespan_beside_its_split_static_plan(capsys, extra, built, split):
    plain = _json(capsys, BASE + extra)
    dyn = _json(capsys, BASE + extra + ["--dynamic"])
    assert plain["makespan"] == pytest.approx(built)
    assert dyn["iteration_as_built_s"] == pytest.approx(built)
    assert dyn["iteration_static_s"] == pytest.approx(split)
    assert "split into I" in dyn["static_plan"]
    capsys.readouterr()
    assert main(BASE + extra + ["--dynamic"]) == 0
    text = capsys.readouterr().out
    assert "as built (whole B)" in text and "static (B split: I, W at once)" in text
    assert f"it takes {built:g} time units, so the split alone saves {built - split:g} time units" in text


@pytest.mark.parametrize("schedule, vpp", [("zb-h1", 1), ("zb-h2", 1), ("zb-v", 1), ("zb-auto", 1), ("zb-auto", 2)])
def test_schedules_without_whole_b_have_one_static_number(capsys, schedule, vpp):
    # nothing to split: the static plan is the schedule as built, and equals the plain makespan (with the tail)
    extra = ["--schedule", schedule, "--vpp", str(vpp), "--grad-sync", "3"]
    plain = _json(capsys, BASE + extra)
    dyn = _json(capsys, BASE + extra + ["--dynamic"])
    assert dyn["iteration_as_built_s"] is None
    assert dyn["iteration_static_s"] == pytest.approx(plain["makespan"])
    capsys.readouterr()
    assert main(BASE + extra + ["--dynamic"]) == 0
    assert "static (as built: no whole B to split)" in capsys.readouterr().out


@pytest.mark.parametrize("schedule", ["gpipe", "overlapped", "dualpipev"])
def test_as_built_equals_the_plain_makespan(capsys, schedule):
    extra = ["--schedule", schedule, "--grad-sync", "2"]
    plain = _json(capsys, BASE + extra)
    dyn = _json(capsys, BASE + extra + ["--dynamic"])
    assert dyn["iteration_as_built_s"] == pytest.approx(plain["makespan"])
    assert dyn["iteration_static_s"] <= plain["makespan"] + 1e-9  # sending the gradient earlier never delays


def test_dynamic_grad_sync_tail_is_in_the_iteration(capsys):
    # split 1F1B: rank 0 ends last at 30, its reduce-scatter (3) follows -> 33; without --grad-sync 30
    dyn = _json(capsys, BASE + ["--schedule", "1f1b", "--dynamic", "--grad-sync", "3"])
    assert dyn["iteration_static_s"] == pytest.approx(30.0 + 3.0)
    assert dyn["grad_sync"]["exposed_tail_static_s"] == pytest.approx(3.0)


def test_w_durations_in_time_units(capsys):
    capsys.readouterr()
    assert main(BASE + ["--schedule", "1f1b", "--dynamic"]) == 0
    text = capsys.readouterr().out
    assert "W durations (time units) from the counts already routed" in text and "W seconds" not in text


@pytest.mark.parametrize("steps", ["0", "1"])
def test_steps_states_its_real_lower_bound(capsys, steps):
    capsys.readouterr()
    assert main(BASE + ["--schedule", "1f1b", "--dynamic", "--steps", steps]) == 2
    err = capsys.readouterr().err.strip()
    assert f"steps = {steps} is out of range; allowed: an integer 2 to" in err and len(err.splitlines()) == 1
    assert main(BASE + ["--schedule", "1f1b", "--dynamic", "--steps", "2"]) == 0


def test_run_online_steps_message_names_the_lower_bound():
    from tessera_lab.dynamic.durations import StageCosts
    from tessera_lab.dynamic.online import run_online
    from tessera_lab.errors import ConfigError

    c = StageCosts.synthetic(2, 1.0, 2.0, 1.0)
    for steps, warmup, low in ((0, 1, 2), (1, 1, 2), (2, 2, 3)):
        with pytest.raises(ConfigError, match=f"'steps' = {steps} is out of range; allowed: an integer >= {low}"):
            run_online(c, "uniform", schedule="1f1b", microbatches=4, steps=steps, warmup=warmup)


# -- finding 9: the run report's gap numbers over the same slots ------------------------------------------------

def _jobs(observed_by_step, predicted, lag):
    """Two jobs (static, dynamic) with one rank record per step: slot "3" observed as given."""
    def job(name):
        steps = [{"0": {"idle": {"3": 0.1}, "predicted": {"3": predicted}, "observed": {"3": o},
                        "decisions": {"fill": 0, "forced": 0}, "group_lag_steps": lag}} for o in observed_by_step]
        return {"name": name, "schedule": "1f1b", "losses": [1.0] * len(steps),
                "step_times_s": [1.0] * len(steps), "gap_steps": steps}

    return [job("static-0"), job("dynamic-0")]


def test_observed_wait_and_zero_predictor_are_over_the_same_slots_by_hand():
    from tessera_lab.runner.launch.dynamic_report import dynamic_report, format_dynamic

    # steps 1..3 compared; lag 2 (an EP group): step 1 has no prediction, so slots of steps 2 and 3 only:
    # observed 0.004 and 0.006 -> mean 5 ms (the step-1 wait of 50 ms is in neither number)
    rep = dynamic_report(_jobs([0.0, 0.050, 0.004, 0.006], 0.005, lag=2), 1, None)
    gp = rep["dynamic"]["gap_prediction"]
    assert gp["slots"] == 2
    assert gp["mean_observed_wait_s"] == pytest.approx(0.005)
    assert gp["zero_predictor_mean_abs_error_s"] == gp["mean_observed_wait_s"]
    assert gp["mean_abs_error_s"] == pytest.approx(0.001)  # |5 - 4|, |5 - 6| ms
    text = format_dynamic(rep)
    assert ("mean observed wait 5.00 ms (= the mean |error| of predicting no wait, 5.00 ms) over the same 2 "
            "slots (steps from the lag on)") in text


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0.0, 0.1), min_size=2, max_size=6), st.floats(0.0, 0.1), st.integers(1, 3))
def test_zero_predictor_error_is_the_mean_observed_wait(observed, predicted, lag):
    from tessera_lab.runner.launch.dynamic_report import dynamic_report

    rep = dynamic_report(_jobs(observed, predicted, lag), 1, None)
    for side in ("static", "dynamic"):
        gp = rep[side]["gap_prediction"]
        assert gp["zero_predictor_mean_abs_error_s"] == pytest.approx(gp["mean_observed_wait_s"], abs=1e-15)
