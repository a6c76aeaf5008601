"""Analytic cost model: roofline, alpha-beta collectives, placement and the two-lane executor."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from tessera_lab.cost.analytic import Contention, CostModel
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, GPUSpec, ParallelConfig, cost_assumptions
from tessera_lab.model.tasks import Collective, Task


def test_gpu_specs_from_datasheet():
    h200 = GPUSpec.named("H200")
    assert h200.peak_flops == 989e12
    assert h200.nvlink_bytes_per_s == 450e9  # 900 GB/s bidirectional, halved per direction
    assert GPUSpec.named("h100").name == "H100-SXM"
    with pytest.raises(ConfigError, match="gpu"):
        GPUSpec.named("A100")


def test_roofline_compute_bound_and_memory_bound():
    a = cost_assumptions()
    cm = CostModel(Cluster.dgx("H200", 1), ParallelConfig(pp=1, ep=8))
    big = Task("g", 0, "F", "gemm", flops=2 * 8192**3, bytes=3 * 8192**2 * 2)
    expected = a["kernel_launch_s"] + 2 * 8192**3 / (989e12 * a["gemm_efficiency"])
    assert cm.task_time(big) == pytest.approx(expected, rel=1e-12)
    copy = Task("c", 0, "F", "elementwise", flops=0, bytes=4.8e9)
    assert cm.task_time(copy) == pytest.approx(a["kernel_launch_s"] + 4.8e9 / (4.8e12 * a["hbm_efficiency"]), rel=1e-12)


def test_alpha_beta_all_to_all_inside_node():
    a = cost_assumptions()
    cm = CostModel(Cluster.dgx("H200", 1), ParallelConfig(pp=1, ep=8))
    S = 100e6
    t = cm.collective_time(Collective("all_to_all", S, "ep", 8))
    # nccl-tests: time = S * (n-1)/n / busbw, NVLink 450 GB/s per direction
    assert t == pytest.approx(a["alpha_intra_node_s"] + S * 7 / 8 / (450e9 * a["nccl_bus_efficiency"]), rel=1e-12)


def test_ep8_in_node_uses_nvlink_ep16_crosses_nodes():
    p8 = ParallelConfig(pp=2, ep=8)
    cl = Cluster.dgx("H200", 4)
    assert {cl.node_of(r) for r in p8.group_ranks("ep")} == {0}
    assert cl.link_for(p8.group_ranks("ep")).name == "NVLink"
    p16 = ParallelConfig(pp=2, ep=16)
    assert cl.link_for(p16.group_ranks("ep")).name == "InfiniBand"
    a = cost_assumptions()
    S = 100e6
    t16 = CostModel(cl, p16).collective_time(Collective("all_to_all", S, "ep", 16))
    # 8 of the 16 peers are off-node: S*8/16 over 50 GB/s InfiniBand dominates S*7/16 over NVLink
    # (each link at its own NCCL efficiency: 0.94 of a NIC, 0.8 of NVLink)
    assert t16 == pytest.approx(a["alpha_inter_node_s"] + S * 8 / 16 / (50e9 * a["nccl_bus_efficiency_inter_node"]),
                                rel=1e-12)


@pytest.mark.parametrize("tp, dp, per_node", [(8, 4, 1), (2, 16, 4), (1, 32, 8)])
def test_data_parallel_collective_across_nodes_uses_each_ranks_nic(tp, dp, per_node):
    # 4 DGX H100 nodes; the dense data-parallel group holds `per_node` ranks of each node (Megatron's order puts TP
    # innermost: ranks tp apart). Each GPU has its own 50 GB/s NIC, so the ring's inter-node bytes leave a node over
    # per_node NICs at once (NVIDIA/nccl #812: 8 NICs of 25 GB/s give 192 GB/s all-reduce bus bandwidth on DGX-A100),
    # capped by NVLink's 450 GB/s per direction (nccl #412): 50, 200, 400 GB/s of line rate. Each link at its own
    # NCCL efficiency (0.94 of a NIC, nccl-tests #290; 0.8 of NVLink): 47, 188 and min(376, 360) = 360 GB/s.
    a = cost_assumptions()
    cm = CostModel(Cluster.dgx("H100", 4), ParallelConfig(pp=1, ep=1, tp=tp, dp=dp))
    assert len(cm.group_link_ranks("edp")) == dp
    S = 1e9
    bus = min({1: 50e9, 4: 200e9, 8: 400e9}[per_node] * a["nccl_bus_efficiency_inter_node"],
              450e9 * a["nccl_bus_efficiency"])
    assert bus == pytest.approx({1: 47e9, 4: 188e9, 8: 360e9}[per_node])
    for kind, factor in (("all_gather", (dp - 1) / dp), ("reduce_scatter", (dp - 1) / dp),
                         ("all_reduce", 2 * (dp - 1) / dp)):
        t = cm.collective_time(Collective(kind, S, "edp", dp))
        assert t == pytest.approx(a["alpha_inter_node_s"] + S * factor / bus, rel=1e-12)


def test_spanning_bus_bandwidth_is_capped_by_nvlink():
    from tessera_lab.cost.analytic import spanning_bus_bytes_per_s

    # a GB200 NVL72 rack's 72 ranks would have 72 x 50 GB/s of NICs; NVLink's 900 GB/s per direction caps the ring
    assert spanning_bus_bytes_per_s(72, 50e9, 900e9) == 900e9
    assert spanning_bus_bytes_per_s(3, 50e9, 900e9) == 150e9
    assert spanning_bus_bytes_per_s(1, 50e9, 450e9) == 50e9


def test_all_reduce_bus_factor_and_noop():
    a = cost_assumptions()
    cm = CostModel(Cluster.dgx("H100", 1), ParallelConfig(pp=1, ep=1, tp=4))
    S = 64e6
    t = cm.collective_time(Collective("all_reduce", S, "tp", 4))
    assert t == pytest.approx(a["alpha_intra_node_s"] + S * 2 * 3 / 4 / (450e9 * a["nccl_bus_efficiency"]), rel=1e-12)
    assert cm.collective_time(Collective("all_reduce", S, "tp", 1)) == 0.0
    assert cm.collective_time(Collective("all_to_all", 0.0, "ep", 8)) == 0.0


def test_two_lane_hand_example():
    # compute A (2) -> comm C (3) -> compute D (1); compute E (2) independent of C
    order = ["A", "C", "E", "D"]
    dur = {"A": 2, "C": 3, "E": 2, "D": 1}
    lanes = {"A": "compute", "C": "comm", "E": "compute", "D": "compute"}
    deps = {"C": ["A"], "D": ["C"]}
    r = pair_makespan(order, dur, lanes, deps)
    assert r.makespan == pytest.approx(6.0)  # A 0-2, C 2-5 with E 2-4 beside it, D 5-6
    # with contention 1.0 on both lanes, C and E run at half speed while together:
    # 2..6 both run (E finishes 2 units of work at t=6, C has done 2 of 3), C alone 6..7, D 7..8
    r2 = pair_makespan(order, dur, lanes, deps, contention=Contention(1.0, 1.0))
    assert r2.makespan == pytest.approx(8.0)
    assert r.comm_hidden_fraction() == pytest.approx(2 / 3)


def test_two_lane_bad_order():
    with pytest.raises(ConfigError, match="cannot complete"):
        pair_makespan(["B", "A"], {"A": 1, "B": 1}, {"A": "compute", "B": "compute"}, {"B": ["A"]})


@given(st.lists(st.tuples(st.floats(0, 5), st.booleans()), min_size=1, max_size=8))
def test_two_lane_bounds(tasks):
    """Makespan lies between the busiest lane's work and the serial sum (no contention, chain-free)."""
    order = [f"t{i}" for i in range(len(tasks))]
    dur = {k: d for k, (d, _) in zip(order, tasks)}
    lanes = {k: "comm" if c else "compute" for k, (_, c) in zip(order, tasks)}
    r = pair_makespan(order, dur, lanes, {})
    comp = sum(d for k, d in dur.items() if lanes[k] == "compute")
    comm = sum(d for k, d in dur.items() if lanes[k] == "comm")
    assert max(comp, comm) - 1e-9 <= r.makespan <= comp + comm + 1e-9
    assert r.makespan == pytest.approx(max(comp, comm))  # independent tasks: lanes run fully in parallel
