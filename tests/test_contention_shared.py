"""Overlap rates from shared resources (cost.contention.shared_rates), worked out by hand."""

import math

import pytest

from tessera_lab.cost.contention import Demand, shared_rates
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.errors import ConfigError

# an NVLink all-to-all: 420 us, 70 us of HBM traffic at the effective bandwidth (share 1/6), 10 us of host, 32/128 SMs
A2A = Demand(420e-6, hbm=70e-6, host=10e-6, sm_share=0.25)


def test_gemm_loses_the_sms_communication_holds():
    gemm = Demand(300e-6, math=300e-6, hbm=40e-6, host=10e-6)  # HBM 0.133 + 0.167 < 1, host 0.033 + 0.024 < 1
    rc, rm = shared_rates(gemm, A2A)
    assert rc == pytest.approx(300 / 400)  # 300 us of math on 3/4 of the SMs
    assert rm == 1.0


def test_memory_kernel_and_communication_share_hbm():
    norm = Demand(100e-6, hbm=100e-6, host=10e-6)  # HBM share 1 + 1/6
    rc, rm = shared_rates(norm, A2A)
    assert rc == pytest.approx(6 / 7)
    assert rm == pytest.approx(6 / 7)


def test_host_bound_task_loses_only_host_time():
    experts = Demand(1280e-6, math=610e-6, hbm=200e-6, host=1280e-6)  # GPU 610 x 4/3 = 813 us < 1280 us of host
    rc, rm = shared_rates(experts, A2A)
    psi = 1 + 10 / 420
    assert rc == pytest.approx(1 / psi)
    assert rm == pytest.approx(1 / psi)


def test_pair_makespan_integrates_the_pair_rates():
    # a 300 us GEMM beside a 420 us all-to-all: the GEMM runs at 3/4 until it ends at 400 us; the all-to-all runs at
    # full rate throughout and ends at 420 us
    order = ["g", "c"]
    res = pair_makespan(order, {"g": 300e-6, "c": 420e-6}, {"g": "compute", "c": "comm"}, {},
                        demands={"g": Demand(300e-6, math=300e-6, hbm=40e-6, host=10e-6), "c": A2A})
    assert res.spans["g"][1] == pytest.approx(400e-6)
    assert res.makespan == pytest.approx(420e-6)


def test_demand_rejects_out_of_range():
    with pytest.raises(ConfigError, match="sm_share"):
        Demand(1.0, sm_share=1.0)
    with pytest.raises(ConfigError, match="negative"):
        Demand(-1.0)
    assert math.isclose(Demand(0.0).share(1.0), 0.0)


def test_cost_model_demands_match_task_times():
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import ParallelConfig, cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.model.tasks import layer_tasks

    par = ParallelConfig()
    cm = CostModel(cluster_for(par), par)
    lt = layer_tasks(load_model("qwen3-next-80b-a3b"), 0, par)
    for t in lt.F + lt.B + lt.W:
        d = cm.demand(t)
        assert d.time == pytest.approx(cm.task_time(t))
        if t.is_comm and d.time > 0:
            # ep 8 inside a node on NCCL: 32 of 132 SMs; 2 HBM bytes per link byte at 0.8 x 450 GB/s over 0.896 x 4.8 TB/s
            assert d.sm_share == pytest.approx(32 / 132)
            assert d.share(d.hbm) == pytest.approx(2 * 450e9 * 0.8 / (4.8e12 * 0.896), rel=0.05)
    assert CostModel(cluster_for(par), par, contention=cm.contention).demands({}) is None
