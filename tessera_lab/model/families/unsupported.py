"""Model types whose architecture has a feature the cost model does not have yet: refused with one line naming it
(the list is in docs/models.md). Not a reader: :func:`tessera_lab.model.families.resolve` consults it before
refusing an unknown ``model_type``, and the readers call :func:`refuse` for such a feature inside a known family.

This module never imports torch.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError

#: model_type -> the architecture feature the cost model does not have (one line each; docs/models.md lists them)
FEATURES: dict[str, str] = {
    "deepseek_v4": "DeepSeek-V4's compressed sparse attention (compress_ratios), hyper-connections (hc_mult) and "
                   "hash-routed MoE layers (num_hash_layers)",
    "deepseek_ref": "DeepSeek-V4's compressed sparse attention (compress_ratios), hyper-connections (hc_mult) and "
                    "hash-routed MoE layers (num_hash_layers)",
    "minimax_m3": "MiniMax-M3's sparse attention (sparse_attention_config) and MTP modules (num_mtp_modules)",
    "minimax_m3_vl": "MiniMax-M3's sparse attention (sparse_attention_config) and MTP modules (num_mtp_modules)",
    "step3p7": "Step-3.x's MTP layers, each with an output head of its own (num_nextn_predict_layers; vLLM "
               "step3p5_mtp.py @375a5cf222eb: a vocab x h head per MTP layer, where the cost model's MTP layers share "
               "the model's head)",
    "step3p5": "Step-3.x's MTP layers, each with an output head of its own (num_nextn_predict_layers; vLLM "
               "step3p5_mtp.py @375a5cf222eb: a vocab x h head per MTP layer, where the cost model's MTP layers share "
               "the model's head)",
}

#: a config field (set, not null) that brings a feature the cost model does not have, whatever the model_type
FIELD_FEATURES: dict[str, str] = {
    "attn_res_block_size": "Kimi-K3's block attention residuals (attn_res_block_size) and normed latent MoE "
                           "(routed_expert_hidden_size, latent_moe_use_norm)",
    "routed_expert_hidden_size": "Kimi-K3's block attention residuals (attn_res_block_size) and normed latent MoE "
                                 "(routed_expert_hidden_size, latent_moe_use_norm)",
    "hc_mult": "hyper-connections (hc_mult: several residual streams mixed per layer)",
    "compress_ratios": "compressed sparse attention (compress_ratios)",
    "num_hash_layers": "hash-routed MoE layers (num_hash_layers)",
}
#: values of a :data:`FIELD_FEATURES` field that bring no such feature (one residual stream, every layer its indexer)
_NO_FEATURE = (None, 0, 1, False)


def feature_of(cfg: Mapping[str, Any]) -> str | None:
    """The unsupported feature named by a config's ``model_type`` or by one of its fields (``None``: none)."""
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in FEATURES:
        return FEATURES[mt]
    return next((FIELD_FEATURES[k] for k in FIELD_FEATURES
                 if not any(cfg.get(k) is v or (type(v) is int and type(cfg.get(k)) is int and cfg.get(k) == v)
                            for v in _NO_FEATURE)), None)


def refuse(model_type: Any, feature: str) -> ConfigError:
    """The one-line refusal: ``model_type 'x' has <feature>, which the cost model does not have yet (docs/models.md)``."""
    return ConfigError(f"config field 'model_type' = {model_type!r}: the model has {feature}, which the cost model "
                       "does not have yet (docs/models.md, 'Not yet modelled'); allowed: a model without it")
