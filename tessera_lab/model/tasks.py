"""Layer-task decomposition: every layer becomes F, B and W task graphs.

For one micro-batch on one rank (``T = micro_batch_size * seq_len`` tokens), each decoder layer is split
into the tasks of docs/concepts.md ("Layer kinds and their tasks"): the mixer (norm, projections, core), the router, permute, the
**dispatch all-to-all** over the EP group, the grouped expert GEMMs, the **combine all-to-all**, unpermute,
the shared expert (independent of the all-to-all) and the residual; a dense layer has an MLP instead.
Backward is the reverse graph: B (input gradient) for every task and W (weight gradient) for every
task that owns weights. W tasks are ``deferrable``.

FLOP conventions (per micro-batch, per rank):

* GEMM ``y = x A`` with ``x`` of shape (m, k) and ``A`` (k, n): F, B and W each cost ``2 m k n``.
* Causal softmax attention core: ``4 b s^2 H d`` counted at half (causal), B = 2 x F, no W.
* Gated DeltaNet core (recurrent form of Yang et al., "Gated Delta Networks", ICLR 2025): per token and
  value head, ``S^T k``, the rank-1 state update and ``S^T q`` cost ``6 d_k d_v``; the chunked kernel adds
  the intra-chunk products ``2 C (d_k + d_v)`` with chunk size ``C = 64`` (flash-linear-attention's
  default). B = 2 x F, no W.
* Routed experts: tokens received by the rank times top-k copies, three GEMMs of width ``moe_intermediate_size``
  (a latent MoE, ``moe_latent_size``: the tokens are projected to the latent before the dispatch and back after the
  combine, so the all-to-alls and the expert GEMMs work on the latent, as Megatron-Core's ``moe_latent_size``);
  with ``tp > 1`` each TP rank routes ``T / tp`` tokens (sequence parallel, expert tensor parallel 1, as
  Megatron-Core does), so expert work and all-to-all bytes are not repeated on every TP rank.

Byte counts (``bytes``) are HBM traffic for the roofline; ``saved_bytes`` is what a forward task keeps
for backward (activation memory). Collective sizes follow nccl-tests' definition of ``S``.

Saved bytes (activation memory), three mechanisms beyond the tensors' shapes:

* Sequence parallelism (``ParallelConfig.sequence_parallel``, with ``tp > 1``): tensors outside the
  tensor-parallel regions (the layer input, norms, the inputs of column-parallel GEMMs, which Transformer
  Engine saves un-gathered and all-gathers again in the backward) are split over the TP ranks, so every saved
  activation of a layer is divided by ``tp`` (Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models", MLSys 2023, section 4.2.2). Megatron-Core refuses MoE training with TP and without it
  (``MoELayer.forward`` in ``megatron/core/transformer/moe/moe_layer.py``).
* FP8 (``precision = fp8``): Transformer Engine's ``Linear``, ``LayerNormLinear`` and ``GroupedLinear`` cast a
  GEMM's input to FP8 in the forward and save that FP8 copy (1 byte an element) for the weight-gradient GEMM
  (``transformer_engine/pytorch/module/linear.py``, ``grouped_linear.py``: ``save_for_backward`` of the quantized
  ``inputmat``). So every GEMM's saved input is 1 byte an element; the attention core (bf16 dot-product
  attention), the SwiGLU input, norms and router probabilities stay in their own dtype.
* One storage, counted once: the attention core's output is the tensor its consumer (output gate, or o_proj in
  bf16) keeps, so it is counted with the consumer (PyTorch's saved tensors share storage with the graph's).
* Recomputation (``ParallelConfig.recompute``; ``recompute_modules`` as Megatron-LM names them, see
  :data:`tessera_lab.model.hardware.RECOMPUTE_MODULES`): a recomputed task saves only what its checkpoint keeps
  and re-runs its forward in the backward. ``layernorm`` covers only the norms that are modules of their own
  (:func:`_separate_norms`: Megatron-Core's TE spec fuses a GQA layer's input norm into ``linear_qkv`` and a dense
  MLP's into ``linear_fc1``).
* The MoE block keeps what Megatron-Core's MoE layer keeps (NVIDIA/Megatron-LM@1e057005959b,
  ``megatron/core/transformer/moe/``: ``router.py``, ``token_dispatcher.py``, ``experts.py``; docs/design-notes.md,
  "Memory"): the router its fp32 logits and its gating GEMM's input (the pre-MLP norm's output, one storage with it);
  the fused permute its int32 row-id map; the experts fc1's input, the SwiGLU input and the fp32 routing
  probabilities (``weighted_bias_swiglu`` applies them, so the unpermute merges without probabilities and keeps
  only the row-id map, Transformer Engine's ``moe_unpermute``), and fc2's input unless ``moe_act``.

This module never imports torch.
"""

from __future__ import annotations

from dataclasses import replace

from tessera_lab.errors import ConfigError
from tessera_lab.model import kinds, mixers
from tessera_lab.model.context_parallel import add_cp_comms
from tessera_lab.model.ep_traffic import busiest_rank_load, copies_per_token
from tessera_lab.model.flops import (attention_flops, conv1d_flops, cross_entropy_flops, gemm_flops, scan_flops,
                                     training_flops)
from tessera_lab.model.graph import PHASES, Collective, LayerTasks, Task, _Fwd  # noqa: F401  (re-exported)
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.mixers import LINEAR_ATTENTION_CHUNK
from tessera_lab.model.spec import MOE, NO_FFN, NO_MIXER, LayerSpec, ModelSpec

#: ops whose FLOPs count as model FLOPs (Megatron-LM convention: GEMMs and the attention core).
MODEL_FLOP_OPS = frozenset({"gemm", "grouped_gemm", "attention", "linear_attention"})
COMM_OPS = frozenset({"all_to_all", "all_reduce", "reduce_scatter", "all_gather", "p2p"})


def _mixer_gated_deltanet(g: _Fwd, m: ModelSpec, T: int, tp: int, after: str) -> str:
    h, dt = m.hidden_size, g.dt
    nvh = m.linear.linear_num_value_heads / tp
    kd = m.linear.linear_num_key_heads * m.linear.linear_key_head_dim / tp
    vd = m.linear.linear_num_value_heads * m.linear.linear_value_head_dim / tp
    dk, dv = m.linear.linear_key_head_dim, m.linear.linear_value_head_dim
    conv_dim = 2 * kd + vd
    proj = g.gemm("in_proj", T, h, 2 * kd + 2 * vd + 2 * nvh, [after], seq=True)
    conv = g.elementwise("conv1d", dt * T * conv_dim * 2, [proj], saved=dt * T * conv_dim,
                         flops=conv1d_flops(T, conv_dim, m.linear.linear_conv_kernel_dim))
    C = LINEAR_ATTENTION_CHUNK
    chunks = -(-T // C)
    state_bytes = chunks * nvh * dk * dv * 4  # fp32 chunk states
    core_flops = scan_flops(T, nvh, dk, dv, C, 6.0)
    # flash-linear-attention's chunk_gated_delta_rule saves its inputs (q, k, v, gate, beta) and the fp32
    # intra-chunk WY matrix (C per token and value head) and recomputes the chunk states in the backward
    core = g.add(
        Task("core", g.layer, "F", "linear_attention", core_flops,
             dt * T * (2 * kd + 2 * vd + 2 * nvh) + 2 * state_bytes, deps=(conv,),
             saved_bytes=dt * T * (2 * kd + vd + 2 * nvh) + 4.0 * T * nvh * C),
        b_scale=2.0,
    )
    norm = g.elementwise("gated_norm", dt * T * vd * 3, [core], saved=dt * T * vd * 2)
    return g.gemm("out_proj", T, vd, h, [norm])


def _mixer_gqa(g: _Fwd, m: ModelSpec, layer: LayerSpec, T: int, b: int, s: int, tp: int, after: str) -> str:
    h, dt = m.hidden_size, g.dt
    nh, nkv, hd, vd = kinds.gqa_shape(m, layer)  # vd: the value head dim (MiMo-V2-Flash: unlike hd)
    nh, nkv = nh / tp, max(nkv / tp, 1)
    gated = layer.attention == "gated_gqa"
    kv_out = nkv * (hd + (0 if layer.k_eq_v else vd))  # Gemma-4's global layers: v is k (no v_proj)
    head_gate = nh if layer.head_gate else 0  # Laguna's g_proj (h x heads), on the same input: one GEMM here
    qkv = g.gemm("qkv_proj", T, h, nh * hd * (2 if gated else 1) + kv_out + head_gate, [after], seq=True)
    rope = g.elementwise("qk_norm_rope", dt * T * (nh + nkv) * hd * 2, [qkv], saved=dt * T * (nh + nkv) * hd)
    # causal: s^2/2 pairs; q k^T over hd, p v over vd (MiMo-V2-Flash: vd unlike hd)
    flops = attention_flops(b, mixers.attention_pairs(s, layer.window, layer.local), nh, hd, vd)
    io = dt * T * (nh * hd + nkv * (hd + vd) + nh * vd)
    # the core keeps q, k, v, its output o and the fp32 lse; o is the very tensor its consumer keeps (the output
    # gate, or o_proj's input in bf16), one storage, so it is counted there (an FP8 o_proj keeps its own FP8 copy)
    o = dt * T * nh * vd
    shared = o if (gated or layer.head_gate or g.gemm_in == dt) else 0.0
    core = g.add(Task("core", g.layer, "F", "attention", flops, io, deps=(rope,),
                      saved_bytes=io + 4.0 * T * nh - shared), b_scale=2.0,
                 selective=dt * T * (nh * hd + nkv * (hd + vd)), module="core_attn")
    last = core
    if gated:
        last = g.elementwise("output_gate", dt * T * nh * vd * 3, [core], saved=dt * T * nh * vd * 2)
    elif layer.head_gate:  # o times one gate value per head: reads o and the gates, writes o_proj's input
        last = g.elementwise("head_gate", dt * T * (2 * nh * vd + nh), [core], saved=dt * T * (nh * vd + nh))
    return g.gemm("o_proj", T, nh * vd, h, [last])


def _mixer_mla(g: _Fwd, m: ModelSpec, layer: LayerSpec, T: int, b: int, s: int, tp: int, after: str) -> str:
    h, dt = m.hidden_size, g.dt
    nh = m.attention.num_attention_heads / tp
    qk = m.attention.qk_nope_head_dim + m.attention.qk_rope_head_dim
    sp = g.sp  # the compressed q and kv (and their norms) are in the sequence-parallel region
    if m.attention.q_lora_rank:
        qa = g.gemm("q_a_proj", T, h, m.attention.q_lora_rank, [after], seq=True)
        qn = g.elementwise("q_a_norm", dt * T * m.attention.q_lora_rank * 2, [qa], saved=dt * T * m.attention.q_lora_rank / sp)
        q = g.gemm("q_b_proj", T, m.attention.q_lora_rank, nh * qk, [qn], seq=True)
    else:
        q = g.gemm("q_proj", T, h, nh * qk, [after], seq=True)
    kva = g.gemm("kv_a_proj", T, h, m.attention.kv_lora_rank + m.attention.qk_rope_head_dim, [after], seq=True)
    kvn = g.elementwise("kv_a_norm", dt * T * m.attention.kv_lora_rank * 2, [kva], saved=dt * T * m.attention.kv_lora_rank / sp)
    kvb = g.gemm("kv_b_proj", T, m.attention.kv_lora_rank, nh * (m.attention.qk_nope_head_dim + m.attention.v_head_dim), [kvn], seq=True)
    core_deps, pairs = (q, kvb), mixers.attention_pairs(s)
    if layer.attention == "mla_sparse":  # DeepSeek-V3.2: each query attends the index_topk keys its indexer picks
        pairs = mixers.attention_pairs(s, m.attention.index_topk, "sliding")
        if not layer.shared_index:  # GLM-5.2's shared layers reuse an earlier layer's selection: no indexer here
            sel = mixers.indexer(g, m, T, b, s, qn if m.attention.q_lora_rank else after, m.attention.q_lora_rank or h, after)
            core_deps = (q, kvb, sel)
    up = "mla_up_proj" in g.modules
    if up:
        # Megatron's 'mla_up_proj' (output-discarding checkpoint of the up projections and RoPE): their inputs stay
        # saved, their outputs (the core's q, k, v) are freed after the forward and rebuilt in the backward
        g.recomputed.update({q, kvb})
    flops = attention_flops(b, pairs, nh, qk, m.attention.v_head_dim)
    io = dt * T * nh * (2 * qk + 2 * m.attention.v_head_dim)
    qkv_in = dt * T * nh * (2 * qk + m.attention.v_head_dim)  # q, k, v; the rest of io is the output o
    # o is o_proj's input, one storage with it in bf16 (counted there); an FP8 o_proj keeps its own copy
    shared = dt * T * nh * m.attention.v_head_dim if g.gemm_in == dt else 0.0
    saved = io + 4.0 * T * nh - shared - (qkv_in if up else 0.0)
    core = g.add(Task("core", g.layer, "F", "attention", flops, io, deps=core_deps, saved_bytes=saved), b_scale=2.0,
                 selective=0.0 if up else qkv_in, module="core_attn")
    return g.gemm("o_proj", T, nh * m.attention.v_head_dim, h, [core])


def _ffn_moe(g: _Fwd, m: ModelSpec, T: int, p: ParallelConfig, after: str, load: float) -> list[str]:
    h, dt, k, E = m.hidden_size, g.dt, m.moe.num_experts_per_tok, m.moe.num_experts
    if E % p.ep:
        raise ConfigError(f"field 'ep' = {p.ep} must divide num_experts = {E}")
    T_all = T
    T = T / p.tp  # sequence parallel: each TP rank routes its slice of the tokens (Megatron, expert TP = 1)
    routed = T * k  # token copies the experts of this rank's tokens need (and, on average, this rank's experts get)
    received = routed * load
    # the dispatcher moves one copy per (token, expert) (alltoall) or per (token, destination rank) (deepep)
    sent = T * copies_per_token(p.dispatcher, E, k, p.ep, m.moe.n_group, m.moe.topk_group) * load
    # saved: the fp32 logits, and the gating GEMM's input (pre_mlp_layernorm's output, bf16, one storage with it)
    # unless the shared expert's fc1 already keeps that storage (_router_keeps_norm_output)
    router_in = dt * T * h if _router_keeps_norm_output(g, m) else 0.0
    router = g.add(Task("router", g.layer, "F", "router", gemm_flops(T, h, E), dt * (T * h + h * E) + 4.0 * T * E * 2,
                        deps=(after,), saved_bytes=4.0 * T * E + router_in, gemms=((T, h, E),)),
                   w=Task("router", g.layer, "W", "gemm", gemm_flops(T, h, E), dt * (T * h + h * E + T * E),
                          gemms=((T, h, E),)))
    h_all, deps = h, [router]
    if m.moe.moe_latent_size:  # latent MoE: fc1_latent_proj before the dispatch, experts and all-to-alls on the latent
        deps.append(g.gemm("latent_down", T, h, m.moe.moe_latent_size, [after]))
        h = m.moe.moe_latent_size
    # the fused permute keeps only its int32 row-id map (token x expert), shared with the unpermute
    permute = g.elementwise("permute", dt * sent * h * 2, deps, saved=4.0 * T * E)
    route = (T, E, k, p.dispatcher, m.moe.n_group, m.moe.topk_group)
    dispatch = g.comm("dispatch", "all_to_all", dt * sent * h, "ep", p.ep, [permute], route)
    width = m.moe.moe_intermediate_size
    gm = 2 if m.moe.expert_act == "swiglu" else 1  # gate+up (SwiGLU) or up only (ReLU^2, Nemotron-H)
    local_experts = E // p.ep
    per_expert = received / local_experts
    shapes = ((per_expert, h, float(gm) * width), (per_expert, width, h))  # gate+up, down (one expert)
    eflops = gemm_flops(received, h, width, gm + 1)
    ebytes = dt * ((gm + 1) * h * width * local_experts + received * (2 * h + (gm + 1) * width))
    # saved per token copy: fc1's input (h, as a GEMM input: FP8 under fp8), the SwiGLU input (2 x width, bf16),
    # its routing probability (fp32: the weighted SwiGLU applies the probabilities) and fc2's input (width, a GEMM
    # input); Megatron's 'moe_act' frees fc2's input and recomputes the SwiGLU
    fc2_in = g.gemm_in * received * width
    exp_saved = g.gemm_in * received * h + dt * received * gm * width + 4.0 * received + fc2_in
    experts = g.add(
        Task("experts", g.layer, "F", "grouped_gemm", eflops, ebytes, deps=(dispatch,),
             saved_bytes=exp_saved - (fc2_in if "moe_act" in g.modules else 0.0), gemms=shapes, groups=local_experts),
        w=Task("experts", g.layer, "W", "grouped_gemm", eflops, ebytes, gemms=shapes, groups=local_experts),
        selective=dt * received * h, module="_experts",  # this project's selective: keep the input, re-run all
    )
    # SwiGLU between the two expert GEMMs is its own memory-bound kernel (Megatron's TEGroupedMLP applies the fused
    # bias-SwiGLU with the routing probabilities between fc1 and fc2, megatron/core/fusions/fused_bias_swiglu.py), as
    # the dense MLP's silu_mul: reads the 2 x width fc1 output, writes width; its input is in the experts' saved bytes
    act = g.elementwise("expert_act", dt * received * width * (gm + 1), [experts])
    if "moe_act" in g.modules:
        g.recomputed.add(act)
    combine = g.comm("combine", "all_to_all", dt * sent * h, "ep", p.ep, [act], route)
    # the probabilities were applied in the experts, so the unpermute merges without them and keeps only the
    # permute's row-id map (counted there), not the expert outputs
    unpermute = g.elementwise("unpermute", dt * (sent * h + T * h), [combine])
    if m.moe.moe_latent_size:  # fc2_latent_proj back to the hidden state
        unpermute = g.gemm("latent_up", T, h, h_all, [unpermute])
        h = h_all
    outs = [unpermute]
    if m.moe.shared_expert_intermediate_size:
        Is = m.moe.shared_expert_intermediate_size / p.tp
        T = T_all  # the shared expert is tensor-parallel (width split), on all tokens
        sflops = gemm_flops(T, h, Is, gm + 1) + (gemm_flops(T, h, 1) if m.moe.shared_expert_gate else 0.0)
        sbytes = dt * ((gm + 1) * h * Is + T * (2 * h + (gm + 1) * Is))
        sshapes = ((T, h, float(gm) * Is), (T, Is, h))
        # saved: fc1's input (h, sequence-parallel, a GEMM input), the SwiGLU input (2 Is) and fc2's input (Is)
        s_saved = T * (g.gemm_in * h / g.sp + dt * gm * Is + g.gemm_in * Is)
        shared = g.add(
            Task("shared_expert", g.layer, "F", "gemm", sflops, sbytes, deps=(after,), saved_bytes=s_saved,
                 gemms=sshapes),
            w=Task("shared_expert", g.layer, "W", "gemm", sflops, sbytes, gemms=sshapes),
        )
        shared_first = shared
        shared = g.elementwise("shared_act", dt * T * Is * (gm + 1), [shared])  # its SwiGLU, as the routed experts'
        if p.tp > 1:
            shared = g.comm("shared_tp_allreduce", "all_reduce", dt * T * h, "tp", p.tp, [shared])
        if "shared_experts" in g.modules:  # Megatron's 'shared_experts': a normal checkpoint keeping the block's input
            _checkpoint(g, first=shared_first, keep=g.gemm_in * T * h / g.sp, last=shared)
        outs.append(shared)
    if "moe" in g.modules:
        _checkpoint(g, first=router, keep=dt * T_all * h / g.sp)  # Megatron's 'moe': the block keeps its input
    return outs


def _router_keeps_norm_output(g: _Fwd, m: ModelSpec) -> bool:
    """Whether the router's gating GEMM is the one saved holder of pre_mlp_layernorm's output: Megatron-Core's
    ``RouterGatingLinearFunction`` saves its bf16 input (``megatron/core/transformer/moe/moe_utils.py``), one storage
    with the norm output; a shared expert whose fc1 keeps a bf16 input holds that same storage (counted there)."""
    return not (m.moe.shared_expert_intermediate_size and g.gemm_in == g.dt)


def _checkpoint(g: _Fwd, first: str, keep: float, last: str | None = None) -> None:
    """Normal checkpointing of the tasks from ``first`` to ``last`` (default: the end of the graph so far): they
    save nothing but the block's input (``keep`` bytes, charged to ``first``) and re-run their forward in the
    backward."""
    names = [t.name for t in g.tasks]
    block = set(names[names.index(first):(names.index(last) + 1 if last is not None else None)])
    g.recomputed |= block
    g.tasks = [replace(t, saved_bytes=(keep if t.name == first else 0.0)) if t.name in block else t for t in g.tasks]


def _ffn_dense(g: _Fwd, m: ModelSpec, layer: LayerSpec, T: int, p: ParallelConfig, after: str) -> list[str]:
    h, dt = m.hidden_size, g.dt
    inter = (layer.dense_width or m.mlp.intermediate_size) / p.tp
    # Megatron's 'mlp' recomputes the dense MLP from its input (post_attn_norm's saved input)
    if m.mlp.ffn_act != "swiglu":  # squared ReLU (Nemotron-H) or GELU: one up projection, not gated
        up = g.gemm("up_proj", T, h, inter, [after], seq=True, module="mlp")
        act = g.elementwise("act", dt * T * inter * 2, [up], saved=dt * T * inter, module="mlp")
    else:
        up = g.gemm("gate_up_proj", T, h, 2 * inter, [after], seq=True, module="mlp")
        act = g.elementwise("silu_mul", dt * T * inter * 3, [up], saved=dt * T * inter * 2, module="mlp")
    down = g.gemm("down_proj", T, inter, h, [act], module="mlp")
    if p.tp > 1:
        down = g.comm("mlp_tp_allreduce", "all_reduce", dt * T * h, "tp", p.tp, [down])
    return [down]


#: mixers whose input norm is a module of its own in Megatron-Core (not fused into the first GEMM): MLA's
#: ``input_layernorm=TENorm`` and DSA's (``fuse_input_layernorm: False``); Gated DeltaNet fuses it into ``in_proj``
#: (``fuse_input_layernorm: True``, ``megatron/core/models/gpt/experimental_attention_variant_module_specs.py``,
#: NVIDIA/Megatron-LM@d98e8a64ddf3), Mamba's ``MambaLayer`` keeps an ``IdentityOp`` norm before its fused ``in_proj``;
#: KDA and Lightning, without a Megatron-Core module, are taken as the other linear mixers (:func:`_separate_norms`)
_SEPARATE_INPUT_NORM = frozenset({"mla", "mla_sparse"})

#: linear mixers built in :mod:`tessera_lab.model.mixers` (attention name -> graph builder)
_LINEAR_MIXERS = {"kda": mixers.kda, "lightning": mixers.lightning, "mamba2": mixers.mamba2, "mamba": mixers.mamba1}


def _backward(fwd: _Fwd) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """Reverse the forward graph: B of a task waits for the B of every consumer; W of a task waits for
    the same input gradient (its consumers' B). A recomputed task's B also re-runs its forward (FLOPs and
    bytes; a recomputed collective moves its bytes again)."""
    consumers: dict[str, list[str]] = {t.name: [] for t in fwd.tasks}
    for t in fwd.tasks:
        for d in t.deps:
            consumers[d].append(t.name)
    b_tasks, w_tasks = [], []
    for t in reversed(fwd.tasks):
        deps = tuple(consumers[t.name])
        scale = fwd.b_scale.get(t.name, 1.0)
        again = 1.0 if t.name in fwd.recomputed else 0.0
        coll = t.collective
        if coll is not None and (again or scale != 1.0):  # a collective's B moves b_scale x its bytes (+1 re-run)
            coll = replace(coll, bytes=coll.bytes * (scale + again))
        # built field by field (dataclasses.replace costs twice as much, and a plan makes thousands of these)
        b_tasks.append(Task(t.name, t.layer, "B", t.op, t.flops * (scale + again),
                            t.bytes * ((2.0 if t.op == "elementwise" else 1.0) + again), coll, deps, t.deferrable,
                            0.0, t.gemms, t.groups))
        if t.name in fwd.weighted:
            w = fwd.weighted[t.name]
            w_tasks.append(Task(w.name, w.layer, "W", w.op, w.flops, w.bytes, w.collective, (), True, 0.0, w.gemms,
                                w.groups))
    return tuple(b_tasks), tuple(w_tasks)


def _full_recompute(g: _Fwd, keep: str) -> None:
    """Full recompute: every forward task re-runs in the backward and saves nothing but the layer input
    (kept by ``keep``)."""
    g.recomputed = {t.name for t in g.tasks}
    g.tasks = [t if t.name == keep else replace(t, saved_bytes=0.0) for t in g.tasks]


def _new_fwd(layer: int, p: ParallelConfig, *, recompute: bool = True) -> _Fwd:
    """An empty forward graph with the parallel config's recompute modules, saved GEMM-input bytes (1 under
    FP8) and sequence-parallel split (module docstring)."""
    modules: frozenset = frozenset()
    if recompute and p.recompute == "selective":
        modules = frozenset(p.recompute_modules) if p.recompute_modules else frozenset({"core_attn", "_experts"})
    return _Fwd(layer, p.dtype_bytes, recompute=p.recompute if recompute else "none", modules=modules,
                gemm_in=1.0 if p.precision == "fp8" else float(p.dtype_bytes),
                sp=p.tp if p.sequence_parallel and p.tp > 1 else 1)


def routing_load_note(model: ModelSpec, parallel: ParallelConfig) -> str:
    """One line stating the busiest-rank load the plan assumes and where it comes from."""
    load = rank_expert_load(model, parallel)
    how = ("given (--expert-load)" if parallel.expert_load is not None else
           "expected busiest of ep ranks under a balanced random router (binomial, Blom); skewed routing raises it")
    return f"expert load: the busiest EP rank gets {load:.4f} x the mean tokens, {how}; dispatcher {parallel.dispatcher}"


def rank_expert_load(model: ModelSpec, parallel: ParallelConfig) -> float:
    """The busiest EP rank's load factor the plan assumes: ``parallel.expert_load`` when set, else the expected
    busiest rank of a balanced random router (:func:`tessera_lab.model.ep_traffic.busiest_rank_load`; 1.0 for
    dense models and ep = 1)."""
    if parallel.expert_load is not None:
        return float(parallel.expert_load)
    if not model.has_moe or parallel.ep == 1:
        return 1.0
    return busiest_rank_load(parallel.tokens_per_rank, model.moe.num_experts_per_tok, parallel.ep)


def layer_tasks(model: ModelSpec, layer: LayerSpec | int, parallel: ParallelConfig, *, expert_load: float = 1.0) -> LayerTasks:
    """F, B and W tasks of one decoder layer for one micro-batch on one rank.

    Args:
        model: the model.
        layer: a layer of ``model`` (or its index).
        parallel: parallel sizes and batch shape (tokens per micro-batch, tp, ep, dtype).
        expert_load: tokens this rank's experts receive relative to the plan's busiest-rank share
            (:func:`rank_expert_load`; 1.0 = as planned; 2.0 = twice the tokens, as under skewed routing).

    Returns:
        LayerTasks whose F list is in forward program order and B list in backward program order.
        W tasks carry no dependencies inside their list: each may run any time after the B task of the
        same name (a scheduler enforces that across bundles).

    Raises:
        ConfigError: a layer index out of range, ``ep`` not dividing the experts, ``expert_load`` < 0.
    """
    if isinstance(layer, int):
        if not 0 <= layer < model.num_layers:
            raise ConfigError(f"field 'layer' = {layer} is out of range; allowed: 0 to {model.num_layers - 1}")
        layer = model.stack.layers[layer]
    if expert_load < 0:
        raise ConfigError(f"field 'expert_load' = {expert_load} is out of range; allowed: >= 0")
    p = parallel
    T, b, s = p.tokens_per_rank, p.micro_batch_size, p.seq_len  # T: this rank's tokens (seq_len / cp each)
    h, dt = model.hidden_size, p.dtype_bytes
    g = _new_fwd(layer.index, p)
    first, outs = None, []
    if layer.mtp:  # DeepSeek-V3 MTP module: enorm/hnorm of the embedding and the hidden state, eh_proj 2h -> h
        first = g.elementwise("mtp_norms", dt * T * h * 4, [], saved=dt * T * 2 * h / g.sp)
        outs = [g.gemm("eh_proj", T, 2 * h, h / p.tp, [first], seq=True)]
    if layer.mixer != NO_MIXER:
        n1 = g.elementwise("input_norm", dt * T * h * 2, outs, saved=dt * T * h / g.sp)
        first = first or n1
        a, start = layer.attention, len(g.tasks)
        if a == "gated_deltanet":
            mix = _mixer_gated_deltanet(g, model, T, p.tp, n1)
        elif a in ("mla", "mla_sparse"):
            mix = _mixer_mla(g, model, layer, T, b, s, p.tp, n1)
        elif a in _LINEAR_MIXERS:
            mix = _LINEAR_MIXERS[a](g, model, T, p.tp, n1)
        else:
            mix = _mixer_gqa(g, model, layer, T, b, s, p.tp, n1)
        if p.cp > 1:  # context parallelism: the mixer's exchange over the CP group (model/context_parallel.py)
            add_cp_comms(g, model, a, start, mix, T, p.tp, p.cp, layer)
        if p.tp > 1:
            mix = g.comm("attn_tp_allreduce", "all_reduce", dt * T * h, "tp", p.tp, [mix])
        outs = [mix]
    if layer.ffn != NO_FFN:
        n2 = g.elementwise("post_attn_norm", dt * T * h * 3, outs, saved=dt * T * h / g.sp)
        first = first or n2
        load = expert_load * rank_expert_load(model, p)
        outs = _ffn_moe(g, model, T, p, n2, load) if layer.ffn == MOE else _ffn_dense(g, model, layer, T, p, n2)
    res = g.elementwise("residual", dt * T * h * 3, outs)
    if layer.mtp:  # the shared head and a loss on the next-next token
        _head(g, model, p, T, res, prefix="mtp_")
    if "layernorm" in g.modules:
        _layernorm_recompute(g, model, _separate_norms(layer), dt * T * h / g.sp)
    if p.recompute == "full":
        _full_recompute(g, first)
    if p.fsdp:
        _fsdp_comms(g, model, p, layer.index)
    B, W = _backward(g)
    return LayerTasks(layer.index, layer.kind, tuple(g.tasks), B, W)


def _separate_norms(layer: LayerSpec) -> tuple[str, ...]:
    """The norms of a layer that are modules of their own, which Megatron's ``layernorm`` recompute covers
    (``TransformerLayer.__init__`` skips an ``IdentityOp`` norm). Megatron-Core's Transformer Engine GPT spec fuses
    the input norm into ``linear_qkv`` (``TELayerNormColumnParallelLinear``) for GQA/MHA self-attention and the
    pre-MLP norm into ``linear_fc1`` for a dense MLP, leaving those norms ``IdentityOp``; MLA and DSA keep a
    separate input norm (``TENorm``, :data:`_SEPARATE_INPUT_NORM`), an MoE layer a separate pre-MLP norm
    (``get_gpt_layer_with_transformer_engine_spec``, ``megatron/core/models/gpt/gpt_layer_specs.py``,
    NVIDIA/Megatron-LM@1e057005959b)."""
    fused_in = layer.mixer != NO_MIXER and layer.attention not in _SEPARATE_INPUT_NORM
    fused_mlp = layer.ffn not in (MOE, NO_FFN)
    return tuple(n for n, fused in (("input_norm", fused_in), ("post_attn_norm", fused_mlp)) if not fused)


def _layernorm_recompute(g: _Fwd, model: ModelSpec, norms: tuple[str, ...], out_bytes: float) -> None:
    """Megatron's ``layernorm`` recompute (output-discarding checkpoint of the separate input and pre-MLP norms,
    :func:`_separate_norms`): each norm's output (``out_bytes``, sequence-parallel) is freed after the forward and
    re-made by re-running the norm in the backward, so the GEMMs that keep it as their saved input (one storage with
    it in bf16; an FP8 GEMM keeps its own FP8 copy) and the router's gating GEMM (bf16 always) no longer hold it."""
    present = {t.name for t in g.tasks} & set(norms)
    g.recomputed |= present
    router = _router_keeps_norm_output(g, model)

    def holds(t: Task) -> bool:
        if not present.intersection(t.deps):
            return False
        return (t.op == "router" and router) or (t.op == "gemm" and g.gemm_in == g.dt and t.saved_bytes >= out_bytes)

    g.tasks = [replace(t, saved_bytes=max(0.0, t.saved_bytes - out_bytes)) if holds(t) else t for t in g.tasks]


def _fsdp_comms(g: _Fwd, model: ModelSpec, p: ParallelConfig, layer: int) -> None:
    """Megatron FSDP's per-layer collectives (``ParallelConfig.fsdp``): an all-gather of the layer's bf16
    parameters before its forward (dense over the ``edp`` group of :attr:`ParallelConfig.dense_shard_dp` ranks,
    routed experts over the ``dp`` group of :attr:`ParallelConfig.expert_dp`), the same all-gather again before
    its backward (the B of the gather task), and a reduce-scatter of its gradients (``grad_bytes`` each) after it
    (the W). Nothing in the layer waits on the gathers: Megatron FSDP prefetches the next layer's parameters while
    this one computes, so they overlap compute on their own link."""
    dense, expert = rank_params(model, p, layer)
    for name, n, group, size in (("fsdp_gather", dense, "edp", p.dense_shard_dp),
                                 ("fsdp_gather_experts", expert, "dp", p.expert_dp)):
        if n <= 0 or size < 2:
            continue
        gather = Collective("all_gather", p.dtype_bytes * n, group, size)
        scatter = Collective("reduce_scatter", p.grad_bytes * n, group, size)
        g.add(Task(name, g.layer, "F", "all_gather", 0.0, 0.0, gather, ()),
              w=Task(name, g.layer, "W", "reduce_scatter", 0.0, 0.0, scatter, (), True))


def rank_params(model: ModelSpec, parallel: ParallelConfig, layer: int) -> tuple[float, float]:
    """Parameters one GPU holds for one entry of ``decompose`` order, split ``(dense, expert)``.

    ``layer`` is a decoder layer index, ``-1`` for the input embedding or ``num_layers`` for the final norm and
    LM head. Dense parameters (mixer, shared expert, dense MLP, embedding, head) are split over ``tp``; norms and
    the router are replicated; routed experts are split over ``ep``.
    """
    p = parallel
    if layer < 0:
        return model.vocab.vocab_size * model.hidden_size / p.tp, 0.0
    if layer >= model.num_layers:
        head = 0 if model.vocab.tie_word_embeddings else model.vocab.vocab_size * model.hidden_size
        return head / p.tp + model.hidden_size, 0.0
    comp = model.layer_params(model.stack.layers[layer])
    dense = (comp["mixer"] + comp["shared"] + comp["dense_mlp"] + comp["mtp"]) / p.tp + comp["norms"] + comp["router"]
    return dense, comp["experts"] / p.ep


def embedding_tasks(model: ModelSpec, parallel: ParallelConfig) -> LayerTasks:
    """Input embedding of the first stage (layer index -1): a gather forward, a scatter-add W."""
    p, h, dt = parallel, model.hidden_size, parallel.dtype_bytes
    T = p.tokens_per_rank
    f = Task("embedding", -1, "F", "embedding", 0.0, dt * T * h * 2 + 8.0 * T)
    w = Task("embedding", -1, "W", "embedding", float(T * h), dt * T * h * 3, deferrable=True)
    return LayerTasks(-1, "embedding", (f,), (), (w,))


def head_tasks(model: ModelSpec, parallel: ParallelConfig) -> LayerTasks:
    """Final norm, LM head GEMM and cross-entropy loss of the last stage (layer index ``num_layers``)."""
    p = parallel
    T = p.tokens_per_rank
    g = _new_fwd(model.num_layers, p, recompute=False)
    _head(g, model, p, T, None)
    B, W = _backward(g)
    return LayerTasks(model.num_layers, "lm_head", tuple(g.tasks), B, W)


def _head(g: _Fwd, model: ModelSpec, p: ParallelConfig, T: int, after: str | None, prefix: str = "") -> None:
    """Final norm, LM head GEMM and loss (also an MTP layer's, on its shared head)."""
    h, dt, V = model.hidden_size, p.dtype_bytes, model.vocab.vocab_size
    n = g.elementwise(prefix + "final_norm", dt * T * h * 2, [after] if after else [], saved=dt * T * h / g.sp)
    head = g.gemm(prefix + "lm_head", T, h, V / p.tp, [n], seq=True)
    # unfused: fp32 log-softmax saved for the backward; fused (TE/Megatron cross-entropy fusion): the gradient is
    # written in place into the bf16 logits during the forward, so only those are kept
    loss_saved = (dt if p.fused_cross_entropy else 4.0) * T * V / p.tp
    g.add(Task(prefix + "loss", g.layer, "F", "loss", cross_entropy_flops(T, V) / p.tp, 4.0 * T * V * 2 / p.tp,
               deps=(head,), saved_bytes=loss_saved))


#: decompositions built in this process, keyed by ``(model, parallel, expert_load)``: one plan decomposes the same
#: model several times (stage costs, the bound lines); all three are frozen and hashable; oldest dropped past the bound
_DECOMPOSED: dict[tuple, tuple[LayerTasks, ...]] = {}
_DECOMPOSED_MAX = 32


def decompose(model: ModelSpec, parallel: ParallelConfig, *, expert_load: float = 1.0) -> list[LayerTasks]:
    """Tasks of every layer: the embedding, each decoder layer in order, then the LM head and loss (a new list of
    immutable :class:`LayerTasks`, built once per model, parallel config and expert load in a process)."""
    key = (model, parallel, float(expert_load))
    held = _DECOMPOSED.get(key)
    if held is None:
        held = (embedding_tasks(model, parallel),) + tuple(
            layer_tasks(model, layer, parallel, expert_load=expert_load) for layer in model.stack.layers
        ) + (head_tasks(model, parallel),)
        if len(_DECOMPOSED) >= _DECOMPOSED_MAX:
            del _DECOMPOSED[next(iter(_DECOMPOSED))]
        _DECOMPOSED[key] = held
    return list(held)


def p2p_activation_bytes(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Bytes one rank sends to the next pipeline stage per micro-batch (hidden states, or their gradient): its
    ``seq_len / cp`` tokens, split over TP."""
    return float(parallel.tokens_per_rank * model.hidden_size * parallel.dtype_bytes / parallel.tp)


def model_flops_per_iteration(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Model FLOPs of one training iteration of the whole job (all pipelines, all micro-batches).

    Megatron-LM convention (``num_floating_point_operations`` in ``megatron/training/training.py``):
    3 x the forward FLOPs of the GEMMs and the attention core (F + B + W), causal attention counted at
    half, MoE through top-k x expert width plus the shared expert, no recomputation. The router GEMM,
    norms, convolutions and element-wise work are not model FLOPs. Computed on an unsharded
    (tp = ep = 1) decomposition of one micro-batch and scaled to the global batch.
    """
    # one micro-batch of the unsharded model: the count, schedule and optimizer enter no model FLOP (nor any task but
    # FSDP's collectives), so they are normalised too and layouts that differ only there share one decomposition
    ref = parallel.replace(tp=1, ep=1, dp=1, pp=1, vpp=1, cp=1, expert_load=None, recompute="none", recompute_modules=(),
                           dispatcher="alltoall", ep_spans_tp=False, microbatches=1, schedule="1f1b", fsdp=False)
    per_mb = 0.0
    for lt in decompose(model, ref):
        per_mb += sum(t.flops for t in lt.F if t.op in MODEL_FLOP_OPS)
    sequences_factor = parallel.tokens_per_iteration / ref.tokens_per_microbatch
    return training_flops(per_mb) * sequences_factor
