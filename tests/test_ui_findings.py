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
