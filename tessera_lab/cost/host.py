"""Host issue time: the CPU time eager PyTorch / Transformer Engine spends launching a task's kernels.

Megatron-LM trains in eager mode (the Megatron-Bridge performance recipes this project checks against set no CUDA
graph, ``perf_recipes/_common.py``), so every kernel costs the host ``host_s_per_kernel`` of issue time (Python,
pybind11, autograd, ATen dispatch, ``cudaLaunchKernel``). The GPU runs a task no faster than the host issues it:

    t_task = max(t_gpu, kernels(task) * host_s_per_kernel)

per task, because the MoE token dispatchers synchronise the host with the device in every MoE layer's forward
(Megatron's ``alltoall`` dispatcher copies the token counts to the host for the all-to-all splits; HybridEP's
blocking dispatch drains the compute stream, NVIDIA-NeMo/Automodel PR #3931), so the host cannot run far ahead.
The bound binds where many tiny kernels sit in one task: the per-expert loop of Transformer Engine's
``GroupedLinear`` (one cuBLAS GEMM per local expert, each FP8 operand quantized by its own kernels) when tokens
per expert are few. It is why fine-grained MoE benefits from CUDA graphs and sync-free kernels (NVIDIA,
"Boosting MoE Training Throughput with Advanced Fusion Kernels", 2026: sync-free MoE for full-iteration graphs).

Kernels per task (:func:`task_kernels`; counts in ``data/hardware/cost_model.json`` with their sources):

* GEMM (dense or one expert's): 1 per GEMM launch; in FP8 current scaling (Transformer Engine
  ``Float8CurrentScalingQuantizer``: ``nvte_compute_amax``, ``nvte_compute_scale_from_amax``, ``nvte_quantize``)
  ``fp8_quantize_kernels`` = 3 more per fresh operand: the input and the weight in F, the output gradient in B,
  none in W (it reuses the transposed copies the cast made). The weight is quantized once per step, not once per
  micro-batch: Megatron-Core calls ``set_is_first_microbatch()`` on the model at the first micro-batch of every
  step (``megatron/core/transformer/module.py``; the pipeline schedules call it through ``forward_step``), its TE
  wrappers pass ``is_first_microbatch`` to ``Linear`` / ``GroupedLinear.forward`` and clear it after the call
  (``megatron/core/extensions/transformer_engine.py``), and Transformer Engine then "allows caching of the FP8
  versions of the weights" between the micro-batches of a step (``transformer_engine/pytorch/module/linear.py``,
  ``grouped_linear.py``, docstring of ``is_first_microbatch``). This model charges per-micro-batch task costs, so
  the weight's quantize kernels are **amortised over the step's m micro-batches** (``1/m`` of them in each F):
  F counts ``1 + (1 + 1/m) x 3`` kernels per GEMM launch (``m = 1`` gives the uncached ``7``);
* attention core: ``attention_kernels_fwd`` / ``_bwd``; Gated DeltaNet core: ``linear_attention_kernels_fwd`` /
  ``_bwd`` (counted from flash-linear-attention's ``chunk_gated_delta_rule``);
* everything else (norms, router, permute, the fused SwiGLU, residual, a collective): 1 per phase, a lower bound
  (the recipes turn on Megatron's fused router, permute, RoPE and bias-activation kernels).

This module never imports torch.
"""

from __future__ import annotations

from typing import Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.model.tasks import Task


def task_kernels(task: Task, *, precision: str, grouped_impl: str, params: Mapping[str, float],
                 microbatches: int = 1) -> float:
    """Kernels the host launches for one task, per micro-batch (formula in the module docstring); 0 for zero-work
    tasks. May be fractional: FP8 weight quantization is amortised over ``microbatches``.

    Args:
        task: a compute or communication task.
        precision: ``bf16`` or ``fp8`` (the GEMMs' input type).
        grouped_impl: ``grouped`` (one launch per GEMM shape for all local experts), ``sequential`` or
            ``multistream`` (one launch per expert and GEMM shape).
        params: ``fp8_quantize_kernels``, ``attention_kernels_fwd/bwd``, ``linear_attention_kernels_fwd/bwd``.
        microbatches: micro-batches per step (``m >= 1``) sharing one FP8 weight cast (default 1: no caching).

    Raises:
        ConfigError: ``microbatches < 1``.
    """
    if microbatches < 1:
        raise ConfigError(f"field 'microbatches' = {microbatches!r} is out of range; allowed: an integer >= 1")
    if task.is_comm:
        return 1.0 if task.collective.bytes > 0 and task.collective.group_size > 1 else 0.0
    if task.flops <= 0 and task.bytes <= 0:
        return 0.0
    bwd = task.phase != "F"
    if task.op == "attention":
        return params["attention_kernels_bwd" if bwd else "attention_kernels_fwd"]
    if task.op == "linear_attention":
        return params["linear_attention_kernels_bwd" if bwd else "linear_attention_kernels_fwd"]
    if not task.gemms:
        return 1.0
    per_launch = 1.0
    if precision == "fp8" and task.op in ("gemm", "grouped_gemm"):
        # input + weight (cached after the first micro-batch: 1/m of a cast per micro-batch) in F, output gradient in B
        fresh = {"F": 1.0 + 1.0 / microbatches, "B": 1.0}.get(task.phase, 0.0)
        per_launch += fresh * params["fp8_quantize_kernels"]
    groups = task.groups if grouped_impl in ("sequential", "multistream") else 1
    extra = 1.0 if task.op == "router" else 0.0  # the fused top-k/score kernel after the gate GEMM
    return per_launch * len(task.gemms) * groups + extra


def host_issue_time(task: Task, *, precision: str, grouped_impl: str, params: Mapping[str, float],
                    microbatches: int = 1) -> float:
    """Host seconds to issue a task's kernels, per micro-batch: ``task_kernels * host_s_per_kernel``."""
    return task_kernels(task, precision=precision, grouped_impl=grouped_impl, params=params,
                        microbatches=microbatches) \
        * params["host_s_per_kernel"]
