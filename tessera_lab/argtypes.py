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

__all__ = ["integer", "finite_float", "int_at_least", "int_in", "positive_int", "nonneg_float", "positive_float", "float_in",
           "float_at_least", "fraction_below_one", "predictor_spec", "module_list", "Switch"]


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


def float_in(name: str, low: float = 0.0, high: float = MAX_TIME_S, *, low_open: bool = False,
             high_open: bool = False, allowed: str | None = None) -> Callable[[str], float]:
    """Parser of a finite number in ``[low, high]`` (open ends with ``low_open`` / ``high_open``); rejects nan and
    inf. ``allowed`` replaces the generated range text (the one line names the real rule)."""
    allowed = allowed or f"a finite number {'>' if low_open else '>='} {low:g} and {'<' if high_open else '<='} {high:g}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} = {text!r} is not a number; allowed: {allowed}") from None
        if not math.isfinite(v) or (v <= low if low_open else v < low) or (v >= high if high_open else v > high):
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


def float_at_least(name: str, low: float, *, what: str = "") -> Callable[[str], float]:
    """Parser of a finite number ``>= low`` (``--expert-load``: ``>= 1``, the busiest rank over the mean); ``what``
    says what the number is, after the rule."""
    return float_in(name, low, 1e12, allowed=f"a finite number >= {low:g}" + (f" ({what})" if what else ""))


def fraction_below_one(name: str) -> Callable[[str], float]:
    """Parser of a share ``0 <= x < 1`` (``--margin``: the share of a predicted wait left unfilled)."""
    return float_in(name, 0.0, 1.0, high_open=True, allowed=f"0 <= {name} < 1")


#: the predictor forms of ``simulate`` / ``run --dynamic`` (as :mod:`tessera_lab.dynamic.controller` parses them)
PREDICTOR_FORMS = "last-step, moving-average:K or minimum:K (K an integer >= 1)"


def predictor_spec(name: str = "predictor") -> Callable[[str], str]:
    """Parser of a wait predictor ``last-step``, ``moving-average:K`` or ``minimum:K``; a bad window K is named
    as such (``K = 0 is out of range``), an unknown kind as unknown. Returns the text unchanged."""

    def parse(text: str) -> str:
        kind, sep, rest = text.strip().lower().partition(":")
        if kind == "last-step" and not sep:
            return text
        if kind in ("moving-average", "minimum"):
            if not sep:
                return text
            try:
                k = int(rest)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{name} = {text!r}: window K = {rest!r} is not an integer; "
                                                 f"allowed: {PREDICTOR_FORMS}") from None
            if k < 1:
                raise argparse.ArgumentTypeError(f"{name} = {text!r}: window K = {k} is out of range; allowed: "
                                                 f"{PREDICTOR_FORMS}")
            return text
        raise argparse.ArgumentTypeError(f"{name} = {text!r} is unknown; allowed: {PREDICTOR_FORMS}")

    return parse


def module_list(name: str, allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """Parser of a comma-separated list of names from ``allowed`` (``--recompute-modules``): an empty list, an empty
    name (``core_attn,,moe``), an unknown or a repeated name is refused in one line."""

    def parse(text: str) -> tuple[str, ...]:
        names = [x.strip() for x in text.split(",")]
        rule = f"allowed: comma-separated names from {', '.join(allowed)}"
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{name} = {text!r} is empty; {rule}")
        if any(not x for x in names):
            raise argparse.ArgumentTypeError(f"{name} = {text!r} has an empty name (two commas or a comma at an "
                                             f"end); {rule}")
        bad = [x for x in names if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{name} = {text!r}: {', '.join(map(repr, bad))} unknown; {rule}")
        if len(set(names)) < len(names):
            raise argparse.ArgumentTypeError(f"{name} = {text!r} repeats a name; {rule}")
        return tuple(names)

    return parse


class Switch(argparse.Action):
    """An on/off switch (``store_true``) that names itself when given a value: ``--ep-spans-tp 0`` gives
    ``argument --ep-spans-tp: is an on/off switch and takes no value (got '0'); ...`` from the subcommand's parser
    instead of argparse's bare ``unrecognized arguments: 0``."""

    def __init__(self, option_strings, dest, default=False, required=False, help=None):  # noqa: A002 - argparse API
        super().__init__(option_strings, dest, nargs="?", const=True, default=default, required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        if values is not True:
            parser.error(f"argument {option_string}: is an on/off switch and takes no value (got {values!r}); "
                         f"allowed: {option_string} alone to turn it on, leave it out for off")
        setattr(namespace, self.dest, True)
