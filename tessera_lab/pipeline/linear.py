"""The simulator's linear pass for schedules without explicit SEND/RECV actions and without blocking sends.

In that case the order in which :func:`tessera_lab.pipeline.engine.simulate`'s event loop runs the actions (a
stack of ready ranks, each running until an input is missing, woken when it arrives) depends on which inputs
exist, never on the durations. :func:`linear_plan` replays that loop once without times and records the order
(with the dependencies as integer slots); :func:`run_linear` then computes every start and end in one pass over it:
the same events, in the same order, with the same arithmetic and tie rules as the event loop (so the timelines are
identical), without wait lists or tuple-keyed dictionaries.
"""

from __future__ import annotations

import math

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.timeline import Event

_OP_COMPUTE = 0


def linear_plan(programs: list[list[tuple]], s2r) -> list[tuple] | None:
    """The execution order of ``programs`` (compute ops only) as the event loop would run them, each entry
    ``(order, number of slots, transfer pairs)``, each entry of ``order``
    ``(rank, needs, produces, dur_key, stage, mb, type, label, plus, minus)`` with ``needs`` as ``(cross, slot)``
    and ``produces`` as ``(slot, dst_stage, transfer)`` where ``transfer`` is ``None`` (no cross-rank transfer)
    or ``(pair index, dst_rank, kind, label, microbatch)`` (``pair index`` into the
    ``(src stage, dst stage)`` list); ``None`` when the programs cannot all run (a deadlock: the event
    loop then reports it) or hold a non-compute op."""
    R = len(programs)
    slots: dict[tuple, int] = {}

    def slot(key: tuple) -> int:
        got = slots.get(key)
        if got is None:
            got = slots[key] = len(slots)
        return got

    pairs: dict[tuple[int, int], int] = {}  # (src stage, dst stage) of each cross-rank transfer -> index
    done: set[tuple] = set()
    arrived: set[tuple] = set()
    w_done: dict[tuple, list[int]] = {}
    w_arr: dict[tuple, list[int]] = {}
    pc = [0] * R
    ready = list(range(R))
    in_ready = [True] * R
    order: list[tuple] = []

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
                if key not in (arrived if cross else done):
                    missing = (w_arr if cross else w_done, key)
                    break
            if missing is not None:
                missing[0].setdefault(missing[1], []).append(r)
                break
            outs = []
            for key, dst in produces:
                done.add(key)
                if key in w_done:
                    wake(w_done, key)
                transfer = None
                if dst >= 0:
                    kind = "RECV_F" if key[0] == "F" else "RECV_B"
                    pair = (key[1], dst)
                    if pair not in pairs:
                        pairs[pair] = len(pairs)
                    transfer = (pairs[pair], s2r[dst], kind, f"{dst}{kind}{key[2]}", key[2])
                    arrived.add(key)
                    if key in w_arr:
                        wake(w_arr, key)
                outs.append((slot(key), dst, transfer))
            order.append((r, tuple((cross, slot(key)) for cross, key in needs), tuple(outs), dur_key, ev_stage,
                          ev_mb, typ, label, plus, minus))
            k += 1
        pc[r] = k
    if any(pc[r] < len(programs[r]) for r in range(R)):
        return None
    return order, len(slots), list(pairs)


def run_linear(plan: tuple[list[tuple], int, list], R: int, durations, xfer):
    """One pass over a :func:`linear_plan`: ``(events, preds, busy, act_deltas)`` as the event loop builds them
    (``xfer(src, dst)`` asked once per stage pair, before the pass).

    Raises:
        ScheduleError: a duration that is negative or not finite.
    """
    plan, n_slots, pairs = plan
    pair_time = [xfer(a, b) for a, b in pairs]
    done = [0.0] * n_slots
    done_ev = [-1] * n_slots
    arrival = [0.0] * n_slots
    arrival_ev = [-1] * n_slots
    t_rank = [0.0] * R
    last_ev = [-1] * R
    busy = [0.0] * R
    act_deltas: list[list[tuple[float, int]]] = [[] for _ in range(R)]
    events: list[Event] = []
    preds: list[int] = []
    ev_append, pred_append = events.append, preds.append
    inf = math.inf
    n_ev = 0
    for r, needs, produces, dur_key, ev_stage, ev_mb, typ, label, plus, minus in plan:
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
        d = durations(*dur_key)
        if not 0.0 <= d < inf:
            raise ScheduleError(f"durations{dur_key} returned {d!r}; allowed finite seconds >= 0")
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
        for s, dst, transfer in produces:
            done[s] = end
            done_ev[s] = idx
            if transfer is None:
                continue
            dt = pair_time[transfer[0]]
            if dt > 0:
                ev_append(Event(transfer[1], dst, transfer[4], transfer[2], end, end + dt, "comm", transfer[3]))
                pred_append(idx)
                arrival_ev[s] = n_ev
                n_ev += 1
            else:
                arrival_ev[s] = idx
            arrival[s] = end + dt
    return events, preds, busy, act_deltas
