"""Paper-scale study with the analytic backend (docs/reproduce.md).

Two questions, on public configurations (the paper's internal model sizes are not public):

1. **MFU at 4,096 to 12,288 GPUs**, Qwen3-Next-like (``qwen3-next-80b-a3b``) and Qwen3-like
   (``qwen3-30b-a3b``: a Qwen3 MoE that fits without recomputation; ``qwen3-235b-a22b`` at ``seq_len``
   4096 is memory-bound under the overlapped schedule, which our planner does not relieve with recompute).
   The GPU count grows through data parallelism (``dp = GPUs / (pp x ep x tp)``), so the simulated pipeline
   is the same and only the gradient synchronisation over the ``ep x dp`` ranks grows: as the paper says,
   GPU count is the evaluation scale, not the variable that explains the gain. Three setups per point:
   ``uniform, 1F1B`` (layer counts as even as possible, plain 1F1B, no dynamic filling: a Megatron-style
   default), ``uniform, overlapped`` (the same partition under the overlapped schedule) and ``full loop``
   (the overlap-aware partition under the overlapped schedule), all at uniform routing; with a
   ``dynamic_routing``, the full-loop partition also runs under
   skewed routing on ZB-H1 without and with dynamic bubble filling (:func:`scale_study`).
2. **Hidden fraction of EP communication and its exposed share of the iteration as expert width grows**
   (:func:`expert_width_study`), and at which widths our model reaches the paper's two reported points
   (``data/paper/tessera_paper_reported.json``, ``overlap``: 73% hidden / 8.3% exposed for the large job,
   26% / 38.9% for the medium job with short per-expert GEMMs) — :func:`paper_point_widths`.

Hidden fraction and exposed share come from the capacity report (:mod:`tessera_lab.report.capacity`): EP all-to-all
time issued in the iteration, and the part of it during which no compute kernel runs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from tessera_lab.errors import PartitionError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.paths import read_data_json

GPU_COUNTS = (4096, 8192, 12288)
FAMILIES = {"qwen3_next": "qwen3-next-80b-a3b", "qwen3": "qwen3-30b-a3b"}
#: expert widths of the width study (routed expert intermediate size)
WIDTHS = (64, 128, 256, 512, 1024, 2048, 4096, 6144)
#: width-study configuration: 8,192 GPUs (the paper's large job) with the EP group of 32 spanning 4 nodes,
#: so the all-to-all runs over InfiniBand as it does at scale
WIDTH_STUDY_PARALLEL = ParallelConfig(pp=8, ep=32, dp=32)


def paper_reported() -> dict[str, Any]:
    """``data/paper/tessera_paper_reported.json`` parsed (reported values, not measured here)."""
    return read_data_json("paper/tessera_paper_reported.json", "paper figures")


def parallel_for_gpus(gpus: int, *, pp: int = 8, ep: int = 8, tp: int = 1, microbatches: int = 32,
                   seq_len: int = 4096) -> ParallelConfig:
    """Parallel sizes for ``gpus`` GPUs: ``dp = gpus / (pp x ep x tp)``.

    Raises:
        ConfigError: ``gpus`` not a multiple of ``pp x ep x tp``.
    """
    from tessera_lab.errors import ConfigError

    base = pp * ep * tp
    if gpus % base:
        raise ConfigError(f"field 'gpus' = {gpus} is not a multiple of pp*ep*tp = {base}")
    return ParallelConfig(pp=pp, ep=ep, tp=tp, dp=gpus // base, microbatches=microbatches, seq_len=seq_len)


def scale_study(gpu_counts: Sequence[int] = GPU_COUNTS, families: dict[str, str] | None = None, *,
                pp: int = 8, ep: int = 8, microbatches: int = 32, method: str = "ilp",
                dynamic_routing: str | None = "zipf:0.5", dynamic_groups: int = 1, seed: int = 0):
    """MFU of each family at each GPU count for the setups of the module docstring.

    With ``dynamic_routing`` (a routing spec of :mod:`tessera_lab.dynamic.routing`, default ``zipf:0.5``), two
    more rows per point run the full-loop partition under skewed
    routing with :func:`tessera_lab.dynamic.evaluate.run_dynamic`: ``zb-h1 static`` and ``zb-h1 + dynamic filling``
    (filling needs split weight gradients, so it runs on ZB-H1, not on the overlapped schedule; the library
    does not combine the two). Their MFU uses the simulated iteration of the slowest of ``dynamic_groups`` EP
    groups. ``dynamic_routing=None`` skips them.

    Returns:
        pandas DataFrame with ``family, model, gpus, dp, setup, routing, iteration_s, tokens_per_s, mfu,
        gain_vs_uniform_1f1b`` (throughput ratio to the first setup minus 1) and ``note``.
    """
    import pandas as pd

    from tessera_lab.plan.make import make_plan

    families = families or FAMILIES
    rows = []
    for family, name in families.items():
        model = load_model(name)
        for gpus in gpu_counts:
            par = parallel_for_gpus(gpus, pp=pp, ep=ep, microbatches=microbatches)
            base = make_plan(model, par.replace(schedule="1f1b"), method="uniform", baselines=())
            full = make_plan(model, par, method=method, baselines=("uniform",))
            setups = [("uniform, 1F1B", base.chosen, base.notes), ("uniform, overlapped", full.baselines["uniform"], []),
                      ("full loop", full.chosen, full.notes)]
            t0 = base.chosen.iteration_time_s
            for setup, ev, notes in setups:
                note = "; ".join(n for n in notes if "exceeds memory" in n)
                if setup == "full loop" and not dynamic_routing:
                    note = (note + "; " if note else "") + "dynamic filling not run (dynamic_routing=None)"
                rows.append({"family": family, "model": name, "gpus": gpus, "dp": par.dp, "setup": setup,
                             "routing": "uniform", "iteration_s": ev.iteration_time_s,
                             "tokens_per_s": ev.tokens_per_s, "mfu": ev.mfu,
                             "gain_vs_uniform_1f1b": t0 / ev.iteration_time_s - 1.0, "note": note})
            if dynamic_routing:
                from tessera_lab.dynamic.durations import StageCosts
                from tessera_lab.dynamic.evaluate import run_dynamic

                zb = par.replace(schedule="zb-h1")
                costs = StageCosts.from_model(model, zb, boundaries=full.chosen.partition.boundaries)
                res = run_dynamic(costs, dynamic_routing, microbatches=par.microbatches, groups=dynamic_groups,
                                  seed=seed)
                peak = full.cluster.gpu.peak_flops * par.world_size
                gain = res.throughput_gain
                for setup, T in (("zb-h1 static", res.iteration_static_s),
                                 ("zb-h1 + dynamic filling", res.iteration_dynamic_s)):
                    rows.append({"family": family, "model": name, "gpus": gpus, "dp": par.dp, "setup": setup,
                                 "routing": str(dynamic_routing), "iteration_s": T,
                                 "tokens_per_s": par.tokens_per_iteration / T, "mfu": full.model_flops / (T * peak),
                                 "gain_vs_uniform_1f1b": t0 / T - 1.0,
                                 "note": (f"full-loop partition; filling removed {res.idle_removed_s * 1e3:.1f} ms idle "
                                          f"per rank, {gain:+.2%} throughput vs zb-h1 static at the same routing")
                                 if "dynamic" in setup else "full-loop partition, skewed routing, no filling"})
    return pd.DataFrame(rows)


def expert_width_study(model_name: str = "qwen3-next-80b-a3b", parallel: ParallelConfig | None = None,
                       widths: Sequence[int] = WIDTHS, *, method: str = "ilp"):
    """EP hidden fraction and exposed share of the iteration for each routed-expert width.

    Each width is planned (overlap-aware partition, overlapped schedule) and its capacity report read.
    Widths whose partition does not fit in memory get a row with ``feasible = False`` and NaN metrics.

    Returns:
        pandas DataFrame with ``width, feasible, iteration_s, mfu, ep_comm_ms_per_gpu,
        exposed_ep_ms_per_gpu, hidden_fraction, exposed_share`` (shares of the iteration's GPU time).
    """
    import pandas as pd

    from tessera_lab.plan.make import make_plan
    from tessera_lab.report.capacity import capacity_report

    parallel = parallel or WIDTH_STUDY_PARALLEL
    base = load_model(model_name)
    rows = []
    for w in widths:
        m = base.with_changes(moe_intermediate_size=int(w))
        try:
            plan = make_plan(m, parallel, method=method, baselines=())
        except PartitionError as exc:
            rows.append({"width": int(w), "feasible": False, "iteration_s": math.nan, "mfu": math.nan,
                         "ep_comm_ms_per_gpu": math.nan, "exposed_ep_ms_per_gpu": math.nan,
                         "hidden_fraction": math.nan, "exposed_share": math.nan, "note": str(exc)})
            continue
        rep = capacity_report(plan)
        rows.append({"width": int(w), "feasible": True, "iteration_s": rep.iteration_time_s, "mfu": rep.mfu,
                     "ep_comm_ms_per_gpu": rep.ep_comm_gpu_s / rep.gpus * 1e3,
                     "exposed_ep_ms_per_gpu": rep.parts.get("exposed_ep_all_to_all", 0.0) / rep.gpus * 1e3,
                     "hidden_fraction": rep.ep_hidden_fraction, "exposed_share": rep.ep_exposed_share, "note": ""})
    return pd.DataFrame(rows)


def _crossing(widths: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """Width where ``values`` first crosses ``target`` (:func:`tessera_lab.report.headline.width_at_hidden_share`)."""
    from tessera_lab.report.headline import width_at_hidden_share

    return width_at_hidden_share(widths, values, target)


def paper_point_widths(width_df, reported: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """At which expert widths our model reaches the paper's reported EP points.

    For each of the paper's two jobs (``overlap.large_job`` and ``overlap.medium_job``), the width where our
    hidden fraction crosses the reported hidden fraction, and the width where our exposed share crosses the
    reported exposed share (log-linear interpolation between the study's widths), with our value of the
    other metric at that width. ``None`` when the study's range does not reach the value.
    """
    reported = reported or paper_reported()
    df = width_df[width_df["feasible"]].sort_values("width")
    w = list(df["width"].astype(float))
    hid = list(df["hidden_fraction"])
    exp = list(df["exposed_share"])
    out = []
    for key in ("large_job", "medium_job"):
        job = reported["overlap"][key]
        h, e = job["ep_comm_hidden_fraction"], job["exposed_ep_comm_share_of_iteration"]
        wh, we = _crossing(w, hid, h), _crossing(w, exp, e)

        def at(width, series):
            if width is None:
                return None
            return _interp(w, series, width)

        out.append({"job": key, "paper_model": job.get("model", ""), "paper_gpus": job.get("gpus"),
                    "paper_hidden": h, "paper_exposed_share": e,
                    "width_reaching_hidden": wh, "our_exposed_share_there": at(wh, exp),
                    "width_reaching_exposed_share": we, "our_hidden_there": at(we, hid),
                    "study_range": (min(w), max(w)) if w else None,
                    "hidden_range": (min(hid), max(hid)) if hid else None,
                    "exposed_range": (min(exp), max(exp)) if exp else None})
    return out


def _interp(widths: Sequence[float], values: Sequence[float], width: float) -> float:
    x = math.log2(width)
    for (w1, v1), (w2, v2) in zip(zip(widths, values), list(zip(widths, values))[1:]):
        if w1 <= width <= w2:
            x1, x2 = math.log2(w1), math.log2(w2)
            return v1 + (v2 - v1) * ((x - x1) / (x2 - x1) if x2 > x1 else 0.0)
    return math.nan


def describe_paper_points(points: list[dict[str, Any]]) -> list[str]:
    """One sentence per paper point (for reports and notebooks)."""
    lines = []
    for p in points:
        label = "large job" if p["job"] == "large_job" else "medium job"
        head = (f"paper {label} ({p['paper_model']}, {p['paper_gpus']} GPUs): {p['paper_hidden']:.0%} hidden, "
                f"{p['paper_exposed_share']:.1%} exposed. ")
        lo, hi = p["study_range"] or (math.nan, math.nan)
        if p["width_reaching_hidden"] is not None:
            a = (f"our model hides {p['paper_hidden']:.0%} at expert width ~{p['width_reaching_hidden']:.0f} "
                 f"(exposed {p['our_exposed_share_there']:.1%} there)")
        else:
            hr = p["hidden_range"] or (math.nan, math.nan)
            a = (f"our model does not reach {p['paper_hidden']:.0%} hidden between widths {lo:.0f} and {hi:.0f} "
                 f"(it hides {hr[0]:.0%} to {hr[1]:.0%})")
        if p["width_reaching_exposed_share"] is not None:
            b = (f"; the exposed share is {p['paper_exposed_share']:.1%} at width ~{p['width_reaching_exposed_share']:.0f} "
                 f"(hidden {p['our_hidden_there']:.0%} there)")
        else:
            er = p["exposed_range"] or (math.nan, math.nan)
            b = (f"; the exposed share {p['paper_exposed_share']:.1%} is not reached in that range "
                 f"({er[0]:.1%} to {er[1]:.1%})")
        lines.append(head + a + b)
    return lines


def plot_width_study(width_df, ax=None, reported: dict[str, Any] | None = None):
    """Hidden fraction and exposed share against expert width (log scale), with the paper's two reported
    points as horizontal reference lines. Returns the matplotlib ``Axes``."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    reported = reported or paper_reported()
    df = width_df[width_df["feasible"]]
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.8), layout="constrained")
    pal = sns.color_palette("colorblind", 4)
    ax.plot(df["width"], df["hidden_fraction"], marker="o", color=pal[0], label="EP comm hidden (ours)")
    ax.plot(df["width"], df["exposed_share"], marker="s", color=pal[1], label="exposed EP share of iteration (ours)")
    for key, style in (("large_job", "--"), ("medium_job", ":")):
        job = reported["overlap"][key]
        ax.axhline(job["ep_comm_hidden_fraction"], color=pal[0], linestyle=style, linewidth=1,
                   label=f"paper {key.replace('_', ' ')}: hidden {job['ep_comm_hidden_fraction']:.0%}")
        ax.axhline(job["exposed_ep_comm_share_of_iteration"], color=pal[1], linestyle=style, linewidth=1,
                   label=f"paper {key.replace('_', ' ')}: exposed {job['exposed_ep_comm_share_of_iteration']:.1%}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("routed expert width (moe_intermediate_size)")
    ax.set_ylabel("fraction")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("EP all-to-all hidden under compute vs expert width", fontsize=10)
    return ax


def plot_scale_study(scale_df, ax=None):
    """MFU per setup against GPU count, one line per (family, setup). Returns the matplotlib ``Axes``."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.6), layout="constrained")
    sns.lineplot(data=scale_df, x="gpus", y="mfu", hue="setup", style="family", markers=True, ax=ax,
                 palette="colorblind")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("MFU")
    ax.set_title("MFU at paper scale (analytic backend)", fontsize=10)
    return ax
