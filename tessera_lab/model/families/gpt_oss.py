"""gpt-oss: GQA attention alternating sliding-window and full layers, with learned attention sinks and biases; a
MoE FFN of biased SwiGLU experts in every layer (router with a bias, no shared expert).

Rules (transformers ``src/transformers/models/gpt_oss/configuration_gpt_oss.py`` @828a27fd326e: ``layer_types``
default ``sliding_attention`` if ``(i + 1) % 2`` else ``full_attention``, window ``sliding_window``;
``modeling_gpt_oss.py`` @6edf5b311854: ``GptOssAttention`` q/k/v/o with ``bias=config.attention_bias`` and
``sinks`` (one per head); ``GptOssExperts`` ``gate_up_proj`` ``(E, h, 2I)`` + bias, ``down_proj`` ``(E, I, h)`` +
bias; ``GptOssTopKRouter`` weight ``(E, h)`` + bias; ``num_local_experts``, top ``num_experts_per_tok``).
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import FULL_ATTENTION, MOE, LayerSpec, _gqa_fields, _moe_common, opt_bool, req_int

MODEL_TYPES = ("gpt_oss",)
ARCHITECTURES = ("GptOssForCausalLM",)
EXAMPLE = "gpt-oss-20b"
SOURCE = "transformers src/transformers/models/gpt_oss/configuration_gpt_oss.py @828a27fd326e, modeling_gpt_oss.py"
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_local_experts",
                   "num_experts_per_tok", "experts_per_token", "layer_types", "sliding_window", "attention_bias",
                   "hidden_act"})
IGNORES = frozenset()


def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    cfg["num_hidden_layers"] = n
    cfg.pop("layer_types", None)  # the default alternation


def _top_k_knob(cfg: dict[str, Any], k: int) -> None:
    """The released config spells top-k twice (``experts_per_token`` and ``num_experts_per_tok``, checked equal):
    the knob sets both."""
    cfg["num_experts_per_tok"] = k
    if "experts_per_token" in cfg:
        cfg["experts_per_token"] = k


KNOBS = {"num_layers": _layers_knob, "window": "sliding_window", "moe_intermediate_size": "intermediate_size",
         "num_experts_per_tok": _top_k_knob, "num_experts": "num_local_experts"}


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a gpt-oss config (rules in the module docstring)."""
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in ("sliding_attention", "full_attention")
                                                              for t in types):
        raise ConfigError(f"config field 'layer_types' must list {n} entries of 'sliding_attention' or 'full_attention'")
    window = req_int(cfg, "sliding_window")
    if "experts_per_token" in cfg and cfg.get("experts_per_token") != cfg.get("num_experts_per_tok", cfg["experts_per_token"]):
        raise ConfigError("config fields 'experts_per_token' and 'num_experts_per_tok' disagree; allowed: equal")
    layers = tuple(LayerSpec(i, FULL_ATTENTION, "gqa", MOE, window=window if t == "sliding_attention" else 0,
                             local="sliding" if t == "sliding_attention" else "") for i, t in enumerate(types))
    bias = opt_bool(cfg, "attention_bias", True)
    width = req_int(cfg, "intermediate_size")
    return dict(**_gqa_fields(cfg), **_moe_common(cfg, "num_local_experts"), attention_bias=bias, o_bias=bias,
                attention_sinks=True, moe_intermediate_size=width, intermediate_size=width, expert_bias=True,
                router_linear_bias=True, layers=layers)
