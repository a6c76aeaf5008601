"""Inputs that name what they describe are checked where they are used; outputs are whole or absent; scripts and
data files keep the one-line contract. Every case: one line naming both sides, exit 2 (or the documented flag and
a warning)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera_lab.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "data" / "profiles" / "cpu-qwen3-next-small.json"  # measured for qwen3-next-80b-a3b, cpu backend


def _main(argv, capsys):
    from tessera_lab.cli.main import main

    rc = main(argv)
    got = capsys.readouterr()
    return rc, got.out, [line for line in got.err.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def olmoe_plan(tmp_path_factory):
    """A plan JSON of olmoe-1b-7b (pp 8 x ep 8 = 64 GPUs on 8 nodes), written by ``tessera-lab plan``; host/sync
    term off, where the chosen partition differs from the uniform baseline's (a case below needs that)."""
    from tessera_lab.cli.main import main

    path = tmp_path_factory.mktemp("plan") / "olmoe.json"
    assert main(["plan", "--model", "olmoe-1b-7b", "--host-sync-ms", "0", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def _write(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return str(p)


# ---------------------------------------------------------------------------------------------- profiles
def test_report_costs_refuses_a_profile_of_another_model_like_plan_profile(olmoe_plan, tmp_path, capsys):
    plan = _write(tmp_path, "p.json", olmoe_plan)
    rc, _, err = _main(["report", "--plan", plan, "--costs", str(PROFILE)], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "measured for model 'qwen3-next-80b-a3b', not 'olmoe-1b-7b'" in err[0] and "--allow-stale-profile" in err[0]
    rc2, _, err2 = _main(["plan", "--model", "olmoe-1b-7b", "--profile", str(PROFILE)], capsys)
    assert rc2 == 2 and "measured for model 'qwen3-next-80b-a3b'" in err2[0]  # the same refusal as plan --profile
    rc, out, err = _main(["report", "--plan", plan, "--costs", str(PROFILE), "--allow-stale-profile"], capsys)
    assert rc == 0 and any("warning: using profile" in line and "does not match" in line for line in err), err
    assert "iteration" in out


def test_allow_stale_profile_without_a_profile_is_refused(olmoe_plan, tmp_path, capsys):
    rc, _, err = _main(["report", "--plan", _write(tmp_path, "p.json", olmoe_plan), "--allow-stale-profile"], capsys)
    assert rc == 2 and len(err) == 1 and "--allow-stale-profile" in err[0] and "ignored" in err[0]


def test_a_profile_with_no_entries_is_refused_not_labelled_as_measured(olmoe_plan, tmp_path, capsys):
    prof = json.loads(PROFILE.read_text())
    prof["entries"] = {}
    rc, _, err = _main(["report", "--plan", _write(tmp_path, "p.json", olmoe_plan), "--costs",
                        _write(tmp_path, "empty.json", prof)], capsys)
    assert rc == 2 and len(err) == 1 and "field 'entries' is empty" in err[0], err


# ---------------------------------------------------------------------------------------------- plan JSON
@pytest.mark.parametrize("origin,needle", [
    ("baseline made-up", "names no baseline of this plan"),
    ("the ILP", "is invalid"),
    ("baseline uniform", "differs from baseline uniform's"),
])
def test_a_partition_from_must_be_one_of_the_plans_own_baselines(olmoe_plan, tmp_path, capsys, origin, needle):
    d = dict(olmoe_plan, partition_from=origin, solver_result={"method": "ilp", "boundaries": olmoe_plan["boundaries"]})
    if origin == "baseline uniform":
        assert d["boundaries"] != d["baselines"]["uniform"]["boundaries"]  # else the case proves nothing
    rc, _, err = _main(["report", "--plan", _write(tmp_path, "p.json", d)], capsys)
    assert rc == 2 and len(err) == 1 and needle in err[0] and "partition_from" in err[0], err
    if needle != "is invalid" and origin != "baseline uniform":
        assert "uniform" in err[0]  # the plan's own baselines are listed


def test_a_kept_baseline_with_its_own_boundaries_is_accepted(olmoe_plan, tmp_path):
    from tessera_lab.plan.load import load_plan

    base = olmoe_plan["baselines"]["uniform"]
    d = dict(olmoe_plan, boundaries=base["boundaries"], partition_from="baseline uniform",
             solver_result={"method": "ilp", "boundaries": olmoe_plan["boundaries"]})
    d.pop("stages", None)
    d.pop("iteration_time_s", None)
    assert load_plan(d).partition_from == "baseline uniform"


def test_a_plan_claiming_64_gpus_on_one_node_is_refused(olmoe_plan, tmp_path, capsys):
    assert olmoe_plan["gpus"] == 64
    rc, _, err = _main(["report", "--plan", _write(tmp_path, "p.json", dict(olmoe_plan, nodes=1))], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "field 'nodes' = 1 holds 8 GPUs" in err[0] and "= 64" in err[0] and "nodes >= 8" in err[0]


# ---------------------------------------------------------------------------------------------- runner inputs
@pytest.mark.parametrize("argv,needle", [
    (["--schedule", "1f1b", "--pair-order", "megatron"], "schedule '1f1b' has no overlapped pairs"),
    (["--schedule", "overlapped", "--pair-order", "megatron"], "field 'pair_exec' = None does not read it"),
    (["--schedule", "overlapped", "--pair-exec", "threads", "--pair-order", "comm-first"], "does not read it"),
])
def test_pair_order_that_would_be_ignored_is_refused_before_workers(argv, needle, tmp_path, capsys):
    rc, _, err = _main(["run", *argv, "--out", str(tmp_path)], capsys)
    assert rc == 2 and len(err) == 1 and "pair_order" in err[0] and needle in err[0], err
    assert not list(tmp_path.glob("rank*.log"))


def test_pair_order_with_scheduled_pairs_is_accepted():
    from tessera_lab.runner.runtime.specs import RunSpec, WorldSpec

    RunSpec(name="x", schedule="overlapped", pair_exec="scheduled", pair_order="megatron").validate(WorldSpec())


def _run_result(events):
    return {"jobs": [{"schedule": "1f1b", "tokens_per_step": 64, "spec": {"model": {}},
                      "timing": {"durations": {"f": [0.1], "b": [0.2]}}, "events": events}]}


def test_a_run_result_with_a_negative_duration_is_refused(tmp_path):
    from tessera_lab.runner.runtime.orders import resolve_order
    from tessera_lab.runner.runtime.schemas import check_run_result

    good = [{"step": 0, "rank": 0, "lane": "compute", "start": 1.0, "end": 1.5}]
    check_run_result(_run_result(good), "run")
    bad = good + [{"step": 0, "rank": 1, "lane": "comm", "start": 2.0, "end": 1.25}]
    with pytest.raises(ConfigError, match=r"jobs\[0\]\.events\[1\]' has end = 1.25 before start = 2"):
        check_run_result(_run_result(bad), "run")
    with pytest.raises(ConfigError, match="end >= start"):  # --pair-order measured:RUN.json replays it: refused
        resolve_order(f"measured:{_write(tmp_path, 'run.json', _run_result(bad))}", 2)
    r = _run_result(good)
    r["jobs"][0]["step_times_s"] = [0.5, -0.1]
    with pytest.raises(ConfigError, match=r"step_times_s\[1\]"):
        check_run_result(r, "run")


# ---------------------------------------------------------------------------------------------- routing logs
def _log(records, top_k=2):
    return {"format": "tessera-lab/routing-log", "version": 1, "num_experts": 4, "top_k": top_k, "records": records}


@pytest.mark.parametrize("records,needle", [
    ([{"layer": 0, "microbatch": 0, "tokens": 8, "routed": [4, 4, 4, 4]},
      {"layer": 0, "microbatch": 0, "tokens": 8, "routed": [4, 4, 4, 4]}], "repeats records[0]"),
    ([{"layer": 0, "tokens": 8, "routed": [4, 4, 4, 3]}], "sums to 15 but tokens x top_k = 8 x 2 = 16"),
    ([{"layer": 0, "tokens": 8, "routed": [9, 7, 0, 0]}], "routed[0]' = 9 exceeds tokens = 8"),
])
def test_inconsistent_routing_logs_are_refused(records, needle, tmp_path, capsys):
    from tessera_lab.dynamic.routing_log import load_routing_log

    path = _write(tmp_path, "log.json", _log(records))
    with pytest.raises(ConfigError) as info:
        load_routing_log(path)
    assert needle in str(info.value)
    rc, _, err = _main(["simulate", "--stages", "2", "--microbatches", "2", "--f", "1", "--b", "2", "--w", "1",
                        "--ep", "2", "--routing", f"replay:{path}"], capsys)
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_a_consistent_routing_log_loads():
    from tessera_lab.dynamic.routing_log import load_routing_log

    log = load_routing_log(_log([{"layer": 0, "tokens": 8, "routed": [8, 4, 4, 0]},
                                 {"layer": 0, "tokens": 8, "routed": [2, 6, 4, 4]}]))
    assert log.counts[0].shape == (1, 1, 2, 4) and log.tokens == 8


# ---------------------------------------------------------------------------------------------- model configs
@pytest.mark.parametrize("field,value,period", [("attn_layer_offset", 8, "attn_layer_period"),
                                                ("expert_layer_offset", 2, "expert_layer_period")])
def test_jamba_offset_at_or_past_its_period_is_refused(field, value, period):
    from tessera_lab.model.spec import ModelSpec

    cfg = json.loads((ROOT / "data" / "models" / "jamba-1.5-mini.json").read_text())
    cfg[field] = value
    with pytest.raises(ConfigError, match=f"'{field}' = {value} is out of range for '{period}' = {cfg[period]}"):
        ModelSpec.from_hf_config(cfg, name="jamba-x")


# ---------------------------------------------------------------------------------------------- bounded work
def test_simulate_dynamic_at_the_steps_maximum_is_refused_at_once(capsys):
    t0 = time.monotonic()
    rc, _, err = _main(["simulate", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2", "--w", "1",
                        "--dynamic", "--steps", "1000000"], capsys)
    assert rc == 2 and len(err) == 1 and "--steps 1000000" in err[0] and "TESSERA_LAB_MAX_ONLINE_ACTIONS" in err[0]
    assert time.monotonic() - t0 < 20


def test_long_dynamic_work_prints_its_estimate_and_progress(capsys, monkeypatch):
    import tessera_lab.cli.simulate as sim

    monkeypatch.setattr(sim, "LONG_WORK_S", 0.0)  # every run counts as long: the lines appear
    rc, _, err = _main(["simulate", "--stages", "2", "--microbatches", "2", "--f", "1", "--b", "2", "--w", "1",
                        "--routing", "zipf:1.2", "--dynamic", "--steps", "10"], capsys)
    assert rc == 0
    assert "estimated" in err[0] and "10 steps x 1 group(s) x 2 run(s)" in err[0]
    assert err[-1].startswith("simulate --dynamic: 100% (20 of 20 steps)")
    assert len(err) == 11  # the estimate and one line per tenth


# ---------------------------------------------------------------------------------------------- outputs
def test_reproduce_refuses_an_empty_out_before_any_work(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _main(["reproduce", "--out", ""], capsys)
    assert rc == 2 and err == ["tessera-lab reproduce: error: option --out = '' is empty; allowed: a folder path"]
    assert not list(tmp_path.iterdir())


def test_staged_folder_is_whole_or_absent(tmp_path):
    from tessera_lab.io import staged_folder

    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with staged_folder(out) as tmp:
            (tmp / "a.txt").write_text("a")
            raise RuntimeError("disk full")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    out.mkdir()
    (out / "keep.txt").write_text("old")
    (out / "a.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with staged_folder(out) as tmp:
            (tmp / "a.txt").write_text("new")
            raise RuntimeError
    assert (out / "a.txt").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    with staged_folder(out) as tmp:
        (tmp / "a.txt").write_text("new")
        (tmp / "b.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt", "keep.txt"]
    assert (out / "a.txt").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_reproduce_write_failing_midway_leaves_nothing(tmp_path, monkeypatch):
    import tessera_lab.report.reproduce as rp

    class Rep:
        notes: list = []

        def as_dict(self):
            return {}

    for name in rp.Reproduction.TABLES:
        setattr(Rep, name, None)
    import matplotlib.pyplot as plt

    monkeypatch.setattr(rp, "plot_mfu", lambda rep: plt.subplots()[1])
    monkeypatch.setattr(rp, "plot_ablation", lambda rep: plt.subplots()[1])

    def full(rep):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(rp, "plot_overlap", full)
    with pytest.raises(OSError):
        rp.write(Rep(), tmp_path / "rep")
    assert list(tmp_path.iterdir()) == []  # neither the folder nor the two figures made before the failure


# ---------------------------------------------------------------------------------------------- measure clock
def test_measure_budget_clock_starts_at_process_start():
    from tessera_lab.cli import measure

    start = measure.process_start_time()
    assert start <= measure._IMPORTED_AT <= time.time()
    out = subprocess.run([sys.executable, "-c", "import time; t = time.time(); from tessera_lab.cli import measure; "
                          "print(t - measure.process_start_time())"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    gap = float(out.stdout)  # interpreter start-up before the first line: >= 0, well under a minute
    assert -1.0 <= gap < 60.0, gap


# ---------------------------------------------------------------------------------------------- claims script
_ENTRY = {"id": "x.y", "value": 1.5, "format": "{:.1f} s", "kind": "measured", "command": "c", "environment": "e",
          "date": "d", "load": "1", "tolerance": {}}


@pytest.mark.parametrize("content,needle", [
    (b"garbage{", "not valid JSON"),
    (b"", "the file is empty"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[1, 2]", "top level is list"),
    (b'{"other": []}', "without a list claims"),
    (json.dumps({"claims": [None]}).encode(), "claims[0] is null"),
    (json.dumps({"claims": [{"id": "x.y"}]}).encode(), "missing field(s) value, format"),
    (json.dumps({"claims": [_ENTRY, _ENTRY]}).encode(), "appears twice (also claims[0])"),
    (json.dumps({"claims": [dict(_ENTRY, format="{:.1q}")]}).encode(), "cannot format value 1.5"),
    (json.dumps({"claims": [dict(_ENTRY, format="{} {}")]}).encode(), "cannot format value 1.5"),
    (json.dumps({"claims": [dict(_ENTRY, value="1.5")]}).encode(), "field 'value' = '1.5'"),
    (json.dumps({"claims": [dict(_ENTRY, kind="guessed")]}).encode(), "field 'kind' = 'guessed'"),
    (json.dumps({"claims": [dict(_ENTRY, tolerance=[])]}).encode(), "field 'tolerance' = []"),
])
def test_claims_script_on_a_broken_registry_is_one_line_per_problem(tmp_path, content, needle):
    reg = tmp_path / "claims.json"
    reg.write_bytes(content)
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "claims.py"), "check", "--no-rerun", "--registry",
                        str(reg)], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert all(line.startswith("claims.py: error: ") for line in lines) and any(needle in x for x in lines), lines


# ---------------------------------------------------------------------------------------------- data folder
@pytest.fixture()
def data_copy(tmp_path, monkeypatch):
    import shutil

    d = tmp_path / "data"
    shutil.copytree(ROOT / "data", d, ignore=shutil.ignore_patterns("validation", "runs"))
    monkeypatch.setenv("TESSERA_LAB_DATA", str(d))
    return d


def test_a_garbage_scenario_file_is_one_line(data_copy, tmp_path, capsys):
    (data_copy / "paper" / "scenarios" / "zz.json").write_text("garbage")
    rc, _, err = _main(["reproduce", "--out", str(tmp_path / "rep"), "--scenario", "dynamic-6144"], capsys)
    assert rc == 2 and len(err) == 1 and "zz.json" in err[0] and "not valid JSON" in err[0], err
    assert not (tmp_path / "rep").exists()


def test_a_string_pp_in_a_scenario_names_pp(data_copy, tmp_path, capsys):
    s = json.loads((data_copy / "paper" / "scenarios" / "dynamic-6144.json").read_text())
    s["layout"]["pp"] = "8"
    (data_copy / "paper" / "scenarios" / "dynamic-6144.json").write_text(json.dumps(s))
    rc, _, err = _main(["reproduce", "--out", str(tmp_path / "rep"), "--scenario", "dynamic-6144"], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "field 'layout.pp' = '8' is not an integer" in err[0] and "4444" not in err[0]


def test_a_garbage_hardware_file_is_one_line(data_copy, capsys):
    from tessera_lab.model import hardware

    (data_copy / "hardware" / "hardware.json").write_bytes(b"\xff\x00garbage")
    hardware.hardware_data.cache_clear() if hasattr(hardware.hardware_data, "cache_clear") else None
    with pytest.raises(ConfigError, match="hardware"):
        hardware.hardware_data()
    if hasattr(hardware.hardware_data, "cache_clear"):
        hardware.hardware_data.cache_clear()
