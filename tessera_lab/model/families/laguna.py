"""Laguna (poolside): GQA layers, sliding-window or global, each with its own query-head count and a head-wise output
gate; a dense SwiGLU first layer, then MoE with a shared expert.

Rules (transformers ``src/transformers/models/laguna/configuration_laguna.py`` @dcb0955f5522, ``LagunaConfig``:
``layer_types`` default all ``full_attention``; ``mlp_layer_types`` default ``dense`` then ``sparse``;
``num_attention_heads_per_layer`` default ``num_attention_heads`` everywhere; ``modeling_laguna.py``
@ca5ff0b0d29a):

* ``LagunaAttention``: ``num_attention_heads_per_layer[i]`` query heads, ``num_key_value_heads`` KV heads of
  ``head_dim``, q/k RMSNorms of the head dim, biases on q, k, v and o when ``attention_bias``; ``g_proj``
  ``h x heads`` gives one softplus gate per head, applied to the head's attention output before ``o_proj``; sliding
  layers attend ``sliding_window`` keys.
* ``LagunaSparseMoeBlock`` (``sparse`` layers): ``num_experts`` SwiGLU experts of ``moe_intermediate_size``, top
  ``num_experts_per_tok``; ``LagunaTopKRouter`` weight ``E x h`` and ``e_score_correction_bias`` ``E``; a shared
  expert (``LagunaMLP``) of ``shared_expert_intermediate_size``, ungated. ``dense`` layers: SwiGLU of
  ``intermediate_size``.

``gating: "per-head"`` (the checkpoints write it) is the gate above, the only one the reference has; another value
is refused. ``mlp_only_layers``, when written, must name the ``dense`` layers of ``mlp_layer_types``.
``moe_routed_scaling_factor`` and ``moe_router_logit_softcapping`` scale values, not shapes.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families.qwen3 import check_act
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, MOE, LayerSpec, _moe_common, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("laguna",)
ARCHITECTURES = ("LagunaForCausalLM",)
EXAMPLE = "laguna-xs.2 (bring the config.json)"
SOURCE = ("transformers src/transformers/models/laguna/modeling_laguna.py @ca5ff0b0d29a, "
          "configuration_laguna.py @dcb0955f5522")
READS = frozenset({"num_attention_heads", "num_attention_heads_per_layer", "num_key_value_heads", "head_dim",
                   "layer_types", "sliding_window", "mlp_layer_types", "mlp_only_layers", "intermediate_size",
                   "moe_intermediate_size", "shared_expert_intermediate_size", "num_experts", "num_experts_per_tok",
                   "attention_bias", "hidden_act"})
IGNORES = frozenset({"moe_routed_scaling_factor", "moe_router_logit_softcapping"})
#: the per-head gate every LagunaAttention has; the MoE weights its output (input weighting is not in the
#: reference); no sparse step other than every layer
NEUTRAL = {"gating": (None, "per-head"), "moe_apply_router_weight_on_input": (None, False),
           "decoder_sparse_step": (None, 1)}


def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    """``n`` layers keeping the config's layout: ``layer_types`` and ``num_attention_heads_per_layer`` tiled from
    their first entries (Laguna XS.2: global then three sliding, repeated), ``mlp_layer_types`` kept as far as it
    goes and ``sparse`` after; lists the config does not give keep the reference's defaults."""
    old = cfg.get("num_hidden_layers")
    for key in ("layer_types", "num_attention_heads_per_layer"):
        v = cfg.get(key)
        if isinstance(v, list) and v and len(v) == old:
            cfg[key] = [v[i % len(v)] for i in range(n)]
    v = cfg.get("mlp_layer_types")
    if isinstance(v, list) and len(v) == old:
        cfg["mlp_layer_types"] = (v + ["sparse"] * n)[:n]
        if cfg.get("mlp_only_layers") is not None:
            cfg["mlp_only_layers"] = [i for i, t in enumerate(cfg["mlp_layer_types"]) if t == "dense"]
    cfg["num_hidden_layers"] = n


KNOBS = {"num_layers": _layers_knob, "window": "sliding_window", "moe_intermediate_size": "moe_intermediate_size",
         "num_experts_per_tok": "num_experts_per_tok", "num_experts": "num_experts",
         "shared_expert_intermediate_size": "shared_expert_intermediate_size"}


def _per_layer(cfg: Mapping[str, Any], key: str, n: int, default: list, allowed: tuple | None) -> list:
    """A per-layer list of ``n`` entries (``default`` when absent or null); ``allowed``: its values (``None``:
    integers >= 1)."""
    v = cfg.get(key)
    if v is None:
        return default
    ok = isinstance(v, list) and len(v) == n and all(
        (x in allowed) if allowed else (type(x) is int and x >= 1) for x in v)
    if not ok:
        what = " or ".join(repr(a) for a in allowed) if allowed else "integers >= 1"
        raise ConfigError(f"config field '{key}' must list {n} entries of {what}")
    return v


def _ffns(cfg: Mapping[str, Any], n: int) -> list[str]:
    """``mlp_layer_types`` (default the first layer dense), checked against ``mlp_only_layers`` when written."""
    types = _per_layer(cfg, "mlp_layer_types", n, ["dense"] + ["sparse"] * (n - 1), ("dense", "sparse"))
    only = cfg.get("mlp_only_layers")
    if only is not None and only != [i for i, t in enumerate(types) if t == "dense"]:
        raise ConfigError(f"config fields 'mlp_only_layers' = {only!r} and 'mlp_layer_types' disagree; allowed: "
                          "mlp_only_layers listing the 'dense' layers of mlp_layer_types")
    return [MOE if t == "sparse" else DENSE for t in types]


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Laguna config (rules in the module docstring)."""
    check_act(cfg)
    n = req_int(cfg, "num_hidden_layers")
    nh, hd = req_int(cfg, "num_attention_heads"), opt_int(cfg, "head_dim", 128)
    nkv = opt_int(cfg, "num_key_value_heads", 8)
    heads = _per_layer(cfg, "num_attention_heads_per_layer", n, [nh] * n, None)
    types = _per_layer(cfg, "layer_types", n, ["full_attention"] * n, ("full_attention", "sliding_attention"))
    bad = next((h for h in heads if h % nkv), None)
    if bad is not None:
        raise ConfigError(f"config field 'num_key_value_heads' = {nkv} must divide every entry of "
                          f"num_attention_heads_per_layer (one is {bad})")
    window = opt_int(cfg, "sliding_window", 512)
    ffns = _ffns(cfg, n)
    layers = tuple(LayerSpec(i, FULL_ATTENTION, "gqa", f, heads=heads[i], kv_heads=nkv, head_dim=hd, head_gate=True,
                             window=window if t == "sliding_attention" else 0,
                             local="sliding" if t == "sliding_attention" else "")
                   for i, (t, f) in enumerate(zip(types, ffns)))
    bias = opt_bool(cfg, "attention_bias", False)
    kw: dict[str, Any] = dict(num_attention_heads=heads[0], num_key_value_heads=nkv, head_dim=hd, qk_norm=True,
                              attention_bias=bias, o_bias=bias, intermediate_size=req_int(cfg, "intermediate_size"),
                              layers=layers)
    if MOE in ffns:
        kw.update(**_moe_common(cfg, "num_experts"), moe_intermediate_size=req_int(cfg, "moe_intermediate_size"),
                  shared_expert_intermediate_size=opt_int(cfg, "shared_expert_intermediate_size", 0, minimum=0),
                  router_bias=True)
    return kw
