"""The lost time of one iteration split into capacity categories: :class:`CapacityReport` and
:func:`capacity_breakdown` (simulated timelines and observed runs alike); the categories, their definitions and
the MFU convention are in :mod:`tessera_lab.report.capacity`'s docstring. GPU-seconds per iteration; never
imports torch.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.simulate import interval_gaps, merge_intervals, overlap_length
from tessera_lab.report.categories import (CATEGORIES, CONDITIONAL, DEFINITIONS, LABELS, MEMORY_WAIT_TYPES,
                                           ActionBreakdown, collective_category)


# ---------------------------------------------------------------------- the report
@dataclass
class CapacityReport:
    """MFU and the lost time of one iteration split into categories (module docstring).

    Attributes:
        source: what was decomposed (``simulated plan: ...`` or ``observed run``).
        iteration_time_s: seconds.
        gpus: GPUs of the job (world size).
        peak_flops: dense bf16 peak per GPU, FLOP/s.
        model_flops: model FLOPs per iteration (Megatron-LM convention).
        parts: category -> GPU-seconds per iteration, in display order; sums to ``lost_gpu_s`` with
            ``residual`` included.
        ep_comm_gpu_s: EP all-to-all time issued in the iteration (standalone, hidden or not), GPU-seconds.
        comm_gpu_s: the same for every in-action collective (``all_to_all:ep``, ``all_reduce:tp``).
        per_rank: per pipeline rank: busy, idle and the idle split, seconds (one GPU of that rank).
        notes: assumptions and caveats.
        costs: the cost source of the predictions (:meth:`tessera_lab.cost.source.CostSource.as_dict`), or
            ``None`` for a bare timeline.
    """

    source: str
    iteration_time_s: float
    gpus: int
    peak_flops: float
    model_flops: float
    parts: dict[str, float]
    ep_comm_gpu_s: float = 0.0
    comm_gpu_s: dict[str, float] = field(default_factory=dict)
    per_rank: list[dict[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    costs: dict[str, Any] | None = None

    @property
    def gpu_time_s(self) -> float:
        """Iteration time x GPUs, GPU-seconds."""
        return self.iteration_time_s * self.gpus

    @property
    def useful_gpu_s(self) -> float:
        """Model FLOPs at peak, GPU-seconds: ``model_flops / peak_flops``."""
        return self.model_flops / self.peak_flops

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs / (iteration time x GPUs x peak)."""
        return self.useful_gpu_s / self.gpu_time_s if self.gpu_time_s > 0 else 0.0

    @property
    def lost_gpu_s(self) -> float:
        """``iteration time x GPUs x (1 - MFU)``, GPU-seconds."""
        return self.gpu_time_s - self.useful_gpu_s

    @property
    def exposed_comm_gpu_s(self) -> dict[str, float]:
        """Exposed-communication rows only, GPU-seconds."""
        return {k: v for k, v in self.parts.items() if k.startswith("exposed_")}

    @property
    def ep_hidden_fraction(self) -> float:
        """Share of the EP all-to-all time hidden under compute: ``1 - exposed / issued`` (0 without EP)."""
        if self.ep_comm_gpu_s <= 0:
            return 0.0
        return 1.0 - self.parts.get("exposed_ep_all_to_all", 0.0) / self.ep_comm_gpu_s

    @property
    def ep_exposed_share(self) -> float:
        """Exposed EP all-to-all as a share of the iteration's GPU time."""
        return self.parts.get("exposed_ep_all_to_all", 0.0) / self.gpu_time_s if self.gpu_time_s > 0 else 0.0

    def rows(self) -> list[dict[str, Any]]:
        """One dict per category: ``category``, ``label``, ``gpu_s``, ``ms_per_gpu``, ``share_of_lost``,
        ``share_of_gpu_time``, ``definition``."""
        lost, total = self.lost_gpu_s, self.gpu_time_s
        out = []
        for k, v in self.parts.items():
            out.append({
                "category": k, "label": LABELS.get(k, k.replace("_", " ")), "gpu_s": v,
                "ms_per_gpu": v / self.gpus * 1e3 if self.gpus else 0.0,
                "share_of_lost": v / lost if lost else 0.0,
                "share_of_gpu_time": v / total if total else 0.0,
                "definition": DEFINITIONS.get(k, f"idle compute lane covered by collective {k[8:]}"
                                              if k.startswith("exposed_") else ""),
            })
        return out

    def table(self):
        """The breakdown as a pandas DataFrame (rows of :meth:`rows`)."""
        import pandas as pd

        return pd.DataFrame(self.rows())

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "iteration_time_s": self.iteration_time_s, "gpus": self.gpus,
            "peak_flops": self.peak_flops, "model_flops": self.model_flops, "mfu": self.mfu,
            "gpu_time_s": self.gpu_time_s, "useful_gpu_s": self.useful_gpu_s, "lost_gpu_s": self.lost_gpu_s,
            "parts_gpu_s": dict(self.parts), "ep_comm_gpu_s": self.ep_comm_gpu_s,
            "ep_hidden_fraction": self.ep_hidden_fraction, "ep_exposed_share": self.ep_exposed_share,
            "comm_gpu_s": dict(self.comm_gpu_s), "per_rank": self.per_rank, "notes": self.notes,
            "mfu_convention": MFU_CONVENTION, "costs": self.costs,
        }

    def format(self) -> str:
        """Readable text: the headline numbers and the table."""
        from tessera_lab.textable import simple_table

        head = (f"capacity report ({self.source}): iteration {self.iteration_time_s:.4f} s x {self.gpus} GPUs = "
                f"{self.gpu_time_s:.4g} GPU-s; model FLOPs at peak {self.useful_gpu_s:.4g} GPU-s; "
                f"MFU {self.mfu:.1%}; lost {self.lost_gpu_s:.4g} GPU-s")
        tiny = 1e-12 * max(1.0, self.gpu_time_s)  # float noise shows as 0 in the text (kept in the data)
        pct = lambda x: f"{0.0 if abs(x) < 5e-4 else x:.1%}"  # noqa: E731 - what rounds to 0.0% prints 0.0%, never -0.0%
        rows = [{"category": r["label"], "GPU-s": 0.0 if abs(r["gpu_s"]) < tiny else r["gpu_s"],
                 "ms/GPU": 0.0 if abs(r["gpu_s"]) < tiny else r["ms_per_gpu"],
                 "of lost": pct(r['share_of_lost']), "of GPU time": pct(r['share_of_gpu_time'])}
                for r in self.rows()]
        total = sum(self.parts.values())
        rows.append({"category": "sum", "GPU-s": total, "ms/GPU": total / self.gpus * 1e3 if self.gpus else 0.0,
                     "of lost": f"{total / self.lost_gpu_s:.1%}" if self.lost_gpu_s else "-",
                     "of GPU time": f"{total / self.gpu_time_s:.1%}" if self.gpu_time_s else "-"})
        for row in rows:  # 4 significant digits, never an exponent: 14,410 ms/GPU prints as 14,410, not 1.441e+04
            for k in ("GPU-s", "ms/GPU"):
                row[k] = f"{row[k]:.4g}" if abs(row[k]) < 1e4 else f"{row[k]:,.0f}"
        lines = [head] + ([f"costs: {self.costs['description']}"] if self.costs else []) + [
            simple_table(rows, disable_numparse=True, colalign=("left", "right", "right", "right", "right"))]
        if self.ep_comm_gpu_s > 0:
            lines.append(f"EP all-to-all: {self.ep_hidden_fraction:.1%} hidden under compute; exposed part "
                         f"{self.ep_exposed_share:.1%} of the iteration's GPU time")
        lines.append("MFU: " + MFU_CONVENTION)
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


MFU_CONVENTION = ("Megatron-LM model FLOPs (3 x forward GEMM + attention-core FLOPs, causal at half, MoE via top-k x "
                  "expert width + shared expert, no recompute) / (iteration time x GPUs x peak dense bf16 FLOP/s)")


def _events_and_span(timeline: Any) -> tuple[list[Any], float, int]:
    """(events, iteration time, ranks) of a :class:`~tessera_lab.pipeline.simulate.Timeline` or a list of event
    dicts / objects with ``rank, stage, type, start, end, lane`` (times shifted so the first starts at 0)."""
    if hasattr(timeline, "events") and hasattr(timeline, "iteration_time"):
        events = list(timeline.events)
        ranks = timeline.num_ranks or (1 + max((e.rank for e in events), default=-1))
        return events, float(timeline.iteration_time), int(ranks)
    from types import SimpleNamespace

    raw = list(timeline)
    if not raw:
        raise ConfigError("field 'timeline' is empty; allowed: a Timeline or a non-empty list of events")
    events = []
    for n, e in enumerate(raw):
        get = e.get if isinstance(e, Mapping) else (lambda k, _e=e: getattr(_e, k, None))
        try:
            ev = SimpleNamespace(rank=int(get("rank")), stage=int(get("stage") if get("stage") is not None else -1),
                                 microbatch=get("microbatch"), type=str(get("type")), start=float(get("start")),
                                 end=float(get("end")), lane=str(get("lane") or "compute"), label=str(get("label") or ""))
        except (TypeError, ValueError):
            raise ConfigError(f"event {n} needs rank, stage, type, start and end; got {e!r}") from None
        if not (math.isfinite(ev.start) and math.isfinite(ev.end)) or ev.end < ev.start:
            raise ConfigError(f"event {n}: start={ev.start}, end={ev.end}; allowed: finite with end >= start")
        events.append(ev)
    t0 = min(e.start for e in events)
    for e in events:
        e.start -= t0
        e.end -= t0
    return events, max(e.end for e in events), 1 + max(e.rank for e in events)


def capacity_breakdown(
    timeline: Any,
    recipes: Mapping[tuple[int, str], ActionBreakdown | float],
    *,
    gpus: int,
    model_flops: float,
    peak_flops: float,
    nominal: Mapping[tuple[int, str], float] | None = None,
    nominal_iteration_s: float | None = None,
    source: str = "timeline",
    notes: Sequence[str] = (),
) -> CapacityReport:
    """Split the lost time of one iteration into the categories of the module docstring.

    Works for a simulated :class:`~tessera_lab.pipeline.simulate.Timeline` and for an observed run given in the same
    event format (a Timeline or a list of dicts with ``rank, stage, microbatch, type, start, end, lane,
    label``; comm-lane events name their collective in ``type``: ``RECV_F``/``RECV_B`` for stage-to-stage
    transfers, ``dp_grad_sync``, ...).

    Args:
        timeline: the iteration.
        recipes: predicted breakdown per ``(stage, action type)`` (:class:`ActionBreakdown`), or a plain
            predicted time in seconds (then compute beyond model FLOPs at peak is one ``compute_unsplit`` row).
        gpus: GPUs of the job; each of the timeline's ranks stands for ``gpus / ranks`` GPUs.
        model_flops: model FLOPs per iteration; peak_flops: FLOP/s per GPU.
        nominal: nominal duration per ``(stage, type)``, seconds (default: the recipe's predicted time); for
            an observed run, e.g. the median observed duration (see :func:`nominal_from_timeline`).
        nominal_iteration_s: the iteration time with every action at its nominal duration (separates the
            idle part of routing variance; without it that idle counts as bubble).

    Raises:
        ConfigError: a compute action without a recipe, ``gpus`` < ranks, non-positive peak.
    """
    events, T, R = _events_and_span(timeline)
    if gpus < R:
        raise ConfigError(f"field 'gpus' = {gpus} is out of range; allowed: >= the timeline's {R} ranks")
    if not peak_flops > 0:
        raise ConfigError(f"field 'peak_flops' = {peak_flops} is out of range; allowed: > 0")
    G = gpus / R
    tally = _Tally.of(R)
    for e in events:  # phase 1: every action against its recipe and nominal duration
        tally.add_event(e, recipes, nominal)
    per_rank = [tally.split_idle(r, T, nominal_iteration_s) for r in range(R)]  # phase 2: each rank's idle time
    ordered = _ordered_parts(tally, G, model_flops / peak_flops)  # phase 3: GPU-seconds, in report order
    ordered["residual"] = T * gpus - model_flops / peak_flops - math.fsum(ordered.values())
    all_notes = list(notes)
    if not tally.mem_iv or not any(tally.mem_iv):
        all_notes.append("memory wait: no memory_wait events in this timeline (the simulator models none)")
    if nominal_iteration_s is None and nominal is not None:
        all_notes.append("routing variance: idle caused by slow micro-batches counts as bubble (no nominal "
                         "iteration time given)")
    return CapacityReport(
        source=source, iteration_time_s=T, gpus=int(gpus), peak_flops=peak_flops, model_flops=model_flops,
        parts=ordered, ep_comm_gpu_s=tally.comm_total.get("all_to_all:ep", 0.0) * G,
        comm_gpu_s={k: v * G for k, v in tally.comm_total.items()}, per_rank=per_rank, notes=all_notes)


@dataclass
class _Tally:
    """What :func:`capacity_breakdown` sums over the events (rank-seconds, before scaling to GPUs)."""

    parts: dict[str, float]
    comm_total: dict[str, float]
    busy_sum: list[float]
    busy0: list[float]
    comp_iv: list[list[tuple[float, float]]]
    mem_iv: list[list[tuple[float, float]]]
    comm_ev: list[list[tuple[float, float, str]]]
    model_at_peak: float = 0.0
    unsplit: bool = False
    busy0_max: float | None = None

    @classmethod
    def of(cls, ranks: int) -> "_Tally":
        return cls(defaultdict(float), defaultdict(float), [0.0] * ranks, [0.0] * ranks,
                   [[] for _ in range(ranks)], [[] for _ in range(ranks)], [[] for _ in range(ranks)])

    def add_event(self, e: Any, recipes: Mapping[tuple[int, str], ActionBreakdown | float],
                  nominal: Mapping[tuple[int, str], float] | None) -> None:
        """One event: a comm-lane or memory-wait interval is kept for phase 2; a compute action adds its recipe's
        parts, its runtime overhead (nominal - predicted) and its routing variance (actual - nominal)."""
        parts = self.parts
        if e.lane != "compute":
            name = "pp_p2p" if e.type in ("RECV_F", "RECV_B") else e.type
            if e.end > e.start:
                self.comm_ev[e.rank].append((e.start, e.end, name))
            return
        if e.type in MEMORY_WAIT_TYPES:
            self.mem_iv[e.rank].append((e.start, e.end))
            return
        key = (int(e.stage), str(e.type))
        if key not in recipes:
            raise ConfigError(f"no predicted breakdown for action type {key[1]!r} on stage {key[0]} "
                              f"(event {e.label or key}); allowed: the keys of 'recipes'")
        rec = recipes[key]
        d = e.end - e.start
        if isinstance(rec, ActionBreakdown):
            p0 = rec.total
            for k, v in rec.parts.items():
                if k == "model_at_peak":
                    self.model_at_peak += v
                else:
                    parts[k] += v
            for k, v in rec.comm.items():
                self.comm_total[k] += v
        else:
            p0 = float(rec)
            parts["compute_unsplit"] += p0
            self.unsplit = True
        d0 = float(nominal[key]) if nominal is not None and key in nominal else p0
        parts["runtime_overhead"] += d0 - p0
        parts["routing_variance"] += d - d0
        self.busy_sum[e.rank] += d
        self.busy0[e.rank] += d0
        self.comp_iv[e.rank].append((e.start, e.end))

    def split_idle(self, r: int, T: float, nominal_iteration_s: float | None) -> dict[str, float]:
        """Rank ``r``'s idle time over the iteration ``[0, T]``: memory wait, exposed communication, stage
        imbalance, the idle part of routing variance and bubble (added to :attr:`parts`); returns its row."""
        if self.busy0_max is None:
            self.busy0_max = max(self.busy0) if self.busy0 else 0.0
        parts = self.parts
        merged = merge_intervals(self.comp_iv[r])
        union = sum(b - a for a, b in merged)
        parts["runtime_overhead"] -= self.busy_sum[r] - union  # compute events overlapping each other
        gaps = interval_gaps(merged, T)
        mem = merge_intervals(self.mem_iv[r])
        mem_wait = overlap_length(gaps, mem)
        parts["memory_wait"] += mem_wait
        idle_iv = _subtract(gaps, mem)
        idle = sum(b - a for a, b in idle_iv)
        exposed = _attribute(idle_iv, self.comm_ev[r])
        exp_total = 0.0
        for name, v in exposed.items():
            parts[collective_category(name)] += v
            exp_total += v
        rem = max(0.0, idle - exp_total)
        imb = min(rem, max(0.0, self.busy0_max - self.busy0[r]))
        rv_idle = 0.0
        if nominal_iteration_s is not None:
            excess = (idle + mem_wait) - (nominal_iteration_s - self.busy0[r])
            rv_idle = min(rem - imb, max(0.0, excess))
        bubble = rem - imb - rv_idle
        parts["stage_imbalance"] += imb
        parts["routing_variance"] += rv_idle
        parts["bubble"] += bubble
        # exposed comm can exceed idle only by float noise; keep the sum exact through ``bubble``
        if idle - exp_total < 0:
            parts["bubble"] += idle - exp_total
        return {"rank": r, "busy_s": union, "idle_s": idle, "memory_wait_s": mem_wait,
                "exposed_comm_s": exp_total, "stage_imbalance_s": imb, "routing_variance_idle_s": rv_idle,
                "bubble_s": bubble + min(0.0, idle - exp_total)}


def _ordered_parts(tally: _Tally, G: float, useful: float) -> dict[str, float]:
    """The parts in GPU-seconds (``G`` GPUs per rank) in the report's order, without ``residual``; ``useful``:
    model FLOPs at peak, GPU-seconds."""
    scaled = {k: v * G for k, v in tally.parts.items()}
    if tally.unsplit:
        scaled["compute_unsplit"] = scaled.get("compute_unsplit", 0.0) + tally.model_at_peak * G - useful
    else:
        scaled["non_model_work"] = scaled.get("non_model_work", 0.0) + tally.model_at_peak * G - useful
    ordered: dict[str, float] = {}
    std = [c for c in CATEGORIES if c != "residual"]
    extra_exposed = sorted(k for k in scaled if k.startswith("exposed_") and k not in std)
    names = std[:5] + extra_exposed + std[5:] + (["compute_unsplit"] if tally.unsplit else [])
    for k, after in CONDITIONAL.items():  # shown in place, only when some kernel contributes
        if scaled.get(k):
            names.insert(names.index(after) + 1, k)
    for k in names:
        ordered[k] = scaled.get(k, 0.0)
    for k in [k for k in scaled if k not in ordered]:
        ordered[k] = scaled[k]
    return ordered


def _subtract(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Merged intervals ``a`` minus merged intervals ``b``."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in b:
            if be <= cur or bs >= e:
                continue
            if bs > cur:
                out.append((cur, bs))
            cur = max(cur, be)
        if cur < e:
            out.append((cur, e))
    return out


def _attribute(idle: Sequence[tuple[float, float]], comm: Sequence[tuple[float, float, str]]) -> dict[str, float]:
    """Seconds of the idle intervals covered by each collective; instants covered by k collectives give
    1/k to each (sweep over interval end points)."""
    out: dict[str, float] = defaultdict(float)
    if not idle or not comm:
        return out
    points = sorted({p for s, e, _ in comm for p in (s, e)} | {p for s, e in idle for p in (s, e)})
    for a, b in zip(points, points[1:]):
        if b <= a:
            continue
        mid = 0.5 * (a + b)
        if not any(s <= mid < e for s, e in idle):
            continue
        active = [n for s, e, n in comm if s <= mid < e]
        if active:
            share = (b - a) / len(active)
            for n in active:
                out[n] += share
    return out


def nominal_from_timeline(timeline: Any, statistic: str = "median") -> dict[tuple[int, str], float]:
    """Nominal duration per ``(stage, action type)`` of a timeline's compute events: the ``median``
    (default) or ``mean`` over its micro-batches, seconds (for observed runs)."""
    import statistics

    if statistic not in ("median", "mean"):
        raise ConfigError(f"field 'statistic' = {statistic!r} is unknown; allowed: median, mean")
    events, _, _ = _events_and_span(timeline)
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    for e in events:
        if e.lane == "compute" and e.type not in MEMORY_WAIT_TYPES:
            groups[(int(e.stage), str(e.type))].append(e.end - e.start)
    fn = statistics.median if statistic == "median" else statistics.fmean
    return {k: float(fn(v)) for k, v in groups.items()}


def capacity_from_observed(timeline: Any, predicted: Mapping[tuple[int, str], ActionBreakdown | float], *,
                           gpus: int, model_flops: float, peak_flops: float,
                           nominal_iteration_s: float | None = None, statistic: str = "median") -> CapacityReport:
    """Capacity report of an observed run (e.g. the runner's per-action timings in the event format of
    :func:`capacity_breakdown`): nominal durations are the ``statistic`` (median by default) of the observed
    durations per (stage, action type), so the run's systematic deviation from ``predicted`` counts as runtime
    overhead and its per-micro-batch spread as routing variance.

    Args:
        timeline: observed events; predicted: per ``(stage, type)`` predicted time (seconds) or breakdown;
        gpus, model_flops, peak_flops: as :func:`capacity_breakdown` (FLOPs per iteration, FLOP/s per GPU).
    """
    return capacity_breakdown(timeline, predicted, gpus=gpus, model_flops=model_flops, peak_flops=peak_flops,
                              nominal=nominal_from_timeline(timeline, statistic),
                              nominal_iteration_s=nominal_iteration_s, source="observed run")


def capacity_from_runner(job: Mapping[str, Any], *, model_flops: float, peak_flops: float,
                         step: int | None = None) -> CapacityReport:
    """Capacity report of one step of a runner job (a job dict of :mod:`tessera_lab.runner`: ``events`` with
    ``step, rank, lane, type, stage, microbatch, start, end, label``; ``timing.durations`` with the per-stage
    ``f``, ``b``, ``w``, ``fb`` medians over the observed steps).

    Every timeline rank is one GPU (the runner records each global rank). Predicted and nominal times per
    (stage, action type) are the runner's medians, so compute beyond model FLOPs at peak is one
    ``compute_unsplit`` row, the step's deviation from the medians is routing variance, receive waits are
    exposed PP p2p and idle time under ``ep_a2a`` events is exposed EP all-to-all.

    Args:
        job: the runner's job result; model_flops: model FLOPs of one step of the run (FLOPs);
        peak_flops: peak FLOP/s of the device the run used; step: which step (default the last).

    Raises:
        ConfigError: a job without events or timing, or an unknown step.
    """
    events = job.get("events") if isinstance(job, Mapping) else None
    timing = job.get("timing") if isinstance(job, Mapping) else None
    if not events or not timing or "durations" not in timing:
        raise ConfigError("field 'job' needs 'events' and 'timing.durations' (a tessera_lab.runner job result)")
    steps = sorted({e["step"] for e in events})
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ConfigError(f"field 'step' = {step} is out of range; allowed: {', '.join(map(str, steps))}")
    evs = [e for e in events if e["step"] == step and e["lane"] in ("compute", "comm")]
    d = timing["durations"]
    pred: dict[tuple[int, str], float] = {}
    for s_, f in enumerate(d["f"]):
        b = d["b"][s_]
        w = d["w"][s_] if d.get("w") else 0.0
        pred[(s_, "F")] = f
        pred[(s_, "B")] = b
        pred[(s_, "I")] = b - w
        pred[(s_, "W")] = w
        if d.get("fb"):
            pred[(s_, "OVERLAP_F_B")] = d["fb"][s_]
    gpus = 1 + max(e["rank"] for e in evs)
    return capacity_breakdown(evs, pred, gpus=gpus, model_flops=model_flops, peak_flops=peak_flops,
                              source=f"runner job {job.get('name', '')!s} step {step}".replace("  ", " "),
                              notes=["predicted = the runner's median action times (no cost-model split)"])
