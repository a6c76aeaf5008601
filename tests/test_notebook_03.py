"""Execute notebooks/03_bubbles_and_microbatches.ipynb headless (small parameters)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "03_bubbles_and_microbatches.ipynb"


def test_notebook_03_runs_headless(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    from jupyter_client.kernelspec import NoSuchKernel

    nb = nbformat.read(NOTEBOOK, as_version=4)
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert "parameters" in first_code.metadata.get("tags", [])
    # the kernel process must import this checkout and draw without a display
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    try:
        client.execute()
    except NoSuchKernel:
        pytest.skip("no 'python3' Jupyter kernel installed")
    text = "\n".join(
        o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "closed form:" in text and "exact here:  True" in text
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # Gantt and micro-batch sweep
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)  # the panel


def test_notebook_is_generated_from_its_script():
    nbformat = pytest.importorskip("nbformat")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_build_03", ROOT / "notebooks" / "_build_03.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    on_disk = nbformat.read(NOTEBOOK, as_version=4)
    assert [c.source for c in on_disk.cells] == [c.source for c in mod.nb.cells]
