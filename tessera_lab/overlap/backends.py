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

import dataclasses
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
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.overlap.core import (
    COMM, COMPUTE, Bundle, MeasurementError, OverlapResult, _schedule, assemble_measured, bundle, bundle_shapes,
    default_contention, pair_graph, spread_stats,
)

CHUNK = 64


# ---------------------------------------------------------------------- scaling
def _s(x: int | None, f: float) -> int | None:
    if x is None:
        return None
    return max(1, int(round(x * f))) if x > 0 else x


def scale_model(model: ModelSpec, f: float) -> ModelSpec:
    """The model with every width multiplied by ``f`` (head and expert counts kept)."""
    if f == 1.0:
        return model
    fields = ("hidden_size", "head_dim", "linear_key_head_dim", "linear_value_head_dim", "intermediate_size",
              "moe_intermediate_size", "shared_expert_intermediate_size", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "q_lora_rank")
    changes = {k: _s(getattr(model, k), f) for k in fields}
    return dataclasses.replace(model, name=f"{model.name}[x{f:g}]", **changes)


def scale_parallel(parallel: ParallelConfig, f: float) -> ParallelConfig:
    """The parallel config with the sequence length multiplied by ``f``."""
    return parallel if f == 1.0 else parallel.replace(seq_len=max(1, int(round(parallel.seq_len * f))))


def scaled_bundle(bd: Bundle, f: float) -> Bundle:
    """The bundle rebuilt at size factor ``f`` (same name and task ids)."""
    return bundle(scale_model(bd.model, f), bd.layer, bd.phase, scale_parallel(bd.parallel, f),
                  expert_load=bd.expert_load, name=bd.name)


def expert_counts(received: int, local_experts: int, seed: int) -> list[int]:
    """Token copies per local expert: ``received`` copies routed uniformly at random (multinomial)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(c) for c in rng.multinomial(max(0, int(received)), [1.0 / local_experts] * local_experts)]


# ---------------------------------------------------------------------- kernels
@dataclass
class KernelContext:
    """Where and how kernels run: device, compute dtype, the communication function and group size."""

    device: Any
    dtype: Any
    world: int
    comm: str  # "gloo", "nccl" or "copy"
    seed: int = 0
    notes: dict = dataclasses.field(default_factory=dict)  # implementation choices, copied into the metadata


def _delta_rule_chunked(q, k, v, beta, chunk: int = CHUNK):
    """Chunked delta rule (WY form). q, k: (H, T, dk); v: (H, T, dv); beta: (H, T). Returns (H, T, dv)."""
    import torch

    H, T, dk = k.shape
    dv = v.shape[-1]
    S = torch.zeros(H, dk, dv, dtype=q.dtype, device=q.device)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    outs = []
    for s0 in range(0, T, chunk):
        qc, kc, vc, bc = q[:, s0:s0 + chunk], k[:, s0:s0 + chunk], v[:, s0:s0 + chunk], beta[:, s0:s0 + chunk]
        c = kc.shape[1]
        kb = kc * bc.unsqueeze(-1)
        A = torch.tril(kb @ kc.transpose(1, 2), -1)
        I = eye[:c, :c].expand(H, c, c)
        if q.dtype in (torch.float32, torch.float64):
            Tinv = torch.linalg.solve_triangular(I + A, I, upper=False)
        else:  # bf16 / fp16: the triangular solve runs in fp32 (as flash-linear-attention's kernels do)
            Tinv = torch.linalg.solve_triangular((I + A).float(), I.float(), upper=False).to(q.dtype)
        W = Tinv @ kb
        U = Tinv @ (vc * bc.unsqueeze(-1))
        Uc = U - W @ S
        outs.append(qc @ S + torch.tril(qc @ kc.transpose(1, 2)) @ Uc)
        S = S + kc.transpose(1, 2) @ Uc
    return torch.cat(outs, dim=1)


def build_kernels(bd: Bundle, ctx: KernelContext, *, layer_seed: int = 0) -> dict[str, Callable[[], Any]]:
    """One callable per task id of a (scaled) bundle. Tensors are allocated here, on ``ctx.device``."""
    import torch
    import torch.nn.functional as F_

    m, p = bd.model, bd.parallel
    dev, dt = ctx.device, ctx.dtype
    T, h = p.tokens_per_microbatch, m.hidden_size
    elsize = torch.empty((), dtype=dt).element_size()
    model_dt = p.dtype_bytes
    gen = torch.Generator(device="cpu").manual_seed(1000 * ctx.seed + layer_seed)

    def rnd(*shape, scale: float = 0.05, grad: bool = False):
        t = (torch.randn(*shape, generator=gen) * scale).to(device=dev, dtype=dt)
        return t.requires_grad_(grad)

    out: dict[str, Callable[[], Any]] = {}
    for task in bd.tasks:
        tid = Bundle.task_id(task)
        ph = task.phase
        op = task.op
        if task.is_comm:
            nbytes = task.collective.bytes if task.collective.group_size > 1 else 0.0
            numel = int(nbytes // elsize)
            if numel <= 0:
                out[tid] = lambda: None
                continue
            numel = -(-numel // ctx.world) * ctx.world
            src, dst = rnd(numel), torch.empty(numel, dtype=dt, device=dev)
            out[tid] = _comm_kernel(task.collective.kind, src, dst, ctx)
        elif op == "gemm" or (op == "router" and ph != "F"):
            n = max(1, int(round(task.flops / (2.0 * T * h))))
            out[tid] = _gemm_kernel(ph, T, h, n, rnd, torch)
        elif op == "router":
            x, w = rnd(T, h), rnd(h, m.num_experts)
            logits = torch.empty(T, m.num_experts, dtype=dt, device=dev)
            k = m.num_experts_per_tok
            out[tid] = lambda x=x, w=w, logits=logits, k=k: torch.topk(torch.matmul(x, w, out=logits), k, dim=-1)
        elif op == "grouped_gemm":
            out[tid] = _experts_kernel(ph, bd, T, h, rnd, torch, F_, layer_seed + ctx.seed * 7919, ctx)
        elif op == "attention":
            out[tid] = _attention_kernel(ph, m, p, rnd, torch, F_, ctx)
        elif op == "linear_attention":
            out[tid] = _linear_attention_kernel(ph, m, p, rnd, torch)
        else:  # element-wise and the rest: move the task's bytes (2 reads, 1 write)
            n = max(1, int(task.bytes / (3 * model_dt)))
            a_, b_, c_ = rnd(n), rnd(n), torch.empty(n, dtype=dt, device=dev)
            out[tid] = lambda a_=a_, b_=b_, c_=c_: torch.mul(a_, b_, out=c_)
    return out


def _comm_kernel(kind: str, src, dst, ctx: KernelContext):
    if ctx.comm == "copy":
        return lambda: dst.copy_(src, non_blocking=True)
    import torch.distributed as dist

    if kind == "all_to_all":
        return lambda: dist.all_to_all_single(dst, src)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(src)
    if kind == "all_gather":
        n = src.numel() // ctx.world
        return lambda: dist.all_gather_into_tensor(dst, src[:n])
    if kind == "reduce_scatter":
        n = src.numel() // ctx.world
        return lambda: dist.reduce_scatter_tensor(dst[:n], src)
    return lambda: dist.all_to_all_single(dst, src)


def _gemm_kernel(phase: str, T: int, k: int, n: int, rnd, torch):
    if phase == "F":
        x, w, y = rnd(T, k), rnd(k, n), rnd(T, n)
        return lambda: torch.matmul(x, w, out=y)
    if phase == "B":
        dy, w, dx = rnd(T, n), rnd(k, n), rnd(T, k)
        wt = w.t()
        return lambda: torch.matmul(dy, wt, out=dx)
    x, dy, dw = rnd(T, k), rnd(T, n), rnd(k, n)
    xt = x.t()
    return lambda: torch.matmul(xt, dy, out=dw)


def _experts_kernel(phase: str, bd: Bundle, T: int, h: int, rnd, torch, F_, seed: int, ctx: KernelContext):
    m, p = bd.model, bd.parallel
    w = m.moe_intermediate_size
    local = max(1, m.num_experts // p.ep)
    received = int(round(T * m.num_experts_per_tok * bd.expert_load))
    counts = expert_counts(received, local, seed)
    N = max(1, sum(counts))
    offs = [0]
    for c in counts:
        offs.append(offs[-1] + c)
    W1, W2 = rnd(local, h, 2 * w), rnd(local, w, h)
    X, H1, A, Y = rnd(N, h), rnd(N, 2 * w), rnd(N, w), rnd(N, h)
    dY, dA, dH1, dX = rnd(N, h), rnd(N, w), rnd(N, 2 * w), rnd(N, h)
    dW1, dW2 = rnd(local, h, 2 * w), rnd(local, w, h)
    segs = [(e, offs[e], offs[e + 1]) for e in range(local) if counts[e] > 0]
    fused = _grouped_mm_kernel(phase, torch, F_, offs, W1, W2, X, A, dY, dH1, w) if ctx.device.type == "cuda" else None
    if fused is not None:
        ctx.notes["grouped_gemm"] = "torch._grouped_mm"
        return fused
    ctx.notes.setdefault("grouped_gemm", "a loop of per-expert matmuls")

    if phase == "F":
        def run():
            for e, s, t in segs:
                torch.matmul(X[s:t], W1[e], out=H1[s:t])
                g, u = H1[s:t, :w], H1[s:t, w:]
                torch.mul(F_.silu(g), u, out=A[s:t])
                torch.matmul(A[s:t], W2[e], out=Y[s:t])
    elif phase == "B":
        def run():
            for e, s, t in segs:
                torch.matmul(dY[s:t], W2[e].t(), out=dA[s:t])
                torch.mul(dA[s:t], A[s:t], out=dH1[s:t, :w])
                torch.mul(dA[s:t], A[s:t], out=dH1[s:t, w:])
                torch.matmul(dH1[s:t], W1[e].t(), out=dX[s:t])
    else:
        def run():
            for e, s, t in segs:
                torch.matmul(A[s:t].t(), dY[s:t], out=dW2[e])
                torch.matmul(X[s:t].t(), dH1[s:t], out=dW1[e])
    return run


def _grouped_mm_kernel(phase, torch, F_, offs, W1, W2, X, A, dY, dH1, w):
    """One grouped-GEMM launch per product with ``torch._grouped_mm`` (CUDA, bf16, Hopper or newer), or None
    when this torch / device does not support it (then the per-expert loop is used)."""
    gmm = getattr(torch, "_grouped_mm", None)
    if gmm is None or X.dtype != torch.bfloat16:
        return None
    ends = torch.tensor(offs[1:], dtype=torch.int32, device=X.device)
    W1t, W2t = W1.transpose(1, 2), W2.transpose(1, 2)

    if phase == "F":
        def run():
            H1 = gmm(X, W1, offs=ends)
            return gmm(F_.silu(H1[:, :w]) * H1[:, w:], W2, offs=ends)
    elif phase == "B":
        def run():
            dA = gmm(dY, W2t, offs=ends)
            return gmm(torch.cat([dA * A, dA * A], dim=1), W1t, offs=ends)
    else:
        def run():
            return gmm(A.t(), dY, offs=ends), gmm(X.t(), dH1, offs=ends)
    try:
        run()
        torch.cuda.synchronize(X.device)
    except Exception:  # noqa: BLE001 - unsupported shapes, dtype or device: fall back to the loop
        return None
    return run


def _attention_kernel(phase: str, m: ModelSpec, p: ParallelConfig, rnd, torch, F_, ctx: KernelContext):
    b, s = p.micro_batch_size, p.seq_len
    hq = max(1, m.num_attention_heads // p.tp)
    if m.kv_lora_rank:  # MLA: q/k carry nope + rope dims, v its own; kv heads = q heads
        dqk, dv, hkv = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim, hq
    else:
        dqk = dv = m.head_dim
        hkv = max(1, m.num_key_value_heads // p.tp)
    grad = phase != "F"
    q = rnd(b, hq, s, dqk, scale=1.0, grad=grad)
    k = rnd(b, hkv, s, dqk, scale=1.0, grad=grad)
    v = rnd(b, hkv, s, dv, scale=1.0, grad=grad)
    if hkv != hq:
        rep = hq // hkv
        fwd = lambda: F_.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
        try:
            with torch.no_grad():
                fwd()
            ctx.notes.setdefault("attention", "scaled_dot_product_attention(is_causal=True, enable_gqa=True)")
        except (TypeError, RuntimeError):  # older torch or a backend without GQA: expand the kv heads
            fwd = lambda: F_.scaled_dot_product_attention(  # noqa: E731
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
            ctx.notes.setdefault("attention", "scaled_dot_product_attention(is_causal=True), kv heads repeated")
    else:
        fwd = lambda: F_.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    if phase == "F":
        def run():
            with torch.no_grad():
                return fwd()
        return run
    o = fwd()
    go = torch.ones_like(o) * 0.01
    return lambda: torch.autograd.grad(o, (q, k, v), go, retain_graph=True)


def _linear_attention_kernel(phase: str, m: ModelSpec, p: ParallelConfig, rnd, torch):
    H = max(1, m.linear_num_value_heads // p.tp)
    dk, dv = m.linear_key_head_dim, m.linear_value_head_dim
    T = p.tokens_per_microbatch
    grad = phase != "F"
    q = rnd(H, T, dk, scale=1.0, grad=grad)
    kraw = rnd(H, T, dk, scale=1.0)
    k = (kraw / kraw.norm(dim=-1, keepdim=True).clamp_min(1e-3)).detach().requires_grad_(grad)
    v = rnd(H, T, dv, scale=1.0, grad=grad)
    beta = torch.sigmoid(rnd(H, T, scale=1.0)).detach().requires_grad_(grad)
    if phase == "F":
        def run():
            with torch.no_grad():
                return _delta_rule_chunked(q, k, v, beta)
        return run
    o = _delta_rule_chunked(q, k, v, beta)
    go = torch.ones_like(o) * 0.01
    return lambda: torch.autograd.grad(o, (q, k, v, beta), go, retain_graph=True)


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


def _measure_jobs(rank: int, world: int, jobs, settings: Settings, runner, ctx: KernelContext,
                  emit: Callable[[tuple], None], broadcast: Callable[[Any], Any], barrier: Callable[[], None],
                  comm_label: str | None) -> None:
    from tessera_lab.overlap.profiles import current_environment

    env = current_environment(settings.backend) if rank == 0 else {}
    load_before = _loadavg()
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
        # rank 0 proposes candidate orders from the measured standalone task times
        payload = None
        if rank == 0:
            dur: dict[str, float] = {}
            for k in graph.keys:
                dur[k] = spread_stats([sp[k][1] - sp[k][0] for sp in runs[graph.owner[k]]])["median"]
            sched = _schedule(graph, dur, settings.contention, budget=settings.budget, keep=max(settings.keep, 1))
            cands = [graph.program_order]
            seen = {graph.projection(graph.program_order)}
            extra = [tuple(given)] if given is not None else [o for _, o in sched.candidates]
            for o in extra:
                if graph.projection(o) not in seen and len(cands) < max(settings.keep, 2 if given is not None else 1):
                    cands.append(tuple(o))
                    seen.add(graph.projection(o))
            payload = (cands, sched)
        cands, sched = broadcast(payload)
        for i in range(len(cands)):
            runs[f"cand{i}"] = []
        for r in range(rounds):
            for i, order in enumerate(cands):
                barrier()
                spans = runner.run(order, kernels, graph.lanes, graph.deps)
                if r >= settings.warmup:
                    runs[f"cand{i}"].append(spans)
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
            res = assemble_measured(a, b, settings.backend, runs, cands, meta, sched)
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
        return _spawn(jobs, settings, world_size or 2, progress)
    n = torch.cuda.device_count()
    if n >= 2:
        return _spawn(jobs, settings, min(n, world_size or 8), progress)
    return _in_process_cuda(jobs, settings, progress)
