"""Every notebook runs top to bottom headless under its small parameters, and matches its generator script."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
ALL = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_executes(path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells), "a tagged parameters cell"
    t0 = time.perf_counter()
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), "at least one figure"
    print(f"{path.name}: {time.perf_counter() - t0:.1f} s")


@pytest.mark.parametrize("path", ALL, ids=[p.stem for p in ALL])
def test_notebook_matches_generator(path, tmp_path):
    """notebooks/_build_NN.py regenerates the committed notebook (code and markdown unchanged)."""
    nbformat = pytest.importorskip("nbformat")
    script = NOTEBOOKS / f"_build_{path.name[:2]}.py"
    if not script.exists():
        pytest.skip("no generator")
    committed = [(c.cell_type, c.source) for c in nbformat.read(path, as_version=4).cells]
    copy = tmp_path / script.name
    copy.write_text(script.read_text())
    subprocess.run([sys.executable, str(copy)], check=True, capture_output=True, cwd=tmp_path)
    regenerated = [(c.cell_type, c.source) for c in nbformat.read(tmp_path / path.name, as_version=4).cells]
    assert regenerated == committed
