"""Memory per pipeline stage: parameters, gradients and optimizer state plus activations in flight.

Bytes per parameter (docs/concepts.md, "Memory per stage"; Megatron-LM mixed precision with Adam): bf16 weights (2) +
gradient buffer (4 in fp32, Megatron-LM's default for bf16, or 2 with ``grad_reduce_dtype = bf16``; the
gradient sync moves the same dtype, :attr:`ParallelConfig.grad_sync_bytes_per_param`) + fp32 master weights,
Adam m and v (12) = 18 (16); with a distributed optimizer the 12 bytes of optimizer state are sharded over the
data-parallel ranks: ``6 + 12 / dp`` (``4 + 12 / dp``) (Rajbhandari et al., ZeRO stage 1).

Capacity: what the device reports (nvidia-smi ``memory.total`` in MiB, ``data/hardware/hardware.json``) minus
the reserve of ``data/hardware/cost_model.json`` (CUDA context, NCCL buffers, fragmentation).

Recomputation (``ParallelConfig.recompute``) changes the saved bytes of the forward tasks
(:mod:`tessera_lab.model.tasks`): ``selective`` keeps the attention core's inputs instead of its outputs and
the routed experts' input instead of their intermediate activations (re-running the expert GEMMs in the
backward); ``full`` keeps only each layer's input; ``selective`` with ``recompute_modules`` follows Megatron-LM's
module names (:mod:`tessera_lab.model.tasks`). Expert parameters are data-parallel over ``ParallelConfig.expert_dp``
ranks (``tp * dp * cp``: with expert TP 1 each TP rank sits in its own EP group, or ``dp * cp`` when the EP group
spans the TP ranks); the rest of a stage over ``ParallelConfig.dense_shard_dp`` ranks (``ep * dp * cp``, or
``ep / tp * dp * cp`` when the EP group spans the TP ranks; CP ranks hold the same parameters; see
:mod:`tessera_lab.model.hardware`). With a distributed optimizer the optimizer state
(``ParallelConfig.optimizer_state_bytes``: fp32 master weights and Adam's moments, 12 bytes, or 8 with bf16
moments as Megatron-Core's precision-aware optimizer keeps them) is sharded over those ranks; with Megatron FSDP
(``ParallelConfig.fsdp``) the bf16 weights and the gradient buffer too, and each GPU also holds the unsharded
parameters of the layer it computes and the one it prefetches, and one layer's unsharded gradients
(:func:`fsdp_buffer_bytes`).

Activations: the ``saved_bytes`` of every forward task of the stage's layers (:mod:`tessera_lab.model.tasks`: what
Megatron-Core's modules keep for the backward, read at NVIDIA/Megatron-LM@1e057005959b; an MoE block keeps the
router's logits and input, the permute's row-id map and the experts' inputs, and its unpermute no tokens, since the
routing probabilities are applied in the experts' weighted SwiGLU; docs/design-notes.md, "Memory") per micro-batch, times the micro-batches in flight on that stage at its peak for the schedule (a micro-batch
is in flight from the start of its F to the end of its B, or of its W when the backward is split). These
closed forms equal the peaks of :mod:`tessera_lab.pipeline.schedules`' action lists in the simulator (tested):
GPipe ``m``; 1F1B ``min(p - s, m)`` on stage ``s`` of ``p``; overlapped 1F1B ``min(2 (p - s), m)`` (its warm-up
runs ``2 (p - 1 - s) + 1`` forwards so that each pair's inputs are ready); ZB-H1 ``min(p, m)`` on every stage
(W is deferred, Qi et al., ICLR 2024); ZB-H2 ``min(2p - 1, m)`` on every stage (the paper's ``2p - 1``); interleaved 1F1B with v chunks
``min(2 (p - s - 1) + (v - 1) p + 1, v m)`` chunk-micro-batches of ``1/v`` of the stage's layers each
(Megatron-LM's interleaved warm-up count plus the micro-batch in its first backward); interleaved with the EP
overlap (Megatron's combined 1F1B, ``interleaved-overlapped``) one chunk-micro-batch more, its extra warm-up
micro-batch (``get_pp_rank_microbatches`` with ``overlap_moe_expert_parallel_comm``,
``megatron/core/pipeline_parallel/schedules.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import Cluster, ParallelConfig, cost_assumptions
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import LayerTasks, rank_params

GIB = 2**30


def bytes_per_param(parallel: ParallelConfig, dp_degree: int) -> float:
    """Training-state bytes per parameter: ``2 + g + o`` (18 with fp32 gradients, 16 with bf16), or
    ``2 + g + o/dp_degree`` with a distributed optimizer, ``(2 + g + o)/dp_degree`` with Megatron FSDP
    (``g`` = :attr:`ParallelConfig.grad_bytes`, ``o`` =
    :attr:`ParallelConfig.optimizer_state_bytes`: 12, or 8 with bf16 Adam moments)."""
    base = 2.0 + parallel.grad_bytes
    state = parallel.optimizer_state_bytes
    if parallel.fsdp:
        return (base + state) / dp_degree
    if parallel.distributed_optimizer:
        return base + state / dp_degree
    return base + state


def in_flight(schedule: str, pp: int, stage: int, m: int, vpp: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` of ``pp`` holds at its peak, in units of the whole
    stage's activations per micro-batch (formulas in the module docstring).

    Raises:
        ConfigError: a schedule without a stage-per-rank memory formula (DualPipeV holds two stages per rank).
    """
    p, s = pp, stage
    if schedule == "gpipe":
        return float(m)
    if schedule == "1f1b":
        return float(min(p - s, m))
    if schedule == "overlapped":
        return float(min(2 * (p - s), m))
    if schedule == "zb-h1":
        return float(min(p, m))
    if schedule == "zb-h2":
        return float(min(2 * p - 1, m))
    if schedule == "interleaved":
        return min(2 * (p - s - 1) + (vpp - 1) * p + 1, vpp * m) / vpp
    if schedule == "interleaved-overlapped":
        # Megatron's combined 1F1B with VP: one more warm-up micro-batch (get_pp_rank_microbatches,
        # megatron/core/pipeline_parallel/schedules.py, overlap_moe_expert_parallel_comm), so one chunk more
        return min(2 * (p - s - 1) + (vpp - 1) * p + 2, vpp * m) / vpp
    raise ConfigError(f"schedule {schedule!r} has no memory model; allowed: gpipe, 1f1b, overlapped, zb-h1, zb-h2, "
                      "interleaved, interleaved-overlapped")


@dataclass(frozen=True)
class LayerMemory:
    """Per-layer memory inputs: parameter bytes on one GPU and activation bytes per micro-batch."""

    param_bytes: float
    activation_bytes: float


def gpu_params(model: ModelSpec, parallel: ParallelConfig, layer: int) -> tuple[float, float]:
    """Parameters one GPU holds for one entry of ``decompose`` order, split ``(dense, expert)``
    (:func:`tessera_lab.model.tasks.rank_params`, the one owner of that split)."""
    return rank_params(model, parallel, layer)


def fsdp_buffer_bytes(model: ModelSpec, parallel: ParallelConfig) -> float:
    """Bytes per GPU that Megatron FSDP holds unsharded on top of the shards: the bf16 parameters of two layers
    (the one computing and the one prefetched) and one layer's gradients before their reduce-scatter
    (``grad_bytes`` each), for the largest decoder layer; 0 without ``fsdp``."""
    if not parallel.fsdp:
        return 0.0
    largest = max(sum(rank_params(model, parallel, i)) for i in range(model.num_layers))
    return largest * (2.0 * parallel.dtype_bytes + parallel.grad_bytes)


def layer_memory(model: ModelSpec, parallel: ParallelConfig, tasks: Sequence[LayerTasks]) -> list[LayerMemory]:
    """Memory of the embedding, every decoder layer and the LM head (same order as ``decompose``).

    Parameter bytes on one GPU (:func:`gpu_params`) times the bytes per parameter of each part's data-parallel
    degree (:attr:`ParallelConfig.dense_shard_dp` for dense parameters, :attr:`ParallelConfig.expert_dp` for experts).
    """
    p = parallel
    dense_bpp = bytes_per_param(p, p.dense_shard_dp)
    expert_bpp = bytes_per_param(p, p.expert_dp)
    out = []
    for lt in tasks:
        dense, expert = gpu_params(model, p, lt.layer)
        out.append(LayerMemory(dense * dense_bpp + expert * expert_bpp, sum(t.saved_bytes for t in lt.F)))
    return out


def memory_reserve_gib() -> float:
    """GiB per GPU held back for the CUDA context, NCCL buffers and fragmentation (``memory_reserve_gib`` of
    ``data/hardware/cost_model.json``, an assumption)."""
    return float(cost_assumptions()["memory_reserve_gib"])


def memory_capacity(cluster: Cluster) -> float:
    """Bytes usable per GPU: HBM minus the cluster's reserve (:attr:`~tessera_lab.model.hardware.Cluster.
    memory_reserve_gib`, by default :func:`memory_reserve_gib`)."""
    return cluster.gpu.memory_bytes - cluster_reserve_gib(cluster) * GIB


def cluster_reserve_gib(cluster: Cluster) -> float:
    """GiB per GPU the cluster holds back: its own ``memory_reserve_gib`` or the data file's default."""
    r = getattr(cluster, "memory_reserve_gib", None)
    return memory_reserve_gib() if r is None else float(r)
