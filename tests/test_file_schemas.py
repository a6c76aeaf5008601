"""Schemas of the files read by ``simulate --routing replay:FILE`` (routing logs), ``report --dynamic`` (dynamic
simulation and run results) and ``plan --profile`` (overlap profiles): the real shipped files pass; tampered copies
are refused with one line naming the file, the field, the value and the allowed range, and the CLI exits 2 before
any work."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tessera_lab.cli.main import main
from tessera_lab.dynamic.routing_log import check_routing_log, load_routing_log
from tessera_lab.errors import ConfigError, ProfileError
from tessera_lab.overlap.profile_schema import check_profile
from tessera_lab.report.dynamic_schema import check_dynamic_source

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "runs"
PROFILE = ROOT / "data" / "profiles" / "cpu-qwen3-next-small.json"
_spec = importlib.util.spec_from_file_location("fuzz_cli", ROOT / "benchmarks" / "fuzz_cli.py")
fuzz_cli = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("fuzz_cli", fuzz_cli)
_spec.loader.exec_module(fuzz_cli)
DROP, _set = fuzz_cli.DROP, fuzz_cli._tampered  # the fuzzer's tamperer: one owner


# ------------------------------------------------------------------------------------------ routing logs
LOG = {"format": "tessera-lab/routing-log", "version": 1, "num_experts": 4, "top_k": 2,
       "records": [{"layer": l, "microbatch": m, "tokens": 4, "routed": [3, 1, 2, 2]} for l in range(2)
                   for m in range(2)]}


def test_good_log_and_runner_route_log_pass():
    assert check_routing_log(LOG, "x") is LOG
    log = load_routing_log(LOG)
    assert log.counts[0].shape == (1, 2, 2, 4) and log.tokens == 4
    check_routing_log([{"layer": 0, "routed": [1, 2], "kept": [1, 2], "capacity": None}], "x")  # the runner's list


@pytest.mark.parametrize("path, value, needle", [
    (("records", 0, "routed", 1), "abc", r"field 'records\[0\]\.routed\[1\]' = 'abc' is not an integer; allowed: an "
                                         r"integer 0 to 1099511627776"),
    (("records", 0, "routed", 1), -1, r"'records\[0\]\.routed\[1\]' = -1 is out of range; allowed: an integer 0 to"),
    (("records", 0, "routed", 1), 1e300, r"= 1e\+300 is out of range; allowed: an integer 0 to 1099511627776"),
    (("records", 0, "routed", 1), 2.5, r"= 2\.5 is not an integer"),
    (("records", 0, "routed"), [1, 2], r"'records\[0\]\.routed' has 2 entries; allowed: 4"),
    (("records", 0, "routed"), DROP, r"field 'records\[0\]\.routed' is missing; allowed: a list of token counts"),
    (("records", 0, "layer"), "0", r"'records\[0\]\.layer' = '0' is not an integer"),
    (("records", 0, "layer"), 10**9, r"over the work limit for decoder layers .*allowed: at most 2048 "
                                      r"\(raise it with TESSERA_LAB_MAX_LAYERS=N\)"),
    (("records", 0, "step"), -1, r"'records\[0\]\.step' = -1 is out of range; allowed: an integer >= 0"),
    (("records", 0, "microbatch"), 1.5, r"'records\[0\]\.microbatch' = 1\.5 is not an integer"),
    (("records", 0, "tokens"), 10**12, r"over the work limit for tokens"),
    (("top_k",), 9, r"field 'top_k' = 9 is out of range; allowed: an integer 1 to 4 \(num_experts\)"),
    (("num_experts",), 0, r"field 'num_experts' = 0 is out of range; allowed: an integer >= 1"),
    (("format",), 5, r"field 'format' = 5 is not a string; allowed: one of 'tessera-lab/routing-log'"),
    (("version",), 2, r"field 'version' = 2 is not allowed; allowed: one of 1"),
    (("records",), "x", r"field 'records' = 'x' is not a list"),
    (("records",), DROP, r"field 'records' is missing"),
    (("records",), [1], r"field 'records\[0\]' = 1 is not an object"),
])
def test_tampered_log_refused_naming_field_and_range(path, value, needle):
    with pytest.raises(ConfigError, match=r"^routing log .f\.json.: .*" + needle):
        check_routing_log(_set(LOG, path, value), "routing log 'f.json'")


def test_huge_log_refused_by_the_work_limit_before_arrays_are_built():
    doc = _set(LOG, ("records", 0), {"layer": 0, "step": 999_999, "microbatch": 99_999, "routed": [1, 1, 1, 1]})
    with pytest.raises(ConfigError, match="over the work limit for token counts held from a routing log"):
        load_routing_log(doc)


@pytest.mark.parametrize("data", [
    json.dumps(_set(LOG, ("records", 0, "routed", 0), -3)).encode(),
    b'{"note": "caf\xe9", ' + json.dumps(LOG).encode()[1:],  # not UTF-8
    json.dumps(_set(LOG, ("top_k",), "2")).encode(),
])
def test_simulate_replay_refuses_tampered_log_with_one_line(tmp_path, capsys, data):
    p = tmp_path / "log.json"
    p.write_bytes(data)
    rc = main(["simulate", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2", "--routing", f"replay:{p}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(p) in err[0] and "Traceback" not in err[0], err


def test_simulate_replay_good_log_runs(tmp_path, capsys):
    p = tmp_path / "log.json"
    p.write_text(json.dumps(LOG))
    assert main(["simulate", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2", "--ep", "2", "--experts",
                 "4", "--top-k", "2", "--routing", f"replay:{p}"]) == 0
    assert main(["simulate", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2", "--ep", "3",
                 "--routing", f"replay:{p}"]) == 2
    assert "4 experts do not split over --ep 3" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ report --dynamic
RUN = json.loads((RUNS / "runner_dynamic_overlapped_zipf1.5.json").read_text())
SIM = {"schedule": "1f1b", "stages": 4, "microbatches": 8, "routing": "zipf:1.2", "steps": 4,
       "costs": "analytic (synthetic --f/--b/--w per stage)", "iteration_static_s": 12.0, "iteration_dynamic_s": 11.0,
       "routing_variance_s": 2.0, "bubble_after_dynamic_s": 1.1, "idle_removed_s": -0.5}


def test_shipped_dynamic_runs_pass():
    for p in sorted(RUNS.glob("runner_dynamic_*.json")):
        check_dynamic_source(json.loads(p.read_text()), str(p))
    check_dynamic_source(SIM, "sim")


@pytest.mark.parametrize("doc, path, value, needle", [
    (RUN, ("static", "step_time", "median_s"), "abc", r"'static\.step_time\.median_s' = 'abc' is not a number; "
                                                      r"allowed: seconds >= 0 and <= 1e\+09"),
    (RUN, ("static", "step_time", "median_s"), -1, r"= -1 is out of range; allowed: seconds >= 0"),
    (RUN, ("static", "step_time", "median_s"), 1e300, r"= 1e\+300 is out of range"),
    (RUN, ("static", "step_time", "median_s"), DROP, r"'static\.step_time\.median_s' is missing"),
    (RUN, ("static", "step_time", "q3_s"), 0.0, r"'static\.step_time' has q1_s = .*allowed: q1_s <= median_s <= q3_s"),
    (RUN, ("world", "ranks"), 0, r"'world\.ranks' = 0 is out of range; allowed: an integer >= 1"),
    (RUN, ("world", "ranks"), "4", r"'world\.ranks' = '4' is not an integer"),
    (RUN, ("routing",), DROP, r"field 'routing' is missing"),
    (RUN, ("gain_verdict",), "maybe", r"'gain_verdict' = 'maybe' is not allowed; allowed: one of 'significant'"),
    (RUN, ("dynamic",), "x", r"field 'dynamic' = 'x' is not an object"),
    (RUN, ("kind",), DROP, r"neither 'simulate"),
    (SIM, ("iteration_static_s",), 0, r"'iteration_static_s' = 0 is out of range; allowed: seconds > 0"),
    (SIM, ("iteration_dynamic_s",), DROP, r"'iteration_dynamic_s' is missing"),
    (SIM, ("routing_variance_s",), 12.0, r"'routing_variance_s' = 12 is out of range; allowed: below "
                                         r"iteration_static_s = 12"),
    (SIM, ("routing_variance_s",), "x", r"'routing_variance_s' = 'x' is not a number"),
    (SIM, ("bubble_after_dynamic_s",), -1, r"'bubble_after_dynamic_s' = -1 is out of range"),
    (SIM, ("idle_removed_s",), None, r"'idle_removed_s' = None is not a number"),
    (SIM, ("stages",), 10**9, r"over the work limit for pipeline stages"),
])
def test_tampered_dynamic_source_refused(doc, path, value, needle):
    with pytest.raises(ConfigError, match=needle):
        check_dynamic_source(_set(doc, path, value), "dynamic source 'd.json'")


@pytest.mark.parametrize("data", [json.dumps(_set(SIM, ("iteration_static_s",), -2)).encode(),
                                  b'{"x": "\xff"}', json.dumps([1, 2]).encode(),
                                  json.dumps(_set(RUN, ("static", "host_idle_per_step", "q1_s"), 1e12)).encode()])
def test_report_dynamic_refuses_before_planning(tmp_path, capsys, data):
    p = tmp_path / "d.json"
    p.write_bytes(data)
    rc = main(["report", "--dynamic", str(p)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(p) in err[0], err


# ------------------------------------------------------------------------------------------ profiles
PROF = json.loads(PROFILE.read_text())
K0 = next(iter(PROF["entries"]))


def test_shipped_and_measured_profiles_pass(tmp_path, capsys):
    check_profile(PROF, str(PROFILE))
    out = tmp_path / "p.json"
    assert main(["measure", "--backend", "analytic", "--model", "qwen3-8b", "--no-progress", "--out", str(out)]) == 0
    check_profile(json.loads(out.read_text()), str(out))


@pytest.mark.parametrize("path, value, needle", [
    (("entries", K0, "t_ab", "median"), -1, r"'entries\[.*\]\.t_ab\.median' = -1 is out of range; allowed: seconds "
                                            r">= 0 and <= 1e\+09"),
    (("entries", K0, "t_ab", "median"), "fast", r"\.t_ab\.median' = 'fast' is not a number"),
    (("entries", K0, "t_ab", "median"), 1e300, r"= 1e\+300 is out of range"),
    (("entries", K0, "t_ab", "median"), DROP, r"\.t_ab\.median' is missing"),
    (("entries", K0, "t_ab", "median"), 100.0, r"\.t_ab\.median' = 100 is out of range; allowed: from q1 "),
    (("entries", K0, "t_a", "samples"), [], r"\.t_a\.samples' has 0 entries; allowed: at least 1"),
    (("entries", K0, "t_a", "samples"), [-1], r"\.t_a\.samples\[0\]' = -1 is out of range"),
    (("entries", K0, "kind_f"), 5, r"\.kind_f' = 5 is not a string"),
    (("entries", K0, "metadata"), DROP, r"\.metadata' is missing"),
    (("entries", K0, "comm_hidden_fraction"), 1.5, r"comm_hidden_fraction' = 1\.5 is out of range; allowed: a "
                                                   r"finite number 0 to 1"),
    (("entries", K0, "layer_f"), 10**9, r"over the work limit for decoder layers"),
    (("schema_version",), 2, r"'schema_version' = 2 is not allowed; allowed: one of 1"),
    (("backend",), "gpu", r"'backend' = 'gpu' is not allowed; allowed: one of 'analytic', 'cpu', 'cuda'"),
    (("size_factor",), 0, r"'size_factor' = 0 is out of range; allowed: a number in \(0, 1\]"),
    (("parallel", "ep"), "8", r"'parallel\.ep' = '8' is not an integer"),
    (("entries",), "x", r"'entries' = 'x' is not an object"),
])
def test_tampered_profile_refused(path, value, needle):
    with pytest.raises(ProfileError, match=needle):
        check_profile(_set(PROF, path, value), "profile 'p.json'")


def test_renamed_entry_key_refused():
    e = PROF["entries"][K0]
    doc = _set(PROF, ("entries",), {"F:mamba|BW:mamba": e})
    with pytest.raises(ProfileError, match=r"has key 'F:mamba\|BW:mamba' for an entry of kinds .*allowed: the key "):
        check_profile(doc, "profile 'p.json'")
