"""Qwen3-Next and Qwen3.5's language model (MoE, or dense: ``qwen3_5_text`` without experts): Gated DeltaNet linear
attention with gated full attention.

Rules (transformers ``src/transformers/models/qwen3_next/configuration_qwen3_next.py`` @249ef8164cfb, ``layer_types`` default:
``full_attention`` if ``(i + 1) % full_attention_interval == 0`` else ``linear_attention``;
``modeling_qwen3_next.py``: MoE by the Qwen3-MoE rule, a sigmoid-gated shared expert; Qwen3.5:
``qwen3_5_moe/configuration_qwen3_5_moe.py`` the same rule, ``attn_output_gate``). MTP layers
(``mtp_num_hidden_layers``, vLLM ``vllm/model_executor/models/qwen3_next_mtp.py``: ``fc`` ``2h x h``, two input
norms, one full-attention MoE decoder layer, a final norm) are counted apart.
Knob ``attention_ratio`` keeps the rule: every ``ratio + 1``-th layer is full attention.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import DENSE, FULL_ATTENTION, MOE, LayerSpec, _from_qwen3_next, opt_bool, opt_int

MODEL_TYPES = ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_text")
ARCHITECTURES = ("Qwen3NextForCausalLM",)
EXAMPLE = "qwen3-next-80b-a3b"
SOURCE = "transformers src/transformers/models/qwen3_next/configuration_qwen3_next.py @249ef8164cfb, modeling_qwen3_next.py @7515843b6175"
READS = frozenset({"layer_types", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                   "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "num_attention_heads",
                   "num_key_value_heads", "head_dim", "intermediate_size", "moe_intermediate_size", "num_experts",
                   "num_experts_per_tok", "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
                   "attention_bias", "attn_output_gate", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings",
                   "hidden_act"})
IGNORES = frozenset({"max_window_layers"})  # used only with use_sliding_window (accepted only false)
#: fields the checkpoints write that change nothing at these values (Qwen3-Next-80B-A3B-Thinking: no sliding window;
#: Qwen3.6: ``output_gate_type: "swish"``, the gate's activation, no effect on shapes)
NEUTRAL = {"use_sliding_window": False, "sliding_window": None, "qkv_bias": False, "use_qk_norm": True,
           "output_gate_type": "swish"}


def _ratio(cfg: dict[str, Any], ratio: int) -> None:
    cfg["full_attention_interval"] = ratio + 1
    cfg.pop("layer_types", None)


def _shared(cfg: dict[str, Any], n: int) -> None:
    cfg["shared_expert_intermediate_size"] = n * int(cfg.get("moe_intermediate_size") or 0)


KNOBS = {"attention_ratio": _ratio, "moe_intermediate_size": "moe_intermediate_size",
         "num_experts_per_tok": "num_experts_per_tok", "num_experts": "num_experts",
         "shared_expert_intermediate_size": "shared_expert_intermediate_size", "shared_experts": _shared,
         "moe_every": "decoder_sparse_step"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Qwen3-Next / Qwen3.5-MoE text config."""
    check_act(cfg)
    dense = cfg.get("model_type") == "qwen3_5_text" and not cfg.get("num_experts")  # Qwen3.5 dense: SwiGLU MLPs
    if dense:
        n = cfg.get("num_hidden_layers")
        cfg = {**cfg, "num_experts": 1, "num_experts_per_tok": 1, "moe_intermediate_size": 1,
               "shared_expert_intermediate_size": 0, "mlp_only_layers": list(range(n)) if isinstance(n, int) else []}
    kw = _from_qwen3_next(cfg)
    if dense:
        kw.update(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0, shared_expert_intermediate_size=0,
                  shared_expert_gate=False)
    if cfg.get("attn_output_gate") is False:
        kw["layers"] = tuple(LayerSpec(l.index, l.mixer, "gqa" if l.attention == "gated_gqa" else l.attention, l.ffn)
                             for l in kw["layers"])
    kw["attention_bias"] = opt_bool(cfg, "attention_bias", False)
    n, mtp = len(kw["layers"]), opt_int(cfg, "mtp_num_hidden_layers", 0, minimum=0)
    kw["mtp_layers"] = tuple(LayerSpec(n + j, FULL_ATTENTION, "gated_gqa" if cfg.get("attn_output_gate", True)
                                       else "gqa", DENSE if dense else MOE, mtp=True) for j in range(mtp))
    return kw
