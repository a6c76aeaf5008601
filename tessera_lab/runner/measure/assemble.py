"""One measured pair (rank 0's dict from :mod:`tessera_lab.runner.measure.harness`) as an
:class:`~tessera_lab.overlap.results.OverlapResult`: the decision rule, the measured inflation and hidden share of
communication, and every derived field named with what it derives from. Seconds throughout."""

from __future__ import annotations

import datetime as _dt

__all__ = ["overlap_result"]


def overlap_result(r: dict, backend: str, env: dict, meta_common: dict):
    """An :class:`~tessera_lab.overlap.results.OverlapResult` from one measured pair (rank 0's dict)."""
    from tessera_lab.overlap.results import OverlapResult, overlap_efficiency, spread_stats
    from tessera_lab.overlap.search import ScheduleResult
    from tessera_lab.samples import below

    from ..runtime.orders import template_graph

    g = template_graph()
    stats = [spread_stats(c["samples"]) for c in r["candidates"]]
    most = max(s["n"] for s in stats)
    finalists = [i for i, s in enumerate(stats) if s["n"] == most]
    ch = min(finalists, key=lambda i: (stats[i]["median"], i))
    sig = ch != 0 and below((stats[ch]["q1"], stats[ch]["q3"]), (stats[0]["q1"], stats[0]["q3"]))
    best = ch if sig else 0
    verdict = "significant" if sig else ("not significant" if ch != 0 else "program order is fastest")
    decision = {"verdict": verdict, "chosen": best, "challenger": ch,
                "program": {k: stats[0][k] for k in ("median", "q1", "q3", "n")},
                "challenger_stats": {k: stats[ch][k] for k in ("median", "q1", "q3", "n")},
                "rule": "challenger q3 < program q1 (quartiles separated)"}
    ta, tb = spread_stats(r["t_f"]), spread_stats(r["t_b"])
    orders = [tuple(c["order"]) for c in r["candidates"]]
    dur = r["durations"]
    tog = {int(k): v for k, v in r.get("together", {}).items()}.get(best, {})
    # measured: per-node time in the chosen order's runs over its time alone (nodes that take no time alone,
    # e.g. all-to-alls with EP 1, have no ratio and are left out)
    inflation = {k: tog[k] / v for k, v in dur.items() if v > 0 and k in tog}
    # measured: the share of the all-to-all time (alone) the compute did not wait for in the chosen order's runs
    comm_t = sum(v for k, v in dur.items() if g.lanes[k] == "comm")
    hidden = max(0.0, min(1.0, 1.0 - tog.get("a2a_wait", comm_t) / comm_t)) if comm_t > 0 else 0.0
    derived = {"gain": "t_a + t_b - t_ab (medians of the measured samples, seconds)",
               "efficiency": "gain / min(t_a, t_b)",
               "inflation": "median node time in the chosen order's pair runs / median node time alone (runner events)",
               "comm_hidden_fraction": ("1 - median all-to-all wait of the compute in the chosen order's pair runs / "
                                        "sum of the all-to-all times alone (runner events); 0 without communication")}
    plan = r.get("plan") or {}
    meta = {**env, **meta_common, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "repeats": plan.get("repeats", meta_common.get("repeats")), "warmup": plan.get("warmup", meta_common.get("warmup")),
            "derived_fields": derived,
            "communication": "EP all-to-all" if comm_t > 0 else "none (EP 1: no all-to-all in this pair)",
            "candidates_measured": len(orders), "best_candidate": best,
            "candidate_medians": [s["median"] for s in stats],
            "candidates": r["candidates"],
            "pair_sizing": r.get("plan"),
            "search": {"orders_measured": len(orders), "halving": r["halving"], "fit": r["fit"],
                       "decision": decision, "method": "runner node-level executor (issue order of the ten "
                                                       "template keys)"}}
    sched = ScheduleResult(orders[best], stats[best]["median"], orders[0], stats[0]["median"],
                           ta["median"] + tb["median"], sum(dur.values()), ta["median"], tb["median"],
                           f"exhaustive template search, {len(orders)} orders measured", 252, 252,
                           sorted(((s["median"], o) for s, o in zip(stats, orders)), key=lambda x: x[0]), backend)
    t_ab = stats[best]["median"]
    return OverlapResult(f"F[{r['kind_f']}]", f"BW[{r['kind_b']}]", r["kind_f"], r["kind_b"], "F", "BW",
                         ta["median"], tb["median"], t_ab, stats[0]["median"], inflation, hidden,
                         overlap_efficiency(ta["median"], tb["median"], t_ab), backend, orders[best],
                         {"t_a": ta, "t_b": tb, "t_ab": stats[best], "t_program": stats[0]}, dict(dur),
                         dict(g.lanes), {k: tuple(v) for k, v in g.deps.items()}, meta, sched)
