"""Gemma-4's language model (``gemma4_text``; the ``gemma4`` multimodal wrapper's ``text_config``): GQA layers of two
shapes, sliding-window and global; in the MoE models (``enable_moe_block``) every layer has a dense MLP beside its
routed experts.

Rules (transformers ``src/transformers/models/gemma4/configuration_gemma4.py`` @351f643ab9f5, ``Gemma4TextConfig``:
``layer_types`` default ``sliding_attention`` if ``(i + 1) % 6`` else ``full_attention``, the last layer forced to
``full_attention``; ``modeling_gemma4.py`` @c308a309e651):

* ``Gemma4TextAttention``: sliding layers attend ``sliding_window`` keys with ``num_key_value_heads`` heads of
  ``head_dim``; global layers use ``global_head_dim`` (when set) and, with ``attention_k_eq_v``,
  ``num_global_key_value_heads`` (default ``num_key_value_heads``) and no ``v_proj`` (the values are the keys);
  ``q_norm`` and ``k_norm`` RMSNorms of the head dim, ``v_norm`` without weights; biases when ``attention_bias``.
* ``Gemma4TextMLP``: gate, up and down projections of ``intermediate_size`` (GELU-tanh gated: SwiGLU's shapes and
  GEMMs, counted as the gated MLP).
* ``enable_moe_block``: ``Gemma4TextRouter`` (``proj`` ``h x num_experts``) picks ``top_k_experts`` of
  ``num_experts`` experts (gate-up ``2 moe_intermediate_size x h``, down) and the layer adds their output to the
  dense MLP's, which every token runs: it is counted as the layer's shared expert (the model card: "8 active / 128
  total experts + 1 shared"). Without it a layer has the dense MLP only.

Norms the cost model does not count (a layer's two extra RMSNorms of ``h``, three more with MoE, the router's
``scale`` ``h`` and ``per_expert_scale`` ``E``): 0.002% of Gemma-4-26B-A4B. Refused: per-layer input embeddings
(``hidden_size_per_layer_input`` > 0, the default 256 included: Gemma-4 E2B/E4B), layers that reuse another layer's
keys and values (``num_kv_shared_layers`` > 0) and bidirectional text attention (``use_bidirectional_attention``
``all``). ``tie_word_embeddings`` defaults to true (``Gemma4TextConfig``).
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.families.unsupported import refuse as refuse_feature
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, MOE, LayerSpec, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("gemma4_text",)
ARCHITECTURES = ("Gemma4ForCausalLM",)
EXAMPLE = "gemma-4-26b-a4b (bring the config.json)"
SOURCE = ("transformers src/transformers/models/gemma4/modeling_gemma4.py @c308a309e651, "
          "configuration_gemma4.py @351f643ab9f5")
READS = frozenset({"num_attention_heads", "num_key_value_heads", "head_dim", "global_head_dim",
                   "num_global_key_value_heads", "attention_k_eq_v", "layer_types", "sliding_window",
                   "intermediate_size", "enable_moe_block", "num_experts", "top_k_experts", "moe_intermediate_size",
                   "attention_bias", "hidden_activation", "hidden_size_per_layer_input"})
#: final_logit_softcapping: a tanh on the logits; vocab_size_per_layer_input: only with per-layer inputs (refused)
IGNORES = frozenset({"final_logit_softcapping", "vocab_size_per_layer_input"})
#: no layer reuses another's keys and values; no double-wide MLP (only on such layers); text attention causal
#: (``vision``: image tokens attend each other both ways, text causally); ``expert_intermediate_size`` null
NEUTRAL = {"num_kv_shared_layers": 0, "use_double_wide_mlp": False, "use_bidirectional_attention": (None, "vision"),
           "expert_intermediate_size": None}


def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    cfg["num_hidden_layers"] = n
    cfg.pop("layer_types", None)  # the default 5:1 rule


KNOBS = {"num_layers": _layers_knob, "window": "sliding_window", "moe_intermediate_size": "moe_intermediate_size",
         "num_experts_per_tok": "top_k_experts", "num_experts": "num_experts"}


def layer_types(cfg: Mapping[str, Any], n: int) -> list[str]:
    """``Gemma4TextConfig.__post_init__``: the given list (``n`` entries) or every 6th layer global, and the last
    layer global either way."""
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in ("sliding_attention", "full_attention")
                                                              for t in types):
        raise ConfigError(f"config field 'layer_types' must list {n} entries of 'sliding_attention' or "
                          "'full_attention'")
    return types[:-1] + ["full_attention"]


def _refuse_features(cfg: Mapping[str, Any]) -> None:
    """Per-layer input embeddings: a feature the cost model does not have (refused by name)."""
    if opt_int(cfg, "hidden_size_per_layer_input", 256, minimum=0):
        raise refuse_feature(cfg.get("model_type"), "Gemma-4's per-layer input embeddings "
                             "(hidden_size_per_layer_input > 0, its default 256: a second embedding table feeding "
                             "every layer)")


def _attention_shapes(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sliding and the global layers' :class:`LayerSpec` fields (head counts, head dims, window, k = v)."""
    nh, hd = req_int(cfg, "num_attention_heads"), opt_int(cfg, "head_dim", 256)
    nkv = opt_int(cfg, "num_key_value_heads", 4)  # Gemma4TextConfig's defaults
    k_eq_v = opt_bool(cfg, "attention_k_eq_v", False)
    gkv = opt_int(cfg, "num_global_key_value_heads", nkv) if k_eq_v else nkv
    local = dict(heads=nh, kv_heads=nkv, head_dim=hd, window=opt_int(cfg, "sliding_window", 512), local="sliding")
    glob = dict(heads=nh, kv_heads=gkv, head_dim=opt_int(cfg, "global_head_dim", 512, minimum=0) or hd,
                k_eq_v=k_eq_v)
    for key, kv in (("num_key_value_heads", nkv), ("num_global_key_value_heads", gkv)):
        if nh % kv:
            raise ConfigError(f"config field '{key}' = {kv} must divide num_attention_heads = {nh}")
    return local, glob


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Gemma-4 text config (rules in the module docstring)."""
    check_act(cfg, "hidden_activation", ("gelu_pytorch_tanh", "gelu"))
    _refuse_features(cfg)
    n = req_int(cfg, "num_hidden_layers")
    local, glob = _attention_shapes(cfg)
    moe = opt_bool(cfg, "enable_moe_block", False)
    width = req_int(cfg, "intermediate_size")
    layers = tuple(LayerSpec(i, FULL_ATTENTION, "gqa", MOE if moe else DENSE,
                             **(local if t == "sliding_attention" else glob))
                   for i, t in enumerate(layer_types(cfg, n)))
    bias = opt_bool(cfg, "attention_bias", False)
    kw: dict[str, Any] = dict(
        num_attention_heads=local["heads"], num_key_value_heads=local["kv_heads"], head_dim=local["head_dim"],
        qk_norm=True, attention_bias=bias, o_bias=bias, intermediate_size=width, layers=layers,
        tie_word_embeddings=opt_bool(cfg, "tie_word_embeddings", True))
    if moe:  # the dense MLP beside the experts: every token runs it, as a shared expert
        E = req_int(cfg, "num_experts")
        k = req_int(cfg, "top_k_experts", allowed=f"1 to num_experts = {E}")
        if k > E:
            raise ConfigError(f"config field 'top_k_experts' = {k} is out of range; allowed: 1 to num_experts = {E}")
        kw.update(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=req_int(cfg, "moe_intermediate_size"),
                  shared_expert_intermediate_size=width)
    return kw
