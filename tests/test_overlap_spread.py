"""benchmarks/bench_overlap_spread.py per paper scenario: the spread is max / min over the pair kinds' gains."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_overlap_spread", ROOT / "benchmarks" / "bench_overlap_spread.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_scenario_spreads_by_their_rows():
    res = _bench().scenario_spreads()
    assert set(res) >= {"qwen3-l-8192", "qwen3-next-m-4096"}
    # Qwen3-235B: every layer is full attention + MoE, one pair kind, spread 1 by construction
    assert len(res["qwen3-l-8192"]["rows"]) == 1 and res["qwen3-l-8192"]["spread"] == 1.0
    nxt = res["qwen3-next-m-4096"]
    assert len(nxt["rows"]) == 4  # {linear, full} attention x {linear, full} attention
    gains = [r["t_a_ms"] + r["t_b_ms"] - r["t_ab_ms"] for r in nxt["rows"]]
    assert nxt["spread"] == pytest.approx(max(gains) / min(gains), rel=1e-9)
    assert all(0 < g < r["t_a_ms"] + r["t_b_ms"] for g, r in zip(gains, nxt["rows"]))
