"""The event engine: every walk over per-rank action lists runs on its walker.

* :class:`~tessera_lab.pipeline.walk.Walk` (:mod:`tessera_lab.pipeline.walk`, re-exported here): the one walker. It holds each rank's clock, the inputs produced, the ranks parked on a missing
  input and an agenda of due ranks with a tie order; its driver calls a policy hook per due rank (and a resource
  model's ``advance`` when none is due). Its policies: the simulation's event loop (:class:`_EventLoop`, explicit
  SEND/RECV as hooks), the dynamic controller's step-by-step execution (:func:`tessera_lab.dynamic.online.execute`)
  processor sharing (:meth:`Walk.run_shared`, the CPU testbed's
  :func:`tessera_lab.runner.testbed.sharing.simulate_shared`), zb-auto's candidate replay (:meth:`Walk.replay`) and
  the NCCL posting-order check (:func:`tessera_lab.pipeline.p2p.check_nccl_order`), all under one dependency rule
  (:func:`action_inputs`).
* :func:`simulate`: discrete-event simulation of pipeline schedules, producing a
  :class:`~tessera_lab.pipeline.timeline.Timeline` (model below), in phases: compile each rank's actions to ops
  (:mod:`tessera_lab.pipeline.programs`), walk them with the event loop, then lay out the extra collectives and build
  the timeline. Where the order of execution cannot depend on the times (no explicit SEND/RECV), the event loop's
  order is recorded on a schedule's first simulation and later simulations of the same schedule run its compiled
  form, a linear pass over that order (:mod:`tessera_lab.pipeline.linear`: the same timeline, bit for bit); a
  one-shot simulation compiles and runs the event loop alone and holds nothing but that order.

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
from typing import Callable, Iterable

from tessera_lab.errors import DeadlockError, ScheduleError
from tessera_lab.pipeline.durations import Durations, _transfer_fn
from tessera_lab.pipeline.linear import run_linear
from tessera_lab.pipeline.programs import (ACTIVATION_CHANGE, _OP_COMPUTE, _OP_SEND, _compile_programs, _held_for,
                                          action_inputs, action_outputs, pack_trace)
from tessera_lab.pipeline.walk import Walk, _deadlock
from tessera_lab.pipeline.timeline import (P2P_COLLECTIVE, Event, Timeline, _add_comm_tasks, _build_timeline,
                                          _comm_tasks, _linear_timeline, serial_lanes)

__all__ = ["compile_schedule", "simulate", "Walk", "action_inputs", "action_outputs", "ACTIVATION_CHANGE", "serial_lanes"]


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
    """The schedule's per-rank programs as the event loop reads them, with the fast path's plan where the order of
    execution cannot depend on the times (a pure function of the schedule's actions and ``stage_to_rank``): pass it
    back as ``simulate(..., compiled=...)`` to simulate the same, unchanged schedule again under other durations
    without compiling it again. The plan is the event loop's own order, recorded on one run at zero times
    (:func:`tessera_lab.pipeline.linear.pack_trace`); ``None`` with explicit SEND/RECV actions or a deadlock."""
    programs, explicit_send, explicit_recv = _compile_programs(schedule)
    plan = None
    if not (explicit_send or explicit_recv):
        loop = _EventLoop(programs, schedule.stage_to_rank, lambda src, dst: 0.0, lambda s, i, k: 0.0, False,
                          explicit_send, explicit_recv)
        loop.run()
        if loop.finished():
            plan = pack_trace(programs, schedule.stage_to_rank, loop.order)
    return programs, explicit_send, explicit_recv, plan


_P2P_NAMES = frozenset({P2P_COLLECTIVE, "RECV_F", "RECV_B"})

#: from this many actions up the linear pass's timeline is analysed on numpy arrays (below, numpy's per-call cost
#: exceeds the work: the event list is made and analysed in Python); both give the same timeline
ARRAY_TIMELINE_MIN_ACTIONS = 1024


def _simulate(schedule, durations, p2p_latency, p2p_time, blocking_sends, comm, compiled=None, time_only=False):
    """One simulation in three phases: compile (or reuse) the programs; walk them, by the fast path's packed order
    when there is one (:func:`_linear`) or the event loop; then the extra collectives and the timeline."""
    xfer = _transfer_fn(p2p_latency, p2p_time)
    R = schedule.num_ranks
    held = None
    if compiled is None:
        held = _held_for(schedule)
        compiled = held.compiled()
    programs, explicit_send, explicit_recv, plan = compiled
    if plan is not None and not blocking_sends:  # the order is fixed: one pass (pipeline.linear)
        return _linear(schedule, plan, R, durations, xfer, comm, time_only)
    loop = _EventLoop(programs, schedule.stage_to_rank, xfer, durations, blocking_sends, explicit_send, explicit_recv)
    loop.run()
    if not loop.finished():
        raise loop.deadlock(schedule.name)
    if held is not None and plan is None and not (explicit_send or explicit_recv):
        held.order = loop.order  # the next simulation of this schedule takes the fast path
    return _finish(schedule, loop.events, loop.preds, R, loop.busy, loop.act_deltas, comm, time_only)


def _linear(schedule, plan, R, durations, xfer, comm, time_only):
    """The fast path: one pass over the packed order (:func:`tessera_lab.pipeline.linear.run_linear`)."""
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


class _EventLoop:
    """The simulation's policy on the walker (:class:`Walk`, stack tie order): each rank runs its compiled program
    until an input is missing; it then parks on that input's key and is due again when it is produced or arrives.
    The walker holds the ranks' clocks (``clock``), the cross-rank inputs at their consumer (``arrival``), the ranks
    parked on one (``parked``) and the agenda; beside it: ``done`` (key -> end time of the producing action, read
    on its rank), the event indices that set them, posted sends and receives (the explicit p2p hooks :meth:`send`
    and :meth:`recv`), the events with their predecessors, per-rank busy time and activation deltas, and ``order``
    (the rank of each compute action run, in run order: the fast path's plan,
    :func:`tessera_lab.pipeline.linear.pack_trace`)."""

    def __init__(self, programs, s2r, xfer, durations, blocking_sends, explicit_send, explicit_recv):
        R = len(programs)
        self.programs, self.s2r, self.xfer, self.durations = programs, s2r, xfer, durations
        self.blocking, self.explicit_send, self.explicit_recv = blocking_sends, explicit_send, explicit_recv
        self.walk = walk = Walk(R, by_clock=False)
        self.done: dict[tuple, float] = {}  # ('F'|'G', stage, mb) -> end time of the producing action
        self.done_ev: dict[tuple, int] = {}  # -> its event index
        self.arrival: dict[tuple, float] = walk.arrival  # ('F'|'G', src_stage, mb) -> time the data is at the consumer
        self.arrival_ev: dict[tuple, int] = {}  # -> transfer event index (producer's if zero-time)
        self.send_post: dict[tuple, float] = {}
        self.recv_post: dict[tuple, float] = {}
        self.w_done: dict[tuple, list[int]] = {}  # ranks parked per key: on a local input, an arrival, a posted recv
        self.w_arr: dict[tuple, list[int]] = walk.parked
        self.w_post: dict[tuple, list[int]] = {}
        self.events: list[Event] = []
        self.preds: list[int] = []  # event index -> event that set its start (-1 none)
        self.busy = [0.0] * R
        self.act_deltas: list[list[tuple[float, int]]] = [[] for _ in range(R)]
        self.pc, self.t_rank, self.last_ev, self.reached = [0] * R, walk.clock, [-1] * R, [-1] * R
        self.order: list[int] = []
        self.add_transfer = self._transfer_maker()

    def _transfer_maker(self) -> Callable[[tuple, float, int, int, int], None]:
        """``add_transfer(key, start, src, dst, pred)``: the transfer of ``key`` from stage ``src`` to ``dst``'s rank,
        started at ``start``: its arrival (an event when it takes time) and the ranks parked on it due."""
        xfer, s2r, events, preds, arrival, arrival_ev = (self.xfer, self.s2r, self.events, self.preds, self.arrival,
                                                         self.arrival_ev)
        w_arr, wake = self.w_arr, self.walk.waker()

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
                wake(key)

        return add_transfer

    def run(self) -> None:
        """Walk until no rank is due (all finished, or the rest parked: :meth:`finished`)."""
        self.walk.run(self._stepper())

    def _stepper(self) -> Callable[[int], bool]:
        """The policy hook ``step(r)``: run rank ``r``'s program from its position until an input is missing. A
        compute op starts at the later of the rank's clock and its inputs (``done`` on the rank, ``arrival`` from
        another rank; a missing one parks the rank on its key), runs ``durations(*key)`` seconds and produces its
        outputs (the ranks parked on them due, transfers to other ranks started); SEND/RECV ops are the explicit p2p
        hooks :meth:`send` and :meth:`recv`. The compute step is inlined: it runs once per action of every
        simulation."""
        programs, order_append, pc, t_rank, last_ev = self.programs, self.order.append, self.pc, self.t_rank, self.last_ev
        done, done_ev, arrival, arrival_ev = self.done, self.done_ev, self.arrival, self.arrival_ev
        w_done, w_arr, wake_done, add_transfer = self.w_done, self.w_arr, self.walk.waker(self.w_done), self.add_transfer
        events, preds, busy, durations, explicit_send = self.events, self.preds, self.busy, self.durations, \
            self.explicit_send
        post_implicit, act_deltas, send, recv = self.blocking and bool(explicit_send), self.act_deltas, self.send, \
            self.recv
        arrival_get, done_get, ev_append, pred_append, inf = arrival.get, done.get, events.append, preds.append, math.inf

        def step(r: int) -> bool:
            prog = programs[r]
            n, k, t, last, acts_r = len(prog), pc[r], t_rank[r], last_ev[r], act_deltas[r]
            while k < n:
                op = prog[k]
                if op[0] != _OP_COMPUTE:
                    got = (send if op[0] == _OP_SEND else recv)(r, op, t, last)
                    if got is None:
                        break
                    t, last = got
                    k += 1
                    continue
                _, a, needs, produces, dur_key, ev_stage, ev_mb, typ, label, plus, minus = op
                if post_implicit and self.reached[r] != k:
                    self.reached[r] = k
                    self.post_receives(needs, t)
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
                    blocked.setdefault(key, []).append(r)  # parked on the missing input
                    break
                d = durations(*dur_key)
                if not 0.0 <= d < inf:
                    raise ScheduleError(f"durations{dur_key} returned {d!r}; allowed finite seconds >= 0")
                end = start + d
                ev_append(Event(r, ev_stage, ev_mb, typ, start, end, "compute", label))
                pred_append(pred)
                order_append(r)
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
                        wake_done(key)
                    if dst >= 0 and key not in explicit_send:
                        add_transfer(key, end, key[1], dst, last)
                k += 1
            pc[r], t_rank[r], last_ev[r] = k, t, last
            return False

        return step

    def post_receives(self, needs: tuple, t: float) -> None:
        """With blocking sends, the implicit receives of a compute op's inputs from other ranks are posted when its
        rank reaches it (at ``t``)."""
        for cross, key in needs:
            if cross and key not in self.explicit_recv and key not in self.recv_post:
                self.recv_post[key] = t
                if key in self.w_post:
                    self.walk.wake(key, self.w_post)

    def send(self, r: int, op: tuple, t: float, last: int) -> tuple[float, int] | None:
        """An explicit send: posted when the rank reaches it; with blocking sends a rendezvous with the receive."""
        _, a, key, src, dst = op
        v = self.done.get(key)
        if v is None:
            self.w_done.setdefault(key, []).append(r)
            return None
        post = t if t > v else v
        self.send_post.setdefault(key, post)
        if self.s2r[dst] == r:  # same-rank "send": nothing moves
            return t, last
        if not self.blocking:
            if key not in self.arrival:
                self.add_transfer(key, post, src, dst, self.done_ev[key])
            return post, last
        rp = self.recv_post.get(key)
        if rp is None:
            self.w_post.setdefault(key, []).append(r)
            return None
        if key not in self.arrival:
            self.add_transfer(key, max(post, rp), src, dst, self.done_ev[key])
        if self.arrival[key] > post:
            ev = self.arrival_ev[key]
            return self.arrival[key], (ev if ev >= 0 else last)
        return post, last

    def recv(self, r: int, op: tuple, t: float, last: int) -> tuple[float, int] | None:
        """An explicit receive: posted when reached; it blocks until the data arrives only with blocking sends."""
        _, a, key, src, dst = op
        if key not in self.recv_post:
            self.recv_post[key] = t
            if key in self.w_post:
                self.walk.wake(key, self.w_post)
        if self.s2r[src] == r or not self.blocking:
            return t, last  # non-blocking receive: the consumer waits for the data
        v = self.arrival.get(key)
        if v is None:
            self.w_arr.setdefault(key, []).append(r)
            return None
        if v > t:
            return v, self.arrival_ev[key]
        return t, last

    def finished(self) -> bool:
        return all(self.pc[r] >= len(p) for r, p in enumerate(self.programs))

    def deadlock(self, name: str) -> DeadlockError:
        """The error naming each stuck rank and its next action."""
        programs, pc = self.programs, self.pc
        stuck = {r: str(programs[r][pc[r]][1]) for r in range(len(programs)) if pc[r] < len(programs[r])}
        return _deadlock(name, stuck, " with blocking sends" if self.blocking else "")


def _finish(schedule, events, preds, R, busy, act_deltas, comm, time_only):
    """Extra collectives on the comm lane, then the iteration time or the timeline."""
    if comm:
        _add_comm_tasks(comm, events, preds, R)
    if time_only:
        return max((e.end for e in events), default=0.0)
    return _build_timeline(schedule, events, preds, R, busy, act_deltas)
