"""Reproducing the shape of the Tessera paper's reported figures on public models (DESIGN section 13).

Every figure shows the paper's **reported** numbers (``data/paper/tessera_paper_reported.json``, an editorial
digest of the paper; internal model sizes are not public) beside this library's analogous result, labelled
``simulated`` (analytic cost model + simulator), ``measured (cpu)`` (a profile measured on this machine by
``tessera-lab measure --backend cpu``) or ``measured (<GPU name>)`` (a GPU profile under ``data/profiles/``).

The four comparisons:

1. **MFU before and after** per production job (reported) against Qwen3-Next-80B-A3B and Qwen3-30B-A3B at
   4,096 GPUs (simulated: uniform partition with plain 1F1B against the full loop).
2. **Ablation**: the static plan's throughput gain (reported 13%, 9 points from stage balance) and the
   dynamic optimizer's (reported +3.4%, 641 ms idle removed at 6,144 GPUs) against ours: uniform 1F1B ->
   uniform overlapped (overlap scheduling) -> overlap-aware partition (stage balance), and dynamic filling.
3. **Overlap gain between layer combinations** (reported: up to 3x spread) against our overlap table.
4. **Hidden vs exposed EP communication as expert width grows** (reported: 73% / 8.3% for the large job,
   26% / 38.9% for the medium job) against the width study.

This module imports the planner, the overlap scheduler, the dynamic optimizer and the study; torch is not needed.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tessera_lab.cost.source import CostSource, analytic_source
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.paths import data_dir

REPORTED, SIMULATED = "reported", "simulated"


def reported() -> dict[str, Any]:
    """The paper's reported numbers (``data/paper/tessera_paper_reported.json``)."""
    return json.loads((data_dir() / "paper" / "tessera_paper_reported.json").read_text())


@dataclass
class Reproduction:
    """Tables (pandas DataFrames) behind the four figures, plus notes on what differs and why.

    Every table has a ``source`` column: ``reported``, ``simulated`` or ``measured (...)``.
    """

    mfu: Any
    ablation: Any
    overlap: Any
    width: Any
    notes: list[str] = field(default_factory=list)
    #: cost source of the simulated rows (every plan here is made with the analytic model)
    costs: CostSource = field(default_factory=analytic_source)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name).to_dict(orient="records") for name in ("mfu", "ablation", "overlap", "width")} | {
            "notes": self.notes, "costs": self.costs.as_dict()}


def mfu_table(gpus: int = 4096, models: Sequence[str] = ("qwen3-next-80b-a3b", "qwen3-30b-a3b")):
    """Reported MFU before/after per job, and ours at ``gpus`` (uniform 1F1B before, full loop after)."""
    import pandas as pd

    from tessera_lab.report.study import scale_study

    rows = [{"job": j["job"], "gpus": j["gpus"], "before": j["mfu_before"], "after": j["mfu_after"], "source": REPORTED}
            for j in reported()["production_jobs"]]
    families = {load_model(m).model_type: m for m in models}
    df = scale_study([gpus], families, dynamic_routing=None)
    for model, sub in df.groupby("model"):
        before = float(sub.loc[sub["setup"].str.startswith("uniform, 1F1B"), "mfu"].iloc[0])
        after = float(sub.loc[sub["setup"].str.startswith("full loop"), "mfu"].iloc[0])
        rows.append({"job": model, "gpus": gpus, "before": before, "after": after, "source": SIMULATED})
    return pd.DataFrame(rows)


def ablation_table(model: str = "qwen3-next-80b-a3b", parallel: ParallelConfig | None = None, *,
                   dynamic_routing: str = "zipf:0.5", dynamic_schedule: str = "1f1b", microbatches: int = 16):
    """Throughput gains: reported ablation vs ours.

    Ours (same model and parallel sizes throughout, uniform routing for the static steps):
    ``T0`` uniform partition, plain 1F1B; ``T1`` uniform partition, overlapped 1F1B; ``T2`` overlap-aware
    partition, overlapped 1F1B. Static gain ``T0/T2 - 1``; of which overlap scheduling ``T0/T1 - 1`` and
    stage balance ``T0/T2 - T0/T1`` (points of the same baseline, so the two add up to the total). Dynamic:
    :func:`tessera_lab.dynamic.evaluate.run_dynamic` on ``dynamic_schedule`` under ``dynamic_routing``.
    """
    import pandas as pd

    from tessera_lab.plan.make import make_plan
    from tessera_lab.report.headline import dynamic_gain, dynamic_headline

    parallel = parallel or ParallelConfig()
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


def ablation_notes(ablation) -> list[str]:
    """What differs between the reported and the simulated ablation, and why (numbers from ``ablation``, a
    :func:`ablation_table` result; its ``attrs["context"]`` holds the baseline's stage times and the dynamic
    run)."""
    rep = reported()["ablation"]
    sim = {r["step"]: r for r in ablation.to_dict(orient="records") if r["source"] == SIMULATED}
    ctx = ablation.attrs.get("context", {})
    total, balance = sim["static plan (total)"]["gain"], sim["of which stage balance"]["gain"]
    overlap = sim["of which overlap scheduling"]["gain"]
    notes = []
    stage_ms = ctx.get("uniform_1f1b_stage_ms") or []
    if len(stage_ms) > 1:
        others = sum(stage_ms[:-1]) / (len(stage_ms) - 1)
        layers = ctx["uniform_layers_per_stage"]
        count = f"{min(layers)}" if min(layers) == max(layers) else f"{min(layers)}-{max(layers)}"
        head = (f"the uniform partition gives every stage {count} layers, so the last stage also "
                f"carries the LM head and loss and takes {stage_ms[-1]:.1f} ms per micro-batch against "
                f"{others:.1f} ms for the others ({stage_ms[-1] / others - 1:+.0%}), and the whole pipeline waits "
                "for it")
    else:
        head = "the uniform partition puts the LM head and loss on a full last stage"
    notes.append(
        f"Static plan: ours gains {total:.1%} ({100 * balance:.1f} points from stage balance, {100 * overlap:.1f} "
        f"from overlap scheduling) where the paper reports {rep['static_plan_throughput_gain']:.0%} "
        f"({100 * rep['of_which_stage_balance']:.0f} points from stage balance). The gap is mostly our baseline: "
        f"{head}; and plain 1F1B overlaps no communication with compute at all, so overlap scheduling alone is "
        f"worth {100 * overlap:.1f} points. The paper's baseline was an already-tuned production plan, with far "
        "less left to gain. Compare the split (stage balance the larger part in both), not the size.")
    d = ctx.get("dynamic")
    if d:
        notes.append(
            f"Dynamic filling: we remove {1e3 * d['idle_removed_s']:.0f} ms of idle time per rank on a "
            f"{d['iteration_static_s']:.2f} s simulated step at {d['gpus']} GPUs ({ctx['model']}, pp={ctx['pp']}, "
            f"ep={ctx['ep']}, {d['microbatches']} micro-batches, {d['routing']} routing, static plan "
            f"{d['schedule']}: {d['idle_removed_share']:.0%} of its idle time); the paper removes "
            f"{rep['dynamic_only_idle_reduction_ms']:.0f} ms at {rep['dynamic_only_job_gpus']:,} GPUs on a production "
            "step whose length is not given. Milliseconds of idle time grow with the step length and the pipeline "
            f"depth, so compare the throughput gain (ours {d['throughput_gain']:+.1%}, reported "
            f"{rep['dynamic_only_throughput_gain']:+.1%}), not the milliseconds.")
    return notes


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
    """One line comparing the reported overlap-gain spread with ours (analytic and measured)."""
    parts = [f"{src} {v:.2f}x" if v != math.inf else f"{src}: a combination lost time when run together"
             for src, v in spreads.items() if src != REPORTED]
    return (f"overlap spread: reported up to {spreads.get(REPORTED, math.nan):.0f}x; ours " + "; ".join(parts)
            + ". In the analytic model at tp = 1 only the MoE part communicates and every layer kind has the same MoE, "
              "so the gain per pair is nearly the same; measured kernels of the two layer kinds contend differently")


def reproduce(*, quick: bool = False, model: str = "qwen3-next-80b-a3b") -> Reproduction:
    """Compute the four comparisons. ``quick`` uses fewer expert widths (for tests and teaching)."""
    from tessera_lab.report.study import describe_paper_points, paper_point_widths

    widths = (128, 512, 2048) if quick else None
    width = width_table(model, widths)
    notes = [
        "Reported numbers are the paper's, for internal models (Qwen3-L/XL, Qwen3-Next-M/XL) at 4,096-12,288 GPUs; "
        "ours are public configs under an analytic cost model, so compare the shape of each claim, not the digits.",
        "Our MFU is higher than the reported one: the analytic model has no stragglers, no kernel tails beyond a "
        "fixed launch cost, and no recomputation, and our public models are smaller than the internal ones.",
        "Our dynamic filling gains come mostly from the warm-up/cool-down bubble of 1F1B; under ZB-H1, which "
        "already fills that bubble, filling routing-induced gaps gains little or nothing in our model.",
    ]
    ablation = ablation_table()
    notes += ablation_notes(ablation)
    sim = width[width["source"] == SIMULATED]
    notes += describe_paper_points(paper_point_widths(sim[sim["feasible"] == True]))  # noqa: E712
    overlap = overlap_tables(model)
    notes.append(spread_note(overlap.attrs["spreads"]))
    return Reproduction(mfu_table(), ablation, overlap, width, notes)


# ---------------------------------------------------------------------- figures
def _palette():
    import seaborn as sns

    pal = sns.color_palette("colorblind", 4)
    return {REPORTED: pal[1], SIMULATED: pal[0], "measured": pal[2]}


def _colour(source: str):
    pal = _palette()
    return pal["measured"] if source.startswith("measured") else pal[source]


def plot_mfu(rep: Reproduction, ax=None):
    """MFU before (light) and after (solid) per job; reported and simulated side by side."""
    import matplotlib.pyplot as plt

    df = rep.mfu
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.6), layout="constrained")
    x = range(len(df))
    for k, row in enumerate(df.itertuples()):
        c = _colour(row.source)
        ax.bar(k - 0.2, row.before, 0.38, color=c, alpha=0.4)
        ax.bar(k + 0.2, row.after, 0.38, color=c)
        ax.text(k + 0.2, row.after, f"{row.after:.1%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [f"{r.job}\n{r.gpus} GPUs\n({r.source})" for r in df.itertuples()], fontsize=7)
    ax.set_ylabel("MFU (light: before, solid: after)")
    ax.set_title("MFU before and after: reported jobs vs simulated public models")
    return ax


def plot_ablation(rep: Reproduction, ax=None):
    """Throughput gain by step, reported vs simulated."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.4), layout="constrained")
    df = rep.ablation.assign(gain_pct=lambda d: 100 * d["gain"])
    sns.barplot(data=df, y="step", x="gain_pct", hue="source", ax=ax, palette=[_colour(s) for s in df["source"].unique()])
    ax.set_xlabel("throughput gain (%)")
    ax.set_ylabel("")
    ax.set_title("Ablation: static plan and dynamic filling")
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
    """Write the four figures (PNG), the tables (JSON) and the notes (Markdown) to ``out``; returns the paths."""
    import matplotlib.pyplot as plt

    from tessera_lab.io import atomic_write_text, dumps, save_figure

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fn in (("mfu", plot_mfu), ("ablation", plot_ablation), ("overlap", plot_overlap), ("width", plot_width)):
        ax = fn(rep)
        p = out / f"{name}.png"
        save_figure(ax.figure, p)
        plt.close(ax.figure)
        paths.append(p)
    paths.append(atomic_write_text(out / "reproduction.json", dumps(rep.as_dict())))
    lines = ["# Tessera paper figures: reported vs tessera-lab", ""]
    for name in ("mfu", "ablation", "overlap", "width"):
        lines += [f"## {name}", "", _table_text(getattr(rep, name)), ""]
    lines += ["## What differs and why", ""] + [f"- {n}" for n in rep.notes]
    paths.append(atomic_write_text(out / "README.md", "\n".join(lines) + "\n"))
    return paths


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
