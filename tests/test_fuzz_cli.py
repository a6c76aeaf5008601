"""Fuzz of the command-line contract with a bounded number of examples: every subcommand (``run`` and
real measurements excluded; ``reproduce`` only in cheap cases) with generated flags and files exits 0 or 2, prints
no traceback, at most two lines on stderr (written-file notices aside) and finishes within its bound.
The generator lives in ``benchmarks/fuzz_cli.py`` (``--examples N`` for longer runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fuzz_cli", ROOT / "benchmarks" / "fuzz_cli.py")
fuzz_cli = importlib.util.module_from_spec(_spec)
sys.modules["fuzz_cli"] = fuzz_cli
_spec.loader.exec_module(fuzz_cli)

BOUND_S = 30.0  # per example; the slowest generated inputs (plan, report) take about a second


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return fuzz_cli.build_corpus(tmp_path_factory.mktemp("fuzz"))


def test_cli_contract_under_fuzzing(corpus, monkeypatch):
    monkeypatch.chdir(corpus.root / "cwd")  # relative outputs stay in the corpus
    seen = []

    @settings(max_examples=80, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(fuzz_cli.case_strategy(corpus))
    @example((["models"], {}))  # one input of each side always runs: 80 generated ones may all be refused
    @example((["params", "qwen3-8b", "--bogus"], {}))
    def check(case):
        argv, env = case
        o = fuzz_cli.run_one(argv, BOUND_S, env, fuzz_cli.known_bad(argv, env, corpus))
        seen.append(o.kind)
        assert o.kind in ("ok", "error", "accepted"), f"{o.kind}: {env} tessera-lab {' '.join(argv)}: {o.detail}"

    check()
    # both sides of the contract ran: inputs taken (finished, or accepted up to the stubbed start of workers or a
    # measurement) and inputs refused (the two explicit examples make sure of it; most generated inputs are refused)
    assert ({"ok", "accepted"} & set(seen)) and "error" in seen
    assert sorted(p.name for p in (corpus.root / "cwd").iterdir()) == []  # nothing written to the working folder


@pytest.mark.parametrize("argv", [
    ["run", "--timeout", "nan"], ["run", "--pp", "0"], ["measure", "--backend", "cpu", "--repeats", "0"],
    ["reproduce", "--out"], ["--bogus"], [],
])
def test_cheap_cases_of_the_excluded_commands(argv):
    o = fuzz_cli.run_one(argv, BOUND_S)
    assert o.kind == "error", o


def test_every_runner_file_kind_and_variable_is_refused(corpus, monkeypatch):
    """Each tampered runner file where its command reads it, and each malformed TESSERA_LAB_* value: exit 2, one
    line (the fuzzer's 'bad by construction' inputs, all of them, deterministically)."""
    monkeypatch.chdir(corpus.root / "cwd")
    where = {"bad_plan": ["run", "--plan"], "bad_store": ["run", "--profile-store"], "bad_run": ["report", "--observed"],
             "bad_validation": ["validate", "--repredict"],
             "bad_device": ["plan", "--model", "tiny-runner", "--pp", "2", "--ep", "2", "--device"]}
    n = 0
    for key, path in sorted(corpus.inputs.items()):
        prefix = "_".join(key.split("_")[:2])
        if prefix in where:
            argv = where[prefix] + [path]
            o = fuzz_cli.run_one(argv, BOUND_S, {}, key)
            assert o.kind == "error", (key, o)
            n += 1
    for var, values in fuzz_cli.ENV_BAD.items():
        for v in values:
            o = fuzz_cli.run_one(["run"], BOUND_S, {var: v}, var)
            assert o.kind == "error", (var, v, o)
            n += 1
    assert n >= 40
    o = fuzz_cli.run_one(["run", "--plan", corpus.inputs["runner_plan"]], BOUND_S)
    assert o.kind == "accepted", o  # the good runner plan gets to the launch


def test_every_routing_log_dynamic_source_and_profile_tamper_is_refused(corpus, monkeypatch):
    """Each tampered routing log (simulate --routing replay:), report --dynamic source and overlap profile: exit 2,
    one line naming the file (deterministically, all of them); the good ones are accepted."""
    import json

    from tessera_lab.errors import TesseraError
    from tessera_lab.io import read_json
    from tessera_lab.overlap.profile_schema import check_profile

    monkeypatch.chdir(corpus.root / "cwd")
    sim = ["simulate", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2", "--routing"]
    n = 0
    for key, path in sorted(corpus.inputs.items()):
        if key.startswith("bad_routing"):
            argv = sim + [f"replay:{path}"]
        elif key.startswith("bad_dynamic"):
            argv = ["report", "--dynamic", path]
        elif key.startswith("bad_profile"):
            with pytest.raises(TesseraError):
                check_profile(read_json(path, "profile"), f"profile '{path}'")
            n += 1
            if not fuzz_cli._PROFILES_CHECKED[0]:
                continue
            argv = ["plan", "--model", "qwen3-next-80b-a3b", "--pp", "4", "-m", "8", "--profile", path,
                    "--allow-stale-profile"]
        else:
            continue
        assert fuzz_cli.known_bad(argv, {}, corpus), argv
        o = fuzz_cli.run_one(argv, BOUND_S, {}, key)
        assert o.kind == "error" and o.rc == 2 and "Traceback" not in o.detail, (key, o)
        assert len([l for l in o.detail.splitlines() if l.strip()]) == 1, (key, o)
        n += 1
    assert n >= 90
    for argv in (sim + [f"replay:{corpus.inputs['routing_good']}"], ["report", "--dynamic", corpus.inputs["dynamic_run"]],
                 ["report", "--dynamic", corpus.inputs["dynamic_sim"]]):
        o = fuzz_cli.run_one(argv, BOUND_S)
        assert o.kind == "ok", (argv, o)
    check_profile(json.loads(open(corpus.inputs["profile_shipped"]).read()), "shipped profile")


def test_tampered_configs_and_torchrun_variables_are_refused(corpus, monkeypatch):
    """The config tampers (string booleans, unknown and shape-named unknown fields) where plan and search read
    them, and each broken torchrun variable for the runner entry: exit 2 in one line; the allow flags accept the
    unknown fields (the fuzzer's rule, checked both ways)."""
    monkeypatch.chdir(corpus.root / "cwd")
    n = 0
    for key, path in sorted(corpus.inputs.items()):
        if not key.startswith(("bad_cfg", "cfg_")):
            continue
        for cmd in (["plan", "--pp", "4", "-m", "8"], ["search", "--gpus", "64", "--max-plans", "1"]):
            argv = cmd + ["--model", path]
            bad = fuzz_cli.known_bad(argv, {}, corpus)
            assert bad, argv
            o = fuzz_cli.run_one(argv, BOUND_S, {}, bad)
            assert o.kind == "error", (key, o)
            n += 1
    allowed = ["plan", "--pp", "4", "-m", "8", "--model", corpus.inputs["cfg_structural"], "--allow-unknown-fields",
               "--allow-structural-fields"]
    assert fuzz_cli.known_bad(allowed, {}, corpus) == ""
    assert fuzz_cli.run_one(allowed, BOUND_S).kind == "ok"
    for change in fuzz_cli.TORCHRUN_BAD:
        env = {**fuzz_cli.TORCHRUN_GOOD, **change}
        o = fuzz_cli.run_one([fuzz_cli.RUNNER_ENTRY], BOUND_S, env, fuzz_cli.known_bad(["runner"], env, corpus))
        assert o.kind == "error", (change, o)
        n += 1
    o = fuzz_cli.run_one([fuzz_cli.RUNNER_ENTRY], BOUND_S, dict(fuzz_cli.TORCHRUN_GOOD))
    assert o.kind == "accepted", o  # the whole set reaches the (stubbed) process group
    assert n >= 20
