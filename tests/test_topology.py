"""Topology: group links, weak links and mixed GPUs in the partitioner, admission."""

from __future__ import annotations

import pytest

from tessera_lab.cost.analytic import CostModel
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, ParallelConfig
from tessera_lab.model.tasks import Collective
from tessera_lab.report.topology import (
    Allocation,
    admission,
    group_link,
    links_table,
    migration_bytes,
    partition_with_factors,
    placement,
)


def test_ep_group_of_8_uses_nvlink_and_of_16_crosses_nodes():
    p8 = ParallelConfig(pp=2, ep=8)
    g8 = group_link(p8, None, "ep")
    assert g8.link == "NVLink" and not g8.crosses_nodes and g8.nodes == (0,)
    p16 = ParallelConfig(pp=2, ep=16)
    g16 = group_link(p16, None, "ep")
    assert g16.link == "InfiniBand" and g16.crosses_nodes and g16.nodes == (0, 1)
    assert g16.bytes_per_s < g8.bytes_per_s
    # the cost model agrees: the same all-to-all per rank is slower across nodes
    coll8 = Collective("all_to_all", 64e6, "ep", 8)
    coll16 = Collective("all_to_all", 64e6, "ep", 16)
    t8 = CostModel(Cluster.dgx("H200", 2), p8).collective_time(coll8)
    t16 = CostModel(Cluster.dgx("H200", 4), p16).collective_time(coll16)
    assert t16 > 3 * t8
    # pipeline stages on different nodes talk over the inter-node link
    assert group_link(p8, None, "pp").link == "InfiniBand"


def test_weak_link_factor_halves_inter_node_bandwidth():
    p = ParallelConfig(pp=2, ep=16)
    healthy = group_link(p, Cluster.dgx("H200", 4), "ep")
    weak = group_link(p, Cluster(Cluster.dgx("H200", 4).gpu, 4, weak_link_factor=0.5), "ep")
    assert weak.bytes_per_s == pytest.approx(healthy.bytes_per_s / 2)


def test_placement_and_links_table():
    p = ParallelConfig(pp=2, ep=8, tp=2)
    df = placement(p)
    assert len(df) == 32 and set(df["node"]) == {0, 1, 2, 3}
    assert df.loc[df["rank"] == 9, "node"].item() == 1
    t = links_table(p)
    assert dict(zip(t["group"], t["link"]))["tp"] == "NVLink"
    assert dict(zip(t["group"], t["link"]))["ep"] == "InfiniBand"  # ep x tp = 16 ranks span 2 nodes
    with pytest.raises(ConfigError):
        group_link(p, None, "xx")
    with pytest.raises(ConfigError, match="world_size"):
        group_link(p, Cluster.dgx("H200", 1), "ep")


@pytest.fixture(scope="module")
def small(qwen3_next):
    return qwen3_next.with_changes(num_layers=16)


def test_slow_stage_gets_fewer_layers(small):
    par = ParallelConfig(pp=4, microbatches=8, seq_len=1024)
    fp = partition_with_factors(small, par, speed_factors=[1.0, 1.6, 1.0, 1.0], method="dp")
    aware = [fp.boundaries_aware[s + 1] - fp.boundaries_aware[s] for s in range(4)]
    unaware = [fp.boundaries_unaware[s + 1] - fp.boundaries_unaware[s] for s in range(4)]
    assert aware[1] < unaware[1]
    assert fp.iteration_aware_s < fp.iteration_unaware_s
    assert fp.migration_bytes > 0
    assert len(fp.table()) == 4


def test_mixed_gpus_and_weak_link_feed_the_cost_model(small):
    par = ParallelConfig(pp=2, ep=16, microbatches=4, seq_len=1024, grouped_gemm="grouped")
    base = partition_with_factors(small, par, method="dp")
    assert base.iteration_aware_s == pytest.approx(base.iteration_unaware_s)
    weak = partition_with_factors(small, par, link_factors=[1.0, 0.25], method="dp")
    assert weak.stage_times_unaware[1] > base.stage_times_unaware[1]  # EP all-to-all crosses nodes on stage 1
    assert weak.stage_times_unaware[0] == pytest.approx(base.stage_times_unaware[0])
    # without the host/sync term, whose waits a faster GPU does not shorten (cost/sync.py)
    mixed = partition_with_factors(small, par.replace(ep=8, host_sync_s=0.0), stage_gpus=["H200", "B200"],
                                   method="dp")
    aware = [mixed.boundaries_aware[s + 1] - mixed.boundaries_aware[s] for s in range(2)]
    unaware = [mixed.boundaries_unaware[s + 1] - mixed.boundaries_unaware[s] for s in range(2)]
    assert aware[1] > unaware[1]  # the faster B200 stage takes more layers
    assert mixed.stage_times_aware[1] < mixed.stage_times_unaware[0]
    assert mixed.iteration_aware_s <= mixed.iteration_unaware_s * (1 + 1e-12)
    with pytest.raises(ConfigError, match="stage_gpus"):
        partition_with_factors(small, par, stage_gpus=["H200"])
    with pytest.raises(ConfigError, match="link_factors"):
        partition_with_factors(small, par, link_factors=[1.0, 0.0])


def test_migration_bytes_counts_moved_layers():
    class SM:
        memory = [type("M", (), {"param_bytes": b})() for b in [0, 10, 20, 30, 40, 0]]  # emb, 4 layers, head

    assert migration_bytes(SM, [0, 2, 4], [0, 2, 4]) == 0
    # layer 1 (20 bytes) moves stage 0 -> 1
    assert migration_bytes(SM, [0, 2, 4], [0, 1, 4]) == 20
    # layers 2, 3 (30 + 40) move stage 1 -> 0
    assert migration_bytes(SM, [0, 2, 4], [0, 4, 4]) == 70


def test_admission_ranks_by_completion_time():
    cands = [
        Allocation("now, 512 GPUs", 0.0, 1.0e6),
        Allocation("in 1 h, 1024 GPUs", 3600.0, 2.0e6),
        Allocation("in 10 h, 4096 GPUs", 36000.0, 8.0e6),
    ]
    rows = admission(cands, remaining_tokens=1.0e10)
    # completion: 10000 s; 3600 + 5000 = 8600 s; 36000 + 1250 s
    assert [r["name"] for r in rows] == ["in 1 h, 1024 GPUs", "now, 512 GPUs", "in 10 h, 4096 GPUs"]
    assert rows[0]["completion_s"] == pytest.approx(8600.0)
    assert rows[0]["rank"] == 1
    short = admission(cands, remaining_tokens=1.0e9)  # little work left: start now
    assert short[0]["name"] == "now, 512 GPUs"
    with pytest.raises(ConfigError):
        admission([], 1.0)
    with pytest.raises(ConfigError):
        admission([Allocation("x", 0.0, 0.0)], 1.0)
