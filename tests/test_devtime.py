"""The runtime's time stamps: host seconds on CPU; on CUDA recorded events resolved after one synchronize at the
end of the step (driven by a fake ``torch.cuda.Event`` whose record() reads a virtual GPU clock)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tessera_lab.runner.runtime import devtime  # noqa: E402


class _GPU:
    t_ms = 0.0
    syncs = 0


class FakeEvent:
    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None):
        self.t = _GPU.t_ms

    def elapsed_time(self, other):  # milliseconds from self to other, as torch.cuda.Event
        return other.t - self.t


def test_cuda_stamps_are_events_resolved_at_the_end(monkeypatch):
    monkeypatch.setattr(devtime.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(devtime.torch.cuda, "synchronize", lambda d=None: setattr(_GPU, "syncs", _GPU.syncs + 1))
    clk = devtime.StepClock(torch.device("cuda", 0))
    _GPU.t_ms = 100.0
    clk.start(0.0)
    _GPU.t_ms = 102.5
    a = clk.now()
    _GPU.t_ms = 110.0
    b = clk.now()
    assert isinstance(a, FakeEvent) and _GPU.syncs == 0  # no host sync while the step runs
    ev = clk.resolve([("compute", "F", 0, 1, a, b, "0F1")])
    assert _GPU.syncs == 1
    assert ev == [("compute", "F", 0, 1, 0.0025, 0.010, "0F1")]  # (102.5 - 100) ms, (110 - 100) ms in seconds


def test_cpu_stamps_are_host_seconds():
    clk = devtime.StepClock(torch.device("cpu"))
    import time

    t0 = time.perf_counter()
    clk.start(t0)
    a = clk.now()
    assert isinstance(a, float) and 0.0 <= a < 5.0
    assert clk.resolve([("x", "F", 0, 0, a, a, "l")]) == [("x", "F", 0, 0, a, a, "l")]
