"""The ``threads`` pair handler's CUDA streams, with a fake stream recorder (no GPU needed): forward and backward of
every pair on different streams (two side streams by micro-batch parity; autograd runs a backward on its
forward's stream), and ``record_stream`` on every tensor handed from one stream to another.

Expected values are worked out by hand from the overlapped schedule's lists (``build_schedule("overlapped", 2, 6)``):
rank 0 runs 0F0 0F1 0F2 (0F3;0B0) (0F4;0B1) (0F5;0B2) 0B3 0B4 0B5, rank 1 runs 1F0 (1F1;1B0) ... (1F5;1B4) 1B5.
"""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("torch")

from tessera_lab.pipeline.schedules import ActionType, build_schedule  # noqa: E402
from tessera_lab.runner.runtime.pairs import PairStreams, get_pair_handler  # noqa: E402


class FakeCuda:
    """``torch.cuda`` as the handler uses it: streams log ``wait_stream`` / ``wait_event``; ``stream(s)`` sets the
    calling thread's current stream; events log the stream they were recorded on."""

    def __init__(self):
        self.log: list[tuple] = []
        self.tls = threading.local()
        self.main = self.Stream("cpu", name="main")

    def Stream(self, device, name=None):  # noqa: N802 - torch's name
        cuda = self

        class S:
            def __init__(self):
                self.name = name or f"side{sum(1 for e in cuda.log if e[0] == 'new' and e[1] != 'main')}"
                cuda.log.append(("new", self.name))

            def wait_stream(self, other):
                cuda.log.append(("wait_stream", self.name, other.name))

            def wait_event(self, ev):
                cuda.log.append(("wait_event", self.name, ev.stream.name))

            def __repr__(self):
                return self.name

        return S()

    def Event(self):  # noqa: N802
        class E:
            stream = None

            def record(self, stream=None):
                self.stream = stream

        return E()

    def current_stream(self, device=None):
        return getattr(self.tls, "cur", self.main)

    @contextlib.contextmanager
    def stream(self, s):
        old = self.current_stream()
        self.tls.cur = s
        try:
            yield
        finally:
            self.tls.cur = old


class T:
    """A tensor that logs ``record_stream``."""

    def __init__(self, name, log):
        self.name, self.log = name, log

    def record_stream(self, s):
        self.log.append(("record_stream", self.name, s.name))


class FakeExecutor:
    """What the handler reads of the executor; ``ran`` logs (what, action, stream it ran on)."""

    def __init__(self, cuda, S):
        self.S = S
        self.pair_streams = PairStreams("cuda:0", cuda)
        self._side = ThreadPoolExecutor(max_workers=1)
        self._targets = {}
        self.cuda = cuda
        self.ran: list[tuple] = []

    def _forward(self, x, inp, record=True):
        self.ran.append(("F", str(x), self.cuda.current_stream().name))
        return T(f"out{x}", self.cuda.log)

    def _backward(self, x, grad, record=True):
        # autograd runs a backward's ops on its forward's stream
        s = self.pair_streams.fwd.get((x.stage, x.microbatch), self._bstream.get((x.stage, x.microbatch)))
        self.ran.append(("B", str(x), s.name if s is not None else "main"))
        return T(f"gx{x}", self.cuda.log)


def _walk(rank: int):
    cuda = FakeCuda()
    ex = FakeExecutor(cuda, 2)
    ex._bstream = {}
    handler = get_pair_handler("threads")
    fwd_stream = {}
    for a in build_schedule("overlapped", 2, 6).actions[rank]:
        if a.type is ActionType.OVERLAP_F_B:
            f = next(x for x in a.sub_actions if x.type is ActionType.F)
            b = next(x for x in a.sub_actions if x.type is not ActionType.F)
            ex._bstream = {(b.stage, b.microbatch): ex.pair_streams.fwd.get((b.stage, b.microbatch))}
            handler.run(ex, f, b, T(f"in{f}", cuda.log), T(f"grad{b}", cuda.log))
            fwd_stream[str(f)] = ex.pair_streams.fwd[(f.stage, f.microbatch)].name
        elif a.type is ActionType.F:
            ex.ran.append(("F", str(a), "main"))
            fwd_stream[str(a)] = "main"
        else:  # a backward alone: the executor's path for it
            bs = ex.pair_streams.backward_stream(a, T(f"grad{a}", cuda.log))
            ex.ran.append(("B", str(a), bs.name if bs is not None else "main"))
    ex._side.shutdown()
    return cuda.log, ex.ran, fwd_stream


def test_pair_forward_and_backward_run_on_different_streams():
    for rank, expect in ((0, {"0F3": "side1", "0F4": "side0", "0F5": "side1"}),
                         (1, {"1F1": "side1", "1F2": "side0", "1F3": "side1", "1F4": "side0", "1F5": "side1"})):
        log, ran, fwd = _walk(rank)
        assert {k: v for k, v in fwd.items() if v != "main"} == expect
        # every pair: its forward's stream differs from the stream its backward ran on (the backward's forward's)
        on = {name: stream for _, name, stream in ran}
        pairs = [[str(x) for x in a.sub_actions] for a in build_schedule("overlapped", 2, 6).actions[rank]
                 if a.type is ActionType.OVERLAP_F_B]
        assert pairs and all(on[f] != on[b] for f, b in pairs), ran
        # a backward alone after its forward ran in a pair runs on that side stream
        alone = [r for r in ran if r[0] == "B"][-1]
        assert alone[2] == fwd[alone[1].replace("B", "F")]


def test_record_stream_on_every_tensor_handed_across_streams():
    log, ran, fwd = _walk(1)
    rec = [e[1:] for e in log if e[0] == "record_stream"]
    # (1F2;1B1): the forward on side0 reads its input; 1B1 runs on side1 (1F1's stream) and reads its output
    # gradient there; the forward's output and the input gradient go back to the main stream
    for item in (("in1F2", "side0"), ("grad1B1", "side1"), ("out1F2", "main"), ("gx1B1", "main")):
        assert item in rec, (item, rec)
    # (1F1;1B0): 1B0's forward ran on main, so its gradients stay on main (nothing to hand)
    assert ("in1F1", "side1") in rec and ("out1F1", "main") in rec
    assert not any(name in ("grad1B0", "gx1B0") for name, _ in rec)
    # the lone 1B5 (its forward on side1): its output gradient handed to side1
    assert ("grad1B5", "side1") in rec
    # ordering without host syncs: each side stream waits for main before its forward, main waits on its event
    assert ("wait_stream", "side0", "main") in log and ("wait_event", "main", "side0") in log
    assert ("wait_stream", "side1", "main") in log and ("wait_event", "main", "side1") in log


def test_parity_collision_takes_the_other_side_stream():
    """A pair whose backward's forward ran on the parity stream of its forward (even offset) swaps streams."""
    from tessera_lab.pipeline.schedules import Action

    ps = PairStreams("cuda:0", FakeCuda())
    ps.fwd[(0, 0)] = ps.side[0]
    assert ps.pick(Action(0, ActionType.F, 2), Action(0, ActionType.B, 0)) is ps.side[1]
    assert ps.pick(Action(0, ActionType.F, 3), Action(0, ActionType.B, 0)) is ps.side[1]
    assert ps.pick(Action(0, ActionType.F, 2), Action(0, ActionType.B, 1)) is ps.side[0]
