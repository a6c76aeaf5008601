"""Repeated timings and what is read from them: the one host-clock timing harness, quartiles, and the one
significance rule of the project (docs/concepts.md, "Measurement and significance").

* :func:`time_calls` times a callable ``repeats`` times after warm-up calls (host clock, ``time.perf_counter``;
  a host clock does not time asynchronous GPU work: CUDA timings go through events in the runner).
* :func:`spread_stats` (median, quartiles, min, max) and :func:`lower_quartile` summarise the samples.
* The significance rule: two sets of repeats differ when their interquartile ranges do not overlap
  (:func:`below`, :func:`apart`); a single difference is significant only when it is larger than the spread of
  the repeats it comes from (:func:`within_spread` says it is not).

Seconds throughout. This module imports nothing from the rest of the package but :mod:`tessera_lab.errors`.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Sequence

from tessera_lab.errors import ConfigError

__all__ = ["time_calls", "spread_stats", "lower_quartile", "below", "apart", "within_spread"]


def time_calls(fn: Callable[[], Any], repeats: int, *, warmup: int = 1) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` (host clock), after ``warmup`` untimed calls.

    Raises:
        ConfigError: ``repeats`` < 1 or ``warmup`` < 0.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"field 'repeats' = {repeats!r} is out of range; allowed: an integer >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"field 'warmup' = {warmup!r} is out of range; allowed: an integer >= 0")
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def spread_stats(samples: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles (linear interpolation between order statistics, numpy's default), min, max, count and
    the samples of repeated timings (seconds).

    Raises:
        ConfigError: no samples.
    """
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ConfigError("field 'samples' is empty; allowed: at least one measurement")

    def q(p: float) -> float:
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"median": q(0.5), "q1": q(0.25), "q3": q(0.75), "min": xs[0], "max": xs[-1], "n": len(xs),
            "samples": list(samples)}


def lower_quartile(xs: Sequence[float]) -> float:
    """The lower quartile of ``xs`` within the data (``statistics.quantiles(method="inclusive")``; the default
    exclusive method extrapolates below the smallest sample for few samples, e.g. below 0 s for two timings);
    one sample: itself."""
    xs = list(xs)
    return statistics.quantiles(xs, n=4, method="inclusive")[0] if len(xs) >= 2 else xs[0]


def below(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """The significance rule, one-sided: ``a = (q1, q3)`` is below ``b = (q1, q3)`` when ``a``'s upper quartile is
    under ``b``'s lower quartile (the interquartile ranges are separated)."""
    return bool(a[1] < b[0])


def apart(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """The significance rule, two-sided: the interquartile ranges ``(q1, q3)`` of ``a`` and ``b`` do not
    overlap."""
    return below(a, b) or below(b, a)


def within_spread(value: float, spread: float) -> bool:
    """A difference ``value`` whose magnitude is at most the ``spread`` of the repeats it was read from could
    have either sign: not significant."""
    return abs(value) <= abs(spread)
