"""The per-MoE-layer host/sync term (cost/sync.py) and the dynamic mechanism split (dynamic/mechanisms.py), by hand."""

from __future__ import annotations

import pytest

from tessera_lab.cost import sync
from tessera_lab.errors import ConfigError


def test_sync_term_by_hand():
    # hidden under the combined-1F1B EP overlap, c otherwise
    assert sync.sync_exposed_per_layer_s("overlapped", 4e-3) == 0.0
    assert sync.sync_exposed_per_layer_s("interleaved-overlapped", 4e-3) == 0.0
    assert sync.sync_exposed_per_layer_s("1f1b", 4e-3) == 4e-3
    with pytest.raises(ConfigError, match="field 'c_s'"):
        sync.sync_exposed_per_layer_s("1f1b", -1.0)
    # pp 1 (Qwen3-30B-A3B on 16 H100): 48 MoE layers x 64 micro-batches x 4 ms = 12.288 s
    assert sync.iteration_sync_s([48], 64, 1, 1, 4e-3) == pytest.approx(48 * 64 * 4e-3)
    # pp 8, vpp 4, m 128, busiest rank 8 MoE layers: 8 x 1 ms x (128 + 7 / 4) = 1.038 s
    assert sync.iteration_sync_s([8, 7, 8, 8], 128, 8, 4, 1e-3) == pytest.approx(8e-3 * (128 + 7 / 4))
    # per_layer_needed_s inverts iteration_sync_s
    need = sync.per_layer_needed_s(10.0 + 1.038, 10.0, [8, 7], 128, 8, 4)
    assert need == pytest.approx(1.038 / (8 * (128 + 7 / 4)))
    assert sync.fit_per_layer_s([3e-3, 5e-3]) == pytest.approx(4e-3) and sync.fit_per_layer_s([]) == 0.0


def test_fit_half_alternates_in_id_order():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_public_runs.py"
    spec = importlib.util.spec_from_file_location("bench_public_runs", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [{"id": i, "reference_only": i == "r"} for i in ("d", "a", "c", "r", "b")]
    assert bench.fit_half(rows) == (["a", "c"], ["b", "d"])


def test_mechanism_split_on_a_synthetic_pipeline():
    from tessera_lab.dynamic.durations import StageCosts
    from tessera_lab.dynamic.mechanisms import mechanism_split, required_for, routing_variance

    costs = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=2, ep=8, num_experts=64, top_k=8, tokens=8 * 512)
    r = mechanism_split(costs, "uniform", schedule="1f1b", microbatches=8)
    g = r["gain"]
    # uniform routing: the prediction is exact, so the oracle decides the same; parts add up by definition
    assert g["total"] == pytest.approx(g["oracle_total"], abs=1e-12)
    assert g["interaction"] == pytest.approx(g["total"] - g["w_only"] - g["rs_only"], abs=1e-15)
    assert g["total"] >= -1e-12 and r["busiest_load_mean"] == pytest.approx(1.0)
    # W per rank: 4 stages x 1 s x 8 micro-batches / 4 ranks = 8 s
    assert r["w_per_rank_ms"] == pytest.approx(8000.0)
    # 641 ms at +3.4%: the step is 0.641 / (1 - 1 / 1.034) = 19.49 s
    need = required_for(641, 0.034, r)
    assert need["paper_step_s"] == pytest.approx(0.641 / (1 - 1 / 1.034))
    assert need["needed_idle_removed_ms"] == pytest.approx(1e3 * r["iteration_static_s"] * (1 - 1 / 1.034))
    v = routing_variance(costs, "uniform", microbatches=4, steps=2)
    assert v["busiest"][0]["max"] == pytest.approx(1.0) and v["hot_overlap"] <= 1.0
