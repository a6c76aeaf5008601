"""Host issue time (tessera_lab/cost/host.py): kernel counts and the eager-launch bound, worked by hand."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cost.analytic import CostModel
from tessera_lab.cost.host import host_issue_time, task_kernels
from tessera_lab.model.hardware import ParallelConfig, cluster_for, cost_assumptions
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import Collective, Task, layer_tasks

A = cost_assumptions()


def _kernels(task, precision="bf16", impl="multistream", m=1):
    return task_kernels(task, precision=precision, grouped_impl=impl, params=A, microbatches=m)


def test_cited_counts():
    assert A["host_s_per_kernel"] == 10e-6
    assert A["fp8_quantize_kernels"] == 3  # nvte_compute_amax, nvte_compute_scale_from_amax, nvte_quantize
    assert (A["attention_kernels_fwd"], A["attention_kernels_bwd"]) == (1, 3)
    assert (A["linear_attention_kernels_fwd"], A["linear_attention_kernels_bwd"]) == (6, 7)


def test_gemm_kernels_by_phase_and_precision():
    f = Task("g", 0, "F", "gemm", 1.0, 1.0, gemms=((64, 64, 64),))
    # bf16: one cuBLAS launch in every phase
    assert [_kernels(f.__class__(**{**f.__dict__, "phase": ph})) for ph in "FBW"] == [1, 1, 1]
    # fp8 current scaling: F quantizes input and weight (1 + 2 x 3 = 7), B the output gradient (1 + 3 = 4), W none
    assert [_kernels(f.__class__(**{**f.__dict__, "phase": ph}), "fp8") for ph in "FBW"] == [7, 4, 1]


def test_expert_kernels_of_qwen3_30b_on_ep16_by_hand():
    # Qwen3-30B-A3B, EP 16: 128 / 16 = 8 local experts, 2 GEMM shapes (gate+up, down) each
    m = load_model("qwen3-30b-a3b")
    p = ParallelConfig(pp=1, ep=16, dp=1, precision="fp8", expert_load=1.0, grouped_gemm="multistream")
    lt = layer_tasks(m, 0, p)
    ex = {ph: next(t for t in lt.phase(ph) if t.name == "experts") for ph in "FBW"}
    assert ex["F"].groups == 8 and len(ex["F"].gemms) == 2
    # multistream: 8 x 2 launches; F 16 x 7 = 112, B 16 x 4 = 64, W 16 x 1 = 16
    assert [_kernels(ex[ph], "fp8") for ph in "FBW"] == [112, 64, 16]
    # one grouped kernel per shape instead: 2 x 7, 2 x 4, 2
    assert [_kernels(ex[ph], "fp8", "grouped") for ph in "FBW"] == [14, 8, 2]
    assert host_issue_time(ex["F"], precision="fp8", grouped_impl="multistream", params=A) == pytest.approx(112e-5)
    # with TE's FP8 weight cache (is_first_microbatch) over m = 32 micro-batches (the ParallelConfig default):
    # per launch 1 GEMM + 3 input + 3/32 weight = 4.09375; 16 launches = 65.5 kernels = 0.655 ms of issue
    assert p.microbatches == 32
    host = 16 * (1 + 3 + 3 / 32) * 10e-6
    assert host == pytest.approx(655e-6)
    cm = CostModel(cluster_for(p, "H100"), p)
    assert cm.host_time(ex["F"]) == pytest.approx(host, rel=1e-12)
    # the cost model takes max(GPU, host): the F expert task is still host-bound here
    assert cm.compute_time(ex["F"]) == pytest.approx(max(cm.gpu_time(ex["F"]), host), rel=1e-12)
    assert cm.gpu_time(ex["F"]) < host
    assert cm.host_excess(ex["F"]) == pytest.approx(host - cm.gpu_time(ex["F"]), rel=1e-12)
    # B and W have no weight cast: the same counts whatever m
    assert [_kernels(ex[ph], "fp8", m=32) for ph in "BW"] == [64, 16]


def test_fp8_weight_quantize_counted_once_per_step_by_hand():
    # one GEMM launch, m = 4 micro-batches: F = 1 + 3 (input) + 3/4 (weight, cast on the first micro-batch only,
    # amortised) = 4.75 kernels per micro-batch; over the step 4 x 4.75 = 19 = 4 GEMMs + 4 input casts x 3 + 1 weight
    # cast x 3 (= 4 + 12 + 3)
    f = Task("g", 0, "F", "gemm", 1.0, 1.0, gemms=((64, 64, 64),))
    assert _kernels(f, "fp8", m=4) == pytest.approx(4.75)
    assert 4 * _kernels(f, "fp8", m=4) == pytest.approx(4 + 4 * 3 + 3)
    assert _kernels(f, "fp8", m=1) == 7  # one micro-batch: nothing to reuse
    # Qwen3-30B-A3B on EP 16, grouped expert GEMMs (2 launches): 2 x 4.75 = 9.5 at m = 4
    m = load_model("qwen3-30b-a3b")
    p = ParallelConfig(pp=1, ep=16, dp=1, precision="fp8", expert_load=1.0, grouped_gemm="grouped", microbatches=4)
    ex = next(t for t in layer_tasks(m, 0, p).phase("F") if t.name == "experts")
    assert _kernels(ex, "fp8", "grouped", m=4) == pytest.approx(9.5)
    assert CostModel(cluster_for(p, "H100"), p).host_time(ex) == pytest.approx(9.5 * 10e-6, rel=1e-12)
    # the weight's HBM cast bytes are amortised alike: F bytes = per x (m k + k n / 4) x groups
    cm = CostModel(cluster_for(p, "H100"), p)
    per = cm.a["fp8_cast_bytes_per_element"]
    want = per * sum((a * b + b * c / 4) * ex.groups for a, b, c in ex.gemms)
    assert cm.fp8_cast_bytes(ex) == pytest.approx(want, rel=1e-12)
    with pytest.raises(Exception, match="microbatches"):
        _kernels(f, "fp8", m=0)


@settings(deadline=None, max_examples=40)
@given(m=st.integers(1, 512), launches=st.integers(1, 16))
def test_weight_cast_once_per_step_whatever_m(m, launches):
    # summed over the step's m micro-batches: m x (1 GEMM + 3 input) + 3 (one weight cast) per launch
    f = Task("g", 0, "F", "gemm", 1.0, 1.0, gemms=((64, 64, 64),) * launches)
    assert m * _kernels(f, "fp8", m=m) == pytest.approx(launches * (4 * m + 3))


def test_other_tasks_count_one_kernel_and_cores_their_cited_counts():
    norm = Task("n", 0, "F", "elementwise", 0.0, 100.0)
    assert _kernels(norm) == 1
    assert _kernels(Task("n", 0, "F", "elementwise")) == 0  # no work, no launch
    router = Task("router", 0, "F", "router", 1.0, 1.0, gemms=((8, 8, 8),))
    assert _kernels(router, "fp8") == 2  # gate GEMM (not FP8-quantized) + fused top-k/score kernel
    assert _kernels(Task("c", 0, "F", "attention", 1.0, 1.0)) == 1
    assert _kernels(Task("c", 0, "B", "attention", 1.0, 1.0)) == 3
    assert _kernels(Task("c", 0, "F", "linear_attention", 1.0, 1.0)) == 6
    assert _kernels(Task("c", 0, "B", "linear_attention", 1.0, 1.0)) == 7
    a2a = Task("d", 0, "F", "all_to_all", collective=Collective("all_to_all", 1e6, "ep", 8))
    assert _kernels(a2a) == 1
    assert _kernels(Task("d", 0, "F", "all_to_all", collective=Collective("all_to_all", 1e6, "ep", 1))) == 0


def test_communication_time_has_no_host_bound():
    p = ParallelConfig(pp=1, ep=8)
    cm = CostModel(cluster_for(p), p)
    a2a = Task("d", 0, "F", "all_to_all", collective=Collective("all_to_all", 1.0, "ep", 8))
    assert cm.host_excess(a2a) == 0.0
    assert cm.task_time(a2a) == cm.collective_time(a2a.collective)


@settings(deadline=None, max_examples=40)
@given(host=st.floats(0, 1e-4), more=st.floats(0, 1e-4), phase=st.sampled_from("FBW"),
       precision=st.sampled_from(["bf16", "fp8"]), impl=st.sampled_from(["grouped", "multistream", "sequential"]))
def test_more_host_time_per_kernel_never_makes_a_task_faster(host, more, phase, precision, impl):
    m = load_model("qwen3-30b-a3b")
    p = ParallelConfig(pp=1, ep=8, dp=1, precision=precision, grouped_gemm=impl, expert_load=1.0)
    lt = layer_tasks(m, 0, p)
    cl = cluster_for(p, "H100")
    lo = CostModel(cl, p, assumptions={"host_s_per_kernel": host})
    hi = CostModel(cl, p, assumptions={"host_s_per_kernel": host + more})
    for t in lt.phase(phase):
        assert hi.task_time(t) >= lo.task_time(t)
        assert lo.task_time(t) >= lo.gpu_time(t) if not t.is_comm else True
    assert hi.phase_cost(lt.phase(phase)).time >= lo.phase_cost(lt.phase(phase)).time - 1e-15
