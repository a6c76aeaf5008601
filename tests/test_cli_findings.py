"""A fresh user's findings on the plan CLI (3, 4, 6, 7, 8, 13): one clear line naming the real rule, the plan
header, the MFU band and the FP8 note. Values worked by hand in the comments."""

from __future__ import annotations

import argparse

import pytest

from tessera_lab.argtypes import float_at_least, fraction_below_one, module_list, predictor_spec
from tessera_lab.checks import divisors_text
from tessera_lab.cli.main import main
from tessera_lab.model.hardware import RECOMPUTE_MODULES, ParallelConfig


def _error(capsys, argv):
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ------------------------------------------------------------------ 13: errors name the real rule
def test_expert_load_rule_is_at_least_one(capsys):
    for bad in ("nan", "0.5", "inf"):
        err = _error(capsys, ["plan", "--expert-load", bad])
        assert "allowed: a finite number >= 1" in err and "1e+12" not in err
    assert float_at_least("expert_load", 1.0)("1") == 1.0


def test_margin_rule_is_zero_to_below_one(capsys):
    for bad in ("-1", "1", "nan"):
        err = _error(capsys, ["simulate", "--dynamic", "--margin", bad])
        assert "allowed: 0 <= margin < 1" in err
    parse = fraction_below_one("margin")
    assert parse("0") == 0.0 and parse("0.999") == 0.999
    with pytest.raises(argparse.ArgumentTypeError):
        parse("1.0")


def test_predictor_window_zero_is_named(capsys):
    err = _error(capsys, ["simulate", "--dynamic", "--predictor", "moving-average:0"])
    assert "window K = 0 is out of range" in err and "unknown" not in err
    assert "is unknown" in _error(capsys, ["simulate", "--dynamic", "--predictor", "median:3"])
    parse = predictor_spec()
    assert [parse(x) for x in ("last-step", "moving-average:1", "minimum:8", "minimum")] == \
        ["last-step", "moving-average:1", "minimum:8", "minimum"]


def test_switch_given_a_value_names_the_flag_and_subcommand(capsys):
    err = _error(capsys, ["plan", "--ep-spans-tp", "0"])
    assert err.startswith("tessera-lab plan: error: argument --ep-spans-tp: is an on/off switch")
    assert "unrecognized" not in err
    assert "--no-distributed-optimizer" in _error(capsys, ["plan", "--no-distributed-optimizer", "yes"])


def test_ep_lists_the_divisors(capsys):
    err = _error(capsys, ["plan", "--ep", "3"])
    # 512 = 2^9: ten divisors 1, 2, ..., 512
    assert "allowed: a divisor of 512: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512" in err
    assert divisors_text(12) == "a divisor of 12: 1, 2, 3, 4, 6, 12"


# ------------------------------------------------------------------ 7: recompute modules
def test_recompute_modules_empty_names_refused(capsys):
    for bad in ("", "core_attn,,moe", "core_attn,", "moe,moe", "core_attn,foo"):
        err = _error(capsys, ["plan", "--recompute", "selective", "--recompute-modules", bad])
        assert "argument --recompute-modules" in err and "allowed: comma-separated names" in err
    assert module_list("m", RECOMPUTE_MODULES)("core_attn,moe_act") == ("core_attn", "moe_act")


def test_recompute_module_the_model_lacks_is_an_error(capsys):
    # Qwen3-Next: Gated DeltaNet + gated attention (no MLA), every FFN an MoE: mla_up_proj and mlp have nothing
    err = _error(capsys, ["plan", "--recompute", "selective", "--recompute-modules", "mla_up_proj"])
    assert "mla_up_proj" in err and "needs MLA attention" in err and "allowed for this model: core_attn, moe_act, moe" in err


def test_header_lists_recompute_modules(capsys):
    assert main(["plan", "--pp", "4", "-m", "8", "--recompute", "selective", "--recompute-modules",
                 "core_attn,moe_act"]) == 0
    assert "recompute selective (core_attn, moe_act)" in capsys.readouterr().out


# ------------------------------------------------------------------ 6: EP spans TP header
def test_ep_spans_tp_header_spells_the_layout(capsys):
    assert main(["plan", "--pp", "4", "-m", "8", "--ep-spans-tp", "--tp", "2"]) == 0
    head = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cluster "))
    # pp 4 x EP 8 = 32 GPUs; EP 8 = TP 2 x DP 4 (dense DP 4); expert DP = dp = 1; tokens 8 x 4096 x 4 = 131,072
    p = ParallelConfig(pp=4, ep=8, tp=2, microbatches=8, ep_spans_tp=True)
    assert (p.world_size, p.dense_dp, p.expert_dp) == (32, 4, 1)
    assert "= 32 GPUs; EP spans TP" in head and "EP group of 8 = TP 2 x DP 4 (expert TP 1, expert DP 1)" in head
    # with 2 expert replicas the stage holds 16 GPUs, and the EP group is still TP 2 x DP 4 (was "x dense DP 8")
    q = ParallelConfig(pp=4, ep=8, tp=2, dp=2, microbatches=8, ep_spans_tp=True)
    assert (q.world_size, q.dense_dp, q.ep_span_text()) == (64, 8, "TP 2 x DP 4")
    assert sorted(q.group_ranks("ep")) == list(range(8))
    assert "(131,072 tokens)" in head


# ------------------------------------------------------------------ 4: MFU against the band
def test_plan_prints_mfu_as_percentage_with_band(capsys):
    assert main(["plan", "--pp", "4", "-m", "8"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("MFU of the chosen plan (simulated):"))
    assert "% " in line or "%," in line
    assert "15.9%-21.1% Tessera paper" in line and "11.9%-21.1% Megatron-Bridge" in line


def test_grouped_gemm_above_band_warns(capsys):
    # one grouped GEMM and no host/sync term: the MFU the published runs never reach
    assert main(["plan", "--grouped-gemm", "grouped", "--host-sync-ms", "0"]) == 0
    out = capsys.readouterr().out
    assert "ABOVE the published band" in out
    warnings = [x for x in out.splitlines() if x.startswith("warning: MFU")]
    # short and once: the bands and their sources are on the MFU line above it, not repeated
    assert len(warnings) == 1 and len(warnings[0]) < 160 and "Tessera paper" not in warnings[0]
    assert out.count("Megatron-Bridge qwen3-30b-a3b") == 1


# ------------------------------------------------------------------ 3: FP8 says why
def test_fp8_plan_says_why_it_is_slower(capsys):
    assert main(["plan", "--precision", "fp8", "--pp", "4", "-m", "8"]) == 0
    out = capsys.readouterr().out
    note = next(x for x in out.splitlines() if x.startswith("note: precision fp8 is"))
    assert "than bf16" in note and "host-bound" in note and "weights cast once per step over m=8" in note


def test_precision_terms_kernel_difference_by_hand():
    # FP8 adds, per GEMM launch, 3 (input) + 3/m (weight) kernels in F and 3 in B: summed over the layers the
    # difference fp8 - bf16 equals that count over the GEMM tasks' launches
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.model.tasks import layer_tasks
    from tessera_lab.plan.precision import precision_terms

    model = load_model("qwen3-30b-a3b").with_changes(num_layers=2)
    p = ParallelConfig(pp=1, ep=16, dp=1, microbatches=4, expert_load=1.0)
    cl = cluster_for(p, "H100")
    t = precision_terms(model, p, cl)
    extra = 0.0
    for layer in range(2):
        for ph, per in (("F", 3 + 3 / 4), ("B", 3.0)):
            for task in layer_tasks(model, layer, p.replace(precision="fp8")).phase(ph):
                if task.op in ("gemm", "grouped_gemm") and task.gemms:
                    extra += per * len(task.gemms) * task.groups  # multistream: one launch per expert and shape
    assert t["fp8"]["kernels"] - t["bf16"]["kernels"] == pytest.approx(extra, rel=1e-9)
    assert CostModel(cl, p).a["host_s_per_kernel"] == 10e-6


# ------------------------------------------------------------------ 8: solver wording and the baseline rule
def test_time_limited_solver_is_not_called_optimum(capsys):
    assert main(["plan", "--schedule", "interleaved-overlapped", "--vpp", "2", "--pp", "4", "-m", "8",
                 "--time-limit", "0.01"]) == 0
    out = capsys.readouterr().out
    if "not proven optimal" in out or "time-limit fallback" in out:
        assert "than the solver optimum" not in out


def test_never_slower_than_a_fitting_baseline():
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import make_plan

    m = load_model("qwen3-next-80b-a3b")
    for objective in ("bottleneck", "auto"):
        plan = make_plan(m, ParallelConfig(schedule="interleaved-overlapped", vpp=2), objective=objective)
        for name, ev in plan.baselines.items():
            if ev.fits_memory:
                assert plan.chosen.iteration_time_s <= ev.iteration_time_s * (1 + 1e-9), (objective, name)


# ------------------------------------------------------------------ second pass 8: one line, the real rule
def test_tp_lists_the_allowed_values(capsys):
    # Qwen3-Next: 16 attention heads, 2 KV heads, 16 linear key heads, 8 GPUs a node: gcd 2 -> tp in {1, 2}
    err = _error(capsys, ["plan", "--tp", "3"])
    assert "must divide num_attention_heads = 16" in err and "allowed: 1, 2 (" in err


def test_top_k_names_the_option_and_the_real_range(capsys):
    for bad in ("0", "600"):  # the default model has 512 routed experts
        err = _error(capsys, ["plan", "--top-k", bad])
        assert f"--top-k = {bad} is out of range" in err and "1 to num_experts = 512" in err
        assert "num_experts_per_tok" not in err


def test_attention_ratio_states_the_lower_bound_and_meaning(capsys):
    for bad in ("0.3", "-1"):
        err = _error(capsys, ["plan", "--attention-ratio", bad])
        assert "--attention-ratio" in err and "an integer 0 to" in err and "linear-attention layers per full" in err


# ------------------------------------------------------------------ second pass 11: plan text
def test_selective_recompute_header_names_the_default_modules(capsys):
    from tessera_lab.cli.plan import _recompute_text

    assert _recompute_text(ParallelConfig(recompute="selective")) == "selective (core_attn, moe_act)"
    assert "default:" not in _recompute_text(ParallelConfig(recompute="selective"))
    # a model without MoE layers: the default set's moe_act has nothing to act on, so the header names core_attn alone
    assert _recompute_text(ParallelConfig(recompute="selective"), moe=False) == "selective (core_attn)"
    assert _recompute_text(ParallelConfig(recompute="full"), moe=False) == "full"


def test_summary_columns_keep_their_decimals_and_parameters_is_explained(capsys):
    assert main(["plan", "--pp", "4", "-m", "8"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, x in enumerate(out) if x.startswith("method"))
    rows = out[head + 2:head + 6]
    cols = [r.split() for r in rows]
    for c in range(1, 2):  # iteration (s): always 3 decimals
        assert all(len(r[c].split(".")[1]) == 3 for r in cols), rows
    assert any(x.startswith("baselines (") and "parameters: balanced on parameter bytes" in x and "DeepSpeed" in x
               for x in out)


def test_report_refuses_plan_options_beside_a_saved_plan(tmp_path, capsys):
    """A saved plan keeps its layout and costs: --host-sync-ms or --pp beside --plan would be ignored, so report
    refuses them (one line, exit 2) instead of answering for the saved plan as if they applied."""
    path = tmp_path / "p.json"
    assert main(["plan", "--pp", "4", "-m", "8", "--json", str(path)]) == 0
    capsys.readouterr()
    for extra, opt in ((["--host-sync-ms", "0"], "--host-sync-ms"), (["--pp", "2"], "--pp"),
                       (["--seq-len", "8192"], "--seq-len")):
        assert main(["report", "--plan", str(path), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and opt in err[0] and "saved plan" in err[0], err
    assert main(["report", "--plan", str(path)]) == 0


def test_auto_refusal_names_every_schedule_and_each_advice_once(capsys):
    """Qwen3-235B on 64 H100 at pp 8 ep 8 fits under no schedule: one line naming each schedule's worst stage, and
    the advice once (the one-chunk schedules' 'pipeline stages' are pipeline ranks, as the interleaved ones say)."""
    assert main(["plan", "--model", "qwen3-235b-a22b", "--gpu", "H100", "--pp", "8", "--ep", "8",
                 "--schedule", "auto"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    line = err[0]
    for name in ("overlapped:", "1f1b:", "zb-h1:", "interleaved vpp 2:"):
        assert name in line, name
    assert line.count("add pipeline stages") == 0 and line.count("add pipeline ranks") == 1


def test_plan_of_a_dense_model_says_why_the_standalone_baseline_is_absent(capsys):
    # without an overlapped schedule the standalone-balanced baseline is the planner's own balance (make.py skips it):
    # the baselines line says so instead of leaving it out silently
    from tessera_lab.cli.main import main

    assert main(["plan", "--model", "qwen3-8b"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("baselines (same schedule"))
    assert "uniform: even layer counts" in line and line.endswith(
        "standalone: not shown (without overlap the planner balances the same standalone costs)")
