"""The CUDA code paths, as far as they run without a GPU: the two-stream runner of the overlap backends
driven by a fake ``torch.cuda`` (streams as virtual clocks, events as time stamps), and the clear errors of
the runner-executor ``cuda`` backend on a machine without enough GPUs. What has never run on a GPU is listed
in README ("GPUs")."""

from __future__ import annotations

import contextlib

import pytest

from tessera_lab.cost.analytic import Contention, two_lane_makespan
from tessera_lab.errors import ConfigError


class _Clock:
    current = None


class FakeStream:
    def __init__(self, device=None):
        self.t = 0.0

    def wait_event(self, ev):
        self.t = max(self.t, ev.t)


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream):
        self.t = stream.t

    def elapsed_time(self, other):  # milliseconds, as torch.cuda.Event does
        return (other.t - self.t) * 1e3


class FakeCuda:
    Stream, Event = FakeStream, FakeEvent

    @staticmethod
    def synchronize(device=None):
        pass

    @staticmethod
    @contextlib.contextmanager
    def stream(s):
        old, _Clock.current = _Clock.current, s
        try:
            yield
        finally:
            _Clock.current = old


class FakeTorch:
    cuda = FakeCuda


def _kernel(seconds):
    def run():
        _Clock.current.t += seconds  # the kernel occupies the stream it was issued on
    return run


def test_stream_runner_places_waits_where_the_dependencies_are():
    """Compute a1 (2 s) -> comm a2 (3 s) -> compute a3 (1 s), and an independent compute b1 (4 s), issued in the
    order a1, a2, b1, a3: streams give a1 [0, 2], a2 [2, 5] (waits on a1), b1 [2, 6] (behind a1 on compute),
    a3 [6, 7] (behind b1, after a2). The exact two-lane executor (no contention) gives the same makespan 7."""
    from tessera_lab.overlap.backends import StreamRunner

    runner = StreamRunner.__new__(StreamRunner)
    runner.torch, runner.device = FakeTorch, None
    runner.compute, runner.comm = FakeStream(), FakeStream()
    dur = {"a1": 2.0, "a2": 3.0, "b1": 4.0, "a3": 1.0}
    lanes = {"a1": "compute", "a2": "comm", "b1": "compute", "a3": "compute"}
    deps = {"a2": ("a1",), "a3": ("a2",)}
    order = ["a1", "a2", "b1", "a3"]
    spans = runner.run(order, {k: _kernel(v) for k, v in dur.items()}, lanes, deps)
    assert spans == {"a1": (0.0, 2.0), "a2": (2.0, 5.0), "b1": (2.0, 6.0), "a3": (6.0, 7.0)}
    assert max(e for _, e in spans.values()) == two_lane_makespan(order, dur, lanes, deps, Contention(0, 0)).makespan


def test_stream_runner_builds_kernels_on_the_compute_stream():
    from tessera_lab.overlap.backends import StreamRunner

    runner = StreamRunner.__new__(StreamRunner)
    runner.torch, runner.device = FakeTorch, None
    runner.compute, runner.comm = FakeStream(), FakeStream()
    with runner.building():
        assert _Clock.current is runner.compute
    assert _Clock.current is None


def test_runner_cuda_backend_without_enough_gpus_is_one_clear_error():
    torch = pytest.importorskip("torch")
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.runner.measure.overlap_measure import measure_layer_pairs

    n = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=f"needs {n + 1} GPUs; this machine has {n}"):
        measure_layer_pairs(load_model("qwen3-next-80b-a3b"), ParallelConfig(ep=n + 1, pp=1, dp=1, tp=1), "cuda")
    with pytest.raises(ConfigError, match="allowed: cpu, cuda"):
        measure_layer_pairs(load_model("qwen3-next-80b-a3b"), ParallelConfig(ep=2, pp=1, dp=1, tp=1), "tpu")
