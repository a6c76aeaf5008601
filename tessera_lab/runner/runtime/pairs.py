"""Handlers of overlapped ``OVERLAP_F_B`` pairs, kept in a registry (as ``torch.distributed.pipelining``'s
``register_custom_function`` does for custom actions).

A handler is called as ``handler(executor, f, b, inp, grad) -> (forward output, backward input gradient)``
with the forward leaf action ``f`` (its input ``inp`` already received) and the backward leaf ``b`` (B or I,
its output gradient ``grad``, None on the last stage). Built in:

* ``serial``: the whole backward, then the whole forward (monolithic autograd passes);
* ``threads``: the whole forward on a side thread beside the whole backward on the calling thread; on a GPU
  the forward on one of two side streams, never the stream the backward runs on (:class:`PairStreams`); on CPU
  it measures thread parallelism as much as hidden communication;
* ``scheduled``: node level (:mod:`tessera_lab.runner.runtime.nodes`): the nodes of F and B in a given issue order
  (:mod:`tessera_lab.runner.runtime.orders`: a named candidate such as ``megatron``, the searched order, or an
  explicit template), compute on the calling thread, all-to-alls asynchronous with their waits where the
  consumers are.

A node-level handler (``node_level=True``) makes the executor run every forward and backward of the job as
nodes, so a backward paired later finds its forward's nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.schedules import ActionType

__all__ = ["PairStreams", "PairHandler", "PAIR_HANDLERS", "register_pair_handler", "get_pair_handler", "interleave"]


@dataclass(frozen=True)
class PairHandler:
    """A registered pair handler: ``run(executor, f, b, inp, grad) -> (out, gx)``; ``node_level``: the job's
    forwards and backwards run as nodes."""

    name: str
    run: Callable
    node_level: bool
    doc: str = ""


PAIR_HANDLERS: dict[str, PairHandler] = {}


def register_pair_handler(name: str, run: Callable, *, node_level: bool = False, doc: str = "") -> None:
    """Add (or replace) a pair handler under ``name`` (then usable as ``run --pair-exec NAME``)."""
    if not isinstance(name, str) or not name:
        raise ConfigError("pair handler name must be a non-empty string")
    PAIR_HANDLERS[name] = PairHandler(name, run, node_level, doc)


def get_pair_handler(name: str) -> PairHandler:
    """The handler registered as ``name``.

    Raises:
        ConfigError: unknown name (lists the registered ones).
    """
    if name not in PAIR_HANDLERS:
        raise ConfigError(f"field 'pair_exec' = {name!r} is unknown; allowed: {', '.join(PAIR_HANDLERS)}")
    return PAIR_HANDLERS[name]


def default_pair_exec(device_type: str, has_pairs: bool) -> str:
    """The pair handler a run without ``pair_exec`` uses: ``scheduled`` on CUDA when the schedule has overlapped
    pairs, ``threads`` otherwise (without pairs no handler runs, and the stages run whole, not node by node). On NCCL
    the ``threads`` handler issues a pair's EP all-to-alls on two communicators from two host threads (the side
    thread's forward, the autograd device thread's backward) in an order that may differ between ranks, which NCCL
    supports only while the kernels of both can run on the device together (NCCL user guide, "Using multiple NCCL
    communicators concurrently"); ``scheduled`` issues every all-to-all from one host thread in a fixed order."""
    return "scheduled" if device_type == "cuda" and has_pairs else "threads"


def interleave(f_keys: list[str], f_layers: list[int], b_keys: list[str], b_layers: list[int],
               template: tuple[str, ...]) -> list[tuple[str, str]]:
    """The full issue order ``[(side, node key)]`` of a pair: the forward's embedding and the backward's head
    first, then the template for each (forward layer k, backward layer k) pair (forward layers ascending,
    backward layers descending), the unpaired layers in program order, then the forward's head and the
    backward's embedding."""
    out: list[tuple[str, str]] = []
    if f_keys and f_keys[0] == "embed":
        out.append(("f", "embed"))
    if b_keys and b_keys[0] == "head":
        out.append(("b", "head"))
    bl = list(reversed(b_layers))
    n = min(len(f_layers), len(bl))
    for k in range(n):
        for key in template:
            side, node = key.split(".")
            out.append((side, f"L{f_layers[k] if side == 'f' else bl[k]}.{node}"))
    from .orders import B_NODES, F_NODES

    out += [("f", f"L{i}.{x}") for i in f_layers[n:] for x in F_NODES]
    out += [("b", f"L{i}.{x}") for i in bl[n:] for x in B_NODES]
    if f_keys and f_keys[-1] == "head":
        out.append(("f", "head"))
    if b_keys and b_keys[-1] == "embed":
        out.append(("b", "embed"))
    return out


# ---------------------------------------------------------------------------------------------- built-ins
def _serial(ex, f, b, inp, grad):
    gx = ex._backward(b, grad, record=False)
    out = ex._forward(f, inp, record=False)
    return out, gx


class PairStreams:
    """The CUDA streams of the ``threads`` handler on a GPU (None on CPU).

    Autograd runs a backward op on the stream its forward op ran on (torch "CUDA semantics: stream semantics of
    backward passes"), so a pair overlaps only when its forward goes to another stream than its backward's
    forward did. Two side streams by micro-batch parity: forward ``(s, i)`` of a pair goes to ``side[i % 2]``,
    or to the other side stream when that one ran the paired backward's forward; a forward outside a pair runs
    on the main (current) stream. Every tensor handed from one stream to another gets ``record_stream`` on the
    stream that uses it (the caching allocator then keeps its memory until that stream's work is done), as
    Megatron-Core's ``ScheduleNode`` does for its inputs and output gradients
    (``megatron/core/pipeline_parallel/utils.py``, NVIDIA/Megatron-LM at 8333bd5bb6de2bdbdb3ebebf224b4a339a04ec90).

    ``cuda``: ``torch.cuda`` (a fake with ``Stream``, ``Event``, ``stream`` and ``current_stream`` in tests).
    """

    def __init__(self, device, cuda=None):
        if cuda is None:
            import torch

            cuda = torch.cuda
        self.cuda = cuda
        self.device = device
        self.side = (cuda.Stream(device), cuda.Stream(device))
        #: (stage, micro-batch) -> the side stream its forward ran on (absent: the main stream)
        self.fwd: dict[tuple[int, int], object] = {}
        #: (stage, micro-batch) -> the side stream its I ran on (its deferred W reads the stash on the main one)
        self.i_ran: dict[tuple[int, int], object] = {}

    def backward_stream(self, b, grad):
        """Before backward leaf ``b`` (B or I) on the calling thread: the side stream autograd will run it on (its
        forward's; None: the main stream), with ``grad`` handed to it."""
        bs = self.fwd.pop((b.stage, b.microbatch), None)
        if bs is not None:
            self.hand(grad, bs)
            if b.type.value == "I":
                self.i_ran[(b.stage, b.microbatch)] = bs
        return bs

    def pick(self, f, b):
        """The side stream for forward ``f`` paired with backward ``b``: by ``f``'s micro-batch parity, never the
        stream ``b``'s forward ran on."""
        s = self.side[f.microbatch % 2]
        return self.side[1 - f.microbatch % 2] if s is self.fwd.get((b.stage, b.microbatch)) else s

    @staticmethod
    def hand(t, stream) -> None:
        """``t`` (a tensor or None) is used on ``stream`` (allocated on another): ``t.record_stream(stream)``."""
        if t is not None:
            t.record_stream(stream)

    def forward(self, ex, f, inp, stream):
        """Forward leaf ``f`` on ``stream`` (called on the side thread); returns ``(output, done event)``."""
        with self.cuda.stream(stream):
            out = ex._forward(f, inp, record=False)
            done = self.cuda.Event()
            done.record(stream)
        return out, done


def _threads(ex, f, b, inp, grad):
    ps = ex.pair_streams
    if ps is None:  # CPU: the forward on the side thread, the backward on this one
        fut = ex._side.submit(ex._forward, f, inp, False)
        try:
            gx = ex._backward(b, grad, record=False)
        finally:
            out = fut.result()  # re-raises a forward failure
        return out, gx
    main = ps.cuda.current_stream(ps.device)
    side = ps.pick(f, b)
    b_stream = ps.backward_stream(b, grad)  # autograd runs b there (None: the main stream); grad handed to it
    side.wait_stream(main)  # the forward's input (received or produced on the main stream) is ready
    ps.hand(inp, side)
    if getattr(ex, "_targets", None) and f.stage == ex.S - 1:
        ps.hand(ex._targets.get(f.microbatch), side)  # the loss reads the targets on the side stream
    fut = ex._side.submit(ps.forward, ex, f, inp, side)
    try:
        gx = ex._backward(b, grad, record=False)
    finally:
        out, done = fut.result()  # re-raises a forward failure
    main.wait_event(done)  # order the main stream after the forward; the host does not wait
    ps.fwd[(f.stage, f.microbatch)] = side
    ps.hand(out, main)  # sent or kept by the main stream
    if b_stream is not None:
        ps.hand(gx, main)  # the input gradient was allocated on the backward's stream
    return out, gx


def _scheduled(ex, f, b, inp, grad):
    pf = ex._program(f, inp)
    _, pb = ex._saved.pop((b.stage, b.microbatch))
    if b.type is ActionType.I:
        ex.defer_weight_grads(b)
    pb.begin_backward(grad)
    for side, key in interleave(pf.fwd_keys, pf.order, pb.bwd_keys, pb.order, ex.pair_template):
        if side == "f":
            pf.forward(key)
        else:
            pb.backward(key)
    ex._saved[(f.stage, f.microbatch)] = (inp, pf)
    return pf.output, pb.input_grad


register_pair_handler("serial", _serial, doc="whole backward, then whole forward")
register_pair_handler("threads", _threads, doc="forward on a side thread beside the backward")
register_pair_handler("scheduled", _scheduled, node_level=True,
                      doc="node level, in an issue order from the overlap scheduler (or a named one)")
