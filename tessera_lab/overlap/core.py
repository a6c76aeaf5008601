"""Overlap of two task bundles: the analytic backend, the overlap scheduler and the overlap table.

docs/concepts.md, "Overlap of two task bundles". A :class:`Bundle` is the task graph of one
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
  :func:`~tessera_lab.cost.lanes.pair_makespan` (``streams``) with rate-based contention: while both lanes are
  busy each (compute task, collective) pair runs at the rates their demands on the shared SMs, HBM and host thread
  give (:func:`tessera_lab.cost.contention.shared_rates`); a given ``contention`` (e.g. :func:`fit_contention` of
  measured pairs) prices them by kernel-class constants instead.
* ``cpu`` and ``cuda`` are measurements, not models: a pair is measured by running it with the runtime's node
  executor on an EP group (:mod:`tessera_lab.runner.measure.harness`, ``tessera-lab measure --backend cpu|cuda``),
  so what is measured is what runs. This package only reads their results (:mod:`.profiles`); the bundle
  functions here (:func:`measure_pair`, :func:`measure_pairs`) evaluate the analytic backend and refuse the
  measuring ones with the replacement named.

The overlap scheduler (:func:`schedule_pair`) is documented on the function. This package never imports
torch.

This module re-exports the package's parts: :mod:`.bundles`, :mod:`.search`, :mod:`.results`, :mod:`.measure`,
:mod:`.table`.
"""


from __future__ import annotations

from .bundles import (  # noqa: F401
    BACKENDS, BUNDLE_PHASES, COMM, COMPUTE, DEFAULT_SIZE_FACTOR, MeasurementError, Bundle, _check_acyclic,
    bundle, PairGraph, pair_graph, analytic_durations, _default_cost_model, _keyed_durations,
)
from .search import (  # noqa: F401
    ScheduleResult, _Evaluator, _ancestors, _lane_preds, _count_extensions, _extensions, _bottom_levels,
    _priority_order, _list_schedule, _local_search, search_orders, _merge_projection, _analytic_fn, _schedule,
)
from .results import (  # noqa: F401
    overlap_efficiency, hidden_fraction, spread_stats, OverlapResult, _now, bundle_shapes, default_contention,
)
from .fit import ContentionFit, fit_contention, fit_contention_samples, fit_sample  # noqa: F401
from .measure import (  # noqa: F401
    schedule_pair, _analytic_result, _validate_order, measure_pair, measure_pairs,
)
from .table import (  # noqa: F401
    layer_kind_examples, table_pairs, TABLE_COLUMNS, results_table, overlap_table, overlap_spread,
    pair_costs_from_table, stage_pair_cost, lane_timeline, overlap_point, hidden_fraction_sweep,
)
