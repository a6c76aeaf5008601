"""A fresh user's findings on the notebooks, panels, figures and the plan header: dense models name no EP group,
tables keep one format per column, the reproduce figures agree with the text that quotes them, notebook 07's
caption names its model, GPU and cost source, and the quick-start panel has a recompute control. Expected values
are worked by hand in the comments."""

from __future__ import annotations

import pytest

from tessera_lab.cli.main import main


def _header(capsys, argv: list[str]) -> str:
    assert main(argv) == 0
    return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("cluster "))


# ------------------------------------------------------------------ dense models: no EP, no dispatcher
@pytest.mark.parametrize("model, extra", [("qwen3-8b", []), ("nemotron-h-56b", ["--recompute", "full"])])
def test_dense_model_header_names_no_ep_group(capsys, model, extra):
    head = _header(capsys, ["plan", "--model", model, "--pp", "4", "-m", "8", "--ep", "8", *extra])
    # pp 4 x ep 8 = 32 GPUs; without routed experts the 8 EP ranks are data-parallel replicas: dp 8
    assert "pp=4 tp=1 dp=8 (32 GPUs; no MoE, ep 8 counts as data-parallel replicas)" in head
    assert "ep=" not in head and "dispatcher" not in head and "expert GEMMs" not in head


def test_dense_model_at_ep_1_says_no_moe(capsys):
    head = _header(capsys, ["plan", "--model", "qwen3-8b", "--pp", "4", "-m", "8", "--ep", "1"])
    assert "pp=4 tp=1 dp=1 (4 GPUs; no MoE)" in head and "dispatcher" not in head


def test_moe_model_header_keeps_ep_and_dispatcher(capsys):
    head = _header(capsys, ["plan", "--pp", "4", "-m", "8"])
    assert "pp=4 ep=8 tp=1 dp=1 (32 GPUs)" in head and "dispatcher alltoall" in head and "expert GEMMs" in head


# ------------------------------------------------------------------ quick-start panel: recompute control
def test_quickstart_recompute_control_makes_a_model_fit():
    """Nemotron-H 56B on 8 stages of H200 at 4,096 tokens does not fit without recomputation (the planner's
    message names the GiB); full recomputation keeps only each layer's input, so it fits, and the panel's plan is
    the plan ``replan`` makes with the same recompute."""
    pytest.importorskip("ipywidgets")
    from tessera_lab.ui.widgets import plan_summary, quickstart_panel, replan

    _, controls, state = quickstart_panel("nemotron-h-56b", pp=8, ep=1, microbatches=8)
    assert list(controls["recompute"].options) == ["none", "selective", "full"]
    assert "GiB" in state["error"]
    controls["recompute"].value = "full"
    assert "error" not in state and state["plan"].chosen.fits_memory
    assert state["plan"].parallel.recompute == "full" and "recompute full" in state["caption"]
    assert state["summary"] == plan_summary(replan("nemotron-h-56b", pp=8, ep=1, microbatches=8, recompute="full"))
    # a dense model has no EP group: the caption reads pp x dp and says so
    assert "pp 8 x dp 1 (no MoE)" in state["caption"] and "ep 1" not in state["caption"]


def test_quickstart_recompute_costs_time_and_saves_memory():
    """Full recomputation re-runs each layer's forward in the backward: the same partition method's slowest stage
    is slower and its largest stage memory smaller than without (Qwen3-Next, pp 8, 8 micro-batches)."""
    from tessera_lab.ui.widgets import replan

    none, full = (replan(pp=8, microbatches=8, recompute=r) for r in ("none", "full"))
    mem = lambda pl: max(st.memory_bytes for st in pl.baselines["uniform"].stages)  # noqa: E731
    slow = lambda pl: max(st.time_s for st in pl.baselines["uniform"].stages)  # noqa: E731
    assert mem(full) < mem(none) and slow(full) > slow(none)


def test_quickstart_refuses_an_unknown_recompute():
    pytest.importorskip("ipywidgets")
    from tessera_lab.errors import ConfigError
    from tessera_lab.ui.widgets import quickstart_panel

    with pytest.raises(ConfigError, match="recompute = 'partial' is unknown; allowed: none, selective, full"):
        quickstart_panel(recompute="partial")


# ------------------------------------------------------------------ reproduce figures
def _mfu_rep():
    """The ``mfu`` table of a reproduction: the paper's four production jobs (reported) and four stand-ins with
    the real scenario's long labels (simulated; values made up)."""
    import pandas as pd

    from tessera_lab.report import reproduce as R

    rows = [{"job": j["job"], "scenario": "", "gpus": j["gpus"], "before": j["mfu_before"], "after": j["mfu_after"],
             "after_lo": float("nan"), "after_hi": float("nan"), "source": R.REPORTED}
            for j in R.reported()["production_jobs"]]
    stand = {"Qwen3-L": "qwen3-235b-a22b", "Qwen3-XL": "qwen3-235b-a22b (num_experts 512)",
             "Qwen3-Next-M": "qwen3-next-80b-a3b", "Qwen3-Next-XL": "qwen3-next-80b-a3b"}
    for i, j in enumerate(R.reported()["production_jobs"]):
        rows.append({"job": f"{j['job']} stand-in: {stand[j['job']]}", "scenario": f"s{i}", "gpus": j["gpus"],
                     "before": 0.10 + 0.01 * i, "after": 0.12 + 0.01 * i, "after_lo": 0.09, "after_hi": 0.3,
                     "source": R.SIMULATED})
    return R.Reproduction(mfu=pd.DataFrame(rows), ablation=None, overlap=None, width=None)


def _boxes(fig, texts):
    r = fig.canvas.get_renderer()
    return [t.get_window_extent(r) for t in texts if t.get_text()]


def test_mfu_figure_labels_do_not_overlap():
    """Every x label and every value written above a bar lies apart from every other, and the labels name each
    job once with its stand-in (four groups for four paper jobs, not eight crowded labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tessera_lab.report import reproduce as R

    ax = R.plot_mfu(_mfu_rep())
    fig = ax.figure
    fig.canvas.draw()
    labels = ax.get_xticklabels()
    assert len(labels) == 4
    assert "Qwen3-XL, 8,192 GPUs" in labels[1].get_text() and "num_experts 512" in labels[1].get_text()
    values = [t for t in ax.texts]
    assert len(values) == 8  # one "after" value per bar pair
    for group in (_boxes(fig, labels), _boxes(fig, values)):
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                assert not a.overlaps(b), (a, b)
    plt.close(fig)


def _ablation_rep(claims_scenario: str | None):
    import pandas as pd

    from tessera_lab.report import reproduce as R

    rep_ab = R.reported()["ablation"]
    rows = [{"step": "static plan (total)", "gain": rep_ab["static_plan_throughput_gain"], "scenario": "",
             "source": R.REPORTED},
            {"step": "dynamic filling", "gain": rep_ab["dynamic_only_throughput_gain"], "scenario": "",
             "source": R.REPORTED}]
    # three scenarios: totals 0.30, 0.10, 0.20 (balance + overlap = total); mean 0.20, lower median "c" (0.20)
    for sc, bal, ovl in (("a", 0.10, 0.20), ("b", 0.04, 0.06), ("c", 0.05, 0.15)):
        rows += [{"step": "static plan (total)", "gain": bal + ovl, "scenario": sc, "source": R.SIMULATED},
                 {"step": "of which stage balance", "gain": bal, "scenario": sc, "source": R.SIMULATED},
                 {"step": "of which overlap scheduling", "gain": ovl, "scenario": sc, "source": R.SIMULATED}]
    rows.append({"step": "dynamic filling", "gain": 0.01, "scenario": "dyn", "source": R.SIMULATED})
    claims = None if claims_scenario is None else pd.DataFrame([
        {"claim": "static plan +13%, about 9 points from stage balance", "scenario": claims_scenario},
        {"claim": "dynamic optimizer alone", "scenario": "dyn"}])
    return R.Reproduction(mfu=None, ablation=pd.DataFrame(rows), overlap=None, width=None, claims=claims)


@pytest.mark.parametrize("quoted, want", [("a", (30.0, 10.0, 20.0)), (None, (20.0, 5.0, 15.0))])
def test_ablation_bars_are_the_quoted_scenarios_numbers(quoted, want):
    """The simulated static bars are the numbers of the one scenario the claims quote (without a claims table:
    the lower median of the totals 0.10, 0.20, 0.30, scenario "c"), never a mean over scenarios; the title names
    it and the dynamic bar is the dynamic scenario's 1.0 %."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tessera_lab.report import reproduce as R

    rep = _ablation_rep(quoted)
    assert R.ablation_scenario(rep) == (quoted or "c")
    ax = R.plot_ablation(rep)
    steps = [t.get_text() for t in ax.get_yticklabels()]
    assert steps == ["static plan (total)", "of which stage balance", "of which overlap scheduling",
                     "dynamic filling"]
    sim = {round(p.get_y() + p.get_height() / 2): p.get_width() for p in ax.containers[1]}
    assert [sim[i] for i in range(3)] == pytest.approx(list(want)) and sim[3] == pytest.approx(1.0)
    assert f"static steps: {quoted or 'c'}" in ax.get_title()
    assert f"{want[0]:+.1f}%" in [t.get_text() for t in ax.texts]
    plt.close(ax.figure)


# ------------------------------------------------------------------ one format per column
@pytest.mark.parametrize("label, unit", [
    ("time/mb (ms)", "ms"), ("MFU (%)", "%"), ("static iteration (s), job of 2 EP groups", "s"),
    ("tokens/s (M)", "M"), ("tokens/s per GPU", "tokens/s"), ("NVLink (us)", "us"), ("memory (GiB)", "GiB"),
    ("bubble fraction", "share"), ("idle removed (share)", "share"), ("throughput gain", "share"),
    ("IB / NVLink", "ratio"), ("overlap-aware speed-up", "ratio"), ("load imbalance (max / mean)", "ratio"),
    ("tp=8, pp=4 on 4 node(s)", None), ("EP ranks", None), ("bytes per all-reduce", None)])
def test_label_unit(label, unit):
    from tessera_lab.report.formatting import label_unit

    assert label_unit(label) == unit


def test_display_frame_one_format_per_column_and_per_metric_row():
    import pandas as pd

    from tessera_lab.report.formatting import display_frame

    cols = pd.DataFrame({"iteration (s)": [0.69794, 1.2], "MFU (%)": [13.4912, 9.8], "bubble fraction": [0.4541, 0.5],
                         "slowest stage (ms)": [46.6213, 112.0], "tokens/s per GPU": [5869.4, 26892.4],
                         "factor": [1.75, 0.875], "n": [5, 12], "fits memory": ["yes", "NO"]})
    got = display_frame(cols)
    assert list(got.iloc[0]) == ["0.698", "13.5", "45.4%", "46.62", "5,869", "1.750", "5", "yes"]
    assert list(got.iloc[1]) == ["1.200", "9.8", "50.0%", "112.00", "26,892", "0.875", "12", "NO"]
    # a table of metrics (no unit in the column labels): each row by its own label; -0.0001 s reads 0.000
    rows = pd.DataFrame({"simulated": [33.0, 0.27272, 0.375, 2], "difference": [-1e-4, 0.0, 0.0, 0]},
                        index=["makespan (s)", "bubble fraction (share of the makespan)",
                               "bubble overhead (bubble / useful work)", "boundaries crossing nodes"])
    got = display_frame(rows)
    assert got.loc["makespan (s)"].tolist() == ["33.000", "0.000"]
    assert got.loc["bubble fraction (share of the makespan)"].tolist() == ["27.3%", "0.0%"]
    assert got.loc["bubble overhead (bubble / useful work)"].tolist() == ["0.375", "0.000"]
    assert got.loc["boundaries crossing nodes"].tolist() == ["2", "0"]
    # no unit and not whole: every cell the digits that give the column's largest value 4 significant figures
    assert display_frame(pd.DataFrame({"x": [123.456, 0.5, float("nan")]}))["x"].tolist() == ["123.5", "0.5", "n/a"]


def _cells_by_column(html: str) -> list[list[str]]:
    import re

    body = html.split("<tbody>")[1]
    rows = [re.findall(r"<td>(.*?)</td>", tr, flags=re.S) for tr in re.findall(r"<tr>(.*?)</tr>", body, flags=re.S)]
    return [list(col) for col in zip(*rows)]


def test_quickstart_panel_table_keeps_one_precision_per_column():
    """Every numeric column of notebook 00's panel table has the same digits after the point in every row (the
    four partitions), whatever the values."""
    pytest.importorskip("ipywidgets")
    import re

    from tessera_lab.ui.widgets import quickstart_panel

    _, _, state = quickstart_panel(pp=8, microbatches=8)
    for col in _cells_by_column(state["table_html"]):
        nums = [c for c in col if re.fullmatch(r"-?[\d,]+(\.\d+)?%?", c)]
        if nums:
            assert len(nums) == len(col) == 4
            assert len({len(c.rstrip("%").partition(".")[2]) for c in nums}) == 1, col


# ------------------------------------------------------------------ notebook 07: model, GPU and cost source
def _synthetic():
    from tessera_lab.dynamic.durations import StageCosts

    return StageCosts.synthetic(4, 1.0, 2.0, 1.0, expert_fraction=0.5, layers_per_stage=2, ep=4, num_experts=16,
                                top_k=2, tokens=4 * 256)


def test_dynamic_panel_caption_names_model_gpu_and_cost_source():
    """Synthetic stage times name no model and no GPU (hand-chosen seconds) and say they are synthetic; the caption
    under the panel's table and figure carries that before the settings."""
    pytest.importorskip("ipywidgets")
    from tessera_lab.ui.dynamic_panel import costs_caption, dynamic_panel

    costs = _synthetic()
    cap = costs_caption(costs)
    assert cap.startswith("model none (synthetic stage times, seconds chosen by hand) · GPU none · costs synthetic")
    _, _, state = dynamic_panel(costs, ep=4, microbatches=8)
    assert "model none" in state["table_html"] and "GPU none" in state["table_html"]
    assert "settings: skew S" in state["table_html"]


def test_model_costs_caption_names_the_gpu_they_were_priced_on():
    from tessera_lab.cost.source import analytic_source
    from tessera_lab.dynamic.durations import StageCosts
    from tessera_lab.model.hardware import ParallelConfig, cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.ui.dynamic_panel import costs_caption

    par = ParallelConfig(pp=8, ep=8, microbatches=8, schedule="zb-h1")
    costs = StageCosts.from_model(load_model("qwen3-next-80b-a3b"), par, cluster_for(par, "B200"))
    cap = costs_caption(costs)  # the GPU read from the costs themselves
    assert cap.startswith("model qwen3-next-80b-a3b · GPU B200 · costs analytic (cost model ")
    assert analytic_source().describe() in cap and costs_caption(costs, "B200") == cap


def test_notebook_07_passes_its_gpu_to_the_caption():
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "notebooks" / "07_dynamic_bubbles.py").read_text()
    assert "cluster_for(par, GPU)" in src and "gpu=GPU if USE_MODEL else None" in src
