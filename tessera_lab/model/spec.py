"""Model specifications read from Hugging Face ``config.json`` files, with parameter counts.

A :class:`ModelSpec` is the architecture of one decoder-only model: the mixer of every layer
(Gated DeltaNet linear attention, gated GQA, plain GQA or MLA), the FFN of every layer (MoE or dense
MLP), and the sizes of each module. Supported Hugging Face ``model_type`` values: ``qwen3``,
``qwen3_moe``, ``qwen3_next``, ``deepseek_v3`` and ``mixtral``.

Parameter counts are computed from the module shapes of the Hugging Face implementations
(``transformers/models/<type>/modeling_<type>.py``); the counting conventions of the published
figures are in ``data/models/_published_params.json``.

This module never imports torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.io import read_json
from tessera_lab.model.hf_families import (  # noqa: F401  (re-exported: the public names of model kinds)
    BUILDERS, DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MOE, SUPPORTED_MODEL_TYPES, LayerSpec, opt_int, req_int,
)
from tessera_lab.paths import data_dir


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a model (numbers of parameters, not bytes).

    ``active`` counts, per token: attention, router, top-k routed experts, shared expert and norms,
    plus the input embedding and the LM head; ``active_non_embedding`` leaves both out.
    ``non_embedding`` is total minus the input embedding and the untied LM head.
    """

    total: int
    embedding: int
    lm_head: int
    non_embedding: int
    active: int
    active_non_embedding: int

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only (hybrid) MoE or dense model.

    Sizes are element counts (not bytes). ``layers`` has one :class:`LayerSpec` per decoder layer.
    Build one with :meth:`from_hf_config` or :func:`load_model`; derive variants with :meth:`with_changes`.

    Raises:
        ConfigError: from the constructors, naming the field and the allowed range.
    """

    name: str
    model_type: str
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    layers: tuple[LayerSpec, ...]
    # full / softmax attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    qk_norm: bool = False
    # Gated DeltaNet (qwen3_next linear attention)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    full_attention_interval: int | None = None
    # MLA (deepseek_v3)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # FFN
    intermediate_size: int = 0
    moe_intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    router_bias: bool = False
    # group-limited routing (DeepSeek-V3: experts in n_group groups, a token picks experts in topk_group of them)
    n_group: int = 1
    topk_group: int = 1
    source: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf_config(cls, path_or_dict: str | Path | Mapping[str, Any], name: str | None = None) -> "ModelSpec":
        """Build a spec from a Hugging Face ``config.json`` (a path or an already parsed dict).

        Args:
            path_or_dict: path to ``config.json`` or its parsed contents.
            name: display name; defaults to the file stem or ``model_type``.

        Raises:
            ConfigError: unknown ``model_type``; a missing, zero or negative size; ``num_experts_per_tok``
                larger than the number of experts; ``layer_types`` of the wrong length or with an
                unknown entry; an unreadable file.
        """
        if isinstance(path_or_dict, (str, Path)):
            path = Path(path_or_dict)
            cfg = read_json(path, "config file")
            if not isinstance(cfg, dict):
                raise ConfigError(f"config file '{path}' holds a JSON {type(cfg).__name__}; allowed: a JSON object "
                                  "(a Hugging Face config.json)")
            name = name or path.stem
        elif isinstance(path_or_dict, Mapping):
            cfg = dict(path_or_dict)
        else:
            raise ConfigError(f"config must be a path or a dict, got {type(path_or_dict).__name__}")
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            where = f"config file '{path_or_dict}': " if isinstance(path_or_dict, (str, Path)) else ""
            raise ConfigError(
                f"{where}config field 'model_type' = {model_type!r} is not supported; allowed: "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        builder = BUILDERS[model_type]
        try:
            kwargs = builder(cfg)
            kwargs.update(
                name=name or str(model_type),
                model_type=model_type,
                hidden_size=req_int(cfg, "hidden_size"),
                vocab_size=req_int(cfg, "vocab_size"),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                source=str(cfg.get("_source", "")),
                raw=cfg,
            )
            spec = cls(**kwargs)
            spec.validate()
        except ConfigError as exc:
            if isinstance(path_or_dict, (str, Path)):
                raise ConfigError(f"config file '{path_or_dict}': {exc}") from None
            raise
        return spec

    def validate(self) -> None:
        """Check cross-field constraints.

        Raises:
            ConfigError: naming the field and the allowed range.
        """
        if not self.layers:
            raise ConfigError("config field 'num_hidden_layers' = 0 is out of range; allowed: an integer >= 1")
        if self.num_attention_heads % max(self.num_key_value_heads, 1):
            raise ConfigError(
                f"config field 'num_key_value_heads' = {self.num_key_value_heads} must divide "
                f"num_attention_heads = {self.num_attention_heads}"
            )
        if self.has_moe:
            if self.num_experts < 1:
                raise ConfigError("config field 'num_experts' must be >= 1 for a MoE layer")
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ConfigError(
                    f"config field 'num_experts_per_tok' = {self.num_experts_per_tok} is out of range; "
                    f"allowed: 1 to num_experts = {self.num_experts}"
                )
            if self.moe_intermediate_size < 1:
                raise ConfigError("config field 'moe_intermediate_size' must be >= 1 for a MoE layer")
        if any(layer.ffn == DENSE for layer in self.layers) and self.intermediate_size < 1:
            raise ConfigError("config field 'intermediate_size' must be >= 1 for a dense MLP layer")

    # ------------------------------------------------------------------ knobs
    def with_changes(
        self,
        *,
        attention_ratio: int | None = None,
        full_attention_interval: int | None = None,
        moe_intermediate_size: int | None = None,
        num_experts: int | None = None,
        num_experts_per_tok: int | None = None,
        shared_expert_intermediate_size: int | None = None,
        num_layers: int | None = None,
        name: str | None = None,
    ) -> "ModelSpec":
        """A copy of this spec with the research knobs changed.

        Args:
            attention_ratio: linear-attention layers per full-attention layer (Qwen3-Next: 3);
                same as ``full_attention_interval = attention_ratio + 1``. Only for hybrid models
                (``qwen3_next``). 0 makes every layer full attention.
            full_attention_interval: every ``interval``-th layer is full attention.
            moe_intermediate_size: routed expert width (elements).
            num_experts: routed experts per MoE layer.
            num_experts_per_tok: top-k.
            shared_expert_intermediate_size: shared expert width (0 removes the shared expert).
            num_layers: number of decoder layers (the layer pattern is re-derived by the family's rule).
            name: name of the variant (default: this name plus the changes).

        Raises:
            ConfigError: a knob out of range (named), or a knob the family does not have.
        """
        cfg = dict(self.raw)
        changes: list[str] = []
        if attention_ratio is not None and full_attention_interval is not None:
            raise ConfigError("give either 'attention_ratio' or 'full_attention_interval', not both")
        if attention_ratio is not None:
            if isinstance(attention_ratio, bool) or not isinstance(attention_ratio, int) or attention_ratio < 0:
                raise ConfigError(f"knob 'attention_ratio' = {attention_ratio!r} is out of range; allowed: an integer >= 0")
            full_attention_interval = attention_ratio + 1
        if full_attention_interval is not None:
            if self.model_type != "qwen3_next":
                raise ConfigError(
                    f"knob 'attention_ratio'/'full_attention_interval' needs a hybrid model (qwen3_next); "
                    f"{self.name} is {self.model_type}"
                )
            cfg["full_attention_interval"] = req_int(
                {"full_attention_interval": full_attention_interval}, "full_attention_interval"
            )
            cfg.pop("layer_types", None)
            changes.append(f"ratio={full_attention_interval - 1}")
        for key, value, label in (
            ("moe_intermediate_size", moe_intermediate_size, "expert"),
            ("num_experts_per_tok", num_experts_per_tok, "topk"),
        ):
            if value is not None:
                if not self.has_moe:
                    raise ConfigError(f"knob '{key}' needs a MoE model; {self.name} is dense")
                cfg[key] = req_int({key: value}, key)
                changes.append(f"{label}={value}")
        if num_experts is not None:
            if not self.has_moe:
                raise ConfigError(f"knob 'num_experts' needs a MoE model; {self.name} is dense")
            key = {"deepseek_v3": "n_routed_experts", "mixtral": "num_local_experts"}.get(self.model_type, "num_experts")
            cfg[key] = req_int({"num_experts": num_experts}, "num_experts")
            changes.append(f"experts={num_experts}")
        if shared_expert_intermediate_size is not None:
            if self.model_type != "qwen3_next":
                raise ConfigError(
                    f"knob 'shared_expert_intermediate_size' applies to qwen3_next; {self.name} is {self.model_type}"
                )
            cfg["shared_expert_intermediate_size"] = req_int(
                {"shared_expert_intermediate_size": shared_expert_intermediate_size},
                "shared_expert_intermediate_size",
                minimum=0,
                allowed="an integer >= 0",
            )
            changes.append(f"shared={shared_expert_intermediate_size}")
        if num_layers is not None:
            cfg["num_hidden_layers"] = req_int({"num_layers": num_layers}, "num_layers")
            cfg.pop("layer_types", None)
            changes.append(f"layers={num_layers}")
        new_name = name or (f"{self.name}[{','.join(changes)}]" if changes else self.name)
        return ModelSpec.from_hf_config(cfg, name=new_name)

    # ------------------------------------------------------------------ derived
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def has_moe(self) -> bool:
        return any(layer.ffn == MOE for layer in self.layers)

    @property
    def attention_ratio(self) -> int | None:
        """Linear-attention layers per full-attention layer (``None`` for non-hybrid models)."""
        if self.full_attention_interval is None:
            return None
        return self.full_attention_interval - 1

    def layer_pattern(self) -> str:
        """One character per layer: ``L`` linear attention, ``A`` full attention; lower case for a dense FFN."""
        out = []
        for layer in self.layers:
            c = "L" if layer.mixer == LINEAR_ATTENTION else "A"
            out.append(c if layer.ffn == MOE else c.lower())
        return "".join(out)

    # ------------------------------------------------------------------ parameters
    def mixer_params(self, layer: LayerSpec) -> int:
        """Parameters of the layer's mixer (projections, norms inside the mixer, conv, gates)."""
        h = self.hidden_size
        if layer.attention == "gated_deltanet":
            # transformers Qwen3NextGatedDeltaNet: in_proj_qkvz, in_proj_ba, depthwise conv1d (no bias),
            # dt_bias and A_log per value head, gated RMSNorm over the value head dim, out_proj.
            kd = self.linear_num_key_heads * self.linear_key_head_dim
            vd = self.linear_num_value_heads * self.linear_value_head_dim
            conv_dim = 2 * kd + vd
            return (
                h * (2 * kd + 2 * vd)
                + h * 2 * self.linear_num_value_heads
                + conv_dim * self.linear_conv_kernel_dim
                + 2 * self.linear_num_value_heads
                + self.linear_value_head_dim
                + vd * h
            )
        if layer.attention == "mla":
            nh = self.num_attention_heads
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qk
            else:
                q = h * nh * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * nh * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + nh * self.v_head_dim * h
        nh, nkv, hd = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        q_out = nh * hd * (2 if layer.attention == "gated_gqa" else 1)
        params = h * q_out + 2 * h * nkv * hd + nh * hd * h
        if self.qk_norm:
            params += 2 * hd
        return params

    def routed_expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def shared_expert_params(self) -> int:
        """Parameters of the shared expert(s) of one MoE layer, including a sigmoid gate if present."""
        p = 3 * self.hidden_size * self.shared_expert_intermediate_size
        if self.shared_expert_gate and self.shared_expert_intermediate_size:
            p += self.hidden_size
        return p

    def router_params(self) -> int:
        """Router (gate) weights, plus DeepSeek-V3's per-expert score-correction bias."""
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    def layer_params(self, layer: LayerSpec) -> dict[str, int]:
        """Parameters of one layer by component: ``mixer``, ``norms``, ``router``, ``experts``
        (all routed experts), ``shared`` and ``dense_mlp``."""
        out = {"mixer": self.mixer_params(layer), "norms": 2 * self.hidden_size,
               "router": 0, "experts": 0, "shared": 0, "dense_mlp": 0}
        if layer.ffn == MOE:
            out["router"] = self.router_params()
            out["experts"] = self.num_experts * self.routed_expert_params()
            out["shared"] = self.shared_expert_params()
        else:
            out["dense_mlp"] = 3 * self.hidden_size * self.intermediate_size
        return out

    def layer_active_params(self, layer: LayerSpec) -> int:
        """Parameters one token touches in this layer (top-k routed experts only)."""
        p = self.layer_params(layer)
        routed = self.num_experts_per_tok * self.routed_expert_params() if layer.ffn == MOE else 0
        return p["mixer"] + p["norms"] + p["router"] + routed + p["shared"] + p["dense_mlp"]

    def param_counts(self) -> ParamCounts:
        """Parameter counts from the module shapes (see :class:`ParamCounts` for the conventions)."""
        embedding = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        final_norm = self.hidden_size
        body = sum(sum(self.layer_params(layer).values()) for layer in self.layers) + final_norm
        active_body = sum(self.layer_active_params(layer) for layer in self.layers) + final_norm
        # a tied head shares the embedding matrix: it still costs compute but adds no parameters
        head_active = self.vocab_size * self.hidden_size
        return ParamCounts(
            total=body + embedding + lm_head,
            embedding=embedding,
            lm_head=lm_head,
            non_embedding=body,
            active=active_body + embedding + (head_active if lm_head else 0),
            active_non_embedding=active_body,
        )

    def summary(self) -> dict[str, Any]:
        """Plain-dict summary used by the CLI and notebooks."""
        return {
            "name": self.name,
            "model_type": self.model_type,
            "layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "pattern": self.layer_pattern(),
            "num_experts": self.num_experts,
            "top_k": self.num_experts_per_tok,
            "expert_width": self.moe_intermediate_size,
            "shared_expert_width": self.shared_expert_intermediate_size,
            "attention_ratio": self.attention_ratio,
        }


# ---------------------------------------------------------------------- shipped models
def shipped_models() -> dict[str, Path]:
    """Shipped configs: name (file stem, e.g. ``qwen3-next-80b-a3b``) -> path under ``data/models``."""
    return {p.stem: p for p in sorted((data_dir() / "models").glob("*.json")) if not p.stem.startswith("_")}


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A shipped model by name (``tessera-lab models`` lists them) or a ``config.json`` path.

    Raises:
        ConfigError: the name is neither a shipped model nor an existing file (lists the shipped names).
    """
    models = shipped_models()
    key = str(name_or_path)
    if key in models:
        return ModelSpec.from_hf_config(models[key], name=key)
    path = Path(key)
    if path.is_file():
        return ModelSpec.from_hf_config(path)
    raise ConfigError(f"model '{key}' is neither a shipped model ({', '.join(models)}) nor a config.json path")


def published_params() -> dict[str, Any]:
    """The authors' published parameter counts with their conventions (``data/models/_published_params.json``)."""
    return json.loads((data_dir() / "models" / "_published_params.json").read_text())


def matches_published(value: float, published: float) -> bool:
    """Whether a computed count agrees with a published one to the precision published.

    A figure given in billions with d decimals (``30.5e9`` -> d = 1) matches when the computed count,
    rounded *or* truncated to d decimals of a billion, equals it. Model cards do both: Qwen3-235B-A22B's
    non-embedding 233.85B is published as "234B" (rounded) while Qwen3-30B-A3B's 3.353B activated is
    published as "3.3B" (truncated).
    """
    text = f"{published / 1e9:.6f}".rstrip("0").rstrip(".")
    decimals = len(text.split(".")[1]) if "." in text else 0
    scale = 10**decimals
    b = value / 1e9
    target = round(published / 1e9 * scale)
    return round(b * scale) == target or int(b * scale + 1e-9) == target


__all__ = [
    "ConfigError", "LayerSpec", "ModelSpec", "ParamCounts", "load_model", "shipped_models",
    "published_params", "matches_published", "SUPPORTED_MODEL_TYPES",
]


def layer_summary(layers: list[int], kinds: list[str]) -> str:
    """Short text of a stage's layers: ``"first-last (Ax1 Lx3)"`` (L linear attention, A full attention, a
    ``d`` suffix for a dense FFN); ``"-"`` for no layers."""
    if not layers:
        return "-"
    short = {"linear_attention": "L", "full_attention": "A"}
    counts = Counter(short.get(k.split("+")[0], "?") + ("" if k.endswith("moe") else "d") for k in kinds)
    parts = " ".join(f"{k}x{n}" for k, n in sorted(counts.items()))
    return f"{layers[0]}-{layers[-1]} ({parts})"
