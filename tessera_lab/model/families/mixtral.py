"""Mixtral: GQA attention (optionally sliding-window) and a MoE FFN of ``num_local_experts`` SwiGLU experts of width
``intermediate_size`` in every layer.

Rules: transformers ``src/transformers/models/mixtral/modeling_mixtral.py`` @00d4b3d2142c (``MixtralSparseMoeBlock``; the
attention's ``sliding_window`` masks every layer when set).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import _from_mixtral, opt_int

MODEL_TYPES = ("mixtral",)
ARCHITECTURES = ("MixtralForCausalLM",)
EXAMPLE = "mixtral-8x7b (bring the config.json)"
SOURCE = "transformers src/transformers/models/mixtral/modeling_mixtral.py @00d4b3d2142c"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts",
                   "num_experts_per_tok", "sliding_window", "hidden_act"})
IGNORES = frozenset()
KNOBS = {"moe_intermediate_size": "intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "num_local_experts", "window": "sliding_window"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Mixtral config."""
    check_act(cfg)
    kw = _from_mixtral(cfg)
    window = opt_int(cfg, "sliding_window", 0, minimum=0)
    if window:
        kw["layers"] = tuple(dataclasses.replace(l, window=window, local="sliding") for l in kw["layers"])
    return kw
