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
    assert sync.planner_per_layer_s(base.replace(ep=1)) == 0.0
    assert sync.planner_per_layer_s(base, analytic=False) == 0.0  # a measured profile holds what the device does
    # the term belongs to the forward, whatever the schedule; only fully exposed where nothing pairs forwards
    for sched in ("overlapped", "interleaved-overlapped"):
        assert sync.planner_per_layer_s(base.replace(schedule=sched)) == sync.FITTED_PER_WAIT_S["alltoall"]
        assert not sync.fully_exposed(base.replace(schedule=sched))
    assert sync.fully_exposed(base) and not sync.fully_exposed(base.replace(host_sync_s=0.0))
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
    # the 3 forwards paired with a backward hide it: 1 x 8 x c; with one micro-batch nothing pairs: 1 x 8 x c too
    assert _plan(small, host_sync_s=C, schedule="overlapped").host_sync_added_s == pytest.approx(8 * C, rel=1e-9)
    assert _plan(small, host_sync_s=C, schedule="overlapped", microbatches=1).host_sync_added_s == pytest.approx(
        8 * C, rel=1e-9)
    assert _plan(small, host_sync_s=C, microbatches=1).host_sync_added_s == pytest.approx(8 * C, rel=1e-9)
    auto = make_plan(small, ParallelConfig(pp=1, ep=8, microbatches=4, seq_len=1024, schedule="auto", host_sync_s=C),
                     method="uniform", baselines=())
    by = {t["schedule"]: t for t in auto.schedule_trials if "iteration_time_s" in t}
    assert by["1f1b"]["host_sync_s"] == pytest.approx(4 * 8 * C, rel=1e-9)
    assert by["overlapped"]["host_sync_s"] == pytest.approx(8 * C, rel=1e-9)
    from tessera_lab.cli.plan import format_plan

    text = format_plan(auto)
    assert "of which host/sync (s)" in text and "without it (s)" in text and "FITTED" in text
