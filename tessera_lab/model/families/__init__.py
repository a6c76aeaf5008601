"""The layer-kind registry: one small reader module per model family, found by ``model_type``.

A reader module (``tessera_lab/model/families/<family>.py``) declares:

* ``MODEL_TYPES``: the ``model_type`` values it reads (the first is the family's name);
* ``ARCHITECTURES``: the ``architectures`` entries that name it (a new ``model_type`` alias of a known architecture,
  such as Kimi-K2's ``kimi_k2`` naming ``DeepseekV3ForCausalLM``, is read by that reader, with a note);
* the fields it knows, by what they do (:func:`field_kind`): ``READS``, the *structural* fields it reads (they set
  shapes or layer kinds); ``NEUTRAL`` (optional), structural fields it does not read, each with the value at which it
  changes nothing (``qkv_bias: false``): accepted at that value, with a note, refused at any other; ``IGNORES``,
  *numeric-only or ignorable* fields (scaling factors, aux-loss coefficients, ...), as :data:`COMMON_IGNORED`.
  Any other field is *unknown*: refused by name (:func:`check_unknown`), unless unknown fields are allowed; then
  the model is *approximate* and its first note says so; a field whose name says it is structural
  (:data:`STRUCTURAL_NAME`) is refused even then, unless structural fields are allowed too;
* ``build(cfg) -> dict``: keyword arguments of :class:`~tessera_lab.model.spec.ModelSpec` (layers, shapes);
* ``KNOBS``: ``with_changes`` keyword -> the config field it sets, or a function ``(cfg, value) -> None`` that
  rewrites the config keeping the family's placement rule;
* ``EXAMPLE``: a shipped model name of the family; ``SOURCE``: the reference implementation cited.

Multimodal configs: the language model's ``text_config`` is read (the vision tower is not planned; a note says so).
Adding a family is one module here plus its test; nothing else in the package changes.

This module never imports torch.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any, Mapping

from tessera_lab.checks import did_you_mean
from tessera_lab.errors import ConfigError
from tessera_lab.model.families import (
    deepseek, gemma4, glm4_moe, gpt_oss, jamba, kimi_linear, laguna, llama, llama4, mimo_v2, minimax, mixtral,
    nemotron_h, olmoe, qwen3, qwen3_next, unsupported,
)

#: every reader, in the order ``tessera-lab models`` lists the families
READERS: tuple[ModuleType, ...] = (qwen3, qwen3_next, deepseek, mixtral, kimi_linear, minimax, jamba, nemotron_h,
                                   glm4_moe, gpt_oss, llama4, olmoe, mimo_v2, gemma4,
                                   laguna, llama)

#: fields of every ``PretrainedConfig`` (and of common checkpoints) that do not change the plan: token ids,
#: initialisation, dropout, RoPE and its scaling, norm epsilons, context length, cache, dtype, quantization of the
#: stored checkpoint (the plan's own precision is ``--precision``), remote-code pointers
COMMON_IGNORED = frozenset({
    "_source", "_name_or_path", "_about", "architectures", "model_type", "transformers_version", "torch_dtype", "dtype",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "initializer_factor", "rms_norm_eps",
    "layer_norm_epsilon", "layer_norm_eps", "norm_eps", "max_position_embeddings", "rope_theta", "rope_scaling",
    "rope_parameters", "partial_rotary_factor", "use_cache", "attention_dropout", "hidden_dropout", "output_router_logits",
    "router_aux_loss_coef", "router_z_loss_coef", "router_jitter_noise", "aux_loss_alpha", "seq_aux",
    "quantization_config", "auto_map", "num_logits_to_keep", "pretraining_tp", "tessera_runner", "use_return_dict",
    "return_dict", "output_attentions", "output_hidden_states", "is_encoder_decoder", "hidden_size", "vocab_size",
    "tie_word_embeddings", "num_hidden_layers", "ep_size", "mamba_ssm_dtype", "residual_in_fp32",
    "rescale_prenorm_residual", "use_mamba_kernels", "initial_context_length", "routed_scaling_factor",
    "norm_topk_prob", "scoring_func", "moe_router_activation_func", "moe_renormalize", "topk_method",
    "use_grouped_topk", "swiglu_limit", "rope_interleave", "rope_type", "rotary_dim", "use_bfloat16",
    # PretrainedConfig's own attributes, written out by some transformers versions (generation and task settings)
    "sep_token_id", "decoder_start_token_id", "torchscript", "problem_type", "id2label", "label2id",
    "finetuning_task", "tokenizer_class", "prefix", "task_specific_params", "chunk_size_feed_forward",
    "add_cross_attention", "tie_encoder_decoder", "is_decoder", "cross_attention_hidden_size", "pruned_heads",
    "begin_suppress_tokens", "suppress_tokens", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p", "typical_p",
    "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "tf_legacy_loss",
    "_attn_implementation_autoset", "_commit_hash", "model_max_length",
})

#: multimodal wrapper fields: the vision tower and its tokens (not planned; the note says so)
WRAPPER_FIELDS = frozenset({"text_config", "vision_config", "image_token_id", "video_token_id", "vision_start_token_id",
                            "vision_end_token_id", "boi_token_index", "eoi_token_index", "image_token_index",
                            "projector_hidden_act", "vision_feature_layer", "vision_feature_select_strategy"})

_BY_TYPE: dict[str, ModuleType] = {t: r for r in READERS for t in r.MODEL_TYPES}
_BY_ARCH: dict[str, ModuleType] = {a: r for r in READERS for a in r.ARCHITECTURES}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_BY_TYPE)


def family_name(reader: ModuleType) -> str:
    """The family's name: its first ``model_type``."""
    return reader.MODEL_TYPES[0]


def reader_for(model_type: str) -> ModuleType:
    """The reader of a ``model_type``.

    Raises:
        ConfigError: the type has no reader (lists the supported ones).
    """
    if model_type not in _BY_TYPE:
        raise ConfigError(f"config field 'model_type' = {model_type!r} is not supported; allowed: "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    return _BY_TYPE[model_type]


def resolve(cfg: Mapping[str, Any]) -> tuple[ModuleType, dict[str, Any], list[str]]:
    """Find the reader of a parsed ``config.json``: ``(reader, the config it reads, notes)``.

    ``model_type`` is checked first (before any other field); a multimodal config's ``text_config`` is what is read;
    an unknown ``model_type`` whose ``architectures`` names a known architecture is read as that architecture.

    Raises:
        ConfigError: ``model_type`` missing or unsupported and no known architecture named.
    """
    notes: list[str] = []
    model_type = cfg.get("model_type")
    feature = unsupported.feature_of(cfg)
    if feature is not None:
        raise unsupported.refuse(model_type, feature)
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and (model_type not in _BY_TYPE or text.get("model_type") in _BY_TYPE):
        inner = dict(text)
        for key in ("tie_word_embeddings",):
            if key in cfg and key not in inner:
                inner[key] = cfg[key]
        inner.setdefault("_source", cfg.get("_source", ""))
        inner.setdefault("architectures", cfg.get("architectures"))
        vision = "the vision tower (vision_config) and the multimodal wrapper are" if "vision_config" in cfg else \
            "the multimodal wrapper is"
        notes.append(f"{model_type}: the language model (text_config, model_type {inner.get('model_type')!r}) is "
                     f"planned; {vision} not planned or counted")
        if inner.get("model_type") not in _BY_TYPE:
            inner["model_type"] = _text_type(model_type, inner.get("model_type"))
        cfg, model_type = inner, inner.get("model_type")
    else:
        cfg = dict(cfg)
    feature = unsupported.feature_of(cfg)  # a text_config's own type or fields
    if feature is not None:
        raise unsupported.refuse(model_type, feature)
    if model_type in _BY_TYPE:
        reader = _BY_TYPE[model_type]
        notes += _arch_note(reader, cfg)
        return reader, cfg, notes
    archs = cfg.get("architectures") or []
    if isinstance(archs, list):
        for arch in archs:
            if isinstance(arch, str) and arch in _BY_ARCH:
                reader = _BY_ARCH[arch]
                notes.append(f"model_type {model_type!r} is not a known type; read as {family_name(reader)} because "
                             f"'architectures' names {arch} (the same architecture)")
                return reader, cfg, notes
    reader_for(str(model_type) if model_type is not None else None)  # raises the one-line error
    raise AssertionError  # pragma: no cover


def _arch_note(reader: ModuleType, cfg: Mapping[str, Any]) -> list[str]:
    """A note when ``architectures`` names another family's architecture than ``model_type`` does (the
    ``model_type`` decides: it is what transformers reads)."""
    archs = cfg.get("architectures")
    if not isinstance(archs, list):
        return []
    other = [a for a in archs if isinstance(a, str) and a in _BY_ARCH and _BY_ARCH[a] is not reader]
    if not other:
        return []
    return [f"'architectures' names {other[0]} (family {family_name(_BY_ARCH[other[0]])}) but model_type "
            f"{cfg.get('model_type')!r} is read by the {family_name(reader)} reader; the model_type decides"]


def _text_type(wrapper: Any, inner: Any) -> Any:
    """The text model_type of a wrapper whose text_config omits it (``llama4`` -> ``llama4_text``)."""
    guess = f"{wrapper}_text"
    return guess if guess in _BY_TYPE else inner


#: a field name that says it sets shapes or layer kinds (``*_size``, ``*_layers``, ``*_experts``, ``*_pattern``,
#: ``*_type*``, ``*_dim``, ``*_heads``, ``*_rank``, ``num_*``, ``n_*``, ...): unknown, it is refused even with
#: ``--allow-unknown-fields`` (``--allow-structural-fields`` plans without it)
STRUCTURAL_NAME = re.compile(r"(_sizes?|_layers?|_experts?|_pattern|_dims?|_heads?|_rank|_groups?|_ratios?|_freq|"
                             r"_interval|_period|_offset|_mult|_list)$|_types?(_|$)|^(num|n)_|(^|_)layer_types")

#: fields that hold a JSON boolean wherever they appear (a string ``"false"`` would read as true)
BOOLEAN_FIELDS = frozenset({
    "tie_word_embeddings", "attention_bias", "mlp_bias", "qkv_bias", "use_qk_norm", "use_sliding_window",
    "attn_output_gate", "attention_output_gate", "use_conv_bias", "use_bias", "mamba_conv_bias", "mamba_proj_bias",
    "mamba_inner_layernorms", "use_routing_bias", "use_mtp", "mla_use_nope", "norm_topk_prob",
    "moe_shared_expert_overlap", "mtp_use_dedicated_embeddings", "use_cache", "enable_moe_block", "postnorm",
    "use_moe_router_bias", "use_grouped_topk", "moe_renormalize", "rope_interleave", "indexer_rope_interleave",
    "attention_k_eq_v", "mla_use_output_gate", "use_double_wide_mlp", "add_swa_attention_sink_bias", "add_full_attention_sink_bias",
})


def _is_neutral(value: Any, neutral: Any) -> bool:
    """Whether a config value equals a neutral value, type included (``"false"`` is not ``false``; ``0.0`` is 0);
    ``neutral`` a tuple: any of its values."""
    if isinstance(neutral, tuple):
        return any(_is_neutral(value, n) for n in neutral)
    if neutral is None or isinstance(neutral, bool):
        return value is neutral
    if isinstance(value, bool) or type(value) not in (int, float, str) or type(neutral) not in (int, float, str):
        return False
    if isinstance(neutral, str) or isinstance(value, str):
        return value == neutral and type(value) is type(neutral)
    return value == neutral


def field_kind(reader: ModuleType, key: str) -> str:
    """What a field does for a reader: ``"structural"`` (read: sets shapes or layer kinds), ``"neutral"``
    (structural, accepted only at its neutral value, ``reader.NEUTRAL``), ``"numeric"`` (numeric-only or ignorable:
    ``reader.IGNORES``, :data:`COMMON_IGNORED`) or ``"unknown"``."""
    if key in reader.READS:
        return "structural"
    if key in getattr(reader, "NEUTRAL", {}):
        return "neutral"
    if key in COMMON_IGNORED or key in WRAPPER_FIELDS or key in reader.IGNORES:
        return "numeric"
    return "unknown"


def unknown_fields(reader: ModuleType, cfg: Mapping[str, Any]) -> list[str]:
    """Config fields that neither the reader nor :data:`COMMON_IGNORED` knows (sorted)."""
    return sorted(k for k in cfg if field_kind(reader, k) == "unknown")


def check_types(cfg: Mapping[str, Any]) -> None:
    """Refuse a boolean field (:data:`BOOLEAN_FIELDS`) that is not a JSON boolean (``null``: the default applies).

    Raises:
        ConfigError: ``config field 'attention_bias' = 'false' is not a boolean; allowed: true or false``.
    """
    for key in sorted(BOOLEAN_FIELDS & set(cfg)):
        v = cfg[key]
        if v is not None and not isinstance(v, bool):
            raise ConfigError(f"config field '{key}' = {v!r} is not a boolean; allowed: true or false (a JSON "
                              "boolean, or null for the default)")


def check_neutral(reader: ModuleType, cfg: Mapping[str, Any]) -> list[str]:
    """Accept the reader's ``NEUTRAL`` fields at their neutral value (returns the note naming them); refuse any other
    value.

    Raises:
        ConfigError: naming the field, its value and the neutral value allowed.
    """
    neutral = getattr(reader, "NEUTRAL", {})
    seen = []
    for key in sorted(set(neutral) & set(cfg)):
        allowed = neutral[key]
        if not _is_neutral(cfg[key], allowed):
            shown = " or ".join(json_text(a) for a in (allowed if isinstance(allowed, tuple) else (allowed,)))
            raise ConfigError(f"config field '{key}' = {json_text(cfg[key])} is not supported by the "
                              f"{family_name(reader)} reader (it changes the layers); allowed: {shown}")
        seen.append(f"'{key}' = {json_text(cfg[key])}")
    if not seen:
        return []
    return [f"config field(s) {', '.join(seen)} at their neutral value (no effect on the layers)"]


def json_text(value: Any) -> str:
    """A config value as JSON writes it (``false``, ``null``, ``"false"``)."""
    import json

    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def check_unknown(reader: ModuleType, cfg: Mapping[str, Any], *, allow: bool,
                  allow_structural: bool = False) -> list[str]:
    """Refuse a config with fields its reader does not know, or return the note that lists the ignored ones.

    ``allow`` (``--allow-unknown-fields``) ignores unknown fields whose name does not say structural;
    ``allow_structural`` (``--allow-structural-fields``, with ``allow``) ignores the others too. The note returned
    starts ``approximate: N unknown field(s) ignored: ...`` (the model may differ from the checkpoint's).

    Raises:
        ConfigError: naming each refused field and why, and how to proceed.
    """
    unknown = unknown_fields(reader, cfg)
    if not unknown:
        return []
    mt = cfg.get("model_type")
    structural = [k for k in unknown if STRUCTURAL_NAME.search(k)]
    if not allow or (structural and not allow_structural):
        refused = unknown if not allow else structural
        known = [*reader.READS, *getattr(reader, "NEUTRAL", {}), *reader.IGNORES, *COMMON_IGNORED, *WRAPPER_FIELDS]
        why = ", ".join(f"'{k}'" + (" (its name says it sets shapes or layer kinds)" if k in structural else "")
                        + did_you_mean(k, known) for k in refused)
        how = ("pass --allow-unknown-fields to plan an approximate model without them" if not structural else
               "pass --allow-unknown-fields --allow-structural-fields to plan an approximate model without them")
        raise ConfigError(
            f"config field(s) {why} are not known to the {family_name(reader)} reader (model_type {mt!r}); planning "
            f"without them could be silently wrong; allowed: the fields of {family_name(reader)} (docs/models.md), "
            f"or {how}")
    listed = ", ".join(unknown)
    return [f"approximate: {len(unknown)} unknown field(s) ignored: {listed} (not known to the "
            f"{family_name(reader)} reader; the model may differ from the checkpoint's)"]


def apply_knob(reader: ModuleType, cfg: dict[str, Any], knob: str, value: Any) -> None:
    """Set a research knob on a config dict by the family's rule (``reader.KNOBS``).

    Raises:
        ConfigError: the family has no such knob.
    """
    action = getattr(reader, "KNOBS", {}).get(knob)
    if action is None:
        raise ConfigError(f"knob '{knob}' does not apply to the {family_name(reader)} family; knobs it has: "
                          f"{', '.join(sorted(getattr(reader, 'KNOBS', {}))) or 'none'}")
    if callable(action):
        action(cfg, value)
    else:
        cfg[action] = value


def config_name(cfg: Mapping[str, Any], path: Any) -> str:
    """The name of a model read from ``path``: the config's ``_name_or_path`` or ``name_or_path`` (a non-empty
    string), else the name of the folder that holds the file (``path``, a :class:`pathlib.Path`), else the
    file's stem (never a bare ``config`` when a folder names the model; ``Org--Model_config.json``: ``Org--Model``)."""
    for key in ("_name_or_path", "name_or_path"):
        v = cfg.get(key)
        if isinstance(v, str) and v.strip():
            return v.strip()
    folder = path.resolve().parent.name
    stem = path.stem
    for suffix in ("_config", "-config", ".config"):  # Org--Model_config.json: the model's name
        if stem.endswith(suffix) and len(stem) > len(suffix):
            stem = stem[: -len(suffix)]
    if stem == "config" and folder:
        return folder
    return stem or folder
