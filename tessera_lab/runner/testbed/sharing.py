"""Processor sharing over a simulated pipeline timeline (torch-free): the runner's iteration time on a CPU
whose cores are shared by the job's busy processes and by other tenants.

Model (times in seconds, work in CPU-seconds of one uncontended core):

* every pipeline rank of the schedule stands for ``procs_per_rank`` processes (its EP x DP replicas, which
  run the same actions in lockstep); its actions run in order, each once its inputs have arrived
  (the dependencies of :mod:`tessera_lab.pipeline.engine`: ``F(s, i)`` needs ``F(s-1, i)``, a backward needs
  ``F(s, i)`` and the backward of ``s+1``, ``W`` needs ``I``; an ``OVERLAP_F_B`` pair needs both inputs);
* an action is ``work`` CPU-seconds followed by ``latency`` seconds blocked (waiting on all-to-all peers),
  and a cross-rank transfer arrives ``p2p`` seconds after its producer ends;
* at each moment the runnable processes are this job's computing ones, ``wait_cpu`` of a process for each
  blocked (waiting) one (0: blocking waits; 1: spinning waits), and ``external`` other tenants; each
  computing process runs at ``rate = min(1, cores / runnable)`` (Linux CFS shares a core equally among
  runnable processes). E.g. 8 computing processes on 2 cores with no external load run at 1/4 speed;
* processes computing at once slow each other (shared caches and memory bandwidth; above the core count,
  context switches): with ``n`` processes computing on the machine (this job's computing ones plus the cores
  other tenants hold, ``machine_cores - cores``), a computing process's speed is divided by
  :func:`corun_slowdown` of ``n``: the slowdown of a layer microbenchmark with ``n`` copies running at once
  against it alone, calibrated at 2 and 4 processes (CPU-time medians on this 2-core VM: 1.06-1.19 with 2,
  1.13-1.24 with 4).

So with the cores oversubscribed the step tends to ``total work / cores`` (the same model split over more
stages does the same total work), and with them idle to the critical path.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping

from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.actions import ActionType
from tessera_lab.pipeline.engine import Walk, action_inputs, action_outputs

__all__ = ["share_rate", "corun_slowdown", "simulate_shared"]

_F, _B, _I, _W, _OV = ActionType.F, ActionType.B, ActionType.I, ActionType.W, ActionType.OVERLAP_F_B


def share_rate(computing: float, cores: float, external: float = 0.0, waiting_cpu: float = 0.0) -> float:
    """Speed of one computing process (1 = a whole core): ``min(1, cores / (computing + waiting_cpu +
    external))``; ``computing`` processes, ``waiting_cpu`` runnable-equivalents from waiting ones.

    Raises:
        ConfigError: ``cores`` <= 0 or a negative count.
    """
    if not cores > 0 or computing < 0 or external < 0 or waiting_cpu < 0:
        raise ConfigError(f"share_rate: cores = {cores!r} must be > 0 and counts >= 0 "
                          f"(computing {computing!r}, external {external!r}, waiting {waiting_cpu!r})")
    n = computing + waiting_cpu + external
    return 1.0 if n <= cores else cores / n


def corun_slowdown(corun: float | Mapping[str, float], runnable: float, machine_cores: float) -> float:
    """Factor (>= 1) by which a computing process slows with ``runnable`` processes computing on the machine
    (this job's and other tenants'): shared caches and memory bandwidth, and above ``machine_cores`` the
    context switches. ``corun``: the calibrated table ``{processes: slowdown}`` (``"1"`` is 1), interpolated
    linearly in the process count and held beyond its last entry; a number ``c`` stands for ``{1: 1,
    machine_cores: c}``.

    Raises:
        ConfigError: a slowdown below 1.
    """
    if isinstance(corun, Mapping):
        pts = sorted((float(k), float(v)) for k, v in corun.items())
    else:
        pts = [(1.0, 1.0), (max(1.0, float(machine_cores)), float(corun))]
    if any(v < 1.0 for _, v in pts):
        raise ConfigError(f"co-running slowdown table {corun!r}: every slowdown must be >= 1")
    pts = [(1.0, 1.0)] + [p for p in pts if p[0] > 1.0]
    x = max(1.0, float(runnable))
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def _leaves(a):
    return a.sub_actions if a.sub_actions else (a,)


def simulate_shared(schedule, work: Callable[[int, int | None, ActionType], float], *, cores: float,
                    external: float = 0.0, procs_per_rank: int = 1, p2p: float = 0.0,
                    latency: Callable[[int, int | None, ActionType], float] | None = None,
                    wait_cpu: float = 0.0, corun: float | Mapping[str, float] = 1.0,
                    machine_cores: float | None = None) -> dict:
    """Processor-sharing simulation of one iteration of ``schedule`` (module docstring).

    ``work(stage, microbatch, type)`` / ``latency(...)``: CPU-seconds and blocked seconds of an action
    (called like :class:`tessera_lab.pipeline.durations.Durations`, an ``OVERLAP_F_B`` pair with its
    backward's stage and micro-batch). Returns ``{"iteration_s", "per_rank_busy_s", "mean_rate",
    "busy_processes"}``: the end of the last action, each rank's computing + blocked time, the mean speed
    of a computing process, the time-mean of computing processes, and ``cpu_s``: the CPU-seconds the
    computing processes used (their work times their co-running slowdowns).

    ``corun`` / ``machine_cores``: the co-running slowdown (module docstring, :func:`corun_slowdown`;
    ``machine_cores`` defaults to ``cores``).

    Raises:
        ConfigError: bad cores / counts, a slowdown < 1; a schedule that cannot complete (a dependency never met).
    """
    corun_slowdown(corun, 1.0, 1.0)  # validates the table
    mc = float(machine_cores if machine_cores is not None else cores)
    others = max(0.0, mc - cores)
    S, s2r = schedule.num_stages, schedule.stage_to_rank
    R = schedule.num_ranks
    lat = latency or (lambda s, i, t: 0.0)
    progs = []
    for r in range(R):
        prog = []
        for a in schedule.actions.get(r, []):
            if not a.is_compute:
                continue
            needs = [(k, src, i, s2r[src] != r) for k, src, i, _ in action_inputs(a, S)]
            prods = list(dict.fromkeys(key[:3] for x in _leaves(a) for key in action_outputs(x, S)))
            key = next(((x.stage, x.microbatch) for x in _leaves(a) if x.type is not _F),
                        (a.stage, a.microbatch)) if a.sub_actions else (a.stage, a.microbatch)
            typ = _OV if a.sub_actions else a.type
            w, d = float(work(key[0], key[1], typ)), float(lat(key[0], key[1], typ))
            if not (w >= 0 and d >= 0 and math.isfinite(w) and math.isfinite(d)):
                raise ConfigError(f"simulate_shared: action {a} on rank {r} has work {w!r}, latency {d!r}")
            prog.append((needs, prods, w, d))
        progs.append(prog)
    model = _SharedCores(cores, external, procs_per_rank, wait_cpu, corun, mc, others)
    t, busy = Walk(R).run_shared(progs, model.speed, model.spent, p2p)
    return {"iteration_s": t, "per_rank_busy_s": busy,
            "mean_rate": model.rate_area / model.cpu_time if model.cpu_time > 0 else 1.0,
            "busy_processes": model.n_area / t if t > 0 else 0.0, "cpu_s": model.cpu_area}


class _SharedCores:
    """The resource model of :func:`simulate_shared` on the engine (:meth:`tessera_lab.pipeline.engine.Walk.run_shared`):
    the speed of a computing process from the ranks computing and waiting (:func:`share_rate`, then
    :func:`corun_slowdown`), and the time integrals of the speed, the computing processes and the CPU they use."""

    def __init__(self, cores, external, procs, wait_cpu, corun, machine_cores, others):
        self.cores, self.external, self.procs, self.wait_cpu = cores, external, procs, wait_cpu
        self.corun, self.mc, self.others = corun, machine_cores, others
        self.rate = self.share = 1.0
        self.rate_area = self.n_area = self.cpu_time = self.cpu_area = 0.0

    def speed(self, computing: int, waiting: int) -> float:
        n_cpu = computing * self.procs
        share = rate = share_rate(n_cpu, self.cores, self.external, self.wait_cpu * waiting * self.procs)
        if n_cpu:
            rate /= corun_slowdown(self.corun, n_cpu + self.external + self.others, self.mc)
        self.share, self.rate = share, rate
        return rate

    def spent(self, dt: float, computing: int) -> None:
        if computing:
            n_cpu = computing * self.procs
            self.rate_area += self.rate * dt
            self.cpu_time += dt
            self.n_area += n_cpu * dt
            self.cpu_area += n_cpu * self.share * dt
