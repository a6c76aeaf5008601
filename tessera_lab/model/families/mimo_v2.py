"""MiMo-V2-Flash (``mimo_v2_flash``): GQA layers of two shapes, sliding-window and full attention, each with its own
head counts and a value head dim unlike the key's; DeepSeek-V3-style routed experts (no shared expert) after dense
SwiGLU layers.

Rules (sglang ``python/sglang/srt/models/mimo_v2_flash.py`` @dd6f32b07e74, ``MiMoV2DecoderLayer``): a layer is
sliding-window attention when ``hybrid_layer_pattern[i] == 1`` (``swa_num_attention_heads``,
``swa_num_key_value_heads``, ``swa_head_dim``, ``swa_v_head_dim``, window ``sliding_window_size``, per-head sink
biases when ``add_swa_attention_sink_bias``), else full attention (``num_attention_heads``, ``num_key_value_heads``,
``head_dim``, ``v_head_dim``; sinks when ``add_full_attention_sink_bias``); ``MiMoV2Attention``: q and k of
``head_dim``, v and o of ``v_head_dim``, no q/k norm, biases when ``attention_bias``. A layer is MoE when
``moe_layer_freq[i]`` is set (``MiMoV2MoE``: ``n_routed_experts`` SwiGLU experts of ``moe_intermediate_size``, top
``num_experts_per_tok``, a router with a score-correction bias for ``topk_method = noaux_tc``), else a dense SwiGLU
MLP of ``intermediate_size``. ``attention_value_scale``, ``swa_rope_theta`` and ``partial_rotary_factor`` change
values, not shapes; ``attention_chunk_size`` is not read by the reference.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, MOE, LayerSpec, _moe_common, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("mimo_v2_flash",)
ARCHITECTURES = ("MiMoV2FlashForCausalLM",)
EXAMPLE = "mimo-v2-flash (bring the config.json)"
SOURCE = "sglang python/sglang/srt/models/mimo_v2_flash.py @dd6f32b07e74"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "v_head_dim", "swa_num_attention_heads",
                   "swa_num_key_value_heads", "swa_head_dim", "swa_v_head_dim", "sliding_window",
                   "sliding_window_size", "hybrid_layer_pattern", "moe_layer_freq", "intermediate_size",
                   "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
                   "attention_bias", "add_swa_attention_sink_bias", "add_full_attention_sink_bias", "hidden_act"})
IGNORES = frozenset({"swa_rope_theta", "attention_value_scale", "layernorm_epsilon", "attention_chunk_size"})
#: no shared expert (MiMoV2MoE has none): null or 0 only
NEUTRAL = {"n_shared_experts": (None, 0)}
KNOBS = {"moe_intermediate_size": "moe_intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "n_routed_experts"}


def _flags(cfg: Mapping[str, Any], key: str, n: int) -> list[int]:
    """A per-layer list of 0/1 (``hybrid_layer_pattern``, ``moe_layer_freq``) of ``n`` entries."""
    v = cfg.get(key)
    if not isinstance(v, list) or len(v) != n or any(type(x) is not int or x not in (0, 1) for x in v):
        raise ConfigError(f"config field '{key}' must list {n} entries of 0 or 1")
    return v


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a MiMo-V2-Flash config (rules in the module docstring)."""
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    swa, moe = _flags(cfg, "hybrid_layer_pattern", n), _flags(cfg, "moe_layer_freq", n)
    window = opt_int(cfg, "sliding_window_size", 0) or req_int(cfg, "sliding_window")
    hd = req_int(cfg, "head_dim")
    full = dict(heads=req_int(cfg, "num_attention_heads"), kv_heads=req_int(cfg, "num_key_value_heads"),
                head_dim=hd, v_head_dim=opt_int(cfg, "v_head_dim", hd),
                sinks=opt_bool(cfg, "add_full_attention_sink_bias", False))
    shd = req_int(cfg, "swa_head_dim")
    local = dict(heads=req_int(cfg, "swa_num_attention_heads"), kv_heads=req_int(cfg, "swa_num_key_value_heads"),
                 head_dim=shd, v_head_dim=opt_int(cfg, "swa_v_head_dim", shd),
                 sinks=opt_bool(cfg, "add_swa_attention_sink_bias", False), window=window, local="sliding")
    for shape in (full, local):
        if shape["heads"] % shape["kv_heads"]:
            raise ConfigError(f"config field 'num_key_value_heads' = {shape['kv_heads']} must divide the "
                              f"attention heads = {shape['heads']}")
    layers = tuple(LayerSpec(i, FULL_ATTENTION, "gqa", MOE if moe[i] else DENSE, **(local if swa[i] else full))
                   for i in range(n))
    bias = opt_bool(cfg, "attention_bias", False)
    return dict(**_moe_common(cfg, "n_routed_experts"), num_attention_heads=full["heads"],
                num_key_value_heads=full["kv_heads"], head_dim=hd, attention_bias=bias,
                moe_intermediate_size=req_int(cfg, "moe_intermediate_size"),
                intermediate_size=req_int(cfg, "intermediate_size"),
                router_bias=cfg.get("topk_method") == "noaux_tc", n_group=opt_int(cfg, "n_group", 1),
                topk_group=opt_int(cfg, "topk_group", 1), layers=layers)
