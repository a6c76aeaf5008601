"""Textbook makespans of uniform pipelines (:func:`closed_form`) and the simulation beside them
(:func:`compare_with_closed_form`). Closed forms follow GPipe / PipeDream-Flush (1F1B), Megatron-LM
interleaved 1F1B (Narayanan et al., SC21), Zero Bubble (Qi et al., ICLR 2024) and DeepSeek's DualPipe README.
Times in seconds. Never imports torch.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.actions import ActionType
from tessera_lab.pipeline.durations import _Uniform, uniform_durations
from tessera_lab.pipeline.engine import simulate
from tessera_lab.pipeline.schedules import build_schedule, canonical_name

__all__ = ["closed_form", "compare_with_closed_form"]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_OV = ActionType.OVERLAP_F_B


def closed_form(
    schedule_name: str,
    pp: int,
    m: int,
    f: float,
    b: float,
    w: float | None = None,
    vpp: int = 1,
    fb: float | None = None,
) -> dict[str, Any]:
    """Textbook makespan and bubble of a uniform pipeline (no p2p time), in seconds.

    ``f``, ``b``, ``w`` and ``fb`` are the times of **one stage (model chunk)** for one
    micro-batch: forward, full backward, weight-gradient part of the backward (the
    input-gradient part is ``i = b - w``; ``w=None`` means 0) and the overlapped F+B pair
    (default ``f + b``). Interleaved and DualPipeV ranks hold several chunks, so their ranks do
    ``vpp`` (or 2) times the work per micro-batch.

    ===============  ===========================================================  ==================
    schedule         makespan                                                     source
    ===============  ===========================================================  ==================
    gpipe, 1f1b      ``(m + p - 1)(f + b)``; bubble per rank ``(p - 1)(f + b)``,    GPipe; Megatron-LM
                     ``bubble_overhead = (p - 1) / m``                             (Narayanan, SC21)
    interleaved      ``v m (f + b) + (p - 1)(f + b)``; overhead ``(p-1)/(v m)``    Megatron-LM SC21
                     (exact when ``m`` is a multiple of ``p``)
    zb-h1            ``m (f + b) + (p - 1)(f + i - w)`` (exact when                Qi et al. ICLR 2024
                     ``w <= min(f, i)``)                                           (their B = our I)
    zb-h2            ``m (f + b) + (p - 1) max(f, f + i - 2w)``: the paper's        Qi et al. ICLR 2024
                     ``(p-1)(f + i - 2w)`` floored at the start-up skew
                     ``(p - 1) f`` one iteration cannot hide (exact for
                     ``m >= 2p - 1``, ``w <= min(f, i)``)
    dualpipev        published bubble ``(PP/2 - 1)(F&B + B - 3W)`` with ``PP = 2p``  DeepSeek DualPipe
                     stages, i.e. ``(p - 1)(fb + b - 3w)``: the idle time of the    README
                     most idle (last) rank; makespan = that rank's work + bubble
                     (exact when ``i == f`` and ``w <= f``)
    overlapped       ``p (f + b) + (m - 1) fb`` (exact for ``fb >= max(f, b)``);    this library
                     equals 1F1B's when ``fb = f + b``
    ===============  ===========================================================  ==================

    Returns:
        dict with ``schedule``, ``pp``, ``m``, ``vpp``, ``makespan``, ``bubble_per_rank`` (idle
        time of the most idle rank), ``per_rank_busy``, ``bubble_fraction``, ``bubble_overhead``,
        ``formula``, ``source``, ``exact`` (whether :func:`simulate` reproduces the makespan for
        these inputs), ``note`` and ``assumptions`` (``[{"assumption", "holds"}]``: what the formula assumes and
        whether these inputs satisfy it; ``exact`` is all of them); for zb-h2 also ``published_bubble``.

    Raises:
        ScheduleError: unknown schedule or settings the schedule refuses.
        ConfigError: negative times or ``w > b``.
    """
    name = canonical_name(schedule_name)
    if name in ("zb-v", "zb-auto"):
        raise ScheduleError(f"{name}: no closed form (the order comes from a search); simulate it instead")
    d = _Uniform(f, b, w, fb)
    sched = build_schedule(name, pp, m, vpp=vpp)
    busy = _busy_per_rank(sched, d)
    T, formula, source, exact, note, assumptions, published = _formula(name, sched.num_ranks, m,
                                                                       sched.stages_per_rank, d, busy)
    out = {"schedule": name, "pp": sched.num_ranks, "m": m, "vpp": sched.stages_per_rank,
           **_bubble(T, busy), "formula": formula, "source": source, "exact": bool(exact), "note": note,
           "assumptions": [{"assumption": a, "holds": bool(h)} for a, h in
                           assumptions + [("no p2p transfer time between stages", True)]]}
    if published is not None:
        out["published_bubble"] = published
    return out


def _busy_per_rank(sched, d: "_Uniform") -> list[float]:
    """Seconds of compute each rank of ``sched`` does: the sum of its actions' uniform times."""
    busy = [0.0] * sched.num_ranks
    for r, acts in sched.actions.items():
        for a in acts:
            if a.type in (_F, _B, _I, _W, _OV):
                busy[r] += d._table[a.type]
    return busy


def _bubble(T: float, busy: list[float]) -> dict[str, Any]:
    """``makespan``, ``bubble_per_rank`` (the most idle rank's idle seconds), ``per_rank_busy``,
    ``bubble_fraction`` (idle share of rank-time) and ``bubble_overhead`` (idle / busy) of makespan ``T``."""
    idle = [max(0.0, T - x) for x in busy]
    return {
        "makespan": T,
        "bubble_per_rank": max(idle),
        "per_rank_busy": busy,
        "bubble_fraction": sum(idle) / (T * len(busy)) if T > 0 else 0.0,
        "bubble_overhead": sum(idle) / sum(busy) if sum(busy) > 0 else 0.0,
    }


def compare_with_closed_form(
    schedule_name: str,
    pp: int,
    m: int,
    f: float,
    b: float,
    w: float | None = None,
    fb: float | None = None,
    vpp: int = 1,
    *,
    p2p_latency: float = 0.0,
    per_rank_times: bool = False,
) -> dict[str, Any]:
    """Simulate a uniform pipeline and put the closed form beside it (the notebook's engine).

    Args:
        schedule_name, pp, m, vpp: as :func:`tessera_lab.pipeline.schedules.build_schedule`.
        f, b, w, fb: seconds per stage (chunk) and micro-batch, as :func:`closed_form`; with
            ``per_rank_times=True`` they are per rank instead and are divided by the stages per
            rank (``vpp`` for interleaved, 2 for DualPipeV), which compares schedules on the same
            model.
        p2p_latency: seconds per cross-rank transfer (the closed forms ignore it).

    Returns:
        dict with ``schedule`` (the :class:`Schedule`), ``timeline`` (:class:`Timeline`),
        ``simulated`` and ``closed_form`` (dicts with ``makespan``, ``bubble_per_rank``,
        ``bubble_fraction``, ``bubble_overhead``), ``exact``, ``assumptions`` (as :func:`closed_form`, the p2p
        one with ``p2p_latency``), ``formula``, ``source``, ``note`` and ``rows``: a list of ``{"metric", "simulated", "closed_form", "difference"}`` dicts
        (``pandas.DataFrame(result["rows"])`` for a table).

    Raises:
        ScheduleError, ConfigError: as :func:`closed_form`.
    """
    sched = build_schedule(schedule_name, pp, m, vpp=vpp)
    k = sched.stages_per_rank if per_rank_times else 1
    f_, b_ = f / k, b / k
    w_ = None if w is None else w / k
    fb_ = None if fb is None else fb / k
    cf = closed_form(schedule_name, pp, m, f_, b_, w_, vpp=vpp, fb=fb_)
    tl = simulate(sched, uniform_durations(f_, b_, w_, fb_), p2p_latency=p2p_latency)
    sim = {
        "makespan": tl.iteration_time,
        "bubble_per_rank": max(tl.per_rank_idle) if tl.per_rank_idle else 0.0,
        "bubble_fraction": tl.bubble_fraction,
        "bubble_overhead": tl.bubble_overhead,
        "peak_activations": max(tl.peak_activations) if tl.peak_activations else 0,
    }
    cfd = {key: cf[key] for key in ("makespan", "bubble_per_rank", "bubble_fraction", "bubble_overhead")}
    rows = [
        {"metric": key, "simulated": sim[key], "closed_form": cfd[key], "difference": sim[key] - cfd[key]}
        for key in cfd
    ]
    if "published_bubble" in cf:
        rows.append(
            {"metric": "published_bubble", "simulated": sim["bubble_per_rank"], "closed_form": cf["published_bubble"],
             "difference": sim["bubble_per_rank"] - cf["published_bubble"]}
        )
    return {
        "schedule": sched,
        "timeline": tl,
        "simulated": sim,
        "closed_form": cfd,
        "exact": cf["exact"] and p2p_latency == 0,
        "assumptions": [a if a["assumption"] != "no p2p transfer time between stages" else
                        {"assumption": f"no p2p transfer time between stages (here {p2p_latency:g} s per hop: each "
                                       "hop on the critical path adds to the simulated iteration)",
                         "holds": p2p_latency == 0} for a in cf["assumptions"]],
        "formula": cf["formula"],
        "source": cf["source"],
        "note": cf["note"],
        "rows": rows,
    }


def _formula(name: str, p: int, m: int, v: int, d: "_Uniform", busy: list[float]) -> tuple:
    """``(makespan, formula, source, exact, note, assumptions, published bubble or None)`` of schedule ``name``
    (the table of :func:`closed_form`); ``busy``: each rank's work, seconds."""
    f, b, w_, i, fbv = d.f, d.b, d.w, d.i, d.fb
    eps = 1e-12 * max(1.0, f + b)
    published = None
    if name in ("gpipe", "1f1b"):
        T = (m + p - 1) * (f + b)
        formula, source, exact = "(m + p - 1)(F + B)", "GPipe (Huang et al. 2019); 1F1B: Narayanan et al., SC21", True
        note = "bubble per rank (p - 1)(F + B); bubble_overhead (p - 1)/m"
        assumptions = [("every stage takes the same F and B", True)]
    elif name == "interleaved":
        T = v * m * (f + b) + (p - 1) * (f + b)
        formula = "v m (F + B) + (p - 1)(F + B) with per-chunk F, B; bubble_overhead (p - 1)/(v m)"
        source = "Megatron-LM interleaved 1F1B (Narayanan et al., SC21)"
        exact = m % p == 0
        note = "" if exact else "micro-batches not a multiple of pp: the closed form is only a guide"
        assumptions = [("every chunk takes the same F and B", True),
                       (f"m is a multiple of p (m = {m}, p = {p}): each rank's v chunks run in groups of p "
                        "micro-batches; with m < p ranks wait for whole groups and the formula undercounts", exact)]
    elif name == "zb-h1":
        T = m * (f + b) + (p - 1) * (f + i - w_)
        formula = "m (F + B) + (p - 1)(F + I - W), I = B - W"
        source = "Zero Bubble (Qi et al., ICLR 2024), ZB-H1; their B is our I"
        exact = w_ <= min(f, i) + eps
        note = "" if exact else "exact only when W <= min(F, I)"
        assumptions = [("every stage takes the same F, I and W", True), ("W <= min(F, I)", exact)]
    elif name == "zb-h2":
        published = (p - 1) * (f + i - 2 * w_)
        T = m * (f + b) + (p - 1) * max(f, f + i - 2 * w_)
        formula = "m (F + B) + (p - 1) max(F, F + I - 2W); paper: bubble (p - 1)(F + I - 2W)"
        source = "Zero Bubble (Qi et al., ICLR 2024), ZB-H2"
        exact = m >= 2 * p - 1 and w_ <= min(f, i) + eps
        note = (
            "one iteration keeps the start-up skew (p - 1) F; the paper hides it across iterations "
            "(optimizer post-validation)"
            + ("" if exact else "; exact only for m >= 2p - 1 and W <= min(F, I)")
        )
        assumptions = [("every stage takes the same F, I and W", True), (f"m >= 2p - 1 (m = {m}, p = {p})",
                                                                       m >= 2 * p - 1),
                       ("W <= min(F, I)", w_ <= min(f, i) + eps)]
    elif name == "dualpipev":
        published = (p - 1) * (fbv + b - 3 * w_)
        T = min(busy) + published
        formula = "(PP/2 - 1)(F&B + B - 3W), PP = 2 pp stages (idle time of the last rank)"
        source = "DeepSeek DualPipe README (DualPipeV row)"
        exact = abs(i - f) <= eps and w_ <= f + eps
        note = "" if exact else "exact only when I = F (input-gradient time equals forward time) and W <= F"
        assumptions = [("I = F (input-gradient time equals forward time)", abs(i - f) <= eps), ("W <= F", w_ <= f + eps)]
    else:  # overlapped
        T = p * (f + b) + (m - 1) * fbv
        formula = "p (F + B) + (m - 1) F&B"
        source = "tessera-lab overlapped 1F1B (pairs F(j + k) with B(j)); reduces to 1F1B for F&B = F + B"
        exact = fbv >= max(f, b) - eps
        note = "" if exact else "exact only when F&B >= max(F, B)"
        assumptions = [("every stage takes the same F, B and F&B", True), ("F&B >= max(F, B)", exact)]
    return T, formula, source, exact, note, assumptions, published
