"""Every Hugging Face config NVIDIA's AIConfigurator vendors (tests/data/aiconfigurator_configs; the commit read is in
data/models/README.md): each MoE or hybrid one plans with counts that match its card, or is refused by one line naming
an architecture feature the cost model does not have yet, a feature docs/models.md lists.

Card figures: the model cards on Hugging Face (total / active); the convention each counts by is stated next to it.
Nemotron 3 cards count active parameters without the input embedding (Nano: "3.2B active, 3.6B with embeddings").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import ModelSpec, matches_published
from tessera_lab.model.tasks import model_flops_per_iteration

AIC = Path(__file__).parent / "data" / "aiconfigurator_configs"
FILES = sorted(AIC.glob("*_config.json"))
DOCS = (Path(__file__).parents[1] / "docs" / "models.md").read_text()


def _is_moe_or_hybrid(cfg: dict) -> bool:
    """From the raw config alone (not the readers): experts, or more than one mixer kind."""
    c = {**cfg, **(cfg.get("text_config") or {})}
    experts = max(int(c.get(k) or 0) for k in ("num_experts", "n_routed_experts", "num_local_experts"))
    kinds = json.dumps([c.get(k) for k in ("layers_block_type", "hybrid_override_pattern", "layer_types",
                                           "hybrid_layer_pattern", "attn_type_list", "linear_attn_config")])
    return experts > 1 or any(s in kinds for s in ("mamba", "linear", "M", "kda", "sliding"))


def test_the_set_is_the_vendored_one():
    assert len(FILES) == 86 and not any("hf_quant" in p.name for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.removesuffix("_config.json"))
def test_plans_or_refused_naming_a_listed_feature(path):
    cfg = json.loads(path.read_text())
    try:
        m = ModelSpec.from_hf_config(path)
    except ConfigError as err:
        text = str(err)
        assert "\n" not in text
        if not _is_moe_or_hybrid(cfg):
            return  # a dense model of a family without a reader (mimo, nemotron-nas): out of scope
        assert "which the cost model does not have yet" in text, text
        feature = text.split("the model has ", 1)[1].split(", which the cost model")[0]
        assert feature.split(" (")[0] in DOCS, f"docs/models.md does not list: {feature}"
        return
    assert not m.approximate and m.num_decoder_layers > 0
    # the task graph builds and its model FLOPs are positive for one micro-batch
    assert model_flops_per_iteration(m, ParallelConfig(pp=1, ep=1, microbatches=1, seq_len=1024)) > 0


def load(name: str) -> ModelSpec:
    return ModelSpec.from_hf_config(AIC / f"{name}_config.json")


def near(value: float, card: float, tol: float = 0.01) -> bool:
    return abs(value / card - 1) <= tol


#: name -> (card total, card active, which count the card's active is, tolerance)
CARDS = {
    "Qwen--Qwen3-Coder-480B-A35B-Instruct": (480e9, 35e9, "active", 0.015),
    "Qwen--Qwen3-235B-A22B": (235e9, 22e9, "active", 0.01),
    "Qwen--Qwen3-VL-235B-A22B-Instruct": (235e9, 22e9, "active", 0.01),  # language model only
    # DeepSeek-V3 671B / 37B: the MTP module apart; "37B" is the active count with embedding and head, truncated
    "deepseek-ai--DeepSeek-V3": (671e9, 37e9, "active", None),
    "deepseek-ai--DeepSeek-R1": (671e9, 37e9, "active", None),
    "nvidia--DeepSeek-V3.1-NVFP4": (671e9, 37e9, "active", None),
    "mistralai--Mixtral-8x7B-v0.1": (46.7e9, 12.9e9, "active", 0.01),
    "mistralai--Mixtral-8x22B-v0.1": (141e9, 39e9, "active", 0.01),
    "meta-llama--Llama-4-Maverick-17B-128E-Instruct": (400e9, 17e9, "active", 0.011),
    # MiniMax-M2.x 230B / 10B: active without embedding and head (as MiniMax-M1's card)
    "MiniMaxAI--MiniMax-M2.5": (230e9, 10e9, "active_non_embedding", 0.021),
    # GLM-5 744B / 40B: active without embedding and head; MTP apart
    "zai-org--GLM-5": (744e9, 40e9, "active_non_embedding", 0.01),
    "zai-org--GLM-5.1": (744e9, 40e9, "active_non_embedding", 0.01),
    # GLM-5.2 744B-A40B: GLM-5's shapes less 57 indexers (its shared layers have none): 39.35B active, the name's
    # "A40B" rounded (within 2%)
    "zai-org--GLM-5.2": (744e9, 40e9, "active_non_embedding", 0.02),
    # Nemotron 3: active without the input embedding (the head counted), as the Nano card states; MTP apart
    "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": (31.6e9, 3.2e9, "active_no_input_embedding", 0.01),
    "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8": (120e9, 12e9, "active_no_input_embedding", 0.02),
    "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16": (550e9, 55e9, "active_no_input_embedding", 0.01),
    # MiMo-V2-Flash 309B / 15B: "15B" is the active count with embedding and head, truncated
    "XiaomiMiMo--MiMo-V2-Flash": (309e9, 15e9, "active", None),
    # Gemma-4: 25.2B total / 3.8B active (26B-A4B), 30.7B (31B dense): the language model's, the tied embedding
    # counted once, active with it; the card lists the ~550M vision encoder apart
    "google--gemma-4-26B-A4B": (25.2e9, 3.8e9, "active", None),
    "nvidia--Gemma-4-31B-IT-NVFP4": (30.7e9, 30.7e9, "active", None),
    # gpt-oss: OpenAI's card counts the unembedding, not the embedding
    "openai--gpt-oss-120b": (116.8e9, 5.1e9, "active_no_input_embedding", 0.01),
    "openai--gpt-oss-20b": (20.9e9, 3.6e9, "active_no_input_embedding", 0.01),
}


@pytest.mark.parametrize("name", sorted(CARDS))
def test_counts_against_the_card(name):
    total, active, which, tol = CARDS[name]
    c = load(name).param_counts()
    got = c.active - c.embedding if which == "active_no_input_embedding" else getattr(c, which)
    if tol is None:  # the card's figure is the count rounded or truncated to its digits
        assert near(c.total, total) and matches_published(got, active), (c.total / 1e9, got / 1e9)
    else:
        assert near(c.total, total, tol) and near(got, active, tol), (c.total / 1e9, got / 1e9)


def test_named_counts_round_to_the_name():
    # Qwen3.5 / 3.6 names: "A3B", "A10B", "A17B" (active, with embedding and head, rounded); totals within 1% (the
    # cards add the vision tower)
    for name, total, active in (("Qwen--Qwen3.5-35B-A3B", 35e9, 3e9), ("Qwen--Qwen3.5-122B-A10B", 122e9, 10e9),
                                ("Qwen--Qwen3.5-397B-A17B", 397e9, 17e9), ("nvidia--Qwen3.6-35B-A3B-NVFP4", 35e9, 3e9)):
        c = load(name).param_counts()
        assert near(c.total, total) and matches_published(c.active, active), name


def test_nemotron3_super_layer_pattern_by_the_reference_rule():
    cfg = json.loads((AIC / "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8_config.json").read_text())
    m = load("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
    # modeling_nemotron_h.py: M -> mamba, * -> attention, E -> moe; one block a layer
    expect = cfg["hybrid_override_pattern"].replace("M", "L").replace("*", "A")
    assert m.layer_pattern() == expect and len(expect) == 88
    assert (m.moe.moe_latent_size, len(m.stack.mtp_layers)) == (1024, 1)
    # the escape hatch gives the same model (no unknown field is left to ignore)
    path = AIC / "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8_config.json"
    assert ModelSpec.from_hf_config(path, allow_unknown_fields=True).param_counts() == m.param_counts()


def test_nemotron3_ultra_block_list_reads_as_the_pattern():
    cfg = json.loads((AIC / "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16_config.json").read_text())
    letters = {"mamba": "L", "attention": "A", "moe": "E", "mlp": "-"}
    assert load("nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16").layer_pattern() == \
        "".join(letters[t] for t in cfg["layers_block_type"])
    # the same blocks spelled as the pattern string read the same model
    pattern = "".join({"mamba": "M", "attention": "*", "moe": "E", "mlp": "-"}[t] for t in cfg["layers_block_type"])
    assert cfg.get("num_hidden_layers") is None  # the list gives the count
    other = {**{k: v for k, v in cfg.items() if k != "layers_block_type"}, "hybrid_override_pattern": pattern,
             "num_hidden_layers": len(pattern)}
    assert ModelSpec.from_hf_config(other).param_counts() == \
        load("nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16").param_counts()
    with pytest.raises(ConfigError, match="disagree"):
        ModelSpec.from_hf_config({**cfg, "hybrid_override_pattern": pattern[::-1]})


def test_latent_moe_layer_params_by_hand():
    m = load("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
    moe = next(l for l in m.stack.layers if l.ffn == "moe")
    h, lat, w, E, sw = 4096, 1024, 2688, 512, 5376
    p = m.layer_params(moe)
    assert p["experts"] == E * 2 * lat * w  # ReLU^2 experts (up, down) on the latent
    assert p["shared"] == 2 * h * sw + 2 * h * lat  # shared expert on h, plus fc1/fc2_latent_proj
    assert p["router"] == h * E + E and p["norms"] == h and p["mixer"] == 0
    # without the latent the experts would be 4x larger: the 458.6B a reading that drops moe_latent_size gives
    cfg = json.loads((AIC / "nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8_config.json").read_text())
    cfg["moe_latent_size"] = None
    assert near(ModelSpec.from_hf_config(cfg).param_counts().total, 458.6e9, 0.002)


def test_latent_moe_moves_the_latent_over_the_all_to_all():
    from tessera_lab.model.tasks import layer_tasks

    m = load("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8")
    p = ParallelConfig(pp=1, ep=8, microbatches=1, seq_len=4096)
    moe = next(l for l in m.stack.layers if l.ffn == "moe")
    tasks = {t.name: t for t in layer_tasks(m, moe, p).F}
    plain = ModelSpec.from_hf_config({**m.raw, "moe_latent_size": None})
    base = {t.name: t for t in layer_tasks(plain, moe, p).F}
    # dispatch bytes scale with the width moved: 1024 / 4096
    assert tasks["dispatch"].bytes == pytest.approx(base["dispatch"].bytes * 1024 / 4096)
    assert tasks["latent_down"].flops == pytest.approx(2 * 4096 * 4096 * 1024)
    assert tasks["latent_up"].flops == pytest.approx(2 * 4096 * 1024 * 4096)
    assert tasks["experts"].flops == pytest.approx(base["experts"].flops * 1024 / 4096)


def test_nemotron35_mtp_step_by_hand():
    m = load("nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4")
    h, nh, nkv, hd = 2688, 32, 2, 128
    E, w, sw = 128, 1856, 3712
    # sglang nemotron_h_mtp.py: eh_proj 2h x h, enorm, hnorm, final norm; an attention block and a MoE block, each
    # with its own norm; attention without biases; ReLU^2 experts and shared expert; router with correction bias
    attention = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    moe = E * 2 * h * w + 2 * h * sw + h * E + E
    assert len(m.stack.mtp_layers) == 1
    assert m.param_counts().mtp == 2 * h * h + 3 * h + attention + 2 * h + moe
    assert m.moe.moe_latent_size == 0  # moe_latent_size: null, no latent


def test_glm5_layer_pattern_by_its_rule():
    cfg = json.loads((AIC / "zai-org--GLM-5_config.json").read_text())
    m = load("zai-org--GLM-5")
    # GlmMoeDsaConfig: mlp_layer_types default the first 3 dense, the rest sparse (= first_k_dense_replace 3); every
    # layer MLA with the DSA indexer
    assert m.layer_pattern() == "aaa" + "A" * (cfg["num_hidden_layers"] - 3)
    assert {l.attention for l in m.stack.layers} == {"mla_sparse"} and len(m.stack.mtp_layers) == 1
    types = ["dense"] * 5 + ["sparse"] * (cfg["num_hidden_layers"] - 5)
    assert ModelSpec.from_hf_config({**cfg, "mlp_layer_types": types}).layer_pattern().startswith("aaaaaA")
    with pytest.raises(ConfigError, match="'qk_head_dim' = 200 is out of range; allowed: qk_nope_head_dim"):
        ModelSpec.from_hf_config({**cfg, "qk_head_dim": 200})


def test_glm4_moe_lite_reads_as_deepseek_v3():
    cfg = json.loads((AIC / "deepseek-ai--DeepSeek-V3_config.json").read_text())
    lite = {**cfg, "model_type": "glm4_moe_lite", "architectures": ["Glm4MoeLiteForCausalLM"]}
    m = ModelSpec.from_hf_config(lite)
    assert m.param_counts() == load("deepseek-ai--DeepSeek-V3").param_counts() and m.family == "deepseek_v3"
    assert not any("architectures" in n for n in m.notes)


def test_mimo_v2_flash_layers_by_the_reference_rule_and_attention_by_hand():
    cfg = json.loads((AIC / "XiaomiMiMo--MiMo-V2-Flash_config.json").read_text())
    m = load("XiaomiMiMo--MiMo-V2-Flash")
    # MiMoV2DecoderLayer: SWA when hybrid_layer_pattern[i] == 1; MoE when moe_layer_freq[i]
    expect = "".join(("S" if s else "A").lower() if not f else ("S" if s else "A")
                     for s, f in zip(cfg["hybrid_layer_pattern"], cfg["moe_layer_freq"]))
    assert m.layer_pattern() == expect and expect.count("S") + expect.count("s") == 39
    h = 4096
    full, swa = m.stack.layers[0], m.stack.layers[1]
    assert swa.window == cfg["sliding_window_size"] == 128 and swa.sinks and not full.sinks
    # MiMoV2Attention: q and k of head_dim 192, v and o of v_head_dim 128; full: 64 heads, 4 kv; SWA: 64, 8 kv + sinks
    assert m.mixer_params(full) == h * 64 * 192 + h * 4 * (192 + 128) + 64 * 128 * h
    assert m.mixer_params(swa) == h * 64 * 192 + h * 8 * (192 + 128) + 64 * 128 * h + 64
    # the attention core: q k^T over 192, p v over 128 (2 x pairs x heads x (192 + 128) at one micro-batch)
    from tessera_lab.model.mixers import attention_pairs
    from tessera_lab.model.tasks import layer_tasks

    p = ParallelConfig(pp=1, ep=1, microbatches=1, seq_len=4096)
    core = next(t for t in layer_tasks(m, full, p).F if t.name == "core")
    assert core.flops == pytest.approx(2.0 * attention_pairs(4096, 0, "") * 64 * (192 + 128))
    with pytest.raises(ConfigError, match="'hybrid_layer_pattern' must list 48 entries"):
        ModelSpec.from_hf_config({**cfg, "hybrid_layer_pattern": cfg["hybrid_layer_pattern"][:-1]})
    with pytest.raises(ConfigError, match="'n_shared_experts' = 1 is not supported"):
        ModelSpec.from_hf_config({**cfg, "n_shared_experts": 1})
    with pytest.raises(ConfigError, match="'add_swa_attention_sink_bias' = 'true' is not a boolean"):
        ModelSpec.from_hf_config({**cfg, "add_swa_attention_sink_bias": "true"})


def test_gemma4_layers_by_the_reference_rule_and_attention_by_hand():
    cfg = json.loads((AIC / "google--gemma-4-26B-A4B_config.json").read_text())["text_config"]
    m = load("google--gemma-4-26B-A4B")
    # Gemma4TextConfig: the listed layer_types; global (full) layers every 6th; enable_moe_block: MoE in every layer
    expect = "".join("S" if t == "sliding_attention" else "A" for t in cfg["layer_types"])
    assert m.layer_pattern() == expect == ("S" * 5 + "A") * 5
    # the default rule without the list: sliding when (i + 1) % 6, the last layer global (forced)
    rule = ModelSpec.from_hf_config({k: v for k, v in cfg.items() if k != "layer_types"} | {"num_hidden_layers": 32})
    assert rule.layer_pattern() == ("S" * 5 + "A") * 5 + "SA"
    h, nh, hd, nkv, ghd, gkv, E, w, mw = 2816, 16, 256, 8, 512, 2, 128, 704, 2112
    local, glob = m.stack.layers[0], m.stack.layers[5]
    assert local.window == 1024 and glob.window == 0 and glob.k_eq_v and not local.k_eq_v
    # Gemma4TextAttention: q, k, v, o with q/k RMSNorm of the head dim; global layers: head dim 512, 2 KV heads,
    # no v_proj (attention_k_eq_v)
    assert m.mixer_params(local) == h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 2 * hd
    assert m.mixer_params(glob) == h * nh * ghd + h * gkv * ghd + nh * ghd * h + 2 * ghd
    # MoE: router h x E, experts gate-up and down; the dense MLP beside them counted as the shared expert
    p = m.layer_params(local)
    assert (p["router"], p["experts"], p["shared"]) == (h * E, E * 3 * h * w, 3 * h * mw)
    assert m.moe.num_experts_per_tok == 8 and m.vocab.tie_word_embeddings
    # the q/k/v GEMM of a global layer has no value output
    from tessera_lab.model.tasks import layer_tasks

    par = ParallelConfig(pp=1, ep=1, microbatches=1, seq_len=4096)
    qkv = next(t for t in layer_tasks(m, glob, par).F if t.name == "qkv_proj")
    assert qkv.flops == pytest.approx(2 * 4096 * h * (nh * ghd + gkv * ghd))


def test_gemma4_refusals_and_types():
    cfg = json.loads((AIC / "google--gemma-4-26B-A4B_config.json").read_text())
    text = cfg["text_config"]
    for change, match in (({"hidden_size_per_layer_input": 256}, "per-layer input embeddings"),
                          ({"num_kv_shared_layers": 20}, "'num_kv_shared_layers' = 20 is not supported"),
                          ({"use_bidirectional_attention": "all"}, "'use_bidirectional_attention' = \"all\""),
                          ({"enable_moe_block": "true"}, "'enable_moe_block' = 'true' is not a boolean"),
                          ({"attention_k_eq_v": "false"}, "'attention_k_eq_v' = 'false' is not a boolean"),
                          ({"top_k_experts": 129}, "'top_k_experts' = 129 is out of range"),
                          ({"num_global_key_value_heads": 3}, "'num_global_key_value_heads' = 3 must divide")):
        with pytest.raises(ConfigError, match=match):
            ModelSpec.from_hf_config({**cfg, "text_config": {**text, **change}})
    # the per-layer input embeddings are on by default (Gemma4TextConfig: 256): a config without the field is refused
    with pytest.raises(ConfigError, match="per-layer input embeddings"):
        ModelSpec.from_hf_config({k: v for k, v in text.items() if k != "hidden_size_per_layer_input"})
    # tie_word_embeddings defaults to true; false unties the head (one more vocab x h)
    untied = ModelSpec.from_hf_config({**text, "tie_word_embeddings": False}).param_counts().total
    assert untied - load("google--gemma-4-26B-A4B").param_counts().total == 262144 * 2816


def test_glm52_shared_indexers_by_the_reference_rule():
    cfg = json.loads((AIC / "zai-org--GLM-5.2_config.json").read_text())
    m = load("zai-org--GLM-5.2")
    # IndexShare: layer i runs its own indexer when max(i - offset + 1, 0) % freq == 0 (offset 3, freq 4): 21 of 78
    shared = [max(i - 3 + 1, 0) % 4 != 0 for i in range(78)]
    assert [l.shared_index for l in m.stack.layers] == shared and shared.count(False) == 21
    assert (m.stack.layers[6].label, m.stack.layers[7].label) == ("DSA-MLA", "DSA-MLA(shared idx)")
    assert [t == "shared" for t in cfg["indexer_types"]] == shared
    # the schedule alone (no list) reads the same layers; a list that disagrees with it is refused
    alone = ModelSpec.from_hf_config({k: v for k, v in cfg.items() if k != "indexer_types"})
    assert [l.shared_index for l in alone.stack.layers] == shared
    bad = list(cfg["indexer_types"])
    bad[4] = "full"
    with pytest.raises(ConfigError, match="disagree at layer 4"):
        ModelSpec.from_hf_config({**cfg, "indexer_types": bad})
    with pytest.raises(ConfigError, match="starts with 'shared'"):
        ModelSpec.from_hf_config({k: v for k, v in cfg.items() if k not in ("index_topk_freq", "index_skip_topk_offset")}
                                 | {"indexer_types": ["shared"] + cfg["indexer_types"][1:]})
    # a shared layer has no indexer weights: GLM-5 (same shapes, every layer its indexer) less 57 indexers
    # (wq_b r_q x n_i d_i, wk h x d_i, k_norm 2 d_i, weights_proj h x n_i)
    h, rq, ni, di = 6144, 2048, 32, 128
    indexer = rq * ni * di + h * di + 2 * di + h * ni
    assert load("zai-org--GLM-5").param_counts().total - m.param_counts().total == 57 * indexer
    # its tasks: no indexer; the core attends the index_topk keys as a full layer's does
    from tessera_lab.model.tasks import layer_tasks

    par = ParallelConfig(pp=1, ep=8, microbatches=1, seq_len=8192)
    full, reuse = ({t.name: t for t in layer_tasks(m, m.stack.layers[i], par).F} for i in (6, 7))
    assert "index_core" in full and not any(n.startswith("index") for n in reuse)
    assert reuse["core"].flops == full["core"].flops


def test_exported_fields_beside_the_reference():
    # NVIDIA's GLM-5.2 NVFP4 config adds layer_types (every layer deepseek_sparse_attention), num_experts (=
    # n_routed_experts) and mlp_bias false: the same model as zai-org's
    nv, zai = load("nvidia--GLM-5.2-NVFP4"), load("zai-org--GLM-5.2")
    assert nv.param_counts() == zai.param_counts() and nv.layer_pattern() == zai.layer_pattern()
    cfg = json.loads((AIC / "nvidia--GLM-5.2-NVFP4_config.json").read_text())
    for change, match in (({"num_experts": 128}, "'num_experts' = 128 and 'n_routed_experts' = 256 disagree"),
                          ({"layer_types": ["full_attention"] * 78}, "'layer_types' must list 78 entries"),
                          ({"mlp_bias": True}, "'mlp_bias' = true is not supported")):
        with pytest.raises(ConfigError, match=match):
            ModelSpec.from_hf_config({**cfg, **change})


def test_cp_ring_carries_each_layers_own_kv_shapes():
    from tessera_lab.model.tasks import layer_tasks

    m = load("google--gemma-4-26B-A4B")
    p = ParallelConfig(pp=1, ep=8, cp=4, seq_len=65536, expert_load=1.0)
    T = 65536 // 4
    ring = {i: next(t for t in layer_tasks(m, m.stack.layers[i], p).F if t.name == "cp_kv").collective.bytes
            for i in (0, 5)}
    # sliding layer: 8 KV heads of 256, K and V; global layer: 2 KV heads of 512, K and V (the values are the keys
    # before v_norm: two tensors in the core); all-gather S = cp x T x width x 2 bytes
    assert ring[0] == 4 * T * 8 * (256 + 256) * 2
    assert ring[5] == 4 * T * 2 * (512 + 512) * 2


def test_glm52_layers_knob_rederives_the_index_schedule():
    m = load("zai-org--GLM-5.2").with_changes(num_layers=20)
    # IndexShare rule for 20 layers (offset 3, freq 4): full at 0, 1, 2, 6, 10, 14, 18; the first 3 layers dense
    assert [i for i, l in enumerate(m.stack.layers) if not l.shared_index] == [0, 1, 2, 6, 10, 14, 18]
    assert m.layer_pattern() == "aaa" + "A" * 17
    nv = load("nvidia--GLM-5.2-NVFP4").with_changes(num_layers=20)
    assert nv.param_counts() == m.param_counts()


def test_gemma4_defaults_are_the_reference_configs():
    # Gemma4TextConfig: num_key_value_heads 4, head_dim 256, sliding_window 512, global_head_dim 512 when absent
    text = json.loads((AIC / "google--gemma-4-26B-A4B_config.json").read_text())["text_config"]
    bare = {k: v for k, v in text.items() if k not in ("num_key_value_heads", "head_dim", "sliding_window",
                                                        "global_head_dim", "num_global_key_value_heads")}
    m = ModelSpec.from_hf_config(bare)
    local, glob = m.stack.layers[0], m.stack.layers[5]
    assert (local.kv_heads, local.head_dim, local.window) == (4, 256, 512)
    assert (glob.kv_heads, glob.head_dim) == (4, 512)  # num_global_key_value_heads: num_key_value_heads
