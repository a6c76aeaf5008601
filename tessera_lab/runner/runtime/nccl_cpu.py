"""ProcessGroupNCCL's point-to-point API as a caller observes it, over gloo on CPU (the runtime's tests and
``run --p2p batch|nccl-order`` on gloo run through it; docs/gpu.md lists each behaviour and its test).

:class:`NcclP2P` offers ``batch_isend_irecv(p2p_op_list)`` and ``barrier(group)`` with what torch 2.13 does on
NCCL (``torch/distributed/distributed_c10d.py``):

* **one Work per batch.** ``batch_isend_irecv`` on a backend with ``supports_coalescing`` (NCCL) posts the ops
  inside ``_coalescing_manager(group, device, async_ops=True)`` and returns ``cm.works``: the single Work of
  ``group._end_coalescing(device)``. Gloo has no coalescing and returns one Work per op; this layer returns a
  one-element list, as NCCL does.
* **waits are idempotent** (ProcessGroupNCCL's ``Work::wait`` is a stream wait on the work's end event, any
  number of times); gloo's p2p Work is not (a second ``wait()`` of a gloo send blocks for ever in torch 2.13).
* **completion lags the host.** ``is_completed()`` is False until every transfer of the batch is done, which
  needs the peers to have posted theirs; nothing completes in ``wait()`` (a communication thread moves the data).
* **tags ignored, a rank pair's transfers matched in posting order**, batches run one after another in posting
  order (NCCL's one stream per communicator): the gloo tag of a transfer is its per-(peer, direction) sequence
  number, never ``P2POp.tag``.
* **the first collective of a group**: "if this API is the first collective call in the group ..., all ranks
  of the group must participate" (``batch_isend_irecv``'s docstring): a batch on a group that has not had a
  collective through :meth:`NcclP2P.barrier` raises :class:`P2POrderError` (stricter than NCCL, which fails only
  when a rank of the group stays out; the runtime always issues the step barrier first).

With the optional per-transfer ``headers`` (the NCCL-order transport's key check), a send met by a receive of other
data, size or dtype raises :class:`P2POrderError` naming both (NCCL: a hang or corrupt data; without headers gloo
aborts the process on a size mismatch); a batch that does not finish within ``timeout_s`` raises it too (a deadlock
under NCCL's rule).
"""

from __future__ import annotations

import datetime
import queue
import threading
import time

import torch
import torch.distributed as dist

__all__ = ["P2POrderError", "CoalescedWork", "NcclP2P"]

_DTYPES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3, torch.int64: 4, torch.int32: 5}


class P2POrderError(RuntimeError):
    """A transfer order NCCL would deadlock on or mismatch, or a batch NCCL would not accept."""


class CoalescedWork:
    """The Work of one coalesced batch: ``wait()`` (idempotent; returns True or raises the batch's error) and
    ``is_completed()`` (True once every transfer of the batch is done). ``label`` names the batch in errors."""

    def __init__(self, label: str, timeout_s: float):
        self.label = label
        self.timeout_s = timeout_s
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        if self._error is not None:
            raise self._error
        return self._done.is_set()

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done.wait(self.timeout_s + 5.0):
            raise P2POrderError(f"p2p batch [{self.label}] did not complete within {self.timeout_s:.0f} s: a deadlock "
                                "under NCCL's rule (batches run in posting order, a rank pair's transfers match in "
                                "posting order, tags ignored)")
        if self._error is not None:
            raise self._error
        return True

    def exception(self):
        return self._error


class _Batch:
    def __init__(self, ops: list[tuple], work: CoalescedWork):
        self.ops = ops  # (op "send"|"recv", tensor, peer, group, seq, header or None)
        self.work = work


class NcclP2P:
    """NCCL's observable p2p API over gloo (module docstring). ``rank``: this global rank (for messages);
    ``timeout_s``: seconds a batch may take before it is declared deadlocked."""

    def __init__(self, rank: int, timeout_s: float = 60.0):
        self.rank = rank
        self.timeout_s = float(timeout_s)
        self._seq: dict[tuple, int] = {}
        self._ready: set = set()  # groups that have had a collective (NCCL communicator of all ranks exists)
        self._q: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self.batches = 0  # batches posted (tests read it)
        self._thread = threading.Thread(target=self._loop, name="tessera-nccl-p2p", daemon=True)
        self._thread.start()

    @staticmethod
    def _gkey(group) -> int:
        return id(group if group is not None else dist.group.WORLD)

    def barrier(self, group=None) -> None:
        """``dist.barrier(group)``: a collective of every rank of ``group`` (after it, batches of a subset are
        allowed)."""
        dist.barrier(group=group)
        self._ready.add(self._gkey(group))

    def batch_isend_irecv(self, p2p_op_list: list, headers: list | None = None) -> list[CoalescedWork]:
        """Post ``p2p_op_list`` (``dist.P2POp`` with ``dist.isend`` / ``dist.irecv``, one group) as one batch;
        returns ``[work]``. ``headers``: optional int tuples, one per op, checked send against receive.

        Raises:
            ValueError: not a list of P2POp, or ops of several groups (as torch's ``_check_p2p_op_list``).
            P2POrderError: the group has had no collective yet; an earlier batch failed.
        """
        if not isinstance(p2p_op_list, list) or not p2p_op_list or not all(
                isinstance(p, dist.P2POp) for p in p2p_op_list):
            raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``torch.distributed.P2POp``.")
        group = p2p_op_list[0].group
        if not all(p.group == group for p in p2p_op_list):
            raise ValueError("All ops need to use the same group.")
        if self._error is not None:
            raise self._error
        if self._gkey(group) not in self._ready:
            raise P2POrderError(f"rank {self.rank}: batch_isend_irecv is the first collective call on its group; "
                                "NCCL requires every rank of the group to take part in it (torch "
                                "distributed_c10d.batch_isend_irecv); issue a collective on the group first")
        ops = []
        for k, p in enumerate(p2p_op_list):
            op = "send" if p.op in (dist.isend, dist.send) else "recv"
            key = (op, p.peer, self._gkey(group))
            seq = self._seq.get(key, 0)
            self._seq[key] = seq + 1
            ops.append((op, p.tensor, p.peer, group, seq, None if headers is None else tuple(headers[k])))
        label = f"rank {self.rank}: " + " ".join(
            f"{op} #{seq} {'to' if op == 'send' else 'from'} {peer}" for op, _, peer, _, seq, _ in ops)
        work = CoalescedWork(label, self.timeout_s)
        self.batches += 1
        self._q.put(_Batch(ops, work))
        return [work]

    def _loop(self) -> None:
        while True:
            b = self._q.get()
            if b is None:
                return
            if self._error is not None:
                b.work._finish(self._error)
                continue
            try:
                self._run(b)
                b.work._finish()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                self._error = exc if isinstance(exc, P2POrderError) else P2POrderError(str(exc))
                b.work._finish(self._error)

    def _run(self, b: _Batch) -> None:
        """Every transfer of the batch is posted, then waited for (nothing waits before all are posted: a wait
        there could deadlock a batch NCCL completes). With ``headers``, each transfer is preceded by
        ``[numel, dtype, *header]``, checked once the batch is done."""
        works, checks = [], []
        for op, t, peer, group, seq, header in b.ops:
            meta = None if header is None else [t.numel(), _DTYPES.get(t.dtype, 99), *header]
            if op == "send":
                if meta is not None:
                    works.append(dist.isend(torch.tensor(meta, dtype=torch.int64), peer, group, 2 * seq))
                works.append(dist.isend(t, peer, group, 2 * seq + 1))
            else:
                if meta is not None:
                    got = torch.empty(len(meta), dtype=torch.int64)
                    works.append(dist.irecv(got, peer, group, 2 * seq))
                    checks.append((got, meta, peer, seq))
                works.append(dist.irecv(t, peer, group, 2 * seq + 1))
        self._wait_all(b, works, time.monotonic() + self.timeout_s)
        for got, meta, peer, seq in checks:
            if got.tolist() != meta:
                raise P2POrderError(
                    f"rank {self.rank}: receive #{seq} from rank {peer} expected {meta} ([numel, dtype, key...]) "
                    f"but NCCL would match it with the send of {got.tolist()} (posting order per rank pair, tags "
                    "ignored)")

    def _wait_all(self, b: _Batch, works: list, deadline: float) -> None:
        for w in works:  # gloo completes a work in wait() (once), which takes a timeout
            left = max(0.001, deadline - time.monotonic())
            try:
                w.wait(datetime.timedelta(seconds=left))
            except RuntimeError as exc:
                if time.monotonic() < deadline - 0.5:
                    raise P2POrderError(f"p2p batch [{b.work.label}] failed: {exc}") from None
                raise P2POrderError(
                    f"p2p batch [{b.work.label}] did not complete within {self.timeout_s:.0f} s: a deadlock under "
                    "NCCL's rule (batches run in posting order, a rank pair's transfers match in posting "
                    "order, tags ignored)") from None

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=1.0)
