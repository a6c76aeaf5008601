"""Widget panels: callbacks are thin over pure functions; setting widget values re-plans."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("ipywidgets")


def test_quickstart_panel_replans_on_widget_change():
    from tessera_lab.ui.widgets import plan_summary, quickstart_panel, replan

    panel, controls, state = quickstart_panel(pp=8, microbatches=8)
    before = state["summary"]
    controls["expert_width"].value = 1024  # triggers a re-plan through the observer
    direct = plan_summary(replan(expert_width=1024, attention_ratio=3, pp=8, microbatches=8))
    base = plan_summary(replan(pp=8, microbatches=8))
    assert direct["ilp"]["iteration_time_s"] > base["ilp"]["iteration_time_s"]
    assert state["summary"] == direct
    assert before == base
    controls["pp"].value = 2  # 48 MoE layers on 2 stages do not fit: the panel reports it instead of failing
    assert "GiB" in state["error"]
    # labels take the width they need (JupyterLab cuts "expert width" to "expert wi…" at its default 80 px)
    assert all(c.style.description_width == "initial" for c in controls.values())


def test_quickstart_panel_takes_every_notebook_parameter_and_refuses_others():
    """Notebook 00's panel gets GPU, EP and SEQ_LEN from the parameters cell: the plan it shows is the plan of those
    settings, and its caption names model, GPU, GPU count, pp/ep/dp, sequence and schedule."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.ui.widgets import plan_summary, quickstart_panel, replan

    _, controls, state = quickstart_panel("qwen3-next-80b-a3b", gpu="H100", pp=8, ep=32, microbatches=16,
                                          seq_len=8192)
    want = plan_summary(replan(gpu="H100", pp=8, ep=32, microbatches=16, seq_len=8192))
    assert state["summary"] == want
    cap = state["caption"]
    for part in ("simulated, costs analytic (cost model ", "qwen3-next-80b-a3b", "256 H100", "pp 8 x ep 32 x dp 1", "sequence 8192", "schedule overlapped",
                 "re-planned in"):
        assert part in cap, (part, cap)
    assert "256 H100" in state["table_html"] and "bound by" in state["table_html"]
    controls["pp"].value = 16  # the GPU count follows pp
    assert "512 H100" in state["caption"]
    with pytest.raises(ConfigError, match="GPU unknown; allowed: gpu, pp, ep"):
        quickstart_panel(GPU="H100")


def test_notebook_00_passes_every_parameter_to_its_panel():
    import re
    from pathlib import Path

    src = (Path(__file__).resolve().parents[1] / "notebooks" / "00_quickstart.py").read_text()
    cells = src.split("# %%")
    params = [c for c in cells if 'tags=["parameters"]' in c][0]
    panel_cell = [c for c in cells if 'tags=["panel"]' in c][0]
    names = [n for line in params.splitlines() if not line.startswith("#")
             for n in re.findall(r"\b([A-Z][A-Z_]+)\b", line.split("=")[0])]
    assert {"MODEL", "GPU", "PP", "EP", "MICROBATCHES", "SEQ_LEN"} <= set(names)
    for n in names:
        assert re.search(rf"\b{n}\b", panel_cell), f"parameter {n} does not reach the panel"


def test_quickstart_model_dropdown_lists_the_shipped_models_and_shows_the_knobs_that_apply():
    from tessera_lab.model.spec import shipped_models
    from tessera_lab.ui.widgets import quickstart_panel

    _, controls, state = quickstart_panel(pp=4, microbatches=4)
    assert list(controls["model"].options) == sorted(shipped_models())
    shown = lambda: {n for n, c in controls.items() if c.layout.display != "none"}  # noqa: E731
    assert {"attention_ratio", "expert_width", "top_k"} <= shown()  # Qwen3-Next: hybrid and MoE
    controls["model"].value = "qwen3-30b-a3b"  # MoE, full attention only
    assert "attention_ratio" not in shown() and {"expert_width", "top_k"} <= shown()
    assert controls["expert_width"].value == 768 and controls["top_k"].value == 8
    assert "qwen3-30b-a3b" in state["caption"]
    controls["model"].value = "qwen3-8b"  # dense: no expert knobs, ep 1
    assert not {"attention_ratio", "expert_width", "top_k"} & shown() and controls["ep"].value == 1


def test_partition_panel_matches_pure_function():
    from tessera_lab.ui.widgets import compare_partitions, partition_panel

    panel, controls, state = partition_panel(pp=4, microbatches=8)
    controls["attention_ratio"].value = 1
    _, table = compare_partitions(attention_ratio=1, expert_width=512, top_k=10, pp=4, microbatches=8)
    assert state["table"].equals(table)
    # the overlap-aware plan is never slower than the uniform one here
    assert (table["overlap-aware speed-up over this row"] >= 1 - 1e-9).all()


def test_partition_panel_model_choice():
    """Notebook 06's model choice: each hybrid re-plans at its own layout; a knob a model lacks is not
    offered (only its "config" value, hidden)."""
    from tessera_lab.ui.widgets import MODEL_LAYOUTS, compare_partitions, partition_panel

    assert {"qwen3-next-80b-a3b", "kimi-linear-48b-a3b", "minimax-m1", "nemotron-h-56b",
            "jamba-1.5-mini"} <= set(MODEL_LAYOUTS)
    panel, controls, state = partition_panel(microbatches=8)
    controls["model"].value = "kimi-linear-48b-a3b"
    plan, table = compare_partitions("kimi-linear-48b-a3b", microbatches=8)
    assert state["table"].equals(table) and plan.parallel.pp == MODEL_LAYOUTS["kimi-linear-48b-a3b"][0]
    controls["model"].value = "nemotron-h-56b"
    assert state["plan"].model.family == "nemotron_h"
    assert [v for _, v in controls["expert_width"].options] == ["config"]  # Nemotron-H is dense
    assert controls["expert_width"].layout.display == "none" and "error" not in state


def _ink(png: bytes) -> float:
    import io

    from PIL import Image

    hist = Image.open(io.BytesIO(png)).convert("L").histogram()
    return sum(hist[:235]) / sum(hist)


def test_panels_draw_a_png_figure_and_an_html_table():
    """Every panel renders into an ipywidgets.Image (PNG bytes from Agg) and an HTML table; no Output widget."""
    import ipywidgets as w

    from tessera_lab.teach.panels import bubble_panel, overlap_panel

    for make in (lambda: bubble_panel(), lambda: overlap_panel(budget=50)):
        box, controls, state = make()
        assert state["png"][:8] == b"\x89PNG\r\n\x1a\n" and _ink(state["png"]) > 0.01
        assert "<table" in state["table_html"] and "settings:" in state["table_html"]
        assert not [c for c in box.children if isinstance(c, w.Output)]
        image = [c for c in box.children if isinstance(c, w.Image)][0]
        before = state["png"]
        first = next(iter(controls.values()))
        opts = getattr(first, "options", None)
        first.value = opts[-1] if opts and first.value != opts[-1] else (opts[0] if opts else first.value + 1)
        assert image.value == state["png"] != before


def test_overlap_panel_model_choice():
    """Notebook 05's model choice: the pair of each hybrid's first MoE layer; a dense model says so."""
    from tessera_lab.model.spec import load_model
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.overlap.table import overlap_point
    from tessera_lab.teach.panels import overlap_panel

    _, controls, state = overlap_panel(ep=16, budget=50, models=("kimi-linear-48b-a3b", "nemotron-h-56b"))
    controls["model"].value = "kimi-linear-48b-a3b"
    want = overlap_point(load_model("kimi-linear-48b-a3b"), ParallelConfig(ep=16, pp=1), expert_width=512, top_k=10,
                         budget=50)
    assert state["result"] == want
    controls["model"].value = "nemotron-h-56b"
    assert "dense" in state["error"]


def test_bubble_panel_reports_a_schedule_it_cannot_run():
    from tessera_lab.pipeline.simulate import compare_with_closed_form
    from tessera_lab.teach.panels import bubble_panel

    _, controls, state = bubble_panel("1f1b", pp=4, microbatches=8)
    assert state["result"]["simulated"] == compare_with_closed_form("1f1b", 4, 8, 1.0, 2.0, 1.0, 2.6)["simulated"]
    controls["schedule"].value = "dualpipev"
    controls["m"].value = 1
    assert "error" in state and state["png"]  # the reason, drawn as a figure too: never a blank picture
    assert "chunks v applies to the interleaved schedule only" not in " ".join(state.get("notes", []))


def test_quickstart_table_marks_partitions_that_do_not_fit():
    from tessera_lab.ui.widgets import plan_notes, replan, summary_table

    plan = replan(expert_width=2048, pp=12, microbatches=34)
    table = summary_table(plan)
    assert list(table.columns) == ["iteration (s)", "tokens/s (M)", "tokens/s per GPU", "MFU (%)", "bubble fraction",
                                   "slowest stage (ms)", "layers per stage", "fits memory"]
    row = table.loc["overlap-aware (ilp)"]
    assert row["tokens/s per GPU"] == pytest.approx(row["tokens/s (M)"] * 1e6 / plan.parallel.world_size)
    for name, ev in [("overlap-aware (ilp)", plan.chosen), *plan.baselines.items()]:
        assert table.loc[name, "fits memory"] == ("yes" if ev.fits_memory else "NO")
        assert any(n.startswith(name + ": does not fit") for n in plan_notes(plan)) == (not ev.fits_memory)


def test_dynamic_panel_uses_the_headline_gain():
    from tessera_lab.report.headline import dynamic_api, dynamic_gain
    from tessera_lab.ui.dynamic_panel import dynamic_panel

    StageCosts, run_dynamic = dynamic_api()
    costs = StageCosts.synthetic(4, 1.0, 2.0, 1.0, expert_fraction=0.5, layers_per_stage=2, ep=4,
                                     num_experts=16, top_k=2, tokens=4 * 256)
    _, controls, state = dynamic_panel(costs, ep=4, microbatches=8, skew=1.0)
    r = state["result"]
    assert dynamic_gain(r) == pytest.approx(r.throughput_gain)
    controls["skew"].value = 0.0
    assert state["result"].throughput_gain == run_dynamic(costs, "zipf:0.0", schedule="1f1b", microbatches=8,
                                                                seed=0).throughput_gain


def test_panel_says_computing_while_compute_runs_and_clears_it_after():
    """The status line reads "computing" (with the new settings) during ``compute`` and no longer after it."""
    import ipywidgets as w

    from tessera_lab.ui.panel import View, panel

    seen = []
    controls = {"x": w.IntSlider(value=1, min=0, max=5, description="x")}

    def compute(v):
        seen.append(box.children[1].value if seen else None)  # the status line (row 0 holds the controls)
        return v["x"]

    box = None
    box, controls, state = panel(controls, compute, lambda r: View(f"x = {r}"))
    controls["x"].value = 3
    assert "computing" in seen[-1] and "x 3" in seen[-1]
    assert "computing" not in box.children[1].value and state["result"] == 3


# --------------------------------------------------------------------------- a fresh user's findings 14-16, 4
def test_bubble_table_rows_are_labelled_with_units_and_free_of_round_off():
    """03's table: every row a label with its unit (DualPipeV's published-formula row too), no raw keys, and a
    difference of two equal times reads 0 (interleaved at p = 1 simulates 1.9999999999999998 for 2.0 s)."""
    from tessera_lab.pipeline.simulate import compare_with_closed_form
    from tessera_lab.teach.panels import bubble_table

    table = bubble_table(compare_with_closed_form("dualpipev", 4, 8, 1.0, 2.0, 1.0, 2.6))
    assert "published_bubble" not in " ".join(table.index) and "_" not in " ".join(table.index)
    assert all(("(s)" in label) or ("share" in label) or ("/" in label) for label in table.index)
    # DualPipe README: bubble (PP/2 - 1)(F&B + B - 3W) = 3 (2.6 + 2 - 3) = 4.8 s with PP = 2p = 8
    row = table.loc["bubble per rank vs DualPipe README (PP/2 - 1)(F&B + B - 3W), PP = 2p (s)"]
    assert row["closed form"] == pytest.approx(4.8) and row["difference"] == 0.0
    # interleaved, p = 1, m = 1, v = 2 chunks of F 0.3 + B 0.7 s: makespan v m (F + B) = 2 s, no bubble
    raw = compare_with_closed_form("interleaved", 1, 1, 0.3, 0.7, 0.1, 2.6, vpp=2)
    assert raw["rows"][0]["difference"] != 0.0  # the float round-off this table hides
    table = bubble_table(raw)
    assert table.loc["makespan (s)", "simulated"] == pytest.approx(2.0)
    assert (table["difference"] == 0.0).all() and table.loc["bubble per rank (s)", "simulated"] == 0.0


def test_panel_caption_items_never_break_inside():
    from tessera_lab.ui.panel import caption_html

    out = caption_html("settings: F (s) 1 · F&B (s) 2.6 · p2p (s) 0")
    assert out == "<span style='white-space: nowrap'>settings: F (s) 1 · F&amp;B (s) 2.6 · p2p (s) 0</span>"


def test_panel_caption_lines_are_balanced_and_never_leave_one_item_alone():
    """03's caption (117 characters) in two lines of 58 and 66 characters, broken between items only: the
    browser never wraps a line, so "p2p (s) 0" cannot end alone on a line."""
    from tessera_lab.ui.panel import CAPTION_SEP, caption_html, caption_lines

    text = ("settings: schedule dualpipev · ranks p 4 · micro-batches 8 · chunks v 2 · F (s) 1 · B (s) 2 · W (s) 1"
            " · F&B (s) 2.6 · p2p (s) 0")
    lines = [CAPTION_SEP.join(line) for line in caption_lines(text.split(CAPTION_SEP), 90)]
    assert lines == ["settings: schedule dualpipev · ranks p 4 · micro-batches 8",
                     "chunks v 2 · F (s) 1 · B (s) 2 · W (s) 1 · F&B (s) 2.6 · p2p (s) 0"]
    assert caption_html(text).count("<br>") == 1 and caption_html(text).count("white-space: nowrap") == 2


@given(st.lists(st.text(alphabet="abc ()", min_size=1, max_size=12), min_size=1, max_size=30),
       st.integers(20, 120))
def test_caption_lines_keep_every_item_in_order(items, width):
    from tessera_lab.ui.panel import caption_lines

    lines = caption_lines(items, width)
    assert [i for line in lines for i in line] == items and all(lines)


def test_panel_numbers_use_thousands_separators_from_1000_up():
    """04's table mixed "26,892" with "3323": every number from 1,000 up now has separators."""
    from tessera_lab.ui.panel import _number

    assert [_number(x) for x in (26892.4, 3323.2, 999.5, 12.345, -1500.0)] == ["26,892", "3,323", "999.5", "12.35",
                                                                               "-1,500"]


def test_bubble_panel_notes_sliders_the_schedule_does_not_use():
    """W matters only where the backward is split (ZB-H1: makespan 27 s at W = 1 s, 30 s at 0.5 s, p 4, m 8,
    F 1, B 2), F&B only where F and B overlap (overlapped, DualPipeV); the panel says which sliders do nothing."""
    from tessera_lab.pipeline.schedules import build_schedule
    from tessera_lab.teach.panels import bubble_panel, uses_fb, uses_w

    _, controls, state = bubble_panel("1f1b")
    assert any("W (s) and F&B (s) do not affect 1f1b" in n for n in state["notes"])
    controls["schedule"].value = "zb-h1"
    assert any("F&B (s) does not affect zb-h1" in n for n in state["notes"])
    assert not any("W (s)" in n and "not affect" in n for n in state["notes"])
    controls["schedule"].value = "dualpipev"
    assert not any("not affect" in n for n in state["notes"])
    assert any("PP = 2p = 8" in n for n in state["notes"])
    controls["schedule"].value = "overlapped"
    assert any("W (s) does not affect overlapped" in n for n in state["notes"])
    assert uses_w(build_schedule("zb-h2", 4, 8)) and not uses_fb(build_schedule("zb-h2", 4, 8))


def test_dynamic_panel_splits_the_gain_into_static_and_dynamic_parts():
    """07: as `simulate --dynamic` does, the static part is the gain of the same job under uniform routing and the
    dynamic part the rest; the two add up to the gain."""
    from tessera_lab.report.headline import dynamic_api, dynamic_gain
    from tessera_lab.ui.dynamic_panel import dynamic_panel

    StageCosts, run_dynamic = dynamic_api()
    costs = StageCosts.synthetic(4, 1.0, 2.0, 1.0, expert_fraction=0.5, layers_per_stage=2, ep=4,
                                 num_experts=16, top_k=2, tokens=4 * 256)
    _, controls, state = dynamic_panel(costs, ep=4, microbatches=8, skew=1.5)
    uni = run_dynamic(costs, "uniform", schedule="1f1b", microbatches=8, seed=0)
    html = state["table_html"]
    assert "static part" in html and "dynamic part" in html
    r = state["result"]
    static_part = dynamic_gain(uni)
    from tessera_lab.ui.dynamic_panel import dynamic_summary

    t = dynamic_summary(r, uni)
    assert t["gain, static part (the same without skew)"] == pytest.approx(static_part)
    assert t["gain, static part (the same without skew)"] + t["gain, dynamic part (from reacting to the skew)"] == \
        pytest.approx(t["throughput gain"])


def test_dynamic_panel_table_is_the_jobs_and_titles_follow_the_choice():
    """07: with 2 EP groups the table's iteration is the slowest group's (the cell above prints it) and says so;
    the Gantt title never says "W moved" when the choice is static."""
    from tessera_lab.report.headline import dynamic_api
    from tessera_lab.ui.dynamic_panel import dynamic_panel, dynamic_summary, dynamic_titles

    StageCosts, run_dynamic = dynamic_api()
    costs = StageCosts.synthetic(4, 1.0, 2.0, 1.0, expert_fraction=0.5, layers_per_stage=2, ep=4,
                                 num_experts=16, top_k=2, tokens=4 * 256)
    _, _, state = dynamic_panel(costs, ep=4, microbatches=8, skew=1.0, groups=2)
    r = state["result"]
    ref = run_dynamic(costs, "zipf:1.0", schedule="1f1b", microbatches=8, seed=0, groups=2)
    table = dynamic_summary(r)
    assert table["static iteration (s), job of 2 EP groups"] == max(g.static.iteration_time for g in ref.groups)
    assert {"choice (EP group 0)", "choice (EP group 1)"} <= set(table)
    assert any("figures: EP group 0" in n for n in state["info"])
    assert "moved" not in dynamic_titles("static")[1] and "moved" in dynamic_titles("fill")[1]


def test_diff_summary_table_shows_shares_in_percent_and_whole_tokens():
    from tessera_lab.ui.tables import diff_summary_rows

    rows = [{"metric": "MFU", "a": 0.2099, "b": 0.2, "change": 0.2 - 0.2099, "unit": ""},
            {"metric": "tokens per second", "a": 500000.0, "b": 503667.3456, "change": 3667.3456, "unit": "tokens/s"},
            {"metric": "costs", "a": "analytic", "b": "analytic", "change": None, "unit": ""}]
    out = diff_summary_rows(rows, ("a", "b"))
    assert out[0] == {"metric": "MFU", "a": "21.0", "b": "20.0", "change": "-1.0 pp", "unit": "%"}
    assert out[1]["change"] == "+3,667" and out[1]["b"] == "503,667" and out[1]["unit"] == "tokens/s"
    assert out[2]["a"] == "analytic" and out[2]["change"] == ""


def test_rank_load_title_fits_inside_the_figure():
    """07's side plot (1.2 of 4.2 of a 13-inch figure): its title is wrapped, never cut by the figure edge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tessera_lab.ui.plots import rank_load_bars

    fig, axes = plt.subplots(1, 2, figsize=(13, 3.0), layout="constrained", gridspec_kw={"width_ratios": [3, 1.2]})
    ax = rank_load_bars([[1, 2, 3, 10, 1, 1, 1, 1]], ax=axes[1])
    fig.canvas.draw()
    box, edge = ax.title.get_window_extent(fig.canvas.get_renderer()), fig.bbox
    assert edge.x0 <= box.x0 and box.x1 <= edge.x1 and box.y1 <= edge.y1
    assert "4.00" in ax.get_title() and "min-max" in ax.get_title()  # 10 / mean 2.5; words are never split
    plt.close(fig)


def test_moe_panel_names_no_link_at_ep_1():
    from tessera_lab.teach.moe import moe_all_to_all
    from tessera_lab.teach.panels import moe_panel

    one = moe_all_to_all("qwen3-30b-a3b", ep=1, skew=1.0)
    assert one.link == "none" and one.time_s == 0.0 and one.summary()["dispatch per rank, mean (MiB)"] == 0.0
    assert moe_all_to_all("qwen3-30b-a3b", ep=8, skew=1.0).link == "NVLink"
    _, controls, state = moe_panel(ep=8, show_figure=False)
    controls["ep"].value = 1
    assert "NVLink" not in state["table_html"] and ">none<" in state["table_html"]


def test_memory_note_uses_the_planners_gib_figures():
    from types import SimpleNamespace

    from tessera_lab.report.headline import memory_note

    ev = SimpleNamespace(fits_memory=False, stages=[SimpleNamespace(index=0, memory_bytes=162.6 * 2**30)])
    note = memory_note("uniform", ev, 134.4013671875 * 2**30)
    assert "stage 0 needs 162.60 GiB, 28.20 GiB more than the 134.40 GiB available" in note
    # virtual stages: a rank's chunks together are what must fit; each chunk alone is under the limit
    chunks = [SimpleNamespace(index=s, memory_bytes=m * 2**30) for s, m in enumerate((70.0, 74.2, 60.0, 74.2))]
    ev = SimpleNamespace(fits_memory=False, stages=chunks,
                         partition=SimpleNamespace(rank_memory=[130.0 * 2**30, 148.4 * 2**30]))
    note = memory_note("uniform", ev, 134.4013671875 * 2**30)
    assert "pipeline rank 1 needs 148.40 GiB over its 2 chunks, 14.00 GiB more than the 134.40 GiB available" in note


def test_plan_notes_carry_the_mfu_validity_note():
    """The panels' MFU check is :func:`~tessera_lab.report.headline.mfu_note` of the chosen plan (one source), and
    where the published MoE band is in, a plan at 31% MFU (one grouped expert GEMM kernel) is flagged."""
    import tessera_lab.report.headline as H
    from tessera_lab.ui.widgets import plan_notes, replan

    plan = replan(pp=8, microbatches=8)
    flag = H.mfu_note(plan.chosen.mfu, moe=True)
    assert (flag in plan_notes(plan)) if flag else not any("MFU" in n for n in plan_notes(plan))
    assert H.mfu_note(0.31, moe=True) and "published" in H.mfu_note(0.31, moe=True)


def test_partition_panel_dropdowns_show_a_selection():
    """ipywidgets shows a None-valued option as an empty dropdown: every control of notebook 06's panel starts on a
    visible option ("config" / "model's layout" for the model's own values) and the plan is the model's own."""
    from tessera_lab.ui.widgets import MODEL_LAYOUTS, partition_panel

    panel, controls, state = partition_panel(microbatches=8)
    for name, c in controls.items():
        if hasattr(c, "options"):
            assert c.index is not None and c.index >= 0, name
    assert state["plan"].parallel.pp == MODEL_LAYOUTS["qwen3-next-80b-a3b"][0]
    assert state["plan"].model.moe.moe_intermediate_size == 512  # Qwen3-Next's own expert width ("config")


def test_quickstart_panel_restores_ep_after_a_dense_model():
    from tessera_lab.ui.widgets import quickstart_panel

    panel, controls, state = quickstart_panel("qwen3-next-80b-a3b", ep=8, microbatches=8)
    controls["model"].value = "qwen3-8b"  # dense: ep 1
    assert controls["ep"].value == 1
    controls["model"].value = "jamba-1.5-mini"  # MoE again: the EP it started with
    assert controls["ep"].value == 8


def test_partition_panel_knob_options_follow_the_model():
    """Notebook 06: "config (V)" names the model's own value V, and V is not offered again (choosing it would
    re-plan the same model); a value kept across a model change stays selected."""
    from tessera_lab.ui.widgets import partition_panel

    panel, controls, state = partition_panel(microbatches=8)
    assert controls["expert_width"].options[0] == ("config (512)", "config")  # Qwen3-Next's experts
    controls["model"].value = "kimi-linear-48b-a3b"
    opts = controls["expert_width"].options
    assert opts[0] == ("config (1024)", "config") and 1024 not in [v for _, v in opts[1:]] and 512 in dict(opts).values()
    controls["expert_width"].value = 2048
    assert state["plan"].model.moe.moe_intermediate_size == 2048


def test_panel_captions_say_simulated_and_name_cost_source_gpu_and_ep():
    """05's caption names what its figures are (simulated), the cost source, the GPU the analytic model prices on
    (cluster_for's default, H200) and EP, not only the controls; 06's (plan_caption) the same from its plan."""
    from tessera_lab.cost.source import analytic_source
    from tessera_lab.teach.panels import overlap_panel
    from tessera_lab.ui.widgets import plan_caption, replan

    _, _, state = overlap_panel("minimax-m1", ep=16, expert_width=256, budget=50)
    html = state["table_html"]
    for part in ("simulated, costs " + analytic_source().describe(), "GPU H200", "EP 16", "expert width 256"):
        assert part in html, (part, html)
    cap = plan_caption(replan(pp=8, microbatches=8))
    assert cap.startswith("simulated, costs " + analytic_source().describe()) and "H200 GPUs" in cap and "ep 8" in cap


def test_bottleneck_line_names_the_host_sync_term_where_it_is_the_largest():
    """The panels' bottleneck line counts the host/sync term as `plan`'s bound line does: the default plan's slowest
    stage carries more host/sync seconds than any task kind (stage 0: 30 ms against its kinds' at most 20 ms), so it
    comes first; with the term off it is absent."""
    from tessera_lab.cost.bounds import layers_bounds
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import make_plan
    from tessera_lab.ui.widgets import bottleneck_bounds

    model = load_model("qwen3-next-80b-a3b")
    plan = make_plan(model)
    stages = plan.chosen.stages
    s = max(range(len(stages)), key=lambda i: stages[i].time_s)
    kinds = layers_bounds(model, plan.parallel, plan.cluster, stages[s].layers, first=s == 0,
                          last=s == len(stages) - 1)
    assert stages[s].host_sync_s > max(k.time_s for k in kinds)
    assert bottleneck_bounds(plan).startswith(f"bottleneck stage {s} is bound by: host/sync")
    assert "host/sync" not in bottleneck_bounds(make_plan(model, ParallelConfig(host_sync_s=0.0)))
    # one source for both: `plan`'s bound line lists the same stage and the host/sync term first among its terms
    from tessera_lab.cli.plan import _bound_lines

    line = _bound_lines(plan)[0]
    assert line.startswith(f"bound: stage {s} ") and line.split("): ", 1)[1].startswith(
        f"host/sync {stages[s].host_sync_s * 1e3:.1f} ms")


def test_mfu_band_not_applied_to_a_model_of_another_scale():
    """A miniature model (tiny-runner, 60,872 parameters, of the Qwen3-Next family) gets no published band: the
    smallest model with a published run has 30.5 B (Qwen3-30B-A3B, computed from its config); the real family
    member keeps its band."""
    from tessera_lab.model.spec import load_model
    from tessera_lab.report.headline import mfu_text, published_mfu_band

    tiny = published_mfu_band("tiny-runner")
    assert not tiny["bands"] and tiny["scale"].startswith("60,872 parameters, under 0.1 x")
    assert "qwen3-30b-a3b, 30.5 B" in tiny["scale"]
    assert "no published band at this scale" in mfu_text(0.02, model=load_model("tiny-runner"))
    assert published_mfu_band("qwen3-next-80b-a3b")["bands"]


def test_mfu_above_every_published_moe_run_is_flagged_without_a_band():
    """A family with no band of its own (Kimi-Linear) is flagged above the highest published MoE run's MFU, as a
    banded family is above its band; below it, nothing."""
    from tessera_lab.model.spec import load_model
    from tessera_lab.report.headline import highest_published_mfu, mfu_note, published_mfu_band

    kimi = load_model("kimi-linear-48b-a3b")
    top = highest_published_mfu()["mfu"]
    assert not published_mfu_band(kimi)["bands"]
    assert mfu_note(top * 1.1, moe=True, model=kimi).startswith(f"MFU {top * 1.1:.1%} is above every published MoE")
    assert mfu_note(top * 0.9, moe=True, model=kimi) is None


def test_a_failed_action_keeps_the_panels_reason():
    """A panel that cannot compute shows why in its status line; an action (the suggest button) that fails too
    says so on its own line and leaves that reason in place (the figure points at it)."""
    import ipywidgets as w

    from tessera_lab.errors import ConfigError
    from tessera_lab.ui.panel import Action, View, panel

    def compute(v):
        raise ConfigError("field 'x' = 0 is out of range; allowed: 1")

    def run(_v):
        raise ConfigError("no layout fits")

    box, controls, state = panel({"x": w.IntSlider(value=0)}, compute, lambda r: View(), error_prefix="cannot plan",
                                 actions=[Action("suggest", run)])
    status = box.children[-3]
    assert "cannot plan" in status.value and "out of range" in status.value
    button, line = box.children[1].children
    button.click()
    assert "cannot plan" in status.value and "out of range" in status.value
    assert "no layout fits" in line.value


def test_quickstart_panel_says_the_gpu_count_and_mfu_as_information():
    """The GPU count moves with ep (64 -> 128 at pp 8): the panel says it beside the table, with the MFU line, as
    information (no warning sign)."""
    from tessera_lab.ui.widgets import quickstart_panel

    _, controls, state = quickstart_panel()
    assert state["info"][0] == "64 GPUs (pp 8 x ep 8 x dp 1)" and state["info"][1].startswith("MFU of the chosen plan")
    controls["ep"].value = 16
    assert state["info"][0] == "128 GPUs (pp 8 x ep 16 x dp 1)"


def test_planning_panels_simulate_plans_default_schedule():
    """The panels plan with the schedule `plan` picks without --schedule: overlapped 1F1B only where the EP
    all-to-all exists (MoE layers and EP > 1), 1F1B for a dense model or EP 1 (Megatron-Core refuses its EP overlap
    there)."""
    from tessera_lab.model.spec import load_model
    from tessera_lab.ui.suggest import panel_schedule
    from tessera_lab.ui.widgets import replan

    assert panel_schedule(load_model("qwen3-next-80b-a3b"), 8) == "overlapped"
    assert panel_schedule(load_model("qwen3-next-80b-a3b"), 1) == "1f1b"
    assert panel_schedule(load_model("nemotron-h-56b"), 1) == "1f1b"
    assert panel_schedule(load_model("qwen3-8b"), 8) == "1f1b"
    # Megatron-Core refuses its EP overlap with full recompute or the moe recompute module: plan's default rule
    assert panel_schedule(load_model("qwen3-next-80b-a3b"), 8, "full") == "1f1b"
    assert panel_schedule(load_model("qwen3-next-80b-a3b"), 8, "selective", ("moe",)) == "1f1b"
    assert panel_schedule(load_model("qwen3-next-80b-a3b"), 8, "selective", ("core_attn", "moe_act")) == "overlapped"
    assert replan("qwen3-8b", pp=4, ep=1).parallel.schedule == "1f1b"
    assert replan("qwen3-next-80b-a3b", pp=8, ep=8, recompute="full").parallel.schedule == "1f1b"
