"""The profile store: schema version, atomic writes (kill -9 mid-write), stale detection, merging of
repeated measurements, and the planner lookups."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from tessera_lab.runner.runtime.orders import TEMPLATE_KEYS

from tessera_lab.overlap import core as ov
from tessera_lab.overlap import profiles as pr
from tessera_lab.errors import ConfigError, ProfileError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model

QWEN = load_model("qwen3-next-80b-a3b")
P = ParallelConfig(pp=1, dp=1)


@pytest.fixture(scope="module")
def analytic_table():
    return ov.overlap_table(QWEN, P, budget=400)


def fake_measured(result: ov.OverlapResult, samples: dict[str, list[float]], env: dict) -> ov.OverlapResult:
    """A copy of an analytic result dressed as a cpu measurement with the given samples."""
    r = copy.deepcopy(result)
    r.backend = "cpu"
    r.spread = {k: ov.spread_stats(v) for k, v in samples.items()}
    r.t_a, r.t_b, r.t_ab = (r.spread[k]["median"] for k in ("t_a", "t_b", "t_ab"))
    r.t_program = r.spread["t_program"]["median"]
    r.overlap_efficiency = ov.overlap_efficiency(r.t_a, r.t_b, r.t_ab)
    r.metadata = {**r.metadata, **env, "backend": "cpu", "repeats": len(samples["t_ab"]), "size_factor": 0.125,
                  "comm_proxy": None, "world_size": 2, "dtype": "float32"}
    return r


CPU_ENV = {"device": "AMD EPYC (2 cores)", "torch": "2.13.0+cpu", "cuda": None, "driver": None}


def test_round_trip_of_an_analytic_profile(tmp_path, analytic_table):
    prof = pr.new_profile("analytic", QWEN.name, P, size_factor=1.0)
    pr.add_results(prof, analytic_table.attrs["results"])
    path = pr.save_profile(prof, tmp_path / "a.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # current: no stale warning
        back = pr.load_profile(path)
    assert back.data["schema_version"] == 1
    assert not pr.is_stale(back)
    assert len(back.entries) == 4
    e = back.entry("linear_attention+moe", "full_attention+moe")
    for f in ("device", "torch", "cuda", "driver", "dtype", "shapes", "repeats", "spread", "date", "backend"):
        assert f in e["metadata"], f
    assert e["t_ab"]["median"] == pytest.approx(
        analytic_table.set_index(["kind_f", "kind_b"]).loc[("linear_attention+moe", "full_attention+moe"), "t_pair"])
    t = back.table()
    assert set(t.columns) >= {"kind_f", "kind_b", "t_pair", "gain", "efficiency"}


def test_unknown_schema_version_and_malformed_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"schema_version": 2, "backend": "cpu", "entries": {}}))
    with pytest.raises(ProfileError, match="schema_version"):
        pr.load_profile(p)
    p.write_text(json.dumps({"schema_version": 1, "backend": "gpu", "entries": {}}))
    with pytest.raises(ProfileError, match="backend"):
        pr.load_profile(p)
    p.write_text(json.dumps({"schema_version": 1, "backend": "cpu", "entries": {"k": {"kind_f": "x"}}}))
    with pytest.raises(ProfileError, match=r"entries\[k\]\.kind_b"):
        pr.load_profile(p)
    p.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        pr.load_profile(p)
    with pytest.raises(ProfileError, match="does not exist"):
        pr.load_profile(tmp_path / "missing.json")


def test_stale_profile_is_detected(tmp_path, analytic_table):
    r = analytic_table.attrs["results"][0]
    measured = fake_measured(r, {"t_a": [1.0], "t_b": [2.0], "t_ab": [2.5], "t_program": [2.7]}, CPU_ENV)
    prof = pr.new_profile("cpu", QWEN.name, P, size_factor=0.125, environment={**CPU_ENV, "device": "Fake CPU 9000", "torch": "0.0.1"})
    measured.metadata["device"] = "Fake CPU 9000"
    measured.metadata["torch"] = "0.0.1"
    pr.add_results(prof, [measured])
    path = pr.save_profile(prof, tmp_path / "stale.json")
    with pytest.warns(pr.StaleProfileWarning, match="stale"):
        back = pr.load_profile(path)
    assert pr.is_stale(back)
    reasons = " ".join(pr.stale_reasons(back))
    assert "device" in reasons and "torch" in reasons
    # the same profile is current on the machine it names
    assert not pr.is_stale(back, {**CPU_ENV, "device": "Fake CPU 9000", "torch": "0.0.1"})
    # re-measuring replaces a stale profile instead of merging into it
    fresh = fake_measured(r, {"t_a": [1.0], "t_b": [2.0], "t_ab": [2.2], "t_program": [2.7]},
                          pr.current_environment("cpu"))
    new = pr.update_profile(path, [fresh], backend="cpu", model=QWEN.name, parallel=P, size_factor=0.125)
    assert not pr.is_stale(new)
    assert new.entries[next(iter(new.entries))]["t_ab"]["samples"] == [2.2]


def test_analytic_profile_goes_stale_when_the_cost_model_changes(tmp_path, analytic_table):
    prof = pr.new_profile("analytic", QWEN.name, P)
    pr.add_results(prof, analytic_table.attrs["results"][:1])
    env = pr.current_environment("analytic")
    assert not pr.is_stale(prof, env)
    assert pr.is_stale(prof, {**env, "cost_model": "0" * 12})


def test_repeated_measurements_merge(tmp_path, analytic_table):
    r = analytic_table.attrs["results"][0]
    env = pr.current_environment("cpu")
    m1 = fake_measured(r, {"t_a": [1.0, 1.2], "t_b": [2.0, 2.2], "t_ab": [2.5, 2.7], "t_program": [3, 3]}, env)
    m2 = fake_measured(r, {"t_a": [1.1], "t_b": [2.1], "t_ab": [2.6], "t_program": [3]}, env)
    path = tmp_path / "m.json"
    pr.update_profile(path, [m1], backend="cpu", model=QWEN.name, parallel=P, size_factor=0.125)
    prof = pr.update_profile(path, [m2], backend="cpu", model=QWEN.name, parallel=P, size_factor=0.125)
    e = next(iter(prof.entries.values()))
    assert sorted(e["t_ab"]["samples"]) == [2.5, 2.6, 2.7]
    assert (e["t_ab"]["median"], e["t_ab"]["q1"], e["t_ab"]["q3"]) == pytest.approx((2.6, 2.55, 2.65))
    assert e["metadata"]["repeats"] == 3 and len(e["metadata"]["dates"]) == 2
    assert e["efficiency"] == pytest.approx((1.1 + 2.1 - 2.6) / 1.1)
    # a measurement with other shapes replaces the entry
    m3 = fake_measured(r, {"t_a": [9.0], "t_b": [9.0], "t_ab": [9.0], "t_program": [9.0]}, env)
    m3.metadata["shapes"] = {"a": {"hidden": 1}}
    merged = pr.merge_entries(e, pr.entry_from_result(m3)[1])
    assert merged["t_ab"]["samples"] == [9.0]


def test_a_write_killed_midway_leaves_the_previous_profile_intact(tmp_path):
    path = tmp_path / "big.json"
    old = pr.new_profile("analytic", "old-model", environment={"device": "x"})
    pr.save_profile(old, path)
    before = path.read_bytes()
    writer = textwrap.dedent(f"""
        from tessera_lab.overlap import profiles as pr
        prof = pr.new_profile("analytic", "new-model", environment={{"device": "x"}})
        prof.data["padding"] = ["0.123456789012345678"] * 6_000_000   # about 140 MB of JSON
        pr.save_profile(prof, {str(path)!r})
    """)
    caught = False
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", writer])
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                tmps = [p for p in tmp_path.iterdir() if p.name.startswith(".big.json.") and p.name.endswith(".tmp")]
                if tmps and tmps[0].stat().st_size > 1_000_000:
                    os.kill(proc.pid, signal.SIGKILL)
                    caught = True
                    break
                time.sleep(0.002)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        if caught:
            break
        pr.save_profile(old, path)  # the write won the race; restore and try again
    assert caught, "could not kill the writer mid-write"
    assert path.read_bytes() == before
    assert json.loads(path.read_text())["model"] == "old-model"  # (an empty profile is refused as costs)


def test_pair_time_lookup_and_planner_costs(tmp_path, analytic_table):
    prof = pr.new_profile("analytic", QWEN.name, P)
    pr.add_results(prof, analytic_table.attrs["results"])
    lin, full = "linear_attention+moe", "full_attention+moe"
    row = analytic_table.set_index(["kind_f", "kind_b"]).loc[(lin, full)]
    assert pr.pair_time(prof, lin, full) == pytest.approx(row["t_pair"])
    assert pr.pair_time(prof, lin, "dense+x") is None
    # transferring the efficiency onto the measured standalone times gives back the measured pair
    assert pr.pair_time(prof, lin, full, t_f=row["t_f"], t_b=row["t_b"]) == pytest.approx(row["t_pair"])
    e = row["efficiency"]
    assert pr.pair_time(prof, lin, full, t_f=2.0, t_b=3.0) == pytest.approx(5.0 - e * 2.0)
    costs = pr.profile_stage_pair_costs(prof, QWEN, P)
    assert set(costs) == {(a, b) for a in (lin, full) for b in (lin, full)}
    assert costs[(lin, full)] == pytest.approx(row["t_pair"])  # full scale, same shapes: measured value as is
    kinds = [l.kind for l in QWEN.stack.layers[:4]]
    sums = ov.pair_costs_from_table(analytic_table, "t_sum")
    assert ov.stage_pair_cost(kinds, costs) < ov.stage_pair_cost(kinds, sums)


def test_scaled_profile_transfers_efficiency(analytic_table):
    env = pr.current_environment("cpu")
    lin = "linear_attention+moe"
    r = next(x for x in analytic_table.attrs["results"] if x.kind_a == lin and x.kind_b == lin)
    m = fake_measured(r, {"t_a": [0.010], "t_b": [0.020], "t_ab": [0.025], "t_program": [0.03]}, env)  # e = 0.5
    prof = pr.new_profile("cpu", QWEN.name, P, size_factor=0.125, environment=env)
    pr.add_results(prof, [m])
    costs = pr.profile_stage_pair_costs(prof, QWEN, P, budget=400)  # the table's search budget: the same search
    row = analytic_table.set_index(["kind_f", "kind_b"]).loc[(lin, lin)]
    assert costs[(lin, lin)] == pytest.approx(row["t_f"] + row["t_b"] - 0.5 * min(row["t_f"], row["t_b"]))
    # combinations the profile lacks fall back to the analytic pair time
    full = "full_attention+moe"
    assert costs[(full, full)] == pytest.approx(
        analytic_table.set_index(["kind_f", "kind_b"]).loc[(full, full), "t_pair"], rel=1e-6)


SHIPPED_CPU = Path(__file__).resolve().parents[1] / "data" / "profiles" / "cpu-qwen3-next-small.json"


def _shipped_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pr.StaleProfileWarning)  # measured on another machine is fine here
        return pr.load_profile(SHIPPED_CPU)


def test_shipped_cpu_profile_loads_and_has_spread():
    prof = _shipped_cpu()
    assert prof.backend == "cpu" and len(prof.entries) == 4
    for e in prof.entries.values():
        reps = e["metadata"]["repeats"]
        assert reps >= 3
        for name in ("t_a", "t_b", "t_ab", "t_program"):
            s = e[name]
            assert s["n"] == len(s["samples"]) and 0 < s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"]
        assert e["t_a"]["n"] == e["t_b"]["n"] == reps  # alone: exactly the timed repeats
        assert e["t_program"]["n"] >= reps and e["t_ab"]["n"] >= reps  # together: halving adds samples


def test_shipped_cpu_profile_is_measured_by_the_runtime_and_holds_no_placeholder():
    """Every value is measured or derived with its source named: gain and efficiency recomputed here from the
    stored medians, inflation per node measured (no 1.0 placeholders), the sizing and the load recorded."""
    prof = _shipped_cpu()
    sz = prof.data["sizing"]
    assert sz["wall_s"] > 0 and sz["cpu_s"] > 0 and sz["load_average_1m"]["before"] is not None
    for key, e in prof.entries.items():
        meta = e["metadata"]
        assert meta["executor"].startswith("runner node-level") and meta["clock"].startswith("host clock")
        assert meta["communication"] == "EP all-to-all" and meta["world_size"] >= 2
        assert set(e["tasks"]) == set(TEMPLATE_KEYS)
        assert all(v["duration_s"] > 0 for v in e["tasks"].values())  # every node took measurable time alone
        ta, tb, tab = e["t_a"]["median"], e["t_b"]["median"], e["t_ab"]["median"]
        assert e["gain"] == pytest.approx(ta + tb - tab, rel=1e-12)
        assert e["efficiency"] == pytest.approx((ta + tb - tab) / min(ta, tb), rel=1e-12)
        derived = meta["derived_fields"]
        assert set(derived) == {"gain", "efficiency", "inflation", "comm_hidden_fraction"}
        assert all(isinstance(v, str) and len(v) > 10 for v in derived.values())
        assert set(e["inflation"]) == set(TEMPLATE_KEYS)
        assert all(v > 0 and v != 1.0 for v in e["inflation"].values()), key  # measured ratios, no placeholders
        assert 0.0 <= e["comm_hidden_fraction"] <= 1.0
        # the decision follows the quartile rule on the stored samples
        d = meta["search"]["decision"]
        cands = meta["candidates"]
        assert cands[0]["order"] == list(TEMPLATE_KEYS) and e["order"] == cands[d["chosen"]]["order"]
        if d["verdict"] == "significant":
            assert pr._stats(cands[d["chosen"]]["samples"])["q3"] < pr._stats(cands[0]["samples"])["q1"]
        else:
            assert d["chosen"] == 0 and e["t_ab"]["samples"] == e["t_program"]["samples"]


def test_shipped_cpu_profile_fit_reproduces_its_samples_within_the_stated_residual():
    """The stored contention, replayed on each entry's stored order and node times, gives t_ab with the stored RMS
    relative error; and no neighbour on the fit's fine grid does better (a local minimum of the stated loss)."""
    from tessera_lab.cost.analytic import Contention
    from tessera_lab.cost.lanes import pair_makespan

    prof = _shipped_cpu()
    fit = prof.data["fit"]
    samples = [e["fit_sample"] for e in prof.entries.values()]
    assert fit["pairs"] == len(samples) == 4

    def rel_errors(c, k):
        out = []
        for s in samples:
            pred = pair_makespan(s["order"], s["durations"], s["lanes"], {a: tuple(b) for a, b in s["deps"].items()},
                                 contention=Contention(c, k)).makespan
            out.append((pred - s["t_ab"]) / s["t_ab"])
        return out

    errs = rel_errors(fit["compute"], fit["comm"])
    rms = (sum(x * x for x in errs) / len(errs)) ** 0.5
    assert rms == pytest.approx(fit["rms_relative_error"], rel=1e-9)
    fine = fit["grid_step"] / 10
    loss = sum(x * x for x in errs)
    for dc in (-fine, 0.0, fine):
        for dk in (-fine, 0.0, fine):
            c, k = fit["compute"] + dc, fit["comm"] + dk
            if 0 <= c <= 3 and 0 <= k <= 3:
                assert sum(x * x for x in rel_errors(c, k)) >= loss - 1e-12


def test_refit_from_the_file_reproduces_the_fit(tmp_path, analytic_table):
    """Per-task durations, lanes, deps and the measured t_ab are stored, so the fit can be redone from the file."""
    results = []
    for i, r in enumerate(analytic_table.attrs["results"][:2]):
        t = r.t_ab * (1.0 + 0.1 * i)  # measured together: slower than the model says, by pair
        results.append(fake_measured(r, {"t_a": [r.t_a], "t_b": [r.t_b], "t_ab": [t], "t_program": [t]}, CPU_ENV))
    prof = pr.new_profile("cpu", QWEN.name, P, size_factor=0.125, environment=CPU_ENV)
    pr.add_results(prof, results)
    path = pr.save_profile(prof, tmp_path / "cpu.json")
    back = pr.load_profile(path, check_stale=False)
    stored = back.data["fit"]
    assert stored["pairs"] == 2
    assert {**pr.refit(back).as_dict(), "grid_step": 0.1} == {k: v for k, v in stored.items() if k != "method"}
    # and equals fitting the results directly
    assert ov.fit_contention(results, step=0.1).as_dict() == pr.refit(back).as_dict()
    e = next(iter(back.entries.values()))
    assert set(e["tasks"]) == set(e["fit_sample"]["durations"]) and e["fit_sample"]["order"] == e["order"]
    with pytest.raises(ConfigError, match="per-task"):
        pr.refit(pr.new_profile("cpu", QWEN.name, P, size_factor=0.125, environment=CPU_ENV))
