"""Rank supervision: per-rank heartbeats, fault injection, and naming the root cause of a failed launch.

Never imports torch (both the spawner and the worker import it).

Heartbeat: every worker runs a daemon thread that rewrites ``{out}/hb-<rank>`` every :data:`HEARTBEAT_S`
seconds (its content is the wall-clock time). A stopped (SIGSTOP) or wedged process stops writing; the spawner
declares a rank whose heartbeat is older than :data:`HEARTBEAT_TIMEOUT_S` (``$TESSERA_LAB_HEARTBEAT_TIMEOUT``)
hung. So a hung rank is detected within ``HEARTBEAT_TIMEOUT_S + poll`` seconds of its last beat (stated bound:
:data:`DETECT_BOUND_S`); a killed rank is detected as soon as its exit status is polled (50 ms).

Root cause: a rank that died by a signal or lost its heartbeat writes no failure record, while its peers then
fail on closed connections and *do* record failures; so signal deaths and lost heartbeats win over recorded
failures, the earliest first (:func:`root_cause`).

Fault injection (tests, ``benchmarks/runner_faults.py``): ``TESSERA_LAB_FAULT=RANK:KIND[:DELAY_S]`` with KIND
``raise`` (an exception in the main thread), ``kill`` (SIGKILL to itself) or ``hang`` (SIGSTOP to itself),
DELAY_S seconds (default 1) after the rank joined the process group.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from pathlib import Path

__all__ = ["HEARTBEAT_S", "HEARTBEAT_TIMEOUT_S", "DETECT_BOUND_S", "EXIT_PEER_FAILED", "start_heartbeat",
           "arm_fault", "parse_fault", "heartbeat_timeout", "Cause", "root_cause", "describe"]

#: seconds between two heartbeats of a worker
HEARTBEAT_S = 0.5
#: a live rank whose last heartbeat is older than this (seconds) is declared hung
HEARTBEAT_TIMEOUT_S = 5.0
#: the stated detection bound of a hung rank (seconds after it stopped): timeout + one beat + polling slack
DETECT_BOUND_S = 10.0
#: ``tessera-lab run`` exit status when a rank failed and its peers were stopped (bad input stays 2)
EXIT_PEER_FAILED = 3
#: seconds a worker may take to write its first heartbeat (interpreter start-up on a loaded machine)
STARTUP_S = 120.0

FAULT_KINDS = ("raise", "kill", "hang")


def heartbeat_timeout() -> float:
    """:data:`HEARTBEAT_TIMEOUT_S`, or ``$TESSERA_LAB_HEARTBEAT_TIMEOUT`` (seconds, finite, >= 1)."""
    from tessera_lab.errors import ConfigError

    v = os.environ.get("TESSERA_LAB_HEARTBEAT_TIMEOUT")
    if v is None:
        return HEARTBEAT_TIMEOUT_S
    try:
        t = float(v)
    except ValueError:
        t = math.nan
    if not (math.isfinite(t) and t >= 1.0):
        raise ConfigError(f"environment variable TESSERA_LAB_HEARTBEAT_TIMEOUT = {v!r}; allowed: seconds >= 1")
    return t


def start_heartbeat(out_dir: str | None, rank: int) -> None:
    """Start the daemon thread that rewrites ``{out_dir}/hb-<rank>`` every :data:`HEARTBEAT_S` s (no-op without
    ``out_dir``, e.g. under torchrun)."""
    if not out_dir:
        return
    path = Path(out_dir) / f"hb-{rank}"

    def loop() -> None:
        while True:
            try:
                path.write_text(f"{time.time():.3f}\n")  # one small write; the spawner reads the mtime
            except OSError:
                pass
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=loop, name="tessera-heartbeat", daemon=True).start()


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
    wall-clock time of the injection goes to ``{out_dir}/fault-<rank>.json`` (for detection-time benchmarks)."""
    f = parse_fault(os.environ.get("TESSERA_LAB_FAULT"))
    if f is None or f[0] != rank:
        return
    _, kind, delay = f

    def fire() -> None:
        time.sleep(delay)
        print(f"tessera-lab runner: injecting fault '{kind}' on rank {rank}", flush=True)
        if out_dir:
            import json

            from tessera_lab.io import atomic_write_text

            atomic_write_text(Path(out_dir) / f"fault-{rank}.json", json.dumps({"kind": kind, "time": time.time()}))
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "hang":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            import _thread

            _thread.interrupt_main()  # KeyboardInterrupt in the main thread: recorded like any exception

    threading.Thread(target=fire, name="tessera-fault", daemon=True).start()


class Cause:
    """One observed failure of a rank: ``kind`` is ``"signal"``, ``"heartbeat"`` or ``"exit"`` (a non-zero
    status, with or without a failure record); ``time`` is the wall-clock time it happened (s since epoch)."""

    PRIORITY = {"signal": 0, "heartbeat": 0, "exit": 1}

    def __init__(self, rank: int, kind: str, time_s: float, *, code: int | None = None, silent_s: float = 0.0):
        self.rank, self.kind, self.time, self.code, self.silent_s = rank, kind, time_s, code, silent_s

    def how(self) -> str:
        if self.kind == "signal":
            try:
                name = signal.Signals(-self.code).name  # type: ignore[operator]
            except (ValueError, TypeError):
                name = "?"
            return f"was killed by signal {-self.code} ({name})"  # type: ignore[operator]
        if self.kind == "heartbeat":
            return f"sent no heartbeat for {self.silent_s:.1f} s (hung or stopped)"
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
    """One sentence: which rank, how, and that the others were stopped."""
    others = n - 1
    return (f"rank {cause.rank} {cause.how()}; the other {others} rank{'s' if others != 1 else ''} were stopped "
            f"because a peer failed")
