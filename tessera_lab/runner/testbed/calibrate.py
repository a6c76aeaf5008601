"""``tessera-lab calibrate``: measure this machine at the runner's shapes and write ``data/devices/NAME.json``
(the format and how it is used: :mod:`tessera_lab.cost.device`).

Measured (lower quartiles of ``repeats`` timings after one warm-up; one thread, deterministic mode, as the runner runs):

* per layer kind, the forward and the backward (B = I + W) of one runner layer at two model widths (the
  given one and twice it), with the analytic FLOPs of each, and the weight-gradient share ``W / (I + W)``;
* the embedding and the final norm + LM head + loss;
* GEMM throughput (``torch.mm`` at ``(tokens, H) x (H, 4H)``) and memory throughput (a copy of 32 MiB);
* gloo in ``max(group_sizes)`` spawned processes: point-to-point one-way time (half a ping-pong) at three
  sizes, with the CPU time of one send or receive (``cpu_per_op_s``) and the CPU share of a blocked receive
  (``wait_cpu_share``: measured ~0.01 here, gloo's waits sleep), and ``all_to_all_single`` at each group size at three sizes; each fitted as ``alpha + bytes / beta``.

* the co-running slowdown of a layer's CPU time with 2 and 4 processes computing at once (:func:`_corun`);
* the runner's own CPU work per step (:func:`_runner_cpu`: one-stage runner jobs at EP 1 and 2, the workers'
  process CPU time per step) and of a stage-to-stage transfer (GPipe jobs at pp 2 and 4), each taken to the
  machine's state during the layer microbenchmarks with the work probe (:mod:`tessera_lab.runner.testbed.work_probe`)
  measured around them.

These calibration runs are microbenchmarks, one-stage jobs and 6-micro-batch GPipe jobs, disjoint from any runner
job a prediction is checked against (those run 4 micro-batches).
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from tessera_lab.cost.device import DEVICE_SCHEMA, KINDS
from tessera_lab.model.flops import runner_layer_flops
from tessera_lab.samples import lower_quartile, time_calls

from ..runtime.specs import TinyConfig

__all__ = ["calibrate", "widened"]


def widened(cfg: TinyConfig, factor: int) -> TinyConfig:
    """``cfg`` with hidden size, head size and expert widths multiplied by ``factor`` (counts kept)."""
    return cfg.with_changes(hidden_size=cfg.hidden_size * factor, head_dim=cfg.head_dim * factor,
                            expert_width=cfg.expert_width * factor,
                            shared_expert_width=cfg.shared_expert_width * factor)


def _quartile_time(fn, repeats: int) -> float:
    """Lower quartile of ``repeats`` timings after one warm-up (:func:`tessera_lab.samples.time_calls`). On a
    shared machine the upper tail is other processes' time slices; the runner's own oversubscription is priced
    separately (on this 2-core machine at load ~10 the lower quartile predicted better than the median: median
    |error| 28 % vs 41 %; docs/concepts.md, "Measurement and significance")."""
    return lower_quartile(time_calls(fn, repeats))


def _fit(points: Sequence[tuple[float, float]]) -> dict[str, float]:
    from tessera_lab.cost.device import _fit_line

    a, b = _fit_line(points)
    out = {"alpha_s": a, "bytes_per_s": (1.0 / b) if b > 0 else 0.0}
    if b <= 0:  # time did not grow with bytes (noise): the byte term is left out, and the file says so
        out["fit_note"] = "time did not grow with message size; byte term left out (re-run on a quieter machine)"
    return out


def _layer_points(cfg: TinyConfig, mbs: int, repeats: int) -> tuple[dict, dict]:
    import torch

    from ..runtime.layers import WEIGHT_GRAD_STORE, TinyMoEModel, forward_key

    tokens = mbs * cfg.seq_len
    layers: dict[str, dict[str, Any]] = {k: {"F": [], "B": [], "w_share": []} for k in KINDS}
    extras: dict[str, float] = {}
    for factor in (1, 2):
        c = widened(cfg, factor)
        model = TinyMoEModel(c)
        d = c.as_dict()
        for kind in KINDS:
            idx = next((i for i, k in enumerate(c.layer_kinds()) if k == kind), None)
            if idx is None:
                continue
            layer = model.layers[idx]
            h = torch.randn(mbs, c.seq_len, c.hidden_size, requires_grad=True)
            g = torch.ones(mbs, c.seq_len, c.hidden_size) * 1e-3
            t_f = _quartile_time(lambda: layer(h), repeats)

            def fb():
                layer(h).backward(g)

            t_fb = _quartile_time(fb, repeats)
            key = ("cal", kind, factor)

            def iw():
                with forward_key(key):
                    out = layer(h)
                WEIGHT_GRAD_STORE.defer(key)
                t0 = time.perf_counter()
                out.backward(g)
                t1 = time.perf_counter()
                WEIGHT_GRAD_STORE.flush(key)
                return t1 - t0, time.perf_counter() - t1

            iw()
            parts = [iw() for _ in range(repeats)]
            t_i = lower_quartile([p[0] for p in parts])
            t_w = lower_quartile([p[1] for p in parts])
            x = runner_layer_flops(d, kind, tokens)
            layers[kind]["F"].append([x, t_f])
            layers[kind]["B"].append([x, max(0.0, t_fb - t_f)])
            layers[kind]["w_share"].append(t_w / (t_i + t_w) if t_i + t_w > 0 else 0.0)
        if factor == 1:
            tok = torch.randint(0, c.vocab_size, (mbs, c.seq_len))
            tgt = torch.randint(0, c.vocab_size, (mbs, c.seq_len))
            extras["embed_F_s"] = _quartile_time(lambda: model.embed(tok), repeats)

            def emb_fb():
                model.embed(tok).sum().backward()

            extras["embed_B_s"] = max(0.0, _quartile_time(emb_fb, repeats) - extras["embed_F_s"])
            hh = torch.randn(mbs, c.seq_len, c.hidden_size, requires_grad=True)
            extras["head_F_s"] = _quartile_time(lambda: TinyMoEModel.loss_sum(model.head(hh), tgt), repeats)

            def head_fb():
                TinyMoEModel.loss_sum(model.head(hh), tgt).backward()

            extras["head_B_s"] = max(0.0, _quartile_time(head_fb, repeats) - extras["head_F_s"])
            extras["head_tokens"] = tokens
    for kind in KINDS:
        ws = layers[kind].pop("w_share")
        layers[kind]["w_share"] = statistics.median(ws) if ws else 0.33
    layers = {k: v for k, v in layers.items() if v["F"]}
    return layers, extras


def _corun_worker(fn, n: int, q) -> None:
    from .work_probe import cpu_median

    q.put(cpu_median(fn, n))


def _corun(cfg: TinyConfig, mbs: int, cores: int, repeats: int = 30, rounds: int = 4) -> dict[str, Any]:
    """Co-running slowdown table: the CPU-time median of one linear-attention layer's forward + backward
    with ``n`` forked copies running at once (``n`` = the core count and twice it), over the same alone
    (shared caches and memory bandwidth; oversubscribed, context switches too): the runner's processes
    compute side by side. ``rounds`` alternations of alone / together; ratios of the medians. Returns
    ``{"table": {"1": 1.0, str(n): slowdown, ...}, "alone_s", "together_s": {n: s}, "source"}``
    (:func:`tessera_lab.runner.testbed.sharing.corun_slowdown` reads the table)."""
    import multiprocessing as mp

    from .work_probe import cpu_median, layer_fb

    fb = layer_fb(cfg, mbs)
    ctx = mp.get_context("fork")
    sizes = sorted({max(2, int(cores)), 2 * max(2, int(cores))})
    alone: list[float] = []
    together: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        alone.append(cpu_median(fb, repeats))
        for n in sizes:
            q = ctx.SimpleQueue()
            procs = [ctx.Process(target=_corun_worker, args=(fb, repeats, q), daemon=True) for _ in range(n)]
            for p in procs:
                p.start()
            together[n] += [q.get() for _ in procs]
            for p in procs:
                p.join(timeout=30)
    a = statistics.median(alone)
    med = {n: statistics.median(v) for n, v in together.items()}
    table = {"1": 1.0}
    for n in sizes:  # a slowdown never shrinks with more processes (noise otherwise)
        table[str(n)] = max(1.0, med[n] / a, *(table.values()))
    return {"table": table, "alone_s": a, "together_s": {str(n): v for n, v in med.items()},
            "source": "measured (layer F+B CPU time, alone and with n copies at once)"}


def _throughput(cfg: TinyConfig, mbs: int, repeats: int) -> dict[str, float]:
    import torch

    T, H = mbs * cfg.seq_len, cfg.hidden_size
    a, b = torch.randn(T, H), torch.randn(H, 4 * H)
    t = _quartile_time(lambda: torch.mm(a, b), repeats * 5)
    big = torch.empty(8 * 1024 * 1024)
    dst = torch.empty_like(big)
    tc = _quartile_time(lambda: dst.copy_(big), repeats)
    return {"gemm_flop_per_s": 2 * T * H * 4 * H / t, "gemm_shape": [T, H, 4 * H],
            "memory_bytes_per_s": 2 * big.numel() * 4 / tc}


#: untimed rounds per size: the first messages of a gloo pair pay connection set-up
_WARM = 3


def _comm_worker(rank: int, world: int, store: str, sizes: list[int], groups: list[int], repeats: int, q) -> None:
    """One process of the communication calibration (``world`` of them, gloo): the p2p ping-pong between ranks 0
    and 1, whether a blocked receive spins, the all-to-all per group size, then the all-to-all in situ; rank 0
    puts the results on ``q``. Every rank takes part in every phase in the same order."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=120))
    cpu_ops: list[float] = []  # CPU seconds of one send or receive on this rank (process_time: every thread)
    out: dict[str, Any] = {"p2p": _ping_pong(rank, sizes, repeats, cpu_ops), "a2a": {}}
    out.update(_p2p_cpu(rank, world, cpu_ops))
    out["a2a"] = _all_to_all_times(rank, sizes, groups, repeats)
    out["in_situ"] = _in_situ_all_to_all(rank, world, sizes, groups, repeats)
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


def _ping_pong(rank: int, sizes: list[int], repeats: int, cpu_ops: list[float]) -> list[list[float]]:
    """``[[bytes, one-way seconds]]`` per size (median, on rank 0; empty elsewhere) of a send/receive ping-pong
    between ranks 0 and 1; appends each timed send or receive's CPU seconds on ranks 0 and 1 to ``cpu_ops``."""
    import torch
    import torch.distributed as dist

    pts = []
    for n in sizes:  # ping-pong 0 <-> 1
        buf = torch.zeros(max(1, n // 4))
        ts = []
        for r in range(repeats + _WARM):
            dist.barrier()
            t0 = time.perf_counter()
            c0 = time.process_time()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if r >= _WARM:
                ts.append((time.perf_counter() - t0) / 2)
                if rank < 2:
                    cpu_ops.append((time.process_time() - c0) / 2)
        if rank == 0:
            pts.append([buf.numel() * 4, statistics.median(ts)])
    return pts


def _p2p_cpu(rank: int, world: int, cpu_ops: list[float]) -> dict[str, float]:
    """``p2p_wait_cpu_share``: does a blocked receive consume CPU (spinning) or sleep? (rank 1 waits while rank 0
    sleeps, then sends); ``p2p_cpu_per_op_s``: the median CPU of a send or receive over ranks 0 and 1."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(64)
    shares = []
    for _ in range(5):
        dist.barrier()
        if rank == 0:
            time.sleep(0.02)
            dist.send(buf, 1)
        elif rank == 1:
            w0, c0 = time.perf_counter(), time.process_time()
            dist.recv(buf, 0)
            shares.append((time.process_time() - c0) / max(time.perf_counter() - w0, 1e-9))
    box = [None] * world
    dist.all_gather_object(box, statistics.median(shares) if shares else None)
    out = {"p2p_wait_cpu_share": box[1]}
    dist.all_gather_object(box, statistics.median(cpu_ops) if cpu_ops else None)
    out["p2p_cpu_per_op_s"] = statistics.median([x for x in box[:2] if x is not None] or [0.0])
    return out


def _all_to_all_times(rank: int, sizes: list[int], groups: list[int], repeats: int) -> dict[str, list]:
    """Per group size ``g`` (ranks ``0..g-1``), barrier-synchronised: ``[[bytes sent per rank, seconds]]`` per
    size (median, on rank 0; empty elsewhere)."""
    import torch
    import torch.distributed as dist

    out = {}
    for g in groups:
        grp = dist.new_group(list(range(g)))
        if rank < g:
            pts = []
            for n in sizes:
                per = max(1, n // 4 // g)
                x, y = torch.zeros(per * g), torch.zeros(per * g)
                ts = []
                for r in range(repeats + _WARM):
                    dist.barrier(group=grp)
                    t0 = time.perf_counter()
                    dist.all_to_all_single(y, x, group=grp)
                    if r >= _WARM:
                        ts.append(time.perf_counter() - t0)
                pts.append([per * (g - 1) * 4, statistics.median(ts)])
            if rank == 0:
                out[str(g)] = pts
        dist.barrier()
    return out


def _in_situ_all_to_all(rank: int, world: int, sizes: list[int], groups: list[int], repeats: int) -> dict[str, dict]:
    """In situ: every rank of the world at once, in EP groups of g, runs a runner-like compute segment then an
    all-to-all, without a barrier in between: the all-to-all then also pays the skew between the peers' arrivals
    and the wake-ups, as in a run (the barrier-synchronised timings exclude both). Per ``g`` dividing the world
    (on rank 0; empty elsewhere): the median over ranks of the time added per all-to-all, and the segment's time."""
    import torch
    import torch.distributed as dist

    out = {}
    a = torch.randn(32, 64)
    b = torch.randn(64, 64)

    def segment():
        y = a
        for _ in range(20):
            y = torch.tanh(y @ b * 0.1)
        return y

    for g in groups:
        if world % g:
            continue
        grp = None
        for lo in range(0, world, g):
            gg = dist.new_group(list(range(lo, lo + g)))
            if lo <= rank < lo + g:
                grp = gg
        per = max(1, sizes[1] // 4 // g)
        x, y = torch.zeros(per * g), torch.zeros(per * g)
        segment()
        t0 = time.perf_counter()
        for _ in range(repeats):
            segment()
        alone = (time.perf_counter() - t0) / repeats
        dist.barrier()
        n = 4 * repeats
        t0 = time.perf_counter()
        for _ in range(n):
            segment()
            dist.all_to_all_single(y, x, group=grp)
        total = (time.perf_counter() - t0) / n
        box = [None] * world
        dist.all_gather_object(box, max(0.0, total - alone))
        if rank == 0:
            out[str(g)] = {"per_all_to_all_s": statistics.median(box), "compute_segment_s": alone,
                           "bytes": per * (g - 1) * 4, "processes": world}
        dist.barrier()
    return out


def _comm(cfg: TinyConfig, mbs: int, groups: Sequence[int], repeats: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    act = mbs * cfg.seq_len * cfg.hidden_size * 4
    sizes = [256, act, 8 * act]
    world = max(2, *groups)
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory(prefix="tessera-calibrate-") as tmp:
        mp.start_processes(_comm_worker, args=(world, str(Path(tmp) / "store"), sizes, list(groups), repeats, q),
                           nprocs=world, start_method="spawn", join=True)
    raw = q.get()
    p2p = _fit([(x, t) for x, t in raw["p2p"]])
    p2p["samples"] = raw["p2p"]
    if raw.get("p2p_wait_cpu_share") is not None:
        p2p["wait_cpu_share"] = min(1.0, max(0.0, float(raw["p2p_wait_cpu_share"])))
    if raw.get("p2p_cpu_per_op_s") is not None:
        p2p["cpu_per_op_s"] = float(raw["p2p_cpu_per_op_s"])
    a2a = {}
    for g, pts in raw["a2a"].items():
        a2a[g] = _fit([(x, t) for x, t in pts])
        a2a[g]["samples"] = pts
        if g in raw.get("in_situ", {}):
            a2a[g]["in_situ"] = raw["in_situ"][g]
    return {"p2p": p2p, "all_to_all": a2a, "comm_world": world}


# long: two job series (one stage per EP size, then GPipe jobs for the transfer fit) share one probe-bracketed run
def _runner_cpu(device: dict, cfg: TinyConfig, mbs: int, eps: Sequence[int], *, microbatches: int = 4,
                steps: int = 12, work_ref: float | None = None, corun: dict | None = None,
                p2p: dict | None = None) -> dict[str, Any]:
    """CPU work of the runner's own execution (node-level actions, p2p posting, gloo threads) per process and
    step, against the layer microbenchmarks: calibration jobs of one pipeline stage (``pp = 1``, all layers on
    one rank, 1F1B) at each EP size. Each worker reports its CPU-seconds per step (``time.process_time``: every
    thread, not inflated by waiting for a core; :func:`tessera_lab.runner.launch.results.cpu_summary`); the median
    over the steps after the first, per process, scaled to the machine's state during the layer
    microbenchmarks (``work_ref``: :func:`tessera_lab.runner.testbed.work_probe.work_probe` around them, against the
    same probe around each job: the CPU-seconds of the same work move by up to 1.5x over minutes here) is the
    runner's work, and
    ``factor = work / microbenchmark work``. ``blocked_s``: the iteration minus its CPU work at the
    processor-sharing speed ``min(1, available cores / processes)`` (available cores measured before the job,
    :func:`tessera_lab.runner.testbed.probe.available_cores`): time blocked on all-to-all peers, per layer and F or B
    action. ``transfer_cpu_s``: the CPU of one stage-to-stage transfer, both ends, fitted on GPipe jobs at
    pp = 2 and 4 through :func:`tessera_lab.runner.testbed.predict.predict_runner` (``p2p``: the ping-pong fit).
    The work is stated as one process computing alone: a job of ``ep`` processes computing side by
    side is divided by their co-running slowdown (``corun``, :func:`_corun`;
    :func:`tessera_lab.runner.testbed.sharing.corun_slowdown` of ``ep`` processes). These jobs (pp = 1,
    and GPipe jobs of 6 micro-batches at pp 2 and 4) are never among the validated ones (pp >= 2, 4
    micro-batches)."""
    from tessera_lab.cost.device import layer_times

    from .probe import available_cores
    from .sharing import corun_slowdown
    from ..launch.spawn import spawn
    from ..runtime.specs import RunSpec, WorldSpec
    from .work_probe import work_probe

    cores = os.cpu_count() or 1
    c = (corun or {}).get("table") or 1.0
    d = cfg.as_dict()
    tokens = mbs * cfg.seq_len
    ex = device["extras"]
    mono = microbatches * (sum(sum(layer_times(device, d, k, tokens)[ph] for ph in ("F", "B"))
                               for k in cfg.layer_kinds())
                           + ex["embed_F_s"] + ex["embed_B_s"] + ex["head_F_s"] + ex["head_B_s"])
    out: dict[str, Any] = {}
    work_ref = work_ref or work_probe(cfg, mbs)

    def run(world: WorldSpec, spec: RunSpec) -> tuple[dict, float]:
        before = work_probe(cfg, mbs)
        job = spawn(world, [spec], timeout_s=600, keep=False).job(spec.name)
        return job, (before + work_probe(cfg, mbs)) / 2  # the machine's state over the job: before and after

    for ep in eps:
        avail = available_cores(cores, processes=ep)["cores_available"]
        job, probe = run(WorldSpec(pp=1, ep=ep, timeout_s=120),
                         RunSpec(name="cal", model=d, schedule="1f1b", microbatches=microbatches,
                                 micro_batch_size=mbs, steps=steps + 1, pair_exec="scheduled"))
        per = job["cpu"]["actions_s"] / ep  # CPU-seconds per process and step, as this job ran
        opt = job["cpu"]["sync_opt_s"] / ep
        ev = [e for e in job["events"] if e["step"] >= 1]
        its = [max(e["end"] for e in ev if e["step"] == st and e["lane"] == "compute")
               for st in sorted({e["step"] for e in ev})]
        it = statistics.median(its)
        # in CPU-seconds of one process alone, in the machine's state of the microbenchmarks
        work = max(1e-9, per) * work_ref / probe / corun_slowdown(c, ep, cores)
        rate = min(1.0, avail / ep)  # processor sharing of the cores available to the calibration job
        out[str(ep)] = {"cpu_per_step_s": per, "optimizer_s": opt, "iteration_s": it,
                        "microbenchmark_work_s": mono, "factor": work / mono, "cores_available": avail,
                        "work_probe_s": probe,
                        "blocked_s": max(0.0, it - per / rate) / (microbatches * 2 * cfg.num_layers),
                        "steps": steps, "microbatches": microbatches, "processes": ep,
                        "source": "measured (worker process CPU time per step, median)"}
    # the CPU of a stage-to-stage transfer inside the runner (both ends: posting, completing, waking up to a
    # cold cache, and the context switches of more processes than cores): GPipe jobs of 6 micro-batches at
    # pp = 2 and 4 (never a validated case: those run 4). Each job's CPU per step is predicted with the model
    # the validation uses (runner.predict: processor sharing with the co-running table) without transfer CPU
    # and with 1 ms of it; the transfer CPU is the least-squares slope through the observed excess.
    if (out.get("1") or {}).get("factor") and p2p is not None:
        from .predict import MachineState, predict_runner

        m2 = 6
        rows, jobs_info = [], []
        for pp in (2, 4):
            avail = available_cores(cores, processes=pp)["cores_available"]
            job, probe2 = run(WorldSpec(pp=pp, ep=1, timeout_s=120),
                              RunSpec(name="cal-p2p", model=d, schedule="gpipe", microbatches=m2,
                                      micro_batch_size=mbs, steps=steps + 1, pair_exec="scheduled"))
            per = job["cpu"]["actions_s"] * work_ref / probe2
            pred = []
            for tx in (0.0, 1e-3):
                dev = {**device, "p2p": p2p, "metadata": {"cores": cores},
                       "runner_cpu": {**out, "transfer_cpu_s": tx, **({"corun": corun} if corun else {})}}
                pred.append(predict_runner(dev, d, pp=pp, ep=1, schedule="gpipe", microbatches=m2,
                                           micro_batch_size=mbs,
                                           machine=MachineState(cores_available=avail))["cpu_per_step_s"])
            rows.append((per - pred[0], (pred[1] - pred[0]) / 1e-3))
            jobs_info.append({"pp": pp, "ep": 1, "schedule": "gpipe", "microbatches": m2, "cpu_per_step_s": per,
                              "predicted_without_transfers_s": pred[0], "cores_available": avail,
                              "work_probe_s": probe2})
        out["transfer_cpu_s"] = max(0.0, sum(e * u for e, u in rows) / max(1e-12, sum(u * u for _, u in rows)))
        out["transfer_jobs"] = jobs_info
    out["work_probe"] = {"ref_s": work_ref, "source": "measured (work probe around the layer microbenchmarks)"}
    if corun:
        out["corun"] = corun
    return out


def quality_warnings(layers: dict, runner_cpu: dict) -> list[str]:
    """Signs that a calibration was measured under contention (each a line for the user): a layer timed faster
    at twice the width (time must grow with FLOPs), or a runner calibration job that had less than 3/4 of a
    core per process available."""
    out = []
    for kind, e in layers.items():
        for ph in ("F", "B"):
            pts = sorted(e.get(ph) or [])
            if len(pts) >= 2 and pts[-1][1] < pts[0][1]:
                out.append(f"{kind} {ph}: twice the width measured faster ({pts[0][1] * 1e3:.2f} -> "
                           f"{pts[-1][1] * 1e3:.2f} ms): noise; predictions from this calibration are uncertain, "
                           f"re-run calibrate on a quieter machine")
    for ep, rc in sorted((k, v) for k, v in runner_cpu.items() if k.isdigit()):
        if rc.get("cores_available", 1.0) < 0.75 * min(int(ep), os.cpu_count() or 1):
            out.append(f"runner calibration job at ep={ep} had {rc['cores_available']:.2f} cores available for "
                       f"{ep} process(es): other tenants were busy; re-run calibrate on a quieter machine")
    return out


def calibrate(cfg: TinyConfig | None = None, *, name: str = "cpu", micro_batch_size: int = 2,
              group_sizes: Sequence[int] = (2, 4), repeats: int = 7) -> dict[str, Any]:
    """Measure this machine (module docstring); returns the device dict (write it with
    :func:`tessera_lab.io.write_json`)."""
    import torch

    from tessera_lab.overlap.environment import current_environment

    from ..runtime.reference import deterministic

    from .probe import cpu_probe

    cfg = cfg or TinyConfig()
    load0 = os.getloadavg()[0]
    t0 = time.time()
    probe = cpu_probe(1)  # the share of a core the microbenchmarks below get (runner.predict.oversubscription)
    probe_world = {str(n): cpu_probe(n) for n in sorted({max(2, *group_sizes)})}  # as many as the comm runs
    from .work_probe import work_probe

    probe0 = work_probe(cfg, micro_batch_size)
    with deterministic(1):
        layers, extras = _layer_points(cfg, micro_batch_size, repeats)
        thr = _throughput(cfg, micro_batch_size, repeats)
        corun = _corun(cfg, micro_batch_size, os.cpu_count() or 1)
    work_ref = (probe0 + work_probe(cfg, micro_batch_size)) / 2  # the machine's state during the microbenchmarks
    comm = _comm(cfg, micro_batch_size, [g for g in group_sizes if g >= 2], repeats)
    runner_cpu = _runner_cpu({"layers": layers, "extras": extras}, cfg, micro_batch_size,
                             sorted({1, *[g for g in group_sizes if 2 <= g <= 2]}), work_ref=work_ref,
                             corun=corun, p2p=comm["p2p"])
    # the share of a core over the whole calibration: the probes before and after, averaged
    probe = (probe + cpu_probe(1)) / 2
    probe_world = {k: (v + cpu_probe(int(k))) / 2 for k, v in probe_world.items()}
    env = current_environment("cpu")
    return {
        "kind": "calibrated_device", "schema_version": DEVICE_SCHEMA, "name": name,
        "layers": layers, "extras": extras, "throughput": thr, "p2p": comm["p2p"], "all_to_all": comm["all_to_all"],
        "runner_cpu": runner_cpu,
        "metadata": {**env, "torch": torch.__version__, "cores": os.cpu_count(),
                     "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                     "model": cfg.as_dict(), "micro_batch_size": micro_batch_size, "repeats": repeats,
                     "group_sizes": list(group_sizes), "comm_world": comm["comm_world"],
                     "load_average_1m": {"before": round(load0, 2), "after": round(os.getloadavg()[0], 2)},
                     "cpu_probe_s": probe, "cpu_probe_world_s": probe_world,
                     "seconds": round(time.time() - t0, 1), "provenance": "measured (tessera-lab calibrate)",
                     "warnings": quality_warnings(layers, runner_cpu)},
    }
