"""A CPU-share probe (torch-free): how fast ``n`` concurrent processes run a fixed pure-Python loop on this
machine *now*.

The runner's per-action time on a CPU is dominated by Python dispatch (the calibrated layer times are mostly
intercept), so the share of a core a process gets is what stretches it. The 1-minute load average lags the
other tenants of a shared machine by tens of seconds; this probe measures the share at the moment a
prediction is made, before the run, in processes of its own (never one of the predicted runs).

``cpu_probe(n)``: ``n`` forked processes each run :data:`ITERATIONS` loop iterations ``repeats`` times; the
result is the median seconds of one repetition over every process and repetition. Calibration records
``cpu_probe(1)`` with its load; :func:`tessera_lab.runner.predict.oversubscription` turns a probe at run time
into the slowdown of the run's processes.
"""

from __future__ import annotations

import multiprocessing as _mp
import statistics
import time

__all__ = ["ITERATIONS", "cpu_probe"]

#: loop iterations of one probe repetition (about 15 ms on one quiet 2.6 GHz Xeon core)
ITERATIONS = 300_000


def _spin(iterations: int, repeats: int, q) -> None:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        x = 0
        for i in range(iterations):
            x += i & 7
        out.append(time.perf_counter() - t)
    q.put(out)


def cpu_probe(processes: int, *, repeats: int = 10, iterations: int = ITERATIONS) -> float:
    """Median seconds of one repetition of the fixed loop with ``processes`` running at once (>= 1).

    Raises:
        ValueError: ``processes`` < 1.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes = {processes!r}; allowed: an integer >= 1")
    try:
        ctx = _mp.get_context("fork")
    except ValueError:  # pragma: no cover - platforms without fork
        ctx = _mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_spin, args=(iterations, repeats, q), daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    times = []
    for _ in procs:
        times += q.get()
    for p in procs:
        p.join(timeout=10)
    return statistics.median(times)
