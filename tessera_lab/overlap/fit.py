"""Fitting the analytic contention term to measured pairs (torch-free), from results or from a profile's
stored samples."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tessera_lab.cost.analytic import Contention
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.errors import ConfigError

from .results import OverlapResult

__all__ = ["ContentionFit", "fit_sample", "fit_contention", "fit_contention_samples"]


# ---------------------------------------------------------------------- contention fit
@dataclass(frozen=True)
class ContentionFit:
    """Result of :func:`fit_contention`: the fitted slowdowns, the RMS relative error of ``t_ab`` and the
    number of pairs used."""

    contention: Contention
    rms_relative_error: float
    pairs: int

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"compute", "comm", "rms_relative_error", "pairs"}``."""
        return {"compute": self.contention.compute, "comm": self.contention.comm,
                "rms_relative_error": self.rms_relative_error, "pairs": self.pairs}


def fit_sample(m: OverlapResult) -> dict[str, Any]:
    """The data one measured pair contributes to :func:`fit_contention_samples` (JSON-ready): its issue order,
    standalone per-task durations, lanes, dependencies and measured ``t_ab`` (seconds)."""
    return {"order": list(m.order), "durations": dict(m.durations), "lanes": dict(m.lanes),
            "deps": {k: list(v) for k, v in m.deps.items()}, "t_ab": m.t_ab}


def fit_contention(measurements: Sequence[OverlapResult], *, max_slowdown: float = 3.0, step: float = 0.05) -> ContentionFit:
    """Fit the analytic contention (compute and comm slowdowns) to measured pairs
    (:func:`fit_contention_samples` over :func:`fit_sample` of each).

    Raises:
        ConfigError: no measurements, or a measurement without durations and order.
    """
    ms = list(measurements)
    if not ms:
        raise ConfigError("field 'measurements' is empty; allowed: at least one OverlapResult")
    for m in ms:
        if not m.durations or not m.order or m.t_ab <= 0:
            raise ConfigError(f"measurement {m.a}+{m.b} lacks durations, order or a positive t_ab")
    return fit_contention_samples([fit_sample(m) for m in ms], max_slowdown=max_slowdown, step=step)


def fit_contention_samples(samples: Sequence[Mapping[str, Any]], *, max_slowdown: float = 3.0,
                           step: float = 0.05) -> ContentionFit:
    """Fit the analytic contention to measured pairs given as :func:`fit_sample` dicts (e.g. read back from a
    profile, so the fit can be redone from the file).

    For each sample, the two-lane executor replays its ``order`` with its standalone per-task ``durations``
    (and kernel ``classes`` when the sample has them, as the scheduler's search does);
    the fit minimises the sum of squared relative errors of the predicted ``t_ab`` against the measured
    ``t_ab`` (least squares) by a grid search over ``[0, max_slowdown]`` in steps of ``step`` for both
    parameters, refined by a finer grid (step / 10) around the best point.

    Raises:
        ConfigError: no samples, a sample without order, durations or a positive ``t_ab``, or a bad grid.
    """
    ms = [dict(s) for s in samples]
    if not ms:
        raise ConfigError("field 'measurements' is empty; allowed: at least one measured pair")
    for m in ms:
        if not m.get("durations") or not m.get("order") or not m.get("t_ab", 0) > 0:
            raise ConfigError("a fit sample lacks durations, order or a positive t_ab")
        m["deps"] = {k: tuple(v) for k, v in m["deps"].items()}
    if not (max_slowdown > 0 and 0 < step <= max_slowdown):
        raise ConfigError("fields 'max_slowdown' and 'step' must satisfy 0 < step <= max_slowdown")

    def loss(c: float, k: float) -> float:
        cont = Contention(c, k)
        err = 0.0
        for m in ms:
            pred = pair_makespan(m["order"], m["durations"], m["lanes"], m["deps"], contention=cont,
                                 classes=m.get("classes")).makespan
            err += ((pred - m["t_ab"]) / m["t_ab"]) ** 2
        return err

    def grid(lo_c, hi_c, lo_k, hi_k, st):
        best = None
        nc = int(round((hi_c - lo_c) / st)) + 1
        nk = int(round((hi_k - lo_k) / st)) + 1
        for i in range(nc):
            for j in range(nk):
                c, k = lo_c + i * st, lo_k + j * st
                v = loss(c, k)
                if best is None or v < best[0] - 1e-15:
                    best = (v, c, k)
        return best

    v, c, k = grid(0.0, max_slowdown, 0.0, max_slowdown, step)
    fine = step / 10
    v, c, k = grid(max(0.0, c - step), min(max_slowdown, c + step), max(0.0, k - step), min(max_slowdown, k + step), fine)
    return ContentionFit(Contention(round(c, 10), round(k, 10)), math.sqrt(v / len(ms)), len(ms))


