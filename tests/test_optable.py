"""Op tables (tessera_lab.cost.optable): the schema check refuses bad files with one line, and the rates the
planner derives are worked out by hand."""

from __future__ import annotations

import json

import pytest

from tessera_lab.cost.optable import OP_TABLE_FORMAT, alpha_beta, check_op_table, compute_rate, load_op_table
from tessera_lab.errors import ConfigError


def _row(op, flops, nbytes, t):
    return {"op": op, "shape": {"m": 8}, "flops": flops, "bytes": nbytes, "median_s": t, "q1_s": t, "q3_s": t,
            "samples_s": [t]}


def _table(rows):
    return {"format": OP_TABLE_FORMAT, "version": 1, "device": "test", "backend": "cpu", "clock": "host clock",
            "dtype": "float32", "ops": rows}


def test_rates_by_hand():
    t = _table([_row("gemm", 2e9, 0, 0.001), _row("gemm", 8e9, 0, 0.002), _row("gemm", 1e9, 0, 0.001),
                # t = 1e-5 + 1e-9 * bytes exactly: alpha 10 us, beta 1 ns/byte (1 GB/s)
                _row("p2p", 0, 1000, 1e-5 + 1e-6), _row("p2p", 0, 1e6, 1e-5 + 1e-3)])
    assert compute_rate(t, "gemm") == pytest.approx(2e12)  # median of 2e12, 4e12, 1e12
    a, b = alpha_beta(t, "p2p")
    assert a == pytest.approx(1e-5) and b == pytest.approx(1e-9)
    with pytest.raises(ConfigError, match="at least two sizes"):
        alpha_beta(t, "all_to_all")
    with pytest.raises(ConfigError, match="compute op 'attention'"):
        compute_rate(t, "attention")


@pytest.mark.parametrize("change, field", [
    (lambda d: d["ops"][0].update(op="conv"), "ops[0].op"),
    (lambda d: d["ops"][0].update(median_s=-1.0), "ops[0].median_s"),
    (lambda d: d["ops"][0].update(q1_s=0.5), "q1_s <= median_s <= q3_s"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(ops=[]), "ops"),
])
def test_bad_tables_are_one_line(tmp_path, change, field):
    d = _table([_row("gemm", 1.0, 0, 0.1)])
    change(d)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError) as exc:
        load_op_table(p)
    assert field in str(exc.value) and "\n" not in str(exc.value)


def test_a_good_table_loads_unchanged():
    d = _table([_row("gemm", 1.0, 0, 0.1)])
    assert check_op_table(d, "t") is d


def test_measured_on_cpu_compute_rows_have_the_counted_flops():
    pytest.importorskip("torch")
    from tessera_lab.runner.measure.optable import SIZES, measure_op_table

    t = measure_op_table("cpu", "tiny", 0)
    gemm = [r for r in t["ops"] if r["op"] == "gemm"]
    assert [r["flops"] for r in gemm] == [2 * n ** 3 for n in SIZES["tiny"]["gemm"]]
    att = next(r for r in t["ops"] if r["op"] == "attention")
    assert att["flops"] == 2 * 1 * 2 * 64 * 64 * 16  # 2 b h t^2 d
    assert {r["op"] for r in t["ops"]} == {"gemm", "grouped_gemm", "attention", "gated_deltanet"}
    assert all(len(r["samples_s"]) == SIZES["tiny"]["repeats"] for r in t["ops"])
