"""The capacity report of an actual runner run (``tessera-lab report --observed RUN.json``, and ``run --plan``
with a calibrated device): :func:`tessera_lab.report.capacity.capacity_from_runner` with the tiny model's
model FLOPs (analytic, Megatron-LM convention: 3 x forward GEMM FLOPs, causal attention at half) and the
calibrated device's GEMM throughput per process as its "peak" (measured)."""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.cost.device import load_device
from tessera_lab.model.flops import gemm_flops, runner_layer_flops, training_flops
from tessera_lab.errors import ConfigError

__all__ = ["run_model_flops", "runner_capacity", "observed_report"]


def run_model_flops(job: Mapping[str, Any]) -> float:
    """Model FLOPs of one step of a runner job: ``3 x`` (forward FLOPs of every layer + LM head GEMM) over the
    step's tokens (analytic)."""
    from .specs import TinyConfig

    cfg = TinyConfig.from_dict(job["spec"]["model"]).as_dict()
    tokens = int(job["tokens_per_step"])
    kinds = TinyConfig.from_dict(job["spec"]["model"]).layer_kinds()
    fwd = sum(runner_layer_flops(cfg, k, tokens) for k in kinds) + gemm_flops(tokens, cfg["hidden_size"], cfg["vocab_size"])
    return training_flops(fwd)


def runner_capacity(job: Mapping[str, Any], device: Mapping[str, Any], step: int | None = None):
    """:class:`~tessera_lab.report.capacity.CapacityReport` of a job on a calibrated device."""
    from tessera_lab.report.capacity import capacity_from_runner

    peak = float(device["throughput"]["gemm_flop_per_s"])
    return capacity_from_runner(job, model_flops=run_model_flops(job), peak_flops=peak, step=step)


def observed_report(run_path: str, device_path: str | None) -> tuple[dict[str, Any], str]:
    """``(JSON dict, text)`` of ``report --observed RUN.json``: the capacity report of the run's first job.

    Raises:
        ConfigError: unreadable run file, not a runner result, or no device file.
    """
    from tessera_lab.io import read_json

    from .schemas import check_run_result

    data = read_json(run_path, "run file")
    if not isinstance(data, dict) or "jobs" not in data:
        raise ConfigError(f"run file '{run_path}' is not a runner result (no field 'jobs'); write one with "
                          "tessera-lab run --json")
    check_run_result(data, f"run file '{run_path}'")
    job = data["jobs"][0]
    if device_path is None:
        from tessera_lab.paths import data_dir

        found = sorted((data_dir() / "devices").glob("*.json"))
        if not found:
            raise ConfigError("report --observed needs --device FILE (a calibrated device: tessera-lab calibrate)")
        device_path = str(found[0])
    dev = load_device(device_path)
    rep = runner_capacity(job, dev)
    parts = {k: v for k, v in rep.parts.items()}
    text = [f"capacity report of an observed run ({run_path}): schedule {job['schedule']}, "
            f"{rep.gpus} processes, iteration {rep.iteration_time_s * 1e3:.2f} ms (observed), "
            f"MFU {rep.mfu:.2%} against the calibrated GEMM rate of {dev.get('name')} "
            f"({dev['throughput']['gemm_flop_per_s'] / 1e9:.2f} GFLOP/s per process, measured; a CPU run: the "
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
           "device": dev.get("name"), "notes": list(rep.notes), "ep_a2a_issued_s": inside}
    return out, "\n".join(text)
