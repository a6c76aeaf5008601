"""argparse ``type=`` factories shared by the command lines (``tessera-lab`` and the runner).

Each factory takes the option's field name and returns a parser for one command-line string. A bad value
raises :class:`argparse.ArgumentTypeError` with one line naming the field and the allowed range, e.g.
``pp = 0 is out of range; allowed: an integer >= 1``; argparse then exits with status 2.

Standard library only (no torch, no numpy), so every command line can import it at no cost.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

__all__ = ["int_at_least", "positive_int", "nonneg_float"]


def int_at_least(name: str, low: int) -> Callable[[str], int]:
    """Parser of an integer ``>= low`` for the option ``name``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} = {text!r} is not an integer; allowed: an integer >= {low}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{name} = {v} is out of range; allowed: an integer >= {low}")
        return v

    return parse


def positive_int(name: str) -> Callable[[str], int]:
    """Parser of an integer ``>= 1`` for the option ``name`` (sizes, counts)."""
    return int_at_least(name, 1)


def nonneg_float(name: str) -> Callable[[str], float]:
    """Parser of a finite number ``>= 0`` for the option ``name`` (times, factors); rejects nan and inf."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} = {text!r} is not a number; allowed: a number >= 0") from None
        if not v >= 0 or v == math.inf:
            raise argparse.ArgumentTypeError(f"{name} = {text} is out of range; allowed: a finite number >= 0")
        return v

    return parse
