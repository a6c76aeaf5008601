"""OLMoE: MHA/GQA attention with q/k RMSNorm over the whole projection, a MoE FFN in every layer (no shared expert).

Rules: transformers ``src/transformers/models/olmoe/modeling_olmoe.py`` @f321adbcdc61 (``OlmoeAttention``: ``q_norm`` RMSNorm of
``hidden_size``, ``k_norm`` of ``num_key_value_heads x head_dim``, biases when ``attention_bias``;
``OlmoeSparseMoeBlock``: ``num_experts`` SwiGLU experts of ``intermediate_size``, top ``num_experts_per_tok``).
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import FULL_ATTENTION, MOE, _gqa_fields, _layers, _moe_common, opt_bool, req_int

MODEL_TYPES = ("olmoe",)
ARCHITECTURES = ("OlmoeForCausalLM",)
EXAMPLE = "olmoe-1b-7b"
SOURCE = "transformers src/transformers/models/olmoe/modeling_olmoe.py @f321adbcdc61"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_experts",
                   "num_experts_per_tok", "attention_bias", "clip_qkv", "hidden_act"})
IGNORES = frozenset()
KNOBS = {"moe_intermediate_size": "intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "num_experts"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of an OLMoE config."""
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    width = req_int(cfg, "intermediate_size")
    bias = opt_bool(cfg, "attention_bias", False)
    return dict(**_gqa_fields(cfg), **_moe_common(cfg, "num_experts"), qk_norm=True, qk_norm_full=True,
                attention_bias=bias, o_bias=bias, moe_intermediate_size=width, intermediate_size=width,
                layers=_layers([FULL_ATTENTION] * n, ["gqa"] * n, [MOE] * n))
