"""The gap filler is driven by completion queries (:meth:`tessera_lab.runner.runtime.gaps.GapFiller.completed`):
before each deferred W it asks the awaited transfer ``is_completed()`` and never waits inside the fill; the single
``wait()`` comes after it. Hand example: one stage, four deferred W of 0.125 s each (the group's W seconds), the
controller's margin 0.5."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tessera_lab.pipeline.schedules import Action, ActionType  # noqa: E402
from tessera_lab.runner.runtime.gaps import GapFiller  # noqa: E402
from tessera_lab.runner.runtime.layers import WEIGHT_GRAD_STORE  # noqa: E402

F, I, W = ActionType.F, ActionType.I, ActionType.W


class FakeWork:
    """``is_completed()`` is False for the first ``n`` polls, then True; ``wait()`` records what ran before it."""

    def __init__(self, n: int, log: list):
        self.n, self.polls, self.log = n, 0, log

    def is_completed(self) -> bool:
        self.polls += 1
        return self.polls > self.n

    def wait(self) -> bool:
        self.log.append(("wait", self.polls))
        return True


class NoQueryWork:
    def __init__(self, log: list):
        self.log = log

    def wait(self) -> bool:
        self.log.append(("wait", None))
        return True


def _filler(predicted_wait: float):
    acts = [a for mb in range(4) for a in (Action(0, F, mb), Action(0, I, mb))] + [Action(0, W, mb) for mb in range(4)]
    log: list = []

    def run_w(a, how):
        WEIGHT_GRAD_STORE.flush((a.stage, a.microbatch))
        log.append((str(a), how))
        filler.ran_w(a, 0.125)

    filler = GapFiller(acts, cap=8, run_w=run_w, clock=lambda: 0.0)
    WEIGHT_GRAD_STORE.clear()
    for mb in range(4):
        WEIGHT_GRAD_STORE.defer((0, mb))
    filler.begin_step()
    filler.w_seconds[0] = 0.125
    filler.ctl.predicted[7] = predicted_wait
    filler.at(7)
    return filler, log


@pytest.mark.parametrize("polls_before_done, predicted, expect_w", [
    (2, 1.0, 2),   # budget (1 - 0.5) x 1.0 = 0.5 s fits all four; the transfer completes at the third poll: 2 W
    (0, 1.0, 0),   # already there at the first query: no gap, no W
    (99, 0.75, 3),  # never completes during the fill: the prediction bounds it, 0.375 s = 3 x 0.125 s
    (99, 1.0, 4),  # 0.5 s = 4 x 0.125 s: every ready W
    (3, 0.75, 3),  # completes at the fourth poll, but the prediction stops at 3 first
])
def test_fill_runs_exactly_the_w_that_fit_before_completion(polls_before_done, predicted, expect_w):
    filler, log = _filler(predicted)
    try:
        work = FakeWork(polls_before_done, log)
        filler.wait(work)
        ran = [x for x in log if x[0] != "wait"]
        assert [r[0] for r in ran] == [str(Action(0, W, mb)) for mb in range(expect_w)]  # in micro-batch order
        assert all(how == "fill" for _, how in ran)
        assert log[-1][0] == "wait" and sum(1 for x in log if x[0] == "wait") == 1  # one wait, after the fill
        assert filler.filled == [f"7:{Action(0, W, mb)}" for mb in range(expect_w)]
        assert len(WEIGHT_GRAD_STORE.pending()) == 4 - expect_w
    finally:
        WEIGHT_GRAD_STORE.clear()


def test_handle_without_a_query_falls_back_to_the_prediction():
    filler, log = _filler(0.75)
    try:
        filler.wait(NoQueryWork(log))
        assert [x[0] for x in log] == [str(Action(0, W, mb)) for mb in range(3)] + ["wait"]
    finally:
        WEIGHT_GRAD_STORE.clear()


def test_real_handles_answer_the_query():
    """The transports' batch handle, the CPU layer's coalesced Work and c10d's Work all have ``is_completed``
    (the query the filler uses)."""
    import torch.distributed as dist

    from tessera_lab.runner.runtime.nccl_cpu import CoalescedWork
    from tessera_lab.runner.runtime.transport import BatchHandle

    assert all(hasattr(c, "is_completed") for c in (BatchHandle, CoalescedWork, dist.Work))


def test_cuda_waits_come_from_events_read_at_the_step_end(monkeypatch):
    """On a GPU the filler times a wait with CUDA events (fake here: each records a device clock that a W
    advances by 0.125 s and the stream wait by 0.05 s), read only in ``end_step``: wait = 2 x 0.125 + 0.05 =
    0.3 s from its start, idle = 0.05 s after the fill (hand-computed)."""
    import torch

    now = [0.0]
    synced = []

    class Ev:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, stream=None):
            self.t = now[0]

        def synchronize(self):
            synced.append(self)

        def elapsed_time(self, end):
            assert self in synced or end in synced  # read only after a synchronize
            return (end.t - self.t) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", Ev)
    filler, log = _filler(1.0)
    filler.cuda = True
    orig_run = filler.run_w

    def run_w(a, how):
        orig_run(a, how)
        now[0] += 0.125

    filler.run_w = run_w

    class DevWork(FakeWork):
        def wait(self):
            now[0] += 0.05
            return super().wait()

    try:
        filler.wait(DevWork(2, log))
        assert filler.waits == {} and not synced  # nothing read during the step
        rec = filler.end_step()
        assert rec["observed"]["7"] == pytest.approx(0.3) and rec["idle"]["7"] == pytest.approx(0.05)
    finally:
        WEIGHT_GRAD_STORE.clear()


def test_cuda_w_seconds_come_from_events_not_host_launch_time():
    """On a GPU the controller's W clock is the device's: each W is stamped with CUDA events (fake here: a device
    clock the W's kernels advance by 0.2 s while its host launch takes no host time at all), read only in
    ``end_step``; the stage's W seconds fed to the controller are then 0.2 s (by hand), not ~0 host seconds."""
    now = [0.0]
    synced = []

    class Ev:
        def __init__(self):
            self.t = now[0]  # recorded on the stream: the device time the stream reaches it

        def synchronize(self):
            synced.append(self)

        def elapsed_time(self, end):
            assert end in synced  # read only after a synchronize
            return (end.t - self.t) * 1e3

    acts = [a for mb in range(2) for a in (Action(0, F, mb), Action(0, I, mb))] + [Action(0, W, mb) for mb in range(2)]

    def run_w(a, how):  # the executor's _run_w on a GPU: stamps around the flush
        e0 = Ev()
        WEIGHT_GRAD_STORE.flush((a.stage, a.microbatch))
        now[0] += 0.2
        filler.ran_w(a, e0, Ev())

    filler = GapFiller(acts, cap=8, run_w=run_w, clock=lambda: 0.0, cuda=True)
    WEIGHT_GRAD_STORE.clear()
    try:
        filler.begin_step()
        for k, a in enumerate(acts):
            filler.at(k)
            if a.type is W:
                run_w(a, "static")
        assert not synced and filler._w_obs == {}  # nothing read during the step
        filler.end_step()
        assert filler.w_seconds == {0: pytest.approx(0.2)}
        # on CPU the same call takes seconds stamps: end - start
        filler.begin_step()
        filler.ran_w(acts[-1], 1.0, 1.25)
        filler.end_step()
        assert filler.w_seconds == {0: pytest.approx(0.25)}
    finally:
        WEIGHT_GRAD_STORE.clear()


def test_executor_stamps_w_with_its_step_clock():
    """``PipelineExecutor._run_w`` hands the controller its step clock's stamps around the W (CUDA events on a
    GPU), not host seconds: a fake clock whose every stamp is 0.1 s of device time after the previous one gives
    W = 0.1 s."""
    from tessera_lab.runner.runtime.executor import PipelineExecutor

    got = []

    class Stamp:
        n = 0

        def __init__(self):
            self.t = Stamp.n * 0.1
            Stamp.n += 1

    class Stub:
        pair_streams = None
        _now = staticmethod(Stamp)

        def _event(self, *a):
            pass

        class gaps:  # noqa: N801
            @staticmethod
            def ran_w(x, start, end=None):
                got.append((str(x), end.t - start.t))

    WEIGHT_GRAD_STORE.clear()
    PipelineExecutor._run_w(Stub(), Action(0, W, 3))
    assert got == [("0W3", pytest.approx(0.1))]
