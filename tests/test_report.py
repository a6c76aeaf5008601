"""Capacity report, model-change diff and the ``tessera-lab report`` command."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.plan.make import make_plan
from tessera_lab.plan.load import load_plan
from tessera_lab.report.capacity import (
    CATEGORIES,
    ActionBreakdown,
    apply_changes,
    capacity_breakdown,
    capacity_report,
    diff_contributions,
    model_diff,
    parse_changes,
)
from tessera_lab.pipeline.schedules import build_schedule
from tessera_lab.pipeline.simulate import override_durations, simulate, stage_durations


@pytest.fixture(scope="module")
def plan(qwen3_next):
    return make_plan(qwen3_next)


@pytest.fixture(scope="module")
def report(plan):
    return capacity_report(plan)


def _check_exact(rep, tol=1e-9):
    assert abs(math.fsum(rep.parts.values()) - rep.lost_gpu_s) <= tol
    assert abs(rep.lost_gpu_s - rep.iteration_time_s * rep.gpus * (1 - rep.mfu)) <= tol * max(1.0, rep.gpu_time_s)


def test_default_plan_breakdown_sums_and_matches_plan(plan, report):
    _check_exact(report)
    assert report.mfu == pytest.approx(plan.chosen.mfu, rel=1e-12)
    assert abs(report.parts["residual"]) < 1e-9  # every part is computed: the residual is float noise
    for k in CATEGORIES:
        assert k in report.parts
    for k, v in report.parts.items():
        if k not in ("residual", "routing_variance"):
            assert v >= -1e-9, (k, v)
    # the default plan has all the big categories
    for k in ("stage_imbalance", "exposed_ep_all_to_all", "exposed_pp_p2p", "bubble", "non_model_work",
              "kernel_efficiency", "overlap_contention", "runtime_overhead", "exposed_dp_grad_sync"):
        assert report.parts[k] > 0, k
    assert report.parts["memory_wait"] == 0
    assert abs(report.parts["routing_variance"]) < 1e-9
    assert 0 < report.ep_hidden_fraction < 1
    table = report.table()
    assert list(table["category"]) == list(report.parts)
    assert table["share_of_lost"].sum() == pytest.approx(1.0)
    text = report.format()
    assert "MFU" in text and "stage imbalance" in text


def test_idle_split_per_rank_equals_simulated_idle(plan, report):
    tl = plan.chosen.timeline
    for r, row in enumerate(report.per_rank):
        assert row["busy_s"] == pytest.approx(tl.per_rank_busy[r], rel=1e-12)
        split = row["exposed_comm_s"] + row["stage_imbalance_s"] + row["bubble_s"] + row["routing_variance_idle_s"]
        assert split == pytest.approx(tl.per_rank_idle[r], abs=1e-12)


def test_stage_imbalance_closed_form_1f1b():
    """1F1B, uniform actions per stage: imbalance = sum_r (slowest - this) x m when the bubble allows."""
    sched = build_schedule("1f1b", 4, 8)
    f, b = [1.0, 1.5, 1.0, 1.2], [2.0, 3.0, 2.0, 2.4]
    tl = simulate(sched, stage_durations(f, b))
    recipes = {(s, t): ActionBreakdown({"model_at_peak": d}, {}, d) for s in range(4)
               for t, d in (("F", f[s]), ("B", b[s]))}
    rep = capacity_breakdown(tl, recipes, gpus=4, model_flops=1e15 * sum(8 * (f[s] + b[s]) for s in range(4)),
                             peak_flops=1e15)
    _check_exact(rep)
    slow = max(x + y for x, y in zip(f, b))
    want = sum((slow - (f[s] + b[s])) * 8 for s in range(4))
    assert rep.parts["stage_imbalance"] == pytest.approx(want)
    assert rep.parts["bubble"] == pytest.approx(sum(tl.per_rank_idle) - want)


def test_routing_variance_from_perturbed_durations(plan):
    """A timeline with per-micro-batch variation (as routing skew gives) puts the extra time in routing
    variance, and the breakdown still sums exactly."""
    ev = plan.chosen
    p = plan.parallel
    sched = build_schedule(p.schedule, p.pp, p.microbatches)
    base = stage_durations([s.f_s for s in ev.stages], [s.b_s for s in ev.stages], [s.w_s for s in ev.stages],
                           fb=[s.overlap_s for s in ev.stages])
    slow = override_durations(base, {(3, mb, "OVERLAP_F_B"): ev.stages[3].overlap_s * 1.5 for mb in range(5, 12)})
    tl = simulate(sched, slow)
    rep = capacity_report(plan, timeline=tl)
    _check_exact(rep)
    assert tl.iteration_time > ev.iteration_time_s
    assert rep.parts["routing_variance"] > 0
    busy_extra = 7 * ev.stages[3].overlap_s * 0.5 * p.world_size / p.pp
    assert rep.parts["routing_variance"] >= busy_extra * (1 - 1e-9)


def test_observed_event_list_with_memory_wait():
    events = [
        {"rank": 0, "stage": 0, "microbatch": 0, "type": "F", "start": 10.0, "end": 11.2, "lane": "compute"},
        {"rank": 0, "stage": 0, "microbatch": 0, "type": "memory_wait", "start": 11.2, "end": 11.5, "lane": "compute"},
        {"rank": 0, "stage": 0, "microbatch": 0, "type": "B", "start": 13.0, "end": 15.0, "lane": "compute"},
        {"rank": 1, "stage": 1, "microbatch": 0, "type": "RECV_F", "start": 11.2, "end": 11.4, "lane": "comm"},
        {"rank": 1, "stage": 1, "microbatch": 0, "type": "F", "start": 11.4, "end": 12.4, "lane": "compute"},
        {"rank": 1, "stage": 1, "microbatch": 0, "type": "B", "start": 12.4, "end": 14.4, "lane": "compute"},
    ]
    recipes = {(0, "F"): 1.0, (0, "B"): 2.0, (1, "F"): 1.0, (1, "B"): 2.0}
    rep = capacity_breakdown(events, recipes, gpus=16, model_flops=2.0e15 * 16, peak_flops=1e15,
                             nominal={(0, "F"): 1.1, (0, "B"): 2.0, (1, "F"): 1.0, (1, "B"): 2.0})
    _check_exact(rep)
    assert rep.iteration_time_s == pytest.approx(5.0)
    assert rep.parts["memory_wait"] == pytest.approx(0.3 * 8)
    assert rep.parts["exposed_pp_p2p"] == pytest.approx(0.2 * 8)
    assert rep.parts["runtime_overhead"] == pytest.approx(0.1 * 8)  # nominal 1.1 vs predicted 1.0
    assert rep.parts["routing_variance"] == pytest.approx(0.1 * 8)  # observed 1.2 vs nominal 1.1
    assert "compute_unsplit" in rep.parts
    with pytest.raises(ConfigError, match="no predicted breakdown"):
        capacity_breakdown(events, {(0, "F"): 1.0}, gpus=16, model_flops=1.0, peak_flops=1e15)


def test_observed_run_against_plan_predictions(plan):
    """An observed run in the simulator's event format, 10% slower than predicted on every action plus one
    slow micro-batch: the systematic part is runtime overhead, the spike routing variance."""
    from tessera_lab.report.capacity import capacity_from_observed, evaluation_recipes

    ev = plan.chosen
    p = plan.parallel
    sched = build_schedule(p.schedule, p.pp, p.microbatches)
    base = stage_durations([s.f_s * 1.1 for s in ev.stages], [s.b_s * 1.1 for s in ev.stages],
                           fb=[s.overlap_s * 1.1 for s in ev.stages])
    tl = simulate(sched, override_durations(base, {(2, 9, "OVERLAP_F_B"): ev.stages[2].overlap_s * 2.0}))
    events = [{"rank": e.rank, "stage": e.stage, "microbatch": e.microbatch, "type": e.type, "start": e.start + 100.0,
               "end": e.end + 100.0, "lane": e.lane, "label": e.label} for e in tl.events]
    recipes = evaluation_recipes(plan.model, p, plan.cluster, ev)
    rep = capacity_from_observed(events, recipes, gpus=p.world_size, model_flops=plan.model_flops,
                                 peak_flops=plan.cluster.gpu.peak_flops)
    _check_exact(rep)
    G = p.world_size / p.pp
    busy_pred = sum(ev.timeline.per_rank_busy)
    assert rep.parts["runtime_overhead"] > 0.09 * busy_pred * G
    assert rep.parts["routing_variance"] == pytest.approx(ev.stages[2].overlap_s * (2.0 - 1.1) * G, rel=1e-6)
    assert rep.source == "observed run"


def test_runner_job_step():
    from tessera_lab.report.capacity import capacity_from_runner

    def ev(step, rank, lane, typ, stage, start, end):
        return {"step": step, "rank": rank, "lane": lane, "type": typ, "stage": stage, "microbatch": 0,
                "start": start, "end": end, "label": f"{stage}{typ}0"}

    events = [ev(0, 0, "compute", "F", 0, 0.0, 1.0), ev(0, 0, "compute", "B", 0, 3.0, 5.0),
              ev(0, 1, "comm", "RECV_F", 1, 1.0, 1.1), ev(0, 1, "compute", "F", 1, 1.1, 2.1),
              ev(0, 1, "comm", "ep_a2a", 1, 2.1, 2.2), ev(0, 1, "compute", "B", 1, 2.2, 4.2),
              ev(1, 0, "compute", "F", 0, 0.0, 1.0)]
    job = {"name": "tiny", "events": events, "timing": {"durations": {"f": [1.0, 1.0], "b": [2.0, 2.0], "w": None,
                                                                      "fb": [3.0, 3.0]}}}
    rep = capacity_from_runner(job, model_flops=2e12, peak_flops=1e12, step=0)
    _check_exact(rep)
    assert rep.parts["exposed_pp_p2p"] == pytest.approx(0.1)
    assert rep.parts["exposed_ep_all_to_all"] == pytest.approx(0.1)
    with pytest.raises(ConfigError):
        capacity_from_runner(job, model_flops=1.0, peak_flops=1.0, step=7)
    with pytest.raises(ConfigError):
        capacity_from_runner({}, model_flops=1.0, peak_flops=1.0)


# ------------------------------------------------------------------ property tests
@st.composite
def timelines(draw):
    R = draw(st.integers(1, 4))
    events, recipes, nominal = [], {}, {}
    for r in range(R):
        t = draw(st.floats(0, 2))
        for k in range(draw(st.integers(1, 5))):
            typ = draw(st.sampled_from(["F", "B", "OVERLAP_F_B"]))
            key = (r, typ)
            if key not in recipes:
                parts = {c: draw(st.floats(0, 1)) for c in ("model_at_peak", "kernel_efficiency", "non_model_work",
                                                           "exposed_ep_all_to_all", "overlap_contention")}
                total = math.fsum(parts.values())
                if total <= 0:
                    parts["model_at_peak"] = total = 0.5
                recipes[key] = ActionBreakdown(parts, {"all_to_all:ep": draw(st.floats(0, 1))}, total)
                nominal[key] = total * draw(st.floats(0.5, 1.5))
            d = nominal[key] * draw(st.floats(0.5, 2.0))
            start = t + draw(st.floats(-0.3, 1.0))  # negative: overlapping compute events
            start = max(0.0, start)
            events.append({"rank": r, "stage": r, "microbatch": k, "type": typ, "start": start, "end": start + d,
                           "lane": "compute"})
            t = start + d
            if draw(st.booleans()):
                cs = max(0.0, start + draw(st.floats(-1, 3)))
                events.append({"rank": r, "stage": r, "microbatch": k, "type": draw(st.sampled_from(
                    ["RECV_F", "RECV_B", "dp_grad_sync", "custom"])), "start": cs, "end": cs + draw(st.floats(0, 1)),
                    "lane": "comm"})
            if draw(st.booleans()):
                ms = t + draw(st.floats(0, 0.5))
                events.append({"rank": r, "stage": r, "microbatch": k, "type": "memory_wait", "start": ms,
                               "end": ms + draw(st.floats(0, 0.5)), "lane": "compute"})
    return events, recipes, nominal, R


@given(timelines(), st.integers(1, 64), st.floats(0.0, 1.0), st.booleans(), st.floats(0.5, 1.5))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_breakdown_sums_to_lost_time_on_random_timelines(tl, per_rank, useful_share, with_nominal, t0_scale):
    events, recipes, nominal, R = tl
    gpus = R * per_rank
    T = max(e["end"] for e in events) - min(e["start"] for e in events)
    peak = 1e14
    flops = useful_share * T * gpus * peak
    rep = capacity_breakdown(events, recipes, gpus=gpus, model_flops=flops, peak_flops=peak, nominal=nominal,
                             nominal_iteration_s=T * t0_scale if with_nominal else None)
    assert abs(math.fsum(rep.parts.values()) - rep.lost_gpu_s) <= 1e-9
    assert abs(rep.parts["residual"]) <= 1e-9
    for k in ("stage_imbalance", "bubble", "memory_wait", "exposed_pp_p2p", "exposed_dp_grad_sync"):
        assert rep.parts[k] >= -1e-9, k


@given(
    width=st.sampled_from([128, 512, 1024]),
    top_k=st.sampled_from([2, 10]),
    ratio=st.sampled_from([1, 3]),
    pp=st.sampled_from([1, 2, 4]),
    extra_mb=st.integers(0, 4),
    schedule=st.sampled_from(["overlapped", "1f1b", "zb-h1", "gpipe"]),
    ep=st.sampled_from([4, 8, 16]),
    dp=st.sampled_from([1, 2]),
)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_breakdown_sums_on_random_plans(qwen3_next, width, top_k, ratio, pp, extra_mb, schedule, ep, dp):
    model = qwen3_next.with_changes(moe_intermediate_size=width, num_experts_per_tok=top_k, attention_ratio=ratio,
                                    num_layers=8)
    par = ParallelConfig(pp=pp, ep=ep, dp=dp, microbatches=2 * pp + extra_mb, seq_len=1024, schedule=schedule)
    plan = make_plan(model, par, method="dp", baselines=())
    rep = capacity_report(plan)
    _check_exact(rep)
    assert abs(rep.parts["residual"]) <= 1e-9 * max(1.0, rep.gpu_time_s)
    assert rep.mfu == pytest.approx(plan.chosen.mfu, rel=1e-12)
    if ep > 8:  # EP group crosses nodes
        assert rep.ep_comm_gpu_s > 0


# ------------------------------------------------------------------ diff
def test_model_diff_contributions_exact(plan, qwen3_next):
    d = model_diff(qwen3_next, {"expert_width": 1024}, plan.parallel, plans=None)
    (pa, pb), (ca, _) = d.plans, d.capacity
    dT = pb.chosen.iteration_time_s - pa.chosen.iteration_time_s
    assert sum(d.contributions_ms_per_gpu.values()) == pytest.approx(dT * 1e3, abs=1e-9)
    # the headline names the largest contribution, whichever way it went
    top = max(d.contributions_ms_per_gpu, key=lambda k: abs(d.contributions_ms_per_gpu[k]))
    assert top in d.headline and "MFU" in d.headline
    rows = {r["metric"]: r for r in d.summary_rows()}
    assert {"iteration time", "MFU", "memory headroom (tightest stage)", "exposed EP all-to-all"} <= set(rows)
    assert len(d.stage_rows()) == plan.parallel.pp
    assert set(d.contributions_ms_per_gpu) >= {"model work at peak", "stage imbalance"}
    assert diff_contributions(ca, ca)["model work at peak"] == 0


def test_report_figure_names_the_configuration_and_shows_both_diff_variants(plan, report, qwen3_next):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tessera_lab.report.capacity import plan_caption
    from tessera_lab.ui.report_figure import report_figure

    fig = report_figure(plan, report)
    (ax,) = fig.axes
    assert plan.model.name in ax.get_title() and f"pp={plan.parallel.pp}" in ax.get_title()
    plt.close(fig)
    d = model_diff(qwen3_next, {"top_k": 4}, plan.parallel)
    fig = report_figure(plan, report, d)
    axes = [a for a in fig.axes if a.get_title()]
    assert len(axes) == 2  # the base and the variant side by side
    assert d.labels[0] in axes[0].get_title() and d.labels[1] in axes[1].get_title()
    assert axes[0].get_ylim() == axes[1].get_ylim()  # one y scale
    assert "x H" in plan_caption(plan)
    plt.close(fig)


def test_changes_parse_and_apply(qwen3_next):
    ch = parse_changes("expert_width=256, top_k=4, seq_len=8192, dtype=fp8, attention_ratio=1")
    m, p = apply_changes(qwen3_next, ParallelConfig(), ch)
    assert m.moe.moe_intermediate_size == 256 and m.moe.num_experts_per_tok == 4 and m.attention_ratio == 1
    assert p.seq_len == 8192 and p.dtype == "fp8"
    with pytest.raises(ConfigError, match="invalid"):
        parse_changes("colour=blue")
    with pytest.raises(ConfigError):
        apply_changes(qwen3_next, ParallelConfig(), {"dtype": "int3"})


def test_plan_json_round_trip(plan, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.as_dict()))
    again = load_plan(path)
    assert again.chosen.iteration_time_s == pytest.approx(plan.chosen.iteration_time_s, rel=1e-12)
    bad = dict(plan.as_dict(), boundaries=[0, 5, 3, 48])
    with pytest.raises(ConfigError, match="boundaries"):
        load_plan(bad)


# ------------------------------------------------------------------ CLI
def test_cli_report_json_and_plot(tmp_path, capsys):
    from tessera_lab.cli.main import main

    out = tmp_path / "r.json"
    png = tmp_path / "w.png"
    assert main(["report", "--pp", "2", "--ep", "4", "-m", "4", "--seq-len", "1024", "--layers", "8",
                 "--json", str(out), "--plot", str(png), "--diff", "top_k=4"]) == 0
    data = json.loads(out.read_text())
    cap = data["capacity"]
    assert abs(sum(cap["parts_gpu_s"].values()) - cap["lost_gpu_s"]) < 1e-9
    assert "headline" in data["diff"]
    assert png.stat().st_size > 0
    assert "capacity report" in capsys.readouterr().out


@pytest.mark.parametrize("argv, needle", [
    (["report", "--plan", "{missing}"], "plan"),
    (["report", "--plan", "{bad_json}"], "not valid JSON"),
    (["report", "--plan", "{no_parallel}"], "plan.parallel"),
    (["report", "--diff", "colour=blue"], "colour=blue"),
    (["report", "--pp", "0"], "pp"),
    (["report", "--model", "no-such-model"], "no-such-model"),
])
def test_cli_report_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, needle):
    from tessera_lab.cli.main import main

    bad_json = tmp_path / "bad.json"
    bad_json.write_text("not json")
    no_parallel = tmp_path / "np.json"
    no_parallel.write_text(json.dumps({"model": "qwen3-next-80b-a3b", "boundaries": [0, 48]}))
    argv = [a.format(missing=tmp_path / "missing.json", bad_json=bad_json, no_parallel=no_parallel) for a in argv]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse errors
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err


def test_repeated_diff_accumulates_like_the_comma_form(capsys):
    """``--diff attention_ratio=1 --diff top_k=4`` means both changes (the comma form), never the last only; a plan or
    model given with another --diff, or a key given twice with different values, is refused in one line."""
    import argparse

    from tessera_lab.cli import report as cli_report
    from tessera_lab.cli.main import main
    from tessera_lab.errors import ConfigError
    from tessera_lab.report.capacity import parse_changes
    from tessera_lab.report.diff import merge_diff_args

    sub = argparse.ArgumentParser().add_subparsers()
    cli_report.add_parser(sub)
    args = sub.choices["report"].parse_args(["--diff", "attention_ratio=1", "--diff", "top_k=4"])
    merged = merge_diff_args(args.diff)
    assert parse_changes(merged) == parse_changes("attention_ratio=1,top_k=4") == {"attention_ratio": 1, "top_k": 4}
    assert merge_diff_args(["top_k=4"]) == "top_k=4" and merge_diff_args(None) is None
    with pytest.raises(ConfigError, match="allowed: one plan or model"):
        merge_diff_args(["plan.json", "top_k=4"])
    with pytest.raises(ConfigError, match="given twice"):
        parse_changes(merge_diff_args(["top_k=2", "top_k=4"]))
    assert parse_changes("top_k=4,top_k=4") == {"top_k": 4}
    for a, b in (("top_k=4", "num_experts_per_tok=2"), ("expert_width=256", "moe_intermediate_size=256"),
                 ("seq_len=8192", "context_length=4096")):  # two names of one setting: refused, whichever values
        with pytest.raises(ConfigError, match="sets the same setting"):
            parse_changes(merge_diff_args([a, b]))
    assert main(["report", "--diff", "qwen3-next-80b-a3b", "--diff", "top_k=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--diff 'qwen3-next-80b-a3b'" in err[0]


def test_report_plan_of_a_config_path_model_needs_no_file(tmp_path, capsys):
    """A plan of a model given as a config.json path carries the config: ``report --plan`` rebuilds the same model
    (same iteration time) after the file is gone; a tampered ``hf_config`` is one line, exit 2."""
    import json
    import shutil

    from tessera_lab.cli.main import main
    from tessera_lab.plan.load import load_plan

    src = tmp_path / "Kimi-Linear-48B-A3B.json"
    shutil.copy(_shipped_config("kimi-linear-48b-a3b"), src)  # the real config.json, under its own name
    out = tmp_path / "p.json"
    assert main(["plan", "--model", str(src), "--json", str(out)]) == 0
    src.unlink()
    d = json.loads(out.read_text())
    assert d["model"] == "Kimi-Linear-48B-A3B" and d["hf_config"]["model_type"] == "kimi_linear"
    plan = load_plan(out)
    assert plan.chosen.iteration_time_s == d["iteration_time_s"]
    capsys.readouterr()
    assert main(["report", "--plan", str(out)]) == 0
    assert "Kimi-Linear-48B-A3B" in capsys.readouterr().out
    d["hf_config"] = [1, 2]
    out.write_text(json.dumps(d))
    assert main(["report", "--plan", str(out)]) == 2
    assert "field 'hf_config' is a JSON list" in capsys.readouterr().err


def _shipped_config(name):
    from tessera_lab.model.spec import shipped_models

    return shipped_models()[name]


def test_a_config_named_like_a_shipped_model_is_carried_not_replaced(tmp_path):
    """A config.json whose file name is a shipped model's but whose contents differ (30 layers, not 36): the plan
    carries it, and reloading gives its 30 layers, never the shipped model of that name."""
    import json

    from tessera_lab.cli.main import main
    from tessera_lab.plan.load import load_plan

    cfg = json.loads(_shipped_config("qwen3-8b").read_text())
    cfg["num_hidden_layers"] = 30
    src = tmp_path / "qwen3-8b.json"
    src.write_text(json.dumps(cfg))
    out = tmp_path / "p.json"
    assert main(["plan", "--model", str(src), "--json", str(out)]) == 0
    assert "hf_config" in json.loads(out.read_text())
    assert load_plan(out).model.num_layers == 30


def test_fp8_gemms_beyond_the_bf16_peak_get_their_own_negative_row():
    """A model-FLOP task faster than its FLOPs at the bf16 peak (an FP8 GEMM) books the gain as a negative
    ``beyond_bf16_peak`` part, its FLOPs at peak in full and nothing to kernel efficiency or non-model work; a slower
    one books the difference as kernel efficiency. By hand: 2e12 FLOP at 1e15 FLOP/s = 2 ms at peak."""
    from tessera_lab.cost.analytic import Contention
    from tessera_lab.model.tasks import Task
    from tessera_lab.report.categories import lane_breakdown

    gemm = Task("fc1", 0, "F", "gemm", flops=2e12)
    for dur, eff, gain in ((1.5e-3, 0.0, -0.5e-3), (3.0e-3, 1.0e-3, 0.0)):
        res = lane_breakdown(["fc1"], {"fc1": dur}, {"fc1": "compute"}, {}, {"fc1": gemm},
                             contention=Contention(), peak_flops=1e15, launch_s=0.0)
        assert res.parts["model_at_peak"] == pytest.approx(2e-3)
        assert res.parts.get("kernel_efficiency", 0.0) == pytest.approx(eff)
        assert res.parts.get("beyond_bf16_peak", 0.0) == pytest.approx(gain)
        assert res.parts.get("non_model_work", 0.0) == 0.0
        assert sum(res.parts.values()) == pytest.approx(dur)


def test_dense_fp8_report_keeps_non_model_work_positive_and_drops_the_routing_rows(capsys):
    """Llama 3.1 70B in FP8 on B200: its GEMMs beat the bf16 peak MFU is measured against, which shows as the
    negative FP8 row (non-model work stays >= 0); without MoE layers the EP all-to-all and routing-variance rows,
    zero by construction, are left out and said so; the parts still sum to the lost time."""
    from tessera_lab.cli.main import main

    assert main(["report", "--model", "llama-3.1-70b", "--gpu", "B200", "--gpus", "64", "--precision", "fp8",
                 "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    parts = out["capacity"]["parts_gpu_s"]
    assert parts["beyond_bf16_peak"] < 0 <= parts["non_model_work"]
    assert "exposed_ep_all_to_all" not in parts and "routing_variance" not in parts
    assert math.fsum(parts.values()) == pytest.approx(out["capacity"]["lost_gpu_s"], rel=1e-9)
    assert any(n.startswith("no MoE layers: no exposed EP all-to-all or routing variance row")
               for n in out["capacity"]["notes"])
    assert main(["report", "--model", "llama-3.1-70b", "--gpus", "64"]) == 0
    text = capsys.readouterr().out
    rows = [line.split("  ")[0] for line in text.splitlines()]
    assert "faster than bf16 peak (FP8)" not in rows and "exposed EP all-to-all" not in rows
    assert "exposed PP p2p" in rows
    assert "routing and dynamic correction: none (no MoE layers: nothing is routed)" in text
