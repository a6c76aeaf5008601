"""Bundles (the task graph of one layer phase for one micro-batch) and pair graphs (two bundles on two lanes).

See :mod:`tessera_lab.overlap.core` for the quantities; torch-free."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

from tessera_lab.cost.analytic import CostModel
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
            (``None`` for synthetic bundles).
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
        tasks: key -> the :class:`~tessera_lab.model.tasks.Task` (what its demands on shared resources come from).
    """

    keys: tuple[str, ...]
    lanes: Mapping[str, str]
    deps: Mapping[str, tuple[str, ...]]
    owner: Mapping[str, str]
    classes: Mapping[str, str] = field(default_factory=dict)
    tasks: Mapping[str, Task] = field(default_factory=dict)

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
    keys, lanes, deps, owner, classes, tasks = [], {}, {}, {}, {}, {}
    for tag, bd in bundles:
        for t in bd.tasks:
            k = f"{bd.name}/{Bundle.task_id(t)}"
            keys.append(k)
            lanes[k] = COMM if t.is_comm else COMPUTE
            deps[k] = tuple(f"{bd.name}/{d}" for d in bd.deps[Bundle.task_id(t)])
            owner[k] = tag
            classes[k] = kernel_class(t.op, t.is_comm)
            tasks[k] = t
    return PairGraph(tuple(keys), lanes, deps, owner, classes, tasks)


def analytic_demands(graph: PairGraph, bundles: Sequence[Bundle], cost_model: CostModel | None,
                     contention: Any = None) -> dict | None:
    """Each key's demand on the resources the two streams share (:meth:`CostModel.demands
    <tessera_lab.cost.analytic.CostModel.demands>`), or ``None`` (overlaps then priced by class constants) when a
    contention was given, a bundle carries its own durations, or the cost model holds a contention fit."""
    if contention is not None or cost_model is None or any(b is not None and b.durations is not None for b in bundles):
        return None
    return cost_model.demands(graph.tasks)


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


