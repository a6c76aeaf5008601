"""The runtime under NCCL's observable API on CPU.

* The CPU process-group layer (:class:`tessera_lab.runner.runtime.nccl_cpu.NcclP2P`, under both transports on gloo)
  checked against what torch 2.13 does on NCCL: one Work per ``batch_isend_irecv`` batch (the source path is
  pinned below), idempotent waits, completion only once the peer has posted, tags ignored and a pair's transfers
  matched in posting order, no batch before the group's first collective.
* Acceptance: every schedule (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, dualpipev, overlapped with each pair
  handler, the ``--dynamic`` pair) at pp 2 and 4, ep 1 and 2, through ``--p2p nccl-order`` (the gloo default) and
  ``--p2p batch``, gives losses and step-0 gradients bitwise equal to the single-process reference.

Cost on the 2-core machine: one launch per (p2p, pp, ep), 12 jobs each; pp 4 x ep 2 is 8 processes (minutes under
load), so the matrix is marked slow/multiprocess; a small pp 2 x ep 2 case through ``--p2p batch`` (a schedule,
each kind of pair handler, ``--dynamic`` and the capacity dispatch) runs by default.
"""

from __future__ import annotations

import inspect
import os
import time

import pytest

pytest.importorskip("torch")

from tessera_lab.runner import RunSpec, WorldSpec, spawn  # noqa: E402

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev"]


def _jobs(pp: int) -> list[RunSpec]:
    common = dict(steps=2, microbatches=2 * pp, check_reference=True, save_grads=True, model={"num_layers": 2 * pp})
    jobs = [RunSpec(name=n, schedule=n, **common) for n in SCHEDULES]
    jobs += [RunSpec(name=f"overlapped-{h}", schedule="overlapped", pair_exec=h, **common)
             for h in ("serial", "threads", "scheduled")]
    jobs += [RunSpec(name="static", schedule="1f1b", defer_w=True, w_lag=0, gaps="observe", **common),
             RunSpec(name="dynamic", schedule="1f1b", defer_w=True, w_lag=None, gaps="fill", **common)]
    return jobs


def _check_bitwise(res, jobs) -> None:
    assert res.backend == "gloo"
    got = {j["spec"]["name"]: j["reference"] for j in res.jobs}
    assert set(got) == {j.name for j in jobs}
    bad = {n: r for n, r in got.items()
           if not (r.get("bitwise_equal") and r.get("grads_bitwise_equal") and r.get("grads_compared", 0) > 0)}
    assert not bad, bad


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("p2p", ["nccl-order", "batch"])
@pytest.mark.parametrize("pp,ep", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_every_schedule_bitwise_under_nccl_semantics(p2p, pp, ep, tmp_path):
    res = spawn(WorldSpec(pp=pp, ep=ep, p2p=p2p, timeout_s=120), _jobs(pp), out_dir=tmp_path, timeout_s=1800)
    _check_bitwise(res, _jobs(pp))


def test_batch_transport_small_case_bitwise(tmp_path):
    """pp 2 x ep 2 through ``--p2p batch`` (one coalesced Work per batch): a schedule with deferred W, each kind of
    pair handler, ``--dynamic`` filling and the capacity dispatch."""
    common = dict(steps=2, microbatches=4, check_reference=True, save_grads=True, model={"num_layers": 4})
    cap = dict(common, model={"num_layers": 4, "ep_dispatch": "capacity"})
    jobs = [RunSpec(name="zb-h1", schedule="zb-h1", **common),
            RunSpec(name="overlapped-threads", schedule="overlapped", pair_exec="threads", **common),
            RunSpec(name="overlapped-scheduled-capacity", schedule="overlapped", pair_exec="scheduled", **cap),
            RunSpec(name="dynamic", schedule="1f1b", defer_w=True, w_lag=None, gaps="fill", **common)]
    res = spawn(WorldSpec(pp=2, ep=2, p2p="batch", timeout_s=120), jobs, out_dir=tmp_path, timeout_s=900)
    _check_bitwise(res, jobs)


# ----------------------------------------------------------------------------------------------
# the CPU layer against torch's NCCL path
# ----------------------------------------------------------------------------------------------


def test_torch_returns_one_coalesced_work_per_batch_on_nccl():
    """The path the layer emulates, in the installed torch: a backend with coalescing (ProcessGroupNCCL) posts the
    batch in ``_coalescing_manager(..., async_ops=True)`` and returns ``cm.works``, the one Work of
    ``_end_coalescing``; only a backend without coalescing returns one Work per op."""
    import torch.distributed.distributed_c10d as c10d

    src = inspect.getsource(c10d.batch_isend_irecv)
    assert "supports_coalescing" in src and "_coalescing_manager(group, device, async_ops=True)" in src
    assert "return cm.works" in src
    cm = inspect.getsource(c10d._coalescing_manager)
    assert "work = group._end_coalescing(device)" in cm and "cm.append(work)" in cm


def _layer_rank(rank: int, port: int, q) -> None:
    import torch
    import torch.distributed as dist

    from tessera_lab.runner.runtime.nccl_cpu import NcclP2P, P2POrderError

    out: dict = {}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        layer = NcclP2P(rank, timeout_s=5.0)
        peer = 1 - rank
        g = dist.new_group([0, 1])
        try:  # no collective on g yet
            layer.batch_isend_irecv([dist.P2POp(dist.isend, torch.zeros(2), peer, g)])
            out["first"] = "posted"
        except P2POrderError as e:
            out["first"] = str(e)
        layer.barrier(g)
        a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
        x, y = torch.zeros(2), torch.zeros(2)
        if rank == 0:  # tags 7 then 5; the peer receives with tags 5 then 7
            works = layer.batch_isend_irecv([dist.P2POp(dist.isend, a, 1, g, tag=7),
                                             dist.P2POp(dist.isend, b, 1, g, tag=5)])
            out["len"] = len(works)
            time.sleep(0.5)
            out["completed_before_peer"] = works[0].is_completed()  # the peer posts after 1.5 s
            t0 = time.monotonic()
            out["wait"] = [works[0].wait(), works[0].wait()]  # idempotent
            out["waited_s"] = time.monotonic() - t0
            out["completed_after"] = works[0].is_completed()
        else:
            time.sleep(1.5)
            works = layer.batch_isend_irecv([dist.P2POp(dist.irecv, x, 0, g, tag=5),
                                             dist.P2POp(dist.irecv, y, 0, g, tag=7)])
            out["len"] = len(works)
            out["wait"] = [works[0].wait(), works[0].wait()]
            out["x"], out["y"] = x.tolist(), y.tolist()
        # with headers (the NCCL-order transport's key check), a send met by a receive of other data is named
        op = dist.isend if rank == 0 else dist.irecv
        try:
            layer.batch_isend_irecv([dist.P2POp(op, torch.zeros(2), peer, g)], headers=[(0, 1, rank)])[0].wait()
            out["mismatch"] = "completed"
        except P2POrderError as e:
            out["mismatch"] = str(e)
        q.put((rank, out))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        q.put((rank, {"error": f"{type(e).__name__}: {e}"}))
    q.close()
    q.join_thread()
    os._exit(0)


def test_cpu_layer_behaves_as_process_group_nccl():
    from _procs import run_ranks

    res = dict(run_ranks(_layer_rank, 2))
    for r in (0, 1):
        assert "error" not in res[r], res
        assert "first collective call" in res[r]["first"], res  # refused before the group's first collective
        assert res[r]["len"] == 1  # one Work for a batch of two ops
        assert res[r]["wait"] == [True, True]
    assert res[0]["completed_before_peer"] is False  # completion lags: the peer had not posted
    assert res[0]["completed_after"] is True and res[0]["waited_s"] > 0.3  # the wait waited for the peer
    assert res[1]["x"] == [1.0, 2.0] and res[1]["y"] == [3.0, 4.0]  # posting order, tags ignored
    assert "expected [2, 0, 0, 1, 1]" in res[1]["mismatch"] and "[2, 0, 0, 1, 0]" in res[1]["mismatch"], res


@pytest.mark.parametrize("argv,needle", [(["--p2p", "nccl-order", "--backend", "nccl"], "'p2p' = 'nccl-order'"),
                                         (["--p2p", "fast"], "--p2p")])
def test_run_p2p_option_bad_value_is_one_line(argv, needle, tmp_path, capsys):
    from tessera_lab.cli.main import main

    try:
        rc = main(["run", *argv, "--out", str(tmp_path)])
    except SystemExit as e:  # argparse's choices
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and needle in err[-1], err
    assert not list(tmp_path.glob("rank*.log"))  # refused before any worker started


def test_run_p2p_option_reaches_the_world():
    import argparse

    from tessera_lab.runner.launch.launch import add_run_arguments, specs_from_args

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    world, _ = specs_from_args(p.parse_args(["--p2p", "batch", "--backend", "gloo"]))
    assert world.p2p == "batch"
    assert specs_from_args(p.parse_args([]))[0].p2p == "auto"
