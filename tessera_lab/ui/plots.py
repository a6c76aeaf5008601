"""Figures (seaborn / matplotlib). Plotting libraries are imported inside each function, so
importing this module stays cheap and works where matplotlib is absent."""

from __future__ import annotations

from typing import Any

__all__ = ["gantt"]

# Colour per action type (indices into seaborn's colour-blind palette), fixed so that every figure
# uses the same colours.
_TYPE_ORDER = ["F", "B", "I", "W", "OVERLAP_F_B"]
_TYPE_PALETTE_INDEX = {"F": 0, "B": 3, "I": 1, "W": 2, "OVERLAP_F_B": 4}
_TYPE_NAMES = {
    "F": "F forward",
    "B": "B backward",
    "I": "I input grad",
    "W": "W weight grad",
    "OVERLAP_F_B": "F&B overlapped\n(F's micro-batch | B's,\nor F's above B's)",
}


def _time_unit(span: float) -> tuple[float, str]:
    if span >= 1.0 or span == 0:
        return 1.0, "s"
    if span >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def _text_colour(rgb) -> str:
    r, g, b = rgb[:3]
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if luminance > 0.5 else "white"


def _bar_text(e) -> str:
    if e.type == "OVERLAP_F_B":
        # label "(0F7;7B3)OVERLAP_F_B" -> "7|3" (forward's micro-batch | backward's)
        inner = e.label[1 : e.label.find(")")]
        parts = []
        for sub in inner.split(";"):
            digits = ""
            for ch in reversed(sub):
                if not ch.isdigit():
                    break
                digits = ch + digits
            parts.append(digits)
        return "|".join(parts)
    return "" if e.microbatch is None else str(e.microbatch)


_FIT_TEXT: list = []


def _fit_text_class():
    """A matplotlib ``Text`` that draws itself at the largest of ``sizes`` points that fits inside a box
    (``xspan`` x ``yspan`` in data units, less a 1-point margin), or not at all; ``variants`` are other ways to
    write the same label (e.g. on two lines), tried at each size after the text itself. The choice is made at
    draw time, so it follows the final layout (constrained layout, a legend outside the axes, the saved dpi)."""
    if not _FIT_TEXT:
        from matplotlib.text import Text

        class FitText(Text):
            def __init__(self, xspan, yspan, *args, sizes=(7.0, 6.0, 5.0), variants=(), **kwargs):
                super().__init__(*args, **kwargs)
                self._xspan, self._yspan, self._sizes = xspan, yspan, tuple(sizes)
                self._variants = (self.get_text(), *variants)

            def _fits(self, renderer) -> bool:
                tr = self.axes.transData
                (x0, y0), (x1, y1) = tr.transform([(self._xspan[0], self._yspan[0]), (self._xspan[1], self._yspan[1])])
                margin = renderer.points_to_pixels(1.0)
                room_w, room_h = abs(x1 - x0) - 2 * margin, abs(y1 - y0) - margin
                for size in self._sizes:
                    for text in self._variants:
                        if self.get_fontsize() != size:
                            self.set_fontsize(size)
                        if self.get_text() != text:
                            self.set_text(text)
                        ext = super().get_window_extent(renderer)
                        if ext.width <= room_w and ext.height <= room_h:
                            return True
                return False

            def draw(self, renderer):
                self.shown = False  # whether the last draw wrote the label (it did not fit otherwise)
                if renderer is None or not self.get_visible() or self.axes is None:
                    return
                if self._fits(renderer):
                    super().draw(renderer)
                    self.shown = True

            def get_tightbbox(self, renderer=None):  # labels live inside the axes: never grow the layout
                return None

        _FIT_TEXT.append(FitText)
    return _FIT_TEXT[0]


# long: one figure drawn in commented steps (rows, bars, micro-batch labels, axes, legend, title) on shared locals
def gantt(timeline, ax=None, title: str | None = None, time_unit: str | None = None, span: float | None = None) -> Any:
    """Gantt chart of a :class:`~tessera_lab.pipeline.simulate.Timeline`: one row per rank.

    Compute actions are bars coloured by type (F, B, I, W, overlapped F&B) with the micro-batch
    number written on each bar (``f|b`` for an overlapped pair, or ``f`` above ``b`` where that fits
    better) at 7 points, or 6 or 5 where the bar is narrow, and left out where even 5 points do not fit;
    transfers and other communication appear as a thin grey strip under the rank's row. Text
    colour follows each bar's brightness, and axes use the active matplotlib style, so the
    figure reads in light and dark themes. Default size 10 x (0.45 per rank + 1.6) inches,
    capped at 8 inches high.

    Args:
        timeline: the simulated timeline.
        ax: matplotlib axes to draw into; a new figure is made when ``None``.
        title: figure title; default names the schedule, makespan and bubble fraction.
        span: the time axis' extent (seconds, or ``time_unit``), at least the timeline's own; charts drawn with
            one ``span`` share their unit and x range (:func:`gantt_pair`).

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Patch

    events = timeline.events
    ranks = max(getattr(timeline, "num_ranks", 0) or 0, 1 + max((e.rank for e in events), default=-1))
    if ax is None:
        height = min(8.0, 0.45 * max(ranks, 1) + 1.6)
        _, ax = plt.subplots(figsize=(10, height), layout="constrained")
    palette = sns.color_palette("colorblind", 10)
    colours = {k: palette[i] for k, i in _TYPE_PALETTE_INDEX.items()}
    comm_colour = (0.55, 0.55, 0.55)
    edge = plt.rcParams.get("axes.facecolor", "white")
    if edge in ("none", None):
        edge = "white"

    span = max(timeline.iteration_time, span or 0.0)
    # seconds shown in s, ms or µs; ``time_unit`` names another unit (e.g. simulate's "time units") and keeps the values
    scale, unit = _time_unit(span) if time_unit is None else (1.0, time_unit)
    bar_h, comm_h = 0.72, 0.16

    # ranks holding several stages (interleaved, DualPipeV): later chunks in a lighter shade
    first_stage: dict[int, int] = {}
    stages_seen: dict[int, set] = {}
    for e in events:
        if e.lane == "compute" and e.type != "OVERLAP_F_B":
            first_stage[e.rank] = min(first_stage.get(e.rank, e.stage), e.stage)
            stages_seen.setdefault(e.rank, set()).add(e.stage)
    multi_chunk = any(len(v) > 1 for v in stages_seen.values())

    def colour_of(typ: str, light: bool):
        c = colours.get(typ, comm_colour)
        return tuple(0.55 * x + 0.45 for x in c) if light else c

    by_key: dict[tuple[int, str, bool], list[tuple[float, float]]] = {}
    comm_bars: dict[int, list[tuple[float, float]]] = {}
    light_of: dict[int, bool] = {}
    for n, e in enumerate(events):
        if e.lane == "compute":
            light = multi_chunk and e.type != "OVERLAP_F_B" and e.stage != first_stage.get(e.rank, e.stage)
            light_of[n] = light
            by_key.setdefault((e.rank, e.type, light), []).append((e.start * scale, (e.end - e.start) * scale))
        else:
            comm_bars.setdefault(e.rank, []).append((e.start * scale, (e.end - e.start) * scale))
    # no edge on bars under ~2.5 points (axes ~80% of the figure): an edge in the background colour would hide them
    pts = 0.8 * ax.figure.get_figwidth() * 72 / max(span * scale, 1e-30)
    for (rank, typ, light), bars in by_key.items():
        for thin in (False, True):
            if group := [b for b in bars if (b[1] * pts < 2.5) == thin]:
                ax.broken_barh(group, (rank - bar_h / 2, bar_h), facecolors=colour_of(typ, light),
                               edgecolors="none" if thin else edge, linewidth=0 if thin else 0.6)
    for rank, bars in comm_bars.items():
        ax.broken_barh(bars, (rank + bar_h / 2 + 0.02, comm_h), facecolors=comm_colour, edgecolors="none", alpha=0.8)

    # micro-batch numbers: each label is drawn at the largest font size (7, 6 or 5 points) at which it fits
    # inside its bar in the final layout, and skipped when even 5 points do not fit (decided at draw time)
    compute = [(n, e) for n, e in enumerate(events) if e.lane == "compute"]
    if len(compute) <= 3000:
        fit_text = _fit_text_class()
        for n, e in compute:
            text = _bar_text(e)
            if not text:
                continue
            label = fit_text(
                (e.start * scale, e.end * scale), (e.rank - bar_h / 2, e.rank + bar_h / 2),
                (e.start + e.end) / 2 * scale, e.rank, text, variants=(text.replace("|", "\n"),) if "|" in text else (),
                ha="center", va="center", linespacing=1.0, color=_text_colour(colour_of(e.type, light_of.get(n, False))),
                clip_on=True,
            )
            label.set_clip_path(ax.patch)
            if hasattr(ax, "_add_text"):  # among ax.texts, like ax.text() would put it
                ax._add_text(label)
            else:  # pragma: no cover - older matplotlib
                ax.add_artist(label)

    ax.set_ylim(ranks - 0.5 + (comm_h + 0.05 if comm_bars else 0.0), -0.6)
    ax.set_yticks(range(ranks))
    ax.set_yticklabels([f"rank {r}" for r in range(ranks)])
    ax.set_xlim(0, span * scale * 1.005 if span > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)

    present = [t for t in _TYPE_ORDER if any(k[1] == t for k in by_key)]
    handles = [Patch(facecolor=colours[t], edgecolor=edge, label=_TYPE_NAMES[t]) for t in present]
    if multi_chunk:
        handles.append(Patch(facecolor=colour_of("F", True), edgecolor=edge, label="lighter: later chunk"))
    if comm_bars:
        handles.append(Patch(facecolor=comm_colour, label="comm (p2p, collectives)"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    if title is None:
        name = getattr(timeline, "schedule_name", "") or "pipeline"
        title = (
            f"{name}: iteration {timeline.iteration_time * scale:.4g} {unit}, "
            f"bubble {timeline.bubble_fraction:.1%} of rank-time"
        )
    ax.set_title(title, fontsize=10)
    return ax


def stage_cost_bars(plan, ax=None, title: str | None = None) -> Any:
    """Bar chart of time per micro-batch per stage (F and B+W stacked) for the chosen partition and
    each baseline of a :class:`~tessera_lab.plan.make.Plan`, side by side. Times in ms.

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    from tessera_lab.plan.proof import method_name

    rows = []
    for ev in [plan.chosen, *plan.baselines.values()]:
        for st in ev.stages:
            rows.append({"partition": method_name(plan, ev), "stage": st.index,
                         "time per micro-batch (ms)": st.time_s * 1e3, "layers": len(st.layers)})
    df = pd.DataFrame(rows)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 3.6), layout="constrained")
    sns.barplot(data=df, x="stage", y="time per micro-batch (ms)", hue="partition", ax=ax,
                palette="colorblind")
    slowest = max(st.time_s for st in plan.chosen.stages) * 1e3
    ax.axhline(slowest, color="grey", linestyle="--", linewidth=1, label=f"slowest ({method_name(plan)})")
    stages = len(plan.chosen.stages)
    if stages > 24:  # label every k-th stage: 96 virtual stages' numbers would run into each other
        k = -(-stages // 16)
        ax.set_xticks(range(0, stages, k))
        ax.set_xticklabels([str(i) for i in range(0, stages, k)])
    # legend outside the axes (right), so it never hides the tallest bars
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="partition", title_fontsize=8,
              frameon=False)
    ax.set_title(title or f"{plan.model.name}: stage cost per micro-batch")
    return ax


__all__.append("stage_cost_bars")


def save_plan_figures(plan, path) -> list:
    """Save the stage-cost bars and the Gantt of the chosen plan's timeline.

    ``path`` ``out/plan.png`` writes ``out/plan-stages.png`` and ``out/plan-timeline.png``.
    Returns the written paths.
    """
    from pathlib import Path

    import matplotlib.pyplot as plt

    from tessera_lab.io import save_figure
    from tessera_lab.plan.proof import partition_label

    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    stem, suffix = base.stem, base.suffix or ".png"
    out = []
    ax = stage_cost_bars(plan)
    p1 = base.with_name(f"{stem}-stages{suffix}")
    save_figure(ax.figure, p1)
    plt.close(ax.figure)
    ax = gantt(plan.chosen.timeline, title=f"{plan.model.name}: {plan.parallel.schedule}, "
               f"p={plan.parallel.pp}, m={plan.parallel.microbatches} ({partition_label(plan)})")
    p2 = base.with_name(f"{stem}-timeline{suffix}")
    save_figure(ax.figure, p2)
    plt.close(ax.figure)
    out += [p1, p2]
    return out


__all__.append("save_plan_figures")


def overlap_heatmap(table, ax=None, value: str = "gain", title: str | None = None) -> Any:
    """Heatmap of an overlap table (:func:`tessera_lab.overlap.core.overlap_table` or ``Profile.table()``):
    rows the forward bundle's layer kind, columns the backward bundle's, cells ``value`` (``gain`` in ms by
    default; ``efficiency``, ``t_pair`` (ms) or ``comm_hidden_fraction`` also work).

    The colour scale is anchored at 0 (from 0 to the largest value; ``efficiency`` and
    ``comm_hidden_fraction`` to at least 1), so cells that differ by a few percent look alike; with values
    of both signs it is a diverging scale centred on 0. The title states the range of the values.

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    ms = value in ("gain", "t_pair", "t_sum", "t_f", "t_b", "t_program")
    order = list(dict.fromkeys(list(table["kind_f"]) + list(table["kind_b"])))
    grid = table.pivot(index="kind_f", columns="kind_b", values=value) * (1e3 if ms else 1.0)
    grid = grid.reindex(index=[k for k in order if k in grid.index], columns=[k for k in order if k in grid.columns])
    if ax is None:
        _, ax = plt.subplots(figsize=(2.8 + 2.4 * grid.shape[1], 1.2 + 1.0 * grid.shape[0]), layout="constrained")
    vals = grid.to_numpy(dtype=float)
    vals = vals[np.isfinite(vals)]
    lo, hi = (float(vals.min()), float(vals.max())) if vals.size else (0.0, 1.0)
    unit_max = 1.0 if value in ("efficiency", "comm_hidden_fraction") else 0.0
    if lo >= 0:  # all non-negative: 0 .. max
        scale = dict(cmap="viridis", vmin=0.0, vmax=max(hi, unit_max) or 1.0)
    elif hi <= 0:  # all non-positive: min .. 0
        scale = dict(cmap="viridis", vmin=lo, vmax=0.0)
    else:  # both signs: diverging around 0
        bound = max(abs(lo), abs(hi), unit_max)
        scale = dict(cmap="vlag_r", vmin=-bound, vmax=bound)  # symmetric limits: white at 0
    sns.heatmap(grid, annot=True, fmt=".3g", ax=ax, cbar_kws={"label": f"{value} (ms)" if ms else value}, **scale)
    ax.tick_params(axis="y", rotation=0)
    ax.set_xlabel("backward (B+W) of micro-batch i")
    ax.set_ylabel("forward of micro-batch i+1")
    backend = table["backend"].iloc[0] if "backend" in table and len(table) else ""
    span = f"values {lo:.3g} to {hi:.3g}{' ms' if ms else ''}; colour scale from {scale['vmin']:.3g} to {scale['vmax']:.3g}"
    ax.set_title((title or f"overlap {value} by layer combination ({backend})") + f"\n{span}", fontsize=10)
    return ax


__all__.append("overlap_heatmap")


def lane_gantt(spans, ax=None, title: str | None = None) -> Any:
    """Gantt chart of tasks on the compute and comm lanes (``tessera_lab.overlap.core.lane_timeline`` output:
    columns ``task, bundle, lane, start, end``; seconds), one colour per bundle, times in ms.

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import seaborn as sns

    bundles = list(dict.fromkeys(spans["bundle"]))
    colours = dict(zip(bundles, sns.color_palette("colorblind", len(bundles))))
    lanes = ["comm", "compute"]
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 2.4), layout="constrained")
    for row in spans.itertuples():
        y = lanes.index(row.lane)
        width = (row.end - row.start) * 1e3
        if width <= 0:
            continue
        ax.barh(y, width, left=row.start * 1e3, height=0.6, color=colours[row.bundle], edgecolor="white", linewidth=0.5)
        if width > 0.06 * max(spans["end"].max() * 1e3, 1e-12):
            ax.text(row.start * 1e3 + width / 2, y, row.task.split(".", 1)[-1], ha="center", va="center", fontsize=6,
                    color=_text_colour(colours[row.bundle]), clip_on=True)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[b]) for b in bundles]
    ax.legend(handles, bundles, loc="upper right", fontsize=8, ncols=len(bundles))
    ax.set_title(title or "tasks on the compute and communication lanes", fontsize=10)
    return ax


__all__.append("lane_gantt")


def standalone_vs_overlap_bars(plan, ax=None, title: str | None = None) -> Any:
    """Per-stage cost of every partition of a plan: the standalone sum (F + B + W one after the other, hatched)
    against the cost after overlap (pairs of F and B run together), in ms. Shows why two stages with equal
    standalone sums run at different speeds.

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    evs = [plan.chosen, *plan.baselines.values()]
    n = len(evs)
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3.8), layout="constrained")
    palette = sns.color_palette("colorblind", n)
    width = 0.8 / n
    x = np.arange(plan.parallel.pp)
    for k, ev in enumerate(evs):
        alone = [st.standalone_s * 1e3 for st in ev.stages]
        after = [st.time_s * 1e3 for st in ev.stages]
        pos = x - 0.4 + width * (k + 0.5)
        ax.bar(pos, alone, width, color=palette[k], alpha=0.35, hatch="//", edgecolor=palette[k])
        ax.bar(pos, after, width, color=palette[k], label=ev.method)
    ax.set_xticks(x)
    ax.set_xlabel("stage")
    ax.set_ylabel("time per micro-batch (ms)")
    # legend outside the axes (right), so it never hides the tallest bars
    ax.legend(title="partition\n(solid: after overlap,\nhatched: standalone)", fontsize=8, title_fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(title or f"{plan.model.name}: stage cost standalone vs after overlap")
    return ax


__all__.append("standalone_vs_overlap_bars")


def waterfall(report, ax=None, title: str | None = None, unit: str = "ms_per_gpu") -> Any:
    """Waterfall of a :class:`~tessera_lab.report.capacity.CapacityReport`: the iteration's time per GPU (``unit``
    ``ms_per_gpu``, default) or GPU-seconds (``gpu_s``), starting from model FLOPs at peak (the MFU share) and
    stacking each lost-time category on top, ending at the full iteration. Rows that round to zero are kept
    (they are part of the contract: the parts sum to the lost time).

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import seaborn as sns

    if unit not in ("ms_per_gpu", "gpu_s"):
        from tessera_lab.errors import ConfigError

        raise ConfigError(f"field 'unit' = {unit!r} is unknown; allowed: ms_per_gpu, gpu_s")
    scale = (1e3 / report.gpus) if unit == "ms_per_gpu" else 1.0
    rows = report.rows()
    labels = ["model FLOPs at peak"] + [r["label"] for r in rows] + ["iteration"]
    values = [report.useful_gpu_s * scale] + [r["gpu_s"] * scale for r in rows]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    palette = sns.color_palette("colorblind", 3)
    bottom = 0.0
    for k, v in enumerate(values):
        if k == 0:
            ax.bar(k, v, color=palette[2])
            bottom = v
            continue
        lo, hi = (bottom, bottom + v) if v >= 0 else (bottom + v, bottom)
        ax.bar(k, hi - lo, bottom=lo, color=palette[1] if v >= 0 else palette[0])
        if abs(v) >= 0.005 * max(values[0], 1e-300):
            ax.text(k, hi, f"{v:.3g}", ha="center", va="bottom", fontsize=7)
        bottom += v
    total = report.gpu_time_s * scale
    ax.bar(len(values), total, color="grey", alpha=0.6)
    ax.text(0, values[0], f"{values[0]:.3g}", ha="center", va="bottom", fontsize=7)
    ax.text(len(values), total, f"{total:.4g}", ha="center", va="bottom", fontsize=7)
    ax.margins(y=0.08)
    ax.axhline(report.useful_gpu_s * scale, color=palette[2], linewidth=0.8, linestyle=":")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("ms per GPU per iteration" if unit == "ms_per_gpu" else "GPU-seconds per iteration")
    headline = f"where the iteration goes: MFU {report.mfu:.1%}, lost {1 - report.mfu:.1%}"
    if title is None:
        title = f"{report.source}\n{headline}" if report.source else headline
    ax.set_title(title, fontsize=10)
    return ax


__all__.append("waterfall")


def waterfall_pair(reports, titles=None, suptitle: str | None = None, unit: str = "ms_per_gpu") -> Any:
    """Two :func:`waterfall` charts side by side on one y scale (a model-change diff: the base on the left,
    the variant on the right). ``titles``: one per chart (default each report's source and MFU);
    ``suptitle``: a line above both (e.g. the diff's headline). Returns the matplotlib ``Figure``."""
    import textwrap

    import matplotlib.pyplot as plt

    a, b = reports
    fig, axes = plt.subplots(1, 2, figsize=(16, 5.0), layout="constrained", sharey=True)
    for ax, rep, t in zip(axes, (a, b), titles or (None, None)):
        waterfall(rep, ax=ax, title=t, unit=unit)
    axes[1].set_ylabel("")
    axes[1].tick_params(axis="y", labelleft=True)
    if suptitle:
        fig.suptitle(textwrap.fill(suptitle, 170), fontsize=10)
    return fig


__all__.append("waterfall_pair")


def routing_heatmap(counts, ax=None, ep: int | None = None, title: str | None = None) -> Any:
    """Heatmap of tokens (assignments) per expert: rows = micro-batches, columns = experts.

    Args:
        counts: ``[microbatches, E]`` (or ``[E]``) token counts from :mod:`tessera_lab.dynamic.routing`.
        ax: axes to draw into (new figure when ``None``).
        ep: draw the boundaries of the ``ep`` EP ranks (experts are split contiguously).
        title: default names the shape and the busiest rank's load.

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    c = np.atleast_2d(np.asarray(counts))
    if c.ndim != 2:
        from tessera_lab.errors import ConfigError

        raise ConfigError(f"field 'counts' has shape {c.shape}; allowed: [microbatches, experts] or [experts]")
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.22 * min(c.shape[0], 24)), layout="constrained")
    sns.heatmap(c, ax=ax, cmap="mako_r", cbar_kws={"label": "tokens (assignments)"},
                xticklabels=max(1, c.shape[1] // 16), yticklabels=max(1, c.shape[0] // 12))
    if ep and c.shape[1] % ep == 0:
        for k in range(1, ep):
            ax.axvline(k * c.shape[1] // ep, color="white", linewidth=1.2)
    ax.set_xlabel("expert" + (f" (white lines: {ep} EP ranks)" if ep else ""))
    ax.set_ylabel("micro-batch")
    if title is None:
        title = f"tokens per expert: {c.shape[0]} micro-batch(es) x {c.shape[1]} experts"
        if ep and c.shape[1] % ep == 0:
            ranks = c.reshape(c.shape[0], ep, -1).sum(-1)
            title += f"; busiest EP rank {np.mean(ranks.max(1) / ranks.mean(1)):.2f}x its share (mean)"
    ax.set_title(title, fontsize=10)
    return ax


def rank_load_bars(loads, ax=None, title: str | None = None, relative: bool = True) -> Any:
    """Per-EP-rank load as bars: the mean over micro-batches, with the min-max range as error bars.

    Args:
        loads: ``[ep]`` or ``[microbatches, ep]`` tokens per EP rank (e.g.
            :func:`tessera_lab.dynamic.routing.ep_rank_load`).
        relative: divide by the mean rank load (1.0 = the uniform share; a dashed line marks it).

    Returns:
        the matplotlib ``Axes``.
    """
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    x = np.atleast_2d(np.asarray(loads, dtype=float))
    if relative:
        mean = x.mean(axis=1, keepdims=True)
        x = np.divide(x, mean, out=np.ones_like(x), where=mean > 0)
    m, lo, hi = x.mean(0), x.min(0), x.max(0)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 + 0.5 * x.shape[1], 3.2), layout="constrained")
    colour = sns.color_palette("colorblind", 4)
    bars = [colour[3] if v == m.max() else colour[0] for v in m]
    ax.bar(range(x.shape[1]), m, color=bars, yerr=[m - lo, hi - m], capsize=3, ecolor="grey")
    ax.axhline(1.0 if relative else float(m.mean()), color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks(range(x.shape[1]))
    ax.set_xlabel("EP rank")
    ax.set_ylabel("load / uniform share" if relative else "tokens")
    imb = float(np.mean(x.max(1) / x.mean(1))) if (x.mean(1) > 0).all() else 1.0
    fit_title(ax, title or f"per-EP-rank load, max/mean {imb:.2f}\nbars: mean, whiskers: min-max",
              fontsize=10)
    return ax


def fit_title(ax, text: str, fontsize: float = 10) -> None:
    """Set ``text`` as the title of ``ax``, each line wrapped at word boundaries to the axes' width, so a
    narrow axes (a panel's side plot) never has its title cut off by the figure edge.

    The width in characters is estimated from the axes' width in inches (about 105 / fontsize characters of
    DejaVu Sans per inch, kept on the safe side of its average glyph width)."""
    import textwrap

    width_in = ax.get_position().width * ax.figure.get_figwidth()
    chars = max(12, int(width_in * 105 / fontsize))
    lines = [wrapped for line in text.split("\n")
             for wrapped in (textwrap.wrap(line, chars, break_on_hyphens=False) or [""])]
    ax.set_title("\n".join(lines), fontsize=fontsize)


def gantt_pair(static, dynamic=None, titles: tuple[str, str] | None = None, time_unit: str | None = None) -> Any:
    """Two Gantt charts on a shared time axis (one unit, one x range: the longer timeline's): the static timeline
    above, the filled (dynamic) one below (only the first when ``dynamic`` is ``None``); ``titles`` name them (the
    iteration and bubble follow); ``time_unit`` as :func:`gantt` (default: seconds). Returns the matplotlib
    ``Figure``."""
    import matplotlib.pyplot as plt

    tls = [t for t in (static, dynamic) if t is not None]
    ranks = max(t.num_ranks or 1 for t in tls)
    h = min(7.0, 0.4 * ranks + 1.4)
    fig, axes = plt.subplots(len(tls), 1, figsize=(10, h * len(tls)), layout="constrained", squeeze=False)
    names = titles or ("static", "dynamic (W moved into predicted bubbles)")
    span = max(t.iteration_time for t in tls)
    for ax, tl, name in zip(axes[:, 0], tls, names):
        gantt(tl, ax=ax, title=f"{name}: iteration {tl.iteration_time:.4g} {time_unit or 's'}, bubble "
                              f"{tl.bubble_fraction:.1%}", time_unit=time_unit, span=span)
    return fig


__all__ += ["routing_heatmap", "rank_load_bars", "gantt_pair", "fit_title"]
