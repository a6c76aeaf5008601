"""``plan``'s summary line says whether the chosen partition is proven optimal (issue 25, large solves)."""

from __future__ import annotations

from types import SimpleNamespace as NS

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
