"""The runner's process groups: every concept its own communicator where NCCL's issue-order matching needs it.

NCCL matches the collectives of one communicator in the order each rank issues them (tags and names play no part);
``run --dynamic`` launches a gradient chunk on the replica group in whichever wait finds it ready, which can differ
between ranks, so a replica group that shared the EP forward communicator could pair one rank's gradient reduction
with another rank's forward all-to-all. gloo would not show it, so this checks the groups themselves."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")


def _rank(rank: int, port: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    from tessera_lab.runner import WorldSpec
    from tessera_lab.runner.runtime.topology import build_topology

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        topo = build_topology(WorldSpec(pp=1, ep=2, dp=1), rank, torch.device("cpu"))
        q.put((rank, topo.replica_group is not None, topo.replica_group is topo.ep_fwd,
               topo.replica_group is topo.ep_bwd, dist.get_process_group_ranks(topo.replica_group)))
    finally:
        dist.destroy_process_group()


def test_replica_group_is_its_own_communicator_when_dp_is_1():
    from tessera_lab.runner.launch.spawn import _free_port

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert [g[1:] for g in got] == [(True, False, False, [0, 1])] * 2
