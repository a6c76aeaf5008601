"""The planning panels (notebooks 00 and 06) offer only values the planner accepts for the chosen model, move an
out-of-range value when the model changes (and say so), and every caption states how long the change took."""

from __future__ import annotations

import html

import pytest

pytest.importorskip("ipywidgets")


def _planner_accepts(spec, pp: int, ep: int, gpu: str = "H200") -> str | None:
    """The planner's own validation (ParallelConfig, cluster size, check_parallel_for_model, stages <= layers):
    ``None`` or the error text."""
    from tessera_lab.errors import TesseraError
    from tessera_lab.model.hardware import ParallelConfig, check_fits, cluster_for
    from tessera_lab.plan.make import check_parallel_for_model

    try:
        parallel = ParallelConfig(pp=pp, ep=ep, microbatches=32)
        cluster = cluster_for(parallel, gpu)
        check_fits(parallel, cluster)
        check_parallel_for_model(spec, parallel, cluster)
    except TesseraError as exc:
        return str(exc)
    return None if pp <= spec.num_layers else f"pp {pp} > {spec.num_layers} layers"


def test_every_offered_option_passes_the_planners_validation_for_every_shipped_model():
    """Every (pp, ep) pair offered for each shipped model passes the planner's checks, and every EP size of the
    panel's list the planner accepts is offered (brute force over EP_CHOICES); knob values build a model."""
    from tessera_lab.model.spec import load_model, shipped_models
    from tessera_lab.ui.widgets import EP_CHOICES, GPU_CHOICES, control_options

    for name in shipped_models():
        spec = load_model(name)
        opts = control_options(spec)
        assert opts["pp"] and opts["ep"], name
        for gpu in GPU_CHOICES:
            for pp in opts["pp"]:
                for ep in opts["ep"]:
                    assert _planner_accepts(spec, pp, ep, gpu) is None, (name, gpu, pp, ep)
        accepted = [ep for ep in EP_CHOICES if _planner_accepts(spec, 1, ep) is None]
        assert opts["ep"] == (accepted if spec.has_moe else [1]), name
        if not spec.has_moe:
            assert opts["top_k"] == []
        for k in opts["top_k"]:
            spec.with_changes(num_experts_per_tok=k)
        for r in opts["attention_ratio"]:
            spec.with_changes(attention_ratio=r)
    scout = control_options(load_model("llama-4-scout-17b-16e"))
    assert scout["ep"] == [1, 2, 4, 8, 16]  # 16 routed experts: its divisors
    assert control_options(load_model("tiny-runner"))["pp"] == [1, 2, 4]  # 4 layers
    assert control_options(load_model("olmoe-1b-7b"))["top_k"] == list(range(1, 65))  # 64 routed experts


def test_quickstart_panel_moves_ep_the_new_model_cannot_take_and_says_so():
    from tessera_lab.ui.widgets import control_options, quickstart_panel
    from tessera_lab.model.spec import load_model

    _, controls, state = quickstart_panel("qwen3-next-80b-a3b", pp=8, ep=32, microbatches=8)
    assert 32 in controls["ep"].options
    controls["model"].value = "llama-4-scout-17b-16e"
    assert list(controls["ep"].options) == [1, 2, 4, 8, 16] and controls["ep"].value == 16
    assert "error" not in state, state.get("error")
    assert "ep 32 -> 16 (llama-4-scout-17b-16e has 16 routed experts)" in state["caption"]
    controls["pp"].value = 4  # a later change: plans, and the note of the model change is gone
    assert "error" not in state and "->" not in state["caption"]
    for name in ("tiny-runner", "qwen3-8b", "olmoe-1b-7b"):
        controls["model"].value = name
        opts = control_options(load_model(name))
        assert list(controls["ep"].options) == opts["ep"] and controls["ep"].value in opts["ep"], name
        assert list(controls["pp"].options) == opts["pp"] and controls["pp"].value in opts["pp"], name
        assert "must divide" not in state.get("error", ""), name
    controls["model"].value = "tiny-runner"
    assert controls["attention_ratio"].max == 3  # 4 layers: ratios 0-3 only


def test_both_planning_panels_state_the_time_of_the_last_change():
    from tessera_lab.ui.widgets import partition_panel, quickstart_panel

    for build in (lambda: quickstart_panel(pp=4, microbatches=4), lambda: partition_panel(microbatches=4)):
        _, controls, state = build()
        controls["microbatches"].value = 8
        assert state["seconds"] > 0 and state["cpu_seconds"] >= 0
        text = f"re-planned in {state['seconds']:.2f} s wall, {state['cpu_seconds']:.2f} s CPU"
        assert text in state["table_html"], state["table_html"]


def test_plan_caption_without_seconds_uses_make_plans_timing():
    from tessera_lab.ui.widgets import plan_caption, replan

    plan = replan(pp=4, microbatches=4)
    cap = plan_caption(plan)
    assert f"re-planned in {plan.timing['wall_s']:.2f} s wall, {plan.timing['cpu_s']:.2f} s CPU" in cap


def test_partition_panel_offers_no_knob_a_dense_model_lacks_and_says_what_it_moved():
    from tessera_lab.ui.widgets import partition_panel

    _, controls, state = partition_panel(microbatches=8)
    controls["expert_width"].value = 2048
    controls["model"].value = "nemotron-h-56b"  # no routed experts
    assert controls["expert_width"].options == (("config", "config"),)
    assert controls["top_k"].options == (("config", "config"),)
    assert controls["expert_width"].layout.display == "none"
    assert "error" not in state, state.get("error")
    assert "expert width 2048 -> config (not valid for nemotron-h-56b)" in html.unescape(state["table_html"])


def test_error_figure_caption_is_wrapped_inside_the_figure():
    """A long settings line under the error figure (7 in wide) stays inside it: every text's drawn extent lies
    within the figure's (measured with the Agg renderer after drawing)."""
    from tessera_lab.ui.panel import CAPTION_SEP, figure_png, message_figure

    caption = "settings: " + CAPTION_SEP.join(
        ["model llama-4-scout-17b-16e", "GPU H200", "pp 8", "ep 32", "micro-batches 32", "sequence 4096",
         "recompute none", "attn ratio 3", "expert width 4096", "top-k 1"])
    fig = message_figure("cannot plan: field 'ep' = 32 must divide num_experts = 16; allowed: 1, 2, 4, 8, 16")
    figure_png(fig, caption=caption)
    renderer = fig.canvas.get_renderer()
    for text in fig.texts:
        box = text.get_window_extent(renderer)
        assert box.x0 >= fig.bbox.x0 - 1 and box.x1 <= fig.bbox.x1 + 1, (text.get_text(), box, fig.bbox)
    assert any("expert width 4096" in t.get_text() for t in fig.texts)


def test_partition_panel_stage_options_pass_the_planners_validation_at_each_models_layout():
    """Notebook 06: every stage count offered for each of its models, at that model's EP and TP, passes the
    planner's checks (ParallelConfig, the cluster, check_parallel_for_model, stages <= layers)."""
    from tessera_lab.errors import TesseraError
    from tessera_lab.model.hardware import ParallelConfig, check_fits, cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import check_parallel_for_model
    from tessera_lab.ui.widgets import MODEL_LAYOUTS, partition_panel

    _, controls, _ = partition_panel(microbatches=16)
    for name, (_, ep, tp) in MODEL_LAYOUTS.items():
        spec = load_model(name)
        for pp in [v for _, v in controls["pp"].options if v != "layout"]:
            try:
                parallel = ParallelConfig(pp=pp, ep=ep, tp=tp, microbatches=32)
                check_fits(parallel, cluster_for(parallel))
                check_parallel_for_model(spec, parallel, cluster_for(parallel))
            except TesseraError as exc:
                raise AssertionError((name, pp, str(exc))) from exc
            assert pp <= spec.num_layers


def test_partition_panel_does_not_call_the_new_models_own_value_invalid():
    """top-k 8 on Qwen3-Next, then Kimi-Linear (whose own top-k is 8): the control shows "config (8)", the same
    value, and the caption says nothing was moved."""
    from tessera_lab.ui.widgets import partition_panel

    _, controls, state = partition_panel(microbatches=8)
    controls["top_k"].value = 8
    controls["model"].value = "kimi-linear-48b-a3b"
    assert controls["top_k"].value == "config" and controls["top_k"].options[0] == ("config (8)", "config")
    assert "error" not in state, state.get("error")
    assert "not valid for kimi-linear-48b-a3b" not in html.unescape(state["table_html"])


def test_partition_panel_starts_a_new_model_at_its_own_ratio():
    """Attention ratio 1 on Qwen3-Next (its own: 3), then Kimi-Linear (its own: 3): the ratio goes back to "config
    (3)" as notebook 00 does, and the caption names the reset (a kept 1 would plan kimi-linear[ratio=1] unasked)."""
    from tessera_lab.ui.widgets import partition_panel

    _, controls, state = partition_panel(microbatches=8)
    controls["attention_ratio"].value = 1
    controls["model"].value = "kimi-linear-48b-a3b"
    assert controls["attention_ratio"].value == "config"
    assert controls["attention_ratio"].options[0] == ("config (3)", "config")
    assert "error" not in state, state.get("error")
    text = html.unescape(state["table_html"])
    assert "attn ratio 1 -> config (3) (a new model starts at its own values)" in text
    assert "ratio=1" not in state["plan"].model.name
