"""A tiny Qwen3-Next-like model, its deterministic data, and the single-process reference.

Model (:class:`TinyMoEModel`, config :class:`TinyConfig`), all float32:

* token embedding ``[V, H]``;
* ``num_layers`` decoder layers; layer ``i`` mixes with **gated full attention** when
  ``(i + 1) % (attention_ratio + 1) == 0`` (Qwen3-Next's rule: ratio 3 -> full attention at layers 3, 7, ...)
  and with **linear attention** otherwise. ``attention_ratio = 0`` gives full attention everywhere.

  - linear attention (:class:`GatedDeltaNet`): q, k, v, decay gate ``g``, write strength ``beta`` and output
    gate ``z`` from one fused projection; L2-normalised q and k; the chunked gated delta rule (state
    ``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, output ``S_t q_t``) computed chunk by
    chunk with a triangular solve inside each chunk; per-head RMSNorm times ``silu(z)``; output projection.
    Simplifications against Qwen3-Next: no short causal convolution, no separate head counts for q/k and v.
  - gated full attention (:class:`GatedAttention`): fused q, k, v and output-gate projection, GQA with
    ``num_kv_heads``, q/k RMSNorm, causal ``scaled_dot_product_attention``, ``out * sigmoid(gate)``. No rotary
    embedding (the linear-attention layers carry position).
  - MoE (:class:`MoEBlock`): router ``[E, H]``, top-k routing (:mod:`tessera_lab.runner.moe`), routed SwiGLU
    experts of width ``expert_width``, and a shared SwiGLU expert of width ``shared_expert_width`` scaled by
    ``sigmoid(shared_gate(x))``.
* final RMSNorm and LM head ``[V, H]``; the loss is the **sum** of token cross-entropies (nats) and callers
  divide by the number of tokens in the global batch (see :func:`combine_losses`).

Every GEMM weight is applied through :class:`DeferrableLinear`, whose backward can stash ``(x, dy)`` instead of
computing ``dW`` (zero-bubble "W deferral", :data:`WEIGHT_GRAD_STORE`). Tensors with more than two consumers
fan out through :func:`fanout`, whose backward sums the consumers' gradients in a fixed order, so the result
never depends on the autograd engine's visiting order.

Initialisation is deterministic: each parameter is drawn from its own generator seeded by ``(seed, name)``,
so a pipeline rank that builds the same model gets exactly the reference's weights whatever it keeps.

The reference (:func:`reference_run`) trains the same modules in one process. Its ``matched`` mode evaluates
the batch with the decomposition the distributed run uses: per-shard (``ep * dp`` shards) non-expert compute,
one GEMM per expert over the rows of all shards of an EP group in shard order, one gradient accumulator per
replica, replicas summed in replica order, per-shard loss sums combined in (micro-batch, shard) order. On CPU
with one intra-op thread and ``torch.use_deterministic_algorithms(True)``, every floating-point operation then
has the same inputs, shapes and order as on the ranks, so losses, gradients and updated weights are bitwise
equal. ``matched=False`` runs the plain model on whole micro-batches (different GEMM shapes, so equal only to
float tolerance).
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
