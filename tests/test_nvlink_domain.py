"""The NVLink domain is a property of the GPU (8 GPUs on a DGX/HGX node, 72 on a GB200 NVL72 rack): an EP group of
64 sits inside one domain on GB200 and spans eight nodes on H200, and its all-to-all time follows the link, worked
out here from the alpha-beta formula and the cited figures of data/hardware."""

from __future__ import annotations

import pytest

from tessera_lab.cost.analytic import CostModel
from tessera_lab.model.hardware import GPUSpec, ParallelConfig, cluster_for, cost_assumptions, hardware_data
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import decompose


def _ep_dispatch(parallel):
    m = load_model("qwen3-next-80b-a3b")
    moe = next(lt for lt in decompose(m, parallel) if any(t.is_comm and t.collective.group == "ep" for t in lt.F))
    return next(t.collective for t in moe.F if t.is_comm and t.collective.group == "ep"
                and t.collective.kind == "all_to_all")


def test_domain_sizes_from_data():
    assert GPUSpec.named("GB200").nvlink_domain == 72
    assert GPUSpec.named("H200").nvlink_domain == hardware_data()["node"]["gpus_per_node"] == 8


@pytest.mark.parametrize("gpu, nodes, link", [("GB200", 1, "NVLink"), ("H200", 8, "InfiniBand")])
def test_ep64_placement_and_all_to_all_time(gpu, nodes, link):
    p = ParallelConfig(pp=1, ep=64, dp=1, microbatches=8)
    cl = cluster_for(p, gpu)
    assert cl.num_nodes == nodes
    ranks = p.ep_link_ranks()
    assert cl.link_for(ranks).name == link
    coll = _ep_dispatch(p)
    a = cost_assumptions()
    eff = a["nccl_bus_efficiency"]
    g = hardware_data()["gpus"][gpu]
    if gpu == "GB200":  # one domain: every byte but the local 1/64 over NVLink at half the bidirectional figure
        want = a["alpha_intra_node_s"] + coll.bytes * 63 / 64 / (g["nvlink_gb_per_s_bidir"] * 1e9 / 2 * eff)
    else:  # 8 per node: 56/64 of the bytes leave the node over one 50 GB/s NIC per GPU, 7/64 stay on NVLink
        ib = hardware_data()["node"]["inter_node"]["gb_per_s_per_direction"] * 1e9
        nv = g["nvlink_gb_per_s_bidir"] * 1e9 / 2
        eff_ib = a["nccl_bus_efficiency_inter_node"]  # NCCL's share of a NIC's line rate (0.94), NVLink's 0.8
        want = a["alpha_inter_node_s"] + max(coll.bytes * 56 / 64 / (ib * eff_ib), coll.bytes * 7 / 64 / (nv * eff))
    assert CostModel(cl, p).collective_time(coll) == pytest.approx(want, rel=1e-12)


def test_gb200_all_to_all_is_faster_than_h200_across_nodes():
    p = ParallelConfig(pp=1, ep=64, dp=1, microbatches=8)
    coll = _ep_dispatch(p)
    t_gb = CostModel(cluster_for(p, "GB200"), p).collective_time(coll)
    t_h = CostModel(cluster_for(p, "H200"), p).collective_time(coll)
    assert t_h > 10 * t_gb  # 50 GB/s NIC against 900 GB/s NVLink per direction
