"""Widget panels: callbacks are thin over pure functions; setting widget values re-plans."""

from __future__ import annotations

import pytest

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


def test_partition_panel_matches_pure_function():
    from tessera_lab.ui.widgets import compare_partitions, partition_panel

    panel, controls, state = partition_panel(pp=4, microbatches=8)
    controls["attention_ratio"].value = 1
    _, table = compare_partitions(attention_ratio=1, expert_width=512, top_k=10, pp=4, microbatches=8)
    assert state["table"].equals(table)
    # the overlap-aware plan is never slower than the uniform one here
    assert (table["overlap-aware speed-up"] >= 1 - 1e-9).all()


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
    assert list(table.columns) == ["iteration (s)", "tokens/s (M)", "MFU", "bubble fraction", "slowest stage (ms)",
                                   "layers per stage", "fits memory"]
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
