"""The Tessera paper's jobs as scenarios: public stand-in models at the paper's GPU counts (docs/reproduce.md).

Each file under ``data/paper/scenarios/`` names a paper job (a production job, the dynamic-only job, the two
overlap jobs or the 256-GPU Megatron-Core comparison), a public stand-in model (a shipped config, optionally
changed with :meth:`~tessera_lab.model.spec.ModelSpec.with_changes`), the job's GPUs and a layout such a job would
use (EP across nodes where EP > 8), every field not from the paper labelled in ``assume``.

:func:`run_scenario` plans a scenario (simulated: analytic cost model and simulator) and returns:

* ``after``: the overlap-aware plan (ILP + simulator refinement), the faster of the overlapped schedule and its
  interleaved form at VP 2 (the planner's two schedules that overlap EP communication), each also with selective
  recomputation when the Megatron-Core baseline needed it to fit, and its capacity figures
  (EP hidden share, exposed EP share and pipeline idle share of the iteration; :mod:`tessera_lab.report.capacity`);
* ``baselines``, each with its gain ``T_baseline / T_after - 1`` (shown separately, never merged):
  ``even_1f1b`` (even layer split, plain 1F1B: the usual "before"), ``even`` (even split, same overlapped
  schedule), ``standalone`` (split balanced on standalone task times: a planner without overlap measurement),
  ``parameters`` (split balanced on parameter bytes per stage, as memory-driven splits do, same schedule) and
  each also as ``gain_with_sync``: the baseline and the overlap-aware plan both planned again with the host/sync
  term fitted on published runs (:mod:`tessera_lab.cost.sync`; every schedule pays what it exposes, the EP-overlap ones
  in their forwards run apart and the part of each paired forward's waits the paired backward does not hide)
  -- a second reading, never merged with the first (the first plans every setup with the planner's own
  term off, ``host_sync_s = 0``; the second plans the same setups with the planner's term at its fitted value);
  ``megatron_core`` (the fastest of Megatron-Core's public layout options that fits memory: even or
  embedding/loss-accounted split, ``account_for_embedding/loss_in_pipeline_split``; plain 1F1B, or interleaved
  VP 2 with the combined-1F1B EP overlap, ``overlap_moe_expert_parallel_comm``, which needs VP when PP > 1);
* ``ablation``: static gain over ``even_1f1b`` split into overlap scheduling ``T0/T1 - 1`` and stage balance
  ``T0/T2 - T0/T1`` (``T1`` = ``even``, ``T2`` = after);
* ``band``: the uncertain knobs one at a time on the chosen partition (EP across nodes vs EP 8 in a node with the
  same GPUs, alltoall vs DeepEP dispatcher, per-expert vs one grouped GEMM, sequence length 2048 / 4096 / 8192,
  8192 with selective recomputation as a job of that length would run), plus
  every knob at its more favourable value together; ``mfu_band`` etc. are lowest-highest over the variants that
  fit memory.

This module imports the planner, not torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.paths import data_dir
from tessera_lab.plan.stages import accounted_boundaries

#: simulator refinement budget per scenario plan (the planner's default is larger; reproduce keeps to a minute)
REFINE_BUDGET = 30
KNOB_VALUES = {"ep_placement": ("across_nodes", "in_node"), "dispatcher": ("alltoall", "deepep"),
               "grouped_gemm": ("multistream", "grouped"), "seq_len": (2048, 4096, 8192)}
LAYOUT_FIELDS = ("pp", "ep", "dp", "tp", "microbatches", "seq_len", "dispatcher", "grouped_gemm", "precision",
                 "recompute", "ep_placement")


def _scenario_schema():
    from tessera_lab.schema import F

    size = {k: F("int", low=1, limit=k if k in ("pp", "ep", "dp", "tp", "microbatches", "seq_len") else None,
                 required=k in ("pp", "ep", "dp")) for k in ("pp", "ep", "dp", "tp", "microbatches", "seq_len")}
    words = {k: F("str", required=False) for k in ("dispatcher", "grouped_gemm", "precision", "recompute",
                                                   "ep_placement")}
    return F("dict", fields={
        "id": F("str"), "paper": F("dict"), "gpus": F("int", low=1, limit="world_size"),
        "model": F("dict", fields={"name": F("str"), "changes": F("dict", required=False),
                                   "why": F("str", required=False)}),
        "layout": F("dict", fields={**size, **words}), "assume": F("dict"),
        "knobs": F("map", required=False, values=F("list", low=1, items=F("any")))})


#: a ``data/paper/scenarios`` file (:func:`load_scenario`; unknown fields are allowed, as everywhere)
SCENARIO = _scenario_schema()


def scenario_dir() -> Path:
    return data_dir() / "paper" / "scenarios"


@dataclass(frozen=True)
class Scenario:
    """One paper job on a public stand-in (a ``data/paper/scenarios`` file)."""

    id: str
    paper: dict
    gpus: int
    model_name: str
    changes: dict
    model_why: str
    layout: dict
    assume: dict
    knobs: dict

    def model(self):
        from tessera_lab.model.spec import load_model

        spec = load_model(self.model_name)
        if self.changes:
            spec = spec.with_changes(**self.changes, name=f"{self.model_name} ({self.changes_text()})")
        return spec

    def changes_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in self.changes.items())

    def parallel(self, **changes: Any) -> ParallelConfig:
        return ParallelConfig(**{k: self.layout[k] for k in LAYOUT_FIELDS if k in self.layout}).replace(**changes)


def load_scenario(path: str | Path) -> Scenario:
    """A scenario file, checked: the layout's ``pp x ep x dp x tp`` equals ``gpus``.

    Raises:
        ConfigError: a missing field or a layout that does not place ``gpus`` GPUs (names the field and value).
    """
    from tessera_lab.io import read_json
    from tessera_lab.schema import validate

    path = Path(path)
    d = read_json(path, "scenario file")  # missing, empty, not UTF-8, not JSON: one line
    where = f"scenario file '{path}'"
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: top level is a JSON {type(d).__name__}; allowed: a scenario object with id, "
                          "paper, gpus, model, layout and assume")
    for key in ("id", "paper", "gpus", "model", "layout", "assume"):
        if key not in d:
            raise ConfigError(f"{path.name}: field '{key}' is missing; allowed: a scenario with id, paper, gpus, "
                              "model, layout and assume")
    validate(d, SCENARIO, where)  # every field typed and bounded: a string 'pp' is named, never multiplied
    lay = d["layout"]
    world = lay["pp"] * lay["ep"] * lay["dp"] * lay.get("tp", 1)
    if world != d["gpus"]:
        raise ConfigError(f"{path.name}: field 'gpus' = {d['gpus']} differs from pp x ep x dp x tp = {world}; "
                          "allowed: the layout's GPU count")
    return Scenario(d["id"], d["paper"], int(d["gpus"]), d["model"]["name"], dict(d["model"].get("changes", {})),
                    d["model"].get("why", ""), dict(lay), dict(d["assume"]), dict(d.get("knobs", KNOB_VALUES)))


def load_scenarios(ids: Sequence[str] | None = None) -> list[Scenario]:
    """Every scenario under :func:`scenario_dir` (or those named), in file-name order.

    Raises:
        ConfigError: an id that names no scenario (lists the known ones).
    """
    all_ = [load_scenario(p) for p in sorted(scenario_dir().glob("*.json"))]
    if ids is None:
        return all_
    known = {s.id: s for s in all_}
    bad = [i for i in ids if i not in known]
    if bad:
        raise ConfigError(f"field 'scenario' = {bad[0]!r} is unknown; allowed: {', '.join(known)}")
    return [known[i] for i in ids]


# ----------------------------------------------------------------------------------------------- evaluation
def _capacity(plan, evaluation=None) -> dict[str, float]:
    """EP hidden share, exposed EP share and pipeline idle share (bubble + stage imbalance) of the iteration."""
    from tessera_lab.report.capacity import capacity_report

    rep = capacity_report(plan, evaluation)
    gpu_s = rep.gpu_time_s
    idle = rep.parts.get("bubble", 0.0) + rep.parts.get("stage_imbalance", 0.0)
    return {"ep_hidden": rep.ep_hidden_fraction, "ep_exposed_share": rep.ep_exposed_share,
            "pipeline_idle_share": idle / gpu_s if gpu_s > 0 else 0.0}


def _even(model, par, *, boundaries=None, capacity: bool = False) -> dict[str, Any]:
    """A given (or even) split under ``par``: MFU, iteration time, fits; ``fits = False`` with the reason when no
    memory fit (the time is then not reported)."""
    from tessera_lab.plan.make import make_plan

    try:
        plan = make_plan(model, par, method="uniform", baselines=(), boundaries=boundaries)
    except TesseraError as exc:
        return {"fits": False, "mfu": math.nan, "iteration_s": math.nan, "note": str(exc).splitlines()[0]}
    ev = plan.chosen
    out = {"fits": bool(ev.fits_memory), "mfu": ev.mfu, "iteration_s": ev.iteration_time_s, "note": ""}
    if capacity:
        out.update(_capacity(plan))
    return out


def accounted_split(num_layers: int, stages: int) -> list[int] | None:
    """Megatron-Core's ``account_for_embedding_in_pipeline_split`` + ``account_for_loss_in_pipeline_split``
    (``get_num_layers_to_build``, ``megatron/core/transformer/transformer_block.py``): every virtual stage gets
    ``(L + 2) / stages`` slots, the embedding taking one on the first and the loss one on the last. Boundaries, or
    ``None`` when ``L + 2`` does not divide (Megatron refuses that layout)."""
    slots, rest = divmod(num_layers + 2, stages)
    if rest or slots < 2:
        return None
    return accounted_boundaries(num_layers, stages, embedding=True, loss=True)


def megatron_core_best(model, par: ParallelConfig, *, _recomputing: bool = False) -> dict[str, Any]:
    """The fastest of Megatron-Core's public pipeline options that fits memory (module docstring), with every
    option tried in ``tried``; when none fits, the same options with selective recomputation."""
    tried = []
    for vpp, schedule in ((1, "1f1b"), (2, "interleaved-overlapped")):
        if par.pp * vpp > model.num_layers or (vpp > 1 and par.pp < 2):
            continue
        for split in ("even", "embedding/loss-accounted"):
            bounds = None if split == "even" else accounted_split(model.num_layers, par.pp * vpp)
            if split != "even" and bounds is None:
                tried.append({"setup": f"{split} split, {schedule} vpp {vpp}", "fits": False, "mfu": math.nan,
                              "iteration_s": math.nan, "note": f"{model.num_layers} + 2 does not divide over "
                                                               f"{par.pp * vpp} virtual stages"})
                continue
            r = _even(model, par.replace(schedule=schedule, vpp=vpp), boundaries=bounds)
            tried.append({"setup": f"{split} split, {schedule}" + (f" vpp {vpp} (combined-1F1B EP overlap)"
                                                                   if vpp > 1 else ""), **r})
    fit = [t for t in tried if t["fits"]]
    if not fit and par.recompute == "none" and not _recomputing:
        # what a Megatron-Core user does next: selective recomputation (--recompute-granularity selective)
        more = megatron_core_best(model, par.replace(recompute="selective"), _recomputing=True)
        for t in more["tried"]:
            t["setup"] += ", selective recomputation"
        tried += more["tried"]
        fit = [t for t in tried if t["fits"]]
    best = min(fit, key=lambda t: t["iteration_s"]) if fit else {"setup": "none fits memory", "fits": False,
                                                                 "mfu": math.nan, "iteration_s": math.nan}
    return {**best, "tried": tried}


def _knob_parallel(par: ParallelConfig, knob: str, value) -> ParallelConfig | None:
    if knob == "ep_placement":
        if value == "across_nodes":
            return par
        if par.ep <= 8:
            return None  # already in a node
        return par.replace(ep=8, dp=par.dp * par.ep // 8)
    if knob == "seq_len" and value > par.seq_len and par.recompute == "none":
        return par.replace(seq_len=value, recompute="selective")  # how a longer-context job fits its activations
    return par.replace(**{knob: value})


def run_scenario(sc: Scenario, *, knobs: bool = True, limit=None) -> dict[str, Any]:
    """Plan one scenario: ``after``, ``baselines``, ``ablation``, ``band`` (module docstring). Every number is
    simulated (analytic cost model); ``after["solve"]`` says whether the partition is proven optimal. ``limit``: the
    ILP's, as :func:`~tessera_lab.plan.make.make_plan`'s (None: its deterministic default budget)."""
    model = sc.model()
    # the first reading: every setup planned with the planner's host/sync term off (cost/sync.py); the second
    # (gain_with_sync) adds the term below, so the two are never merged
    par0 = sc.parallel().replace(host_sync_s=0.0)
    mc_best = megatron_core_best(model, par0)
    plans = _overlap_plans(model, par0, mc_best, limit)
    if not plans:
        raise ConfigError(f"scenario {sc.id}: no overlap-aware plan fits memory at its layout")
    fitting = [p for p in plans if p.chosen.fits_memory] or plans
    plan = min(fitting, key=lambda p: p.chosen.iteration_time_s)
    after = _after(plan, plans)
    # the second reading plans again with the term, as Megatron-Core's options are re-picked with it
    plans_sync = _overlap_plans(model, par0.replace(host_sync_s=None), mc_best, limit)
    fitting_sync = [p for p in plans_sync if p.chosen.fits_memory] or plans_sync
    plan_sync = min(fitting_sync, key=lambda p: p.chosen.iteration_time_s) if fitting_sync else None
    base = _baselines(model, par0, plan, mc_best, plan_sync)
    t0, t1, t2 = base["even_1f1b"]["iteration_s"], base["even"]["iteration_s"], after["iteration_s"]
    ablation = {"total": t0 / t2 - 1, "overlap": t0 / t1 - 1, "balance": t0 / t2 - t0 / t1,
                "fits": base["even_1f1b"]["fits"] and base["even"]["fits"]}
    band = [{"knob": "central", "value": "as in the scenario", "fits": after["fits"], "mfu": after["mfu"],
             **{k: after[k] for k in ("ep_hidden", "ep_exposed_share", "pipeline_idle_share")}, "note": ""}]
    if knobs:
        band += _knob_band(sc, model, plan.parallel, after)
    out = {"id": sc.id, "paper": sc.paper, "gpus": sc.gpus, "model": model.name, "model_why": sc.model_why,
           "layout": sc.layout, "assume": sc.assume, "after": after, "baselines": base, "ablation": ablation,
           "band": band}
    return out | _band_ranges(band)


def _overlap_plans(model, par0: ParallelConfig, mc_best: dict[str, Any], limit) -> list:
    """The overlap-aware plans tried: one and two chunks per rank, each with no recomputation and, when the
    Megatron-Core baseline needed it to fit, selective recomputation; setups that do not plan are left out."""
    from tessera_lab.plan.make import make_plan

    # the plan may use what the Megatron-Core baseline needed to fit: selective recomputation, when it did
    recomputes = ("none", "selective") if "recomputation" in mc_best["setup"] else ("none",)
    plans = []
    for recompute in recomputes:
        for vpp, schedule in ((1, "overlapped"), (2, "interleaved-overlapped")):
            if vpp > 1 and (par0.pp < 2 or par0.pp * vpp > model.num_layers):
                continue
            try:
                plans.append(make_plan(model, par0.replace(schedule=schedule, vpp=vpp, recompute=recompute),
                                       baselines=("uniform", "standalone", "parameters"), limit=limit,
                                       refine_budget=REFINE_BUDGET))
            except TesseraError:
                continue
    return plans


def _after(plan, plans: list) -> dict[str, Any]:
    """The chosen plan's reading (``after``): MFU, iteration time, layout, every candidate tried, the solve line
    and the capacity shares."""
    from tessera_lab.plan.proof import solve_line

    par, ev = plan.parallel, plan.chosen
    return {"mfu": ev.mfu, "iteration_s": ev.iteration_time_s, "fits": bool(ev.fits_memory), "schedule": par.schedule,
            "vpp": par.vpp, "recompute": par.recompute,
            "candidates": [{"schedule": p.parallel.schedule, "vpp": p.parallel.vpp, "recompute": p.parallel.recompute,
                            "mfu": p.chosen.mfu,
                            "fits": bool(p.chosen.fits_memory), "boundaries": list(p.chosen.partition.boundaries)}
                           for p in plans],
            "boundaries": list(ev.partition.boundaries), "solve": solve_line(plan),
            "proven_optimal": ev.partition.proven, **_capacity(plan)}


def _baselines(model, par0: ParallelConfig, plan, mc_best: dict[str, Any], plan_sync=None
               ) -> dict[str, dict[str, Any]]:
    """The baselines (even split with plain 1F1B, the plan's own baselines under its schedule, Megatron-Core's best),
    each with its gain over the plan, read with the host/sync term off and then at its fitted value (``plan_sync``:
    the overlap-aware plan made with the term, whose own baselines are the priced ones; ``None``, when it does not
    plan: no second reading, NaN)."""
    par = plan.parallel
    t2 = plan.chosen.iteration_time_s

    def gain(t: float) -> float:
        return t / t2 - 1.0 if t == t == t and t > 0 else math.nan

    base = {}
    e1 = _even(model, par0.replace(schedule="1f1b", vpp=1))
    base["even_1f1b"] = {"setup": "even split, plain 1F1B", **e1}
    sched = par.schedule + (f" vpp {par.vpp}" if par.vpp > 1 else "")
    for name, label in (("uniform", f"even split, {sched} (the plan's schedule)"),
                        ("standalone", f"balanced on standalone F+B+W, {sched}"),
                        ("parameters", f"balanced on parameters per stage, {sched}")):
        b = plan.baselines[name]
        key = "even" if name == "uniform" else name
        base[key] = {"setup": label, "fits": bool(b.fits_memory), "mfu": b.mfu, "iteration_s": b.iteration_time_s,
                     "note": "" if b.fits_memory else "exceeds GPU memory: its time is not achievable"}
    base["megatron_core"] = mc_best
    base["even_1f1b"]["schedule"] = "1f1b"
    base["even"]["schedule"] = base["standalone"]["schedule"] = base["parameters"]["schedule"] = par.schedule
    mc = base["megatron_core"]
    mc["schedule"] = "interleaved-overlapped" if "interleaved-overlapped" in mc["setup"] else "1f1b"
    # the second reading: the same setups planned with the planner's host/sync term (cost/sync.py) at its fitted
    # value, the overlap-aware plan among them; every schedule pays what it exposes (the EP-overlap schedules: the
    # forwards they run apart, and in each pair the waits the paired backward's mlp node does not hide)
    par_sync = par0.replace(host_sync_s=None)
    t2_sync = plan_sync.chosen.iteration_time_s if plan_sync is not None else math.nan

    def gain_sync(t: float) -> float:
        return t / t2_sync - 1.0 if t == t and t > 0 and t2_sync == t2_sync else math.nan

    priced = {"even_1f1b": _even(model, par_sync.replace(schedule="1f1b", vpp=1))["iteration_s"]}
    for name, key in (("uniform", "even"), ("standalone", "standalone"), ("parameters", "parameters")):
        priced[key] = plan_sync.baselines[name].iteration_time_s if plan_sync is not None else math.nan
    for b in base.values():
        b["gain"] = gain(b["iteration_s"]) if b["fits"] else math.nan
    for key, b in base.items():
        if key == "megatron_core":
            continue
        t_sync = priced[key]
        b["sync_s"] = t_sync - b["iteration_s"] if b["fits"] else 0.0
        b["gain_with_sync"] = gain_sync(t_sync) if b["fits"] else math.nan
    # Megatron-Core's best with the term: the fastest of its options once each pays what its schedule exposes
    mc_sync = megatron_core_best(model, par_sync)
    if mc_sync["fits"]:
        same = next((t for t in mc["tried"] if t["setup"] == mc_sync["setup"]), mc)
        mc.update(gain_with_sync=gain_sync(mc_sync["iteration_s"]), sync_setup=mc_sync["setup"],
                  sync_s=mc_sync["iteration_s"] - same["iteration_s"])
    else:
        mc.update(gain_with_sync=math.nan, sync_s=0.0)
    return base


def _knob_band(sc: Scenario, model, par: ParallelConfig, after: dict[str, Any]) -> list[dict[str, Any]]:
    """The band's rows away from the centre: the plan's partition under each other knob value (even-split
    evaluation) and, when more than one knob gains, under all the favourable ones together."""
    bounds = after["boundaries"]
    band, better = [], {}
    for knob, values in KNOB_VALUES.items():
        for value in values:
            if value == _central(sc, knob):
                continue
            kp = _knob_parallel(par, knob, value)
            if kp is None:
                continue
            r = _even(model, kp, boundaries=bounds, capacity=True)
            band.append({"knob": knob, "value": value, **r})
            if r["fits"] and r["mfu"] > after["mfu"]:
                better[knob] = value
    if len(better) > 1:
        kp = par
        for knob, value in better.items():
            kp = _knob_parallel(kp, knob, value)
        r = _even(model, kp, boundaries=bounds, capacity=True)
        band.append({"knob": "favourable together", "value": ", ".join(f"{k} {v}" for k, v in better.items()), **r})
    return band


def _band_ranges(band: list[dict[str, Any]]) -> dict[str, list[float]]:
    """``[min, max]`` over the band's fitting rows of MFU, EP hidden, EP exposed, pipeline idle and exposed + idle
    (NaN without such rows)."""
    fit = [b for b in band if b["fits"]]
    out = {}
    for key in ("mfu", "ep_hidden", "ep_exposed_share", "pipeline_idle_share"):
        vals = [b[key] for b in fit if key in b and b[key] == b[key]]
        out[f"{key}_band"] = [min(vals), max(vals)] if vals else [math.nan, math.nan]
    idle = [b["ep_exposed_share"] + b["pipeline_idle_share"] for b in fit if "pipeline_idle_share" in b]
    out["exposed_plus_idle_band"] = [min(idle), max(idle)] if idle else [math.nan, math.nan]
    return out


def _central(sc: Scenario, knob: str):
    if knob == "ep_placement":
        return "across_nodes" if sc.layout["ep"] > 8 else "in_node"
    return sc.layout.get(knob, ParallelConfig().__getattribute__(knob))


def run_scenarios(ids: Sequence[str] | None = None, *, knobs: bool = True) -> list[dict[str, Any]]:
    """:func:`run_scenario` for every scenario (or those named)."""
    return [run_scenario(sc, knobs=knobs) for sc in load_scenarios(ids)]


# ----------------------------------------------------------------------------------------------- dynamic at scale
#: routing of the dynamic scenario (assumption, docs/reproduce.md): Zipf 0.2 whose hot experts move every step;
#: at EP 32 the busiest EP rank carries about 1.35x the mean (p50 over layers and micro-batches)
DYNAMIC_ROUTING = "drift:0.2"


def dynamic_at_scale(results: list[dict[str, Any]], *, routing: str = DYNAMIC_ROUTING, schedule: str = "zb-h1",
                     paper: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The dynamic-only job's scenario (``paper.kind = ablation_dynamic``): the static plan is the scenario's
    one-chunk overlap-aware partition under ``schedule`` (ZB-H1: W already placed in the cool-down, as a tuned
    static plan would), routing ``routing``; :func:`tessera_lab.dynamic.mechanisms.mechanism_split` gives the
    gain per mechanism and the predictor's error, :func:`~tessera_lab.dynamic.mechanisms.required_for` what the
    paper's 641 ms / +3.4% would need. ``None`` without such a scenario."""
    from tessera_lab.dynamic.durations import StageCosts
    from tessera_lab.dynamic.mechanisms import mechanism_split, memory_limit, required_for

    r = next((x for x in results if x["paper"].get("kind") == "ablation_dynamic"), None)
    if r is None:
        return None
    sc = load_scenarios([r["id"]])[0]
    one = next((c for c in r["after"]["candidates"] if c["vpp"] == 1), None)
    par = sc.parallel(schedule=schedule, host_sync_s=0.0)  # the scenarios' first reading: host/sync term off
    costs = StageCosts.from_model(sc.model(), par, boundaries=one["boundaries"] if one else None)
    res = mechanism_split(costs, routing, schedule=schedule, microbatches=par.microbatches)
    ab = paper or {"dynamic_only_idle_reduction_ms": 641, "dynamic_only_throughput_gain": 0.034}
    need = required_for(ab["dynamic_only_idle_reduction_ms"], ab["dynamic_only_throughput_gain"], res)
    g = res["gain"]
    needs = (f"the paper's {ab['dynamic_only_idle_reduction_ms']:.0f} ms at {ab['dynamic_only_throughput_gain']:+.1%} "
             f"imply a {need['paper_step_s']:.1f} s step; ours is {res['iteration_static_s']:.2f} s and would need "
             f"{need['needed_idle_removed_ms']:.0f} ms removed per rank, while the W work a rank could move is "
             f"{need['our_w_per_rank_ms']:.0f} ms (of {need['our_idle_static_ms']:.0f} ms idle): "
             + ("W alone cannot supply it" if need["our_w_per_rank_ms"] < need["needed_idle_removed_ms"] else
                "W could supply it if the gaps were predictable")
             + f"; split: W {g['w_only']:+.2%}, reduce-scatter chunks {g['rs_only']:+.2%}, both {g['total']:+.2%}, "
               f"with exact routing (oracle) {g['oracle_total']:+.2%}")
    lim = memory_limit(costs, routing, schedule=schedule, microbatches=par.microbatches, extra=(1, 4, 32))
    by = lim["by_extra"]
    needs += (f"; binding limit: activation memory on the bottleneck rank (rank {lim['bottleneck_rank']}, "
              f"{lim['bottleneck_w_per_microbatch_ms']:.1f} ms of W per micro-batch): at the static plan's memory each "
              "rank may defer about one W past its next forward; with 1 / 4 / 32 more micro-batches of activations "
              f"per rank the gain is {by[1]['total']:+.2%} / {by[4]['total']:+.2%} / {by[32]['total']:+.2%} "
              f"({by[32]['idle_removed_ms']:.0f} ms removed at 32), against {lim['w_free_gain']:+.2%} with every W "
              "free (no W order gains more); exact routing gains no more because the prediction is not what binds; "
              f"the data dependency alone (memory aside) would let W into {lim['data_dependency']['fillable_ms']:.0f} "
              f"ms of the {lim['data_dependency']['gap_ms']:.0f} ms idle between each rank's first and last action "
              f"on the static timeline, against {by[32]['idle_removed_ms']:.0f} ms removed with 32 more "
              "micro-batches of memory")
    return {**res, "total_gain": g["total"], "scenario": r["id"], "needs": needs, "required": need,
            "memory_limit": lim}
