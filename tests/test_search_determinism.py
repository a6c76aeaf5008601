"""The search's result does not depend on the machine's load: the ILP that partitions virtual stages runs under a
work budget (binaries, branch-and-bound nodes), never a wall-clock limit. A clock that runs 10 s per reading (a
machine loaded far past the old 0.02 s per solve) must give the same rows as the real one."""

from __future__ import annotations

import time
import types

import pytest

from tessera_lab.model.spec import load_model
from tessera_lab.plan import ilp
from tessera_lab.plan import search as S
from tessera_lab.plan.search import Layout


def _slow_clock(step_s: float = 10.0):
    """A stand-in for the ``time`` module of :mod:`tessera_lab.plan.ilp` whose ``perf_counter`` advances ``step_s``
    per reading: every wall-clock deadline there is spent at its first check."""
    ticks = [time.perf_counter()]

    def perf_counter() -> float:
        ticks[0] += step_s
        return ticks[0]

    return types.SimpleNamespace(perf_counter=perf_counter, process_time=time.process_time)


#: gpt-oss-20b on 32 H200 (1,024 sequences of 4,096): the first layout's ILP (336 binaries after pruning, within the
#: budget) finds a partition simulated at 6.08 s where the heuristic plan (the exact DP over the virtual stages,
#: scored per rank) gives 6.26 s; the second has its ILP proven optimal at the heuristic's plan
LAYOUTS = [Layout(pp=2, vpp=2, ep=2, tp=1, dp=8, microbatches=16, micro_batch_size=4, schedule="interleaved-overlapped",
                  recompute="none", dispatcher="deepep"),
           Layout(pp=2, vpp=2, ep=8, tp=1, dp=2, microbatches=16, micro_batch_size=4, schedule="interleaved-overlapped",
                  recompute="none", dispatcher="deepep")]


def _rows(res) -> list[tuple]:
    return [(c.layout, c.result["iteration_time_s"], tuple(c.result["boundaries"]), c.result["solver_status"])
            for c in res.ranked]


def test_search_rows_do_not_depend_on_the_clock(monkeypatch):
    model = load_model("gpt-oss-20b")
    idle = S.search(model, 32, top=2, layouts=LAYOUTS)
    monkeypatch.setattr(ilp, "time", _slow_clock())
    loaded = S.search(model, 32, top=2, layouts=LAYOUTS)
    assert _rows(loaded) == _rows(idle)
    assert len(idle.ranked) == 2
    # the ILP decided (within its budget), not a fallback: statuses say so
    assert all(c.result["solver_status"] == "Optimal" for c in idle.ranked), _rows(idle)


def test_budget_gate_keeps_the_heuristic_plan(monkeypatch):
    """A budget of 0 binaries never runs HiGHS: the row is the heuristic plan's, and says so; the ILP's plan is
    at least as fast (it starts from that plan as its bound)."""
    model = load_model("gpt-oss-20b")
    solved = S.search(model, 32, top=1, layouts=LAYOUTS[:1])
    monkeypatch.setattr(S, "VIRTUAL_ILP_BUDGET", ilp.IlpBudget(max_binaries=0, max_nodes=0))
    gated = S.search(model, 32, top=1, layouts=LAYOUTS[:1])
    status = gated.ranked[0].result["solver_status"]
    assert status.startswith("NotSolved (") and "binaries over 0" in status and "work budget" in status
    assert solved.ranked[0].result["iteration_time_s"] <= gated.ranked[0].result["iteration_time_s"]


def test_ilp_budget_rejects_negative_counts():
    from tessera_lab.errors import PartitionError

    with pytest.raises(PartitionError, match="counts >= 0"):
        ilp.IlpBudget(max_binaries=-1, max_nodes=5)
