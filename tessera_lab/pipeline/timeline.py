"""The simulator's output: :class:`Event`, :class:`Timeline` (per-action intervals, makespan, busy/idle,
bubble metrics, exposed communication, critical path, peak activations) and the interval helpers
(:func:`merge_intervals`, :func:`overlap_length`, :func:`interval_gaps`). Times in seconds. pandas is
imported only by :meth:`Timeline.to_dataframe`. Never imports torch.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.durations import _nonneg

__all__ = ["Event", "Timeline", "merge_intervals", "overlap_length", "interval_gaps", "P2P_COLLECTIVE"]

P2P_COLLECTIVE = "pp_p2p"
_OVERLAP = "OVERLAP_F_B"


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


def merge_intervals(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals (touching ones join; empty ones,
    ``end <= start``, are dropped). The input is not changed."""
    out: list[tuple[float, float]] = []
    append = out.append
    cur_s = cur_e = None
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if cur_e is not None and s <= cur_e:
            if e > cur_e:
                cur_e = e
        else:
            if cur_e is not None:
                append((cur_s, cur_e))
            cur_s, cur_e = s, e
    if cur_e is not None:
        append((cur_s, cur_e))
    return out


def overlap_length(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Total length of the intersection of two merged interval lists (as :func:`merge_intervals` returns)."""
    i = j = 0
    na, nb = len(a), len(b)
    total = 0.0
    while i < na and j < nb:
        a_s, a_e = a[i]
        b_s, b_e = b[j]
        s = a_s if a_s >= b_s else b_s
        e = a_e if a_e <= b_e else b_e
        if e > s:
            total += e - s
        if a_e < b_e:
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
    schedule,
    events: list[Event],
    preds: list[int],
    R: int,
    busy: list[float],
    act_deltas: list[list[tuple[float, int]]],
) -> Timeline:
    T = 0.0
    compute_iv: list[list[tuple[float, float]]] = [[] for _ in range(R)]
    comm_iv: dict[tuple[int, str], list[tuple[float, float]]] = {}
    p2p_types = ("RECV_F", "RECV_B")
    last_any = last_compute = -1  # the last event ending at T, and the last compute event ending at T
    for k, e in enumerate(events):
        end = e.end
        is_compute = e.lane == "compute"
        if end > T:
            T, last_any, last_compute = end, k, (k if is_compute else -1)
        elif end == T:
            last_any = k
            if is_compute:
                last_compute = k
        if not is_compute:
            coll = P2P_COLLECTIVE if e.type in p2p_types else e.type
            key = (e.rank, coll)
            got = comm_iv.get(key)
            if got is None:
                comm_iv[key] = [(e.start, end)]
            else:
                got.append((e.start, end))
    idle = [max(0.0, T - b) for b in busy]
    total_busy = sum(busy)
    total_idle = sum(idle)
    bubble_fraction = total_idle / (T * R) if T > 0 and R > 0 else 0.0
    bubble_overhead = total_idle / total_busy if total_busy > 0 else 0.0

    exposed: dict[str, float] = {}
    if comm_iv:  # the compute intervals are needed only to expose communication
        for e in events:
            if e.lane == "compute":
                compute_iv[e.rank].append((e.start, e.end))
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
        idx = last_compute if last_compute >= 0 else last_any  # the last-ending event (a compute one on ties)
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


def _comm_tasks(comm: Iterable, R: int, locate) -> list[tuple]:
    """The extra collectives on the comm lanes: ``(rank, stage, mb, name, start, end, pred)`` each, in the order
    they are laid out. ``locate(needed)`` maps each needed ``(rank, label)`` to ``(end, event index, stage, mb)`` of
    the last compute event on that rank with that label (an ``OVERLAP_F_B`` event answers to each sub-action's
    label), leaving out those that do not run."""
    parsed = []  # (n, rank, name, seconds, label or None), in task order, up to the first malformed task
    failure: ConfigError | None = None
    try:
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
            parsed.append((n, rank, name, seconds, None if after is None else str(after)))
    except ConfigError as exc:
        failure = exc
    # the event each named action ended with: the last compute event with that label on that rank (an
    # OVERLAP_F_B event "(0F7;7B3)OVERLAP_F_B" also answers to each sub-action's label)
    needed = {(rank, label) for _, rank, _, _, label in parsed if label is not None}
    found = locate(needed) if needed else {}
    tasks = []
    for n, rank, name, seconds, label in parsed:
        if label is None:
            ready_t, pred, stage, mb = 0.0, -1, -1, None
        else:
            got = found.get((rank, label))
            if got is None:
                raise ConfigError(f"comm task {n}: action {label!r} does not run on rank {rank}")
            ready_t, pred, stage, mb = got
        tasks.append((ready_t, n, rank, seconds, str(name), pred, stage, mb))
    if failure is not None:
        raise failure
    return [(rank, stage, mb, name, start, end, pred)
            for start, end, (_, _, rank, _, name, pred, stage, mb) in serial_lanes(tasks, R)]


def serial_lanes(tasks: list[tuple], R: int) -> list[tuple[float, float, tuple]]:
    """The communication-lane rule: tasks ``(ready seconds, order, rank, seconds, ...)`` run one after another on
    their rank's lane, taken by ready time (ties: by ``order``, which must be unique), each starting at the later of
    its ready time and the end of the lane's previous task. Returns ``[(start, end, task), ...]`` in that order (the
    simulator's extra collectives, :func:`_comm_tasks`, and the dynamic execution's gradient reduce-scatters,
    :func:`tessera_lab.dynamic.online.execute`)."""
    lane_free = [0.0] * R
    out = []
    for task in sorted(tasks):
        ready, _, rank, seconds = task[:4]
        start = max(ready, lane_free[rank])
        end = start + seconds
        lane_free[rank] = end
        out.append((start, end, task))
    return out


def _add_comm_tasks(comm: Iterable, events: list[Event], preds: list[int], R: int) -> None:
    """Append the extra collectives (:func:`_comm_tasks`) to ``events`` and ``preds``, each after the event its
    action ended with (found scanning the events backwards)."""

    def locate(needed: set) -> dict:
        found: dict[tuple[int, str], int] = {}
        ov = _OVERLAP
        for idx in range(len(events) - 1, -1, -1):
            if len(found) == len(needed):
                break
            e = events[idx]
            if e.lane != "compute":
                continue
            key = (e.rank, e.label)
            if key in needed and key not in found:
                found[key] = idx
            if e.type == ov:
                for x in e.label[1:e.label.index(")")].split(";"):
                    key = (e.rank, x.strip())
                    if key in needed and key not in found:
                        found[key] = idx
        return {k: (events[i].end, i, events[i].stage, events[i].microbatch) for k, i in found.items()}

    for rank, stage, mb, name, start, end, pred in _comm_tasks(comm, R, locate):
        events.append(Event(rank, stage, mb, name, start, end, "comm", name))
        preds.append(pred)


# ---- the linear pass's timeline: analyses on arrays, events made when first read ---------------------------------


class _Lazy:
    """A value a :class:`Timeline` computes when the attribute is first read: ``make(timeline)``."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


def _lazy_attribute(name: str) -> property:
    slot = "_" + name

    def get(self):
        v = self.__dict__[slot]
        if isinstance(v, _Lazy):
            was_enabled = gc.isenabled()
            gc.disable()  # many small objects and no cycles, as in the simulator itself
            try:
                v = self.__dict__[slot] = v.make(self)
            finally:
                if was_enabled:
                    gc.enable()
        return v

    def set(self, v):
        self.__dict__[slot] = v

    return property(get, set, doc=f"``{name}`` (made when first read)")


def _timeline_state(self) -> dict:
    """Pickle/copy state with every lazily made attribute made."""
    return {k: (v.make(self) if isinstance(v, _Lazy) else v) for k, v in self.__dict__.items()}


Timeline.events = _lazy_attribute("events")
Timeline.critical_path = _lazy_attribute("critical_path")
Timeline.__getstate__ = _timeline_state


def _small(np, ranks, R: int):
    """Rank numbers in the narrowest integer type that holds them (a stable sort of 16-bit integers is a radix
    sort)."""
    return ranks.astype(np.int16) if R <= np.iinfo(np.int16).max else ranks


def _exposed_by_rank(np, cr, cs, ce, T: float, qr, qs, qe, R: int) -> list[float]:
    """Per rank ``r < R``: :func:`overlap_length` of the merged comm intervals ``(qs, qe)`` on rank ``qr`` with the
    idle gaps that the rank's compute intervals leave in ``[0, T]``, on arrays (the gaps of every rank at once,
    then per rank a sort, merge and search). The compute intervals ``(cr, cs, ce)`` come grouped by rank
    (ascending) and in lane order (each starts at or after the previous end); the comm intervals in any order. Each
    rank's overlaps are summed in time order, as :func:`overlap_length` adds them (so the floats are the same)."""
    keep = ce > cs
    cr, cs, ce = cr[keep], cs[keep], ce[keep]
    gs = np.empty(len(cs))  # the gap before each compute interval: from the previous end on the rank, or 0
    if len(cs):
        gs[0] = 0.0
        gs[1:] = np.where(cr[1:] != cr[:-1], 0.0, ce[:-1])
    rank_end = np.searchsorted(cr, np.arange(R), "right")  # the gap after the rank's last interval, up to T
    some = rank_end > np.searchsorted(cr, np.arange(R), "left")
    last = np.zeros(R)
    last[some] = ce[rank_end[some] - 1]
    gr = np.insert(cr, rank_end, np.arange(R))
    gs, ge = np.insert(gs, rank_end, last), np.insert(cs, rank_end, T)
    g = ge > gs
    gr, gs, ge = gr[g], gs[g], ge[g]
    k = qe > qs
    qr, qs, qe = qr[k], qs[k], qe[k]
    out = [0.0] * R
    o = np.argsort(_small(np, qr, R), kind="stable")
    qr, qs, qe = qr[o], qs[o], qe[o]
    qb = np.searchsorted(qr, np.arange(R + 1), "left").tolist()
    gb = np.searchsorted(gr, np.arange(R + 1), "left").tolist()
    for x in range(R):
        q0, q1, g0, g1 = qb[x], qb[x + 1], gb[x], gb[x + 1]
        if q1 == q0 or g1 == g0:
            continue
        s, e = qs[q0:q1], qe[q0:q1]
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        top = np.maximum.accumulate(e)  # the latest end so far
        new = np.empty(len(s), dtype=bool)
        new[0] = True
        np.greater(s[1:], top[:-1], out=new[1:])
        first = np.flatnonzero(new)
        a = s[first]  # merged comm intervals [a, b]: b, the running maximum at the last of each
        b = top[np.append(first[1:] - 1, len(s) - 1)]
        gsx, gex = gs[g0:g1], ge[g0:g1]
        lo = np.searchsorted(gex, a, "right")  # the first gap ending after a
        counts = np.searchsorted(gsx, b, "left") - lo  # ... up to the last starting before b
        np.maximum(counts, 0, out=counts)
        total = int(counts.sum())
        if not total:
            continue
        gi = np.repeat(np.arange(len(a)), counts)
        h = np.arange(total) - np.repeat(np.cumsum(counts) - counts - lo, counts)
        lengths = np.minimum(b[gi], gex[h]) - np.maximum(a[gi], gsx[h])
        out[x] = float(np.cumsum(lengths)[-1])
    return out


def _peaks_in_lane_order(np, r, cs, ce, plus, minus, R: int) -> list[int]:
    """Per rank, the most activations alive at once, from its actions in lane order (grouped by rank, ascending):
    ``plus`` taken at each start and ``minus`` freed at each end. The times in lane order never decrease, so no sort
    is needed: at equal times the event loop's order frees first, and then the most alive within a group of equal
    times is reached at the group's end; the peak is the largest count at a group's end (at least 0)."""
    n = len(cs)
    if not n:
        return [0] * R
    t = np.empty(2 * n)
    t[0::2], t[1::2] = cs, ce
    d = np.empty(2 * n, dtype=np.int64)
    d[0::2], d[1::2] = plus, -minus
    rr = np.repeat(r, 2)
    cum = np.cumsum(d)
    end = np.ones(2 * n, dtype=bool)
    end[:-1] = (t[1:] != t[:-1]) | (rr[1:] != rr[:-1])
    lo = np.searchsorted(rr, np.arange(R + 1), "left")
    base = np.where(lo[:-1] > 0, cum[np.maximum(lo[:-1] - 1, 0)], 0)
    held = np.flatnonzero(lo[1:] > lo[:-1])
    peaks = np.zeros(R, dtype=np.int64)
    if len(held):
        top = np.maximum.reduceat(np.where(end, cum, np.iinfo(np.int64).min), lo[held])
        peaks[held] = np.maximum(top - base[held], 0)
    return peaks.tolist()


# long: one pass over the run's arrays, which its lazy critical-path closure shares (a split passes a dozen)
def _linear_timeline(schedule, run, R: int, tasks: list | None = None):
    """The :class:`Timeline` of a :func:`tessera_lab.pipeline.linear.run_linear` pass, the same as
    :func:`_build_timeline` of its events, computed on arrays (events and critical path made when first read).
    ``tasks``: the extra collectives (:func:`_comm_tasks`, none named as the p2p transfers count), events after the
    pass's."""
    import numpy as np

    pk = run.packed
    cs, ce = run.start_array, run.end_array[1:]
    n = len(ce)
    if len(pk.tr_pair):
        dts = np.array(run.pair_time, dtype=float)[pk.tr_pair]
        mask = dts > 0
        tr_e = pk.tr_entry[mask]
        qs = ce[tr_e]
        qe = qs + dts[mask]
        qr = pk.tr_rank[mask]
    else:
        tr_e = np.zeros(0, dtype=np.int64)
        qs = qe = np.zeros(0)
        qr = tr_e
    nq = len(qe)
    tasks = tasks or []
    T = max(0.0, float(ce.max()) if n else 0.0, float(qe.max()) if nq else 0.0, *(x[5] for x in tasks))

    def critical_path(tl) -> list[Event]:
        """From the last-ending event (a compute one on ties) back along the predecessors (global event indices:
        each compute event followed by its transfers, then the collectives)."""
        if not n + nq + len(tasks):
            return []
        gc, gq, _ = run.event_index()
        jc = np.flatnonzero(ce == T)
        kq = np.flatnonzero(qe == T)
        last_compute = int(gc[jc[-1]]) if len(jc) else -1
        last_any = max(last_compute, int(gq[kq[-1]]) if len(kq) else -1,
                       *(n + nq + i for i, x in enumerate(tasks) if x[5] == T))
        idx = last_compute if last_compute >= 0 else last_any
        preds = np.empty(n + nq, dtype=np.int64)
        preds[gc] = run.pred
        preds[gq] = gc[tr_e]
        preds = preds.tolist() + [x[6] for x in tasks]
        path, seen = [], set()
        while idx >= 0 and idx not in seen:
            seen.add(idx)
            path.append(idx)
            idx = preds[idx]
        events = tl.events
        return [events[i] for i in reversed(path)]

    def events(tl) -> list[Event]:
        return run.events()[0] + [Event(r, st, mb, name, a, b, "comm", name) for r, st, mb, name, a, b, _ in tasks]

    busy = run.busy
    idle = [max(0.0, T - b) for b in busy]
    total_busy, total_idle = sum(busy), sum(idle)
    order, _ = pk.by_rank(R)
    r_o, cs_o, ce_o = pk.rank[order], cs[order], ce[order]
    lanes = {P2P_COLLECTIVE: (qr, qs, qe)} if nq else {}  # collective -> its intervals (rank, start, end)
    for name in dict.fromkeys(x[3] for x in tasks):
        got = [x for x in tasks if x[3] == name]
        lanes[name] = tuple(np.array([x[i] for x in got], dtype=float if i else np.int64) for i in (0, 4, 5))
    exposed: dict[str, float] = {}
    for name, (lr, ls, le) in lanes.items():  # summed over the ranks in the order of their first interval
        per_rank = _exposed_by_rank(np, r_o, cs_o, ce_o, T, lr, ls, le, R)
        ranks, first = np.unique(_small(np, lr, R), return_index=True)
        total = 0.0
        for r in ranks[np.argsort(first, kind="stable")].tolist():
            total += per_rank[r]
        exposed[name] = total
    tl = Timeline(
        events=_Lazy(events),
        iteration_time=T,
        per_rank_busy=busy,
        per_rank_idle=idle,
        bubble_fraction=total_idle / (T * R) if T > 0 and R > 0 else 0.0,
        bubble_overhead=total_idle / total_busy if total_busy > 0 else 0.0,
        exposed_comm=exposed,
        critical_path=_Lazy(critical_path),
        peak_activations=_peaks_in_lane_order(np, r_o, cs_o, ce_o, pk.plus[order], pk.minus[order], R),
        schedule_name=schedule.name,
        num_ranks=R,
    )
    return tl
