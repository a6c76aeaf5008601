"""ModelSpec's groups: every flat field in exactly one place, the flat form equal to what the family readers return,
and a spec rebuilt from its flat form equal to itself, on every shipped model."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tessera_lab.model import families
from tessera_lab.model.spec import (
    FIELD_GROUP, FLAT_FIELDS, SPEC_GROUPS, LayerSpec, ModelSpec, load_model, shipped_models,
)

TOP = [f.name for f in dataclasses.fields(ModelSpec) if f.name not in SPEC_GROUPS]


def test_every_field_in_one_place():
    group_fields = [f.name for c in SPEC_GROUPS.values() for f in dataclasses.fields(c)]
    assert len(group_fields) == len(set(group_fields)) == len(FIELD_GROUP)
    assert not set(group_fields) & set(TOP)
    assert sorted(FLAT_FIELDS) == sorted(group_fields + TOP)
    # a group's name is no flat field, and no flat field shadows a property or method of the spec
    assert not set(SPEC_GROUPS) & set(FLAT_FIELDS)
    assert not {n for n in group_fields if hasattr(ModelSpec, n)}
    assert sorted(SPEC_GROUPS) == ["attention", "linear", "mlp", "moe", "stack", "vocab"]


def _layer_dicts(layers) -> tuple[dict, ...]:
    return tuple(dataclasses.asdict(l) for l in layers)


@pytest.mark.parametrize("name", list(shipped_models()))
def test_flat_form_is_the_readers_output(name):
    """as_dict() holds, field by field, what the family reader returned for the config (the peer), the identity
    fields from_hf_config adds, and each group's default for a field the reader leaves out."""
    spec = load_model(name)
    cfg = json.loads(shipped_models()[name].read_text())
    reader, cfg, _ = families.resolve(cfg)
    built = reader.build(cfg)
    flat = spec.as_dict()
    assert list(flat) == list(FLAT_FIELDS)
    # from_hf_config reads these itself (a reader may say that its family ties the embeddings by default)
    built.setdefault("tie_word_embeddings", cfg.get("tie_word_embeddings") is True)
    built["vocab_size"] = cfg["vocab_size"]
    for key in FLAT_FIELDS:
        if key in ("layers", "mtp_layers"):
            assert flat[key] == _layer_dicts(built.get(key, ())), key
        elif key in built:
            assert flat[key] == built[key], key
        elif key in FIELD_GROUP:
            default = next(f.default for f in dataclasses.fields(SPEC_GROUPS[FIELD_GROUP[key]]) if f.name == key)
            assert flat[key] == default, key
    assert (flat["name"], flat["model_type"], flat["hidden_size"]) == (name, cfg["model_type"], cfg["hidden_size"])


@pytest.mark.parametrize("name", list(shipped_models()))
def test_rebuilt_from_flat_form(name):
    spec = load_model(name, plan_mtp=True)
    flat = {k: getattr(spec, k) for k in TOP}
    flat.update({k: getattr(getattr(spec, g), k) for k, g in FIELD_GROUP.items()})
    again = ModelSpec.from_fields(**flat)
    assert again == spec and hash(again) == hash(spec)
    assert again.param_counts() == spec.param_counts() and again.layer_pattern() == spec.layer_pattern()
    assert all(isinstance(l, LayerSpec) for l in again.stack.layers)


def test_value_reads_a_field_or_property_by_name():
    spec = load_model("qwen3-next-80b-a3b")
    assert spec.value("linear_num_key_heads") == spec.linear.linear_num_key_heads == 16  # config.json: 16
    assert spec.value("num_experts") == 512 and spec.value("attention_ratio") == 3  # config: 512 experts, interval 4
    assert spec.value("no_such_field", 0) == 0


def test_from_fields_refuses_an_unknown_keyword():
    spec = load_model("olmoe-1b-7b")
    flat = {k: v for k, v in spec.as_dict().items() if k in TOP}
    flat.update(layers=spec.stack.layers, num_attention_heads=16, num_key_value_heads=16, head_dim=128,
                vocab_size=50304, tie_word_embeddings=False)
    assert ModelSpec.from_fields(**flat).attention.head_dim == 128
    with pytest.raises(TypeError):
        ModelSpec.from_fields(**flat, num_expert=8)
