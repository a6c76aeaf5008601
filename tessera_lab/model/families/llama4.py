"""Llama 4's language model (``llama4_text``; the ``llama4`` multimodal wrapper's ``text_config``): chunked local
attention on RoPE layers and full attention on the NoPE layers, MoE (routed + one shared expert) every
``interleave_moe_layer_step`` layers, dense SwiGLU MLPs of ``intermediate_size_mlp`` elsewhere.

Rules (transformers ``src/transformers/models/llama4/configuration_llama4.py`` @b17cfe48c5a9: ``no_rope_layers``
default ``int((i + 1) % no_rope_layer_interval != 0)`` (1 = RoPE; ``[]`` means the default), ``moe_layers`` default
``range(interleave_moe_layer_step - 1, n, interleave_moe_layer_step)``; ``modeling_llama4.py`` @63210d0e3b74:
RoPE layers attend within chunks of ``attention_chunk_size`` tokens, NoPE layers attend the whole causal context;
``Llama4TextMoe``: ``num_local_experts`` experts of ``intermediate_size``, top ``num_experts_per_tok``, a shared
expert of ``intermediate_size``, router without bias; the q/k L2 norm has no weights).
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, MOE, LayerSpec, _gqa_fields, _moe_common, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("llama4_text",)
ARCHITECTURES = ("Llama4ForCausalLM",)
EXAMPLE = "llama-4-scout-17b-16e"
SOURCE = "transformers src/transformers/models/llama4/configuration_llama4.py @b17cfe48c5a9, modeling_llama4.py"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                   "intermediate_size_mlp", "num_local_experts", "num_experts_per_tok", "interleave_moe_layer_step",
                   "moe_layers", "no_rope_layers", "no_rope_layer_interval", "attention_chunk_size", "layer_types",
                   "attention_bias", "use_qk_norm", "hidden_act"})
IGNORES = frozenset({"attn_temperature_tuning", "floor_scale", "attn_scale"})


def _moe_every(cfg: dict[str, Any], every: int) -> None:
    cfg["interleave_moe_layer_step"] = every
    cfg.pop("moe_layers", None)


def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    cfg["num_hidden_layers"] = n
    for key in ("moe_layers", "no_rope_layers", "layer_types"):
        cfg.pop(key, None)


KNOBS = {"moe_every": _moe_every, "num_layers": _layers_knob, "window": "attention_chunk_size",
         "moe_intermediate_size": "intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "num_local_experts"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Llama 4 text config (rules in the module docstring)."""
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    interval = opt_int(cfg, "no_rope_layer_interval", 4)
    rope = cfg.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    if not isinstance(rope, list) or len(rope) != n or any(type(r) is not int or r not in (0, 1) for r in rope):
        raise ConfigError(f"config field 'no_rope_layers' must list {n} entries (1: RoPE, 0: NoPE)")
    step = opt_int(cfg, "interleave_moe_layer_step", 1)
    moe_layers = cfg.get("moe_layers")
    if moe_layers is not None and (not isinstance(moe_layers, list) or
                                   any(type(i) is not int or not 0 <= i < n for i in moe_layers)):
        raise ConfigError(f"config field 'moe_layers' must list layer indices in 0..{n - 1}")
    moe_layers = set(range(step - 1, n, step) if moe_layers is None else moe_layers)
    chunk = opt_int(cfg, "attention_chunk_size", 8192)
    types = cfg.get("layer_types")
    if types is not None and (not isinstance(types, list) or len(types) != n):
        raise ConfigError(f"config field 'layer_types' must list {n} entries")
    layers = []
    for i in range(n):
        local = (types[i] == "chunked_attention") if types is not None else bool(rope[i])
        layers.append(LayerSpec(i, FULL_ATTENTION, "gqa", MOE if i in moe_layers else DENSE,
                                window=chunk if local else 0, local="chunked" if local else "", rope=bool(rope[i]),
                                dense_width=0 if i in moe_layers else opt_int(cfg, "intermediate_size_mlp", 16384)))
    width = req_int(cfg, "intermediate_size")
    bias = opt_bool(cfg, "attention_bias", False)
    return dict(**_gqa_fields(cfg), **_moe_common(cfg, "num_local_experts"), attention_bias=bias, o_bias=bias,
                moe_intermediate_size=width, intermediate_size=width, shared_expert_intermediate_size=width,
                layers=tuple(layers))
