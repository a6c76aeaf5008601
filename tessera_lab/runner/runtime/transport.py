"""Point-to-point transports of the pipeline runtime: one *batch* (a run of SEND/RECV actions of a lowered
schedule, :func:`tessera_lab.pipeline.p2p.lowered_steps`) is posted with :meth:`P2PTransport.post`, which returns
ONE handle for the whole batch: ``batch_isend_irecv`` on NCCL returns one coalesced Work per batch (torch 2.13
``distributed_c10d.batch_isend_irecv`` -> ``_coalescing_manager(..., async_ops=True)`` -> ``cm.works``), so a
receive of the batch is complete only when the batch is; the handle waits every Work the call returned, once
(as torch's ``pipelining`` ``_wait_batch_p2p`` waits the returned list).

* :class:`BatchP2P` (``--p2p batch``): ``batch_isend_irecv`` of ``api`` per batch, as ``torch.distributed.pipelining``'s
  ``_batch_p2p``: ``torch.distributed`` on NCCL; on gloo the CPU layer
  :class:`~tessera_lab.runner.runtime.nccl_cpu.NcclP2P` (NCCL's return shape, completion, matching and first-collective
  rule). Tags: a per-(peer, direction) sequence number (NCCL ignores tags and matches in posting order anyway).
* :class:`NcclOrderP2P` (``--p2p nccl-order``, the gloo default): the same over the CPU layer, each transfer with a
  small header carrying its ``(kind, stage, micro-batch)`` key, so a send met by a receive of other data raises
  :class:`P2POrderError` at once, naming both.

Handles have ``wait()`` (idempotent) and ``is_completed()`` (the runtime waits on receives; sends are waited for by
:meth:`P2PTransport.finish` at the end of a step).
"""

from __future__ import annotations

import torch.distributed as dist

from tessera_lab.errors import ConfigError

from .nccl_cpu import NcclP2P, P2POrderError

__all__ = ["P2POrderError", "P2PTransport", "BatchHandle", "BatchP2P", "NcclOrderP2P", "make_transport", "P2P_MODES"]

#: ``auto``: :class:`NcclOrderP2P` on gloo, :class:`BatchP2P` on NCCL; ``nccl-order``; ``batch``
P2P_MODES = ("auto", "nccl-order", "batch")
_KIND = {"F": 0, "G": 1}


class BatchHandle:
    """The handle of one posted batch, shared by all its ops: ``works`` is what ``batch_isend_irecv`` returned
    (one coalesced Work on NCCL, one per op on a backend without coalescing). ``wait()`` waits each Work once
    (gloo's p2p Work must not be waited twice) and is idempotent; ``is_completed()`` is True once every Work is."""

    def __init__(self, works: list):
        self.works = list(works)
        self._done = False

    def wait(self) -> bool:
        if not self._done:
            for w in self.works:
                w.wait()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self.works)


class P2PTransport:
    """Base. ``api``: an object with ``batch_isend_irecv`` and ``barrier`` (``torch.distributed`` or
    :class:`~tessera_lab.runner.runtime.nccl_cpu.NcclP2P`); ``group``: the process group of the transfers (peers are
    global ranks; None: the default group)."""

    name = "base"
    headers = False

    def __init__(self, api, group=None):
        self.api = api
        self.group = group
        self._seq: dict[tuple[str, int], int] = {}
        self._sends: list[BatchHandle] = []

    def _next(self, op: str, peer: int) -> int:
        k = (op, peer)
        n = self._seq.get(k, 0)
        self._seq[k] = n + 1
        return n

    def barrier(self) -> None:
        """A collective of every rank of the group: NCCL requires one before batches of a subset of its ranks
        (``batch_isend_irecv``'s docstring); the executor issues it once, at construction."""
        self.api.barrier(group=self.group)

    def post(self, ops: list[tuple]) -> BatchHandle | None:
        """Post ``ops`` ``[(op, key, tensor, peer)]`` (``op`` ``"send"``/``"recv"``, ``key = ('F'|'G', stage,
        micro-batch)``, ``peer`` a global rank) as one batch; returns its handle (None for no ops).

        Raises:
            P2POrderError: on the CPU layer, an earlier batch failed or the group has had no collective.
        """
        if not ops:
            return None
        p2p = [dist.P2POp(dist.isend if op == "send" else dist.irecv, t, peer, self.group, self._next(op, peer))
               for op, _key, t, peer in ops]
        if self.headers:
            works = self.api.batch_isend_irecv(p2p, headers=[(_KIND[k[0]], k[1], k[2]) for _, k, _, _ in ops])
        else:
            works = self.api.batch_isend_irecv(p2p)
        h = BatchHandle(works)
        if any(op == "send" for op, *_ in ops):
            self._sends.append(h)
        return h

    def finish(self) -> None:
        """Wait for every batch with a send posted so far."""
        for h in self._sends:
            h.wait()
        self._sends = []

    def close(self) -> None:
        close = getattr(self.api, "close", None)
        if close is not None:
            close()


class BatchP2P(P2PTransport):
    """``batch_isend_irecv`` of ``api`` per batch (module docstring)."""

    name = "batch"


class NcclOrderP2P(P2PTransport):
    """NCCL's p2p semantics over gloo with key headers (module docstring). ``rank``: this global rank (for
    messages); ``timeout_s``: seconds a batch may take before it is declared deadlocked."""

    name = "nccl-order"
    headers = True

    def __init__(self, rank: int, timeout_s: float = 60.0, group=None):
        super().__init__(NcclP2P(rank, timeout_s), group)
        self.rank = rank


def make_transport(mode: str, backend: str, rank: int, timeout_s: float) -> P2PTransport:
    """The transport for ``mode`` (:data:`P2P_MODES`) on ``backend`` (``"gloo"``/``"nccl"``): on NCCL
    ``torch.distributed`` itself; on gloo the CPU layer :class:`~tessera_lab.runner.runtime.nccl_cpu.NcclP2P`.

    Raises:
        ConfigError: unknown mode, or ``nccl-order`` on NCCL (NCCL already has these semantics).
    """
    if mode not in P2P_MODES:
        raise ConfigError(f"run field 'p2p' = {mode!r} is unknown; allowed: {', '.join(P2P_MODES)}")
    if mode == "nccl-order" and backend != "gloo":
        raise ConfigError("run field 'p2p' = 'nccl-order' is the CPU emulation of NCCL; allowed on gloo only")
    if backend != "gloo":
        return BatchP2P(dist)
    if mode == "batch":
        return BatchP2P(NcclP2P(rank, timeout_s))
    return NcclOrderP2P(rank, timeout_s)
