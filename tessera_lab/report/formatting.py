"""Numbers for people: each row of a diff, each column of a panel table gets a unit and one fitting format (the
data keep full precision).

Shares (MFU, bubble fraction, EP comm hidden: unit ``""`` in the data) are shown as percentages, tokens/s as whole
numbers, times with the digits of :data:`DECIMALS`. Used by ``tessera-lab report --diff``, the notebooks'
:func:`tessera_lab.ui.tables.diff_summary_table` and every panel table (:func:`display_frame`: the unit a column's
or a row's label states, :func:`label_unit`, sets the digits of all its cells).
"""

from __future__ import annotations

import math
import re
from typing import Any

#: digits after the point per unit (after shares are turned into %); ``M``: millions (tokens/s (M)), ``ratio``: a
#: quotient of two like quantities (speed-up, IB / NVLink, max / mean)
DECIMALS = {"%": 1, "tokens/s": 0, "s": 3, "ms": 2, "ms/GPU": 2, "us": 1, "GiB": 1, "MiB": 1, "M": 3, "ratio": 3}


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


#: a unit in parentheses in a label: "time/mb (ms)", "MFU (%)", "static iteration (s), job of 2 EP groups"
_UNIT = re.compile(r"(?:^|\s)\((ms/GPU|ms|us|µs|s|%|GiB|MiB|M)\)")  # not "node(s)"
#: words of a label whose number is a share 0..1 (shown x100 with a % sign) when the label states no unit
_SHARE = re.compile(r"\b(share|fraction|gain)\b")
#: words of a label whose number is a ratio of two like quantities
_RATIO = re.compile(r" / | vs |\bimbalance\b|\bspeed-up\b|\befficiency\b|\bratio\b")


def label_unit(label: Any) -> str | None:
    """The unit a table label states, one of :data:`DECIMALS` or ``"share"``: a unit in parentheses first
    (``"time/mb (ms)"`` -> ``ms``, ``"µs"`` read as ``us``), then ``tokens/s``, then a share (``share``,
    ``fraction``, ``gain``: a number 0..1), then a ratio (``a / b``, ``vs``, ``imbalance``, ``speed-up``,
    ``efficiency``); ``None`` when it states none."""
    text = str(label)
    if m := _UNIT.search(text):
        return "us" if m.group(1) == "µs" else m.group(1)
    if "tokens/s" in text:
        return "tokens/s"
    if _SHARE.search(text):
        return "share"
    if _RATIO.search(text):
        return "ratio"
    return None


def _numbers(values: list[Any]) -> list[float]:
    import numbers

    return [float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool) and v == v]


def unit_formatter(unit: str | None, values: list[Any]):
    """``value -> str`` for the cells of one column (or one row) of a table: ``unit`` from :func:`label_unit`;
    a share is shown x100 with a ``%`` sign and :data:`DECIMALS` ``["%"]`` digits; a stated unit takes its
    :data:`DECIMALS`; without a unit, whole numbers stay whole and other numbers all take the digits that give the
    largest of ``values`` 4 significant figures (0 to 4 digits). Thousands separators throughout; a number that
    rounds to 0 reads 0 without sign; missing values ``n/a``; non-numbers pass through (``str``)."""
    nums = _numbers(values)
    if unit == "share":
        digits, scale, suffix = DECIMALS["%"], 100.0, "%"
    elif unit is not None:
        digits, scale, suffix = DECIMALS.get(unit, 3), 1.0, ""
    elif nums and all(float(x).is_integer() for x in nums):
        digits, scale, suffix = 0, 1.0, ""
    else:
        top = max((abs(x) for x in nums if math.isfinite(x)), default=0.0)
        digits = 3 if top == 0 else min(4, max(0, 3 - math.floor(math.log10(top))))
        scale, suffix = 1.0, ""

    def fmt(v: Any) -> str:
        import numbers

        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "n/a"
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            return str(v)
        x = float(v) * scale
        if not math.isfinite(x):
            return str(x)
        if round(x, digits) == 0:
            x = 0.0
        return f"{x:,.{digits}f}{suffix}"

    return fmt


def display_frame(table: Any):
    """A DataFrame of strings with one format per column: each column by the unit its label states
    (:func:`label_unit`), or, in a table of metrics (no column label states a unit, some row label does, e.g.
    "makespan (s)" beside "bubble fraction"), each row by its label's. Non-numeric cells pass through."""
    import pandas as pd

    df = table.to_frame() if isinstance(table, pd.Series) else table
    by_column = (any(label_unit(c) is not None for c in df.columns)
                 or not any(label_unit(r) is not None for r in df.index))
    out = df.astype(object).copy()
    if by_column:
        for j, c in enumerate(df.columns):
            col = list(df.iloc[:, j])
            f = unit_formatter(label_unit(c), col)
            out.iloc[:, j] = [f(v) for v in col]
    else:
        for i, r in enumerate(df.index):
            row = list(df.iloc[i, :])
            f = unit_formatter(label_unit(r), row)
            out.iloc[i, :] = [f(v) for v in row]
    return out


__all__ = ["DECIMALS", "format_value", "diff_summary_rows", "label_unit", "unit_formatter", "display_frame"]
