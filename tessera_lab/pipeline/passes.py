"""Schedule passes: pure ``Schedule -> Schedule`` functions, in one place for the planner, simulator, runner and
dynamic optimizer (modelled on torch.distributed.pipelining's lowering passes and sail-sg's zero-bubble
``scheduler/passes.py``).

* :func:`with_comms`: explicit SEND/RECV actions, placed as torch's ``_add_send_recv`` places them.
* :func:`lower`: the runtime's action lists: :func:`with_comms`, then the p2p batching pass
  (:func:`tessera_lab.pipeline.p2p.batch_p2p`), checked by the NCCL rule.
* :func:`split_backward`: every full backward ``B`` (also inside overlapped ``(F;B)`` pairs, as in ``overlapped``
  and DualPipeV) becomes ``I`` (input gradient, where ``B`` was) and a deferrable ``W`` placed ``w_lag``
  micro-batches later (``0``: right after its ``I``; ``None``: at the end of the rank's list).
* :func:`chunk_weight_gradients`: every ``W`` as ``chunks`` consecutive parts (finer deferrable work fits
  shorter gaps; simulate with durations that divide W, e.g. ``tessera_lab.dynamic.durations.ChunkedDurations``).
* :func:`defer_weight_gradients`: every ``W`` as late as a memory cap of live micro-batch activations per rank
  allows (:func:`memory_caps`).
* :func:`fill_gaps`: ``W`` pulled back into the idle gaps (:func:`idle_gaps`) of a simulated order, optionally
  using each action's slack (:func:`action_slack`); never lengthens the simulated iteration.

Every pass returns a new, validated :class:`~tessera_lab.pipeline.schedules.Schedule` and raises
:class:`~tessera_lab.errors.ScheduleError` when the result is not executable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tessera_lab.errors import ConfigError, ScheduleError
from tessera_lab.pipeline.schedules import Action, ActionType, Schedule, parse_action
from tessera_lab.pipeline.p2p import batch_p2p, check_nccl_order
from tessera_lab.pipeline.simulate import Timeline, _transfer_fn, simulate

__all__ = ["with_comms", "lower", "split_backward", "chunk_weight_gradients", "defer_weight_gradients", "memory_caps",
           "order_peak", "LiveActivations", "Gap", "idle_gaps", "action_slack", "fill_gaps", "GRAD_RS"]

_F, _B, _I, _W, _OV = ActionType.F, ActionType.B, ActionType.I, ActionType.W, ActionType.OVERLAP_F_B
#: name of the per-stage data-parallel gradient reduce-scatter task on the communication lane
GRAD_RS = "grad_reduce_scatter"


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


def lower(schedule: Schedule) -> Schedule:
    """The action lists the runtime executes: compute-only ``schedule`` lowered by :func:`with_comms` and
    batched by :func:`~tessera_lab.pipeline.p2p.batch_p2p` (each maximal run of SEND/RECV actions is one
    ``batch_isend_irecv``); a schedule that already has SEND/RECV actions is only checked.

    Raises:
        ScheduleError / DeadlockError: the lists cannot run under the NCCL p2p rule
            (:func:`~tessera_lab.pipeline.p2p.check_nccl_order`).
    """
    if any(a.is_comm for acts in schedule.actions.values() for a in acts):
        check_nccl_order(schedule)
        return schedule
    return batch_p2p(with_comms(schedule))


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


@dataclass(frozen=True)
class Gap:
    """An idle interval of one rank's compute lane (seconds).

    Attributes:
        rank: pipeline rank.
        start, end: seconds from the start of the iteration.
        before: label of the compute action that ends the gap (``None``: the iteration's tail).
    """

    rank: int
    start: float
    end: float
    before: str | None

    @property
    def length(self) -> float:
        return self.end - self.start

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "start": self.start, "end": self.end, "length": self.length, "before": self.before}


def idle_gaps(timeline: Timeline, *, min_length: float = 0.0, tail: bool = True) -> dict[int, list[Gap]]:
    """Each rank's idle gaps in time order, ``{rank: [Gap, ...]}``.

    A gap is a stretch of the iteration ``[0, iteration_time]`` where the rank's compute lane is idle (the
    head before its first action included; the tail after its last action when ``tail``). Gaps no longer
    than ``min_length`` seconds are left out. The lengths of all gaps (with the tail) add up to the rank's
    ``per_rank_idle``.
    """
    R = timeline.num_ranks or (1 + max((e.rank for e in timeline.events), default=-1))
    by_rank: dict[int, list] = {r: [] for r in range(R)}
    for e in timeline.events:
        if e.lane == "compute":
            by_rank[e.rank].append(e)
    T = timeline.iteration_time
    out: dict[int, list[Gap]] = {}
    for r in range(R):
        evs = sorted(by_rank[r], key=lambda e: (e.start, e.end))
        gaps, cur = [], 0.0
        for e in evs:
            if e.start - cur > min_length and e.start > cur:
                gaps.append(Gap(r, cur, e.start, e.label))
            cur = max(cur, e.end)
        if tail and T - cur > min_length and T > cur:
            gaps.append(Gap(r, cur, T, None))
        out[r] = gaps
    return out


class LiveActivations:
    """Live micro-batch activations on one rank while walking an order: +1 at a forward, -1 when the
    backward of that micro-batch is complete (a B, or the last of the ``chunks`` W parts of a split one)."""

    def __init__(self, chunks: int = 1):
        self.chunks = chunks
        self.left: dict[tuple[int, int], int] = {}
        self.live = 0
        self.peak = 0

    def add(self, a: Action) -> None:
        for x in a.leaves():  # a pair starts its F before its backward frees anything
            if x.type is _F:
                self.live += 1
                self.peak = max(self.peak, self.live)
        for x in a.leaves():
            if x.type is _B:
                self.live -= 1
            elif x.type is _W:
                key = (x.stage, x.microbatch)
                n = self.left.get(key, self.chunks) - 1
                self.left[key] = n
                if n == 0:
                    self.live -= 1


def order_peak(acts: Sequence[Action], chunks: int = 1) -> int:
    """Most live micro-batch activations while walking one rank's order (``chunks`` W parts free one)."""
    live = LiveActivations(chunks)
    for a in acts:
        live.add(a)
    return live.peak


def chunk_weight_gradients(schedule: Schedule, chunks: int) -> Schedule:
    """Each W action replaced by ``chunks`` consecutive W parts (same label), to be simulated with
    durations that divide W by ``chunks`` (``tessera_lab.dynamic.durations.ChunkedDurations``). Finer deferrable work fits smaller gaps:
    Tessera defers per-layer weight-gradient tasks, not a stage's whole W."""
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise ConfigError(f"field 'w_chunks' = {chunks!r} is out of range; allowed: an integer >= 1")
    if chunks == 1:
        return schedule
    lists = {r: [y for a in acts for y in ([a] * chunks if a.type is _W else [a])] for r, acts in schedule.actions.items()}
    return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches, lists,
                    dict(schedule.stage_to_rank), {**schedule.meta, "w_chunks": chunks})


def memory_caps(schedule: Schedule, memory_cap: int | Sequence[int] | str | None = "max", *,
                activation_bytes: Sequence[float] | None = None, chunks: int = 1) -> list[int]:
    """Live micro-batch activations allowed per rank.

    Args:
        schedule: the static order the caps are measured on.
        memory_cap: ``"rank"`` (or ``None``): each rank's own peak in the static order, so no rank ever
            needs more activation memory than in the static plan; ``"max"`` (default): the most activation
            memory the static plan needs on any rank, in bytes, allowed on every rank (GPUs are provisioned
            for the worst rank; 1F1B's later ranks have that headroom): ``floor(max_r' peak_r' a_r' / a_r)``;
            ``"max+K"``: that plus ``K`` micro-batches on every rank (memory bought for deferral); an int (the same count on every rank) or one int per rank.
        activation_bytes: activation bytes per micro-batch of each stage (default: equal); a rank holding
            several stages uses their mean.
        chunks: W parts per micro-batch in ``schedule``.

    Raises:
        ConfigError: an unknown policy, a wrong-length list or a cap below 1.
    """
    R = schedule.num_ranks
    if memory_cap is None or memory_cap == "rank":
        return [max(1, order_peak(schedule.actions.get(r, []), chunks)) for r in range(R)]
    if isinstance(memory_cap, str) and memory_cap.startswith("max+"):
        try:
            extra = int(memory_cap[4:])
        except ValueError:
            extra = -1
        if extra < 0:
            raise ConfigError(f"field 'memory_cap' = {memory_cap!r} is unknown; allowed: 'max', 'max+K' (K >= 0), "
                              "'rank', an integer >= 1 or one integer per rank")
        return [c + extra for c in memory_caps(schedule, "max", activation_bytes=activation_bytes, chunks=chunks)]
    if memory_cap == "max":
        peaks = [order_peak(schedule.actions.get(r, []), chunks) for r in range(R)]
        if activation_bytes is None:
            act = [1.0] * R
        else:
            if len(activation_bytes) != schedule.num_stages:
                raise ConfigError(f"field 'activation_bytes' has {len(activation_bytes)} entries; allowed: one per "
                                  f"stage ({schedule.num_stages})")
            act = []
            for r in range(R):
                st = [s for s, rr in schedule.stage_to_rank.items() if rr == r]
                act.append(float(np.mean([activation_bytes[s] for s in st])) if st else 1.0)
        budget = max(p * a for p, a in zip(peaks, act))
        return [max(peaks[r], int(math.floor(budget / act[r] * (1 + 1e-9)))) if act[r] > 0 else peaks[r]
                for r in range(R)]
    if isinstance(memory_cap, str):
        raise ConfigError(f"field 'memory_cap' = {memory_cap!r} is unknown; allowed: 'max', 'max+K', 'rank', an "
                          "integer >= 1 or one integer per rank")
    if isinstance(memory_cap, (int, np.integer)) and not isinstance(memory_cap, bool):
        caps = [int(memory_cap)] * R
    else:
        caps = [int(c) for c in memory_cap]
        if len(caps) != R:
            raise ConfigError(f"field 'memory_cap' has {len(caps)} entries; allowed: one per rank ({R})")
    if any(c < 1 for c in caps):
        raise ConfigError(f"field 'memory_cap' = {memory_cap!r} is out of range; allowed: micro-batches >= 1 per rank")
    return caps


def defer_weight_gradients(schedule: Schedule, memory_cap: int | Sequence[int] | str | None = "rank", *,
                           w_chunks: int = 1) -> Schedule | None:
    """Move every W as late as the memory cap allows (W tasks go last; a W runs earlier only when the next
    forward would exceed the cap of live micro-batch activations on its rank).

    Args:
        schedule: a split schedule (I and W actions).
        memory_cap: live micro-batches per rank (a policy or counts, see :func:`memory_caps`); default
            ``"rank"``: each rank's peak in the given order, so the result never needs more activation
            memory than the input.
        w_chunks: W parts per micro-batch in ``schedule`` (:func:`chunk_weight_gradients`); a micro-batch's
            activations are freed by its last part.

    Returns:
        the deferred schedule, or ``None`` if a rank cannot meet its cap (fewer pending W tasks than needed).
    """
    caps = memory_caps(schedule, memory_cap, chunks=w_chunks)
    lists: dict[int, list[Action]] = {}
    for r in range(schedule.num_ranks):
        acts = schedule.actions.get(r, [])
        pending: list[Action] = []  # oldest I first; each stands for its w_chunks W parts
        out: list[Action] = []
        live = LiveActivations(w_chunks)
        for a in acts:
            if a.type is _W:
                continue
            if any(x.type is _F for x in a.leaves()):
                while live.live + 1 > caps[r] and pending:
                    wa = pending.pop(0)
                    for _ in range(w_chunks):
                        out.append(wa)
                        live.add(wa)
                if live.live + 1 > caps[r]:
                    return None
            out.append(a)
            live.add(a)
            for x in a.leaves():
                if x.type is _I:
                    pending.append(Action(x.stage, _W, x.microbatch))
        out.extend(wa for wa in pending for _ in range(w_chunks))
        lists[r] = out
    return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches, lists,
                    dict(schedule.stage_to_rank), {**schedule.meta, "w_deferred": True})


def action_slack(timeline: Timeline, schedule: Schedule, *, p2p_latency: float = 0.0,
                 p2p_time: float | Callable[[int, int], float] | None = None) -> dict[int, float]:
    """Slack of every compute event (seconds): how much later it could start without making the iteration
    longer, with the ranks' orders fixed (critical-path method over the timeline's events).

    Edges (an overlapped pair counts as its forward and its backward): consecutive actions of a rank; ``F(s, i) -> F(s+1, i)`` and ``I|B(s+1, i) -> I|B(s, i)`` with the
    transfer time between ranks; ``F(s, i) -> I|B(s, i)``; ``I(s, i) -> W(s, i)``; a gradient reduce-scatter
    after its W. Returns ``{event index: slack}`` (0 on the critical path).
    """
    xfer = _transfer_fn(p2p_latency, p2p_time)
    s2r = schedule.stage_to_rank
    ev = timeline.events
    T = timeline.iteration_time
    prod: dict[tuple[str, int, int], int] = {}
    ws: dict[tuple[int, int], list[int]] = {}
    last_w: dict[int, int] = {}
    by_rank: dict[int, list[int]] = {}
    leaves: dict[int, list[tuple[str, int, int]]] = {}  # event -> (type, stage, mb) of the actions it runs
    for n, e in enumerate(ev):
        if e.lane != "compute":
            continue
        by_rank.setdefault(e.rank, []).append(n)
        if e.type == _OV.value:  # an overlapped pair runs a forward and a backward
            leaves[n] = [(str(x.type), x.stage, x.microbatch) for x in parse_action(e.label).leaves()]
        else:
            leaves[n] = [(e.type, e.stage, e.microbatch)]
        for typ, st, mb in leaves[n]:
            if typ == "F":
                prod[("F", st, mb)] = n
            elif typ in ("I", "B"):
                prod[("G", st, mb)] = n
        if e.type == "W":
            ws.setdefault((e.stage, e.microbatch), []).append(n)
        if e.type in ("W", "B"):
            last_w[e.stage] = n if e.stage not in last_w or ev[last_w[e.stage]].end <= e.end else last_w[e.stage]
    succ: dict[int, list[tuple[int, float]]] = {}

    def edge(u: int | None, v: int, lag: float) -> None:
        if u is not None and u != v:
            succ.setdefault(u, []).append((v, lag))

    for r, idx in by_rank.items():
        idx.sort(key=lambda n: (ev[n].start, n))
        for u, v in zip(idx, idx[1:]):
            edge(u, v, 0.0)
    S = schedule.num_stages
    for n, e in enumerate(ev):
        if e.lane != "compute":
            if e.type == GRAD_RS and e.stage in last_w:
                edge(last_w[e.stage], n, 0.0)
            continue
        for typ, s, i in leaves[n]:
            if typ == "F" and s > 0:
                edge(prod.get(("F", s - 1, i)), n, xfer(s - 1, s) if s2r[s - 1] != s2r[s] else 0.0)
            elif typ in ("I", "B"):
                edge(prod.get(("F", s, i)), n, 0.0)
                if s < S - 1:
                    edge(prod.get(("G", s + 1, i)), n, xfer(s + 1, s) if s2r[s + 1] != s2r[s] else 0.0)
            elif typ == "W":
                edge(prod.get(("G", s, i)), n, 0.0)
    lf = [T] * len(ev)
    for n in range(len(ev) - 1, -1, -1):  # events are appended in a topological order
        for v, lag in succ.get(n, ()):
            lf[n] = min(lf[n], lf[v] - (ev[v].end - ev[v].start) - lag)
    return {n: max(0.0, lf[n] - ev[n].end) for n, e in enumerate(ev) if e.lane == "compute"}


def _fill_pass(schedule: Schedule, timeline: Timeline, durations, tol: float,
               slack: dict[int, float] | None = None) -> tuple[Schedule, int]:
    gaps = idle_gaps(timeline, tail=False)
    ev_index = {}
    if slack is not None:
        for n, e in enumerate(timeline.events):
            if e.lane == "compute" and e.type != "W":
                ev_index[(e.rank, e.label)] = n
    moved_total = 0
    lists: dict[int, list[Action]] = {}
    for r in range(schedule.num_ranks):
        acts = list(schedule.actions.get(r, []))
        pos = {str(a): n for n, a in enumerate(acts) if a.is_compute and a.type is not _W}
        i_pos = {(x.stage, x.microbatch): n for n, a in enumerate(acts) for x in a.leaves() if x.type is _I}
        w_list = [(n, a) for n, a in enumerate(acts) if a.type is _W]
        taken: set[int] = set()
        insert: dict[int, list[Action]] = {}
        for g in gaps.get(r, []):
            px = pos.get(g.before)
            if px is None:
                continue
            room = g.length
            if slack is not None:
                room += slack.get(ev_index.get((r, g.before), -1), 0.0)
            for n, a in w_list:
                if n <= px or n in taken:
                    continue
                ip = i_pos.get((a.stage, a.microbatch))
                if ip is None or ip >= px:
                    continue
                d = durations(a.stage, a.microbatch, _W)
                if d <= 0 or d > room + tol:
                    continue
                taken.add(n)
                insert.setdefault(px, []).append(a)
                room -= d
        moved_total += len(taken)
        if taken:
            out = []
            for n, a in enumerate(acts):
                out.extend(insert.get(n, ()))
                if n not in taken:
                    out.append(a)
            lists[r] = out
        else:
            lists[r] = acts
    if not moved_total:
        return schedule, 0
    return Schedule(schedule.name, schedule.num_ranks, schedule.num_stages, schedule.num_microbatches, lists,
                    dict(schedule.stage_to_rank), dict(schedule.meta)), moved_total


def fill_gaps(schedule: Schedule, durations, *, max_passes: int = 64, use_slack: bool = True,
              **sim: Any) -> tuple[Schedule, Timeline, int]:
    """Pull W tasks back into the predicted idle gaps of each rank, repeatedly, until nothing moves.

    One pass simulates the order, lists each rank's gaps (:func:`idle_gaps`) and, for every gap before
    action ``X``, moves W tasks that sit after ``X`` in the rank's order and whose I runs before ``X`` to just
    before ``X``, in order, while their predicted durations fit in the gap. A W that fits runs in time the
    rank would have idled, so no action starts later than before: the iteration never gets longer, and W
    never precedes its I. With ``use_slack`` a W may also use ``X``'s slack (:func:`action_slack`: delaying
    an action off the critical path costs nothing); a slack pass that would lengthen the predicted
    iteration (slack is shared between actions) is replaced by a fit-only pass. A moved W frees its
    activations earlier, so memory never grows.

    Returns:
        ``(schedule, timeline, moves)``: the filled order, its simulated timeline and how many W moves
        were made over all passes.
    """
    tl = simulate(schedule, durations, **sim)
    total = 0
    slack_on = use_slack
    for _ in range(max_passes):
        tol = 1e-9 * max(tl.iteration_time, 1e-30)
        moved = 0
        if slack_on:
            sl = action_slack(tl, schedule, p2p_latency=sim.get("p2p_latency", 0.0), p2p_time=sim.get("p2p_time"))
            new, moved = _fill_pass(schedule, tl, durations, tol, sl)
            if moved:
                new_tl = simulate(new, durations, **sim)
                if new_tl.iteration_time > tl.iteration_time * (1 + 1e-12):
                    moved = 0
                    slack_on = False  # slack is shared: fall back to moves that provably never hurt
        if not moved:
            new, moved = _fill_pass(schedule, tl, durations, tol)
            if not moved:
                break
            new_tl = simulate(new, durations, **sim)
            if new_tl.iteration_time > tl.iteration_time * (1 + 1e-9):  # pragma: no cover - see the argument above
                break
        schedule, tl, total = new, new_tl, total + moved
    return schedule, tl, total
