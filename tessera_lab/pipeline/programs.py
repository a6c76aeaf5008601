"""The event engine's compile phase: each rank's actions as ops the event loop
(:class:`tessera_lab.pipeline.engine._EventLoop`) reads, with the dependency rule of
:mod:`tessera_lab.pipeline.engine` written into each op (which inputs it needs, from which rank, and what it
produces for whom). A pure function of the schedule's actions and ``stage_to_rank``; never imports torch.
"""

from __future__ import annotations

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.actions import ActionType
from tessera_lab.pipeline.p2p import check_nccl_order

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_OV = ActionType.OVERLAP_F_B
_SEND_F, _RECV_F, _SEND_B, _RECV_B = ActionType.SEND_F, ActionType.RECV_F, ActionType.SEND_B, ActionType.RECV_B

#: op kinds
_OP_COMPUTE, _OP_SEND, _OP_RECV = 0, 1, 2
_COMM_OPS = frozenset({_SEND_F, _SEND_B, _RECV_F, _RECV_B})
_TYPE_STR = {t: t.value for t in ActionType}


def _comm_op(a, r: int, s2r) -> tuple:
    """A SEND/RECV action as an op ``(kind, action, key, src stage, dst stage)``."""
    t = a.type
    if t is _SEND_F:
        key, src, dst = ("F", a.stage, a.microbatch), a.stage, a.stage + 1
    elif t is _SEND_B:
        key, src, dst = ("G", a.stage, a.microbatch), a.stage, a.stage - 1
    elif t is _RECV_F:
        key, src, dst = ("F", a.stage - 1, a.microbatch), a.stage - 1, a.stage
    else:
        key, src, dst = ("G", a.stage + 1, a.microbatch), a.stage + 1, a.stage
    if src not in s2r or dst not in s2r:
        raise ScheduleError(f"{a} on rank {r}: stages {src} -> {dst} are not both in the schedule")
    return (_OP_SEND if t is _SEND_F or t is _SEND_B else _OP_RECV), a, key, src, dst


def _rank_program(acts, r: int, s2r, S: int, explicit_send: set, explicit_recv: set) -> list[tuple]:
    """Rank ``r``'s actions as ops: SEND/RECV by :func:`_comm_op` (their keys added to ``explicit_send`` /
    ``explicit_recv``); a compute action (or pair) as ``(kind, action, needs, produces, durations key, event stage,
    event mb, type, label, activations taken, activations freed)``. ``needs``: ``((cross_rank, key), ...)`` with key
    ``('F'|'G', stage, mb)`` (``F``: forward output of that stage, ``G``: its input gradient, from B or I); local
    needs read ``done``, cross-rank ones ``arrival``. ``produces``: ``((key, dst stage or -1), ...)``. The compute
    case is inlined: it runs once per action of every first simulation."""
    prog = []
    for a in acts:
        t = a.type
        if t in _COMM_OPS:
            op = _comm_op(a, r, s2r)
            (explicit_send if op[0] == _OP_SEND else explicit_recv).add(op[2])
            prog.append(op)
            continue
        leaves = a.sub_actions if a.sub_actions else (a,)
        needs, produces = [], []
        plus = minus = 0
        for x in leaves:
            s, i, k = x.stage, x.microbatch, x.type
            if s not in s2r:
                raise ScheduleError(f"{x} on rank {r}: stage {s} has no rank in stage_to_rank")
            if k is _F:
                if s > 0:
                    needs.append((s2r[s - 1] != r, ("F", s - 1, i)))
                produces.append((("F", s, i), s + 1 if s + 1 < S and s2r[s + 1] != r else -1))
                plus += 1
            elif k is _B or k is _I:
                needs.append((False, ("F", s, i)))
                if s < S - 1:
                    needs.append((s2r[s + 1] != r, ("G", s + 1, i)))
                produces.append((("G", s, i), s - 1 if s > 0 and s2r[s - 1] != r else -1))
                if k is _B:
                    minus += 1
            elif k is _W:
                needs.append((False, ("G", s, i)))
                minus += 1
            else:
                raise ScheduleError(f"{x} on rank {r}: cannot simulate action type {k.value} inside a pair")
        if a.sub_actions:
            bwd = next((x for x in leaves if x.type is not _F), leaves[-1])
            dur_key, ev_stage, ev_mb, label = (bwd.stage, bwd.microbatch, _OV), bwd.stage, bwd.microbatch, str(a)
        else:
            dur_key, ev_stage, ev_mb = (a.stage, a.microbatch, t), a.stage, a.microbatch
            label = f"{a.stage}{_TYPE_STR[t]}{'' if a.microbatch is None else a.microbatch}"
        prog.append((_OP_COMPUTE, a, tuple(needs), tuple(produces), dur_key, ev_stage, ev_mb, _TYPE_STR[t], label,
                     plus, minus))
    return prog


def _compile_programs(schedule) -> tuple[list[list[tuple]], set, set]:
    """Per rank, its actions as ops and the keys sent and received by
    explicit SEND/RECV actions (:func:`_rank_program`; a lowered schedule is first checked against the NCCL rule)."""
    S, s2r = schedule.num_stages, schedule.stage_to_rank
    explicit_send: set[tuple] = set()
    explicit_recv: set[tuple] = set()
    programs = [_rank_program(schedule.actions.get(r, []), r, s2r, S, explicit_send, explicit_recv)
                for r in range(schedule.num_ranks)]
    if explicit_send or explicit_recv:
        check_nccl_order(schedule)
    return programs, explicit_send, explicit_recv
