"""One definition per concept, found by scanning every module of the package (not a list of directories):

* one pair makespan: only ``cost/lanes.py`` turns a :class:`Contention` into lane rates (``.slowdown(...)``,
  ``.comm_slowdown(...)``), and only it defines a function or class of the pair model's names;
* one FLOP counter: only ``model/flops.py`` turns shapes into FLOPs (no arithmetic bound to a ``flops`` name, a
  ``flops=`` keyword or a task's FLOP field anywhere else);
* one schedule registry: only ``pipeline/schedules.py`` maps schedule names to builders;
* one walker: only ``pipeline/walk.py`` (the walker) and ``pipeline/engine.py`` (its simulation policy) walk per-rank action lists (an agenda, a deadlock exit, a loop advancing
  per-rank positions), but the list schedulers ``LIST_SCHEDULERS`` names (they build an order; they walk no list).

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
    """Lines that compute pair-model lane rates or define a pair-model function (a wrapper that calls the owner's
    :func:`pair_makespan` or :func:`side_stream_makespan`, directly or through ``CostModel.own_stream_time``, is
    allowed: ``host_issue_makespan`` fills in the CPU template's graph)."""
    signs = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("slowdown", "comm_slowdown")):
            signs.append(f"line {node.lineno}: lane rate {ast.unparse(node.func)}(...)")
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and any(n in node.name.lower() for n in PAIR_NAMES):
            calls = {getattr(c.func, "id", getattr(c.func, "attr", None)) for c in ast.walk(node)
                     if isinstance(c, ast.Call)}
            if not calls & {"pair_makespan", "side_stream_makespan", "own_stream_time"}:
                signs.append(f"line {node.lineno}: defines {node.name}")
    return signs


def test_one_pair_makespan():
    found = {m: s for m, tree in _modules().items() if m != PAIR_OWNER and (s := _pair_model_signs(tree))}
    assert not found, f"pair-makespan code outside {PAIR_OWNER}: {found}"
    assert _pair_model_signs(_modules()[PAIR_OWNER])  # the rule sees the owner's own code
    planted = ast.parse("def two_lane_makespan(order, d, lanes, deps, c):\n"
                        "    return 1.0 / (1.0 + c.slowdown('compute'))\n")
    assert len(_pair_model_signs(planted)) == 2


# ---- one FLOP counter ------------------------------------------------------------------------------------------

FLOP_OWNER = "model/flops.py"


def _bare_product(node: ast.AST) -> bool:
    """``node`` multiplies shapes itself: a ``*`` whose operands are neither a call (a counter of model/flops.py)
    nor an existing count (``x.flops``); calls are not looked into (their arguments are shapes)."""
    if isinstance(node, ast.Call):
        return False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        counted = [isinstance(x, ast.Call) or (isinstance(x, ast.Attribute) and "flops" in x.attr)
                   for x in (node.left, node.right)]
        if not any(counted):
            return True
    return any(_bare_product(c) for c in ast.iter_child_nodes(node))


def _flop_signs(tree: ast.Module) -> list[str]:
    """Lines that count FLOPs from shapes: a product bound to a ``*flops*`` name, a ``flops=`` keyword, a task's
    FLOP field (``Task(name, layer, phase, op, FLOPS, ...)``) or returned by a ``*flops*`` function; and
    ``*flops*`` functions that call no counter."""
    signs = []
    for node in ast.walk(tree):
        slots = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any("flops" in ast.unparse(t).lower() for t in targets) and node.value is not None:
                slots.append(node.value)
        elif isinstance(node, ast.Call):
            slots += [k.value for k in node.keywords if k.arg == "flops"]
            if getattr(node.func, "id", None) == "Task" and len(node.args) > 4:
                slots.append(node.args[4])
        elif isinstance(node, ast.FunctionDef) and "flops" in node.name.lower():
            slots += [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value is not None]
            called = {getattr(c.func, "id", getattr(c.func, "attr", "")) for c in ast.walk(node)
                      if isinstance(c, ast.Call)}
            if not any(c.endswith("_flops") or c == "decompose" for c in called):
                signs.append(f"line {node.lineno}: {node.name} counts without the counters")
        signs += [f"line {v.lineno}: {ast.unparse(v)}" for v in slots if _bare_product(v)]
    return signs


def test_one_flop_counter():
    mods = _modules()
    found = {m: s for m, tree in mods.items() if m != FLOP_OWNER and (s := _flop_signs(tree))}
    assert not found, f"FLOP counts outside {FLOP_OWNER}: {found}"
    assert _flop_signs(mods[FLOP_OWNER])  # the rule sees the owner's own formulas
    planted = ast.parse("def f(T, h, E, t):\n"
                        "    flops = 2.0 * T * h * E\n"
                        "    x = Task('router', 0, 'F', 'router', 2.0 * T * h * E, 0.0)\n"
                        "    y = Task('b', 0, 'B', 'gemm', t.flops * 2.0, 0.0)\n"  # scaling a count: allowed
                        "    return g.elementwise('c', 1.0, [], flops=T * h)\n")
    assert len(_flop_signs(planted)) == 3


# ---- one schedule registry -------------------------------------------------------------------------------------

REGISTRY_OWNER = "pipeline/schedules.py"
#: the modules that define schedule generators (and may call them to build candidates)
GENERATOR_MODULES = ("pipeline/generators.py", "pipeline/zerobubble.py", "pipeline/zbsingle.py")


def _registry_signs(tree: ast.Module, generators: set[str], names: set[str]) -> list[str]:
    """Lines that pick a schedule builder outside the registry: a call of a generator, or a dict of builders keyed
    by schedule names."""
    signs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in generators:
            signs.append(f"line {node.lineno}: calls {ast.unparse(node.func)}")
        if isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & names) >= 2 and any(isinstance(v, (ast.Name, ast.Attribute, ast.Lambda))
                                              for v in node.values):
                signs.append(f"line {node.lineno}: a dict of schedule builders")
    return signs


def test_one_schedule_registry():
    from tessera_lab.pipeline import schedules

    generators = {e.build.__name__ for e in schedules.SCHEDULES.values()} | {
        "gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "zb_h2", "zb_v", "zb_auto", "dualpipev",
        "overlapped_1f1b", "interleaved_overlapped"}
    generators.discard("<lambda>")
    names = set(schedules.SCHEDULES)
    mods = _modules()
    found = {m: s for m, tree in mods.items() if m != REGISTRY_OWNER and m not in GENERATOR_MODULES
             and (s := _registry_signs(tree, generators, names))}
    assert not found, f"schedule builders picked outside {REGISTRY_OWNER}: {found}"
    assert _registry_signs(mods[REGISTRY_OWNER], generators, names)  # the rule sees the registry itself
    planted = ast.parse("def plan_schedule(name, pp, m, vpp):\n"
                        "    if name == 'interleaved-overlapped':\n"
                        "        return interleaved_overlapped(pp, vpp, m)\n"
                        "    return {'gpipe': gpipe, '1f1b': one_f_one_b}[name](pp, m)\n")
    assert len(_registry_signs(planted, generators, names)) == 2
    # every builder the package names is in the registry, with no second name -> builder table beside it
    assert {"interleaved-overlapped", "zb-auto"} <= names
    assert set(schedules.ALL_SCHEDULE_NAMES) < names


# ---- one walker ------------------------------------------------------------------------------------------------

#: the walker (its driver and replay policy) and the engine (its simulation policy, the event loop)
WALKER_OWNERS = ("pipeline/walk.py", "pipeline/engine.py")
#: functions outside the engine that may show a walker's signs because they *build* an order, by module and then by
#: function (dotted for a method), each with its reason. They may keep an agenda of rank clocks (``heapq``) and
#: per-rank counters; they may not read an action list at a rank's advancing position nor report a deadlock (signs
#: of a walk over a given list, :data:`WALK_OVER_A_LIST`), and anything else in their modules that walks is found
#: like anywhere else. This list only ever shrinks
LIST_SCHEDULERS = {
    # zb-auto's greedy list schedulers build each rank's F/I/W order from the stage times (sail-sg's heuristic): a
    # heap of rank clocks picks the next decision; they walk no list (their candidates are timed by the engine's
    # replay policy, Walk.replay, through zbsingle.replay_single)
    "pipeline/zbsingle.py": ("greedy_single", "GreedyGeneral.place", "GreedyGeneral.decide", "GreedyGeneral.run"),
}
#: the signs that only a walk over a given list shows (never allowed outside the engine)
WALK_OVER_A_LIST = ("while loop reading", "DeadlockError")


#: the modules that execute action lists step by step on the engine (the dynamic controller, the CPU testbed's
#: sharing, the NCCL posting-order check, zb-auto's candidate replay)
ENGINE_USERS = ("dynamic/online.py", "runner/testbed/sharing.py", "pipeline/p2p.py", "pipeline/zbsingle.py")


def _per_rank(node: ast.AST) -> bool:
    """``node`` is a subscript by a computed index (``pos[r]``, ``self.pc[r]``), not by a constant."""
    return isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Constant)


def _paired(assign: ast.Assign):
    """(target, value) pairs of an assignment, element by element for ``a, b = x, y``."""
    value = assign.value
    for target in assign.targets:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            yield from zip(target.elts, value.elts)
        else:
            yield target, value


def _cursor_walks(func: ast.AST) -> list[str]:
    """``while`` loops in ``func`` that read a list at a position the loop advances (``a = acts[p]; ...; p += 1``)
    where the position is a rank's: a computed subscript itself (``pos[r] += 1``), or a name ``func`` loads from or
    stores to one (``p = pos[r]``, ``pos[r], t[r] = p, tr``). A merge of two interval lists or a pass over one list
    keeps its cursors to itself and is not one."""
    per_rank_names = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Assign):
            for target, value in _paired(node):
                if isinstance(target, ast.Name) and any(_per_rank(v) for v in ast.walk(value)):
                    per_rank_names.add(target.id)
                if _per_rank(target) and isinstance(value, ast.Name):
                    per_rank_names.add(value.id)
    signs = []
    for loop in ast.walk(func):
        if not isinstance(loop, ast.While):
            continue
        advanced = {ast.unparse(n.target) for n in ast.walk(loop) if isinstance(n, ast.AugAssign)
                    and isinstance(n.op, ast.Add) and (_per_rank(n.target) or (isinstance(n.target, ast.Name)
                                                                           and n.target.id in per_rank_names))}
        read = sorted({ast.unparse(n) for n in ast.walk(loop) if isinstance(n, ast.Subscript)
                       and ast.unparse(n.slice) in advanced})
        if read:
            signs.append(f"line {loop.lineno}: while loop reading {read[0]} at a rank's advancing position")
    return signs


def _walker_signs(tree: ast.Module) -> list[str]:
    """What makes a module a walker over actions of its own: an agenda of ranks (``heapq``), a deadlock report
    (``DeadlockError(...)`` made or raised), a ``while`` loop advancing a per-rank position (``pc[r] += 1``; a
    counter under a constant key, ``pruned["bound"] += 1``, is not one), or a ``while`` loop reading a list at a
    rank's advancing position (:func:`_cursor_walks`)."""
    signs = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if "heapq" in names:
                signs.append(f"line {node.lineno}: imports heapq")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "DeadlockError":
            signs.append(f"line {node.lineno}: makes a DeadlockError")
        elif isinstance(node, ast.Raise) and isinstance(node.exc, (ast.Name, ast.Attribute)) and \
                getattr(node.exc, "id", getattr(node.exc, "attr", None)) == "DeadlockError":
            signs.append(f"line {node.lineno}: raises DeadlockError")
        elif isinstance(node, ast.While):
            for inner in ast.walk(node):
                if isinstance(inner, ast.AugAssign) and _per_rank(inner.target):
                    signs.append(f"line {node.lineno}: while loop advancing {ast.unparse(inner.target)}")
                    break
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            signs += _cursor_walks(node)
    return list(dict.fromkeys(signs))  # a nested function's loops are seen from each enclosing one


def _owners(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, dotted name) of every function and class of ``tree``, outermost first."""
    spans = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                spans.append((child.lineno, child.end_lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def _located_walker_signs(tree: ast.Module) -> list[tuple[frozenset[str], str]]:
    """Each of :func:`_walker_signs` with the functions it belongs to: the innermost function around its line, or
    for a module-level ``import heapq`` every function that uses ``heapq`` (none: the module itself, ``""``)."""
    spans = _owners(tree)

    def owner(line: int) -> str:
        inside = [name for first, last, name in spans if first <= line <= last]
        return inside[-1] if inside else ""

    heap_users = frozenset(owner(n.lineno) for n in ast.walk(tree)
                           if isinstance(n, ast.Name) and n.id == "heapq") - {""}
    located = []
    for sign in _walker_signs(tree):
        line = int(sign.split(":")[0].removeprefix("line "))
        name = owner(line)
        located.append((heap_users or frozenset({name}) if sign.endswith("imports heapq") and not name
                        else frozenset({name}), sign))
    return located


def _unexempted(module: str, tree: ast.Module) -> list[str]:
    """The walker signs of ``module`` outside the functions :data:`LIST_SCHEDULERS` names for it, and inside them
    every sign of a walk over a given list (:data:`WALK_OVER_A_LIST`)."""
    allowed = set(LIST_SCHEDULERS.get(module, ()))
    return [sign for names, sign in _located_walker_signs(tree)
            if not names <= allowed or any(w in sign for w in WALK_OVER_A_LIST)]


def test_one_walker():
    """Every walk over per-rank action lists runs on the engine's one walker (:class:`Walk`: simulation, the dynamic
    controller, the CPU testbed's processor sharing, the NCCL posting-order check and zb-auto's candidate replay are
    policies on it; the fast path packs the order the event loop recorded and walks nothing), scanning the whole
    package; the only other functions with a walker's signs build orders (:data:`LIST_SCHEDULERS`)."""
    mods = _modules()
    found = {m: s for m, tree in mods.items() if m not in WALKER_OWNERS and (s := _unexempted(m, tree))}
    assert not found, f"walkers over actions outside {WALKER_OWNERS}: {found}"
    assert all(_walker_signs(mods[m]) for m in WALKER_OWNERS)
    for m, names in LIST_SCHEDULERS.items():  # the list holds only what is still there, each with a walker's signs
        walking = set().union(*(owners for owners, _ in _located_walker_signs(mods[m])))
        assert set(names) <= walking, (m, set(names) - walking)
    assert not _walker_signs(mods["pipeline/linear.py"]) and not _walker_signs(mods["dynamic/online.py"])
    for m in ENGINE_USERS:  # the modules that execute action lists step by step do so on the engine
        assert any(isinstance(n, ast.ImportFrom) and n.module in ("tessera_lab.pipeline.engine",
                                                                  "tessera_lab.pipeline.walk")
                   and "Walk" in {a.name for a in n.names} for n in ast.walk(mods[m])), m
    planted = ast.parse("import heapq\nwhile todo:\n    pc[r] += 1\nraise DeadlockError('stuck')\n")
    assert len(_walker_signs(planted)) == 3
    assert not _walker_signs(ast.parse("while todo:\n    seen['pruned'] += 1\n"))  # a counter, not a walk


def test_one_walker_sees_cursor_walks():
    """A round-robin replay with local cursors (the shape of a list replay) is a walker; merging two interval lists
    or a one-list pass with their own cursors is not."""
    replay = ("def replay(lists, R):\n"
              "    pos, t = [0] * R, [0.0] * R\n"
              "    progress = True\n"
              "    while progress:\n"
              "        progress = False\n"
              "        for r in range(R):\n"
              "            acts, p, tr = lists[r], pos[r], t[r]\n"
              "            while p < len(acts):\n"
              "                if acts[p] not in done:\n"
              "                    break\n"
              "                tr += 1.0\n"
              "                p += 1\n"
              "            if p != pos[r]:\n"
              "                pos[r], t[r] = p, tr\n"
              "                progress = True\n")
    assert _walker_signs(ast.parse(replay))
    merge = ("def overlap(a, b):\n"
             "    i = j = 0\n"
             "    while i < len(a) and j < len(b):\n"
             "        if a[i][1] < b[j][1]:\n"
             "            i += 1\n"
             "        else:\n"
             "            j += 1\n")
    assert not _walker_signs(ast.parse(merge))
    assert not _walker_signs(ast.parse("def f(lists):\n    for r, acts in lists.items():\n        k = 0\n"
                                       "        while k < len(acts):\n            out.append(acts[k])\n"
                                       "            k += 1\n"))


def test_walker_exemption_is_by_function():
    """A second walker added to an exempted module is found: the exemption names functions, not modules."""
    module = "pipeline/zerobubble.py"
    source = (PKG / module).read_text()
    assert not _unexempted(module, ast.parse(source))
    second = ("\n\ndef _another_replay(lists, pos, r):\n"
              "    while pos[r] < len(lists[r]):\n"
              "        pos[r] += 1\n")
    found = _unexempted(module, ast.parse(source + second))
    assert found and all("while loop" in f for f in found)
    heap = ("\n\nimport heapq\n\ndef _agenda(h):\n    return heapq.heappop(h)\n")
    assert any("imports heapq" in f for f in _unexempted(module, ast.parse(source + heap)))
    # a method of an exempted class that is not named is not exempt
    zbs = "pipeline/zbsingle.py"
    cursor = ("\n\ndef greedy_single(lists, pos, r):\n    while pos[r] < len(lists[r]):\n"
              "        a = lists[r][pos[r]]\n        pos[r] += 1\n")
    assert any("while loop reading" in f for f in _unexempted(zbs, ast.parse((PKG / zbs).read_text() + cursor)))
    method = ("\n\nclass GreedyGeneral2:\n    def run(self, pc, r):\n        while pc[r] < 3:\n"
              "            pc[r] += 1\n")
    assert _unexempted(zbs, ast.parse((PKG / zbs).read_text() + method))
