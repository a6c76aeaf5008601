"""A pair of bundles under the analytic backend, the overlap scheduler entry :func:`schedule_pair`, and the
contention fit. The measuring backends (``cpu``, ``cuda``) are not here: a pair is measured by running it with the
runtime (:mod:`tessera_lab.runner.measure.harness`); the functions below refuse them and name it. No torch."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tessera_lab.cost.analytic import Contention, CostModel
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig

from .bundles import (
    BACKENDS, Bundle, PairGraph, _default_cost_model, _keyed_durations, analytic_demands, analytic_durations,
    pair_graph,
)
from .environment import current_environment
from .results import OverlapResult, _now, bundle_shapes, default_contention, overlap_efficiency, spread_stats
from .fit import ContentionFit, fit_contention, fit_contention_samples, fit_sample  # noqa: F401 (re-exported)
from .search import ScheduleResult, _schedule


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
        backend: ``analytic`` (the only one here) evaluates candidates with the two-lane executor and the
            contention term; ``cpu`` / ``cuda`` are refused (:func:`measure_pairs` names the harness).
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
        _refuse_measuring(backend)
    graph = pair_graph(a, b)
    cm = cost_model or (_default_cost_model(a.parallel or ParallelConfig())
                        if a.durations is None or b.durations is None else None)
    demands = None
    if durations is None:
        durations = _keyed_durations(a, b, analytic_durations(a, cm), analytic_durations(b, cm))
        demands = analytic_demands(graph, (a, b), cm, contention)
    if contention is None:
        contention = cm.contention if cm is not None else default_contention()
    return _schedule(graph, durations, contention, budget=budget, beam=beam, keep=keep, demands=demands)


def _analytic_result(a: Bundle, b: Bundle, *, order: Sequence[str] | None, contention: Contention | None,
                     cost_model: CostModel | None, budget: int, keep: int) -> OverlapResult:
    graph = pair_graph(a, b)
    cm = cost_model or (_default_cost_model(a.parallel or ParallelConfig()) if a.durations is None or b.durations is None else None)
    durations = _keyed_durations(a, b, analytic_durations(a, cm), analytic_durations(b, cm))
    demands = analytic_demands(graph, (a, b), cm, contention)
    cont = contention or (cm.contention if cm is not None else default_contention())
    sched = _schedule(graph, durations, cont, budget=budget, keep=keep, demands=demands)
    if order is not None:
        order = _validate_order(graph, order)
        chosen = tuple(order)
    else:
        chosen = sched.order
    kw = {"contention": cont, "classes": graph.classes, "demands": demands}
    together = pair_makespan(chosen, durations, graph.lanes, graph.deps, **kw)
    alone_a = pair_makespan(graph.of("a"), durations, graph.lanes, graph.deps, **kw)
    alone_b = pair_makespan(graph.of("b"), durations, graph.lanes, graph.deps, **kw)
    alone = {**alone_a.spans, **alone_b.spans}
    inflation = {}
    for k in graph.keys:
        d0 = alone[k][1] - alone[k][0]
        d1 = together.spans[k][1] - together.spans[k][0]
        inflation[k] = d1 / d0 if d0 > 0 else 1.0
    t_a, t_b, t_ab = alone_a.makespan, alone_b.makespan, together.makespan
    meta = current_environment("analytic", cm.cluster.gpu.name if cm is not None else None)
    meta.update({
        "backend": "analytic", "date": _now(),
        "device": f"analytic model of {cm.cluster.gpu.name}" if cm is not None else "analytic model (given durations)",
        "contention": ("shared resources per task pair (cost.contention.shared_rates)" if demands else
                       {"compute": cont.compute, "comm": cont.comm, "memory": cont.memory,
                        "comm_beside_memory": cont.comm_beside_memory}),
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


def _validate_order(graph: PairGraph, order: Sequence[str]) -> tuple[str, ...]:
    order = tuple(order)
    if sorted(order) != sorted(graph.keys):
        missing = sorted(set(graph.keys) - set(order))
        extra = sorted(set(order) - set(graph.keys))
        raise ConfigError(f"field 'order' must list every task key once; missing {missing[:5]}, unknown {extra[:5]}")
    try:
        pair_makespan(order, {k: 1.0 for k in order}, graph.lanes, graph.deps)
    except ConfigError as exc:
        raise ConfigError(f"field 'order' is not dependency-respecting: {exc}") from None
    return order


def measure_pair(a: Bundle, b: Bundle, backend: str = "analytic", *, order: Sequence[str] | None = None,
                 contention: Contention | None = None, cost_model: CostModel | None = None,
                 budget: int = 4000, keep: int = 4, **measure_kwargs: Any) -> OverlapResult:
    """Two bundles alone and together under the analytic backend: ``t_a``, ``t_b``, ``t_ab``, inflation, hidden
    fraction of communication and overlap efficiency (seconds).

    Args:
        a, b: bundles with distinct names (e.g. ``bundle(m, 0, "F")`` and ``bundle(m, 3, "BW")``).
        backend: ``analytic`` (cost model + contention). ``cpu`` and ``cuda`` are measurements of the runtime and
            are refused here with the replacement named (:func:`measure_pairs`).
        order: issue order for ``t_ab`` (keys ``"<bundle>/<phase>.<task>"``); default: the overlap scheduler's.
        contention: analytic contention (default the cost model's, else ``data/hardware/cost_model.json``).
        cost_model: task times for the analytic backend; budget, keep: scheduler evaluations and kept orders.

    Raises:
        ConfigError: bad arguments (named with the allowed range), or a measuring backend.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"field 'backend' = {backend!r} is unknown; allowed: {', '.join(BACKENDS)}")
    if backend != "analytic":
        _refuse_measuring(backend)
    return _analytic_result(a, b, order=order, contention=contention, cost_model=cost_model, budget=budget, keep=keep)


def _refuse_measuring(backend: str) -> None:
    raise ConfigError(f"field 'backend' = {backend!r}: bundles are measured only analytically here; a {backend} "
                      f"measurement runs the layer pair with the runtime: tessera_lab.runner.measure.harness."
                      f"measure_layer_pairs(model, parallel, {backend!r}) or tessera-lab measure --backend {backend}")


def measure_pairs(pairs: Sequence[tuple[Bundle, Bundle]], backend: str = "analytic", *,
                  orders: Sequence[Sequence[str] | None] | None = None, contention: Contention | None = None,
                  cost_model: CostModel | None = None, budget: int = 4000, keep: int = 4,
                  progress: Callable[[int, int], None] | None = None, **measure_kwargs: Any) -> list[OverlapResult]:
    """:func:`measure_pair` for several pairs; ``progress(done, total)`` is called after each pair.

    Raises:
        ConfigError: as :func:`measure_pair`; ``orders`` not one per pair.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"field 'backend' = {backend!r} is unknown; allowed: {', '.join(BACKENDS)}")
    if backend != "analytic":
        _refuse_measuring(backend)
    orders = list(orders) if orders is not None else [None] * len(pairs)
    if len(orders) != len(pairs):
        raise ConfigError(f"field 'orders' has {len(orders)} entries; allowed: one per pair ({len(pairs)})")
    out = []
    for i, ((a, b), o) in enumerate(zip(pairs, orders)):
        out.append(_analytic_result(a, b, order=o, contention=contention, cost_model=cost_model, budget=budget, keep=keep))
        if progress:
            progress(i + 1, len(pairs))
    return out
