"""The local spawner: start ``pp * ep * dp`` worker processes, watch them, collect rank 0's result.

Never imports torch. Everything a launch depends on is checked before the first process starts: the jobs, the
timeout, ``$TESSERA_LAB_FAULT`` and ``$TESSERA_LAB_HEARTBEAT_TIMEOUT``, and with ``backend="nccl"`` that there are
at least as many visible GPUs as local ranks (:func:`gpu_count`, never two ranks on one device).
A failing worker makes the others exit within :attr:`WorldSpec.grace_s` (then they are killed);
:class:`RunnerError` names the rank that failed first and carries every exit status and log.
Each worker reports readiness and writes a heartbeat (:mod:`tessera_lab.runner.launch.supervise`): a rank killed by a
signal is named from its exit status, a hung (stopped) rank from its missing heartbeat (with its Python stack),
and both win over the failure records its peers write afterwards. ``RunnerError.peer_failed`` is True when a rank
failed and the others were shut down (``tessera-lab run`` exits with
:data:`~tessera_lab.runner.launch.supervise.EXIT_PEER_FAILED`, 3).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from tessera_lab.errors import ConfigError, TesseraError

from tessera_lab.io import atomic_write_text, read_json

from .supervise import (HEARTBEAT_FD_ENV, HEARTBEAT_S, STARTUP_FACTOR, Cause, busy_allowance, busy_hint, describe,
                        heartbeat_timeout, parse_fault, root_cause, startup_deadline, startup_floor)
from .results import RunResult
from ..runtime.specs import RunnerError, RunSpec, WorldSpec

__all__ = ["spawn"]




def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _has_gpu() -> bool:
    """True when an NVIDIA device node exists (cheap; the spawner never imports torch)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def gpu_count() -> int:
    """Visible NVIDIA GPUs without importing torch: the ``/dev/nvidiaN`` device nodes, limited by
    ``$CUDA_VISIBLE_DEVICES`` when it is set (its comma-separated entries up to the first invalid one, as CUDA
    reads it)."""
    n = sum(1 for d in Path("/dev").glob("nvidia*") if re.fullmatch(r"nvidia\d+", d.name))
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return n
    k = 0
    for item in vis.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        k += 1
    return min(n, k)


def _cpu_ticks(pid: int) -> int:
    """User + system CPU clock ticks of ``pid`` (from /proc; -1 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().split(")")[-1].split()
        return int(f[11]) + int(f[12])
    except (OSError, IndexError, ValueError):
        return -1


def _dump_stack(pid: int, path: Path, stopped: bool) -> str:
    """Ask a hung worker for its Python stack (SIGUSR1, :func:`~tessera_lab.runner.launch.supervise.install_stack_dump`;
    a stopped one is continued so the handler runs), kill it, and return the dump (waits at most 1 s)."""
    try:
        os.kill(pid, signal.SIGUSR1)
        if stopped:
            os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return ""
    end = time.monotonic() + 1.0
    text, last = "", -1
    while time.monotonic() < end:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            text = ""
        if text and len(text) == last:
            break
        last = len(text) if text else -1
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return _quote_stack(text)


#: lines of a hung rank's stack quoted in the error (the whole dump stays in ``stack-<rank>.txt``)
STACK_QUOTE_LINES = 40


def _quote_stack(text: str) -> str:
    """The first :data:`STACK_QUOTE_LINES` lines of a faulthandler dump, main thread first (faulthandler lists the
    newest thread first); where that cuts the main thread's frames, its frames in this project's code
    (``tessera_lab/``) that were cut are quoted after the count, so the error shows where the rank was in the
    job even when its innermost frames are deep in a library (an import, torch)."""
    blocks = [b.strip() for b in text.strip().split("\n\n") if b.strip()]
    lines = "\n\n".join(reversed(blocks)).splitlines()
    if len(lines) <= STACK_QUOTE_LINES:
        return "\n".join(lines)
    main = blocks[-1].splitlines() if blocks else []
    ours = [ln for ln in main[STACK_QUOTE_LINES:] if "tessera_lab" in ln]
    more = f"... ({len(lines) - STACK_QUOTE_LINES} more lines"
    more += "; the main thread's frames in tessera_lab among them:)" if ours else ")"
    return "\n".join(lines[:STACK_QUOTE_LINES] + [more] + ours)


def _state(pid: int) -> str:
    """The process state letter from /proc (``"T"``: stopped; ``"?"``: unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0]
    except (OSError, IndexError):
        return "?"


def _tail(path: str, n: int = 25) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def check_launch(world: WorldSpec, jobs: Sequence[RunSpec], *, timeout_s: float = 600.0,
                 env: dict | None = None) -> tuple[float, float]:
    """Every check a launch makes before a process starts; returns the heartbeat timeout and the start-up deadline
    floor (seconds).

    Raises:
        ConfigError: bad timeout, no/duplicate jobs, a bad job, a malformed ``$TESSERA_LAB_FAULT`` (or one naming
            a rank outside the world), a bad ``$TESSERA_LAB_HEARTBEAT_TIMEOUT`` or ``$TESSERA_LAB_STARTUP_FLOOR``, or
            NCCL with fewer GPUs than ranks.
    """
    jobs = list(jobs)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (math.isfinite(timeout_s)
                                                                                       and timeout_s > 0):
        raise ConfigError(f"run --timeout = {timeout_s!r} is out of range; allowed: a finite number of seconds > 0")
    merged = dict(os.environ)
    merged.update(env or {})
    fault = parse_fault(merged.get("TESSERA_LAB_FAULT"))
    if fault is not None and fault[0] >= world.world_size:
        raise ConfigError(f"TESSERA_LAB_FAULT rank = {fault[0]} is out of range; allowed: 0..{world.world_size - 1} "
                          f"(pp x ep x dp = {world.world_size} ranks)")
    if world.backend == "nccl":
        gpus = gpu_count()
        if gpus == 0:
            raise ConfigError("run --backend nccl needs an NVIDIA GPU and none was found (no /dev/nvidia*); "
                              "use --backend gloo or auto")
        if world.world_size > gpus:
            raise ConfigError(f"run --backend nccl: pp x ep x dp = {world.world_size} ranks is out of range for "
                              f"{gpus} visible GPU{'s' if gpus != 1 else ''}; allowed: <= {gpus} (one rank per GPU)")
    hb_timeout = _with_env(merged, "TESSERA_LAB_HEARTBEAT_TIMEOUT", heartbeat_timeout)
    floor = _with_env(merged, "TESSERA_LAB_STARTUP_FLOOR", startup_floor)
    if not jobs:
        raise ConfigError("run: no jobs given")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"run: job names must be unique, got {names}")
    for j in jobs:
        j.validate(world)
    return hb_timeout, floor


def _with_env(merged: dict, name: str, read) -> float:
    """``read()`` with ``os.environ[name]`` set as in ``merged`` (the launch's environment), restored after."""
    old, new = os.environ.get(name), merged.get(name)
    try:
        if new is not None:
            os.environ[name] = new
        return read()
    finally:
        if new is not None:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


def spawn(world: WorldSpec, jobs: Sequence[RunSpec], *, out_dir: str | os.PathLike | None = None,
          timeout_s: float = 600.0, python: str | None = None, env: dict | None = None,
          keep: bool = True) -> RunResult:
    """Start ``world.world_size`` local worker processes, run ``jobs`` in order, return rank 0's results.

    Args:
        world: the grid and timeouts.
        jobs: the jobs (validated here, before any process starts).
        out_dir: where logs (``rank{r}.log``), the spec, the result and gradient files go (default: a new
            temporary folder ``tessera-run-*``).
        keep: keep the temporary folder after a successful launch (False: removed, and the result's ``out_dir``
            and ``logs`` are cleared). A given ``out_dir`` and the folder of a failed launch are always kept
            (the error names it).
        timeout_s: wall-clock limit for the whole launch; on expiry every worker is killed.
        python: interpreter for the workers (default: this one).
        env: extra environment variables for the workers.

    Raises:
        ConfigError / ScheduleError: a bad spec (nothing started).
        RunnerError: a worker failed or the launch timed out (every worker has exited when it is raised).
    """
    jobs = list(jobs)
    hb_timeout, floor = check_launch(world, jobs, timeout_s=timeout_s, env=env)
    temporary = out_dir is None
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="tessera-run-"))
    spec_path, result_path = _prepare_out(out, world, jobs)
    port = _free_port()
    n = world.world_size
    base_env = dict(os.environ)
    base_env.update(env or {})
    base_env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n),
                     "LOCAL_WORLD_SIZE": str(n), "TESSERA_PARENT_PID": str(os.getpid()),
                     "OMP_NUM_THREADS": base_env.get("OMP_NUM_THREADS", "1")})
    procs: list[subprocess.Popen] = []
    logs: dict[int, str] = {}
    handles = []
    watch = _Watch(procs, out, hb_timeout, floor, timeout_s)
    try:
        for r in range(n):
            e = dict(base_env, RANK=str(r), LOCAL_RANK=str(r), GROUP_RANK="0")
            log = out / f"rank{r}.log"
            logs[r] = str(log)
            fh = open(log, "w")
            handles.append(fh)
            beat_r, beat_w = os.pipe()  # the rank's heartbeat: it writes, the watch reads (never a disk)
            os.set_blocking(beat_r, False)
            watch.beats[r] = beat_r
            e[HEARTBEAT_FD_ENV] = str(beat_w)
            try:
                procs.append(subprocess.Popen(
                    [python or sys.executable, "-m", "tessera_lab.runner", "--worker", "--spec", str(spec_path),
                     "--out", str(out)],
                    stdout=fh, stderr=subprocess.STDOUT, env=e, start_new_session=True, pass_fds=(beat_w,)))
            finally:
                os.close(beat_w)
            watch.spawned[r] = time.time()
        timed_out = watch.run(world.grace_s)
    finally:
        _kill_all(procs, watch.codes)
        for fh in handles:
            fh.close()
        for fd in watch.beats.values():
            os.close(fd)
    codes, pids = watch.codes, {r: p.pid for r, p in enumerate(procs)}
    if timed_out and not watch.causes:
        raise RunnerError(f"run timed out after {timeout_s:.0f} s (--timeout); all {n} workers were killed (exit "
                          f"codes {codes}); logs kept in {out}", codes, logs, pids)
    if watch.causes or any(c != 0 for c in codes.values()):
        raise _failure(watch, out, logs, pids, n)
    data = json.loads(result_path.read_text())
    if temporary and not keep:
        shutil.rmtree(out, ignore_errors=True)
        return RunResult(data["jobs"], data["backend"], data["world"], None, {}, pids)
    return RunResult(data["jobs"], data["backend"], data["world"], str(out), logs, pids)


def _prepare_out(out: Path, world: WorldSpec, jobs: list[RunSpec]) -> tuple[Path, Path]:
    """Create the run folder, write the spec (atomically) and remove what an earlier launch left there (result,
    failure and fault records, heartbeats, ready and import marks, stacks); returns the spec and result paths."""
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    atomic_write_text(spec_path, json.dumps({"world": asdict(world), "jobs": [j.as_dict() for j in jobs]}, indent=1))
    result_path = out / "result.json"
    for old in [result_path, *out.glob("failure-*.json"), *out.glob("fault-*.json"), *out.glob("hb-*"),
                *out.glob("ready-*"), *out.glob("imported-*"), *out.glob("stack-*.txt")]:
        old.unlink(missing_ok=True)
    return spec_path, result_path


def _failure(watch: "_Watch", out: Path, logs: dict[int, str], pids: dict[int, int], n: int) -> RunnerError:
    """The error of a failed launch: the root cause among the watcher's causes and the ranks' failure records,
    the exit codes, where the logs are, a busy-machine hint and the hung rank's Python stack for a heartbeat or
    start timeout, and the failed rank's log tail."""
    codes, causes, stack = watch.codes, watch.causes, watch.stack
    if not causes:  # pragma: no cover - every non-zero exit before the kill phase is a cause
        causes = [Cause(r, "exit", time.time(), code=c) for r, c in codes.items() if c != 0]
    recorded = {}
    for r in codes:
        try:
            recorded[r] = float(read_json(out / f"failure-{r}.json", "failure record")["time"])
        except (TesseraError, OSError, ValueError, KeyError, TypeError):
            pass
    bad = root_cause(causes, recorded)
    extra = ""
    if bad.kind in ("heartbeat", "start"):
        hint = busy_hint() if bad.state not in ("T", "t") else ""  # a stopped rank is not slow: no such hint
        extra = (f"; {hint}" if hint else "") + (f"\nPython stack of rank {bad.rank} when it was declared hung:\n"
                                                  f"{stack}" if stack else "")
    err = RunnerError(
        f"{describe(bad, n)}; exit codes {codes}; logs kept in {out}{extra}\nlog tail of rank {bad.rank}:\n"
        + _tail(logs[bad.rank]), codes, logs, pids)
    err.peer_failed, err.failed_rank, err.cause, err.detected_at = True, bad.rank, bad.how(), watch.detected_at
    err.ended_at = time.time()
    return err


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


#: share of a core a rank past its start-up deadline must use to count as still working (given up to
#: busy_allowance of its deadline)
BUSY_SHARE = 0.02


class _Watch:
    """The spawner's watch over its workers: exit statuses, heartbeats of ready ranks, start-up deadlines.

    ``spawned``: rank -> wall-clock time of its spawn (filled by the caller). After :meth:`run`: ``codes``
    (rank -> exit status or None), ``causes`` (:class:`Cause`), ``stack`` (the hung rank's Python stack),
    ``detected_at`` (wall-clock time of the first cause).
    """

    def __init__(self, procs: list, out: Path, hb_timeout: float, floor: float, timeout_s: float):
        self.procs, self.out, self.hb_timeout, self.floor, self.timeout_s = procs, out, hb_timeout, floor, timeout_s
        self.spawned: dict[int, float] = {}
        self.codes: dict[int, int | None] = {}
        self.causes: list[Cause] = []
        self.stack, self.detected_at = "", 0.0
        self.cpu: dict[int, int] = {}  # rank -> CPU ticks when its heartbeat was last fresh
        self.beats: dict[int, int] = {}  # rank -> read end of its heartbeat pipe (non-blocking)
        self.last_beat: dict[int, float] = {}  # rank -> wall-clock time a beat was last read
        self.on_time: dict[int, tuple[int, float]] = {}  # rank -> (CPU ticks, time) when last within its deadline

    def run(self, grace_s: float) -> bool:
        """Poll every 50 ms until every worker exited, a rank failed (+ ``grace_s``; at once for a hung rank), or
        the launch timeout; True on timeout."""
        n = len(self.spawned)
        self.codes.update({r: None for r in range(n)})
        deadline = time.monotonic() + self.timeout_s
        fail_time = 0.0
        while True:
            now = time.monotonic()
            self._poll(n)
            if self.causes and not fail_time:
                fail_time = now
                self.detected_at = self.detected_at or time.time()
            if all(c is not None for c in self.codes.values()):
                return False
            if now > deadline:
                return True
            if self.causes and (now - fail_time > grace_s or any(c.kind in ("heartbeat", "start")
                                                                for c in self.causes)):
                return False  # a hung rank never exits by itself: stop everyone now
            time.sleep(0.05)

    def _poll(self, n: int) -> None:
        imported = {r: _mtime(self.out / f"imported-{r}") for r in range(n)}
        ready = {r: _mtime(self.out / f"ready-{r}") for r in range(n)}
        for r, p in enumerate(self.procs):
            if self.codes[r] is None and p.poll() is not None:
                self.codes[r] = p.returncode
                if p.returncode != 0:
                    self.causes.append(Cause(r, "signal" if p.returncode < 0 else "exit", time.time(),
                                             code=p.returncode))
            elif self.codes[r] is None and not any(c.rank == r for c in self.causes):
                cause = (self._heartbeat(r, p) if ready[r] is not None else self._startup(r, p, imported, ready))
                if cause is not None:
                    self.causes.append(cause)
                    self.detected_at = time.time()
                    self.stack = _dump_stack(p.pid, self.out / f"stack-{r}.txt", cause.state in ("T", "t"))
                    return

    def _silent(self, r: int) -> float:
        """Seconds since rank ``r`` last beat (its pipe drained here; the file beat of a worker without a pipe), or
        since it reported ready or was spawned."""
        fd = self.beats.get(r)
        if fd is not None:
            try:
                while os.read(fd, 4096):  # every unread beat; b"" once the rank has exited
                    self.last_beat[r] = time.time()
            except BlockingIOError:
                pass
        last = (self.last_beat.get(r) or _mtime(self.out / f"hb-{r}") or _mtime(self.out / f"ready-{r}")
                or self.spawned[r])
        return max(0.0, time.time() - last)

    def _heartbeat(self, r: int, p) -> Cause | None:
        """A ready rank: hung when silent past the heartbeat timeout and stopped or idle; one still using CPU gets
        :func:`busy_allowance` (BUSY_FACTOR x the timeout x the machine's oversubscription)."""
        silent = self._silent(r)
        if silent <= 2 * HEARTBEAT_S or r not in self.cpu:
            self.cpu[r] = _cpu_ticks(p.pid)
        if silent <= self.hb_timeout:
            return None
        state = _state(p.pid)
        working = state not in ("T", "t") and _cpu_ticks(p.pid) > self.cpu[r] >= 0
        if working and silent <= busy_allowance(self.hb_timeout):
            return None  # silent but using CPU (starved, or a long call holding the GIL)
        return Cause(r, "heartbeat", time.time() - silent, silent_s=silent, state=state)

    def _startup(self, r: int, p, imported: dict, ready: dict) -> Cause | None:
        """A rank not ready yet: named when stopped and silent past the heartbeat timeout, or past its start-up
        deadline (a rank that has imported torch is judged only once every rank has)."""
        now, state = time.time(), _state(p.pid)
        silent = self._silent(r)
        if imported[r] is None:
            what = "that it had imported torch"
            took = [imported[q] - self.spawned[q] for q in imported if imported[q] is not None]
            elapsed = now - self.spawned[r]
        elif all(t is not None for t in imported.values()):
            what = "that it had joined the process group"
            last = max(imported.values())
            took = [max(0.0, ready[q] - last) for q in ready if ready[q] is not None]
            elapsed = now - last
        else:
            return None  # waiting for a peer that has not imported torch: that peer is the one to name
        limit = startup_deadline(took, self.floor)
        if limit is None and imported[r] is not None:
            limit = self.floor  # every rank imported torch and none has joined yet: the floor applies
        how = self._deadline_text(limit, took, what)
        if state in ("T", "t") and silent > self.hb_timeout:
            return Cause(r, "start", now - silent, silent_s=silent, state=state,
                         detail=f"was stopped (process state {state}) before it reported {what}: no heartbeat for "
                                f"{silent:.1f} s; {how}")
        if limit is None or elapsed <= limit:
            self.on_time[r] = (_cpu_ticks(p.pid), now)
            return None
        if self._working(r, p.pid, now) and elapsed <= busy_allowance(limit):
            return None  # still working (a slow import on a busy machine)
        return Cause(r, "start", now, state=state,
                     detail=f"did not report {what} within {elapsed:.1f} s (process state {state}, last heartbeat "
                            f"{silent:.1f} s ago); {how}")

    def _working(self, r: int, pid: int, now: float) -> bool:
        """Whether the rank used at least :data:`BUSY_SHARE` of a core since it was last on time (the heartbeat
        thread alone uses far less; a rank importing on a busy machine more)."""
        ticks, then = self.on_time.get(r, (-1, now))
        used = (_cpu_ticks(pid) - ticks) / (os.sysconf("SC_CLK_TCK") or 100)
        return ticks >= 0 and now > then and used / (now - then) >= BUSY_SHARE

    def _deadline_text(self, limit: float | None, took: list[float], what: str) -> str:
        if limit is None:
            return (f"start-up deadline not set yet (no rank had reported {what}; --timeout "
                    f"{self.timeout_s:.0f} s applies)")
        if not took:
            return f"start-up deadline {limit:.1f} s (the floor; no rank had reported {what})"
        return (f"start-up deadline {limit:.1f} s = max(floor {self.floor:.0f} s, {STARTUP_FACTOR:g} x {max(took):.1f} "
                f"s, the slowest of the {len(took)} rank{'s' if len(took) != 1 else ''} that did)")


def _kill_all(procs: list, codes: dict) -> None:
    """Kill every still-running worker (SIGKILL: a worker keeps nothing that needs a clean exit; its outputs are
    written atomically) and reap it; record signals as negative codes."""
    live = [(r, p) for r, p in enumerate(procs) if p.poll() is None]
    for _, p in live:
        try:
            p.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass
    end = time.monotonic() + 2.0
    for r, p in live:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            p.wait()
    for r, p in enumerate(procs):
        if p.returncode is None:
            p.wait()
        codes[r] = p.returncode


