"""Figures of the teaching notebooks (laptop-sized, opaque white background). Each returns a matplotlib Figure;
matplotlib and seaborn are imported inside the functions.
"""

from __future__ import annotations

from typing import Mapping

from tessera_lab.teach.collectives import CollectiveRun, _sources
from tessera_lab.teach.moe import AllToAllVolumes

# =====================================================================================================
# 5. figures (laptop-sized, opaque white background so they read in light and dark themes)
# =====================================================================================================
def _style():
    import seaborn as sns

    return sns.axes_style("whitegrid", {"axes.facecolor": "white", "figure.facecolor": "white"})


def _text_colour(rgb) -> str:
    r, g, b = rgb[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def plot_collectives(runs: Mapping[str, CollectiveRun], *, width: float = 10.0):
    """One row per collective: each rank's buffer before (left) and after (right), one cell per element,
    coloured by the rank the value came from (grey hatched = a sum over all ranks). Returns the figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Patch, Rectangle

    kinds = list(runs)
    n = max(run.world_size for run in runs.values())
    palette = sns.color_palette("colorblind", max(n, 3))
    grey = (0.78, 0.78, 0.78)
    with _style():
        fig, axes = plt.subplots(len(kinds), 2, figsize=(width, 0.55 * n * len(kinds) + 1.2), squeeze=False,
                                 facecolor="white", layout="constrained")
        for row, kind in enumerate(kinds):
            run = runs[kind]
            chunk = max(1, len(run.inputs[0]) // n) if kind != "all_gather" else len(run.inputs[0])
            for col, (bufs, title) in enumerate(((run.inputs, "before"), (run.outputs, "after"))):
                ax = axes[row][col]
                width_cells = max(len(b) for b in bufs)
                for r, buf in enumerate(bufs):
                    srcs = [r] * len(buf) if col == 0 else _sources(kind, n, chunk, r, len(buf))
                    for j, (v, src) in enumerate(zip(buf, srcs)):
                        colour = grey if src is None else palette[src]
                        ax.add_patch(Rectangle((j, n - 1 - r), 0.94, 0.9, facecolor=colour, edgecolor="white",
                                               hatch="//" if src is None else None))
                        ax.text(j + 0.47, n - 1 - r + 0.45, f"{v:g}", ha="center", va="center", fontsize=9,
                                color=_text_colour(colour))
                ax.set_xlim(-0.1, max(width_cells, 1))
                ax.set_ylim(-0.1, n)
                ax.set_yticks([n - 1 - r + 0.45 for r in range(n)], [f"rank {r}" for r in range(n)])
                ax.set_xticks([])
                ax.grid(False)
                for spine in ax.spines.values():
                    spine.set_visible(False)
                ax.set_title(f"{kind}: {title}", fontsize=10, loc="left")
                if col == 1:
                    ax.set_xlabel(run.call, fontsize=8, family="monospace")
        handles = [Patch(facecolor=palette[r], label=f"from rank {r}") for r in range(n)]
        handles.append(Patch(facecolor=grey, hatch="//", label="sum of all ranks"))
        fig.legend(handles=handles, loc="outside lower center", ncol=n + 1, frameon=False)
    return fig


def plot_cost_bars(table, *, title: str | None = None):
    """Grouped bars of :func:`collective_cost_table`: NVLink vs InfiniBand time per collective (log scale)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = table[["NVLink (us)", "InfiniBand (us)"]].reset_index().melt(
        id_vars="collective", var_name="link", value_name="time (us)")
    long["link"] = long["link"].str.replace(" (us)", "", regex=False)
    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.6), facecolor="white", layout="constrained")
        sns.barplot(data=long, x="collective", y="time (us)", hue="link", palette="colorblind", ax=ax)
        ax.set_yscale("log")
        ax.set_xlabel("")
        if title:
            ax.set_title(title, fontsize=10)
        for container in ax.containers:
            ax.bar_label(container, fmt="%.3g", fontsize=8, padding=2)
    return fig


def plot_cost_vs_size(sweep, *, title: str | None = None):
    """Log-log time vs message size per collective and link (from :func:`collective_cost_sweep`)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.8), facecolor="white", layout="constrained")
        sns.lineplot(data=sweep, x="bytes", y="time (us)", hue="collective", style="link", palette="colorblind",
                     marker="o", ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size S (bytes)")
        if title:
            ax.set_title(title, fontsize=10)
        sns.move_legend(ax, "upper left", fontsize=8, frameon=True)
    return fig


def plot_tp_sweep(sweep, *, title: str | None = None):
    """Bars of compute vs TP all-reduce time per layer for each tp (from :func:`tp_link_sweep`); the
    all-reduce bar's label names its link."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = sweep.melt(id_vars=["tp", "link"], value_vars=["compute per layer (ms)", "TP all-reduce per layer (ms)"],
                      var_name="", value_name="ms per layer per micro-batch")
    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.6), facecolor="white", layout="constrained")
        sns.barplot(data=long, x="tp", y="ms per layer per micro-batch", hue="", palette="colorblind", ax=ax)
        comm = ax.containers[1]
        ax.bar_label(comm, labels=[lk if lk != "none" else "" for lk in sweep["link"]], fontsize=8, padding=2)
        ax.set_xlabel("tensor-parallel size (8 GPUs per node)")
        if title:
            ax.set_title(title, fontsize=10)
    return fig


def plot_moe(volumes: AllToAllVolumes, *, title: str | None = None):
    """Left: dispatch token copies from each rank to each rank (heatmap; the combine is its transpose).
    Right: expert tokens per rank with the mean (the slowest rank sets the pace)."""
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    send = np.asarray(volumes.send)
    with _style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), facecolor="white", layout="constrained",
                                   width_ratios=[1, 1.3])
        every = max(1, volumes.ep // 16)  # at most 16 rank labels per axis (EP 64 labels every 4th rank)
        sns.heatmap(send, ax=a, cmap="viridis", annot=volumes.ep <= 8, fmt="d", cbar_kws={"label": "token copies"},
                    annot_kws={"fontsize": 7}, xticklabels=every, yticklabels=every)
        a.tick_params(labelsize=7)
        a.set_xlabel("to rank (dispatch)")
        a.set_ylabel("from rank")
        a.set_title("dispatch all-to-all (combine = transpose)" if volumes.ep > 1
                    else "ep = 1: no all-to-all, every token stays local", fontsize=10)
        palette = sns.color_palette("colorblind", 4)
        load = np.asarray(volumes.expert_tokens)
        b.bar(range(volumes.ep), load, color=[palette[3] if v == load.max() else palette[0] for v in load])
        b.axhline(load.mean(), color=palette[1], linestyle="--", label="mean")
        b.set_xticks(range(0, volumes.ep, max(1, volumes.ep // 8)))
        b.set_xlabel("EP rank")
        b.set_ylabel("token copies for its experts")
        b.set_title(f"per-rank load: max / mean = {volumes.load_imbalance:.2f}", fontsize=10)
        b.legend(fontsize=8)
        if title:
            fig.suptitle(title, fontsize=11)
    return fig


def plot_a2a_vs_topk(table, *, title: str | None = None):
    """Dispatch + combine time per rank vs top-k, one line per EP size (from :func:`a2a_volume_vs_topk`);
    dashed lines run over InfiniBand."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.6), facecolor="white", layout="constrained")
        eps = sorted(table["ep"].unique())
        colours = sns.color_palette("colorblind", len(eps))
        markers = "osD^vP*X"
        for i, ep in enumerate(eps):  # one legend entry per line: EP size and the link it runs on
            d = table[table["ep"] == ep].sort_values("top-k")
            link = "/".join(dict.fromkeys(d["link"]))
            ax.plot(d["top-k"], d["dispatch + combine (us)"], color=colours[i], marker=markers[i % len(markers)],
                    linestyle="--" if "InfiniBand" in link else "-", markersize=5, label=f"EP {ep} ({link})")
        ax.set_yscale("log")
        ax.set_xlabel("top-k (experts per token)")
        ax.set_ylabel("dispatch + combine per layer (us)")
        if title:
            ax.set_title(title, fontsize=10)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False,
                  title="EP size (link); dashed: InfiniBand", title_fontsize=8)
    return fig


def plot_skew_sweep(table, *, title: str | None = None):
    """Left: load imbalance (max / mean) vs skew. Right: all-to-all and expert GEMM time of the slowest rank
    vs skew, beside the uniform all-to-all and the mean expert time (from :func:`skew_sweep`)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    palette = sns.color_palette("colorblind", 4)
    with _style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4), facecolor="white", layout="constrained")
        a.plot(table["skew"], table["load imbalance"], marker="o", color=palette[0])
        a.axhline(1.0, color="grey", linestyle=":")
        a.set_xlabel("routing skew (Zipf exponent)")
        a.set_ylabel("busiest rank / mean")
        a.set_title("per-rank expert load", fontsize=10)
        b.plot(table["skew"], table["all-to-all (us)"], marker="o", color=palette[1], label="all-to-all (slowest rank)")
        b.plot(table["skew"], table["uniform all-to-all (us)"], linestyle="--", color=palette[1], label="all-to-all if uniform")
        b.plot(table["skew"], table["slowest expert GEMMs (us)"], marker="s", color=palette[2], label="expert GEMMs (slowest rank)")
        b.plot(table["skew"], table["mean expert GEMMs (us)"], linestyle="--", color=palette[2], label="expert GEMMs (mean)")
        b.set_xlabel("routing skew (Zipf exponent)")
        b.set_ylabel("us per layer per micro-batch")
        b.set_title("the slowest rank sets the pace", fontsize=10)
        b.legend(fontsize=8)
        if title:
            fig.suptitle(title, fontsize=11)
    return fig




def plot_bubble_sweep(sweep, pp: int, *, title: str | None = None):
    """Bubble fraction against micro-batches per schedule (notebook 03): ``sweep`` a DataFrame with columns
    ``micro-batches``, ``schedule``, ``simulated`` and ``closed form``. Dots: simulated; the closed form is a line
    where a schedule is defined at every micro-batch count of the sweep, and markers only (``x``) where it skips
    some (interleaved needs particular counts), so no line suggests values at counts it cannot run."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    with _style():
        fig, ax = plt.subplots(figsize=(7, 3.8), layout="constrained", facecolor="white")
        colours = sns.color_palette("colorblind", 10)
        every = sorted(sweep["micro-batches"].unique())
        for i, (name, g) in enumerate(sweep.groupby("schedule", sort=False)):
            g = g.sort_values("micro-batches")
            gaps = list(g["micro-batches"]) != every
            ax.plot(g["micro-batches"], g["closed form"], color=colours[i], ls="none" if gaps else "-",
                    marker="x" if gaps else None, ms=6,
                    label=f"{name}" + (" (defined at these counts only)" if gaps else ""))
            ax.scatter(g["micro-batches"], g["simulated"], color=colours[i], s=25)
        ax.set_xlabel("micro-batches")
        ax.set_ylabel("bubble_fraction")
        ax.legend(title="schedule (line/x: closed form; dots: simulated)", fontsize=8, title_fontsize=8)
        ax.set_title(title or f"p = {pp}: the bubble shrinks as micro-batches grow")
    return fig


def plot_ratio_spread(spread, ratios, *, title: str | None = None):
    """Spread over attention ratios per setting (notebook 06): ``spread`` the second result of
    :func:`tessera_lab.teach.sensitivity.attention_ratio_sweep` (fractions; NaN where no plan fits). A NaN is
    written as "n/a (does not fit)" at its bar's place instead of drawing a zero-length bar."""
    import math

    import matplotlib.pyplot as plt

    cols = list(spread.columns)
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    n, h = len(cols), 0.8 / max(len(cols), 1)
    with _style():
        fig, ax = plt.subplots(figsize=(8, 3), layout="constrained", facecolor="white")
        for j, col in enumerate(cols):
            ys = [i - 0.4 + h * (j + 0.5) for i in range(len(spread))]
            vals = [100 * v for v in spread[col]]
            ax.barh(ys, [0.0 if math.isnan(v) else v for v in vals], height=h, color=colours[j % 4], label=col)
            for y, v in zip(ys, vals):
                if math.isnan(v):
                    ax.text(0, y, " n/a (does not fit)", va="center", ha="left", fontsize=8, color="dimgray")
        ax.set_yticks(range(len(spread)))
        ax.set_yticklabels(list(spread.index))
        ax.invert_yaxis()
        ax.set_xlabel("spread over attention ratios (%): (max - min) / min")
        ax.legend(fontsize=8)
        ax.set_title(title or f"attention ratio {', '.join(map(str, ratios))}: where it moves the time")
        if n and all(math.isnan(v) for col in cols for v in spread[col]):
            ax.set_xlim(0, 1)
    return fig
