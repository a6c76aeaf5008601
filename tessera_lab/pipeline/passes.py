"""Schedule passes: pure ``Schedule -> Schedule`` functions, in one place for the planner, simulator, runner and
dynamic optimizer (modelled on torch.distributed.pipelining's lowering passes and sail-sg's zero-bubble
``scheduler/passes.py``).

* :func:`with_comms`: explicit SEND/RECV actions, placed as torch's ``_add_send_recv`` places them.
* :func:`split_backward`: every full backward ``B`` (also inside overlapped ``(F;B)`` pairs, as in ``overlapped``
  and DualPipeV) becomes ``I`` (input gradient, where ``B`` was) and a deferrable ``W`` placed ``w_lag``
  micro-batches later (``0``: right after its ``I``; ``None``: at the end of the rank's list).

Every pass returns a new, validated :class:`~tessera_lab.pipeline.schedules.Schedule` and raises
:class:`~tessera_lab.errors.ScheduleError` when the result is not executable.
"""

from __future__ import annotations

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.schedules import Action, ActionType, Schedule

__all__ = ["with_comms", "split_backward"]


def with_comms(schedule: Schedule) -> Schedule:
    """A copy with explicit SEND/RECV actions, placed the way torch's ``_add_send_recv`` does:
    each cross-rank send right after its producing compute action, and the matching receive
    appended to the receiving rank's list at that moment of a rank-by-rank sweep.

    Raises:
        ScheduleError: the compute orders cannot be lowered (they are not jointly executable).
    """
    S = schedule.num_stages
    s2r = schedule.stage_to_rank
    pending = {r: list(schedule.compute_actions(r)) for r in range(schedule.num_ranks)}
    out: dict[int, list[Action]] = {r: [] for r in range(schedule.num_ranks)}
    done: set[tuple[str, int, int]] = set()  # ('F'|'G', stage, mb) visible on the consumer rank
    F, B, I = ActionType.F, ActionType.B, ActionType.I

    def ready(x: Action) -> bool:
        if x.type is F and x.stage > 0:
            return ("F", x.stage - 1, x.microbatch) in done
        if x.type in (B, I) and x.stage < S - 1:
            return ("G", x.stage + 1, x.microbatch) in done
        return True

    while any(pending.values()):
        progress = False
        for r in range(schedule.num_ranks):
            if not pending[r]:
                continue
            a = pending[r][0]
            if not all(ready(x) for x in a.leaves()):
                continue
            out[r].append(a)
            for x in a.leaves():
                if x.type is F:
                    done.add(("F", x.stage, x.microbatch))
                    if x.stage < S - 1 and s2r[x.stage + 1] != r:
                        out[r].append(Action(x.stage, ActionType.SEND_F, x.microbatch))
                        out[s2r[x.stage + 1]].append(Action(x.stage + 1, ActionType.RECV_F, x.microbatch))
                elif x.type in (B, I):
                    done.add(("G", x.stage, x.microbatch))
                    if x.stage > 0 and s2r[x.stage - 1] != r:
                        out[r].append(Action(x.stage, ActionType.SEND_B, x.microbatch))
                        out[s2r[x.stage - 1]].append(Action(x.stage - 1, ActionType.RECV_B, x.microbatch))
            pending[r].pop(0)
            progress = True
        if not progress:
            stuck = {r: str(v[0]) for r, v in pending.items() if v}
            raise ScheduleError(f"schedule {schedule.name!r} cannot be lowered with comms; stuck: {stuck}")
    return Schedule(schedule.name, schedule.num_ranks, S, schedule.num_microbatches, out, dict(s2r), dict(schedule.meta))


def split_backward(schedule: Schedule, w_lag: int | None = 0) -> Schedule:
    """Split every full backward ``B`` into ``I`` (input gradient, where ``B`` was) and a deferred ``W``.

    ``W(s, i)`` goes right after the action holding ``I(s, i + w_lag)`` on the same stage (``w_lag=0``: right after
    its own ``I``); without such an action (``i + w_lag >= m``), or with ``w_lag=None``, it goes to the end of the
    rank's list; in schedules that
    already split some backwards (ZB, DualPipeV) it moves up to just before the first existing ``W(s, j)``
    with ``j > i``. So W passes stay in micro-batch order per stage and gradients accumulate in the same
    order as with ``B``. Overlapped pairs ``(F;B)`` become ``(F;I)``. Actions already split (I/W) are kept.

    Raises:
        ScheduleError: the result fails :meth:`Schedule.validate`.
    """
    m = schedule.num_microbatches
    new_actions: dict[int, list[Action]] = {}
    any_converted = False
    for r, acts in schedule.actions.items():
        out: list[Action] = []
        slots: dict[tuple[int, int], int] = {}  # (stage, mb) of an I made from a B -> index in out
        converted: list[tuple[int, int]] = []
        existing_w: dict[int, list[tuple[int, int]]] = {}  # stage -> [(mb, index)] of W already in the list
        for a in acts:
            if a.type is ActionType.OVERLAP_F_B:
                subs = tuple(Action(x.stage, ActionType.I, x.microbatch) if x.type is ActionType.B else x
                             for x in a.sub_actions)
                out.append(Action(a.stage, a.type, a.microbatch, subs))
                for x in a.sub_actions:
                    if x.type is ActionType.B:
                        slots[(x.stage, x.microbatch)] = len(out) - 1
                        converted.append((x.stage, x.microbatch))
            elif a.type is ActionType.B:
                out.append(Action(a.stage, ActionType.I, a.microbatch))
                slots[(a.stage, a.microbatch)] = len(out) - 1
                converted.append((a.stage, a.microbatch))
            else:
                if a.type is ActionType.W:
                    existing_w.setdefault(a.stage, []).append((a.microbatch, len(out)))
                out.append(a)
        before: dict[int, list[tuple[int, int, Action]]] = {}  # insert before index (len(out) = at the end)
        for s, i in converted:
            at = len(out)
            if w_lag is not None and i + w_lag < m and (s, i + w_lag) in slots:
                at = slots[(s, i + w_lag)] + 1
            later = [q for j, q in existing_w.get(s, []) if j > i]  # keep W in micro-batch order per stage
            if later:
                at = min(at, min(later))
            before.setdefault(at, []).append((i, s, Action(s, ActionType.W, i)))
        merged: list[Action] = []
        for k in range(len(out) + 1):
            merged.extend(w for _, _, w in sorted(before.get(k, []), key=lambda x: (x[0], x[1])))
            if k < len(out):
                merged.append(out[k])
        new_actions[r] = merged
        any_converted = any_converted or bool(converted)
    if not any_converted:  # already split (ZB-H1, ZB-H2) or no backward: an unchanged copy
        return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, m, new_actions,
                        dict(schedule.stage_to_rank), dict(schedule.meta))
    sched = Schedule(schedule.name + "+defer-w", schedule.num_ranks, schedule.num_stages, m, new_actions,
                     dict(schedule.stage_to_rank), dict(schedule.meta, defer_w=True, w_lag=w_lag))
    return sched.validate()
