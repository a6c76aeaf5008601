"""The model knob options and ``report --diff`` changes say what a fresh user needs: every range states both ends
(the upper one a work limit with the variable that raises it), an option the model cannot take names the model and
why (no sliding-window layers, no routed experts, --experts below the model's top-k), and ``tessera-lab models``
lists every knob option a family takes (``--layers`` for all of them). Exit 2, one line, before any work."""

from __future__ import annotations

import json

import pytest

from tessera_lab.checks import WORK_LIMITS
from tessera_lab.cli.main import main


def _error(capsys, argv) -> str:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("option, name, low, limit", [
    ("--experts", "num_experts", 1, "num_experts"), ("--expert-width", "expert_width", 1, "expert_width"),
    ("--top-k", "top_k", 1, "top_k"), ("--layers", "layers", 1, "layers"),
    ("--shared-experts", "shared_experts", 0, "experts"), ("--moe-every", "moe_every", 1, "layers"),
])
def test_huge_knob_values_state_both_ends_of_the_range(capsys, option, name, low, limit):
    err = _error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", option, "1000000000"])
    top = WORK_LIMITS[limit][0]  # the default work limit (no TESSERA_LAB_MAX_* set in the tests)
    assert f"{name} = 1000000000 is out of range; allowed: an integer {low} to {top}" in err
    assert f"TESSERA_LAB_MAX_{limit.upper()}=N" in err


def test_huge_window_states_the_upper_end(capsys):
    err = _error(capsys, ["params", "gpt-oss-20b", "--window", "1e12"])
    assert "window = 1000000000000 is out of range; allowed: an integer 1 to 16777216" in err


def test_window_on_a_model_without_sliding_window_layers(capsys):
    for value in ("0", "4096"):  # the model is the problem, whatever the value
        err = _error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", "--window", value])
        assert f"option --window = {value}: model qwen3-next-80b-a3b (family qwen3_next) has no sliding-window" in err
        assert "gemma4_text, gpt_oss, laguna, llama4_text, mixtral" in err  # the families that have one
    err = _error(capsys, ["params", "gpt-oss-20b", "--window", "0"])  # a model with a window: the range
    assert "option --window = 0 is out of range; allowed: an integer 1 to 16777216" in err


@pytest.mark.parametrize("option", ["--top-k", "--experts", "--expert-width", "--shared-experts"])
def test_expert_options_on_a_dense_model_say_it_has_no_routed_experts(capsys, option):
    err = _error(capsys, ["params", "nemotron-h-56b", option, "2"])
    assert f"option {option} = 2: model nemotron-h-56b has no routed experts (a dense model)" in err
    assert "num_experts = 0" not in err


def test_experts_below_the_models_top_k_suggests_top_k(capsys):
    # Qwen3-Next-80B-A3B: num_experts_per_tok = 10 in its config.json
    cfg = json.loads(open("data/models/qwen3-next-80b-a3b.json").read())
    k = cfg["num_experts_per_tok"]
    err = _error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", "--experts", "4"])
    assert f"option --experts = 4 is below the model's top-k = {k}" in err
    assert f"--experts {k} or more, or lower the top-k as well with --top-k K (1 to 4)" in err
    assert main(["params", "qwen3-next-80b-a3b", "--experts", "4", "--top-k", "2"]) == 0


@pytest.mark.parametrize("change, needle", [
    ("attention_ratio=x", "change 'attention_ratio' = 'x' is not an integer; allowed: an integer 0 to 4096"),
    ("top_k=2.5", "change 'top_k' = '2.5' is not an integer; allowed: an integer 1 to 65536"),
    ("expert_width=1e99", "change 'expert_width' = '1e99' is out of range; allowed: an integer 1 to 4194304"),
    ("layers=-3", "change 'layers' = -3 is out of range; allowed: an integer 1 to 2048"),
    ("seq_len=abc", "change 'seq_len' = 'abc' is not an integer; allowed: an integer 1 to 16777216"),
    ("microbatches=0", "change 'microbatches' = 0 is out of range; allowed: an integer 1 to 100000"),
])
def test_report_diff_changes_typed_before_planning(capsys, change, needle):
    assert needle in _error(capsys, ["report", "--diff", change])


def test_diff_changes_parse_written_floats():
    from tessera_lab.report.capacity import parse_changes
    from tessera_lab.report.diff import check_changes

    assert check_changes(parse_changes("expert_width=1e3,seq_len=8192.0,dtype=fp8")) == {
        "expert_width": 1000, "seq_len": 8192, "dtype": "fp8"}


def test_models_lists_every_knob_option_with_layers_for_every_family(capsys):
    assert main(["models", "--json", "-"]) == 0
    fams = json.loads(capsys.readouterr().out)["families"]
    assert fams and all("--layers" in f["options"].split(", ") for f in fams)
    assert all("num_layers" in f["knobs"].split(", ") for f in fams)
    by = {f["family"]: f["options"].split(", ") for f in fams}
    assert "--window" in by["gpt_oss"] and "--window" not in by["qwen3_next"]
    assert main(["models"]) == 0
    assert "--layers" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["report", "--lifecycle", "S.json", "--dynamic", "D.json"], "option --dynamic is not used by report --lifecycle"),
    (["report", "--lifecycle", "S.json", "--plot", "x.png"], "option --plot is not used by report --lifecycle"),
    (["report", "--observed", "R.json", "--diff", "top_k=2"], "option --diff is not used by report --observed"),
    (["report", "--device", "dev.json"], "option --device sets the peak of an observed run's report"),
])
def test_report_refuses_options_it_would_ignore(capsys, argv, needle):
    assert needle in _error(capsys, argv)


SIM = ["simulate", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2"]


@pytest.mark.parametrize("extra, needle", [
    (["--experts", "8"], "option --experts is used only with --routing SPEC or --dynamic (it would be ignored)"),
    (["--seed", "3"], "option --seed is used only with --routing SPEC or --dynamic"),
    (["--routing", "zipf:1.2", "--margin", "0.3"], "option --margin is used only with --dynamic"),
    (["--routing", "zipf:1.2", "--groups", "2"], "option --groups is used only with --dynamic"),
    (["--routing", "zipf:1.2", "--seed", "-1"], "seed = -1 is out of range; allowed: an integer 0 to 9223372036854775807"),
    (["--routing", "zipf:1.2", "--experts", "6", "--ep", "4"],
     "option --ep = 4 must divide --experts = 6 (each EP rank holds the same number of experts); allowed: a divisor "
     "of 6: 1, 2, 3, 6"),
    (["--routing", "zipf:1.2", "--top-k", "100"], "option --top-k = 100 is out of range; allowed: an integer 1 to "
                                                  "--experts = 64"),
])
def test_simulate_routing_options_refused_not_ignored(capsys, extra, needle):
    assert needle in _error(capsys, SIM + extra)


def test_simulate_routing_defaults_still_apply(capsys):
    assert main(SIM + ["--routing", "zipf:1.2", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["routing"] == "zipf:1.2" and out["busiest_rank_load_mean"] >= 1.0  # max over 8 ranks >= the mean
    assert main(SIM + ["--dynamic", "--w", "0.5", "--seed", "2", "--groups", "2", "--margin", "0.3", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["margin"] == 0.3 and out["groups"] == 2 and out["steps"] == 4  # steps: the default


@pytest.mark.parametrize("model, option, needle", [
    ("qwen3-8b", "--attention-ratio", "option --attention-ratio = 2: model qwen3-8b (family qwen3) has no "
                                      "linear-attention layers"),
    ("olmoe-1b-7b", "--moe-every", "option --moe-every = 2: the olmoe family of olmoe-1b-7b has no moe_every to "
                                   "change; allowed: leave --moe-every out (this family's options: --expert-width, "
                                   "--experts, --layers, --top-k)"),
])
def test_knob_the_family_lacks_names_the_family_and_its_options(capsys, model, option, needle):
    assert needle in _error(capsys, ["params", model, option, "2"])


@pytest.mark.parametrize("model, looked", [
    ("qwen3-8b", "the qwen3 family's reader knows no MTP field"),
    ("kimi-k2-instruct", "looked for num_nextn_predict_layers: absent or 0"),
])
def test_mtp_on_a_config_without_mtp_layers_is_refused(capsys, model, looked):
    err = _error(capsys, ["plan", "--model", model, "--mtp"])
    assert f"option --mtp: model {model}'s config declares no MTP layers ({looked})" in err, err
    assert "allowed: leave --mtp out" in err and "num_nextn_predict_layers" in err, err


def test_mtp_on_a_qwen3_next_config_without_the_field_is_refused(capsys, tmp_path):
    cfg = json.loads(open("data/models/qwen3-next-80b-a3b.json").read())
    del cfg["mtp_num_hidden_layers"]
    path = tmp_path / "Qwen3-Next-no-MTP" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    err = _error(capsys, ["plan", "--model", str(path), "--mtp"])
    assert "declares no MTP layers (looked for mtp_num_hidden_layers: absent or 0)" in err, err


def test_mtp_on_a_config_with_mtp_layers_is_taken():
    import argparse

    from tessera_lab.cli.common import model_from_args

    args = argparse.Namespace(model="glm-4.5-air", mtp=True)
    m = model_from_args(args)  # glm-4.5-air.json: num_nextn_predict_layers = 1
    assert len(m.stack.mtp_layers) == 1 and m.stack.plan_mtp and m.stack.layers[-1].mtp
    # qwen3-next-80b-a3b.json: mtp_num_hidden_layers = 1, one gated-attention MoE layer after the 48 decoder layers
    m = model_from_args(argparse.Namespace(model="qwen3-next-80b-a3b", mtp=True))
    last = m.stack.layers[-1]
    assert m.num_layers == 49 and last.mtp and last.attention == "gated_gqa" and last.ffn == "moe"


@pytest.mark.parametrize("key", ["top_k", "num_experts_per_tok", "expert_width", "num_experts", "shared_experts"])
def test_report_diff_expert_change_on_a_dense_model_names_the_typed_key(capsys, key):
    err = _error(capsys, ["report", "--model", "qwen3-8b", "--diff", f"{key}=2"])
    assert err.endswith(f"change {key} = 2: model qwen3-8b has no routed experts (a dense model); allowed: leave "
                        f"{key} out, or diff a MoE model"), err


def test_memory_refusal_of_a_dense_model_does_not_suggest_ep(capsys):
    for argv in (["--pp", "2", "--dp", "8"], ["--pp", "2", "--dp", "8", "--vpp", "2", "--schedule", "interleaved"]):
        err = _error(capsys, ["plan", "--model", "nemotron-h-56b", *argv])  # 56B dense: 2 stages cannot hold it
        assert "GiB" in err and "shard further (tp, dp with a distributed optimizer)" in err, err
        assert "ep" not in err.split("shard further")[1].split(")")[0] and "expert" not in err, err
    # MoE: ep named (64 GPUs hold the parameter state; 64k-token sequences do not fit)
    err = _error(capsys, ["plan", "--model", "qwen3-next-80b-a3b", "--pp", "4", "--ep", "8", "--seq-len", "65536"])
    assert "shard further (ep for experts, dp with a distributed optimizer)" in err, err


def test_memory_refusal_below_the_parameter_state_names_the_gpus_needed(capsys):
    """qwen3-235b-a22b on pp 2 x ep 2 (4 GPUs): weights, gradients and Adam state take 18 bytes a parameter
    (bf16 weights, fp32 gradients, fp32 master weights and two fp32 moments), so 235.09e9 x 18 / 4 bytes a GPU on the
    lightest layout of 4 GPUs, above the 134.40 GiB of an H200; the fewest whole nodes at which that share fits:
    235.09e9 x 18 / n <= 134.40 GiB gives n >= 29.3, so 32. Recompute, schedule and sequence advice cannot close
    that gap and is left out; a refusal whose parameter state fits keeps it."""
    from tessera_lab.model.spec import load_model

    total = load_model("qwen3-235b-a22b").param_counts().total
    err = _error(capsys, ["plan", "--model", "qwen3-235b-a22b", "--pp", "2", "--ep", "2"])
    assert err.startswith("tessera-lab plan: error: no partition fits in memory: even the closest one"), err
    assert (f"no layout of 4 GPUs holds qwen3-235b-a22b's parameter state (weights, gradients and optimizer state: "
            f"the lightest layout {total * 18 / 4 / 2**30:.1f} GiB per GPU against 134.4 GiB, computed)") in err, err
    assert "at least 32 GPUs" in err and f"{total * 18 / 32 / 2**30:.1f} GiB per GPU" in err, err
    assert err.endswith("tessera-lab search --model qwen3-235b-a22b --gpu H200 --seq-len 4096 --gpus 32 lists layouts"), err
    assert "--recompute" not in err and "--schedule" not in err and "shard further" not in err, err
    # --schedule auto: every schedule's finding, then the same count instead of the advice
    err = _error(capsys, ["plan", "--model", "qwen3-235b-a22b", "--pp", "2", "--ep", "2", "--schedule", "auto"])
    assert err.startswith("tessera-lab plan: error: schedule auto: no schedule fits; ") and "advice:" not in err, err
    assert err.endswith("tessera-lab search --model qwen3-235b-a22b --gpu H200 --seq-len 4096 --gpus 32 lists layouts"), err
    # 1.24 GiB over with the parameter state well inside: the refusal's own advice, no GPU count
    err = _error(capsys, ["plan", "--model", "qwen3-30b-a3b", "--pp", "4", "--ep", "1", "--recompute", "full",
                          "-m", "32", "--schedule", "overlapped"])
    assert "keep fewer micro-batches in flight (--schedule 1f1b)" in err and "no layout of" not in err, err


def test_auto_refusal_gives_its_advice_once(capsys):
    """Every schedule refused for memory: the one-chunk refusals ('add pipeline stages') and the interleaved ones
    ('add pipeline ranks') advise the same thing, so the advice reads once, with the search pointer once, and
    without schedule advice (every schedule was tried)."""
    err = _error(capsys, ["plan", "--model", "qwen3-30b-a3b", "--pp", "4", "--ep", "1", "-m", "64", "--seq-len",
                          "16384", "--schedule", "auto"])
    assert "interleaved vpp 2: no partition into 8 virtual stages fits" in err and "1f1b: no partition fits" in err
    advice = err.split("; advice: ", 1)[1]
    assert advice == ("add pipeline ranks, recompute activations (--recompute selective|full), shard further (ep for "
                      "experts, dp with a distributed optimizer) or shorten the sequence (tessera-lab search lists "
                      "layouts that fit, or the GPUs one needs)"), advice


def _plan_json(tmp_path, argv):
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "gpt-oss-20b", "--json", str(out), *argv]) == 0
    return json.loads(out.read_text())


def test_window_at_least_the_sequence_says_the_layers_are_full_attention(tmp_path, capsys):
    """gpt-oss-20b, 4096-token sequences: a sliding window >= 4096 lets every token see all earlier ones (query i
    sees min(i + 1, w) keys), so 100000 and 4096 cost the same and a note says so; 4095 and the config's 128 stay
    local (no note)."""
    wide, edge = _plan_json(tmp_path, ["--window", "100000"]), _plan_json(tmp_path, ["--window", "4096"])
    for d, w in ((wide, 100000), (edge, 4096)):
        note = [n for n in d["notes"] if n.startswith("window:")]
        assert len(note) == 1 and f"12 layer(s) (sliding {w} tokens)" in note[0], d["notes"]
        assert "compute as full causal attention" in note[0]
    assert wide["iteration_time_s"] == pytest.approx(edge["iteration_time_s"], rel=1e-12)
    for argv in (["--window", "4095"], []):
        assert not [n for n in _plan_json(tmp_path, argv)["notes"] if n.startswith("window:")]
