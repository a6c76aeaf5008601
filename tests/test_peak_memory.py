"""The planner's peak-memory prediction for a runner job (runner/launch/memory.py): per global rank in the grid's
order, and its parameter part equal to the runner's own modules counted by torch (a peer: the model the run
builds), at the planner's bytes per parameter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tessera_lab.cost.memory import bytes_per_param  # noqa: E402
from tessera_lab.model.hardware import ParallelConfig  # noqa: E402
from tessera_lab.runner.launch.memory import predicted_peak_bytes  # noqa: E402
from tessera_lab.runner.runtime.layers import is_expert_param  # noqa: E402
from tessera_lab.runner.runtime.specs import RunSpec, WorldSpec  # noqa: E402
from tessera_lab.runner.runtime.topology import build_stages  # noqa: E402


def test_prediction_per_rank_and_its_parameter_part():
    world = WorldSpec(pp=2, ep=2)
    m = 4
    job = {s: RunSpec(schedule=s, microbatches=m, micro_batch_size=2) for s in ("gpipe", "1f1b")}
    b = [0, 2, 4]
    pred = {s: predicted_peak_bytes(j, world, b, s) for s, j in job.items()}
    # ranks 0, 1: stage 0 (pp outermost), ranks 2, 3: stage 1
    assert pred["1f1b"][0] == pred["1f1b"][1] and pred["1f1b"][2] == pred["1f1b"][3]
    cfg = job["1f1b"].model_config
    _, stages = build_stages(cfg, b, [0, 1], 2, [0, 1])  # EP rank 0's experts
    par = ParallelConfig(pp=2, ep=2, dp=1)
    # the planner's bytes per parameter: dense parameters' optimizer state sharded over ep * dp ranks, experts' over dp
    bpp_dense, bpp_expert = bytes_per_param(par, par.dense_dp), bytes_per_param(par, par.expert_dp)
    for s, rank in ((0, 0), (1, 2)):
        # in flight: GPipe m, 1F1B min(pp - s, m); the difference isolates the activations per micro-batch
        k_g, k_1 = m, min(2 - s, m)
        act = (pred["gpipe"][rank] - pred["1f1b"][rank]) / (k_g - k_1)
        params = pred["1f1b"][rank] - act * k_1
        named = list(stages[s].named_parameters())
        dense = sum(p.numel() for n, p in named if not is_expert_param(n))
        expert = sum(p.numel() for n, p in named if is_expert_param(n))
        # the planner's Qwen3-Next linear attention has a short convolution over q, k, v; the runner's config says
        # kernel 1 (TinyConfig.to_hf_config) and its modules have none: 3 h d weights per linear-attention layer
        conv = 3 * cfg.num_heads * cfg.head_dim * sum(
            1 for i in range(b[s], b[s + 1]) if cfg.layer_kinds()[i] == "linear_attention")
        assert act > 0 and expert > 0 and conv > 0
        assert params == pytest.approx((dense + conv) * bpp_dense + expert * bpp_expert, rel=1e-9)


def test_no_prediction_without_a_memory_formula():
    assert predicted_peak_bytes(RunSpec(schedule="dualpipev", microbatches=4), WorldSpec(pp=2, ep=1), [0, 1, 2, 3, 4],
                                "dualpipev") is None
