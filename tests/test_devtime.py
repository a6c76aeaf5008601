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


def test_settle_reads_the_host_clock_after_a_device_synchronize(monkeypatch):
    import time

    calls = []
    monkeypatch.setattr(devtime.torch.cuda, "synchronize", lambda d=None: calls.append(("sync", time.perf_counter())))
    clk = devtime.StepClock(torch.device("cuda", 0))
    t = clk.settle()
    assert len(calls) == 1 and calls[0][1] <= t  # the host clock is read after the synchronize returned
    cpu = devtime.StepClock(torch.device("cpu"))
    cpu.settle()
    assert len(calls) == 1  # no synchronize on CPU


def test_job_reads_the_step_end_after_the_device_finished(monkeypatch, tmp_path):
    """The gradient sync and the optimizer only enqueue kernels on CUDA: a step's end (``step_time``, the sync+opt
    event, tokens/s) must be read after the device ran them (:meth:`StepClock.settle`), not at their launch."""
    import torch.distributed as dist

    from tessera_lab.runner.runtime.specs import RunSpec, WorldSpec
    from tessera_lab.runner.runtime.topology import build_topology
    from tessera_lab.runner.runtime.train import run_job

    if dist.is_initialized():  # pragma: no cover - the file runs alone in its worker
        pytest.skip("a process group exists in this process")
    settled = []
    real = devtime.StepClock.settle

    def settle(self):
        settled.append(real(self))
        return settled[-1]

    monkeypatch.setattr(devtime.StepClock, "settle", settle)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        world = WorldSpec(pp=1, ep=1)
        raw = run_job(world, build_topology(world, 0, torch.device("cpu")), RunSpec(steps=2))
    finally:
        dist.destroy_process_group()
    assert len(settled) == 2  # once per step
    for rec, t_end in zip(raw["records"], settled):
        p = rec[0]
        assert p["step_time"] == t_end - p["t0"]
        assert [e for e in p["events"] if e[0] == "step"][0][5] == t_end - p["t0"]


def test_backward_all_to_all_is_labelled_with_its_forward_action(tmp_path):
    """On CUDA the autograd engine runs a backward Function on its device thread, where the executor's thread-local
    action is not set. The backward exchange must carry the ``(stage, microbatch)`` read at its forward. Shown on CPU
    by running the backward from another host thread (the same situation: a thread that never ran the action)."""
    import functools
    import threading

    import torch.distributed as dist

    from tessera_lab.runner.runtime.moe import all_to_all

    if dist.is_initialized():  # pragma: no cover - the file runs alone in its worker
        pytest.skip("a process group exists in this process")
    tls, seen = threading.local(), []

    def hook(name, start, end, nbytes, action=None):
        seen.append((name, getattr(tls, "action", (-1, None)) if action is None else action))

    hook = functools.partial(hook)
    hook.current_action = lambda: getattr(tls, "action", (-1, None))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        tls.action = (3, 7)
        x = torch.randn(4, 2, requires_grad=True)
        y = all_to_all(x, [4], [4], dist.group.WORLD, hook=hook, name="ep_dispatch")
        worker = threading.Thread(target=lambda: y.sum().backward())
        worker.start()
        worker.join()
    finally:
        dist.destroy_process_group()
    assert seen == [("ep_dispatch", (3, 7)), ("ep_dispatch_bwd", (3, 7))]
    assert torch.equal(x.grad, torch.ones(4, 2))


def test_sync_debug_sets_and_restores_the_mode_on_cuda_only(monkeypatch):
    """$TESSERA_LAB_SYNC_DEBUG=warn|error runs the block under torch.cuda.set_sync_debug_mode (process-wide) and puts
    the previous mode back, also when the block raises; on CPU and when unset nothing is touched; another value is
    one ValueError naming the variable, the value and the allowed ones."""
    calls, state = [], {"mode": 0}
    monkeypatch.setattr(devtime.torch.cuda, "get_sync_debug_mode", lambda: state["mode"])
    monkeypatch.setattr(devtime.torch.cuda, "set_sync_debug_mode",
                        lambda m: (calls.append(m), state.__setitem__("mode", m)))
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.delenv(devtime.SYNC_DEBUG_ENV, raising=False)
    with devtime.sync_debug(cuda):
        pass
    monkeypatch.setenv(devtime.SYNC_DEBUG_ENV, "error")
    with devtime.sync_debug(cpu):
        pass
    assert calls == []
    with pytest.raises(RuntimeError):
        with devtime.sync_debug(cuda):
            assert state["mode"] == "error"
            raise RuntimeError("a synchronizing operation")
    assert calls == ["error", 0] and state["mode"] == 0
    monkeypatch.setenv(devtime.SYNC_DEBUG_ENV, "loud")
    with pytest.raises(ValueError, match=r"^TESSERA_LAB_SYNC_DEBUG = 'loud' is not allowed; allowed: warn or 1, "):
        devtime.sync_debug_mode()
    # torch.cuda.set_sync_debug_mode's own values (torch/cuda/__init__.py), as strings
    for value, mode in (("default", None), ("0", None), ("1", "warn"), ("2", "error"), (" warn ", "warn"),
                        ("WARN", "warn"), ("Error", "error")):
        monkeypatch.setenv(devtime.SYNC_DEBUG_ENV, value)
        assert devtime.sync_debug_mode() == mode, value
