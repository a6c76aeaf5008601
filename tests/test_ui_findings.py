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
