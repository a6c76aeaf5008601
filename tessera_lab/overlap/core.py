"""Overlap of two task bundles: measurement backends, the overlap scheduler and the overlap table.

DESIGN section 3 ("Overlap of two task bundles") and section 4. A :class:`Bundle` is the task graph of one
layer phase for one micro-batch (for example the forward of layer 4 for micro-batch i+1, or the full
backward of layer 7 for micro-batch i). Two bundles run on one device with two in-order lanes: a
**compute** lane (one CUDA stream, or one CPU thread) and a **comm** lane (a second stream or thread).
Every task's lane is fixed by its kind (collectives on the comm lane); a task starts when its lane is free
and its dependencies inside its own bundle have finished; the two bundles are independent of each other.

Quantities (seconds unless stated):

* ``t_a``, ``t_b``: makespan of each bundle run alone in program order on the two lanes.
* ``t_ab``: makespan of the best dependency-respecting issue order of the two bundles together.
* ``gain = t_a + t_b - t_ab`` and overlap efficiency ``e = gain / min(t_a, t_b)``. ``e`` can be negative:
  while both lanes are busy, compute and communication slow each other down (contention). Never assume
  ``t_ab = max(t_a, t_b)``.
* per-task inflation: the task's time together divided by its time alone.
* hidden fraction of communication: share of communication time during which the compute lane was busy.

Backends (``backend=``):

* ``analytic``: :class:`~tessera_lab.cost.analytic.CostModel` task times and the exact two-lane executor
  :func:`~tessera_lab.cost.analytic.two_lane_makespan` with its rate-based contention term: while both lanes are
  busy compute runs ``1 + kappa_compute`` and communication ``1 + kappa_comm`` times slower. Defaults
  come from ``data/hardware/cost_model.json`` (0.25 and 0.1); :func:`fit_contention` fits both from
  measured pairs.
* ``cpu``: real torch kernels at the task shapes scaled by a size factor, compute in one thread and gloo
  ``all_to_all_single`` in another, in a local process group of at least two spawned processes; median of
  repeats with spread (see :mod:`tessera_lab.overlap.backends`).
* ``cuda``: compute on one CUDA stream, communication on another, CUDA events, warm-up, median of repeats;
  NCCL ``all_to_all_single`` when two or more GPUs are visible, else a device-to-device copy of the same
  bytes on the side stream (the result records ``comm_proxy: "copy"``).

The overlap scheduler (:func:`schedule_pair`) is documented on the function. This module never imports
torch; the measuring backends import it inside :mod:`tessera_lab.overlap.backends`.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from tessera_lab.cost.analytic import Contention, CostModel, two_lane_makespan
from tessera_lab.cost.contention import kernel_class
from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.model.hardware import ParallelConfig, cluster_for
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import Task, layer_tasks

BACKENDS = ("analytic", "cpu", "cuda")
BUNDLE_PHASES = ("F", "B", "W", "BW")
COMPUTE, COMM = "compute", "comm"
#: default size factor per backend (``cpu`` shrinks every width and the sequence length 8x).
DEFAULT_SIZE_FACTOR = {"analytic": 1.0, "cpu": 0.125, "cuda": 1.0}


class MeasurementError(TesseraError, RuntimeError):
    """A measuring backend failed (a worker died, timed out, or the device is missing)."""


# ---------------------------------------------------------------------- bundles
@dataclass(frozen=True)
class Bundle:
    """A named group of tasks that run as one unit (one layer phase for one micro-batch).

    Attributes:
        name: label used to prefix task keys in a pair (``"<name>/<task id>"``), e.g. ``"F0"``, ``"BW3"``.
        tasks: the tasks in program order.
        deps: task id -> ids of tasks of this bundle it waits for. A task id is ``"<phase>.<name>"``.
        model, parallel, layer, phase, kind, expert_load: how the bundle was built by :func:`bundle`
            (``None`` for synthetic bundles; the ``cpu`` and ``cuda`` backends need them to build kernels).
        durations: optional standalone durations per task id, seconds; when given, the ``analytic`` backend
            uses them instead of the cost model (synthetic bundles in tests and teaching).
    """

    name: str
    tasks: tuple[Task, ...]
    deps: Mapping[str, tuple[str, ...]]
    model: ModelSpec | None = None
    parallel: ParallelConfig | None = None
    layer: int | None = None
    phase: str | None = None
    kind: str | None = None
    expert_load: float = 1.0
    durations: Mapping[str, float] | None = None

    @staticmethod
    def task_id(task: Task) -> str:
        return f"{task.phase}.{task.name}"

    @property
    def ids(self) -> list[str]:
        """Task ids in program order."""
        return [self.task_id(t) for t in self.tasks]

    def lane(self, task: Task) -> str:
        return COMM if task.is_comm else COMPUTE

    @classmethod
    def from_tasks(cls, name: str, tasks: Sequence[Task], *, durations: Mapping[str, float] | None = None,
                   **context: Any) -> "Bundle":
        """Build a bundle from tasks; ``Task.deps`` name tasks of the same phase. A W task with a B task of
        the same name in the bundle waits for what that B task waits for (the output gradient).

        Raises:
            ConfigError: an empty name, duplicate task ids, a dependency on a task not in the bundle, a
                cycle, or durations missing / negative for some task.
        """
        if not name or "/" in name:
            raise ConfigError(f"field 'name' = {name!r} is invalid; allowed: a non-empty name without '/'")
        ids = [cls.task_id(t) for t in tasks]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ConfigError(f"bundle {name!r} has duplicate task ids {dup}; allowed: unique phase.name per task")
        known = set(ids)
        by_id = dict(zip(ids, tasks))
        deps: dict[str, tuple[str, ...]] = {}
        for t in tasks:
            d = [f"{t.phase}.{x}" for x in t.deps]
            if t.phase == "W" and f"B.{t.name}" in known:
                d += [f"B.{x}" for x in by_id[f"B.{t.name}"].deps]
            missing = [x for x in d if x not in known]
            if missing:
                raise ConfigError(f"task {cls.task_id(t)!r} of bundle {name!r} depends on {missing}, not in the bundle")
            deps[cls.task_id(t)] = tuple(dict.fromkeys(d))
        _check_acyclic(ids, deps, name)
        if durations is not None:
            missing = [i for i in ids if i not in durations]
            if missing:
                raise ConfigError(f"field 'durations' of bundle {name!r} lacks tasks {missing}")
            bad = [i for i in ids if not (durations[i] >= 0 and math.isfinite(durations[i]))]
            if bad:
                raise ConfigError(f"field 'durations' of bundle {name!r} has negative or non-finite values for {bad}; "
                                  f"allowed: finite seconds >= 0")
            durations = {i: float(durations[i]) for i in ids}
        return cls(name, tuple(tasks), deps, durations=durations, **context)

    def renamed(self, name: str) -> "Bundle":
        """The same bundle under another name (e.g. another micro-batch)."""
        if not name or "/" in name:
            raise ConfigError(f"field 'name' = {name!r} is invalid; allowed: a non-empty name without '/'")
        return replace(self, name=name)


def _check_acyclic(ids: Sequence[str], deps: Mapping[str, Sequence[str]], label: str) -> None:
    state: dict[str, int] = {}
    for root in ids:
        if root in state:
            continue
        stack = [(root, iter(deps.get(root, ())))]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise ConfigError(f"bundle {label!r} has a dependency cycle through {nxt!r}")
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(deps.get(nxt, ()))))


def bundle(model: ModelSpec, layer: int, phase: str, parallel: ParallelConfig | None = None, *,
           expert_load: float = 1.0, name: str | None = None) -> Bundle:
    """The tasks of one layer phase for one micro-batch on one rank, as a :class:`Bundle`.

    Args:
        model: the model.
        layer: decoder layer index (0 to ``num_layers - 1``).
        phase: ``F`` (forward), ``B`` (input gradient), ``W`` (weight gradient) or ``BW`` (the full backward:
            B then W; each W task waits for the output gradient its B task waits for).
        parallel: parallel sizes and batch shape (default :class:`~tessera_lab.model.hardware.ParallelConfig`).
        expert_load: tokens this rank's experts receive relative to the uniform share (1.0 = uniform).
        name: bundle name (default ``"<phase><layer>"``, e.g. ``"BW7"``).

    Raises:
        ConfigError: a phase outside F, B, W, BW; a layer out of range; bad parallel sizes.
    """
    if phase not in BUNDLE_PHASES:
        raise ConfigError(f"field 'phase' = {phase!r} is unknown; allowed: {', '.join(BUNDLE_PHASES)}")
    parallel = parallel or ParallelConfig()
    lt = layer_tasks(model, layer, parallel, expert_load=expert_load)
    tasks = lt.B + lt.W if phase == "BW" else lt.phase(phase)
    return Bundle.from_tasks(name or f"{phase}{lt.layer}", tasks, model=model, parallel=parallel, layer=lt.layer,
                             phase=phase, kind=lt.kind, expert_load=expert_load)


# ---------------------------------------------------------------------- the pair graph
@dataclass(frozen=True)
class PairGraph:
    """Two bundles as one graph with keys ``"<bundle name>/<task id>"``.

    Attributes:
        keys: all keys in program order (bundle a, then bundle b).
        lanes: ``compute`` or ``comm`` per key.
        deps: key -> keys it waits for (inside its own bundle only).
        owner: key -> ``"a"`` or ``"b"``.
        classes: key -> kernel class (``compute`` / ``memory`` / ``comm``, :mod:`tessera_lab.cost.contention`).
    """

    keys: tuple[str, ...]
    lanes: Mapping[str, str]
    deps: Mapping[str, tuple[str, ...]]
    owner: Mapping[str, str]
    classes: Mapping[str, str] = field(default_factory=dict)

    @property
    def program_order(self) -> tuple[str, ...]:
        return self.keys

    def of(self, which: str) -> tuple[str, ...]:
        """Keys of bundle ``a`` or ``b`` in program order."""
        return tuple(k for k in self.keys if self.owner[k] == which)

    def projection(self, order: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The (compute lane, comm lane) sequences an issue order implies; the makespan depends only on them."""
        return (tuple(k for k in order if self.lanes[k] == COMPUTE), tuple(k for k in order if self.lanes[k] == COMM))


def pair_graph(a: Bundle, b: Bundle | None = None) -> PairGraph:
    """The joint graph of one or two bundles (their names must differ)."""
    bundles = [("a", a)] + ([("b", b)] if b is not None else [])
    if b is not None and a.name == b.name:
        raise ConfigError(f"bundles a and b are both named {a.name!r}; give one another name (Bundle.renamed)")
    keys, lanes, deps, owner, classes = [], {}, {}, {}, {}
    for tag, bd in bundles:
        for t in bd.tasks:
            k = f"{bd.name}/{Bundle.task_id(t)}"
            keys.append(k)
            lanes[k] = COMM if t.is_comm else COMPUTE
            deps[k] = tuple(f"{bd.name}/{d}" for d in bd.deps[Bundle.task_id(t)])
            owner[k] = tag
            classes[k] = kernel_class(t.op, t.is_comm)
    return PairGraph(tuple(keys), lanes, deps, owner, classes)


def analytic_durations(bd: Bundle, cost_model: CostModel | None = None) -> dict[str, float]:
    """Standalone duration of each task of ``bd`` (by task id), seconds: ``bd.durations`` if given, else the
    cost model's :meth:`~tessera_lab.cost.analytic.CostModel.task_time` (default: an H200 cluster that fits the
    bundle's parallel sizes)."""
    if bd.durations is not None:
        return dict(bd.durations)
    if cost_model is None:
        parallel = bd.parallel or ParallelConfig()
        cost_model = _default_cost_model(parallel)
    return {Bundle.task_id(t): cost_model.task_time(t) for t in bd.tasks}


_COST_MODELS: dict[ParallelConfig, CostModel] = {}


def _default_cost_model(parallel: ParallelConfig) -> CostModel:
    if parallel not in _COST_MODELS:
        _COST_MODELS[parallel] = CostModel(cluster_for(parallel), parallel)
    return _COST_MODELS[parallel]


def _keyed_durations(a: Bundle, b: Bundle | None, da: Mapping[str, float], db: Mapping[str, float] | None) -> dict[str, float]:
    out = {f"{a.name}/{k}": v for k, v in da.items()}
    if b is not None and db is not None:
        out.update({f"{b.name}/{k}": v for k, v in db.items()})
    return out


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
    """Makespan of an issue order, cached by its lane projection; deadlocked projections score ``inf``."""

    def __init__(self, graph: PairGraph, fn: Callable[[Sequence[str]], float]):
        self.graph, self.fn = graph, fn
        self.cache: dict[tuple[tuple[str, ...], tuple[str, ...]], float] = {}

    def __call__(self, order: Sequence[str]) -> float:
        key = self.graph.projection(order)
        if key not in self.cache:
            try:
                self.cache[key] = float(self.fn(key[0] + key[1]))
            except ConfigError:  # the lanes wait on each other: not a valid order
                self.cache[key] = math.inf
        return self.cache[key]

    def score_projection(self, comp: tuple[str, ...], comm: tuple[str, ...]) -> float:
        return self((*comp, *comm))


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


def _priority_order(graph: PairGraph, prio: Callable[[str], Any]) -> tuple[str, ...]:
    """A topological order that always issues the ready task with the smallest ``prio``."""
    done: set[str] = set()
    out: list[str] = []
    while len(out) < len(graph.keys):
        ready = [k for k in graph.keys if k not in done and all(d in done for d in graph.deps[k])]
        k = min(ready, key=prio)
        out.append(k)
        done.add(k)
    return tuple(out)


def _list_schedule(graph: PairGraph, durations: Mapping[str, float], bl: Mapping[str, float],
                   comm_first: bool = False) -> tuple[str, ...]:
    """Greedy list scheduling without contention: repeatedly issue the ready task that can start
    earliest on its lane (ties: comm first if asked, then the longest path to the end)."""
    lane_free = {COMPUTE: 0.0, COMM: 0.0}
    finish: dict[str, float] = {}
    out: list[str] = []
    while len(out) < len(graph.keys):
        best = None
        for k in graph.keys:
            if k in finish or not all(d in finish for d in graph.deps[k]):
                continue
            start = max([lane_free[graph.lanes[k]]] + [finish[d] for d in graph.deps[k]])
            key = (start, 0 if (comm_first and graph.lanes[k] == COMM) else 1, -bl[k])
            if best is None or key < best[0]:
                best = (key, k, start)
        _, k, start = best
        finish[k] = start + durations.get(k, 0.0)
        lane_free[graph.lanes[k]] = finish[k]
        out.append(k)
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


def _analytic_fn(graph: PairGraph, durations: Mapping[str, float], contention: Contention) -> Callable[[Sequence[str]], float]:
    return lambda order: two_lane_makespan(order, durations, graph.lanes, graph.deps, contention, graph.classes).makespan


def schedule_pair(a: Bundle, b: Bundle, backend: str = "analytic", *, budget: int = 4000,
                  contention: Contention | None = None, cost_model: CostModel | None = None,
                  durations: Mapping[str, float] | None = None, beam: int = 3, keep: int = 3,
                  **measure_kwargs: Any) -> ScheduleResult:
    """Find a good issue order for two bundles run together (the overlap scheduler).

    The search space is the set of dependency-respecting issue orders; each task's lane is fixed (comm
    tasks on the comm lane), and the makespan depends only on each lane's sequence, so candidates are
    pairs (compute sequence, comm sequence) and evaluations are cached by that pair.

    * **Exhaustive** when the number of such pairs (linear extensions of each lane's induced precedence,
      multiplied) is at most ``budget``: every pair is evaluated; pairs whose lanes wait on each other
      (deadlock) are skipped. This is exactly the minimum over all topological orders.
    * **Heuristic** otherwise: seeds are program order (a then b), b then a, two greedy list schedules
      (earliest start on its lane; ties to comm tasks or to the longest remaining path) and two priority
      orders ("comm first", "critical path first"); from the ``beam`` best distinct seeds a first-improvement
      local search moves one task at a time inside its lane (within a window of 12 positions, keeping
      precedence) until no move improves or ``budget`` evaluations are spent.

    The program order is always evaluated and wins ties, so the result is never slower than program order.

    Args:
        a, b: the bundles (distinct names).
        backend: ``analytic`` evaluates candidates with the two-lane executor and the contention term.
            ``cpu`` or ``cuda`` measure the pair (:func:`measure_pair`): standalone runs give per-task times,
            the analytic search over those times proposes ``keep`` orders (program order included), each is
            measured, and the fastest measured one wins; the returned makespans are then measured medians.
        budget: maximum distinct candidates evaluated (>= 1).
        contention: analytic contention (default: the cost model's).
        cost_model: cost model for task times (default: H200 cluster fitting the bundles' parallel sizes).
        durations: standalone durations per pair key (overrides the cost model).

    Raises:
        ConfigError: unknown backend, budget < 1, bundles with the same name.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"field 'backend' = {backend!r} is unknown; allowed: {', '.join(BACKENDS)}")
    if not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"field 'budget' = {budget!r} is out of range; allowed: an integer >= 1")
    if backend != "analytic":
        res = measure_pair(a, b, backend, budget=budget, keep=keep, **measure_kwargs)
        return res.schedule
    graph = pair_graph(a, b)
    if durations is None:
        cm = cost_model
        durations = _keyed_durations(a, b, analytic_durations(a, cm), analytic_durations(b, cm))
    if contention is None:
        contention = (cost_model or _default_cost_model(a.parallel or ParallelConfig())).contention
    return _schedule(graph, durations, contention, budget=budget, beam=beam, keep=keep)


def _schedule(graph: PairGraph, durations: Mapping[str, float], contention: Contention, *, budget: int = 4000,
              beam: int = 3, keep: int = 3) -> ScheduleResult:
    fn = _analytic_fn(graph, durations, contention)
    method, cands, evaluated, space = search_orders(graph, fn, durations, budget=budget, beam=beam, keep=keep)
    program = graph.program_order
    prog_ms = fn(program)
    t_a = fn(graph.of("a"))
    t_b = fn(graph.of("b"))
    best_ms, best = cands[0]
    return ScheduleResult(best, best_ms, program, prog_ms, t_a + t_b, sum(durations.values()), t_a, t_b,
                          method, evaluated, space, cands, "analytic")


def brute_force_orders(graph: PairGraph) -> Iterable[tuple[str, ...]]:
    """Every topological order of a pair graph (exponential: for tests on small bundles)."""
    done: set[str] = set()
    out: list[str] = []

    def rec():
        if len(out) == len(graph.keys):
            yield tuple(out)
            return
        for k in graph.keys:
            if k not in done and all(d in done for d in graph.deps[k]):
                out.append(k); done.add(k)
                yield from rec()
                out.pop(); done.discard(k)

    yield from rec()


# ---------------------------------------------------------------------- results
def overlap_efficiency(t_a: float, t_b: float, t_ab: float) -> float:
    """``(t_a + t_b - t_ab) / min(t_a, t_b)`` (DESIGN section 3); NaN when ``min(t_a, t_b) == 0``.
    Negative when running together is slower than one after the other."""
    m = min(t_a, t_b)
    return (t_a + t_b - t_ab) / m if m > 0 else math.nan


def hidden_fraction(spans: Mapping[str, tuple[float, float]], lanes: Mapping[str, str]) -> float:
    """Share of communication time during which the compute lane was busy (0 without communication)."""
    comm = [(s, e) for k, (s, e) in spans.items() if lanes[k] == COMM and e > s]
    comp = [(s, e) for k, (s, e) in spans.items() if lanes[k] == COMPUTE and e > s]
    total = sum(e - s for s, e in comm)
    if total <= 0:
        return 0.0
    hidden = sum(max(0.0, min(ce, e) - max(cs, s)) for cs, ce in comm for s, e in comp)
    return min(1.0, hidden / total)


def spread_stats(samples: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles (IQR), min, max and the samples of repeated timings (seconds)."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ConfigError("field 'samples' is empty; allowed: at least one measurement")

    def q(p: float) -> float:  # linear interpolation (numpy's default)
        pos = p * (len(xs) - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"median": q(0.5), "q1": q(0.25), "q3": q(0.75), "min": xs[0], "max": xs[-1], "n": len(xs),
            "samples": list(samples)}


@dataclass
class OverlapResult:
    """Two bundles alone and together (DESIGN section 3). Times in seconds (medians when measured).

    Attributes:
        a, b: bundle names; kind_a, kind_b: layer kinds; phase_a, phase_b: bundle phases.
        t_a, t_b: each bundle alone (program order); t_ab: together, in ``order``.
        t_program: together in program order (a then b on each lane).
        inflation: pair key -> time together / time alone (1.0 = unaffected).
        comm_hidden_fraction: share of the pair's communication time overlapped by compute.
        overlap_efficiency: ``(t_a + t_b - t_ab) / min(t_a, t_b)``; may be negative.
        backend: ``analytic``, ``cpu`` or ``cuda``.
        order: the issue order of ``t_ab``.
        spread: per quantity (``t_a``, ``t_b``, ``t_ab``, ``t_program``) the median, q1, q3, min, max, n
            and samples (one sample for the analytic backend).
        durations, lanes, deps: the pair graph with standalone per-task times (for :func:`fit_contention`).
        metadata: device, versions, dtype, shapes, repeats, spread kind, date, size factor, comm proxy.
        schedule: the scheduler's result that chose ``order``.
    """

    a: str
    b: str
    kind_a: str | None
    kind_b: str | None
    phase_a: str | None
    phase_b: str | None
    t_a: float
    t_b: float
    t_ab: float
    t_program: float
    inflation: dict[str, float]
    comm_hidden_fraction: float
    overlap_efficiency: float
    backend: str
    order: tuple[str, ...]
    spread: dict[str, dict[str, Any]] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)
    lanes: dict[str, str] = field(default_factory=dict)
    deps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    schedule: ScheduleResult | None = None

    @property
    def gain(self) -> float:
        """``t_a + t_b - t_ab``, seconds (negative: together is slower than one after the other)."""
        return self.t_a + self.t_b - self.t_ab

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict (without the scheduler object)."""
        return {
            "a": self.a, "b": self.b, "kind_a": self.kind_a, "kind_b": self.kind_b,
            "phase_a": self.phase_a, "phase_b": self.phase_b,
            "t_a": self.t_a, "t_b": self.t_b, "t_ab": self.t_ab, "t_program": self.t_program, "gain": self.gain,
            "overlap_efficiency": self.overlap_efficiency, "comm_hidden_fraction": self.comm_hidden_fraction,
            "inflation": self.inflation, "backend": self.backend, "order": list(self.order), "spread": self.spread,
            "durations": self.durations, "lanes": self.lanes, "deps": {k: list(v) for k, v in self.deps.items()},
            "metadata": self.metadata,
        }


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def bundle_shapes(bd: Bundle) -> dict[str, Any]:
    """The shape parameters that define a bundle's kernels (tokens, widths, heads, experts, EP size)."""
    m, p = bd.model, bd.parallel
    if m is None or p is None:
        return {"synthetic": True, "tasks": len(bd.tasks)}
    return {
        "layer": bd.layer, "phase": bd.phase, "kind": bd.kind, "tokens": p.tokens_per_microbatch,
        "micro_batch_size": p.micro_batch_size, "seq_len": p.seq_len, "hidden": m.hidden_size,
        "heads": m.num_attention_heads, "kv_heads": m.num_key_value_heads, "head_dim": m.head_dim,
        "linear_heads": [m.linear_num_key_heads, m.linear_num_value_heads],
        "linear_head_dims": [m.linear_key_head_dim, m.linear_value_head_dim],
        "experts": m.num_experts, "top_k": m.num_experts_per_tok, "expert_width": m.moe_intermediate_size,
        "shared_width": m.shared_expert_intermediate_size, "ep": p.ep, "tp": p.tp, "dtype": p.dtype,
        "expert_load": bd.expert_load,
    }


def _analytic_result(a: Bundle, b: Bundle, *, order: Sequence[str] | None, contention: Contention | None,
                     cost_model: CostModel | None, budget: int, keep: int) -> OverlapResult:
    graph = pair_graph(a, b)
    cm = cost_model or (_default_cost_model(a.parallel or ParallelConfig()) if a.durations is None or b.durations is None else None)
    durations = _keyed_durations(a, b, analytic_durations(a, cm), analytic_durations(b, cm))
    cont = contention or (cm.contention if cm is not None else default_contention())
    sched = _schedule(graph, durations, cont, budget=budget, keep=keep)
    if order is not None:
        order = _validate_order(graph, order)
        chosen = tuple(order)
    else:
        chosen = sched.order
    together = two_lane_makespan(chosen, durations, graph.lanes, graph.deps, cont, graph.classes)
    alone_a = two_lane_makespan(graph.of("a"), durations, graph.lanes, graph.deps, cont, graph.classes)
    alone_b = two_lane_makespan(graph.of("b"), durations, graph.lanes, graph.deps, cont, graph.classes)
    alone = {**alone_a.spans, **alone_b.spans}
    inflation = {}
    for k in graph.keys:
        d0 = alone[k][1] - alone[k][0]
        d1 = together.spans[k][1] - together.spans[k][0]
        inflation[k] = d1 / d0 if d0 > 0 else 1.0
    t_a, t_b, t_ab = alone_a.makespan, alone_b.makespan, together.makespan
    from tessera_lab.overlap.profiles import current_environment

    meta = current_environment("analytic", cm.cluster.gpu.name if cm is not None else None)
    meta.update({
        "backend": "analytic", "date": _now(),
        "device": f"analytic model of {cm.cluster.gpu.name}" if cm is not None else "analytic model (given durations)",
        "contention": {"compute": cont.compute, "comm": cont.comm, "memory": cont.memory,
                       "comm_beside_memory": cont.comm_beside_memory},
        "cost_assumptions": dict(cm.a) if cm is not None else None,
        "dtype": (a.parallel.dtype if a.parallel else None), "shapes": {"a": bundle_shapes(a), "b": bundle_shapes(b)},
        "repeats": 1, "spread": "none (deterministic model)", "size_factor": 1.0, "comm_proxy": None,
        "search": {"method": sched.method, "evaluated": sched.evaluated, "space": sched.space},
    })
    spread = {name: spread_stats([v]) for name, v in (("t_a", t_a), ("t_b", t_b), ("t_ab", t_ab),
                                                      ("t_program", sched.program_makespan))}
    return OverlapResult(a.name, b.name, a.kind, b.kind, a.phase, b.phase, t_a, t_b, t_ab, sched.program_makespan,
                         inflation, together.comm_hidden_fraction(), overlap_efficiency(t_a, t_b, t_ab), "analytic",
                         chosen, spread, durations, dict(graph.lanes), dict(graph.deps), meta, sched)


def default_contention() -> Contention:
    """The contention of ``data/hardware/cost_model.json`` (compute 0.25, comm 0.1 unless changed there)."""
    from tessera_lab.model.hardware import cost_assumptions

    a = cost_assumptions()
    return Contention(a["contention_compute_slowdown"], a["contention_comm_slowdown"])


def _validate_order(graph: PairGraph, order: Sequence[str]) -> tuple[str, ...]:
    order = tuple(order)
    if sorted(order) != sorted(graph.keys):
        missing = sorted(set(graph.keys) - set(order))
        extra = sorted(set(order) - set(graph.keys))
        raise ConfigError(f"field 'order' must list every task key once; missing {missing[:5]}, unknown {extra[:5]}")
    try:
        two_lane_makespan(order, {k: 1.0 for k in order}, graph.lanes, graph.deps)
    except ConfigError as exc:
        raise ConfigError(f"field 'order' is not dependency-respecting: {exc}") from None
    return order


def measure_pair(a: Bundle, b: Bundle, backend: str = "analytic", *, order: Sequence[str] | None = None,
                 repeats: int = 5, warmup: int = 1, size_factor: float | None = None,
                 contention: Contention | None = None, cost_model: CostModel | None = None,
                 budget: int = 4000, keep: int = 2, world_size: int | None = None, timeout_s: float = 600.0,
                 seed: int = 0, progress: Callable[[int, int], None] | None = None) -> OverlapResult:
    """Run two bundles alone and together and report ``t_a``, ``t_b``, ``t_ab``, inflation, hidden fraction
    of communication and overlap efficiency.

    Args:
        a, b: bundles with distinct names (e.g. ``bundle(m, 0, "F")`` and ``bundle(m, 3, "BW")``).
        backend: ``analytic`` (cost model + contention), ``cpu`` (torch kernels + gloo in spawned processes)
            or ``cuda`` (two CUDA streams; NCCL with >= 2 GPUs, else a copy proxy).
        order: issue order for ``t_ab`` (keys ``"<bundle>/<phase>.<task>"``); default: the overlap scheduler's.
        repeats, warmup: timed and untimed repetitions (measuring backends; >= 1 and >= 0).
        size_factor: multiplies every width and the sequence length of the kernels (``cpu``: 0.125 by
            default; ``cuda``: 1.0); GEMM FLOPs scale by ``f**3``, all-to-all bytes by ``f**2``.
        contention: analytic contention (default from ``data/hardware/cost_model.json``).
        cost_model: task times for the analytic backend.
        budget: scheduler evaluations; keep: orders measured by the measuring backends.
        world_size: processes of the local group (``cpu``: default 2; ``cuda``: default the visible GPUs, at
            most 8; >= 2).
        timeout_s: the measuring processes are killed after this many seconds.

    Raises:
        ConfigError: bad arguments (named with the allowed range).
        MeasurementError: a measuring backend failed or timed out; torch or CUDA missing.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"field 'backend' = {backend!r} is unknown; allowed: {', '.join(BACKENDS)}")
    if backend == "analytic":
        return _analytic_result(a, b, order=order, contention=contention, cost_model=cost_model, budget=budget, keep=keep)
    return measure_pairs([(a, b)], backend, orders=[order] if order is not None else None, repeats=repeats,
                         warmup=warmup, size_factor=size_factor, contention=contention, budget=budget, keep=keep,
                         world_size=world_size, timeout_s=timeout_s, seed=seed, progress=progress)[0]


def measure_pairs(pairs: Sequence[tuple[Bundle, Bundle]], backend: str = "analytic", *,
                  orders: Sequence[Sequence[str] | None] | None = None, repeats: int = 5, warmup: int = 1,
                  size_factor: float | None = None, contention: Contention | None = None,
                  cost_model: CostModel | None = None, budget: int = 4000, keep: int = 2, world_size: int | None = None,
                  timeout_s: float = 600.0, seed: int = 0,
                  progress: Callable[[int, int], None] | None = None) -> list[OverlapResult]:
    """:func:`measure_pair` for several pairs; the measuring backends start their processes once.

    ``progress(done, total)`` is called after each pair.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"field 'backend' = {backend!r} is unknown; allowed: {', '.join(BACKENDS)}")
    orders = list(orders) if orders is not None else [None] * len(pairs)
    if len(orders) != len(pairs):
        raise ConfigError(f"field 'orders' has {len(orders)} entries; allowed: one per pair ({len(pairs)})")
    if backend == "analytic":
        out = []
        for i, ((a, b), o) in enumerate(zip(pairs, orders)):
            out.append(_analytic_result(a, b, order=o, contention=contention, cost_model=cost_model, budget=budget, keep=keep))
            if progress:
                progress(i + 1, len(pairs))
        return out
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"field 'repeats' = {repeats!r} is out of range; allowed: an integer >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"field 'warmup' = {warmup!r} is out of range; allowed: an integer >= 0")
    f = DEFAULT_SIZE_FACTOR[backend] if size_factor is None else size_factor
    if not (isinstance(f, (int, float)) and 0 < f <= 1):
        raise ConfigError(f"field 'size_factor' = {size_factor!r} is out of range; allowed: a number in (0, 1]")
    if not (isinstance(keep, int) and keep >= 1):
        raise ConfigError(f"field 'keep' = {keep!r} is out of range; allowed: an integer >= 1")
    for a, b in pairs:
        for bd in (a, b):
            if bd.model is None or bd.parallel is None:
                raise ConfigError(f"bundle {bd.name!r} has no model; the {backend} backend needs bundles made by bundle()")
        pair_graph(a, b)  # names differ
    for (a, b), o in zip(pairs, orders):
        if o is not None:
            _validate_order(pair_graph(a, b), o)
    from tessera_lab.overlap import backends as overlap_backends  # imports torch

    return overlap_backends.measure(pairs, backend, orders=orders, repeats=repeats, warmup=warmup,
                                    size_factor=float(f), contention=contention, budget=budget, keep=keep,
                                    world_size=world_size, timeout_s=timeout_s, seed=seed, progress=progress)


def assemble_measured(a: Bundle, b: Bundle, backend: str, runs: Mapping[str, list[dict[str, tuple[float, float]]]],
                      candidates: Sequence[tuple[str, ...]], metadata: Mapping[str, Any],
                      sched: ScheduleResult | None) -> OverlapResult:
    """Build an :class:`OverlapResult` from measured spans (used by the measuring backends).

    ``runs`` maps ``"a"``, ``"b"`` and ``"cand0"``, ``"cand1"``, ... to lists of per-run spans (key ->
    (start, end) seconds from the run's start). ``candidates[0]`` is the program order.
    """
    graph = pair_graph(a, b)

    def makespans(rs):
        return [max((e for _, e in r.values()), default=0.0) for r in rs]

    def median_run(rs):
        ms = makespans(rs)
        i = sorted(range(len(ms)), key=lambda j: ms[j])[len(ms) // 2]
        return rs[i]

    ta, tb = spread_stats(makespans(runs["a"])), spread_stats(makespans(runs["b"]))
    cstats = [spread_stats(makespans(runs[f"cand{i}"])) for i in range(len(candidates))]
    best = min(range(len(candidates)), key=lambda i: (cstats[i]["median"], i))
    alone: dict[str, list[float]] = {k: [] for k in graph.keys}
    for r in runs["a"] + runs["b"]:
        for k, (s, e) in r.items():
            alone[k].append(e - s)
    together: dict[str, list[float]] = {k: [] for k in graph.keys}
    for r in runs[f"cand{best}"]:
        for k, (s, e) in r.items():
            together[k].append(e - s)
    dur = {k: spread_stats(v)["median"] for k, v in alone.items()}
    inflation = {k: (spread_stats(together[k])["median"] / dur[k] if dur[k] > 0 else 1.0) for k in graph.keys}
    hf = hidden_fraction(median_run(runs[f"cand{best}"]), graph.lanes)
    t_a, t_b, t_ab = ta["median"], tb["median"], cstats[best]["median"]
    meta = dict(metadata)
    meta.update({"candidates_measured": len(candidates), "best_candidate": best,
                 "candidate_medians": [c["median"] for c in cstats]})
    spread = {"t_a": ta, "t_b": tb, "t_ab": cstats[best], "t_program": cstats[0]}
    measured = ScheduleResult(
        tuple(candidates[best]), t_ab, tuple(candidates[0]), cstats[0]["median"], t_a + t_b, sum(dur.values()), t_a, t_b,
        f"{sched.method} search on measured task times, {len(candidates)} orders measured" if sched else "measured",
        sched.evaluated if sched else len(candidates), sched.space if sched else None,
        sorted(((c["median"], tuple(o)) for c, o in zip(cstats, candidates)), key=lambda x: x[0]), backend)
    return OverlapResult(a.name, b.name, a.kind, b.kind, a.phase, b.phase, t_a, t_b, t_ab, cstats[0]["median"],
                         inflation, hf, overlap_efficiency(t_a, t_b, t_ab), backend, tuple(candidates[best]), spread,
                         dur, dict(graph.lanes), dict(graph.deps), meta, measured)


# ---------------------------------------------------------------------- contention fit
@dataclass(frozen=True)
class ContentionFit:
    """Result of :func:`fit_contention`: the fitted slowdowns, the RMS relative error of ``t_ab`` and the
    number of pairs used."""

    contention: Contention
    rms_relative_error: float
    pairs: int


def fit_contention(measurements: Sequence[OverlapResult], *, max_slowdown: float = 3.0, step: float = 0.05) -> ContentionFit:
    """Fit the analytic contention (compute and comm slowdowns) to measured pairs.

    For each measurement, the two-lane executor replays its ``order`` with its standalone per-task
    ``durations``; the fit minimises the sum of squared relative errors of the predicted ``t_ab`` against
    the measured ``t_ab`` (least squares) by a grid search over ``[0, max_slowdown]`` in steps of ``step``
    for both parameters, refined by a finer grid (step / 10) around the best point.

    Raises:
        ConfigError: no measurements, or a measurement without durations and order.
    """
    ms = list(measurements)
    if not ms:
        raise ConfigError("field 'measurements' is empty; allowed: at least one OverlapResult")
    for m in ms:
        if not m.durations or not m.order or m.t_ab <= 0:
            raise ConfigError(f"measurement {m.a}+{m.b} lacks durations, order or a positive t_ab")
    if not (max_slowdown > 0 and 0 < step <= max_slowdown):
        raise ConfigError("fields 'max_slowdown' and 'step' must satisfy 0 < step <= max_slowdown")

    def loss(c: float, k: float) -> float:
        cont = Contention(c, k)
        err = 0.0
        for m in ms:
            pred = two_lane_makespan(m.order, m.durations, m.lanes, m.deps, cont).makespan
            err += ((pred - m.t_ab) / m.t_ab) ** 2
        return err

    def grid(lo_c, hi_c, lo_k, hi_k, st):
        best = None
        nc = int(round((hi_c - lo_c) / st)) + 1
        nk = int(round((hi_k - lo_k) / st)) + 1
        for i in range(nc):
            for j in range(nk):
                c, k = lo_c + i * st, lo_k + j * st
                v = loss(c, k)
                if best is None or v < best[0] - 1e-15:
                    best = (v, c, k)
        return best

    v, c, k = grid(0.0, max_slowdown, 0.0, max_slowdown, step)
    fine = step / 10
    v, c, k = grid(max(0.0, c - step), min(max_slowdown, c + step), max(0.0, k - step), min(max_slowdown, k + step), fine)
    return ContentionFit(Contention(round(c, 10), round(k, 10)), math.sqrt(v / len(ms)), len(ms))


# ---------------------------------------------------------------------- the overlap table
def layer_kind_examples(model: ModelSpec) -> dict[str, int]:
    """First decoder layer of each layer kind, e.g. ``{"linear_attention+moe": 0, "full_attention+moe": 3}``."""
    out: dict[str, int] = {}
    for layer in model.layers:
        out.setdefault(layer.kind, layer.index)
    return out


def table_pairs(model: ModelSpec, parallel: ParallelConfig | None = None, *, backward: str = "BW",
                expert_load: float = 1.0) -> list[tuple[Bundle, Bundle]]:
    """The (forward, backward) bundle pairs of the overlap table: for every ordered pair of layer kinds
    (kind_f, kind_b), the forward of a kind_f layer for micro-batch i+1 against the backward (``BW``:
    B then W, or ``B``) of a kind_b layer for micro-batch i."""
    if backward not in ("B", "BW"):
        raise ConfigError(f"field 'backward' = {backward!r} is unknown; allowed: B, BW")
    parallel = parallel or ParallelConfig()
    ex = layer_kind_examples(model)
    out = []
    for kf, lf in ex.items():
        for kb, lb in ex.items():
            a = bundle(model, lf, "F", parallel, expert_load=expert_load, name=f"F{lf}")
            b = bundle(model, lb, backward, parallel, expert_load=expert_load, name=f"{backward}{lb}")
            out.append((a, b))
    return out


TABLE_COLUMNS = ["kind_f", "kind_b", "layer_f", "layer_b", "t_f", "t_b", "t_sum", "t_pair", "t_program", "gain",
                 "efficiency", "comm_hidden_fraction", "t_pair_q1", "t_pair_q3", "repeats", "backend"]


def results_table(results: Sequence[OverlapResult]) -> "Any":
    """A pandas DataFrame of overlap results, one row per (kind_f, kind_b) pair (columns ``TABLE_COLUMNS``;
    times in seconds)."""
    import pandas as pd

    rows = []
    for r in results:
        sp = r.spread.get("t_ab", {})
        rows.append({
            "kind_f": r.kind_a, "kind_b": r.kind_b,
            "layer_f": (r.metadata.get("shapes", {}).get("a", {}) or {}).get("layer"),
            "layer_b": (r.metadata.get("shapes", {}).get("b", {}) or {}).get("layer"),
            "t_f": r.t_a, "t_b": r.t_b, "t_sum": r.t_a + r.t_b, "t_pair": r.t_ab, "t_program": r.t_program,
            "gain": r.gain, "efficiency": r.overlap_efficiency, "comm_hidden_fraction": r.comm_hidden_fraction,
            "t_pair_q1": sp.get("q1", r.t_ab), "t_pair_q3": sp.get("q3", r.t_ab),
            "repeats": r.metadata.get("repeats", 1), "backend": r.backend,
        })
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def overlap_table(model: ModelSpec, parallel: ParallelConfig | None = None, backend: str = "analytic", *,
                  backward: str = "BW", expert_load: float = 1.0, **kwargs: Any) -> "Any":
    """The overlap table: every combination of layer kinds that can meet in a stage, the forward of one
    micro-batch against the backward of another, both ways round (for Qwen3-Next: linear_attention+moe and
    full_attention+moe, 4 rows; dense kinds too when the model has them).

    Columns (seconds): ``t_f`` and ``t_b`` (each alone), ``t_sum = t_f + t_b`` (the standalone sum),
    ``t_pair`` (together, best order), ``t_program`` (together in program order), ``gain = t_sum - t_pair``,
    ``efficiency = gain / min(t_f, t_b)``, ``comm_hidden_fraction``, the pair time's quartiles and repeats.
    Keyword arguments go to :func:`measure_pairs` (``repeats``, ``size_factor``, ``progress``, ...).

    Returns:
        a pandas DataFrame with columns :data:`TABLE_COLUMNS`; ``table.attrs["results"]`` holds the
        :class:`OverlapResult` objects.
    """
    pairs = table_pairs(model, parallel, backward=backward, expert_load=expert_load)
    results = measure_pairs(pairs, backend, **kwargs)
    table = results_table(results)
    table.attrs["results"] = results
    table.attrs["model"] = model.name
    return table


def overlap_spread(table: "Any") -> float:
    """Best gain / worst gain across the table's rows (the paper: up to 3x between layer combinations).

    Returns ``inf`` when the worst gain is <= 0 while the best is > 0, and NaN when no gain is positive.
    """
    gains = [float(g) for g in table["gain"]]
    if not gains:
        raise ConfigError("field 'table' has no rows")
    best, worst = max(gains), min(gains)
    if best <= 0:
        return math.nan
    if worst <= 0:
        return math.inf
    return best / worst


def pair_costs_from_table(table: "Any", column: str = "t_pair") -> dict[tuple[str, str], float]:
    """``{(kind_f, kind_b): seconds}`` from an overlap table (``t_pair``, or ``t_sum`` for the standalone sum)."""
    return {(r.kind_f, r.kind_b): float(getattr(r, column)) for r in table.itertuples()}


def stage_pair_cost(kinds: Sequence[str], pair_costs: Mapping[tuple[str, str], float]) -> float:
    """Per-micro-batch cost of a stage after overlap (DESIGN section 3), seconds, without stage extras.

    In the steady state of overlapped 1F1B the forward walks the stage's layers up while the backward of
    an earlier micro-batch walks them down: for a stage owning layers ``i .. j-1`` (kinds in order), layer
    ``i+k``'s forward pairs with layer ``j-1-k``'s backward, ``k = 0 .. n-1``; the cost is the sum of the
    ``n`` pair makespans ``pair_costs[(kind(i+k), kind(j-1-k))]``.

    Raises:
        ConfigError: a kind combination missing from ``pair_costs``.
    """
    n = len(kinds)
    total = 0.0
    for k in range(n):
        key = (kinds[k], kinds[n - 1 - k])
        if key not in pair_costs:
            raise ConfigError(f"pair {key} is missing from 'pair_costs'; allowed keys: {sorted(pair_costs)}")
        total += pair_costs[key]
    return total


# ---------------------------------------------------------------------- teaching helpers
def lane_timeline(a: Bundle, b: Bundle | None = None, *, order: Sequence[str] | None = None,
                  contention: Contention | None = None, cost_model: CostModel | None = None) -> "Any":
    """Task spans of one bundle (or a pair, in ``order`` or the scheduler's best order) on the two lanes,
    from the analytic two-lane executor, as a DataFrame with columns ``task, bundle, lane, start, end,
    duration`` (seconds)."""
    import pandas as pd

    graph = pair_graph(a, b)
    cm = cost_model or _default_cost_model(a.parallel or ParallelConfig())
    durations = _keyed_durations(a, b, analytic_durations(a, cm), analytic_durations(b, cm) if b is not None else None)
    cont = contention or cm.contention
    if order is None:
        order = graph.keys if b is None else _schedule(graph, durations, cont).order
    res = two_lane_makespan(tuple(order), durations, graph.lanes, graph.deps, cont)
    rows = [{"task": k, "bundle": k.split("/")[0], "lane": graph.lanes[k], "start": s, "end": e, "duration": e - s}
            for k, (s, e) in res.spans.items()]
    return pd.DataFrame(rows).sort_values(["start", "lane"]).reset_index(drop=True)


def overlap_point(model: ModelSpec, parallel: ParallelConfig | None = None, *, expert_width: int | None = None,
                  top_k: int | None = None, kind_f: str | None = None, kind_b: str | None = None,
                  contention: Contention | None = None, budget: int = 1500) -> dict[str, float]:
    """Analytic overlap of one F/BW pair for a model variant (expert width and top-k changed).

    Returns seconds and fractions: ``t_f``, ``t_b``, ``t_pair``, ``gain``, ``efficiency``,
    ``comm_hidden_fraction`` (share of the pair's EP communication hidden under compute),
    ``expert_gemm_s`` (forward expert GEMM time) and ``comm_s`` (total communication time of the pair).
    The default pair is the forward and backward of the first layer (linear attention + MoE in Qwen3-Next).

    Raises:
        ConfigError: a knob out of range (from :meth:`ModelSpec.with_changes`) or an unknown kind.
    """
    parallel = parallel or ParallelConfig()
    m = model.with_changes(moe_intermediate_size=expert_width, num_experts_per_tok=top_k) \
        if (expert_width is not None or top_k is not None) else model
    ex = layer_kind_examples(m)
    kf = kind_f or next(iter(ex))
    kb = kind_b or kf
    for k in (kf, kb):
        if k not in ex:
            raise ConfigError(f"field 'kind' = {k!r} is not a layer kind of {m.name}; allowed: {', '.join(ex)}")
    a = bundle(m, ex[kf], "F", parallel, name=f"F{ex[kf]}")
    b = bundle(m, ex[kb], "BW", parallel, name=f"BW{ex[kb]}")
    r = _analytic_result(a, b, order=None, contention=contention, cost_model=None, budget=budget, keep=1)
    expert = sum(v for k, v in r.durations.items() if k.startswith(f"{a.name}/F.experts"))
    comm = sum(v for k, v in r.durations.items() if r.lanes[k] == COMM)
    return {"expert_width": m.moe_intermediate_size, "top_k": m.num_experts_per_tok, "t_f": r.t_a, "t_b": r.t_b,
            "t_pair": r.t_ab, "gain": r.gain, "efficiency": r.overlap_efficiency,
            "comm_hidden_fraction": r.comm_hidden_fraction, "expert_gemm_s": expert, "comm_s": comm}


def hidden_fraction_sweep(model: ModelSpec, parallel: ParallelConfig | None = None, *,
                          expert_widths: Sequence[int] = (64, 128, 256, 512, 1024, 2048),
                          top_ks: Sequence[int] = (10,), **kwargs: Any) -> "Any":
    """:func:`overlap_point` over expert widths and top-k values, as a DataFrame (one row per point)."""
    import pandas as pd

    rows = [overlap_point(model, parallel, expert_width=w, top_k=k, **kwargs) for k in top_ks for w in expert_widths]
    return pd.DataFrame(rows)
