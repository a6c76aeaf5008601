"""Documented maxima that bound a command's work (docs/robustness.md, "Work limits at their maximum"): search's
--max-plans, --jobs and --gpus are refused over their work limits in one line, before any planning, and the variable
raises them."""

from __future__ import annotations

import pytest

from tessera_lab.cli.main import main
from tessera_lab.checks import WORK_LIMITS


@pytest.mark.parametrize("option, name", [("--max-plans", "max_plans"), ("--jobs", "jobs"), ("--gpus", "gpus")])
def test_search_limits_refused_in_one_line(capsys, option, name):
    limit = WORK_LIMITS[name][0]
    # at 1,048,576 GPUs (the world-size limit) the enumeration alone had not ended after 600 s, printing nothing
    assert main(["search", "--gpus", "64", option, str(limit + 1 if name != "gpus" else 1_048_576)]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    value = limit + 1 if name != "gpus" else 1_048_576
    assert len(lines) == 1 and f"{name} = {value} is over the work limit {limit}" in lines[0], lines
    assert f"TESSERA_LAB_MAX_{name.upper()}=N" in lines[0]


def test_search_limit_raised_by_its_variable(capsys, monkeypatch):
    monkeypatch.setenv("TESSERA_LAB_MAX_MAX_PLANS", "5000")
    # accepted past the parser: the next refusal is search's own (too few GPUs for the model), not the limit
    assert main(["search", "--gpus", "8", "--model", "deepseek-v3", "--max-plans", "4000"]) == 2
    err = capsys.readouterr().err
    assert "work limit" not in err and "--gpus = 8 is too small" in err, err


def test_plan_partition_segments_bounded_before_any_work(capsys):
    """2,048 layers on 1,024 stages weigh 1,024 x 1,025 = 1,049,600 layer segments (over 10 minutes on two cores):
    refused in one line naming the product and the limit, before the model is decomposed."""
    import time

    t0 = time.process_time()
    assert main(["plan", "--layers", "2048", "--pp", "1024"]) == 2
    lines = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(lines) == 1 and "1024 x (layers 2048 - stages + 1) = 1049600" in lines[0], lines
    assert f"at most {WORK_LIMITS['partition_segments'][0]}" in lines[0]
    assert time.process_time() - t0 < 5.0
