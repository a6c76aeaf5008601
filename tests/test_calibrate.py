"""Calibration records what the prediction reads: the CPU probes (share, speed, available cores), the runner's
own CPU work per step, the in-situ all-to-all cost and the CPU of gloo sends, receives and waits."""

from __future__ import annotations

import pytest

from tessera_lab.runner.testbed.probe import cpu_probe


def test_cpu_probe_times_a_fixed_loop_and_rejects_bad_counts():
    t1 = cpu_probe(1, repeats=2, iterations=20_000)
    assert 0 < t1 < 5
    with pytest.raises(ValueError, match="processes"):
        cpu_probe(0)


def test_cpu_share_measures_a_window():
    from tessera_lab.runner.testbed.probe import cpu_share

    assert 0 < cpu_share(1, window_s=0.05) <= 1.0
    with pytest.raises(ValueError, match="processes"):
        cpu_share(0)


def test_available_cores_by_hand(monkeypatch):
    from tessera_lab.runner.testbed import probe

    # two spinners, each ran 1 s of wall with 0.5 s of CPU (half a core each): one core in all
    seen = []
    monkeypatch.setattr(probe, "_spinners", lambda n, w, *own: seen.append((n, own)) or [(50, 0.5, 1.0)] * n)
    a = probe.available_cores(2)
    assert a["share"] == 0.5 and a["cores_available"] == 1.0 and a["processes"] == 2
    # as many spinners as the job has processes, each in a session of its own: 6 at a sixth of a core -> 1
    monkeypatch.setattr(probe, "_spinners", lambda n, w, *own: seen.append((n, own)) or [(50, 1 / 6, 1.0)] * n)
    assert probe.available_cores(2, processes=6)["cores_available"] == pytest.approx(1.0)
    assert seen[-1] == (6, (True,))
    # never more than the machine's cores
    monkeypatch.setattr(probe, "_spinners", lambda n, w, *own: [(100, 1.0, 1.0)] * n)
    assert probe.available_cores(2, processes=4)["cores_available"] == 2.0


@pytest.mark.slow
def test_calibrate_records_probes_and_in_situ_all_to_all():
    pytest.importorskip("torch")
    from tessera_lab.runner.testbed.calibrate import calibrate
    from tessera_lab.runner.testbed.predict import MachineState, predict_runner

    dev = calibrate(repeats=2)
    meta = dev["metadata"]
    assert meta["cpu_probe_s"] > 0 and set(meta["cpu_probe_world_s"]) == {"4"}
    for g in ("2", "4"):
        situ = dev["all_to_all"][g]["in_situ"]
        assert situ["per_all_to_all_s"] >= 0 and situ["processes"] == 4 and situ["bytes"] > 0
    for ep in ("1", "2"):
        rc = dev["runner_cpu"][ep]
        assert rc["factor"] > 0 and rc["cpu_per_step_s"] > 0 and rc["blocked_s"] >= 0 and rc["processes"] == int(ep)
    rcx = dev["runner_cpu"]
    assert rcx["work_probe"]["ref_s"] > 0 and all(rcx[ep]["work_probe_s"] > 0 for ep in ("1", "2"))
    table = rcx["corun"]["table"]  # co-running slowdowns never below 1 and never shrinking with more processes
    assert table["1"] == 1.0 and 1.0 <= table["2"] <= table["4"]
    assert 0 <= dev["p2p"]["wait_cpu_share"] <= 1 and dev["p2p"]["cpu_per_op_s"] >= 0
    p = predict_runner(dev, dev["metadata"]["model"], pp=2, ep=2, microbatches=4, machine=MachineState(cores_available=1.0))
    assert p["iteration_s"] > 0 and p["cores_available"] == 1.0
