"""The authors' published parameter counts (``data/models/_published_params.json``) and how a computed count is
compared with one (to the precision published). Re-exported by :mod:`tessera_lab.model.spec`.

This module never imports torch.
"""

from __future__ import annotations

import json
from typing import Any

from tessera_lab.paths import read_data_json


def published_params() -> dict[str, Any]:
    """The authors' published parameter counts with their conventions (``data/models/_published_params.json``)."""
    return read_data_json("models/_published_params.json", "published parameter counts")


def matches_published(value: float, published: float) -> bool:
    """Whether a computed count agrees with a published one to the precision published.

    A figure given in billions with d decimals (``30.5e9`` -> d = 1) matches when the computed count,
    rounded *or* truncated to d decimals of a billion, equals it. Model cards do both: Qwen3-235B-A22B's
    non-embedding 233.85B is published as "234B" (rounded) while Qwen3-30B-A3B's 3.353B activated is
    published as "3.3B" (truncated).
    """
    text = f"{published / 1e9:.6f}".rstrip("0").rstrip(".")
    decimals = len(text.split(".")[1]) if "." in text else 0
    scale = 10**decimals
    b = value / 1e9
    target = round(published / 1e9 * scale)
    return round(b * scale) == target or int(b * scale + 1e-9) == target
