"""Per-op device timings (an *op table*): what the cost model needs from a device, measured on it, loaded and
checked here (torch-free). The runner measures one with :mod:`tessera_lab.runner.measure.optable`
(``scripts/gpu_check.sh`` does on every GPU run); the format is in docs/file-schemas.md.

A table holds rows ``{"op", "shape", "flops", "bytes", "median_s", "q1_s", "q3_s", "samples_s"}``: ``op`` one of
:data:`OPS`, ``shape`` the op's sizes (ints), ``flops`` its floating-point operations (0 for communication),
``bytes`` what it moves (communication: payload bytes per rank; compute: 0), seconds measured.

What the planner derives from it (:func:`compute_rate`, :func:`alpha_beta`): the achieved FLOP/s of a compute op
(the median over its rows of flops / median_s) and, for a communication op, the latency ``alpha`` (s) and
inverse bandwidth ``beta`` (s/byte) of ``t = alpha + beta * bytes`` fitted by least squares over its sizes
(Hockney's model, the one the cost model's communication terms use).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from tessera_lab.errors import ConfigError
from tessera_lab.schema import F, validate

__all__ = ["OP_TABLE_FORMAT", "OP_TABLE_VERSION", "OPS", "COMPUTE_OPS", "COMM_OPS", "OP_TABLE", "check_op_table",
           "load_op_table", "compute_rate", "alpha_beta"]

OP_TABLE_FORMAT = "tessera-lab/op-table"
OP_TABLE_VERSION = 1
#: compute ops: a GEMM ``[m, k] x [k, n]``; the grouped GEMM of ``groups`` experts ``[m, k] x [k, n]`` each;
#: causal attention ``[b, h, t, d]``; the chunked Gated DeltaNet rule ``[b, h, t, d]`` with ``chunk``
COMPUTE_OPS = ("gemm", "grouped_gemm", "attention", "gated_deltanet")
#: communication ops over ``ranks`` processes: an equal-split all-to-all and a one-way p2p send/recv
COMM_OPS = ("all_to_all", "p2p")
OPS = COMPUTE_OPS + COMM_OPS

_SECONDS = F("num", low=0.0, high=1e9)
ROW = F("dict", fields={
    "op": F("str", choices=OPS),
    "shape": F("map", high=8, values=F("int", low=0, high=2**40)),
    "flops": F("num", low=0.0, high=1e30),
    "bytes": F("num", low=0.0, high=1e18),
    "median_s": _SECONDS, "q1_s": _SECONDS, "q3_s": _SECONDS,
    "samples_s": F("list", low=1, high=10_000, items=_SECONDS),
})
OP_TABLE = F("dict", fields={
    "format": F("str", choices=(OP_TABLE_FORMAT,)),
    "version": F("int", choices=(OP_TABLE_VERSION,), allowed=str(OP_TABLE_VERSION)),
    "device": F("str"),
    "backend": F("str", choices=("cpu", "cuda")),
    "clock": F("str"),
    "dtype": F("str"),
    "ops": F("list", low=1, high=100_000, items=ROW),
}, allowed="an object (an op table from tessera_lab.runner.measure.optable)")


def check_op_table(data: Any, where: str) -> dict:
    """``data`` checked against :data:`OP_TABLE` and ``q1_s <= median_s <= q3_s`` per row; returned unchanged.

    Raises:
        ConfigError: one line naming ``where``, the field, the value and what is allowed.
    """
    validate(data, OP_TABLE, where)
    for i, r in enumerate(data["ops"]):
        if not r["q1_s"] <= r["median_s"] <= r["q3_s"]:
            raise ConfigError(f"{where}: field 'ops[{i}]' has q1_s = {r['q1_s']}, median_s = {r['median_s']}, "
                              f"q3_s = {r['q3_s']}; allowed: q1_s <= median_s <= q3_s")
    return data


def load_op_table(path: str | Path) -> dict:
    """Read and check an op table (:func:`tessera_lab.io.read_json`, then :func:`check_op_table`).

    Raises:
        ConfigError: unreadable file or a field out of range (one line).
    """
    from tessera_lab.io import read_json

    return check_op_table(read_json(path, "op table"), f"op table '{path}'")


def compute_rate(table: dict, op: str) -> float:
    """Achieved FLOP/s of compute op ``op``: the median over its rows of ``flops / median_s``.

    Raises:
        ConfigError: ``op`` is not a compute op or has no timed rows in ``table``.
    """
    rates = [r["flops"] / r["median_s"] for r in table["ops"] if r["op"] == op and r["median_s"] > 0]
    if op not in COMPUTE_OPS or not rates:
        raise ConfigError(f"op table has no rows of compute op {op!r}; allowed: {', '.join(COMPUTE_OPS)} present "
                          f"in the table")
    return statistics.median(rates)


def alpha_beta(table: dict, op: str) -> tuple[float, float]:
    """``(alpha_s, beta_s_per_byte)`` of communication op ``op``: least squares of ``median_s = alpha + beta *
    bytes`` over its rows (at least two sizes), each clipped at 0.

    Raises:
        ConfigError: ``op`` is not a communication op or has fewer than two sizes in ``table``.
    """
    pts = [(r["bytes"], r["median_s"]) for r in table["ops"] if r["op"] == op]
    xs = {x for x, _ in pts}
    if op not in COMM_OPS or len(xs) < 2:
        raise ConfigError(f"op table has {len(xs)} sizes of communication op {op!r}; allowed: {', '.join(COMM_OPS)} "
                          f"with at least two sizes")
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    beta = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    beta = max(0.0, beta)
    return max(0.0, my - beta * mx), beta
