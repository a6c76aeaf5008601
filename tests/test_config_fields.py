"""Config fields by what they do: a known field at its neutral value plans (with a note), an unknown field is refused
by name, ``--allow-unknown-fields`` plans an *approximate* model that says so first, structural-named unknown fields
need ``--allow-structural-fields`` too; boolean fields must be JSON booleans; a model read from a path is named by
its config or its folder.

Configs: the Hugging Face configs ai-dynamo/aiconfigurator vendors (tests/data/aiconfigurator_configs, commit in
data/models/README.md) and the shipped ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera_lab.cli.main import main
from tessera_lab.errors import ConfigError
from tessera_lab.model.spec import ModelSpec, load_model, shipped_models

AIC = Path(__file__).parent / "data" / "aiconfigurator_configs"


def aic(name: str) -> dict:
    return json.loads((AIC / f"{name}_config.json").read_text())


def shipped(name: str) -> dict:
    return json.loads(shipped_models()[name].read_text())


def near(value: float, card: float, tol: float = 0.01) -> bool:
    return abs(value / card - 1) <= tol


# ---------------------------------------------------------------------- neutral values
def test_qwen3_coder_plans_with_its_neutral_fields():
    cfg = aic("Qwen--Qwen3-Coder-480B-A35B-Instruct")
    assert cfg["qkv_bias"] is False and cfg["shared_expert_intermediate_size"] == 0 and cfg["use_qk_norm"] is True
    m = ModelSpec.from_hf_config(cfg)
    c = m.param_counts()
    # card: 480B total, 35B activated (with embedding and head)
    assert near(c.total, 480e9) and near(c.active, 35e9, 0.02)
    assert any("neutral value" in n and "'qkv_bias' = false" in n for n in m.notes)
    assert not m.approximate
    # the same model as without the neutral fields
    plain = {k: v for k, v in cfg.items() if k not in ("qkv_bias", "shared_expert_intermediate_size", "use_qk_norm")}
    assert ModelSpec.from_hf_config(plain).param_counts() == c


def test_qwen3_next_thinking_sliding_window_false_plans():
    cfg = shipped("qwen3-next-80b-a3b")
    thinking = {**cfg, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 48}
    assert ModelSpec.from_hf_config(thinking).param_counts() == ModelSpec.from_hf_config(cfg).param_counts()


@pytest.mark.parametrize("field,value,allowed", [("qkv_bias", True, "false"), ("use_qk_norm", False, "true"),
                                                  ("shared_expert_intermediate_size", 1024, "0")])
def test_neutral_field_at_another_value_is_refused_naming_it(field, value, allowed):
    cfg = {**aic("Qwen--Qwen3-Coder-480B-A35B-Instruct"), field: value}
    with pytest.raises(ConfigError, match=rf"'{field}' = {json.dumps(value)} .*allowed: {allowed}$"):
        ModelSpec.from_hf_config(cfg)


def test_qwen3_next_sliding_window_true_is_refused():
    with pytest.raises(ConfigError, match=r"'use_sliding_window' = true .*allowed: false"):
        ModelSpec.from_hf_config({**shipped("qwen3-next-80b-a3b"), "use_sliding_window": True})


# ---------------------------------------------------------------------- unknown fields
def test_unknown_field_refused_by_name_then_approximate_with_the_flag():
    cfg = {**shipped("qwen3-30b-a3b"), "router_warmup_coef": 0.5}
    with pytest.raises(ConfigError, match=r"'router_warmup_coef' are not known to the qwen3 reader"):
        ModelSpec.from_hf_config(cfg)
    m = ModelSpec.from_hf_config(cfg, allow_unknown_fields=True)
    assert m.notes[0] == m.approximate
    assert m.approximate.startswith("approximate: 1 unknown field(s) ignored: router_warmup_coef")


@pytest.mark.parametrize("field", ["moe_latent_size", "extra_layers", "num_sink_tokens", "block_pattern",
                                   "attn_type_list", "norm_type", "kv_head_dim"])
def test_structural_named_unknown_field_needs_its_own_flag(field):
    cfg = {**shipped("qwen3-30b-a3b"), field: 7}
    with pytest.raises(ConfigError, match=rf"'{field}' \(its name says it sets shapes or layer kinds\)"):
        ModelSpec.from_hf_config(cfg, allow_unknown_fields=True)
    m = ModelSpec.from_hf_config(cfg, allow_unknown_fields=True, allow_structural_fields=True)
    assert m.approximate.startswith(f"approximate: 1 unknown field(s) ignored: {field}")


def test_approximate_is_the_plans_first_line_and_in_its_export(tmp_path, capsys):
    folder = tmp_path / "Qwen3-8B-custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**shipped("qwen3-8b"), "router_warmup_coef": 1}))
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", str(folder / "config.json"), "--pp", "2", "--allow-unknown-fields",
                 "--export", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("approximate: 1 unknown field(s) ignored: router_warmup_coef")
    data = json.loads(out.read_text())
    assert data["approximate"].startswith("approximate:") and data["notes"][0] == data["approximate"]
    # and a refusal without the flag: exit 2, one line
    assert main(["plan", "--model", str(folder / "config.json"), "--pp", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "router_warmup_coef" in err[0]


# ---------------------------------------------------------------------- strict types
#: one shipped model per family, with the boolean fields its reader reads
BOOLEANS = {"qwen3-30b-a3b": ["attention_bias", "tie_word_embeddings"],
            "qwen3-next-80b-a3b": ["attention_bias", "attn_output_gate"],
            "deepseek-v3": ["attention_bias", "tie_word_embeddings"],
            "kimi-linear-48b-a3b": ["tie_word_embeddings", "mla_use_nope"],
            "minimax-m1": ["tie_word_embeddings", "use_qk_norm"],
            "jamba-1.5-mini": ["mamba_conv_bias", "mamba_proj_bias", "tie_word_embeddings"],
            "nemotron-h-56b": ["mlp_bias", "attention_bias", "use_conv_bias", "use_bias"],
            "glm-4.5-air": ["attention_bias", "use_qk_norm"],
            "gpt-oss-20b": ["attention_bias", "tie_word_embeddings"],
            "llama-4-scout-17b-16e": ["attention_bias", "use_qk_norm"],
            "olmoe-1b-7b": ["attention_bias", "tie_word_embeddings"]}


@pytest.mark.parametrize("model,field", [(m, f) for m, fs in BOOLEANS.items() for f in fs])
def test_string_boolean_is_one_line_naming_field_and_value(model, field):
    cfg = shipped(model)
    target = cfg["text_config"] if "text_config" in cfg and model.startswith("llama") else cfg
    target[field] = "false"
    with pytest.raises(ConfigError, match=rf"config field '{field}' = 'false' is not a boolean; allowed: true or false"):
        ModelSpec.from_hf_config(cfg)


def test_null_boolean_takes_the_default_and_integer_valued_float_is_an_integer():
    cfg = shipped("jamba-1.5-mini")
    base = ModelSpec.from_hf_config(cfg).param_counts()
    # Jamba's mamba_conv_bias defaults to true in transformers: null keeps it
    assert ModelSpec.from_hf_config({**cfg, "mamba_conv_bias": None}).param_counts() == \
        ModelSpec.from_hf_config({**cfg, "mamba_conv_bias": True}).param_counts()
    assert ModelSpec.from_hf_config({**cfg, "hidden_size": float(cfg["hidden_size"])}).param_counts() == base
    with pytest.raises(ConfigError, match=r"'hidden_size' = '4096' is not an integer"):
        ModelSpec.from_hf_config({**cfg, "hidden_size": "4096"})


def test_string_boolean_exits_2_from_the_cli(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**shipped("qwen3-8b"), "tie_word_embeddings": "false"}))
    assert main(["params", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'tie_word_embeddings' = 'false'" in err[0]


# ---------------------------------------------------------------------- names
def test_model_named_by_config_then_folder_never_config(tmp_path, capsys):
    folder = tmp_path / "My-Qwen3-8B"
    folder.mkdir()
    cfg = shipped("qwen3-8b")
    cfg.pop("_name_or_path", None)
    (folder / "config.json").write_text(json.dumps(cfg))
    assert load_model(folder / "config.json").name == "My-Qwen3-8B"
    (folder / "config.json").write_text(json.dumps({**cfg, "_name_or_path": "Qwen/Qwen3-8B"}))
    assert load_model(folder / "config.json").name == "Qwen/Qwen3-8B"
    assert load_model(AIC / "Qwen--Qwen3-8B_config.json").name == "Qwen--Qwen3-8B"
    assert main(["plan", "--model", str(folder / "config.json"), "--pp", "2"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head.startswith("model Qwen/Qwen3-8B (qwen3, from ") and str(folder / "config.json") in head


def test_params_prints_pattern_legend_and_split(capsys):
    assert main(["params", "deepseek-v3", "--json", "-"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["pattern"] == "aaa" + "A" * 58
    # 3 dense layers, 58 MoE layers, 1 MTP layer (by DeepSeek-V3's first_k_dense_replace = 3)
    assert (d["split"]["dense"]["layers"], d["split"]["moe"]["layers"], d["split"]["mtp"]["layers"]) == (3, 58, 1)
    m = load_model("deepseek-v3")
    assert d["split"]["dense"]["parameters"] + d["split"]["moe"]["parameters"] + m.hidden_size == d["non_embedding"]
    assert main(["params", "deepseek-v3"]) == 0
    text = capsys.readouterr().out
    assert "pattern aaaA" in text and "lower case: dense FFN" in text and "moe: 58 layers" in text


# ---------------------------------------------------------------------- knobs the family rule cannot realise
def test_jamba_attention_ratio_100_is_refused_with_the_ratios_it_can():
    m = load_model("jamba-1.5-mini")
    with pytest.raises(ConfigError) as err:
        m.with_changes(attention_ratio=100)
    text = str(err.value)
    assert "'attention_ratio' = 100 cannot be realised by the jamba rule in 32 layers" in text
    allowed = [int(x) for x in text.split("allowed: ")[1].split(", ")]
    # by Jamba's rule (attention when i % (r + 1) == min(4, r)), brute force over the 32 layers: the linear runs
    # (before each attention layer, and the trailing one) are r long more often than not
    def realised(r):
        full = [i for i in range(32) if i % (r + 1) == min(4, r)]
        runs = [b - a - 1 for a, b in zip([-1] + full, full)] + ([31 - full[-1]] if full[-1] < 31 else [])
        return bool(full) and 2 * runs.count(r) > len(runs)
    assert allowed == [r for r in range(32) if realised(r)] and 7 in allowed and 100 not in allowed
    for r in allowed:
        assert m.with_changes(attention_ratio=r).num_decoder_layers == 32


def test_kimi_ratio_keeps_its_rule_and_refuses_what_it_cannot():
    m = load_model("kimi-linear-48b-a3b")
    assert m.with_changes(attention_ratio=3).layer_pattern() == m.layer_pattern()
    with pytest.raises(ConfigError, match="cannot be realised by the kimi_linear rule"):
        m.with_changes(attention_ratio=20)  # MLA at 21 and 27: runs 20 and 5


def test_kimi_layer_in_both_lists_is_refused():
    cfg = shipped("kimi-linear-48b-a3b")
    lac = cfg["linear_attn_config"]
    lac["full_attn_layers"] = sorted(set(lac.get("full_attn_layers") or [4]) | {lac["kda_layers"][0]})
    with pytest.raises(ConfigError, match=rf"layer {lac['kda_layers'][0]} \(1-based\) in both kda_layers"):
        ModelSpec.from_hf_config(cfg)


def test_expert_width_names_what_else_it_changed():
    jamba = load_model("jamba-1.5-mini").with_changes(moe_intermediate_size=7168)
    # Jamba: layers i % 2 == 0 are dense (expert_layer_period 2, offset 1): 16 of 32
    assert any("16 dense MLP layers' width 14336 -> 7168" in n for n in jamba.notes)
    scout = load_model("llama-4-scout-17b-16e").with_changes(moe_intermediate_size=4096)
    assert any("shared expert's width 8192 -> 4096" in n for n in scout.notes)
    # Qwen3-Next's shared expert has its own field: nothing else changes, nothing said
    nxt = load_model("qwen3-next-80b-a3b").with_changes(moe_intermediate_size=256)
    assert not any("also changed" in n for n in nxt.notes)
    # asked for both: nothing to say about the shared expert
    ds = load_model("deepseek-v3").with_changes(moe_intermediate_size=1024, shared_experts=1)
    assert not any("shared expert's width" in n for n in ds.notes)


def test_approximate_is_the_reports_first_line_and_survives_a_saved_plan(tmp_path, capsys):
    folder = tmp_path / "Qwen3-8B-custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**shipped("qwen3-8b"), "router_warmup_coef": 1}))
    assert main(["report", "--model", str(folder / "config.json"), "--pp", "2", "--allow-unknown-fields"]) == 0
    assert capsys.readouterr().out.startswith("approximate: 1 unknown field(s) ignored: router_warmup_coef")
    saved = tmp_path / "plan.json"
    assert main(["plan", "--model", str(folder / "config.json"), "--pp", "2", "--allow-unknown-fields",
                 "--json", str(saved)]) == 0
    capsys.readouterr()
    assert main(["report", "--plan", str(saved)]) == 0
    assert capsys.readouterr().out.startswith("approximate: 1 unknown field(s) ignored")


def test_moe_only_blocks_print_e_in_stage_tables():
    from tessera_lab.model.spec import layer_summary

    m = ModelSpec.from_hf_config(AIC / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16_config.json")
    # MEMEM*E M: Mamba, MoE, Mamba, MoE, Mamba, attention, MoE, Mamba
    assert layer_summary(list(range(8)), [l.kind for l in m.stack.layers[:8]]) == "0-7 (Ax1 Ex3 Lx4)"
    h56 = load_model("nemotron-h-56b")
    assert layer_summary([0, 1], [l.kind for l in h56.stack.layers[:2]]) == "0-1 (-dx1 Lx1)"


@pytest.mark.parametrize("model,field,value", [("deepseek-v3.2", "q_lora_rank", "1536"),
                                               ("deepseek-v3.2", "q_lora_rank", 1536.5),
                                               ("kimi-linear-48b-a3b", "num_experts", "256"),
                                               ("qwen3-30b-a3b", "num_experts", 128.5)])
def test_wrongly_typed_integer_is_one_line(model, field, value):
    with pytest.raises(ConfigError, match=rf"config field '{field}' = .* is not an integer"):
        ModelSpec.from_hf_config({**shipped(model), field: value})


def test_llama4_layer_lists_must_hold_integers():
    cfg = shipped("llama-4-scout-17b-16e")
    text = cfg["text_config"]
    n = text["num_hidden_layers"]
    with pytest.raises(ConfigError, match="'no_rope_layers' must list"):
        ModelSpec.from_hf_config({**cfg, "text_config": {**text, "no_rope_layers": ["1"] * n}})
    with pytest.raises(ConfigError, match="'moe_layers' must list layer indices"):
        ModelSpec.from_hf_config({**cfg, "text_config": {**text, "moe_layers": ["3"]}})
