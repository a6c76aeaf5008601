"""Fuzz of the command-line contract (issue 18) with a bounded number of examples: every subcommand (``run`` and
real measurements excluded; ``reproduce`` only in cheap cases) with generated flags and files exits 0 or 2, prints
no traceback, at most two lines on stderr (written-file notices aside) and finishes within its bound.
The generator lives in ``benchmarks/fuzz_cli.py`` (``--examples N`` for longer runs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

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
    @given(fuzz_cli.argv_strategy(corpus))
    def check(argv):
        o = fuzz_cli.run_one(argv, BOUND_S)
        seen.append(o.kind)
        assert o.kind in ("ok", "error"), f"{o.kind}: tessera-lab {' '.join(argv)}: {o.detail}"

    check()
    assert "ok" in seen and "error" in seen  # the generator reaches both sides of the contract
    assert sorted(p.name for p in (corpus.root / "cwd").iterdir()) == []  # nothing written to the working folder


@pytest.mark.parametrize("argv", [
    ["run", "--timeout", "nan"], ["run", "--pp", "0"], ["measure", "--backend", "cpu", "--repeats", "0"],
    ["reproduce", "--out"], ["--bogus"], [],
])
def test_cheap_cases_of_the_excluded_commands(argv):
    o = fuzz_cli.run_one(argv, BOUND_S)
    assert o.kind == "error", o
