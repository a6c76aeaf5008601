"""Context parallelism (CP) in a layer's task graph: what each mixer kind sends over the CP group, and where.

With ``cp > 1`` every rank holds ``T = micro_batch_size * seq_len / cp`` tokens of each micro-batch (Megatron's
load-balanced causal split: the sequence in ``2 cp`` chunks, rank ``i`` holding chunks ``i`` and ``2 cp - 1 - i``,
so every rank has the same share of the causal (query, key) pairs). Norms, projections, MoE and MLP work on those
tokens unchanged. The mixers exchange data over the ``cp`` group (the ``cp`` ranks ``tp`` apart,
:meth:`~tessera_lab.model.hardware.ParallelConfig.group_ranks`), as Megatron-Core runs them:

* **Full attention** (GQA, MLA, DeepSeek sparse attention): Transformer Engine's ``cp_comm_type = "p2p"``
  (Megatron's default, ``--cp-comm-type``): the KV chunks travel a ring, ``cp - 1`` steps, each overlapped with the
  attention of the chunk already there
  (``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``, ``AttnFuncWithCPAndKVP2P``,
  ``flash_attn_p2p_communicate``: KV in the forward, KV and dKV in the backward; TransformerEngine commit
  ``9c61cd7e5e0c93217ad38d4682568ff5dde4f08b``). Each rank sends ``(cp - 1) x KV`` bytes, ``KV = T x kv_width x
  dtype``; priced as an all-gather of ``S = cp x KV`` (nccl-tests' ``S``, time ``S (cp-1)/cp / B``, the same bytes
  per link as the ring and as ``cp_comm_type = "all_gather"``). The backward sends the KV around again and the KV
  gradients back: twice the forward bytes. The attention core's FLOPs are the sequence's causal pairs over ``cp``.
* **Mamba-2** (``megatron/core/ssm/mamba_context_parallel.py``, ``MambaContextParallel.pre_conv_ssm`` /
  ``post_conv_ssm``): an all-to-all from sequence to head sharding of the in-projection's output (z, x, B, C, dt; B
  and C repeated to ``cp`` groups when the rank has fewer SSM groups than ``cp``) before the convolution and the
  scan, and an all-to-all back of the scan's output before the out-projection. Each all-to-all's ``S`` is the rank's
  whole buffer, ``T x width x dtype`` (it keeps ``1/cp`` of it).
* **Gated DeltaNet** (``megatron/core/ssm/gated_delta_net/gdn.py`` and ``common.py``: ``a2a_cp_to_hp`` of the whole
  in-projection output ``qkvzba``, ``a2a_hp_to_cp`` of the gated norm's output): the same two all-to-alls.
* **KDA, lightning attention, Mamba-1**: Megatron-Core has no CP for them; assumed to run as its Gated DeltaNet does
  (head sharding: the in-projection's output all-to-all'd before the convolution and recurrence, the gated output
  back before the out-projection), since each head's recurrence is independent. The alternative of passing the
  recurrent state between CP ranks (flash-linear-attention's GDN CP, ``fla/ops/chunk_cp.py`` as its
  ``tests/cp/README.md`` lists it, commit ``a5a967c1600cc4841fd8642ad64d5c43e9bcfc83``) moves less (one ``d_k x
  d_v`` state per head) but serialises the ranks along the sequence; it is not modelled.

The backward of an all-to-all is the reverse all-to-all of the same bytes. Commit read: Megatron-LM
``d98e8a64ddf34856e74b24714e3bedb2f5a39553``. Rationale and worked examples: docs/context-parallel.md.
"""

from __future__ import annotations

from dataclasses import replace

from tessera_lab.errors import ConfigError
from tessera_lab.model.graph import Collective, Task, _Fwd

#: mixers that Megatron-Core runs head-sharded under CP (an all-to-all before and after the recurrence)
HEAD_SHARDED = ("gated_deltanet", "kda", "lightning", "mamba2", "mamba")


def kv_width(model, attention: str, tp: int, layer=None) -> float:
    """Elements per token of the K and V one rank passes around the CP ring (per TP rank).

    GQA: ``kv_heads / tp x (head_dim + v_head_dim)`` (at least one KV head a TP rank), the layer's own shapes when
    ``layer`` (a :class:`~tessera_lab.model.hf_families.LayerSpec`) has them (MiMo-V2-Flash, Gemma-4's global
    layers), else the model's; MLA (``mla``, ``mla_sparse``): the up-projected
    ``heads / tp x (qk_nope + qk_rope + v_head_dim)``, the K and V Transformer Engine's attention gets.
    """
    if attention in ("mla", "mla_sparse"):
        return model.attention.num_attention_heads / tp * (model.attention.qk_nope_head_dim + model.attention.qk_rope_head_dim + model.attention.v_head_dim)
    if layer is not None:
        from tessera_lab.model.kinds import gqa_shape

        _, nkv, hd, vd = gqa_shape(model, layer)
        return max(nkv / tp, 1) * (hd + vd)
    return 2.0 * max(model.attention.num_key_value_heads / tp, 1) * model.attention.head_dim


def attention_ring_bytes(model, attention: str, tokens: float, tp: int, cp: int, dtype_bytes: int,
                         layer=None) -> float:
    """nccl-tests ``S`` of the forward KV ring of one full-attention layer, bytes: ``cp x tokens x kv_width x dtype``
    (``tokens`` = the rank's ``T``); each rank sends ``(cp - 1) / cp`` of it. 0 when ``cp = 1``."""
    if cp <= 1:
        return 0.0
    return float(cp * tokens * kv_width(model, attention, tp, layer) * dtype_bytes)


def mamba2_in_width(model, tp: int, cp: int) -> float:
    """Elements per token of a Mamba-2 layer's sequence-to-head all-to-all: ``2 inner + 2 g' N + heads`` per TP rank,
    ``g' = max(groups / tp, cp)`` (B and C repeated to ``cp`` groups when the rank has fewer, Megatron's
    ``group_repeat_count``)."""
    inner = model.linear.mamba_num_heads * model.linear.mamba_head_dim / tp
    groups = max(model.linear.mamba_n_groups / tp, cp)
    return 2 * inner + 2 * groups * model.linear.ssm_state_size + model.linear.mamba_num_heads / tp


def check_heads(model, attention: str, tp: int, cp: int) -> None:
    """Raise ConfigError when a head-sharded mixer's heads per TP rank are not a multiple of ``cp`` (Megatron-Core
    asserts it, ``mamba_context_parallel.py`` and ``gated_delta_net/common.py``)."""
    heads = {"gated_deltanet": "linear_num_key_heads", "kda": "linear_num_value_heads", "lightning": "num_attention_heads",
             "mamba2": "mamba_num_heads", "mamba": None}.get(attention)
    n = model.value(heads, 0) if heads else 0
    if heads and n and (n // tp) % cp:
        raise ConfigError(f"field 'cp' = {cp} does not divide the {n // tp} {attention} heads per TP rank "
                          f"({heads} {n} / tp {tp}); allowed: cp dividing them (head sharding under CP)")


def _insert(g: _Fwd, index: int, task: Task, b_scale: float = 1.0) -> str:
    g.tasks.insert(index, task)
    g.b_scale[task.name] = b_scale
    return task.name


def _rewire(g: _Fwd, old: str, new: str, skip: str) -> None:
    """Every task but ``skip`` that waits on ``old`` waits on ``new`` instead."""
    g.tasks = [t if t.name == skip or old not in t.deps else replace(t, deps=tuple(new if d == old else d
                                                                                   for d in t.deps)) for t in g.tasks]


def add_cp_comms(g: _Fwd, model, attention: str, start: int, out: str, tokens: float, tp: int, cp: int,
                 layer=None) -> None:
    """Add the CP communication of the mixer whose forward tasks are ``g.tasks[start:]`` (its last task ``out``).

    Full attention: the attention core's FLOPs over ``cp`` and a ``cp_kv`` ring (all-gather ``S`` of
    :func:`attention_ring_bytes`, backward twice the bytes) issued with the core's inputs and waited for by the
    core's consumers, so the ring overlaps the core. Head-sharded mixers (:data:`HEAD_SHARDED`): ``cp_a2a_in`` after
    the first projection (``S = tokens x its output width x dtype``; Mamba-2: :func:`mamba2_in_width`) and
    ``cp_a2a_out`` before ``out`` (``S = tokens x out's input width x dtype``). ``tokens``: the rank's ``T``;
    ``layer``: the layer (its own attention shapes size the ring).
    """
    dt = g.dt
    if attention in HEAD_SHARDED:
        check_heads(model, attention, tp, cp)
        first = next(t for t in g.tasks[start:] if t.op == "gemm")
        width = mamba2_in_width(model, tp, cp) if attention == "mamba2" else first.gemms[0][2]
        i = g.tasks.index(first) + 1
        a2a = _insert(g, i, Task("cp_a2a_in", g.layer, "F", "all_to_all", 0.0, 0.0,
                                 Collective("all_to_all", dt * tokens * width, "cp", cp), (first.name,)))
        _rewire(g, first.name, a2a, skip=a2a)
        last = next(t for t in g.tasks if t.name == out)
        j = g.tasks.index(last)
        back = _insert(g, j, Task("cp_a2a_out", g.layer, "F", "all_to_all", 0.0, 0.0,
                                  Collective("all_to_all", dt * tokens * last.gemms[0][1], "cp", cp), last.deps))
        g.tasks[j + 1] = replace(last, deps=(back,))
        return
    core = next((t for t in g.tasks[start:] if t.op == "attention" and t.name == "core"), None)
    if core is None:
        return
    i = g.tasks.index(core)
    g.tasks[i] = replace(core, flops=core.flops / cp)
    ring = _insert(g, i, Task("cp_kv", g.layer, "F", "all_gather", 0.0, 0.0,
                              Collective("all_gather", attention_ring_bytes(model, attention, tokens, tp, cp, dt,
                                                                            layer), "cp", cp), core.deps),
                 b_scale=2.0)
    if core.name in g.recomputed:
        g.recomputed.add(ring)  # recomputing the core re-runs its ring
    g.tasks = [replace(t, deps=t.deps + (ring,)) if core.name in t.deps else t for t in g.tasks]
