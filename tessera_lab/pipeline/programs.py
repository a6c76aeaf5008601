"""The event engine's rules and its compile phase (never imports torch).

The rules every walk over actions follows (:mod:`tessera_lab.pipeline.engine`): data flow, an action's inputs
(:func:`action_inputs`) and the outputs of a compute leaf (:func:`action_outputs`); activation memory, what a leaf
takes or frees (:data:`ACTIVATION_CHANGE`). The compile phase writes them into each rank's ops for the event loop
(:class:`tessera_lab.pipeline.engine._EventLoop`: which inputs an op needs, from which rank, and what it produces for
whom; the data-flow rule inlined, as the compile runs once per action of a first simulation, and checked equal to
:func:`action_inputs` and :func:`action_outputs` by the tests), a pure function of the schedule's actions and
``stage_to_rank``; and holds the compilations of recently simulated schedules (:func:`_held_for`).
"""

from __future__ import annotations

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.actions import ActionType
from tessera_lab.pipeline.linear import pack_trace
from tessera_lab.pipeline.p2p import check_nccl_order

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_OV = ActionType.OVERLAP_F_B
_SEND_F, _RECV_F, _SEND_B, _RECV_B = ActionType.SEND_F, ActionType.RECV_F, ActionType.SEND_B, ActionType.RECV_B

#: op kinds
_OP_COMPUTE, _OP_SEND, _OP_RECV = 0, 1, 2
_COMM_OPS = frozenset({_SEND_F, _SEND_B, _RECV_F, _RECV_B})
_TYPE_STR = {t: t.value for t in ActionType}

#: activations a compute leaf takes (+1: a forward keeps its micro-batch's activations on its rank) or frees (-1: a
#: whole backward, or the weight gradient ending a split one; an input gradient keeps them for its W), in
#: micro-batches
ACTIVATION_CHANGE = {_F: 1, _B: -1, _I: 0, _W: -1}
#: the same rule as the compile reads it, per leaf type: activations taken and freed
(_TAKES_F, _FREES_F), (_TAKES_B, _FREES_B), (_TAKES_I, _FREES_I), (_TAKES_W, _FREES_W) = (
    (max(ACTIVATION_CHANGE[k], 0), max(-ACTIVATION_CHANGE[k], 0)) for k in (_F, _B, _I, _W))


def action_inputs(a, num_stages: int, weight: bool = True) -> list[tuple[str, int, int, int]]:
    """The inputs of compute action ``a`` (each leaf of a pair) under the dependency rule of this module:
    ``(kind, producing stage, micro-batch, consuming stage)`` with kind ``"F"`` (a forward output) or ``"G"`` (an
    input gradient); a ``W`` leaf needs its stage's own ``G`` (left out with ``weight=False``)."""
    out = []
    for x in (a.sub_actions or (a,)):
        s, i, k = x.stage, x.microbatch, x.type
        if k is _F and s > 0:
            out.append(("F", s - 1, i, s))
        elif k is _B or k is _I:
            out.append(("F", s, i, s))
            if s < num_stages - 1:
                out.append(("G", s + 1, i, s))
        elif k is _W and weight:
            out.append(("G", s, i, s))
    return out


def action_outputs(x, num_stages: int, weight: bool = True) -> list[tuple[str, int, int, int]]:
    """The keys of :func:`action_inputs` that compute leaf ``x`` produces, in delivery order: a forward's output for
    its stage and the next, a backward's gradient for the previous stage and an ``I``'s for its own ``W`` (left out
    with ``weight=False``); a ``W`` nothing."""
    s, i, k = x.stage, x.microbatch, x.type
    if k is _F:
        return [("F", s, i, s)] + ([("F", s, i, s + 1)] if s < num_stages - 1 else [])
    if k is _B or k is _I:
        out = [("G", s, i, s - 1)] if s > 0 else []
        return out + [("G", s, i, s)] if k is _I and weight else out
    return []


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
        subs = a.sub_actions
        needs = produces = ()  # tuples grown per leaf (a leaf's own tuples when it is alone)
        plus = minus = 0
        for x in (subs or (a,)):
            s, i, k = x.stage, x.microbatch, x.type
            if s not in s2r:
                raise ScheduleError(f"{x} on rank {r}: stage {s} has no rank in stage_to_rank")
            if k is _F:
                if s > 0:
                    needs += ((s2r[s - 1] != r, ("F", s - 1, i)),)
                produces += ((("F", s, i), s + 1 if s + 1 < S and s2r[s + 1] != r else -1),)
                plus, minus = plus + _TAKES_F, minus + _FREES_F
            elif k is _B or k is _I:
                if s < S - 1:
                    needs += ((False, ("F", s, i)), (s2r[s + 1] != r, ("G", s + 1, i)))
                else:
                    needs += ((False, ("F", s, i)),)
                produces += ((("G", s, i), s - 1 if s > 0 and s2r[s - 1] != r else -1),)
                plus, minus = (plus + _TAKES_B, minus + _FREES_B) if k is _B else (plus + _TAKES_I, minus + _FREES_I)
            elif k is _W:
                needs += ((False, ("G", s, i)),)
                plus, minus = plus + _TAKES_W, minus + _FREES_W
            else:
                raise ScheduleError(f"{x} on rank {r}: cannot simulate action type {k.value} inside a pair")
        ts = _TYPE_STR[t]
        if subs:
            bwd = next((x for x in subs if x.type is not _F), subs[-1])
            dur_key, ev_stage, ev_mb, label = (bwd.stage, bwd.microbatch, _OV), bwd.stage, bwd.microbatch, str(a)
        else:
            dur_key, ev_stage, ev_mb = (a.stage, a.microbatch, t), a.stage, a.microbatch
            label = f"{a.stage}{ts}{'' if a.microbatch is None else a.microbatch}"
        prog.append((_OP_COMPUTE, a, needs, produces, dur_key, ev_stage, ev_mb, ts, label, plus, minus))
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


class _Held:
    """A simulated schedule, held by identity with a copy of every action list. Its first simulation compiles the
    programs without holding them (a one-shot pays for its compile and event loop only, and keeps nothing but the
    order that run recorded: holding every new schedule's programs made a process's first simulations slower); the
    second compiles again and holds them, with the fast path's plan packed from that order."""

    __slots__ = ("schedule", "shape", "lists", "programs", "sends", "recvs", "plan", "order", "fresh")

    def __init__(self, schedule):
        R = schedule.num_ranks
        self.schedule = schedule
        self.shape = (schedule.num_stages, R, dict(schedule.stage_to_rank))
        self.lists = [list(schedule.actions.get(r, [])) for r in range(R)]
        self.programs = self.sends = self.recvs = self.plan = self.order = None
        self.fresh = True

    def holds(self, schedule) -> bool:
        """``schedule`` is the one held, unchanged: each action list equal to the copy (by identity first)."""
        lists, R = schedule.actions, schedule.num_ranks
        return (self.schedule is schedule and self.shape == (schedule.num_stages, R, schedule.stage_to_rank)
                and all(lists.get(r, []) == h for r, h in zip(range(R), self.lists)))

    def compiled(self) -> tuple:
        """``(programs, sends, recvs, plan)`` as :func:`tessera_lab.pipeline.engine.compile_schedule` gives them
        (``plan``: ``None`` until a run recorded its order)."""
        if self.programs is None:
            compiled = _compile_programs(self.schedule)
            if self.fresh:  # the first simulation: nothing held
                self.fresh = False
                return (*compiled, None)
            self.programs, self.sends, self.recvs = compiled
        if self.plan is None and self.order is not None:
            self.plan = pack_trace(self.programs, self.schedule.stage_to_rank, self.order)
            self.order = None
        return self.programs, self.sends, self.recvs, self.plan


#: compiled programs of recently simulated schedules, by identity
_COMPILED: dict[int, _Held] = {}


def _held_for(schedule) -> _Held:
    """The held compilation of ``schedule``, made (and the oldest of eight dropped) when it is new or changed."""
    held = _COMPILED.get(id(schedule))
    if held is not None and held.holds(schedule):
        return held
    held = _Held(schedule)
    if len(_COMPILED) >= 8 and id(schedule) not in _COMPILED:
        _COMPILED.pop(next(iter(_COMPILED)))
    _COMPILED[id(schedule)] = held
    return held
