"""Measuring backends of :mod:`tessera_lab.overlap.core`: real torch kernels at the task shapes.

Kernels (one per task, built once, run many times; shapes after the size factor ``f``):

* ``gemm`` (projections, shared expert, router weight gradient): ``(T, h) @ (h, n)`` with ``T`` tokens,
  ``h`` the hidden size and ``n = flops / (2 T h)``; B is ``dY (T, n) @ A^T``, W is ``X^T (h, T) @ dY``.
* ``router``: the gate GEMM ``(T, h) @ (h, E)`` then ``topk``.
* ``grouped_gemm`` (routed experts): per local expert ``e`` with ``c_e`` tokens, ``X_e @ W1_e`` (width 2w,
  gate and up), SiLU-and-multiply, ``@ W2_e``; B and W are the transposed products. Token counts per local
  expert come from a routing: ``T * top_k * expert_load`` token copies drawn uniformly at random over the
  ``E / ep`` local experts (multinomial, seeded). On CUDA with bf16 each product is one
  ``torch._grouped_mm`` launch when this torch supports it, else a loop of per-expert matmuls (the
  metadata's ``kernels`` says which).
* ``attention``: ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)`` with the
  model's query / key-value heads and head size; B is the real autograd backward of that call.
* ``linear_attention``: a chunked delta-rule loop (chunk 64; WY form with a triangular solve per chunk,
  Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence Length", NeurIPS 2024;
  the gate of Gated DeltaNet is left out); B is the autograd backward through the loop.
* ``elementwise`` and anything else: a multiply moving the task's bytes (read two operands, write one).
* ``all_to_all``: ``torch.distributed.all_to_all_single`` of the task's bytes (equal splits) over the local
  group; ``all_reduce`` likewise. On one GPU the ``cuda`` backend moves the same bytes with a
  device-to-device copy on the communication stream instead (``comm_proxy = "copy"``).

Size factor ``f``: every width (hidden, head sizes, expert widths) and the sequence length are multiplied by
``f`` (rounded, at least 1); head counts, expert counts and top-k are kept. GEMM and attention FLOPs scale
by about ``f**3`` and all-to-all bytes by ``f**2``, so communication weighs relatively more at small ``f``.

Timing: the ``cpu`` backend spawns ``world_size`` processes (``torch.multiprocessing``, spawn) in a gloo
group; each runs the same program with one torch thread: compute tasks in the main thread, communication
in a second thread, dependencies through ``threading.Event``; spans from ``time.perf_counter``. Rank 0
returns the results through a queue; every process is killed after ``timeout_s``. The ``cuda`` backend
issues compute on one stream and communication on another with event dependencies, and times with CUDA
events after warm-up. Each round runs a alone, b alone and every candidate order together (interleaved so
drift affects all alike); the first ``warmup`` rounds are dropped; medians and quartiles of the rest.
"""

from __future__ import annotations

import datetime as _dt
import os
import queue as _queue
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from tessera_lab.cost.analytic import Contention
from tessera_lab.errors import ConfigError
from tessera_lab.overlap.bundles import COMM, COMPUTE, Bundle, MeasurementError, pair_graph
from tessera_lab.overlap.environment import current_environment
from tessera_lab.overlap.results import (
    OverlapResult, assemble_measured, bundle_shapes, default_contention, spread_stats,
)
from tessera_lab.overlap.fit import fit_contention_samples
from tessera_lab.overlap.search import _schedule

from tessera_lab.overlap.kernels import (  # noqa: F401  (re-exported)
    CHUNK, KernelContext, _delta_rule_chunked, build_kernels, expert_counts, scale_model, scale_parallel,
    scaled_bundle,
)

#: grid step of the contention fits made while measuring (coarse grid, then a 10x finer one around its best)
FIT_STEP = 0.1


def halve(alive: Sequence[int], medians: Mapping[int, float]) -> list[int]:
    """One successive-halving round: the ``max(2, ceil(n / 2))`` candidates with the lowest medians (ties to
    the lower index), program order (candidate 0) always among them in place of the worst kept; fewer than
    ``n`` whenever ``n >= 3``, so halving ends."""
    ranked = sorted(alive, key=lambda i: (medians[i], i))
    kept = ranked[:max(2, (len(ranked) + 1) // 2)]
    if 0 in alive and 0 not in kept:
        kept = kept[:-1] + [0]
    return sorted(kept)


# ---------------------------------------------------------------------- runners
class ThreadRunner:
    """CPU: compute tasks in the calling thread, communication tasks in a second thread."""

    def __init__(self, timeout_s: float = 120.0):
        self.timeout_s = timeout_s

    def building(self):
        """Context in which kernels are built (nothing special on CPU)."""
        import contextlib

        return contextlib.nullcontext()

    def run(self, order: Sequence[str], kernels: Mapping[str, Callable], lanes: Mapping[str, str],
            deps: Mapping[str, Sequence[str]]) -> dict[str, tuple[float, float]]:
        comp = [k for k in order if lanes[k] == COMPUTE]
        comm = [k for k in order if lanes[k] == COMM]
        events = {k: threading.Event() for k in order}
        spans: dict[str, tuple[float, float]] = {}
        errors: list[BaseException] = []
        known = set(order)

        def lane(seq):
            try:
                for k in seq:
                    for d in deps.get(k, ()):
                        if d in known and not events[d].wait(self.timeout_s):
                            raise MeasurementError(f"task {k} waited more than {self.timeout_s} s for {d}")
                        if errors:
                            return
                    s = time.perf_counter()
                    kernels[k]()
                    spans[k] = (s, time.perf_counter())
                    events[k].set()
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                for e in events.values():
                    e.set()

        t0 = time.perf_counter()
        th = None
        if comm:
            th = threading.Thread(target=lane, args=(comm,), daemon=True)
            th.start()
        lane(comp)
        if th is not None:
            th.join(self.timeout_s)
            if th.is_alive():
                raise MeasurementError(f"communication thread did not finish within {self.timeout_s} s")
        if errors:
            raise errors[0]
        return {k: (s - t0, e - t0) for k, (s, e) in spans.items()}


class StreamRunner:
    """CUDA: compute on one stream, communication on another; dependencies across lanes by CUDA events;
    per-task spans from CUDA events relative to a start event recorded on both streams."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = device
        self.compute = torch.cuda.Stream(device)
        self.comm = torch.cuda.Stream(device)

    def building(self):
        """Build kernels on the compute stream, so that autograd backward kernels (which run on the stream
        of their forward) land on the compute lane."""
        return self.torch.cuda.stream(self.compute)

    def run(self, order, kernels, lanes, deps):
        torch = self.torch
        torch.cuda.synchronize(self.device)
        start = torch.cuda.Event(enable_timing=True)
        start.record(self.compute)
        self.comm.wait_event(start)
        evs: dict[str, tuple[Any, Any]] = {}
        for k in order:
            s = self.compute if lanes[k] == COMPUTE else self.comm
            for d in deps.get(k, ()):
                if d in evs and lanes[d] != lanes[k]:
                    s.wait_event(evs[d][1])
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(s):
                e0.record(s)
                kernels[k]()
                e1.record(s)
            evs[k] = (e0, e1)
        torch.cuda.synchronize(self.device)
        return {k: (start.elapsed_time(e0) / 1e3, start.elapsed_time(e1) / 1e3) for k, (e0, e1) in evs.items()}


# ---------------------------------------------------------------------- the measuring program (every rank)
@dataclass
class Settings:
    backend: str
    repeats: int
    warmup: int
    size_factor: float
    contention: Contention
    budget: int
    keep: int
    seed: int
    timeout_s: float
    fit: bool = True


def _measure_jobs(rank: int, world: int, jobs, settings: Settings, runner, ctx: KernelContext,
                  emit: Callable[[tuple], None], broadcast: Callable[[Any], Any], barrier: Callable[[], None],
                  comm_label: str | None) -> None:
    env = current_environment(settings.backend) if rank == 0 else {}
    load_before = _loadavg()
    fit_samples: list[dict] = []
    for ji, (a, b, given) in enumerate(jobs):
        ctx.notes = {}
        sa, sb = scaled_bundle(a, settings.size_factor), scaled_bundle(b, settings.size_factor)
        graph = pair_graph(sa, sb)
        with runner.building():
            ka = {f"{sa.name}/{k}": fn for k, fn in build_kernels(sa, ctx, layer_seed=2 * ji).items()}
            kb = {f"{sb.name}/{k}": fn for k, fn in build_kernels(sb, ctx, layer_seed=2 * ji + 1).items()}
        kernels = {**ka, **kb}
        oa, ob = graph.of("a"), graph.of("b")
        runs: dict[str, list] = {"a": [], "b": []}
        rounds = settings.warmup + settings.repeats
        for r in range(rounds):
            for tag, order in (("a", oa), ("b", ob)):
                barrier()
                spans = runner.run(order, kernels, graph.lanes, graph.deps)
                if r >= settings.warmup:
                    runs[tag].append(spans)
        # 1. the program order together: the first pair measurement, from which contention is fitted
        prog = graph.program_order
        runs["cand0"] = []
        for r in range(rounds):
            barrier()
            spans = runner.run(prog, kernels, graph.lanes, graph.deps)
            if r >= settings.warmup:
                runs["cand0"].append(spans)
        # 2. rank 0: fit contention on every pair measured so far, re-search with the fitted model
        payload = None
        if rank == 0:
            dur: dict[str, float] = {}
            for k in graph.keys:
                dur[k] = spread_stats([sp[k][1] - sp[k][0] for sp in runs[graph.owner[k]]])["median"]
            t_prog = spread_stats([max(e for _, e in sp.values()) for sp in runs["cand0"]])["median"]
            fit_samples.append({"order": list(prog), "durations": dur, "lanes": dict(graph.lanes),
                                "deps": {k: list(v) for k, v in graph.deps.items()}, "t_ab": t_prog,
                                "classes": dict(graph.classes)})
            fit = fit_contention_samples(fit_samples, step=FIT_STEP) if settings.fit else None
            cont = fit.contention if fit is not None else settings.contention
            n_cand = max(settings.keep, 1)
            sched = _schedule(graph, dur, cont, budget=settings.budget, keep=max(n_cand, 8))
            cands = [prog]
            seen = {graph.projection(prog)}
            extra = [tuple(given)] if given is not None else [o for _, o in sched.candidates]
            for o in extra:
                if graph.projection(o) not in seen and len(cands) < max(n_cand, 2 if given is not None else 1):
                    cands.append(tuple(o))
                    seen.add(graph.projection(o))
            payload = (cands, sched, fit)
        cands, sched, fit = broadcast(payload)
        for i in range(1, len(cands)):
            runs[f"cand{i}"] = []
        # 3. successive halving: every candidate `repeats` times, keep the better half (program order always),
        #    double the repeats, until two remain
        alive = list(range(len(cands)))
        n_rep, first, halving = settings.repeats, True, []
        while True:
            for r in range(n_rep + (settings.warmup if first else 0)):
                for i in alive:
                    barrier()
                    spans = runner.run(cands[i], kernels, graph.lanes, graph.deps)
                    if not first or r >= settings.warmup:
                        runs[f"cand{i}"].append(spans)
            first = False
            if len(alive) <= 2:
                break
            nxt = None
            if rank == 0:
                med = {i: spread_stats([max(e for _, e in sp.values()) for sp in runs[f"cand{i}"]])["median"]
                       for i in alive}
                nxt = halve(alive, med)
                halving.append({"repeats": n_rep, "alive": list(alive), "medians": [med[i] for i in alive],
                                "kept": nxt})
            alive = broadcast(nxt)
            n_rep *= 2
        if rank == 0:
            meta = dict(env)
            meta.update({
                "backend": settings.backend, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "dtype": str(ctx.dtype).replace("torch.", ""), "model_dtype": a.parallel.dtype,
                "shapes": {"a": bundle_shapes(sa), "b": bundle_shapes(sb)}, "repeats": settings.repeats,
                "warmup": settings.warmup, "spread": "iqr (q1, q3) and min/max over repeats",
                "size_factor": settings.size_factor, "world_size": world, "comm": comm_label,
                "comm_proxy": "copy" if ctx.comm == "copy" else None,
                "search_contention": {"compute": settings.contention.compute, "comm": settings.contention.comm},
                "kernels": dict(ctx.notes),
                "load_average_1m": {"before": load_before, "after": _loadavg()},
            })
            meta["search"] = {"orders_measured": len(cands), "halving": halving,
                              "fit": fit.as_dict() if fit is not None else None,
                              "search_contention": {"compute": cont.compute, "comm": cont.comm}}
            res = assemble_measured(a, b, settings.backend, runs, cands, meta, sched, decide=True)
            emit(("result", ji, res))
        del kernels, ka, kb


def _loadavg() -> float | None:
    """The machine's 1-minute load average (other processes competing for the cores), if known."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _worker(rank: int, world: int, store: str, jobs, settings: Settings, q) -> None:
    """Entry point of a spawned measuring process (gloo on CPU, NCCL on GPUs)."""
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:
            pass
        torch.set_flush_denormal(True)
        cuda = settings.backend == "cuda"
        if cuda:
            torch.cuda.set_device(rank)
            device, dtype, pg = torch.device("cuda", rank), _torch_dtype(jobs[0][0].parallel.dtype), "nccl"
        else:
            device, dtype, pg = torch.device("cpu"), torch.float32, "gloo"
        dist.init_process_group(pg, init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=_dt.timedelta(seconds=max(30.0, settings.timeout_s)))
        try:
            ctx = KernelContext(device, dtype, world, pg, settings.seed)
            runner = StreamRunner(device) if cuda else ThreadRunner(settings.timeout_s)

            def broadcast(obj):
                box = [obj]
                dist.broadcast_object_list(box, src=0)
                return box[0]

            def barrier():
                if cuda:
                    torch.cuda.synchronize(device)
                dist.barrier()

            _measure_jobs(rank, world, jobs, settings, runner, ctx, q.put, broadcast, barrier, pg)
            barrier()
        finally:
            dist.destroy_process_group()
        q.put(("done", rank))
    except BaseException:  # noqa: BLE001 - sent to the parent
        q.put(("error", rank, traceback.format_exc()))
        raise


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.bfloat16}[name]


# ---------------------------------------------------------------------- parent side
def _spawn(jobs, settings: Settings, world: int, progress) -> list[OverlapResult]:
    import torch.multiprocessing as tmp

    ctx = tmp.get_context("spawn")
    q = ctx.Queue()
    results: dict[int, OverlapResult] = {}
    with tempfile.TemporaryDirectory(prefix="tessera-measure-") as tmpdir:
        store = str(Path(tmpdir) / "store")
        procs = [ctx.Process(target=_worker, args=(r, world, store, jobs, settings, q), daemon=True)
                 for r in range(world)]
        for pr in procs:
            pr.start()
        deadline = time.monotonic() + settings.timeout_s
        done = 0
        try:
            while done < world:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MeasurementError(
                        f"{settings.backend} measurement did not finish within timeout_s = {settings.timeout_s:g} s; "
                        f"lower repeats or size_factor, or raise the timeout")
                try:
                    msg = q.get(timeout=min(remaining, 0.5))
                except _queue.Empty:
                    dead = [(r, pr.exitcode) for r, pr in enumerate(procs) if pr.exitcode not in (None, 0)]
                    if dead:
                        time.sleep(0.5)  # let an error message arrive first
                        try:
                            msg = q.get_nowait()
                        except _queue.Empty:
                            raise MeasurementError(f"measuring process(es) died: rank/exit code {dead}") from None
                    else:
                        continue
                if msg[0] == "result":
                    results[msg[1]] = msg[2]
                    if progress:
                        progress(len(results), len(jobs))
                elif msg[0] == "done":
                    done += 1
                elif msg[0] == "error":
                    last = msg[2].strip().splitlines()[-1] if msg[2].strip() else "unknown error"
                    raise MeasurementError(f"measuring rank {msg[1]} failed: {last}")
        finally:
            for pr in procs:
                pr.join(timeout=10 if done == world else 0.1)
            for pr in procs:
                if pr.is_alive():
                    pr.kill()
                    pr.join(timeout=5)
            q.close()
    return [results[i] for i in range(len(jobs))]


def _in_process_cuda(jobs, settings: Settings, progress) -> list[OverlapResult]:
    import torch

    device = torch.device("cuda", torch.cuda.current_device())
    dtype = _torch_dtype(jobs[0][0].parallel.dtype)
    ctx = KernelContext(device, dtype, 1, "copy", settings.seed)
    runner = StreamRunner(device)
    results: dict[int, OverlapResult] = {}

    def emit(msg):
        results[msg[1]] = msg[2]
        if progress:
            progress(len(results), len(jobs))

    _measure_jobs(0, 1, jobs, settings, runner, ctx, emit, lambda x: x, lambda: torch.cuda.synchronize(device),
                  "copy (one GPU: device-to-device copy on the comm stream)")
    return [results[i] for i in range(len(jobs))]


def preflight(backend: str) -> None:
    """Raise :class:`MeasurementError` at once if ``backend`` cannot run here (no torch, no CUDA GPU)."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dev dependency
        raise MeasurementError(f"the {backend} backend needs torch ({exc}); pip install torch") from None
    if backend == "cuda" and not torch.cuda.is_available():
        raise MeasurementError("the cuda backend needs a CUDA GPU; torch.cuda.is_available() is False "
                               "(use --backend cpu or analytic)")
    if backend == "cpu" and not torch.distributed.is_available():
        raise MeasurementError("the cpu backend needs torch.distributed with gloo; this torch build lacks it")


def measure(pairs: Sequence[tuple[Bundle, Bundle]], backend: str, *, orders, repeats: int, warmup: int,
            size_factor: float, contention: Contention | None, budget: int, keep: int, world_size: int | None,
            timeout_s: float, seed: int, progress) -> list[OverlapResult]:
    """Measure pairs with the ``cpu`` or ``cuda`` backend (see the module docstring)."""
    preflight(backend)
    import torch

    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"field 'timeout_s' = {timeout_s!r} is out of range; allowed: seconds > 0")
    settings = Settings(backend, repeats, warmup, size_factor, contention or default_contention(), budget, keep, seed,
                        float(timeout_s))
    jobs = [(a, b, tuple(o) if o is not None else None) for (a, b), o in zip(pairs, orders)]
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2):
        raise ConfigError(f"field 'world_size' = {world_size!r} is out of range; allowed: an integer >= 2")
    if backend == "cpu":
        ep = jobs[0][0].parallel.ep if jobs and jobs[0][0].parallel is not None else 2
        return _spawn(jobs, settings, world_size or max(2, min(8, ep)), progress)
    n = torch.cuda.device_count()
    if n >= 2:
        return _spawn(jobs, settings, min(n, world_size or 8), progress)
    return _in_process_cuda(jobs, settings, progress)
