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

Published bands (:func:`published_mfu_band`, :func:`mfu_text`, :func:`mfu_note`) are chosen per model family
and model: the Tessera paper's jobs of the same family (Qwen3 MoE 29.7-39.0%, Qwen3-Next 15.9-21.1%) and
Megatron-Bridge's runs of the same model (or a named stand-in); every comparative word comes from
:func:`position` on the values it describes.

Validity notes (:func:`efficiency_note`, :func:`spread_note`, :func:`gain_note`, :func:`mfu_note`) return
``None`` for a value inside its meaningful range, else one line saying why it should not be read as is.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

from tessera_lab.samples import within_spread

#: best BF16 MFU of a published large-scale run: Llama 3 405B pre-training on 8,192-16,384 H100s reached 38-43%
#: (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 4): the ceiling for dense models; MoE models are checked
#: against :func:`published_mfu_band` instead. A planned MFU above it is flagged, not hidden.
PUBLISHED_MFU_CEILING = {"dense": 0.43}
PUBLISHED_MFU_SOURCE = "Llama 3 405B on 16K H100: 38-43% BF16 MFU (Dubey et al. 2024, Table 4)"

#: the Tessera paper's job family (``family`` in ``data/paper/tessera_paper_reported.json``) per Hugging Face
#: ``model_type``: Qwen3 MoE jobs (Qwen3-L/XL, 29.7-39.0%) and Qwen3-Next jobs (Qwen3-Next-M/XL, 15.9-21.1%). A
#: ``model_type`` read by the same family reader (:mod:`tessera_lab.model.families`) takes the same band
#: (:func:`band_type`): Qwen3-VL's MoE text model is the Qwen3 MoE decoder, Qwen3.5's the Qwen3-Next decoder
PAPER_FAMILY = {"qwen3_moe": "qwen3", "qwen3_next": "qwen3_next"}
#: Megatron-Bridge stand-in for a family with no published run of its own: Qwen3-30B-A3B (128 experts, top-8, 3B
#: active) is the published model closest to Qwen3-Next-80B-A3B's fine-grained 512 experts, top-10
MB_PROXY = {"qwen3_next": "qwen3-30b-a3b"}
#: the GPU of the Megatron-Bridge band: H100 (its bf16 peak is the default H200's)
MB_BAND_GPU = "H100"
#: the model whose band a call without ``model`` uses (the default plan's model)
DEFAULT_BAND_MODEL = ("qwen3-next-80b-a3b", "qwen3_next", True)
# kept for callers that name the default band's Megatron-Bridge model
MB_BAND_MODEL = MB_PROXY["qwen3_next"]


def _model_key(model: Any) -> tuple[str, str, bool]:
    """``(name, model_type, has MoE layers)`` of a :class:`~tessera_lab.model.spec.ModelSpec`, a shipped model's name, or ``None``
    (the default plan's model)."""
    if model is None:
        return DEFAULT_BAND_MODEL
    if isinstance(model, str):
        from tessera_lab.model.spec import load_model

        spec = load_model(model)
        return spec.name, spec.model_type, bool(spec.has_moe)
    return str(model.name), str(model.model_type), bool(model.has_moe)


def published_mfu_band(model: Any = None) -> dict[str, Any]:
    """The published MFU band of ``model``'s family, the one source for ``plan``, ``report``, ``reproduce`` and
    the notebooks.

    Chosen per model family and model (each band computed from a shipped data file):

    * ``tessera``: the Tessera paper's production jobs of the model's family (:data:`PAPER_FAMILY`:
      ``qwen3_moe`` -> the Qwen3 jobs, ``qwen3_next`` -> the Qwen3-Next jobs; ``data/paper``), lowest to highest
      of their MFU before and after Tessera;
    * ``megatron_bridge``: Megatron-Bridge's runs of this very model on :data:`MB_BAND_GPU`
      (``data/published/megatron_bridge.json``), model TFLOP/s per GPU / the GPU's dense bf16 peak (this
      project's MFU convention; the source names the runs' precision, FP8 or BF16); for a model without a run there, its family's stand-in
      :data:`MB_PROXY`, else the published model of the same ``model_type`` closest in size (gpt-oss-120b for
      gpt-oss-20b), named as a stand-in in ``source``.

    Args:
        model: a ModelSpec, a shipped model's name, or ``None`` (Qwen3-Next-80B-A3B, the default plan's model).
    Returns:
        ``{"lo", "hi", "bands": [{"name", "lo", "hi", "source"}, ...], "family"}``, shares (0.211 = 21.1%);
        ``lo``/``hi`` are ``None`` and ``bands`` empty when neither the family nor the model has a published run,
        or when the model is under :data:`BAND_MIN_SCALE` of the smallest model with a Megatron-Bridge run
        (``scale`` then says so: a model of millions of parameters runs kernels too small to compare).
    """
    name, model_type, moe = _model_key(model)
    total = None
    if model is not None:
        spec = model if not isinstance(model, str) else None
        total = (spec.param_counts().total if spec is not None else _shipped_params(name))
        smallest, small_name = _smallest_published()
        if total < BAND_MIN_SCALE * smallest:
            return {"lo": None, "hi": None, "bands": [], "family": model_type,
                    "scale": f"{_count(total)} parameters, under {BAND_MIN_SCALE:g} x the smallest model with a "
                             f"published run ({small_name}, {smallest / 1e9:.1f} B; computed)"}
    return _band(name, band_type(model_type) if moe else model_type, model_type, total, moe)


def _count(n: float) -> str:
    """``60,872``, ``60.9 M`` or ``3.05 B``."""
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M" if n >= 1e6 else f"{n:,.0f}"


#: a model smaller than this share of the smallest published model (by total parameters) is compared with no band
BAND_MIN_SCALE = 0.1


@functools.lru_cache(maxsize=64)
def _shipped_params(name: str) -> float:
    from tessera_lab.model.spec import load_model

    return float(load_model(name).param_counts().total)


@functools.lru_cache(maxsize=1)
def _smallest_published() -> tuple[float, str]:
    """``(total parameters, name)`` of the smallest model with a Megatron-Bridge run (data/published)."""
    from tessera_lab.paths import read_data_json

    names = {r["model"] for r in read_data_json("published/megatron_bridge.json", "published runs")["runs"]}
    return min((_shipped_params(n), n) for n in names)


@functools.lru_cache(maxsize=32)
def _band(name: str, family_type: str, model_type: str, total: float | None = None, moe: bool | None = None
          ) -> dict[str, Any]:
    """The bands of ``name``, whose ``model_type`` takes the family of ``family_type`` (:func:`band_type`);
    ``total`` (parameters) and ``moe``: the model's own, for a model that is not shipped (a config.json), else read
    from the shipped model."""
    from tessera_lab.paths import read_data_json

    family = PAPER_FAMILY.get(family_type)
    bands = []
    if family:
        jobs = [j for j in read_data_json("paper/tessera_paper_reported.json", "paper figures")[
            "production_jobs"] if j["family"] == family]
        paper = [j[k] for j in jobs for k in ("mfu_before", "mfu_after") if j.get(k) is not None]
        gpus = sorted({j["gpus"] for j in jobs})
        label = {"qwen3": "Qwen3 MoE", "qwen3_next": "Qwen3-Next"}.get(family, family)
        span = f"{gpus[0]:,}" if len(gpus) == 1 else f"{gpus[0]:,}-{gpus[-1]:,}"
        bands.append({"name": "tessera", "lo": min(paper), "hi": max(paper),
                      "source": f"Tessera paper, {label} at {span} GPUs"})
    if (mb := _megatron_bridge_band(name, model_type, total, moe, proxy=MB_PROXY.get(family_type))) is not None:
        bands.append(mb)
    if not bands:
        return {"lo": None, "hi": None, "bands": [], "family": model_type}
    return {"lo": min(b["lo"] for b in bands), "hi": max(b["hi"] for b in bands), "bands": bands,
            "family": model_type}


def band_type(model_type: str) -> str:
    """The ``model_type`` whose published band ``model_type`` takes: itself where :data:`PAPER_FAMILY` names it, else
    the named type read by the same family reader (``qwen3_vl_moe_text`` -> ``qwen3_moe``, ``qwen3_5_moe_text`` ->
    ``qwen3_next``), else itself. The paper's jobs are MoE: :func:`published_mfu_band` maps only MoE models."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.families import reader_for

    if model_type in PAPER_FAMILY:
        return model_type
    try:
        reader = reader_for(model_type)
    except ConfigError:
        return model_type
    return next((t for t in PAPER_FAMILY if reader_for(t) is reader), model_type)


def _same_type_stand_in(name: str, model_type: str, runs: list[dict], total: float | None = None,
                        moe: bool | None = None, gpu: str = MB_BAND_GPU) -> str | None:
    """The published model of the same model family (one reader of :mod:`tessera_lab.model.families`: the same
    architecture at another size or revision, e.g. gpt-oss-120b for gpt-oss-20b, deepseek-v3 for deepseek-v3.2,
    qwen3-30b-a3b for Qwen3-VL's MoE text model) and the same kind (MoE or dense) with a run on ``gpu`` (default
    :data:`MB_BAND_GPU`), closest to ``name`` in total parameters (by ratio; ``total`` and ``moe``: the model's own,
    given for a model loaded from a config.json, else read from the shipped model ``name``); None when there is
    none, or when ``name`` is not shipped and they are not given."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.families import reader_for
    from tessera_lab.model.spec import load_model

    try:
        family = reader_for(model_type)
        if total is None or moe is None:
            total, moe = _shipped_params(name), bool(load_model(name).has_moe)
    except (ConfigError, OSError):
        return None
    same = {r["model"] for r in runs if r["gpu"] == gpu and r["model"] != name
            and reader_for(load_model(r["model"]).model_type) is family
            and bool(load_model(r["model"]).has_moe) == moe}
    return min(same, key=lambda m: abs(math.log(_shipped_params(m) / total)), default=None)


@functools.lru_cache(maxsize=256)
def _run_tflop_rate(model: str, seq_len: int, mtp_layers: int, tokens_per_s_per_gpu: float) -> float:
    """Model TFLOP/s per GPU of a published run in the plan's convention: its published tokens/s per GPU times this
    project's model FLOPs per token (:func:`~tessera_lab.model.tasks.model_flops_per_iteration` at the run's
    sequence, its MTP layers counted). The pages' own TFLOP/s count some models otherwise (GPT-OSS 20% lower,
    Nemotron 3 Nano 6-7% higher: docs/fidelity.md), so a band built on them would compare unlike counts."""
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.model.tasks import model_flops_per_iteration

    spec = load_model(model, plan_mtp=mtp_layers > 0)
    par = ParallelConfig(pp=1, ep=1, dp=1, microbatches=1, seq_len=seq_len)
    return tokens_per_s_per_gpu * model_flops_per_iteration(spec, par) / par.tokens_per_iteration / 1e12


def run_tflop_rate(run: dict) -> float:
    """:func:`_run_tflop_rate` of a run of ``data/published/megatron_bridge.json`` (its page's Model TFLOP/s per
    GPU where it gives no tokens/s)."""
    if not run.get("tokens_per_s_per_gpu"):
        return float(run["model_tflops_per_gpu"])
    return _run_tflop_rate(run["model"], int(run["seq_len"]), int(run.get("mtp_num_layers") or 0),
                             float(run["tokens_per_s_per_gpu"]))


@functools.lru_cache(maxsize=1)
def highest_published_mfu() -> dict[str, Any] | None:
    """The highest MFU of any (MoE) Megatron-Bridge run on :data:`MB_BAND_GPU` in ``data/published/megatron_bridge.json``
    (:func:`run_tflop_rate` / the GPU's dense bf16 peak, the bands' convention): ``{"mfu", "source"}``, or ``None``
    without such a run. A plausibility ceiling for a model with no band of its own, not a limit."""
    from tessera_lab.model.hardware import hardware_data
    from tessera_lab.paths import read_data_json

    from tessera_lab.model.spec import load_model

    runs = [r for r in read_data_json("published/megatron_bridge.json", "published runs")["runs"]
            if r["gpu"] == MB_BAND_GPU and r.get("model_tflops_per_gpu") and load_model(r["model"]).has_moe]
    if not runs:
        return None
    peak = next(v["bf16_dense_tflops"] for k, v in hardware_data()["gpus"].items() if k.split("-")[0] == MB_BAND_GPU)
    best = max(runs, key=run_tflop_rate)
    return {"mfu": run_tflop_rate(best) / peak,
            "source": f"Megatron-Bridge {best['model']} on {MB_BAND_GPU}, published tokens/s x model FLOPs per token / "
                      f"{peak:.0f} bf16 TFLOP/s"}


def _span(b: dict) -> str:
    return f"{b['lo']:.1%}" if b["lo"] == b["hi"] else f"{b['lo']:.1%}-{b['hi']:.1%}"


def position(value: float, lo: float, hi: float) -> str:
    """``"inside"``, ``"above"`` or ``"below"`` the closed range ``[lo, hi]`` (the one comparison every band
    sentence is built from)."""
    return "inside" if lo <= value <= hi else ("above" if value > hi else "below")


def dense_band(model: Any, gpu: str | None = None, precision: str | None = None) -> dict[str, Any] | None:
    """The published band of a dense ``model`` (a ModelSpec or a shipped model's name) for a plan on ``gpu`` (a GPU
    type as ``data/hardware`` names it, ``H100-SXM`` or ``H100``) in ``precision`` (``bf16``/``fp8``): the
    Megatron-Bridge runs (``data/published/megatron_bridge.json``) of the model, else of the dense model of the same
    family closest in size, on that GPU type (H100 runs for an H200, as :func:`published_mfu_band` takes them) and in
    that precision, model TFLOP/s per GPU / the GPU's dense bf16 peak
    (the plan's MFU convention). ``{"lo", "hi", "bands": [...], "family"}`` as :func:`published_mfu_band`; ``None``
    without a model, a GPU or a precision, or without such a run (a dense plan is never set against runs of
    another GPU or precision)."""
    if model is None or gpu is None or precision is None:
        return None
    name, model_type, moe = _model_key(model)
    if moe:
        return None
    kind = gpu.split("-")[0]
    kind = MB_BAND_GPU if kind == "H200" else kind  # the H200 is an H100 with more HBM: same SMs and bf16 peak
    total = model.param_counts().total if not isinstance(model, str) else None
    band = _megatron_bridge_band(name, model_type, total, False, gpu=kind, precision=precision)
    return None if band is None else {"lo": band["lo"], "hi": band["hi"], "bands": [band], "family": model_type}


def _megatron_bridge_band(name: str, model_type: str, total: float | None, moe: bool | None, *,
                          gpu: str = MB_BAND_GPU, precision: str | None = None, proxy: str | None = None
                          ) -> dict[str, Any] | None:
    """The ``megatron_bridge`` band of ``name``: its Megatron-Bridge runs (``data/published/megatron_bridge.json``)
    on ``gpu`` (and in ``precision`` where given), else those of ``proxy``, else of :func:`_same_type_stand_in`'s
    model; :func:`run_tflop_rate` / the GPU's dense bf16 peak (the plan's MFU convention). ``{"name", "lo", "hi",
    "source"}``, or ``None`` without such runs."""
    from tessera_lab.model.hardware import hardware_data
    from tessera_lab.paths import read_data_json

    runs = [r for r in read_data_json("published/megatron_bridge.json", "published runs")["runs"]
            if r["gpu"] == gpu and (precision is None or r.get("precision") == precision)]
    mb_model = (name if any(r["model"] == name for r in runs)
                else proxy or _same_type_stand_in(name, model_type, runs, total, moe, gpu=gpu))
    mine = [r for r in runs if r["model"] == mb_model]
    if not mine:
        return None
    peak = next(v["bf16_dense_tflops"] for k, v in hardware_data()["gpus"].items() if k.split("-")[0] == gpu)
    mfu = [run_tflop_rate(r) / peak for r in mine]
    stand_in = "" if mb_model == name else f" (stand-in for {name})"
    label = " and ".join(sorted({str(r.get("precision", "?")).upper() for r in mine}))  # as each run states
    return {"name": "megatron_bridge", "lo": min(mfu), "hi": max(mfu),
            "source": f"Megatron-Bridge {mb_model}{stand_in} on {gpu} ({label} runs, published tokens/s x model FLOPs "
                      f"per token / {peak:.0f} bf16 TFLOP/s)"}


def mfu_text(mfu: float, *, moe: bool = True, model: Any = None, gpu: str | None = None,
             precision: str | None = None) -> str:
    """``"21.0%: inside 15.9%-21.1% Tessera paper, ...; above 11.9%-21.1% Megatron-Bridge ..."``: the MFU against
    the published band of ``model``'s family (:func:`published_mfu_band`; a dense model's: :func:`dense_band` on the
    plan's ``gpu`` in its ``precision``);
    a dense model without a band, and a MoE model without one, get the bare percentage (the latter with a caution
    when it exceeds every published MoE run's MFU, :func:`highest_published_mfu`)."""
    if not moe:
        band = dense_band(model, gpu, precision)
        if band is None:
            asked = model is not None and gpu is not None and precision is not None
            return f"{mfu:.1%}" + (" (no published dense run of this model's family on this GPU type in this "
                                   "precision)" if asked else "")
        return _band_text(mfu, band)
    top = highest_published_mfu()
    above = (f"; ABOVE every published MoE run's MFU here (highest {top['mfu']:.1%}, {top['source']})"
             if top and mfu > top["mfu"] else "")
    band = published_mfu_band(model)
    if not band["bands"]:
        if band.get("scale"):
            return f"{mfu:.1%} (no published band at this scale: {band['scale']}{above})"
        return f"{mfu:.1%} (no published run of this model or its family in data/paper or data/published{above})"
    return _band_text(mfu, band)


def _band_text(mfu: float, band: dict[str, Any]) -> str:
    """The sentence of :func:`mfu_text` for a model with a band."""
    where = position(mfu, band["lo"], band["hi"])
    each = [position(mfu, b["lo"], b["hi"]) for b in band["bands"]]
    if len(set(each)) > 1:  # inside one band only: say which
        return f"{mfu:.1%}: " + "; ".join(f"{w} {_span(b)} {b['source']}" for w, b in zip(each, band["bands"]))
    where = where.upper() if where == "above" else where
    return f"{mfu:.1%}, {where} the published band (" + "; ".join(
        f"{_span(b)} {b['source']}" for b in band["bands"]) + ")"


def mfu_line(plan: Any) -> str:
    """``MFU of the chosen plan (simulated): 14.7%, below ...``: a plan's MFU against its published band
    (:func:`mfu_text`), as ``plan`` prints it and the planning panels show it."""
    m = plan.model
    return ("MFU of the chosen plan (simulated): "
            + mfu_text(plan.chosen.mfu, moe=m.moe.num_experts > 0, model=m, gpu=plan.cluster.gpu.name,
                       precision=plan.parallel.precision))


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
    if within_spread(gain, spread):
        return f"gain {gain:+.1%} not significant: within the measurement spread ±{abs(spread):.1%}"
    return None


def mfu_note(mfu: float, *, moe: bool = True, grouped_gemm: str | None = None, model: Any = None,
             gpu: str | None = None, precision: str | None = None) -> str | None:
    """Flag a planned MFU above the published band: for MoE models :func:`published_mfu_band` of ``model``'s family
    (``None``: the default plan's model), for dense ones their :func:`dense_band` (on ``gpu`` in ``precision``),
    else the best BF16 MFU of a published large-scale dense run (:data:`PUBLISHED_MFU_CEILING`).
    ``grouped_gemm`` (the plan's expert-GEMM mode) picks the likely cause named: ``grouped`` (one grouped kernel,
    which the recipes do not run), else the per-layer host work the cost model may undercount."""
    if moe:
        band = published_mfu_band(model)
        cause = "simulated, likely optimistic: " + ("one grouped expert GEMM kernel, which recipes do not run"
                                                     if grouped_gemm == "grouped"
                                                     else "host or GPU time the cost model underprices")
        if band["bands"] and mfu > band["hi"]:  # short: the MFU line beside it already names the bands and sources
            return (f"MFU {mfu:.1%} is above the published band (max {band['hi']:.1%}, {mfu / band['hi']:.2f}x): "
                    + cause)
        top = highest_published_mfu()
        if not band["bands"] and top and mfu > top["mfu"]:  # no band of its own: every published MoE run's MFU
            return (f"MFU {mfu:.1%} is above every published MoE run's (highest {top['mfu']:.1%}, "
                    f"{mfu / top['mfu']:.2f}x): " + cause)
        return None
    band = dense_band(model, gpu, precision)
    if band is not None:  # the model's own (or its family's) published dense runs on this GPU, in this precision
        if mfu > band["hi"]:
            return (f"MFU {mfu:.1%} is above the published band (max {band['hi']:.1%}, {mfu / band['hi']:.2f}x): "
                    "simulated, likely optimistic")
        return None
    ceiling = PUBLISHED_MFU_CEILING["dense"]
    if precision in (None, "bf16") and mfu > ceiling:  # a BF16 figure: an FP8 plan's MFU is not comparable
        return (f"MFU {mfu:.1%} is above the best BF16 MFU of a published large-scale dense run ({ceiling:.0%}, "
                f"{PUBLISHED_MFU_SOURCE}; no published run of this model's family on this GPU in this precision): "
                "simulated, likely optimistic")
    return None


def memory_note(method: str, evaluation: Any, capacity_bytes: float | None = None) -> str | None:
    """Name an evaluation (partition) that does not fit in GPU memory, with its worst stage and, given the GPU's
    ``capacity_bytes``, the shortfall in GiB."""
    if getattr(evaluation, "fits_memory", True):
        return None
    stages = getattr(evaluation, "stages", [])
    ranks = list(getattr(getattr(evaluation, "partition", None), "rank_memory", None) or [])
    if ranks and len(ranks) < len(stages):  # virtual stages: a rank holds several chunks, and its sum is what fits
        r = max(range(len(ranks)), key=ranks.__getitem__)
        name, need = f"pipeline rank {r}", ranks[r]
        chunks = f" over its {len(stages) // len(ranks)} chunks"
    else:
        worst = max((st for st in stages if getattr(st, "memory_bytes", None) is not None),
                    key=lambda st: st.memory_bytes, default=None)
        name, need, chunks = (f"stage {worst.index}", worst.memory_bytes, "") if worst is not None else ("", 0.0, "")
    where = ""
    if name:
        where = f" ({name} needs {need / 2**30:.2f} GiB{chunks}"
        if capacity_bytes:  # the same figures and wording as the planner's infeasibility message
            where += f", {(need - capacity_bytes) / 2**30:.2f} GiB more than the {capacity_bytes / 2**30:.2f} GiB available"
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
            if within_spread(float(row["gain"]), iqr):
                note = (f"gain {float(row['gain']) * 1e3:+.3g} ms not significant: within the repeats' "
                        f"interquartile range {iqr * 1e3:.3g} ms")
        notes.append(note or "")
    return notes


def ratio_note(value: float, what: str = "spread") -> str | None:
    """An infinite or NaN ratio (a zero or negative denominator) is "n/a", with the reason."""
    if value is None or math.isinf(value) or math.isnan(value):
        return f"{what} n/a: the smallest value is zero or negative, so the ratio is undefined"
    return None
