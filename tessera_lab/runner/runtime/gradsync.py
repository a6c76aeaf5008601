"""The runner's gradient collective, as the simulator models it (:data:`tessera_lab.pipeline.passes.GRAD_RS`): a
reduce-scatter, ordered so that CPU runs are bitwise equal to the single-process reference, followed by an
all-gather of the reduced shards (the runner's optimizer steps whole parameters, so every rank needs the whole
sum: reduce-scatter + all-gather is the ring all-reduce, ``2 (P - 1) / P`` of the gradient bytes sent per rank,
not the ``P - 1`` times of gathering whole gradients).

:class:`OrderedReduceScatter`: the flat gradient (``n`` float32 elements, padded to ``P * ceil(n / P)``) is cut
into ``P`` shards; one ``all_to_all_single`` hands shard ``q`` of every replica to replica ``q`` (that is the
reduce-scatter's traffic), which sums them in replica order ``0, 1, ..., P - 1`` (element for element the same
additions as a sum of whole gradients in replica order: the bitwise-reference rule); ``all_gather`` of the
reduced shards then gives every replica the sum.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["OrderedReduceScatter", "ordered_all_reduce"]


class OrderedReduceScatter:
    """Start the reduce-scatter of ``flat`` (1-D float tensor) over ``group`` of ``size`` ranks (asynchronous with
    ``async_op``); :meth:`result` finishes it and returns the summed ``flat`` (same length)."""

    def __init__(self, flat: torch.Tensor, group, size: int, async_op: bool = False):
        self.n = flat.numel()
        self.size = size
        self.group = group
        self.chunk = -(-self.n // size)
        pad = self.chunk * size - self.n
        self.send = torch.cat([flat, flat.new_zeros(pad)]) if pad else flat.contiguous()
        self.recv = torch.empty_like(self.send)
        self.work = dist.all_to_all_single(self.recv, self.send, group=group, async_op=async_op)

    @property
    def nbytes(self) -> int:
        """Bytes of the send and receive buffers this collective holds."""
        return 2 * self.send.numel() * self.send.element_size()

    def result(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
        parts = self.recv.view(self.size, self.chunk)  # row q: replica q's copy of my shard
        acc = parts[0].clone()
        for q in range(1, self.size):
            acc = acc + parts[q]
        shards = [torch.empty_like(acc) for _ in range(self.size)]
        dist.all_gather(shards, acc, group=self.group)
        return torch.cat(shards)[:self.n]


def ordered_all_reduce(flat: torch.Tensor, group, size: int) -> torch.Tensor:
    """The replica-ordered sum of ``flat`` over ``group`` (:class:`OrderedReduceScatter`, then the all-gather)."""
    return OrderedReduceScatter(flat, group, size).result()
