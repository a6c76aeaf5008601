"""The local spawner: start ``pp * ep * dp`` worker processes, watch them, collect rank 0's result.

Never imports torch. A failing worker makes the others exit within :attr:`WorldSpec.grace_s` (then they are
killed); :class:`RunnerError` names the rank that failed first and carries every exit status and log.
"""

from __future__ import annotations

import json
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

from tessera_lab.errors import ConfigError

from .results import RunResult
from .specs import RunnerError, RunSpec, WorldSpec

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
    spec_path.write_text(json.dumps({"world": asdict(world), "jobs": [j.as_dict() for j in jobs]}, indent=1))
    result_path = out / "result.json"
    for old in [result_path, *out.glob("failure-*.json")]:
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
        deadline = time.monotonic() + timeout_s
        first_fail: int | None = None
        fail_time = 0.0
        timed_out = False
        while True:
            for r, p in enumerate(procs):
                if codes[r] is None and p.poll() is not None:
                    codes[r] = p.returncode
                    if p.returncode != 0 and first_fail is None:
                        first_fail, fail_time = r, time.monotonic()
            if all(c is not None for c in codes.values()):
                break
            now = time.monotonic()
            if now > deadline:
                timed_out = True
                break
            if first_fail is not None and now - fail_time > world.grace_s:
                break
            time.sleep(0.05)
    finally:
        _kill_all(procs, codes)
        for fh in handles:
            fh.close()
    pids = {r: p.pid for r, p in enumerate(procs)}
    if timed_out:
        raise RunnerError(f"run timed out after {timeout_s:.0f} s; all {n} workers were killed (exit codes {codes}); "
                          f"logs in {out}", codes, logs, pids)
    if any(c != 0 for c in codes.values()):
        bad = first_fail if first_fail is not None else next(r for r, c in codes.items() if c != 0)
        recorded = {}
        for r in codes:
            try:
                recorded[r] = json.loads((out / f"failure-{r}.json").read_text())["time"]
            except (OSError, ValueError, KeyError):
                pass
        if recorded:  # the rank that failed first is the root cause; its peers fail after it
            bad = min(recorded, key=recorded.get)
        raise RunnerError(
            f"rank {bad} failed with exit status {codes[bad]}; exit codes {codes}; log tail of rank {bad}:\n"
            + _tail(logs[bad]), codes, logs, pids)
    data = json.loads(result_path.read_text())
    return RunResult(data["jobs"], data["backend"], data["world"], str(out), logs, pids)


def _kill_all(procs: list, codes: dict) -> None:
    """Terminate (then kill) every still-running worker and reap it; record signals as negative codes."""
    live = [(r, p) for r, p in enumerate(procs) if p.poll() is None]
    for _, p in live:
        try:
            p.send_signal(signal.SIGTERM)
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


