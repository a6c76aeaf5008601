"""The overlap scheduler's search over dependency-respecting issue orders of a pair graph (torch-free)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from tessera_lab.cost.analytic import Contention
from tessera_lab.cost.contention import Demand
from tessera_lab.cost.lanes import StreamPair
from tessera_lab.errors import ConfigError

from .bundles import COMM, COMPUTE, PairGraph


# ---------------------------------------------------------------------- the overlap scheduler
@dataclass
class ScheduleResult:
    """Result of :func:`schedule_pair` (seconds).

    Attributes:
        order: best issue order found (keys of :class:`PairGraph`).
        makespan: its makespan (with the backend's contention).
        program_order, program_makespan: bundle a then bundle b on each lane.
        serial_makespan: ``t_a + t_b``, the two bundles one after the other.
        one_lane_makespan: every task on a single lane (sum of standalone task times).
        t_a, t_b: each bundle alone in program order.
        method: ``exhaustive`` or ``heuristic``.
        evaluated: distinct lane projections evaluated.
        space: number of candidate lane-sequence pairs (``None`` when too large to count).
        candidates: the best few distinct orders, best first, as (makespan, order).
        backend: the evaluating backend.
    """

    order: tuple[str, ...]
    makespan: float
    program_order: tuple[str, ...]
    program_makespan: float
    serial_makespan: float
    one_lane_makespan: float
    t_a: float
    t_b: float
    method: str
    evaluated: int
    space: int | None
    candidates: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    backend: str = "analytic"

    @property
    def gain_over_program(self) -> float:
        return self.program_makespan - self.makespan


class _Evaluator:
    """Makespan of an issue order, cached by its lane projection; deadlocked projections score ``inf``. When ``fn``
    is a :class:`~tessera_lab.cost.lanes.StreamPair`'s ``makespan``, projections are scored by its
    ``projection_makespan`` directly (the same number, without splitting the order again)."""

    def __init__(self, graph: PairGraph, fn: Callable[[Sequence[str]], float]):
        self.graph, self.fn = graph, fn
        owner = getattr(fn, "__self__", None)
        self._lanes_fn = owner.projection_makespan if isinstance(owner, StreamPair) else None
        self.cache: dict[tuple[tuple[str, ...], tuple[str, ...]], float] = {}

    def __call__(self, order: Sequence[str]) -> float:
        return self._score(self.graph.projection(order))

    def _score(self, key: tuple[tuple[str, ...], tuple[str, ...]]) -> float:
        got = self.cache.get(key)
        if got is None:
            if self._lanes_fn is not None:
                got = self._lanes_fn(key[0], key[1])
            else:
                try:
                    got = float(self.fn(key[0] + key[1]))
                except ConfigError:  # the lanes wait on each other: not a valid order
                    got = math.inf
            self.cache[key] = got
        return got

    def score_projection(self, comp: tuple[str, ...], comm: tuple[str, ...]) -> float:
        return self._score((tuple(comp), tuple(comm)))


def _ancestors(graph: PairGraph) -> dict[str, frozenset[str]]:
    anc: dict[str, frozenset[str]] = {}
    for k in graph.keys:  # keys are in a topological order (program order of each bundle)
        s: set[str] = set()
        for d in graph.deps[k]:
            s.add(d)
            s |= anc[d]
        anc[k] = frozenset(s)
    return anc


def _lane_preds(graph: PairGraph, lane: str, anc: Mapping[str, frozenset[str]]) -> dict[str, frozenset[str]]:
    members = [k for k in graph.keys if graph.lanes[k] == lane]
    mset = set(members)
    return {k: frozenset(a for a in anc[k] if a in mset) for k in members}


def _count_extensions(items: Sequence[str], preds: Mapping[str, frozenset[str]], cap: int) -> int | None:
    """Linear extensions of a poset, or None if more than ``cap`` (memoised over placed sets)."""
    idx = {k: i for i, k in enumerate(items)}
    pmask = {k: sum(1 << idx[p] for p in preds[k]) for k in items}
    full = (1 << len(items)) - 1
    memo: dict[int, int] = {full: 1}

    def count(mask: int) -> int:
        if mask in memo:
            return memo[mask]
        total = 0
        for k in items:
            bit = 1 << idx[k]
            if not mask & bit and pmask[k] & mask == pmask[k]:
                total += count(mask | bit)
                if total > cap:
                    break
        memo[mask] = total
        if len(memo) > 200_000:
            raise OverflowError
        return total

    try:
        n = count(0)
    except (OverflowError, RecursionError):
        return None
    return n if n <= cap else None


def _extensions(items: Sequence[str], preds: Mapping[str, frozenset[str]]) -> Iterable[tuple[str, ...]]:
    """All linear extensions (depth-first, program order first)."""
    placed: list[str] = []
    done: set[str] = set()

    def rec():
        if len(placed) == len(items):
            yield tuple(placed)
            return
        for k in items:
            if k not in done and preds[k] <= done:
                placed.append(k)
                done.add(k)
                yield from rec()
                placed.pop()
                done.discard(k)

    yield from rec()


def _bottom_levels(graph: PairGraph, durations: Mapping[str, float]) -> dict[str, float]:
    succ: dict[str, list[str]] = {k: [] for k in graph.keys}
    for k in graph.keys:
        for d in graph.deps[k]:
            succ[d].append(k)
    bl: dict[str, float] = {}
    for k in reversed(graph.keys):
        bl[k] = durations.get(k, 0.0) + max((bl[s] for s in succ[k]), default=0.0)
    return bl


class _Ready:
    """The tasks of a graph whose dependencies are all issued, kept as each one is issued (the same set the test
    ``all(d in done for d in deps[k])`` gives, without testing every dependency of every task at every step)."""

    def __init__(self, graph: PairGraph):
        self.keys = graph.keys
        self.left = {k: len(set(graph.deps[k])) for k in graph.keys}
        self.succ: dict[str, list[str]] = {k: [] for k in graph.keys}
        for k in graph.keys:
            for d in set(graph.deps[k]):
                self.succ[d].append(k)
        self.ready = {k: n == 0 for k, n in self.left.items()}

    def now(self) -> list[str]:
        """The ready tasks not yet issued, in program order."""
        ready = self.ready
        return [k for k in self.keys if ready[k]]

    def issue(self, k: str) -> None:
        self.ready[k] = False
        left, ready = self.left, self.ready
        for s in self.succ[k]:
            left[s] -= 1
            if left[s] == 0:
                ready[s] = True


def _priority_order(graph: PairGraph, prio: Callable[[str], Any]) -> tuple[str, ...]:
    """A topological order that always issues the ready task with the smallest ``prio`` (the first in program order
    on a tie)."""
    ready = _Ready(graph)
    out: list[str] = []
    while len(out) < len(graph.keys):
        k = min(ready.now(), key=prio)
        out.append(k)
        ready.issue(k)
    return tuple(out)


def _list_schedule(graph: PairGraph, durations: Mapping[str, float], bl: Mapping[str, float],
                   comm_first: bool = False) -> tuple[str, ...]:
    """Greedy list scheduling without contention: repeatedly issue the ready task that can start
    earliest on its lane (ties: comm first if asked, then the longest path to the end, then program order)."""
    lane_free = {COMPUTE: 0.0, COMM: 0.0}
    finish: dict[str, float] = {}
    out: list[str] = []
    ready = _Ready(graph)
    while len(out) < len(graph.keys):
        best = None
        for k in ready.now():
            start = max([lane_free[graph.lanes[k]]] + [finish[d] for d in graph.deps[k]])
            key = (start, 0 if (comm_first and graph.lanes[k] == COMM) else 1, -bl[k])
            if best is None or key < best[0]:
                best = (key, k, start)
        _, k, start = best
        finish[k] = start + durations.get(k, 0.0)
        lane_free[graph.lanes[k]] = finish[k]
        out.append(k)
        ready.issue(k)
    return tuple(out)


def _local_search(ev: _Evaluator, graph: PairGraph, lane_preds: Mapping[str, Mapping[str, frozenset[str]]],
                  start: tuple[tuple[str, ...], tuple[str, ...]], budget: Callable[[], bool], window: int) -> tuple[float, tuple]:
    """First-improvement hill climbing over single-task moves inside one lane's sequence."""
    cur = [list(start[0]), list(start[1])]
    best = ev.score_projection(tuple(cur[0]), tuple(cur[1]))
    improved = True
    while improved and not budget():
        improved = False
        for li, lane in enumerate((COMPUTE, COMM)):
            seq = cur[li]
            preds = lane_preds[lane]
            for i in range(len(seq)):
                x = seq[i]
                lo, hi = i, i
                while lo > 0 and i - lo < window and seq[lo - 1] not in preds[x]:  # move earlier
                    lo -= 1
                while hi < len(seq) - 1 and hi - i < window and x not in preds[seq[hi + 1]]:  # move later
                    hi += 1
                for j in itertools.chain(range(lo, i), range(i + 1, hi + 1)):
                    if budget():
                        return best, (tuple(cur[0]), tuple(cur[1]))
                    cand = seq[:i] + seq[i + 1:]
                    cand.insert(j, x)
                    trial = [cand, cur[1]] if li == 0 else [cur[0], cand]
                    score = ev.score_projection(tuple(trial[0]), tuple(trial[1]))
                    if score < best * (1 - 1e-12):
                        best, cur = score, trial
                        improved = True
                        break
                if improved:
                    break
            if improved:
                break
    return best, (tuple(cur[0]), tuple(cur[1]))


def search_orders(graph: PairGraph, evaluate: Callable[[Sequence[str]], float], durations: Mapping[str, float], *,
                  budget: int = 4000, beam: int = 3, window: int = 12, keep: int = 3) -> tuple[str, list[tuple[float, tuple[str, ...]]], int, int | None]:
    """Search issue orders of a pair graph (the engine of :func:`schedule_pair`).

    Returns ``(method, candidates, evaluated, space)`` where ``candidates`` holds the ``keep`` best distinct
    orders, best first, as (makespan, order). The program order is always evaluated first and wins ties.
    """
    ev = _Evaluator(graph, evaluate)
    anc = _ancestors(graph)
    lane_preds = {lane: _lane_preds(graph, lane, anc) for lane in (COMPUTE, COMM)}
    comp_items = [k for k in graph.keys if graph.lanes[k] == COMPUTE]
    comm_items = [k for k in graph.keys if graph.lanes[k] == COMM]
    program = graph.program_order
    ev(program)
    n_comp = _count_extensions(comp_items, lane_preds[COMPUTE], budget)
    n_comm = _count_extensions(comm_items, lane_preds[COMM], budget) if n_comp is not None else None
    space = n_comp * n_comm if (n_comp is not None and n_comm is not None) else None
    if space is not None and space <= budget:
        method = "exhaustive"
        comm_exts = list(_extensions(comm_items, lane_preds[COMM]))
        for comp in _extensions(comp_items, lane_preds[COMPUTE]):
            for comm in comm_exts:
                ev.score_projection(comp, comm)
    else:
        method = "heuristic"
        bl = _bottom_levels(graph, durations)
        pos = {k: i for i, k in enumerate(graph.keys)}
        seeds = [
            program,
            graph.of("b") + graph.of("a"),
            _list_schedule(graph, durations, bl),
            _list_schedule(graph, durations, bl, comm_first=True),
            _priority_order(graph, lambda k: (graph.lanes[k] != COMM, -bl[k], pos[k])),  # comm first
            _priority_order(graph, lambda k: (-bl[k], pos[k])),  # critical path first
        ]
        scored = []
        for s in seeds:
            proj = graph.projection(s)
            scored.append((ev(s), proj))
        # beam: local search from the best distinct seeds; stop when the budget is spent
        starts = []
        for score, proj in sorted(scored, key=lambda x: x[0]):
            if proj not in [p for _, p in starts] and math.isfinite(score):
                starts.append((score, proj))
        for _, proj in starts[:beam]:
            _local_search(ev, graph, lane_preds, proj, lambda: len(ev.cache) >= budget, window)
            if len(ev.cache) >= budget:
                break
    prog_key = graph.projection(program)
    ranked = sorted(ev.cache.items(), key=lambda kv: (kv[1], kv[0] != prog_key))
    cands = [(score, proj[0] + proj[1]) for proj, score in ranked[:keep] if math.isfinite(score)]
    # express winners as a full issue order that interleaves the lanes (a valid topological order)
    cands = [(score, _merge_projection(graph, order)) for score, order in cands]
    return method, cands, len(ev.cache), space


def _merge_projection(graph: PairGraph, order: Sequence[str]) -> tuple[str, ...]:
    """Turn (compute sequence + comm sequence) into one topological issue order with the same lane
    sequences (issue whichever lane head is ready, compute lane first)."""
    comp, comm = graph.projection(order)
    i = j = 0
    done: set[str] = set()
    out: list[str] = []
    while i < len(comp) or j < len(comm):
        if i < len(comp) and all(d in done for d in graph.deps[comp[i]]):
            out.append(comp[i]); done.add(comp[i]); i += 1
        elif j < len(comm) and all(d in done for d in graph.deps[comm[j]]):
            out.append(comm[j]); done.add(comm[j]); j += 1
        else:  # pragma: no cover - only deadlocked projections, which never rank
            raise ConfigError("lane sequences wait on each other")
    return tuple(out)


def _analytic_fn(graph: PairGraph, durations: Mapping[str, float], contention: Contention,
                 demands: Mapping[str, Demand] | None = None) -> Callable[[Sequence[str]], float]:
    """Makespan of an issue order under the ``streams`` semantics (:class:`tessera_lab.cost.lanes.StreamPair`,
    the compiled form of :func:`~tessera_lab.cost.lanes.pair_makespan`; ``inf`` for an order that cannot complete)."""
    return StreamPair(graph.keys, durations, graph.lanes, graph.deps, contention, graph.classes, demands).makespan


#: searched pairs by shape: (graph structure, durations, contention, search options) -> ScheduleResult. A re-plan
#: that changes nothing a pair sees (micro-batches, pp, dp, schedule) finds its orders here without a search.
_SEARCHED: dict[tuple, ScheduleResult] = {}
_SEARCHED_MAX = 512


def search_cache_info() -> dict[str, int]:
    """``{"entries": n, "hits": h, "searches": s}`` of the pair-search cache of :func:`_schedule`."""
    return {"entries": len(_SEARCHED), **_SEARCH_STATS}


_SEARCH_STATS = {"hits": 0, "searches": 0}


def _schedule(graph: PairGraph, durations: Mapping[str, float], contention: Contention, *, budget: int = 4000,
              beam: int = 3, keep: int = 3, demands: Mapping[str, Demand] | None = None) -> ScheduleResult:
    """The analytic search of :func:`~tessera_lab.overlap.measure.schedule_pair`, cached by shape: the graph's keys,
    lanes, dependencies and kernel classes, every task's duration and demands, the contention and the search
    options."""
    keys = graph.keys
    key = (keys, tuple(graph.lanes[k] for k in keys), tuple(tuple(graph.deps[k]) for k in keys),
           tuple(graph.owner[k] for k in keys), tuple(graph.classes.get(k) for k in keys),
           tuple(durations.items()), contention, budget, beam, keep,
           tuple(demands.get(k) for k in keys) if demands else None)
    hit = _SEARCHED.get(key)
    if hit is not None:
        _SEARCH_STATS["hits"] += 1
        return replace(hit, candidates=list(hit.candidates))
    _SEARCH_STATS["searches"] += 1
    res = _search(graph, durations, contention, budget=budget, beam=beam, keep=keep, demands=demands)
    if len(_SEARCHED) >= _SEARCHED_MAX:
        _SEARCHED.clear()
    _SEARCHED[key] = replace(res, candidates=list(res.candidates))
    return res


def _search(graph: PairGraph, durations: Mapping[str, float], contention: Contention, *, budget: int = 4000,
            beam: int = 3, keep: int = 3, demands: Mapping[str, Demand] | None = None) -> ScheduleResult:
    fn = _analytic_fn(graph, durations, contention, demands)
    method, cands, evaluated, space = search_orders(graph, fn, durations, budget=budget, beam=beam, keep=keep)
    program = graph.program_order
    prog_ms = fn(program)
    t_a = fn(graph.of("a"))
    t_b = fn(graph.of("b"))
    best_ms, best = cands[0]
    return ScheduleResult(best, best_ms, program, prog_ms, t_a + t_b, sum(durations.values()), t_a, t_b,
                          method, evaluated, space, cands, "analytic")


