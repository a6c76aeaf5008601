"""Jamba: Mamba (Mamba-1) layers with GQA attention every ``attn_layer_period`` layers, MoE every
``expert_layer_period`` layers.

Rules (transformers ``src/transformers/models/jamba/configuration_jamba.py`` @ 161d2bed0075,
``layers_block_type``: ``attention`` if ``i % attn_layer_period == attn_layer_offset`` else ``mamba``;
``layers_num_experts``: ``num_experts`` if ``i % expert_layer_period == expert_layer_offset`` else 1, a dense
SwiGLU MLP of ``intermediate_size``; ``modeling_jamba.py`` ``JambaMambaMixer``: ``d_inner = mamba_expand x h``,
``mamba_dt_rank`` (``auto``: ``ceil(h / 16)``), ``mamba_d_state``, ``mamba_d_conv``, dt/B/C RMSNorms). Experts have
``intermediate_size`` too (``JambaSparseMoeBlock``), no shared expert.
Knob ``attention_ratio``: period ``ratio + 1``, the offset kept inside the period (``min(offset, period - 1)``).
An offset at or past its period (no layer would match) is refused.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MOE, _gqa_fields, _layers, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("jamba",)
ARCHITECTURES = ("JambaForCausalLM",)
EXAMPLE = "jamba-1.5-mini"
SOURCE = "transformers src/transformers/models/jamba/configuration_jamba.py @161d2bed0075, modeling_jamba.py"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "intermediate_size", "num_experts",
                   "num_experts_per_tok", "attn_layer_period", "attn_layer_offset", "expert_layer_period",
                   "expert_layer_offset", "mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank",
                   "mamba_conv_bias", "mamba_proj_bias", "mamba_inner_layernorms", "sliding_window", "hidden_act"})
IGNORES = frozenset({"calc_logits_for_entire_prompt", "n_ctx"})


def _ratio(cfg: dict[str, Any], ratio: int) -> None:
    period = ratio + 1
    cfg["attn_layer_period"] = period
    cfg["attn_layer_offset"] = min(int(cfg.get("attn_layer_offset", 4)), period - 1)


def _moe_every(cfg: dict[str, Any], every: int) -> None:
    cfg["expert_layer_period"] = every
    cfg["expert_layer_offset"] = min(int(cfg.get("expert_layer_offset", 1)), every - 1)


KNOBS = {"attention_ratio": _ratio, "moe_every": _moe_every, "moe_intermediate_size": "intermediate_size",
         "num_experts_per_tok": "num_experts_per_tok", "num_experts": "num_experts"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Jamba config (rules in the module docstring)."""
    check_act(cfg)
    if cfg.get("sliding_window"):
        raise ConfigError("config field 'sliding_window' is set; allowed for jamba: null (no released Jamba uses it)")
    n, h = req_int(cfg, "num_hidden_layers"), req_int(cfg, "hidden_size")
    ap, ao = opt_int(cfg, "attn_layer_period", 8), opt_int(cfg, "attn_layer_offset", 4, minimum=0)
    ep, eo = opt_int(cfg, "expert_layer_period", 2), opt_int(cfg, "expert_layer_offset", 1, minimum=0)
    for name, period, offset in (("attn_layer", ap, ao), ("expert_layer", ep, eo)):
        if offset >= period:  # i % period never equals it: a model with no attention (no MoE) layer at all
            raise ConfigError(f"config field '{name}_offset' = {offset} is out of range for '{name}_period' = "
                              f"{period}; allowed: 0 to {period - 1}")
    E = opt_int(cfg, "num_experts", 16)
    k = opt_int(cfg, "num_experts_per_tok", 2)
    if k > E:
        raise ConfigError(f"config field 'num_experts_per_tok' = {k} is out of range; allowed: 1 to num_experts = {E}")
    mixers = [FULL_ATTENTION if i % ap == ao else LINEAR_ATTENTION for i in range(n)]
    ffns = [MOE if (E > 1 and i % ep == eo) else DENSE for i in range(n)]
    dt_rank = cfg.get("mamba_dt_rank", "auto")
    dt_rank = math.ceil(h / 16) if dt_rank == "auto" else req_int(cfg, "mamba_dt_rank")
    width = req_int(cfg, "intermediate_size")
    return dict(
        **_gqa_fields(cfg), num_experts=E if MOE in ffns else 0, num_experts_per_tok=k if MOE in ffns else 0,
        moe_intermediate_size=width, intermediate_size=width,
        mamba_d_inner=opt_int(cfg, "mamba_expand", 2) * h, ssm_state_size=opt_int(cfg, "mamba_d_state", 16),
        mamba_conv_kernel=opt_int(cfg, "mamba_d_conv", 4), mamba_dt_rank=dt_rank,
        mamba_conv_bias=opt_bool(cfg, "mamba_conv_bias", True), mamba_proj_bias=opt_bool(cfg, "mamba_proj_bias", False),
        mamba_bcdt_norms=opt_bool(cfg, "mamba_inner_layernorms", True),  # Jamba v0.1 names them
        layers=_layers(mixers, ["gqa" if m == FULL_ATTENTION else "mamba" for m in mixers], ffns),
    )
