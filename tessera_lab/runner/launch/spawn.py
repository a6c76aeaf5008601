"""The local spawner: start ``pp * ep * dp`` worker processes, watch them, collect rank 0's result.

Never imports torch. Everything a launch depends on is checked before the first process starts: the jobs, the
timeout, ``$TESSERA_LAB_FAULT`` and ``$TESSERA_LAB_HEARTBEAT_TIMEOUT``, and with ``backend="nccl"`` that there are
at least as many visible GPUs as local ranks (:func:`gpu_count`, never two ranks on one device).
A failing worker makes the others exit within :attr:`WorldSpec.grace_s` (then they are killed);
:class:`RunnerError` names the rank that failed first and carries every exit status and log.
Each worker reports readiness and writes a heartbeat (:mod:`tessera_lab.runner.launch.supervise`): a rank killed by a
signal is named from its exit status, a hung (stopped) rank from its missing heartbeat (with its Python stack),
and both win over the failure records its peers write afterwards. ``RunnerError.peer_failed`` is True when a rank
failed and the others were stopped (``tessera-lab run`` exits with
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

from .supervise import BUSY_FACTOR, HEARTBEAT_S, Cause, busy_hint, describe, heartbeat_timeout, parse_fault, root_cause
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


def _silent_for(hb: Path, ready: Path) -> float | None:
    """Seconds since the last heartbeat in ``hb``; None before the worker reported ready (no deadline yet)."""
    if not ready.exists():
        return None
    try:
        return max(0.0, time.time() - hb.stat().st_mtime)
    except OSError:
        try:
            return max(0.0, time.time() - ready.stat().st_mtime)
        except OSError:  # pragma: no cover
            return None


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
    # faulthandler lists the newest thread first: the main thread (the one that matters) goes first here
    blocks = [b.strip() for b in text.strip().split("\n\n") if b.strip()]
    lines = "\n\n".join(reversed(blocks)).splitlines()
    return "\n".join(lines[:40] + ([f"... ({len(lines) - 40} more lines)"] if len(lines) > 40 else []))


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
                 env: dict | None = None) -> float:
    """Every check a launch makes before a process starts; returns the heartbeat timeout (seconds).

    Raises:
        ConfigError: bad timeout, no/duplicate jobs, a bad job, a malformed ``$TESSERA_LAB_FAULT`` (or one naming
            a rank outside the world), a bad ``$TESSERA_LAB_HEARTBEAT_TIMEOUT``, or NCCL with fewer GPUs than ranks.
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
    old = os.environ.get("TESSERA_LAB_HEARTBEAT_TIMEOUT")
    hb = merged.get("TESSERA_LAB_HEARTBEAT_TIMEOUT")
    try:
        if hb is not None:
            os.environ["TESSERA_LAB_HEARTBEAT_TIMEOUT"] = hb
        hb_timeout = heartbeat_timeout()
    finally:
        if hb is not None:
            if old is None:
                os.environ.pop("TESSERA_LAB_HEARTBEAT_TIMEOUT", None)
            else:
                os.environ["TESSERA_LAB_HEARTBEAT_TIMEOUT"] = old
    if not jobs:
        raise ConfigError("run: no jobs given")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"run: job names must be unique, got {names}")
    for j in jobs:
        j.validate(world)
    return hb_timeout


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
    hb_timeout = check_launch(world, jobs, timeout_s=timeout_s, env=env)
    temporary = out_dir is None
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="tessera-run-"))
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    atomic_write_text(spec_path, json.dumps({"world": asdict(world), "jobs": [j.as_dict() for j in jobs]}, indent=1))
    result_path = out / "result.json"
    for old in [result_path, *out.glob("failure-*.json"), *out.glob("fault-*.json"), *out.glob("hb-*"),
                *out.glob("ready-*"), *out.glob("stack-*.txt")]:
        old.unlink(missing_ok=True)
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
    codes: dict[int, int | None] = {r: None for r in range(n)}
    try:
        for r in range(n):
            e = dict(base_env, RANK=str(r), LOCAL_RANK=str(r), GROUP_RANK="0")
            log = out / f"rank{r}.log"
            logs[r] = str(log)
            fh = open(log, "w")
            handles.append(fh)
            procs.append(subprocess.Popen(
                [python or sys.executable, "-m", "tessera_lab.runner", "--worker", "--spec", str(spec_path),
                 "--out", str(out)],
                stdout=fh, stderr=subprocess.STDOUT, env=e, start_new_session=True))
        start = time.monotonic()
        deadline = start + timeout_s
        causes: list[Cause] = []
        fail_time, detected_at = 0.0, 0.0
        timed_out = False
        busy_cpu: dict[int, int] = {}  # rank -> CPU ticks when its heartbeat was last fresh
        stack = ""
        while True:
            now = time.monotonic()
            for r, p in enumerate(procs):
                if codes[r] is None and p.poll() is not None:
                    codes[r] = p.returncode
                    if p.returncode != 0:
                        kind = "signal" if p.returncode < 0 else "exit"
                        causes.append(Cause(r, kind, time.time(), code=p.returncode))
                elif codes[r] is None and not any(c.rank == r for c in causes):
                    silent = _silent_for(out / f"hb-{r}", out / f"ready-{r}")
                    if silent is None:
                        continue
                    if silent <= 2 * HEARTBEAT_S or r not in busy_cpu:
                        busy_cpu[r] = _cpu_ticks(p.pid)
                    if silent > hb_timeout:
                        state = _state(p.pid)
                        working = state not in ("T", "t") and _cpu_ticks(p.pid) > busy_cpu[r] >= 0
                        if working and silent <= BUSY_FACTOR * hb_timeout:
                            continue  # silent but using CPU (starved, or a long call holding the GIL)
                        causes.append(Cause(r, "heartbeat", time.time() - silent, silent_s=silent, state=state))
                        detected_at = time.time()
                        stack = _dump_stack(p.pid, out / f"stack-{r}.txt", state in ("T", "t"))
            if causes and not fail_time:
                fail_time = now
                detected_at = detected_at or time.time()
            if all(c is not None for c in codes.values()):
                break
            if now > deadline:
                timed_out = True
                break
            if causes and (now - fail_time > world.grace_s or any(c.kind == "heartbeat" for c in causes)):
                break  # a hung rank never exits by itself: stop everyone now
            time.sleep(0.05)
    finally:
        _kill_all(procs, codes)
        for fh in handles:
            fh.close()
    pids = {r: p.pid for r, p in enumerate(procs)}
    if timed_out and not causes:
        raise RunnerError(f"run timed out after {timeout_s:.0f} s (--timeout); all {n} workers were killed (exit "
                          f"codes {codes}); logs kept in {out}", codes, logs, pids)
    if causes or any(c != 0 for c in codes.values()):
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
        if bad.kind == "heartbeat":
            hint = busy_hint()
            extra = (f"; {hint}" if hint else "") + (f"\nPython stack of rank {bad.rank} when it was declared hung:\n"
                                                      f"{stack}" if stack else "")
        err = RunnerError(
            f"{describe(bad, n)}; exit codes {codes}; logs kept in {out}{extra}\nlog tail of rank {bad.rank}:\n"
            + _tail(logs[bad.rank]), codes, logs, pids)
        err.peer_failed, err.failed_rank, err.cause, err.detected_at = True, bad.rank, bad.how(), detected_at
        err.ended_at = time.time()
        raise err
    data = json.loads(result_path.read_text())
    if temporary and not keep:
        shutil.rmtree(out, ignore_errors=True)
        return RunResult(data["jobs"], data["backend"], data["world"], None, {}, pids)
    return RunResult(data["jobs"], data["backend"], data["world"], str(out), logs, pids)


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


