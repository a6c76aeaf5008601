"""Floating-point operation counts: the one place the package turns shapes into FLOPs.

Every count is a forward count in FLOPs (a multiply-add is 2), float; shapes are element counts (tokens, heads,
head dimensions, widths) and may be fractional where a dimension is split across ranks. The task graphs
(:mod:`tessera_lab.model.tasks`, :mod:`tessera_lab.model.mixers`, :mod:`tessera_lab.model.graph`), the CPU
testbed's calibration (:mod:`tessera_lab.cost.device`), the runner's model-FLOP count and the teaching notebooks
all count through these functions. Conventions (docs/cost-model.md):

* a GEMM ``(m, k) @ (k, n)``: ``2 m k n`` (one multiply-add per output element and inner index);
* tokens through ``params`` weights of dense layers: ``2 tokens params`` (nanoGPT's ``6 N`` per token for a
  training step is three of these);
* attention core over ``pairs`` (query, key) pairs: ``2 batch pairs heads (qk_dim + v_dim)`` (QK^T and PV; a
  causal sequence of ``s`` has about ``s^2 / 2`` pairs, :func:`tessera_lab.model.mixers.attention_pairs`);
* a chunked linear-attention scan: ``tokens heads (state_mults dk dv + 2 chunk (dk + dv))``;
* a training step (F + B + W): ``3 x`` the forward (Megatron-LM's ``num_floating_point_operations``).

This module imports nothing from the package but :mod:`tessera_lab.errors`.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError

#: layer kinds of the runner's tiny model (:func:`runner_layer_flops`)
RUNNER_KINDS = ("linear_attention", "full_attention")


def gemm_flops(m: float, k: float, n: float, count: float = 1) -> float:
    """FLOPs of ``count`` GEMMs ``(m, k) @ (k, n)``: ``2 m k n count``."""
    return 2.0 * m * k * n * count


def dense_flops(tokens: float, params: float) -> float:
    """FLOPs of ``tokens`` tokens through ``params`` dense weights (each weight one multiply-add a token)."""
    return 2.0 * tokens * params


def attention_flops(batch: float, pairs: float, heads: float, qk_dim: float, v_dim: float) -> float:
    """FLOPs of an attention core: QK^T (``qk_dim``) and PV (``v_dim``) over ``pairs`` (query, key) pairs per
    sequence, ``batch`` sequences, ``heads`` heads (``v_dim = 0``: scores only, e.g. an indexer)."""
    return 2.0 * batch * pairs * heads * (qk_dim + v_dim)


def scan_flops(tokens: float, heads: float, dk: float, dv: float, chunk: float, state_mults: float) -> float:
    """FLOPs of a chunked linear-attention scan (gated delta rule: ``state_mults = 6``; lightning attention and
    Mamba-2's SSD: 4, with ``dk, dv`` = state and head dimensions): per token and head ``state_mults dk dv`` for
    the chunk-state updates and reads, ``2 chunk (dk + dv)`` for the intra-chunk attention."""
    return tokens * heads * (state_mults * dk * dv + 2.0 * chunk * (dk + dv))


def selective_scan_flops(tokens: float, inner: float, state: float) -> float:
    """FLOPs of Mamba-1's selective scan: ``9`` per token, channel and state element (discretise, update, read)."""
    return 9.0 * tokens * inner * state


def conv1d_flops(tokens: float, channels: float, kernel: float) -> float:
    """FLOPs of a depthwise causal conv1d: one multiply-add per token, channel and kernel tap."""
    return 2.0 * tokens * channels * kernel


def cross_entropy_flops(tokens: float, vocab: float) -> float:
    """FLOPs of softmax cross-entropy over ``vocab`` logits a token (max, subtract, exp, sum, divide: 5 each)."""
    return 5.0 * tokens * vocab


def training_flops(forward: float) -> float:
    """Model FLOPs of a training step (forward, input gradient, weight gradient) from its forward FLOPs."""
    return 3.0 * forward


def runner_layer_flops(cfg: Mapping[str, Any], kind: str, tokens: int) -> float:
    """Forward FLOPs of one layer of the runner's tiny model for ``tokens`` tokens (GEMMs, attention core, delta
    rule).

    ``cfg``: :class:`tessera_lab.runner.runtime.specs.TinyConfig` fields as a dict; ``kind``: ``linear_attention``
    or ``full_attention``. GEMMs: :func:`dense_flops` over the layer's weights; the full attention core is causal
    over ``seq_len`` (``tokens seq_len / 2`` pairs); the delta rule is :func:`scan_flops` with ``state_mults = 6``.

    Raises:
        ConfigError: an unknown ``kind``.
    """
    H, h, d, kv = cfg["hidden_size"], cfg["num_heads"], cfg["head_dim"], cfg["num_kv_heads"]
    E, k, w, ws = cfg["num_experts"], cfg["top_k"], cfg["expert_width"], cfg["shared_expert_width"]
    T, C = cfg["seq_len"], cfg["linear_chunk"]
    if kind == "linear_attention":
        mixer = H * (4 * h * d + 2 * h) + h * d * H
        core = scan_flops(tokens, h, d, d, C, 6.0)
    elif kind == "full_attention":
        mixer = H * (2 * h * d + 2 * kv * d) + h * d * H
        core = attention_flops(1, tokens * T / 2, h, d, d)
    else:
        raise ConfigError(f"layer kind {kind!r} is unknown; allowed: {', '.join(RUNNER_KINDS)}")
    moe = H * E + k * (H * 2 * w + w * H) + ((H * 2 * ws + ws * H + H) if ws else 0)
    return dense_flops(tokens, mixer + moe) + core
