"""Megatron-Core options the published recipes use: the ``layernorm`` and ``shared_experts`` recompute modules,
Megatron FSDP (memory and per-layer collectives) and the embedding/loss-accounted pipeline split. Every expected
number is worked out by hand in the comment beside it."""

from __future__ import annotations

import pytest

from tessera_lab.cost.memory import bytes_per_param, fsdp_buffer_bytes
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import layer_tasks, rank_params
from tessera_lab.plan.stages import accounted_boundaries
from tessera_lab.report.scenarios import accounted_split

QWEN = load_model("qwen3-235b-a22b")  # h 4096, 64 q heads, 4 kv heads, head_dim 128, 128 experts of 1536, top-8


def _f(model, layer, par):
    return {t.name: t for t in layer_tasks(model, layer, par).F}


def test_layernorm_recompute_frees_the_norm_output_by_hand():
    base = ParallelConfig(pp=1, tp=2, ep=8, expert_load=1.0)
    ln = base.replace(recompute="selective", recompute_modules=("layernorm",))
    a, b = _f(QWEN, 0, base), _f(QWEN, 0, ln)
    # the router's gating GEMM keeps its input, the pre-MLP norm's output: bf16, sequence parallel over tp 2:
    # 2 * 2048 * 4096 = 16,777,216 bytes, beside its fp32 logits 4 * 2048 * 128 = 1,048,576; the pre-MLP norm is a
    # module of its own in an MoE layer, so 'layernorm' frees that storage (the norm re-runs in the backward)
    assert a["router"].saved_bytes == 16_777_216 + 1_048_576 and b["router"].saved_bytes == 1_048_576
    # the input norm is fused into linear_qkv (Megatron-Core's TE spec for GQA): 'layernorm' leaves it, and qkv_proj
    # keeps the norm output, 16,777,216; nothing else changes
    assert a["qkv_proj"].saved_bytes == b["qkv_proj"].saved_bytes == 16_777_216
    assert {k: t.saved_bytes for k, t in a.items() if k != "router"} == \
        {k: t.saved_bytes for k, t in b.items() if k != "router"}
    bw = {t.name: t for t in layer_tasks(QWEN, 0, ln).B}
    bw0 = {t.name: t for t in layer_tasks(QWEN, 0, base).B}
    # the pre-MLP norm's backward re-runs its forward: bytes 2x (elementwise B) + 1x again = 3x the forward's; the
    # fused input norm's does not
    assert bw["post_attn_norm"].bytes == pytest.approx(bw0["post_attn_norm"].bytes * 3 / 2)
    assert bw["input_norm"].bytes == bw0["input_norm"].bytes
    # under FP8 qkv_proj keeps its own FP8 copy (2048 x 4096 x 1 B); the router's input is bf16 either way
    f8 = _f(QWEN, 0, ln.replace(precision="fp8"))
    assert f8["qkv_proj"].saved_bytes == 8_388_608 and f8["router"].saved_bytes == 1_048_576
    # an MLA layer's input norm is a module of its own (TENorm): 'layernorm' frees its output where the q/kv down
    # projections keep it in bf16 (DeepSeek-V3 layer 0, tp 1: 2 * 4096 * 7168 = 58,720,256 each)
    ds = load_model("deepseek-v3")
    d0 = _f(ds, 0, ParallelConfig(pp=1, ep=8, expert_load=1.0))
    d1 = _f(ds, 0, ParallelConfig(pp=1, ep=8, expert_load=1.0, recompute="selective", recompute_modules=("layernorm",)))
    freed = [k for k in d0 if d0[k].saved_bytes - d1[k].saved_bytes == 58_720_256]
    assert freed and all("input_norm" in d0[k].deps for k in freed)


def test_shared_experts_recompute_by_hand():
    m = load_model("qwen3-next-80b-a3b")  # h 2048, shared expert width 512, SwiGLU
    base = ParallelConfig(pp=1, tp=1, ep=8, expert_load=1.0)
    layer = next(i for i, ly in enumerate(m.stack.layers) if ly.ffn == "moe")
    a = _f(m, layer, base)
    b = _f(m, layer, base.replace(recompute="selective", recompute_modules=("shared_experts",)))
    # without recompute: fc1's input 2 * 4096 * 2048 + SwiGLU input 2 * 4096 * 1024 + fc2's input 2 * 4096 * 512 =
    # 16,777,216 + 8,388,608 + 4,194,304 = 29,360,128; the checkpoint keeps only the input (16,777,216)
    assert a["shared_expert"].saved_bytes == 29_360_128
    assert b["shared_expert"].saved_bytes == 16_777_216 and b["shared_act"].saved_bytes == 0.0
    bb = {t.name: t for t in layer_tasks(m, layer, base.replace(recompute="selective",
                                                                  recompute_modules=("shared_experts",))).B}
    ba = {t.name: t for t in layer_tasks(m, layer, base).B}
    f = a["shared_expert"].flops  # its B re-runs the forward: dgrad (1x) + 1x again
    assert bb["shared_expert"].flops == pytest.approx(ba["shared_expert"].flops + f)


def test_fsdp_memory_by_hand():
    p = ParallelConfig(pp=1, tp=2, ep=8, dp=16, fsdp=True)
    # bf16 weight 2 + fp32 gradient 4 + optimizer 12 = 18 bytes, all sharded over 128 ranks: 0.140625
    assert bytes_per_param(p, 128) == 18 / 128
    assert bytes_per_param(p.replace(fsdp=False), 128) == 6 + 12 / 128
    dense, expert = rank_params(QWEN, p, 0)
    # attention: q 4096 x 8192, k and v 4096 x 512 each, o 8192 x 4096, q/k norms 128 each -> 71,303,424 / tp 2 =
    # 35,651,712, plus the two replicated layer norms (2 x 4096) and the router (4096 x 128 = 524,288)
    assert dense == 35_651_712 + 8192 + 524_288
    # experts: 128 x 3 x 4096 x 1536 / ep 8 = 301,989,888
    assert expert == 301_989_888
    # buffers: two layers' bf16 parameters and one layer's fp32 gradients, (2 x 2 + 4) bytes per parameter
    assert fsdp_buffer_bytes(QWEN, p) == (dense + expert) * 8
    assert fsdp_buffer_bytes(QWEN, p.replace(fsdp=False)) == 0.0
    with pytest.raises(ConfigError, match="fsdp"):
        ParallelConfig(fsdp=1)


def test_fsdp_collectives_by_hand():
    p = ParallelConfig(pp=1, tp=2, ep=8, dp=16, fsdp=True, expert_load=1.0)
    lt = layer_tasks(QWEN, 0, p)
    dense, expert = rank_params(QWEN, p, 0)
    f = {t.name: t.collective for t in lt.F if t.name.startswith("fsdp")}
    b = {t.name: t.collective for t in lt.B if t.name.startswith("fsdp")}
    w = {t.name: t.collective for t in lt.W if t.name.startswith("fsdp")}
    # dense: all-gathered in bf16 over the ep x dp = 128 ranks holding the same TP shard; experts over tp x dp = 32
    assert (f["fsdp_gather"].kind, f["fsdp_gather"].bytes, f["fsdp_gather"].group, f["fsdp_gather"].group_size) == \
        ("all_gather", 2 * dense, "edp", 128)
    assert (f["fsdp_gather_experts"].bytes, f["fsdp_gather_experts"].group_size) == (2 * expert, 32)
    assert b == f  # gathered again before the backward
    # gradients reduce-scattered in fp32 (4 bytes)
    assert w["fsdp_gather_experts"].kind == "reduce_scatter" and w["fsdp_gather_experts"].bytes == 4 * expert
    assert not [t for t in layer_tasks(QWEN, 0, p.replace(fsdp=False)).F if t.name.startswith("fsdp")]


def test_accounted_split_by_hand():
    # 94 layers + embedding + loss = 96 slots over pp 32 x vpp 3 = 96 virtual stages: one each, so the first
    # virtual stage holds only the embedding and the last only the loss
    b = accounted_boundaries(94, 96, embedding=True, loss=True)
    assert b[:3] == [0, 0, 1] and b[-2:] == [94, 94] and len(b) == 97
    assert all(b[s + 1] - b[s] == 1 for s in range(1, 95))
    # pp 8 x vpp 4 = 32: 3 slots each -> 2, 3 x 30, 2
    b = accounted_boundaries(94, 32, embedding=True, loss=True)
    assert [b[s + 1] - b[s] for s in range(32)] == [2] + [3] * 30 + [2]
    # embedding only: 95 slots over 5 stages -> 18, 19, 19, 19, 19
    b = accounted_boundaries(94, 5, embedding=True, loss=False)
    assert [b[s + 1] - b[s] for s in range(5)] == [18, 19, 19, 19, 19]
    with pytest.raises(ConfigError, match="pp x vpp"):
        accounted_boundaries(94, 7, embedding=True, loss=True)
    # the capacity report's recipe split is the same rule (it refuses stages left without a layer)
    assert accounted_split(94, 32) == accounted_boundaries(94, 32, embedding=True, loss=True)
    assert accounted_split(94, 96) is None


def test_fsdp_plan_records_and_reads_back():
    from tessera_lab.plan.load import load_plan
    from tessera_lab.plan.make import make_plan

    m = load_model("qwen3-30b-a3b")
    par = ParallelConfig(pp=2, ep=8, dp=2, microbatches=4, schedule="1f1b", fsdp=True)
    plan = make_plan(m, par, method="uniform", baselines=(), gpu="H100")
    d = plan.as_dict()
    assert d["parallel"]["fsdp"] is True
    assert load_plan(d).parallel.fsdp
    # every byte of training state sharded: fewer parameter bytes per GPU, the unsharded buffers included
    plain = make_plan(m, par.replace(fsdp=False), method="uniform", baselines=(), gpu="H100")
    assert plan.chosen.stages[0].param_bytes < plain.chosen.stages[0].param_bytes


def test_split_with_more_virtual_stages_than_layers_plans():
    """An embedding- and loss-accounted split may hold pp x vpp = layers + 2 virtual stages (the first only the
    embedding, the last only the loss): the plan scores that split, its baselines included, instead of refusing it.
    Qwen3-30B-A3B: 48 layers + 2 = 50 = pp 25 x vpp 2, one decoder layer on each of virtual stages 1..48."""
    from tessera_lab.plan.make import make_plan

    m = load_model("qwen3-30b-a3b")
    par = ParallelConfig(pp=25, vpp=2, ep=8, microbatches=50, schedule="interleaved", expert_load=1.0)
    b = accounted_boundaries(48, 50, embedding=True, loss=True)
    plan = make_plan(m, par, None, method="uniform", gpu="H100", boundaries=b)
    assert list(plan.chosen.partition.boundaries) == b
    assert [b[s + 1] - b[s] for s in (0, 1, 48, 49)] == [0, 1, 1, 0]


def _fsdp_cost_model():
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import cluster_for

    p = ParallelConfig(pp=1, tp=2, ep=8, dp=16, fsdp=True, expert_load=1.0, ep_placement="contiguous",
                       dispatcher="deepep", micro_batch_size=4, recompute="full")
    return p, CostModel(cluster_for(p, "H100"), p)


def test_fsdp_collectives_on_their_own_stream_by_hand():
    p, cm = _fsdp_cost_model()
    lt = layer_tasks(QWEN, 0, p)
    dense, expert = rank_params(QWEN, p, 0)
    gather = next(t for t in lt.F if t.name == "fsdp_gather_experts")
    assert gather.own_stream and not next(t for t in lt.F if t.name == "dispatch").own_stream
    # the expert gather: 2 x 301,989,888 bytes over 32 ranks, one a node (EP 8 fills a node): InfiniBand 50 GB/s at
    # NCCL's 94% (nccl-tests #290: 46-48 GB/s per NDR NIC): 20 us + 603,979,776 x 31/32 / 47e9 = 12.469 ms
    t = 2e-5 + 2 * expert * 31 / 32 / 47e9
    assert t == pytest.approx(12.469e-3, abs=1e-6)
    assert cm.task_time(gather) == pytest.approx(t)
    # its NCCL kernel across nodes holds 16 of the 132 SMs: lanes of 10 ms beside it take 10 + 16/132 x t < t
    assert cm.own_stream_time(0.010, [gather]) == pytest.approx(t)
    assert cm.own_stream_time(0.001, []) == 0.001
    assert cm.own_stream_time(0.020, [gather]) == pytest.approx(0.020 + t * 16 / 132)


def test_fsdp_layer_cost_is_the_lanes_or_the_own_stream_by_hand():
    p, cm = _fsdp_cost_model()
    lt = layer_tasks(QWEN, 0, p)
    side = {ph: [t for t in getattr(lt, ph) if t.own_stream] for ph in "FBW"}
    lanes = {ph: cm.phase_cost([t for t in getattr(lt, ph) if not t.own_stream]) for ph in "FBW"}
    # per micro-batch and layer: two gathers (before F, before B: one for the recomputation and the backward) of
    # each group and one reduce-scatter of each group, Megatron-Core's optim_grads_params with full recompute
    assert [len(side[ph]) for ph in "FBW"] == [2, 2, 2]
    assert all(t.collective.kind == "reduce_scatter" for t in side["W"])
    cost = cm.layer_cost(lt)
    side_s = {ph: sum(cm.task_time(t) for t in side[ph]) for ph in "FBW"}
    share = {ph: sum(cm.task_time(t) * cm.comm_sm_share(t.collective) for t in side[ph]) for ph in "FBW"}
    assert cost.F.time == pytest.approx(max(side_s["F"], lanes["F"].time + share["F"]))
    assert cost.B.time == pytest.approx(lanes["B"].time)  # the backward's gathers and reduce-scatters go with W
    bw = max(side_s["B"] + side_s["W"], lanes["B"].time + lanes["W"].time + share["B"] + share["W"])
    assert cost.B.time + cost.W.time == pytest.approx(bw)
    # here the link binds: the gathers and reduce-scatters (2 + 2 + 4 bytes a parameter) outlast the lanes
    assert bw == pytest.approx(side_s["B"] + side_s["W"]) and side_s["W"] > lanes["B"].time + lanes["W"].time
    assert cost.F.comm == pytest.approx(lanes["F"].comm + side_s["F"])


def test_fsdp_report_recipes_match_the_layer_costs():
    """The report's per-phase recipes price FSDP's own-stream collectives as the cost model does: their totals are
    the layer's F, B and W times, their parts sum to them, and a link-bound backward puts the excess on the exposed
    all-gather and reduce-scatter rows (the backward's two gathers and the reduce-scatter share two task names)."""
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.model.tasks import decompose
    from tessera_lab.report.categories import _RecipeBuilder

    p, cm = _fsdp_cost_model()
    lt = decompose(QWEN, p)[1]
    cost = cm.layer_cost(lt)
    rb = _RecipeBuilder(QWEN, p, cluster_for(p, "H100"))
    side = sum(cm.task_time(t) for t in lt.B + lt.W if t.own_stream)
    for ph in "FBW":
        bd = rb.phase(1, ph)
        assert bd.total == pytest.approx(getattr(cost, ph).time)
        assert sum(bd.parts.values()) == pytest.approx(bd.total)
    w = rb.phase(1, "W")
    lanes_w = cm.phase_cost([t for t in lt.W if not t.own_stream])
    assert cost.W.comm == pytest.approx(lanes_w.comm + side)  # every gather and reduce-scatter counted once
    exposed = sum(v for k, v in w.parts.items() if k.startswith("exposed_all_gather") or
                  k.startswith("exposed_reduce_scatter"))
    assert exposed == pytest.approx(side - rb.phase(1, "B").total - lanes_w.time)


def test_host_waits_hide_behind_fsdp_streams_by_hand():
    """While the host waits the compute stream idles, but FSDP's prefetched gathers and reduce-scatters run on: a
    phase bound by them has ``lane_slack`` = their time - the lanes - the SMs their kernels take, and a wait hides in
    it up to its own length. By hand for the ModelZoo FSDP layer (its forward: one dispatcher wait, its recompute
    in the backward: another, each the fitted `deepep` value)."""
    from tessera_lab.cost.sync import FITTED_PER_WAIT_S, host_waits, own_stream_hidden_s
    from tessera_lab.plan.stages import layer_host_sync

    p, cm = _fsdp_cost_model()
    lt = layer_tasks(QWEN, 0, p)
    cost = cm.layer_cost(lt)
    for ph, tasks in (("F", list(lt.F)), ("W", list(lt.B) + list(lt.W))):
        side = [t for t in tasks if t.own_stream]
        lanes = (cm.phase_cost([t for t in lt.F if not t.own_stream]).time if ph == "F" else
                 cm.phase_cost([t for t in lt.B if not t.own_stream]).time
                 + cm.phase_cost([t for t in lt.W if not t.own_stream]).time)
        want = sum(cm.task_time(t) for t in side) - lanes - sum(cm.task_time(t) * cm.comm_sm_share(t.collective)
                                                                 for t in side)
        assert getattr(cost, ph).lane_slack == pytest.approx(max(0.0, want)) and want > 0
    assert cost.B.lane_slack == 0.0  # the backward's own-stream collectives are priced with W
    c = FITTED_PER_WAIT_S["deepep"]
    assert host_waits(p, QWEN) == ["dispatcher", "dispatcher (recompute)"]
    # the forward's wait hides up to the forward's slack, the recompute's up to the backward's; never beyond a wait
    assert own_stream_hidden_s(["dispatcher", "dispatcher (recompute)"], 4e-3, 1e-3, 9e-3) == pytest.approx(5e-3)
    assert own_stream_hidden_s(["dispatcher"], 4e-3, 9e-3, 9e-3) == pytest.approx(4e-3)
    assert own_stream_hidden_s(["dispatcher"], 4e-3, -1.0, 0.0) == 0.0
    hidden = min(c, cost.F.lane_slack) + min(c, cost.W.lane_slack)
    sync = layer_host_sync(QWEN, p, cm.model_costs(QWEN), True)
    moe = [i for i, ly in enumerate(QWEN.stack.layers) if ly.ffn == "moe"]
    assert sync[moe[0]] == pytest.approx(2 * c - hidden) and 0 < sync[moe[0]] < 2 * c
    # without FSDP nothing is hidden: every wait is exposed
    q = p.replace(fsdp=False)
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import cluster_for

    plain = layer_host_sync(QWEN, q, CostModel(cluster_for(q, "H100"), q).model_costs(QWEN), True)
    assert plain[moe[0]] == pytest.approx(2 * c)
