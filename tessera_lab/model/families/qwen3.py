"""Qwen3 (dense), Qwen3-MoE and Qwen3-VL-MoE's language model.

Rules (transformers ``src/transformers/models/qwen3_moe/modeling_qwen3_moe.py`` @00d4b3d2142c,
``Qwen3MoeDecoderLayer``): a layer is MoE when it is not in ``mlp_only_layers``, there are experts and
``(i + 1) % decoder_sparse_step == 0``; attention is GQA with per-head q/k RMSNorm. Qwen3-VL-MoE's text model
(``qwen3_vl_moe/modeling_qwen3_vl_moe.py``, ``Qwen3VLMoeTextDecoderLayer``) is the same decoder.
Sliding-window attention (``use_sliding_window``) is refused: no released Qwen3 checkpoint uses it.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.hf_families import _from_qwen3, _from_qwen3_moe, opt_bool

MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen3_vl_moe_text", "qwen3_vl_text")
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
EXAMPLE = "qwen3-30b-a3b"
SOURCE = "transformers src/transformers/models/qwen3_moe/modeling_qwen3_moe.py @00d4b3d2142c"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                   "moe_intermediate_size", "num_experts", "num_experts_per_tok", "decoder_sparse_step",
                   "mlp_only_layers", "attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
                   "hidden_act"})
IGNORES = frozenset()
#: fields Qwen3 checkpoints write that change nothing at these values (Qwen3-Coder-480B-A35B writes them): no
#: q/k/v bias, the q/k RMSNorm every Qwen3 layer has, no shared expert
NEUTRAL = {"qkv_bias": False, "use_qk_norm": True, "shared_expert_intermediate_size": 0}
KNOBS = {"moe_intermediate_size": "moe_intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "num_experts", "moe_every": "decoder_sparse_step"}


def check_act(cfg: Mapping[str, Any], key: str = "hidden_act", allowed: tuple[str, ...] = ("silu",)) -> str:
    """The activation field, refused when the family's MLP does not use it (SwiGLU needs ``silu``)."""
    act = cfg.get(key, allowed[0])
    if act not in allowed:
        raise ConfigError(f"config field '{key}' = {act!r} is not supported; allowed: {', '.join(allowed)}")
    return act


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Qwen3 / Qwen3-MoE config (rules in the module docstring)."""
    if opt_bool(cfg, "use_sliding_window", False):
        raise ConfigError("config field 'use_sliding_window' = true is not supported for qwen3; allowed: false")
    check_act(cfg)
    # Qwen3-VL's dense text model (qwen3_vl_text) has no experts: the Qwen3 decoder
    dense = cfg.get("model_type") == "qwen3" or (cfg.get("model_type") == "qwen3_vl_text" and "num_experts" not in cfg)
    kw = _from_qwen3(cfg) if dense else _from_qwen3_moe(cfg)
    kw["attention_bias"] = kw["o_bias"] = opt_bool(cfg, "attention_bias", False)
    return kw
