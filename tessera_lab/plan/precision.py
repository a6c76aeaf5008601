"""Why an FP8 plan is faster or slower than the same plan in bf16: one note for ``plan --precision fp8``.

FP8 halves the GEMMs' time at the FP8 peak but, in Transformer Engine's current scaling, adds 3 quantize kernels
(amax, scale, cast) per fresh GEMM operand (the input in F, the output gradient in B; the weight once per step,
cached over the micro-batches: :mod:`tessera_lab.cost.host`) and their HBM bytes. In eager mode a task takes at
least ``kernels x host_s_per_kernel``, so where many small expert GEMMs sit in one task (fine-grained MoE, one
launch per local expert) the extra kernels make the host the bound and FP8 can be slower than bf16.
The comparison sums the decoder layers' compute tasks of one micro-batch, standalone (before F/B overlap, no
communication), with the same analytic cost model in both precisions (provenance: analytic).
"""

from __future__ import annotations

from typing import Any

from tessera_lab.cost.analytic import CostModel
from tessera_lab.model.hardware import Cluster, ParallelConfig
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import layer_tasks


def precision_terms(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> dict[str, dict[str, float]]:
    """Seconds per micro-batch summed over every decoder layer's compute tasks (F, B and W), per precision.

    Returns:
        ``{"fp8": terms, "bf16": terms}`` with terms ``gpu_s`` (roofline GPU time), ``host_s`` (eager issue time),
        ``task_s`` (sum of ``max(gpu, host)``), ``host_bound_s`` (``task_s`` of the tasks whose issue time is the
        bound) and ``kernels`` (kernels issued, per micro-batch).
    """
    out = {}
    for prec in ("fp8", "bf16"):
        par = parallel.replace(precision=prec)
        cm = CostModel(cluster, par)
        t = {"gpu_s": 0.0, "host_s": 0.0, "task_s": 0.0, "host_bound_s": 0.0, "kernels": 0.0}
        for layer in range(model.num_layers):
            lt = layer_tasks(model, layer, par)
            for ph in "FBW":
                for task in lt.phase(ph):
                    if task.is_comm:
                        continue
                    g, h = cm.gpu_time(task), cm.host_time(task)
                    t["gpu_s"] += g
                    t["host_s"] += h
                    t["task_s"] += max(g, h)
                    t["host_bound_s"] += h if h > g else 0.0
                    t["kernels"] += h / cm.a["host_s_per_kernel"]
        out[prec] = t
    return out


def precision_note(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, terms: dict[str, Any] | None = None
                   ) -> str:
    """One line: FP8 against bf16 on this plan's layers, and why (host-bound share of the FP8 compute time)."""
    t = terms or precision_terms(model, parallel, cluster)
    f, b = t["fp8"], t["bf16"]
    ratio = f["task_s"] / b["task_s"] if b["task_s"] > 0 else float("nan")
    verdict = "slower" if ratio > 1 else "faster"
    why = (f"{f['host_bound_s'] / f['task_s']:.0%} of the FP8 compute time is in host-bound tasks (bf16: "
           f"{b['host_bound_s'] / b['task_s']:.0%}): {f['kernels']:.0f} kernels to issue against {b['kernels']:.0f} "
           f"(3 quantize kernels per fresh GEMM operand, TE current scaling; weights cast once per step over "
           f"m={parallel.microbatches}), {f['host_s'] * 1e3:.1f} ms of issue at "
           f"{CostModel(cluster, parallel).a['host_s_per_kernel'] * 1e6:.0f} us per kernel (assumed, "
           "data/hardware/cost_model.json) against "
           f"{f['gpu_s'] * 1e3:.1f} ms of GPU work (bf16 {b['gpu_s'] * 1e3:.1f} ms)")
    return (f"precision fp8 is {verdict} than bf16 on these layers: {f['task_s'] * 1e3:.1f} ms against "
            f"{b['task_s'] * 1e3:.1f} ms of compute per micro-batch ({ratio - 1:+.0%}; decoder layers' F+B+W tasks "
            f"standalone, analytic); {why}"
            + ("; one grouped expert GEMM kernel (--grouped-gemm grouped) or CUDA graphs remove most of the issue "
               "time" if f["host_bound_s"] > 0.5 * f["task_s"] else ""))
