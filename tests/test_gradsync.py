"""The runner's gradient collective: reduce-scatter with a replica-ordered sum, then an all-gather of the shards.
Checked against the sum of whole gradients in replica order worked out in the test (bitwise), on 3 gloo ranks
with a length that 3 does not divide, and its traffic against gathering whole gradients."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")


def _inputs(n: int, size: int) -> list:
    g = torch.Generator().manual_seed(7)
    return [torch.randn(n, generator=g) * (10.0 ** q) for q in range(size)]  # magnitudes differ: order matters


class _SentCounter:
    """Counts the elements this rank sends to its peers through the collectives ``module`` calls on ``dist``: an
    ``all_to_all_single`` keeps one of ``size`` equal shards, an ``all_gather`` sends its tensor to ``size - 1``
    peers."""

    def __init__(self, module, size: int):
        self.module, self.size, self.elements = module, size, 0
        self.real = module.dist
        real = self.real

        class Counting:
            def __getattr__(_, name):
                return getattr(real, name)

            def all_to_all_single(_, recv, send, **kw):
                self.elements += send.numel() * (size - 1) // size
                return real.all_to_all_single(recv, send, **kw)

            def all_gather(_, outs, t, **kw):
                self.elements += t.numel() * (size - 1)
                return real.all_gather(outs, t, **kw)

        module.dist = Counting()

    def stop(self) -> None:
        self.module.dist = self.real


def _worker(rank: int, port: int, q) -> None:
    import torch.distributed as dist

    from tessera_lab.runner.runtime.gradsync import OrderedReduceScatter, ordered_all_reduce

    import tessera_lab.runner.runtime.gradsync as gs

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    xs = _inputs(10, 3)
    sent = _SentCounter(gs, 3)
    out = ordered_all_reduce(xs[rank].clone(), None, 3)
    sent.stop()
    rs = OrderedReduceScatter(xs[rank].clone(), None, 3, async_op=True)
    out2 = rs.result()
    q.put((rank, out.tolist(), out2.tolist(), rs.nbytes, sent.elements))
    dist.destroy_process_group()


def test_ordered_reduce_scatter_is_the_replica_ordered_sum():
    from _procs import run_ranks

    got = dict((r, (a, b, nb, sent)) for r, a, b, nb, sent in run_ranks(_worker, 3))
    xs = _inputs(10, 3)
    expected = ((xs[0] + xs[1]) + xs[2]).tolist()  # the reference's order: replica 0, then 1, then 2
    for r in range(3):
        assert got[r][0] == expected and got[r][1] == expected
        assert got[r][2] == 2 * 12 * 4  # 10 elements padded to 12: send + receive buffers
        # traffic per rank, counted on the collectives it called: the all-to-all sends 2 of its 3 shards of 4, the
        # all-gather its shard to 2 peers: 4 x 4 = 16 elements, below the 2 x 10 = 20 of gathering whole gradients
        # (P - 1 = 2 copies of 10), a gap that grows with P
        assert got[r][3] == 16 < 2 * 10
