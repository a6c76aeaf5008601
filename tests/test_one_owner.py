"""One definition per concept, found by scanning every module of the package (not a list of directories):

* one pair makespan: only ``cost/lanes.py`` turns a :class:`Contention` into lane rates (``.slowdown(...)``,
  ``.comm_slowdown(...)``), and only it defines a function or class of the pair model's names;
* one FLOP counter: only ``model/flops.py`` turns shapes into FLOPs (no arithmetic bound to a ``flops`` name, a
  ``flops=`` keyword or a task's FLOP field anywhere else);
* one schedule registry: only ``pipeline/registry.py`` maps schedule names to builders.

Each rule is also run on a planted copy of the thing it forbids, so the test can fail."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "tessera_lab"


@functools.lru_cache(maxsize=1)
def _modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(PKG)): ast.parse(p.read_text()) for p in sorted(PKG.rglob("*.py"))}


# ---- one pair makespan -----------------------------------------------------------------------------------------

PAIR_OWNER = "cost/lanes.py"
PAIR_NAMES = ("two_lane", "pair_makespan", "streampair", "host_issue_makespan", "_host_issue", "_streams")


def _pair_model_signs(tree: ast.Module) -> list[str]:
    """Lines that compute pair-model lane rates or define a pair-model function (a wrapper that only calls
    :func:`pair_makespan` is allowed: ``host_issue_makespan`` fills in the CPU template's graph)."""
    signs = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("slowdown", "comm_slowdown")):
            signs.append(f"line {node.lineno}: lane rate {ast.unparse(node.func)}(...)")
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and any(n in node.name.lower() for n in PAIR_NAMES):
            calls = {getattr(c.func, "id", getattr(c.func, "attr", None)) for c in ast.walk(node)
                     if isinstance(c, ast.Call)}
            if "pair_makespan" not in calls:
                signs.append(f"line {node.lineno}: defines {node.name}")
    return signs


def test_one_pair_makespan():
    found = {m: s for m, tree in _modules().items() if m != PAIR_OWNER and (s := _pair_model_signs(tree))}
    assert not found, f"pair-makespan code outside {PAIR_OWNER}: {found}"
    assert _pair_model_signs(_modules()[PAIR_OWNER])  # the rule sees the owner's own code
    planted = ast.parse("def two_lane_makespan(order, d, lanes, deps, c):\n"
                        "    return 1.0 / (1.0 + c.slowdown('compute'))\n")
    assert len(_pair_model_signs(planted)) == 2
