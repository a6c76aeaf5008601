"""The event engine: every walk over per-rank action lists runs here.

* :func:`simulate`: discrete-event simulation of pipeline schedules, producing a
  :class:`~tessera_lab.pipeline.timeline.Timeline` (model below). Schedules whose order of execution does not depend
  on the times (no explicit SEND/RECV, no blocking sends) take the linear pass of :mod:`tessera_lab.pipeline.linear`
  (the same timeline, bit for bit); the rest the event loop below.
* :class:`Walk`: the engine for walks whose steps a caller decides, with the same dependency rule
  (:func:`action_inputs`): an agenda of ranks by clock with a policy hook (the dynamic controller's step-by-step
  execution, :func:`tessera_lab.dynamic.online.execute`), and a processor-sharing driver with a resource model (the
  CPU testbed, :func:`tessera_lab.runner.testbed.sharing.simulate_shared`).

Model (times in float seconds):

* Each rank has a **compute lane** that runs its action list strictly in order, and a
  **communication lane** (point-to-point transfers into the rank, and optional extra collectives).
  A rank blocks until the next action's inputs have arrived.
* Dependencies: ``F`` of micro-batch ``i`` on stage ``s`` needs ``F(s-1, i)``; a backward (``B`` or
  ``I``) of ``i`` on ``s`` needs ``F(s, i)`` and the backward of ``i`` on ``s+1`` (the last stage
  only its own ``F``); ``W`` needs ``I`` of the same stage and micro-batch. An ``OVERLAP_F_B`` pair
  needs the inputs of both its sub-actions, runs for the pair makespan and delivers both outputs
  when it ends.
* Transfers between stages on different ranks take ``p2p_latency + p2p_time(src, dst)``;
  transfers between stages on the same rank are free. A zero-time transfer is a no-op (no event,
  no exposed time; with blocking sends it still synchronises sender and receiver).
  Without explicit SEND/RECV actions a transfer starts when its producer ends (batched
  ``isend``/``irecv``, as Megatron and torch do). Explicit ``SEND_*`` actions post the send when the
  rank reaches them; with ``blocking_sends=True`` a send is a rendezvous: it completes (and the
  sender continues) only after the receiver has posted the matching receive (explicit
  ``RECV_*``, or implicitly when it reaches the consuming compute action) and the data moved;
  explicit receives then block until the data arrives. Orders that can never complete raise
  :class:`~tessera_lab.errors.DeadlockError` naming each stuck rank and its next action.
* A lowered schedule (explicit SEND/RECV actions) is first played by the NCCL rule
  (:func:`tessera_lab.pipeline.p2p.check_nccl_order`: a rank's batches run in posting order, a rank pair's
  p2p match in posting order, tags ignored); an order NCCL would deadlock on or mismatch raises.

Durations come from a callable ``durations(stage, microbatch, type) -> seconds`` (the
:class:`Durations` protocol). For an ``OVERLAP_F_B`` pair it is called with the *backward*
sub-action's stage and micro-batch and ``ActionType.OVERLAP_F_B``.


This module never imports torch, nor the schedule IR (it reads a schedule's ``num_stages``, ``num_ranks``,
``stage_to_rank``, ``actions`` and ``name``), so the IR's validation can call it.
"""

from __future__ import annotations

import gc
import math
import heapq
from typing import Callable, Iterable

from tessera_lab.errors import ConfigError, DeadlockError, ScheduleError
from tessera_lab.pipeline.actions import ActionType
from tessera_lab.pipeline.durations import Durations, _nonneg
from tessera_lab.pipeline.linear import linear_plan, run_linear
from tessera_lab.pipeline.p2p import check_nccl_order
from tessera_lab.pipeline.timeline import (P2P_COLLECTIVE, Event, Timeline, _add_comm_tasks, _build_timeline,
                                          _comm_tasks, _linear_timeline)

__all__ = ["compile_schedule", "simulate", "Walk", "action_inputs"]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_OV = ActionType.OVERLAP_F_B
_SEND_F, _RECV_F, _SEND_B, _RECV_B = ActionType.SEND_F, ActionType.RECV_F, ActionType.SEND_B, ActionType.RECV_B

# compiled op kinds
_OP_COMPUTE, _OP_SEND, _OP_RECV = 0, 1, 2
_COMM_OPS = frozenset({_SEND_F, _SEND_B, _RECV_F, _RECV_B})
_TYPE_STR = {t: t.value for t in ActionType}


def _transfer_fn(p2p_latency: float, p2p_time) -> Callable[[int, int], float]:
    lat = _nonneg("p2p_latency", p2p_latency)
    if p2p_time is None:
        return lambda src, dst: lat
    if callable(p2p_time):
        memo: dict[tuple[int, int], float] = {}  # p2p_time is a function of (src, dst): asked once per pair

        def fn(src: int, dst: int) -> float:
            got = memo.get((src, dst))
            if got is not None:
                return got
            v = p2p_time(src, dst)
            if not 0.0 <= v < math.inf:
                raise ConfigError(f"p2p_time({src}, {dst}) returned {v!r}; allowed finite seconds >= 0")
            got = memo[(src, dst)] = lat + v
            return got

        return fn
    t = lat + _nonneg("p2p_time", p2p_time)
    return lambda src, dst: t


def simulate(
    schedule,
    durations: Durations,
    *,
    p2p_latency: float = 0.0,
    p2p_time: float | Callable[[int, int], float] | None = None,
    blocking_sends: bool = False,
    comm: Iterable | None = None,
    compiled: tuple | None = None,
    time_only: bool = False,
) -> Timeline:
    """Simulate one iteration of ``schedule``.

    Args:
        schedule: per-rank action lists (compute only, or with explicit SEND/RECV actions).
        durations: ``durations(stage, microbatch, type) -> seconds`` (see :class:`Durations`).
        p2p_latency: seconds added to every cross-rank stage-to-stage transfer.
        p2p_time: transfer seconds, a constant or ``p2p_time(src_stage, dst_stage)`` (a function of the stage
            pair: asked once per pair); added to the latency. Same-rank transfers are free.
        blocking_sends: explicit ``SEND_*`` actions are rendezvous (see module docstring).
        comm: extra communication tasks on the comm lane, each ``(rank, collective_name, seconds,
            after_action)`` (tuple or dict with those keys); ``after_action`` is an
            :class:`Action`, its string (``"3W7"``), or ``None`` (start of the iteration). A rank's
            tasks run one after another, each starting when its action has ended and the lane is
            free; they do not block compute but count as exposed while the compute lane is idle,
            and can extend the iteration. Zero-second tasks are no-ops.
        compiled: :func:`compile_schedule` of this very schedule (unchanged since), to skip compiling it.
        time_only: return only the iteration time (float seconds, the latest event end) without building the
            timeline's analyses (exposure, critical path, peaks): what a search over many candidates needs.

    Returns:
        :class:`Timeline`.

    Raises:
        DeadlockError: no rank can progress; ``stuck`` maps rank -> its next action.
        ScheduleError: an action names a stage without a rank, or a negative duration is returned.
        ConfigError: negative latency/transfer time or malformed ``comm`` tasks.
    """
    # The simulator allocates many small tuples and no cycles: pausing the cyclic garbage
    # collector halves its run time on long schedules.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(schedule, durations, p2p_latency, p2p_time, blocking_sends, comm, compiled, time_only)
    finally:
        if was_enabled:
            gc.enable()


def compile_schedule(schedule) -> tuple:
    """The schedule's per-rank programs as the event loop reads them (a pure function of the schedule's actions
    and ``stage_to_rank``): pass it back as ``simulate(..., compiled=...)`` to simulate the same, unchanged
    schedule again under other durations without compiling it again."""
    S = schedule.num_stages
    s2r = schedule.stage_to_rank
    R = schedule.num_ranks
    ranks = range(R)

    # ---- compile --------------------------------------------------------------------------
    # Per op: needs = ((cross_rank, key), ...) where key = ('F'|'G', stage, mb): 'F' = forward
    # output of that stage, 'G' = input gradient of that stage (from B or I). Local needs read
    # ``done``; cross-rank needs read ``arrival`` (same key = the producing stage).
    explicit_send: set[tuple] = set()
    explicit_recv: set[tuple] = set()
    programs: list[list[tuple]] = []
    for r in ranks:
        prog = []
        for a in schedule.actions.get(r, []):
            t = a.type
            if t in _COMM_OPS:
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
                if t is _SEND_F or t is _SEND_B:
                    explicit_send.add(key)
                    prog.append((_OP_SEND, a, key, src, dst))
                else:
                    explicit_recv.add(key)
                    prog.append((_OP_RECV, a, key, src, dst))
                continue
            leaves = a.sub_actions if a.sub_actions else (a,)
            needs = []
            produces = []
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
                dur_key = (bwd.stage, bwd.microbatch, _OV)
                ev_stage, ev_mb, label = bwd.stage, bwd.microbatch, str(a)
            else:
                dur_key = (a.stage, a.microbatch, t)
                ev_stage, ev_mb = a.stage, a.microbatch
                label = f"{a.stage}{_TYPE_STR[t]}{'' if a.microbatch is None else a.microbatch}"
            prog.append(
                (_OP_COMPUTE, a, tuple(needs), tuple(produces), dur_key, ev_stage, ev_mb, _TYPE_STR[t], label, plus, minus)
            )
        programs.append(prog)
    if explicit_send or explicit_recv:
        check_nccl_order(schedule)
    plan = None if explicit_send or explicit_recv else linear_plan(programs, s2r)
    return programs, explicit_send, explicit_recv, plan


_P2P_NAMES = frozenset({P2P_COLLECTIVE, "RECV_F", "RECV_B"})

#: from this many actions up the linear pass's timeline is analysed on numpy arrays (below, numpy's per-call cost
#: exceeds the work: the event list is made and analysed in Python); both give the same timeline
ARRAY_TIMELINE_MIN_ACTIONS = 1024

#: compiled programs of recently simulated schedules, by identity, with a copy of every action list
_COMPILED: dict[int, tuple] = {}


def _compiled_for(schedule) -> tuple:
    """:func:`compile_schedule` of ``schedule``, reused while its actions and ``stage_to_rank`` are unchanged: each
    action list equal to the copy held with the compiled programs (a list compare, by identity first; an equal action
    compiles the same)."""
    lists = schedule.actions
    R = schedule.num_ranks
    held = _COMPILED.get(id(schedule))
    if (held is not None and held[0] is schedule and held[1] == (schedule.num_stages, R, schedule.stage_to_rank)
            and all(lists.get(r, []) == h for r, h in zip(range(R), held[2]))):
        return held[3]
    compiled = compile_schedule(schedule)
    if len(_COMPILED) >= 8:
        _COMPILED.pop(next(iter(_COMPILED)))
    _COMPILED[id(schedule)] = (schedule, (schedule.num_stages, R, dict(schedule.stage_to_rank)),
                               [list(lists.get(r, [])) for r in range(R)], compiled)
    return compiled


def _simulate(schedule, durations, p2p_latency, p2p_time, blocking_sends, comm, compiled=None, time_only=False):
    xfer = _transfer_fn(p2p_latency, p2p_time)
    s2r = schedule.stage_to_rank
    R = schedule.num_ranks
    ranks = range(R)
    programs, explicit_send, explicit_recv, plan = compiled if compiled is not None else _compiled_for(schedule)
    if plan is not None and not blocking_sends:  # the order is fixed: one pass (pipeline.linear)
        if time_only:
            run = run_linear(plan, R, durations, xfer)
            T = run.iteration_time()
            if comm:  # the extra collectives' ends, their actions found on the plan (no events made)
                T = max([T, *(end for *_, end, _ in _comm_tasks(comm, R, run.locate))])
            return T
        if plan.n >= ARRAY_TIMELINE_MIN_ACTIONS:
            run = run_linear(plan, R, durations, xfer, arrays=True)
            tasks = _comm_tasks(comm, R, run.locate) if comm else []
            if not any(x[3] in _P2P_NAMES for x in tasks):  # (a collective named as the transfers joins their lane)
                return _linear_timeline(schedule, run, R, tasks)
        events, preds, busy, act_deltas = run_linear(plan, R, durations, xfer, make_events=True)
        return _finish(schedule, events, preds, R, busy, act_deltas, comm, time_only)

    # ---- state ----------------------------------------------------------------------------
    done: dict[tuple, float] = {}  # ('F'|'G', stage, mb) -> end time of the producing action
    done_ev: dict[tuple, int] = {}  # -> its event index
    arrival: dict[tuple, float] = {}  # ('F'|'G', src_stage, mb) -> time the data is at the consumer
    arrival_ev: dict[tuple, int] = {}  # -> transfer event index (producer's if zero-time)
    send_post: dict[tuple, float] = {}
    recv_post: dict[tuple, float] = {}
    w_done: dict[tuple, list[int]] = {}  # waiters per key
    w_arr: dict[tuple, list[int]] = {}
    w_post: dict[tuple, list[int]] = {}
    post_implicit = blocking_sends and bool(explicit_send)
    events: list[Event] = []
    preds: list[int] = []  # event index -> event that set its start (-1 none)
    busy = [0.0] * R
    act_deltas: list[list[tuple[float, int]]] = [[] for _ in ranks]
    pc = [0] * R
    t_rank = [0.0] * R
    last_ev = [-1] * R
    reached = [-1] * R
    ready = list(ranks)
    in_ready = [True] * R
    inf = math.inf

    def wake(wdict: dict, key: tuple) -> None:
        for q in wdict.pop(key):
            if not in_ready[q]:
                in_ready[q] = True
                ready.append(q)

    def add_transfer(key: tuple, start: float, src: int, dst: int, pred: int) -> None:
        dt = xfer(src, dst)
        end = start + dt
        if dt > 0:
            kind = "RECV_F" if key[0] == "F" else "RECV_B"
            events.append(Event(s2r[dst], dst, key[2], kind, start, end, "comm", f"{dst}{kind}{key[2]}"))
            preds.append(pred)
            arrival_ev[key] = len(events) - 1
        else:
            arrival_ev[key] = pred
        arrival[key] = end
        if key in w_arr:
            wake(w_arr, key)

    arrival_get = arrival.get
    done_get = done.get
    ev_append = events.append
    pred_append = preds.append
    while ready:
        r = ready.pop()
        in_ready[r] = False
        prog = programs[r]
        n = len(prog)
        k = pc[r]
        t = t_rank[r]
        last = last_ev[r]
        acts_r = act_deltas[r]
        while k < n:
            op = prog[k]
            kind = op[0]
            if kind == _OP_COMPUTE:
                _, a, needs, produces, dur_key, ev_stage, ev_mb, typ, label, plus, minus = op
                if post_implicit and reached[r] != k:
                    reached[r] = k
                    for cross, key in needs:  # implicit receives are posted on reaching the consumer
                        if cross and key not in explicit_recv and key not in recv_post:
                            recv_post[key] = t
                            if key in w_post:
                                wake(w_post, key)
                start, pred = t, last
                blocked = None
                for cross, key in needs:
                    if cross:
                        v = arrival_get(key)
                        if v is None:
                            blocked = w_arr
                            break
                        if v > start or (v == start and pred == last):
                            start, pred = v, arrival_ev[key]
                    else:
                        v = done_get(key)
                        if v is None:
                            blocked = w_done
                            break
                        if v > start:
                            start, pred = v, done_ev[key]
                if blocked is not None:
                    blocked.setdefault(key, []).append(r)
                    break
                d = durations(*dur_key)
                if not 0.0 <= d < inf:
                    raise ScheduleError(f"durations{dur_key} returned {d!r}; allowed finite seconds >= 0")
                end = start + d
                ev_append(Event(r, ev_stage, ev_mb, typ, start, end, "compute", label))
                pred_append(pred)
                last = len(events) - 1
                t = end
                busy[r] += d
                if plus:
                    acts_r.append((start, plus))
                if minus:
                    acts_r.append((end, -minus))
                for key, dst in produces:
                    done[key] = end
                    done_ev[key] = last
                    if key in w_done:
                        wake(w_done, key)
                    if dst >= 0 and key not in explicit_send:
                        add_transfer(key, end, key[1], dst, last)
                k += 1
            elif kind == _OP_SEND:
                _, a, key, src, dst = op
                v = done_get(key)
                if v is None:
                    w_done.setdefault(key, []).append(r)
                    break
                post = t if t > v else v
                send_post.setdefault(key, post)
                if s2r[dst] == r:  # same-rank "send": nothing moves
                    k += 1
                    continue
                if blocking_sends:
                    rp = recv_post.get(key)
                    if rp is None:
                        w_post.setdefault(key, []).append(r)
                        break
                    if key not in arrival:
                        add_transfer(key, max(post, rp), src, dst, done_ev[key])
                    if arrival[key] > post:
                        t = arrival[key]
                        if arrival_ev[key] >= 0:
                            last = arrival_ev[key]
                    else:
                        t = post
                else:
                    if key not in arrival:
                        add_transfer(key, post, src, dst, done_ev[key])
                    t = post
                k += 1
            else:  # _OP_RECV
                _, a, key, src, dst = op
                if key not in recv_post:
                    recv_post[key] = t
                    if key in w_post:
                        wake(w_post, key)
                if s2r[src] == r or not blocking_sends:
                    k += 1  # non-blocking receive: the consumer waits for the data
                    continue
                v = arrival_get(key)
                if v is None:
                    w_arr.setdefault(key, []).append(r)
                    break
                if v > t:
                    t = v
                    last = arrival_ev[key]
                k += 1
        pc[r] = k
        t_rank[r] = t
        last_ev[r] = last

    if any(pc[r] < len(programs[r]) for r in ranks):
        stuck = {r: str(programs[r][pc[r]][1]) for r in ranks if pc[r] < len(programs[r])}
        detail = "; ".join(f"rank {r} waits at {a}" for r, a in sorted(stuck.items()))
        raise DeadlockError(
            f"deadlock in schedule {schedule.name!r}"
            + (" with blocking sends" if blocking_sends else "")
            + f": ranks {sorted(stuck)} cannot progress ({detail})",
            stuck,
        )

    return _finish(schedule, events, preds, R, busy, act_deltas, comm, time_only)


def _finish(schedule, events, preds, R, busy, act_deltas, comm, time_only):
    """Extra collectives on the comm lane, then the iteration time or the timeline."""
    if comm:
        _add_comm_tasks(comm, events, preds, R)
    if time_only:
        return max((e.end for e in events), default=0.0)
    return _build_timeline(schedule, events, preds, R, busy, act_deltas)


# ---- the engine for walks that decide step by step ------------------------------------------------------------


def action_inputs(a, num_stages: int, weight: bool = True) -> list[tuple[str, int, int, int]]:
    """The inputs of compute action ``a`` (each leaf of a pair) under the dependency rule of this module:
    ``(kind, producing stage, micro-batch, consuming stage)`` with kind ``"F"`` (a forward output) or ``"G"`` (an
    input gradient); a ``W`` leaf needs its stage's own ``G`` (left out with ``weight=False``)."""
    out = []
    for x in (a.sub_actions or (a,)):
        s, i, k = x.stage, x.microbatch, x.type
        if k is _F:
            if s > 0:
                out.append(("F", s - 1, i, s))
        elif k is _B or k is _I:
            out.append(("F", s, i, s))
            if s < num_stages - 1:
                out.append(("G", s + 1, i, s))
        elif k is _W and weight:
            out.append(("G", s, i, s))
    return out


class Walk:
    """The event engine's state for a walk over per-rank action lists whose steps a caller decides: each rank's
    clock (``clock[r]``, seconds), the inputs produced so far (``arrival[key]``: the time the input is at its
    consumer), the ranks parked on a missing input, and an agenda of ranks by clock (ties: lower rank first).

    Two drivers: :meth:`run` (each rank on its own lane; the policy hook ``step(r)`` runs the rank's next
    action(s) at its clock, calls :meth:`produce` for their outputs and :meth:`resume` or :meth:`park`; the
    dynamic controller's execution, :func:`tessera_lab.dynamic.online.execute`) and :meth:`run_shared` (ranks
    share processors; a resource model turns the number of ranks computing at once into their speed; the CPU
    testbed's processor sharing, :func:`tessera_lab.runner.testbed.sharing.simulate_shared`)."""

    __slots__ = ("clock", "arrival", "parked", "agenda")

    def __init__(self, num_ranks: int):
        self.clock = [0.0] * num_ranks
        self.arrival: dict[tuple, float] = {}
        self.parked: dict[tuple, list[int]] = {}
        self.agenda = [(0.0, r) for r in range(num_ranks)]

    def produce(self, key: tuple, when: float) -> None:
        """Input ``key`` is at its consumer at ``when``: the ranks parked on it are due again at their clocks."""
        self.arrival[key] = when
        for q in self.parked.pop(key, ()):
            heapq.heappush(self.agenda, (self.clock[q], q))

    def park(self, r: int, key: tuple) -> None:
        """Rank ``r`` waits for input ``key`` (due again when it is produced)."""
        self.parked.setdefault(key, []).append(r)

    def resume(self, r: int) -> None:
        """Rank ``r`` is due again at its clock (after the ranks due earlier: global time order)."""
        heapq.heappush(self.agenda, (self.clock[r], r))

    def run(self, step: Callable[[int], bool]) -> None:
        """Pop the rank due first, move its clock to that time and call the policy hook ``step(r)`` (again while it
        returns ``True``: the rank goes on at once), until no rank is due (all finished, or the rest parked: see
        :meth:`check_finished`)."""
        agenda, clock, pop = self.agenda, self.clock, heapq.heappop
        while agenda:
            t, r = pop(agenda)
            if t > clock[r]:
                clock[r] = t
            while step(r):
                pass

    @staticmethod
    def check_finished(name: str, lists: list, pc: list[int]) -> None:
        """Raise :class:`DeadlockError` (``stuck``: rank -> its next action) when a rank has actions left."""
        stuck = {r: str(lists[r][pc[r]]) for r in range(len(lists)) if pc[r] < len(lists[r])}
        if stuck:
            raise DeadlockError(f"deadlock in schedule {name!r}: ranks {sorted(stuck)} cannot progress", stuck)

    def run_shared(self, programs: list[list[tuple]], speed: Callable[[int, int], float],
                   spent: Callable[[float, int], None], p2p: float = 0.0) -> tuple[float, list[float]]:
        """Processor sharing: every rank runs ``programs[r]``, entries ``(needs, produces, work, latency)``
        (``needs``: ``(kind, stage, mb, cross)``; ``produces``: ``(kind, stage, mb)``; ``work`` seconds at speed 1
        then ``latency`` seconds blocked), each action once its inputs are available (``p2p`` seconds after their
        producer ended when ``cross``). The resource model ``speed(computing, waiting)`` gives the speed of each
        computing rank while ``computing`` ranks compute and ``waiting`` ranks wait or block; ``spent(dt,
        computing)`` is told each interval. Time advances to the next completion or arrival.

        Returns ``(iteration seconds, per-rank computing + blocked seconds)``.

        Raises:
            ConfigError: no rank can progress (an input never produced)."""
        R = len(programs)
        done = self.arrival
        pos = [0] * R
        state = ["idle"] * R  # idle (waiting for inputs) | cpu | block
        left = [0.0] * R  # remaining work (cpu) or blocked seconds (block)
        busy = [0.0] * R
        t = 0.0

        def ready(r: int) -> float | None:
            at = 0.0
            for kind, s, i, cross in programs[r][pos[r]][0]:
                if (kind, s, i) not in done:
                    return None
                at = max(at, done[(kind, s, i)] + (p2p if cross else 0.0))
            return at

        while True:
            pending = []
            for r in range(R):
                if state[r] == "idle" and pos[r] < len(programs[r]):
                    at = ready(r)
                    if at is not None and at <= t + 1e-15:
                        state[r], left[r] = "cpu", programs[r][pos[r]][2]
                    elif at is not None:
                        pending.append(at)
            if all(pos[r] >= len(programs[r]) for r in range(R)):
                break
            n_cpu = sum(1 for r in range(R) if state[r] == "cpu")
            n_wait = sum(1 for r in range(R) if state[r] != "cpu" and pos[r] < len(programs[r]))
            rate = speed(n_cpu, n_wait)
            dts = [left[r] / rate for r in range(R) if state[r] == "cpu"]
            dts += [left[r] for r in range(R) if state[r] == "block"]
            dts += [a - t for a in pending]
            if not dts:
                stuck = {r: pos[r] for r in range(R) if pos[r] < len(programs[r])}
                raise ConfigError(f"simulate_shared: no rank can progress (rank -> next action index: {stuck})")
            dt = max(0.0, min(dts))
            spent(dt, n_cpu)
            for r in range(R):
                if state[r] == "cpu":
                    left[r] -= rate * dt
                    busy[r] += dt
                elif state[r] == "block":
                    left[r] -= dt
                    busy[r] += dt
            t += dt
            for r in range(R):
                if state[r] == "cpu" and left[r] <= 1e-12:
                    d = programs[r][pos[r]][3]
                    state[r], left[r] = ("block", d) if d > 0 else ("end", 0.0)
                if state[r] == "block" and left[r] <= 1e-12:
                    state[r] = "end"
                if state[r] == "end":
                    for p in programs[r][pos[r]][1]:
                        done[p] = t
                    pos[r] += 1
                    state[r] = "idle"
        return t, busy
