"""Capacity-bounded EP dispatch (:class:`tessera_lab.runner.runtime.moe.CapacityDispatch`, ``ep_dispatch="capacity"``):
the device-built indices against a hand example, the capacities against their formula, and a 2 x 2 (pp x ep) gloo
run on the NCCL-order transport in which every host read (``tolist``, ``item``, ``cpu``, ``int()``, ``float()``,
``bool()``, ``nonzero``, ``bincount``, ``torch.cuda.synchronize``) raises inside the model's forward and backward,
with losses and gradients bitwise equal to the single-process reference for 1F1B, overlapped pairs (threads,
scheduled), ZB-H1 (W deferred) and DualPipeV (two stages per rank)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import pytest

torch = pytest.importorskip("torch")

from tessera_lab.runner.runtime.moe import (CapacityDispatch, capacity_sizes, group_exchange_capacity,  # noqa: E402
                                            recv_index, route, send_index)
from tessera_lab.runner.runtime.specs import TinyConfig  # noqa: E402


# -------------------------------------------------------------------------------------- hand example
def test_capacity_sizes_formula():
    # n = 8 tokens, k = 2, E = 4, P = 2 (El = 2): no factor -> Ce = n = 8, Cd = min(8 * min(2, 2), 2 * 8) = 16
    assert capacity_sizes(8, 2, 4, 2, None) == (8, 16)
    # cf 1.0: Ce = ceil(1.0 * 8 * 2 / 4) = 4, Cd = min(16, 2 * 4) = 8
    assert capacity_sizes(8, 2, 4, 2, 1.0) == (4, 8)
    # k = 1: a token reaches one expert of a rank -> Cd = min(8 * 1, 2 * 8) = 8
    assert capacity_sizes(8, 1, 4, 2, None) == (8, 8)
    # cf so large that Ce caps at n
    assert capacity_sizes(8, 2, 4, 2, 100.0) == (8, 16)


def test_dispatch_indices_hand_example():
    """P = 2 ranks, El = 2 experts each (E = 4), cd = ce = 3. Rank 0 sends rows a0..a3 to experts [0, 0, 1, 3]
    (counts [2, 1, 0, 1]); rank 1 sends b0..b2 to experts [0, 2, 2] (counts [1, 0, 2, 0]). Worked out by hand:
    send buffers  rank 0: [a0 a1 a2 | a3 0 0]   rank 1: [b0 0 0 | b1 b2 0]
    received      rank 0: [a0 a1 a2 | b0 0 0]   rank 1: [a3 0 0 | b1 b2 0]
    expert blocks (P * ce = 6 rows, peer-major, then zeros)
                  e0: [a0 a1 b0 0 0 0]  e1: [a2 0 0 0 0 0]  e2: [b1 b2 0 0 0 0]  e3: [a3 0 0 0 0 0]."""
    P, El, cd, ce = 2, 2, 3, 3
    a = torch.tensor([[1.0], [2.0], [3.0], [4.0]])  # a0..a3
    b = torch.tensor([[10.0], [20.0], [30.0]])  # b0..b2
    ca, cb = torch.tensor([2, 1, 0, 1]), torch.tensor([1, 0, 2, 0])
    caps = [CapacityDispatch(P, El, ce, cd) for _ in range(P)]
    sa, sb = caps[0].send(a, ca), caps[1].send(b, cb)
    assert sa.flatten().tolist() == [1, 2, 3, 4, 0, 0] and sb.flatten().tolist() == [10, 0, 0, 20, 30, 0]
    # the all-to-all: rank r receives block r of every peer, peer-major; the counts likewise
    recv = [torch.cat([sa[r * cd:(r + 1) * cd], sb[r * cd:(r + 1) * cd]]) for r in range(P)]
    rc = [torch.cat([ca[r * El:(r + 1) * El], cb[r * El:(r + 1) * El]]) for r in range(P)]
    xs = [caps[r].expert_inputs(recv[r], rc[r]) for r in range(P)]
    got = [x.flatten().tolist() for r in range(P) for x in xs[r]]
    assert got == [[1, 2, 10, 0, 0, 0], [3, 0, 0, 0, 0, 0], [20, 30, 0, 0, 0, 0], [4, 0, 0, 0, 0, 0]]
    # experts multiply by 100 + global id; outputs travel back and land on their rows of x_perm
    ys = [[x * (100 + r * El + e) for e, x in enumerate(xs[r])] for r in range(P)]
    back = [caps[r].expert_outputs(ys[r]) for r in range(P)]
    ret = [torch.cat([back[q][r * cd:(r + 1) * cd] for q in range(P)]) for r in range(P)]
    ya, yb = caps[0].receive(ret[0]), caps[1].receive(ret[1])
    assert ya.flatten().tolist() == [100, 200, 303, 412]  # a0, a1 by expert 0, a2 by 1, a3 by 3
    assert yb.flatten().tolist() == [1000, 2040, 3060]  # b0 by expert 0, b1, b2 by 2


@pytest.mark.parametrize("P,cf,seed", [(2, None, 0), (2, 1.0, 1), (4, None, 2), (4, 0.5, 3)])
def test_dispatch_equals_the_host_emulation(P, cf, seed):
    """Random skewed routing of n = 12 tokens per rank to E = 8 experts (top 3): every expert block equals the
    host-count emulation :func:`group_exchange_capacity` (built with lists on the host), and the round trip
    returns each rank's rows."""
    n, E, k, H = 12, 8, 3, 5
    El = E // P
    gen = torch.Generator().manual_seed(seed)
    bias = torch.linspace(2.0, -2.0, E)  # skew: low experts preferred
    plans = [route(torch.randn(n, E, generator=gen) + bias, k, cf, fixed=True) for _ in range(P)]
    x = [torch.randn(n, H, generator=gen) for _ in range(P)]
    xps = [xi.index_select(0, p.order // k) for xi, p in zip(x, plans)]
    ce, cd = capacity_sizes(n, k, E, P, cf)
    caps = [CapacityDispatch(P, El, ce, cd) for _ in range(P)]
    sends = [c.send(xp, p.send_counts) for c, xp, p in zip(caps, xps, plans)]
    recv = [torch.cat([sends[q][r * cd:(r + 1) * cd] for q in range(P)]) for r in range(P)]
    rc = [torch.cat([plans[q].send_counts[r * El:(r + 1) * El] for q in range(P)]) for r in range(P)]
    blocks = [blk for r in range(P) for blk in caps[r].expert_inputs(recv[r], rc[r])]
    want, split = group_exchange_capacity(xps, [p.send_counts for p in plans], E, ce)
    assert all(torch.equal(g, w) for g, w in zip(blocks, want))
    ys = [blk * (e + 1) for e, blk in enumerate(blocks)]
    back = [caps[r].expert_outputs(ys[r * El:(r + 1) * El]) for r in range(P)]
    ret = [torch.cat([back[q][r * cd:(r + 1) * cd] for q in range(P)]) for r in range(P)]
    got = [caps[r].receive(ret[r]) for r in range(P)]
    assert all(torch.equal(g, w) for g, w in zip(got, split(ys)))


def test_route_fixed_keeps_the_uneven_order():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(10, 6, generator=gen)
    for cf in (None, 0.5):
        a, b = route(logits, 2, cf), route(logits, 2, cf, fixed=True)
        A = int(a.send_counts.sum())
        assert torch.equal(a.order, b.order[:A]) and b.order.numel() == 20
        assert sorted(b.order.tolist()) == list(range(20))  # a permutation: dropped assignments last
        assert torch.equal(a.dropped_counts, b.dropped_counts)


def test_bad_dispatch_mode_and_factor_one_line():
    from tessera_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="ep_dispatch.*allowed: auto, uneven, capacity"):
        TinyConfig(ep_dispatch="fast")
    for cf in (float("inf"), float("nan"), -1.0, 0.0):
        with pytest.raises(ConfigError, match="capacity_factor"):
            TinyConfig(capacity_factor=cf)


# ---------------------------------------------------------------------------- no host sync, 2 x 2 run
class HostSync(RuntimeError):
    pass


_FORBIDDEN = [(torch.Tensor, n) for n in ("tolist", "item", "cpu", "numpy", "nonzero", "bincount", "__int__",
                                          "__float__", "__bool__")]
_FORBIDDEN += [(torch, "nonzero"), (torch, "bincount"), (torch.cuda, "synchronize")]
_inside = threading.local()


def _install_guard() -> None:
    """Each forbidden call raises :class:`HostSync` on a thread that is inside a guarded region."""
    for owner, name in _FORBIDDEN:
        orig = getattr(owner, name)

        def patched(*a, __orig=orig, __name=name, **kw):
            if getattr(_inside, "depth", 0) and not getattr(_inside, "off", False):
                raise HostSync(f"host read {__name} on the dispatch path")
            return __orig(*a, **kw)

        setattr(owner, name, patched)


def _guarded(fn):
    @functools.wraps(fn)
    def wrapper(*a, **kw):
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            return fn(*a, **kw)
        finally:
            _inside.depth -= 1
    return wrapper


def _rank(rank, port, q):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="4")
        import torch.distributed as dist

        from tessera_lab.runner import RunSpec, WorldSpec
        from tessera_lab.runner.launch.results import compare_reference, summarize_job
        from tessera_lab.runner.runtime import layers, nodes
        from tessera_lab.runner.runtime.moe import ExpertParallelComm
        from tessera_lab.runner.runtime.topology import build_topology
        from tessera_lab.runner.runtime.train import run_jobs

        torch.set_num_threads(1)
        world = WorldSpec(pp=2, ep=2, p2p="nccl-order", timeout_s=120)
        common = dict(steps=2, microbatches=4, check_reference=True, save_grads=True,
                      model={"num_layers": 4, "ep_dispatch": "capacity", "router_bias": [1.5, 0.5, 0.0, -1.0]})
        jobs = [RunSpec(name="1f1b", schedule="1f1b", **common),
                RunSpec(name="overlapped-threads", schedule="overlapped", pair_exec="threads", **common),
                RunSpec(name="overlapped-scheduled", schedule="overlapped", pair_exec="scheduled", **common),
                RunSpec(name="zb-h1", schedule="zb-h1", **common),  # W deferred: padded GEMMs' dW later
                RunSpec(name="dualpipev", schedule="dualpipev", **common)]  # two stages per rank
        dist.init_process_group("gloo", rank=rank, world_size=4)
        topo = build_topology(world, rank, torch.device("cpu"))
        # the model's forward and backward, monolithic and node by node, run guarded
        layers.MoEBlock.forward = _guarded(layers.MoEBlock.forward)
        nodes.StageProgram.forward = _guarded(nodes.StageProgram.forward)
        nodes.StageProgram.backward = _guarded(nodes.StageProgram.backward)
        torch.autograd.backward = _guarded(torch.autograd.backward)
        _install_guard()
        out_dir = os.environ["TESSERA_TEST_OUT"]
        raws = run_jobs(world, topo, jobs, out_dir)
        refs = {}
        if rank == 0:
            for j, raw in zip(jobs, raws):
                with _unguarded():
                    refs[j.name] = compare_reference(summarize_job(raw, j, world), j, world, out_dir)
        # not vacuous: the uneven dispatch reads its counts on the host, and the guard catches it
        cfg = TinyConfig(ep_dispatch="uneven")
        moe = layers.MoEBlock(cfg, 0)
        comm = ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, topo.ep, topo.ep_rank, cfg.num_experts)
        moe.keep_experts(comm.local_experts)
        try:
            moe(torch.randn(8, cfg.hidden_size), comm)
            caught = None
        except HostSync as e:
            caught = str(e)
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, refs, caught))
    except BaseException as e:  # noqa: BLE001 - reported to the test process
        import traceback

        q.put((rank, "error", "".join(traceback.format_exception(e))[-3000:]))


@contextlib.contextmanager
def _unguarded():
    """The single-process reference (host counts by design) runs with the guard off."""
    _inside.off = True
    try:
        yield
    finally:
        _inside.off = False


@pytest.mark.multiprocess
def test_capacity_dispatch_no_host_sync_and_bitwise(tmp_path, monkeypatch):
    from _procs import run_ranks

    monkeypatch.setenv("TESSERA_TEST_OUT", str(tmp_path))
    got = sorted(run_ranks(_rank, 4, timeout_s=600), key=lambda r: r[0])
    errors = [r for r in got if r[1] == "error"]
    assert not errors, errors[0][2]
    refs = got[0][1]
    assert set(refs) == {"1f1b", "overlapped-threads", "overlapped-scheduled", "zb-h1", "dualpipev"}
    for name, ref in refs.items():
        assert ref["bitwise_equal"] and ref["max_abs_diff"] == 0.0, (name, ref)
        assert ref["grads_bitwise_equal"] is True and ref["grads_compared"] > 0, (name, ref)
    assert all(r[2] is not None and "tolist" in r[2] for r in got), [r[2] for r in got]


@pytest.mark.multiprocess
def test_capacity_dispatch_with_dynamic_gaps_bitwise(tmp_path):
    """``run --dynamic`` with EP sends the gap controller's numbers with the first dispatch of a step; in capacity
    mode that is a small exchange of its own before the counts (once per step). Static and dynamic placement,
    pp 2 x ep 2 on the NCCL-order transport, stay bitwise equal to the reference."""
    from tessera_lab.runner import RunSpec, WorldSpec, spawn

    common = dict(schedule="1f1b", steps=3, microbatches=4, defer_w=True, check_reference=True,
                  model={"num_layers": 4, "ep_dispatch": "capacity", "capacity_factor": 1.0})
    jobs = [RunSpec(name="static", w_lag=0, gaps="observe", **common),
            RunSpec(name="dynamic", gaps="fill", **common)]
    res = spawn(WorldSpec(pp=2, ep=2, p2p="nccl-order", timeout_s=120), jobs, out_dir=tmp_path, timeout_s=900)
    got = {j["spec"]["name"]: j for j in res.jobs}
    for name in ("static", "dynamic"):
        assert got[name]["reference"]["bitwise_equal"], (name, got[name]["reference"])
    # capacity factor 1.0 on 2 x 16 tokens: Ce = ceil(32 * 2 / 4) = 16 per expert; the drops each rank read once
    # per step equal the single-process reference's, and there are some
    from tessera_lab.runner.runtime.reference import reference_run

    ref = reference_run(TinyConfig(**common["model"]), ep=2, microbatches=4, steps=3)
    routing = got["dynamic"]["routing"]
    assert {int(k) for k in routing} == set(range(4))
    for layer, counts in routing.items():
        assert counts == {k: ref.routing[int(layer)][k] for k in ("routed", "kept", "dropped")}, layer
    assert sum(sum(c["dropped"]) for c in routing.values()) > 0


def test_auto_mode_by_device_and_padding():
    from tessera_lab.runner.runtime.moe import dispatch_mode, padding_factor

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    # the tiny runner model: 32 tokens per group, E 4, top 2: padding E / k = 2 (computed)
    assert padding_factor(32, 2, 4, None) == 2.0
    assert dispatch_mode("auto", cpu, 32, 2, 4) == "uneven" and dispatch_mode("auto", cuda, 32, 2, 4) == "capacity"
    # Qwen3-Next-80B (E 512, top 10), 4096 tokens: 512 / 10 = 51.2x without a factor -> uneven; cf 1.0 ->
    # Ce = ceil(4096 * 10 / 512) = 80, 512 * 80 / 40960 = 1.0 -> capacity
    assert padding_factor(4096, 10, 512, None) == pytest.approx(51.2)
    assert dispatch_mode("auto", cuda, 4096, 10, 512) == "uneven"
    assert padding_factor(4096, 10, 512, 1.0) == 1.0 and dispatch_mode("auto", cuda, 4096, 10, 512, 1.0) == "capacity"
    assert dispatch_mode("capacity", cpu) == "capacity" and dispatch_mode("uneven", cuda) == "uneven"


def test_run_option_ep_dispatch_reaches_the_model():
    """``run --ep-dispatch capacity`` sets the model field; an unknown mode is refused by argparse (exit 2)."""
    import argparse

    import pytest

    from tessera_lab.runner.launch.launch import add_run_arguments, specs_from_args

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    _, job = specs_from_args(p.parse_args(["--pp", "2", "--ep", "2", "--ep-dispatch", "capacity"]))
    assert job.model["ep_dispatch"] == "capacity"
    _, job = specs_from_args(p.parse_args(["--pp", "2", "--ep", "2"]))
    assert "ep_dispatch" not in job.model
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--ep-dispatch", "fixed"])
    assert e.value.code == 2


def test_dispatch_summary_names_mode_reason_and_padding():
    """The run result's ``ep_dispatch`` and the header lines: hand-computed for the tiny model (n 32 = 2 x 16
    tokens, E 4, top 2, EP 2, no factor): Ce = n = 32, Cd = min(32 * min(2, 2), 2 * 32) = 64, sent 2 * 64 = 128,
    routed 32 * 2 = 64, experts 2 * 2 * 32 = 128 rows, padding 4 * 32 / 64 = 2x."""
    from tessera_lab.runner.launch.launch import format_dispatch
    from tessera_lab.runner.runtime.moe import dispatch_summary
    from tessera_lab.runner.runtime.schemas import RUN_RESULT
    from tessera_lab.schema import validate

    d = dispatch_summary("capacity", "cpu", 32, 2, 4, 2, None)
    assert (d["mode"], d["capacity_per_expert"], d["capacity_per_destination"], d["rows_sent"], d["rows_routed"],
            d["expert_rows"], d["padding_factor"]) == ("capacity", 32, 64, 128, 64, 128, 2.0)
    text = "\n".join(format_dispatch(d))
    assert "EP dispatch: capacity (requested" in text and "128 rows sent" in text and "64 rows routed" in text
    a = dispatch_summary("auto", "cpu", 32, 2, 4, 2, None)
    assert a["mode"] == "uneven" and "auto on CPU" in a["reason"] and "rows_sent" not in a
    g = dispatch_summary("auto", "cuda", 32, 2, 4, 2, None)
    assert g["mode"] == "capacity" and "2.00x <= 4x" in g["reason"]
    # Qwen3-Next-80B shape: 51.2x padding -> uneven on CUDA, and the reason says so
    q = dispatch_summary("auto", "cuda", 4096, 10, 512, 16, None)
    assert q["mode"] == "uneven" and "51.20x > 4x" in q["reason"]
    job = {"schedule": "1f1b", "tokens_per_step": 256, "spec": {"model": {}}, "ep_dispatch": d,
           "timing": {"durations": {"f": [0.1], "b": [0.1]}},
           "events": [{"step": 0, "rank": 0, "lane": "compute", "start": 0.0, "end": 1.0}]}
    validate({"jobs": [job]}, RUN_RESULT, "run.json")
    with pytest.raises(Exception, match="ep_dispatch.mode"):
        validate({"jobs": [{**job, "ep_dispatch": {**d, "mode": "fixed"}}]}, RUN_RESULT, "run.json")


def test_run_header_and_json_name_the_dispatch(tmp_path, capsys):
    """A capacity run with factor 1.0 (tiny model: Ce = ceil(32 * 2 / 4) = 16, Cd = min(64, 2 * 16) = 32): the
    header names the mode and the computed rows; the observed kept rows per call are the run's kept assignments
    over its calls (routed / (n k)), at most the 64 routed; the result passes the run-result schema."""
    import json

    from tessera_lab.cli.main import main
    from tessera_lab.runner.runtime.schemas import check_run_result

    out = tmp_path / "run.json"
    assert main(["run", "--pp", "2", "--ep", "2", "--steps", "2", "--ep-dispatch", "capacity",
                 "--capacity-factor", "1.0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tokens/s observed" in text and "EP dispatch: capacity (requested" in text
    assert "64 rows sent (32 per destination) vs 64 rows routed" in text and "padding factor 1.00x" in text
    data = json.loads(out.read_text())
    check_run_result(data, "run.json")
    job = data["jobs"][0]
    routed = sum(sum(t["routed"]) for t in job["routing"].values())
    kept = sum(sum(t["kept"]) for t in job["routing"].values())
    assert routed % 64 == 0 and kept < routed
    assert job["ep_dispatch"]["rows_kept_observed"] == pytest.approx(kept / (routed / 64))
