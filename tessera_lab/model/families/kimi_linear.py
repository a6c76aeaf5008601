"""Kimi-Linear: Kimi Delta Attention (KDA) linear attention with MLA full attention, DeepSeek-V3-style MoE.

Rules (vLLM ``vllm/transformers_utils/configs/kimi_linear.py`` @6b06599499a6 ``KimiLinearConfig.is_kda_layer`` and the
checkpoint's ``configuration_kimi.py``): ``linear_attn_config["kda_layers"]`` and ``["full_attn_layers"]`` list
**1-based** layer numbers: layer ``i`` (0-based) is KDA when ``i + 1`` is in ``kda_layers``, else MLA (NoPE when
``mla_use_nope``; no effect on the counts). KDA: ``num_heads`` heads of ``head_dim`` (keys and values), short
convolutions of ``short_conv_kernel_size`` (shapes in :mod:`tessera_lab.model.kinds`, from flash-linear-attention
``fla/layers/kda.py`` as vLLM ``vllm/model_executor/models/kimi_linear.py`` @8744bb0924a5 loads it). FFN (``KimiDecoderLayer`` there): MoE when
``i >= first_k_dense_replace`` and ``i % moe_layer_freq == 0`` (DeepSeek-V3's rule), ``num_experts`` of
``moe_intermediate_size``, top ``num_experts_per_token``, ``num_shared_experts`` shared experts, a sigmoid router
with a score-correction bias; else a dense SwiGLU of ``intermediate_size``.
Knob ``attention_ratio`` keeps the published placement (layers 4, 8, ..., 24 and the last, 27): MLA at every
``ratio + 1``-th layer and at the last layer.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.deepseek import mtp_layers
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MOE, _layers, opt_int, req_int,
)

MODEL_TYPES = ("kimi_linear",)
ARCHITECTURES = ("KimiLinearForCausalLM",)
EXAMPLE = "kimi-linear-48b-a3b"
SOURCE = "vLLM vllm/transformers_utils/configs/kimi_linear.py @6b06599499a6, vllm/model_executor/models/kimi_linear.py @8744bb0924a5"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "kv_lora_rank", "q_lora_rank",
                   "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mla_use_nope", "linear_attn_config",
                   "intermediate_size", "num_experts", "num_experts_per_token", "num_shared_experts",
                   "moe_intermediate_size", "num_expert_group", "topk_group", "first_k_dense_replace",
                   "moe_layer_freq", "num_nextn_predict_layers", "hidden_act"})
IGNORES = frozenset()


def _lac(cfg: Mapping[str, Any]) -> dict[str, Any]:
    lac = cfg.get("linear_attn_config")
    if not isinstance(lac, Mapping):
        raise ConfigError("config field 'linear_attn_config' is missing; allowed: an object with kda_layers, "
                          "num_heads, head_dim, short_conv_kernel_size")
    return dict(lac)


def _ratio(cfg: dict[str, Any], ratio: int) -> None:
    n = int(cfg["num_hidden_layers"])
    full = [i for i in range(1, n + 1) if i % (ratio + 1) == 0 or i == n]
    lac = _lac(cfg)
    lac["kda_layers"] = [i for i in range(1, n + 1) if i not in full]
    lac["full_attn_layers"] = full
    cfg["linear_attn_config"] = lac


def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    lac = _lac(cfg)
    old = int(cfg["num_hidden_layers"])
    full = len([i for i in range(1, old + 1) if i not in set(lac.get("kda_layers") or [])])
    ratio = max(0, (old - full) // max(full, 1))
    cfg["num_hidden_layers"] = n
    _ratio(cfg, ratio)


KNOBS = {"attention_ratio": _ratio, "num_layers": _layers_knob, "moe_intermediate_size": "moe_intermediate_size",
         "num_experts_per_tok": "num_experts_per_token", "num_experts": "num_experts",
         "shared_experts": "num_shared_experts", "moe_every": "moe_layer_freq"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Kimi-Linear config (rules in the module docstring)."""
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    lac = _lac(cfg)
    kda = lac.get("kda_layers") or []
    if not isinstance(kda, list) or any(not isinstance(i, int) or not 1 <= i <= n for i in kda):
        raise ConfigError(f"config field 'linear_attn_config.kda_layers' must list 1-based layer numbers in 1..{n}")
    kda_set = set(kda)
    full = lac.get("full_attn_layers")
    if full is not None:
        if not isinstance(full, list) or any(not isinstance(i, int) or not 1 <= i <= n for i in full):
            raise ConfigError(f"config field 'linear_attn_config.full_attn_layers' must list 1-based layer numbers "
                              f"in 1..{n}")
        both = sorted(kda_set & set(full))
        if both:
            raise ConfigError(f"config field 'linear_attn_config' lists layer {both[0]} (1-based) in both kda_layers "
                              "and full_attn_layers; allowed: each layer in one of them")
    mixers = [LINEAR_ATTENTION if i + 1 in kda_set else FULL_ATTENTION for i in range(n)]
    E = req_int(cfg, "num_experts")
    k = req_int(cfg, "num_experts_per_token")
    if k > E:
        raise ConfigError(f"config field 'num_experts_per_token' = {k} is out of range; allowed: 1 to num_experts = {E}")
    first = opt_int(cfg, "first_k_dense_replace", 0, minimum=0)
    freq = opt_int(cfg, "moe_layer_freq", 1)
    ffns = [MOE if i >= first and i % freq == 0 else DENSE for i in range(n)]
    layers = _layers(mixers, ["kda" if m == LINEAR_ATTENTION else "mla" for m in mixers], ffns)
    H = req_int(lac, "num_heads")
    d = req_int(lac, "head_dim")
    width = req_int(cfg, "moe_intermediate_size")
    return dict(
        num_attention_heads=req_int(cfg, "num_attention_heads"),
        num_key_value_heads=req_int(cfg, "num_attention_heads"),  # MLA: every head has its own k and v
        head_dim=req_int(cfg, "qk_nope_head_dim") + req_int(cfg, "qk_rope_head_dim"),
        q_lora_rank=opt_int(cfg, "q_lora_rank", 0, minimum=0) or None,
        kv_lora_rank=req_int(cfg, "kv_lora_rank"),
        qk_nope_head_dim=req_int(cfg, "qk_nope_head_dim"), qk_rope_head_dim=req_int(cfg, "qk_rope_head_dim"),
        v_head_dim=req_int(cfg, "v_head_dim"),
        linear_num_key_heads=H, linear_num_value_heads=H, linear_key_head_dim=d, linear_value_head_dim=d,
        linear_conv_kernel_dim=req_int(lac, "short_conv_kernel_size"),
        intermediate_size=req_int(cfg, "intermediate_size"),
        moe_intermediate_size=width, num_experts=E, num_experts_per_tok=k,
        shared_expert_intermediate_size=opt_int(cfg, "num_shared_experts", 0, minimum=0) * width,
        router_bias=True,  # KimiMoEGate.e_score_correction_bias
        n_group=opt_int(cfg, "num_expert_group", 1), topk_group=opt_int(cfg, "topk_group", 1),
        layers=layers,
        mtp_layers=mtp_layers(n, opt_int(cfg, "num_nextn_predict_layers", 0, minimum=0), layers[-1]),
    )
