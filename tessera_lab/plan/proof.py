"""Whether a plan's partition is proven optimal: the one sentence ``plan``, ``reproduce`` and the scenarios print."""

from __future__ import annotations

from typing import Any

from tessera_lab.plan.ilp import limit_word


def kept_baseline(plan: Any) -> str:
    """The baseline whose partition the plan kept (``"parameters"`` of ``partition_from = "baseline parameters,
    moved by simulator refinement"``), or ``""`` when the partition is the solver's."""
    origin = getattr(plan, "partition_from", "") or ""
    return origin.split(",")[0].removeprefix("baseline ") if origin else ""


def solve_line(plan: Any) -> str:
    """One line saying whether the chosen partition is proven optimal: ``proven optimal`` when the solver (exact DP, or
    HiGHS with solution status optimal) finished, else that its limit (work budget or time limit) decided (``Partition.status``); a given
    or even split has no solver. Simulator refinement, when it moved the boundaries, is named after it."""
    ev = plan.chosen
    part = ev.partition
    if not part.solver and ev.method == "uniform":
        return "chosen partition: a given or even split (no solver, nothing to prove)"
    status = part.status or "Optimal"
    t = f" in {part.solve_time_s:.2f} s wall" if part.solve_time_s else ""
    moved = (plan.refinement or {}).get("gain_s", 0.0) > 0
    after = ("; then moved by simulator refinement, which searches neighbours and proves nothing"
             if moved else "")
    kept, own = kept_baseline(plan), getattr(plan, "solver_result", None)
    if kept and own is not None:  # the chosen partition is a baseline's: say so, and what the solver proved
        proof = (f"proven optimal for the solver's objective ({part.solver or ev.method}, status Optimal{t})"
                 if status == "Optimal" else
                 f"NOT proven optimal ({part.solver or ev.method}, status {status}{t})")
        return (f"chosen partition: the {kept} baseline's, not the solver's: it simulates faster "
                f"({ev.iteration_time_s:.4f} s) than the {own.method} "
                f"{'optimum' if status == 'Optimal' else 'partition'} ({own.iteration_time_s:.4f} s, "
                f"boundaries {list(own.partition.boundaries)}), which is {proof}; the solver's objective is not the "
                f"simulated time{after}")
    if status == "Optimal":
        return (f"chosen partition: proven optimal for the solver's objective ({part.solver or ev.method}, status "
                f"Optimal{t}){after}")
    return (f"chosen partition: NOT proven optimal: the solver's {limit_word(status)} decided "
            f"({part.solver or ev.method}, status {status}{t}){after}")


def partition_label(plan: Any, evaluation: Any = None) -> str:
    """``"<method> partition"`` for figure captions and report sources; for a plan whose chosen boundaries are a
    baseline's (``plan.partition_from``, kept because they simulate faster than the solver's optimum, also after a
    plan JSON round trip) it says so: ``"parameters baseline's partition (kept over the ilp optimum)"``."""
    ev = plan.chosen if evaluation is None else evaluation
    kept = kept_baseline(plan)
    if kept and ev is plan.chosen:
        what = "optimum" if ev.partition.proven else "best partition (not proven optimal)"
        return f"{kept} baseline's partition (kept over the {ev.method} {what}: it simulates faster)"
    return f"{method_name(plan, ev)} partition"


def method_name(plan: Any, evaluation: Any = None) -> str:
    """The evaluation's method, or ``given split`` where ``uniform`` scored a split that is not the even one (a
    recipe's pipeline layout, Megatron's embedding/loss-accounted split, whose first or last virtual stage may
    hold no decoder layer)."""
    from tessera_lab.plan.problem import uniform_boundaries

    ev = plan.chosen if evaluation is None else evaluation
    b = list(ev.partition.boundaries)
    stages = len(b) - 1
    if ev.method == "uniform" and (stages > plan.model.num_layers
                                   or b != list(uniform_boundaries(plan.model.num_layers, stages))):
        return "given split"
    return ev.method
