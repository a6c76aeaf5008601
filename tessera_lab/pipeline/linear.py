"""The simulator's linear pass for schedules without explicit SEND/RECV actions and without blocking sends.

In that case the order in which :func:`tessera_lab.pipeline.engine.simulate`'s event loop runs the actions (a
stack of ready ranks, each running until an input is missing, woken when it arrives) depends on which inputs
exist, never on the durations. :func:`linear_plan` replays that loop once without times and records the order
(with the dependencies as integer slots, transfers as stage-pair indices: a :class:`Packed` plan);
:func:`run_linear` then computes every start and end in one pass over it: the same events, in the same order, with
the same arithmetic and tie rules as the event loop (so the timelines are identical), without wait lists or
tuple-keyed dictionaries, and for long schedules without event objects (:class:`LinearRun`: starts, ends and
predecessors in lists, analysed on arrays by :func:`tessera_lab.pipeline.timeline._linear_timeline`; the events are
made when first read).
"""

from __future__ import annotations

import math

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.timeline import Event

_OP_COMPUTE = 0


def linear_plan(programs: list[list[tuple]], s2r) -> "Packed | None":
    """The execution order of ``programs`` (compute ops only) as the event loop would run them, as a
    :class:`Packed` plan (dependencies as integer slots, transfers as stage-pair indices); ``None`` when the
    programs cannot all run (a deadlock: the event loop then reports it) or hold a non-compute op."""
    R = len(programs)
    slots: dict[tuple, int] = {}  # the outputs produced so far, each with its slot
    pairs: dict[tuple[int, int], int] = {}  # (src stage, dst stage) of each cross-rank transfer -> index
    arrived: set[tuple] = set()
    w_done: dict[tuple, list[int]] = {}
    w_arr: dict[tuple, list[int]] = {}
    pc = [0] * R
    ready = list(range(R))
    in_ready = [True] * R
    entries: list[tuple] = []
    ev_entries: list[tuple] = []
    meta: list[tuple] = []
    ranks: list[int] = []
    pluses: list[int] = []
    minuses: list[int] = []
    tr_entry: list[int] = []
    tr_pair: list[int] = []
    tr_rank: list[int] = []

    def wake(wdict: dict, key: tuple) -> None:
        for q in wdict.pop(key):
            if not in_ready[q]:
                in_ready[q] = True
                ready.append(q)

    while ready:
        r = ready.pop()
        in_ready[r] = False
        prog = programs[r]
        n, k = len(prog), pc[r]
        while k < n:
            op = prog[k]
            if op[0] != _OP_COMPUTE:
                return None
            _, a, needs, produces, dur_key, ev_stage, ev_mb, typ, label, plus, minus = op
            missing = None
            for cross, key in needs:
                if key not in (arrived if cross else slots):
                    missing = (w_arr if cross else w_done, key)
                    break
            if missing is not None:
                missing[0].setdefault(missing[1], []).append(r)
                break
            j = len(entries)
            prods, transfers, full = [], [], []
            for key, dst in produces:
                got = slots.get(key)
                if got is None:
                    got = slots[key] = len(slots)
                if key in w_done:
                    wake(w_done, key)
                if dst < 0:
                    prods.append((got, -1))
                    full.append((got, None))
                    continue
                pair = pairs.get((key[1], dst))
                if pair is None:
                    pair = pairs[(key[1], dst)] = len(pairs)
                dst_rank = s2r[dst]
                prods.append((got, pair))
                kind = "RECV_F" if key[0] == "F" else "RECV_B"
                transfers.append((pair, dst_rank, dst, kind, key[2], f"{dst}{kind}{key[2]}"))
                full.append((got, transfers[-1]))
                tr_entry.append(j)
                tr_pair.append(pair)
                tr_rank.append(dst_rank)
                arrived.add(key)
                if key in w_arr:
                    wake(w_arr, key)
            meta.append((r, ev_stage, ev_mb, typ, label, tuple(transfers), (plus, minus) if plus or minus else None))
            slot_needs = tuple((cross, slots[key]) for cross, key in needs)
            entries.append((r, slot_needs, tuple(prods), *dur_key))
            ev_entries.append((r, slot_needs, tuple(full), *dur_key, ev_stage, ev_mb, typ, label, plus, minus))
            ranks.append(r)
            pluses.append(plus)
            minuses.append(minus)
            k += 1
        pc[r] = k
    if any(pc[r] < len(programs[r]) for r in range(R)):
        return None
    return Packed(entries, ev_entries, meta, len(slots), list(pairs), ranks, pluses, minuses, tr_entry, tr_pair,
                  tr_rank)


class LinearRun:
    """What one :func:`run_linear` pass computed, in the plan's order (entry ``j`` = its ``j``-th compute action):
    ``start[j]``, ``end[j]`` (seconds), ``pred[j]`` (event index that set its start, -1 none), ``busy`` per rank,
    ``pair_time`` (seconds per transfer pair), ``arrival_max``. :meth:`events` lays out the events as the event loop lists them
    (each compute event followed by its transfers that take time) with their predecessors."""

    __slots__ = ("packed", "start", "end", "pred", "busy", "pair_time", "arrival_max")

    def __init__(self, packed, start, end, pred, busy, pair_time, arrival_max=0.0):
        self.packed, self.start, self.end, self.pred, self.busy, self.pair_time = packed, start, end, pred, busy, pair_time
        self.arrival_max = arrival_max  # the latest input arrival: the latest transfer end (an end + 0 otherwise)

    def iteration_time(self) -> float:
        """The latest event end (seconds; 0 without events)."""
        return max(0.0, max(self.end, default=0.0), self.arrival_max)

    def events(self, R: int) -> tuple[list[Event], list[int], list[list[tuple[float, int]]]]:
        """``(events, preds, act_deltas)`` as the event loop builds them (``act_deltas``: per rank, ``(time,
        +activations taken)`` at each start and ``(time, -activations freed)`` at each end)."""
        events: list[Event] = []
        preds: list[int] = []
        act_deltas: list[list[tuple[float, int]]] = [[] for _ in range(R)]
        ev_append, pred_append = events.append, preds.append
        pt, start, end, pred = self.pair_time, self.start, self.end, self.pred
        for j, (r, stage, mb, typ, label, transfers, pm) in enumerate(self.packed.meta):
            e = end[j]
            idx = len(events)
            ev_append(Event(r, stage, mb, typ, start[j], e, "compute", label))
            pred_append(pred[j])
            if pm is not None:
                if pm[0]:
                    act_deltas[r].append((start[j], pm[0]))
                if pm[1]:
                    act_deltas[r].append((e, -pm[1]))
            for pair, dst_rank, dst, kind, tmb, tlabel in transfers:
                dt = pt[pair]
                if dt > 0:
                    ev_append(Event(dst_rank, dst, tmb, kind, e, e + dt, "comm", tlabel))
                    pred_append(idx)
        return events, preds, act_deltas


class Packed:
    """A :func:`linear_plan` in the form the pass reads: ``entries`` ``(rank, needs, produces, *dur_key)`` with
    ``needs`` ``(cross, slot)`` and ``produces`` ``(slot, pair)`` (pair -1: no cross-rank transfer, else an index
    into ``pairs``, the ``(src stage, dst stage)`` list); ``meta`` per entry ``(rank, stage, mb, type, label,
    transfers, deltas)`` with transfers ``(pair, dst rank, dst stage, kind, mb, label)`` and deltas ``(plus,
    minus)`` or ``None``; ``ev_entries``, the same with the event fields, for the pass that makes events; numpy arrays per entry (``rank``,
    ``plus``, ``minus``: activations taken at the start and freed at the end) and per transfer (``tr_entry``,
    ``tr_pair``, ``tr_rank``: producing entry, stage pair, receiving rank), in event order."""

    __slots__ = ("entries", "ev_entries", "meta", "n_slots", "pairs", "rank", "plus", "minus", "tr_entry", "tr_pair",
                 "tr_rank", "_by_rank")

    def __init__(self, entries, ev_entries, meta, n_slots, pairs, ranks, plus, minus, tr_entry, tr_pair, tr_rank):
        import numpy as np

        self.entries, self.ev_entries, self.meta, self.n_slots, self.pairs = entries, ev_entries, meta, n_slots, pairs
        self.rank, self.plus, self.minus = (np.array(x, dtype=np.int64) for x in (ranks, plus, minus))
        self.tr_entry, self.tr_pair, self.tr_rank = (np.array(x, dtype=np.int64) for x in (tr_entry, tr_pair, tr_rank))
        self._by_rank = None

    def by_rank(self, R: int):
        """``(order, lo)``: the entries grouped by rank (stable), rank ``r``'s at ``order[lo[r]:lo[r + 1]]``."""
        if self._by_rank is None:
            import numpy as np

            order = np.argsort(self.rank, kind="stable")
            self._by_rank = (order, np.searchsorted(self.rank[order], np.arange(R + 1), "left"))
        return self._by_rank


def run_linear(packed: Packed, R: int, durations, xfer, make_events: bool = False):
    """One pass over a :class:`Packed` :func:`linear_plan`: every start and end with the event loop's arithmetic
    and tie rules (``xfer(src, dst)`` asked once per stage pair, before the pass; ``durations`` once per action).

    Returns a :class:`LinearRun` (no event objects made: :meth:`LinearRun.events` makes them when asked), or with
    ``make_events`` ``(events, preds, busy, act_deltas)`` as the event loop builds them (one pass: the cheaper way
    for short schedules whose timeline is analysed from its events).

    Raises:
        ScheduleError: a duration that is negative or not finite.
    """
    pair_time = [xfer(a, b) for a, b in packed.pairs]
    n_slots = packed.n_slots
    done = [0.0] * n_slots
    done_ev = [-1] * n_slots
    arrival = [0.0] * n_slots
    arrival_ev = [-1] * n_slots
    t_rank = [0.0] * R
    last_ev = [-1] * R
    busy = [0.0] * R
    start_of: list[float] = []
    end_of: list[float] = []
    pred_of: list[int] = []
    start_append, end_append, pred_append = start_of.append, end_of.append, pred_of.append
    events: list[Event] = []
    ev_append = events.append
    act_deltas: list[list[tuple[float, int]]] = [[] for _ in range(R)]
    inf = math.inf
    n_ev = 0
    if make_events:
        for r, needs, produces, ds, dm, dk, ev_stage, ev_mb, typ, label, plus, minus in packed.ev_entries:
            last = last_ev[r]
            start, pred = t_rank[r], last
            for cross, s in needs:
                if cross:
                    v = arrival[s]
                    if v > start or (v == start and pred == last):
                        start, pred = v, arrival_ev[s]
                else:
                    v = done[s]
                    if v > start:
                        start, pred = v, done_ev[s]
            d = durations(ds, dm, dk)
            if not 0.0 <= d < inf:
                raise ScheduleError(f"durations{(ds, dm, dk)} returned {d!r}; allowed finite seconds >= 0")
            end = start + d
            idx = n_ev
            ev_append(Event(r, ev_stage, ev_mb, typ, start, end, "compute", label))
            pred_append(pred)
            n_ev += 1
            t_rank[r] = end
            last_ev[r] = idx
            busy[r] += d
            if plus:
                act_deltas[r].append((start, plus))
            if minus:
                act_deltas[r].append((end, -minus))
            for s, transfer in produces:
                done[s] = end
                done_ev[s] = idx
                if transfer is None:
                    continue
                dt = pair_time[transfer[0]]
                if dt > 0:
                    ev_append(Event(transfer[1], transfer[2], transfer[4], transfer[3], end, end + dt, "comm",
                                    transfer[5]))
                    pred_append(idx)
                    arrival_ev[s] = n_ev
                    n_ev += 1
                else:
                    arrival_ev[s] = idx
                arrival[s] = end + dt
        return events, pred_of, busy, act_deltas
    for r, needs, produces, ds, dm, dk in packed.entries:
        last = last_ev[r]
        start, pred = t_rank[r], last
        for cross, s in needs:
            if cross:
                v = arrival[s]
                if v > start or (v == start and pred == last):
                    start, pred = v, arrival_ev[s]
            else:
                v = done[s]
                if v > start:
                    start, pred = v, done_ev[s]
        d = durations(ds, dm, dk)
        if not 0.0 <= d < inf:
            raise ScheduleError(f"durations{(ds, dm, dk)} returned {d!r}; allowed finite seconds >= 0")
        end = start + d
        idx = n_ev
        n_ev += 1
        start_append(start)
        end_append(end)
        pred_append(pred)
        t_rank[r] = end
        last_ev[r] = idx
        busy[r] += d
        for s, pair in produces:
            done[s] = end
            done_ev[s] = idx
            if pair < 0:
                continue
            dt = pair_time[pair]
            if dt > 0:
                arrival_ev[s] = n_ev
                n_ev += 1
            else:
                arrival_ev[s] = idx
            arrival[s] = end + dt
    return LinearRun(packed, start_of, end_of, pred_of, busy, pair_time, max(arrival, default=0.0))
