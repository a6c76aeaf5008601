"""Cost-model realism: shape-aware GEMM efficiency, kernel-class contention, dispatchers, busiest-rank
load, recompute and memory. Every expected value is worked by hand in the comment beside it (or brute-forced)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cost.analytic import CostModel, deepep_link_shares
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.cost.contention import (
    COMM, COMPUTE, MEMORY, Contention, InflationSample, fit_kernel_contention, hbm_share, kernel_class,
    kernel_contention, sm_slowdown,
)
from tessera_lab.cost.gemm import gemm_efficiency, phase_shape
from tessera_lab.cost.memory import GIB, bytes_per_param, memory_capacity
from tessera_lab.errors import ConfigError
from tessera_lab.model.ep_traffic import (
    busiest_rank_load, copies_per_token, destinations_from_routing, expected_destinations,
)
from tessera_lab.model.hardware import Cluster, GPUSpec, ParallelConfig, cluster_for, cost_assumptions
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import Collective, Task, layer_tasks

A = cost_assumptions()


# ---------------------------------------------------------------------- GEMM efficiency by shape
def test_bf16_anchor_reproduces_the_measured_square_gemm():
    # 8192^3: K factor 8192/(8192+365) = 0.95735, tiles exact, 4096 tiles on 132 SMs -> 32 waves: 4096/4224
    # = 0.969697; 0.855 * 0.95735 * 0.969697 = 0.79373 (the 0.794 measured on an H200)
    eff = gemm_efficiency(8192, 8192, 8192, params=A)
    assert eff == pytest.approx(0.855 * 8192 / 8557 * 4096 / 4224, rel=1e-12)
    assert eff == pytest.approx(0.794, abs=1e-3)


def test_fp8_curve_matches_deepgemm_rows_within_3_percent():
    # DeepGEMM README (H800, FP8 peak 1979): (M, N, K) -> TFLOP/s
    rows = [((4096, 7168, 16384), 1358), ((4096, 32768, 512), 590), ((4096, 4096, 7168), 1304),
            ((4096, 2112, 7168), 1058)]
    for (m, n, k), tflops in rows:
        pred = gemm_efficiency(m, k, n, precision="fp8", params=A) * 1979
        assert pred == pytest.approx(tflops, rel=0.03)
    # grouped contiguous layout: 4 groups x 8192 rows, N 4096, K 7168 -> 1297 TFLOP/s
    assert gemm_efficiency(8192, 7168, 4096, groups=4, precision="fp8", params=A) * 1979 == pytest.approx(1297, rel=0.03)


def test_tile_quantization_and_short_k():
    # 644 rows per expert fill 6 tiles of 128 (768 rows): 644/768 of the 640-row efficiency's tile factor (1.0);
    # same N, K and tile count (5 vs 6 tiles of M changes waves: 5*8=40 and 6*8=48 tiles, both one wave of 132)
    e640 = gemm_efficiency(640, 2048, 1024, params=A)
    e644 = gemm_efficiency(644, 2048, 1024, params=A)
    assert e640 == pytest.approx(0.855 * 2048 / 2413 * 40 / 132, rel=1e-12)
    assert e644 == pytest.approx(0.855 * 2048 / 2413 * (644 / 768) * 48 / 132, rel=1e-12)
    # K = 512 (an expert down-projection) against K = 4096 at the same M, N: k/(k+365) halves it
    assert gemm_efficiency(4096, 512, 4096, params=A) / gemm_efficiency(4096, 4096, 4096, params=A) == pytest.approx(
        (512 / 877) / (4096 / 4461), rel=1e-12)


def test_phase_shapes():
    assert phase_shape((10, 20, 30), "F") == (10, 20, 30)
    assert phase_shape((10, 20, 30), "B") == (10, 30, 20)   # dX = dY W^T: K = n
    assert phase_shape((10, 20, 30), "W") == (20, 10, 30)   # dW = X^T dY: K = m (the tokens)
    with pytest.raises(ConfigError):
        phase_shape((1, 2, 3), "X")
    with pytest.raises(ConfigError):
        gemm_efficiency(1, 1, 1, precision="fp4", params=A)


def test_compute_time_of_a_gemm_task_by_hand():
    p = ParallelConfig(pp=1, ep=1)
    cm = CostModel(cluster_for(p, "H200"), p)
    m, k, n = 4096, 2048, 1024
    t = Task("x", 0, "F", "gemm", 2.0 * m * k * n, 2.0 * (m * k + k * n + m * n), gemms=((m, k, n),))
    # eff = 0.855 * 2048/2413 * (256 tiles -> 2 waves: 256/264); t = 4 us + max(flops/(989e12 eff), bytes/(4.8e12*0.896))
    eff = 0.855 * 2048 / 2413 * 256 / 264
    expect = 4e-6 + max(2.0 * m * k * n / (989e12 * eff), 2.0 * (m * k + k * n + m * n) / (4.8e12 * 0.896))
    assert cm.compute_time(t) == pytest.approx(expect, rel=1e-12)
    # FP8: the FP8 peak and curve, plus 6 bytes per element of input and weight for the casts (F); one micro-batch
    # (m = 1): the weight is cast in this micro-batch (TE caches it for the step's later micro-batches)
    p8 = p.replace(precision="fp8", microbatches=1)
    cm8 = CostModel(cluster_for(p8, "H200"), p8)
    eff8 = 0.74 * 2048 / 2778 * 256 / 264
    expect8 = 4e-6 + max(2.0 * m * k * n / (1979e12 * eff8), 2.0 * (m * k + k * n + m * n) / (4.8e12 * 0.896)) \
        + 6.0 * (m * k + k * n) / (4.8e12 * 0.896)
    assert cm8.gpu_time(t) == pytest.approx(expect8, rel=1e-12)
    # eager host issue: 1 GEMM + 3 quantize kernels (amax, scale, cast) for each of input and weight = 7 kernels
    # x 10 us = 70 us > the 35 us GPU time: this FP8 GEMM is host-bound, the bf16 one (1 kernel, 10 us) is not
    assert cm8.host_time(t) == pytest.approx(7 * 10e-6, rel=1e-12)
    # m = 32 micro-batches share one weight cast: 6 x k n / 32 cast bytes and 1 + 3 + 3/32 kernels per micro-batch
    p32 = p.replace(precision="fp8", microbatches=32)
    cm32 = CostModel(cluster_for(p32, "H200"), p32)
    expect32 = expect8 - 6.0 * k * n * (1 - 1 / 32) / (4.8e12 * 0.896)
    assert cm32.gpu_time(t) == pytest.approx(expect32, rel=1e-12)
    assert cm32.host_time(t) == pytest.approx((1 + 3 + 3 / 32) * 10e-6, rel=1e-12)
    assert cm8.compute_time(t) == pytest.approx(max(expect8, 70e-6), rel=1e-12) == 70e-6
    assert cm.compute_time(t) == pytest.approx(max(expect, 10e-6), rel=1e-12) == pytest.approx(expect)


def test_sequential_expert_gemms_pay_one_launch_per_expert():
    p = ParallelConfig(pp=1, ep=8, expert_load=1.0, grouped_gemm="grouped")
    lt = layer_tasks(load_model("qwen3-next-80b-a3b"), 0, p)
    experts = next(t for t in lt.F if t.name == "experts")
    grouped = CostModel(cluster_for(p), p).compute_time(experts)
    seq_p = p.replace(grouped_gemm="sequential")
    sequential = CostModel(cluster_for(seq_p), seq_p).compute_time(experts)
    assert sequential > grouped   # 64 local experts x 2 GEMMs launches, and waves per expert
    assert experts.groups == 64 and experts.gemms[0] == (640.0, 2048, 1024.0)  # 4096*10/64 tokens per expert


def test_multistream_counts_waves_over_four_experts_at_once():
    # (256, 2048, 1024) per expert, 8 experts, 132 SMs: 2 x 8 = 16 output tiles an expert; K factor and tile
    # quantization (exact 128 multiples) are common, so only the wave factor differs:
    # grouped 128 tiles -> 128/132; multistream 4 experts at once, 64 tiles -> 64/132; sequential 16 -> 16/132
    eff = {impl: gemm_efficiency(256, 2048, 1024, groups=8, impl=impl, params=A)
           for impl in ("grouped", "multistream", "sequential")}
    base = A["gemm_peak_efficiency_bf16"] * 2048 / (2048 + A["gemm_k_half_bf16"])
    assert eff["grouped"] == pytest.approx(base * 128 / 132, rel=1e-12)
    assert eff["multistream"] == pytest.approx(base * 64 / 132, rel=1e-12)
    assert eff["sequential"] == pytest.approx(base * 16 / 132, rel=1e-12)
    # two experts fit the four streams: same waves as one grouped kernel
    assert gemm_efficiency(256, 2048, 1024, groups=2, impl="multistream", params=A) == pytest.approx(
        gemm_efficiency(256, 2048, 1024, groups=2, impl="grouped", params=A), rel=1e-12)
    # one launch per expert and GEMM, as sequential: 64 experts x 2 GEMMs x kernel_launch_s more than grouped
    p = ParallelConfig(pp=1, ep=8, expert_load=1.0)
    experts = next(t for t in layer_tasks(load_model("qwen3-next-80b-a3b"), 0, p).F if t.name == "experts")
    ms = p.replace(grouped_gemm="multistream")
    cm = CostModel(cluster_for(ms), ms)
    t_flops = experts.flops / (cm.cluster.gpu.peak_flops * cm.gemm_efficiency(experts))
    t_bytes = experts.bytes / (cm.cluster.gpu.hbm_bytes_per_s * A["hbm_efficiency"])
    assert cm.gpu_time(experts) == pytest.approx(A["kernel_launch_s"] * 128 + max(t_flops, t_bytes), rel=1e-12)


def test_expert_swiglu_is_its_own_memory_bound_kernel():
    # Qwen3-Next, ep 8, balanced: 4096 tokens x top-10 = 40960 copies; SwiGLU reads 2 x 512 and writes 512 bf16
    # values per copy: 2 * 40960 * 512 * 3 bytes; the shared expert's (width 512) on the 4096 tokens; combine waits
    m = load_model("qwen3-next-80b-a3b")
    p = ParallelConfig(ep=8, expert_load=1.0)
    f = {t.name: t for t in layer_tasks(m, 0, p).F}
    assert f["expert_act"].op == "elementwise" and f["expert_act"].bytes == 2 * 40960 * m.moe.moe_intermediate_size * 3
    assert f["shared_act"].bytes == 2 * 4096 * m.moe.shared_expert_intermediate_size * 3
    assert f["combine"].deps == ("expert_act",) and f["expert_act"].saved_bytes == 0
    assert kernel_class(f["expert_act"].op) == MEMORY


# ---------------------------------------------------------------------- contention by kernel class
def test_sm_and_hbm_shares_by_hand():
    assert sm_slowdown(24, 132) == pytest.approx(132 / 108 - 1)       # DeepEP: 0.2222
    assert sm_slowdown(32, 132) == pytest.approx(0.32)                # NCCL on NVLink: 132/100 - 1
    assert hbm_share(360e9, 4.8e12 * 0.896) == pytest.approx(720 / 4300.8)  # 0.1674
    with pytest.raises(ConfigError):
        sm_slowdown(132, 132)


def test_class_contention_of_the_default_plan():
    p = ParallelConfig()  # ep=8 in one node, alltoall (NCCL): 32 SMs; NVLink 450 GB/s x 0.8 = 360 GB/s
    c = CostModel(cluster_for(p), p).contention
    assert c.compute == pytest.approx(0.32) and c.memory == pytest.approx(720 / 4300.8)
    assert c.comm_beside_memory == c.memory and c.comm == pytest.approx(0.05)
    d = ParallelConfig(dispatcher="deepep")
    assert CostModel(cluster_for(d), d).contention.compute == pytest.approx(132 / 108 - 1)
    # EP across nodes: NCCL's 16 SMs and the IB link's HBM share (50 GB/s x 0.94, NCCL's share of a NIC, x 2 / 4300.8)
    x = ParallelConfig(pp=1, ep=16)
    cx = CostModel(cluster_for(x), x).contention
    assert cx.compute == pytest.approx(132 / 116 - 1) and cx.memory == pytest.approx(94 / 4300.8)


def test_kernel_classes():
    assert kernel_class("grouped_gemm") == COMPUTE and kernel_class("attention") == COMPUTE
    assert kernel_class("elementwise") == MEMORY and kernel_class("linear_attention") == MEMORY
    assert kernel_class("all_to_all", True) == COMM


def test_two_lane_rates_by_class():
    order, lanes, deps = ["a", "c"], {"a": "compute", "c": "comm"}, {}
    dur = {"a": 1.0, "c": 1.0}
    cont = Contention(compute=0.5, comm=0.0, memory=0.25, comm_beside_memory=0.25)
    # memory-bound partner: both at 1/1.25 = 0.8 -> both end at 1.25
    r = pair_makespan(order, dur, lanes, deps, contention=cont, classes={"a": MEMORY, "c": COMM})
    assert r.spans["a"][1] == pytest.approx(1.25) and r.spans["c"][1] == pytest.approx(1.25)
    # compute-bound partner: a at 2/3, c at 1 -> c ends at 1, a has 1/3 left alone -> 4/3
    r = pair_makespan(order, dur, lanes, deps, contention=cont, classes={"a": COMPUTE, "c": COMM})
    assert r.spans["c"][1] == pytest.approx(1.0) and r.makespan == pytest.approx(4 / 3)
    # without classes: every compute-lane task counts as compute (the two-constant model)
    assert pair_makespan(order, dur, lanes, deps, contention=cont).makespan == pytest.approx(4 / 3)


def test_fit_kernel_contention_from_inflations():
    samples = [InflationSample(COMPUTE, x) for x in (1.2, 1.25, 1.3)] + [
        InflationSample(MEMORY, 1.1, overlap=0.5),            # (1.1 - 1) / 0.5 = 0.2
        InflationSample(COMM, 1.04, partner=COMPUTE), InflationSample(COMM, 1.2, partner=MEMORY),
        InflationSample(MEMORY, 3.0, overlap=0.1),             # below half overlapped: ignored
    ]
    c = fit_kernel_contention(samples)
    assert c.compute == pytest.approx(0.25) and c.memory == pytest.approx(0.2)
    assert c.comm == pytest.approx(0.04) and c.comm_beside_memory == pytest.approx(0.2)
    prior = Contention(0.1, 0.02, 0.3, 0.3)
    assert fit_kernel_contention([], prior=prior) == prior
    with pytest.raises(ConfigError):
        fit_kernel_contention([InflationSample("gpu", 1.0)])


_graphs = st.lists(st.tuples(st.sampled_from(["compute", "comm"]), st.floats(0.0, 2.0),
                             st.sampled_from([COMPUTE, MEMORY])), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(tasks=_graphs, c1=st.tuples(*[st.floats(0, 1)] * 4), extra=st.tuples(*[st.floats(0, 1)] * 4),
       chain=st.booleans())
def test_more_contention_never_makes_a_pair_faster(tasks, c1, extra, chain):
    order = [f"t{i}" for i in range(len(tasks))]
    lanes = {k: t[0] for k, t in zip(order, tasks)}
    dur = {k: t[1] for k, t in zip(order, tasks)}
    classes = {k: (COMM if t[0] == "comm" else t[2]) for k, t in zip(order, tasks)}
    deps = {k: (order[i - 1],) for i, k in enumerate(order) if chain and i % 2 and i > 0}
    lo = Contention(*c1)
    hi = Contention(*(a + b for a, b in zip(c1, extra)))
    t_lo = pair_makespan(order, dur, lanes, deps, contention=lo, classes=classes).makespan
    t_hi = pair_makespan(order, dur, lanes, deps, contention=hi, classes=classes).makespan
    assert t_hi >= t_lo * (1 - 1e-9) - 1e-12


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]),
       size=st.sampled_from([2, 4, 8, 16, 32]), b1=st.floats(0, 1e9), extra=st.floats(0, 1e9),
       deepep=st.booleans())
def test_more_bytes_never_make_a_collective_faster(kind, size, b1, extra, deepep):
    p = ParallelConfig(pp=1, ep=size, dispatcher="deepep" if deepep else "alltoall")
    cm = CostModel(cluster_for(p), p)
    route = (4096.0, 256, 8, p.dispatcher) if kind == "all_to_all" else None
    t1 = cm.collective_time(Collective(kind, b1, "ep", size, route))
    t2 = cm.collective_time(Collective(kind, b1 + extra, "ep", size, route))
    assert t2 >= t1


# ---------------------------------------------------------------------- dispatchers and busiest-rank load
def test_expected_destinations_by_formula_and_brute_force():
    # 4 experts, top-2, 2 ranks of 2: of the 6 pairs, 2 stay on one rank (D = 1), 4 split (D = 2): 10/6
    assert expected_destinations(4, 2, 2) == pytest.approx(10 / 6)
    pairs = list(itertools.combinations(range(4), 2))
    assert destinations_from_routing(pairs, 2) == pytest.approx(10 / 6)
    # Qwen3-Next: 512 experts, top-10, ep 8: miss = prod_{i<10} (448 - i)/(512 - i)
    miss = math.prod((448 - i) / (512 - i) for i in range(10))
    assert expected_destinations(512, 10, 8) == pytest.approx(8 * (1 - miss))
    assert copies_per_token("deepep", 512, 10, 8) / copies_per_token("alltoall", 512, 10, 8) == pytest.approx(0.592, abs=1e-3)
    assert expected_destinations(512, 10, 1) == 1.0
    with pytest.raises(ConfigError):
        expected_destinations(512, 10, 7)


def test_deepep_dispatch_bytes_and_link_shares():
    m = load_model("qwen3-next-80b-a3b")
    p = ParallelConfig(ep=8, dispatcher="deepep", expert_load=1.0)
    f = {t.name: t for t in layer_tasks(m, 0, p).F}
    assert f["dispatch"].collective.bytes == pytest.approx(2 * 4096 * expected_destinations(512, 10, 8) * 2048)
    # 256 experts, top-8, 32 ranks on 4 nodes: inter share D_node*(3/4)/D_rank, intra share 7/8
    inter, intra = deepep_link_shares((4096, 256, 8, "deepep"), 32, 4)
    d_rank = 32 * (1 - math.prod((248 - i) / (256 - i) for i in range(8)))
    d_node = 4 * (1 - math.prod((192 - i) / (256 - i) for i in range(8)))
    assert inter == pytest.approx(d_node * 0.75 / d_rank) and intra == pytest.approx(7 / 8)
    assert inter < 0.75  # less than the alltoall dispatcher's share crossing nodes


def test_contiguous_ep_placement_spans_fewer_nodes_by_hand():
    # DeepSeek-V3 on H100 as Megatron places it: TP 2, EP 64, DeepEP. Our grid strides EP by tp (ranks 0, 2, ..,
    # 126: 16 nodes, 4 a node); Megatron-Core's expert grid (ETP 1) puts EP on ranks 0..63 (8 nodes, 8 a node).
    grid = ParallelConfig(pp=1, tp=2, ep=64, dp=1, dispatcher="deepep")
    contig = grid.replace(ep_placement="contiguous")
    assert grid.ep_link_ranks() == list(range(0, 128, 2)) and contig.ep_link_ranks() == list(range(64))
    cl = Cluster.dgx("H100", 16)
    routing = (2048, 256, 8, "deepep", 8, 4)  # 8 groups, 4 of them a token (at most 4 nodes)
    coll = Collective("all_to_all", 1e8, "ep", 64, routing)
    # group-limited: experts of 4 of 8 groups = 128 experts on 32 ranks (D_rank), on 4 of the 8 nodes (D_node)
    d_rank = 32 * (1 - math.comb(124, 8) / math.comb(128, 8))
    d_node8 = 4 * (1 - math.comb(96, 8) / math.comb(128, 8))
    d_node16 = 8 * (1 - math.comb(112, 8) / math.comb(128, 8))
    eff, eff_ib = A["nccl_bus_efficiency"], A["nccl_bus_efficiency_inter_node"]  # NVLink, a NIC
    inter, intra = cl.inter_link(), cl.intra_link()
    want_c = inter.latency_s + max(1e8 * d_node8 * 7 / 8 / d_rank / (inter.bytes_per_s * eff_ib),
                                   1e8 * 7 / 8 / (intra.bytes_per_s * eff))
    want_g = inter.latency_s + max(1e8 * d_node16 * 15 / 16 / d_rank / (inter.bytes_per_s * eff_ib),
                                   1e8 * 3 / 4 / (intra.bytes_per_s * eff))
    assert CostModel(cl, contig).collective_time(coll) == pytest.approx(want_c, rel=1e-12)
    assert CostModel(cl, grid).collective_time(coll) == pytest.approx(want_g, rel=1e-12)
    assert want_c < want_g
    with pytest.raises(ConfigError):
        ParallelConfig(ep_placement="strided")


def test_busiest_rank_load_formula_and_simulation():
    # N/ep = 40960, sigma = sqrt(327680 * 1/8 * 7/8) = 189.31, z(8) = Phi^-1(7.625/8.25)
    from statistics import NormalDist

    z = NormalDist().inv_cdf(7.625 / 8.25)
    assert busiest_rank_load(4096, 10, 8) == pytest.approx(1 + math.sqrt(35840) * z / 40960)
    # against a multinomial simulation (balanced random router), 400 micro-batches
    rng = np.random.default_rng(0)
    draws = rng.multinomial(8 * 4096 * 10, [1 / 8] * 8, size=400).max(axis=1) / 40960
    assert busiest_rank_load(4096, 10, 8) == pytest.approx(draws.mean(), rel=2e-3)
    assert busiest_rank_load(4096, 10, 1) == 1.0


def test_default_plan_uses_the_busiest_rank_load():
    m = load_model("qwen3-next-80b-a3b")
    f = {t.name: t for t in layer_tasks(m, 0, ParallelConfig()).F}
    f1 = {t.name: t for t in layer_tasks(m, 0, ParallelConfig(expert_load=1.0)).F}
    assert f["experts"].flops / f1["experts"].flops == pytest.approx(busiest_rank_load(4096, 10, 8))
    with pytest.raises(ConfigError):
        ParallelConfig(expert_load=0.9)


# ---------------------------------------------------------------------- memory
def test_capacity_in_gib_as_the_device_reports_it():
    h200 = GPUSpec.named("H200")
    assert h200.memory_bytes == 143771 * 2**20            # 140.40 GiB, not 141e9 bytes = 131.3 GiB
    assert memory_capacity(Cluster.dgx("H200")) / GIB == pytest.approx(143771 / 1024 - 6)
    assert GPUSpec.named("H100").memory_bytes / GIB == pytest.approx(81559 / 1024)
    assert GPUSpec.named("H100").peak_for("fp8") == 1979e12
    with pytest.raises(ConfigError):
        GPUSpec.named("H100").peak_for("fp4")


def test_bytes_per_param_and_gradient_sync_agree():
    # distributed optimizer, dp 4: bf16 weight 2 + fp32 grad 4 + 12/4 = 9; bf16 grad: 2 + 2 + 3 = 7
    p = ParallelConfig()
    assert bytes_per_param(p, 4) == 9.0
    assert bytes_per_param(p.replace(grad_reduce_dtype="bf16"), 4) == 7.0
    assert bytes_per_param(p.replace(distributed_optimizer=False), 4) == 18.0
    assert bytes_per_param(p.replace(distributed_optimizer=False, grad_reduce_dtype="bf16"), 4) == 16.0
    # sync: reduce-scatter of grads + all-gather of bf16 params = (4 + 2)/2 all-reduce bytes; all-reduce of grads
    assert p.grad_sync_bytes_per_param == 3.0
    assert p.replace(grad_reduce_dtype="bf16").grad_sync_bytes_per_param == 2.0
    assert p.replace(distributed_optimizer=False).grad_sync_bytes_per_param == 4.0


def test_recompute_saved_bytes_by_hand():
    m = load_model("qwen3-30b-a3b")  # h 2048, 32 heads, 4 kv heads, head_dim 128, 128 experts top-8, width 768
    base = ParallelConfig(pp=1, ep=8, expert_load=1.0)
    none = {t.name: t for t in layer_tasks(m, 0, base).F}
    sel = {t.name: t for t in layer_tasks(m, 0, base.replace(recompute="selective")).F}
    full = layer_tasks(m, 0, base.replace(recompute="full"))
    T, dt = 4096, 2
    # attention core keeps q, k, v: 2 * 4096 * (32 + 2 * 4) * 128 instead of q, k, v and the fp32 lse (its output o
    # is o_proj's saved input, one storage, counted with o_proj)
    assert sel["core"].saved_bytes == dt * T * 40 * 128
    assert none["core"].saved_bytes == dt * T * (32 * 128 + 2 * 4 * 128) + 4 * T * 32
    # routed experts keep their input only: 2 * (4096 * 8) * 2048
    assert sel["experts"].saved_bytes == dt * T * 8 * 2048
    # without recompute also the SwiGLU input (2 x 768), fc2's input (768) and the fp32 routing probability (4 B)
    assert none["experts"].saved_bytes == T * 8 * (dt * (2048 + 3 * 768) + 4)
    # full: only the layer input (input_norm's 2 * 4096 * 2048) is kept; every B re-runs its F
    assert sum(t.saved_bytes for t in full.F) == dt * T * 2048
    fb = {t.name: t for t in full.B}
    ff = {t.name: t for t in full.F}
    assert fb["experts"].flops == 2 * ff["experts"].flops and fb["core"].flops == 3 * ff["core"].flops
    assert fb["dispatch"].collective.bytes == 2 * ff["dispatch"].collective.bytes
    # selective: the recomputed expert forward is added to its B; other B tasks unchanged
    sb = {t.name: t for t in layer_tasks(m, 0, base.replace(recompute="selective")).B}
    assert sb["experts"].flops == 2 * sel["experts"].flops and sb["o_proj"].flops == sel["o_proj"].flops


def test_gated_deltanet_saves_flash_linear_attention_activations():
    m = load_model("qwen3-next-80b-a3b")  # 16 key heads x 128, 32 value heads x 128
    f = {t.name: t for t in layer_tasks(m, 0, ParallelConfig(expert_load=1.0)).F}
    T, kd, vd, nvh = 4096, 16 * 128, 32 * 128, 32
    # q, k, v, gate, beta in bf16 plus one fp32 C x C-per-chunk WY matrix (C = 64 per token and value head)
    assert f["core"].saved_bytes == 2 * T * (2 * kd + vd + 2 * nvh) + 4 * T * nvh * 64


def test_bad_choices_are_one_clear_error():
    for field, bad in (("dispatcher", "nccl"), ("recompute", "some"), ("precision", "fp4"),
                       ("grad_reduce_dtype", "fp16"), ("grouped_gemm", "loop")):
        with pytest.raises(ConfigError, match=field):
            ParallelConfig(**{field: bad})


def test_fit_gemm_curve_recovers_known_parameters():
    # samples generated from E = 0.8, K0 = 500 must give back exactly those (a measured profile's path)
    truth = {"gemm_peak_efficiency_bf16": 0.8, "gemm_k_half_bf16": 500.0}
    shapes = [(4096, 512, 4096, 1), (4096, 2048, 1024, 1), (640, 2048, 1024, 64), (8192, 8192, 8192, 1)]
    samples = [(m, k, n, g, gemm_efficiency(m, k, n, groups=g, params=truth)) for m, k, n, g in shapes]
    from tessera_lab.cost.gemm import fit_gemm_curve

    fit = fit_gemm_curve(samples)
    assert fit["gemm_k_half_bf16"] == 500.0 and fit["gemm_peak_efficiency_bf16"] == pytest.approx(0.8, rel=1e-9)
    with pytest.raises(ConfigError):
        fit_gemm_curve([])


def test_model_flops_convention_matches_the_published_pages():
    # Megatron-Bridge reports Model TFLOP/s and tokens/s per GPU: their ratio is model FLOPs per token.
    # Qwen3-30B-A3B (26.06, H100): 203e12 / 8826 = 23.00 GFLOP per token; Qwen3-235B-A22B: 253e12 / 1712 = 147.8
    from tessera_lab.model.tasks import model_flops_per_iteration

    for name, tflops, tokens in (("qwen3-30b-a3b", 203, 8826), ("qwen3-235b-a22b", 253, 1712)):
        p = ParallelConfig(pp=1, ep=1, microbatches=1)
        per_token = model_flops_per_iteration(load_model(name), p) / p.tokens_per_iteration
        assert per_token == pytest.approx(tflops * 1e12 / tokens, rel=5e-3)


def test_group_limited_routing_limits_destinations():
    from tessera_lab.model.ep_traffic import limited_destinations

    # DeepSeek-V3: 256 experts in 8 groups, top-8 from 4 groups; on 64 ranks a token's experts lie in 128
    # experts on 32 ranks: expected_destinations(128, 8, 32) = 32 (1 - C(124, 8)/C(128, 8))
    d = limited_destinations(256, 8, 64, 8, 4)
    assert d == pytest.approx(32 * (1 - math.prod((124 - i) / (128 - i) for i in range(8))))
    # nodes = groups: at most 4 of 8 nodes, 4 (1 - C(96, 8)/C(128, 8)) = 3.62
    assert limited_destinations(256, 8, 8, 8, 4) == pytest.approx(4 * (1 - math.prod((96 - i) / (128 - i) for i in range(8))))
    # no limit when the groups do not fall on whole ranks, or none is configured
    assert limited_destinations(256, 8, 4, 8, 4) == expected_destinations(256, 8, 4)
    assert limited_destinations(256, 8, 64) == expected_destinations(256, 8, 64)
    assert load_model("deepseek-v3").moe.n_group == 8 and load_model("deepseek-v3").moe.topk_group == 4


def test_fused_cross_entropy_keeps_bf16_logits():
    from tessera_lab.model.tasks import head_tasks

    m = load_model("qwen3-30b-a3b")
    p = ParallelConfig(pp=1, ep=8)
    unfused = {t.name: t for t in head_tasks(m, p).F}["loss"].saved_bytes
    fused = {t.name: t for t in head_tasks(m, p.replace(fused_cross_entropy=True)).F}["loss"].saved_bytes
    assert unfused == 4.0 * 4096 * 151936 and fused == 2.0 * 4096 * 151936   # fp32 log-softmax vs bf16 logits
