"""The runner's routing skew knob (``run --routing``) and its dynamic W filling (``run --dynamic``)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tessera_lab.errors import ConfigError  # noqa: E402
from tessera_lab.dynamic.routing import expert_shares, parse_routing  # noqa: E402
from tessera_lab.runner.launch.launch import add_run_arguments, routing_bias, specs_from_args  # noqa: E402
from tessera_lab.runner.runtime.reference import reference_run  # noqa: E402
from tessera_lab.runner.runtime.specs import TinyConfig  # noqa: E402


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(list(argv))


def test_the_pair_handler_has_one_option_name(capsys):
    """``--pair-exec`` (``pair_exec`` in a job) is the option; ``--overlap`` and a job field ``overlap`` are refused
    with one line naming it (exit 2 on the command line)."""
    from tessera_lab.runner.runtime.specs import RunSpec

    assert specs_from_args(_args("--pair-exec", "serial"))[1].pair_exec == "serial"
    assert specs_from_args(_args())[1].pair_exec is None  # the executor's default, threads
    with pytest.raises(SystemExit) as exc:
        _args("--overlap", "serial")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "--overlap = 'serial' is replaced by --pair-exec" in err
    with pytest.raises(ConfigError, match="field 'overlap' = 'thread' is replaced by 'pair_exec'"):
        RunSpec.from_dict({"schedule": "overlapped", "overlap": "thread"})
    assert "overlap" not in RunSpec().as_dict()


def test_routing_bias_rows_are_the_per_layer_shares():
    bias = np.array(routing_bias("zipf:1.5", {"num_layers": 4, "num_experts": 4}))
    assert bias.shape == (4, 4)
    shares = expert_shares(parse_routing("zipf:1.5"), 4, layers=4, steps=1, seed=0)[0]
    soft = np.exp(bias) / np.exp(bias).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(soft, shares, rtol=1e-12)
    # zipf(1.5) over 4 experts: the most popular gets 1 / H(4, 1.5) of the tokens
    h = sum(k ** -1.5 for k in range(1, 5))
    np.testing.assert_allclose(soft.max(axis=1), 1 / h, rtol=1e-12)
    # every layer holds the same zipf shares, placed by a seeded per-layer permutation of the experts: sorted rows
    # are the zipf shares, and with seed 0 the most popular expert is not the same one in every layer
    zipf = sorted(k ** -1.5 / h for k in range(1, 5))
    np.testing.assert_allclose(np.sort(soft, axis=1), [zipf] * 4, rtol=1e-12)
    assert len({int(np.argmax(r)) for r in bias}) > 1


def test_routing_knob_reaches_the_job_and_skews_the_router():
    _, job = specs_from_args(_args("--routing", "zipf:1.5", "--pp", "2", "--ep", "2"))
    cfg = job.model_config
    assert len(cfg.router_bias) == cfg.num_layers and len(cfg.router_bias[0]) == cfg.num_experts
    skew = reference_run(cfg, ep=2, steps=1, record_grads=())
    flat = reference_run(TinyConfig(), ep=2, steps=1, record_grads=())
    # the tiny router's own logits are small: the skewed layers' busiest expert gets clearly more tokens
    def top_share(res):
        return np.mean([max(r["routed"]) / sum(r["routed"]) for r in res.routing.values()])
    assert top_share(skew) > top_share(flat) + 0.05
    with pytest.raises(ConfigError, match="routing"):
        routing_bias("walk:0.5", {})
    with pytest.raises(ConfigError, match="router_bias"):
        TinyConfig(num_layers=2, router_bias=((0.0,) * 4,))


# ---------------------------------------------------------------------------------------------- gap filling
from tessera_lab.pipeline.schedules import Action, ActionType  # noqa: E402
from tessera_lab.runner.runtime.gaps import GapFiller  # noqa: E402
from tessera_lab.runner.runtime.layers import WEIGHT_GRAD_STORE  # noqa: E402


class _Work:
    """A receive that completes after ``polls`` calls of is_completed."""

    def __init__(self, polls: int):
        self.polls = polls

    def is_completed(self) -> bool:
        self.polls -= 1
        return self.polls < 0

    def wait(self) -> None:
        self.polls = -1


def _filler(cap=9):
    F, I, W = ActionType.F, ActionType.I, ActionType.W
    acts = [Action(0, F, 0), Action(0, F, 1), Action(0, I, 0), Action(0, F, 2), Action(0, I, 1), Action(0, I, 2),
            Action(0, W, 0), Action(0, W, 1), Action(0, W, 2)]
    ran = []
    clock = iter(range(1000))
    g = GapFiller(acts, cap, lambda a, how: (ran.append((a.microbatch, how)), WEIGHT_GRAD_STORE.flush((0, a.microbatch)),
                                             g.ran_w(a, 1.0)), lambda: float(next(clock)))
    return g, acts, ran


def test_gap_filler_needs_history_keeps_order_and_honours_the_cap():
    WEIGHT_GRAD_STORE.clear()
    g, acts, ran = _filler()
    g.begin_step()
    WEIGHT_GRAD_STORE.defer((0, 0))
    g.at(3)
    g.wait(_Work(5))
    assert ran == []  # step 0: no observed W seconds, no predicted wait
    g.ran_w(acts[6], 1.0)
    WEIGHT_GRAD_STORE.flush((0, 0))
    g.waits[3] = 10.0  # observed: 10 s at slot 3 (the clock ticks 1 s per read)
    g.end_step()
    g.begin_step()
    assert g.ctl.predicted[3] == 10.0
    WEIGHT_GRAD_STORE.defer((0, 1))
    WEIGHT_GRAD_STORE.defer((0, 0))
    g.at(3)
    g.wait(_Work(5))
    # W(0) is the oldest: 1 s fits (1 - 0.5) * 10 - elapsed; W(1) follows in order while it still fits
    assert [mb for mb, _ in ran] == [0, 1] and all(h == "fill" for _, h in ran)
    assert g.skip_w(acts[6]) and g.skip_w(acts[7]) and not g.skip_w(acts[8])
    WEIGHT_GRAD_STORE.clear()
    g, acts, ran = _filler(cap=2)
    g.begin_step()
    WEIGHT_GRAD_STORE.defer((0, 1))
    WEIGHT_GRAD_STORE.defer((0, 0))
    g.before_forward()  # 2 deferred >= cap 2: the oldest runs, then 1 < 2
    assert ran == [(0, "forced")]
    WEIGHT_GRAD_STORE.clear()


@pytest.mark.slow
def test_dynamic_run_is_bitwise_equal_to_static(tmp_path):
    from tessera_lab.runner import RunSpec, WorldSpec, spawn

    rb = routing_bias("zipf:1.5", {})
    common = dict(schedule="overlapped", defer_w=True, steps=5, model={"router_bias": rb}, save_grads=True)
    res = spawn(WorldSpec(pp=2, ep=2, timeout_s=60),
                [RunSpec(name="static", w_lag=0, gaps="observe", **common), RunSpec(name="dynamic", gaps="fill", **common)],
                out_dir=tmp_path, timeout_s=300)
    s, d = res.job("static"), res.job("dynamic")
    assert s["losses"] == d["losses"] and s["loss_sums"] == d["loss_sums"]
    for r in range(4):
        gs = torch.load(tmp_path / f"grads_static_rank{r}.pt")
        gd = torch.load(tmp_path / f"grads_dynamic_rank{r}.pt")
        assert gs.keys() == gd.keys() and all(torch.equal(gs[k], gd[k]) for k in gs)
    assert all(v["cap"] is None for v in s["gap_steps"][0].values())
    # one controller per EP group: both EP ranks of a pipeline rank plan with the same predicted waits in every
    # step; each stops filling when its own input has arrived (a completion query), so the fills themselves may
    # differ by that tail: on every rank they keep W in micro-batch order per stage
    pp_of = {e["rank"]: e["pp_rank"] for e in d["events"]}
    for st in d["gap_steps"]:
        for pr in set(pp_of.values()):
            recs = [st[str(r)] for r in pp_of if pp_of[r] == pr]
            assert len(recs) == 2 and all(w_order_kept(v["filled"]) for v in recs)
            assert recs[0]["predicted"].keys() == recs[1]["predicted"].keys()
            assert all(recs[0]["predicted"][k] == recs[1]["predicted"][k] for k in recs[0]["predicted"])
    assert sum(len(v["filled"]) for st in d["gap_steps"] for v in st.values()) > 0
    assert sum(v["decisions"]["fill"] for st in s["gap_steps"] for v in st.values()) == 0


def w_order_kept(filled: list[str]) -> bool:
    """True when the filled W passes (``"TAG:<stage>W<mb>"``) of each stage come in micro-batch order."""
    seen: dict[str, int] = {}
    for f in filled:
        stage, mb = f.split(":", 1)[1].split("W")
        if int(mb) < seen.get(stage, -1):
            return False
        seen[stage] = int(mb)
    return True


def test_dynamic_report_statistics_by_hand():
    from tessera_lab.runner.launch.dynamic_report import dynamic_report

    def job(name, times, idle, pred, obs):
        rec = {"0": {"idle": {"3": idle}, "predicted": {"3": pred}, "observed": {"3": obs},
                     "decisions": {"fill": 1 if name.startswith("dyn") else 0, "forced": 0}}}
        return {"name": name, "schedule": "overlapped", "losses": [1.0, 0.5, 0.25], "step_times_s": times,
                "gap_steps": [rec, rec, rec]}

    jobs = [job("static-0", [9.0, 2.0, 2.2], 0.5, 0.0, 0.4), job("dynamic-0", [9.0, 1.0, 1.2], 0.1, 0.3, 0.1)]
    rep = dynamic_report(jobs, 1, "zipf:1.5")
    assert rep["steps_compared"] == [1, 2]  # step 0 left out
    assert rep["static"]["step_time"]["median_s"] == pytest.approx(2.1)
    assert rep["dynamic"]["step_time"]["median_s"] == pytest.approx(1.1)
    assert rep["gain"] == pytest.approx(1.0 / 2.1)
    assert rep["gain_verdict"] == "significant"  # [1.05, 1.15] vs [2.05, 2.15]
    assert rep["idle_removed_s"] == pytest.approx(0.4)
    assert rep["dynamic"]["gap_prediction"]["mean_abs_error_s"] == pytest.approx(0.2)
    assert rep["losses_bitwise_equal_to_static"]
    jobs[1]["step_times_s"] = [9.0, 2.0, 2.3]
    assert dynamic_report(jobs, 1, None)["gain_verdict"] == "not significant"


def _hand_jobs(static_times, dynamic_times, idle_static=0.5, idle_dynamic=0.1):
    def job(name, times, idle, pred, obs):
        rec = {"0": {"idle": {"3": idle}, "predicted": {"3": pred}, "observed": {"3": obs},
                     "decisions": {"fill": 1 if name.startswith("dyn") else 0, "forced": 0}}}
        return {"name": name, "schedule": "overlapped", "losses": [1.0, 0.5, 0.25], "step_times_s": times,
                "gap_steps": [rec, rec, rec]}

    return [job("static-0", static_times, idle_static, 0.0, 0.4),
            job("dynamic-0", dynamic_times, idle_dynamic, 0.3, 0.1)]


def test_format_dynamic_labels_iqr_verdicts_and_a_predictor_worse_than_zero():
    from tessera_lab.runner.launch.dynamic_report import dynamic_report, format_dynamic

    rep = dynamic_report(_hand_jobs([9.0, 2.0, 2.2], [9.0, 1.0, 1.2]), 1, "zipf:1.5")
    # dynamic slots: predicted 0.3, observed 0.1 -> |error| 0.2; predicting 0 -> |error| 0.1 (worse than zero)
    gp = rep["dynamic"]["gap_prediction"]
    assert gp["mean_abs_error_s"] == pytest.approx(0.2) and gp["zero_predictor_mean_abs_error_s"] == pytest.approx(0.1)
    assert rep["idle_removed_verdict"] == "significant"  # idle per step [0.5, 0.5] vs [0.1, 0.1]
    text = format_dynamic(rep)
    # step times [2.0, 2.2]: median 2.1 s, quartiles 2.05 and 2.15 (numpy linear interpolation)
    assert "step time  static  median 2100.0 ms (interquartile range q1-q3 2050.0-2150.0 ms, n=2)" in text
    assert "gain +47.62% (significant)" in text  # (2.1 - 1.1) / 2.1
    assert "removed 400.0 ms (significant)" in text
    assert ("mean observed wait 100.00 ms (= the mean |error| of predicting no wait, 100.00 ms) over the same 2 "
            "slots") in text
    assert "the gap predictor does worse than predicting no gap" in text
    # inside the noise: static idle per step [0.2, 0.05] (IQR 0.0875-0.1625, median 0.125) holds the dynamic
    # 0.1; equal step times
    jobs = _hand_jobs([9.0, 2.0, 2.3], [9.0, 2.0, 2.3], idle_static=0.2)
    jobs[0]["gap_steps"][2] = {"0": dict(jobs[0]["gap_steps"][1]["0"], idle={"3": 0.05})}
    noisy = dynamic_report(jobs, 1, None)
    assert noisy["gain_verdict"] == noisy["idle_removed_verdict"] == "not significant"
    assert noisy["idle_removed_s"] == pytest.approx(0.025)
    t2 = format_dynamic(noisy)
    assert "gain +0.00% (not significant: inside the noise" in t2
    assert "removed 25.0 ms (not significant: inside the noise" in t2


@pytest.mark.slow
def test_cli_run_dynamic_json(tmp_path):
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tessera_lab", "run", "--pp", "2", "--ep", "2", "--schedule",
                          "overlapped", "--routing", "zipf:1.5", "--dynamic", "--steps", "3", "--trials", "1",
                          "--json", "-"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    assert rep["kind"] == "runner_dynamic" and rep["provenance"] == "observed"
    assert rep["losses_bitwise_equal_to_static"] and rep["interleaved"] == ["static-0", "dynamic-0"]
    assert rep["gain_verdict"] in ("significant", "not significant")
    bad = subprocess.run([sys.executable, "-m", "tessera_lab", "run", "--routing", "walk:0.5"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "routing" in bad.stderr


def test_job_identity_names_the_pair_handler_and_drops_the_routing_bias():
    from dataclasses import asdict

    from tessera_lab.runner.launch.dynamic_report import dynamic_report, job_identity
    from tessera_lab.runner.runtime.specs import RunSpec, WorldSpec

    world = asdict(WorldSpec(pp=2, ep=2))
    a = job_identity(RunSpec(schedule="overlapped", model={"router_bias": [[0.0] * 4] * 4}).as_dict(), world)
    b = job_identity(RunSpec(schedule="overlapped", pair_exec="serial").as_dict(), world)
    c = job_identity(RunSpec(schedule="overlapped", pair_exec="scheduled").as_dict(), world)
    assert a["pair_exec"] == "threads" and b["pair_exec"] == "serial" and c["pair_exec"] == "scheduled"
    assert "router_bias" not in a["model"] and a["model"]["hidden_size"] == 32 and a["model"] == b["model"]
    jobs = _hand_jobs([9.0, 2.0, 2.2], [9.0, 1.0, 1.2])
    for j in jobs:
        j.update(spec=RunSpec(schedule="overlapped", pair_exec="scheduled").as_dict(), world=world)
    rep = dynamic_report(jobs, 1, "zipf:1.5")
    assert rep["job"] == c and rep["job"]["microbatches"] == 4
