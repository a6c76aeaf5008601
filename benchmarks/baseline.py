"""Side-by-side measurements against a baseline revision of the package, for the benchmarks' target tables.

:func:`baseline_tree` extracts ``tessera_lab/`` and ``data/`` of a git revision (default :data:`BASELINE_REV`, the
revision the performance targets were set against; CHANGELOG.md) into a temporary folder once;
:func:`run_code` runs a snippet of Python in a fresh interpreter on either tree and returns what it printed as JSON
plus the child's CPU seconds (user + sys, from ``getrusage(RUSAGE_CHILDREN)``) and wall seconds, so that the
baseline and the current code are measured in the same run on the same (busy, shared) machine. Provenance of every
figure: measured on this machine in this run.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the revision the performance targets were measured against
BASELINE_REV = "a5a8568"


def baseline_tree(rev: str = BASELINE_REV) -> Path:
    """A folder holding ``tessera_lab/`` and ``data/`` of ``rev`` (extracted with ``git archive`` once)."""
    out = Path(tempfile.gettempdir()) / f"tessera-lab-baseline-{rev}"
    if not (out / "tessera_lab" / "__init__.py").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "tessera_lab", "data"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


_COMPILED: set[Path] = set()


def byte_compile(tree: Path) -> None:
    """Byte-compile ``tree/tessera_lab`` once per benchmark run (``compileall``; not counted in any figure), so both
    trees are timed as a user's second run sees them. Without it a stale or missing ``.pyc`` is compiled again in
    every measured process wherever ``PYTHONDONTWRITEBYTECODE`` is set (this development VM sets it): tens of
    milliseconds of CPU per process that no installed copy pays."""
    tree = Path(tree).resolve()
    if tree not in _COMPILED:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "tessera_lab")], check=True,
                       capture_output=True)
        _COMPILED.add(tree)


def run_code(tree: Path, code: str, *, timeout: float = 600.0, argv: list[str] | None = None) -> dict:
    """Run ``code`` (or, with ``argv``, ``python ARGV``) with ``tree`` first on the path (byte-compiled first:
    :func:`byte_compile`); returns ``{"out": <its last stdout line as JSON, or None>, "cpu_s": child CPU seconds,
    "wall_s": wall seconds}``."""
    byte_compile(tree)
    env = dict(os.environ, PYTHONPATH=str(tree), TESSERA_LAB_DATA=str(tree / "data"))
    c0, w0 = _children_cpu(), time.perf_counter()
    res = subprocess.run([sys.executable] + (argv if argv is not None else ["-c", code]), cwd=str(tree), env=env,
                         capture_output=True, text=True, timeout=timeout)
    wall, cpu = time.perf_counter() - w0, _children_cpu() - c0
    if res.returncode != 0:
        raise RuntimeError(f"benchmark snippet failed on {tree}:\n{res.stderr[-2000:]}")
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    out = None
    if lines:
        try:
            out = json.loads(lines[-1])
        except json.JSONDecodeError:
            out = None
    return {"out": out, "cpu_s": cpu, "wall_s": wall}


def run_cli(tree: Path, args: list[str], *, timeout: float = 600.0) -> dict:
    """``python -m tessera_lab ARGS`` as a whole process on ``tree``: ``{"cpu_s", "wall_s"}`` (output discarded)."""
    return run_code(tree, "", timeout=timeout, argv=["-m", "tessera_lab"] + list(args))


def load() -> str:
    """The 1-minute load average, as text."""
    return f"{os.getloadavg()[0]:.2f}"


def target_row(what: str, target: str, base: float | None, now: float, unit: str, *, higher_is_better=False,
               extra: str = "") -> str:
    """One line of a target table: what, target, baseline figure, current figure, ratio baseline/current (or
    current/baseline where higher is better: a speed-up either way) and a free note."""
    if base is None:
        ratio = "n/a"
    else:
        r = (now / base) if higher_is_better else (base / now if now > 0 else float("inf"))
        ratio = f"{r:.1f}x"
    b = "n/a" if base is None else f"{base:,.3f}"
    return f"{what:<44} {target:<18} {b:>12} {now:>12,.3f} {unit:<10} {ratio:>7}  {extra}"


TABLE_HEAD = (f"{'measure':<44} {'target':<18} {'baseline':>12} {'now':>12} {'unit':<10} {'speedup':>7}  note")
