"""A calibrated device (``data/devices/NAME.json``) and the prediction of the runner's iteration time from it.

``tessera-lab calibrate`` (:mod:`tessera_lab.runner.testbed.calibrate`) measures on this machine, at the runner's
shapes: per layer kind, forward and backward times at two model widths (fitted as ``t = overhead + flops /
rate``, so the intercept is the per-action overhead: Python dispatch, small kernels), the embedding and LM
head, GEMM and memory throughput, and gloo point-to-point and all-to-all latency and bandwidth at the
runner's group sizes. The file records the date, torch version, CPU, core count and machine load.

Prediction (:func:`tessera_lab.runner.testbed.predict.predict_runner`, no torch): per stage, the CPU work of forward /
backward = the sum of its layers' fitted times + the embedding / LM head, times ``runner_cpu[ep].factor`` (the
runner's own CPU per step in one-stage calibration jobs against these microbenchmarks: node-level execution,
EP replicas each paying Python dispatch, all-to-all CPU), plus the CPU of its sends and receives
(``p2p.cpu_per_op_s``); with ``ep > 1`` each layer action is also blocked ``runner_cpu[ep].blocked_s`` on its
all-to-all peers (no CPU: gloo's waits sleep, ``p2p.wait_cpu_share`` ~0.01 measured). Then processor
sharing over the schedule's timeline (:mod:`tessera_lab.runner.testbed.sharing`): the computing processes share the
cores available to the job, measured before the run; stage-to-stage transfers take ``alpha + bytes / beta``.
Overlapped pairs are priced as forward + backward work (no hiding assumed). Provenance of every number:
*measured* (the device file), *analytic* (FLOP counts of the tiny model), *predicted* (the simulation).

Errors: a device file that is missing, unreadable or of another schema raises
:class:`~tessera_lab.errors.ConfigError` naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.model.flops import RUNNER_KINDS, runner_layer_flops

__all__ = ["DEVICE_SCHEMA", "load_device", "layer_times", "alpha_beta", "a2a_entry", "cost_source"]

DEVICE_SCHEMA = 1
KINDS = RUNNER_KINDS


def _device_schema():
    from tessera_lab.checks import MAX_TIME_S
    from tessera_lab.schema import F, seconds

    points = F("list", low=1, limit="costs", items=F("list", low=2, high=2, items=F("num", low=0.0, high=1e30)))
    layer = F("dict", fields={"F": points, "B": points, "w_share": F("num", low=0.0, high=1.0, required=False)})
    fit = F("dict", fields={"alpha_s": seconds(), "bytes_per_s": F("num", low=0.0, high=1e30)})
    return F("dict", fields={
        "name": F("str", required=False),
        "layers": F("map", low=1, limit="costs", values=layer),
        "extras": F("map", values=F("num", low=0.0, high=MAX_TIME_S)),
        "throughput": F("dict", required=False, fields={
            "gemm_flop_per_s": F("num", low=0.0, low_open=True, high=1e30),
            "memory_bytes_per_s": F("num", low=0.0, low_open=True, high=1e30, required=False)}),
        "p2p": fit,
        "all_to_all": F("map", limit="ep", values=fit),
        "metadata": F("dict", fields={"cores": F("int", low=1, high=1 << 20, null=True, required=False)}),
        "runner_cpu": F("dict", required=False),
    })


DEVICE_FILE = _device_schema()


def load_device(path: str | Path) -> dict[str, Any]:
    """Read and check a calibrated device file.

    Raises:
        ConfigError: missing file, invalid JSON, wrong ``kind`` / ``schema_version``, missing fields.
    """
    from tessera_lab.io import read_json
    from tessera_lab.schema import validate

    p = Path(path)
    data = read_json(p, "device file")  # missing, unreadable, not UTF-8, too large, invalid JSON: one line
    if not isinstance(data, dict) or data.get("kind") != "calibrated_device" or data.get("schema_version") != DEVICE_SCHEMA:
        raise ConfigError(f"'{p}' is not a calibrated device: field 'kind' must be 'calibrated_device' and "
                          f"'schema_version' {DEVICE_SCHEMA} (write one with tessera-lab calibrate --out {p})")
    validate(data, DEVICE_FILE, f"device file '{p}'")
    data["_path"] = str(p)
    return data


def cost_source(device: Mapping[str, Any]) -> dict[str, Any]:
    """The plan's cost provenance for a calibrated device: ``"calibrated device NAME"`` with path and date."""
    meta = device["metadata"]
    return {"source": f"calibrated device {device.get('name', '?')}", "kind": "calibrated_device",
            "path": device.get("_path"), "device": meta.get("device"), "date": meta.get("date"),
            "torch": meta.get("torch")}


def _fit_line(points: Sequence[Sequence[float]]) -> tuple[float, float]:
    """Least-squares ``t = a + b x`` through ``(x, t)`` points (``b >= 0``, ``a >= 0``); one point: ``a = 0``."""
    pts = [(float(x), float(t)) for x, t in points]
    if len(pts) == 1 or len({x for x, _ in pts}) == 1:
        x, t = pts[0]
        return 0.0, (t / x if x > 0 else 0.0)
    n = len(pts)
    mx, mt = sum(x for x, _ in pts) / n, sum(t for _, t in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = max(0.0, sum((x - mx) * (t - mt) for x, t in pts) / sxx)
    a = mt - b * mx
    if a < 0:
        b, a = sum(x * t for x, t in pts) / sum(x * x for x, _ in pts), 0.0
    return a, b


def layer_times(device: Mapping[str, Any], cfg: Mapping[str, Any], kind: str, tokens: int) -> dict[str, float]:
    """Fitted single-process ``{"F", "B", "W"}`` seconds of one layer (``B`` includes ``W``), ep = 1."""
    entry = device["layers"].get(kind)
    if entry is None:
        raise ConfigError(f"device '{device.get('name')}' has no calibration for layer kind {kind!r}")
    x = runner_layer_flops(cfg, kind, tokens)
    out = {}
    for ph in ("F", "B"):
        a, b = _fit_line(entry[ph])
        out[ph] = a + b * x
    out["W"] = out["B"] * float(entry.get("w_share", 0.33))
    return out


def alpha_beta(entry: Mapping[str, Any], nbytes: float) -> float:
    return float(entry["alpha_s"]) + (nbytes / float(entry["bytes_per_s"]) if entry["bytes_per_s"] > 0 else 0.0)


def a2a_entry(device: Mapping[str, Any], ep: int) -> Mapping[str, Any]:
    table = device["all_to_all"]
    if str(ep) in table:
        return table[str(ep)]
    sizes = sorted(int(s) for s in table)
    return table[str(min(sizes, key=lambda s: abs(s - ep)))]
