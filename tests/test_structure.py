"""Package structure: imports point down the data flow, no cycles (function-local imports count),
nothing below ``cli/`` imports ``cli/``, modules stay small, and the planning core imports no torch."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

#: import cycles still being broken; this list only ever shrinks
KNOWN_CYCLES: list[set[str]] = []
PKG = Path(__file__).resolve().parents[1] / "tessera_lab"
MAX_LINES = 600
#: modules still over MAX_LINES while they are being split; this list only ever shrinks
OVERSIZE_ALLOWED: set[str] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """tessera_lab modules ``name`` imports anywhere in its body (top level or inside functions)."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("tessera_lab"):
                found.add(t)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {n: {t for t in _imports(n, p, modules) if t != "tessera_lab"} for n, p in modules.items()}


def test_no_import_cycles():
    graph = _graph()
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    new = [c for c in cycles if set(c) not in KNOWN_CYCLES]
    assert not new, f"import cycles: {new}"
    gone = [sorted(k) for k in KNOWN_CYCLES if k not in [set(c) for c in cycles]]
    assert not gone, f"remove from KNOWN_CYCLES (broken now): {gone}"


ARCHITECTURE = PKG.parent / "docs" / "architecture.md"


def _documented_order() -> tuple[dict[str, int], set[str]]:
    """Package -> level along the data flow, and the top-level helper modules, both read from
    ``docs/architecture.md``: its first code block is the chain ``a ─► b / c ─► ...`` (peers joined by ``/`` share
    a level), and the sentence naming "the top-level helpers" lists them in backticks up to its full stop."""
    text = ARCHITECTURE.read_text()
    chain = text.split("```")[1].strip()
    levels = {name.strip(): i for i, group in enumerate(chain.split("─►")) for name in group.split("/")}
    sentence = text[text.index("top-level helpers"):]
    sentence = sentence[: sentence.index(". ")]
    helpers = set(re.findall(r"`([a-z_]+)`", sentence))
    return levels, helpers


def _arrows_against_the_order(graph: dict[str, set[str]]) -> list[str]:
    """Every import ``a -> b`` between two packages (or a helper and a package) that the documented order does not
    allow: ``b`` must sit strictly to the left of ``a`` (peers import neither way), helpers import only helpers, and
    every package and top-level module must be named in the document."""
    levels, helpers = _documented_order()
    top = {"tessera_lab.__main__": levels["cli"]}  # the ``python -m tessera_lab`` entry point sits with cli

    def where(module: str) -> tuple[str, int | None]:
        if module in top:
            return "cli", top[module]
        part = module.split(".")[1]
        if part in helpers:
            return part, -1
        return part, levels.get(part)

    bad = []
    for a, deps in sorted(graph.items()):
        if a == "tessera_lab":
            continue
        pa, la = where(a)
        if la is None:
            bad.append(f"{a}: package or module '{pa}' is not in docs/architecture.md")
            continue
        for b in sorted(deps):
            pb, lb = where(b)
            if pa == pb:
                continue
            if lb is None:
                bad.append(f"{b}: package or module '{pb}' is not in docs/architecture.md")
            elif not lb < la and not (la == -1 and lb == -1):
                bad.append(f"{a} -> {b}")
    return bad


def test_imports_follow_the_documented_order():
    """Every import in tessera_lab/ (function-local ones included) points to the left of the order in
    docs/architecture.md; no exception list."""
    bad = _arrows_against_the_order(_graph())
    assert not bad, f"imports against docs/architecture.md's order: {bad}"


def test_the_order_check_can_fail():
    """The check sees an upward arrow, an arrow between peers, and a helper importing a package."""
    graph = {"tessera_lab.report.capacity": {"tessera_lab.ui.plots"},
             "tessera_lab.runner.runtime.capacity": {"tessera_lab.report.capacity"},
             "tessera_lab.io": {"tessera_lab.model.spec"},
             "tessera_lab.plan.make": {"tessera_lab.model.spec", "tessera_lab.errors"}}
    assert _arrows_against_the_order(graph) == ["tessera_lab.io -> tessera_lab.model.spec",
                                                "tessera_lab.report.capacity -> tessera_lab.ui.plots",
                                                "tessera_lab.runner.runtime.capacity -> tessera_lab.report.capacity"]
    levels, helpers = _documented_order()
    assert levels["runner"] == levels["report"] and levels["model"] == 0 and levels["cli"] == max(levels.values())
    assert {"errors", "io", "paths", "samples"} <= helpers


def test_report_and_runner_stay_apart_and_report_imports_no_ui():
    graph = _graph()
    for a, deps in graph.items():
        for b in deps:
            pa, pb = a.split(".")[1:2], b.split(".")[1:2]
            assert not (pa == ["report"] and pb in (["ui"], ["runner"])), f"{a} -> {b}"
            assert not (pa == ["runner"] and pb == ["report"]), f"{a} -> {b}"


def test_nothing_below_cli_imports_cli():
    bad = {n: sorted(t for t in deps if t.startswith("tessera_lab.cli"))
           for n, deps in _graph().items() if not n.startswith("tessera_lab.cli") and n != "tessera_lab.__main__"}
    assert not {n: d for n, d in bad.items() if d}


def test_modules_are_small():
    sizes = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    over = {n: s for n, s in sizes.items() if s > MAX_LINES and n not in OVERSIZE_ALLOWED}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
    shrunk = {n for n in OVERSIZE_ALLOWED if sizes.get(n, 0) <= MAX_LINES}
    assert not shrunk, f"remove from OVERSIZE_ALLOWED (now small or gone): {sorted(shrunk)}"


MAX_FUNCTION_LINES = 120
MAX_PARAMETERS = 12


def _function_sizes(module: str, path: Path) -> dict[str, tuple[int, int]]:
    """``module.Qual.name -> (lines from the def line to the last line, parameters)`` of every function and method
    in ``path`` (nested ones included); ``self`` / ``cls`` of a method are not counted, ``*args`` and ``**kw`` are
    one each."""
    out: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.", True)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs] + [x for x in (a.vararg, a.kwarg) if x]
                if in_class and a.args and a.args[0].arg in ("self", "cls"):
                    params = params[1:]
                out[f"{prefix}{child.name}"] = (child.end_lineno - child.lineno + 1, len(params))
                visit(child, f"{prefix}{child.name}.", False)
            else:
                visit(child, prefix, in_class)

    visit(ast.parse(path.read_text()), f"{module}.", False)
    return out


def _oversize_functions() -> dict[str, tuple[int, int]]:
    sizes: dict[str, tuple[int, int]] = {}
    for name, path in _modules().items():
        sizes.update(_function_sizes(name, path))
    return {k: v for k, v in sizes.items() if v[0] > MAX_FUNCTION_LINES or v[1] > MAX_PARAMETERS}


def test_functions_are_readable():
    """No function in tessera_lab/ over 120 lines (def line to last line) or 12 parameters; no exception list."""
    over = _oversize_functions()
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines or {MAX_PARAMETERS} parameters: {over}"


READABLE_LINES = 80
READABLE_PARAMETERS = 10
#: the reason beside a long def: ``# long: <reason>``, ``# params: <reason>`` or ``# long, params: <reason>``
_REASON = re.compile(r"#\s*(long|params)(?:\s*,\s*(long|params))?\s*:\s*\S")


def _unexplained(module: str, path: Path) -> dict[str, tuple[int, int]]:
    """Functions in ``path`` over READABLE_LINES lines without ``# long: <reason>``, or over READABLE_PARAMETERS
    parameters without ``# params: <reason>``, on the def line or the line above it (above its decorators when it
    has any)."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines))
    where: dict[str, list[int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                where[f"{prefix}{child.name}"] = [child.lineno, child.lineno - 1, first - 1]
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, f"{module}.")
    out = {}
    for name, (n, params) in _function_sizes(module, path).items():
        need = {k for k, over in (("long", n > READABLE_LINES), ("params", params > READABLE_PARAMETERS)) if over}
        if not need:
            continue
        given = set()
        for ln in where[name]:
            if 1 <= ln <= len(lines) and (m := _REASON.search(lines[ln - 1])):
                given |= {g for g in m.groups() if g}
        if need - given:
            out[name] = (n, params)
    return out


def test_long_functions_say_why():
    """Every function in tessera_lab/ over 80 lines or 10 parameters carries its reason beside the def
    (``# long: ...`` / ``# params: ...``); the rest read as named phases or take grouped inputs."""
    found: dict[str, tuple[int, int]] = {}
    for name, path in _modules().items():
        found.update(_unexplained(name, path))
    over = found
    assert not over, (f"functions over {READABLE_LINES} lines or {READABLE_PARAMETERS} parameters with no "
                      f"'# long: <reason>' / '# params: <reason>' beside the def (lines, parameters): {over}")


def test_the_reason_check_can_fail(tmp_path):
    src = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    params = ", ".join(f"p{i}" for i in range(11))
    src.write_text(f"def bare():\n{body}\n\n"
                   f"# long: a table read top to bottom\ndef told():\n{body}\n\n"
                   f"def wide({params}):  # long: a table\n{body}\n\n"
                   f"def both({params}):  # long, params: mirrors a public signature\n{body}\n\n"
                   "class C:\n    @staticmethod\n    # params: as the API it wraps\n"
                   f"    def narrow({params}):\n        pass\n")
    assert _unexplained("pkg.m", src) == {"pkg.m.bare": (81, 0), "pkg.m.wide": (81, 11)}


def test_function_sizes_are_counted_as_stated(tmp_path):
    src = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(119))
    src.write_text("class C:\n    def m(self, a, *b, c, **d):\n        def inner():\n            pass\n\n"
                   f"def long(p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13):\n{body}\n    return x0\n")
    sizes = _function_sizes("pkg.m", src)
    assert sizes == {"pkg.m.C.m": (3, 4), "pkg.m.C.m.inner": (2, 0), "pkg.m.long": (121, 13)}


#: fields of a Hugging Face ``config.json`` that only a config reader looks up
HF_CONFIG_KEYS = frozenset({
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "num_experts_per_tok", "n_routed_experts",
    "moe_intermediate_size", "intermediate_size", "full_attention_interval", "layer_types", "linear_num_key_heads",
    "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim", "shared_expert_intermediate_size",
    "num_local_experts", "kv_lora_rank", "q_lora_rank", "first_k_dense_replace", "text_config",
})
#: the one reader of Hugging Face configs: ``model/`` (``spec.ModelSpec.from_hf_config`` and its family readers)
CONFIG_READER = "tessera_lab.model"


def _config_reads(source: str) -> list[str]:
    """Lines of ``source`` that read a Hugging Face config field: ``cfg["num_hidden_layers"]`` (a load, not a
    store) or ``cfg.get("num_hidden_layers", ...)`` / ``.pop`` / ``.setdefault``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args and isinstance(node.args[0], ast.Constant)):
            key = node.args[0].value
        if key in HF_CONFIG_KEYS:
            found.append(f"line {node.lineno}: {key}")
    return found


def test_one_config_reader():
    """Only ``model/`` reads Hugging Face config fields; everything else (the runner's tiny model included) builds
    on :class:`~tessera_lab.model.spec.ModelSpec`. Scans every module of the package."""
    found = {}
    for name, path in _modules().items():
        if name == CONFIG_READER or name.startswith(CONFIG_READER + "."):
            continue
        reads = _config_reads(path.read_text())
        if reads:
            found[name] = reads
    assert not found, f"Hugging Face config fields read outside {CONFIG_READER}: {found}"
    # the criterion sees the reader itself, and a second reader (a check that it can fail)
    assert _config_reads((PKG / "model" / "hf_families.py").read_text())
    assert _config_reads("def f(cfg):\n    return cfg.get('num_hidden_layers', 1) + cfg['num_attention_heads']\n") \
        == ["line 2: num_hidden_layers", "line 2: num_attention_heads"]
    assert not _config_reads("heads = {}\nheads['num_attention_heads'] = 4\n")


PLANNING = ["tessera_lab.model.spec", "tessera_lab.model.tasks", "tessera_lab.model.hardware", "tessera_lab.model.layout",
            "tessera_lab.cost.analytic", "tessera_lab.cost.memory", "tessera_lab.pipeline.schedules",
            "tessera_lab.pipeline.passes", "tessera_lab.pipeline.simulate", "tessera_lab.plan.make",
            "tessera_lab.plan.partition", "tessera_lab.plan.exports", "tessera_lab.report.capacity",
            "tessera_lab.cli.main"]


def test_planning_core_imports_no_torch():
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch' or name.startswith('torch.'):\n"
            "            raise ImportError('torch is blocked')\n"
            "sys.meta_path.insert(0, Block())\n"
            + "".join(f"import {m}\n" for m in PLANNING)
            + "from tessera_lab.cli.main import main\n"
            "assert main(['plan', '--json', '-']) == 0\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("mod", sorted(_modules()))
def test_every_module_has_a_docstring(mod):
    path = _modules()[mod]
    if path.name == "__main__.py":
        return
    assert ast.get_docstring(ast.parse(path.read_text())), f"{mod} has no module docstring"


# ----------------------------------------------------------------------------------------------
# the runner's jobs: runtime, launch, measure and the CPU testbed behind a fence
# ----------------------------------------------------------------------------------------------

RUNNER_PACKAGES = ("runtime", "launch", "measure", "testbed")


def test_runner_layout_shows_its_jobs():
    runner = PKG / "runner"
    loose = sorted(p.name for p in runner.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert loose == [], f"runner modules outside a job package: {loose}"
    assert sorted(p.name for p in runner.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(RUNNER_PACKAGES)


def test_no_runtime_module_imports_the_cpu_testbed():
    """The fence: nothing the runtime runs imports the CPU testbed, directly or through another module."""
    graph = _graph()
    runtime = [n for n in graph if n.startswith("tessera_lab.runner.runtime")]
    for start in runtime:
        seen, todo = set(), [start]
        while todo:
            n = todo.pop()
            for t in graph.get(n, ()):
                assert not t.startswith("tessera_lab.runner.testbed"), f"{start} reaches {t} (via {n})"
                if t not in seen and t.startswith("tessera_lab.runner.runtime"):
                    seen.add(t)
                    todo.append(t)


def test_everything_the_cpu_testbed_prints_says_so():
    """Every print of a testbed module with literal text, and every format_* text it builds, says CPU testbed."""
    for path in sorted((PKG / "runner" / "testbed").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and node.args:
                arg = node.args[0]
                if isinstance(arg, (ast.Constant, ast.JoinedStr)):
                    assert "CPU testbed" in ast.unparse(arg), f"{path.name}:{node.lineno} prints {ast.unparse(arg)}"
            if isinstance(node, ast.FunctionDef) and node.name.startswith("format_"):
                assert "CPU testbed" in ast.unparse(node), f"{path.name}: {node.name} does not say CPU testbed"
