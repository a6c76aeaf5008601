"""The sizes the layout search (:mod:`tessera_lab.plan.search`) tries per dimension: TP (:func:`tp_choices`) and CP
(:func:`cp_choices`), each by Megatron-Core's rules as ``plan`` checks them (docs/search.md, "What is enumerated")."""

from __future__ import annotations

import math

from tessera_lab.errors import ConfigError
from tessera_lab.model.spec import ModelSpec

#: context parallelism is tried only where each CP rank keeps at least this many tokens of a sequence (the search's
#: limit: below it the per-rank attention is short and the KV exchange is not hidden; ``plan --cp`` takes any size)
CP_MIN_TOKENS = 4096


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_choices(model: ModelSpec, gpus_per_node: int) -> list[int]:
    """TP sizes Megatron can run: divisors of every attention, key-value and linear-attention head count and of
    the GPUs of a node (the rule of :func:`tessera_lab.plan.make.check_parallel_for_model`)."""
    heads = [model.num_attention_heads, model.num_key_value_heads] + (
        [model.linear_num_key_heads] if model.linear_num_key_heads else [])
    return _divisors(math.gcd(gpus_per_node, *heads))


def cp_choices(model: ModelSpec, seq_len: int, tp: int, gpus_per_node: int) -> list[int]:
    """CP sizes the search tries with ``tp``: powers of two that Megatron-Core can run (``seq_len`` a multiple of
    ``2 cp``; the heads of every head-sharded mixer per TP rank a multiple of ``cp``,
    :func:`tessera_lab.model.context_parallel.check_heads`), with the ``tp x cp`` block inside one NVLink domain
    and at least :data:`CP_MIN_TOKENS` tokens of a sequence per CP rank (the search's limit, docs/search.md)."""
    from tessera_lab.model.context_parallel import check_heads

    out, cp = [], 1
    while tp * cp <= gpus_per_node and seq_len % (2 * cp if cp > 1 else 1) == 0 and (
            cp == 1 or seq_len // cp >= CP_MIN_TOKENS):
        try:
            for attention in {layer.attention for layer in model.layers}:
                check_heads(model, attention, tp, cp)
            out.append(cp)
        except ConfigError:
            pass
        cp *= 2
    return out
