"""Rank supervision: readiness, per-rank heartbeats, fault injection, and naming the root cause of a failed launch.

Never imports torch (both the spawner and the worker import it).

Start-up: a worker writes ``{out}/imported-<rank>`` once it has imported torch (:func:`mark_imported`, just before
it joins the process group) and ``{out}/ready-<rank>`` once it has joined (:func:`mark_ready`). Importing torch on a
loaded machine takes many seconds, during which a process may not be scheduled at all, so the heartbeat deadline
does not apply before ready; instead every rank has a start-up deadline (:func:`startup_deadline`): once one rank
has reported a step, every other rank must report it within ``max(floor, STARTUP_FACTOR x`` the slowest time the
ranks that did report took (measured by the spawner from each rank's spawn)``)``; the floor is
:data:`STARTUP_FLOOR_S` (``$TESSERA_LAB_STARTUP_FLOOR``). A rank still using CPU at its deadline gets up to
:data:`BUSY_FACTOR` times it. A rank that is *stopped* (``/proc/PID/stat`` state ``T``) and silent for the
heartbeat timeout is named at once, ready or not. Peers waiting in the rendezvous for a rank that never came are
not blamed: a rank that never reported ``imported`` is named before one that never reported ready.

Heartbeat: every worker runs a daemon thread that writes one byte every :data:`HEARTBEAT_S` seconds to a pipe
the spawner made for it (``$TESSERA_LAB_HEARTBEAT_FD``; without one, e.g. a worker started by hand with ``--out``,
it rewrites ``{out}/hb-<rank>``). A pipe never waits on a disk: a shared machine whose file system stalls for
seconds (a file write in the heartbeat thread then blocks in ``open``) does not make a working rank look hung.
A stopped (SIGSTOP) or wedged process stops writing. The spawner declares a *ready* rank hung when its
heartbeat is older than :data:`HEARTBEAT_TIMEOUT_S` (:data:`MISSED_BEATS` missed beats;
``$TESSERA_LAB_HEARTBEAT_TIMEOUT``) and the process is stopped or used no CPU while silent; a silent rank that
still uses CPU (starved or in a long C call holding the GIL) is given up to :data:`BUSY_FACTOR` times the
timeout, times the machine's oversubscription (1-minute load average / cores, at least 1: on a machine at load 9 on
2 cores a runnable thread gets about 2/9 of a core, so a beat due every 0.5 s may come many seconds late;
:func:`busy_allowance`). A stopped rank is thus detected within ``HEARTBEAT_TIMEOUT_S + HEARTBEAT_S + poll``
seconds of its fault (stated bound :data:`DETECT_BOUND_S`); a killed or failing rank as soon as its exit status is polled (50 ms).
The hung rank's Python stack (all threads, :mod:`faulthandler` on ``SIGUSR1``, :func:`install_stack_dump`) is
written to ``{out}/stack-<rank>.txt`` and quoted in the error, with a hint when the machine is busy
(:func:`busy_hint`).

Root cause: a rank that died by a signal or lost its heartbeat writes no failure record, while its peers then
fail on closed connections and *do* record failures; so signal deaths and lost heartbeats win over recorded
failures, the earliest first (:func:`root_cause`).

Fault injection (tests, ``benchmarks/runner_faults.py``): ``TESSERA_LAB_FAULT=RANK:KIND[:DELAY_S]`` with KIND
``raise`` (an exception raised asynchronously in the main thread, :func:`ctypes.pythonapi.PyThreadState_SetAsyncExc`;
if the main thread stays inside a C call, the fault thread ends the rank as an uncaught exception would, exit
status 1, after :data:`RAISE_FALLBACK_S`), ``kill`` (SIGKILL to itself) or ``hang`` (SIGSTOP to itself),
DELAY_S seconds (default 1) after the rank reported ready; ``start-hang`` (SIGSTOP to itself DELAY_S seconds after
the worker started, or when it has imported torch if that comes first: always before it reports ready) and
``start-block`` (the main thread sleeps for ever once torch is imported; the heartbeat goes on, so only the
start-up deadline catches it). None of them depends on signal dispositions (a job
started in the background from a shell ignores SIGINT). The spawner parses the variable before any worker starts.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["HEARTBEAT_S", "HEARTBEAT_TIMEOUT_S", "DETECT_BOUND_S", "EXIT_PEER_FAILED", "MISSED_BEATS",
           "start_heartbeat", "mark_ready", "install_stack_dump", "arm_fault", "parse_fault", "heartbeat_timeout",
           "busy_hint", "FaultInjected", "Cause", "root_cause", "describe", "STARTUP_FLOOR_S", "STARTUP_FACTOR",
           "STARTUP_DETECT_BOUND_S", "busy_allowance", "HEARTBEAT_FD_ENV",
           "startup_floor", "startup_deadline", "mark_imported", "arm_start_fault", "start_checkpoint"]

#: seconds between two heartbeats of a worker
HEARTBEAT_S = 0.5
#: missed beats before a ready rank is declared hung
MISSED_BEATS = 10
#: a ready rank whose last heartbeat is older than this (seconds) is declared hung (MISSED_BEATS * HEARTBEAT_S)
HEARTBEAT_TIMEOUT_S = MISSED_BEATS * HEARTBEAT_S
#: a silent rank that still uses CPU is declared hung only after BUSY_FACTOR times the timeout
BUSY_FACTOR = 3.0
#: the stated detection bound of a stopped rank (seconds after it stopped): timeout + one beat + polling slack
DETECT_BOUND_S = 10.0
#: the stated detection bound of a rank stopped before it reported ready (seconds after it stopped): a stopped
#: rank is named once silent for the heartbeat timeout, as a ready one; the rest covers the stack dump and reaping
#: the workers on a busy two-core machine (the start-up deadline itself applies only to ranks still running)
STARTUP_DETECT_BOUND_S = 40.0
#: ``tessera-lab run`` exit status when a rank failed and its peers were shut down (bad input stays 2)
EXIT_PEER_FAILED = 3
#: seconds the ``raise`` fault waits for the main thread to raise before it ends the rank itself
RAISE_FALLBACK_S = 2.0

#: the least start-up deadline (seconds from a rank's spawn to its report)
STARTUP_FLOOR_S = 30.0
#: a rank's start-up deadline is this many times the slowest time of the ranks that did report the same step
STARTUP_FACTOR = 3.0

FAULT_KINDS = ("raise", "kill", "hang", "start-hang", "start-block")
START_FAULTS = ("start-hang", "start-block")


def _env_seconds(name: str, default: float) -> float:
    from tessera_lab.errors import ConfigError

    v = os.environ.get(name)
    if v is None:
        return default
    try:
        t = float(v)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t >= 1.0):
        raise ConfigError(f"environment variable {name} = {v!r}; allowed: seconds >= 1")
    return t


def startup_floor() -> float:
    """:data:`STARTUP_FLOOR_S`, or ``$TESSERA_LAB_STARTUP_FLOOR`` (seconds, finite, >= 1). Raises ConfigError."""
    return _env_seconds("TESSERA_LAB_STARTUP_FLOOR", STARTUP_FLOOR_S)


def startup_deadline(reported_s: list[float], floor: float) -> float | None:
    """Seconds a rank may take from its spawn to a start-up report: ``max(floor, STARTUP_FACTOR * max(reported_s))``
    where ``reported_s`` are the measured times (seconds from spawn) of the ranks that did report; None while no
    rank has reported (nothing measured: only ``--timeout`` applies)."""
    if not reported_s:
        return None
    return max(floor, STARTUP_FACTOR * max(reported_s))


def heartbeat_timeout() -> float:
    """:data:`HEARTBEAT_TIMEOUT_S`, or ``$TESSERA_LAB_HEARTBEAT_TIMEOUT`` (seconds, finite, >= 1)."""
    return _env_seconds("TESSERA_LAB_HEARTBEAT_TIMEOUT", HEARTBEAT_TIMEOUT_S)


#: environment variable naming the write end of the heartbeat pipe the spawner passed to a worker
HEARTBEAT_FD_ENV = "TESSERA_LAB_HEARTBEAT_FD"


def start_heartbeat(out_dir: str | None, rank: int) -> None:
    """Start the daemon thread that beats every :data:`HEARTBEAT_S` s: one byte to the pipe in
    ``$TESSERA_LAB_HEARTBEAT_FD`` (non-blocking: a full pipe already holds unread beats), else a rewrite of
    ``{out_dir}/hb-<rank>``. No-op without either (e.g. under torchrun)."""
    fd = os.environ.get(HEARTBEAT_FD_ENV, "")
    if fd.isdigit():
        pipe = int(fd)
        os.set_blocking(pipe, False)

        def beat() -> None:
            try:
                os.write(pipe, b".")
            except OSError:  # full (BlockingIOError: beats are waiting) or the spawner is gone (BrokenPipeError)
                pass
    elif out_dir:
        path = Path(out_dir) / f"hb-{rank}"

        def beat() -> None:
            try:
                path.write_text(f"{time.time():.3f}\n")  # one small write; the spawner reads the mtime
            except OSError:
                pass
    else:
        return

    def loop() -> None:
        while True:
            beat()
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=loop, name="tessera-heartbeat", daemon=True).start()


def mark_imported(out_dir: str | None, rank: int) -> None:
    """Write ``{out_dir}/imported-<rank>`` (torch imported, about to join the process group)."""
    if out_dir:
        try:
            (Path(out_dir) / f"imported-{rank}").write_text(f"{time.time():.3f}\n")
        except OSError:  # pragma: no cover - the spawner's start-up deadline then names this rank
            pass


def mark_ready(out_dir: str | None, rank: int) -> None:
    """Write ``{out_dir}/ready-<rank>`` (torch imported, process group joined): heartbeat deadlines apply from now."""
    if out_dir:
        try:
            (Path(out_dir) / f"ready-{rank}").write_text(f"{time.time():.3f}\n")
        except OSError:  # pragma: no cover - the spawner then keeps waiting (bounded by --timeout)
            pass


_STACK_FILE = None


def install_stack_dump(out_dir: str | None, rank: int) -> None:
    """On ``SIGUSR1`` dump every thread's Python stack to ``{out_dir}/stack-<rank>.txt`` (:mod:`faulthandler`;
    works while the main thread is blocked in C). No-op without ``out_dir``."""
    global _STACK_FILE
    if not out_dir or not hasattr(signal, "SIGUSR1"):
        return
    import faulthandler

    try:
        _STACK_FILE = open(Path(out_dir) / f"stack-{rank}.txt", "w")  # noqa: SIM115 - kept open for the handler
        faulthandler.register(signal.SIGUSR1, file=_STACK_FILE, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):  # pragma: no cover - best effort
        pass


def busy_allowance(base_s: float, cores: int | None = None, load: float | None = None) -> float:
    """Seconds a silent rank that still uses CPU may stay silent: ``BUSY_FACTOR x base_s x max(1, load / cores)``
    (``load``: the 1-minute load average, ``cores``: the usable cores; both read from the machine by default). A
    stopped or idle rank gets no allowance (the caller checks); this only keeps a starved rank on a busy machine
    from being called hung."""
    try:
        load = os.getloadavg()[0] if load is None else load
    except OSError:  # pragma: no cover
        load = 0.0
    if not cores:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return BUSY_FACTOR * base_s * max(1.0, load / max(1, cores))


def busy_hint(cores: int | None = None, load: float | None = None) -> str:
    """A hint when the machine is busy (1-minute load average above the core count), else ``""``."""
    try:
        load = os.getloadavg()[0] if load is None else load
    except OSError:  # pragma: no cover
        return ""
    cores = cores or os.cpu_count() or 1
    if load <= cores:
        return ""
    return (f"the machine is busy (load average {load:.1f} on {cores} cores): if this rank was only slow, set "
            f"TESSERA_LAB_HEARTBEAT_TIMEOUT above {heartbeat_timeout():.0f} s")


class FaultInjected(RuntimeError):
    """The exception of an injected ``raise`` fault."""


def _raise_in_main(rank: int, out_dir: str | None) -> None:
    """Raise :class:`FaultInjected` in the main thread; end the rank as an uncaught exception would if the main
    thread has not ended it within :data:`RAISE_FALLBACK_S` (it may sit in a C call that never returns)."""
    import ctypes

    main_id = threading.main_thread().ident
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main_id), ctypes.py_object(FaultInjected))
    time.sleep(RAISE_FALLBACK_S)
    import sys

    if out_dir:
        from tessera_lab.io import atomic_write_text

        import json

        try:
            atomic_write_text(Path(out_dir) / f"failure-{rank}.json", json.dumps({"rank": rank, "time": time.time()}))
        except Exception:  # noqa: BLE001 - best effort while exiting  # pragma: no cover
            pass
    print(f"tessera_lab.runner.launch.supervise.FaultInjected: injected 'raise' fault on rank {rank} (the main thread "
          f"did not return to Python within {RAISE_FALLBACK_S} s)", file=sys.stderr, flush=True)
    os._exit(1)


def parse_fault(text: str | None) -> tuple[int, str, float] | None:
    """``"RANK:KIND[:DELAY_S]"`` -> ``(rank, kind, delay_s)``; None for None/empty. Raises ConfigError."""
    from tessera_lab.errors import ConfigError

    if not text:
        return None
    parts = text.split(":")
    try:
        rank, kind = int(parts[0]), parts[1]
        delay = float(parts[2]) if len(parts) > 2 else 1.0
    except (ValueError, IndexError):
        rank, kind, delay = -1, "", math.nan
    if len(parts) > 3 or rank < 0 or kind not in FAULT_KINDS or not (math.isfinite(delay) and delay >= 0):
        raise ConfigError(f"TESSERA_LAB_FAULT = {text!r}; allowed: RANK:KIND[:DELAY_S] with KIND one of "
                          f"{'|'.join(FAULT_KINDS)}, RANK >= 0, DELAY_S >= 0")
    return rank, kind, delay


def arm_fault(rank: int, out_dir: str | None = None) -> None:
    """If ``$TESSERA_LAB_FAULT`` names this rank, inject its fault after the delay (from a daemon thread); the
    wall-clock time of the injection goes to ``{out_dir}/fault-<rank>.json`` (for detection-time benchmarks).
    Call after :func:`mark_ready`."""
    f = parse_fault(os.environ.get("TESSERA_LAB_FAULT"))
    if f is None or f[0] != rank or f[1] in START_FAULTS:
        return
    _, kind, delay = f

    def fire() -> None:
        time.sleep(delay)
        _note_fault(kind, rank, out_dir)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            _raise_in_main(rank, out_dir)  # an exception in the main thread: recorded like any exception

    threading.Thread(target=fire, name="tessera-fault", daemon=True).start()


def _note_fault(kind: str, rank: int, out_dir: str | None) -> None:
    """Print and record (``{out_dir}/fault-<rank>.json``, wall-clock time) an injection about to happen."""
    print(f"tessera-lab runner: injecting fault '{kind}' on rank {rank}", flush=True)
    if out_dir:
        import json

        from tessera_lab.io import atomic_write_text

        atomic_write_text(Path(out_dir) / f"fault-{rank}.json", json.dumps({"kind": kind, "time": time.time()}))


_START_FAULT: dict = {}
_START_LOCK = threading.Lock()


def arm_start_fault(rank: int, out_dir: str | None = None) -> None:
    """If ``$TESSERA_LAB_FAULT`` names this rank with a start fault, arm it (call first thing in the worker):
    ``start-hang`` stops the process DELAY_S s from now from a daemon thread, or at :func:`start_checkpoint` if
    that comes first; ``start-block`` blocks the main thread at :func:`start_checkpoint`."""
    try:
        f = parse_fault(os.environ.get("TESSERA_LAB_FAULT"))
    except Exception:  # noqa: BLE001 - the spawner checked it; a worker started by hand ignores a bad one
        return
    if f is None or f[0] != rank or f[1] not in START_FAULTS:
        return
    _START_FAULT.update(kind=f[1], rank=rank, out=out_dir, fired=False)
    if f[1] == "start-hang":
        def fire() -> None:
            time.sleep(f[2])
            _fire_start_fault()

        threading.Thread(target=fire, name="tessera-fault", daemon=True).start()


def _fire_start_fault() -> None:
    with _START_LOCK:
        if not _START_FAULT or _START_FAULT["fired"]:
            return
        _START_FAULT["fired"] = True
    _note_fault(_START_FAULT["kind"], _START_FAULT["rank"], _START_FAULT["out"])
    if _START_FAULT["kind"] == "start-hang":
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        while True:
            time.sleep(3600)


def start_checkpoint() -> None:
    """Where an armed start fault fires at the latest: torch imported, the process group not joined yet."""
    _fire_start_fault()


class Cause:
    """One observed failure of a rank: ``kind`` is ``"signal"``, ``"heartbeat"``, ``"start"`` (no start-up report
    by its deadline, or stopped before ready; ``detail`` says which and the deadline) or ``"exit"`` (a non-zero
    status, with or without a failure record); ``time`` is the wall-clock time it happened (s since epoch)."""

    PRIORITY = {"signal": 0, "heartbeat": 0, "start": 0, "exit": 1}

    def __init__(self, rank: int, kind: str, time_s: float, *, code: int | None = None, silent_s: float = 0.0,
                 state: str = "?", detail: str = ""):
        self.rank, self.kind, self.time, self.code, self.silent_s = rank, kind, time_s, code, silent_s
        self.state = state  # process state letter when a heartbeat was lost ("T": stopped)
        self.detail = detail  # "start": what the rank did not report and the deadline

    def how(self) -> str:
        if self.kind == "signal":
            try:
                name = signal.Signals(-self.code).name  # type: ignore[operator]
            except (ValueError, TypeError):
                name = "?"
            return f"was killed by signal {-self.code} ({name})"  # type: ignore[operator]
        if self.kind == "heartbeat":
            what = "stopped" if self.state in ("T", "t") else "hung"
            return f"sent no heartbeat for {self.silent_s:.1f} s ({what})"
        if self.kind == "start":
            return self.detail
        return f"failed with exit status {self.code}"

    def __repr__(self) -> str:  # pragma: no cover - debugging
        return f"Cause(rank={self.rank}, kind={self.kind!r}, time={self.time:.3f}, code={self.code})"


def root_cause(causes: list[Cause], recorded: dict[int, float]) -> Cause:
    """The rank that failed first: signal deaths and lost heartbeats (no record possible) before exits; among
    exits, the earliest failure record (``recorded``: rank -> time), else the first exit observed."""
    if not causes:
        raise ValueError("root_cause: no causes")

    def key(c: Cause) -> tuple:
        t = recorded.get(c.rank, c.time) if c.kind == "exit" else c.time
        return Cause.PRIORITY[c.kind], t

    return min(causes, key=key)


def describe(cause: Cause, n: int) -> str:
    """One sentence: which rank, how, and that the others were shut down."""
    others = n - 1
    return (f"rank {cause.rank} {cause.how()}; the other {others} rank{'s' if others != 1 else ''} were shut down "
            f"because a peer failed")
