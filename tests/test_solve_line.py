"""``plan``'s summary line says whether the chosen partition is proven optimal (large solves)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from tessera_lab.plan.proof import solve_line


def _plan(status, solver="HiGHS", method="ilp", gain=0.0):
    part = NS(solver=solver, status=status, solve_time_s=1.5)
    return NS(chosen=NS(partition=part, method=method), refinement={"gain_s": gain})


def test_solve_line_states_proof_or_time_limit():
    assert solve_line(_plan("Optimal")).startswith("chosen partition: proven optimal for the solver's objective (HiGHS")
    line = solve_line(_plan("TimeLimit (feasible, not proven optimal)"))
    assert "NOT proven optimal: the solver's time limit decided" in line and "TimeLimit" in line
    assert "NOT proven" in solve_line(_plan("TimeLimit (time limit: best heuristic plan)"))
    assert "refinement" in solve_line(_plan("Optimal", gain=1e-3)) and "refinement" not in solve_line(_plan("Optimal"))
    assert "no solver" in solve_line(_plan(None, solver=None, method="uniform"))
    assert solve_line(_plan(None, solver=None, method="dp")).startswith("chosen partition: proven optimal")  # exact DP


def test_solve_line_names_a_kept_baseline_and_the_solver_optimum_beside_it():
    p = _plan("Optimal")
    p.chosen.iteration_time_s = 1.0
    p.partition_from = "baseline parameters"
    p.solver_result = NS(method="ilp", iteration_time_s=1.25, partition=NS(boundaries=[0, 2, 4]))
    line = solve_line(p)
    assert line.startswith("chosen partition: the parameters baseline's, not the solver's"), line
    assert "(1.0000 s) than the ilp optimum (1.2500 s, boundaries [0, 2, 4]), which is proven optimal" in line
    # a solver stopped at its limit: its partition is not called an optimum anywhere in the line
    p.chosen.partition.status = "TimeLimit (feasible, not proven optimal)"
    line = solve_line(p)
    assert "than the ilp partition (1.2500 s" in line and "NOT proven optimal" in line and "optimum" not in line
    assert "in 1.50 s wall" in line





@pytest.mark.parametrize("objective", ["auto", "bottleneck"])
def test_plan_kept_baseline_is_labelled_as_such_and_the_solver_result_reported(tmp_path, capsys, objective):
    """gpt-oss-20b: the parameters baseline simulates faster than the ILP optimum, so the plan keeps its partition
    (objective auto: the refinement starts there and moves nowhere; bottleneck: the never-slower rule). The text and
    the JSON say so and report the ILP's own result beside it."""
    import json

    from tessera_lab.cli.main import main

    out_json = tmp_path / "plan.json"
    # host/sync term off: the case (a baseline simulating faster than the ILP optimum) is the planner's, not the term's
    assert main(["plan", "--model", "gpt-oss-20b", "--host-sync-ms", "0", "--objective", objective, "--json",
                 str(out_json)]) == 0
    out = capsys.readouterr().out
    d = json.loads(out_json.read_text())
    base = d["baselines"]["parameters"]
    assert d["partition_from"] == "baseline parameters" and d["method"] == "ilp"
    assert d["boundaries"] == base["boundaries"] and d["iteration_time_s"] == base["iteration_time_s"]
    own = d["solver_result"]
    assert own["boundaries"] != d["boundaries"] and own["iteration_time_s"] > d["iteration_time_s"]
    assert own["solver"] == "HiGHS" and own["solver_status"] == "Optimal"
    assert "[ilp (chosen)]" not in out and "chosen partition: proven optimal" not in out
    assert "[ilp (chosen: the parameters baseline's partition; it simulates faster than the ilp optimum)]" in out
    assert f"[ilp optimum (not chosen: slower when simulated)] boundaries {own['boundaries']}; solver HiGHS" in out
    assert "chosen partition: the parameters baseline's, not the solver's" in out


def test_plan_of_the_solver_own_partition_keeps_the_plain_labels(tmp_path):
    import json

    from tessera_lab.cli.main import main

    out_json = tmp_path / "plan.json"
    assert main(["plan", "--json", str(out_json)]) == 0  # qwen3-next-80b-a3b: the ILP optimum is kept
    d = json.loads(out_json.read_text())
    assert "partition_from" not in d and "solver_result" not in d


def test_a_kept_baseline_survives_the_plan_json_round_trip(tmp_path, capsys):
    """gpt-oss-20b keeps the parameters baseline's partition: reloading its plan JSON keeps that origin, so a report
    on it names the baseline's partition, never an ILP partition it is not; a tampered origin is refused (exit 2)."""
    import json

    from tessera_lab.cli.main import main
    from tessera_lab.plan.load import load_plan
    from tessera_lab.plan.proof import partition_label

    out_json = tmp_path / "plan.json"
    assert main(["plan", "--model", "gpt-oss-20b", "--host-sync-ms", "0", "--json", str(out_json)]) == 0
    plan = load_plan(out_json)
    assert plan.partition_from == "baseline parameters"
    assert partition_label(plan) == "parameters baseline's partition (kept over the ilp optimum: it simulates faster)"
    capsys.readouterr()
    assert main(["report", "--plan", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "parameters baseline's partition" in out and "ilp partition" not in out
    d = json.loads(out_json.read_text())
    d["partition_from"] = 5
    out_json.write_text(json.dumps(d))
    assert main(["report", "--plan", str(out_json)]) == 2
    assert "field 'partition_from' = 5 is not a string" in capsys.readouterr().err
