"""The planner's host/sync term (cost/sync.py applied by plan/stages.py): values worked out by hand on one-stage plans,
where a 1F1B iteration is the micro-batches' F + B one after the other, so the term adds m x MoE layers x c."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tessera_lab.cost import sync
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.plan.make import make_plan
from tessera_lab.report.capacity import capacity_report
from tessera_lab.model.spec import load_model

ROOT = Path(__file__).resolve().parents[1]
C = 2e-3  # seconds per MoE layer and micro-batch, a value of the test's own


@pytest.fixture(scope="module")
def small():
    from tessera_lab.model.spec import load_model

    # Qwen3-Next's every decoder layer is a MoE layer (decoder_sparse_step 1): 8 layers -> 8 MoE layers
    return load_model("qwen3-next-80b-a3b").with_changes(num_layers=8)


def _plan(model, **kw):
    par = ParallelConfig(**{"pp": 1, "ep": 8, "microbatches": 4, "seq_len": 1024, "schedule": "1f1b", **kw})
    return make_plan(model, par, method="uniform", baselines=())


def test_one_stage_1f1b_adds_m_times_moe_layers_times_c(small):
    off, on = _plan(small, host_sync_s=0.0), _plan(small, host_sync_s=C)
    # 4 micro-batches x 8 MoE layers x 2 ms = 64 ms on the only rank, nothing else changes
    assert on.chosen.iteration_time_s - off.chosen.iteration_time_s == pytest.approx(4 * 8 * C, rel=1e-9)
    st_on, st_off = on.chosen.stages[0], off.chosen.stages[0]
    assert st_on.host_sync_s == pytest.approx(8 * C) and st_off.host_sync_s == 0.0
    assert st_on.f_s - st_off.f_s == pytest.approx(8 * C) and st_on.b_s == st_off.b_s
    note = next(n for n in on.notes if n.startswith("host/sync term"))
    assert "2.00 ms per MoE layer" in note and "set by --host-sync-ms" in note
    assert f"adds {4 * 8 * C:.4f} s" in note
    assert not any(n.startswith("host/sync term") for n in off.notes)
    # the plan file keeps the value it was made with (and no key at the default, so saved plans read as before)
    assert on.as_dict()["parallel"]["host_sync_s"] == C
    assert "host_sync_s" not in _plan(small).as_dict()["parallel"]


def test_capacity_report_puts_it_in_runtime_overhead(small):
    off, on = capacity_report(_plan(small, host_sync_s=0.0)), capacity_report(_plan(small, host_sync_s=C))
    gpus = 8  # pp 1 x ep 8
    # every GPU of the one stage pays 4 x 8 x 2 ms: GPU-seconds = 8 x 0.064
    assert on.parts["runtime_overhead"] - off.parts["runtime_overhead"] == pytest.approx(gpus * 4 * 8 * C, rel=1e-9)
    for k in off.parts:
        if k not in ("runtime_overhead", "residual"):
            assert on.parts[k] == pytest.approx(off.parts[k], rel=1e-9, abs=1e-12), k
    assert abs(on.parts["residual"]) <= 1e-9 * on.gpu_time_s


def test_default_is_the_fitted_value_and_the_rule_where_it_is_zero(small):
    # default (None): the dispatcher's fitted value, with its provenance in the note
    on = _plan(small)
    fitted = sync.FITTED_PER_WAIT_S[on.parallel.dispatcher]
    assert on.chosen.stages[0].host_sync_s == pytest.approx(8 * fitted)
    assert any("fitted per dispatcher and host wait on the fit set of the published runs" in n for n in on.notes)
    base = ParallelConfig(ep=8, schedule="1f1b", dispatcher="alltoall")
    assert sync.planner_per_layer_s(base) == sync.FITTED_PER_WAIT_S["alltoall"]
    # DeepEP's normal mode waits too, with its own fitted value (less host work behind its wait)
    assert sync.planner_per_layer_s(base.replace(dispatcher="deepep")) == sync.FITTED_PER_WAIT_S["deepep"]
    assert sync.planner_per_layer_s(base.replace(host_sync_s=2e-3, dispatcher="deepep")) == 2e-3  # one value for any
    assert sync.planner_per_layer_s(base.replace(host_sync_s=0.0)) == 0.0
    # without EP the alltoall dispatcher still waits, at 'before_finish' (Megatron-Core's preprocess: the per-expert
    # token counts go to the host for the grouped GEMM's splits)
    assert sync.planner_per_layer_s(base.replace(ep=1)) == sync.FITTED_PER_WAIT_S["alltoall"]
    assert sync.planner_per_layer_s(base, analytic=False) == 0.0  # a measured profile holds what the device does
    # the term belongs to the forward, whatever the schedule; only fully exposed where nothing pairs forwards
    for sched in ("overlapped", "interleaved-overlapped"):
        assert sync.planner_per_layer_s(base.replace(schedule=sched)) == sync.FITTED_PER_WAIT_S["alltoall"]
        assert not sync.fully_exposed(base.replace(schedule=sched))
    assert sync.fully_exposed(base) and not sync.fully_exposed(base.replace(host_sync_s=0.0))
    # a model without MoE layers carries no term: a dense run says nothing about c (it stays out of the fit)
    assert sync.fully_exposed(base, load_model("qwen3-30b-a3b"))
    assert not sync.fully_exposed(base, load_model("qwen3-8b"))
    assert sync.planner_per_layer_s(base, model=load_model("qwen3-8b")) == 0.0
    # the default plan (overlapped) carries it in its forwards: a forward run apart waits
    assert _plan(small, schedule="overlapped").chosen.stages[0].host_sync_s == pytest.approx(8 * fitted)
    with pytest.raises(ConfigError, match="field 'host_sync_s'"):
        ParallelConfig(host_sync_s=-1e-3)


def test_cli_option_and_bad_value():
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-m", "tessera_lab", "plan", "--host-sync-ms", "-1"], capture_output=True,
                       text=True, timeout=120, env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "host_sync_ms" in lines[0], r.stderr
    r = subprocess.run([sys.executable, "-m", "tessera_lab", "plan", "--help"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert "--host-sync-ms" in r.stdout and "published runs" in " ".join(r.stdout.split())


def test_cli_plan_states_what_the_term_adds(capsys):
    from tessera_lab.cli.main import main

    args = ["plan", "--pp", "1", "--ep", "8", "--microbatches", "4", "--seq-len", "1024", "--layers", "8",
            "--schedule", "1f1b", "--method", "uniform"]
    assert main(args + ["--host-sync-ms", "2"]) == 0
    out = capsys.readouterr().out
    assert "host/sync term: 2.00 ms per MoE layer" in out and f"adds {4 * 8 * C:.4f} s" in out
    assert main(args + ["--host-sync-ms", "0"]) == 0
    assert "host/sync term" not in capsys.readouterr().out


def test_saved_plan_reloads_with_its_term(small):
    from tessera_lab.plan.load import load_plan

    on = _plan(small, host_sync_s=C)
    again = load_plan(on.as_dict())
    assert again.parallel.host_sync_s == C
    assert again.chosen.iteration_time_s == pytest.approx(on.chosen.iteration_time_s, rel=1e-12)


def test_auto_table_shows_what_the_term_adds_per_schedule(small):
    # one stage, 4 micro-batches, 8 MoE layers: the term adds 4 x 8 x c to 1f1b (and gpipe), 1 x 8 x c to overlapped
    # (its one warm-up forward); the
    # plan records it (host_sync_added_s) and the auto trials carry it beside each iteration
    one = _plan(small, host_sync_s=C)
    assert one.host_sync_added_s == pytest.approx(4 * 8 * C, rel=1e-9)
    # overlapped 1F1B on one stage: min(2 (p - 1 - s) + 1, m) = 1 warm-up forward runs apart and carries the term,
    # the 3 forwards paired with a backward hide it up to the paired backward's mlp node (q, the same for every
    # layer: one MoE block): 1 x 8 x c + 3 x 8 x (c - q); with one micro-batch nothing pairs: 1 x 8 x c
    q = _queued(small)
    assert 0 < q < C
    assert _plan(small, host_sync_s=C, schedule="overlapped").host_sync_added_s == pytest.approx(
        8 * C + 3 * 8 * (C - q), rel=1e-9)
    assert _plan(small, host_sync_s=C, schedule="overlapped", microbatches=1).host_sync_added_s == pytest.approx(
        8 * C, rel=1e-9)
    assert _plan(small, host_sync_s=C, microbatches=1).host_sync_added_s == pytest.approx(8 * C, rel=1e-9)
    auto = make_plan(small, ParallelConfig(pp=1, ep=8, microbatches=4, seq_len=1024, schedule="auto", host_sync_s=C),
                     method="uniform", baselines=())
    by = {t["schedule"]: t for t in auto.schedule_trials if "iteration_time_s" in t}
    assert by["1f1b"]["host_sync_s"] == pytest.approx(4 * 8 * C, rel=1e-9)
    assert by["overlapped"]["host_sync_s"] == pytest.approx(8 * C + 3 * 8 * (C - q), rel=1e-9)
    from tessera_lab.cli.plan import format_plan

    text = format_plan(auto)
    assert "of which host/sync (s)" in text and "without it (s)" in text and "FITTED" in text


def _queued(model, **kw) -> float:
    """The backward mlp node's seconds of the model's first MoE layer under _plan's layout (one value: its MoE
    layers share one expert block)."""
    from tessera_lab.plan.stages import build_stage_model

    par = ParallelConfig(**{"pp": 1, "ep": 8, "microbatches": 4, "seq_len": 1024, "schedule": "overlapped",
                            "host_sync_s": C, **kw})
    _, sm = build_stage_model(model, par, _cluster(par))
    moe = [l for l, ly in enumerate(model.stack.layers) if ly.ffn == "moe"]
    assert len({round(sm.mlp_queued[l], 15) for l in moe}) == 1
    return sm.mlp_queued[moe[0]]


def _cluster(par):
    from tessera_lab.model.hardware import cluster_for

    return cluster_for(par)


def test_a_paired_forward_exposes_its_waits_beyond_the_paired_backwards_mlp_node():
    """Megatron-Core queues the paired backward's mlp node before the forward's dispatch waits: each pair's makespan
    carries max(0, waits of the forward layer - mlp node of the backward layer); a dense forward waits for nothing.
    DeepSeek-V3 cut to 5 layers (3 dense, 2 MoE) gives all four (forward, backward) kind combinations."""
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.stages import build_stage_model

    model = load_model("deepseek-v3").with_changes(num_layers=5)
    ffn = {ly.kind: ly.ffn for ly in model.stack.layers}
    assert sorted(ffn.values()) == ["dense", "moe"], ffn
    for c in (2e-3, 0.2):  # below and far above the mlp nodes' times
        par = ParallelConfig(pp=1, ep=8, microbatches=4, seq_len=1024, schedule="overlapped", host_sync_s=c)
        _, sm = build_stage_model(model, par, _cluster(par))
        first = {}
        for l, ly in enumerate(model.stack.layers):
            first.setdefault(ly.kind, l)
        q = {k: sm.mlp_queued[l] for k, l in first.items()}
        assert all(v > 0 for v in q.values())
        for (kf, kb), raw in sm.raw_pair_costs.items():
            waits = c if ffn[kf] == "moe" else 0.0
            assert sm.pair_costs[(kf, kb)] - raw == pytest.approx(max(0.0, waits - q[kb]), abs=1e-15), (kf, kb, c)
        # the stage's paired seconds are the sum over its pairs, and the model without the term has none
        n = model.num_layers
        want = sum(sm.pair_costs[(sm.kinds[k], sm.kinds[n - 1 - k])] - sm.raw_pair_costs[(sm.kinds[k],
                   sm.kinds[n - 1 - k])] for k in range(n))
        assert sm.paired_sync(0, 0, n) == pytest.approx(want, rel=1e-12)
        assert sm.without_sync().paired_sync(0, 0, n) == 0.0
        assert sm.fb(0, 0, n) - sm.without_sync().fb(0, 0, n) == pytest.approx(want, rel=1e-9)
    assert sync.paired_exposed_s(3e-3, 1e-3) == pytest.approx(2e-3) and sync.paired_exposed_s(1e-3, 3e-3) == 0.0
