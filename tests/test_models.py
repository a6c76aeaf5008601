"""ModelSpec parsing, validation, knobs and parameter counts against published figures."""

from __future__ import annotations

import json

import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.model.spec import ModelSpec, load_model, matches_published, published_params, shipped_models


def raw(name: str) -> dict:
    return json.loads(shipped_models()[name].read_text())


def test_shipped_models_listed():
    assert set(shipped_models()) == {"qwen3-next-80b-a3b", "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-8b", "deepseek-v3",
                                     "tiny-runner",  # tiny-runner: the runner's model
                                     # current MoE and hybrid models
                                     "kimi-linear-48b-a3b", "minimax-m1", "jamba-1.5-mini", "nemotron-h-56b",
                                     "qwen3.5-35b-a3b", "glm-4.5-air", "gpt-oss-20b",
                                     "gpt-oss-120b",  # a published-run model (data/published)
                                     "llama-4-scout-17b-16e",
                                     "deepseek-v3.2", "kimi-k2-instruct", "olmoe-1b-7b", "qwen3-vl-30b-a3b",
                                     "nemotron-3-nano-30b-a3b",  # a published-run model (data/published)
                                     "llama-3.1-70b", "llama-3.1-405b"}  # dense published-run models


def test_qwen3_next_layer_pattern(qwen3_next):
    # full attention at layers 3, 7, ..., 47: (i + 1) % 4 == 0 (docs/concepts.md)
    full = [l.index for l in qwen3_next.stack.layers if l.mixer == "full_attention"]
    assert full == list(range(3, 48, 4))
    assert all(l.ffn == "moe" for l in qwen3_next.stack.layers)
    assert qwen3_next.attention_ratio == 3


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-8b"])
def test_param_counts_match_published(name):
    pub = published_params()[name]
    c = load_model(name).param_counts()
    assert matches_published(c.total, pub["total"])
    assert matches_published(c.non_embedding, pub["non_embedding"])
    if "activated" in pub:
        # conventions from published_params.json: Qwen3-Next's "3B activated" excludes embedding and
        # head; Qwen3 MoE's activated count includes both.
        active = c.active_non_embedding if name.startswith("qwen3-next") else c.active
        assert matches_published(active, pub["activated"])


def test_qwen3_next_active_hand_count(qwen3_next):
    """Active parameters worked out by hand from the config (no code shared with models.py)."""
    h, V = 2048, 151936
    # Gated DeltaNet: qkvz (2*2048 + 2*4096 outputs), ba (2*32), conv 8192*4, dt_bias + A_log, norm 128, out 4096->2048
    gdn = h * (2 * 2048 + 2 * 4096) + h * 64 + 8192 * 4 + 64 + 128 + 4096 * h
    # gated attention: q with gate (16*256*2), k, v (2*256 each), o, q/k norms
    attn = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    moe_active = h * 512 + 10 * 3 * h * 512 + 3 * h * 512 + h  # router, top-10 experts, shared, shared gate
    norms = 2 * h
    active_body = 36 * (gdn + moe_active + norms) + 12 * (attn + moe_active + norms) + h
    c = qwen3_next.param_counts()
    assert c.active_non_embedding == active_body
    assert c.active == active_body + 2 * V * h
    assert round(c.active_non_embedding / 1e9, 2) == 3.25  # "about 3.25B" in published_params.json
    assert round(c.active / 1e9, 2) == 3.87 or round(c.active / 1e9, 2) == 3.88


def test_deepseek_v3_counts():
    """DeepSeek-V3 technical report (arXiv 2412.19437): 671B total, 37B activated (main model, no MTP)."""
    c = load_model("deepseek-v3").param_counts()
    assert matches_published(c.total, 671e9)
    assert matches_published(c.active, 37e9)
    m = load_model("deepseek-v3")
    assert m.layer_pattern()[:4] == "aaaA"  # three dense layers then MoE


def test_mixtral_counts():
    """Mixtral 8x7B (Mistral AI announcement): 46.7B total, 12.9B active per token."""
    cfg = {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
        "vocab_size": 32000, "tie_word_embeddings": False,
    }
    c = ModelSpec.from_hf_config(cfg).param_counts()
    assert matches_published(c.total, 46.7e9)
    assert matches_published(c.active, 12.9e9)


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": -5}, "hidden_size"),
        ({"num_experts_per_tok": 600}, "num_experts_per_tok"),
        ({"layer_types": ["linear_attention"] * 47}, "layer_types"),
        ({"layer_types": ["linear_attention"] * 47 + ["mamba"]}, "layer_types"),
        ({"model_type": "gpt9", "architectures": None}, "model_type"),  # with architectures it is an alias
        ({"num_experts": None}, "num_experts"),
        ({"moe_intermediate_size": "wide"}, "moe_intermediate_size"),
    ],
)
def test_bad_config_names_field(change, field):
    cfg = raw("qwen3-next-80b-a3b")
    for k, v in change.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    with pytest.raises(ConfigError, match=field):
        ModelSpec.from_hf_config(cfg)


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        ModelSpec.from_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelSpec.from_hf_config(bad)
    with pytest.raises(ConfigError, match="neither a shipped model"):
        load_model("no-such-model")


def test_with_changes_knobs(qwen3_next):
    r1 = qwen3_next.with_changes(attention_ratio=1)
    assert r1.layer_pattern()[:6] == "LALALA"
    assert r1.attention_ratio == 1
    r7 = qwen3_next.with_changes(attention_ratio=7)
    assert sum(l.mixer == "full_attention" for l in r7.stack.layers) == 6
    wide = qwen3_next.with_changes(moe_intermediate_size=2048, num_experts_per_tok=4, num_experts=256)
    assert (wide.moe.moe_intermediate_size, wide.moe.num_experts_per_tok, wide.moe.num_experts) == (2048, 4, 256)
    # routed expert parameters scale with experts x width
    assert wide.routed_expert_params() == 3 * 2048 * 2048
    assert qwen3_next.with_changes(num_layers=24).num_layers == 24
    assert qwen3_next.with_changes(shared_expert_intermediate_size=0).shared_expert_params() == 0
    # the original is unchanged
    assert qwen3_next.moe.moe_intermediate_size == 512


def test_with_changes_bad_knobs(qwen3_next):
    with pytest.raises(ConfigError, match="attention_ratio"):
        qwen3_next.with_changes(attention_ratio=-1)
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        qwen3_next.with_changes(num_experts_per_tok=1000)
    with pytest.raises(ConfigError, match="hybrid"):
        load_model("qwen3-8b").with_changes(attention_ratio=3)
    with pytest.raises(ConfigError, match="dense"):
        load_model("qwen3-8b").with_changes(num_experts_per_tok=2)


def test_matches_published_rounding_rules():
    assert matches_published(30.532e9, 30.5e9)
    assert matches_published(233.85e9, 234e9)   # rounded
    assert matches_published(3.353e9, 3.3e9)    # truncated
    assert not matches_published(3.45e9, 3.3e9)
    assert not matches_published(81.2e9, 80e9)
