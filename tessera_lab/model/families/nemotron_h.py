"""Nemotron-H: blocks of one kind each, spelled by ``hybrid_override_pattern``: ``M`` a Mamba-2 mixer, ``*`` GQA
attention, ``-`` a dense MLP (squared ReLU, not gated), ``E`` a MoE FFN; each block has one RMSNorm and a residual.

Rules: transformers ``src/transformers/models/nemotron_h/configuration_nemotron_h.py`` @cfeb552ef0cb
(``layers_block_type`` from ``hybrid_override_pattern``: ``M`` mamba, ``*`` attention, ``-`` mlp, ``E`` moe) and
``modeling_nemotron_h.py`` (``NemotronHMamba2Mixer``: ``mamba_num_heads`` heads of ``mamba_head_dim``, ``n_groups``,
``ssm_state_size``, ``conv_kernel``, ``chunk_size``; ``NemotronHMLP``: up and down projections, ``mlp_hidden_act``
``relu2``; attention heads of ``attention_head_dim``; ``NemotronHMoE`` (Nemotron 3): ``n_routed_experts`` ReLU^2
experts of ``moe_intermediate_size``, top ``num_experts_per_tok``, a shared expert of
``moe_shared_expert_intermediate_size``, a router with a score-correction bias). A block is a layer here: a mixer block has no FFN
(``ffn = none``), an MLP block no mixer (``mixer = none``). The ``time_step_*`` fields set the initialisation and
the clamp of dt: no effect on shapes or FLOPs (``time_step_limit`` may hold ``Infinity``).
Knob ``attention_ratio``: among the mixer blocks, every ``ratio + 1``-th is attention (the MLP blocks stay).

Nemotron 3 (Nano, Super, Ultra, 3.5 Lightning; transformers ``modeling_nemotron_h.py`` @008d9e9577b0): the blocks may
be listed as ``layers_block_type`` (``mamba``, ``attention``, ``mlp``, ``moe``; ``num_hidden_layers`` may then be
null) instead of the pattern; ``moe_latent_size`` (``NemotronHMoE``: ``fc1_latent_proj`` h -> latent, the routed
experts on the latent, ``fc2_latent_proj`` back; the shared expert on the hidden state; null: no latent);
``num_nextn_predict_layers`` MTP steps of the blocks ``mtp_hybrid_override_pattern`` / ``mtp_layers_block_type``
spell (sglang ``python/sglang/srt/models/nemotron_h_mtp.py`` @d4d0fc583717: the step's first block has ``enorm``,
``hnorm`` and ``eh_proj`` 2h x h, its last a final norm; ``*E``, an attention block then a MoE block, is one MTP
layer here), counted apart. ``moe_shared_expert_overlap`` is an execution choice (no effect on shapes).
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.hf_families import (
    DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MOE, NO_FFN, NO_MIXER, LayerSpec, opt_bool, opt_int, req_int,
)

MODEL_TYPES = ("nemotron_h",)
ARCHITECTURES = ("NemotronHForCausalLM",)
EXAMPLE = "nemotron-h-56b"
SOURCE = "transformers src/transformers/models/nemotron_h/configuration_nemotron_h.py @cfeb552ef0cb"
READS = frozenset({"hybrid_override_pattern", "num_attention_heads", "num_key_value_heads", "attention_head_dim",
                   "head_dim", "attention_bias", "intermediate_size", "mlp_bias", "mlp_hidden_act", "mamba_num_heads",
                   "mamba_head_dim", "n_groups", "ssm_state_size", "conv_kernel", "chunk_size", "use_bias",
                   "use_conv_bias", "mamba_hidden_act", "expand", "sliding_window", "n_routed_experts",
                   "num_experts_per_tok", "moe_intermediate_size", "moe_shared_expert_intermediate_size",
                   "n_shared_experts", "n_group", "topk_group", "layers_block_type", "moe_latent_size",
                   "num_nextn_predict_layers", "mtp_hybrid_override_pattern", "mtp_layers_block_type"})
IGNORES = frozenset({"time_step_floor", "time_step_limit", "time_step_max", "time_step_min", "time_step_rank",
                     "hidden_dropout", "mamba_proj_bias", "mamba_ssm_cache_dtype", "moe_shared_expert_overlap"})
_KINDS = {"M": (LINEAR_ATTENTION, "mamba2", NO_FFN), "*": (FULL_ATTENTION, "gqa", NO_FFN),
          "-": (NO_MIXER, "none", DENSE), "E": (NO_MIXER, "none", MOE)}


def _as_pattern(cfg: dict[str, Any]) -> str:
    """The config's blocks as ``hybrid_override_pattern`` (a ``layers_block_type`` list rewritten as the pattern)."""
    pat = _blocks(cfg, "hybrid_override_pattern", "layers_block_type", None) or ""
    cfg.pop("layers_block_type", None)
    cfg["hybrid_override_pattern"] = pat
    return pat


def _ratio(cfg: dict[str, Any], ratio: int) -> None:
    out, j = [], 0
    for c in _as_pattern(cfg):
        if c in "M*":
            j += 1
            c = "*" if j % (ratio + 1) == 0 else "M"
        out.append(c)
    cfg["hybrid_override_pattern"] = "".join(out)


def _layers_knob(cfg: dict[str, Any], n: int) -> None:
    pat = _as_pattern(cfg)
    cfg["hybrid_override_pattern"] = (pat * (n // max(len(pat), 1) + 1))[:n]
    cfg["num_hidden_layers"] = n


KNOBS = {"attention_ratio": _ratio, "num_layers": _layers_knob, "moe_intermediate_size": "moe_intermediate_size",
         "num_experts_per_tok": "num_experts_per_tok", "num_experts": "n_routed_experts"}


#: ``layers_block_type`` entries -> pattern characters (transformers ``MIXER_TYPES`` of ``modeling_nemotron_h.py``)
_BLOCK_CHARS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def _blocks(cfg: Mapping[str, Any], pattern_key: str, list_key: str, n: int | None) -> str | None:
    """The block pattern from ``pattern_key`` (a string) or ``list_key`` (block names), checked to agree and to have
    ``n`` blocks (``None``: any length); ``None`` when neither is given."""
    pat, types = cfg.get(pattern_key), cfg.get(list_key)
    if types is not None:
        if not isinstance(types, list) or any(t not in _BLOCK_CHARS for t in types):
            bad = next((t for t in types if t not in _BLOCK_CHARS), None) if isinstance(types, list) else types
            raise ConfigError(f"config field '{list_key}' has entry {bad!r}; allowed: a list of "
                              f"{', '.join(_BLOCK_CHARS)}")
        listed = "".join(_BLOCK_CHARS[t] for t in types)
        if pat is not None and pat != listed:
            raise ConfigError(f"config fields '{pattern_key}' = {pat!r} and '{list_key}' disagree; allowed: one of "
                              "them, or both spelling the same blocks")
        pat = listed
    if pat is None:
        return None
    if not isinstance(pat, str) or (n is not None and len(pat) != n) or any(c not in _KINDS for c in pat):
        raise ConfigError(f"config field '{pattern_key}' must be {n if n is not None else 'some'} characters of "
                          "M (Mamba-2), * (attention), - (MLP), E (MoE)")
    return pat


def _mtp(cfg: Mapping[str, Any], n: int) -> tuple[LayerSpec, ...]:
    """The MTP layers (one per ``num_nextn_predict_layers``; each step's blocks must be an attention block and a MoE
    block, ``*E``, the one MTP layer kind the cost model has)."""
    steps = opt_int(cfg, "num_nextn_predict_layers", 0, minimum=0)
    pat = _blocks(cfg, "mtp_hybrid_override_pattern", "mtp_layers_block_type", None)
    if not steps:
        return ()
    if pat != "*E":
        raise ConfigError(f"config field 'mtp_hybrid_override_pattern' = {pat!r} is not supported; allowed: '*E' "
                          "(an attention block then a MoE block), or num_nextn_predict_layers = 0")
    return tuple(LayerSpec(n + j, FULL_ATTENTION, "gqa", MOE, mtp=True) for j in range(steps))


def build(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """ModelSpec keyword arguments of a Nemotron-H config (rules in the module docstring)."""
    n_given = cfg.get("num_hidden_layers")
    pat = _blocks(cfg, "hybrid_override_pattern", "layers_block_type",
                  None if n_given is None and cfg.get("layers_block_type") is not None else
                  req_int(cfg, "num_hidden_layers"))
    if pat is None:
        raise ConfigError("config field 'hybrid_override_pattern' is missing; allowed: a string of M, *, -, E (or "
                          "'layers_block_type', a list of mamba, attention, mlp, moe)")
    act = cfg.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise ConfigError(f"config field 'mlp_hidden_act' = {act!r} is not supported; allowed: relu2")
    layers = tuple(LayerSpec(i, *_KINDS[c]) for i, c in enumerate(pat))
    nh = req_int(cfg, "num_attention_heads")
    hd = opt_int(cfg, "attention_head_dim", 0) or opt_int(cfg, "head_dim", req_int(cfg, "hidden_size") // nh)
    bias = opt_bool(cfg, "attention_bias", False)
    moe: dict[str, Any] = {}
    if "E" in pat:  # NemotronHMoE: ReLU^2 routed experts, shared expert(s), sigmoid router with a correction bias
        E = req_int(cfg, "n_routed_experts")
        k = req_int(cfg, "num_experts_per_tok", allowed=f"1 to n_routed_experts = {E}")
        if k > E:
            raise ConfigError(f"config field 'num_experts_per_tok' = {k} is out of range; allowed: 1 to "
                              f"n_routed_experts = {E}")
        moe = dict(num_experts=E, num_experts_per_tok=k, moe_intermediate_size=req_int(cfg, "moe_intermediate_size"),
                   shared_expert_intermediate_size=opt_int(cfg, "moe_shared_expert_intermediate_size", 0, minimum=0)
                   * opt_int(cfg, "n_shared_experts", 1, minimum=0),
                   expert_act="relu2", router_bias=True, n_group=opt_int(cfg, "n_group", 1),
                   topk_group=opt_int(cfg, "topk_group", 1), moe_latent_size=opt_int(cfg, "moe_latent_size", 0))
    return dict(**moe,
        num_attention_heads=nh, num_key_value_heads=opt_int(cfg, "num_key_value_heads", nh), head_dim=hd,
        attention_bias=bias, o_bias=bias,
        intermediate_size=req_int(cfg, "intermediate_size"), ffn_act="relu2", mlp_bias=opt_bool(cfg, "mlp_bias", False),
        mamba_num_heads=req_int(cfg, "mamba_num_heads"), mamba_head_dim=req_int(cfg, "mamba_head_dim"),
        mamba_n_groups=opt_int(cfg, "n_groups", 1), ssm_state_size=req_int(cfg, "ssm_state_size"),
        mamba_conv_kernel=opt_int(cfg, "conv_kernel", 4), mamba_chunk_size=opt_int(cfg, "chunk_size", 128),
        mamba_conv_bias=opt_bool(cfg, "use_conv_bias", True), mamba_proj_bias=opt_bool(cfg, "use_bias", False),
        layers=layers, mtp_layers=_mtp(cfg, len(layers)),
    )
