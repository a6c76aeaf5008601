"""The capacity report of an actual runner run (``tessera-lab report --observed RUN.json``):
:func:`tessera_lab.report.breakdown.capacity_from_runner` with the run's model FLOPs (analytic, given by the
caller: Megatron-LM convention, 3 x forward GEMM FLOPs, causal attention at half) and the calibrated device's GEMM
throughput per process as its "peak" (measured). Works on the run file's data; reading and checking the file is
the caller's (the runner owns its result schema)."""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.report.breakdown import CapacityReport, capacity_from_runner

__all__ = ["runner_capacity", "observed_report"]


def runner_capacity(job: Mapping[str, Any], device: Mapping[str, Any], model_flops: float,
                    step: int | None = None) -> CapacityReport:
    """:class:`~tessera_lab.report.breakdown.CapacityReport` of a runner job (a run file's ``jobs[i]``) on a
    calibrated device (``device["throughput"]["gemm_flop_per_s"]``, FLOP/s per process, measured);
    ``model_flops``: model FLOPs of one step (analytic)."""
    peak = float(device["throughput"]["gemm_flop_per_s"])
    return capacity_from_runner(job, model_flops=model_flops, peak_flops=peak, step=step)


def observed_report(run_path: str, job: Mapping[str, Any], device: Mapping[str, Any],
                    model_flops: float) -> tuple[dict[str, Any], str]:
    """``(JSON dict, text)`` of ``report --observed RUN.json`` for one job of the run file ``run_path`` (named in
    the text only), on a calibrated device, with the step's model FLOPs (analytic)."""
    rep = runner_capacity(job, device, model_flops)
    parts = {k: v for k, v in rep.parts.items()}
    text = [f"capacity report of an observed run ({run_path}): schedule {job['schedule']}, "
            f"{rep.gpus} processes, iteration {rep.iteration_time_s * 1e3:.2f} ms (observed), "
            f"MFU {rep.mfu:.2%} against the calibrated GEMM rate of {device.get('name')} "
            f"({device['throughput']['gemm_flop_per_s'] / 1e9:.2f} GFLOP/s per process, measured; a CPU run: the "
            f"share of that rate, not a GPU figure)"]
    total = sum(parts.values()) or 1.0
    for k, v in parts.items():
        text.append(f"  {k:<28} {v * 1e3:9.2f} ms x process  ({v / total:6.1%} of lost time)")
    step = max(e["step"] for e in job["events"])
    inside = sum(e["end"] - e["start"] for e in job["events"]
                 if e["step"] == step and e["lane"] == "comm" and e["type"] == "ep_a2a")
    text += ["  compute_unsplit: compute beyond the model FLOPs at the calibrated rate (the runner's median "
             "action times are not split by cost-model term)",
             "  routing_variance: this step's deviation from the median action times (negative: faster than "
             "the medians); routing variance across routings is `report --dynamic`"]
    if inside > 0:
        text.append(f"  EP all-to-all issued in this step: {inside * 1e3:.2f} ms x process (events ep_a2a); "
                    f"exposed_ep_all_to_all counts only the time a rank idles under one, and an all-to-all inside "
                    f"a running F or B (monolithic autograd, or waited inside a pair) is in that action's compute")
    out = {"source": rep.source, "iteration_s": rep.iteration_time_s, "processes": rep.gpus, "mfu": rep.mfu,
           "model_flops": rep.model_flops, "peak_flops": rep.peak_flops, "parts_s": parts,
           "device": device.get("name"), "notes": list(rep.notes), "ep_a2a_issued_s": inside}
    return out, "\n".join(text)
