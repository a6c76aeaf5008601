"""Plain-text tables for the CLI and the reports: a list of dicts in the layout of tabulate's ``"simple"`` format.

:func:`simple_table` gives the same text, byte for byte, as
``tabulate(rows, headers="keys", tablefmt="simple", floatfmt=..., disable_numparse=..., colalign=...)``
(python-tabulate 0.10) for the cells the package prints: ``None``, ``bool``, ``int``, ``float`` (and other numbers
``float()`` accepts) and text. It exists so that printing a table does not import tabulate (with
``importlib.metadata`` and ``wcwidth``), which cost a plain ``tessera-lab plan`` a fifth of its CPU time; the tests
check it against tabulate itself on random tables.

The rules (tabulate's, restated):

- columns: the union of the rows' keys in the order they first appear; a missing key or ``None`` is a blank cell;
- column type: the most general of its cells' types in the order bool < int < float < text, blank cells (``None``,
  ``""``) not counting and an all-blank column counting as bool. With number parsing on, text that reads as a
  number counts as one: ``int()`` text (``" 12 "``, ``"1_000"``) and ``"584,353"`` (thousands separators) as int;
  ``float()`` text that is finite or literally ``inf`` / ``-inf`` / ``nan`` (any case), and ``"1,234.5"``, as float;
  ``"True"`` / ``"False"`` as bool;
- cells: float columns print ``format(float(cell), floatfmt)`` (thousands separators dropped first; a cell
  ``float()`` refuses prints as it is), int columns ``format(cell, "")`` (text as written), others ``str(cell)``;
- alignment: int and float columns ``"decimal"`` (trailing blanks so that the decimal points, or the exponent marks
  of numbers without a point, line up; then flush right), others ``"left"``; ``colalign`` overrides per column
  (``"left"``, ``"right"``, ``"center"``, ``"decimal"``; ``"global"`` keeps the default). Left, right and centre
  alignment strip the cell's surrounding blanks first, decimal alignment keeps them;
- widths: a column is as wide as its widest aligned cell and at least its header's width plus 2; headers align
  like their column (decimal as right);
- lines: header, a rule of dashes as wide as each column, one line per row; columns joined by two blanks; every
  line without trailing blanks. No rows (or no keys) give ``""``.

Widths count characters as a terminal shows them (ASCII: one each; East Asian wide characters two; combining marks
and format characters none). Cells or headers with line breaks, ANSI escape codes or other control characters are
refused (:class:`ValueError`): tabulate lays those out differently and the package never prints them.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["simple_table"]

#: tabulate's text form of a number with thousands separators (``"1,234"``, ``"-12,345.6"``, ``".5"``, ``"7."``)
_THOUSANDS = re.compile(r"^(([+-]?[0-9]{1,3})(?:,([0-9]{3}))*)?(?(1)\.[0-9]*|\.[0-9]+)?$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: column kinds, least to most general (a column takes the most general kind among its cells)
_BLANK, _BOOL, _INT, _FLOAT, _TEXT = range(5)
_NONFINITE_WORDS = ("inf", "-inf", "nan")


def _converts(conv: Any, value: Any) -> bool:
    try:
        conv(value)
    except (ValueError, TypeError):
        return False
    return True


def _reads_as_number(text: str) -> bool:
    """``float()`` accepts the text and it is finite, or it names inf/-inf/nan itself (``"1e999"`` is text)."""
    try:
        x = float(text)
    except ValueError:
        return False
    return math.isfinite(x) or text.lower() in _NONFINITE_WORDS


def _kind(value: Any, numparse: bool) -> int:
    """The kind of one cell (see the module rules)."""
    if value is None:
        return _BLANK
    if isinstance(value, str):
        if not value:
            return _BLANK
        if value in ("True", "False"):
            return _BOOL
        if not numparse:
            return _TEXT
        thousands = _THOUSANDS.match(value) is not None
        if _converts(int, value) or (thousands and "." not in value):
            return _INT
        if _reads_as_number(value) or thousands:
            return _FLOAT
        return _TEXT
    if type(value) is bool:
        return _BOOL
    if hasattr(value, "isoformat"):  # dates and times print as text
        return _TEXT
    if not numparse:
        return _TEXT
    if type(value) is int or ((hasattr(value, "is_integer") or hasattr(value, "__array__"))
                              and str(type(value)).startswith("<class 'numpy.int")):
        return _INT
    if _converts(float, value):
        return _FLOAT
    return _TEXT


def _cell_text(value: Any, kind: int, floatfmt: str) -> str:
    """One cell as text, formatted for its column's kind."""
    if value is None:
        return ""
    if kind == _INT:
        return format(value, "")
    if kind == _FLOAT:
        if isinstance(value, str) and "," in value:
            value = value.replace(",", "")
        try:
            return format(float(value), floatfmt)
        except (ValueError, TypeError):
            return f"{value}"
    return f"{value}"


def _digits_after_point(text: str) -> int:
    """Characters after the decimal point (or after the exponent mark when there is no point); -1 for integers,
    text that is not a number, and numbers with neither (``"nan"``, ``"1,000"``)."""
    if not (_reads_as_number(text) or _THOUSANDS.match(text)):
        return -1
    if _converts(int, text):
        return -1
    pos = text.rfind(".")
    if pos < 0:
        pos = text.lower().rfind("e")
    return len(text) - pos - 1 if pos >= 0 else -1


def _width(text: str) -> int:
    """Columns a terminal gives the text."""
    if text.isascii():
        return len(text)
    import unicodedata

    width = 0
    for ch in text:
        if ch == "\xad":
            width += 1
        elif unicodedata.category(ch) in ("Mn", "Me", "Cf") or "\u1160" <= ch <= "\u11ff":
            continue
        else:
            width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def _pad(text: str, width: int, how: str) -> str:
    """``text`` padded to ``width`` terminal columns: ``"<"`` flush left, ``">"`` flush right, ``"^"`` centred."""
    return format(text, f"{how}{width - (_width(text) - len(text))}")


def _align_column(cells: list[str], align: str | None, min_width: int) -> tuple[list[str], int]:
    """The column's cells padded to a common width (at least ``min_width``), and that width."""
    if align == "decimal":
        after = [_digits_after_point(c) for c in cells]
        most = max(after)
        cells = [c + " " * (most - a) for c, a in zip(cells, after)]
        how = ">"
    elif not align:
        how = ""
    else:
        cells = [c.strip() for c in cells]
        how = {"right": ">", "center": "^"}.get(align, "<")
    width = max(max(_width(c) for c in cells), min_width)
    return ([_pad(c, width, how) for c in cells] if how else cells), width


def _align_header(header: str, align: str | None, width: int) -> str:
    if align == "left":
        return _pad(header, width, "<")
    if align == "center":
        return _pad(header, width, "^")
    if not align:
        return header
    return _pad(header, width, ">")


def simple_table(rows: Iterable[Mapping[Any, Any]], floatfmt: str | Sequence[str] = "g",
                 disable_numparse: bool | Iterable[int] = False,
                 colalign: Sequence[str | None] | None = None) -> str:
    """The rows as a plain-text table (tabulate's ``"simple"`` format with ``headers="keys"``; rules in the module
    docstring).

    ``floatfmt``: a ``format()`` spec for every float column, or one per column (columns past its end use ``"g"``).
    ``disable_numparse``: True reads no text as a number; a collection of column indices does so for those columns.
    ``colalign``: per-column alignment overriding the default, ``"global"`` or past its end keeping it.
    Raises ValueError for a cell or header with a line break, an escape code or another control character.
    """
    rows = list(rows)
    keys: list[Any] = []
    seen: set[Any] = set()
    for row in rows:
        for k in row:
            if k not in seen:
                seen.add(k)
                keys.append(k)
    if not keys:
        return ""
    n = len(keys)
    headers = [str(k) for k in keys]
    if isinstance(disable_numparse, bool):
        numparse = [not disable_numparse] * n
    else:
        numparse = [True] * n
        for i in disable_numparse:
            numparse[i] = False
    if isinstance(floatfmt, str):
        floatfmts = [floatfmt] * n
    else:
        floatfmts = list(floatfmt)[:n] + ["g"] * max(0, n - len(floatfmt))
    columns = [[row.get(k) for row in rows] for k in keys]
    kinds = [max([_BOOL] + [_kind(v, parse) for v in col]) for col, parse in zip(columns, numparse)]
    texts = [[_cell_text(v, kind, fmt) for v in col] for col, kind, fmt in zip(columns, kinds, floatfmts)]
    bad = _CONTROL.search("".join(headers) + "".join("".join(col) for col in texts))
    if bad:
        raise ValueError(f"table cell or header with control character {bad.group()!r}: not laid out as text")
    aligns: list[str | None] = ["decimal" if kind in (_INT, _FLOAT) else "left" for kind in kinds]
    for i, align in enumerate(colalign or ()):
        if i < n and align != "global":
            aligns[i] = align
    laid_out = [_align_column(col, align, _width(h) + 2) for col, align, h in zip(texts, aligns, headers)]
    widths = [w for _, w in laid_out]
    lines = ["  ".join(_align_header(h, a, w) for h, a, w in zip(headers, aligns, widths)).rstrip(),
             "  ".join("-" * w for w in widths).rstrip()]
    lines += ["  ".join(cells).rstrip() for cells in zip(*(col for col, _ in laid_out))]
    return "\n".join(lines)
