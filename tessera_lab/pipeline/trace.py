"""Chrome trace (Trace Event Format) export of a simulated :class:`~tessera_lab.pipeline.simulate.Timeline`.

The JSON opens in Perfetto (https://ui.perfetto.dev) and ``chrome://tracing``: one process per
pipeline rank, with a ``compute`` thread and a ``comm`` thread; each action is a complete
(``"ph": "X"``) event with its stage, micro-batch and type in ``args``. Times are written in
microseconds, as the format requires (the timeline itself is in seconds).

The file is written with :func:`tessera_lab.io.atomic_write_text` (atomic for regular files, so a reader never
sees half a trace; devices and symlinks are written, not replaced).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tessera_lab.io import atomic_write_text

__all__ = ["chrome_trace_dict", "write_chrome_trace"]

_TID = {"compute": 0, "comm": 1}


def chrome_trace_dict(timeline) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``."""
    events: list[dict[str, Any]] = []
    ranks = sorted({e.rank for e in timeline.events} | set(range(getattr(timeline, "num_ranks", 0) or 0)))
    for r in ranks:
        events.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for lane, tid in _TID.items():
            events.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid, "args": {"name": lane}})
    for e in timeline.events:
        events.append(
            {
                "name": e.label,
                "cat": e.type if e.lane == "compute" else f"comm,{e.type}",
                "ph": "X",
                "pid": e.rank,
                "tid": _TID.get(e.lane, 1),
                "ts": e.start * 1e6,
                "dur": (e.end - e.start) * 1e6,
                "args": {"stage": e.stage, "microbatch": e.microbatch, "type": e.type},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "tessera-lab",
            "schedule": getattr(timeline, "schedule_name", ""),
            "iteration_time_s": timeline.iteration_time,
            "bubble_fraction": timeline.bubble_fraction,
            "bubble_overhead": timeline.bubble_overhead,
        },
    }


def write_chrome_trace(timeline, path: str | os.PathLike) -> Path:
    """Write ``timeline`` as Chrome trace JSON to ``path`` atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = chrome_trace_dict(timeline)
    atomic_write_text(path, json.dumps(data))
    return path
