"""Layer-task decomposition and model FLOPs against closed forms."""

from __future__ import annotations

import pytest

from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import decompose, layer_tasks, model_flops_per_iteration


def test_dense_model_flops_closed_form():
    """Qwen3-8B: 6 x tokens x (GEMM params incl. LM head) + 3 x causal attention (2 s H d per token per layer)."""
    s, m, mbs = 4096, 4, 2
    p = ParallelConfig(pp=1, ep=1, microbatches=m, micro_batch_size=mbs, seq_len=s)
    h, L, nh, nkv, hd, I, V = 4096, 36, 32, 8, 128, 12288, 151936
    gemm_params = L * (h * nh * hd + 2 * h * nkv * hd + nh * hd * h + 3 * h * I) + h * V
    tokens = s * m * mbs
    expected = 6 * tokens * gemm_params + 3 * tokens * L * 2 * s * nh * hd
    assert model_flops_per_iteration(load_model("qwen3-8b"), p) == pytest.approx(expected, rel=1e-12)


def test_moe_model_flops_closed_form():
    """Qwen3-30B-A3B: attention GEMMs + top-8 experts of width 768 (no shared expert), router excluded."""
    s, m = 2048, 8
    p = ParallelConfig(pp=4, ep=8, dp=2, microbatches=m, seq_len=s)
    h, L, nh, nkv, hd, I, k, V = 2048, 48, 32, 4, 128, 768, 8, 151936
    per_token = 2 * (L * (h * nh * hd + 2 * h * nkv * hd + nh * hd * h + k * 3 * h * I) + h * V) + L * 2 * s * nh * hd
    tokens = s * m * 8 * 2  # every one of the ep*dp data-parallel pipelines runs m micro-batches
    assert model_flops_per_iteration(load_model("qwen3-30b-a3b"), p) == pytest.approx(3 * per_token * tokens, rel=1e-12)


def test_moe_layer_tasks_structure(qwen3_next):
    # balanced routing pinned (expert_load=1): this test checks the per-copy formulas; the default busiest-rank
    # load factor is tested in tests/test_cost_realism.py
    p = ParallelConfig(ep=8, seq_len=4096, expert_load=1.0)
    lt = layer_tasks(qwen3_next, 3, p)
    names = [t.name for t in lt.F]
    for required in ("router", "permute", "dispatch", "experts", "combine", "unpermute", "shared_expert", "core"):
        assert required in names
    f = {t.name: t for t in lt.F}
    # dispatch and combine are EP all-to-alls of T*k*h bf16 values
    assert f["dispatch"].collective.kind == "all_to_all"
    assert f["dispatch"].collective.bytes == 4096 * 10 * 2048 * 2
    assert f["dispatch"].collective.group_size == 8
    assert f["experts"].deps == ("dispatch",) and f["expert_act"].deps == ("experts",)
    assert f["combine"].deps == ("expert_act",)  # the SwiGLU kernel sits between the expert GEMMs and the combine
    # the shared expert does not depend on the all-to-all: a natural overlap partner
    assert "dispatch" not in f["shared_expert"].deps
    # expert GEMM FLOPs: 3 GEMMs over T*k routed tokens
    assert f["experts"].flops == 2 * 4096 * 10 * 2048 * 512 * 3
    # backward: B of a GEMM equals F; attention core B = 2 F; W only for weighted tasks, all deferrable
    b = {t.name: t for t in lt.B}
    assert b["experts"].flops == f["experts"].flops
    assert b["core"].flops == 2 * f["core"].flops
    assert {t.name for t in lt.W} == {"qkv_proj", "o_proj", "router", "experts", "shared_expert"}
    assert all(t.deferrable for t in lt.W)
    # backward walks the graph in reverse: combine before experts before dispatch
    order = [t.name for t in lt.B]
    assert order.index("combine") < order.index("experts") < order.index("dispatch")


def test_ep1_all_to_all_is_noop(qwen3_next):
    lt = layer_tasks(qwen3_next, 0, ParallelConfig(pp=1, ep=1))
    assert {t.name: t for t in lt.F}["dispatch"].collective.bytes == 0


def test_tp_adds_two_allreduces_per_dense_layer():
    lt = layer_tasks(load_model("qwen3-8b"), 0, ParallelConfig(pp=1, ep=1, tp=4))
    assert [t.name for t in lt.F if t.collective and t.collective.kind == "all_reduce"] == [
        "attn_tp_allreduce", "mlp_tp_allreduce"]


def test_decompose_covers_every_layer(qwen3_next):
    lts = decompose(qwen3_next, ParallelConfig())
    assert [lt.layer for lt in lts] == list(range(-1, 49))
    assert lts[0].kind == "embedding" and lts[-1].kind == "lm_head"


def test_expert_load_scales_expert_work(qwen3_next):
    p = ParallelConfig()
    base = {t.name: t for t in layer_tasks(qwen3_next, 0, p).F}
    double = {t.name: t for t in layer_tasks(qwen3_next, 0, p, expert_load=2.0).F}
    assert double["experts"].flops == 2 * base["experts"].flops
    assert double["router"].flops == base["router"].flops


def test_bad_layer_index(qwen3_next):
    from tessera_lab.errors import ConfigError

    with pytest.raises(ConfigError, match="layer"):
        layer_tasks(qwen3_next, 48, ParallelConfig())
    with pytest.raises(ConfigError, match="ep"):
        layer_tasks(qwen3_next, 0, ParallelConfig(ep=3))
