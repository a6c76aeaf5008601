"""Overlap results: efficiency, hidden fraction, spread statistics, :class:`OverlapResult` and assembling
measured spans into one (torch-free)."""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from tessera_lab.cost.analytic import Contention
from tessera_lab.samples import spread_stats  # noqa: F401  (re-exported: one summary of repeated timings)

from .bundles import COMM, COMPUTE, Bundle
from .search import ScheduleResult


# ---------------------------------------------------------------------- results
def overlap_efficiency(t_a: float, t_b: float, t_ab: float) -> float:
    """``(t_a + t_b - t_ab) / min(t_a, t_b)`` (docs/concepts.md, "Overlap of two task bundles"); NaN when ``min(t_a, t_b) == 0``.
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


@dataclass
class OverlapResult:
    """Two bundles alone and together (docs/concepts.md, "Overlap of two task bundles"). Times in seconds (medians when measured).

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
    """The shape parameters that define a bundle (tokens, widths, heads, experts, EP size)."""
    m, p = bd.model, bd.parallel
    if m is None or p is None:
        return {"synthetic": True, "tasks": len(bd.tasks)}
    return {
        "layer": bd.layer, "phase": bd.phase, "kind": bd.kind, "tokens": p.tokens_per_microbatch,
        "micro_batch_size": p.micro_batch_size, "seq_len": p.seq_len, "hidden": m.hidden_size,
        "heads": m.attention.num_attention_heads, "kv_heads": m.attention.num_key_value_heads, "head_dim": m.attention.head_dim,
        "linear_heads": [m.linear.linear_num_key_heads, m.linear.linear_num_value_heads],
        "linear_head_dims": [m.linear.linear_key_head_dim, m.linear.linear_value_head_dim],
        "experts": m.moe.num_experts, "top_k": m.moe.num_experts_per_tok, "expert_width": m.moe.moe_intermediate_size,
        "shared_width": m.moe.shared_expert_intermediate_size, "ep": p.ep, "tp": p.tp, "dtype": p.dtype,
        "expert_load": bd.expert_load,
    }


def default_contention() -> Contention:
    """The contention of ``data/hardware/cost_model.json`` (compute 0.25, comm 0.1 unless changed there)."""
    from tessera_lab.model.hardware import cost_assumptions

    a = cost_assumptions()
    return Contention(a["contention_compute_slowdown"], a["contention_comm_slowdown"])
