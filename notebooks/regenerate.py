"""Rebuild the notebooks from their jupytext sources and store their outputs.

Each notebook ``NN_name.ipynb`` is paired with the percent-format script ``NN_name.py`` (the source you edit and
review; jupytext's pairing is in both files' metadata, so JupyterLab with jupytext installed keeps them in step
while you work). This script, run from the repository root:

    python notebooks/regenerate.py               # every notebook: read NN_*.py, execute it, write NN_*.ipynb
    python notebooks/regenerate.py 00 06         # only these (by number or file name)
    python notebooks/regenerate.py --no-execute  # sources only (no outputs), seconds
    python notebooks/regenerate.py --check       # exit 1 when a notebook's cells differ from its script

Notebooks execute with the small defaults of their ``parameters`` cell, in ``notebooks/`` as the working
directory, with this checkout first on ``PYTHONPATH``; outputs (figures, tables, widget state) are stored. Writes
are atomic (temporary file, then rename). Exit status: 0 done, 1 out of sync (``--check``) or a notebook raised,
2 bad arguments.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def sources(names: list[str] | None = None) -> list[Path]:
    """The percent-format scripts ``NN_*.py`` (all, or those matching ``names``: ``"06"`` or a file name)."""
    found = sorted(HERE.glob("[0-9][0-9]_*.py"))
    if not names:
        return found
    out = []
    for name in names:
        hits = [p for p in found if p.stem == Path(name).stem or p.name[:2] == name]
        if not hits:
            raise SystemExit(f"regenerate: no notebook source matches {name!r}; allowed: "
                             f"{', '.join(p.name[:2] for p in found)}")
        out += hits
    return out


def cells_of(nb) -> list[tuple[str, str, tuple[str, ...]]]:
    """What must agree between a notebook and its script: cell type, source and tags, per cell."""
    return [(c.cell_type, c.source.strip(), tuple(c.get("metadata", {}).get("tags", []))) for c in nb.cells]


def out_of_sync(script: Path) -> str | None:
    """``None`` when ``script``'s notebook has the same cells, else one line saying what differs."""
    import jupytext
    import nbformat

    ipynb = script.with_suffix(".ipynb")
    if not ipynb.exists():
        return f"{ipynb.name} is missing"
    want = cells_of(jupytext.read(script))
    have = cells_of(nbformat.read(ipynb, as_version=4))
    if want == have:
        return None
    for i, (a, b) in enumerate(zip(want, have)):
        if a != b:
            return f"{ipynb.name}: cell {i} differs from {script.name}"
    return f"{ipynb.name}: {len(have)} cells, {script.name}: {len(want)}"


def build(script: Path, *, execute: bool = True, timeout_s: int = 600) -> float:
    """Write ``script``'s notebook (executed unless ``execute=False``); returns the seconds it took."""
    import jupytext
    import nbformat

    t0 = time.perf_counter()
    nb = jupytext.read(script)
    nb.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"})
    nb.metadata["jupytext"] = {"formats": "ipynb,py:percent"}
    if execute:
        from nbclient import NotebookClient

        env_path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + env_path if env_path else "")
        os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend, as in JupyterLab
        NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                       resources={"metadata": {"path": str(HERE)}}).execute()
    target = script.with_suffix(".ipynb")
    fd, tmp = tempfile.mkstemp(dir=HERE, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        nbformat.write(nb, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook numbers or file names (default: all)")
    ap.add_argument("--no-execute", action="store_true", help="write the notebooks without running them")
    ap.add_argument("--check", action="store_true", help="only check that notebooks match their scripts")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = ap.parse_args(argv)
    try:
        scripts = sources(args.names)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.check:
        problems = [p for p in (out_of_sync(s) for s in scripts) if p]
        for p in problems:
            print(f"out of sync: {p} (run: python notebooks/regenerate.py)")
        return 1 if problems else 0
    total = 0.0
    for s in scripts:
        try:
            dt = build(s, execute=not args.no_execute, timeout_s=args.timeout)
        except Exception as exc:  # a notebook raised: say which, keep the committed one
            print(f"{s.name}: FAILED: {type(exc).__name__}: {str(exc).splitlines()[-1] if str(exc) else ''}")
            return 1
        total += dt
        print(f"{s.with_suffix('.ipynb').name}: {dt:.1f} s")
    print(f"total {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
