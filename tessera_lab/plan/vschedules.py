"""The planner's schedule settings: which per-stage times and memory budget ``zb-auto`` is searched with, and the
activations each schedule holds at its peak.

``zb-auto``: the zero-bubble schedule search run on the plan's own per-stage F, I, W and p2p times, with a memory
budget of ``2 p - 1`` micro-batches of activations per rank (ZB-H2's), which is what the planner's memory model
charges on every rank. ``interleaved-overlapped`` (:func:`tessera_lab.pipeline.generators.interleaved_overlapped`)
holds one chunk-micro-batch more than interleaved 1F1B (checked against the simulator in the tests for ``m`` a
multiple of ``pp``, Megatron's case; otherwise the interleaved memory model's own error carries over). Every
schedule is built from the one registry, :data:`tessera_lab.pipeline.schedules.SCHEDULES`.

Raises (all functions): :class:`~tessera_lab.errors.ScheduleError` or ``ConfigError`` as the underlying builders.
"""

from __future__ import annotations

from typing import Sequence

from tessera_lab.cost.memory import in_flight
from tessera_lab.pipeline.schedules import INTERLEAVED_OVERLAPPED, Schedule, build_schedule


def zb_auto_budget(pp: int, m: int) -> int:
    """Micro-batches of activations per rank the planner lets ``zb-auto`` hold: ``min(2 p - 1, m)`` (ZB-H2's)."""
    return min(2 * pp - 1, m)


def plan_schedule(name: str, pp: int, m: int, vpp: int = 1, *, f: Sequence[float] | None = None,
                  i: Sequence[float] | None = None, w: Sequence[float] | None = None, p2p: float = 0.0) -> Schedule:
    """The schedule ``name`` for the planner (``build_schedule(..., planner=True)``): ``zb-auto`` searched on the
    per-stage times ``f``, ``i``, ``w`` and ``p2p`` (seconds) within :func:`zb_auto_budget`."""
    if name == "zb-auto":
        return build_schedule(name, pp, m, vpp, memory_budget=zb_auto_budget(pp, m), f=list(f), i=list(i), w=list(w),
                              p2p=p2p)
    return build_schedule(name, pp, m, vpp, planner=True)


def plan_in_flight(schedule: str, pp: int, stage: int, m: int, vpp: int = 1) -> float:
    """Micro-batches of activations rank ``stage`` holds at its peak, in units of its whole per-micro-batch
    activations (:func:`tessera_lab.cost.memory.in_flight`; interleaved-overlapped: one chunk more than
    interleaved)."""
    if schedule == INTERLEAVED_OVERLAPPED:
        return min(in_flight("interleaved", pp, stage, m, vpp) * vpp + 1, vpp * m) / vpp
    if schedule == "zb-auto":
        return float(zb_auto_budget(pp, m))
    return in_flight(schedule, pp, stage, m, vpp)
