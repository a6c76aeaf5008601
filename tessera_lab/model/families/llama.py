"""Llama (Llama 2, Llama 3, Llama 3.1 and the dense checkpoints that reuse ``LlamaForCausalLM``): GQA attention with
RoPE and no q/k norm, and a dense SwiGLU MLP of width ``intermediate_size`` in every layer.

Rules: transformers ``src/transformers/models/llama/modeling_llama.py`` @00d4b3d2142c (``LlamaDecoderLayer``:
``LlamaAttention``, whose q/k/v/o projections carry a bias when ``attention_bias``, and ``LlamaMLP``, whose three
projections carry one when ``mlp_bias``). RoPE scaling (``rope_scaling``, Llama 3.1's ``llama3`` type) changes the
rotary frequencies, not the shapes, so it is ignored as for every family.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import DENSE, FULL_ATTENTION, _gqa_fields, _layers, opt_bool, req_int

MODEL_TYPES = ("llama",)
ARCHITECTURES = ("LlamaForCausalLM",)
EXAMPLE = "llama-3.1-70b"
SOURCE = "transformers src/transformers/models/llama/modeling_llama.py @00d4b3d2142c"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "attention_bias",
                   "hidden_act"})
IGNORES = frozenset()
#: the MLP bias (three small vectors per layer) is not in the layer decomposition: accepted only where it is absent
NEUTRAL = {"mlp_bias": False}
KNOBS: dict[str, Any] = {}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Llama config (rules in the module docstring).

    Raises:
        ConfigError: ``hidden_act`` other than ``silu``; a missing or non-positive ``num_hidden_layers``,
            ``num_attention_heads`` or ``intermediate_size``.
    """
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    kw = dict(**_gqa_fields(cfg), qk_norm=False, intermediate_size=req_int(cfg, "intermediate_size"),
              layers=_layers([FULL_ATTENTION] * n, ["gqa"] * n, [DENSE] * n))
    kw["attention_bias"] = kw["o_bias"] = opt_bool(cfg, "attention_bias", False)
    return kw
