"""The multi-process runner on CPU (gloo): correctness against the single-process reference, W deferral,
expert parallelism edge cases, gradient accumulation, timing outputs, launch errors and faults.

Cost on a 2-core machine: one 4-process launch (pp=2, ep=2) runs thirteen jobs (every schedule and the edge
cases) and is shared by most tests; a fault launch, a CLI launch (dp=2) and a torchrun launch add a few seconds
each. About a minute in total.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tessera_lab.errors import ConfigError, ScheduleError  # noqa: E402
from tessera_lab.pipeline.passes import split_backward  # noqa: E402
from tessera_lab.runner import RunnerError, RunSpec, WorldSpec, spawn, write_trace  # noqa: E402
from tessera_lab.runner.launch.launch import _alive, record_profile  # noqa: E402
from tessera_lab.runner.runtime.model import (  # noqa: E402
    WEIGHT_GRAD_STORE,
    TinyConfig,
    TinyMoEModel,
    chunk_gated_delta_rule,
    deterministic,
    forward_key,
    make_batch,
    recurrent_gated_delta_rule,
    reference_run,
)
from tessera_lab.runner.runtime.moe import route  # noqa: E402
from tessera_lab.pipeline.schedules import ActionType, build_schedule  # noqa: E402

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "overlapped", "dualpipev"]
EXTRA = {
    "overlapped-defer": dict(schedule="overlapped", defer_w=True, save_grads=True),
    "overlapped-serial": dict(schedule="overlapped", pair_exec="serial", save_grads=True),
    "capacity": dict(model={"capacity_factor": 0.6}),
    "zero-token": dict(model={"router_bias": [0.0, 0.0, -30.0, -30.0]}),  # EP rank 1 (experts 2, 3) gets nothing
    "acc-4x2": dict(micro_batch_size=4, microbatches=2, steps=1, save_grads=True),
    "acc-2x4": dict(micro_batch_size=2, microbatches=4, steps=1, save_grads=True),
}


def _job(name: str) -> RunSpec:
    if name in SCHEDULES:
        return RunSpec(name=name, schedule=name, steps=2, save_grads=True)
    return RunSpec(**{"name": name, "steps": 2, **EXTRA[name]})


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    """One launch (4 processes) running every job; shared by the tests below."""
    out = tmp_path_factory.mktemp("runner")
    t0 = time.monotonic()
    res = spawn(WorldSpec(pp=2, ep=2, timeout_s=60), [_job(n) for n in SCHEDULES + list(EXTRA)], out_dir=out,
                timeout_s=600)
    res.elapsed = time.monotonic() - t0
    return res


@functools.lru_cache(maxsize=None)
def _reference(model_items: tuple, m: int, mbs: int, steps: int, matched: bool = True, ep: int = 2, dp: int = 1):
    cfg = TinyConfig.from_dict(dict(model_items))
    return reference_run(cfg, ep=ep, dp=dp, microbatches=m, micro_batch_size=mbs, steps=steps, matched=matched)


def reference_for(job: dict, matched: bool = True):
    spec = job["spec"]
    model = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in spec["model"].items()))
    return _reference(model, spec["microbatches"], spec["micro_batch_size"], spec["steps"], matched,
                      job["world"]["ep"], job["world"]["dp"])


def rank_grads(res, name: str) -> dict[str, torch.Tensor]:
    """Step-0 gradients of a job merged over ranks (replicated parameters must agree exactly)."""
    merged: dict[str, torch.Tensor] = {}
    files = sorted(glob.glob(os.path.join(res.out_dir, f"grads_{name}_rank*.pt")))
    assert len(files) == 4, files
    for f in files:
        for k, v in torch.load(f).items():
            if k in merged:
                assert torch.equal(merged[k], v), f"replicas disagree on {k}"
            merged[k] = v
    return merged


# ----------------------------------------------------------------------------------------------
# fast unit tests (no processes)
# ----------------------------------------------------------------------------------------------


def test_chunked_delta_rule_equals_recurrence():
    g = torch.Generator().manual_seed(0)
    b, h, T, d = 2, 2, 21, 8
    q = torch.randn(b, h, T, d, generator=g)
    k = torch.nn.functional.normalize(torch.randn(b, h, T, d, generator=g), dim=-1)
    v = torch.randn(b, h, T, d, generator=g)
    decay = -torch.rand(b, h, T, generator=g)
    beta = torch.rand(b, h, T, generator=g)
    for chunk in (1, 4, 8, 32):
        out = chunk_gated_delta_rule(q, k, v, decay, beta, chunk)
        torch.testing.assert_close(out, recurrent_gated_delta_rule(q, k, v, decay, beta), rtol=1e-4, atol=1e-5)


def test_route_capacity_counts_are_exact():
    # 6 tokens all prefer expert 0 (then 1); top-1; capacity ceil(1.0 * 6 * 1 / 2) = 3: the first 3 are kept
    logits = torch.tensor([[2.0, 1.0]] * 6)
    plan = route(logits, 1, capacity_factor=1.0)
    assert plan.capacity == 3
    assert plan.routed_counts.tolist() == [6, 0]
    assert plan.send_counts.tolist() == [3, 0] and plan.dropped_counts.tolist() == [3, 0]
    assert plan.keep[:, 0].tolist() == [True, True, True, False, False, False]
    # top-2: slot order within a token, token order within an expert
    plan = route(torch.tensor([[3.0, 2.0, 1.0]] * 4), 2, capacity_factor=0.75)  # C = ceil(0.75*4*2/3) = 2
    assert plan.send_counts.tolist() == [2, 2, 0] and plan.dropped_counts.tolist() == [2, 2, 0]
    assert route(logits, 1).dropped_counts.tolist() == [0, 0]


def test_w_deferral_in_one_process_gives_identical_gradients():
    cfg = TinyConfig(num_layers=2)
    batch = make_batch(cfg, 0, 4)

    def grads(defer: bool):
        model = TinyMoEModel(cfg)
        WEIGHT_GRAD_STORE.clear()
        with deterministic():
            for mb in range(2):
                key = (0, mb)
                with forward_key(key):
                    loss = model.loss_sum(model(batch[2 * mb:2 * mb + 2, :-1]), batch[2 * mb:2 * mb + 2, 1:]) / 128
                if defer:
                    WEIGHT_GRAD_STORE.defer(key)
                loss.backward()
                if defer:  # input-gradient pass left the GEMM weight gradients undone
                    assert model.lm_head.weight.grad is None or mb > 0
                    assert WEIGHT_GRAD_STORE.flush(key) > 0
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    a, b = grads(False), grads(True)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_defer_weight_grads_transform():
    for name in SCHEDULES:
        sched = build_schedule(name, 2, 4, 2 if name in ("interleaved", "dualpipev") else 1)
        for lag in (None, 0, 1):
            d = split_backward(sched, lag)  # validates
            for r, acts in d.actions.items():
                leaves = [x for a in acts for x in a.leaves()]
                assert not any(x.type is ActionType.B for x in leaves)
                ws = [(x.stage, x.microbatch) for x in leaves if x.type is ActionType.W]
                for s in d.rank_stages(r):
                    assert [i for st, i in ws if st == s] == list(range(4)), "W in micro-batch order"
    pairs = [a for a in split_backward(build_schedule("overlapped", 2, 4), None).actions[1] if a.sub_actions]
    assert pairs and all(str(a).startswith("(1F") and ";1I" in str(a) for a in pairs)


def test_spec_validation_names_fields():
    w = WorldSpec(pp=2, ep=2)
    with pytest.raises(ConfigError, match="boundaries"):
        RunSpec(boundaries=[0, 3]).validate(w)
    with pytest.raises(ConfigError, match="num_experts"):
        RunSpec().validate(WorldSpec(pp=2, ep=3))
    with pytest.raises(ConfigError, match="num_layers"):
        RunSpec(schedule="interleaved", vpp=3).validate(w)
    with pytest.raises(ScheduleError, match="microbatches"):
        RunSpec(schedule="1f1b", microbatches=1).validate(w)
    with pytest.raises(ConfigError, match="pp"):
        WorldSpec(pp=0)
    with pytest.raises(ConfigError, match="world size 3 does not equal"):
        w.check_world_size(3)
    with pytest.raises(ConfigError, match="router_bias"):
        TinyConfig(router_bias=(1.0,))


# ----------------------------------------------------------------------------------------------
# the shared 4-process launch
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", SCHEDULES + ["overlapped-defer", "overlapped-serial"])
def test_losses_bitwise_equal_and_gradients_match_reference(main_run, name):
    job = main_run.job(name)
    ref = reference_for(job)
    assert job["losses"] == ref.losses, (job["losses"], ref.losses)  # bitwise: deterministic CPU mode
    assert job["loss_sums"] == ref.loss_sums
    grads = rank_grads(main_run, name)
    assert set(grads) == set(ref.grads[0])
    for k, g in grads.items():
        torch.testing.assert_close(g, ref.grads[0][k], rtol=1e-6, atol=1e-9, msg=k)
    assert all(torch.equal(g, ref.grads[0][k]) for k, g in grads.items()), "bitwise in deterministic mode"
    assert job["losses"][1] < job["losses"][0]


@pytest.mark.slow
def test_same_math_as_the_plain_model(main_run):
    """Against the plain model on whole micro-batches (other GEMM shapes): equal to float tolerance."""
    job = main_run.job("1f1b")
    plain = reference_for(job, matched=False)
    for a, b in zip(job["losses"], plain.losses):
        assert abs(a - b) <= 1e-6 * abs(b)
    grads = rank_grads(main_run, "1f1b")
    for k, g in grads.items():
        torch.testing.assert_close(g, plain.grads[0][k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.slow
def test_w_deferral_gradients_identical(main_run):
    deferred, plain = main_run.job("overlapped-defer"), main_run.job("overlapped")
    leaves = [a for acts in deferred["actions"].values() for a in acts]
    assert any(";" in a and "I" in a.split(";")[1] for a in leaves), "pairs overlap F with I"
    assert any(a.endswith(tuple(f"W{i}" for i in range(4))) for a in leaves)
    ga, gb = rank_grads(main_run, "overlapped-defer"), rank_grads(main_run, "overlapped")
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    assert deferred["losses"] == plain["losses"]
    gz, g1 = rank_grads(main_run, "zb-h1"), rank_grads(main_run, "1f1b")  # I/W schedule vs full B
    assert all(torch.equal(gz[k], g1[k]) for k in gz)


@pytest.mark.slow
def test_zero_token_rank(main_run):
    job = main_run.job("zero-token")
    for layer, counts in job["routing"].items():
        assert counts["routed"][2:] == [0, 0] and counts["kept"][2:] == [0, 0], layer
        assert sum(counts["routed"]) > 0
    assert job["losses"] == reference_for(job).losses


@pytest.mark.slow
def test_capacity_drops_counted_exactly(main_run):
    job = main_run.job("capacity")
    ref = reference_for(job)
    assert job["losses"] == ref.losses
    spec = job["spec"]
    tokens_per_group = spec["micro_batch_size"] * 16
    groups = spec["microbatches"] * 2 * spec["steps"]  # micro-batches x replicas x steps
    cap = -(-6 * tokens_per_group * 2 // 40)  # ceil(0.6 * n * k / E)
    total_dropped = 0
    for layer, counts in job["routing"].items():
        assert counts == {k: ref.routing[int(layer)][k] for k in ("routed", "kept", "dropped")}
        assert sum(counts["routed"]) == tokens_per_group * 2 * groups
        assert all(r == k + d for r, k, d in zip(counts["routed"], counts["kept"], counts["dropped"]))
        assert all(k <= cap * groups for k in counts["kept"])
        total_dropped += sum(counts["dropped"])
    assert total_dropped > 0


@pytest.mark.slow
def test_gradient_accumulation_4x2_equals_2x4(main_run):
    a, b = main_run.job("acc-4x2"), main_run.job("acc-2x4")
    assert a["tokens_per_step"] == b["tokens_per_step"]
    assert abs(a["losses"][0] - b["losses"][0]) < 1e-6
    ga, gb = rank_grads(main_run, "acc-4x2"), rank_grads(main_run, "acc-2x4")
    # and both equal one micro-batch holding the whole batch in the plain model
    whole = reference_run(TinyConfig(), ep=1, microbatches=1, micro_batch_size=16, steps=1, matched=False)
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-5, atol=1e-7, msg=k)
        torch.testing.assert_close(ga[k], whole.grads[0][k], rtol=1e-4, atol=1e-6, msg=k)
    assert abs(whole.losses[0] - a["losses"][0]) < 1e-5


@pytest.mark.slow
def test_timing_trace_and_profile_store(main_run, tmp_path):
    job = main_run.job("1f1b")
    t = job["timing"]
    assert [r["stage"] for r in t["stages"]] == [0, 1]
    assert all(r["F_s"] > 0 and r["B_s"] > 0 for r in t["stages"])
    assert t["iteration"]["predicted_s"] > 0 and t["iteration"]["observed_s"] > 0
    types = {e["type"] for e in job["events"]}
    assert {"F", "B", "RECV_F", "RECV_B", "ep_a2a"} <= types
    ov = main_run.job("overlapped")
    assert any(e["type"] == "OVERLAP_F_B" for e in ov["events"])
    # inside a pair the forward (side thread) and the backward (main thread) really run at the same time
    subs = {}
    for e in ov["events"]:
        if e["lane"] == "sub":
            subs.setdefault((e["step"], e["rank"], e["type"]), []).append((e["start"], e["end"]))
    overlapping = sum(
        1 for (st, r, typ), fs in subs.items() if typ == "F"
        for (f0, f1), (b0, b1) in zip(fs, subs.get((st, r, "B"), [])) if f0 < b1 and b0 < f1)
    assert overlapping >= 1
    path = write_trace(job, tmp_path / "trace.json")
    trace = json.loads(path.read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in xs} == {0, 1, 2, 3} and all(e["dur"] >= 0 for e in xs)
    store = record_profile(tmp_path / "store.json", main_run)
    record_profile(store, main_run)  # appends
    data = json.loads(store.read_text())
    assert data["schema_version"] == 1 and len(data["runs"]) == 2 * len(main_run.jobs)
    assert data["runs"][0]["environment"]["torch"]
    df = main_run.timing_table("1f1b")
    assert "observed_busy (ms)" in df.columns
    # the lifecycle reads the runner's per-step records as they are
    from tessera_lab.report.lifecycle import load_records

    recs = load_records(job["lifecycle"])
    keys = {"stage:0", "stage:1", "bubble", "iteration"} | ({"collective:ep_all_to_all"} if job["world"]["ep"] > 1 else set())
    assert len(recs) == 2 and set(recs[0]["observed"]) == keys
    assert all(v > 0 for v in recs[0]["predicted"].values())


@pytest.mark.slow
def test_no_orphans_after_a_launch(main_run):
    assert main_run.pids and not any(_alive(p) for p in main_run.pids.values())
    assert main_run.elapsed < 300


# ----------------------------------------------------------------------------------------------
# launch errors and faults
# ----------------------------------------------------------------------------------------------


def test_world_size_error_before_any_collective():
    # MASTER_ADDR/PORT point at nothing: joining a process group would hang, so a quick exit 2 proves the check
    env = dict(os.environ, RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="9")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "tessera_lab.runner", "--pp", "2", "--ep", "2"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "world size 3 does not equal pp x ep x dp = 2 x 2 x 1 = 4" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_injected_fault_makes_every_rank_exit_nonzero(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RunnerError) as info:
        spawn(WorldSpec(pp=2, ep=2, timeout_s=30, grace_s=10),
              [RunSpec(name="fault", steps=2, fault={"rank": 3, "step": 0, "action": 2})], out_dir=tmp_path,
              timeout_s=120)
    elapsed = time.monotonic() - t0
    err = info.value
    assert "rank 3 failed" in str(err) and "injected fault" in str(err)
    assert set(err.exit_codes) == {0, 1, 2, 3} and all(c != 0 for c in err.exit_codes.values()), err.exit_codes
    assert not any(_alive(p) for p in err.pids.values())
    assert elapsed < 100


@pytest.mark.slow
def test_cli_run_with_data_parallel_plan_and_outputs(tmp_path, capsys):
    from tessera_lab.cli.main import main

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"boundaries": [0, 3, 4]}))
    rc = main(["run", "--pp", "2", "--ep", "1", "--dp", "2", "--schedule", "gpipe", "--steps", "2", "--plan",
               str(plan), "--check", "--trace", str(tmp_path / "t.json"), "--json", "-", "--out", str(tmp_path / "o")])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    job = out["jobs"][0]
    assert job["boundaries"] == [0, 3, 4] and job["world"]["dp"] == 2
    assert job["reference"]["bitwise_equal"], job["reference"]
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


@pytest.mark.slow
def test_torchrun_entry(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    assert Path(torchrun).exists(), "torch installs torchrun beside the interpreter"  # torch is imported above
    from tessera_lab.runner.launch.launch import _free_port

    out = tmp_path / "r.json"
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(_free_port()), "-m", "tessera_lab.runner",
                        "--pp", "2", "--ep", "1", "--steps", "1", "--check", "--json", str(out)],
                       capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    job = json.loads(out.read_text())["jobs"][0]
    assert job["reference"]["bitwise_equal"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs >= 2 GPUs for NCCL")
def test_nccl_pipeline_matches_reference(tmp_path):
    res = spawn(WorldSpec(pp=2, ep=1, backend="nccl"),
                [RunSpec(name="nccl", schedule="1f1b", steps=2, check_reference=True, deterministic=False)],
                out_dir=tmp_path, timeout_s=300)
    assert res.backend == "nccl"
    ref = res.job(0)["reference"]
    assert ref["max_abs_diff"] < 1e-3, ref  # GPU kernels differ from the CPU reference: tolerance, not bitwise
