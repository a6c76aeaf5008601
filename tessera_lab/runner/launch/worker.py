"""The worker side of a launch: join the process group, run the jobs, report (rank 0), exit at once on failure."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from tessera_lab.errors import ConfigError, TesseraError

from .supervise import (arm_fault, arm_start_fault, install_stack_dump, mark_imported, mark_ready, start_checkpoint,
                        start_heartbeat)
from .results import RunResult, compare_reference, summarize_job
from ..runtime.specs import RunSpec, WorldSpec

__all__ = ["run_worker", "worker_main"]




def _watch_parent() -> None:
    """Exit this worker if its parent (the spawner or torchrun's agent) goes away."""
    parent = int(os.environ.get("TESSERA_PARENT_PID", os.getppid()))

    def loop() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(5)

    threading.Thread(target=loop, name="tessera-parent-watch", daemon=True).start()


def check_rendezvous_env(rank: int, world_size: int) -> None:
    """Refuse, before any process group, what ``init_process_group``'s ``env://`` rendezvous would fail on with a
    traceback or wait on: ``RANK`` outside ``[0, WORLD_SIZE)``, ``MASTER_ADDR`` unset or empty, ``MASTER_PORT`` not
    an integer in 1..65535, ``LOCAL_RANK`` (when set) not an integer >= 0. torchrun and the spawner set all five.

    Raises:
        ConfigError: one line naming the variable, its value and the allowed range.
    """
    how = "(set by torchrun or the spawner; run `tessera-lab run` to launch locally)"
    if not 0 <= rank < world_size:
        raise ConfigError(f"environment variable RANK = {rank} is outside 0..WORLD_SIZE-1 = 0..{world_size - 1} {how}")
    if not os.environ.get("MASTER_ADDR"):
        raise ConfigError(f"environment variable MASTER_ADDR = {os.environ.get('MASTER_ADDR')!r} is unset or empty; "
                          f"allowed: the rendezvous host {how}")
    port = os.environ.get("MASTER_PORT")
    if not (port or "").strip().isdigit() or not 1 <= int(port) <= 65535:  # type: ignore[arg-type]
        raise ConfigError(f"environment variable MASTER_PORT = {port!r} is not a port; allowed: an integer 1..65535 "
                          f"{how}")
    local = os.environ.get("LOCAL_RANK")
    if local is not None and not local.strip().isdigit():
        raise ConfigError(f"environment variable LOCAL_RANK = {local!r} is not an integer >= 0 {how}")


def _env_int(name: str) -> int:
    v = os.environ.get(name)
    try:
        return int(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"environment variable {name} = {v!r} is not an integer (set by torchrun or the spawner)") from None


def run_worker(world: WorldSpec, jobs: Sequence[RunSpec], out_dir: str | None) -> RunResult | None:
    """Body of one worker process: checks the world size, joins the process group, runs the jobs.

    Returns the :class:`RunResult` on rank 0 (None elsewhere). Raises :class:`ConfigError` before any
    collective if ``WORLD_SIZE != pp * ep * dp``.
    """
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    world.check_world_size(world_size)  # before any process group exists
    check_rendezvous_env(rank, world_size)
    for j in jobs:
        j.validate(world)
    import datetime

    import torch
    import torch.distributed as dist

    from ..runtime.topology import build_topology
    from ..runtime.train import run_jobs

    start_checkpoint()  # an armed start fault fires here at the latest (before the rank reports anything)
    mark_imported(out_dir, rank)  # the spawner's start-up deadline: torch imported, joining now
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and world.backend != "gloo"
    if world.backend == "nccl" and not cuda:
        raise ConfigError("run --backend nccl needs a CUDA GPU and torch sees none; use --backend gloo or auto")
    backend = world.backend if world.backend != "auto" else ("nccl" if cuda else "gloo")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", rank))
        if local >= torch.cuda.device_count():  # never two ranks on one GPU
            raise ConfigError(f"local rank {local} has no GPU of its own: {torch.cuda.device_count()} visible; "
                              "allowed: one rank per GPU (fewer processes per node, or --backend gloo)")
        torch.cuda.set_device(local)
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=world.timeout_s), **kwargs)
    topo = build_topology(world, rank, device)
    mark_ready(out_dir, rank)  # heartbeat deadlines apply from here on
    arm_fault(rank, out_dir)  # $TESSERA_LAB_FAULT (tests and benchmarks/runner_faults.py)
    results = []
    for j, raw in zip(jobs, run_jobs(world, topo, list(jobs), out_dir, interleave=world.interleave)):
        if rank == 0:
            res = summarize_job(raw, j, world, device.type)
            if j.check_reference:
                res["reference"] = compare_reference(res, j, world, out_dir, device.type)
            results.append(res)
    _add_peak_memory(results, jobs, world, device)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return RunResult(results, backend, asdict(world), out_dir)


def _add_peak_memory(results: list, jobs: Sequence[RunSpec], world: WorldSpec, device) -> None:
    """Gather every rank's peak memory (a collective: every rank calls it) and, on rank 0, give each job's result
    ``peak_memory`` (:mod:`.memory`: observed per rank beside the planner's prediction)."""
    import torch.distributed as dist

    from .memory import observed_peak, peak_memory_record, predicted_peak_bytes

    gathered: list = [None] * world.world_size
    dist.all_gather_object(gathered, observed_peak(device))
    for res, j in zip(results, jobs):
        res["peak_memory"] = peak_memory_record(gathered, predicted_peak_bytes(j, world, res["boundaries"],
                                                                               res["schedule"]))


def _record_failure(out_dir: str | None) -> None:
    """Write ``{out_dir}/failure-<rank>.json`` with the wall-clock time of this rank's failure, so the launcher
    can name the rank that failed first (the root cause) rather than the first one it happened to poll."""
    if not out_dir:
        return
    try:
        rank = int(os.environ.get("RANK", "-1"))
        from tessera_lab.io import atomic_write_text

        atomic_write_text(Path(out_dir) / f"failure-{rank}.json", json.dumps({"rank": rank, "time": time.time()}))
    except (OSError, TesseraError):  # pragma: no cover - best effort while exiting
        pass


def worker_main(spec_path: str, out_dir: str | None) -> int:
    """Entry of a spawned worker: read the spec, run, rank 0 writes ``{out_dir}/result.json``."""
    _watch_parent()
    try:
        rank = int(os.environ.get("RANK", "-1"))
        install_stack_dump(out_dir, rank)
        start_heartbeat(out_dir, rank)
        arm_start_fault(rank, out_dir)
    except ValueError:
        pass
    try:
        data = json.loads(Path(spec_path).read_text())
        world = WorldSpec(**data["world"])
        jobs = [RunSpec.from_dict(j) for j in data["jobs"]]
        res = run_worker(world, jobs, out_dir)
        if res is not None and out_dir:
            from tessera_lab.io import atomic_write_text, dumps

            atomic_write_text(Path(out_dir) / "result.json", dumps(res.to_dict()))
    except TesseraError as exc:
        _record_failure(out_dir)
        print(f"tessera-lab runner: error: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)
    except BaseException:  # noqa: BLE001 - any failure must end this rank at once
        _record_failure(out_dir)
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


