"""Measure an op table (:mod:`tessera_lab.cost.optable`: format, schema, loader): GEMM and grouped GEMM over sizes,
the runner's attention and Gated DeltaNet kernels, and an all-to-all and a p2p transfer over sizes between two
processes (NCCL on GPUs, gloo on CPU). float32, as the runner computes.

    python -m tessera_lab.runner.measure.optable --backend cuda|cpu [--sizes gpu|tiny] [--ranks 2] --out TABLE.json

Clock: CUDA events around the op on a GPU (one synchronize after each sample), ``time.perf_counter`` on CPU.
Each row: ``warmup`` untimed runs, then ``repeats`` samples; median and quartiles of the samples. FLOPs (counted,
fp32 multiply-adds as 2): GEMM ``2 m n k``; grouped GEMM ``groups x 2 m n k`` (one GEMM per expert, as the runner's
MoE runs them); causal attention ``2 b h t^2 d`` (QK^T and PV over the lower triangle); the chunked Gated DeltaNet
rule (:func:`~tessera_lab.runner.runtime.layers.chunk_gated_delta_rule`, ``d_k = d_v = d``) ``2 b h t (5 C d + 3
d^2) + b h t C^2`` (its five chunk-by-chunk products, three state products and the unit-triangular solve).
Communication ``bytes`` is the payload per rank: the all-to-all's whole send buffer, the p2p message; a p2p sample
is half a ping-pong (rank 0 sends and receives back); the ranks meet at a barrier (untimed) before each sample.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

__all__ = ["SIZES", "compute_rows", "measure_op_table", "main"]

#: sizes per preset: ``gpu`` for a GPU run, ``tiny`` for the CPU rehearsal (seconds on two cores)
SIZES = {
    "gpu": {"gemm": [1024, 2048, 4096, 8192], "grouped": {"groups": 8, "k": 2048, "n": 1024, "m": [256, 1024, 4096]},
            "attention": {"b": 1, "h": 16, "d": 128, "t": [1024, 4096]},
            "gdn": {"b": 1, "h": 16, "d": 128, "chunk": 64, "t": [1024, 4096]},
            "comm_bytes": [1 << 16, 1 << 20, 1 << 24, 1 << 27], "warmup": 3, "repeats": 10},
    "tiny": {"gemm": [64, 128], "grouped": {"groups": 4, "k": 64, "n": 32, "m": [16, 64]},
             "attention": {"b": 1, "h": 2, "d": 16, "t": [64, 128]},
             "gdn": {"b": 1, "h": 2, "d": 16, "chunk": 8, "t": [64, 128]},
             "comm_bytes": [1 << 12, 1 << 16], "warmup": 1, "repeats": 5},
}


def _timer(device) -> Callable[[Callable[[], None]], float]:
    """Seconds of one call of ``fn`` on ``device``: CUDA events (then a synchronize), else the host clock."""
    import torch

    if device.type == "cuda":
        def timed(fn):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
    else:
        def timed(fn):
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
    return timed


def _row(op: str, shape: dict, flops: float, nbytes: float, samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else [samples[0]] * 3
    med = statistics.median(samples)
    return {"op": op, "shape": shape, "flops": float(flops), "bytes": float(nbytes), "median_s": med,
            "q1_s": min(q[0], med), "q3_s": max(q[2], med), "samples_s": samples}


def _sample(timed, fn, warmup: int, repeats: int, before: Callable[[], None] | None = None) -> list[float]:
    """``repeats`` timed calls of ``fn`` after ``warmup`` untimed ones; ``before`` (untimed) precedes each."""
    out = []
    for i in range(warmup + repeats):
        if before is not None:
            before()
        t = timed(fn)
        if i >= warmup:
            out.append(t)
    return out


def compute_rows(device, sizes: dict) -> list[dict]:
    """The compute rows (module docstring) on ``device`` with a preset of :data:`SIZES`."""
    import torch
    import torch.nn.functional as F

    from ..runtime.layers import chunk_gated_delta_rule

    timed, w, r = _timer(device), sizes["warmup"], sizes["repeats"]
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    rows = []
    for n in sizes["gemm"]:
        a, b = rnd(n, n), rnd(n, n)
        rows.append(_row("gemm", {"m": n, "n": n, "k": n}, 2 * n ** 3, 0, _sample(timed, lambda: a @ b, w, r)))
    g = sizes["grouped"]
    for m in g["m"]:
        xs, ws = [rnd(m, g["k"]) for _ in range(g["groups"])], [rnd(g["k"], g["n"]) for _ in range(g["groups"])]
        rows.append(_row("grouped_gemm", {"groups": g["groups"], "m": m, "n": g["n"], "k": g["k"]},
                         g["groups"] * 2 * m * g["n"] * g["k"], 0,
                         _sample(timed, lambda: [x @ y for x, y in zip(xs, ws)], w, r)))
    at = sizes["attention"]
    for t in at["t"]:
        q, k, v = (rnd(at["b"], at["h"], t, at["d"]) for _ in range(3))
        rows.append(_row("attention", {"b": at["b"], "h": at["h"], "t": t, "d": at["d"]},
                         2 * at["b"] * at["h"] * t * t * at["d"], 0,
                         _sample(timed, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), w, r)))
    gd = sizes["gdn"]
    for t in gd["t"]:
        b, h, d, C = gd["b"], gd["h"], gd["d"], gd["chunk"]
        q, k = (F.normalize(rnd(b, h, t, d), dim=-1) for _ in range(2))
        v, gl, beta = rnd(b, h, t, d), -torch.rand(b, h, t, generator=gen).to(device), \
            torch.rand(b, h, t, generator=gen).to(device)
        rows.append(_row("gated_deltanet", {"b": b, "h": h, "t": t, "d": d, "chunk": C},
                         2 * b * h * t * (5 * C * d + 3 * d * d) + b * h * t * C * C, 0,
                         _sample(timed, lambda: chunk_gated_delta_rule(q, k, v, gl, beta, C), w, r)))
    return rows


def _comm_worker(rank: int, world: int, store: str, sizes: dict, cuda: bool, q) -> None:
    """One process of the communication rows: all-to-all and ping-pong over ``sizes["comm_bytes"]``."""
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank,
                                world_size=world, timeout=_dt.timedelta(seconds=120))
        timed, w, r = _timer(device), sizes["warmup"], sizes["repeats"]
        rows = []
        for nbytes in sizes["comm_bytes"]:
            n = max(world, nbytes // 4 // world * world)
            x, y = torch.ones(n, device=device), torch.empty(n, device=device)

            def a2a():
                dist.all_to_all_single(y, x)

            rows.append(_row("all_to_all", {"ranks": world, "elements": n}, 0, 4 * n,
                             _sample(timed, a2a, w, r, before=dist.barrier)))

            def ping():
                if rank == 0:
                    dist.send(x, 1)
                    dist.recv(y, 1)
                elif rank == 1:
                    dist.recv(y, 0)
                    dist.send(x, 0)

            samples = [s / 2 for s in _sample(timed, ping, w, r, before=dist.barrier)]
            rows.append(_row("p2p", {"ranks": 2, "elements": n}, 0, 4 * n, samples))
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            q.put(("rows", rows))
    except BaseException:  # noqa: BLE001 - sent to the parent
        import traceback

        q.put(("error", traceback.format_exc()))
        raise


def _comm_rows(world: int, sizes: dict, cuda: bool, timeout_s: float) -> list[dict]:
    import torch.multiprocessing as mp

    q = mp.get_context("spawn").Queue()
    with tempfile.TemporaryDirectory(prefix="tessera-optable-") as tmp:
        pc = mp.start_processes(_comm_worker, args=(world, str(Path(tmp) / "store"), sizes, cuda, q), nprocs=world,
                                start_method="spawn", join=False)
        try:
            kind, payload = q.get(timeout=timeout_s)
            pc.join(timeout=30)
        finally:
            for p in pc.processes:
                if p.is_alive():
                    p.kill()
    if kind == "error":
        raise RuntimeError(f"communication rows failed: {payload.strip().splitlines()[-1]}")
    return payload


def measure_op_table(backend: str, preset: str, ranks: int, timeout_s: float = 300.0) -> dict:
    """An op table (:data:`tessera_lab.cost.optable.OP_TABLE`) measured here: compute rows on device 0 (or the
    CPU), communication rows between ``ranks`` processes (none when ``ranks < 2``)."""
    import torch

    from tessera_lab.cost.optable import OP_TABLE_FORMAT, OP_TABLE_VERSION, check_op_table

    cuda = backend == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(1)
    sizes = SIZES[preset]
    rows = compute_rows(device, sizes)
    if ranks >= 2:
        rows += _comm_rows(ranks, sizes, cuda, timeout_s)
    name = torch.cuda.get_device_name(0) if cuda else f"cpu ({os.cpu_count()} cores, 1 thread)"
    table = {"format": OP_TABLE_FORMAT, "version": OP_TABLE_VERSION, "device": name, "backend": backend,
             "clock": "CUDA events" if cuda else "host clock (time.perf_counter)", "dtype": "float32",
             "torch": torch.__version__, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
             "sizes": preset, "ops": rows}
    return check_op_table(table, "measured op table")


def main(argv: list[str] | None = None) -> int:
    """Command line (module docstring); exit 0, or 2 on bad input."""
    from tessera_lab.io import dumps, atomic_write_text

    p = argparse.ArgumentParser(prog="python -m tessera_lab.runner.measure.optable")
    p.add_argument("--backend", choices=["cpu", "cuda"], required=True)
    p.add_argument("--sizes", choices=sorted(SIZES), default=None, help="default: gpu on cuda, tiny on cpu")
    p.add_argument("--ranks", type=int, choices=[0, 1, 2], default=2, help="processes of the communication rows")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    table = measure_op_table(a.backend, a.sizes or ("gpu" if a.backend == "cuda" else "tiny"), a.ranks)
    atomic_write_text(Path(a.out), dumps(table))
    for r in table["ops"]:
        rate = f", {r['flops'] / r['median_s'] / 1e9:.1f} GFLOP/s" if r["flops"] and r["median_s"] else ""
        print(f"{r['op']} {r['shape']}: median {r['median_s'] * 1e3:.3f} ms{rate} (measured)")
    print(f"op table: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
