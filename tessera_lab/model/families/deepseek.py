"""DeepSeek-V3 / R1, DeepSeek-V3.2 (MLA with the lightning indexer of DeepSeek Sparse Attention) and the models that
name ``DeepseekV3ForCausalLM`` under another ``model_type`` (Kimi-K2's ``kimi_k2``).

Rules (transformers ``src/transformers/models/deepseek_v3/modeling_deepseek_v3.py`` @f5a9ec512fa9, ``DeepseekV3DecoderLayer``):
a layer is MoE when ``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0``, else a dense SwiGLU MLP of
``intermediate_size``; MoE = ``n_routed_experts`` routed experts of ``moe_intermediate_size``, top
``num_experts_per_tok`` in ``topk_group`` of ``n_group`` groups, ``n_shared_experts`` shared experts of the same
width, a score-correction bias with ``topk_method = noaux_tc``. ``num_nextn_predict_layers`` MTP modules (DeepSeek-V3
report section 2.2; the HF checkpoint's layer 61: ``eh_proj``, ``enorm``, ``hnorm``, one MoE decoder layer,
``shared_head.norm``) are counted apart: the 671B of the card excludes them.
DeepSeek-V3.2 (``deepseek_v32``; deepseek-ai/DeepSeek-V3.2-Exp ``inference/model.py``, ``Indexer``): every layer's
MLA attends the ``index_topk`` keys its indexer (``index_n_heads`` heads of ``index_head_dim``) selects.
Aliases read by the same rule: GLM-4.7-Flash's ``glm4_moe_lite`` (transformers
``src/transformers/models/glm4_moe_lite/modeling_glm4_moe_lite.py``: DeepSeek-V3's MLA decoder layer) and GLM-5's
``glm_moe_dsa`` (transformers ``src/transformers/models/glm_moe_dsa/modular_glm_moe_dsa.py`` @4c94ecda4a4e:
``GlmMoeDsaConfig``, MLA with DeepSeek-V3.2's indexer ``GlmMoeDsaIndexer``; ``mlp_layer_types`` lists ``dense`` /
``sparse`` per layer, default the first 3 dense; ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim``).
``indexer_types`` all ``full`` (GLM-5.1: every layer its own indexer) is the DeepSeek-V3.2 rule; layers that share
another layer's indexer selection (GLM-5.2: ``shared``, ``index_topk_freq``) are refused: the cost model does not
have shared indexers yet.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.unsupported import refuse as refuse_feature
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import DENSE, MOE, _from_deepseek_v3, opt_int, req_int

MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa")
ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM")
EXAMPLE = "deepseek-v3"
SOURCE = "transformers src/transformers/models/deepseek_v3/modeling_deepseek_v3.py @f5a9ec512fa9"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                   "qk_rope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size", "n_routed_experts",
                   "num_experts_per_tok", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", "n_group",
                   "topk_group", "topk_method", "num_nextn_predict_layers", "index_n_heads", "index_head_dim",
                   "index_topk", "hidden_act", "attention_bias", "head_dim", "mlp_layer_types", "qk_head_dim",
                   "indexer_types", "index_topk_freq", "index_topk_pattern", "index_skip_topk_offset"})
#: indexer_rope_interleave: RoPE layout; index_share_for_mtp_iteration: only with shared indexers (refused)
IGNORES = frozenset({"indexer_rope_interleave", "index_share_for_mtp_iteration"})
KNOBS = {"moe_intermediate_size": "moe_intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "n_routed_experts", "shared_experts": "n_shared_experts", "moe_every": "moe_layer_freq"}


def mtp_layers(n: int, count: int, like: Any) -> tuple:
    """``count`` MTP layers after ``n`` decoder layers, each a copy of the decoder layer ``like`` (MoE)."""
    return tuple(dataclasses.replace(like, index=n + j, ffn=MOE, mtp=True) for j in range(count))


def _check_qk_head_dim(cfg: Mapping[str, Any]) -> None:
    """``qk_head_dim``, when given, must be ``qk_nope_head_dim + qk_rope_head_dim`` (GLM-5 writes it)."""
    if cfg.get("qk_head_dim") is None:
        return
    want = req_int(cfg, "qk_nope_head_dim") + req_int(cfg, "qk_rope_head_dim")
    if req_int(cfg, "qk_head_dim") != want:
        raise ConfigError(f"config field 'qk_head_dim' = {cfg['qk_head_dim']} is out of range; allowed: "
                          f"qk_nope_head_dim + qk_rope_head_dim = {want}")


def _check_indexer_sharing(cfg: Mapping[str, Any]) -> None:
    """Refuse layers that reuse another layer's indexer selection (GLM-5.2's ``indexer_types`` ``shared``)."""
    types = cfg.get("indexer_types")
    if types is not None and (not isinstance(types, list) or any(t not in ("full", "shared") for t in types)):
        raise ConfigError("config field 'indexer_types' must list 'full' or 'shared' per layer")
    freq = cfg.get("index_topk_freq")
    if (types and "shared" in types) or freq not in (None, 1) or cfg.get("index_topk_pattern") is not None:
        raise refuse_feature(cfg.get("model_type"), "DSA indexers shared across layers (indexer_types "
                                 "'shared', index_topk_freq, index_topk_pattern: a layer reuses another's selection)")


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a DeepSeek-V3 / V3.2 config (rules in the module docstring)."""
    check_act(cfg)
    if cfg.get("attention_bias"):
        raise ConfigError("config field 'attention_bias' = true is not supported for deepseek_v3; allowed: false")
    kw = _from_deepseek_v3(cfg)
    _check_qk_head_dim(cfg)
    types = cfg.get("mlp_layer_types")
    if types is not None:  # GLM-5: the per-layer list decides
        n = len(kw["layers"])
        if not isinstance(types, list) or len(types) != n or any(t not in ("dense", "sparse") for t in types):
            raise ConfigError(f"config field 'mlp_layer_types' must list {n} entries of 'dense' or 'sparse'")
        kw["layers"] = tuple(dataclasses.replace(l, ffn=MOE if t == "sparse" else DENSE)
                             for l, t in zip(kw["layers"], types))
    _check_indexer_sharing(cfg)
    if cfg.get("model_type") in ("deepseek_v32", "glm_moe_dsa") or "index_topk" in cfg:
        kw.update(index_n_heads=req_int(cfg, "index_n_heads"), index_head_dim=req_int(cfg, "index_head_dim"),
                  index_topk=req_int(cfg, "index_topk"))
        kw["layers"] = tuple(dataclasses.replace(l, attention="mla_sparse") for l in kw["layers"])
    n = len(kw["layers"])
    kw["mtp_layers"] = mtp_layers(n, opt_int(cfg, "num_nextn_predict_layers", 0, minimum=0), kw["layers"][-1])
    return kw
