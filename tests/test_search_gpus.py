"""GPU counts the search accepts: multiples of the 8-GPU node on every system, so on GB200 (NVLink domain of 72) a
partial NVL72 rack too, placed as `plan` places it (the fewest racks holding the GPUs)."""

from __future__ import annotations

import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig, cluster_for
from tessera_lab.model.spec import load_model
from tessera_lab.plan import search as S
from tessera_lab.plan.make import make_plan


@pytest.mark.parametrize("gpu, gpus, ok", [("GB200", 8, True), ("GB200", 16, True), ("GB200", 64, True),
                                           ("GB200", 72, True), ("GB200", 80, True), ("GB200", 144, True),
                                           ("GB200", 12, False), ("GB200", 4, False), ("H200", 16, True),
                                           ("H200", 12, False), ("B300", 20, False)])
def test_gpu_counts_by_hand(gpu, gpus, ok):
    from tessera_lab.model.hardware import GPUSpec

    domain = GPUSpec.named(gpu).nvlink_domain
    model = load_model("qwen3-30b-a3b")
    if ok:
        assert S.check_search_inputs(model, gpus, 4096, 4096 * 64, domain) == 64
        # the same cluster as `plan` builds for that world size
        assert S.search_cluster(gpu, gpus) == cluster_for(ParallelConfig(pp=1, ep=gpus, dp=1), gpu)
    else:
        with pytest.raises(ConfigError) as info:
            S.check_search_inputs(model, gpus, 4096, 4096 * 64, domain)
        line = str(info.value)
        assert f"--gpus = {gpus} is out of range" in line and "\n" not in line
        assert ("8, 16, ..., 72 inside one NVLink domain of 72" in line if domain == 72
                else "a multiple of the 8 GPUs of an NVLink domain" in line)
        # the nearest accepted counts, worked out by hand: 12 -> 8 or 16, 4 -> 8, 20 -> 16 or 24
        near = {12: "(nearest: 8 or 16)", 4: "(nearest: 8)", 20: "(nearest: 16 or 24)"}[gpus]
        assert line.endswith(near)


def test_search_on_a_partial_rack_matches_plan():
    """16 GB200 GPUs: the search plans on one NVL72 rack (16 GPUs used), and its first layout's iteration is what
    `plan` computes for that layout with the search's planner options."""
    model = load_model("qwen3-30b-a3b")
    res = S.search(model, 16, gpu="GB200", global_batch_tokens=4096 * 256, top=1, max_plans=8)
    assert res.ranked, res.errors
    first = res.ranked[0]
    opts = dict(S.PLAN_OPTIONS, **({"method": S.VIRTUAL_METHOD, "limit": S.VIRTUAL_ILP_BUDGET}
                                   if first.layout.vpp > 1 else {}))
    pl = make_plan(model, first.layout.parallel(4096), None, gpu="GB200", **opts)
    assert pl.cluster.num_gpus == 72 and pl.parallel.world_size == 16
    assert pl.chosen.iteration_time_s == pytest.approx(first.result["iteration_time_s"], rel=1e-12)


def test_plan_header_says_how_many_gpus_of_the_rack_it_uses(capsys):
    """64 GPUs on GB200 sit in one 72-GPU NVLink domain: the header says 64 GPUs of 1 x 72 are used; on H200 the 64 GPUs
    fill 8 nodes of 8 and the header names the nodes only."""
    from tessera_lab.cli.main import main

    assert main(["plan", "--gpu", "GB200"]) == 0
    assert "cluster 64 GPUs of 1 x 72 GB200 (a node is one NVLink domain of 72 GPUs);" in capsys.readouterr().out
    assert main(["plan"]) == 0
    assert "cluster 8 x 8 H200;" in capsys.readouterr().out
