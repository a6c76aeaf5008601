"""The layer-kind registry: every shipped config reads, counts and plans; layer patterns against each
config's own rule; model FLOPs against hand derivations; nothing dropped silently; knobs by the family's rule.

Card figures (total / active) are from each model's Hugging Face model card; the convention each card counts by is
stated next to its expectation.
"""

from __future__ import annotations

import json

import pytest

from tessera_lab.cli.main import main
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import ModelSpec, load_model, matches_published, shipped_models
from tessera_lab.model.tasks import model_flops_per_iteration

NEW = ["kimi-linear-48b-a3b", "minimax-m1", "jamba-1.5-mini", "nemotron-h-56b", "qwen3.5-35b-a3b", "glm-4.5-air",
       "gpt-oss-20b", "llama-4-scout-17b-16e", "deepseek-v3.2", "kimi-k2-instruct", "olmoe-1b-7b", "qwen3-vl-30b-a3b"]


def raw(name: str) -> dict:
    return json.loads(shipped_models()[name].read_text())


def near(value: float, card: float, tol: float = 0.01) -> bool:
    return abs(value / card - 1) <= tol


# ---------------------------------------------------------------------- parameter counts against the cards
def test_card_counts():
    c = {n: load_model(n).param_counts() for n in NEW}
    # MiniMax-M1 456B / 45.9B: active without the embedding and the head
    assert near(c["minimax-m1"].total, 456e9) and near(c["minimax-m1"].active_non_embedding, 45.9e9)
    # Jamba-1.5-Mini 52B / 12B: both with embedding and head
    assert near(c["jamba-1.5-mini"].total, 52e9) and near(c["jamba-1.5-mini"].active, 12e9)
    # Nemotron-H-56B: dense, 56B total
    assert near(c["nemotron-h-56b"].total, 56e9) and c["nemotron-h-56b"].active == c["nemotron-h-56b"].total
    # Qwen3.5-35B-A3B: 35B total without the vision tower and the MTP layer (counted apart); "3B" active rounded
    assert near(c["qwen3.5-35b-a3b"].total, 35e9) and c["qwen3.5-35b-a3b"].mtp > 0
    assert matches_published(c["qwen3.5-35b-a3b"].active, 3e9)
    # GLM-4.5-Air 106B / 12B: total without the MTP layer; active without embedding and head ("12B" rounded)
    assert near(c["glm-4.5-air"].total, 106e9) and matches_published(c["glm-4.5-air"].active_non_embedding, 12e9)
    assert near(c["glm-4.5-air"].total + c["glm-4.5-air"].mtp, 109.2e9, 0.01)  # with the MTP layer
    # gpt-oss-20b 20.9B / 3.6B (OpenAI model card: active counts the unembedding, not the embedding)
    g = c["gpt-oss-20b"]
    assert near(g.total, 20.9e9) and near(g.active_non_embedding + g.lm_head, 3.6e9)
    # Llama-4-Scout 109B / 17B: the card's total includes the vision encoder; the language model is 107.8B (1.1%
    # under); active 17B with embedding and head
    assert near(c["llama-4-scout-17b-16e"].total, 109e9, 0.012)
    assert matches_published(c["llama-4-scout-17b-16e"].active, 17e9)  # "17B": 17.17B rounded
    # DeepSeek-V3.2 671B / 37B: V3's card figures without the MTP layer; the indexer adds 0.85B
    d = c["deepseek-v3.2"]
    assert near(d.total, 671e9) and near(d.active_non_embedding, 37e9, 0.02) and d.mtp > 11e9
    assert near(d.total - load_model("deepseek-v3").param_counts().total, 61 * (1536 * 64 * 128 + 7168 * 128 + 256
                                                                              + 7168 * 64), 1e-9)
    # OLMoE-1B-7B 6.9B / 1.3B with embedding and head
    assert near(c["olmoe-1b-7b"].total, 6.9e9) and matches_published(c["olmoe-1b-7b"].active, 1.3e9)
    # Kimi-K2 1.04T / 32B (README); the card's table says 1T: the module shapes give 1.026T (1.3% under 1.04T)
    k2 = c["kimi-k2-instruct"]
    assert near(k2.total, 1.04e12, 0.014) and matches_published(k2.active, 32e9)  # "32B": 32.86B truncated
    # Kimi-Linear 48B / 3B: 48B is the count without embedding and head (48.37B); "3B" active rounded
    kl = c["kimi-linear-48b-a3b"]
    assert near(kl.non_embedding, 48e9) and matches_published(kl.active_non_embedding, 3e9)
    # Qwen3-VL-30B-A3B: the language model is Qwen3-30B-A3B's (30.5B); the card's 30B is rounded
    assert c["qwen3-vl-30b-a3b"] == load_model("qwen3-30b-a3b").param_counts()


def test_kda_and_mla_layer_params_by_hand():
    """Kimi-Linear: one KDA layer and one MLA layer, from the module shapes written out here."""
    m = load_model("kimi-linear-48b-a3b")
    h, H, d, K = 2304, 32, 128, 4
    kda = (3 * h * H * d + 3 * H * d * K + H + h * d + d * H * d + H * d + h * H + h * d + d * H * d + d
           + H * d * h)
    mla = h * 32 * 192 + h * 576 + 512 + 512 * 32 * 256 + 32 * 128 * h
    assert m.mixer_params(m.stack.layers[0]) == kda
    assert m.mixer_params(m.stack.layers[3]) == mla


# ---------------------------------------------------------------------- layer patterns against each config's rule
def test_kimi_linear_pattern():
    m, cfg = load_model("kimi-linear-48b-a3b"), raw("kimi-linear-48b-a3b")
    kda = set(cfg["linear_attn_config"]["kda_layers"])  # 1-based layer numbers
    assert [l.attention for l in m.stack.layers] == ["kda" if i + 1 in kda else "mla" for i in range(27)]
    assert [l.index + 1 for l in m.stack.layers if l.attention == "mla"] == cfg["linear_attn_config"]["full_attn_layers"]
    assert [l.ffn for l in m.stack.layers] == ["dense"] + ["moe"] * 26  # first_k_dense_replace = 1
    assert m.mixer_kinds([0, 1, 2, 3]) == "KDA x3 + MLA"


def test_nemotron_h_pattern():
    m, pat = load_model("nemotron-h-56b"), raw("nemotron-h-56b")["hybrid_override_pattern"]
    kinds = {"M": ("mamba2", "none"), "*": ("gqa", "none"), "-": ("none", "dense")}
    assert [(l.attention, l.ffn) for l in m.stack.layers] == [kinds[c] for c in pat]
    assert (pat.count("M"), pat.count("*"), pat.count("-")) == (54, 10, 54)


def test_jamba_pattern():
    m = load_model("jamba-1.5-mini")
    assert [l.index for l in m.stack.layers if l.attention == "gqa"] == [i for i in range(32) if i % 8 == 4]
    assert [l.index for l in m.stack.layers if l.ffn == "moe"] == [i for i in range(32) if i % 2 == 1]
    assert all(l.attention == "mamba" for l in m.stack.layers if l.index % 8 != 4)


def test_gpt_oss_alternation():
    m = load_model("gpt-oss-20b")
    assert [(l.local, l.window) for l in m.stack.layers] == [("sliding", 128) if i % 2 == 0 else ("", 0) for i in range(24)]
    assert m.attention.attention_sinks and m.layer_pattern() == "SA" * 12


def test_llama4_chunked_nope_and_moe_interleave():
    m = load_model("llama-4-scout-17b-16e")
    nope = [i for i in range(48) if (i + 1) % 4 == 0]  # no_rope_layer_interval 4
    assert [l.index for l in m.stack.layers if not l.rope] == nope
    assert [l.index for l in m.stack.layers if l.local == "chunked"] == [i for i in range(48) if i not in nope]
    assert all(l.window == 8192 for l in m.stack.layers if l.local == "chunked")
    assert all(l.ffn == "moe" for l in m.stack.layers)  # interleave_moe_layer_step 1
    two = m.with_changes(moe_every=2)
    assert [l.index for l in two.stack.layers if l.ffn == "moe"] == list(range(1, 48, 2))
    assert all(l.dense_width == 16384 for l in two.stack.layers if l.ffn == "dense")  # intermediate_size_mlp


def test_deepseek_dense_first_layers_and_mtp():
    for name, dense in (("deepseek-v3", 3), ("deepseek-v3.2", 3), ("kimi-k2-instruct", 1), ("glm-4.5-air", 1)):
        m = load_model(name)
        assert [l.ffn for l in m.stack.layers[:dense + 1]] == ["dense"] * dense + ["moe"], name
    m = load_model("deepseek-v3")
    assert len(m.stack.mtp_layers) == 1 and m.num_layers == 61
    planned = load_model("deepseek-v3", plan_mtp=True)
    assert planned.num_layers == 62 and planned.stack.layers[-1].mtp and planned.stack.layers[-1].ffn == "moe"
    assert planned.param_counts() == m.param_counts()  # planning the MTP layer does not change the card counts
    assert all(l.attention == "mla_sparse" for l in load_model("deepseek-v3.2").stack.layers)


def test_minimax_and_qwen35_patterns():
    m, types = load_model("minimax-m1"), raw("minimax-m1")["attn_type_list"]
    assert [l.attention for l in m.stack.layers] == ["gqa" if t else "lightning" for t in types]
    q = load_model("qwen3.5-35b-a3b")
    assert [l.index for l in q.stack.layers if l.mixer == "full_attention"] == list(range(3, 40, 4))
    assert any("vision tower" in n for n in q.notes) and len(q.stack.mtp_layers) == 1


# ---------------------------------------------------------------------- model FLOPs per token by hand
def flops_per_token(m: ModelSpec, seq: int) -> float:
    p = ParallelConfig(pp=1, ep=1, microbatches=1, seq_len=seq)
    return model_flops_per_iteration(m, p) / p.tokens_per_iteration


def test_gpt_oss_flops_by_hand():
    h, nh, nkv, hd, E_w, k, V, s, w = 2880, 64, 8, 64, 2880, 4, 201088, 4096, 128
    gemm = 2 * (h * nh * hd + 2 * h * nkv * hd + nh * hd * h) + 2 * k * 3 * h * E_w
    full, sliding = 4 * (s / 2) * nh * hd, 4 * ((s * w - w * w / 2) / s) * nh * hd
    fwd = 24 * gemm + 12 * (full + sliding) + 2 * h * V
    assert flops_per_token(load_model("gpt-oss-20b"), s) == pytest.approx(3 * fwd, rel=1e-12)


def test_kimi_linear_flops_by_hand():
    h, H, d, s, V = 2304, 32, 128, 4096, 163840
    kda = 2 * (h * (3 * H * d + H + 2 * d) + d * 2 * H * d + H * d * h) + H * (6 * d * d + 2 * 64 * 2 * d)
    mla = 2 * (h * 32 * 192 + h * 576 + 512 * 32 * 256 + 32 * 128 * h) + 2 * (s / 2) * 32 * (192 + 128)
    moe = 2 * (8 * 3 * h * 1024 + 3 * h * 1024)  # top-8 routed + one shared expert
    fwd = 20 * kda + 7 * mla + 2 * 3 * h * 9216 + 26 * moe + 2 * h * V
    assert flops_per_token(load_model("kimi-linear-48b-a3b"), s) == pytest.approx(3 * fwd, rel=1e-12)


def test_minimax_flops_by_hand():
    h, nh, nkv, hd, w, s, V = 6144, 64, 8, 128, 9216, 4096, 200064
    inner = nh * hd
    lightning = 2 * (h * 4 * inner + inner * h) + nh * (4 * hd * hd + 2 * 64 * 2 * hd)
    full = 2 * (h * inner + 2 * h * nkv * hd + inner * h) + 4 * (s / 2) * nh * hd
    fwd = 70 * lightning + 10 * full + 80 * 2 * 2 * 3 * h * w + 2 * h * V
    assert flops_per_token(load_model("minimax-m1"), s) == pytest.approx(3 * fwd, rel=1e-12)


def test_nemotron_h_flops_by_hand():
    h, H, P, G, N, s, V, ffn = 8192, 256, 64, 8, 256, 4096, 131072, 32768
    inner = H * P
    conv = inner + 2 * G * N
    mamba = 2 * (h * (inner + conv + H) + inner * h) + H * (4 * N * P + 2 * 128 * (N + P))
    attn = 2 * (h * 64 * 128 + 2 * h * 8 * 128 + 64 * 128 * h) + 4 * (s / 2) * 64 * 128
    mlp = 2 * 2 * h * ffn  # squared ReLU: up and down
    fwd = 54 * mamba + 10 * attn + 54 * mlp + 2 * h * V
    assert flops_per_token(load_model("nemotron-h-56b"), s) == pytest.approx(3 * fwd, rel=1e-12)


def test_llama4_chunked_flops_by_hand():
    h, nh, nkv, hd, w, s, V, c = 5120, 40, 8, 128, 8192, 16384, 202048, 8192
    proj = 2 * (h * nh * hd + 2 * h * nkv * hd + nh * hd * h) + 2 * (3 * h * w + 3 * h * w)  # 1 routed + shared
    chunked = 4 * (2 * c * c / 2 / s) * nh * hd
    full = 4 * (s / 2) * nh * hd
    fwd = 48 * proj + 36 * chunked + 12 * full + 2 * h * V
    assert flops_per_token(load_model("llama-4-scout-17b-16e"), s) == pytest.approx(3 * fwd, rel=1e-12)


# ---------------------------------------------------------------------- nothing dropped silently
def test_minimax_relabelled_mixtral_is_refused_naming_fields():
    cfg = raw("minimax-m1")
    cfg["model_type"] = "mixtral"
    with pytest.raises(ConfigError, match=r"'attn_type_list'.*mixtral") as err:
        ModelSpec.from_hf_config(cfg)
    assert "postnorm" in str(err.value)
    # attn_type_list names a layer-kind list: --allow-unknown-fields alone still refuses it (the model has 70
    # lightning-attention layers a mixtral reading would drop)
    with pytest.raises(ConfigError, match=r"'attn_type_list' \(its name says.*--allow-structural-fields"):
        ModelSpec.from_hf_config(cfg, allow_unknown_fields=True)
    m = ModelSpec.from_hf_config(cfg, allow_unknown_fields=True, allow_structural_fields=True)
    assert m.notes[0].startswith("approximate: ") and "attn_type_list" in m.notes[0] and m.approximate == m.notes[0]
    assert all(l.attention == "gqa" for l in m.stack.layers)
    assert any("MiniMaxM1ForCausalLM" in n and "model_type decides" in n for n in m.notes)


def test_nemotron_h_infinity_is_not_the_error(tmp_path):
    m = load_model("nemotron-h-56b")  # time_step_limit [0.0, Infinity] in the file
    assert m.num_layers == 118
    text = shipped_models()["nemotron-h-56b"].read_text().replace('"nemotron_h"', '"nemotron_x"')
    path = tmp_path / "c.json"
    path.write_text(text.replace('"NemotronHForCausalLM"', '"NemotronXForCausalLM"'))
    with pytest.raises(ConfigError, match="model_type") as err:
        load_model(str(path))
    assert "time_step_limit" not in str(err.value)


def test_alias_and_text_config_notes():
    k2 = load_model("kimi-k2-instruct")
    assert k2.family == "deepseek_v3" and any("DeepseekV3ForCausalLM" in n for n in k2.notes)
    assert any("vision tower" in n for n in load_model("qwen3-vl-30b-a3b").notes)


def test_cli_unknown_field_exit_2(tmp_path, capsys):
    cfg = raw("minimax-m1")
    cfg["model_type"] = "mixtral"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(cfg))
    assert main(["params", str(path)]) == 2
    err = capsys.readouterr().err
    assert "attn_type_list" in err and "mixtral" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------- knobs
def test_attention_ratio_kimi_linear_by_hand():
    m = load_model("kimi-linear-48b-a3b")
    r1 = m.with_changes(attention_ratio=1)
    full = [i for i in range(1, 28) if i % 2 == 0 or i == 27]  # every 2nd layer and the last
    assert [l.index + 1 for l in r1.stack.layers if l.attention == "mla"] == full
    kda, mla = m.mixer_params(m.stack.layers[0]), m.mixer_params(m.stack.layers[3])
    assert r1.param_counts().total - m.param_counts().total == (len(full) - 7) * (mla - kda)
    assert r1.param_counts().active - m.param_counts().active == (len(full) - 7) * (mla - kda)


def test_attention_ratio_qwen35_by_hand():
    m = load_model("qwen3.5-35b-a3b")
    r1 = m.with_changes(attention_ratio=1)
    assert [l.index for l in r1.stack.layers if l.mixer == "full_attention"] == list(range(1, 40, 2))
    h = 2048
    gdn = h * (2 * 2048 + 2 * 4096) + h * 64 + 8192 * 4 + 64 + 128 + 4096 * h
    attn = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    assert r1.param_counts().total - m.param_counts().total == 10 * (attn - gdn)


def test_ratio_without_full_attention_refused_unless_asked():
    for name, ratio in (("qwen3.5-35b-a3b", 40), ("minimax-m1", 80), ("qwen3-next-80b-a3b", 100)):
        with pytest.raises(ConfigError, match="no full-attention layer"):
            load_model(name).with_changes(attention_ratio=ratio)
        m = load_model(name).with_changes(attention_ratio=ratio, allow_no_full_attention=True)
        assert not any(l.mixer == "full_attention" for l in m.stack.layers)
    with pytest.raises(ConfigError, match="needs a hybrid"):
        load_model("gpt-oss-20b").with_changes(attention_ratio=1)


def test_other_knobs():
    g = load_model("glm-4.5-air").with_changes(shared_experts=2)
    assert g.moe.shared_expert_intermediate_size == 2 * 1408
    w = load_model("gpt-oss-20b").with_changes(window=1024)
    assert {l.window for l in w.stack.layers} == {0, 1024}
    j = load_model("jamba-1.5-mini").with_changes(moe_every=4)
    assert [l.index for l in j.stack.layers if l.ffn == "moe"] == [i for i in range(32) if i % 4 == 1]
    n = load_model("nemotron-h-56b").with_changes(attention_ratio=3)
    assert n.layer_pattern().count("A") == 16  # 64 mixer blocks, every 4th attention


def test_params_cli_takes_knobs(capsys):
    assert main(["params", "kimi-linear-48b-a3b", "--attention-ratio", "1", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mixers"] == "KDA x13 + MLA x14" and out["model"].endswith("[ratio=1]")


# ---------------------------------------------------------------------- plans
#: a layout each model fits at (H200, 4096 tokens a sequence)
LAYOUTS = {
    "kimi-linear-48b-a3b": ["--pp", "4", "--ep", "8"], "minimax-m1": ["--pp", "16", "--ep", "32"],
    "jamba-1.5-mini": ["--pp", "4", "--ep", "8"], "nemotron-h-56b": ["--pp", "4", "--ep", "1", "--tp", "8"],
    "qwen3.5-35b-a3b": ["--pp", "4", "--ep", "8"], "glm-4.5-air": ["--pp", "4", "--ep", "8"],
    "gpt-oss-20b": ["--pp", "4", "--ep", "8"], "llama-4-scout-17b-16e": ["--pp", "4", "--ep", "8"],
    "deepseek-v3.2": ["--pp", "16", "--ep", "64"], "kimi-k2-instruct": ["--pp", "16", "--ep", "64"],
    "olmoe-1b-7b": ["--pp", "4", "--ep", "8"], "qwen3-vl-30b-a3b": ["--pp", "4", "--ep", "8"],
}


@pytest.mark.parametrize("name", NEW)
def test_every_added_family_config_plans(name, capsys):
    pp = LAYOUTS[name][1]
    args = ["plan", "--model", name, *LAYOUTS[name], "--microbatches", str(2 * int(pp))]
    assert main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "mixers" in out and load_model(name).mixer_kinds().split(" x")[0] in out


def test_mtp_planned_on_last_stage(capsys):
    assert main(["plan", "--model", "glm-4.5-air", "--pp", "8", "--ep", "8", "--microbatches", "16", "--mtp"]) == 0
    out = capsys.readouterr().out
    assert "MTP" in out and "MTP layer(s) planned" in out


def test_a_config_not_given_llama4_maverick():
    """Llama-4-Maverick (github:ai-dynamo/aiconfigurator@64c5ddb6 model_configs/meta-llama--Llama-4-Maverick-17B-128E-
    Instruct_config.json, text_config as vendored): card 400B total / 17B active; MoE every 2nd layer (layers 1, 3, ...)
    with dense MLPs of intermediate_size_mlp between."""
    text = {"attention_bias": False, "attention_chunk_size": 8192, "attention_dropout": 0.0, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 5120, "interleave_moe_layer_step": 2, "intermediate_size": 8192,
            "intermediate_size_mlp": 16384, "max_position_embeddings": 1048576, "model_type": "llama4_text",
            "num_attention_heads": 40, "num_experts_per_tok": 1, "num_hidden_layers": 48, "num_key_value_heads": 8,
            "num_local_experts": 128, "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_scaling": None,
            "rope_theta": 500000.0, "router_aux_loss_coef": 0.001, "torch_dtype": "bfloat16", "use_cache": True,
            "use_qk_norm": False, "vocab_size": 202048}
    cfg = {"architectures": ["Llama4ForConditionalGeneration"], "boi_token_index": 200080, "eoi_token_index": 200081,
           "image_token_index": 200092, "model_type": "llama4", "text_config": text, "torch_dtype": "bfloat16",
           "transformers_version": "4.51.0.dev0", "vision_config": {"hidden_size": 1408, "num_hidden_layers": 34}}
    m = ModelSpec.from_hf_config(cfg)
    assert [l.index for l in m.stack.layers if l.ffn == "moe"] == list(range(1, 48, 2))
    c = m.param_counts()
    assert near(c.total, 400e9) and matches_published(c.active, 17e9)


#: NVIDIA-Nemotron-3-Nano-30B-A3B config.json as quoted in a public GitHub test module of nemotron3_jax (JAX authors,
#: NEMOTRON3_30B_JSON); card: 31.6B total, 3.6B active with embeddings
NEMOTRON3_NANO = (
    '{"architectures": ["NemotronHForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,'
    '"bos_token_id": 1, "chunk_size": 128, "conv_kernel": 4, "eos_token_id": 2, "expand": 2,'
    '"head_dim": 128, "hidden_dropout": 0.0, "hidden_size": 2688,'
    '"hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",'
    '"initializer_range": 0.02, "intermediate_size": 1856, "layer_norm_epsilon": 1e-05,'
    '"mamba_head_dim": 64, "mamba_hidden_act": "silu", "mamba_num_heads": 64, "mamba_proj_bias": false,'
    '"mamba_ssm_cache_dtype": "float32", "max_position_embeddings": 262144, "mlp_bias": false,'
    '"mlp_hidden_act": "relu2", "model_type": "nemotron_h", "moe_intermediate_size": 1856,'
    '"moe_shared_expert_intermediate_size": 3712, "n_group": 1, "n_groups": 8, "n_routed_experts": 128,'
    '"n_shared_experts": 1, "norm_eps": 1e-05, "norm_topk_prob": true, "num_attention_heads": 32,'
    '"num_experts_per_tok": 6, "num_hidden_layers": 52, "num_key_value_heads": 2, "num_logits_to_keep": 1,'
    '"pad_token_id": 0, "partial_rotary_factor": 1.0, "rescale_prenorm_residual": true,'
    '"residual_in_fp32": false, "rope_theta": 10000, "routed_scaling_factor": 2.5, "sliding_window": null,'
    '"ssm_state_size": 128, "tie_word_embeddings": false, "time_step_floor": 0.0001, "time_step_max": 0.1,'
    '"time_step_min": 0.001, "topk_group": 1, "torch_dtype": "bfloat16", "transformers_version": "4.55.4",'
    '"use_bias": false, "use_cache": true, "use_conv_bias": true, "use_mamba_kernels": true,'
    '"vocab_size": 131072}'
)


def test_a_config_not_given_nemotron3_nano_moe_blocks():
    m = ModelSpec.from_hf_config(json.loads("".join(NEMOTRON3_NANO)))
    pat = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    kinds = {"M": ("mamba2", "none"), "*": ("gqa", "none"), "E": ("none", "moe")}
    assert [(l.attention, l.ffn) for l in m.stack.layers] == [kinds[c] for c in pat]
    c = m.param_counts()
    assert near(c.total, 31.6e9) and near(c.active, 3.6e9)
    # ReLU^2 experts have no gate projection: 2 h w per routed expert
    assert m.routed_expert_params() == 2 * 2688 * 1856 and m.shared_expert_params() == 2 * 2688 * 3712


def test_a_config_not_given_minimax_m2():
    """MiniMax-M2 (config values as quoted by a public GitHub vLLM-hook test module, attn_type_list [1] * 62):
    card 230B total / 10B active (without embedding and head); MTP modules counted apart."""
    cfg = {'model_type': 'minimax_m2',
           'architectures': ['MiniMaxM2ForCausalLM'],
           'hidden_act': 'silu',
           'hidden_size': 3072,
           'intermediate_size': 1536,
           'num_hidden_layers': 62,
           'num_attention_heads': 48,
           'num_key_value_heads': 8,
           'head_dim': 128,
           'rotary_dim': 64,
           'num_local_experts': 256,
           'num_experts_per_tok': 8,
           'shared_intermediate_size': 0,
           'scoring_func': 'sigmoid',
           'use_routing_bias': True,
           'output_router_logits': False,
           'use_qk_norm': True,
           'qk_norm_type': 'per_layer',
           'max_position_embeddings': 204800,
           'vocab_size': 200064,
           'rms_norm_eps': 1e-06,
           'attention_dropout': 0.0,
           'router_jitter_noise': 0.0,
           'num_mtp_modules': 3,
           'mtp_transformer_layers': 1,
           'use_mtp': True,
           'attention_bias': False,
           'tie_word_embeddings': False}
    cfg["attn_type_list"] = [1] * 62
    m = ModelSpec.from_hf_config(cfg)
    assert all(l.attention == "gqa" for l in m.stack.layers) and m.attention.qk_norm_full and len(m.stack.mtp_layers) == 3
    c = m.param_counts()
    assert near(c.total, 230e9) and matches_published(c.active_non_embedding, 10e9)


def test_qwen35_dense_text_config_by_hand():
    """A dense Qwen3.5 (text_config model_type qwen3_5_text, no experts): every layer a SwiGLU MLP; counted by hand."""
    cfg = raw("qwen3.5-35b-a3b")
    text = {k: v for k, v in cfg["text_config"].items() if k not in (
        "num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
        "mlp_only_layers")}
    text.update(model_type="qwen3_5_text", intermediate_size=6144)
    m = ModelSpec.from_hf_config({**cfg, "model_type": "qwen3_5", "text_config": text})
    h, V = 2048, 248320
    gdn = h * (2 * 2048 + 2 * 4096) + h * 64 + 8192 * 4 + 64 + 128 + 4096 * h
    attn = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h + 2 * 256
    body = 30 * gdn + 10 * attn + 40 * (3 * h * 6144 + 2 * h) + h
    assert not m.has_moe and m.param_counts().total == body + 2 * V * h
    assert m.layer_pattern() == "llla" * 10


def test_attention_ratio_is_the_period_of_the_placement():
    """Kimi-Linear places MLA at 1-based layers 4, 8, ..., 24 and 27 (its config's full_attn_layers): three KDA
    layers per MLA layer, with one shorter run at the end; 20 KDA // 7 MLA would say 2."""
    from tessera_lab.model.spec import load_model

    kimi = load_model("kimi-linear-48b-a3b")
    assert kimi.layer_pattern().upper().count("A") == 7
    assert kimi.attention_ratio == 3
    assert load_model("jamba-1.5-mini").attention_ratio == 7  # attn_layer_period 8


def test_gpt_oss_top_k_knob_sets_both_spellings():
    """gpt-oss's config carries top-k as experts_per_token and num_experts_per_tok (refused when they differ): the
    knob changes both, so every top-k plans."""
    from tessera_lab.model.spec import load_model

    m = load_model("gpt-oss-20b").with_changes(num_experts_per_tok=2)
    assert m.moe.num_experts_per_tok == 2 and m.raw["experts_per_token"] == 2


def test_glm4v_moe_wrapper_reads_its_text_model_as_glm4_moe():
    # GLM-4.5V: Glm4vMoeTextConfig subclasses Glm4MoeConfig (modular_glm4v_moe.py); its text model is GLM-4.5-Air's
    text = {**raw("glm-4.5-air"), "model_type": "glm4v_moe_text"}
    text.pop("architectures", None)
    wrapper = {"model_type": "glm4v_moe", "architectures": ["Glm4vMoeForConditionalGeneration"], "text_config": text,
               "vision_config": {"hidden_size": 1536}, "image_token_id": 151363}
    m = ModelSpec.from_hf_config(wrapper)
    assert m.family == "glm4_moe" and m.param_counts() == load_model("glm-4.5-air").param_counts()
    assert any("vision tower" in n for n in m.notes)


# ---------------------------------------------------------------------- Laguna (transformers modeling_laguna.py)
LAGUNA = __import__("pathlib").Path(__file__).parent / "data" / "laguna" / "poolside--Laguna-XS.2_config.json"


def test_laguna_layers_by_the_reference_rule_and_card_counts():
    cfg = json.loads(LAGUNA.read_text())
    m = ModelSpec.from_hf_config(LAGUNA)
    # LagunaDecoderLayer: sliding when layer_types[i] == "sliding_attention"; MoE when mlp_layer_types[i] == "sparse"
    expect = "".join(("S" if t == "sliding_attention" else "A").lower() if f == "dense" else
                     ("S" if t == "sliding_attention" else "A")
                     for t, f in zip(cfg["layer_types"], cfg["mlp_layer_types"]))
    assert m.layer_pattern() == expect == "aSSS" + "ASSS" * 9
    assert [l.heads for l in m.stack.layers[:4]] == [48, 64, 64, 64] and all(l.head_gate for l in m.stack.layers)
    # card (sglang cookbook, Poolside's model card): 33.4B total, 3.0B active, both with embedding and head
    c = m.param_counts()
    assert matches_published(c.total, 33.4e9) and matches_published(c.active, 3.0e9), (c.total, c.active)
    # LagunaConfig defaults: without the lists every layer global with num_attention_heads, the first layer dense
    plain = {k: v for k, v in cfg.items() if k not in ("layer_types", "num_attention_heads_per_layer",
                                                         "mlp_layer_types", "mlp_only_layers")}
    assert ModelSpec.from_hf_config(plain).layer_pattern() == "a" + "A" * 39


def test_laguna_layer_params_and_head_gate_by_hand():
    m = ModelSpec.from_hf_config(LAGUNA)
    h, hd, nkv, E, w, sw, dw = 2048, 128, 8, 256, 512, 512, 8192
    full, swa = m.stack.layers[4], m.stack.layers[1]
    # LagunaAttention: q, k, v, o, q/k RMSNorm of head_dim, g_proj h x heads (one gate per head)
    for layer, nh in ((full, 48), (swa, 64)):
        assert m.mixer_params(layer) == h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 2 * hd + h * nh
    p = m.layer_params(full)
    # router weight and e_score_correction_bias, SwiGLU experts, ungated shared expert
    assert (p["router"], p["experts"], p["shared"]) == (h * E + E, E * 3 * h * w, 3 * h * sw)
    assert m.layer_params(m.stack.layers[0])["dense_mlp"] == 3 * h * dw
    # the gate's GEMM rides on the q/k/v projection (h -> q, k, v and the heads' gates); the gating reads o and
    # the gates and writes o_proj's input
    from tessera_lab.model.tasks import layer_tasks

    par = ParallelConfig(pp=1, ep=1, microbatches=1, seq_len=4096)
    tasks = {t.name: t for t in layer_tasks(m, swa, par).F}
    assert tasks["qkv_proj"].flops == pytest.approx(2 * 4096 * h * (64 * hd + 2 * nkv * hd + 64))
    assert tasks["head_gate"].bytes == pytest.approx(2 * 4096 * (2 * 64 * hd + 64))


def test_laguna_refusals_and_types():
    cfg = json.loads(LAGUNA.read_text())
    for change, match in (({"gating": "per-element"}, "'gating' = \"per-element\" is not supported"),
                          ({"moe_apply_router_weight_on_input": True}, "'moe_apply_router_weight_on_input' = true"),
                          ({"mlp_only_layers": [0, 1]}, "'mlp_only_layers' = \\[0, 1\\] and 'mlp_layer_types' disagree"),
                          ({"num_attention_heads_per_layer": [48] * 39}, "'num_attention_heads_per_layer' must list 40"),
                          ({"num_key_value_heads": 7}, "'num_key_value_heads' = 7 must divide"),
                          ({"attention_bias": "false"}, "'attention_bias' = 'false' is not a boolean"),
                          ({"tie_word_embeddings": "false"}, "'tie_word_embeddings' = 'false' is not a boolean"),
                          ({"num_experts_per_tok": 8.5}, "num_experts_per_tok"),
                          ({"use_mla": True}, "'use_mla'")):
        with pytest.raises(ConfigError, match=match):
            ModelSpec.from_hf_config({**cfg, **change})


def test_laguna_layers_knob_keeps_the_layout():
    m = ModelSpec.from_hf_config(LAGUNA).with_changes(num_layers=10)
    # the per-layer lists tiled: global (48 heads) then three sliding (64 heads); the first layer stays dense
    assert m.layer_pattern() == "aSSSASSSAS" and [l.heads for l in m.stack.layers[:5]] == [48, 64, 64, 64, 48]


@pytest.mark.parametrize("size,total", [("8B", 8_030_261_248), ("70B", 70_553_706_496), ("405B", 405_853_388_800)])
def test_llama_dense_counts_and_flops_by_hand(size, total):
    """Llama 3.1 (model_type llama, the vendored AIConfigurator configs): the parameter count by hand equals the
    checkpoint's published total (its safetensors index); no q/k norm (LlamaAttention has none, Qwen3's has);
    an MLP bias, which the layer decomposition does not have, is refused by name."""
    path = f"tests/data/aiconfigurator_configs/meta-llama--Meta-Llama-3.1-{size}_config.json"
    cfg = json.loads(open(path).read())
    m = ModelSpec.from_hf_config(path)
    h, f, n, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    attn = 2 * h * h + 2 * h * cfg["num_key_value_heads"] * d
    layer = attn + 3 * h * f + 2 * h
    assert m.param_counts().total == n * layer + h + 2 * V * h == total
    assert not m.has_moe and m.layer_pattern() == "a" * n and m.attention.qk_norm is False
    bad = {**cfg, "mlp_bias": True}
    with pytest.raises(ConfigError, match="mlp_bias"):
        ModelSpec.from_hf_config(bad)
