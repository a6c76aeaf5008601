"""Every notebook runs top to bottom headless under its small parameters, ships with its outputs, and matches its
jupytext source (``notebooks/NN_name.py``; regenerate with ``python notebooks/regenerate.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALL = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.notebook
@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_executes(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells), "a tagged parameters cell"
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "at least one figure"


def test_every_notebook_has_a_jupytext_source():
    """Each notebook is paired with its percent-format script (the source to edit), and no stray scripts."""
    assert ALL
    assert sorted(p.stem for p in ALL) == sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    assert not list(NOTEBOOKS.glob("_build_*.py")), "notebooks are built from their jupytext scripts now"


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_in_sync_with_its_script(path):
    """NN_name.ipynb has the cells (type, source, tags) of NN_name.py; fix: python notebooks/regenerate.py NN."""
    pytest.importorskip("jupytext")
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import regenerate
    finally:
        sys.path.remove(str(NOTEBOOKS))
    assert regenerate.out_of_sync(path.with_suffix(".py")) is None


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_ships_with_outputs(path):
    """Every notebook opens with its outputs (from its small parameters): each code cell ran, and there is a figure."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "a code cell without output: python notebooks/regenerate.py"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "at least one stored figure"
