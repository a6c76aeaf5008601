"""Noise checks on a measured overlap table, computed from its own samples (torch-free).

A measurement on a busy machine can contradict itself. Two checks, each from the recorded data only:

* **same side, two pairs**: the forward of one layer kind is measured alone in every pair that has it as F (the
  backward alone likewise as BW). The same work measured in two pairs whose quartile ranges do not overlap
  (``q3`` of one below ``q1`` of the other) differs by more than its own spread allows.
* **together faster than the slowest side alone**: ``efficiency = (t_a + t_b - t_ab) / min(t_a, t_b) > 1`` is
  the same as ``t_ab < max(t_a, t_b)``: the pair finished before one of its sides alone, which running more work
  cannot do; the times alone were inflated (or the pair's deflated) by other load.

Neither check alters a measured value; each returns a warning (dict) naming the pair(s), the figures and the load
(called a busy machine when the 1-minute load average exceeded the core count, or when the core count is unknown).
Seconds in the dicts, milliseconds in the text.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

__all__ = ["noise_warnings", "load_text"]


def load_text(load: Mapping[str, Any] | None, cores: int | None = None) -> str:
    """``"load average (1 min) 12.3 -> 17.8 on 2 cores, measured before and after the run"`` from a sizing's
    ``load_average_1m`` and the machine's core count (left out when None)."""
    load = load or {}
    on = f" on {cores} cores" if cores else ""
    return (f"load average (1 min) {load.get('before')} -> {load.get('after')}{on}, measured before and after "
            f"the run")


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def noise_warnings(results: Sequence, load: Mapping[str, Any] | None = None,
                   cores: int | None = None) -> list[dict[str, Any]]:
    """Noise warnings of one measurement's results (module docstring), in the order found.

    Args:
        results: :class:`~tessera_lab.overlap.results.OverlapResult` objects in the order measured (pair ``i + 1``
            is ``results[i]``), each with ``spread`` holding ``t_a``/``t_b`` quartiles (``q1``, ``q3``; a result
            without them is skipped by the first check).
        load: the sizing's ``load_average_1m`` (``before``, ``after``), quoted in the text; cores: the machine's
            CPU count (``os.cpu_count()``), quoted beside it.

    Returns:
        dicts ``{"check", "pairs", "side", "figures_s", "text"}``; ``check`` is ``"same side differs"`` or
        ``"together faster than a side alone"``; ``pairs`` are 1-based pair numbers.
    """
    where = load_text(load, cores)
    peak = max((v for v in (load or {}).values() if isinstance(v, (int, float))), default=None)
    if cores and peak is not None and peak <= cores:  # the load says the machine was not busy: say so
        cause = f"noise, though the machine was not busy ({where}); more --repeats narrow it"
    else:
        cause = f"noise on a busy machine ({where})"
    out: list[dict[str, Any]] = []
    sides: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for i, r in enumerate(results):
        for role, kind, key in (("F", r.kind_a, "t_a"), ("BW", r.kind_b, "t_b")):
            s = (r.spread or {}).get(key) or {}
            if {"median", "q1", "q3"} <= set(s):
                sides.setdefault((role, kind), []).append((i + 1, s))
    for (role, kind), seen in sides.items():
        for x in range(len(seen)):
            for y in range(x + 1, len(seen)):
                (pi, si), (pj, sj) = seen[x], seen[y]
                if si["q3"] < sj["q1"] or sj["q3"] < si["q1"]:
                    text = (f"noise warning: {role}[{kind}] alone measured {_ms(si['median'])} ms (IQR "
                            f"{_ms(si['q1'])}-{_ms(si['q3'])}) in pair {pi} and {_ms(sj['median'])} ms (IQR "
                            f"{_ms(sj['q1'])}-{_ms(sj['q3'])}) in pair {pj}: the same work, quartile ranges that do "
                            f"not overlap; the difference is {cause}, not the layer")
                    out.append({"check": "same side differs", "pairs": [pi, pj], "side": f"{role}[{kind}]",
                                "figures_s": {"median": [si["median"], sj["median"]], "q1": [si["q1"], sj["q1"]],
                                              "q3": [si["q3"], sj["q3"]]}, "text": text})
    for i, r in enumerate(results):
        slow = max(r.t_a, r.t_b)
        if r.t_ab < slow:
            m = min(r.t_a, r.t_b)
            eff = (r.t_a + r.t_b - r.t_ab) / m if m > 0 else float("nan")
            side = f"F[{r.kind_a}]" if r.t_a >= r.t_b else f"BW[{r.kind_b}]"
            text = (f"noise warning: pair {i + 1} (F[{r.kind_a}] + BW[{r.kind_b}]) ran together in {_ms(r.t_ab)} ms, "
                    f"faster than its slowest side alone ({side} {_ms(slow)} ms), efficiency {eff:.3g} > 1; a pair "
                    f"cannot finish before one of its sides, so this is {cause}")
            out.append({"check": "together faster than a side alone", "pairs": [i + 1], "side": side,
                        "figures_s": {"t_a": r.t_a, "t_b": r.t_b, "t_ab": r.t_ab, "efficiency": eff}, "text": text})
    return out
