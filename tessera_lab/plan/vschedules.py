"""Schedules the planner builds beyond :func:`tessera_lab.pipeline.schedules.build_schedule`, and their memory.

``interleaved-overlapped``: interleaved 1F1B (``vpp`` chunks per rank, Megatron-LM placement) whose steady state
runs each backward together with the next forward as one ``OVERLAP_F_B`` pair, as Megatron-Core's EP-overlap
path does (combined 1F1B with VPP > 1). Built from the interleaved lists by one rewrite: every rank runs one more
warm-up forward (Megatron's extra warm-up micro-batch in ``get_pp_rank_microbatches``), and each steady-state
``B`` is fused with the ``F`` that follows it. The forward and the backward of a pair may belong to different
chunks; the simulator times a pair by its backward's stage (``fb[stage of B]``). Peak live activations per rank:
one chunk-micro-batch more than interleaved 1F1B (checked against the simulator in the tests for ``m`` a multiple
of ``pp``, Megatron's case; otherwise the interleaved memory model's own error carries over).

``zb-auto`` (when :mod:`tessera_lab.pipeline` provides it): the zero-bubble schedule search run on the plan's own
per-stage F, I, W and p2p times, with a memory budget of ``2 p - 1`` micro-batches of activations per rank
(ZB-H2's), which is what the planner's memory model charges on every rank.

Raises (all functions): :class:`~tessera_lab.errors.ScheduleError` or ``ConfigError`` as the underlying builders.
"""

from __future__ import annotations

from typing import Sequence

from tessera_lab.cost.memory import in_flight
from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.schedules import ActionType, Schedule, build_schedule, canonical_name, overlap

INTERLEAVED_OVERLAPPED = "interleaved-overlapped"
#: schedule names the planner builds here (the rest go to ``build_schedule``)
PLANNER_SCHEDULES = (INTERLEAVED_OVERLAPPED,)


def _known(name: str) -> bool:
    try:
        canonical_name(name)
    except ScheduleError:
        return False
    return True


#: whether the pipeline package has the zero-bubble schedule search
HAS_ZB_AUTO = _known("zb-auto")


def zb_auto_budget(pp: int, m: int) -> int:
    """Micro-batches of activations per rank the planner lets ``zb-auto`` hold: ``min(2 p - 1, m)`` (ZB-H2's)."""
    return min(2 * pp - 1, m)


def interleaved_overlapped(pp: int, vpp: int, m: int) -> Schedule:
    """Interleaved 1F1B with (B; next F) pairs in the steady state (module docstring)."""
    base = build_schedule("interleaved", pp, m, vpp)
    F, B = ActionType.F, ActionType.B
    lists = {}
    for r, acts in base.actions.items():
        n = len(acts)
        warm = 0  # warm-up forwards: up to the first F that a B follows
        while warm < n and not (acts[warm].type == F and warm + 1 < n and acts[warm + 1].type == B):
            warm += 1
        out = list(acts[:warm + 1])  # one more warm-up forward
        rest = acts[warm + 1:]
        k = 0
        while k < len(rest):
            if rest[k].type == B and k + 1 < len(rest) and rest[k + 1].type == F:
                out.append(overlap(rest[k + 1], rest[k]))
                k += 2
            else:
                out.append(rest[k])
                k += 1
        lists[r] = out
    return Schedule(INTERLEAVED_OVERLAPPED, pp, base.num_stages, m, lists, dict(base.stage_to_rank), {"vpp": vpp})


def plan_schedule(name: str, pp: int, m: int, vpp: int = 1, *, f: Sequence[float] | None = None,
                  i: Sequence[float] | None = None, w: Sequence[float] | None = None, p2p: float = 0.0) -> Schedule:
    """The schedule ``name`` for the planner: :func:`interleaved_overlapped`, ``zb-auto`` searched on the per-stage
    times ``f``, ``i``, ``w`` and ``p2p`` (seconds) within :func:`zb_auto_budget`, or ``build_schedule``."""
    if name == INTERLEAVED_OVERLAPPED:
        return interleaved_overlapped(pp, vpp, m)
    if name == "zb-auto":
        return build_schedule(name, pp, m, vpp, memory_budget=zb_auto_budget(pp, m), f=list(f), i=list(i), w=list(w),
                              p2p=p2p)
    return build_schedule(name, pp, m, vpp)


def plan_in_flight(schedule: str, pp: int, stage: int, m: int, vpp: int = 1) -> float:
    """Micro-batches of activations rank ``stage`` holds at its peak, in units of its whole per-micro-batch
    activations (:func:`tessera_lab.cost.memory.in_flight`; interleaved-overlapped: one chunk more than
    interleaved)."""
    if schedule == INTERLEAVED_OVERLAPPED:
        return min(in_flight("interleaved", pp, stage, m, vpp) * vpp + 1, vpp * m) / vpp
    if schedule == "zb-auto":
        return float(zb_auto_budget(pp, m))
    return in_flight(schedule, pp, stage, m, vpp)
