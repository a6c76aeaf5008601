"""The per-MoE-layer host/sync term (cost/sync.py) and the dynamic mechanism split (dynamic/mechanisms.py), by hand."""

from __future__ import annotations

import pytest

from tessera_lab.cost import sync
from tessera_lab.errors import ConfigError


def test_sync_term_by_hand():
    # c for every schedule (a paired forward hides it through the pair's makespan, not through this value)
    from tessera_lab.model.hardware import ParallelConfig

    base = ParallelConfig(ep=8, schedule="1f1b", dispatcher="alltoall", host_sync_s=4e-3)
    for sched in ("1f1b", "overlapped", "interleaved-overlapped"):
        assert sync.planner_per_layer_s(base.replace(schedule=sched)) == 4e-3
    # host waits per MoE layer and micro-batch, read from Megatron-Core's code paths (cost/sync.py): the dispatcher's
    # wait, again where the MoE block is recomputed; GPT-OSS's clamped GLU activation waits at every call, again where
    # the activation is recomputed (moe_act is in Megatron's default selective set)
    from types import SimpleNamespace

    gpt_oss, qwen = SimpleNamespace(model_type="gpt_oss"), SimpleNamespace(model_type="qwen3_moe")
    cases = [("none", (), 1, 2), ("selective", (), 1, 3), ("selective", ("moe_act",), 1, 3),
             ("selective", ("layernorm",), 1, 2), ("selective", ("moe",), 2, 4), ("full", (), 2, 4)]
    for rc, mods, want_qwen, want_oss in cases:
        par = base.replace(recompute=rc, recompute_modules=mods)
        assert sync.host_waits_per_layer(par, qwen) == want_qwen, (rc, mods)
        assert sync.host_waits_per_layer(par, gpt_oss) == want_oss, (rc, mods)
        assert sync.host_waits_per_layer(par) == want_qwen  # no model: the dispatcher's waits only
        assert sync.planner_per_layer_s(par, model=gpt_oss) == pytest.approx(4e-3 * want_oss)
    # iteration_sync_s: every forward carries it (1F1B / interleaved: m + (pp - 1) / vpp stage slots)
    assert sync.iteration_sync_s([48], 64, 1, 1, 4e-3) == pytest.approx(48 * 64 * 4e-3)
    # pp 8, vpp 4, m 128, busiest rank 8 MoE layers: 8 x 1 ms x (128 + 7 / 4) = 1.038 s
    assert sync.iteration_sync_s([8, 7, 8, 8], 128, 8, 4, 1e-3) == pytest.approx(8e-3 * (128 + 7 / 4))
    # per_layer_needed_s inverts iteration_sync_s
    need = sync.per_layer_needed_s(10.0 + 1.038, 10.0, [8, 7], 128, 8, 4)
    assert need == pytest.approx(1.038 / (8 * (128 + 7 / 4)))
    # the fit is the median (an odd count: the middle value; even: the mean of the two middle ones), 0 without runs
    assert sync.fit_per_layer_s([3e-3, 20e-3, 5e-3]) == pytest.approx(5e-3)
    assert sync.fit_per_layer_s([3e-3, 5e-3, 4e-3, 30e-3]) == pytest.approx(4.5e-3) and sync.fit_per_layer_s([]) == 0.0


def test_split_rule_by_hand():
    # the split is a pure function of the id (SHA-256 parity), never of an error; ModelZoo runs are always test
    import hashlib

    from tessera_lab.report.fidelity_set import split_for_run

    # hand values: sha256("a") ends in ...bb (odd): fit; sha256("b") ends in ...9d (odd): fit
    assert hashlib.sha256(b"a").hexdigest().endswith("bb") and hashlib.sha256(b"b").hexdigest().endswith("9d")
    assert split_for_run({"id": "a", "source_family": "megatron-bridge"}) == "fit"
    assert split_for_run({"id": "b", "source_family": "megatron-bridge"}) == "fit"
    for rid in ("c", "d", "qwen3-30b-a3b/16xH100/fp8/ep16"):
        even = int(hashlib.sha256(rid.encode()).hexdigest()[-1], 16) % 2 == 0
        assert split_for_run({"id": rid, "source_family": "megatron-bridge"}) == ("test" if even else "fit")
    assert split_for_run({"id": "a", "source_family": "megatron-moe-modelzoo"}) == "test"
    assert split_for_run({"id": "a", "source_family": "megatron-bridge", "reference_only": True}) == "reference"


def test_a_runs_file_whose_split_was_edited_is_refused(tmp_path):
    import json

    import pytest

    from tessera_lab.errors import ConfigError
    from tessera_lab.report.fidelity_set import load_runs

    run = {"id": "a", "source": "x", "source_family": "megatron-bridge", "split": "test", "model": "m", "gpu": "H100",
           "gpus": 8, "precision": "bf16", "gbs": 8, "mbs": 1, "seq_len": 4096, "tp": 1, "pp": 1, "ep": 8,
           "dispatcher": "alltoall", "recompute": "none", "step_time_s": 1.0}
    p = tmp_path / "runs.json"
    p.write_text(json.dumps({"runs": [run]}))
    with pytest.raises(ConfigError, match="field 'split' = 'test' disagrees with the split rule"):
        load_runs([p])
    p.write_text(json.dumps({"runs": [dict(run, split="fit")]}))
    assert load_runs([p])[0][0]["id"] == "a"


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


def test_memory_limit_bounds_by_hand():
    from tessera_lab.dynamic.durations import StageCosts
    from tessera_lab.dynamic.mechanisms import memory_limit

    costs = StageCosts.synthetic(4, 1.0, 2.0, 1.0, layers_per_stage=2, ep=8, num_experts=64, top_k=8, tokens=8 * 512)
    r = memory_limit(costs, "uniform", schedule="1f1b", microbatches=8, extra=(0, 2, 8))
    # 1F1B, 4 stages, 8 micro-batches, F 1 s, B 2 s = I 1 s + W 1 s (W right after I, local to its rank): the
    # bottleneck rank runs 8 x (F + I + W) = 24 s, plus the fill and drain chain of (4 - 1) x (F + I) = 6 s: T = 30 s;
    # with W free: 8 x 2 + 6 = 22 s, so no W order can gain more than 30 / 22 - 1 = 36.4%
    assert r["iteration_static_s"] == pytest.approx(30.0)
    assert r["w_free_gain"] == pytest.approx(30 / 22 - 1)
    assert r["bottleneck_w_per_microbatch_ms"] == pytest.approx(1000.0)
    gains = [r["by_extra"][k]["total"] for k in (0, 2, 8)]
    assert all(-1e-12 <= g <= r["w_free_gain"] + 1e-12 for g in gains)
    assert gains[0] <= gains[1] + 1e-12 <= gains[2] + 2e-12  # more activation memory never moves less W here


def test_w_fillable_gaps_by_hand():
    """Rank 0: F0 [0,1], I0 [1,2], idle [2,4], F1 [4,5], W0 [5,6.5], I1 [6.5,7.5], idle [7.5,8], W1 [8,9]. The
    first gap (2 s) may take W0 (its I ended at 2, it runs after 4): 1.5 s; the second (0.5 s) W1 (I1 ended at 7.5):
    0.5 s. Rank 1: F0 [1,2], W0 [2.5,3] with its I after the gap: nothing fills [2,2.5]. The idle before a rank's
    first action is not a gap."""
    from types import SimpleNamespace

    from tessera_lab.dynamic.mechanisms import w_fillable_gaps
    from tessera_lab.pipeline.timeline import Event

    def ev(rank, stage, mb, typ, a, b):
        return Event(rank, stage, mb, typ, a, b, "compute", f"{stage}{typ}{mb}")

    events = [ev(0, 0, 0, "F", 0, 1), ev(0, 0, 0, "I", 1, 2), ev(0, 0, 1, "F", 4, 5), ev(0, 0, 0, "W", 5, 6.5),
              ev(0, 0, 1, "I", 6.5, 7.5), ev(0, 0, 1, "W", 8, 9),
              ev(1, 1, 0, "F", 1, 2), ev(1, 1, 0, "W", 2.5, 3), ev(1, 1, 0, "I", 3, 3.5),
              Event(0, -1, None, "pp_p2p", 2, 3, "comm", "x")]
    r = w_fillable_gaps(SimpleNamespace(events=events))
    assert r["per_rank_gap_s"] == pytest.approx([2.5, 0.5])
    assert r["per_rank_fillable_s"] == pytest.approx([2.0, 0.0])
    assert r["gap_ms"] == pytest.approx(1500.0) and r["fillable_ms"] == pytest.approx(1000.0)
