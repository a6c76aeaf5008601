"""One source per headline number, and how to read it (validity notes).

Every number the CLI, the reports, ``reproduce`` and the notebooks state as a headline comes from one function
here. Where two numbers answer different questions they have different names:

* :func:`ep_hidden_share_iteration`: share of the EP all-to-all time issued in a whole simulated iteration
  that is hidden under compute, ``1 - exposed / issued`` (capacity report; the paper's 73% / 26% claims are of
  this kind).
* :func:`ep_hidden_share_pair`: share of one F/BW layer pair's communication hidden under that pair's compute
  (the overlap scheduler's best order, analytic; notebook 05). One pair, not an iteration: it ignores the
  warm-up/cool-down, where nothing is paired.
* :func:`width_at_hidden_share`: the routed-expert width at which a hidden-share curve crosses a target, by
  linear interpolation in log2(width) between the sweep points around the crossing. The curve is
  :func:`tessera_lab.report.study.expert_width_study` (iteration shares, EP over 4 nodes); a sweep over fewer widths (``reproduce --quick``,
  notebook 08's ``QUICK``) interpolates over fewer points and gives a coarser width: it says so.
* :func:`dynamic_headline` / :func:`dynamic_gain`: the throughput gain of dynamic bubble filling,
  ``T_static / T_dynamic - 1``, on the reproduce setup (Qwen3-Next-80B-A3B stage costs, ``zipf:0.5`` routing,
  1F1B static plan, 16 micro-batches). Notebook 07's sliders use a synthetic teaching pipeline instead; its
  numbers are labelled "toy pipeline" and are not this headline.

Validity notes (:func:`efficiency_note`, :func:`spread_note`, :func:`gain_note`, :func:`mfu_note`) return
``None`` for a value inside its meaningful range, else one line saying why it should not be read as is.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any, Sequence

#: best BF16 MFU of a published large-scale run: Llama 3 405B pre-training on 8,192-16,384 H100s reached 38-43%
#: (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4): the ceiling for dense models; MoE models are checked
#: against :func:`published_mfu_band` instead. A planned MFU above it is flagged, not hidden.
PUBLISHED_MFU_CEILING = {"dense": 0.43}
PUBLISHED_MFU_SOURCE = "Llama 3 405B on 16K H100: 38-43% BF16 MFU (Dubey et al. 2024, Table 4)"

#: the Megatron-Bridge runs of the published MoE band: Qwen3-30B-A3B (128 experts, top-8, 3B active: the published
#: model closest to Qwen3-Next-80B-A3B's fine-grained 512 experts, top-10) on H100 (the bf16 peak of the default H200)
MB_BAND_MODEL, MB_BAND_GPU = "qwen3-30b-a3b", "H100"


@functools.lru_cache(maxsize=1)
def published_mfu_band() -> dict[str, Any]:
    """The published MFU band of fine-grained MoE training, the one source for ``plan``, ``report`` and notebooks.

    Two bands, each computed from a shipped data file, and their union:

    * ``tessera``: the Tessera paper's Qwen3-Next jobs (``data/paper/tessera_paper_reported.json``,
      ``production_jobs`` of family ``qwen3_next``, 4,096-12,288 GPUs), lowest to highest of their MFU before and
      after Tessera (15.9-21.1%);
    * ``megatron_bridge``: Megatron-Bridge's :data:`MB_BAND_MODEL` runs on :data:`MB_BAND_GPU`
      (``data/published/megatron_bridge.json``), model TFLOP/s per GPU / the GPU's dense bf16 peak (this project's
      MFU convention; the runs are FP8): 118 / 989 = 11.9% to 203 / 989 = 20.5%.

    Returns:
        ``{"lo": float, "hi": float, "bands": [{"name", "lo", "hi", "source"}, ...]}``, shares (0.211 = 21.1%).
    """
    from tessera_lab.model.hardware import hardware_data
    from tessera_lab.paths import data_dir

    jobs = [j for j in json.loads((data_dir() / "paper" / "tessera_paper_reported.json").read_text())["production_jobs"]
            if j["family"] == "qwen3_next"]
    paper = [j[k] for j in jobs for k in ("mfu_before", "mfu_after") if j.get(k) is not None]
    gpus = sorted({j["gpus"] for j in jobs})
    runs = [r for r in json.loads((data_dir() / "published" / "megatron_bridge.json").read_text())["runs"]
            if r["model"] == MB_BAND_MODEL and r["gpu"] == MB_BAND_GPU]
    gpu_data = hardware_data()["gpus"]
    peak = next(v["bf16_dense_tflops"] for k, v in gpu_data.items() if k.split("-")[0] == MB_BAND_GPU)
    mb = [r["model_tflops_per_gpu"] / peak for r in runs]
    bands = [
        {"name": "tessera", "lo": min(paper), "hi": max(paper),
         "source": f"Tessera paper, Qwen3-Next at {gpus[0]:,}-{gpus[-1]:,} GPUs"},
        {"name": "megatron_bridge", "lo": min(mb), "hi": max(mb),
         "source": f"Megatron-Bridge {MB_BAND_MODEL} on {MB_BAND_GPU} (FP8 runs, model TFLOP/s / {peak:.0f} bf16)"},
    ]
    return {"lo": min(b["lo"] for b in bands), "hi": max(b["hi"] for b in bands), "bands": bands}


def mfu_text(mfu: float, *, moe: bool = True) -> str:
    """``"21.0% (published band: 15.9-21.1% Tessera paper, ...; 11.9-20.5% Megatron-Bridge ...)"``; dense models get
    the bare percentage (no published band here)."""
    if not moe:
        return f"{mfu:.1%}"
    band = published_mfu_band()
    where = "inside" if band["lo"] <= mfu <= band["hi"] else ("ABOVE" if mfu > band["hi"] else "below")
    each = ["inside" if b["lo"] <= mfu <= b["hi"] else ("above" if mfu > b["hi"] else "below") for b in band["bands"]]
    if len(set(each)) > 1:  # inside one band only: say which
        return f"{mfu:.1%}: " + "; ".join(f"{w} {b['lo']:.1%}-{b['hi']:.1%} {b['source']}"
                                          for w, b in zip(each, band["bands"]))
    return f"{mfu:.1%}, {where} the published band (" + "; ".join(
        f"{b['lo']:.1%}-{b['hi']:.1%} {b['source']}" for b in band["bands"]) + ")"


# ----------------------------------------------------------------------------------------------- headline numbers
def ep_hidden_share_iteration(plan_or_report: Any) -> float:
    """Share (0..1) of the EP all-to-all time issued in one simulated iteration that is hidden under compute.

    Args:
        plan_or_report: a :class:`~tessera_lab.plan.make.Plan` (its chosen partition's capacity report is used)
            or a :class:`~tessera_lab.report.capacity.CapacityReport`.
    Returns:
        ``1 - exposed / issued`` (0 without EP traffic).
    """
    report = plan_or_report
    if not hasattr(report, "ep_hidden_fraction"):
        from tessera_lab.report.capacity import capacity_report

        report = capacity_report(plan_or_report)
    return float(report.ep_hidden_fraction)


def ep_hidden_share_pair(model: Any, parallel: Any = None, *, expert_width: int | None = None,
                         top_k: int | None = None, budget: int = 1500) -> float:
    """Share (0..1) of one F/BW layer pair's communication hidden under the pair's compute (analytic best order;
    :func:`tessera_lab.overlap.core.overlap_point`)."""
    from tessera_lab.overlap.core import overlap_point

    return float(overlap_point(model, parallel, expert_width=expert_width, top_k=top_k,
                               budget=budget)["comm_hidden_fraction"])


def width_at_hidden_share(widths: Sequence[float], shares: Sequence[float], target: float) -> float | None:
    """Expert width at which ``shares`` (over increasing ``widths``) first crosses ``target``.

    Linear interpolation in log2(width) between the two sweep points around the first crossing; ``None`` when
    the curve never reaches the target. NaN points (widths that could not be planned) are skipped.
    """
    pts = [(float(w), float(s)) for w, s in zip(widths, shares) if not math.isnan(float(s))]
    for (w0, s0), (w1, s1) in zip(pts, pts[1:]):
        if min(s0, s1) <= target <= max(s0, s1) and s0 != s1:
            t = (target - s0) / (s1 - s0)
            return 2 ** (math.log2(w0) + t * (math.log2(w1) - math.log2(w0)))
        if s0 == target:
            return w0
    if pts and pts[-1][1] == target:
        return pts[-1][0]
    return None


def dynamic_gain(result: Any) -> float:
    """Throughput gain of dynamic bubble filling over the static plan, ``T_static / T_dynamic - 1`` (0.034 = +3.4%),
    of a :class:`~tessera_lab.dynamic.evaluate.DynamicResult` (tokens per iteration unchanged)."""
    static_s, dynamic_s = result.iteration_static_s, result.iteration_dynamic_s
    if not (static_s > 0 and dynamic_s > 0):
        raise ValueError(f"iteration times must be positive, got static {static_s}, dynamic {dynamic_s}")
    return static_s / dynamic_s - 1.0


def dynamic_api():
    """``(StageCosts, run_dynamic)`` of :mod:`tessera_lab.dynamic` (:mod:`~tessera_lab.dynamic.durations`,
    :mod:`~tessera_lab.dynamic.evaluate`)."""
    from tessera_lab.dynamic.durations import StageCosts
    from tessera_lab.dynamic.evaluate import run_dynamic

    return StageCosts, run_dynamic


#: the setup of the dynamic-gain headline (``reproduce``'s ablation, notebook 07's comparison with the paper)
DYNAMIC_HEADLINE = {"model": "qwen3-next-80b-a3b", "routing": "zipf:0.5", "schedule": "1f1b", "microbatches": 16}


def dynamic_headline(model: str = DYNAMIC_HEADLINE["model"], parallel: Any = None, *,
                     routing: str = DYNAMIC_HEADLINE["routing"], schedule: str = DYNAMIC_HEADLINE["schedule"],
                     microbatches: int = DYNAMIC_HEADLINE["microbatches"], groups: int = 1, seed: int = 0):
    """Static vs dynamic on a shipped model's analytic stage costs (:class:`~tessera_lab.dynamic.durations.StageCosts`
    ``.from_model``); the :class:`~tessera_lab.dynamic.evaluate.DynamicResult`. Its :func:`dynamic_gain` is the headline."""
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model

    StageCosts, run_dynamic = dynamic_api()
    parallel = parallel or ParallelConfig()
    return run_dynamic(StageCosts.from_model(load_model(model), parallel), routing, schedule=schedule,
                       microbatches=microbatches, groups=groups, seed=seed)


# ----------------------------------------------------------------------------------------------- validity notes
def efficiency_note(e: float) -> str | None:
    """Overlap efficiency ``e = (t_A + t_B - t_AB) / min(t_A, t_B)`` is at most 1 (the shorter bundle fully
    hidden); above 1 the pair ran faster than its longer half alone, which is a measurement artefact."""
    if e is None or (isinstance(e, float) and math.isnan(e)):
        return "overlap efficiency n/a: no time measured for one bundle"
    if e > 1 + 1e-9:
        return (f"overlap efficiency {e:.3f} > 1 is not physical (the pair would be faster than its longer half "
                "alone): n/a, re-measure with more repeats")
    return None


def spread_note(spread: float) -> str | None:
    """A spread (relative range of repeats) that is infinite or NaN means a repeat measured zero time."""
    if spread is None or math.isinf(spread) or math.isnan(spread):
        return "spread n/a: a repeat measured zero time (timer resolution); re-measure with larger shapes"
    return None


def gain_note(gain: float, spread: float) -> str | None:
    """A gain whose magnitude is within the measurement spread could have either sign: not significant."""
    if spread_note(spread):
        return "gain not significant: " + spread_note(spread)
    if abs(gain) <= abs(spread):
        return f"gain {gain:+.1%} not significant: within the measurement spread ±{abs(spread):.1%}"
    return None


def mfu_note(mfu: float, *, moe: bool = True, grouped_gemm: str | None = None) -> str | None:
    """Flag a planned MFU above the published band: for MoE models :func:`published_mfu_band`, for dense ones the
    best published run (:data:`PUBLISHED_MFU_CEILING`). ``grouped_gemm`` (the plan's expert-GEMM mode) picks the
    likely cause named: ``grouped`` (one grouped kernel, which the recipes do not run), else the per-layer host
    work the cost model does not count."""
    if moe:
        band = published_mfu_band()
        if mfu > band["hi"]:  # short: the MFU line beside it already names the bands and their sources
            return (f"MFU {mfu:.1%} is above the published band (max {band['hi']:.1%}): an optimistic bound; likely "
                    + ("one grouped expert GEMM kernel, which the published recipes do not run"
                       if grouped_gemm == "grouped" else "per-layer host work the model does not count"))
        return None
    ceiling = PUBLISHED_MFU_CEILING["dense"]
    if mfu > ceiling:
        return (f"MFU {mfu:.1%} is above any published run of this model class ({ceiling:.0%}, "
                f"{PUBLISHED_MFU_SOURCE}): an optimistic bound")
    return None


def memory_note(method: str, evaluation: Any, capacity_bytes: float | None = None) -> str | None:
    """Name an evaluation (partition) that does not fit in GPU memory, with its worst stage and, given the GPU's
    ``capacity_bytes``, the shortfall in GiB."""
    if getattr(evaluation, "fits_memory", True):
        return None
    worst = None
    for st in getattr(evaluation, "stages", []):
        mem = getattr(st, "memory_bytes", None)
        if mem is not None and (worst is None or mem > worst.memory_bytes):
            worst = st
    where = ""
    if worst is not None:
        where = f" (stage {worst.index} needs {worst.memory_bytes / 2**30:.2f} GiB"
        if capacity_bytes:  # the same figures and wording as the planner's infeasibility message
            where += (f", {(worst.memory_bytes - capacity_bytes) / 2**30:.2f} GiB more than the "
                      f"{capacity_bytes / 2**30:.2f} GiB available")
        where += ")"
    return f"{method}: does not fit in GPU memory{where}; its times are not achievable"


def overlap_validity(table: Any) -> list[str]:
    """One validity note per row of an overlap table (columns ``gain``, ``efficiency`` and, when measured,
    ``t_pair_q1``/``t_pair_q3``): "" when the row reads as is, else why not (efficiency > 1; a gain within the
    interquartile range of the pair's repeats is "not significant": its sign could flip between runs)."""
    notes = []
    for _, row in table.iterrows():
        note = efficiency_note(float(row["efficiency"])) if "efficiency" in row else None
        if note is None and "t_pair_q1" in row and "t_pair_q3" in row and not math.isnan(float(row["t_pair_q1"])):
            iqr = float(row["t_pair_q3"]) - float(row["t_pair_q1"])
            if abs(float(row["gain"])) <= iqr:
                note = (f"gain {float(row['gain']) * 1e3:+.3g} ms not significant: within the repeats' "
                        f"interquartile range {iqr * 1e3:.3g} ms")
        notes.append(note or "")
    return notes


def ratio_note(value: float, what: str = "spread") -> str | None:
    """An infinite or NaN ratio (a zero or negative denominator) is "n/a", with the reason."""
    if value is None or math.isinf(value) or math.isnan(value):
        return f"{what} n/a: the smallest value is zero or negative, so the ratio is undefined"
    return None
