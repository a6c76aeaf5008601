"""Discrete-event simulation of pipeline schedules, and the :class:`Timeline` it produces.

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

Durations come from a callable ``durations(stage, microbatch, type) -> seconds`` (the
:class:`Durations` protocol). For an ``OVERLAP_F_B`` pair it is called with the *backward*
sub-action's stage and micro-batch and ``ActionType.OVERLAP_F_B``.

Closed forms (:func:`closed_form`) follow GPipe / PipeDream-Flush (1F1B), Megatron-LM interleaved
1F1B (Narayanan et al., SC21), Zero Bubble (Qi et al., ICLR 2024) and DeepSeek's DualPipe README.

This module never imports torch; pandas is imported only by :meth:`Timeline.to_dataframe` and
:func:`compare_with_closed_form`.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from tessera_lab.errors import ConfigError, DeadlockError, ScheduleError
from tessera_lab.pipeline.schedules import ActionType, Schedule, build_schedule, canonical_name, parse_action

__all__ = [
    "Durations",
    "uniform_durations",
    "stage_durations",
    "override_durations",
    "Event",
    "Timeline",
    "simulate",
    "closed_form",
    "compare_with_closed_form",
    "merge_intervals",
    "overlap_length",
    "interval_gaps",
]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_OV = ActionType.OVERLAP_F_B
_SEND_F, _RECV_F, _SEND_B, _RECV_B = ActionType.SEND_F, ActionType.RECV_F, ActionType.SEND_B, ActionType.RECV_B
P2P_COLLECTIVE = "pp_p2p"


class Durations(Protocol):
    """``durations(stage, microbatch, type) -> seconds``.

    ``type`` is an :class:`ActionType`: ``F``, ``B`` (full backward), ``I`` (input gradient), ``W``
    (weight gradient) or ``OVERLAP_F_B`` (called with the backward sub-action's stage and
    micro-batch; returns the pair makespan). Any callable with this signature works, e.g. one
    that reads per-(stage, micro-batch) expert loads for variable routing.
    """

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float: ...


def _nonneg(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{name}={value!r} is out of range; allowed: finite seconds >= 0")
    return v


class _Uniform:
    __slots__ = ("f", "b", "w", "i", "fb", "_table")

    def __init__(self, f: float, b: float, w: float | None, fb: float | None):
        self.f = _nonneg("f", f)
        self.b = _nonneg("b", b)
        self.w = 0.0 if w is None else _nonneg("w", w)
        if self.w > self.b:
            raise ConfigError(f"w={w} is out of range; the weight-gradient time must be <= b={b} (b is the full backward)")
        self.i = self.b - self.w
        self.fb = self.f + self.b if fb is None else _nonneg("fb", fb)
        self._table = {_F: self.f, _B: self.b, _I: self.i, _W: self.w, _OV: self.fb}

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        return self._table[type]

    def __repr__(self) -> str:
        return f"uniform_durations(f={self.f}, b={self.b}, w={self.w}, fb={self.fb})"


def uniform_durations(f: float, b: float, w: float | None = None, fb: float | None = None) -> Durations:
    """The same times on every stage and micro-batch (seconds).

    Args:
        f: forward time F.
        b: full backward time B (input gradient + weight gradient).
        w: weight-gradient time W; a split backward then takes ``I = b - w`` and ``W = w``.
            ``None`` means the split is unknown: ``I = b`` and ``W = 0``.
        fb: makespan of an overlapped F+B pair (``OVERLAP_F_B``); default ``f + b`` (no overlap
            gain). Perfect overlap would be ``max(f, b)``; measured values can even exceed
            ``f + b`` (DESIGN section 3).

    Raises:
        ConfigError: a negative or non-finite time, or ``w > b``.
    """
    return _Uniform(f, b, w, fb)


class _PerStage:
    __slots__ = ("tables",)

    def __init__(self, tables: list[dict]):
        self.tables = tables

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        try:
            return self.tables[stage][type]
        except IndexError:
            raise ConfigError(
                f"stage_durations: no times for stage {stage}; lists cover stages 0..{len(self.tables) - 1}"
            ) from None


def stage_durations(
    f: Sequence[float],
    b: Sequence[float],
    w: Sequence[float] | None = None,
    fb: Sequence[float] | Callable[[float, float], float] | None = None,
) -> Durations:
    """Per-stage times (seconds); index = global stage.

    Args:
        f, b: forward and full-backward time of each stage.
        w: weight-gradient time of each stage (``I = b - w``); ``None``: ``I = b``, ``W = 0``.
        fb: pair makespan of an ``OVERLAP_F_B`` whose backward runs on stage ``s``: a sequence
            (``fb[s]``), or a callable ``fb(f[s], b[s])`` (e.g. ``max`` for perfect overlap), or
            ``None`` for ``f[s] + b[s]``.

    Raises:
        ConfigError: lists of different lengths, negative times, or ``w[s] > b[s]``.
    """
    f, b = list(f), list(b)
    n = len(f)
    if len(b) != n or (w is not None and len(w) != n) or (fb is not None and not callable(fb) and len(fb) != n):
        raise ConfigError(
            f"stage_durations: f, b, w and fb must have one entry per stage; got lengths f={n}, b={len(b)}"
            + (f", w={len(w)}" if w is not None else "")
            + (f", fb={len(fb)}" if fb is not None and not callable(fb) else "")
        )
    tables = []
    for s in range(n):
        fs, bs = _nonneg(f"f[{s}]", f[s]), _nonneg(f"b[{s}]", b[s])
        ws = 0.0 if w is None else _nonneg(f"w[{s}]", w[s])
        if ws > bs:
            raise ConfigError(f"w[{s}]={ws} is out of range; allowed <= b[{s}]={bs}")
        if fb is None:
            fbs = fs + bs
        elif callable(fb):
            fbs = _nonneg(f"fb(f[{s}], b[{s}])", fb(fs, bs))
        else:
            fbs = _nonneg(f"fb[{s}]", fb[s])
        tables.append({_F: fs, _B: bs, _I: bs - ws, _W: ws, _OV: fbs})
    return _PerStage(tables)


def override_durations(
    base: Durations, overrides: Mapping[tuple[int, int, ActionType | str], float]
) -> Durations:
    """``base`` with some (stage, micro-batch, type) entries replaced (seconds).

    Use it for per-micro-batch variation such as routing skew: ``{(3, 7, "F"): 0.012, ...}``.

    Raises:
        ConfigError: a negative override or an unknown type.
    """
    table: dict[tuple[int, int, ActionType], float] = {}
    for key, value in overrides.items():
        stage, mb, kind = key
        try:
            kind = ActionType(kind)
        except ValueError:
            raise ConfigError(f"override_durations: unknown action type {kind!r}; allowed F, B, I, W, OVERLAP_F_B") from None
        table[(int(stage), int(mb), kind)] = _nonneg(f"override {key}", value)

    def durations(stage: int, microbatch: int, type: ActionType) -> float:
        v = table.get((stage, microbatch, type))
        return base(stage, microbatch, type) if v is None else v

    return durations


# ----------------------------------------------------------------------------------------------
# Timeline
# ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Event:
    """One interval on a rank's lane.

    Attributes:
        rank: pipeline rank.
        stage: stage of the action (for a pair: the backward's stage; ``-1`` for an extra collective).
        microbatch: micro-batch (for a pair: the backward's; ``None`` for an extra collective).
        type: ``"F"``, ``"B"``, ``"I"``, ``"W"``, ``"OVERLAP_F_B"`` on the compute lane;
            ``"RECV_F"``/``"RECV_B"`` (a p2p transfer into this rank) or the collective's name on
            the comm lane.
        start, end: seconds from the start of the iteration.
        lane: ``"compute"`` or ``"comm"``.
        label: the action in torch notation (``"0F7"``, ``"(0F7;7B3)OVERLAP_F_B"``, ``"1RECV_F4"``).
    """

    rank: int
    stage: int
    microbatch: int | None
    type: str
    start: float
    end: float
    lane: str
    label: str

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    """Result of :func:`simulate`. All times in seconds.

    Attributes:
        events: compute and comm events, in simulation order.
        iteration_time: makespan (latest event end).
        per_rank_busy: compute-lane busy time per rank.
        per_rank_idle: ``iteration_time - busy`` per rank (compute lane).
        bubble_fraction: ``sum(idle) / (iteration_time * ranks)``.
        bubble_overhead: ``sum(idle) / sum(busy)`` (Megatron's bubble / ideal work).
        exposed_comm: collective -> seconds (summed over ranks) during which that rank's compute
            lane was idle while the collective ran (``"pp_p2p"`` for stage-to-stage transfers).
        critical_path: the chain of events, first to last, that set the makespan.
        peak_activations: per rank, the most micro-batch activations alive at once (F started,
            its B, or W when the backward is split, not yet finished; counted per stage).
    """

    events: list[Event]
    iteration_time: float
    per_rank_busy: list[float]
    per_rank_idle: list[float]
    bubble_fraction: float
    bubble_overhead: float
    exposed_comm: dict[str, float]
    critical_path: list[Event]
    peak_activations: list[int]
    schedule_name: str = ""
    num_ranks: int = 0

    @property
    def makespan(self) -> float:
        """Alias of ``iteration_time``."""
        return self.iteration_time

    @property
    def num_compute_events(self) -> int:
        return sum(1 for e in self.events if e.lane == "compute")

    def summary(self) -> dict[str, Any]:
        """Plain-data summary (for JSON output)."""
        return {
            "schedule": self.schedule_name,
            "makespan": self.iteration_time,
            "bubble_fraction": self.bubble_fraction,
            "bubble_overhead": self.bubble_overhead,
            "per_rank_busy": list(self.per_rank_busy),
            "per_rank_idle": list(self.per_rank_idle),
            "peak_activations": list(self.peak_activations),
            "exposed_comm": dict(self.exposed_comm),
        }

    def to_dataframe(self):
        """Events as a pandas DataFrame (columns rank, stage, microbatch, type, start, end,
        duration, lane, label)."""
        import pandas as pd

        return pd.DataFrame(
            {
                "rank": [e.rank for e in self.events],
                "stage": [e.stage for e in self.events],
                "microbatch": [e.microbatch for e in self.events],
                "type": [e.type for e in self.events],
                "start": [e.start for e in self.events],
                "end": [e.end for e in self.events],
                "duration": [e.end - e.start for e in self.events],
                "lane": [e.lane for e in self.events],
                "label": [e.label for e in self.events],
            }
        )

    def to_chrome_trace(self, path):
        """Write Chrome trace JSON (opens in Perfetto / chrome://tracing); returns the path."""
        from tessera_lab.pipeline.trace import write_chrome_trace

        return write_chrome_trace(self, path)


# ----------------------------------------------------------------------------------------------
# Simulator
# ----------------------------------------------------------------------------------------------

# compiled op kinds
_OP_COMPUTE, _OP_SEND, _OP_RECV = 0, 1, 2
_COMM_OPS = frozenset({_SEND_F, _SEND_B, _RECV_F, _RECV_B})
_TYPE_STR = {t: t.value for t in ActionType}


def _transfer_fn(p2p_latency: float, p2p_time) -> Callable[[int, int], float]:
    lat = _nonneg("p2p_latency", p2p_latency)
    if p2p_time is None:
        return lambda src, dst: lat
    if callable(p2p_time):
        def fn(src: int, dst: int) -> float:
            v = p2p_time(src, dst)
            if not 0.0 <= v < math.inf:
                raise ConfigError(f"p2p_time({src}, {dst}) returned {v!r}; allowed finite seconds >= 0")
            return lat + v

        return fn
    t = lat + _nonneg("p2p_time", p2p_time)
    return lambda src, dst: t


def simulate(
    schedule: Schedule,
    durations: Durations,
    *,
    p2p_latency: float = 0.0,
    p2p_time: float | Callable[[int, int], float] | None = None,
    blocking_sends: bool = False,
    comm: Iterable | None = None,
) -> Timeline:
    """Simulate one iteration of ``schedule``.

    Args:
        schedule: per-rank action lists (compute only, or with explicit SEND/RECV actions).
        durations: ``durations(stage, microbatch, type) -> seconds`` (see :class:`Durations`).
        p2p_latency: seconds added to every cross-rank stage-to-stage transfer.
        p2p_time: transfer seconds, a constant or ``p2p_time(src_stage, dst_stage)``; added to the
            latency. Same-rank transfers are free.
        blocking_sends: explicit ``SEND_*`` actions are rendezvous (see module docstring).
        comm: extra communication tasks on the comm lane, each ``(rank, collective_name, seconds,
            after_action)`` (tuple or dict with those keys); ``after_action`` is an
            :class:`Action`, its string (``"3W7"``), or ``None`` (start of the iteration). A rank's
            tasks run one after another, each starting when its action has ended and the lane is
            free; they do not block compute but count as exposed while the compute lane is idle,
            and can extend the iteration. Zero-second tasks are no-ops.

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
        return _simulate(schedule, durations, p2p_latency, p2p_time, blocking_sends, comm)
    finally:
        if was_enabled:
            gc.enable()


def _simulate(schedule, durations, p2p_latency, p2p_time, blocking_sends, comm) -> Timeline:
    xfer = _transfer_fn(p2p_latency, p2p_time)
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

    # ---- extra collectives on the comm lane ------------------------------------------------
    if comm:
        _add_comm_tasks(comm, events, preds, R)

    return _build_timeline(schedule, events, preds, R, busy, act_deltas)


def _add_comm_tasks(comm: Iterable, events: list[Event], preds: list[int], R: int) -> None:
    by_label: dict[tuple[int, str], int] = {}
    for idx, e in enumerate(events):
        if e.lane != "compute":
            continue
        by_label[(e.rank, e.label)] = idx
        if e.type == _OV.value:
            for x in parse_action(e.label).sub_actions:
                by_label[(e.rank, str(x))] = idx
    tasks = []
    for n, task in enumerate(comm):
        if isinstance(task, Mapping):
            try:
                rank, name, seconds, after = task["rank"], task["collective"], task["seconds"], task.get("after")
            except KeyError as exc:
                raise ConfigError(f"comm task {n}: missing key {exc.args[0]!r}; keys: rank, collective, seconds, after") from None
        else:
            try:
                rank, name, seconds, after = task
            except (TypeError, ValueError):
                raise ConfigError(
                    f"comm task {n}: expected (rank, collective_name, seconds, after_action), got {task!r}"
                ) from None
        if not isinstance(rank, int) or not 0 <= rank < R:
            raise ConfigError(f"comm task {n}: rank={rank!r} is out of range; allowed 0..{R - 1}")
        seconds = _nonneg(f"comm task {n} seconds", seconds)
        if seconds == 0:
            continue  # zero-size collective: a no-op
        if after is None:
            ready_t, pred, stage, mb = 0.0, -1, -1, None
        else:
            label = str(after)
            idx = by_label.get((rank, label))
            if idx is None:
                raise ConfigError(f"comm task {n}: action {label!r} does not run on rank {rank}")
            ev = events[idx]
            ready_t, pred, stage, mb = ev.end, idx, ev.stage, ev.microbatch
        tasks.append((ready_t, n, rank, str(name), seconds, pred, stage, mb))
    tasks.sort()
    lane_free = [0.0] * R
    for ready_t, n, rank, name, seconds, pred, stage, mb in tasks:
        start = max(ready_t, lane_free[rank])
        end = start + seconds
        lane_free[rank] = end
        events.append(Event(rank, stage, mb, name, start, end, "comm", name))
        preds.append(pred)


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals (touching ones join; empty ones,
    ``end <= start``, are dropped). The input is not changed."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def overlap_length(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Total length of the intersection of two merged interval lists (as :func:`merge_intervals` returns)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if e > s:
            total += e - s
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def interval_gaps(merged: Sequence[tuple[float, float]], end: float) -> list[tuple[float, float]]:
    """The parts of ``[0, end]`` that merged intervals ``merged`` leave uncovered (e.g. a rank's idle time
    from its merged compute intervals and the iteration time), in order."""
    gaps, cur = [], 0.0
    for s, e in merged:
        if s > cur:
            gaps.append((cur, s))
        cur = max(cur, e)
    if end > cur:
        gaps.append((cur, end))
    return gaps


def _build_timeline(
    schedule: Schedule,
    events: list[Event],
    preds: list[int],
    R: int,
    busy: list[float],
    act_deltas: list[list[tuple[float, int]]],
) -> Timeline:
    T = max((e.end for e in events), default=0.0)
    compute_iv: list[list[tuple[float, float]]] = [[] for _ in range(R)]
    comm_iv: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in events:
        if e.lane != "compute":
            coll = P2P_COLLECTIVE if e.type in ("RECV_F", "RECV_B") else e.type
            comm_iv.setdefault((e.rank, coll), []).append((e.start, e.end))
    if comm_iv:
        for e in events:
            if e.lane == "compute":
                compute_iv[e.rank].append((e.start, e.end))
    idle = [max(0.0, T - b) for b in busy]
    total_busy = sum(busy)
    total_idle = sum(idle)
    bubble_fraction = total_idle / (T * R) if T > 0 and R > 0 else 0.0
    bubble_overhead = total_idle / total_busy if total_busy > 0 else 0.0

    exposed: dict[str, float] = {}
    if comm_iv:
        idle_iv = [interval_gaps(merge_intervals(compute_iv[r]), T) for r in range(R)]
        for (r, coll), ivs in comm_iv.items():
            exposed[coll] = exposed.get(coll, 0.0) + overlap_length(merge_intervals(ivs), idle_iv[r])

    peaks = []
    for r in range(R):
        deltas = sorted(act_deltas[r])  # (time, -1) sorts before (time, +1): frees first at ties
        live = peak = 0
        for _, d in deltas:
            live += d
            peak = max(peak, live)
        peaks.append(peak)

    path: list[Event] = []
    if events:
        idx = -1  # the last-ending event (a compute event on ties)
        for k in range(len(events) - 1, -1, -1):
            e = events[k]
            if e.end == T and (idx < 0 or (e.lane == "compute" and events[idx].lane != "compute")):
                idx = k
        seen = set()
        while idx >= 0 and idx not in seen:
            seen.add(idx)
            path.append(events[idx])
            idx = preds[idx]
        path.reverse()

    return Timeline(
        events=events,
        iteration_time=T,
        per_rank_busy=busy,
        per_rank_idle=idle,
        bubble_fraction=bubble_fraction,
        bubble_overhead=bubble_overhead,
        exposed_comm=exposed,
        critical_path=path,
        peak_activations=peaks,
        schedule_name=schedule.name,
        num_ranks=R,
    )


# ----------------------------------------------------------------------------------------------
# Closed forms
# ----------------------------------------------------------------------------------------------


def closed_form(
    schedule_name: str,
    pp: int,
    m: int,
    f: float,
    b: float,
    w: float | None = None,
    vpp: int = 1,
    fb: float | None = None,
) -> dict[str, Any]:
    """Textbook makespan and bubble of a uniform pipeline (no p2p time), in seconds.

    ``f``, ``b``, ``w`` and ``fb`` are the times of **one stage (model chunk)** for one
    micro-batch: forward, full backward, weight-gradient part of the backward (the
    input-gradient part is ``i = b - w``; ``w=None`` means 0) and the overlapped F+B pair
    (default ``f + b``). Interleaved and DualPipeV ranks hold several chunks, so their ranks do
    ``vpp`` (or 2) times the work per micro-batch.

    ===============  ===========================================================  ==================
    schedule         makespan                                                     source
    ===============  ===========================================================  ==================
    gpipe, 1f1b      ``(m + p - 1)(f + b)``; bubble per rank ``(p - 1)(f + b)``,    GPipe; Megatron-LM
                     ``bubble_overhead = (p - 1) / m``                             (Narayanan, SC21)
    interleaved      ``v m (f + b) + (p - 1)(f + b)``; overhead ``(p-1)/(v m)``    Megatron-LM SC21
                     (exact when ``m`` is a multiple of ``p``)
    zb-h1            ``m (f + b) + (p - 1)(f + i - w)`` (exact when                Qi et al. ICLR 2024
                     ``w <= min(f, i)``)                                           (their B = our I)
    zb-h2            ``m (f + b) + (p - 1) max(f, f + i - 2w)``: the paper's        Qi et al. ICLR 2024
                     ``(p-1)(f + i - 2w)`` floored at the start-up skew
                     ``(p - 1) f`` one iteration cannot hide (exact for
                     ``m >= 2p - 1``, ``w <= min(f, i)``)
    dualpipev        published bubble ``(PP/2 - 1)(F&B + B - 3W)`` with ``PP = 2p``  DeepSeek DualPipe
                     stages, i.e. ``(p - 1)(fb + b - 3w)``: the idle time of the    README
                     most idle (last) rank; makespan = that rank's work + bubble
                     (exact when ``i == f`` and ``w <= f``)
    overlapped       ``p (f + b) + (m - 1) fb`` (exact for ``fb >= max(f, b)``);    this library
                     equals 1F1B's when ``fb = f + b``
    ===============  ===========================================================  ==================

    Returns:
        dict with ``schedule``, ``pp``, ``m``, ``vpp``, ``makespan``, ``bubble_per_rank`` (idle
        time of the most idle rank), ``per_rank_busy``, ``bubble_fraction``, ``bubble_overhead``,
        ``formula``, ``source``, ``exact`` (whether :func:`simulate` reproduces the makespan for
        these inputs) and ``note``; for zb-h2 also ``published_bubble``.

    Raises:
        ScheduleError: unknown schedule or settings the schedule refuses.
        ConfigError: negative times or ``w > b``.
    """
    name = canonical_name(schedule_name)
    d = _Uniform(f, b, w, fb)
    f, b, w_, i, fbv = d.f, d.b, d.w, d.i, d.fb
    sched = build_schedule(name, pp, m, vpp=vpp)
    p = sched.num_ranks
    busy = [0.0] * p
    for r, acts in sched.actions.items():
        for a in acts:
            if a.type in (_F, _B, _I, _W, _OV):
                busy[r] += d._table[a.type]
    eps = 1e-12 * max(1.0, f + b)
    published = None
    if name in ("gpipe", "1f1b"):
        T = (m + p - 1) * (f + b)
        formula, source, exact = "(m + p - 1)(F + B)", "GPipe (Huang et al. 2019); 1F1B: Narayanan et al., SC21", True
        note = "bubble per rank (p - 1)(F + B); bubble_overhead (p - 1)/m"
    elif name == "interleaved":
        v = sched.stages_per_rank
        T = v * m * (f + b) + (p - 1) * (f + b)
        formula = "v m (F + B) + (p - 1)(F + B) with per-chunk F, B; bubble_overhead (p - 1)/(v m)"
        source = "Megatron-LM interleaved 1F1B (Narayanan et al., SC21)"
        exact = m % p == 0
        note = "" if exact else "micro-batches not a multiple of pp: the closed form is only a guide"
    elif name == "zb-h1":
        T = m * (f + b) + (p - 1) * (f + i - w_)
        formula = "m (F + B) + (p - 1)(F + I - W), I = B - W"
        source = "Zero Bubble (Qi et al., ICLR 2024), ZB-H1; their B is our I"
        exact = w_ <= min(f, i) + eps
        note = "" if exact else "exact only when W <= min(F, I)"
    elif name == "zb-h2":
        published = (p - 1) * (f + i - 2 * w_)
        T = m * (f + b) + (p - 1) * max(f, f + i - 2 * w_)
        formula = "m (F + B) + (p - 1) max(F, F + I - 2W); paper: bubble (p - 1)(F + I - 2W)"
        source = "Zero Bubble (Qi et al., ICLR 2024), ZB-H2"
        exact = m >= 2 * p - 1 and w_ <= min(f, i) + eps
        note = (
            "one iteration keeps the start-up skew (p - 1) F; the paper hides it across iterations "
            "(optimizer post-validation)"
            + ("" if exact else "; exact only for m >= 2p - 1 and W <= min(F, I)")
        )
    elif name == "dualpipev":
        published = (p - 1) * (fbv + b - 3 * w_)
        T = min(busy) + published
        formula = "(PP/2 - 1)(F&B + B - 3W), PP = 2 pp stages (idle time of the last rank)"
        source = "DeepSeek DualPipe README (DualPipeV row)"
        exact = abs(i - f) <= eps and w_ <= f + eps
        note = "" if exact else "exact only when I = F (input-gradient time equals forward time) and W <= F"
    else:  # overlapped
        T = p * (f + b) + (m - 1) * fbv
        formula = "p (F + B) + (m - 1) F&B"
        source = "tessera-lab overlapped 1F1B (pairs F(j + k) with B(j)); reduces to 1F1B for F&B = F + B"
        exact = fbv >= max(f, b) - eps
        note = "" if exact else "exact only when F&B >= max(F, B)"
    idle = [max(0.0, T - x) for x in busy]
    out = {
        "schedule": name,
        "pp": p,
        "m": m,
        "vpp": sched.stages_per_rank,
        "makespan": T,
        "bubble_per_rank": max(idle),
        "per_rank_busy": busy,
        "bubble_fraction": sum(idle) / (T * p) if T > 0 else 0.0,
        "bubble_overhead": sum(idle) / sum(busy) if sum(busy) > 0 else 0.0,
        "formula": formula,
        "source": source,
        "exact": bool(exact),
        "note": note,
    }
    if published is not None:
        out["published_bubble"] = published
    return out


def compare_with_closed_form(
    schedule_name: str,
    pp: int,
    m: int,
    f: float,
    b: float,
    w: float | None = None,
    fb: float | None = None,
    vpp: int = 1,
    *,
    p2p_latency: float = 0.0,
    per_rank_times: bool = False,
) -> dict[str, Any]:
    """Simulate a uniform pipeline and put the closed form beside it (the notebook's engine).

    Args:
        schedule_name, pp, m, vpp: as :func:`tessera_lab.pipeline.schedules.build_schedule`.
        f, b, w, fb: seconds per stage (chunk) and micro-batch, as :func:`closed_form`; with
            ``per_rank_times=True`` they are per rank instead and are divided by the stages per
            rank (``vpp`` for interleaved, 2 for DualPipeV), which compares schedules on the same
            model.
        p2p_latency: seconds per cross-rank transfer (the closed forms ignore it).

    Returns:
        dict with ``schedule`` (the :class:`Schedule`), ``timeline`` (:class:`Timeline`),
        ``simulated`` and ``closed_form`` (dicts with ``makespan``, ``bubble_per_rank``,
        ``bubble_fraction``, ``bubble_overhead``), ``exact``, ``formula``, ``source``, ``note``
        and ``rows``: a list of ``{"metric", "simulated", "closed_form", "difference"}`` dicts
        (``pandas.DataFrame(result["rows"])`` for a table).

    Raises:
        ScheduleError, ConfigError: as :func:`closed_form`.
    """
    sched = build_schedule(schedule_name, pp, m, vpp=vpp)
    k = sched.stages_per_rank if per_rank_times else 1
    f_, b_ = f / k, b / k
    w_ = None if w is None else w / k
    fb_ = None if fb is None else fb / k
    cf = closed_form(schedule_name, pp, m, f_, b_, w_, vpp=vpp, fb=fb_)
    tl = simulate(sched, uniform_durations(f_, b_, w_, fb_), p2p_latency=p2p_latency)
    sim = {
        "makespan": tl.iteration_time,
        "bubble_per_rank": max(tl.per_rank_idle) if tl.per_rank_idle else 0.0,
        "bubble_fraction": tl.bubble_fraction,
        "bubble_overhead": tl.bubble_overhead,
        "peak_activations": max(tl.peak_activations) if tl.peak_activations else 0,
    }
    cfd = {key: cf[key] for key in ("makespan", "bubble_per_rank", "bubble_fraction", "bubble_overhead")}
    rows = [
        {"metric": key, "simulated": sim[key], "closed_form": cfd[key], "difference": sim[key] - cfd[key]}
        for key in cfd
    ]
    if "published_bubble" in cf:
        rows.append(
            {"metric": "published_bubble", "simulated": sim["bubble_per_rank"], "closed_form": cf["published_bubble"],
             "difference": sim["bubble_per_rank"] - cf["published_bubble"]}
        )
    return {
        "schedule": sched,
        "timeline": tl,
        "simulated": sim,
        "closed_form": cfd,
        "exact": cf["exact"] and p2p_latency == 0,
        "formula": cf["formula"],
        "source": cf["source"],
        "note": cf["note"],
        "rows": rows,
    }
