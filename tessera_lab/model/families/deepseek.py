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
``indexer_types`` all ``full`` (GLM-5.1: every layer its own indexer) is the DeepSeek-V3.2 rule. GLM-5.2's IndexShare
(``indexer_types`` ``shared``; when the list is absent, ``index_topk_pattern`` or layer ``i`` full when
``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0``): a ``shared`` layer has no indexer weights and its
MLA attends the ``index_topk`` keys the last ``full`` layer selected (the IndexShare ``GlmMoeDsaAttention`` of
transformers' ``glm_moe_dsa/modular_glm_moe_dsa.py``: ``self.indexer = None if skip_topk``, ``prev_topk_indices``;
vLLM's and Megatron's GLM-5.2 support apply the same ``skip_topk`` rule; the stored copy read carries no commit to
pin). The MTP layer is counted with an indexer of its own (``index_share_for_mtp_iteration``: its reuse across MTP
steps, no effect on its weights).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tessera_lab.errors import ConfigError
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
                   "indexer_types", "index_topk_freq", "index_topk_pattern", "index_skip_topk_offset", "layer_types",
                   "num_experts"})
#: indexer_rope_interleave: RoPE layout; index_share_for_mtp_iteration: the MTP steps' reuse of one selection; moe_router_dtype: the
#: router's arithmetic precision
IGNORES = frozenset({"indexer_rope_interleave", "index_share_for_mtp_iteration", "moe_router_dtype"})
#: no MLP biases (DeepseekV3MLP has none)
NEUTRAL = {"mlp_bias": (None, False)}
def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    """``n`` layers by the family's rules: ``mlp_layer_types`` kept as far as it goes and ``sparse`` after;
    ``indexer_types`` re-derived from the schedule fields when the config has them (GLM-5.2), else kept as far as
    it goes and ``full`` after; an exported ``layer_types`` (one value) written for ``n`` layers."""
    old = cfg.get("num_hidden_layers")
    mlp, idx, lt = cfg.get("mlp_layer_types"), cfg.get("indexer_types"), cfg.get("layer_types")
    if isinstance(mlp, list) and len(mlp) == old:
        cfg["mlp_layer_types"] = (mlp + ["sparse"] * n)[:n]
    if isinstance(idx, list) and len(idx) == old:
        if _indexer_rule({**cfg, "num_hidden_layers": n}, n) is not None:
            cfg.pop("indexer_types")
        else:
            cfg["indexer_types"] = (idx + ["full"] * n)[:n]
    if isinstance(lt, list) and lt and len(set(lt)) == 1:
        cfg["layer_types"] = lt[:1] * n
    cfg["num_hidden_layers"] = n


KNOBS = {"moe_intermediate_size": "moe_intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "n_routed_experts", "shared_experts": "n_shared_experts", "moe_every": "moe_layer_freq",
         "num_layers": _layers_knob}


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


def _indexer_rule(cfg: Mapping[str, Any], n: int) -> list[str] | None:
    """The indexer schedule the config's ``index_topk_pattern`` (``F`` full, ``S`` shared) or ``index_topk_freq`` /
    ``index_skip_topk_offset`` give (layer ``i`` full when ``max(i - offset + 1, 0) % freq == 0``; defaults 1 and
    2); ``None`` when the config gives none of them."""
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or len(pattern) != n or set(pattern) - {"F", "S"}:
            raise ConfigError(f"config field 'index_topk_pattern' must be {n} characters of F (full) or S (shared)")
        return ["full" if c == "F" else "shared" for c in pattern]
    if cfg.get("index_topk_freq") is None and cfg.get("index_skip_topk_offset") is None:
        return None
    freq = opt_int(cfg, "index_topk_freq", 1)
    offset = opt_int(cfg, "index_skip_topk_offset", 2, minimum=0)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]


def _shared_indexers(cfg: Mapping[str, Any], n: int) -> list[bool]:
    """Per layer: whether it reuses an earlier layer's indexer selection (GLM-5.2 IndexShare: ``indexer_types``
    ``shared``, or the schedule of :func:`_indexer_rule`); both given must agree; the first layer runs its own."""
    types, rule = cfg.get("indexer_types"), _indexer_rule(cfg, n)
    if types is not None and (not isinstance(types, list) or len(types) != n
                              or any(t not in ("full", "shared") for t in types)):
        raise ConfigError(f"config field 'indexer_types' must list {n} entries of 'full' or 'shared'")
    if types is not None and rule is not None and types != rule:
        at = next(i for i, (a, b) in enumerate(zip(types, rule)) if a != b)
        raise ConfigError(f"config fields 'indexer_types' and index_topk_freq / index_skip_topk_offset / "
                          f"index_topk_pattern disagree at layer {at} ({types[at]!r} against {rule[at]!r}); "
                          "allowed: one schedule")
    types = types if types is not None else rule or ["full"] * n
    if types[0] != "full":
        raise ConfigError("config field 'indexer_types' starts with 'shared'; allowed: the first layer 'full' (a "
                          "shared layer reuses an earlier layer's selection)")
    return [t == "shared" for t in types]


def _check_exported_fields(cfg: Mapping[str, Any], dsa: bool) -> None:
    """Fields some exports write beside the reference's (NVIDIA's GLM-5.2 NVFP4 config): ``num_experts`` must be
    ``n_routed_experts``; ``layer_types`` must name every layer ``deepseek_sparse_attention`` (a DSA model's only
    attention) and is refused on a model without the indexer."""
    if cfg.get("num_experts") is not None and cfg.get("num_experts") != cfg.get("n_routed_experts"):
        raise ConfigError(f"config fields 'num_experts' = {cfg['num_experts']!r} and 'n_routed_experts' = "
                          f"{cfg.get('n_routed_experts')!r} disagree; allowed: equal")
    types, n = cfg.get("layer_types"), cfg.get("num_hidden_layers")
    if types is not None and (not dsa or not isinstance(types, list) or len(types) != n
                              or any(t != "deepseek_sparse_attention" for t in types)):
        raise ConfigError(f"config field 'layer_types' must list {n} entries of 'deepseek_sparse_attention' (a "
                          "model with the DSA indexer); allowed: that, or no layer_types")


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
    dsa = cfg.get("model_type") in ("deepseek_v32", "glm_moe_dsa") or "index_topk" in cfg
    _check_exported_fields(cfg, dsa)
    if dsa:
        kw.update(index_n_heads=req_int(cfg, "index_n_heads"), index_head_dim=req_int(cfg, "index_head_dim"),
                  index_topk=req_int(cfg, "index_topk"))
        shared = _shared_indexers(cfg, len(kw["layers"]))
        kw["layers"] = tuple(dataclasses.replace(l, attention="mla_sparse", shared_index=sh)
                             for l, sh in zip(kw["layers"], shared))
    n = len(kw["layers"])
    kw["mtp_layers"] = mtp_layers(n, opt_int(cfg, "num_nextn_predict_layers", 0, minimum=0),
                                  dataclasses.replace(kw["layers"][-1], shared_index=False))  # its own indexer
    return kw
