"""What bounds a stage's tasks (tessera_lab.cost.bounds) and the `bound:` line of `tessera-lab plan`."""

from __future__ import annotations

import pytest

from tessera_lab.cost.analytic import CostModel
from tessera_lab.cost.bounds import compute_bound, knob_hint, layers_bounds, task_kind
from tessera_lab.model.hardware import ParallelConfig, cluster_for
from tessera_lab.model.tasks import decompose


def _expert_task(model, parallel, phase="F"):
    lt = [lt for lt in decompose(model, parallel) if lt.layer == 0][0]
    return [t for t in getattr(lt, phase) if t.op == "grouped_gemm"][0]


def test_default_expert_gemms_are_host_issue_bound(qwen3_next):
    """Hand count: ep 8 leaves 512 / 8 = 64 local experts; multistream launches one GEMM per expert and per
    shape (gate/up and down: 2) at 10 us of host time each = 1.28 ms per forward, above the GPU time."""
    p = ParallelConfig()
    cm = CostModel(cluster_for(p, "H200"), p)
    task = _expert_task(qwen3_next, p)
    assert task_kind(task) == "expert GEMMs"
    assert cm.host_time(task) == pytest.approx(64 * 2 * 10e-6)
    assert cm.host_time(task) > cm.gpu_time(task)
    assert compute_bound(cm, task) == "host issue"


def test_one_grouped_kernel_makes_the_expert_gemms_compute_bound(qwen3_next):
    p = ParallelConfig(grouped_gemm="grouped")
    cm = CostModel(cluster_for(p, "H200"), p)
    task = _expert_task(qwen3_next, p)
    assert cm.host_time(task) < cm.gpu_time(task)
    terms = cm.gpu_terms(task)
    assert terms["compute"] > terms["hbm"]  # large GEMMs: FLOPs over bytes
    assert compute_bound(cm, task) == "compute"


def test_gpu_terms_sum_to_gpu_time(qwen3_next):
    p = ParallelConfig()
    cm = CostModel(cluster_for(p, "H200"), p)
    for lt in decompose(qwen3_next, p)[:3]:
        for t in lt.F + lt.B + lt.W:
            if not t.is_comm:
                g = cm.gpu_terms(t)
                assert cm.gpu_time(t) == pytest.approx(g["launch"] + max(g["compute"], g["hbm"]) + g["cast"])


def test_stage_bounds_sum_to_the_standalone_task_times(qwen3_next):
    p = ParallelConfig()
    cluster = cluster_for(p, "H200")
    kinds = layers_bounds(qwen3_next, p, cluster, range(7, 14))
    cm = CostModel(cluster, p)
    total = sum(cm.task_time(t) for lt in decompose(qwen3_next, p) if 7 <= lt.layer <= 13
                for t in lt.F + lt.B + lt.W)
    assert sum(k.time_s for k in kinds) == pytest.approx(total)
    assert all(sum(k.by_bound.values()) == pytest.approx(k.time_s) for k in kinds)
    by = {k.kind: k for k in kinds}
    assert by["expert GEMMs"].bound == "host issue" and by["EP all-to-all"].bound == "link bandwidth"
    assert "host-issue bound" in knob_hint(kinds)


def test_plan_names_the_bound_of_the_bottleneck_stage_expert_gemms(capsys):
    from tessera_lab.cli.main import main

    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if ln.startswith("bound: stage")][0]
    assert "expert GEMMs" in line and "host issue" in line
    assert any("host-issue bound" in ln and "--grouped-gemm grouped" in ln for ln in out.splitlines())
