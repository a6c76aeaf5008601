"""The repository explains itself: code cites docs/ (no design document outside the repository), no work-log wording
("issue N", "turn N") in code or test names, and every repository path and module docs/*.md and README name exists."""

from __future__ import annotations

import ast
import glob
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "tessera_lab"
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
#: top-level folders whose paths docs may name
TOP = ("tessera_lab", "tests", "scripts", "benchmarks", "data", "notebooks")
PACKAGES = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists())
#: a repository path in prose: ``tessera_lab/...``, ``tests/...``, ...; or a package-relative module ``runner/x.py``
PATH_RE = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[A-Za-z0-9_./*-]*[A-Za-z0-9_*/])")
REL_RE = re.compile(r"(?<![\w/.-])((?:" + "|".join(PACKAGES) + r")/[a-z_/]+\.py)\b")
#: a dotted module (or module attribute) in backticks: ``tessera_lab.plan.make`` or ``plan.make.make_plan``
DOTTED_RE = re.compile(r"`((?:tessera_lab|" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
#: placeholders docs use for a file the user names (``data/devices/NAME.json``, ``notebooks/NN_name.py``)
PLACEHOLDER = re.compile(r"NAME|NN_name|my-machine")
#: a file name in backticks (``overlap.png``), not a module
FILE_NAME = re.compile(r"\.(png|svg|json|md|csv|py|ipynb|txt|html)$")
WORK_LOG = re.compile(r"\b[Ii]ssues? #?\d+|\bturn[- ]?\d+|\bturn\d")
OUTSIDE = re.compile(r"DESIGN(?:\.md| section| §)|shared/reference|\.\./shared")


def _defined_names(path: Path) -> set[str]:
    """Top-level functions, classes and assigned names of a module (what ``module.name`` may refer to)."""
    out: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def _module_path(dotted: str) -> Path | None:
    base = PKG.parent.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.exists():
            return p
    return None


def _dotted_exists(name: str) -> bool:
    """``name`` (with or without ``tessera_lab.``) is a module, or a module and a name defined in it (one level:
    ``module.Class.method`` checks the class)."""
    parts = name.split(".")
    if parts[0] != "tessera_lab":
        parts = ["tessera_lab"] + parts
    for i in range(len(parts), 1, -1):
        path = _module_path(".".join(parts[:i]))
        if path is not None:
            rest = parts[i:]
            return not rest or rest[0] in _defined_names(path)
    return False


def missing_references(text: str) -> list[str]:
    """Repository paths, package-relative module paths and dotted modules named in ``text`` that do not exist."""
    bad = []
    for m in PATH_RE.finditer(text):
        p = m.group(1).rstrip(".")
        if PLACEHOLDER.search(p):
            continue
        if not (glob.glob(str(ROOT / p)) if "*" in p else (ROOT / p).exists()):
            bad.append(p)
    bad += [m.group(1) for m in REL_RE.finditer(text) if not (PKG / m.group(1)).exists()]
    bad += [m.group(1) for m in DOTTED_RE.finditer(text)
            if not FILE_NAME.search(m.group(1)) and not _dotted_exists(m.group(1))]
    return bad


def test_every_path_and_module_named_in_the_docs_exists():
    bad = {d.name: missing_references(d.read_text()) for d in DOCS}
    assert not {k: v for k, v in bad.items() if v}


def test_the_reference_check_can_fail():
    text = ("see `tessera_lab/plan/make.py`, tessera_lab/plan/nope.py, runner/predict.py, `runner.predict`, "
            "`plan.make.make_plan`, `plan.make.no_such_name`, `overlap.png`, data/devices/NAME.json and tests/data/golden/*.json")
    assert missing_references(text) == ["tessera_lab/plan/nope.py", "runner/predict.py", "runner.predict",
                                        "plan.make.no_such_name"]


def test_code_cites_nothing_outside_the_repository():
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(PKG.rglob("*.py"))
           for i, line in enumerate(p.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not bad


def test_no_work_log_wording_in_code_or_test_names():
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in sorted(PKG.rglob("*.py"))
           for i, line in enumerate(p.read_text().splitlines(), 1) if WORK_LOG.search(line)]
    for p in sorted((ROOT / "tests").glob("*.py")):
        if WORK_LOG.search(p.name):
            bad.append(p.name)
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and WORK_LOG.search(node.name.replace("_", " ")):
                bad.append(f"{p.name}::{node.name}")
    assert not bad
    assert WORK_LOG.search("as issue 17 saw") and WORK_LOG.search("test every turn3 config")


def test_readme_is_short_and_its_quick_start_installs_what_it_opens():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    quick = text[text.index("## Quick start"):]
    quick = quick[: quick.index("\n## ", 1)]
    first_install = next(line for line in quick.splitlines() if "pip install" in line)
    assert "jupyter lab" in quick and ".[notebooks]" in first_install
