"""Notebook figures say what they cannot show: no zero-length bar for "no plan fits" (06), no line across
micro-batch counts a schedule cannot run (03), one time axis for predicted and observed timelines (09)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402


def test_ratio_spread_labels_settings_where_no_plan_fits():
    from tessera_lab.teach.figures import plot_ratio_spread

    spread = pd.DataFrame({"spread of layers time": [0.02, 0.05], "spread of planned iteration": [0.03, math.nan]},
                          index=["default", "32K tokens"])
    fig = plot_ratio_spread(spread, (1, 3, 7))
    ax = fig.axes[0]
    texts = [t.get_text().strip() for t in ax.texts]
    assert texts == ["n/a (does not fit)"]
    # the label sits at the NaN bar's row (second setting, second series): y = 1 - 0.4 + 0.4 * 1.5 = 1.2
    assert abs(ax.texts[0].get_position()[1] - 1.2) < 1e-9
    widths = sorted(round(p.get_width(), 9) for p in ax.patches)
    assert widths == [0.0, 2.0, 3.0, 5.0]


def test_bubble_sweep_draws_no_line_across_missing_counts():
    from tessera_lab.teach.figures import plot_bubble_sweep

    rows = [{"micro-batches": m, "schedule": "1f1b", "simulated": 3 / (m + 3), "closed form": 3 / (m + 3)}
            for m in range(4, 9)]
    rows += [{"micro-batches": m, "schedule": "interleaved", "simulated": 1.5 / (m + 1.5),
              "closed form": 1.5 / (m + 1.5)} for m in (4, 6, 8)]
    ax = plot_bubble_sweep(pd.DataFrame(rows), 4).axes[0]
    lines = {ln.get_label().split(" ")[0]: ln for ln in ax.lines}
    assert lines["1f1b"].get_linestyle() == "-"
    assert lines["interleaved"].get_linestyle() == "None" and lines["interleaved"].get_marker() == "x"


def test_gantt_pair_shares_unit_and_range():
    from tessera_lab.pipeline.simulate import Event, Timeline
    from tessera_lab.ui.plots import gantt_pair

    def tl(T):
        return Timeline(events=[Event(0, 0, 0, "F", 0.0, T, "compute", "F0")], iteration_time=T,
                        per_rank_busy=[T], per_rank_idle=[0.0], bubble_fraction=0.0, bubble_overhead=0.0,
                        exposed_comm={}, critical_path=[], peak_activations=[], schedule_name="x", num_ranks=1)

    fig = gantt_pair(tl(0.5), tl(2.0), titles=("predicted", "observed"))  # 500 ms and 2 s
    a, b = fig.axes[:2]
    assert a.get_xlabel() == b.get_xlabel() == "time (s)"
    assert a.get_xlim() == b.get_xlim() == (0.0, 2.0 * 1.005)
