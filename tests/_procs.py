"""Test helper: run ``target(rank, port, queue)`` in ``n`` spawned processes (a local gloo group on a free port,
:func:`tessera_lab.runner.launch.spawn._free_port`) and collect one queue item per process."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable


def run_ranks(target: Callable, n: int, timeout_s: float = 120) -> list[Any]:
    from tessera_lab.runner.launch.spawn import _free_port

    port = _free_port()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, port, q)) for r in range(n)]
    for p in procs:
        p.start()
    try:
        return [q.get(timeout=timeout_s) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
