"""Point-to-point transports of the pipeline runtime: one *batch* (a run of SEND/RECV actions of a lowered
schedule, :func:`tessera_lab.pipeline.p2p.lowered_steps`) is posted with :meth:`P2PTransport.post`.

* :class:`BatchP2P` (NCCL, and gloo when asked): one ``dist.batch_isend_irecv`` per batch, as
  ``torch.distributed.pipelining``'s ``_batch_p2p``. Tags come from a per-(peer, direction) sequence counter only,
  so gloo too matches a rank pair's transfers in posting order (NCCL ignores tags and always does).
* :class:`NcclOrderP2P` (gloo, the CPU default): NCCL's semantics on CPU. The batches of a rank run one after
  another on a communication thread, in posting order (NCCL's stream); every transfer is matched by its per-pair
  sequence number only, and carries a small header with its ``(kind, stage, micro-batch)`` key, so a send met by
  a receive of other data raises :class:`P2POrderError` at once; a batch that does not complete within
  ``timeout_s`` raises :class:`P2POrderError` naming it (a deadlock under NCCL's rule, which gloo's tag matching
  would have hidden).

Handles returned by ``post`` have ``wait()`` and ``is_completed()`` (the runtime waits on receives only; sends are
waited for by :meth:`P2PTransport.finish` at the end of a step).
"""

from __future__ import annotations

import datetime
import queue
import threading
import time

import torch
import torch.distributed as dist

from tessera_lab.errors import ConfigError

__all__ = ["P2POrderError", "P2PTransport", "BatchP2P", "NcclOrderP2P", "make_transport", "P2P_MODES"]

#: ``auto``: :class:`NcclOrderP2P` on gloo, :class:`BatchP2P` on NCCL; ``nccl-order``; ``batch``
P2P_MODES = ("auto", "nccl-order", "batch")
_KIND = {"F": 0, "G": 1}


class P2POrderError(RuntimeError):
    """A transfer order NCCL would deadlock on or mismatch (raised by :class:`NcclOrderP2P`)."""


class P2PTransport:
    """Base: per-pair sequence counters. ``ops``: ``[(op, key, tensor, peer)]`` with ``op`` ``"send"`` or
    ``"recv"``, ``key = ('F'|'G', stage, micro-batch)``, ``peer`` a global rank; returns one handle per op."""

    name = "base"

    def __init__(self, group=None):
        self.group = group  # a process group (peers are global ranks); None: the default group
        self._seq: dict[tuple[str, int], int] = {}
        self._sends: list = []

    def _next(self, op: str, peer: int) -> int:
        k = (op, peer)
        n = self._seq.get(k, 0)
        self._seq[k] = n + 1
        return n

    def post(self, ops: list[tuple]) -> list:  # pragma: no cover - abstract
        raise NotImplementedError

    def finish(self) -> None:
        """Wait for every send posted so far."""
        for w in self._sends:
            w.wait()
        self._sends = []

    def close(self) -> None:
        pass


class BatchP2P(P2PTransport):
    """One ``dist.batch_isend_irecv`` per batch; tag = the op's per-pair sequence number (module docstring)."""

    name = "batch"

    def post(self, ops: list[tuple]) -> list:
        if not ops:
            return []
        p2p = []
        for op, _key, t, peer in ops:
            fn = dist.isend if op == "send" else dist.irecv
            p2p.append(dist.P2POp(fn, t, peer, self.group, self._next(op, peer)))
        works = dist.batch_isend_irecv(p2p)
        self._sends.extend(w for (op, *_), w in zip(ops, works) if op == "send")
        return works


class _Batch:
    def __init__(self, ops: list[tuple], label: str):
        self.ops = ops
        self.label = label
        self.done = threading.Event()
        self.error: BaseException | None = None


class _Handle:
    def __init__(self, batch: _Batch, timeout_s: float):
        self.batch = batch
        self.timeout_s = timeout_s

    def is_completed(self) -> bool:
        if self.batch.error is not None:
            raise self.batch.error
        return self.batch.done.is_set()

    def wait(self) -> bool:
        if not self.batch.done.wait(self.timeout_s + 5.0):
            raise P2POrderError(f"p2p batch [{self.batch.label}] did not complete within {self.timeout_s:.0f} s: "
                                "a deadlock under NCCL's rule (batches run in posting order, a rank pair's "
                                "transfers match in posting order, tags ignored)")
        if self.batch.error is not None:
            raise self.batch.error
        return True


class NcclOrderP2P(P2PTransport):
    """NCCL's p2p semantics over gloo (module docstring). ``rank``: this global rank (for messages);
    ``timeout_s``: seconds a batch may take before it is declared deadlocked."""

    name = "nccl-order"

    def __init__(self, rank: int, timeout_s: float = 60.0, group=None):
        super().__init__(group)
        self.rank = rank
        self.timeout_s = float(timeout_s)
        self._q: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="tessera-p2p", daemon=True)
        self._thread.start()

    def post(self, ops: list[tuple]) -> list:
        if self._error is not None:
            raise self._error
        if not ops:
            return []
        seq_ops = [(op, key, t, peer, self._next(op, peer)) for op, key, t, peer in ops]
        label = " ".join(f"{op} {key[0]}{key[1]},{key[2]} {'to' if op == 'send' else 'from'} {peer}"
                         for op, key, _, peer, _ in seq_ops)
        b = _Batch(seq_ops, f"rank {self.rank}: {label}")
        self._q.put(b)
        h = _Handle(b, self.timeout_s)
        self._sends.extend(h for op, *_ in ops if op == "send")
        return [h] * len(ops)

    def _loop(self) -> None:
        while True:
            b = self._q.get()
            if b is None:
                return
            if self._error is not None:
                b.error = self._error
                b.done.set()
                continue
            try:
                self._run(b)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                self._error = b.error = exc if isinstance(exc, P2POrderError) else P2POrderError(str(exc))
            b.done.set()

    def _run(self, b: _Batch) -> None:
        works, checks = [], []
        for op, key, t, peer, seq in b.ops:
            if op == "send":
                head = torch.tensor([_KIND[key[0]], key[1], key[2]], dtype=torch.int64)
                works.append(dist.isend(head, peer, self.group, 2 * seq))
                works.append(dist.isend(t, peer, self.group, 2 * seq + 1))
            else:
                head = torch.empty(3, dtype=torch.int64)
                works.append(dist.irecv(head, peer, self.group, 2 * seq))
                works.append(dist.irecv(t, peer, self.group, 2 * seq + 1))
                checks.append((head, key, peer, seq))
        deadline = time.monotonic() + self.timeout_s
        for w in works:  # gloo completes a work only in wait(), which takes a timeout
            left = max(0.001, deadline - time.monotonic())
            try:
                w.wait(datetime.timedelta(seconds=left))
            except RuntimeError as exc:
                if time.monotonic() < deadline - 0.5:
                    raise P2POrderError(f"p2p batch [{b.label}] failed: {exc}") from None
                raise P2POrderError(
                    f"p2p batch [{b.label}] did not complete within {self.timeout_s:.0f} s: a deadlock under "
                    "NCCL's rule (batches run in posting order, a rank pair's transfers match in posting "
                    "order, tags ignored)") from None
        for head, key, peer, seq in checks:
            got = ("F" if int(head[0]) == 0 else "G", int(head[1]), int(head[2]))
            if got != tuple(key):
                raise P2POrderError(
                    f"rank {self.rank}: receive #{seq} from rank {peer} expected {key[0]}{key[1:]} but NCCL would "
                    f"match it with the send of {got[0]}{got[1:]} (posting order per rank pair, tags ignored)")

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=1.0)


def make_transport(mode: str, backend: str, rank: int, timeout_s: float) -> P2PTransport:
    """The transport for ``mode`` (:data:`P2P_MODES`) on ``backend`` (``"gloo"``/``"nccl"``).

    Raises:
        ConfigError: unknown mode, or ``nccl-order`` on NCCL (NCCL already has these semantics).
    """
    if mode not in P2P_MODES:
        raise ConfigError(f"run field 'p2p' = {mode!r} is unknown; allowed: {', '.join(P2P_MODES)}")
    if mode == "nccl-order" and backend != "gloo":
        raise ConfigError("run field 'p2p' = 'nccl-order' is the CPU emulation of NCCL; allowed on gloo only")
    if mode == "batch" or (mode == "auto" and backend != "gloo"):
        return BatchP2P()
    return NcclOrderP2P(rank, timeout_s)
