"""Calibration records what the prediction reads: the CPU-share probes and the in-situ all-to-all cost."""

from __future__ import annotations

import pytest

from tessera_lab.runner.probe import cpu_probe


def test_cpu_probe_times_a_fixed_loop_and_rejects_bad_counts():
    t1 = cpu_probe(1, repeats=2, iterations=20_000)
    assert 0 < t1 < 5
    with pytest.raises(ValueError, match="processes"):
        cpu_probe(0)


@pytest.mark.slow
def test_calibrate_records_probes_and_in_situ_all_to_all():
    pytest.importorskip("torch")
    from tessera_lab.runner.calibrate import calibrate
    from tessera_lab.runner.predict import predict_runner

    dev = calibrate(repeats=2)
    meta = dev["metadata"]
    assert meta["cpu_probe_s"] > 0 and set(meta["cpu_probe_world_s"]) == {"4"}
    for g in ("2", "4"):
        situ = dev["all_to_all"][g]["in_situ"]
        assert situ["per_all_to_all_s"] >= 0 and situ["processes"] == 4 and situ["bytes"] > 0
    p = predict_runner(dev, dev["metadata"]["model"], pp=2, ep=2, microbatches=4, cpu_probe_s=meta["cpu_probe_world_s"]["4"])
    assert p["iteration_s"] > 0 and p["busy_processes"] <= 4
