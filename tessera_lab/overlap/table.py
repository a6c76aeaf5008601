"""The overlap table over a model's layer kinds, pair costs and stage costs after overlap, lane timelines and
sweeps (torch-free)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from tessera_lab.cost.analytic import Contention, CostModel
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import ModelSpec

from .bundles import (COMM, Bundle, _default_cost_model, _keyed_durations, analytic_demands, analytic_durations,
                      bundle, pair_graph)
from .measure import _analytic_result, measure_pairs
from .results import OverlapResult
from .search import _schedule


# ---------------------------------------------------------------------- the overlap table
def layer_kind_examples(model: ModelSpec) -> dict[str, int]:
    """First decoder layer of each layer kind, e.g. ``{"linear_attention+moe": 0, "full_attention+moe": 3}``."""
    out: dict[str, int] = {}
    for layer in model.stack.layers:
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
    """Per-micro-batch cost of a stage after overlap (docs/concepts.md, "Stage cost after overlap"), seconds, without stage extras.

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
    demands = analytic_demands(graph, (a, b), cm, contention)
    cont = contention or cm.contention
    if order is None:
        order = graph.keys if b is None else _schedule(graph, durations, cont, demands=demands).order
    res = pair_makespan(tuple(order), durations, graph.lanes, graph.deps, contention=cont, classes=graph.classes,
                        demands=demands)
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
    The default pair is the forward and backward of the first MoE layer (linear attention + MoE in Qwen3-Next; the
    first layer when the model has no MoE).

    Raises:
        ConfigError: a knob out of range (from :meth:`ModelSpec.with_changes`) or an unknown kind.
    """
    parallel = parallel or ParallelConfig()
    m = model.with_changes(moe_intermediate_size=expert_width, num_experts_per_tok=top_k) \
        if (expert_width is not None or top_k is not None) else model
    ex = layer_kind_examples(m)
    kf = kind_f or next((k for k in ex if k.endswith("+moe")), next(iter(ex)))  # the first MoE kind, if any
    kb = kind_b or kf
    for k in (kf, kb):
        if k not in ex:
            raise ConfigError(f"field 'kind' = {k!r} is not a layer kind of {m.name}; allowed: {', '.join(ex)}")
    a = bundle(m, ex[kf], "F", parallel, name=f"F{ex[kf]}")
    b = bundle(m, ex[kb], "BW", parallel, name=f"BW{ex[kb]}")
    r = _analytic_result(a, b, order=None, contention=contention, cost_model=None, budget=budget, keep=1)
    expert = sum(v for k, v in r.durations.items() if k.startswith(f"{a.name}/F.experts"))
    comm = sum(v for k, v in r.durations.items() if r.lanes[k] == COMM)
    return {"expert_width": m.moe.moe_intermediate_size, "top_k": m.moe.num_experts_per_tok, "t_f": r.t_a, "t_b": r.t_b,
            "t_pair": r.t_ab, "gain": r.gain, "efficiency": r.overlap_efficiency,
            "comm_hidden_fraction": r.comm_hidden_fraction, "expert_gemm_s": expert, "comm_s": comm}


def hidden_fraction_sweep(model: ModelSpec, parallel: ParallelConfig | None = None, *,
                          expert_widths: Sequence[int] = (64, 128, 256, 512, 1024, 2048),
                          top_ks: Sequence[int] = (10,), **kwargs: Any) -> "Any":
    """:func:`overlap_point` over expert widths and top-k values, as a DataFrame (one row per point)."""
    import pandas as pd

    rows = [overlap_point(model, parallel, expert_width=w, top_k=k, **kwargs) for k in top_ks for w in expert_widths]
    return pd.DataFrame(rows)
