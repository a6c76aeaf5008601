"""Numbers for people: each row of a diff gets a unit and a fitting format (the data keep full precision).

Shares (MFU, bubble fraction, EP comm hidden: unit ``""`` in the data) are shown as percentages, tokens/s as whole
numbers, times with the digits of :data:`DECIMALS`. Used by ``tessera-lab report --diff`` and the notebooks'
:func:`tessera_lab.ui.tables.diff_summary_table`.
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


__all__ = ["DECIMALS", "format_value", "diff_summary_rows"]
