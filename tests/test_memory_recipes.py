"""Memory mechanisms of the published recipes, each on a hand-worked example: sequence parallelism, FP8 saved GEMM
inputs, Megatron's recompute modules, the EP group spanning TP (expert TP 1), bf16 Adam moments, and the in-flight
count of interleaved 1F1B with the EP overlap. Every expected number is worked out in the comment beside it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.cost.memory import bytes_per_param, in_flight, layer_memory
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import RECOMPUTE_MODULES, ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import decompose, layer_tasks
from tessera_lab.plan.vschedules import plan_in_flight

T = 4096  # tokens per micro-batch (mbs 1 x seq 4096)


def _saved(model, layer, par):
    return {t.name: t.saved_bytes for t in layer_tasks(model, layer, par).F}


def test_sequence_parallel_and_fp8_saved_bytes_by_hand():
    m = load_model("qwen3-30b-a3b")  # h 2048, 32 heads, 4 kv heads, head_dim 128, 128 experts top-8, width 768
    base = ParallelConfig(pp=1, tp=2, ep=8, expert_load=1.0)
    sp = _saved(m, 0, base)
    nosp = _saved(m, 0, base.replace(sequence_parallel=False))
    fp8 = _saved(m, 0, base.replace(precision="fp8"))
    # sequence parallel: the layer input norm keeps T/tp rows: 2 B * 2048 tokens * 2048 = 8,388,608 (16,777,216 without)
    assert sp["input_norm"] == 8_388_608 and nosp["input_norm"] == 16_777_216
    # qkv_proj (column parallel) saves its un-gathered input: 2 * 2048 * 2048 = 8,388,608; FP8 copy: 4,194,304
    assert sp["qkv_proj"] == 8_388_608 and fp8["qkv_proj"] == 4_194_304
    # o_proj's input is already split by heads (16 of 32 per rank): 4096 * 16 * 128 = 8,388,608 elements
    assert sp["o_proj"] == 2 * 8_388_608 == nosp["o_proj"] and fp8["o_proj"] == 8_388_608
    # the attention core is bf16 either way: q, o (16 heads) and k, v (2 kv heads) plus the fp32 lse:
    # 2 * 4096 * (2*16*128 + 2*2*128) + 4 * 4096 * 16 = 37,748,736 + 262,144 = 38,010,880; in bf16 its output o
    # (2 * 4096 * 16 * 128 = 16,777,216) is o_proj's saved input, one storage counted there: 21,233,664
    assert sp["core"] == 21_233_664 and fp8["core"] == 38_010_880
    # routed experts: each TP rank routes 2048 tokens x top-8 = 16,384 copies; per copy fc1's input (2048), the
    # SwiGLU input (2 x 768, bf16), its fp32 routing probability (4 B) and fc2's input (768): bf16
    # 2*(2048 + 1536 + 768) + 4 = 8708 B, FP8 2048 + 3072 + 4 + 768 = 5892 B -> 142,671,872 and 96,534,528
    assert sp["experts"] == 16_384 * 8708 == 142_671_872
    assert fp8["experts"] == 16_384 * 5892 == 96_534_528
    # tp = 1: no split, sequence_parallel has no effect
    one = ParallelConfig(pp=1, ep=8, expert_load=1.0)
    assert _saved(m, 0, one) == _saved(m, 0, one.replace(sequence_parallel=False))


def test_megatron_recompute_modules_by_hand():
    m = load_model("deepseek-v3")  # h 7168, 128 heads, q_lora 1536, kv_lora 512, qk 128+64, v 128; layers 0-2 dense
    none = ParallelConfig(pp=1, ep=8, expert_load=1.0)
    rec = none.replace(recompute="selective", recompute_modules=("mla_up_proj", "mlp"))
    f0 = {t.name: t for t in layer_tasks(m, 0, none).F}
    r = layer_tasks(m, 0, rec)
    rf, rb = {t.name: t for t in r.F}, {t.name: t for t in r.B}
    # core without recompute: q, k (128 heads x 192), v (x 128) bf16 plus the fp32 lse; o (2 * 4096 * 128 * 128 =
    # 134,217,728) is o_proj's input, counted there: 536,870,912 + 2,097,152 = 538,968,064
    assert f0["core"].saved_bytes == 538_968_064
    # mla_up_proj frees q, k, v (2 * 4096 * 128 * (384 + 128) = 536,870,912): the lse remains, 2,097,152
    assert rf["core"].saved_bytes == 2_097_152
    # under FP8 o_proj keeps an FP8 copy, so the core's bf16 o counts: 134,217,728 + 2,097,152
    fp8 = layer_tasks(m, 0, rec.replace(precision="fp8")).F
    assert {t.name: t.saved_bytes for t in fp8}["core"] == 136_314_880
    # the up projections keep their inputs (2 * 4096 * 1536 = 12,582,912) and re-run their forward in the backward
    assert rf["q_b_proj"].saved_bytes == 12_582_912
    assert rb["q_b_proj"].flops == 2 * rf["q_b_proj"].flops and rb["kv_b_proj"].flops == 2 * rf["kv_b_proj"].flops
    assert rb["core"].flops == 2 * rf["core"].flops  # the core itself is not recomputed (B = 2 x F)
    # 'mlp' (dense MLP): gate_up, SwiGLU and down keep nothing and re-run in the backward
    assert rf["gate_up_proj"].saved_bytes == rf["silu_mul"].saved_bytes == rf["down_proj"].saved_bytes == 0
    assert rb["gate_up_proj"].flops == 2 * rf["gate_up_proj"].flops
    # a MoE layer (3): 'mlp' is the dense MLP only, so the routed experts keep everything:
    # 4096 * 8 copies * (2 B * (7168 + 2*2048 + 2048) + 4 B probability) = 32,768 * 26,628 = 872,546,304
    moe = {t.name: t.saved_bytes for t in layer_tasks(m, 3, rec).F}
    assert moe["experts"] == 872_546_304
    # 'moe_act' frees fc2's input (32,768 * 2 * 2048 = 134,217,728): 738,328,576, and the SwiGLU re-runs
    act = layer_tasks(m, 3, none.replace(recompute="selective", recompute_modules=("moe_act",)))
    assert {t.name: t.saved_bytes for t in act.F}["experts"] == 738_328_576
    fa, ba = {t.name: t for t in act.F}, {t.name: t for t in act.B}
    assert ba["expert_act"].bytes == 3 * fa["expert_act"].bytes  # B of an elementwise op 2x its bytes, +1 re-run
    # 'moe': the whole MoE block keeps only its input, 2 * 4096 * 7168 = 58,720,256 (charged to the router); the
    # all-to-alls move their bytes again in the backward
    whole = layer_tasks(m, 3, none.replace(recompute="selective", recompute_modules=("moe",)))
    ws = {t.name: t.saved_bytes for t in whole.F}
    assert ws["router"] == 58_720_256 and ws["experts"] == ws["unpermute"] == ws["shared_expert"] == 0
    wf, wb = {t.name: t for t in whole.F}, {t.name: t for t in whole.B}
    assert wb["dispatch"].collective.bytes == 2 * wf["dispatch"].collective.bytes


def test_ep_group_spanning_tp_by_hand():
    # TP 2 x DP 4 = EP 8 on each of 2 stages (Megatron-Core's expert grid with expert TP 1): 16 GPUs
    p = ParallelConfig(pp=2, tp=2, ep=8, dp=1, ep_spans_tp=True, microbatches=4, expert_load=1.0)
    assert (p.world_size, p.dense_dp, p.expert_dp) == (16, 4, 1)
    assert p.group_ranks("ep") == list(range(8)) and p.group_ranks("ep", pp_i=1) == list(range(8, 16))
    assert p.group_ranks("edp") == [0, 2, 4, 6] and p.group_ranks("tp") == [0, 1]  # dense DP strides by tp
    assert p.tokens_per_iteration == 4 * T * 4  # m x T x dense DP
    # the same TP and EP with EP inside DP: 2 x 8 x 2 = 32 GPUs, dense DP 8, experts replicated over tp x dp = 2
    q = ParallelConfig(pp=2, tp=2, ep=8, dp=1)
    assert (q.world_size, q.dense_dp, q.expert_dp) == (32, 8, 2)
    m = load_model("qwen3-30b-a3b")
    comp = m.layer_params(m.stack.layers[0])
    mem = layer_memory(m, p.replace(grad_reduce_dtype="bf16"), decompose(m, p))[1]
    # dense: mixer / tp + norms + router at 2 + 2 + 12/4 = 7 B; experts / 8 at 2 + 2 + 12/1 = 16 B
    dense = comp["mixer"] / 2 + comp["norms"] + comp["router"]
    assert mem.param_bytes == pytest.approx(7 * dense + 16 * comp["experts"] / 8)
    for bad in (dict(tp=3, ep=8), dict(tp=1, ep=8)):
        with pytest.raises(ConfigError, match="ep_spans_tp"):
            ParallelConfig(ep_spans_tp=True, **bad)


def test_adam_moment_dtype_and_module_checks():
    p = ParallelConfig(grad_reduce_dtype="bf16", adam_moment_dtype="bf16")
    # bf16 weight 2 + bf16 gradient 2 + (fp32 master 4 + two bf16 moments 2 + 2) / 4 = 6
    assert bytes_per_param(p, 4) == 6.0 and p.optimizer_state_bytes == 8.0
    assert bytes_per_param(p.replace(distributed_optimizer=False), 4) == 12.0
    with pytest.raises(ConfigError, match="adam_moment_dtype"):
        ParallelConfig(adam_moment_dtype="fp16")
    with pytest.raises(ConfigError, match="recompute_modules"):
        ParallelConfig(recompute="selective", recompute_modules=("gdn",))  # not modelled: refused
    with pytest.raises(ConfigError, match="recompute_modules"):
        ParallelConfig(recompute_modules=("core_attn",))  # needs recompute = selective


def test_interleaved_overlapped_in_flight_is_megatrons_count():
    # Megatron's get_pp_rank_microbatches (schedules.py): warm-up (p - s - 1) * 2 + (v - 1) * p, + 1 with
    # overlap_moe_expert_parallel_comm; the first combined step then runs one more forward before its backward
    # frees anything. p 8, v 4, rank 0: 14 + 24 + 1 + 1 = 40 chunk-micro-batches = 10 of the rank's four chunks;
    # rank 7: 0 + 24 + 1 + 1 = 26 -> 6.5. Plain interleaved (no overlap): 39 and 25 chunks.
    assert plan_in_flight("interleaved-overlapped", 8, 0, 512, 4) == 10.0
    assert plan_in_flight("interleaved-overlapped", 8, 7, 512, 4) == 6.5
    assert in_flight("interleaved", 8, 0, 512, 4) * 4 == 39 and in_flight("interleaved", 8, 7, 512, 4) * 4 == 25
    # the memory model's own formula agrees with the planner's (vschedules: interleaved + one chunk)
    for p, v, m, s in ((8, 4, 512, 0), (8, 4, 512, 7), (4, 2, 8, 1), (4, 3, 2, 0)):
        assert in_flight("interleaved-overlapped", p, s, m, v) == plan_in_flight("interleaved-overlapped", p, s, m, v)
    # against the overlapped 1F1B the bench used before: 2 (p - s) = 16 micro-batches on rank 0
    assert in_flight("overlapped", 8, 0, 512) == 16.0


def _total_saved(model, par, layers):
    return sum(t.saved_bytes for i in layers for t in layer_tasks(model, i, par).F)


_DSV3 = load_model("deepseek-v3")
_BASE = ParallelConfig(pp=1, ep=8, tp=2, expert_load=1.0, precision="fp8")


@settings(max_examples=25, deadline=None)
@given(st.sets(st.sampled_from(RECOMPUTE_MODULES)), st.sets(st.sampled_from(RECOMPUTE_MODULES)))
def test_more_recompute_never_increases_memory(a, extra):
    small, big = sorted(a), sorted(a | extra)
    layers = (0, 3)  # a dense and a MoE layer of DeepSeek-V3 (MLA)
    none = _total_saved(_DSV3, _BASE, layers)
    full = _total_saved(_DSV3, _BASE.replace(recompute="full"), layers)


    def sel(mods):  # no modules = no recompute (an empty list under 'selective' means this project's default set)
        par = _BASE.replace(recompute="selective", recompute_modules=tuple(mods)) if mods else _BASE
        return _total_saved(_DSV3, par, layers)

    default = _total_saved(_DSV3, _BASE.replace(recompute="selective"), layers)
    assert full <= sel(big) <= sel(small) <= none and full <= default <= none


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "overlapped", "zb-h1", "zb-h2", "interleaved", "interleaved-overlapped"]),
       st.integers(2, 8), st.integers(2, 4), st.integers(1, 64), st.integers(0, 64))
def test_more_microbatches_never_decrease_in_flight(schedule, p, v, m, more):
    v = v if schedule.startswith("interleaved") else 1
    for s in range(p):
        a = plan_in_flight(schedule, p, s, m, v)
        b = plan_in_flight(schedule, p, s, m + more, v)
        assert a <= b
        if s + 1 < p:  # an earlier stage never holds fewer than a later one
            assert plan_in_flight(schedule, p, s + 1, m, v) <= a


def test_make_plan_takes_a_given_split():
    from tessera_lab.plan.make import make_plan

    m = load_model("qwen3-30b-a3b")
    par = ParallelConfig(pp=2, ep=8, microbatches=4, schedule="1f1b", expert_load=1.0)
    plan = make_plan(m, par, method="uniform", baselines=(), boundaries=[0, 20, 48])
    assert plan.chosen.partition.boundaries == [0, 20, 48] and [len(s.layers) for s in plan.chosen.stages] == [20, 28]
    for bad in ([0, 20], [0, 30, 20], [0, 20, 47]):
        with pytest.raises(ConfigError, match="boundaries"):
            make_plan(m, par, method="uniform", baselines=(), boundaries=bad)
    with pytest.raises(ConfigError, match="boundaries"):
        make_plan(m, par, method="ilp", baselines=(), boundaries=[0, 20, 48])


def test_plan_json_keeps_the_layout_and_memory_fields():
    import json

    from tessera_lab.plan.load import load_plan
    from tessera_lab.plan.make import make_plan

    m = load_model("qwen3-30b-a3b")
    par = ParallelConfig(pp=2, tp=2, ep=8, dp=1, ep_spans_tp=True, microbatches=4, schedule="1f1b", expert_load=1.0,
                         recompute="selective", recompute_modules=("moe_act",), adam_moment_dtype="bf16")
    d = json.loads(json.dumps(make_plan(m, par, method="uniform", baselines=()).as_dict()))
    assert d["parallel"]["ep_spans_tp"] is True and d["parallel"]["recompute_modules"] == ["moe_act"]
    assert d["gpus"] == 16
    assert load_plan(d).parallel == par
    # defaults are not written (plans without these fields read as before)
    plain = make_plan(m, ParallelConfig(pp=2, ep=8, microbatches=4, schedule="1f1b"), method="uniform", baselines=())
    assert "ep_spans_tp" not in plain.as_dict()["parallel"]


def test_cli_options_reach_the_plan(tmp_path, capsys):
    import json

    from tessera_lab.cli.main import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "qwen3-30b-a3b", "--gpu", "H100", "--pp", "2", "--tp", "2", "--ep", "8",
                 "--ep-spans-tp", "--microbatches", "4", "--schedule", "1f1b", "--method", "uniform",
                 "--recompute", "selective", "--recompute-modules", "moe_act,core_attn", "--adam-moment-dtype", "bf16",
                 "--json", str(out)]) == 0
    par = json.loads(out.read_text())["parallel"]
    assert (par["ep_spans_tp"], par["recompute_modules"], par["adam_moment_dtype"]) == (True, ["moe_act", "core_attn"],
                                                                                       "bf16")
    capsys.readouterr()
    assert main(["plan", "--tp", "3", "--ep", "8", "--ep-spans-tp"]) == 2  # one clear line, exit 2
    assert "ep_spans_tp" in capsys.readouterr().err


def test_megatron_moe_layer_saved_tensors_by_hand():
    """What Megatron-Core keeps for the backward of a Qwen3-235B-A22B layer (h 4096, 64 q / 4 kv heads of 128, 128
    experts top-8, width 1536, no shared expert) at the ModelZoo's TP 2 / EP 8 layout with selective recompute of
    ``layernorm`` and ``moe_act``: the input norm is fused into linear_qkv (not recomputed), the pre-MLP norm is a
    module of its own (recomputed), the router's bf16 input is that norm's output, the unpermute keeps no tokens."""
    m = load_model("qwen3-235b-a22b")
    par = ParallelConfig(pp=32, vpp=3, tp=2, ep=8, ep_spans_tp=True, microbatches=512, schedule="interleaved",
                         recompute="selective", recompute_modules=("layernorm", "moe_act"), expert_load=1.0)
    s = _saved(m, 0, par)
    rows = 2 * 2048 * 4096  # one bf16 [4096 / tp tokens, h] tensor of the sequence-parallel region: 16,777,216
    assert s["input_norm"] == rows  # the layer input, kept by the fused LayerNormLinear
    assert s["qkv_proj"] == rows  # its ln_out: the fused input norm is an IdentityOp to the recompute, so it stays
    assert s["qk_norm_rope"] == 2 * 4096 * (32 + 2) * 128 == 35_651_584  # q (32 heads / rank) and k (2) norm inputs
    # q, k, v and the fp32 lse: 2 * 4096 * (32*128 + 2*2*128) + 4 * 4096 * 32 = 37,748,736 + 524,288
    assert s["core"] == 38_273_024
    assert s["o_proj"] == 2 * 4096 * 32 * 128 == 33_554_432
    assert s["post_attn_norm"] == rows  # the recompute checkpoint keeps the norm's input
    assert s["router"] == 4 * 2048 * 128 == 1_048_576  # fp32 logits; its bf16 input (the norm output) freed
    assert s["permute"] == 4 * 2048 * 128  # the int32 row-id map (token x expert)
    # 2048 tokens x top-8 = 16,384 copies x (fc1 input 2*4096 + SwiGLU input 2*3072 + fp32 prob 4) = 14,340 B each
    assert s["experts"] == 16_384 * 14_340 == 234_946_560
    assert s["unpermute"] == s["combine"] == s["expert_act"] == s["residual"] == 0
    assert sum(s.values()) == 394_854_400
    # without the recompute: the router's gating GEMM keeps the norm output (one bf16 storage, 16,777,216 B) and
    # fc2's input (16,384 x 2 x 1536 = 50,331,648) stays
    full = _saved(m, 0, par.replace(recompute="none", recompute_modules=()))
    assert full["router"] == 1_048_576 + rows and full["experts"] == 234_946_560 + 50_331_648
    assert full["qkv_proj"] == rows and full["unpermute"] == 0
    # a shared expert (DeepSeek-V3, bf16) keeps the same norm-output storage as its fc1 input: the router only its
    # logits, 4 * 4096 * 256 = 4,194,304
    ds = _saved(load_model("deepseek-v3"), 3, ParallelConfig(pp=1, ep=8, expert_load=1.0))
    assert ds["router"] == 4_194_304 and ds["shared_expert"] >= 2 * 4096 * 7168


def test_modelzoo_a2a_layout_peak_by_hand():
    """The ModelZoo's all-to-all layout (TP 2, EP 8 spanning TP, PP 32, VPP 3, 512 micro-batches, embedding and loss
    in the split): pipeline rank 1 holds one decoder layer in each of its 3 chunks and, in interleaved 1F1B,
    2 (p - s - 1) + (v - 1) p + 1 = 2*30 + 2*32 + 1 = 125 chunk-micro-batches in flight; its peak is its training state
    plus 125 x the layer's 394,854,400 saved bytes (previous test), which fits the H100's 80 GiB less the reserve."""
    from tessera_lab.cost.memory import memory_capacity
    from tessera_lab.model.hardware import Cluster
    from tessera_lab.plan.stages import accounted_boundaries, build_stage_model

    m = load_model("qwen3-235b-a22b")
    par = ParallelConfig(pp=32, vpp=3, tp=2, ep=8, ep_spans_tp=True, microbatches=512, schedule="interleaved",
                         recompute="selective", recompute_modules=("layernorm", "moe_act"), expert_load=1.0)
    assert plan_in_flight("interleaved", 32, 1, 512, 3) * 3 == 125
    b = accounted_boundaries(m.num_layers, 96, embedding=True, loss=True)
    assert [b[s + 1] - b[s] for s in (1, 33, 65)] == [1, 1, 1]
    mem = layer_memory(m, par, decompose(m, par))
    params = sum(mem[1 + b[s]].param_bytes for s in (1, 33, 65))
    rank1 = params + 125 * 394_854_400
    cluster = Cluster.dgx("H100", 32)
    _, sm = build_stage_model(m, par, cluster)
    assert sum(sm.memory_bytes(s, b[s], b[s + 1]) for s in (1, 33, 65)) == pytest.approx(rank1)
    assert rank1 < memory_capacity(cluster)
