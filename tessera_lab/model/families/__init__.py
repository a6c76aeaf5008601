"""The layer-kind registry: one small reader module per model family, found by ``model_type``.

A reader module (``tessera_lab/model/families/<family>.py``) declares:

* ``MODEL_TYPES``: the ``model_type`` values it reads (the first is the family's name);
* ``ARCHITECTURES``: the ``architectures`` entries that name it (a new ``model_type`` alias of a known architecture,
  such as Kimi-K2's ``kimi_k2`` naming ``DeepseekV3ForCausalLM``, is read by that reader, with a note);
* ``READS``: the config fields it reads; ``IGNORES``: fields it understands that do not change the plan
  (scaling factors, aux-loss coefficients, ...). A config field in neither set nor in :data:`COMMON_IGNORED` is
  *unknown*: the config is refused, naming it, unless unknown fields are allowed (then listed in the notes);
* ``build(cfg) -> dict``: keyword arguments of :class:`~tessera_lab.model.spec.ModelSpec` (layers, shapes);
* ``KNOBS``: ``with_changes`` keyword -> the config field it sets, or a function ``(cfg, value) -> None`` that
  rewrites the config keeping the family's placement rule;
* ``EXAMPLE``: a shipped model name of the family; ``SOURCE``: the reference implementation cited.

Multimodal configs: the language model's ``text_config`` is read (the vision tower is not planned; a note says so).
Adding a family is one module here plus its test; nothing else in the package changes.

This module never imports torch.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.families import (
    deepseek, glm4_moe, gpt_oss, jamba, kimi_linear, llama4, minimax, mixtral, nemotron_h, olmoe, qwen3, qwen3_next,
)

#: every reader, in the order ``tessera-lab models`` lists the families
READERS: tuple[ModuleType, ...] = (qwen3, qwen3_next, deepseek, mixtral, kimi_linear, minimax, jamba, nemotron_h,
                                   glm4_moe, gpt_oss, llama4, olmoe)

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
    if model_type in _BY_TYPE:
        return _BY_TYPE[model_type], cfg, notes
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


def _text_type(wrapper: Any, inner: Any) -> Any:
    """The text model_type of a wrapper whose text_config omits it (``llama4`` -> ``llama4_text``)."""
    guess = f"{wrapper}_text"
    return guess if guess in _BY_TYPE else inner


def unknown_fields(reader: ModuleType, cfg: Mapping[str, Any]) -> list[str]:
    """Config fields that neither the reader nor :data:`COMMON_IGNORED` knows (sorted)."""
    known = COMMON_IGNORED | WRAPPER_FIELDS | reader.READS | reader.IGNORES
    return sorted(k for k in cfg if k not in known)


def check_unknown(reader: ModuleType, cfg: Mapping[str, Any], *, allow: bool) -> list[str]:
    """Refuse a config with fields its reader does not understand, or (``allow``) return the note listing them.

    Raises:
        ConfigError: naming the fields and the model type, and how to proceed.
    """
    unknown = unknown_fields(reader, cfg)
    if not unknown:
        return []
    mt = cfg.get("model_type")
    listed = ", ".join(f"'{k}'" for k in unknown)
    if not allow:
        raise ConfigError(
            f"config field(s) {listed} are not understood by the {family_name(reader)} reader (model_type {mt!r}); "
            "they may change the layers (planning without them could be silently wrong); allowed: the fields of "
            f"{family_name(reader)} (docs/models.md), or pass --allow-unknown-fields to plan without them")
    return [f"ignored config field(s) not understood by the {family_name(reader)} reader: {listed} "
            "(--allow-unknown-fields)"]


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
