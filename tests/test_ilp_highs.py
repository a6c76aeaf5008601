"""The ILP partitioner on HiGHS (``highspy``): the same plans as the exact DP and as brute force, memory per rank with
virtual stages, a silent solver, no numpy, and the DP fallback without highspy."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

import pytest

from tessera_lab.errors import InfeasiblePlanError, PartitionError
from tessera_lab.plan import ilp
from tessera_lab.plan.partition import additive_problem, solve, solve_dp, solve_ilp, uniform_boundaries
from tessera_lab.plan.problem import PartitionProblem


def _random_problem(rng: random.Random, objective: str, with_memory: bool) -> PartitionProblem:
    """Continuous random layer costs (so equal optima with equal spread have probability zero), 3-16 layers."""
    L = rng.randint(3, 16)
    S = rng.randint(1, min(5, L))
    costs = [rng.uniform(0.1, 10.0) for _ in range(L)]
    kw: dict = dict(objective=objective, microbatches=rng.choice([1, 4, 8]))
    if with_memory:
        def memory(s, i, j):  # parameters ~ cost plus activations x in-flight micro-batches (1F1B: S - s)
            return sum(costs[i:j]) + 0.5 * (S - s) * (j - i)

        uni = uniform_boundaries(L, S)
        kw.update(memory=memory, memory_limit=max(memory(s, uni[s], uni[s + 1]) for s in range(S))
                  * rng.uniform(0.5, 1.0) + 2 * max(costs))
    return additive_problem(costs, S, **kw)


def _brute_force(prob: PartitionProblem) -> list[int] | None:
    """The plan both passes must find, independent of the library: over every placement of the S - 1 cut points
    whose stages fit in memory, the least objective (``max_s cost_s`` or ``sum_s cost_s + (m - 1) max_s cost_s``),
    then among plans within 1e-9 (relative) of it the least ``sum_s cost_s^2``. None if nothing fits."""
    L, S, m = prob.num_layers, prob.num_stages, prob.microbatches
    plans = []
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = (0,) + cuts + (L,)
        if prob.memory and any(prob.memory(s, b[s], b[s + 1]) > prob.memory_limit for s in range(S)):
            continue
        c = [prob.cost(s, b[s], b[s + 1]) for s in range(S)]
        plans.append((max(c) if prob.objective == "bottleneck" else sum(c) + (m - 1) * max(c),
                      sum(x * x for x in c), list(b)))
    if not plans:
        return None
    best = min(p[0] for p in plans)
    return min((p for p in plans if p[0] <= best * (1 + 1e-9)), key=lambda p: p[1])[2]


@pytest.mark.parametrize("objective", ["bottleneck", "schedule"])
@pytest.mark.parametrize("with_memory", [False, True])
def test_ilp_equals_dp_and_brute_force(objective, with_memory):
    """40 seeded random additive problems per case: the HiGHS ILP reaches the exact DP's objective and returns the
    brute-force plan (optimum, then the smallest spread); with the bottleneck objective that is also the DP's plan
    (with the schedule objective the DP's spread tie-break is not exhaustive, so only the objective is compared)."""
    rng = random.Random(f"{objective}-{with_memory}")
    checked = 0
    for _ in range(40):
        prob = _random_problem(rng, objective, with_memory)
        want = _brute_force(prob)
        try:
            dp = solve_dp(prob)
        except InfeasiblePlanError:
            assert want is None
            with pytest.raises(InfeasiblePlanError):
                solve_ilp(prob, limit=20)
            continue
        got = solve_ilp(prob, limit=20)
        assert got.status == "Optimal" and got.solver == "HiGHS"
        assert got.objective == pytest.approx(dp.objective, rel=1e-9)
        assert got.boundaries == want, (prob.num_layers, prob.num_stages)
        if objective == "bottleneck":
            assert got.boundaries == dp.boundaries
        checked += 1
    assert checked >= 20


def _brute_force_vpp(costs, ranks, vpp, objective, m, memory=None, limit=None):
    """Best objective over every placement of the S - 1 cut points, independent of the library: bottleneck
    ``max(rank sums, vpp x the longest chunk)`` (the ILP's objective with virtual stages), schedule ``sum of chunks +
    (m - 1) x the largest rank sum``; placements whose rank memory exceeds ``limit`` are skipped. None if none fits."""
    L, S = len(costs), ranks * vpp
    best = None
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = (0,) + cuts + (L,)
        chunks = [sum(costs[b[s]:b[s + 1]]) for s in range(S)]
        rank = [sum(chunks[s] for s in range(r, S, ranks)) for r in range(ranks)]
        if memory and max(sum(memory(s, b[s], b[s + 1]) for s in range(r, S, ranks)) for r in range(ranks)) > limit:
            continue
        val = (max(max(rank), vpp * max(chunks)) if objective == "bottleneck"
               else sum(chunks) + (m - 1) * max(rank))
        best = val if best is None else min(best, val)
    return best


def _ilp_value(part, costs, ranks, vpp, objective, m):
    b = part.boundaries
    chunks = [sum(costs[b[s]:b[s + 1]]) for s in range(len(b) - 1)]
    rank = [sum(chunks[s] for s in range(r, len(chunks), ranks)) for r in range(ranks)]
    return max(max(rank), vpp * max(chunks)) if objective == "bottleneck" else sum(chunks) + (m - 1) * max(rank)


@pytest.mark.parametrize("objective", ["bottleneck", "schedule"])
@pytest.mark.parametrize("with_memory", [False, True])
def test_virtual_stages_equal_brute_force(objective, with_memory):
    """vpp > 1 (where no DP applies): 12 seeded random small cases per case against brute force over all cut
    placements, with the memory limit per rank (the sum over its chunks)."""
    rng = random.Random(f"vpp-{objective}-{with_memory}")
    for _ in range(12):
        ranks, vpp = rng.choice([(2, 2), (1, 3), (2, 3), (3, 2)])
        L = rng.randint(ranks * vpp, 10)
        costs = [float(rng.randint(1, 9)) for _ in range(L)]
        m = rng.choice([1, 4])
        kw: dict = dict(vpp=vpp, objective=objective, microbatches=m)
        memory = limit = None
        if with_memory:
            def memory(s, i, j):  # activations x in-flight chunks, more on early chunks
                return float(j - i) * (1.0 + (s < ranks))

            limit = 2.0 * L / ranks * rng.uniform(0.7, 1.3)
            kw.update(memory=memory, memory_limit=limit)
        prob = additive_problem(costs, ranks * vpp, **kw)
        want = _brute_force_vpp(costs, ranks, vpp, objective, m, memory, limit)
        if want is None:
            with pytest.raises(InfeasiblePlanError):
                solve_ilp(prob, limit=20)
            continue
        part = solve_ilp(prob, limit=20)
        assert part.status == "Optimal"
        assert _ilp_value(part, costs, ranks, vpp, objective, m) == pytest.approx(want)
        if with_memory:
            assert max(part.rank_memory) <= limit * (1 + 1e-12)


def test_virtual_stages_memory_bounds_every_rank():
    """By hand: 8 layers of cost 1 except the last (9), 2 ranks x 2 chunks, memory = layer count, 4 per rank. The
    last layer's chunk sets the objective (vpp x 9 = 18, brute force agrees), so plans tie on it, among them ones
    with 5 layers on rank 0 ([0, 2, 4, 7, 8]: chunks of 2 and 3 layers); the memory rows must hold on every rank."""
    prob = additive_problem([1, 1, 1, 1, 1, 1, 1, 9], 4, vpp=2, memory=lambda s, i, j: float(j - i),
                            memory_limit=4.0)
    part = solve_ilp(prob)
    assert part.rank_memory == [4.0, 4.0]
    want = _brute_force_vpp([1, 1, 1, 1, 1, 1, 1, 9], 2, 2, "bottleneck", 1, lambda s, i, j: float(j - i), 4.0)
    assert _ilp_value(part, [1, 1, 1, 1, 1, 1, 1, 9], 2, 2, "bottleneck", 1) == want


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)


def test_solver_is_silent_and_needs_no_numpy():
    """Nothing reaches file descriptor 1 (``plan --json -`` stays valid) and numpy is never imported (``import
    highspy`` would import it: about 0.1 s of CPU), through a time-limited virtual-stage solve too."""
    out = _run(
        "import sys\n"
        "from tessera_lab.plan.partition import additive_problem, solve_ilp\n"
        "solve_ilp(additive_problem([1.0, 2.0, 3.0, 4.0, 5.0], 2))\n"
        "solve_ilp(additive_problem([1.0 + (l * 37 % 11) / 7 for l in range(64)], 16, vpp=4), limit=0.5)\n"
        "sys.stderr.write('numpy' if 'numpy' in sys.modules else 'no numpy')\n"
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == b""
    assert out.stderr.decode().endswith("no numpy")


def test_loaded_module_is_the_one_highspy_uses():
    """The compiled module loaded without the package's __init__ is the one a later ``import highspy`` uses."""
    out = _run(
        "from tessera_lab.plan.ilp import highs_core\n"
        "core = highs_core()\n"
        "import highspy\n"
        "print(highspy.Highs.__mro__[1] is core._Highs, highspy.HighsModelStatus is core.HighsModelStatus)\n"
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.split() == [b"True", b"True"]


def test_package_import_fallback_is_silent_and_equal():
    """Without a loadable ``_core`` extension the partitioner uses ``import highspy`` and its ``Highs`` class (which
    prints a banner when created): the same plan as the exact DP, and still nothing on file descriptor 1."""
    out = _run(
        "import importlib.machinery, sys\n"
        "saved = importlib.machinery.EXTENSION_SUFFIXES[:]\n"
        "importlib.machinery.EXTENSION_SUFFIXES[:] = []  # no _core file is found: the package import is used\n"
        "from tessera_lab.plan import ilp\n"
        "core = ilp.highs_core()\n"
        "importlib.machinery.EXTENSION_SUFFIXES[:] = saved\n"
        "from tessera_lab.plan.partition import additive_problem, solve_dp\n"
        "p = additive_problem([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0], 3)\n"
        "got, want = ilp.solve_ilp(p), solve_dp(p)\n"
        "sys.stderr.write(f'{type(core).__name__} {got.status} {got.boundaries == want.boundaries}')\n"
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout == b""
    assert out.stderr.decode().endswith("SimpleNamespace Optimal True")


def test_without_highspy_ilp_falls_back_to_the_dp(monkeypatch):
    monkeypatch.setitem(sys.modules, "highspy", None)  # import highspy now fails
    monkeypatch.delitem(sys.modules, "highspy._core", raising=False)
    monkeypatch.setattr(ilp, "_CORE", [])
    prob = additive_problem([3, 1, 4, 1, 5, 9, 2, 6], 3)
    part = solve(prob, "ilp")
    assert part.method == "ilp" and part.solver == "dp (no ILP solver installed (highspy))"
    assert part.boundaries == solve_dp(prob).boundaries
    with pytest.raises(PartitionError, match="install highspy"):
        solve_ilp(prob)


def test_on_paths_keeps_exactly_the_segments_of_some_plan():
    """The pruning pass keeps a segment iff some plan (every cut placement, enumerated) made only of the given
    segments uses it: random segment subsets of small problems."""
    rng = random.Random(5)
    for _ in range(60):
        L = rng.randint(2, 9)
        S = rng.randint(1, min(4, L))
        seg = {(s, i, j): 1.0 for s in range(S) for i in range(L) for j in range(i + 1, L + 1) if rng.random() < 0.6}
        want = set()
        for cuts in itertools.combinations(range(1, L), S - 1):
            b = (0,) + cuts + (L,)
            plan = {(s, b[s], b[s + 1]) for s in range(S)}
            if plan <= seg.keys():
                want |= plan
        assert set(ilp._on_paths(seg, S, L)) == want


def test_virtual_stages_that_cannot_fit_even_one_chunk_per_rank_are_refused_before_the_ilp():
    """A rank's memory sums its chunks, so when no split fits with each chunk alone under the limit none fits at
    all: the memory reason at once, not a time limit (seen: Nemotron-H vpp 2 timed out at 10 s)."""
    import time

    from tessera_lab.errors import InfeasiblePlanError

    p = additive_problem([1.0] * 64, 16, vpp=4, memory=lambda s, i, j: float(j - i), memory_limit=3.0)
    t0 = time.perf_counter()
    with pytest.raises(InfeasiblePlanError, match="virtual stages fits"):
        solve_ilp(p, limit=30.0)
    assert time.perf_counter() - t0 < 5.0


def test_default_limit_is_the_deterministic_budget(monkeypatch):
    """``plan``'s partition must not move with the machine's load: make_plan, solve and partition_costs default to the
    work budget (a count, never seconds), and ``schedule="auto"`` gives each schedule the smaller auto budget."""
    from tessera_lab.errors import TesseraError
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan import make, partition
    from tessera_lab.plan.make import AUTO_ILP_BUDGET, make_plan

    assert isinstance(ilp.DEFAULT_ILP_BUDGET, ilp.IlpBudget) and isinstance(AUTO_ILP_BUDGET, ilp.IlpBudget)
    seen = []
    real = partition.solve_ilp
    monkeypatch.setattr(partition, "solve_ilp", lambda p, *, limit: seen.append(limit) or real(p, limit=limit))
    partition.partition_costs([1.0, 2.0, 1.0, 3.0], 2, "ilp")
    make_plan(load_model("qwen3-30b-a3b"), make.ParallelConfig(pp=4, ep=8, microbatches=8), gpu="H100")
    assert seen and all(lim == ilp.DEFAULT_ILP_BUDGET for lim in seen)

    trials = []

    def refuse(model, parallel, cluster, **kw):  # record each schedule's limit, plan nothing
        trials.append(kw["limit"])
        raise TesseraError("not planned")

    monkeypatch.setattr(make, "make_plan", refuse)
    for given, expected in ((None, AUTO_ILP_BUDGET), (ilp.IlpBudget(7, 3), ilp.IlpBudget(7, 3)), (30.0, 2.0)):
        trials.clear()
        with pytest.raises(TesseraError):
            make._auto_schedule(load_model("qwen3-30b-a3b"), make.ParallelConfig(schedule="auto"), None, limit=given)
        assert trials and all(t == expected for t in trials)


def test_work_budget_keeps_the_heuristic_plan_and_says_so(capsys):
    """``partition --ilp-max-binaries 0``: no model is solved; the status names the budget and a heuristic plan (4
    virtual stages over 8 layers) is returned."""
    from tessera_lab.cli.main import main

    assert main(["partition", "--costs", "1,2,1,3,2,2,1,1", "--stages", "2", "--vpp", "2",
                 "--ilp-max-binaries", "0", "--json", "-"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert "over 0" in out["status"] and "work budget: best heuristic plan" in out["status"]
    b = out["boundaries"]
    assert len(b) == 5 and b[0] == 0 and b[-1] == 8 and all(x < y for x, y in zip(b, b[1:]))
    assert ilp.limit_word(out["status"]) == "work budget"
    assert ilp.limit_word("TimeLimit (feasible, not proven optimal)") == "time limit"
