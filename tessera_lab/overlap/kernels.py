"""Kernels of the measuring backends at a task's shapes, and the size factor (see
:mod:`tessera_lab.overlap.backends` for what each kernel is). torch is imported inside the builders."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.overlap.bundles import Bundle, bundle

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


#: mixers the measured backends have kernels for (scaled_dot_product_attention, the chunked delta rule)
MEASURED_MIXERS = ("gqa", "gated_gqa", "mla", "gated_deltanet", "none")


def check_measurable(model: ModelSpec, layer: int | None) -> None:
    """Refuse, naming the mixer, a layer the cpu/cuda backends cannot run (see :func:`build_kernels`)."""
    if layer is None or not 0 <= layer < model.num_layers:
        return
    spec = model.layers[layer]
    if spec.attention not in MEASURED_MIXERS or spec.local or spec.mtp:
        raise ConfigError(f"layer {layer} of {model.name} ({spec.label}) has no measured kernel on the cpu/cuda "
                          f"backends (they run {', '.join(MEASURED_MIXERS[:4])}); allowed: --backend analytic")


def build_kernels(bd: Bundle, ctx: KernelContext, *, layer_seed: int = 0) -> dict[str, Callable[[], Any]]:
    """One callable per task id of a (scaled) bundle. Tensors are allocated here, on ``ctx.device``.

    Raises:
        ConfigError: a layer whose mixer has no measured kernel here (KDA, lightning, Mamba, DeepSeek-V3.2's sparse
            MLA, sliding-window or chunked attention): those are planned with the analytic model only.
    """
    check_measurable(bd.model, bd.layer)
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


