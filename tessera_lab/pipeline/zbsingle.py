"""The greedy list scheduler of the zero-bubble search (:mod:`tessera_lab.pipeline.zerobubble`): its
:class:`Policy` switches, its general loop (:class:`GreedyGeneral`, any placement), the loop inlined for stage ``s``
on rank ``s`` (:func:`greedy_single`, the same orders as the general loop, tested), and the timing of a candidate order
(:func:`replay_single`: an activation-budget check, then the engine's replay policy, the simulator's float operations
with non-blocking sends). Times in
seconds (any consistent unit). Never imports torch.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.actions import Action, ActionType
from tessera_lab.pipeline.walk import Walk
from tessera_lab.pipeline.ir import Schedule

__all__ = ["Policy", "POLICIES", "greedy_single", "GreedyGeneral", "replay_single", "check_single", "action_table"]

_F, _I, _W = ActionType.F, ActionType.I, ActionType.W


@dataclass(frozen=True)
class Policy:
    """Switches of the greedy list scheduler (the docstring of :mod:`tessera_lab.pipeline.zerobubble`)."""

    f_first: bool = True  # F before a pending W when both can run (ZB-H2-like); False: W first (ZB-H1-like)
    stagger: bool = True  # at most 2(p - r) - 1 micro-batches awaiting I on rank r (single-chunk placement)
    fit: bool = False  # W fills an idle gap only if it ends before the next known F/I start
    reserve_all: bool = True  # ranks with several stages: a started micro-batch reserves room for all its later
    # stages on the rank (False: room for one later-stage forward per stage)


POLICIES: tuple[Policy, ...] = tuple(
    Policy(f_first=a, stagger=b, fit=c, reserve_all=d)
    for d in (True, False) for a in (True, False) for b in (True, False) for c in (False, True)
)


@lru_cache(maxsize=64)
def action_table(S: int, m: int) -> tuple[tuple[tuple[Action, ...], ...], ...]:
    """``table[kind][stage][k]``: the F, I and W :class:`Action` objects (kind 0, 1, 2) of ``S`` stages and ``m``
    micro-batches, built once (frozen, shared by every order built from them)."""
    return tuple(tuple(tuple(Action(s, kind, k) for k in range(m)) for s in range(S)) for kind in (_F, _I, _W))


# long: the zero-bubble search's hot loop, greedy_order inlined decision by decision (locals kept for speed)
def greedy_single(m: int, f: Sequence[float], i: Sequence[float], w: Sequence[float], p2p: float,
                   memory_budget: float, policy: Policy, stats: dict | None = None) -> dict[int, list[Action]] | None:
    """:func:`~tessera_lab.pipeline.zerobubble.greedy_order` for one stage per rank with stage ``s`` on rank ``s``:
    the same decisions and the same float operations, inlined (tests/test_zerobubble.py compares the orders on
    random inputs). ``f``, ``i``, ``w``: seconds per stage; ``p2p``: seconds per transfer; ``memory_budget``:
    micro-batches of activations per rank. Returns per-rank action lists, or ``None`` if the budget is too small
    for the order to finish. ``stats`` (a dict), if given, receives ``fit_differs``: whether a W ran where
    ``policy.fit`` would have waited; when it is False, the same call with ``fit=True`` returns the same order (both
    take the same decisions throughout). Raises nothing."""
    R = S = len(f)
    f_lim = [2 * (R - r) - 1 if policy.stagger else math.inf for r in range(R)]
    scale = max([1.0] + list(f) + list(i) + list(w))
    tol = 1e-9 * scale
    cap = memory_budget + 1e-9
    f_first, fit = policy.f_first, policy.fit
    FA, IA, WA = action_table(S, m)
    f_end = [[None] * m for _ in range(S)]
    i_end = [[None] * m for _ in range(S)]
    nf, ni, nw = [0] * S, [0] * S, [0] * S
    live = [0.0] * R
    t = [0.0] * R
    left = [3 * m] * R
    blocked: list[int] = []
    heap = [(0.0, r) for r in range(R)]
    lists: dict[int, list[Action]] = {r: [] for r in range(R)}
    last = S - 1
    pop, push = heapq.heappop, heapq.heappush
    inf = math.inf
    fit_differs = False
    while heap:
        T, r = pop(heap)
        if T != t[r] or not left[r] or r in blocked:
            continue  # stale entry
        k = ni[r]
        bi = None  # ready time of the oldest I, if known
        if k < nf[r]:
            bi = f_end[r][k]
            if r < last:
                e = i_end[r + 1][k]
                if e is None:
                    bi = None
                else:
                    e = e + p2p
                    bi = e if e > bi else bi
        kf = nf[r]
        bf = None  # ready time of the next F, if known and allowed
        if kf < m and live[r] + 1.0 <= cap and kf - k < f_lim[r]:
            if r == 0:
                bf = 0.0
            else:
                e = f_end[r - 1][kf]
                bf = None if e is None else e + p2p
        kind = None
        if bi is not None and bi <= T + tol:
            kind, ready = 1, bi
        else:
            f_now = bf is not None and bf <= T + tol
            w_pend = nw[r] < k
            if f_now and (f_first or not w_pend):
                kind, ready = 0, bf
            elif w_pend:
                if bi is None:
                    nxt = inf if bf is None else bf
                else:
                    nxt = bi if bf is None or bi < bf else bf
                if f_now or nxt == inf or T + w[r] <= nxt + tol:
                    kind, ready = 2, T
                elif not fit:
                    kind, ready = 2, T
                    fit_differs = True  # here policy.fit would wait instead: the fit order differs
        if kind is None:
            nxt = None
            if bi is not None:
                nxt = bi
            if bf is not None and (nxt is None or bf < nxt):
                nxt = bf
            Ttol = T + tol
            for x in range(R):
                if x != r and left[x] and t[x] > Ttol and (nxt is None or t[x] < nxt):
                    nxt = t[x]
            if nxt is None:
                blocked.append(r)
            else:
                t[r] = nxt
                push(heap, (nxt, r))
            continue
        tr = t[r]
        start = ready if ready > tr else tr
        if kind == 1:
            end = i_end[r][k] = start + i[r]
            ni[r] = k + 1
            lists[r].append(IA[r][k])
        elif kind == 0:
            end = f_end[r][kf] = start + f[r]
            nf[r] = kf + 1
            live[r] += 1.0
            lists[r].append(FA[r][kf])
        else:
            kw = nw[r]
            nw[r] = kw + 1
            live[r] -= 1.0
            end = start + w[r]
            lists[r].append(WA[r][kw])
        t[r] = end
        left[r] -= 1
        if left[r]:
            push(heap, (end, r))
        if blocked:
            for x in blocked:
                push(heap, (t[x], x))
            blocked.clear()
    if stats is not None:
        stats["fit_differs"] = fit_differs
    return lists if not any(left) else None


def replay_single(lists: dict[int, list[Action]], m: int, f, i, w, p2p: float, budget: float) -> float | None:
    """Makespan (seconds) of one-stage-per-rank F/I/W orders (stage ``s`` on rank ``s``, ``lists[r]`` holding stage
    ``r``'s ``3 m`` actions) under per-stage seconds ``f``, ``i``, ``w`` and ``p2p`` seconds per hop, timed by the
    engine's replay policy (:meth:`tessera_lab.pipeline.walk.Walk.replay`: the simulator's float operations, so its
    number); ``None`` if a rank's peak live activations (from the order alone, as ``order_peak``) exceed
    ``budget`` or the orders cannot run."""
    R = len(f)
    cap = budget + 1e-9
    for r in range(R):  # peak live activations from the order alone (order_peak)
        live = 0
        for a in lists[r]:
            if a.type is _F:
                live += 1
                if live > cap:
                    return None
            elif a.type is _W:
                live -= 1
    return Walk(R, by_clock=False).replay([lists[r] for r in range(R)], list(range(R)), m, f, i, w, p2p)


def check_single(sched: Schedule) -> Schedule:
    """The checks of :meth:`Schedule.validate` that the pruned search's candidates need beyond its replay (which
    has run the orders to the end): every rank ``r`` lists exactly the F, I and W of stage ``r`` for every
    micro-batch, once each."""
    m = sched.num_microbatches
    for r in range(sched.num_ranks):
        acts = sched.actions.get(r, [])
        want = set(action_table(sched.num_stages, m)[0][r] + action_table(sched.num_stages, m)[1][r]
                   + action_table(sched.num_stages, m)[2][r])
        if len(acts) != 3 * m or set(acts) != want:
            raise ScheduleError(f"zb-auto: rank {r}'s order does not hold each F, I and W of stage {r} once")
    return sched


class GreedyGeneral:
    """The general greedy list scheduler of :func:`greedy_order`: ranks in order of the time they are free (a heap
    with stale entries skipped); at its time a rank runs an I whose inputs are there, else a forward that fits the
    memory budget (and the stagger limit), else a pending W (when it fits before the next known input, with
    ``policy.fit``), else waits for the next input or another rank's progress."""

    def __init__(self, stage_to_rank, m, f, i, w, p2p, memory_budget, policy):
        S = len(stage_to_rank)
        R = max(stage_to_rank.values()) + 1
        self.s2r, self.m, self.f, self.i, self.w, self.p2p, self.policy, self.S, self.R = (
            stage_to_rank, m, f, i, w, p2p, policy, S, R)
        self.stages = [sorted(s for s in range(S) if stage_to_rank[s] == r) for r in range(R)]
        self.unit = [1.0 / len(self.stages[stage_to_rank[s]]) for s in range(S)]
        self.single = all(len(x) == 1 for x in self.stages)
        self.f_lim = [2 * (R - r) - 1 if (policy.stagger and self.single) else math.inf for r in range(R)]
        self.tol = 1e-9 * max([1.0] + list(f) + list(i) + list(w))
        self.cap = memory_budget + 1e-9
        self.first = [x[0] for x in self.stages]
        self.later_stages = [x[1:] for x in self.stages]
        self.f_end = [[None] * m for _ in range(S)]
        self.i_end = [[None] * m for _ in range(S)]
        self.nf, self.ni, self.nw = [0] * S, [0] * S, [0] * S
        self.live = [0.0] * R
        self.t = [0.0] * R
        self.left = [3 * m * len(self.stages[r]) for r in range(R)]
        self.blocked: set[int] = set()
        self.heap = [(0.0, r) for r in range(R)]  # (time the rank is free, rank); stale entries are skipped
        self.lists: dict[int, list[Action]] = {r: [] for r in range(R)}

    def reserved(self, r: int, extra: int) -> float:
        """Room held for later-stage forwards of started micro-batches."""
        if not self.later_stages[r]:
            return 0.0
        nf, unit = self.nf, self.unit
        n0 = nf[self.first[r]] + extra
        if self.policy.reserve_all:
            return sum(unit[s] * (n0 - nf[s]) for s in self.stages[r][1:])
        return sum(unit[s] * min(1, n0 - nf[s]) for s in self.stages[r][1:])

    def hop(self, a: int, b: int) -> float:
        return self.p2p if self.s2r[a] != self.s2r[b] else 0.0

    def place(self, r: int, kind: ActionType, s: int, ready: float) -> None:
        """Append ``kind`` of stage ``s``'s next micro-batch to rank ``r`` from ``max(its time, ready)``."""
        t = self.t
        start = max(t[r], ready)
        if kind is _F:
            k = self.nf[s]
            self.f_end[s][k] = start + self.f[s]
            self.nf[s] += 1
            self.live[r] += self.unit[s]
            t[r] = start + self.f[s]
        elif kind is _I:
            k = self.ni[s]
            self.i_end[s][k] = start + self.i[s]
            self.ni[s] += 1
            t[r] = start + self.i[s]
        else:
            k = self.nw[s]
            self.nw[s] += 1
            self.live[r] -= self.unit[s]
            t[r] = start + self.w[s]
        self.lists[r].append(Action(s, kind, k))
        self.left[r] -= 1
        if self.left[r]:
            heapq.heappush(self.heap, (t[r], r))
        for x in self.blocked:
            heapq.heappush(self.heap, (t[x], x))
        self.blocked.clear()

    def candidates(self, r: int) -> tuple:
        """``(best I, best F, W stage)`` of rank ``r``: each ``(ready time, tie-break, stage)`` or ``None``."""
        S, m, nf, ni, nw, own = self.S, self.m, self.nf, self.ni, self.nw, self.stages[r]
        best_i = best_f = None
        awaiting = nf[own[0]] - ni[own[0]] if self.single else sum(nf[s] - ni[s] for s in own)
        for s in own:
            k = ni[s]
            if k < nf[s]:
                rd = self.f_end[s][k]
                if s < S - 1:
                    e = self.i_end[s + 1][k]
                    rd = None if e is None else max(rd, e + self.hop(s + 1, s))
                if rd is not None and (best_i is None or (rd, s) < best_i[:2]):
                    best_i = (rd, s, s)
            k = nf[s]
            # a micro-batch entering the rank's first stage must leave room for later-stage forwards
            fits = self.live[r] + self.unit[s] + (self.reserved(r, 1) if s == self.first[r] else 0.0) <= self.cap
            if k < m and fits and awaiting < self.f_lim[r]:
                if s == 0:
                    rd = 0.0
                else:
                    e = self.f_end[s - 1][k]
                    rd = None if e is None else e + self.hop(s - 1, s)
                if rd is not None and (best_f is None or (rd, -s) < best_f[:2]):
                    best_f = (rd, -s, s)
        if self.single:
            w_stage = own[0] if nw[own[0]] < ni[own[0]] else None
        else:
            pend = [s for s in own if nw[s] < ni[s]]
            w_stage = min(pend, key=lambda s: (self.i_end[s][nw[s]], s)) if pend else None
        return best_i, best_f, w_stage

    def decide(self, r: int, T: float) -> None:
        """Rank ``r`` at its time ``T``: place an I, an F or a W, or move its time to the next event (or block)."""
        best_i, best_f, w_stage = self.candidates(r)
        tol, policy = self.tol, self.policy
        i_now = best_i is not None and best_i[0] <= T + tol
        f_now = best_f is not None and best_f[0] <= T + tol
        if i_now:
            return self.place(r, _I, best_i[2], best_i[0])
        if f_now and (policy.f_first or w_stage is None):
            return self.place(r, _F, best_f[2], best_f[0])
        known = [c[0] for c in (best_i, best_f) if c is not None]
        if w_stage is not None:
            nxt = min(known, default=math.inf)
            if f_now or not policy.fit or nxt == math.inf or T + self.w[w_stage] <= nxt + tol:
                return self.place(r, _W, w_stage, T)
        t, left = self.t, self.left
        later = [t[x] for x in range(self.R) if x != r and left[x] and t[x] > T + tol]
        nxt = min(known + later, default=None)
        if nxt is None:
            self.blocked.add(r)
        else:
            t[r] = nxt
            heapq.heappush(self.heap, (nxt, r))

    def run(self) -> dict[int, list[Action]] | None:
        heap, t, left, blocked = self.heap, self.t, self.left, self.blocked
        while True:
            if not heap:
                return self.lists if not any(left) else None
            T, r = heapq.heappop(heap)
            if T != t[r] or not left[r] or r in blocked:
                continue  # stale entry
            self.decide(r, T)
