"""argparse ``type=`` factories shared by the command lines (``tessera-lab`` and the runner).

Each factory takes the option's field name and returns a parser for one command-line string. A bad value
raises :class:`argparse.ArgumentTypeError` with one line naming the field and the allowed range, e.g.
``pp = 0 is out of range; allowed: an integer >= 1``; argparse then exits with status 2.

Integer options named in :data:`tessera_lab.checks.WORK_LIMITS` (``microbatches``, ``stages``, ``layers``, ``dp``,
...) are also bounded by that work limit (raise it with ``TESSERA_LAB_MAX_<NAME>``). Numbers are finite: ``nan``,
``inf`` and values over :data:`tessera_lab.checks.MAX_TIME_S` are refused.

Standard library only (no torch, no numpy), so every command line can import it at no cost.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

from tessera_lab.checks import MAX_TIME_S, env_name, work_limit

__all__ = ["integer", "finite_float", "int_at_least", "int_in", "positive_int", "nonneg_float", "positive_float", "float_in"]


def _limit(name: str) -> int | None:
    try:
        return work_limit(name)
    except ValueError as exc:  # a malformed TESSERA_LAB_MAX_<NAME>: say so (argparse would print "invalid value")
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parse_int(name: str, text: str, allowed: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    try:  # "1e3" or "64.0" are integers written as floats
        f = float(text)
    except ValueError:
        f = math.nan
    if math.isfinite(f) and f == int(f):
        if abs(f) < 2**62:
            return int(f)
        raise argparse.ArgumentTypeError(f"{name} = {text!r} is out of range; allowed: {allowed}") from None
    raise argparse.ArgumentTypeError(f"{name} = {text!r} is not an integer; allowed: {allowed}") from None


def int_in(name: str, low: int, high: int | None = None) -> Callable[[str], int]:
    """Parser of an integer in ``[low, high]`` for the option ``name``; ``high`` defaults to the work limit of
    ``name`` (:func:`tessera_lab.checks.work_limit`), if it has one."""

    def parse(text: str) -> int:
        limit = _limit(name)
        top = high if high is not None else limit
        allowed = f"an integer >= {low}" if top is None else f"an integer {low} to {top}"
        v = _parse_int(name, text, allowed)
        if v < low or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"{name} = {v} is out of range; allowed: {allowed}")
        if high is None and limit is not None and v > limit:
            raise argparse.ArgumentTypeError(
                f"{name} = {v} is over the work limit {limit} of this kind of machine; allowed: {allowed} "
                f"(raise it with {env_name(name)}=N)")
        return v

    return parse


def integer(name: str) -> Callable[[str], int]:
    """Parser of any integer (``1e3`` counts) for the option ``name``, bounded above by its work limit if it has
    one; the range below is checked where the value is used. ``tessera-lab`` puts it in place of a bare ``int``."""

    def parse(text: str) -> int:
        limit = _limit(name)
        allowed = "an integer" if limit is None else f"an integer <= {limit}"
        v = _parse_int(name, text, allowed)
        if limit is not None and v > limit:
            raise argparse.ArgumentTypeError(
                f"{name} = {v} is over the work limit {limit} of this kind of machine; allowed: {allowed} "
                f"(raise it with {env_name(name)}=N)")
        return v

    return parse


def int_at_least(name: str, low: int) -> Callable[[str], int]:
    """Parser of an integer ``>= low`` for the option ``name`` (bounded above by its work limit, if any)."""
    return int_in(name, low)


def positive_int(name: str) -> Callable[[str], int]:
    """Parser of an integer ``>= 1`` for the option ``name`` (sizes, counts)."""
    return int_in(name, 1)


def float_in(name: str, low: float = 0.0, high: float = MAX_TIME_S, *, low_open: bool = False) -> Callable[[str], float]:
    """Parser of a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``); rejects nan and inf."""
    allowed = f"a finite number {'>' if low_open else '>='} {low:g} and <= {high:g}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} = {text!r} is not a number; allowed: {allowed}") from None
        if not math.isfinite(v) or (v <= low if low_open else v < low) or v > high:
            raise argparse.ArgumentTypeError(f"{name} = {text} is out of range; allowed: {allowed}")
        return v

    return parse


def finite_float(name: str, bound: float = 1e12) -> Callable[[str], float]:
    """Parser of a finite number in ``[-bound, bound]`` (any sign); ``tessera-lab`` puts it in place of a bare
    ``float`` so that ``nan`` and ``inf`` never pass."""
    return float_in(name, -bound, bound)


def nonneg_float(name: str, high: float = MAX_TIME_S) -> Callable[[str], float]:
    """Parser of a finite number ``>= 0`` (and ``<= high``) for the option ``name`` (times, factors)."""
    return float_in(name, 0.0, high)


def positive_float(name: str, high: float = MAX_TIME_S) -> Callable[[str], float]:
    """Parser of a finite number ``> 0`` (and ``<= high``) for the option ``name`` (time limits, pair times)."""
    return float_in(name, 0.0, high, low_open=True)
