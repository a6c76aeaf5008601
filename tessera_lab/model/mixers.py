"""Forward task graphs of the mixer kinds beyond GQA/MLA/Gated DeltaNet (:mod:`tessera_lab.model.tasks` builds
those and calls these): KDA, lightning attention, Mamba-2, Mamba-1, DeepSeek-V3.2's indexer, and the attention
pair count of sliding-window and chunked attention.

FLOP conventions (per micro-batch of ``T = b s`` tokens; model FLOPs count the GEMMs and the cores, as Megatron-LM's
``num_floating_point_operations`` counts GEMMs and attention; cores B = 2 x F, no W):

* Softmax attention core: ``4 b P H d`` with ``P`` the (query, key) pairs of one sequence (:func:`attention_pairs`):
  causal ``s^2 / 2`` (Megatron's halving), sliding window ``w``: ``s w - w^2 / 2`` (each query sees ``min(i + 1, w)``
  keys; equals ``s^2 / 2`` at ``w = s``), chunked (Llama-4): ``s // c`` chunks of ``c^2 / 2`` plus the remainder's.
  DeepSeek-V3.2's sparse MLA attends ``index_topk`` keys: pairs as a window of ``index_topk``.
* Lightning indexer (DeepSeek-V3.2): its q/k/weight GEMMs and a score core ``2 b P n_i d_i`` over all causal pairs.
* Linear attention with a gated delta rule (KDA, as Gated DeltaNet): per token and head ``6 d_k d_v`` (``S^T k``,
  the rank-1 update, ``S^T q``) plus the chunked kernel's intra-chunk products ``2 C (d_k + d_v)``, ``C = 64``.
* Lightning attention (MiniMax; no delta rule): ``4 d^2 + 2 C (2 d)`` per token and head (state update and read-out
  plus the intra-chunk products).
* Mamba-2 (SSD, chunked): per token and head ``4 N P + 2 C (N + P)`` (state update and read-out, intra-chunk
  ``C B^T`` and its product), ``C = chunk_size``.
* Mamba-1 selective scan: ``9 N`` per token and channel (``mamba_ssm``'s ``selective_scan_ref`` FLOP count,
  ``9 B L D N``).

Host kernels: the linear-mixer cores are ``linear_attention`` tasks and count as flash-linear-attention's
``chunk_gated_delta_rule`` (:mod:`tessera_lab.cost.host`); a stated approximation for lightning and Mamba kernels.
This module never imports torch.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.model.flops import attention_flops, conv1d_flops, scan_flops, selective_scan_flops
from tessera_lab.model.graph import Task, _Fwd

LINEAR_ATTENTION_CHUNK = 64


def attention_pairs(s: int, window: int = 0, local: str = "") -> float:
    """(query, key) pairs of one causal sequence of ``s`` tokens (formulas in the module docstring)."""
    if not window or window >= s:
        return s * s / 2.0
    if local == "chunked":
        full, rest = divmod(s, window)
        return full * window * window / 2.0 + rest * rest / 2.0
    return float(s * window - window * window / 2.0)


def _linear_core(g: _Fwd, flops: float, io: float, saved: float, state_bytes: float, deps: list[str]) -> str:
    return g.add(Task("core", g.layer, "F", "linear_attention", flops, io + 2 * state_bytes, deps=tuple(deps),
                      saved_bytes=saved), b_scale=2.0)


def kda(g: _Fwd, m: Any, T: int, tp: int, after: str) -> str:
    """Kimi Delta Attention: q/k/v/gate projections, short convolutions, the chunked delta-rule core with
    per-channel decay, the low-rank gate up-projections, gated RMSNorm and the output projection."""
    h, dt = m.hidden_size, g.dt
    H = m.linear.linear_num_value_heads / tp
    dk, dv = m.linear.linear_key_head_dim, m.linear.linear_value_head_dim
    kd, vd = H * dk, H * dv
    proj = g.gemm("in_proj", T, h, 2 * kd + vd + H + 2 * dv, [after], seq=True)  # q, k, v, beta, f_a, g_a
    lora = g.gemm("gate_lora_up", T, dv, kd + vd, [proj])  # f_b (decay), g_b (output gate)
    conv_dim = 2 * kd + vd
    conv = g.elementwise("conv1d", dt * T * conv_dim * 2, [proj], saved=dt * T * conv_dim,
                         flops=conv1d_flops(T, conv_dim, m.linear.linear_conv_kernel_dim))
    C = LINEAR_ATTENTION_CHUNK
    chunks = -(-T // C)
    flops = scan_flops(T, H, dk, dv, C, 6.0)
    core = _linear_core(g, flops, dt * T * (3 * kd + 2 * vd), dt * T * (3 * kd + vd + H) + 4.0 * T * H * C,
                        chunks * H * dk * dv * 4, [conv, lora])
    norm = g.elementwise("gated_norm", dt * T * vd * 3, [core, lora], saved=dt * T * vd * 2)
    return g.gemm("out_proj", T, vd, h, [norm])


def lightning(g: _Fwd, m: Any, T: int, tp: int, after: str) -> str:
    """MiniMax lightning attention: qkv and output-gate projections, the chunked linear-attention core with a
    per-head decay, RMSNorm times the sigmoid gate, and the output projection."""
    h, dt = m.hidden_size, g.dt
    H, d = m.attention.num_attention_heads / tp, m.attention.head_dim
    inner = H * d
    proj = g.gemm("qkv_gate_proj", T, h, 4 * inner, [after], seq=True)
    C = LINEAR_ATTENTION_CHUNK
    chunks = -(-T // C)
    flops = scan_flops(T, H, d, d, C, 4.0)
    core = _linear_core(g, flops, dt * T * 4 * inner, dt * T * 3 * inner + 4.0 * T * H * C, chunks * H * d * d * 4,
                        [proj])
    norm = g.elementwise("norm_gate", dt * T * inner * 3, [core], saved=dt * T * inner * 2)
    return g.gemm("out_proj", T, inner, h, [norm])


def mamba2(g: _Fwd, m: Any, T: int, tp: int, after: str) -> str:
    """Mamba-2 (SSD): in_proj (z, x, B, C, dt), depthwise conv1d, the chunked scan, gated RMSNorm, out_proj."""
    h, dt = m.hidden_size, g.dt
    H, P, N = m.linear.mamba_num_heads / tp, m.linear.mamba_head_dim, m.linear.ssm_state_size
    inner = H * P
    conv_dim = inner + 2 * m.linear.mamba_n_groups * N / tp
    proj = g.gemm("in_proj", T, h, inner + conv_dim + H, [after], seq=True)
    conv = g.elementwise("conv1d", dt * T * conv_dim * 2, [proj], saved=dt * T * conv_dim,
                         flops=conv1d_flops(T, conv_dim, m.linear.mamba_conv_kernel))
    C = m.linear.mamba_chunk_size or LINEAR_ATTENTION_CHUNK
    chunks = -(-T // C)
    flops = scan_flops(T, H, N, P, C, 4.0)
    core = _linear_core(g, flops, dt * T * (conv_dim + inner + H), dt * T * (conv_dim + H) + 4.0 * T * H * C,
                        chunks * H * N * P * 4, [conv])
    norm = g.elementwise("gated_norm", dt * T * inner * 3, [core], saved=dt * T * inner * 2)
    return g.gemm("out_proj", T, inner, h, [norm])


def mamba1(g: _Fwd, m: Any, T: int, tp: int, after: str) -> str:
    """Mamba-1 (Jamba): in_proj (x, z), conv1d, x_proj (dt, B, C), dt_proj, the selective scan, out_proj."""
    h, dt = m.hidden_size, g.dt
    inner, N, R = m.linear.mamba_d_inner / tp, m.linear.ssm_state_size, m.linear.mamba_dt_rank
    proj = g.gemm("in_proj", T, h, 2 * inner, [after], seq=True)
    conv = g.elementwise("conv1d", dt * T * inner * 2, [proj], saved=dt * T * inner,
                         flops=conv1d_flops(T, inner, m.linear.mamba_conv_kernel))
    xp = g.gemm("x_proj", T, inner, R + 2 * N, [conv])
    dtp = g.gemm("dt_proj", T, R, inner, [xp])
    core = _linear_core(g, selective_scan_flops(T, inner, N), dt * T * (3 * inner + 2 * N), dt * T * (3 * inner + 2 * N), 0.0,
                        [conv, dtp])
    gate = g.elementwise("gate", dt * T * inner * 3, [core], saved=dt * T * inner * 2)
    return g.gemm("out_proj", T, inner, h, [gate])


def indexer(g: _Fwd, m: Any, T: int, b: int, s: int, q_in: str, q_dim: int, after: str) -> str:
    """DeepSeek-V3.2's lightning indexer: q (from the q LoRA's normed output), k and head weights, the score core
    over all causal pairs, and the top-k selection; returns the selection task (the sparse core waits for it)."""
    h, dt = m.hidden_size, g.dt
    ni, di = m.attention.index_n_heads, m.attention.index_head_dim
    q = g.gemm("index_q", T, q_dim, ni * di, [q_in])
    k = g.gemm("index_k", T, h, di, [after], seq=True)
    w = g.gemm("index_weights", T, h, ni, [after], seq=True)
    flops = attention_flops(b, attention_pairs(s), ni, di, 0)
    score = g.add(Task("index_core", g.layer, "F", "attention", flops, dt * T * (ni * di + di + ni) + 2.0 * T * s,
                       deps=(q, k, w), saved_bytes=dt * T * (ni * di + di + ni)), b_scale=2.0)
    return g.elementwise("index_topk", 4.0 * T * min(s, m.attention.index_topk) * 2, [score],
                         saved=4.0 * T * min(s, m.attention.index_topk))
