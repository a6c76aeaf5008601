"""The local spawner: start ``pp * ep * dp`` worker processes, watch them, collect rank 0's result.

Never imports torch. A failing worker makes the others exit within :attr:`WorldSpec.grace_s` (then they are
killed); :class:`RunnerError` names the rank that failed first and carries every exit status and log.
Each worker writes a heartbeat (:mod:`tessera_lab.runner.launch.supervise`): a rank killed by a signal is named from
its exit status, a hung (stopped) rank from its missing heartbeat, and both win over the failure records its
peers write afterwards. ``RunnerError.peer_failed`` is True when a rank failed and the others were stopped
(``tessera-lab run`` exits with :data:`~tessera_lab.runner.launch.supervise.EXIT_PEER_FAILED`, 3).
"""

from __future__ import annotations

import json
import math
import os
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

from .supervise import STARTUP_S, Cause, describe, heartbeat_timeout, root_cause
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


def _silent_for(hb: Path, since_start: float) -> float | None:
    """Seconds since the last heartbeat in ``hb`` (None while a worker may still be starting up)."""
    try:
        return max(0.0, time.time() - hb.stat().st_mtime)
    except OSError:
        return since_start if since_start > STARTUP_S else None


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


def spawn(world: WorldSpec, jobs: Sequence[RunSpec], *, out_dir: str | os.PathLike | None = None,
          timeout_s: float = 600.0, python: str | None = None, env: dict | None = None) -> RunResult:
    """Start ``world.world_size`` local worker processes, run ``jobs`` in order, return rank 0's results.

    Args:
        world: the grid and timeouts.
        jobs: the jobs (validated here, before any process starts).
        out_dir: where logs (``rank{r}.log``), the spec, the result and gradient files go (default: a new
            temporary folder, kept so the logs can be read).
        timeout_s: wall-clock limit for the whole launch; on expiry every worker is killed.
        python: interpreter for the workers (default: this one).
        env: extra environment variables for the workers.

    Raises:
        ConfigError / ScheduleError: a bad spec (nothing started).
        RunnerError: a worker failed or the launch timed out (every worker has exited when it is raised).
    """
    jobs = list(jobs)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (math.isfinite(timeout_s)
                                                                                       and timeout_s > 0):
        raise ConfigError(f"run --timeout = {timeout_s!r} is out of range; allowed: a finite number of seconds > 0")
    if world.backend == "nccl" and not _has_gpu():
        raise ConfigError("run --backend nccl needs an NVIDIA GPU and none was found (no /dev/nvidia*); "
                          "use --backend gloo or auto")
    hb_timeout = heartbeat_timeout()
    if not jobs:
        raise ConfigError("run: no jobs given")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"run: job names must be unique, got {names}")
    for j in jobs:
        j.validate(world)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="tessera-run-"))
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    atomic_write_text(spec_path, json.dumps({"world": asdict(world), "jobs": [j.as_dict() for j in jobs]}, indent=1))
    result_path = out / "result.json"
    for old in [result_path, *out.glob("failure-*.json"), *out.glob("fault-*.json"), *out.glob("hb-*")]:
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
        while True:
            now = time.monotonic()
            for r, p in enumerate(procs):
                if codes[r] is None and p.poll() is not None:
                    codes[r] = p.returncode
                    if p.returncode != 0:
                        kind = "signal" if p.returncode < 0 else "exit"
                        causes.append(Cause(r, kind, time.time(), code=p.returncode))
                elif codes[r] is None and not any(c.rank == r for c in causes):
                    silent = _silent_for(out / f"hb-{r}", now - start)
                    if silent is not None and silent > hb_timeout:
                        causes.append(Cause(r, "heartbeat", time.time() - silent, silent_s=silent))
            if causes and not fail_time:
                fail_time, detected_at = now, time.time()
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
        raise RunnerError(f"run timed out after {timeout_s:.0f} s; all {n} workers were killed (exit codes {codes}); "
                          f"logs in {out}", codes, logs, pids)
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
        err = RunnerError(
            f"{describe(bad, n)}; exit codes {codes}; logs in {out}; log tail of rank {bad.rank}:\n"
            + _tail(logs[bad.rank]), codes, logs, pids)
        err.peer_failed, err.failed_rank, err.cause, err.detected_at = True, bad.rank, bad.how(), detected_at
        raise err
    data = json.loads(result_path.read_text())
    return RunResult(data["jobs"], data["backend"], data["world"], str(out), logs, pids)


def _kill_all(procs: list, codes: dict) -> None:
    """Terminate (then kill) every still-running worker and reap it; record signals as negative codes."""
    live = [(r, p) for r, p in enumerate(procs) if p.poll() is None]
    for _, p in live:
        try:  # a stopped (hung) process cannot act on SIGTERM: kill it at once
            p.send_signal(signal.SIGKILL if _state(p.pid) == "T" else signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + 3.0
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


