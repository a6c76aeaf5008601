"""Handlers of overlapped ``OVERLAP_F_B`` pairs, kept in a registry (as ``torch.distributed.pipelining``'s
``register_custom_function`` does for custom actions).

A handler is called as ``handler(executor, f, b, inp, grad) -> (forward output, backward input gradient)``
with the forward leaf action ``f`` (its input ``inp`` already received) and the backward leaf ``b`` (B or I,
its output gradient ``grad``, None on the last stage). Built in:

* ``serial``: the whole backward, then the whole forward (monolithic autograd passes);
* ``threads``: the whole forward on a side thread (a side CUDA stream on GPUs) beside the whole backward on
  the calling thread (the first handler; on CPU it measures thread parallelism as much as hidden
  communication);
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

__all__ = ["PairHandler", "PAIR_HANDLERS", "register_pair_handler", "get_pair_handler", "interleave"]


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


def _threads(ex, f, b, inp, grad):
    if ex._side_stream is not None:
        import torch

        ex._side_stream.wait_stream(torch.cuda.current_stream(ex.topo.device))
    fut = ex._side.submit(ex._forward_side, f, inp)
    try:
        gx = ex._backward(b, grad, record=False)
    finally:
        out = fut.result()  # re-raises a forward failure
    if ex._side_stream is not None:  # the forward's kernels ran on the side stream: order, do not sync the host
        import torch

        torch.cuda.current_stream(ex.topo.device).wait_event(ex._side_done)
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
