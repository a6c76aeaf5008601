"""The planner plans what the runner runs: the tiny runner model as a ModelSpec, calibrated
device files, predictions checked by hand, ``plan --device``, ``run --plan`` (prediction before the run vs
observation), ``report --observed`` and the validation matrix. Torch-free except the one launch (a few seconds).
"""

from __future__ import annotations

import json
import re
import math

import pytest

from tessera_lab.cli.main import main as cli
from tessera_lab.cost.device import layer_times, load_device
from tessera_lab.model.flops import runner_layer_flops as layer_flops
from tessera_lab.errors import ConfigError
from tessera_lab.model.spec import load_model
from tessera_lab.runner.testbed.predict import (MachineState, PlanChoices, balanced_boundaries, device_plan,
                                                 predict_runner)
from tessera_lab.runner.runtime.specs import TinyConfig
from tessera_lab.runner.testbed.validate import cases

RATE = 1e-9  # seconds per FLOP in the synthetic device


def synthetic_device(cores: int = 64, a2a_alpha: float = 0.0, head: float = 0.0) -> dict:
    """A device whose layers cost exactly flops * RATE (F) and 2 flops * RATE (B), no overheads."""
    pts = lambda r: [[1e6, 1e6 * r], [2e6, 2e6 * r]]  # noqa: E731
    return {"kind": "calibrated_device", "schema_version": 1, "name": "synthetic",
            "layers": {k: {"F": pts(RATE), "B": pts(2 * RATE), "w_share": 0.5}
                       for k in ("linear_attention", "full_attention")},
            "extras": {"embed_F_s": 0.0, "embed_B_s": 0.0, "head_F_s": head, "head_B_s": head, "head_tokens": 32},
            "throughput": {"gemm_flop_per_s": 1 / RATE}, "p2p": {"alpha_s": 0.0, "bytes_per_s": 0.0},
            "all_to_all": {"2": {"alpha_s": a2a_alpha, "bytes_per_s": 0.0}},
            "metadata": {"cores": cores, "date": "2026-12-01", "device": "synthetic"}}


def test_tiny_runner_is_a_shipped_model_and_round_trips():
    spec = load_model("tiny-runner")
    cfg = TinyConfig()
    assert spec.hidden_size == cfg.hidden_size and len(spec.stack.layers) == cfg.num_layers
    assert [l.kind.split("+")[0] for l in spec.stack.layers] == cfg.layer_kinds()
    assert spec.moe.num_experts == cfg.num_experts and spec.moe.num_experts_per_tok == cfg.top_k
    assert TinyConfig.from_hf_config(cfg.to_hf_config()) == cfg
    with pytest.raises(ConfigError, match="tessera_runner"):
        TinyConfig.from_hf_config({"hidden_size": 8})


def test_layer_flops_by_hand():
    d = TinyConfig().as_dict()  # H 32, h 2, d 16, kv 1, E 4, k 2, w 16, ws 32, T 16, C 8
    # full attention, 32 tokens: mixer GEMMs 32*(2*32+2*16) + 32*32 = 4096; MoE 32*4 + 2*(32*32 + 16*32)
    # + 32*64 + 32*32 + 32 = 128 + 3072 + 3104 = 6304; 2 * 32 * (4096 + 6304) + core 2*32*16*2*16
    assert layer_flops(d, "full_attention", 32) == 2 * 32 * (4096 + 6304) + 2 * 32 * 16 * 2 * 16
    with pytest.raises(ConfigError, match="layer kind"):
        layer_flops(d, "mamba", 32)


def test_prediction_by_hand():
    dev = synthetic_device()
    cfg = TinyConfig().as_dict()
    tokens = 2 * cfg["seq_len"]
    lt = layer_times(dev, cfg, "linear_attention", tokens)
    x = layer_flops(cfg, "linear_attention", tokens)
    assert lt["F"] == pytest.approx(x * RATE) and lt["B"] == pytest.approx(2 * x * RATE)
    assert lt["W"] == pytest.approx(lt["B"] / 2)
    kinds = TinyConfig().layer_kinds()
    per_layer = [layer_flops(cfg, k, tokens) * RATE for k in kinds]
    # one stage (pp = 1), GPipe: every micro-batch's F then B, nothing overlaps: m * 3 * sum(F)
    p = predict_runner(dev, cfg, pp=1, ep=1, schedule="gpipe", microbatches=4, micro_batch_size=2)
    assert p["iteration_s"] == pytest.approx(4 * 3 * sum(per_layer))
    # two stages, 1F1B with p = 2, m = 4: (m + p - 1) (F + B) for equal stages; boundaries [0, 2, 4]
    p2 = predict_runner(dev, cfg, pp=2, ep=1, schedule="1f1b", microbatches=4, micro_batch_size=2)
    s0, s1 = sum(per_layer[:2]), sum(per_layer[2:])
    assert p2["stage_f_s"] == pytest.approx([s0, s1]) and p2["stage_b_s"] == pytest.approx([2 * s0, 2 * s1])
    assert p2["iteration_s"] >= 4 * 3 * max(s0, s1)
    # ep = 2 adds, per MoE layer and direction, a count exchange and two all-to-alls (alpha each here)
    p3 = predict_runner(synthetic_device(a2a_alpha=1e-3), cfg, pp=1, ep=2, schedule="gpipe", microbatches=4,
                        micro_batch_size=2)
    assert p3["iteration_s"] - p["iteration_s"] == pytest.approx(4 * 2 * 4 * 3e-3)
    # processor sharing: 2 replicas x 2 ranks = 4 processes on 2 cores; equal stages (F = s0, B = 2 s0),
    # 1F1B p = 2, m = 4, by hand: both ranks computing -> each at 1/2, one alone -> full speed:
    # 0-1 r0 F0 | 1-3 r0 F1, r1 F0 | 3-5 r1 B0 | 5-7 r1 F1 (r0 B0 half done) | 7-9 r0 B0 (r1 B1 half)
    # 9-11 r0 F2, r1 B1 | 11-13 r1 F2 | 13-15 r0 B1 | 15-17 r0 F3, r1 B2 | 17-19 r1 F3 | 19-21 r0 B2
    # 21-22 r1 B3 alone | 22-24 r0 B3 alone: 24 s0 = total work (2 x 2 x 4 x 3 s0) / 2 cores
    p4 = predict_runner(synthetic_device(cores=2), cfg, pp=2, ep=2, schedule="1f1b", microbatches=4,
                        micro_batch_size=2)
    assert s0 == pytest.approx(s1) and p4["iteration_s"] == pytest.approx(24 * s0)
    assert p4["cores_available"] == 2.0 and p4["oversubscription"] > 1.0
    # half a core available (measured before the run): every step of the timeline 4x slower
    p5 = predict_runner(synthetic_device(cores=2), cfg, pp=2, ep=2, schedule="1f1b", microbatches=4,
                        micro_batch_size=2, machine=MachineState(cores_available=0.5))
    assert p5["iteration_s"] == pytest.approx(4 * 24 * s0)
    # the same work taking 1.5x the CPU now (work probe 3 ms against the calibration's 2 ms): one stage,
    # nothing shared, no latency -> 1.5x the step and the CPU; a device without a probe ignores it
    dev6 = {**synthetic_device(), "runner_cpu": {"work_probe": {"ref_s": 2e-3}}}
    p6 = predict_runner(dev6, cfg, pp=1, ep=1, schedule="gpipe", microbatches=4, micro_batch_size=2,
                        machine=MachineState(work_probe_s=3e-3))
    assert p6["work_scale"] == pytest.approx(1.5)
    assert p6["iteration_s"] == pytest.approx(1.5 * p["iteration_s"])
    assert p6["cpu_per_step_s"] == pytest.approx(1.5 * 4 * 3 * sum(per_layer))
    assert predict_runner(dev, cfg, pp=1, ep=1, schedule="gpipe", microbatches=4, micro_batch_size=2,
                          machine=MachineState(work_probe_s=3e-3))["iteration_s"] == pytest.approx(p["iteration_s"])
    # the co-running table: two processes of one stage (ep = 2, no all-to-all cost) on 2 cores, slowed 1.2x
    # each by the other: 1.2 x the one-process step
    dev7 = {**synthetic_device(cores=2), "runner_cpu": {"corun": {"table": {"1": 1.0, "2": 1.2}}}}
    p7 = predict_runner(dev7, cfg, pp=1, ep=2, schedule="gpipe", microbatches=4, micro_batch_size=2)
    assert p7["iteration_s"] == pytest.approx(1.2 * p["iteration_s"])


def test_balanced_boundaries_brute_force():
    dev = synthetic_device(head=5e-5)
    cfg = TinyConfig(num_layers=6).as_dict()
    b = balanced_boundaries(dev, cfg, 3, 32)
    kinds = TinyConfig(num_layers=6).layer_kinds()
    cost = [3 * layer_flops(cfg, k, 32) * RATE for k in kinds]

    def worst(bd):
        return max(sum(cost[bd[s]:bd[s + 1]]) + (1e-4 if s == 2 else 0.0) for s in range(3))

    import itertools

    best = min(([0, i, j, 6] for i, j in itertools.combinations(range(1, 6), 2)), key=worst)
    assert worst(b) == pytest.approx(worst(best))


def test_device_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_device(tmp_path / "none.json")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ConfigError, match="calibrated_device"):
        load_device(tmp_path / "x.json")
    (tmp_path / "u.json").write_bytes(b'\xff\xfe{"kind": "calibrated_device"}')
    with pytest.raises(ConfigError, match=r"^device file '.*u.json' is not UTF-8 text \(byte 0xff at offset 0\)"):
        load_device(tmp_path / "u.json")
    good = synthetic_device(cores=2)
    for change, field in [(lambda d: d["throughput"].update(gemm_flop_per_s="fast"), "throughput.gemm_flop_per_s"),
                          (lambda d: d["p2p"].update(alpha_s=-1.0), "p2p.alpha_s"),
                          (lambda d: d.update(layers=[]), "layers"),
                          (lambda d: d["metadata"].update(cores=0), "metadata.cores")]:
        bad = json.loads(json.dumps(good))
        change(bad)
        (tmp_path / "b.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=rf"^device file '.*b.json': field '{re.escape(field)}' = "):
            load_device(tmp_path / "b.json")


def test_plan_device_cli_and_plan_json(tmp_path, capsys):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(synthetic_device(cores=2)))
    out = tmp_path / "plan.json"
    rc = cli(["plan", "--model", "tiny-runner", "--device", str(path), "--pp", "2", "--ep", "2",
              "--microbatches", "4", "--micro-batch-size", "2", "--schedule", "overlapped", "--export", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "costs: calibrated device synthetic" in text and "predicted iteration" in text
    plan = json.loads(out.read_text())
    assert plan["kind"] == "runner_plan" and plan["costs"]["source"] == "calibrated device synthetic"
    assert plan["boundaries"][0] == 0 and plan["boundaries"][-1] == 4 and plan["pair_exec"] == "scheduled"
    assert len(plan["pair_order"]["template"]) == 10 and plan["prediction"]["iteration_s"] > 0
    # not a runner model: one clear line, exit 2
    assert cli(["plan", "--model", "qwen3-8b", "--device", str(path)]) == 2
    assert "tessera_runner" in capsys.readouterr().err


def test_plan_device_default_schedule_follows_plans_ep_overlap_rule(tmp_path, capsys, monkeypatch):
    """Without --schedule a runner plan takes plan's default: the overlapped 1F1B with EP > 1, 1F1B at EP 1, decided
    by the planner's rule (pipeline.schedules.default_ep_overlap); the runner has no recompute, so --recompute is
    refused in one line (exit 2) rather than ignored."""
    import tessera_lab.runner.testbed.predict as P

    path = tmp_path / "dev.json"
    path.write_text(json.dumps(synthetic_device(cores=2)))

    def schedule(ep: str) -> str:
        out = tmp_path / f"plan-ep{ep}.json"
        assert cli(["plan", "--model", "tiny-runner", "--device", str(path), "--pp", "2", "--ep", ep, "-m", "4",
                    "--export", str(out)]) == 0
        capsys.readouterr()
        return json.loads(out.read_text())["parallel"]["schedule"]

    assert schedule("2") == "overlapped" and schedule("1") == "1f1b"
    monkeypatch.setattr(P, "default_ep_overlap", lambda args: False)  # the runner asks the planner's rule
    assert schedule("2") == "1f1b"
    monkeypatch.undo()
    assert cli(["plan", "--model", "tiny-runner", "--device", str(path), "--pp", "2", "--ep", "2", "-m", "4",
                "--recompute", "full"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--recompute" in err and len(err.splitlines()) == 1


def test_validation_matrix_shape():
    full = cases(False)
    assert len(full) == 4 * 2 * 2 * 2 * 2
    assert {c["schedule"] for c in full} == {"gpipe", "1f1b", "zb-h1", "overlapped"}
    quick = cases(True)
    assert len(quick) == 10 and {c["pp"] for c in quick} == {2} and {c["ep"] for c in quick} == {1, 2}


@pytest.mark.multiprocess
def test_run_plan_executes_the_plan_and_reports_the_prediction(tmp_path, capsys):
    pytest.importorskip("torch")
    dev_path = tmp_path / "dev.json"
    dev_path.write_text(json.dumps(synthetic_device(cores=2)))
    plan = device_plan(load_device(dev_path), "tiny-runner", pp=2, ep=2, schedule="overlapped", microbatches=4,
                       micro_batch_size=2, choices=PlanChoices(partition="uniform", pair_order="megatron"))
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    rc = cli(["run", "--plan", str(tmp_path / "plan.json"), "--steps", "3", "--check", "--json",
              str(tmp_path / "run.json"), "--profile-store", str(tmp_path / "store.json")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "before the run" in text and "bitwise" in text
    job = json.loads((tmp_path / "run.json").read_text())["jobs"][0]
    assert job["schedule"] == "overlapped" and job["boundaries"] == plan["boundaries"]
    assert job["pair_exec"]["handler"] == "scheduled" and job["pair_exec"]["template"] == plan["pair_order"]["template"]
    pv = job["plan_vs_observed"]
    assert pv["predicted_s"] == plan["prediction"]["iteration_s"]  # made before the run, carried unchanged
    assert pv["observed_s"] > 0 and math.isclose(pv["error"], (pv["predicted_s"] - pv["observed_s"]) / pv["observed_s"])
    store = json.loads((tmp_path / "store.json").read_text())
    assert store["runs"][0]["predictions"] == "plan (before the run)"
    rec = store["runs"][0]["lifecycle"]["steps"][0]
    assert rec["predicted"]["iteration"] == plan["prediction"]["iteration_s"]
    # the capacity report of the actual run
    rc = cli(["report", "--observed", str(tmp_path / "run.json"), "--device", str(dev_path), "--json", "-"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["source"].startswith("runner job") and rep["processes"] == 4 and 0 < rep["mfu"] < 1


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(pp=st.integers(1, 4), m=st.integers(4, 8), procs=st.integers(1, 4),
       cores=st.floats(0.25, 8.0), sched=st.sampled_from(["gpipe", "1f1b", "zb-h1", "overlapped"]))
def test_processor_sharing_bounds(pp, m, procs, cores, sched):
    """Processor sharing lies between the work bound (total CPU work / cores) and the critical path at the
    slowest speed, and more cores never make it slower."""
    from tessera_lab.pipeline.schedules import build_schedule
    from tessera_lab.runner.testbed.sharing import simulate_shared

    s = build_schedule(sched, pp, m, 1)
    work = lambda st_, i, t: 1.0 + 0.25 * st_  # noqa: E731
    # a pair's work is asked once, with its backward's stage (the work function depends on the stage only)
    total = sum(work(a.sub_actions[-1].stage if a.sub_actions else a.stage, None, a.type)
                for acts in s.actions.values() for a in acts if a.is_compute) * procs
    free = simulate_shared(s, work, cores=1e9, procs_per_rank=procs)["iteration_s"]
    t = simulate_shared(s, work, cores=cores, procs_per_rank=procs)["iteration_s"]
    slow = min(1.0, cores / (procs * pp))
    assert t >= max(free, total / min(cores, procs * pp)) - 1e-9
    assert t <= free / slow + 1e-9
    assert simulate_shared(s, work, cores=cores * 2, procs_per_rank=procs)["iteration_s"] <= t + 1e-9


def test_rank_agreement_over_pairs_apart_beyond_the_noise_by_hand():
    """Three cases; observed IQRs: A 0.9-1.1, B 1.0-1.3 (overlaps A), C 2.0-2.2 (apart from both). Prediction
    orders A > B (wrong against observed A < B), A < C and B < C (right): all pairs 2/3; the pairs apart, A-C and
    B-C, 2/2; the A-B pair has no observed order beyond the noise."""
    from tessera_lab.runner.testbed.validate import rank_agreement

    q = lambda lo, m, hi: {"observed_q1_s": lo, "observed_s": m, "observed_q3_s": hi}  # noqa: E731
    cs = [{"predicted_s": 1.2, **q(0.9, 1.0, 1.1)}, {"predicted_s": 1.1, **q(1.0, 1.15, 1.3)},
          {"predicted_s": 2.0, **q(2.0, 2.1, 2.2)}]
    r = rank_agreement(cs)
    assert r["rank_pairs"] == 3 and r["rank_agreement"] == pytest.approx(2 / 3)
    assert r["rank_pairs_apart"] == 2 and r["rank_agreement_apart"] == 1.0
    # without quartiles no pair counts as apart
    bare = rank_agreement([{k: c[k] for k in ("predicted_s", "observed_s")} for c in cs])
    assert bare["rank_pairs_apart"] == 0 and bare["rank_agreement_apart"] != bare["rank_agreement_apart"]  # NaN


def test_validation_summary_and_offline_reprediction_by_hand():
    from tessera_lab.runner.testbed.validate import repredict, summarize

    cs = [{"predicted_s": 1.08, "observed_s": 1.0}, {"predicted_s": 1.9, "observed_s": 2.0},
          {"predicted_s": 3.0, "observed_s": 2.5}]
    r = summarize(cs)  # errors +8 %, -5 %, +20 %; all 3 pairs ordered alike
    assert r["median_abs_error"] == pytest.approx(0.08) and r["rank_agreement"] == 1.0 and r["rank_pairs"] == 3
    assert r["targets_met"] == {"median_abs_error_busy": True, "median_abs_error_quiet": False,
                                "rank_agreement": True}
    dev = synthetic_device(cores=2)
    cfg = TinyConfig().as_dict()
    want = predict_runner(dev, cfg, pp=2, ep=2, schedule="1f1b", boundaries=[0, 2, 4], machine=MachineState(cores_available=1.0))
    stored = {"prediction_inputs": {"cores_available": {"pp2-ep2": {"cores_available": 1.0}}},
              "cases": [{"name": "x", "schedule": "1f1b", "pp": 2, "ep": 2, "width": 1, "boundaries": [0, 2, 4],
                         "observed_s": want["iteration_s"] * 2}]}
    out = repredict(stored, dev)
    assert out["cases"][0]["predicted_s"] == pytest.approx(want["iteration_s"])
    assert out["cases"][0]["error"] == pytest.approx(-0.5)


def test_repredict_cli_uses_the_calibration_stored_in_the_result(tmp_path, capsys):
    """A result of `validate` without --device keeps its fresh calibration (`calibration.device_file`), so
    `validate --repredict RESULT` needs no --device; a result without one is refused in one line, exit 2."""
    dev = synthetic_device(cores=2)
    cfg = TinyConfig().as_dict()
    want = predict_runner(dev, cfg, pp=2, ep=2, schedule="1f1b", boundaries=[0, 2, 4], machine=MachineState(cores_available=1.0))
    stored = {"prediction_inputs": {"cores_available": {"pp2-ep2": {"cores_available": 1.0}}},
              "calibration": {"device_file": dev},
              "cases": [{"name": "x", "schedule": "1f1b", "pp": 2, "ep": 2, "width": 1, "boundaries": [0, 2, 4],
                         "observed_s": want["iteration_s"] * 2}]}
    f = tmp_path / "r.json"
    f.write_text(json.dumps(stored))
    assert cli(["validate", "--repredict", str(f), "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cases"][0]["error"] == pytest.approx(-0.5)
    del stored["calibration"]
    f.write_text(json.dumps(stored))
    assert cli(["validate", "--repredict", str(f)]) == 2
    err = capsys.readouterr().err
    assert "--device" in err and len(err.strip().splitlines()) == 1


def test_plan_and_run_plan_refuse_inconsistent_input_before_any_run(tmp_path, capsys):
    """`plan --device --ep 3` (4 experts) is refused naming 'ep' and the divisors; `run --plan` refuses an option
    set against the plan and an unreadable --profile-store before any worker starts (one line, exit 2)."""
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(synthetic_device(cores=2)))
    assert cli(["plan", "--model", "tiny-runner", "--device", str(path), "--pp", "2", "--ep", "3", "-m", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "'ep' = 3" in err and "1, 2, 4" in err and len(err.splitlines()) == 1
    plan = tmp_path / "plan.json"
    assert cli(["plan", "--model", "tiny-runner", "--device", str(path), "--pp", "2", "--ep", "2", "-m", "4",
                "--micro-batch-size", "2", "--export", str(plan)]) == 0
    capsys.readouterr()
    assert cli(["run", "--plan", str(plan), "--pp", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--pp = 4" in err and "pp = 2" in err and len(err.splitlines()) == 1
    bad = tmp_path / "store.json"
    bad.write_text("not json")
    assert cli(["run", "--plan", str(plan), "--profile-store", str(bad)]) == 2
    cap = capsys.readouterr()
    assert "runner profile store" in cap.err and "not valid JSON" in cap.err and "loss" not in cap.out  # refused before the run
    assert bad.read_text() == "not json"
