"""Reproducing the Tessera paper's claims on its own scale, with public stand-ins (docs/reproduce.md).

Every table shows the paper's **reported** numbers (``data/paper/tessera_paper_reported.json``, an editorial
digest of the paper; internal model sizes are not public) beside this library's result on the paper's jobs as
scenarios (``data/paper/scenarios``, :mod:`tessera_lab.report.scenarios`), labelled ``simulated`` (analytic cost
model + simulator), ``measured (cpu)`` (a profile measured on this machine by ``tessera-lab measure --backend
cpu``) or ``measured (<GPU name>)`` (a GPU profile under ``data/profiles/``).

:func:`reproduce` computes:

1. ``claims``: one row per paper claim with a verdict computed from the numbers (:mod:`tessera_lab.report.claims`);
2. ``mfu``: MFU before (Megatron-Core's best public setup) and after (overlap-aware plan) per production job,
   with the band over the uncertain knobs (EP placement, dispatcher, grouped GEMM, sequence length);
3. ``baselines``: per scenario, the gain over an even split (plain 1F1B, and the plan's schedule), over a split
   balanced on standalone task times and over Megatron-Core's best public setup, each separately;
4. ``bands``: every knob variant per scenario;
5. ``ablation``: static gain split into overlap scheduling and stage balance, and the dynamic optimizer at
   6,144 GPUs split by mechanism (:mod:`tessera_lab.dynamic.mechanisms`);
6. ``overlap``: gain of layer-kind combinations (analytic and measured); ``width``: hidden/exposed EP share vs
   expert width.

This module imports the planner, the overlap scheduler, the dynamic optimizer and the study; torch is not needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tessera_lab.cost.source import CostSource, analytic_source
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.paths import data_dir, read_data_json

REPORTED, SIMULATED = "reported", "simulated"


def reported() -> dict[str, Any]:
    """The paper's reported numbers (``data/paper/tessera_paper_reported.json``)."""
    return read_data_json("paper/tessera_paper_reported.json", "paper figures")


@dataclass
class Reproduction:
    """Tables (pandas DataFrames) of :func:`reproduce`, the scenario results and computed notes.

    Every table has a ``source`` column (``reported``, ``simulated`` or ``measured (...)``) or, for ``claims``,
    a ``verdict`` computed from the numbers.
    """

    mfu: Any
    ablation: Any
    overlap: Any
    width: Any
    notes: list[str] = field(default_factory=list)
    #: cost source of the simulated rows (every plan here is made with the analytic model)
    costs: CostSource = field(default_factory=analytic_source)
    claims: Any = None
    baselines: Any = None
    bands: Any = None
    scenarios: list[dict[str, Any]] = field(default_factory=list)
    dynamic: dict[str, Any] | None = None

    TABLES = ("claims", "mfu", "baselines", "bands", "ablation", "overlap", "width")

    def as_dict(self) -> dict[str, Any]:
        tables = {name: getattr(self, name).to_dict(orient="records") for name in self.TABLES
                  if getattr(self, name) is not None}
        return tables | {"notes": self.notes, "costs": self.costs.as_dict(), "scenarios": self.scenarios,
                         "dynamic": self.dynamic}


def ablation_table(model: str = "qwen3-next-80b-a3b", parallel: ParallelConfig | None = None, *,
                   dynamic_routing: str = "zipf:0.5", dynamic_schedule: str = "1f1b", microbatches: int = 16):
    """Throughput gains: reported ablation vs ours.

    Ours (same model and parallel sizes throughout, uniform routing for the static steps):
    ``T0`` uniform partition, plain 1F1B; ``T1`` uniform partition, overlapped 1F1B; ``T2`` overlap-aware
    partition, overlapped 1F1B. Static gain ``T0/T2 - 1``; of which overlap scheduling ``T0/T1 - 1`` and
    stage balance ``T0/T2 - T0/T1`` (points of the same baseline, so the two add up to the total); the planner's
    host/sync term (:mod:`tessera_lab.cost.sync`) off unless ``parallel.host_sync_s`` sets it, as in the
    scenarios' first reading. Dynamic:
    :func:`tessera_lab.dynamic.evaluate.run_dynamic` on ``dynamic_schedule`` under ``dynamic_routing``.
    """
    import pandas as pd

    from tessera_lab.plan.make import make_plan
    from tessera_lab.report.headline import dynamic_gain, dynamic_headline

    parallel = parallel or ParallelConfig()
    if parallel.host_sync_s is None:  # the paper's ablation compares schedules of one runtime: the term only if set
        parallel = parallel.replace(host_sync_s=0.0)
    spec = load_model(model)
    base = make_plan(spec, parallel.replace(schedule="1f1b"), method="uniform", baselines=()).chosen
    t0 = base.iteration_time_s
    t1 = make_plan(spec, parallel, method="uniform", baselines=()).chosen.iteration_time_s
    t2 = make_plan(spec, parallel, baselines=()).chosen.iteration_time_s
    dyn = dynamic_headline(model, parallel, routing=dynamic_routing, schedule=dynamic_schedule,
                           microbatches=microbatches)
    rep = reported()["ablation"]
    rows = [
        {"step": "static plan (total)", "gain": rep["static_plan_throughput_gain"], "source": REPORTED},
        {"step": "of which stage balance", "gain": rep["of_which_stage_balance"], "source": REPORTED},
        {"step": "dynamic filling", "gain": rep["dynamic_only_throughput_gain"], "source": REPORTED,
         "idle_removed_ms": rep["dynamic_only_idle_reduction_ms"]},
        {"step": "static plan (total)", "gain": t0 / t2 - 1, "source": SIMULATED},
        {"step": "of which stage balance", "gain": t0 / t2 - t0 / t1, "source": SIMULATED},
        {"step": "of which overlap scheduling", "gain": t0 / t1 - 1, "source": SIMULATED},
        {"step": "dynamic filling", "gain": dynamic_gain(dyn), "source": SIMULATED,
         "idle_removed_ms": 1e3 * dyn.idle_removed_s},
    ]
    out = pd.DataFrame(rows)
    stage_ms = [st.time_s * 1e3 for st in base.stages]
    summary = dyn.summary()
    out.attrs["context"] = {
        "model": spec.name, "pp": parallel.pp, "ep": parallel.ep, "microbatches": parallel.microbatches,
        "uniform_layers_per_stage": [len(st.layers) for st in base.stages],
        "uniform_1f1b_stage_ms": stage_ms,
        "dynamic": {k: summary[k] for k in ("routing", "schedule", "gpus", "microbatches", "iteration_static_s",
                                            "idle_static_s", "idle_removed_s", "idle_removed_share",
                                            "throughput_gain")},
    }
    return out


def overlap_tables(model: str = "qwen3-next-80b-a3b", parallel: ParallelConfig | None = None,
                   profiles: Sequence[Path] | None = None):
    """Gain of running F and B+W of two layer kinds together, per combination: ours (simulated, and every
    measured profile under ``data/profiles/`` that holds an overlap table) and the reported spread."""
    import pandas as pd

    from tessera_lab.overlap.core import overlap_spread, overlap_table

    spec = load_model(model)
    table = overlap_table(spec, parallel or ParallelConfig(), "analytic")
    frames = [table.assign(source=SIMULATED)]
    for path in profiles if profiles is not None else sorted((data_dir() / "profiles").glob("*.json")):
        measured = _profile_table(path)
        if measured is not None:
            frames.append(measured)
    out = pd.concat(frames, ignore_index=True)
    spreads = {src: overlap_spread(sub) for src, sub in out.groupby("source")}
    out.attrs["spreads"] = spreads | {REPORTED: reported()["overlap"]["max_overlap_gain_spread_between_layer_combinations"]}
    return out


def _profile_table(path: Path):
    """An overlap table from a saved profile, labelled ``measured (cpu)`` or ``measured (<device>)``;
    ``None`` if the file is not an overlap profile (e.g. runner observations in the same folder)."""
    import warnings

    from tessera_lab.errors import ProfileError
    from tessera_lab.overlap.profiles import load_profile

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = load_profile(path, check_stale=False)
    except (ProfileError, KeyError, ValueError):
        return None
    table = prof.table()
    if len(table) == 0:
        return None
    label = "measured (cpu)" if prof.backend == "cpu" else f"measured ({prof.environment.get('device', prof.backend)})"
    return table.assign(source=label)


def width_table(model: str = "qwen3-next-80b-a3b", widths: Sequence[int] | None = None,
                parallel: ParallelConfig | None = None):
    """Hidden fraction and exposed share of EP communication vs expert width (simulated) and the paper's two
    reported points."""
    import pandas as pd

    from tessera_lab.report.study import WIDTHS, expert_width_study

    df = expert_width_study(model, parallel, widths or WIDTHS).assign(source=SIMULATED)
    ov = reported()["overlap"]
    pts = pd.DataFrame([
        {"job": "large job (" + ov["large_job"]["model"] + ")", "hidden_fraction": ov["large_job"]["ep_comm_hidden_fraction"],
         "exposed_share": ov["large_job"]["exposed_ep_comm_share_of_iteration"], "source": REPORTED},
        {"job": "medium job (" + ov["medium_job"]["model"] + ")", "hidden_fraction": ov["medium_job"]["ep_comm_hidden_fraction"],
         "exposed_share": ov["medium_job"]["exposed_ep_comm_share_of_iteration"], "source": REPORTED},
    ])
    return pd.concat([df, pts], ignore_index=True)


def spread_note(spreads: dict[str, float]) -> str:
    """One line comparing the reported overlap-gain spread with ours (analytic and measured), its wording computed
    from the spreads."""
    parts = [f"{src} {v:.2f}x" if v != math.inf else f"{src}: a combination lost time when run together"
             for src, v in spreads.items() if src != REPORTED]
    sim = spreads.get(SIMULATED, math.nan)
    why = ""
    if sim == sim and sim != math.inf and sim < 1.5:
        why = (f". The analytic spread is {sim:.2f}x: at tp = 1 only the MoE part communicates and every layer kind "
               "has the same MoE, so the gain per pair varies little; measured kernels of the layer kinds contend "
               "differently")
    return f"overlap spread: reported up to {spreads.get(REPORTED, math.nan):.0f}x; ours " + "; ".join(parts) + why


def scenario_tables(results: list[dict[str, Any]]):
    """``(mfu, baselines, bands)`` DataFrames from :func:`tessera_lab.report.scenarios.run_scenario` results and
    the paper's production jobs (module docstring)."""
    import pandas as pd

    rep = {j["job"]: j for j in reported()["production_jobs"]}
    mfu = []
    for job in rep.values():
        mfu.append({"job": job["job"], "scenario": "", "gpus": job["gpus"], "before": job["mfu_before"],
                    "after": job["mfu_after"], "after_lo": math.nan, "after_hi": math.nan, "source": REPORTED})
    for r in results:
        if r["paper"].get("kind") != "production_job":
            continue
        mc = r["baselines"]["megatron_core"]
        mfu.append({"job": f"{r['paper']['job']} stand-in: {r['model']}", "scenario": r["id"], "gpus": r["gpus"],
                    "before": mc["mfu"], "after": r["after"]["mfu"], "after_lo": r["mfu_band"][0],
                    "after_hi": r["mfu_band"][1], "source": SIMULATED})
    base = []
    for r in results:
        row = {"scenario": r["id"], "gpus": r["gpus"], "after_mfu": r["after"]["mfu"],
               "after_schedule": r["after"]["schedule"] + (f" vpp {r['after']['vpp']}" if r["after"]["vpp"] > 1 else ""),
               "proven_optimal": r["after"]["proven_optimal"]}
        for key, b in r["baselines"].items():
            row[f"gain_vs_{key}"] = b["gain"]
        row["gain_vs_megatron_core_with_sync"] = r["baselines"]["megatron_core"].get("gain_with_sync", math.nan)
        row["megatron_core_setup"] = r["baselines"]["megatron_core"]["setup"]
        row["source"] = SIMULATED
        base.append(row)
    bands = []
    for r in results:
        for b in r["band"]:
            bands.append({"scenario": r["id"], "knob": b["knob"], "value": str(b["value"]), "fits": b["fits"],
                          "mfu": b["mfu"], "ep_hidden": b.get("ep_hidden", math.nan),
                          "ep_exposed_share": b.get("ep_exposed_share", math.nan),
                          "pipeline_idle_share": b.get("pipeline_idle_share", math.nan),
                          "note": b.get("note", ""), "source": SIMULATED})
    return pd.DataFrame(mfu), pd.DataFrame(base), pd.DataFrame(bands)


def scenario_ablation(results: list[dict[str, Any]], dynamic: dict[str, Any] | None):
    """Reported ablation rows beside ours: the static split of each production scenario whose even split fits
    (``even_1f1b`` -> ``even`` -> after) and the dynamic run split by mechanism."""
    import pandas as pd

    rep = reported()["ablation"]
    rows = [
        {"step": "static plan (total)", "gain": rep["static_plan_throughput_gain"], "scenario": "", "source": REPORTED},
        {"step": "of which stage balance", "gain": rep["of_which_stage_balance"], "scenario": "", "source": REPORTED},
        {"step": "dynamic filling", "gain": rep["dynamic_only_throughput_gain"], "scenario": "", "source": REPORTED,
         "idle_removed_ms": rep["dynamic_only_idle_reduction_ms"]},
    ]
    for r in results:
        a = r["ablation"]
        if r["paper"].get("kind") != "production_job" or not a["fits"]:
            continue
        rows += [{"step": "static plan (total)", "gain": a["total"], "scenario": r["id"], "source": SIMULATED},
                 {"step": "of which stage balance", "gain": a["balance"], "scenario": r["id"], "source": SIMULATED},
                 {"step": "of which overlap scheduling", "gain": a["overlap"], "scenario": r["id"],
                  "source": SIMULATED}]
    if dynamic:
        g = dynamic["gain"]
        for step, key in (("dynamic filling", "total"), ("dynamic: W moved into gaps", "w_only"),
                          ("dynamic: reduce-scatter chunks", "rs_only"), ("dynamic, exact routing (oracle)",
                                                                          "oracle_total")):
            rows.append({"step": step, "gain": g[key], "scenario": dynamic["scenario"], "source": SIMULATED,
                         "idle_removed_ms": dynamic["idle_removed_ms"] if key == "total" else math.nan})
    return pd.DataFrame(rows)


def scenario_notes(results: list[dict[str, Any]], dynamic: dict[str, Any] | None) -> list[str]:
    """Comparative sentences, each computed from the values it names."""
    from tessera_lab.report.headline import position

    rep = {j["job"]: j for j in reported()["production_jobs"]}
    notes = []
    for r in results:
        job = rep.get(r["paper"].get("job"))
        lo, hi = r["mfu_band"]
        b = r["baselines"]
        gains = "; ".join(f"{b[k]['setup']} {b[k]['gain']:+.1%}" if b[k]["fits"] else f"{k}: does not fit memory"
                          for k in ("even_1f1b", "even", "standalone", "parameters", "megatron_core") if k in b)
        head = f"{r['id']} ({r['model']}, {r['gpus']:,} GPUs): after {r['after']['mfu']:.1%}, band {lo:.1%}-{hi:.1%}"
        if job:
            head += (f"; the paper's {job['mfu_after']:.1%} after is {position(job['mfu_after'], lo, hi)} our band")
        notes.append(f"{head}. Gains: {gains}. {r['after']['solve']}.")
    if dynamic:
        notes.append(f"Dynamic optimizer ({dynamic['scenario']}, {dynamic['routing']}, {dynamic['schedule']}): "
                     f"{dynamic['needs']}; predictor (previous step's routing): makespan error "
                     f"{dynamic['predictor']['makespan_error']:+.1%}, {dynamic['predictor']['recall']:.0%} of the "
                     "realised gap time inside predicted gaps.")
    return notes


def reproduce(*, quick: bool = False, model: str = "qwen3-next-80b-a3b",
              scenarios: Sequence[str] | None = None) -> Reproduction:
    """Run the scenarios and compute every table (module docstring). ``quick`` uses fewer expert widths in the
    width study; ``scenarios`` names a subset (default all)."""
    from tessera_lab.report.claims import claim_rows
    from tessera_lab.report.scenarios import dynamic_at_scale, run_scenarios
    from tessera_lab.report.study import describe_paper_points, paper_point_widths

    results = run_scenarios(scenarios)
    dynamic = dynamic_at_scale(results, paper=reported()["ablation"])
    widths = (128, 512, 2048) if quick else None
    width = width_table(model, widths)
    overlap = overlap_tables(model)
    claims = pd_frame(claim_rows(results, reported(), overlap_spreads=overlap.attrs["spreads"], dynamic=dynamic))
    mfu, baselines, bands = scenario_tables(results)
    notes = ["Reported numbers are the paper's, for internal models (Qwen3-L/XL, Qwen3-Next-M/XL) at 4,096-12,288 "
             "GPUs; ours are public stand-ins (data/paper/scenarios, every assumption labelled) under the analytic "
             "cost model."]
    notes += scenario_notes(results, dynamic)
    sim = width[width["source"] == SIMULATED]
    notes += describe_paper_points(paper_point_widths(sim[sim["feasible"] == True]))  # noqa: E712
    notes.append(spread_note(overlap.attrs["spreads"]))
    return Reproduction(mfu, scenario_ablation(results, dynamic), overlap, width, notes, claims=claims,
                        baselines=baselines, bands=bands, scenarios=results, dynamic=dynamic)


def pd_frame(rows: list[dict[str, Any]]):
    import pandas as pd

    return pd.DataFrame(rows)


# ---------------------------------------------------------------------- figures
def _palette():
    import seaborn as sns

    pal = sns.color_palette("colorblind", 4)
    return {REPORTED: pal[1], SIMULATED: pal[0], "measured": pal[2]}


def _colour(source: str):
    pal = _palette()
    return pal["measured"] if source.startswith("measured") else pal[source]


#: characters per line of a job's x label in the MFU figure (7-point text under a group of bars)
MFU_LABEL_CHARS = 24


def _paper_job(job: str) -> str:
    """The paper job a row of the ``mfu`` table belongs to: ``"Qwen3-L stand-in: qwen3-235b-a22b"`` -> ``"Qwen3-L"``."""
    return job.split(" stand-in: ")[0]


def plot_mfu(rep: Reproduction, ax=None):
    """MFU before (light) and after (solid) per paper job: one group of bars per job, the reported pair beside its
    simulated stand-in's (colour: source), the band over the uncertain knobs as an error bar, each "after" value
    written above its bar. The x label of a group names the job and its GPU count, then the stand-in model wrapped
    at :data:`MFU_LABEL_CHARS` characters, so that neighbouring labels never overlap."""
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    df = rep.mfu
    jobs = list(dict.fromkeys(_paper_job(j) for j in df["job"]))
    if ax is None:
        _, ax = plt.subplots(figsize=(max(7.0, 2.3 * len(jobs) + 2.5), 3.8), layout="constrained")
    labels, top = [], 0.0
    for g, job in enumerate(jobs):
        rows = [r for r in df.itertuples() if _paper_job(r.job) == job]
        w = 0.8 / (2 * len(rows))  # a before and an after bar per row, the group 0.8 wide
        for i, row in enumerate(rows):
            c = _colour(row.source)
            x0 = g - 0.4 + 2 * i * w + w / 2
            ax.bar(x0, row.before, w * 0.95, color=c, alpha=0.4)
            ax.bar(x0 + w, row.after, w * 0.95, color=c)
            lo, hi = getattr(row, "after_lo", math.nan), getattr(row, "after_hi", math.nan)
            peak = row.after
            if lo == lo and hi == hi:  # the band over the uncertain knobs
                ax.errorbar(x0 + w, row.after, yerr=[[row.after - lo], [hi - row.after]], color="black", capsize=3,
                            linewidth=1)
                peak = max(peak, hi)
            ax.annotate(f"{row.after:.1%}", (x0 + w, peak), xytext=(0, 2), textcoords="offset points", ha="center",
                        va="bottom", fontsize=7)
            top = max(top, peak)
        stand_ins = [r.job.split(" stand-in: ")[1] for r in rows if " stand-in: " in r.job]
        gpus = sorted({int(r.gpus) for r in rows})
        head = f"{job}, {'/'.join(f'{n:,}' for n in gpus)} GPUs"
        labels.append("\n".join([head] + (textwrap.wrap(f"stand-in {', '.join(stand_ins)}", MFU_LABEL_CHARS)
                                           if stand_ins else [])))
    ax.set_xticks(range(len(jobs)), labels, fontsize=7)
    ax.set_xlim(-0.6, len(jobs) - 0.4)
    ax.set_ylim(0, 1.15 * top if top > 0 else 1)  # room for the values above the bars
    ax.set_ylabel("MFU")
    sources = list(dict.fromkeys(df["source"]))
    ax.legend(handles=[Patch(color=_colour(s), alpha=a, label=f"{s}, {when}") for s in sources
                       for a, when in ((0.4, "before"), (1.0, "after"))],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("MFU before (Megatron-Core's best) and after; error bars: band over EP placement, dispatcher, "
                 "grouped GEMM, sequence length", fontsize=9)
    return ax


def ablation_scenario(rep: Reproduction) -> str:
    """The production scenario whose static ablation the claims table quotes (its ``scenario`` column on the
    "static plan" row); without a claims table the lower median of the simulated static totals, the rule
    :func:`tessera_lab.report.claims.claim_rows` uses. ``""`` when no scenario has a static ablation."""
    claims = rep.claims
    if claims is not None and len(claims):
        row = claims[claims["claim"].str.startswith("static plan")]
        if len(row) and row["scenario"].iloc[0]:
            return str(row["scenario"].iloc[0])
    tot = rep.ablation[(rep.ablation["source"] == SIMULATED) & (rep.ablation["step"] == "static plan (total)")]
    if not len(tot):
        return ""
    ranked = tot.sort_values("gain", kind="stable")
    return str(ranked["scenario"].iloc[(len(ranked) - 1) // 2])


def plot_ablation(rep: Reproduction, ax=None):
    """Throughput gain by step, reported beside simulated, one number per bar (never a mean over scenarios): the
    static steps of the scenario the claims quote (:func:`ablation_scenario`) and the dynamic rows of the dynamic
    scenario; the title names both and each bar carries its value."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 3.6), layout="constrained")
    df = rep.ablation
    quoted = ablation_scenario(rep)
    dynamic_steps = {s for s in df["step"] if str(s).startswith("dynamic")}
    sim = df[df["source"] == SIMULATED]
    sim = sim[(sim["scenario"] == quoted) | sim["step"].isin(dynamic_steps)]
    shown = [df[df["source"] == REPORTED], sim]
    steps = list(dict.fromkeys(s for part in shown for s in part["step"]))
    steps = [s for s in steps if s not in dynamic_steps] + [s for s in steps if s in dynamic_steps]  # static first
    h = 0.38
    for k, (part, src) in enumerate(zip(shown, (REPORTED, SIMULATED))):
        gains = dict(zip(part["step"], 100 * part["gain"]))
        y = [i + (k - 0.5) * h for i, s in enumerate(steps) if s in gains]
        v = [gains[s] for s in steps if s in gains]
        ax.barh(y, v, h * 0.95, color=_colour(src), label=src)
        for yy, vv in zip(y, v):
            ax.annotate(f"{vv:+.1f}%", (max(vv, 0.0), yy), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7)
    ax.set_yticks(np.arange(len(steps)), steps)
    ax.invert_yaxis()
    ax.set_xlim(right=ax.get_xlim()[1] * 1.12)  # room for the values
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("throughput gain (%)")
    ax.legend(fontsize=8, loc="lower right", frameon=False)
    dyn = sim[sim["step"].isin(dynamic_steps)]["scenario"]
    where = [f"static steps: {quoted} (the scenario the claims quote)" if quoted else "static steps: no scenario fits"]
    if len(dyn):
        where.append(f"dynamic: {dyn.iloc[0]}")
    ax.set_title("Ablation, reported vs simulated; " + "; ".join(where), fontsize=9)
    return ax


def plot_overlap(rep: Reproduction, ax=None):
    """Overlap gain (standalone sum - pair time) per layer-kind combination, per source, with each
    source's best/worst spread in the legend."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4), layout="constrained")
    df = rep.overlap.copy()
    df["combination"] = df["kind_f"].str.replace("_attention", "", regex=False) + " F | " + \
        df["kind_b"].str.replace("_attention", "", regex=False) + " B"
    df["relative gain (% of standalone sum)"] = 100 * df["gain"] / df["t_sum"]
    spreads = rep.overlap.attrs.get("spreads", {})
    def spread_text(src: str) -> str:
        v = spreads.get(src, math.nan)
        return "spread: a combination lost time" if v == math.inf else f"spread {v:.2f}x"

    df["source"] = [f"{s} ({spread_text(s)})" for s in df["source"]]
    sns.barplot(data=df, y="combination", x="relative gain (% of standalone sum)", hue="source", ax=ax,
                palette=[_colour(s.split(" (spread")[0]) for s in df["source"].unique()])
    ax.axvline(0, color="grey", linewidth=0.8)
    # legend below the axes (under the x label), so it never covers a bar
    sns.move_legend(ax, "upper center", bbox_to_anchor=(0.5, -0.2), ncols=1, title=None, fontsize=8, frameon=False)
    ax.set_title(f"Overlap gain between layer combinations (reported spread up to "
                 f"{spreads.get(REPORTED, math.nan):.0f}x)")
    ax.set_ylabel("")
    return ax


def plot_width(rep: Reproduction, ax=None):
    """Hidden fraction and exposed share of EP communication vs expert width, with the reported points: four
    labelled reference lines (hidden and exposed for each reported job; colour: hidden or exposed as in the
    simulated curves, dashes: which job)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.6), layout="constrained")
    df = rep.width
    sim = df[(df["source"] == SIMULATED) & (df["feasible"] == True)]  # noqa: E712
    pal = sns.color_palette("colorblind", 4)
    ax.plot(sim["width"], sim["hidden_fraction"], "o-", color=pal[0], label="EP comm hidden (simulated)")
    ax.plot(sim["width"], sim["exposed_share"], "s-", color=pal[1], label="exposed EP share of iteration (simulated)")
    for row, style in zip(df[df["source"] == REPORTED].itertuples(), ("--", ":", "-.")):
        job = row.job.split(" (")[0]
        ax.axhline(row.hidden_fraction, color=pal[0], linestyle=style, linewidth=1.2,
                   label=f"reported {job}: hidden {row.hidden_fraction:.0%}")
        ax.axhline(row.exposed_share, color=pal[1], linestyle=style, linewidth=1.2,
                   label=f"reported {job}: exposed {row.exposed_share:.1%}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("routed expert width (moe_intermediate_size)")
    ax.set_ylabel("share")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title("EP all-to-all hidden vs exposed as expert GEMMs grow")
    return ax


def write(rep: Reproduction, out: str | Path) -> list[Path]:
    """Write the four figures (PNG), the tables and scenario results (JSON) and the claims, tables and notes
    (Markdown) to ``out``, all or none (:class:`tessera_lab.io.staged_folder`); returns the paths.

    Raises:
        OutputError: a file cannot be written (nothing new is left in ``out``).
    """
    import matplotlib.pyplot as plt

    from tessera_lab.io import atomic_write_text, dumps, save_figure, staged_folder

    out = Path(out)
    names = []
    with staged_folder(out) as tmp:  # every file or none: a failure leaves nothing new in ``out``
        for name, fn in (("mfu", plot_mfu), ("ablation", plot_ablation), ("overlap", plot_overlap),
                         ("width", plot_width)):
            ax = fn(rep)
            try:
                save_figure(ax.figure, tmp / f"{name}.png")
            finally:
                plt.close(ax.figure)
            names.append(f"{name}.png")
        atomic_write_text(tmp / "reproduction.json", dumps(rep.as_dict()))
        lines = ["# Tessera paper claims: reported vs tessera-lab", ""]
        for name in Reproduction.TABLES:
            if getattr(rep, name) is not None:
                lines += [f"## {name}", "", _table_text(getattr(rep, name)), ""]
        lines += ["## What differs and why", ""] + [f"- {n}" for n in rep.notes]
        atomic_write_text(tmp / "README.md", "\n".join(lines) + "\n")
        names += ["reproduction.json", "README.md"]
    return [out / n for n in names]


def _table_text(df) -> str:
    """A table as Markdown (text without tabulate): missing values blank, booleans ``True`` / ``False``."""
    shown = df.astype(object).map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v))
                                  else str(v) if isinstance(v, bool) else v)
    if _has_tabulate():
        return shown.to_markdown(index=False)
    return shown.to_string(index=False)  # pragma: no cover


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:  # pragma: no cover
        return False
    return True
