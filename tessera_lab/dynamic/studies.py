"""Studies over the dynamic optimizer: skew and group sweeps, stale-prediction study, the paper's ablation.

Each returns plain rows (lists of dicts) of means over seeds; keywords go to
:func:`tessera_lab.dynamic.evaluate.run_dynamic`. Times are float seconds, gains are ratios minus 1.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tessera_lab.dynamic.durations import StageCosts
from tessera_lab.dynamic.evaluate import DynamicResult, gap_error, run_dynamic
from tessera_lab.dynamic.routing import parse_routing

__all__ = ["SKEW_LEVELS", "dynamic_gain_vs_skew", "group_sweep", "prediction_study", "paper_comparison"]

#: the three routing regimes of the evaluation (Zipf exponents on 512 experts over 8 EP ranks give a busiest
#: rank of about 1.0x, 1.25x and 1.75x its uniform share)
SKEW_LEVELS = {"uniform": "uniform", "moderate": "zipf:0.5", "heavy": "zipf:1.0"}


def dynamic_gain_vs_skew(costs: StageCosts, skews: Iterable[float] = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25), *,
               seeds: Iterable[int] = (0, 1, 2), include_uniform: bool = True, **kw: Any) -> list[dict[str, Any]]:
    """Idle removed and throughput gain vs Zipf skew (means over ``seeds``); one row per skew.

    Keywords go to :func:`run_dynamic` (``schedule``, ``microbatches``, ``groups``, ...).
    """
    specs = (["uniform"] if include_uniform else []) + [f"zipf:{s:g}" for s in skews]
    rows = []
    for spec in specs:
        res = [run_dynamic(costs, spec, seed=sd, **kw) for sd in (seeds if spec != "uniform" else [0])]
        rows.append(_mean_row(spec, res))
    return rows


def _mean_row(label: str, res: Sequence[DynamicResult]) -> dict[str, Any]:
    def m(f):
        return float(np.mean([f(r) for r in res]))

    return {
        "routing": label, "runs": len(res),
        "busiest_rank_load": m(lambda r: r.mean_imbalance),
        "iteration_static_s": m(lambda r: r.iteration_static_s),
        "iteration_dynamic_s": m(lambda r: r.iteration_dynamic_s),
        "idle_static_s": m(lambda r: r.idle_static_s),
        "idle_removed_s": m(lambda r: r.idle_removed_s),
        "idle_removed_share": m(lambda r: r.idle_removed_share),
        "throughput_gain": m(lambda r: r.throughput_gain),
        "group_idle_removed_s": m(lambda r: float(np.mean([g.idle_removed_s for g in r.groups]))),
        "never_slower": all(r.summary()["never_slower"] for r in res),
    }


def group_sweep(costs: StageCosts, groups: Iterable[int] = (1, 2, 4, 8), routing: str = "zipf:1.0", *,
                seeds: Iterable[int] = (0, 1, 2), **kw: Any) -> list[dict[str, Any]]:
    """Idle removed and throughput gain vs the number of EP groups (each deciding alone); one row per count."""
    rows = []
    for G in groups:
        row = _mean_row(routing, [run_dynamic(costs, routing, groups=G, seed=sd, **kw) for sd in seeds])
        rows.append({"groups": G, **row})
    return rows


def prediction_study(costs: StageCosts, routing: str = "drift:1.0", *, steps: Iterable[int] = (1, 2, 3, 4),
                     lag: int = 1, seed: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """Predicted vs realised gaps when the prediction uses the routing of step ``t - lag`` and the step runs
    with the routing of step ``t`` (under ``drift`` the hot experts have moved in between).

    One row per step: gap errors of the static order (:func:`gap_error`), the realised gain of the plan
    decided on stale metadata, the gain with exact metadata, and whether the stale plan ended up slower
    than static (the guard holds on the prediction, not on a wrong prediction).
    """
    rows = []
    for t in steps:
        stale = run_dynamic(costs, routing, step=t, lag=lag, seed=seed, **kw)
        exact = run_dynamic(costs, routing, step=t, lag=0, seed=seed, **kw)
        g = stale.groups[0]
        err = gap_error(g.plan.predicted_static, g.static)
        load_err = float(np.mean(np.abs(g.predicted_loads - g.loads)))
        rows.append({
            "step": t, "routing": str(parse_routing(routing)), "lag": lag, **err, "load_mae": load_err,
            "gain_stale": stale.throughput_gain, "gain_exact": exact.throughput_gain,
            "idle_removed_stale_s": stale.idle_removed_s, "idle_removed_exact_s": exact.idle_removed_s,
            "stale_slower_than_static": stale.iteration_dynamic_s > stale.iteration_static_s * (1 + 1e-12),
        })
    return rows


def paper_comparison(result: DynamicResult | Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows with the paper's reported dynamic-only ablation beside a simulated result (labelled).

    Reported values come from ``data/paper/tessera_paper_reported.json`` (``ablation``: 641 ms idle removed,
    +3.4% throughput, 6,144 GPUs, internal model). Simulated values are this library's, on public configs
    and an analytic cost model: compare the shape, not the digits.
    """

    from tessera_lab.paths import read_data_json

    rep = read_data_json("paper/tessera_paper_reported.json", "paper figures")["ablation"]
    s = result.summary() if isinstance(result, DynamicResult) else dict(result)
    return [
        {"metric": "idle time removed per rank (ms)", "reported (paper)": rep["dynamic_only_idle_reduction_ms"],
         "simulated (tessera-lab)": 1e3 * s["idle_removed_s"]},
        {"metric": "throughput gain (%)", "reported (paper)": 100 * rep["dynamic_only_throughput_gain"],
         "simulated (tessera-lab)": 100 * s["throughput_gain"]},
        {"metric": "share of idle time removed (%)", "reported (paper)": None,
         "simulated (tessera-lab)": 100 * s["idle_removed_share"]},
        {"metric": "GPUs", "reported (paper)": rep["dynamic_only_job_gpus"],
         "simulated (tessera-lab)": s.get("gpus")},
    ]
