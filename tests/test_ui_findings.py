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
