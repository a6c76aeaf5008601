"""``tessera-lab measure``: the analytic table in-process, a real cpu measurement (slow, small), and bad
input exiting with status 2 and one line."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from tessera_lab.overlap import profiles as pr
from tessera_lab.cli.main import main
from tessera_lab.errors import ConfigError
from tessera_lab.model.spec import load_model
from tessera_lab.runner.runtime.orders import NAMED_ORDERS, TEMPLATE_KEYS
from tessera_lab.runner.measure.harness import runner_config_for
from tessera_lab.runner.measure.sizing import pair_rounds

CLI = [sys.executable, "-m", "tessera_lab"]


def test_measure_analytic_writes_a_profile_and_prints_the_table(tmp_path, capsys):
    out = tmp_path / "an.json"
    assert main(["measure", "--backend", "analytic", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "linear_attention+moe" in text and "full_attention+moe" in text and "overlap spread" in text
    assert text.rstrip().splitlines()[-1] == f"profile written: {out}"  # the path, on its own line, last
    assert "noise warning" not in text  # the analytic model has no noise
    prof = pr.load_profile(out)
    assert prof.backend == "analytic" and len(prof.entries) == 4
    assert main(["measure", "--backend", "analytic", "--out", str(out), "--no-progress", "--json", "-"]) == 0
    got = capsys.readouterr()
    result = json.loads(got.out)  # stdout is the JSON only; the path goes to stderr
    assert result["backend"] == "analytic" and len(result["table"]) == 4 and result["noise_warnings"] == []
    assert f"profile written: {out}" in got.err
    assert {"t_pair", "t_sum", "gain", "efficiency"} <= set(result["table"][0])
    assert pr.load_profile(out).entries[next(iter(prof.entries))]["metadata"]["repeats"] == 2  # merged


@pytest.mark.parametrize("argv, field", [
    (["--backend", "analytic", "--size-factor", "0"], "size_factor"),
    (["--backend", "analytic", "--size-factor", "abc"], "size_factor"),
    (["--backend", "analytic", "--repeats", "0"], "repeats"),
    (["--backend", "tpu"], "backend"),
    (["--backend", "analytic", "--model", "no-such-model"], "no-such-model"),
    (["--backend", "analytic", "--timeout", "-1"], "timeout"),
    (["--backend", "cpu", "--world-size", "1"], "world_size"),
    (["--backend", "cpu", "--budget-s", "0"], "budget_s"),
    (["--backend", "cpu", "--budget-s", "inf"], "budget_s"),
    (["--backend", "cpu", "--orders", "1"], "orders"),
    (["--backend", "runner"], "--backend cpu --model tiny-runner"),
])
def test_bad_input_exits_2_with_one_line(argv, field, tmp_path):
    proc = subprocess.run(CLI + ["measure", *argv, "--out", str(tmp_path / "x.json")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, proc.stderr
    assert field in lines[0]
    assert not (tmp_path / "x.json").exists()


def test_cuda_without_a_gpu_exits_2_with_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    proc = subprocess.run(CLI + ["measure", "--backend", "cuda", "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and "CUDA" in lines[0]


@pytest.mark.slow
def test_measure_cpu_writes_a_profile_with_spread(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu.json"
    proc = subprocess.run(CLI + ["measure", "--backend", "cpu", "--ep", "2", "--size-factor", "0.03125", "--repeats", "2",
                                 "--orders", "4", "--warmup", "0", "--timeout", "400", "--budget-s", "400", "--out", str(out), "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr
    assert "linear_attention+moe" in proc.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prof = pr.load_profile(out)  # measured here: current, no warning
    assert prof.backend == "cpu" and prof.size_factor == 0.03125 and len(prof.entries) == 4
    for e in prof.entries.values():
        for name in ("t_a", "t_b", "t_ab", "t_program"):
            s = e[name]
            assert s["n"] >= 2 and len(s["samples"]) == s["n"]
            assert 0 < s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"]
        meta = e["metadata"]
        assert meta["backend"] == "cpu" and meta["repeats"] == 2 and meta["world_size"] == 2
        assert meta["device"] and meta["torch"] and meta["date"] and meta["shapes"]["a"]["hidden"] == 64
        assert e["tasks"] and all(v["lane"] in ("compute", "comm") for v in e["tasks"].values())
        assert len(meta["candidates"]) >= 4 and meta["search"]["decision"]["verdict"]
        # measuring is running: the runner's node-level executor, its ten template keys, Megatron's order
        assert meta["executor"].startswith("runner node-level")
        assert set(e["tasks"]) == set(TEMPLATE_KEYS)
        assert list(NAMED_ORDERS["megatron"]) in [c["order"] for c in meta["candidates"]]
        # measured fields only: per-node inflation from the pair runs (no 1.0 placeholders for every node), and
        # every derived field names what it derives from
        assert e["inflation"] and set(e["inflation"]) <= set(TEMPLATE_KEYS)
        assert len(set(e["inflation"].values())) > 1
        assert set(meta["derived_fields"]) == {"gain", "efficiency", "inflation", "comm_hidden_fraction"}
        assert "all-to-all wait" in meta["derived_fields"]["comm_hidden_fraction"]
        assert meta["communication"] == "EP all-to-all" and 0.0 <= e["comm_hidden_fraction"] <= 1.0
    # the fit is stored, and refitting from the file's per-task data reproduces it exactly
    assert prof.data["fit"]["pairs"] == 4
    refit = pr.refit(pr.load_profile(out)).as_dict()
    assert refit == {k: v for k, v in prof.data["fit"].items() if k in refit}
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["profile"] == str(out)


def test_runner_config_scales_widths_and_keeps_counts():
    """Qwen3-Next-80B at size factor 1/32 (hand-computed): hidden 2048 -> 64, head_dim 256 -> 8, expert width
    512 -> 16, shared 512 -> 16, sequence 4096 -> 128; 16 q heads, 2 kv heads, 512 experts, top-10 kept."""
    cfg = runner_config_for(load_model("qwen3-next-80b-a3b"), 1 / 32, 4096)
    assert (cfg["hidden_size"], cfg["head_dim"], cfg["expert_width"], cfg["shared_expert_width"],
            cfg["seq_len"]) == (64, 8, 16, 16, 128)
    assert (cfg["num_heads"], cfg["num_kv_heads"], cfg["num_experts"], cfg["top_k"]) == (16, 2, 512, 10)
    with pytest.raises(ConfigError, match="dense FFN"):
        runner_config_for(load_model("qwen3-8b"), 1 / 32, 4096)


@pytest.mark.slow
def test_measure_cpu_sizes_its_work_to_a_small_budget(tmp_path):
    """A small budget: repeats and candidate orders are reduced (never below 3 and 2) exactly when the defaults'
    estimate from the probe exceeds the time left, the progress lines name every pair and order, and the end says
    what was reduced; the sizing is in the profile."""
    pytest.importorskip("torch")
    out = tmp_path / "cpu.json"
    proc = subprocess.run(CLI + ["measure", "--backend", "cpu", "--ep", "2", "--size-factor", "0.03125", "--warmup", "0",
                                 "--budget-s", "25", "--out", str(out)], capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr
    assert "probe at size factor 0.03125" in err and "pair 4/4" in err and "order 1/" in err
    assert "reduced to fit:" in proc.stdout and "CPU" in proc.stdout
    prof = pr.load_profile(out)
    sz = prof.data["sizing"]
    # "skipped:" only when something planned was not run (a halving round cut); reductions are not skips
    assert ("skipped:" in proc.stdout) == bool(sz["skipped"])
    assert all("halving stopped" in s for s in sz["skipped"])
    # what ran per pair, from the run's records (not the plan's figure)
    ran = [prof.entries[k]["metadata"] for k in prof.entries]
    orders = sorted({m["candidates_measured"] for m in ran})
    line = next(l for l in proc.stdout.splitlines() if l.startswith("sizing"))
    assert "orders measured per pair" in line
    if len(orders) == 1:
        assert f"orders measured per pair {orders[0]}" in line
    # noise warnings are computed and recorded (maybe none), and the written path closes the output
    assert isinstance(prof.data["noise_warnings"], list)
    assert all(("noise warning" in w["text"]) and w["text"] in proc.stdout for w in prof.data["noise_warnings"])
    assert proc.stdout.rstrip().splitlines()[-1] == f"profile written: {out}"
    assert sz["budget_s"] == 25 and sz["size_factor"] == 0.03125 and sz["fixed"] == ["size_factor"]
    assert sz["plan"]["repeats"] >= 3 and sz["plan"]["keep"] >= 2
    # whether the defaults had to be reduced depends on this machine's speed now: recompute it from the last probe's
    # own record (its round costs, the requested work, the seconds it had left), independently of plan_work
    last = sz["probes"][-1]
    req = sz["requested"]
    default_s = sum(last["round_s"]) * pair_rounds(req["keep"], req["repeats"], req["warmup"])
    assert bool(last["plan"]["reductions"]) == (default_s > last["seconds_left"])
    assert set(last["plan"]["reductions"]) <= set(sz["reductions"])
    assert bool(sz["reductions"]) == ("reduced to fit: nothing" not in proc.stdout)
    assert sz["wall_s"] > 0 and sz["cpu_s"] > 0 and sz["load_average_1m"]["before"] is not None
    for e in prof.entries.values():
        assert e["metadata"]["sizing"] == sz and e["metadata"]["repeats"] == e["metadata"]["pair_sizing"]["repeats"]
        assert len(e["metadata"]["candidates"]) == e["metadata"]["pair_sizing"]["keep"]
