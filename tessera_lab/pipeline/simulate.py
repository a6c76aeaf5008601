"""Entry module of the pipeline simulator (re-exports).

The simulation model (lanes, dependencies, transfers, blocking sends, deadlocks) is described in
:mod:`tessera_lab.pipeline.engine`; the :class:`Timeline` and its metrics in :mod:`tessera_lab.pipeline.timeline`;
closed forms in :mod:`tessera_lab.pipeline.closedform`.
"""

from __future__ import annotations

from tessera_lab.pipeline.closedform import closed_form, compare_with_closed_form
from tessera_lab.pipeline.durations import Durations, override_durations, stage_durations, uniform_durations
from tessera_lab.pipeline.engine import _transfer_fn, simulate
from tessera_lab.pipeline.timeline import (
    P2P_COLLECTIVE,
    Event,
    Timeline,
    interval_gaps,
    merge_intervals,
    overlap_length,
)

__all__ = [
    "Durations",
    "uniform_durations",
    "stage_durations",
    "override_durations",
    "Event",
    "Timeline",
    "simulate",
    "closed_form",
    "compare_with_closed_form",
    "merge_intervals",
    "overlap_length",
    "interval_gaps",
    "P2P_COLLECTIVE",
    "_transfer_fn",
]
