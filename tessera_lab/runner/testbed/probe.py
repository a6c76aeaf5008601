"""A CPU-share probe (torch-free): how fast ``n`` concurrent processes run a fixed pure-Python loop on this
machine *now*.

The runner's per-action time on a CPU is dominated by Python dispatch (the calibrated layer times are mostly
intercept), so the share of a core a process gets is what stretches it. The 1-minute load average lags the
other tenants of a shared machine by tens of seconds; this probe measures the share at the moment a
prediction is made, before the run, in processes of its own (never one of the predicted runs).

``available_cores(cores, processes=n)`` (what the runner's prediction reads): ``n`` spinning processes, each
in a session of its own, and the cores they got in all over a window. ``cpu_probe(n)``: ``n`` forked processes
each run :data:`ITERATIONS` loop iterations ``repeats`` times, the median seconds of one repetition (recorded
by calibration; read only to re-predict results stored before ``available_cores`` existed).
"""

from __future__ import annotations

import multiprocessing as _mp
import os
import statistics
import time

from tessera_lab.samples import time_calls

__all__ = ["ITERATIONS", "cpu_probe", "cpu_share", "available_cores"]

#: loop iterations of one probe repetition (about 15 ms on one quiet 2.6 GHz Xeon core)
ITERATIONS = 300_000


def _spin(iterations: int, repeats: int, q) -> None:
    def loop() -> None:
        x = 0
        for i in range(iterations):
            x += i & 7

    q.put(time_calls(loop, repeats, warmup=0))


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


def _share(window_s: float, q, own_session: bool = False) -> None:
    if own_session:  # a scheduling group of its own, as each spawned runner worker is (start_new_session)
        try:
            os.setsid()
        except OSError:  # pragma: no cover - already a session leader
            pass
    w0, c0 = time.perf_counter(), time.process_time()
    x = n = 0
    while time.perf_counter() - w0 < window_s:
        for i in range(2000):
            x += i & 7
        n += 2000
    q.put((n, time.process_time() - c0, time.perf_counter() - w0))


def _spinners(processes: int, window_s: float, own_session: bool = False) -> list[tuple[int, float, float]]:
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1 or not window_s > 0:
        raise ValueError(f"processes = {processes!r}, window_s = {window_s!r}; allowed: an integer >= 1, "
                         f"seconds > 0")
    try:
        ctx = _mp.get_context("fork")
    except ValueError:  # pragma: no cover
        ctx = _mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_share, args=(window_s, q, own_session), daemon=True) for _ in range(processes)]
    for p in procs:
        p.start()
    out = [q.get() for _ in procs]
    for p in procs:
        p.join(timeout=10)
    return out


def cpu_share(processes: int, *, window_s: float = 0.5) -> float:
    """Mean share of a core (CPU time / wall time, 0..1) that each of ``processes`` spinning processes got
    over ``window_s`` seconds now (a median of short repetitions, :func:`cpu_probe`, is quantised by the
    scheduler's time slices; a share over a window is the processor-sharing rate itself).

    Raises:
        ValueError: ``processes`` < 1 or ``window_s`` <= 0.
    """
    return min(1.0, statistics.fmean(c / max(w, 1e-9) for _, c, w in _spinners(processes, window_s)))


def available_cores(cores: int, *, processes: int | None = None, window_s: float = 0.5) -> dict[str, float]:
    """Cores a job of ``processes`` processes gets now (default ``max(2, cores)``): as many spinning processes,
    each in a session of its own as each spawned runner worker is (:func:`tessera_lab.runner.launch.spawn.spawn`
    starts them with ``start_new_session``; with the kernel's autogroup scheduling a session is a scheduling
    group, so against busy other tenants a job's share grows with its process count: while the test-suite ran
    here, 2, 4 and 6 such spinners got 1.07, 1.33 and 1.45 cores, and 1.08, 0.85 and 0.75 in one session);
    the sum of their CPU shares, never more than ``cores``. (A core's speed is not measured here: this VM's
    pure-Python loop speed did not follow its torch work's; :mod:`tessera_lab.runner.testbed.work_probe` measures that.)
    Returns ``{"cores_available", "share", "processes", "window_s"}``."""
    n = int(processes) if processes else max(2, int(cores))
    share = min(1.0, statistics.fmean(c / max(w, 1e-9) for _, c, w in _spinners(n, window_s, True)))
    return {"cores_available": min(float(cores), n * share), "share": share, "processes": n, "window_s": window_s}
