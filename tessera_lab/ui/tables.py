"""Display tables for notebooks: the data keep full precision, these give each row a unit and a fitting format.

:func:`diff_summary_table` shows :meth:`tessera_lab.report.capacity.DiffReport.summary_rows` with shares (MFU,
bubble fraction, EP comm hidden: unit ``""`` in the data) as percentages and tokens/s as whole numbers.
"""

from __future__ import annotations

from typing import Any

#: digits after the point per unit (after shares are turned into %)
DECIMALS = {"%": 1, "tokens/s": 0, "s": 3, "ms": 2, "ms/GPU": 2, "GiB": 1}


def format_value(v: Any, unit: str, *, signed: bool = False) -> str:
    """One cell: ``v`` with the digits of :data:`DECIMALS` for ``unit`` (3 otherwise) and thousands separators;
    ``signed`` adds a ``+`` to positive changes (one that rounds to 0 reads 0). Non-numbers (a costs
    description) pass through; ``None`` is ``""``."""
    if v is None:
        return ""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return str(v)
    d = DECIMALS.get(unit, 3)
    if round(v, d) == 0:  # no "-0.0" and no "+0.0" for a change that rounds away
        v, signed = 0.0, False
    return f"{v:{'+' if signed else ''},.{d}f}"


def diff_summary_rows(rows: list[dict[str, Any]], labels: tuple[str, str]) -> list[dict[str, str]]:
    """Rows of ``DiffReport.summary_rows()`` as strings: a unit ``""`` on a number marks a share (0..1), shown
    ×100 with unit ``%`` (the change then in percentage points, ``pp``)."""
    out = []
    for r in rows:
        unit, a, b, ch = r["unit"], r[labels[0]], r[labels[1]], r["change"]
        pp = False
        if unit == "" and isinstance(a, (int, float)) and isinstance(b, (int, float)):
            a, b, ch = 100 * a, 100 * b, None if ch is None else 100 * ch
            unit, pp = "%", True
        out.append({"metric": r["metric"], labels[0]: format_value(a, unit), labels[1]: format_value(b, unit),
                    "change": format_value(ch, unit, signed=True) + (" pp" if pp and ch is not None else ""),
                    "unit": unit})
    return out


def diff_summary_table(diff: Any):
    """pandas DataFrame of :func:`diff_summary_rows` for a :class:`~tessera_lab.report.capacity.DiffReport`,
    indexed by metric."""
    import pandas as pd

    return pd.DataFrame(diff_summary_rows(diff.summary_rows(), diff.labels)).set_index("metric")


__all__ = ["DECIMALS", "format_value", "diff_summary_rows", "diff_summary_table"]
