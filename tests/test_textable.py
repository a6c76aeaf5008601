"""tessera_lab.textable: the plain-text tables equal tabulate's "simple" format with headers="keys" (the oracle here
is tabulate itself, a dev dependency), on random tables and on hand examples worked out by counting columns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.textable import simple_table

try:
    from tabulate import tabulate
except ImportError:  # the dev extra is not installed: only the hand examples run
    tabulate = None
needs_tabulate = pytest.mark.skipif(tabulate is None, reason="tabulate (the dev extra) is the oracle")

KEYS = ["a", "bb", "long header", "x", "GPU-s", "ms/mb", "é", "中文"]
FLOATFMTS = [".3f", ".4g", ".1f", ".3e", "", "g", ".2%", ".6g"]
NUMERIC_TEXT = ["584,353", "1,000.25", "-12,345.6", "1e-3", "-2.5E+07", " 12 ", " 3.5 ", "nan", "NaN", "inf", "-inf",
                "Infinity", "1e999", "12%", "7.", ".5", "-.5", "+4", "1_000", "1,0000", "0x10", "True", "False",
                "-", "n/a", "3.000", "0", "-0.0", "12 ms", "1,234"]

texts = st.text(alphabet=st.sampled_from(list("abcXYZ019 .,-+e%_/()") + ["µ", "×", "→", "中", "é"]), max_size=12)
cells = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-10**15, max_value=10**15),
    st.integers(min_value=-5, max_value=5),
    st.floats(allow_nan=True, allow_infinity=True, min_value=None, max_value=None),
    st.floats(min_value=-1e6, max_value=1e6).map(lambda x: round(x, 3)),
    st.sampled_from([0.0, -0.0, 1e-12, 3e-7, 1e21, 123456789.0, 2.0, -7.0, 0.1 + 0.2]),
    st.sampled_from(NUMERIC_TEXT),
    texts,
    st.just(""),
)


@st.composite
def tables(draw):
    n_rows = draw(st.integers(min_value=0, max_value=6))
    rows = []
    for _ in range(n_rows):
        keys = draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=len(KEYS)))
        rows.append({k: draw(cells) for k in keys})
    return rows


floatfmts = st.one_of(st.sampled_from(FLOATFMTS), st.lists(st.sampled_from(FLOATFMTS), max_size=9).map(tuple))


def oracle(rows, **kw):
    return tabulate(rows, headers="keys", tablefmt="simple", **kw)


@needs_tabulate
@settings(max_examples=400, deadline=None)
@given(rows=tables(), floatfmt=floatfmts, disable_numparse=st.booleans())
def test_equals_tabulate_simple(rows, floatfmt, disable_numparse):
    assert simple_table(rows, floatfmt=floatfmt, disable_numparse=disable_numparse) == \
        oracle(rows, floatfmt=floatfmt, disable_numparse=disable_numparse)


@needs_tabulate
@settings(max_examples=150, deadline=None)
@given(rows=tables(), colalign=st.lists(st.sampled_from(["left", "right", "center", "decimal", "global"]),
                                        max_size=9).map(tuple),
       numparse_off=st.lists(st.integers(min_value=0, max_value=7), max_size=3, unique=True))
def test_equals_tabulate_with_colalign_and_column_numparse(rows, colalign, numparse_off):
    n = len({k for r in rows for k in r})
    off = [i for i in numparse_off if i < n]
    assert simple_table(rows, colalign=colalign, disable_numparse=off) == \
        oracle(rows, colalign=colalign, disable_numparse=off)


def test_hand_example_decimal_alignment_and_blanks():
    rows = [{"name": "alpha", "t": 1.5, "n": 3}, {"name": "b", "t": 12.25, "extra": "x"}, {"t": None, "n": -40}]
    # t: float column, .2f -> "1.50", "12.25", "" ; n: ints right-aligned; extra: text, left; name: text, left.
    # widths: name max(5, 4+2)=6; t max(5, 1+2)=5 -> "12.25" 5, header "t" 1+2=3 -> 5; n max(3, 1+2)=3;
    # extra max(1, 5+2)=7
    expected = ("name        t    n  extra\n"
                "------  -----  ---  -------\n"
                "alpha    1.50    3\n"
                "b       12.25       x\n"
                "               -40")
    assert simple_table(rows, floatfmt=".2f") == expected


def test_hand_example_numeric_text_and_numparse_off():
    rows = [{"k": "584,353"}, {"k": "1e-3"}, {"k": " 12 "}]
    # parsed: a float column ("584,353" is int-like but "1e-3" makes it float), default floatfmt "g": "584353",
    # "0.001", "12"; decimal alignment pads each to 3 digits after the point (a number without a point counts -1:
    # 4 blanks), width 10, flush right, trailing blanks of the last column dropped
    assert simple_table(rows) == "         k\n----------\n584353\n     0.001\n    12"
    # not parsed: text, stripped and left-aligned; width max(7, 1+2)
    assert simple_table(rows, disable_numparse=True) == "k\n-------\n584,353\n1e-3\n12"


def test_per_column_floatfmt_and_empty_tables():
    rows = [{"a": 1.23456, "b": 1.23456, "c": 1.23456}]
    # columns past the tuple's end use "g"; widths: max(len(cell), len(header) + 2)
    expected = "  a      b        c\n---  -----  -------\n1.2  1.235  1.23456"
    assert simple_table(rows, floatfmt=(".1f", ".3f")) == expected
    assert simple_table([]) == ""
    assert simple_table([{}, {}]) == ""


@needs_tabulate
def test_hand_examples_agree_with_tabulate():
    assert oracle([{"name": "alpha", "t": 1.5, "n": 3}, {"name": "b", "t": 12.25, "extra": "x"}, {"t": None, "n": -40}],
                  floatfmt=".2f") == simple_table(
        [{"name": "alpha", "t": 1.5, "n": 3}, {"name": "b", "t": 12.25, "extra": "x"}, {"t": None, "n": -40}],
        floatfmt=".2f")
    rows = [{"k": "584,353"}, {"k": "1e-3"}, {"k": " 12 "}]
    assert oracle(rows) == simple_table(rows) and oracle(rows, disable_numparse=True) == simple_table(
        rows, disable_numparse=True)
    assert oracle([]) == "" == oracle([{}, {}])


def test_control_characters_are_refused():
    with pytest.raises(ValueError, match="control character"):
        simple_table([{"a": "two\nlines"}])
    with pytest.raises(ValueError, match="control character"):
        simple_table([{"a\tb": 1}])


def test_default_plan_imports_neither_tabulate_nor_numpy():
    """The default ``plan`` prints its tables without tabulate (which imports importlib.metadata and wcwidth) and
    plans without numpy (the whole process's CPU time)."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys\n"
            "from tessera_lab.cli.main import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['plan'])\n"
            "print(rc, sorted(m for m in ('tabulate', 'wcwidth', 'numpy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "0 []"
