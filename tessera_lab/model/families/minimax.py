"""MiniMax-Text-01 / MiniMax-M1: lightning attention (linear) with softmax GQA every few layers, MoE in every layer.

Rules: the checkpoint's ``modeling_minimax_m1.py`` (``MiniMaxM1DecoderLayer``: ``attn_type_list[i] == 0`` is
lightning attention, ``1`` softmax attention; ``MiniMaxM1SparseMoeBlock``: ``num_local_experts`` SwiGLU experts of
``intermediate_size``, top ``num_experts_per_tok``, no shared expert), as vLLM
``vllm/model_executor/models/minimax_text_01.py`` @98370df70c18 reads it (``attn_type_list``, else ``layer_types``); transformers ``src/transformers/models/minimax/`` uses
``layer_types`` (``linear_attention`` / ``full_attention``) for the same thing. Lightning attention
(``MiniMaxText01LightningAttention``): ``qkv_proj``, ``output_gate``, an RMSNorm and ``out_proj`` over
``num_attention_heads x head_dim``. The ``layernorm_*_alpha/beta`` residual scalings and ``postnorm`` do not change
shapes or FLOPs. Knob ``attention_ratio``: softmax attention at every ``ratio + 1``-th layer (M1: 7).
MiniMax-M2 (``minimax_m2``; vLLM ``vllm/model_executor/models/minimax_m2.py``): softmax GQA in every layer
(``attn_type_list`` all 1 or absent) with q/k RMSNorm over the whole projection (``qk_norm_type = per_layer``) or per
head, a sigmoid router with a correction bias (``use_routing_bias``), and ``num_mtp_modules x mtp_transformer_layers``
MTP layers (``use_mtp``), counted apart, each as one MoE decoder layer (an assumption: the config does not
spell out an MTP module's FFN).
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.deepseek import mtp_layers
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import (
    FULL_ATTENTION, LINEAR_ATTENTION, MOE, _gqa_fields, _layers, _moe_common, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("minimax_m1", "minimax_text_01", "minimax", "minimax_m2")
ARCHITECTURES = ("MiniMaxM1ForCausalLM", "MiniMaxText01ForCausalLM", "MiniMaxForCausalLM", "MiniMaxM2ForCausalLM")
EXAMPLE = "minimax-m1"
SOURCE = "vLLM vllm/model_executor/models/minimax_text_01.py @98370df70c18, minimax_m2.py; transformers src/transformers/models/minimax/"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts",
                   "num_experts_per_tok", "attn_type_list", "layer_types", "hidden_act", "block_size", "use_qk_norm",
                   "qk_norm_type", "use_routing_bias", "use_mtp", "num_mtp_modules", "mtp_transformer_layers",
                   "attention_bias"})
IGNORES = frozenset({"layernorm_full_attention_alpha", "layernorm_full_attention_beta",
                     "layernorm_linear_attention_alpha", "layernorm_linear_attention_beta", "layernorm_mlp_alpha",
                     "layernorm_mlp_beta", "postnorm", "full_attn_alpha_factor", "full_attn_beta_factor",
                     "linear_attn_alpha_factor", "linear_attn_beta_factor", "mlp_alpha_factor", "mlp_beta_factor",
                     "sliding_window", "use_sliding_window", "shared_intermediate_size", "shared_moe_mode"})


def _ratio(cfg: dict[str, Any], ratio: int) -> None:
    n = int(cfg["num_hidden_layers"])
    types = [1 if (i + 1) % (ratio + 1) == 0 else 0 for i in range(n)]
    if "layer_types" in cfg and "attn_type_list" not in cfg:
        cfg["layer_types"] = [FULL_ATTENTION if t else LINEAR_ATTENTION for t in types]
    else:
        cfg["attn_type_list"] = types
        cfg.pop("layer_types", None)


def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    types = build(cfg)["layers"]
    full = sum(1 for l in types if l.mixer == FULL_ATTENTION)
    ratio = (len(types) - full) // max(full, 1)
    cfg["num_hidden_layers"] = n
    _ratio(cfg, ratio)


KNOBS = {"attention_ratio": _ratio, "num_layers": _layers_knob, "moe_intermediate_size": "intermediate_size",
         "num_experts_per_tok": "num_experts_per_tok", "num_experts": "num_local_experts"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a MiniMax-M1 config (rules in the module docstring)."""
    check_act(cfg)
    if cfg.get("shared_intermediate_size"):
        raise ConfigError("config field 'shared_intermediate_size' > 0 (a shared expert) is not supported for minimax; "
                          "allowed: 0")
    n = req_int(cfg, "num_hidden_layers")
    if cfg.get("model_type") == "minimax_m2" and "attn_type_list" not in cfg and "layer_types" not in cfg:
        cfg = {**cfg, "attn_type_list": [1] * n}
    if "attn_type_list" in cfg:
        raw = cfg["attn_type_list"]
        if not isinstance(raw, list) or len(raw) != n or any(t not in (0, 1) for t in raw):
            raise ConfigError(f"config field 'attn_type_list' must list {n} entries of 0 (lightning) or 1 (softmax)")
        mixers = [FULL_ATTENTION if t == 1 else LINEAR_ATTENTION for t in raw]
    else:
        raw = cfg.get("layer_types")
        if not isinstance(raw, list) or len(raw) != n or any(t not in (FULL_ATTENTION, LINEAR_ATTENTION) for t in raw):
            raise ConfigError(f"config field 'attn_type_list' (or 'layer_types') must list {n} layer kinds")
        mixers = list(raw)
    width = req_int(cfg, "intermediate_size")
    if cfg.get("attention_bias"):
        raise ConfigError("config field 'attention_bias' = true is not supported for minimax; allowed: false")
    norm = cfg.get("qk_norm_type", "per_layer")
    if cfg.get("use_qk_norm") and norm not in ("per_layer", "per_head"):
        raise ConfigError(f"config field 'qk_norm_type' = {norm!r} is not supported; allowed: per_layer, per_head")
    layers = _layers(mixers, ["gqa" if m == FULL_ATTENTION else "lightning" for m in mixers], [MOE] * n)
    mtp = (opt_int(cfg, "num_mtp_modules", 0, minimum=0) * opt_int(cfg, "mtp_transformer_layers", 1, minimum=0)
           if cfg.get("use_mtp") else 0)
    return dict(
        **_gqa_fields(cfg), **_moe_common(cfg, "num_local_experts"),
        qk_norm=opt_bool(cfg, "use_qk_norm", False), qk_norm_full=norm == "per_layer",
        router_bias=opt_bool(cfg, "use_routing_bias", False),
        moe_intermediate_size=width, intermediate_size=width, layers=layers,
        mtp_layers=mtp_layers(n, mtp, layers[-1]),
    )
