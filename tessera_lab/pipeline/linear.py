"""The simulator's linear pass for schedules without explicit SEND/RECV actions and without blocking sends.

In that case the order in which :func:`tessera_lab.pipeline.engine.simulate`'s event loop runs the actions (a
stack of ready ranks, each running until an input is missing, woken when it arrives) depends on which inputs
exist, never on the durations. The event loop records that order on its first run of a schedule;
:func:`pack_trace` packs it as flat integer lists (a :class:`Packed` plan: the event loop's compiled form, not a
second walk); :func:`run_linear` then computes every end time in one tight pass over them: an action starts at the later of its rank's previous end and the arrival of each input produced on another
rank (the producer's end plus the stage pair's transfer time), and ends ``duration`` seconds later. Inputs produced
on the same rank need no test: their producer ran earlier on the same lane, so they are there by the rank's clock.
The floats are those of the event loop (the same additions and comparisons); the starts, each start's predecessor
(the event loop's tie rules) and the events are derived from the ends on arrays when first read
(:class:`LinearRun`), so the timeline is the event loop's, bit for bit.
"""

from __future__ import annotations

from bisect import bisect_left

import math
from itertools import repeat

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.timeline import Event



def pack_trace(programs: list[list[tuple]], s2r, order: list[int]) -> "Packed":
    """The event loop's run of ``programs`` (compute ops only), recorded as ``order`` (the rank of each compute
    action, in the order the loop ran them: :class:`tessera_lab.pipeline.engine._EventLoop`), as a :class:`Packed`
    plan: per entry its rank's previous entry and its inputs from other ranks (the producing entry, the stage pair,
    the transfer), per transfer its producer, pair and receiving rank. Not a walk: the order is given."""
    pairs: dict[tuple[int, int], int] = {}  # (src stage, dst stage) of each cross-rank transfer -> index
    arrived: dict[tuple, int] = {}  # key -> index of the transfer that brought it (the latest)
    pc = [0] * len(programs)
    last_of = [0] * len(programs)  # per rank: 1 + its latest entry (0: none yet)
    meta: list[tuple] = []
    rows: list[tuple] = []  # per entry: rank, plus, minus, prev, p1, x1, k1, p2, x2, k2, *durations key
    transfers_of: list[tuple] = []  # per transfer: producing entry, pair, receiving rank
    no_input = (0, -1, -1)
    for j, r in enumerate(order):
        op = programs[r][pc[r]]
        pc[r] += 1
        _, a, needs, produces, dur_key, ev_stage, ev_mb, typ, label, plus, minus = op
        inputs = []  # (1 + producing entry, pair, transfer) of each input from another rank
        for cross, key in needs:
            if cross:
                t = arrived[key]
                e_, pair_, _ = transfers_of[t]
                inputs.append((e_ + 1, pair_, t))
        first = inputs[0] if inputs else no_input
        second = inputs[1] if len(inputs) > 1 else no_input
        rows.append((r, plus, minus, last_of[r], *first, *second, *dur_key))
        last_of[r] = j + 1
        transfers = []
        for key, dst in produces:
            if dst < 0:
                continue
            pair = pairs.get((key[1], dst))
            if pair is None:
                pair = pairs[(key[1], dst)] = len(pairs)
            dst_rank = s2r[dst]
            kind = "RECV_F" if key[0] == "F" else "RECV_B"
            transfers.append((pair, dst_rank, dst, kind, key[2], f"{dst}{kind}{key[2]}"))
            arrived[key] = len(transfers_of)
            transfers_of.append((j, pair, dst_rank))
        meta.append((r, ev_stage, ev_mb, typ, label, tuple(transfers), (plus, minus) if plus or minus else None))
    cols = [list(c) for c in zip(*rows)] if rows else [[] for _ in range(13)]
    tr = [list(c) for c in zip(*transfers_of)] if transfers_of else [[], [], []]
    used = set(cols[6]) | set(cols[9])
    dangling = [t for t in range(len(transfers_of)) if t not in used]  # transfers no action waits for
    return Packed(meta, cols[10:13], cols[3], cols[4:10], list(pairs), cols[0], cols[1], cols[2], *tr, dangling)


class Packed:
    """A :func:`linear_plan`, in the plan's order (entry ``j`` = the ``j``-th compute action the event loop runs):

    * ``keys``: the ``durations`` arguments of every entry (lists of stages, micro-batches, types);
    * per entry (numpy arrays): ``prev`` (1 + the rank's previous entry, 0 for its first), and per input from
      another rank (at most two, in input order) ``p1``/``p2`` (1 + the producing entry, 0 none), ``x1``/``x2`` (its
      stage pair, an index into ``pairs``; -1 none), ``k1``/``k2`` (the transfer that brings it; -1 none); ``rank``,
      ``plus``, ``minus`` (activations taken at the start and freed at the end); ``loop``: ``prev``, ``p1``, ``p2``,
      ``k1``, ``k2`` as lists, for the passes;
    * per transfer in event order (numpy arrays): ``tr_entry``, ``tr_pair``, ``tr_rank`` (producing entry, stage
      pair, receiving rank); ``dangling``: ``(1 + producing entry, pair)`` of the transfers no entry waits for;
    * ``meta`` per entry ``(rank, stage, mb, type, label, transfers, deltas)`` with transfers ``(pair, dst rank, dst
      stage, kind, mb, label)`` and deltas ``(plus, minus)`` or ``None``, for the events."""

    __slots__ = ("meta", "keys", "loop", "n", "pairs", "dangling", "_lists", "_arrays", "_by_rank", "_offsets",
                 "_labels", "_columns", "_timed")

    # params: a slotted record's constructor, one argument per column linear_plan builds (see the class docstring)
    def __init__(self, meta, keys, prev, need, pairs, ranks, plus, minus, tr_entry, tr_pair, tr_rank, dangling):
        self.meta, self.keys, self.pairs, self.n = meta, keys, pairs, len(meta)
        self.loop = (prev, need[0], need[3], need[2], need[5])  # as lists, for the passes: prev, p1, p2, k1, k2
        # the integer columns as lists; as numpy arrays (attributes of the same names) only when an array path reads
        # them, so a short schedule's pass never imports numpy
        self._lists = dict(zip(_ARRAY_FIELDS, (ranks, plus, minus, prev, *need, tr_entry, tr_pair, tr_rank)))
        self._arrays: dict = {}
        self.dangling = [(tr_entry[t] + 1, tr_pair[t]) for t in dangling]
        self._by_rank = None
        self._offsets = None
        self._labels = None
        self._columns = None
        self._timed = None

    def last_by_label(self) -> dict:
        """``(rank, label) -> entry``: the rank's last entry with that label (a pair's entry also answers to each
        sub-action's label)."""
        if self._labels is None:
            got = {}
            for j, (r, _, _, typ, label, _, _) in enumerate(self.meta):
                got[(r, label)] = j
                if typ == "OVERLAP_F_B":
                    for x in label[1:label.index(")")].split(";"):
                        got[(r, x.strip())] = j
            self._labels = got
        return self._labels

    def columns(self) -> tuple:
        """The events' fields as lists: per entry rank, stage, micro-batch, type, label; per transfer (event order)
        ``[ranks, stages, micro-batches, kinds, labels]``."""
        if self._columns is None:
            cols = [list(c) for c in zip(*[m[:5] for m in self.meta])] if self.meta else [[], [], [], [], []]
            flat = [(t[1], t[2], t[4], t[3], t[5]) for m in self.meta for t in m[5]]
            tcols = [list(c) for c in zip(*flat)] if flat else [[], [], [], [], []]
            self._columns = (*cols, tcols)
        return self._columns

    def by_rank(self, R: int):
        """``(order, lo)``: the entries grouped by rank (stable: lane order), rank ``r``'s at ``order[lo[r]:lo[r +
        1]]``."""
        if self._by_rank is None:
            import numpy as np

            rank = self.rank
            order = np.argsort(rank, kind="stable")
            self._by_rank = (order, np.searchsorted(rank[order], np.arange(R + 1), "left"))
        return self._by_rank

    def offsets(self, pair_time: list[float]):
        """Per entry, the transfer seconds of its inputs from other ranks as the pass reads them: ``(o1, o2, pt)``
        lists (0 where no input; ``pt``: ``pair_time``), for ``pair_time`` per stage pair (the last set kept)."""
        key = tuple(pair_time)
        if self._offsets is None or self._offsets[0] != key:
            pt = list(pair_time) + [0.0]  # index -1: no input
            self._offsets = (key, [pt[x] for x in self._lists["x1"]], [pt[x] for x in self._lists["x2"]], pt[:-1])
        return self._offsets[1:]

    def timed_entries(self, pair_time: list[float]) -> list[int]:
        """The entries of the transfers that take time under ``pair_time`` (seconds per stage pair), ascending (event
        order); the last set kept."""
        key = tuple(t > 0 for t in pair_time)
        if self._timed is None or self._timed[0] != key:
            lists = self._lists
            self._timed = (key, [e for e, p in zip(lists["tr_entry"], lists["tr_pair"]) if key[p]])
        return self._timed[1]


#: :class:`Packed`'s integer columns, read as numpy arrays (int64) by the array paths
_ARRAY_FIELDS = ("rank", "plus", "minus", "prev", "p1", "x1", "k1", "p2", "x2", "k2", "tr_entry", "tr_pair", "tr_rank")


def _array_field(name: str) -> property:
    def get(self):
        got = self._arrays.get(name)
        if got is None:
            import numpy as np

            got = self._arrays[name] = np.array(self._lists[name], dtype=np.int64)
        return got

    return property(get, doc=f"``{name}`` per entry (or transfer) as an int64 array, made when first read")


for _name in _ARRAY_FIELDS:
    setattr(Packed, _name, _array_field(_name))


class LinearRun:
    """What one :func:`run_linear` pass computed, in the plan's order (entry ``j`` = its ``j``-th compute action):
    ``ends`` (``ends[j + 1]``: entry ``j``'s end, seconds; ``ends[0] = 0``), the durations, ``pair_time`` (seconds
    per stage pair). Derived on arrays when first read: ``end``, ``start`` (lists, seconds), ``end_array``,
    ``start_array``, ``pred`` (event index that set each start, -1 none: the event loop's tie rules), ``busy`` (per
    rank, the durations summed in lane order). :meth:`events` lays out the events as the event loop lists them (each
    compute event followed by its transfers that take time) with their predecessors."""

    __slots__ = ("packed", "R", "ends", "durs", "pair_time", "_o", "_cache")

    def __init__(self, packed, R, ends, durs, pair_time, offsets):
        self.packed, self.R, self.ends, self.durs, self.pair_time, self._o = packed, R, ends, durs, pair_time, offsets
        self._cache: dict = {}

    @property
    def _oarr(self):
        """The offsets as arrays: ``(o1, o2, pair_time)`` (the same floats as the lists the pass read)."""
        def make():
            import numpy as np

            return tuple(np.array(v, dtype=float) for v in self._o)

        return self._get("oarr", make)

    def iteration_time(self) -> float:
        """The latest event end (seconds; 0 without events): the latest end, or a transfer no action waits for (one
        an action waits for ends by that action's start)."""
        ends, pt = self.ends, self.pair_time
        return max(0.0, max(ends), *(ends[p] + pt[x] for p, x in self.packed.dangling))

    def _get(self, name, make):
        got = self._cache.get(name)
        if got is None:
            got = self._cache[name] = make()
        return got

    @property
    def end_array(self):
        import numpy as np

        return self._get("end_array", lambda: np.array(self.ends, dtype=float))

    @property
    def start_array(self):
        """Each start from the ends: the same comparisons as the pass (a missing input reads ``ends[0] + 0``)."""
        def make():
            import numpy as np

            pk, E = self.packed, self.end_array
            s = E[pk.prev]
            s = np.maximum(s, E[pk.p1] + self._oarr[0])
            return np.maximum(s, E[pk.p2] + self._oarr[1])

        return self._get("start_array", make)

    @property
    def start(self) -> list[float]:
        return self._get("start", lambda: self.start_array.tolist())

    @property
    def end(self) -> list[float]:
        return self.ends[1:]

    @property
    def busy(self) -> list[float]:
        """Per rank, its durations summed in lane order (sequential float additions, as the event loop)."""
        def make():
            import numpy as np

            order, lo = self.packed.by_rank(self.R)
            d = self._cache.get("durs_array")
            d = (np.array(self.durs, dtype=float) if d is None else d)[order]
            return [float(np.cumsum(d[lo[r]:lo[r + 1]])[-1]) if lo[r + 1] > lo[r] else 0.0 for r in range(self.R)]

        return self._get("busy", make)

    def event_index(self):
        """``(gc, gq, tmask)``: each entry's event index, each transfer that takes time's event index, and which
        transfers take time (event order: each compute event followed by its transfers that take time)."""
        def make():
            import numpy as np

            pk = self.packed
            tmask = self._oarr[2][pk.tr_pair] > 0
            tr_e = pk.tr_entry[tmask]
            n = pk.n
            gc = np.arange(n) + np.searchsorted(tr_e, np.arange(n), "left")
            return gc, tr_e + np.arange(len(tr_e)) + 1, tmask

        return self._get("event_index", make)

    @property
    def pred(self) -> list[int]:
        """The event that set each entry's start under the event loop's rules: the rank's previous event; an input
        from another rank that arrives later, or at the same time while the previous event still holds (in input
        order); the arrival's event is the transfer, or the producer itself when the transfer takes no time."""
        def make():
            import numpy as np

            pk, E = self.packed, self.end_array
            if not pk.n:
                return []
            gc, gq, tmask = self.event_index()
            tr_ev = np.append(gc[pk.tr_entry], -1)  # index -1: no input
            tr_ev[:-1][tmask] = gq
            last = np.where(pk.prev > 0, gc[pk.prev - 1], -1)
            t = E[pk.prev]
            v1 = E[pk.p1] + self._oarr[0]
            fire = (pk.p1 > 0) & (v1 >= t)
            pred = np.where(fire, tr_ev[pk.k1], last)
            s = np.where(fire, v1, t)
            v2 = E[pk.p2] + self._oarr[1]
            fire = (pk.p2 > 0) & ((v2 > s) | ((v2 == s) & (pred == last)))
            return np.where(fire, tr_ev[pk.k2], pred).tolist()

        return self._get("pred", make)

    def locate(self, needed: set) -> dict:
        """For :func:`tessera_lab.pipeline.timeline._comm_tasks`: each needed ``(rank, label)`` that runs -> ``(end,
        event index, stage, mb)`` of the rank's last compute event with that label."""
        last = self.packed.last_by_label()
        found = {k: last[k] for k in needed if k in last}
        if not found:
            return {}
        # entry j's event index: j plus the transfers that take time made before it (as event_index, without arrays)
        timed = self.packed.timed_entries(self.pair_time)  # ascending: event order
        meta, ends = self.packed.meta, self.ends
        return {k: (ends[j + 1], j + bisect_left(timed, j), meta[j][1], meta[j][2]) for k, j in found.items()}

    def events(self) -> tuple[list[Event], list[int]]:
        """``(events, preds)`` as the event loop builds them: each compute event followed by its transfers that take
        time, and each event's predecessor; made on arrays."""
        import numpy as np

        pk = self.packed
        n = pk.n
        ranks, stages, mbs, types, labels, tcols = pk.columns()
        gc, gq, tmask = self.event_index()
        events = list(map(Event, ranks, stages, mbs, types, self.start, self.end, repeat("compute", n), labels))
        preds = np.empty(n + len(gq), dtype=np.int64)
        preds[gc] = self.pred
        if len(gq):
            sel = np.flatnonzero(tmask)
            cols = tcols if len(sel) == len(tmask) else [[c[i] for i in sel.tolist()] for c in tcols]
            qs = self.end_array[pk.tr_entry[sel] + 1]
            qe = qs + self._oarr[2][pk.tr_pair[sel]]  # the producer's end + the pair's seconds, as the event loop adds
            comm = list(map(Event, cols[0], cols[1], cols[2], cols[3], qs.tolist(), qe.tolist(),
                            repeat("comm", len(sel)), cols[4]))
            preds[gq] = gc[pk.tr_entry[sel]]
            laid = [None] * (n + len(gq))
            for i, e in zip(gc.tolist(), events):
                laid[i] = e
            for i, e in zip(gq.tolist(), comm):
                laid[i] = e
            events = laid
        return events, preds.tolist()


def _check(durs: list, keys) -> None:
    """Raise :class:`ScheduleError` naming the first duration that is negative or not finite (``keys``: the
    ``durations`` arguments, three lists)."""
    for j, d in enumerate(durs):
        if not 0.0 <= d < math.inf:
            raise ScheduleError(f"durations{tuple(k[j] for k in keys)} returned {d!r}; allowed finite seconds >= 0")


def run_linear(packed: Packed, R: int, durations, xfer, make_events: bool = False, arrays: bool = False):
    """One pass over a :class:`Packed` :func:`linear_plan`: every end with the event loop's arithmetic (``xfer(src,
    dst)`` asked once per stage pair, before the pass; ``durations`` once per action, in the plan's order, or once
    for all through its ``batch`` method where it has one: see :mod:`tessera_lab.pipeline.durations`).

    Returns a :class:`LinearRun` (starts, predecessors and events derived when read), or with ``make_events``
    ``(events, preds, busy, act_deltas)`` as the event loop builds them (:func:`_pass_with_events`). ``arrays``:
    the caller will read the run's arrays (the durations are then checked on an array, which the busy times reuse).

    Raises:
        ScheduleError: a duration that is negative or not finite.
    """
    pair_time = [xfer(a, b) for a, b in packed.pairs]
    o1, o2, pt = packed.offsets(pair_time)
    batch = getattr(durations, "batch", None)
    durs = batch(*packed.keys) if batch is not None else list(map(durations, *packed.keys))
    darr = None
    if arrays and durs:
        import numpy as np

        try:
            darr = np.array(durs, dtype=float)
        except (TypeError, ValueError):
            _check(durs, packed.keys)
            raise
        if not (np.isfinite(darr).all() and (darr >= 0.0).all()):
            _check(durs, packed.keys)
    elif durs:
        if not (min(durs) >= 0.0 and max(durs) < math.inf) or math.isnan(sum(durs)):
            _check(durs, packed.keys)
    E = [0.0]
    append = E.append
    if make_events:
        return _pass_with_events(packed, R, durs, pair_time, o1, o2)
    prev, p1s, p2s = packed.loop[:3]
    for q, p1, a, p2, b, d in zip(prev, p1s, o1, p2s, o2, durs):
        s = E[q]
        if p1:
            v = E[p1] + a
            if v > s:
                s = v
            if p2:
                v = E[p2] + b
                if v > s:
                    s = v
        append(s + d)
    run = LinearRun(packed, R, E, durs, pair_time, (o1, o2, pt))
    if darr is not None:
        run._cache["durs_array"] = darr
    return run


def _pass_with_events(packed: Packed, R: int, durs: list, pair_time: list, o1: list, o2: list):
    """The pass that also makes the events as it goes (cheaper than the arrays for short schedules): the same
    starts and ends, each start's predecessor by the event loop's rules (the rank's previous event; an input from
    another rank arriving later, or at the same time while the previous event still holds); returns ``(events,
    preds, busy, act_deltas)`` as the event loop builds them."""
    prev, p1s, p2s, k1s, k2s = packed.loop
    E = [0.0]  # 1 + entry -> its end
    G = [-1]  # 1 + entry -> its event index
    arr_ev = [-1] * len(packed._lists["tr_entry"])  # transfer -> the event its input is there by (itself, or its producer)
    events: list[Event] = []
    preds: list[int] = []
    busy = [0.0] * R
    act_deltas: list[list[tuple[float, int]]] = [[] for _ in range(R)]
    ev_append, pred_append = events.append, preds.append
    t = 0
    for j, (r, stage, mb, typ, label, transfers, pm) in enumerate(packed.meta):
        q = prev[j]
        start = E[q]
        pred = last = G[q]
        p1 = p1s[j]
        if p1:
            v = E[p1] + o1[j]
            if v >= start:
                start, pred = v, arr_ev[k1s[j]]
            p2 = p2s[j]
            if p2:
                v = E[p2] + o2[j]
                if v > start or (v == start and pred == last):
                    start, pred = v, arr_ev[k2s[j]]
        d = durs[j]
        e = start + d
        idx = len(events)
        ev_append(Event(r, stage, mb, typ, start, e, "compute", label))
        pred_append(pred)
        E.append(e)
        G.append(idx)
        busy[r] += d
        if pm is not None:
            if pm[0]:
                act_deltas[r].append((start, pm[0]))
            if pm[1]:
                act_deltas[r].append((e, -pm[1]))
        for pair, dst_rank, dst, kind, tmb, tlabel in transfers:
            dt = pair_time[pair]
            if dt > 0:
                arr_ev[t] = len(events)
                ev_append(Event(dst_rank, dst, tmb, kind, e, e + dt, "comm", tlabel))
                pred_append(idx)
            else:
                arr_ev[t] = idx
            t += 1
    return events, preds, busy, act_deltas
