"""The runner's CPU accounting and the parts of the prediction that read it: per-step process CPU time in the
results, the co-running slowdown of processes computing side by side, and launches whose jobs take a step
each in turn. Expected values are worked by hand in each docstring."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tessera_lab.errors import ConfigError


def test_corun_slowdown_table_by_hand():
    """Table {1: 1, 2: 1.1, 4: 1.2}: 1.5 processes -> halfway to 2: 1.05; 3 -> halfway 2..4: 1.15; beyond the
    last entry it holds (8 -> 1.2); below one process, 1. A number c on a 2-core machine stands for {1: 1,
    2: c}."""
    from tessera_lab.runner.testbed.sharing import corun_slowdown

    t = {"1": 1.0, "2": 1.1, "4": 1.2}
    assert corun_slowdown(t, 1, 2) == 1.0
    assert corun_slowdown(t, 0.5, 2) == 1.0
    assert corun_slowdown(t, 1.5, 2) == pytest.approx(1.05)
    assert corun_slowdown(t, 3, 2) == pytest.approx(1.15)
    assert corun_slowdown(t, 8, 2) == pytest.approx(1.2)
    assert corun_slowdown(1.1, 2, 2) == pytest.approx(1.1)
    assert corun_slowdown(1.1, 1.5, 2) == pytest.approx(1.05)
    assert corun_slowdown(1.0, 5, 2) == 1.0
    with pytest.raises(ConfigError, match="slowdown"):
        corun_slowdown({"2": 0.9}, 2, 2)


def test_shared_simulation_with_corun_by_hand():
    """One stage (pp = 1), GPipe, 2 micro-batches, F = 1 and B = 2 CPU-seconds each: 6 CPU-seconds per
    process. Two processes on two cores, each slowed 1.25x by the other: 7.5 s, and the CPU used is 2 x 7.5 =
    15 CPU-seconds. Alone (one process) there is nothing to share: 6 s."""
    from tessera_lab.pipeline.actions import ActionType
    from tessera_lab.pipeline.schedules import build_schedule
    from tessera_lab.runner.testbed.sharing import simulate_shared

    s = build_schedule("gpipe", 1, 2, 1)
    work = lambda st_, i, t: 1.0 if t is ActionType.F else 2.0  # noqa: E731
    two = simulate_shared(s, work, cores=2, procs_per_rank=2, corun={"1": 1.0, "2": 1.25})
    assert two["iteration_s"] == pytest.approx(7.5)
    assert two["cpu_s"] == pytest.approx(15.0)
    one = simulate_shared(s, work, cores=2, procs_per_rank=1, corun={"1": 1.0, "2": 1.25})
    assert one["iteration_s"] == pytest.approx(6.0) and one["cpu_s"] == pytest.approx(6.0)
    # another tenant holding one of the two cores (cores available 1) makes 2 processes running: 1.25x too
    other = simulate_shared(s, work, cores=1, procs_per_rank=1, corun={"2": 1.25}, machine_cores=2)
    assert other["iteration_s"] == pytest.approx(7.5)


@settings(max_examples=30, deadline=None)
@given(pp=st.integers(1, 4), m=st.integers(4, 6), procs=st.integers(1, 3), cores=st.floats(0.5, 4.0),
       c2=st.floats(1.0, 1.5), sched=st.sampled_from(["gpipe", "1f1b", "zb-h1", "overlapped"]))
def test_corun_only_slows_and_cpu_is_work_times_slowdown(pp, m, procs, cores, c2, sched):
    """A co-running slowdown never shortens the step, and never by more than its largest factor; the CPU
    used lies between the work and the work times that factor."""
    from tessera_lab.pipeline.schedules import build_schedule
    from tessera_lab.runner.testbed.sharing import simulate_shared

    s = build_schedule(sched, pp, m, 1)
    work = lambda st_, i, t: 1.0 + 0.5 * st_  # noqa: E731
    base = simulate_shared(s, work, cores=cores, procs_per_rank=procs)
    slow = simulate_shared(s, work, cores=cores, procs_per_rank=procs, corun={"1": 1.0, "2": c2}, machine_cores=2)
    assert base["iteration_s"] - 1e-9 <= slow["iteration_s"] <= base["iteration_s"] * c2 + 1e-9
    assert base["cpu_s"] - 1e-9 <= slow["cpu_s"] <= base["cpu_s"] * c2 + 1e-9


def test_cpu_summary_by_hand():
    """Two ranks, three steps (step 0 is the warm-up): rank CPU in actions 0.1 / 0.2, 0.3 / 0.5, 0.4 / 0.4:
    per step sums of the observed steps 0.8 and 0.8 -> 0.8; per rank medians (0.3 + 0.4) / 2 = 0.35 and
    (0.5 + 0.4) / 2 = 0.45; sync + optimizer 0.02 per rank -> 0.04."""
    from tessera_lab.runner.launch.results import cpu_summary

    steps = [(0.1, 0.2), (0.3, 0.5), (0.4, 0.4)]
    records = [[{"rank": r, "cpu_s": {"actions": a[r], "sync_opt": 0.02}} for r in (0, 1)] for a in steps]
    c = cpu_summary(records, [1, 2])
    assert c["actions_s"] == pytest.approx(0.8)
    assert c["per_rank_actions_s"] == pytest.approx([0.35, 0.45])
    assert c["sync_opt_s"] == pytest.approx(0.04)
    assert cpu_summary([[{"rank": 0}]], [0]) is None


def test_run_jobs_interleaves_whole_steps(monkeypatch):
    """Jobs of 2 and 3 steps: one after the other A0 A1 B0 B1 B2; interleaved A0 B0 A1 B1 B2, each step whole
    before the next job's starts, and each job's value returned in order."""
    pytest.importorskip("torch")
    from tessera_lab.runner.runtime import train

    log: list[str] = []

    def fake(world, topo, spec, out_dir):
        for k in range(spec.steps):
            log.append(f"{spec.name}{k}")
            yield
        return spec.name

    class Spec:
        def __init__(self, name, steps):
            self.name, self.steps, self.deterministic = name, steps, False

    monkeypatch.setattr(train, "_job_steps", fake)
    jobs = [Spec("A", 2), Spec("B", 3)]
    assert train.run_jobs(None, None, jobs) == ["A", "B"]
    assert log == ["A0", "A1", "B0", "B1", "B2"]
    log.clear()
    assert train.run_jobs(None, None, jobs, interleave=True) == ["A", "B"]
    assert log == ["A0", "B0", "A1", "B1", "B2"]


@pytest.mark.slow
def test_interleaved_launch_is_bitwise_the_reference_and_reports_cpu(tmp_path):
    """Two jobs (1F1B and GPipe) interleaved in one pp = 2, ep = 2 launch: each job's losses and gradients
    are bitwise those of the single-process reference, and every rank's CPU time per step is reported
    (positive, and no more than its wall time times the process's threads: gloo's included, at most a few)."""
    pytest.importorskip("torch")
    from tessera_lab.runner.launch.spawn import spawn
    from tessera_lab.runner.runtime.specs import RunSpec, WorldSpec

    jobs = [RunSpec(name=s, schedule=s, steps=3, check_reference=True, save_grads=True) for s in ("1f1b", "gpipe")]
    res = spawn(WorldSpec(pp=2, ep=2, interleave=True), jobs, out_dir=str(tmp_path), timeout_s=300)
    for s in ("1f1b", "gpipe"):
        job = res.job(s)
        ref = job["reference"]
        assert ref["bitwise_equal"] and ref["grads_bitwise_equal"] and ref["grads_compared"] > 0, ref
        cpu = job["cpu"]
        assert len(cpu["per_rank_actions_s"]) == 4 and all(x > 0 for x in cpu["per_rank_actions_s"])
        assert cpu["actions_s"] <= 4 * 8 * max(job["step_times_s"])
