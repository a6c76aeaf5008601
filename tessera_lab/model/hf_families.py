"""Layer kinds, :class:`LayerSpec`, the config-field readers (:func:`req_int`, :func:`opt_int`) and the builders of
the Qwen3, Qwen3-MoE, Qwen3-Next, DeepSeek-V3 and Mixtral layer lists, which the family readers of
:mod:`tessera_lab.model.families` (the registry: one module per family) call.

Each builder follows the layer rules of ``transformers/models/<type>/configuration_<type>.py`` and raises
:class:`~tessera_lab.errors.ConfigError` naming the config field and its allowed range. This module never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tessera_lab.checks import MAX_CONFIG_INT, check_int
from tessera_lab.errors import ConfigError

#: Mixer kinds (docs/concepts.md, "Layer kinds and their tasks"); ``none``: a block without a mixer (Nemotron-H's MLP-only blocks).
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
NO_MIXER = "none"
#: FFN kinds; ``none``: a block without an FFN (Nemotron-H's Mamba-2 and attention blocks).
MOE = "moe"
DENSE = "dense"
NO_FFN = "none"

#: mixer implementations (``LayerSpec.attention``) -> short label used in plans (``KDA x3 + MLA``)
MIXER_LABELS = {
    "gated_deltanet": "GDN", "gated_gqa": "GatedAttn", "gqa": "GQA", "mla": "MLA", "mla_sparse": "DSA-MLA",
    "kda": "KDA", "lightning": "Lightning", "mamba2": "Mamba2", "mamba": "Mamba", "none": "MLP-only",
}


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer.

    Attributes:
        index: 0-based layer index.
        mixer: ``"linear_attention"``, ``"full_attention"`` or ``"none"``.
        attention: the mixer's implementation (keys of :data:`MIXER_LABELS`): ``"gated_deltanet"``,
            ``"gated_gqa"`` (full attention with an output gate), ``"gqa"`` (MHA/GQA/MQA), ``"mla"``,
            ``"mla_sparse"`` (MLA with DeepSeek-V3.2's lightning indexer), ``"kda"`` (Kimi Delta Attention),
            ``"lightning"`` (MiniMax lightning attention), ``"mamba2"``, ``"mamba"`` (Mamba-1) or ``"none"``.
        ffn: ``"moe"``, ``"dense"`` or ``"none"``.
        window: tokens a query attends: the sliding window (``local = "sliding"``) or the chunk size
            (``local = "chunked"``); 0 for full causal attention.
        local: ``""`` (full), ``"sliding"`` or ``"chunked"``.
        rope: whether the layer applies RoPE (Llama-4's NoPE layers: ``False``; no effect on the counts).
        dense_width: this layer's dense MLP width when it differs from the model's ``intermediate_size`` (0: that).
        mtp: a multi-token-prediction layer (after the last decoder layer; not in the card's totals).
        heads, kv_heads, head_dim, v_head_dim: this GQA layer's own attention shapes when they differ from the
            model's (MiMo-V2-Flash's sliding-window layers); 0: the model's (``v_head_dim`` 0: ``head_dim``).
        sinks: this layer has per-head attention-sink biases (MiMo-V2-Flash's sliding-window layers).
        k_eq_v: the values are the keys (no value projection; Gemma-4's global layers, ``attention_k_eq_v``).
        head_gate: a head-wise output gate (one scalar per head from ``g_proj`` ``h x heads``, applied to the head's
            attention output before o; Laguna).
        shared_index: a DSA layer (``mla_sparse``) without its own indexer: it attends the ``index_topk`` keys an
            earlier layer's indexer selected (GLM-5.2's ``indexer_types`` ``shared``).
    """

    index: int
    mixer: str
    attention: str
    ffn: str
    window: int = 0
    local: str = ""
    rope: bool = True
    dense_width: int = 0
    mtp: bool = False
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    sinks: bool = False
    k_eq_v: bool = False
    head_gate: bool = False
    shared_index: bool = False

    @property
    def kind(self) -> str:
        """Cost class of the layer, such as ``"linear_attention+moe"``: layers of one kind cost the same (the overlap
        table and the planner's pair costs use one layer per kind). Layers that differ beyond mixer and FFN carry a
        detail after the mixer: ``full_attention/sliding128+moe``, ``full_attention/mtp+moe``, ``.../w16384+dense``."""
        detail = "/mtp" if self.mtp else (f"/{self.local}{self.window}" if self.local else "")
        if self.heads or self.kv_heads or self.head_dim or self.v_head_dim:
            detail += f"/h{self.heads}kv{self.kv_heads}d{self.head_dim}v{self.v_head_dim}"
        if self.k_eq_v:
            detail += "/keqv"
        if self.head_gate:
            detail += "/hgate"
        if self.shared_index:
            detail += "/sharedidx"
        if self.dense_width:
            detail += f"/w{self.dense_width}"
        return f"{self.mixer}{detail}+{self.ffn}"

    @property
    def label(self) -> str:
        """Mixer label for plans: ``KDA``, ``MLA``, ``SWA`` (sliding), ``Chunked``, ``MTP`` ..."""
        if self.mtp:
            return "MTP"
        if self.local == "sliding":
            return "SWA"
        if self.local == "chunked":
            return "Chunked"
        if self.attention == "none":  # a block without mixer: named by its FFN
            return "MoE-only" if self.ffn == MOE else "MLP-only"
        if self.shared_index:  # GLM-5.2: DSA on an earlier layer's selection
            return "DSA-MLA(shared idx)"
        return MIXER_LABELS.get(self.attention, self.attention)


def req_int(cfg: Mapping[str, Any], key: str, *, minimum: int = 1, allowed: str | None = None) -> int:
    """An integer config field in ``[minimum, MAX_CONFIG_INT]`` (layer counts: the ``layers`` work limit of
    :mod:`tessera_lab.checks`); ConfigError naming the field when missing, not an integer (NaN, inf, a string, a
    fraction) or out of range."""
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"config field '{key}' is missing; allowed: {allowed or f'an integer >= {minimum}'}")
    layers = key in ("num_hidden_layers", "num_layers")
    return check_int(cfg[key], key, low=minimum, high=None if layers else MAX_CONFIG_INT, allowed=allowed,
                     limit="layers" if layers else None, noun="config field")


def opt_int(cfg: Mapping[str, Any], key: str, default: int, *, minimum: int = 1) -> int:
    """An optional integer config field (``default`` when absent or null), checked like :func:`req_int`."""
    if cfg.get(key) is None:
        return default
    return req_int(cfg, key, minimum=minimum)


def opt_bool(cfg: Mapping[str, Any], key: str, default: bool) -> bool:
    """An optional boolean config field: ``default`` (Hugging Face's) when absent or null, else it must be a JSON
    boolean (a string ``"false"`` would read as true).

    Raises:
        ConfigError: naming the field and the value.
    """
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ConfigError(f"config field '{key}' = {v!r} is not a boolean; allowed: true or false (a JSON boolean, "
                          "or null for the default)")
    return v


def _moe_rule_qwen(cfg: Mapping[str, Any], n_layers: int, num_experts: int) -> list[str]:
    """transformers Qwen3-MoE / Qwen3-Next rule: a layer is MoE when it is not in ``mlp_only_layers``,
    there are experts, and ``(i + 1) % decoder_sparse_step == 0``."""
    step = opt_int(cfg, "decoder_sparse_step", 1)
    mlp_only = cfg.get("mlp_only_layers") or []
    if not isinstance(mlp_only, (list, tuple)) or any(not isinstance(i, int) or not 0 <= i < n_layers for i in mlp_only):
        raise ConfigError(f"config field 'mlp_only_layers' must list layer indices in 0..{n_layers - 1}")
    return [MOE if (i not in mlp_only and num_experts > 0 and (i + 1) % step == 0) else DENSE for i in range(n_layers)]


def _gqa_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    nh = req_int(cfg, "num_attention_heads")
    nkv = opt_int(cfg, "num_key_value_heads", nh)
    h = req_int(cfg, "hidden_size")
    head_dim = opt_int(cfg, "head_dim", h // nh if h % nh == 0 else 0)
    if head_dim < 1:
        raise ConfigError("config field 'head_dim' is missing and hidden_size is not a multiple of num_attention_heads")
    return {"num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": head_dim}


def _layers(mixers: list[str], attentions: list[str], ffns: list[str]) -> tuple[LayerSpec, ...]:
    return tuple(LayerSpec(i, m, a, f) for i, (m, a, f) in enumerate(zip(mixers, attentions, ffns)))


def _from_qwen3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    n = req_int(cfg, "num_hidden_layers")
    return dict(
        **_gqa_fields(cfg),
        qk_norm=True,
        intermediate_size=req_int(cfg, "intermediate_size"),
        layers=_layers([FULL_ATTENTION] * n, ["gqa"] * n, [DENSE] * n),
    )


def _moe_common(cfg: Mapping[str, Any], experts_key: str) -> dict[str, Any]:
    num_experts = req_int(cfg, experts_key)
    topk = req_int(cfg, "num_experts_per_tok", allowed=f"1 to {experts_key} = {num_experts}")
    if topk > num_experts:
        raise ConfigError(
            f"config field 'num_experts_per_tok' = {topk} is out of range; allowed: 1 to {experts_key} = {num_experts}"
        )
    return {"num_experts": num_experts, "num_experts_per_tok": topk}


def _from_qwen3_moe(cfg: Mapping[str, Any]) -> dict[str, Any]:
    n = req_int(cfg, "num_hidden_layers")
    moe = _moe_common(cfg, "num_experts")
    ffns = _moe_rule_qwen(cfg, n, moe["num_experts"])
    return dict(
        **_gqa_fields(cfg),
        **moe,
        qk_norm=True,
        moe_intermediate_size=req_int(cfg, "moe_intermediate_size"),
        intermediate_size=opt_int(cfg, "intermediate_size", 0, minimum=0),
        layers=_layers([FULL_ATTENTION] * n, ["gqa"] * n, ffns),
    )


def _from_qwen3_next(cfg: Mapping[str, Any]) -> dict[str, Any]:
    n = req_int(cfg, "num_hidden_layers")
    interval = opt_int(cfg, "full_attention_interval", 4)
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        # transformers Qwen3NextConfig rule
        layer_types = [FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n)]
    if not isinstance(layer_types, (list, tuple)) or len(layer_types) != n:
        got = len(layer_types) if isinstance(layer_types, (list, tuple)) else type(layer_types).__name__
        raise ConfigError(f"config field 'layer_types' has {got} entries; allowed: exactly num_hidden_layers = {n}")
    bad = [t for t in layer_types if t not in (FULL_ATTENTION, LINEAR_ATTENTION)]
    if bad:
        raise ConfigError(
            f"config field 'layer_types' has unknown entry {bad[0]!r}; allowed: 'linear_attention', 'full_attention'"
        )
    moe = _moe_common(cfg, "num_experts")
    ffns = _moe_rule_qwen(cfg, n, moe["num_experts"])
    shared = opt_int(cfg, "shared_expert_intermediate_size", 0, minimum=0)
    return dict(
        **_gqa_fields(cfg),
        **moe,
        qk_norm=True,
        linear_num_key_heads=req_int(cfg, "linear_num_key_heads"),
        linear_num_value_heads=req_int(cfg, "linear_num_value_heads"),
        linear_key_head_dim=req_int(cfg, "linear_key_head_dim"),
        linear_value_head_dim=req_int(cfg, "linear_value_head_dim"),
        linear_conv_kernel_dim=req_int(cfg, "linear_conv_kernel_dim"),
        full_attention_interval=interval,
        moe_intermediate_size=req_int(cfg, "moe_intermediate_size"),
        intermediate_size=opt_int(cfg, "intermediate_size", 0, minimum=0),
        shared_expert_intermediate_size=shared,
        shared_expert_gate=shared > 0,
        layers=_layers(
            list(layer_types),
            ["gated_gqa" if t == FULL_ATTENTION else "gated_deltanet" for t in layer_types],
            ffns,
        ),
    )


def _from_deepseek_v3(cfg: Mapping[str, Any]) -> dict[str, Any]:
    n = req_int(cfg, "num_hidden_layers")
    moe = _moe_common(cfg, "n_routed_experts")
    first_dense = opt_int(cfg, "first_k_dense_replace", 0, minimum=0)
    freq = opt_int(cfg, "moe_layer_freq", 1)
    ffns = [MOE if (i >= first_dense and i % freq == 0) else DENSE for i in range(n)]
    width = req_int(cfg, "moe_intermediate_size")
    n_shared = opt_int(cfg, "n_shared_experts", 0, minimum=0)
    return dict(
        num_attention_heads=req_int(cfg, "num_attention_heads"),
        num_key_value_heads=opt_int(cfg, "num_key_value_heads", 1),
        head_dim=req_int(cfg, "qk_nope_head_dim") + req_int(cfg, "qk_rope_head_dim"),
        q_lora_rank=opt_int(cfg, "q_lora_rank", 0, minimum=0) or None,
        kv_lora_rank=req_int(cfg, "kv_lora_rank"),
        qk_nope_head_dim=req_int(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=req_int(cfg, "qk_rope_head_dim"),
        v_head_dim=req_int(cfg, "v_head_dim"),
        intermediate_size=req_int(cfg, "intermediate_size"),
        moe_intermediate_size=width,
        shared_expert_intermediate_size=n_shared * width,
        router_bias=cfg.get("topk_method") == "noaux_tc",
        n_group=opt_int(cfg, "n_group", 1),
        topk_group=opt_int(cfg, "topk_group", 1),
        layers=_layers([FULL_ATTENTION] * n, ["mla"] * n, ffns),
        **moe,
    )


def _from_mixtral(cfg: Mapping[str, Any]) -> dict[str, Any]:
    n = req_int(cfg, "num_hidden_layers")
    moe = _moe_common(cfg, "num_local_experts")
    width = req_int(cfg, "intermediate_size")
    return dict(
        **_gqa_fields(cfg),
        **moe,
        moe_intermediate_size=width,
        intermediate_size=width,
        layers=_layers([FULL_ATTENTION] * n, ["gqa"] * n, [MOE] * n),
    )
