"""Model specifications read from Hugging Face ``config.json`` files, with parameter counts.

A :class:`ModelSpec` is the architecture of one decoder-only model: the mixer of every layer
(full, sliding-window or chunked attention, gated GQA, MLA with or without DeepSeek-V3.2's indexer, Gated
DeltaNet, KDA, lightning attention, Mamba-1/2), the FFN of every layer (MoE, dense MLP or none), the model's MTP
layers and the sizes of each module. The config is read by the family's reader of the layer-kind registry
(:mod:`tessera_lab.model.families`; ``tessera-lab models`` lists the families).

Parameter counts are computed from the module shapes of the reference implementations (:mod:`tessera_lab.model.kinds`);
the counting conventions of the published figures are in ``data/models/_published_params.json`` and docs/models.md.

This module never imports torch.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

from tessera_lab.checks import did_you_mean
from tessera_lab.errors import ConfigError
from tessera_lab.io import read_json
from tessera_lab.model import families, kinds
from tessera_lab.model import knobs as knob_rules
from tessera_lab.model.families import SUPPORTED_MODEL_TYPES
from tessera_lab.model.knobs import VARIANT_KEYS
from tessera_lab.model.hf_families import (  # noqa: F401  (re-exported: the public names of model kinds)
    DENSE, FULL_ATTENTION, LINEAR_ATTENTION, MIXER_LABELS, MOE, NO_FFN, NO_MIXER, LayerSpec, opt_int, req_int,
)
from tessera_lab.model.published import matches_published, published_params  # noqa: F401  (re-exported)
from tessera_lab.model.spec_groups import (  # noqa: F401  (re-exported: the groups of a ModelSpec)
    FIELD_GROUP, FLAT_FIELDS, SPEC_GROUPS, AttentionSpec, LayerStack, LinearMixerSpec, MlpSpec, MoESpec, VocabSpec,
)
from tessera_lab.paths import data_dir


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of a model (numbers of parameters, not bytes).

    ``active`` counts, per token: attention, router, top-k routed experts, shared expert and norms,
    plus the input embedding and the LM head; ``active_non_embedding`` leaves both out.
    ``non_embedding`` is total minus the input embedding and the untied LM head. None of these include the MTP
    layers (``mtp``: their own parameters; they share the embedding and the head), as the model cards count.
    """

    total: int
    embedding: int
    lm_head: int
    non_embedding: int
    active: int
    active_non_embedding: int
    mtp: int = 0
    mtp_active: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only (hybrid) MoE or dense model.

    What the model is (``name``, ``model_type``, ``family``, ``hidden_size``, where it was read from) and what it
    describes, by group: ``stack`` (:class:`LayerStack`, one :class:`LayerSpec` per layer), ``attention``
    (:class:`AttentionSpec`), ``linear`` (:class:`LinearMixerSpec`), ``mlp`` (:class:`MlpSpec`), ``moe``
    (:class:`MoESpec`) and ``vocab`` (:class:`VocabSpec`). Sizes are element counts (not bytes).
    Build one with :meth:`from_hf_config` or :func:`load_model`; derive variants with :meth:`with_changes`.

    Raises:
        ConfigError: from the constructors, naming the field and the allowed range.
    """

    name: str
    model_type: str
    hidden_size: int
    stack: LayerStack
    attention: AttentionSpec
    vocab: VocabSpec
    linear: LinearMixerSpec = LinearMixerSpec()
    mlp: MlpSpec = MlpSpec()
    moe: MoESpec = MoESpec()
    family: str = ""
    source: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)
    allow_unknown_fields: bool = field(default=False, compare=False)
    allow_structural_fields: bool = field(default=False, compare=False)
    #: the config.json file read (empty for a dict or a derived variant's own config)
    path: str = field(default="", compare=False)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)

    @classmethod
    def from_fields(cls, **flat: Any) -> "ModelSpec":
        """A spec from flat keywords (a family reader's output plus the identity fields; :data:`FLAT_FIELDS`),
        each put in its group (:data:`FIELD_GROUP`).

        Raises:
            TypeError: a keyword that is no field of the spec or of a group (as a dataclass constructor does).
        """
        groups: dict[str, dict[str, Any]] = {g: {} for g in SPEC_GROUPS}
        top = {}
        for key, value in flat.items():
            if key in FIELD_GROUP:
                groups[FIELD_GROUP[key]][key] = value
            else:
                top[key] = value
        return cls(**top, **{g: SPEC_GROUPS[g](**kw) for g, kw in groups.items()})

    def as_dict(self) -> dict[str, Any]:
        """The spec as one flat dict in the order of :data:`FLAT_FIELDS` (layers as dicts, as
        :func:`dataclasses.asdict` writes them)."""
        nested = dataclasses.asdict(self)
        flat = {k: v for k, v in nested.items() if k not in SPEC_GROUPS}
        for g in SPEC_GROUPS:
            flat.update(nested[g])
        return {k: flat[k] for k in FLAT_FIELDS}

    def value(self, name: str, default: Any = None) -> Any:
        """The value of a field given by its flat name (a knob or config-like name held in a data table, e.g.
        ``"linear_num_key_heads"``), or of a property of the spec (``"attention_ratio"``); ``default`` when the spec
        has neither."""
        group = FIELD_GROUP.get(name)
        return getattr(getattr(self, group), name) if group else getattr(self, name, default)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf_config(cls, path_or_dict: str | Path | Mapping[str, Any], name: str | None = None, *,
                       allow_unknown_fields: bool = False, plan_mtp: bool = False,
                       notes: tuple[str, ...] = (), allow_structural_fields: bool = False) -> "ModelSpec":
        """Build a spec from a Hugging Face ``config.json`` (a path or an already parsed dict).

        The family's reader is found by ``model_type`` first (:func:`tessera_lab.model.families.resolve`:
        ``text_config`` of a multimodal config, an alias named by ``architectures``); then fields no reader
        understands refuse the config unless ``allow_unknown_fields`` (then listed in :attr:`notes`); then the reader
        checks only the fields it reads. Boolean fields must be JSON booleans; a field the reader knows only at its
        neutral value is accepted at that value, with a note.

        Args:
            path_or_dict: path to ``config.json`` or its parsed contents.
            name: display name; defaults to :func:`~tessera_lab.model.families.config_name` (the config's ``_name_or_path``, its folder, its
                stem) or ``model_type``.
            allow_unknown_fields: plan without the unknown fields whose name does not say structural (the first
                note starts ``approximate:``, :attr:`approximate`).
            allow_structural_fields: with ``allow_unknown_fields``, plan without structural-named unknown fields too.
            plan_mtp: put the MTP layers in ``stack.layers`` after the decoder layers (the last stage holds them).
            notes: notes carried over from the spec this one derives from.

        Raises:
            ConfigError: unknown ``model_type``; a field the reader does not understand; a missing, zero or
                negative size; ``num_experts_per_tok`` larger than the number of experts; a layer list of the
                wrong length or with an unknown entry; an unreadable file.
        """
        where = ""
        if isinstance(path_or_dict, (str, Path)):
            path = Path(path_or_dict)
            where = f"config file '{path}': "
            cfg = read_json(path, "config file", finite=False)
            if not isinstance(cfg, dict):
                raise ConfigError(f"config file '{path}' holds a JSON {type(cfg).__name__}; allowed: a JSON object "
                                  "(a Hugging Face config.json)")
            name = name or families.config_name(cfg, path)
        elif isinstance(path_or_dict, Mapping):
            cfg = dict(path_or_dict)
        else:
            raise ConfigError(f"config must be a path or a dict, got {type(path_or_dict).__name__}")
        try:
            reader, cfg, found = families.resolve(cfg)
            families.check_types(cfg)
            approx = families.check_unknown(reader, cfg, allow=allow_unknown_fields,
                                            allow_structural=allow_structural_fields)
            found = found + families.check_neutral(reader, cfg)
            carried = [n for n in notes if not n.startswith("approximate:")]
            all_notes = approx + carried + [n for n in found if n not in carried]
            kwargs = reader.build(cfg)
            mtp = tuple(kwargs.pop("mtp_layers", ()))
            layers = tuple(kwargs.pop("layers"))
            if plan_mtp:
                layers += tuple(dataclasses.replace(l, index=len(layers) + j) for j, l in enumerate(mtp))
            kwargs.update(
                name=name or str(cfg.get("model_type")),
                model_type=str(cfg.get("model_type")),
                family=families.family_name(reader),
                hidden_size=req_int(cfg, "hidden_size"),
                vocab_size=req_int(cfg, "vocab_size"),
                # a reader whose family ties by default (Gemma-4) says so; else only a JSON true ties
                tie_word_embeddings=kwargs.pop("tie_word_embeddings", cfg.get("tie_word_embeddings") is True),
                source=str(cfg.get("_source", "")),
                layers=layers, mtp_layers=mtp, plan_mtp=plan_mtp,
                notes=tuple(all_notes), allow_unknown_fields=allow_unknown_fields,
                allow_structural_fields=allow_structural_fields, raw=cfg,
                path=str(path_or_dict) if isinstance(path_or_dict, (str, Path)) else "",
            )
            spec = cls.from_fields(**kwargs)
            spec.validate()
        except ConfigError as exc:
            if where and not str(exc).startswith(where):
                raise ConfigError(f"{where}{exc}") from None
            raise
        return spec

    def validate(self) -> None:
        """Check cross-field constraints.

        Raises:
            ConfigError: naming the field and the allowed range.
        """
        if not self.stack.layers:
            raise ConfigError("config field 'num_hidden_layers' = 0 is out of range; allowed: an integer >= 1")
        if self.attention.num_attention_heads % max(self.attention.num_key_value_heads, 1):
            raise ConfigError(
                f"config field 'num_key_value_heads' = {self.attention.num_key_value_heads} must divide "
                f"num_attention_heads = {self.attention.num_attention_heads}"
            )
        if self.has_moe:
            if self.moe.num_experts < 1:
                raise ConfigError("config field 'num_experts' must be >= 1 for a MoE layer")
            if not 1 <= self.moe.num_experts_per_tok <= self.moe.num_experts:
                raise ConfigError(
                    f"config field 'num_experts_per_tok' = {self.moe.num_experts_per_tok} is out of range; "
                    f"allowed: 1 to num_experts = {self.moe.num_experts}"
                )
            if self.moe.moe_intermediate_size < 1:
                raise ConfigError("config field 'moe_intermediate_size' must be >= 1 for a MoE layer")
        if any(layer.ffn == DENSE for layer in self.stack.layers) and self.mlp.intermediate_size < 1:
            raise ConfigError("config field 'intermediate_size' must be >= 1 for a dense MLP layer")

    # ------------------------------------------------------------------ knobs
    #: the knobs :meth:`with_changes` takes (keywords, in the order they name a variant)
    CHANGE_KNOBS = ("attention_ratio", "full_attention_interval", "moe_intermediate_size", "num_experts_per_tok",
                    "num_experts", "shared_expert_intermediate_size", "shared_experts", "moe_every", "window",
                    "num_layers")

    def with_changes(self, *, allow_no_full_attention: bool = False, plan_mtp: bool | None = None,
                     name: str | None = None, **knobs: int | None) -> "ModelSpec":
        """A copy of this spec with the research knobs changed, by the family's own rule
        (``KNOBS`` of its reader in :mod:`tessera_lab.model.families`). A knob given as ``None`` is left as is.

        Knobs (keywords, :data:`CHANGE_KNOBS`):
            attention_ratio: linear-mixer layers per full-attention layer (Qwen3-Next: 3), placed by the family's
                rule (Qwen3-Next/3.5: every ``ratio + 1``-th layer full; Kimi-Linear: every ``ratio + 1``-th and
                the last; MiniMax: every ``ratio + 1``-th; Jamba: period ``ratio + 1``; Nemotron-H: every
                ``ratio + 1``-th mixer block). 0 makes every mixer full attention.
            full_attention_interval: ``attention_ratio + 1``.
            moe_intermediate_size: routed expert width (elements).
            num_experts: routed experts per MoE layer.
            num_experts_per_tok: top-k.
            shared_expert_intermediate_size: shared expert width (0 removes the shared expert).
            shared_experts: number of shared experts (each of the routed experts' width).
            moe_every: MoE every N-th layer by the family's rule (the others dense).
            window: sliding window (gpt-oss, Mixtral) or attention chunk (Llama-4), in tokens.
            num_layers: number of decoder layers (the layer pattern is re-derived by the family's rule).

        Args:
            allow_no_full_attention: accept a ratio that leaves no full-attention layer.
            plan_mtp: put the MTP layers in the plan (default: as this spec).
            name: name of the variant (default: this name plus the changes).

        Raises:
            ConfigError: an unknown knob, a knob out of range (named), a knob the family does not have, or a ratio
                that leaves no full-attention layer (unless ``allow_no_full_attention``).
        """
        unknown = sorted(set(knobs) - set(self.CHANGE_KNOBS))
        if unknown:
            raise ConfigError(f"knob {unknown[0]!r} is unknown{did_you_mean(unknown[0], self.CHANGE_KNOBS)}; allowed: "
                              f"{', '.join(self.CHANGE_KNOBS)}")
        reader = families.reader_for(self.model_type) if self.model_type in SUPPORTED_MODEL_TYPES else \
            families.resolve(self.raw)[0]
        cfg = dict(self.raw)
        changes: list[str] = []
        ratio = self._change_ratio(reader, cfg, knobs.get("attention_ratio"), knobs.get("full_attention_interval"),
                                   changes)
        self._change_moe(reader, cfg, knobs, changes)
        window, num_layers = knobs.get("window"), knobs.get("num_layers")
        if window is not None:
            families.apply_knob(reader, cfg, "window", req_int({"window": window}, "window"))
            changes.append(f"window={window}")
        if num_layers is not None:
            n = req_int({"num_layers": num_layers}, "num_layers")
            if "num_layers" in getattr(reader, "KNOBS", {}):
                families.apply_knob(reader, cfg, "num_layers", n)
            else:
                cfg["num_hidden_layers"] = n
                cfg.pop("layer_types", None)
            changes.append(f"layers={num_layers}")
        new_name = name or (f"{self.name}[{','.join(changes)}]" if changes else self.name)
        spec = ModelSpec.from_hf_config(cfg, name=new_name, allow_unknown_fields=self.allow_unknown_fields,
                                        allow_structural_fields=self.allow_structural_fields,
                                        plan_mtp=self.stack.plan_mtp if plan_mtp is None else plan_mtp, notes=self.notes)
        spec = dataclasses.replace(spec, path=self.path)
        if ratio is not None and any(l.mixer == LINEAR_ATTENTION for l in self.stack.layers):
            knob_rules.check_ratio(spec, ratio, reader, cfg, allow_no_full_attention)
        asked = {k for k in ("moe_intermediate_size", "shared_expert_intermediate_size", "shared_experts")
                 if knobs.get(k) is not None}
        side = knob_rules.side_effects(self, spec, asked)
        return dataclasses.replace(spec, notes=spec.notes + tuple(n for n in side if n not in spec.notes)) \
            if side else spec

    def _change_ratio(self, reader, cfg: dict, attention_ratio: int | None, full_attention_interval: int | None,
                      changes: list[str]) -> int | None:
        """Apply the attention-ratio knob (given either way) to ``cfg``; returns the ratio (None: not given)."""
        if attention_ratio is not None and full_attention_interval is not None:
            raise ConfigError("give either 'attention_ratio' or 'full_attention_interval', not both")
        if full_attention_interval is not None:
            attention_ratio = req_int({"full_attention_interval": full_attention_interval},
                                      "full_attention_interval") - 1
        if attention_ratio is not None:
            if isinstance(attention_ratio, bool) or not isinstance(attention_ratio, int) or attention_ratio < 0:
                raise ConfigError(f"knob 'attention_ratio' = {attention_ratio!r} is out of range; allowed: an integer >= 0")
            if "attention_ratio" not in getattr(reader, "KNOBS", {}):
                raise ConfigError(f"knob 'attention_ratio'/'full_attention_interval' needs a hybrid model with a linear "
                                  f"and a full-attention mixer; {self.name} is {self.model_type}")
            families.apply_knob(reader, cfg, "attention_ratio", attention_ratio)
            changes.append(f"ratio={attention_ratio}")
        return attention_ratio

    def _change_moe(self, reader, cfg: dict, knobs: Mapping[str, Any], changes: list[str]) -> None:
        """Apply the expert knobs given in ``knobs`` to ``cfg`` (a dense model takes only ``moe_every``)."""
        moe_knobs = (("moe_intermediate_size", "expert", 1), ("num_experts_per_tok", "topk", 1),
                     ("num_experts", "experts", 1), ("shared_expert_intermediate_size", "shared", 0),
                     ("shared_experts", "nshared", 0), ("moe_every", "moe_every", 1))
        for key, label, low in moe_knobs:
            value = knobs.get(key)
            if value is None:
                continue
            if not self.has_moe and key != "moe_every":
                raise ConfigError(f"knob '{key}' = {value}: model {self.name} has no routed experts (a dense "
                                  f"model); allowed: leave {key} out, or a MoE model")
            value = req_int({key: value}, key, minimum=low, allowed=f"an integer >= {low}")
            families.apply_knob(reader, cfg, key, value)
            changes.append(f"{label}={value}")

    # ------------------------------------------------------------------ derived
    @property
    def approximate(self) -> str:
        """``"approximate: N unknown field(s) ignored: ..."`` when unknown config fields were ignored
        (``--allow-unknown-fields``), else ``""``: plans, exports and reports made from this spec show it first."""
        return next((n for n in self.notes if n.startswith("approximate:")), "")

    @property
    def num_layers(self) -> int:
        """Layers the plan places (the decoder layers, plus the MTP layers when ``plan_mtp``)."""
        return len(self.stack.layers)

    @property
    def num_decoder_layers(self) -> int:
        """Decoder layers (without MTP layers)."""
        return sum(1 for l in self.stack.layers if not l.mtp)

    @property
    def has_moe(self) -> bool:
        return any(layer.ffn == MOE for layer in self.stack.layers)

    @property
    def attention_ratio(self) -> int | None:
        """Linear-mixer layers per full-attention layer (``None`` for models without both kinds): the most common
        run of linear-mixer layers before a full-attention layer (Kimi-Linear's MLA at layers 4, 8, ..., 24 and
        27 gives 3, its period, not 20 // 7)."""
        if self.stack.full_attention_interval is not None:
            return self.stack.full_attention_interval - 1
        mixers = [l.mixer for l in self.stack.layers if not l.mtp]
        if LINEAR_ATTENTION not in mixers or FULL_ATTENTION not in mixers:
            return None
        runs, run = Counter(), 0
        for m in mixers:
            if m == FULL_ATTENTION:
                runs[run] += 1
                run = 0
            elif m == LINEAR_ATTENTION:
                run += 1
        return max(runs, key=lambda r: (runs[r], r))

    def layer_pattern(self) -> str:
        """One character per layer: ``L`` linear mixer (GDN, KDA, lightning, Mamba), ``A`` full attention (``S``
        sliding window, ``C`` chunked), ``T`` an MTP layer; lower case for a dense FFN (upper case also for a block
        without FFN); a block without mixer: ``-`` (dense MLP) or ``E`` (MoE)."""
        out = []
        for layer in self.stack.layers:
            if layer.mtp:
                out.append("T")
                continue
            if layer.mixer == NO_MIXER:
                out.append("-" if layer.ffn == DENSE else "E")
                continue
            c = "L" if layer.mixer == LINEAR_ATTENTION else {"sliding": "S", "chunked": "C"}.get(layer.local, "A")
            out.append(c.lower() if layer.ffn == DENSE else c)
        return "".join(out)

    def mixer_kinds(self, layers: "list[int] | None" = None) -> str:
        """The mixer kinds of some layers (default all): ``KDA x3 + MLA``, in order of first appearance."""
        chosen = self.stack.layers if layers is None else [self.stack.layers[i] for i in layers]
        return mixer_kinds_text([l.label for l in chosen])

    # ------------------------------------------------------------------ parameters (cached: a plan asks ~21,000 times)
    @cached_property
    def _layer_param_cache(self) -> dict[LayerSpec, dict[str, int]]:
        return {}

    def mixer_params(self, layer: LayerSpec) -> int:
        """Parameters of the layer's mixer (projections, norms inside the mixer, conv, gates); see
        :mod:`tessera_lab.model.kinds`."""
        return kinds.mixer_params(self, layer)

    def routed_expert_params(self) -> int:
        """Parameters of one routed expert (gate, up and down projections)."""
        return kinds.routed_expert_params(self)

    def shared_expert_params(self) -> int:
        """Parameters of the shared expert(s) of one MoE layer, including a sigmoid gate if present."""
        p = (3 if self.moe.expert_act == "swiglu" else 2) * self.hidden_size * self.moe.shared_expert_intermediate_size
        if self.moe.shared_expert_gate and self.moe.shared_expert_intermediate_size:
            p += self.hidden_size
        return p

    def router_params(self) -> int:
        """Router (gate) weights, plus biases (see :func:`tessera_lab.model.kinds.router_params`)."""
        return kinds.router_params(self)

    def layer_params(self, layer: LayerSpec) -> dict[str, int]:
        """Parameters of one layer by component: ``mixer``, ``norms``, ``router``, ``experts``
        (all routed experts), ``shared``, ``dense_mlp`` and ``mtp`` (cached per layer kind, and per layer so
        that a layer seen before is found without building its index-0 key)."""
        cache = self._layer_param_cache
        got = cache.get(layer)
        if got is None:
            key = dataclasses.replace(layer, index=0)
            if key not in cache:
                cache[key] = kinds.layer_params(self, layer)
            got = cache[layer] = cache[key]
        return dict(got)

    def layer_active_params(self, layer: LayerSpec) -> int:
        """Parameters one token touches in this layer (top-k routed experts only)."""
        return kinds.layer_active_params(self, layer)

    @cached_property
    def _param_counts(self) -> ParamCounts:
        embedding = self.vocab.vocab_size * self.hidden_size
        lm_head = 0 if self.vocab.tie_word_embeddings else self.vocab.vocab_size * self.hidden_size
        final_norm = self.hidden_size
        main = [l for l in self.stack.layers if not l.mtp]
        body = sum(sum(self.layer_params(layer).values()) for layer in main) + final_norm
        active_body = sum(self.layer_active_params(layer) for layer in main) + final_norm
        mtp = sum(sum(self.layer_params(l).values()) for l in self.stack.mtp_layers)
        mtp_active = sum(self.layer_active_params(l) for l in self.stack.mtp_layers)
        # a tied head shares the embedding matrix: it still costs compute but adds no parameters
        head_active = self.vocab.vocab_size * self.hidden_size
        return ParamCounts(
            total=body + embedding + lm_head,
            embedding=embedding,
            lm_head=lm_head,
            non_embedding=body,
            active=active_body + embedding + (head_active if lm_head else 0),
            active_non_embedding=active_body,
            mtp=mtp,
            mtp_active=mtp_active,
        )

    def param_counts(self) -> ParamCounts:
        """Parameter counts from the module shapes (see :class:`ParamCounts` for the conventions); computed once."""
        return self._param_counts

    def summary(self) -> dict[str, Any]:
        """Plain-dict summary used by the CLI and notebooks."""
        return {
            "name": self.name,
            "model_type": self.model_type,
            "family": self.family,
            "layers": self.num_layers,
            "mtp_layers": len(self.stack.mtp_layers),
            "hidden_size": self.hidden_size,
            "pattern": self.layer_pattern(),
            "mixers": self.mixer_kinds(),
            "num_experts": self.moe.num_experts,
            "top_k": self.moe.num_experts_per_tok,
            "expert_width": self.moe.moe_intermediate_size,
            "shared_expert_width": self.moe.shared_expert_intermediate_size,
            "attention_ratio": self.attention_ratio,
        }


def mixer_kinds_text(labels: "list[str]") -> str:
    """``KDA x3 + MLA`` from per-layer mixer labels (order of first appearance; ``x1`` left out)."""
    counts = Counter(labels)
    return " + ".join(f"{k} x{counts[k]}" if counts[k] > 1 else k for k in dict.fromkeys(labels)) or "-"


# ---------------------------------------------------------------------- shipped models
def shipped_models() -> dict[str, Path]:
    """Shipped configs: name (file stem, e.g. ``qwen3-next-80b-a3b``) -> path under ``data/models``."""
    return {p.stem: p for p in sorted((data_dir() / "models").glob("*.json")) if not p.stem.startswith("_")}


def load_model(name_or_path: str | Path, *, allow_unknown_fields: bool = False, plan_mtp: bool = False,
               allow_structural_fields: bool = False) -> ModelSpec:
    """A shipped model by name (``tessera-lab models`` lists them), a ``config.json`` path, or a folder that holds
    one (a Hugging Face model folder).

    ``allow_unknown_fields``, ``allow_structural_fields`` and ``plan_mtp``: see :meth:`ModelSpec.from_hf_config`.

    Raises:
        ConfigError: the name is neither a shipped model nor an existing file, or names a folder without a
            ``config.json`` (lists the shipped names).
    """
    models = shipped_models()
    key = str(name_or_path)
    kw = {"allow_unknown_fields": allow_unknown_fields, "plan_mtp": plan_mtp,
          "allow_structural_fields": allow_structural_fields}
    if key in models:  # a shipped model is named, not located (its path is this machine's)
        return dataclasses.replace(ModelSpec.from_hf_config(models[key], name=key, **kw), path="")
    path = Path(key)
    if path.is_dir():  # a Hugging Face model folder holds its config.json
        if not (path / "config.json").is_file():
            raise ConfigError(f"model '{key}' is a folder without a config.json; allowed: a config.json path, a folder "
                              f"that holds one, or a shipped model ({', '.join(models)})")
        path = path / "config.json"
    if path.is_file():
        return ModelSpec.from_hf_config(path, **kw)
    if path.suffix == ".json" or "/" in key:
        raise ConfigError(f"model '{key}': no such file (a config.json path must name an existing file; shipped "
                          f"models: {', '.join(models)})")
    raise ConfigError(f"model '{key}' is neither a shipped model{did_you_mean(key, models)} ({', '.join(models)}) nor a "
                      "config.json path")


_VARIANT = re.compile(r"^(?P<base>[^\[]+)\[(?P<changes>[^\]]*)\]$")


def model_from_name(name: str) -> ModelSpec:
    """A shipped model or config path, or a variant name as :meth:`ModelSpec.with_changes` writes it
    (``qwen3-next-80b-a3b[expert=256,topk=4]``; keys of :data:`tessera_lab.model.knobs.VARIANT_KEYS`).

    Raises:
        ConfigError: unknown model or change key.
    """
    m = _VARIANT.match(name.strip())
    if not m:
        return load_model(name)
    base = load_model(m.group("base"))
    changes = {}
    for item in filter(None, m.group("changes").split(",")):
        k, _, v = item.partition("=")
        if k not in VARIANT_KEYS:
            raise ConfigError(f"field 'model' = {name!r}: change {k!r} is unknown{did_you_mean(k, VARIANT_KEYS)}; "
                              f"allowed: {', '.join(VARIANT_KEYS)}")
        try:
            changes[VARIANT_KEYS[k]] = int(v)
        except ValueError:
            raise ConfigError(f"field 'model' = {name!r}: {k}={v!r} is not an integer") from None
    return base.with_changes(**changes, name=name)


__all__ = [
    "ConfigError", "LayerSpec", "ModelSpec", "ParamCounts", "LayerStack", "AttentionSpec", "LinearMixerSpec", "MlpSpec",
    "MoESpec", "VocabSpec", "load_model", "shipped_models", "kind_letter",
    "published_params", "matches_published", "SUPPORTED_MODEL_TYPES",
]


def kind_letter(kind: str) -> str:
    """The :meth:`ModelSpec.layer_pattern` letter of a :attr:`LayerSpec.kind`: L linear mixer, A full (global)
    attention, S sliding window, C chunked, T MTP; a block without mixer: - (MLP) or E (MoE)."""
    mixer, _, detail = kind.split("+")[0].partition("/")
    if detail.startswith("mtp"):
        return "T"
    if mixer == NO_MIXER:
        return "E" if kind.endswith("+" + MOE) else "-"
    if mixer == FULL_ATTENTION and detail.startswith(("sliding", "chunked")):
        return "S" if detail.startswith("sliding") else "C"
    return {LINEAR_ATTENTION: "L", FULL_ATTENTION: "A", "none": "-"}.get(mixer, "?")


def layer_summary(layers: list[int], kinds: list[str]) -> str:
    """Short text of a stage's layers: ``"first-last (Ax1 Lx3)"`` (``"39 (Ax1)"`` for one layer), the letters of :meth:`ModelSpec.layer_pattern`
    (L linear mixer, A full attention, S sliding window, C chunked, T MTP, - / E an MLP / MoE block without mixer)
    with a ``d`` suffix for a dense FFN; ``"-"`` for no layers."""
    if not layers:
        return "-"
    counts = Counter(kind_letter(k) + ("d" if k.endswith("+dense") else "") for k in kinds)
    parts = " ".join(f"{k}x{n}" for k, n in sorted(counts.items()))
    span = str(layers[0]) if len(layers) == 1 else f"{layers[0]}-{layers[-1]}"
    return f"{span} ({parts})"
