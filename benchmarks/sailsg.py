"""sail-sg's Zero Bubble heuristic (``initial_solution`` of ``megatron/core/pipeline_parallel/zerobubble/scheduler/
zb.py`` in github.com/sail-sg/zero-bubble-pipeline-parallelism, pinned at commit :data:`PINNED`), loaded from a local
git checkout of that repository, for ``bench_schedules.py``'s comparison: its search time and its order simulated by
this package's simulator (so both makespans come from one simulator).

The heuristic runs its greedy ``manual_order`` under 2 x 2 x 2 switches (bubble before the first B, B priority,
no-bubble greedy W filling) and keeps the shortest by its own completion times. Its ``B`` is this package's ``I``.
Memory: ``mem_f = 1``, ``mem_b = 0``, ``mem_w = -1`` micro-batch of activations per stage, ``max_mem = K``.
"""

from __future__ import annotations

import subprocess
import sys
import time
import types

#: the sail-sg commit whose heuristic is compared (git log -1 of the fetched snapshot, 2025-05-07)
PINNED = "39f2c186a27580b7051eb51e0f651e1efd0a8170"
_PKG = "megatron.core.pipeline_parallel.zerobubble.scheduler"


def load(repo: str, rev: str = PINNED):
    """The ``zb`` module of sail-sg's scheduler at ``rev`` from the git checkout ``repo`` (needs torch and pulp)."""
    def source(rel: str) -> str:
        return subprocess.run(["git", "-C", repo, "show", f"{rev}:{rel}"], capture_output=True, text=True,
                              check=True).stdout

    parts = _PKG.split(".")
    for k in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:k]), types.ModuleType(".".join(parts[:k])))
    mods = {}
    for name in ("graph", "zb"):
        mod = types.ModuleType(f"{_PKG}.{name}")
        sys.modules[mod.__name__] = mod
        rel = f"megatron/core/pipeline_parallel/zerobubble/scheduler/{name}.py"
        exec(compile(source(rel), rel, "exec"), mod.__dict__)
        mods[name] = mod
    return mods["graph"], mods["zb"]


def run(graph_mod, zb_mod, p: int, m: int, f, i, w, p2p: float, K: float):
    """``(CPU seconds of build_graph + initial_solution, per-rank action lists)`` of the heuristic."""
    from tessera_lab.pipeline.actions import Action, ActionType

    cfg = graph_mod.GraphConfig(mem_f=[1.0] * p, mem_b=[0.0] * p, mem_w=[-1.0] * p, max_mem=[float(K)] * p,
                                cost_f=[float(x) for x in f], cost_b=[float(x) for x in i],
                                cost_w=[float(x) for x in w], cost_comm=float(p2p), n_stages=p, n_micro=m)
    t0 = time.process_time()
    g = zb_mod.Graph.build_graph(p, m, cfg)
    _, _, done = zb_mod.initial_solution(g, print_result=False)
    dt = time.process_time() - t0
    kinds = (ActionType.F, ActionType.I, ActionType.W)
    lists = {}
    for s in range(p):
        nodes = [(done[g.get_id(k, s, mb)], k, mb) for k in range(3) for mb in range(m)]
        nodes.sort()
        lists[s] = [Action(s, kinds[k], mb) for _, k, mb in nodes]
    return dt, lists
