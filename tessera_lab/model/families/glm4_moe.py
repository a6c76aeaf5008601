"""GLM-4.5 / GLM-4.5-Air (``glm4_moe``): GQA attention with q/k/v biases and optional per-head q/k norm; dense
SwiGLU MLP in the first ``first_k_dense_replace`` layers, then DeepSeek-V3-style MoE (routed + shared experts,
sigmoid scores with a correction bias, group-limited top-k); ``num_nextn_predict_layers`` MTP layers.

Rules: transformers ``src/transformers/models/glm4_moe/modeling_glm4_moe.py`` @a0699c971daf (``Glm4MoeAttention``: q, k, v
``bias=config.attention_bias``, o without bias, ``q_norm``/``k_norm`` when ``use_qk_norm``;
``Glm4MoeDecoderLayer``: ``Glm4MoeMoE`` if ``layer_idx >= config.first_k_dense_replace`` else ``Glm4MoeMLP``).
The MTP layer (stored as layer ``num_hidden_layers``, as DeepSeek-V3's) is counted apart: the card's 106B excludes it.
GLM-4.5V / 4.6V's language model (``glm4v_moe_text``, the ``glm4v_moe`` wrapper's ``text_config``) is the same decoder:
transformers ``src/transformers/models/glm4v_moe/modular_glm4v_moe.py`` @28f64d214c42 (``Glm4vMoeTextConfig``
subclasses ``Glm4MoeConfig``; ``Glm4MoeDecoderLayer``, ``Glm4MoeMoE``; attention ``Glm4Attention`` with q/k/v biases and
multimodal RoPE sections, no q/k norm).
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.model.families.deepseek import mtp_layers
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, MOE, _gqa_fields, _layers, _moe_common, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("glm4_moe", "glm4v_moe_text")
ARCHITECTURES = ("Glm4MoeForCausalLM",)
EXAMPLE = "glm-4.5-air"
SOURCE = "transformers src/transformers/models/glm4_moe/modeling_glm4_moe.py @a0699c971daf"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "attention_bias", "use_qk_norm",
                   "intermediate_size", "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                   "n_shared_experts", "first_k_dense_replace", "n_group", "topk_group", "num_nextn_predict_layers",
                   "hidden_act"})
IGNORES = frozenset()
KNOBS = {"moe_intermediate_size": "moe_intermediate_size", "num_experts_per_tok": "num_experts_per_tok",
         "num_experts": "n_routed_experts", "shared_experts": "n_shared_experts"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a GLM-4.5 config (rules in the module docstring)."""
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    moe = _moe_common(cfg, "n_routed_experts")
    first_dense = opt_int(cfg, "first_k_dense_replace", 0, minimum=0)
    width = req_int(cfg, "moe_intermediate_size")
    layers = _layers([FULL_ATTENTION] * n, ["gqa"] * n, [MOE if i >= first_dense else DENSE for i in range(n)])
    bias = opt_bool(cfg, "attention_bias", False)
    return dict(
        **_gqa_fields(cfg), **moe,
        qk_norm=opt_bool(cfg, "use_qk_norm", False),
        attention_bias=bias,
        intermediate_size=req_int(cfg, "intermediate_size"),
        moe_intermediate_size=width,
        shared_expert_intermediate_size=opt_int(cfg, "n_shared_experts", 0, minimum=0) * width,
        router_bias=True,  # Glm4MoeTopkRouter.e_score_correction_bias
        n_group=opt_int(cfg, "n_group", 1), topk_group=opt_int(cfg, "topk_group", 1),
        layers=layers,
        mtp_layers=mtp_layers(n, opt_int(cfg, "num_nextn_predict_layers", 0, minimum=0), layers[-1]),
    )
