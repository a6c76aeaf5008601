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


def test_bound_line_terms_add_up_to_the_stage_time_with_the_host_sync_term(capsys):
    """Under 1f1b the host/sync term is not hidden: the bound line lists it (per MoE layer, with its source) and its
    terms sum to the slowest stage's time of the table (within the 0.1 ms rounding of each term)."""
    import re

    from tessera_lab.cli.main import main

    assert main(["plan", "--schedule", "1f1b", "--host-sync-ms", "3"]) == 0
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if ln.startswith("bound: stage")][0]
    slowest = float(re.search(r"^ilp\s.*?(\d+\.\d+)\s+yes$", out, re.M).group(1))  # table: slowest stage (ms)
    names = "expert GEMMs|EP all-to-all|dense GEMMs|elementwise|attention core|linear-attention core|TP all-reduce|" \
            "other communication|host/sync|smaller kinds"
    terms = dict(re.findall(rf"(?:: |; )({names}) (\d+\.\d) ms", line))
    assert "host/sync" in terms, line
    assert sum(float(v) for v in terms.values()) == pytest.approx(slowest, abs=0.05 * len(terms) + 0.01)
    stage = int(re.search(r"bound: stage (\d+)", line).group(1))
    row = re.search(rf"^\s+{stage}\s+(\d+)-(\d+) ", out.split("[ilp (chosen)]")[1], re.M)
    n_layers = int(row.group(2)) - int(row.group(1)) + 1  # every layer of qwen3-next-80b-a3b is MoE
    assert f"host/sync {n_layers * 3.0:.1f} ms: {n_layers} MoE layers x 3.00 ms per forward (set by --host-sync-ms" \
        in line, line


def test_fsdp_traffic_named_in_bound_line(capsys):
    """Megatron FSDP's gathers and reduce-scatters run on streams of their own: the bound line reports them as
    their own kind and says why the kinds' sum exceeds the stage's standalone time; when they outweigh the compute
    kinds the hint names the knobs that move them, and following it (larger micro-batches, the same tokens)
    shortens the simulated iteration."""
    import re

    from tessera_lab.cli.main import main
    from tessera_lab.cost.bounds import OWN_STREAM_KIND

    def run(*extra):
        assert main(["plan", "--dp", "4", "--fsdp", *extra]) == 0
        out = capsys.readouterr().out
        return out, float(re.search(r"^ilp\s+(\d+\.\d+)", out, re.M).group(1))

    out, t1 = run()
    line = [ln for ln in out.splitlines() if ln.startswith("bound: stage")][0]
    sums = re.search(r"sum (\d+\.\d) ms, the stage's standalone F\+B\+W (\d+\.\d) ms", line)
    assert float(sums.group(1)) > float(sums.group(2))
    assert f"{OWN_STREAM_KIND} run beside the other kinds" in line
    assert "other communication" not in line  # the FSDP traffic is not lumped with other collectives
    hint = [ln for ln in out.splitlines() if ln.startswith("bound: ") and not ln.startswith("bound: stage")][0]
    assert hint.startswith(f"bound: {OWN_STREAM_KIND} take") and "--micro-batch-size" in hint
    _, t4 = run("--micro-batch-size", "4", "-m", "8")  # 32 sequences per replica either way
    assert t4 < t1


def test_fsdp_hint_offers_fewer_micro_batches_only_where_there_are_several():
    """With one micro-batch, fewer micro-batches are no option: the FSDP hint then names the distributed optimizer
    alone (hand-made kinds: 30 ms of FSDP traffic against 20 ms of compute)."""
    from tessera_lab.cost.bounds import OWN_STREAM_KIND, KindBound, knob_hint

    kinds = [KindBound(OWN_STREAM_KIND, 0.030, {"link bandwidth": 0.030}),
             KindBound("expert GEMMs", 0.020, {"compute": 0.020}, host_s=0.005, gpu_s=0.020)]
    assert "--micro-batch-size" in knob_hint(kinds, 8) and "--micro-batch-size" in knob_hint(kinds)
    one = knob_hint(kinds, 1)
    assert "--micro-batch-size" not in one and "the distributed optimizer (no --fsdp)" in one


def test_knob_hint_names_the_kernel_count_knob_of_the_kind():
    """A host-issue-bound kind gets the knob that cuts its kernel count: the grouped expert GEMM for expert GEMMs
    only; elementwise kernels get fusion, fewer layers or larger micro-batches (hand-built kinds)."""
    from tessera_lab.cost.bounds import KindBound, knob_hint

    def kind(name):
        return KindBound(name, 1e-3, {"host issue": 1e-3}, host_s=1e-3, gpu_s=4e-4)

    assert "--grouped-gemm grouped" in knob_hint([kind("expert GEMMs")])
    hint = knob_hint([kind("elementwise")])
    assert "grouped" not in hint and "--micro-batch-size" in hint and hint.startswith("elementwise are host-issue")
