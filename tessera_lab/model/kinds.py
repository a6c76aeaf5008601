"""Parameters of each mixer and FFN kind, from the module shapes of the family's reference implementation.

Every function takes a :class:`~tessera_lab.model.spec.ModelSpec` and returns a number of parameters (not bytes).
Shapes (``h`` hidden size, all linear layers without bias unless the config says):

* ``gqa`` / ``gated_gqa`` (MHA, GQA, MQA; transformers ``LlamaAttention``-style): q ``h x nh hd`` (x2 with the output
  gate of Qwen3-Next/Qwen3.5), k and v ``h x nkv hd`` (no v when the values are the keys, Gemma-4's
  ``attention_k_eq_v`` global layers), o ``nh hd x h``; ``attention_bias``: q, k, v biases
  (``o_bias``: o's too, gpt-oss); per-head q/k RMSNorm ``2 hd`` (Qwen3) or over the whole projection
  ``nh hd + nkv hd`` (OLMoE ``q_norm``/``k_norm``); gpt-oss sinks: one logit per head; a head-wise output gate
  (Laguna ``g_proj``) ``h x nh``.
* ``mla`` (DeepSeek-V3 ``DeepseekV3Attention``): q through a LoRA (``q_a``, norm, ``q_b``) or ``q_proj``; ``kv_a``
  ``h x (r_kv + d_rope)``, its norm, ``kv_b`` ``r_kv x nh (d_nope + d_v)``, o ``nh d_v x h``. ``mla_sparse``
  adds DeepSeek-V3.2's lightning indexer (DeepSeek-V3.2-Exp ``inference/model.py`` ``Indexer``): ``wq_b``
  ``r_q x n_i d_i``, ``wk`` ``h x d_i``, ``k_norm`` LayerNorm (weight and bias) ``2 d_i``, ``weights_proj``
  ``h x n_i`` (none on a layer that reuses an earlier layer's selection, GLM-5.2's ``shared`` layers).
* ``gated_deltanet`` (transformers ``Qwen3NextGatedDeltaNet``): see :func:`mixer_params`.
* ``kda`` (Kimi Delta Attention, flash-linear-attention ``fla/layers/kda.py`` as vLLM ``kimi_linear.py`` loads it):
  q, k ``h x H d_k``, v ``h x H d_v``, three depthwise short convolutions (no bias) ``(2 H d_k + H d_v) K``,
  ``A_log`` ``H``, gate LoRA ``f_a`` ``h x d_v``, ``f_b`` ``d_v x H d_k``, ``dt_bias`` ``H d_k``, beta ``b_proj``
  ``h x H``, output-gate LoRA ``g_a`` ``h x d_v``, ``g_b`` ``d_v x H d_v``, gated RMSNorm ``d_v``, o ``H d_v x h``.
* ``lightning`` (MiniMax-Text-01/M1 ``MiniMaxText01LightningAttention``): ``qkv_proj`` ``h x 3 nh hd``,
  ``output_gate`` ``h x nh hd``, RMSNorm ``nh hd``, ``out_proj`` ``nh hd x h`` (the per-head decay slopes are
  buffers, not parameters).
* ``mamba2`` (transformers ``NemotronHMamba2Mixer``): ``I = H P``, ``conv_dim = I + 2 G N``; ``in_proj``
  ``h x (I + conv_dim + H)``, conv1d ``conv_dim K`` (+ ``conv_dim`` bias), ``dt_bias``, ``A_log``, ``D`` (``H``
  each), gated RMSNorm ``I``, ``out_proj`` ``I x h``.
* ``mamba`` (Mamba-1, transformers ``JambaMambaMixer``): ``I = expand h``; ``in_proj`` ``h x 2I``, conv1d
  ``I K`` (+ ``I`` bias), ``x_proj`` ``I x (R + 2N)``, ``dt_proj`` ``R x I`` + bias ``I``, ``A_log`` ``I N``, ``D``
  ``I``, ``out_proj`` ``I x h``; Jamba's dt/B/C RMSNorms ``R + 2N``.
* dense MLP: SwiGLU ``3 h w``; ReLU^2 or GELU (not gated) ``2 h w``; ``mlp_bias`` adds the biases.
* routed expert: SwiGLU ``3 h w`` (gpt-oss adds biases ``2w + h``), ReLU^2 ``2 h w`` (Nemotron-H); router ``h x E`` (+ ``E`` with a linear
  bias, gpt-oss; + ``E`` score-correction bias, DeepSeek-V3 ``noaux_tc``).

This module never imports torch.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.model.hf_families import DENSE, MOE, LayerSpec

#: a :class:`tessera_lab.model.spec.ModelSpec` (not imported: spec imports this module)
ModelSpec = Any


def mixer_params(m: ModelSpec, layer: LayerSpec) -> int:
    """Parameters of the layer's mixer (projections, norms inside the mixer, convolutions, gates)."""
    h, a = m.hidden_size, layer.attention
    if a == "none":
        return 0
    if a == "gated_deltanet":
        # transformers Qwen3NextGatedDeltaNet: in_proj_qkvz, in_proj_ba, depthwise conv1d (no bias),
        # dt_bias and A_log per value head, gated RMSNorm over the value head dim, out_proj.
        kd = m.linear.linear_num_key_heads * m.linear.linear_key_head_dim
        vd = m.linear.linear_num_value_heads * m.linear.linear_value_head_dim
        conv_dim = 2 * kd + vd
        return (h * (2 * kd + 2 * vd) + h * 2 * m.linear.linear_num_value_heads + conv_dim * m.linear.linear_conv_kernel_dim
                + 2 * m.linear.linear_num_value_heads + m.linear.linear_value_head_dim + vd * h)
    if a == "kda":
        H, dk, dv = m.linear.linear_num_value_heads, m.linear.linear_key_head_dim, m.linear.linear_value_head_dim
        kd, vd = H * dk, H * dv
        return (h * (2 * kd + vd) + (2 * kd + vd) * m.linear.linear_conv_kernel_dim + H + h * dv + dv * kd + kd
                + h * H + h * dv + dv * vd + dv + vd * h)
    if a == "lightning":
        inner = m.attention.num_attention_heads * m.attention.head_dim
        return 5 * h * inner + inner
    if a == "mamba2":
        H, inner = m.linear.mamba_num_heads, m.linear.mamba_num_heads * m.linear.mamba_head_dim
        conv_dim = inner + 2 * m.linear.mamba_n_groups * m.linear.ssm_state_size
        proj = h * (inner + conv_dim + H) + inner * h
        if m.linear.mamba_proj_bias:
            proj += inner + conv_dim + H + h
        conv = conv_dim * m.linear.mamba_conv_kernel + (conv_dim if m.linear.mamba_conv_bias else 0)
        return proj + conv + 3 * H + inner
    if a == "mamba":
        inner, N, R = m.linear.mamba_d_inner, m.linear.ssm_state_size, m.linear.mamba_dt_rank
        proj = h * 2 * inner + inner * h + (2 * inner + h if m.linear.mamba_proj_bias else 0)
        conv = inner * m.linear.mamba_conv_kernel + (inner if m.linear.mamba_conv_bias else 0)
        ssm = inner * (R + 2 * N) + R * inner + inner + inner * N + inner
        return proj + conv + ssm + ((R + 2 * N) if m.linear.mamba_bcdt_norms else 0)
    if a in ("mla", "mla_sparse"):
        nh = m.attention.num_attention_heads
        qk = m.attention.qk_nope_head_dim + m.attention.qk_rope_head_dim
        if m.attention.q_lora_rank:
            q = h * m.attention.q_lora_rank + m.attention.q_lora_rank + m.attention.q_lora_rank * nh * qk
        else:
            q = h * nh * qk
        kv = h * (m.attention.kv_lora_rank + m.attention.qk_rope_head_dim) + m.attention.kv_lora_rank
        kv += m.attention.kv_lora_rank * nh * (m.attention.qk_nope_head_dim + m.attention.v_head_dim)
        params = q + kv + nh * m.attention.v_head_dim * h
        if a == "mla_sparse" and not layer.shared_index:  # GLM-5.2's shared layers have no indexer of their own
            ni, di = m.attention.index_n_heads, m.attention.index_head_dim
            params += (m.attention.q_lora_rank or h) * ni * di + h * di + 2 * di + h * ni
        return params
    nh, nkv, hd, vd = gqa_shape(m, layer)
    q_out = nh * hd * (2 if a == "gated_gqa" else 1)
    kv = nkv * (hd + (0 if layer.k_eq_v else vd))  # Gemma-4's global layers: v is k (no v_proj)
    params = h * q_out + h * kv + nh * vd * h  # q, k, v (MiMo-V2-Flash: v of its own width), o
    if m.attention.qk_norm:
        params += (nh + nkv) * hd if m.attention.qk_norm_full else 2 * hd
    if m.attention.attention_bias:
        params += q_out + kv
    if m.attention.o_bias:
        params += h
    if m.attention.attention_sinks or layer.sinks:
        params += nh
    if layer.head_gate:  # Laguna's g_proj: one gate per head
        params += h * nh
    return params


def gqa_shape(m: ModelSpec, layer: LayerSpec) -> tuple[int, int, int, int]:
    """``(heads, kv_heads, head_dim, v_head_dim)`` of a GQA layer: the layer's own (:class:`LayerSpec` ``heads``
    ...) where set, else the model's; the value head dim is the head dim unless set."""
    hd = layer.head_dim or m.attention.head_dim
    return (layer.heads or m.attention.num_attention_heads, layer.kv_heads or m.attention.num_key_value_heads, hd,
            layer.v_head_dim or hd)


def dense_mlp_params(m: ModelSpec, layer: LayerSpec) -> int:
    """Parameters of the layer's dense MLP (its own width when the layer has one)."""
    w = layer.dense_width or m.mlp.intermediate_size
    h = m.hidden_size
    if m.mlp.ffn_act == "swiglu":
        return 3 * h * w + ((2 * w + h) if m.mlp.mlp_bias else 0)
    return 2 * h * w + ((w + h) if m.mlp.mlp_bias else 0)


def routed_expert_params(m: ModelSpec) -> int:
    """Parameters of one routed expert (gate, up and down projections; biases for gpt-oss); a latent MoE's experts
    read and write the ``moe_latent_size`` state (transformers ``NemotronHExperts`` on ``fc1_latent_proj``'s output)."""
    w, h = m.moe.moe_intermediate_size, (m.moe.moe_latent_size or m.hidden_size)
    mats = 3 if m.moe.expert_act == "swiglu" else 2  # Nemotron-H's ReLU^2 experts: up and down only
    return mats * h * w + ((2 * w + h) if m.moe.expert_bias else 0)


def latent_projection_params(m: ModelSpec) -> int:
    """A latent MoE's ``fc1_latent_proj`` (h -> latent) and ``fc2_latent_proj`` (latent -> h), biases with
    ``mlp_bias`` (transformers ``modeling_nemotron_h.py`` @008d9e9577b0 ``NemotronHMoE``); every token uses them, so
    they count with the shared expert; 0 without a latent."""
    lat, h = m.moe.moe_latent_size, m.hidden_size
    return 2 * h * lat + ((lat + h) if m.mlp.mlp_bias else 0) if lat else 0


def router_params(m: ModelSpec) -> int:
    """Router (gate) weights, plus a linear bias (gpt-oss) and DeepSeek-V3's per-expert score-correction bias."""
    E = m.moe.num_experts
    return m.hidden_size * E + (E if m.moe.router_bias else 0) + (E if m.moe.router_linear_bias else 0)


def layer_params(m: ModelSpec, layer: LayerSpec) -> dict[str, int]:
    """Parameters of one layer by component: ``mixer``, ``norms``, ``router``, ``experts`` (all routed experts),
    ``shared``, ``dense_mlp`` and ``mtp`` (an MTP layer's own projection and norms: DeepSeek-V3 ``eh_proj``
    ``2h x h`` and ``enorm``, ``hnorm``, ``shared_head.norm``; the embedding and head are shared)."""
    h = m.hidden_size
    norms = (h if layer.mixer != "none" else 0) + (h if layer.ffn != "none" else 0)
    out = {"mixer": mixer_params(m, layer), "norms": norms, "router": 0, "experts": 0, "shared": 0, "dense_mlp": 0,
           "mtp": 2 * h * h + 3 * h if layer.mtp else 0}
    if layer.ffn == MOE:
        out["router"] = router_params(m)
        out["experts"] = m.moe.num_experts * routed_expert_params(m)
        out["shared"] = m.shared_expert_params() + latent_projection_params(m)
    elif layer.ffn == DENSE:
        out["dense_mlp"] = dense_mlp_params(m, layer)
    return out


def layer_active_params(m: ModelSpec, layer: LayerSpec) -> int:
    """Parameters one token touches in this layer (top-k routed experts only)."""
    p = m.layer_params(layer)
    routed = m.moe.num_experts_per_tok * routed_expert_params(m) if layer.ffn == MOE else 0
    return p["mixer"] + p["norms"] + p["router"] + routed + p["shared"] + p["dense_mlp"] + p["mtp"]
