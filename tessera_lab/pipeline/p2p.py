"""Point-to-point semantics of lowered schedules: batching (:func:`lowered_steps`, :func:`batch_p2p`) and the NCCL
rule (:func:`check_nccl_order`), shared by the simulator and the runner.

A *lowered* rank list holds compute actions and explicit ``SEND_*`` / ``RECV_*`` actions
(:func:`tessera_lab.pipeline.passes.with_comms`). The runtime issues every maximal run of consecutive
communication actions as **one batch** (one ``batch_isend_irecv``, i.e. one NCCL group), the way
``torch.distributed.pipelining``'s ``_batch_p2p`` fires a 1F1B step's forward send and backward receive together
and DualPipe commits its pending sends and receives before each compute.

The NCCL rule (what NCCL does and gloo does not):

* a rank's batches run one after another on its communication stream, in posting order; a batch completes when
  all its operations have completed, and the next one starts only then;
* the ``k``-th send from rank ``a`` to rank ``b`` is matched with the ``k``-th receive on ``b`` from ``a``
  (posting order per rank pair and direction); tags are ignored, so a send meets a receive of other data
  silently;
* an operation completes when both it and its partner are in the running batch of their ranks;
* a compute action waits for the batches holding its inputs' receives.

:func:`check_nccl_order` plays a schedule by these rules without durations and raises
:class:`~tessera_lab.errors.DeadlockError` (no rank can progress) or :class:`~tessera_lab.errors.ScheduleError` (a
send would be matched with a receive of other data, a compute reads data no receive brings). Never imports torch.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator, Sequence

from tessera_lab.errors import DeadlockError, ScheduleError
from tessera_lab.pipeline.actions import Action, ActionType
from tessera_lab.pipeline.walk import Walk, _deadlock

__all__ = ["comm_route", "lowered_steps", "check_nccl_order", "check_nccl_steps", "batch_p2p", "needs_cross_rank"]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_SEND = (ActionType.SEND_F, ActionType.SEND_B)


def comm_route(a: Action) -> tuple[tuple[str, int, int], int, int]:
    """``(key, src_stage, dst_stage)`` of a SEND/RECV action; ``key = ('F'|'G', producing stage, micro-batch)``
    (``'F'``: a forward output, ``'G'``: an input gradient)."""
    s, i, t = a.stage, a.microbatch, a.type
    if t is ActionType.SEND_F:
        return ("F", s, i), s, s + 1
    if t is ActionType.SEND_B:
        return ("G", s, i), s, s - 1
    if t is ActionType.RECV_F:
        return ("F", s - 1, i), s - 1, s
    if t is ActionType.RECV_B:
        return ("G", s + 1, i), s + 1, s
    raise ScheduleError(f"{a} is not a SEND/RECV action")


def needs_cross_rank(a: Action, s2r: dict[int, int], rank: int, num_stages: int) -> list[tuple[str, int, int]]:
    """Keys of the inputs of compute action ``a`` (pair: both leaves) produced on another rank."""
    out = []
    for x in a.leaves():
        s, i = x.stage, x.microbatch
        if x.type is _F and s > 0 and s2r[s - 1] != rank:
            out.append(("F", s - 1, i))
        elif x.type in (_B, _I) and s < num_stages - 1 and s2r[s + 1] != rank:
            out.append(("G", s + 1, i))
    return out


def lowered_steps(actions: Sequence[Action]) -> Iterator[tuple[str, int, tuple[Action, ...]]]:
    """A rank list as runtime steps: ``("compute", index, (action,))`` or ``("batch", index, comm_actions)`` for
    every maximal run of consecutive SEND/RECV actions (``index``: position of its first action)."""
    run: list[Action] = []
    start = 0
    for k, a in enumerate(actions):
        if a.is_comm:
            if not run:
                start = k
            run.append(a)
            continue
        if run:
            yield "batch", start, tuple(run)
            run = []
        yield "compute", k, (a,)
    if run:
        yield "batch", start, tuple(run)


def check_nccl_order(schedule) -> None:
    """Play a lowered ``schedule`` by the NCCL rule (module docstring); returns None when every rank finishes.

    Reads ``num_ranks``, ``num_stages``, ``stage_to_rank``, ``actions`` and ``name``. A compute-only list on more
    than one rank fails (its computes read data no receive brings): lower it first.

    Raises:
        DeadlockError: ranks cannot progress; ``stuck`` maps rank -> its next action (or running batch).
        ScheduleError: a send would be matched with a receive of other data; a compute reads cross-rank data
            without a receive posted before it; a SEND comes before its producer.
    """
    check_nccl_steps(schedule, {r: list(lowered_steps(schedule.actions.get(r, []))) for r in range(schedule.num_ranks)})


def check_nccl_steps(schedule, steps: dict[int, list[tuple[str, int, tuple[Action, ...]]]]) -> None:
    """:func:`check_nccl_order` on explicit runtime steps (``steps[rank]``: :func:`lowered_steps` items, where two
    batches may follow each other, as a runtime that posts every transfer in a batch of its own does). Reads the
    schedule's ``num_stages``, ``num_ranks``, ``stage_to_rank`` and ``name``; raises as :func:`check_nccl_order`.
    The play is a policy (:class:`_NcclReplay`) on the engine's walker (stack order)."""
    walk = Walk(schedule.num_ranks, by_clock=False)
    replay = _NcclReplay(walk, schedule, steps)
    walk.run(replay.step)
    stuck = replay.stuck()
    if stuck:
        raise _deadlock(getattr(schedule, "name", "?"), stuck, " under the NCCL p2p rule (batches in posting order, "
                        "matching in posting order per rank pair)")


class _NcclReplay:
    """The NCCL rule as a policy on the walker: each rank's host position ``pc`` and the keys it has
    ``produced``/``posted`` a receive for, its ``stream`` of posted batches (one at a time, in posting order),
    ``batches`` (batch id -> ops ``[direction, seq, key, done, action]``, and the count of its ops not yet matched),
    ``chan`` per rank pair ``(src, dst)``: its sends and receives as ``(batch, op)`` in posting order, and the
    ``complete`` batch ids. The hook :meth:`step` makes one move of a rank; a move another rank may wait on (a new
    batch at the head of a stream, an op matched) makes that rank due again."""

    def __init__(self, walk, schedule, steps: dict[int, list[tuple[str, int, tuple[Action, ...]]]]) -> None:
        self.resume, self.schedule, self.steps = walk.resume, schedule, steps
        self.S, self.R, self.s2r = schedule.num_stages, schedule.num_ranks, schedule.stage_to_rank
        self.pc = [0] * self.R
        self.produced: list[set] = [set() for _ in range(self.R)]
        self.posted: list[dict] = [{} for _ in range(self.R)]  # key -> batch id of its receive
        self.complete: set[int] = set()
        self.stream: list[deque] = [deque() for _ in range(self.R)]
        self.batches: list[list[list]] = []
        self.open: list[int] = []  # batch id -> its ops not yet matched
        self.chan: dict[tuple[int, int], tuple[list, list]] = {}

    def step(self, r: int) -> bool:
        """One move of rank ``r``: its next host step (post a batch, or run a compute whose receives are complete),
        else matching its oldest batch's ops with the peers' oldest batches. ``True``: it moved (the walker calls
        again at once)."""
        return self.host(r) or self.comm(r)

    def post(self, r: int, acts: tuple[Action, ...]) -> None:
        """Rank ``r`` posts one batch: its cross-rank ops join their rank pair's channel in order."""
        s2r, bid, ops = self.s2r, len(self.batches), []
        for a in acts:
            key, src, dst = comm_route(a)
            if src not in s2r or dst not in s2r:
                raise ScheduleError(f"{a} on rank {r}: stages {src} -> {dst} are not both in the schedule")
            a_rank, b_rank = s2r[src], s2r[dst]
            if a.type in _SEND:
                if key not in self.produced[r]:
                    raise ScheduleError(f"rank {r}: {a} comes before the action producing its data")
                if b_rank == r:
                    continue
                sends = self.chan.setdefault((r, b_rank), ([], []))[0]
                op = [(r, b_rank), len(sends), key, False, a]
                sends.append((bid, op))
            else:
                if a_rank == r:
                    continue
                recvs = self.chan.setdefault((a_rank, r), ([], []))[1]
                op = [(a_rank, r), len(recvs), key, False, a]
                recvs.append((bid, op))
                self.posted[r][key] = bid
            ops.append(op)
        self.batches.append(ops)
        self.open.append(len(ops))
        if not ops:
            self.complete.add(bid)
            return
        self.stream[r].append(bid)
        if len(self.stream[r]) == 1:
            self._wake_peers(ops)

    def _wake_peers(self, ops: list) -> None:
        """The peers of ``ops`` (a batch now at the head of its stream) are due again: they may match with it."""
        for op in ops:
            a, b = op[0]
            self.resume(a)
            self.resume(b)

    def host(self, r: int) -> bool:
        """Rank ``r``'s next host step, if it can run: a batch is posted, a compute runs once the batches holding
        its cross-rank inputs' receives are complete. ``False`` at the end or waiting."""
        steps, pc = self.steps[r], self.pc[r]
        if pc >= len(steps):
            return False
        kind, _, acts = steps[pc]
        if kind == "batch":
            self.post(r, acts)
        else:
            a, posted = acts[0], self.posted[r]
            for key in needs_cross_rank(a, self.s2r, r, self.S):
                if key not in posted:
                    raise ScheduleError(f"rank {r}: {a} reads {key[0]}{key[1:]} but no receive of it is posted "
                                        "before it (lower the schedule with with_comms)")
                if posted[key] not in self.complete:
                    return False
            for x in a.leaves():
                if x.type is _F:
                    self.produced[r].add(("F", x.stage, x.microbatch))
                elif x.type in (_B, _I):
                    self.produced[r].add(("G", x.stage, x.microbatch))
        self.pc[r] = pc + 1
        return True

    def comm(self, r: int) -> bool:
        """Match the ops of rank ``r``'s oldest batch with the peer ops at the head of their peers' streams (each
        match makes the peer due again); ``True`` when that batch completed (the next one is then the head)."""
        stream, batches = self.stream, self.batches
        if not stream[r]:
            return False
        bid = stream[r][0]
        for op in batches[bid]:
            if op[3]:
                continue
            direction, seq = op[0], op[1]
            sends, recvs = self.chan[direction]
            is_send = op[4].type in _SEND
            other = recvs if is_send else sends
            if seq >= len(other):
                continue
            obid, oop = other[seq]
            peer = direction[1] if is_send else direction[0]
            if not stream[peer] or stream[peer][0] != obid:
                continue
            if oop[2] != op[2]:
                snd, rcv = (op, oop) if is_send else (oop, op)
                raise ScheduleError(
                    f"NCCL order mismatch in schedule {getattr(self.schedule, 'name', '?')!r}: send #{seq} from "
                    f"rank {direction[0]} to rank {direction[1]} ({snd[4]}) would be matched with {rcv[4]} "
                    "(NCCL matches a rank pair's p2p in posting order and ignores tags)")
            op[3] = oop[3] = True
            self.open[bid] -= 1
            self.open[obid] -= 1
            self.resume(peer)
        if self.open[bid]:
            return False
        stream[r].popleft()
        self.complete.add(bid)
        if stream[r]:
            self._wake_peers(batches[stream[r][0]])
        return True

    def stuck(self) -> dict[int, str]:
        """Rank -> where it waits (its running batch's unmatched ops, or its next step) for every rank that did not
        finish; empty when all finished."""
        stuck = {}
        for r in range(self.R):
            if self.stream[r]:
                stuck[r] = "[" + " ".join(str(op[4]) for op in self.batches[self.stream[r][0]] if not op[3]) + "]"
            elif self.pc[r] < len(self.steps[r]):
                stuck[r] = str(self.steps[r][self.pc[r]][2][0])
        return stuck


def batch_p2p(schedule):
    """The runtime lowering of a schedule lowered by ``with_comms``: every receive moved to the communication run
    just before the first compute action that reads it, so a rank's sends after one compute and its receives for
    the next form one batch (:func:`lowered_steps`), as in torch's Schedule1F1B and DualPipe. If that order would
    deadlock under the NCCL rule, ``with_comms``' placement (a global sweep: every rank pair sees its transfers in
    one order, so it is NCCL-safe) is kept. ``meta['p2p']`` says which (``"batched"`` or ``"sweep"``).

    Returns a new :class:`~tessera_lab.pipeline.schedules.Schedule`.

    Raises:
        ScheduleError / DeadlockError: neither order passes :func:`check_nccl_order`.
    """
    Schedule = type(schedule)  # the IR class (this module is below the IR: the simulator imports it)
    S, s2r = schedule.num_stages, schedule.stage_to_rank
    lists: dict[int, list[Action]] = {}
    for r, acts in schedule.actions.items():
        recv_of = {comm_route(a)[0]: a for a in acts if a.type in (ActionType.RECV_F, ActionType.RECV_B)}
        out: list[Action] = []
        for a in acts:
            if a.type in (ActionType.RECV_F, ActionType.RECV_B):
                key, src, _ = comm_route(a)
                if s2r.get(src) == r:
                    out.append(a)  # a same-rank receive moves nothing: keep it where it is
                continue
            if not a.is_comm:
                out.extend(recv_of.pop(k) for k in needs_cross_rank(a, s2r, r, S) if k in recv_of)
            out.append(a)
        out.extend(recv_of.values())
        lists[r] = out
    meta = dict(schedule.meta)
    cand = Schedule(schedule.name, schedule.num_ranks, S, schedule.num_microbatches, lists, dict(s2r),
                    {**meta, "p2p": "batched"})
    try:
        check_nccl_order(cand)
        return cand
    except (DeadlockError, ScheduleError):
        pass
    kept = Schedule(schedule.name, schedule.num_ranks, S, schedule.num_microbatches,
                    {r: list(v) for r, v in schedule.actions.items()}, dict(s2r), {**meta, "p2p": "sweep"})
    check_nccl_order(kept)
    return kept
