"""The tiny Qwen3-Next-like model and its single-process reference, under one name (re-exports).

The model itself is described in :mod:`tessera_lab.runner.runtime.layers`; the reference run in
:mod:`tessera_lab.runner.runtime.reference`.
"""

from __future__ import annotations

from .layers import (
    WEIGHT_GRAD_STORE, DecoderLayer, DeferrableLinear, Expert, GatedAttention, GatedDeltaNet, MoEBlock, RMSNorm,
    TinyMoEModel, chunk_gated_delta_rule, fanout, forward_key, is_expert_param, recurrent_gated_delta_rule,
)
from .reference import (
    ReferenceResult, combine_losses, deterministic, make_batch, make_optimizer, reference_run, shard_rows,
)
from .specs import TinyConfig

__all__ = [
    "TinyConfig", "TinyMoEModel", "DecoderLayer", "MoEBlock", "Expert", "GatedDeltaNet", "GatedAttention", "RMSNorm",
    "DeferrableLinear", "WEIGHT_GRAD_STORE", "forward_key", "fanout", "chunk_gated_delta_rule",
    "recurrent_gated_delta_rule", "make_batch", "shard_rows", "combine_losses", "make_optimizer", "deterministic",
    "reference_run", "ReferenceResult", "is_expert_param",
]
