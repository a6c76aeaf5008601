"""The ``report --plot`` figure: a plan's capacity waterfall titled with its model and configuration, or a model
diff's two waterfalls side by side (matplotlib, imported inside the functions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera_lab.io import save_figure
from tessera_lab.report.capacity import CapacityReport, DiffReport, capacity_report, plan_caption

__all__ = ["report_figure", "save_report_figure"]


def report_figure(plan: Any, report: CapacityReport | None = None, diff: DiffReport | None = None) -> Any:
    """The ``report --plot`` figure: the waterfall of ``plan`` titled with its model and configuration; with
    a ``diff``, both variants' waterfalls side by side on one y scale under the diff's headline. Returns the
    matplotlib ``Figure``."""
    from tessera_lab.ui.plots import waterfall, waterfall_pair

    if diff is None:
        rep = report or capacity_report(plan)
        ax = waterfall(rep, title=f"{plan_caption(plan)}\nwhere the iteration goes: MFU {rep.mfu:.1%}, "
                                  f"lost {1 - rep.mfu:.1%}")
        return ax.figure
    titles = [f"{plan_caption(pl, name=label, sep=chr(10))}\nMFU {cap.mfu:.1%}, iteration {cap.iteration_time_s:.4f} s"
              for label, pl, cap in zip(diff.labels, diff.plans, diff.capacity)]
    return waterfall_pair(diff.capacity, titles=titles, suptitle=diff.headline)


def save_report_figure(path: str | Path, plan: Any, report: CapacityReport | None = None,
                       diff: DiffReport | None = None) -> Path:
    """Write :func:`report_figure` to ``path`` (PNG, 120 dpi); returns the path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = report_figure(plan, report, diff)
    save_figure(fig, path)
    plt.close(fig)
    return path
