"""Schemas of the files tessera-lab reads, checked before any work starts.

A schema is a tree of :class:`F` (one field: its type, range, whether it is required, and the schema of its items
or members). :func:`validate` walks a parsed JSON value against it and raises one line naming the file, the
field (``runs[3].lifecycle.steps[0].observed``), the value and what is allowed, e.g.::

    runner plan 'p.json': field 'parallel.microbatches' = 1e+09 is over the work limit for micro-batches ...

Integer fields may name a work limit of :mod:`tessera_lab.checks` (``limit="microbatches"``), so values that would
exhaust memory or time are refused with the limit and the variable that raises it. Unknown fields are allowed
(files carry notes and provenance); a field's *type* is never coerced (a string ``"4"`` is not the integer 4).

Standard library only. The schemas of the runner's files live in :mod:`tessera_lab.runner.runtime.schemas`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from tessera_lab.checks import _shown, check_float, check_int
from tessera_lab.errors import ConfigError

__all__ = ["F", "validate", "field_path"]


class F:
    """One field of a schema.

    Args:
        kind: ``"int"``, ``"num"`` (finite int or float), ``"str"``, ``"bool"``, ``"list"``, ``"dict"`` (fixed
            members ``fields``), ``"map"`` (any string keys, each value ``values``) or ``"any"``.
        low, high: inclusive range of an ``int``/``num`` (``low_open``: strictly above ``low``); for ``list`` and
            ``map`` the allowed number of entries.
        required: the field must be present (in a ``dict``).
        null: ``None`` is allowed.
        choices: the allowed values (``str``/``int``).
        items: the schema of every item of a ``list``.
        fields: the members of a ``dict`` (name -> F).
        values: the schema of every value of a ``map``.
        limit: a :data:`tessera_lab.checks.WORK_LIMITS` name applied to an ``int`` (or to a list's length).
        allowed: text of what is allowed (default from the range).
    """

    __slots__ = ("kind", "low", "high", "required", "null", "choices", "items", "fields", "values", "limit",
                 "allowed", "low_open")

    # params: a schema field's keyword-only options (a slotted, dataclass-like __init__)
    def __init__(self, kind: str, *, low: float | None = None, high: float | None = None, required: bool = True,
                 null: bool = False, choices: tuple | None = None, items: "F | None" = None,
                 fields: Mapping[str, "F"] | None = None, values: "F | None" = None, limit: str | None = None,
                 allowed: str | None = None, low_open: bool = False):
        self.kind, self.low, self.high, self.required, self.null = kind, low, high, required, null
        self.choices, self.items, self.fields, self.values = choices, items, dict(fields or {}), values
        self.limit, self.allowed, self.low_open = limit, allowed, low_open


def field_path(parts: list[Any]) -> str:
    """``["runs", 3, "job"]`` -> ``runs[3].job``; a key that is not a plain name (a profile's
    ``F:a|BW:b``) in brackets: ``["entries", "F:a|BW:b", "t_ab"]`` -> ``entries[F:a|BW:b].t_ab``."""
    out = ""
    for p in parts:
        if isinstance(p, int) or not str(p).isidentifier():
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "(top level)"


_KIND_TEXT = {"int": "an integer", "num": "a finite number", "str": "a string", "bool": "true or false",
              "list": "a list", "dict": "an object", "map": "an object", "any": "any value"}


def validate(data: Any, schema: F, where: str, *, error: type[Exception] = ConfigError) -> Any:
    """Check ``data`` against ``schema``; returns ``data`` unchanged.

    Args:
        where: the file, as shown first in a message (``"runner plan 'p.json'"``).

    Raises:
        ``error``: one line for the first field that is missing, of the wrong type, out of range, or over a work
        limit.
    """
    stack: list[tuple[Any, F, list[Any]]] = [(data, schema, [])]
    while stack:
        value, f, parts = stack.pop()
        name = field_path(parts)
        if value is None and f.null:
            continue
        if f.kind == "any":
            continue
        if f.kind == "int":
            check_int(value, name, low=None if f.low is None else int(f.low),
                      high=None if f.high is None else int(f.high), where=where, limit=f.limit, error=error,
                      allowed=f.allowed)
        elif f.kind == "num":
            check_float(value, name, low=f.low, high=f.high, low_open=f.low_open, where=where, error=error,
                        allowed=f.allowed)
        elif f.kind == "bool":
            if not isinstance(value, bool):
                raise error(f"{where}: field '{name}' = {_shown(value)} is not true or false; allowed: true or false")
        elif f.kind == "str":
            if not isinstance(value, str):
                raise error(f"{where}: field '{name}' = {_shown(value)} is not a string; allowed: "
                            f"{f.allowed or _choices(f) or 'a string'}")
        elif f.kind in ("list", "dict", "map"):
            ok = isinstance(value, list) if f.kind == "list" else isinstance(value, dict)
            if not ok:
                what = "a list" if f.kind == "list" else "an object"
                raise error(f"{where}: field '{name}' = {_shown(value)} is not {what}; allowed: "
                            f"{f.allowed or what}" + (" or null" if f.null else ""))
            if f.kind in ("list", "map"):
                n = len(value)
                if (f.low is not None and n < f.low) or (f.high is not None and n > f.high):
                    lo = "" if f.low is None else f"at least {int(f.low)}"
                    hi = "" if f.high is None else f"at most {int(f.high)}"
                    raise error(f"{where}: field '{name}' has {n} entries; allowed: {' and '.join(x for x in (lo, hi) if x)}")
                if f.limit:
                    from tessera_lab.checks import check_work

                    check_work(f.limit, n, field=f"field '{name}' (entries)", where=where, error=error)
            if f.kind == "list" and f.items is not None and _plain_number(f.items):
                _check_numbers(value, f.items, parts, where, error)  # long lists of counts or times, fast
            elif f.kind == "list" and f.items is not None:
                stack.extend((v, f.items, parts + [i]) for i, v in reversed(list(enumerate(value))))
            elif f.kind == "map" and f.values is not None:
                for k, v in value.items():
                    stack.append((v, f.values, parts + [k]))
            elif f.kind == "dict":
                for k, sub in reversed(list(f.fields.items())):
                    if k not in value:
                        if sub.required:
                            raise error(f"{where}: field '{field_path(parts + [k])}' is missing; allowed: "
                                        f"{sub.allowed or _choices(sub) or _KIND_TEXT[sub.kind]}")
                        continue
                    stack.append((value[k], sub, parts + [k]))
        else:  # pragma: no cover - a schema bug
            raise ValueError(f"unknown schema kind {f.kind!r}")
        if f.choices is not None and value not in f.choices:
            raise error(f"{where}: field '{name}' = {_shown(value)} is not allowed; allowed: {_choices(f)}")
    return data


def _plain_number(f: F) -> bool:
    """An ``int``/``num`` field without choices or null: its list items can be checked in one loop."""
    return f.kind in ("int", "num") and f.choices is None and not f.null


def _check_numbers(values: list, f: F, parts: list[Any], where: str, error: type[Exception]) -> None:
    """The items of a list of plain numbers: the common case (an int, or a float for ``num``, inside the range)
    is accepted in a tight loop; any other item goes through :func:`check_int` / :func:`check_float` for its
    message (or, for an integral float such as ``3.0``, is accepted by it)."""
    from tessera_lab.checks import work_limit

    lo = -math.inf if f.low is None else f.low
    hi = math.inf if f.high is None else f.high
    if f.kind == "int" and f.limit is not None:
        lim = work_limit(f.limit)
        hi = hi if lim is None else min(hi, lim)
    ok = (int,) if f.kind == "int" else (int, float)
    for i, v in enumerate(values):
        t = type(v)
        if t in ok and (lo < v if f.low_open else lo <= v) and v <= hi and (
                math.isfinite(v) if t is float else (f.kind == "int" or abs(v) <= 1e300)):
            continue
        name = field_path(parts + [i])
        if f.kind == "int":
            check_int(v, name, low=None if f.low is None else int(f.low), high=None if f.high is None else int(f.high),
                      where=where, limit=f.limit, error=error, allowed=f.allowed)
        else:
            check_float(v, name, low=f.low, high=f.high, low_open=f.low_open, where=where, error=error,
                        allowed=f.allowed)


def _choices(f: F) -> str:
    if not f.choices:
        return ""
    return "one of " + ", ".join(repr(c) for c in f.choices)


def positive_seconds(**kw: Any) -> F:
    """A time in seconds > 0 (finite, at most :data:`tessera_lab.checks.MAX_TIME_S`)."""
    from tessera_lab.checks import MAX_TIME_S

    return F("num", low=0.0, low_open=True, high=MAX_TIME_S, allowed=f"seconds > 0 and <= {MAX_TIME_S:g}", **kw)


def seconds(**kw: Any) -> F:
    """A time in seconds >= 0 (finite, at most :data:`tessera_lab.checks.MAX_TIME_S`)."""
    from tessera_lab.checks import MAX_TIME_S

    return F("num", low=0.0, high=MAX_TIME_S, allowed=f"seconds >= 0 and <= {MAX_TIME_S:g}", **kw)


def is_integral(x: Any) -> bool:
    """True for an int (not bool) or an integral finite float."""
    return (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and math.isfinite(x)
                                                                and x == int(x))
