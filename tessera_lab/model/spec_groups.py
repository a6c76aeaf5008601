"""The groups of a :class:`~tessera_lab.model.spec.ModelSpec`: what a model description holds, by what it describes.

A spec is its identity (name, type, family, hidden size, where it was read from) plus six groups: the layer stack,
softmax attention, the linear-time mixers, the dense MLP, the mixture of experts and the vocabulary. A family reader
(:mod:`tessera_lab.model.families`) returns flat keywords named as in the Hugging Face configs;
:data:`FIELD_GROUP` says which group holds each, and :data:`FLAT_FIELDS` is the order of
:meth:`~tessera_lab.model.spec.ModelSpec.as_dict`. Sizes are element counts (not bytes).

This module never imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tessera_lab.model.hf_families import LayerSpec


@dataclass(frozen=True)
class LayerStack:
    """The layers of a model in order: one :class:`LayerSpec` per decoder layer (with the MTP layers after them
    when ``plan_mtp``), the MTP layers apart, and the config's full-attention interval of a hybrid model."""

    layers: tuple[LayerSpec, ...]
    #: MTP layers (counted apart; in ``layers`` after the decoder layers only when ``plan_mtp``)
    mtp_layers: tuple[LayerSpec, ...] = ()
    plan_mtp: bool = False
    #: every N-th layer is full attention (Qwen3-Next's config field; None: the pattern is listed per layer)
    full_attention_interval: int | None = None


@dataclass(frozen=True)
class AttentionSpec:
    """Softmax attention of the full-attention layers: heads (GQA), MLA ranks (DeepSeek-V3) and DeepSeek-V3.2's
    lightning indexer; sizes in elements. Lightning attention (MiniMax) uses the head fields too."""

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    qk_norm: bool = False
    #: q/k norm over the whole projection (OLMoE), not per head
    qk_norm_full: bool = False
    attention_bias: bool = False
    o_bias: bool = False
    attention_sinks: bool = False
    # MLA (deepseek_v3)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek-V3.2 lightning indexer (mla_sparse)
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0


@dataclass(frozen=True)
class LinearMixerSpec:
    """Sizes of the linear-time mixers: Gated DeltaNet and KDA (the ``linear_*`` fields), Mamba-2 and Mamba-1
    (the ``mamba_*`` fields and ``ssm_state_size``); elements. 0 where the model has no such mixer."""

    # Gated DeltaNet (qwen3_next) and KDA (kimi_linear)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    # Mamba-2 (mamba2) and Mamba-1 (mamba)
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    mamba_n_groups: int = 1
    ssm_state_size: int = 0
    mamba_conv_kernel: int = 0
    mamba_chunk_size: int = 0
    mamba_conv_bias: bool = False
    mamba_proj_bias: bool = False
    mamba_d_inner: int = 0
    mamba_dt_rank: int = 0
    mamba_bcdt_norms: bool = False


@dataclass(frozen=True)
class MlpSpec:
    """The dense MLP of the dense-FFN layers: width (elements; a layer's own ``dense_width`` overrides it),
    activation (swiglu, relu2, gelu; not swiglu: no gate projection) and biases."""

    intermediate_size: int = 0
    ffn_act: str = "swiglu"
    mlp_bias: bool = False


@dataclass(frozen=True)
class MoESpec:
    """The mixture of experts of the MoE layers: routed experts (count, top-k, width, activation, biases), shared
    experts, latent projection, router (biases, group-limited routing); widths in elements."""

    moe_intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    #: latent MoE (Nemotron 3 Super/Ultra): routed experts run on an h -> moe_latent_size projection of the hidden
    #: state (and it back); 0: experts on the hidden state
    moe_latent_size: int = 0
    router_bias: bool = False
    # group-limited routing (DeepSeek-V3: experts in n_group groups, a token picks experts in topk_group of them)
    n_group: int = 1
    topk_group: int = 1
    expert_act: str = "swiglu"
    expert_bias: bool = False
    router_linear_bias: bool = False


@dataclass(frozen=True)
class VocabSpec:
    """The vocabulary: its size (the embedding and the LM head are ``vocab_size x hidden_size``) and whether the
    head shares the embedding matrix."""

    vocab_size: int
    tie_word_embeddings: bool


#: the groups of a :class:`ModelSpec` (attribute -> class), in the order their fields are read
SPEC_GROUPS: dict[str, type] = {"stack": LayerStack, "attention": AttentionSpec, "linear": LinearMixerSpec,
                                "mlp": MlpSpec, "moe": MoESpec, "vocab": VocabSpec}
#: flat field name (a reader's keyword, a config-like name) -> the group holding it
FIELD_GROUP: dict[str, str] = {f.name: g for g, c in SPEC_GROUPS.items() for f in dataclasses.fields(c)}
#: the flat field names in the order of :meth:`ModelSpec.as_dict`
FLAT_FIELDS: tuple[str, ...] = (
    "name", "model_type", "hidden_size", "vocab_size", "tie_word_embeddings", "layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "qk_norm", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size",
    "moe_intermediate_size", "num_experts", "num_experts_per_tok", "shared_expert_intermediate_size",
    "shared_expert_gate", "moe_latent_size", "router_bias", "n_group", "topk_group", "attention_bias", "o_bias",
    "attention_sinks", "qk_norm_full", "index_n_heads", "index_head_dim", "index_topk", "mamba_num_heads",
    "mamba_head_dim", "mamba_n_groups", "ssm_state_size", "mamba_conv_kernel", "mamba_chunk_size", "mamba_conv_bias",
    "mamba_proj_bias", "mamba_d_inner", "mamba_dt_rank", "mamba_bcdt_norms", "ffn_act", "expert_act", "mlp_bias",
    "expert_bias", "router_linear_bias", "mtp_layers", "plan_mtp", "family", "source", "notes",
    "allow_unknown_fields", "allow_structural_fields", "path", "raw",
)
