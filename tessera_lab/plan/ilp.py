"""The ILP partitioner: HiGHS through its compiled ``highspy`` module (the sparse model passed column by column, no
modelling layer); always with a limit: a deterministic work budget (:class:`IlpBudget`, the default
:data:`DEFAULT_ILP_BUDGET`), or wall-clock seconds (opt-in; the result then depends on the machine's load).

One binary per feasible (stage, segment) pair, linked as a path from layer 0 to layer L (flow conservation
between consecutive stages); segments that cannot be in an optimal plan because their cost already exceeds a
known feasible plan's objective are left out. With virtual stages (``vpp > 1``) a rank's cost and memory are sums
over its non-contiguous chunks (constraints per rank), which the DP cannot express.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import math
import os
import sys
import time
import types
from dataclasses import dataclass

from tessera_lab.errors import PartitionError, SolverLimitError
from tessera_lab.plan.heuristics import heuristic_start
from tessera_lab.plan.problem import Partition, PartitionProblem, infeasible_error, score_boundaries

#: the solver's name in :attr:`Partition.solver`
SOLVER = "HiGHS"
#: HiGHS' presolve probing does not watch the time limit (seen: 9 s of probing under a 3 s limit on a 22k-binary
#: virtual-stage model); switching that presolve rule off keeps the limit (HiGHS' own advice)
PRESOLVE_RULE_OFF = 32768
_CORE: list = []  # the loaded module (or None when highspy is missing), once looked up
#: what the partitioner uses of highspy's compiled module
_NAMES = ("_Highs", "HighsLp", "HighsModelStatus", "HighsVarType", "kHighsInf", "kSolutionStatusFeasible")


@dataclass(frozen=True)
class IlpBudget:
    """A deterministic limit on the ILP's work, in place of a wall-clock time limit: the same partition on an idle or a
    loaded machine (a time limit stops HiGHS wherever the clock finds it, so the incumbent it returns depends on the
    machine's load).

    ``max_binaries``: a pruned model with more segment binaries is not solved; the best heuristic plan is kept, as at
    a time limit. ``max_nodes``: HiGHS' ``mip_max_nodes`` per pass (branch-and-bound nodes; HiGHS' search is
    deterministic for given options and model, and the model's column order is fixed). Both are counts, never
    seconds.
    """

    max_binaries: int
    max_nodes: int

    def __post_init__(self):
        if self.max_binaries < 0 or self.max_nodes < 0:
            raise PartitionError(f"IlpBudget({self.max_binaries}, {self.max_nodes}) is out of range; allowed: "
                                 "counts >= 0")


#: the ILP's default limit (``tessera-lab plan``, :func:`~tessera_lab.plan.make.make_plan`, ``partition``): a work
#: budget, so the partition is the same on an idle and on a loaded machine. Sized on the documented commands
#: (README, docs/cli.md; measured 2026-12-03, HiGHS 1.16, load < 2): with one stage per rank their models have
#: 8-558 binaries and close within 1 branch-and-bound node; with virtual stages ``plan --schedule
#: interleaved-overlapped --vpp 2`` has 1,999 binaries (proven optimal at the root, 4.6 CPU s) and ``plan --schedule
#: interleaved --vpp 3`` 2,548 (optimal after 1 node, 7.8 CPU s), so every one is solved to the optimum the former
#: 10 s limit reached at idle. A larger model (96 virtual stages' worth of segments) keeps the best heuristic plan
#: and says so; HiGHS' root node has no deterministic work limit, so its CPU time grows with the binaries.
DEFAULT_ILP_BUDGET = IlpBudget(max_binaries=3000, max_nodes=50)


def highs_core():
    """highspy's compiled module (``highspy._core``: ``_Highs``, ``HighsLp``, the enums), or ``None`` when highspy is
    not installed (or lacks one of those names).

    ``import highspy`` also imports numpy for its Python wrapper (about 0.1 s of CPU, a third of the default plan's
    budget); the compiled module alone does not, and every call made here (scalar setters, list-typed row fields,
    list-valued solutions) keeps it that way. The module is loaded from the installed package's folder without
    running the package's ``__init__`` and registered under its own name, so a later ``import highspy`` reuses it.
    A layout without a ``_core`` extension falls back to ``import highspy`` (its ``Highs`` class stands in for
    ``_Highs``).
    """
    if _CORE:
        return _CORE[0]
    core = sys.modules.get("highspy._core")
    try:
        spec = importlib.util.find_spec("highspy") if core is None else None
    except (ImportError, ValueError):  # pragma: no cover - a broken installation
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_core" + suffix)
            if core is None and os.path.isfile(path):
                core = _load_extension("highspy._core", path)
    if core is None and spec is not None:
        try:
            import highspy
        except ImportError:  # pragma: no cover - an unusable installation
            highspy = None
        if highspy is not None and hasattr(highspy, "Highs"):
            core = types.SimpleNamespace(**{n: getattr(highspy, n) for n in _NAMES[1:] if hasattr(highspy, n)},
                                         _Highs=highspy.Highs)
    if core is not None and not all(hasattr(core, n) for n in _NAMES):
        core = None  # pragma: no cover - an incompatible highspy
    _CORE.append(core)
    return core


def _load_extension(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # pragma: no cover - an unloadable build: the caller tries the package import
        del sys.modules[name]
        return None
    return module


def available_solver(time_limit_s: float | None = None) -> str | None:
    """The ILP solver's name (``"HiGHS"``) when ``highspy`` is installed, else ``None`` (use the exact DP)."""
    return SOLVER if highs_core() is not None else None


@contextlib.contextmanager
def _native_stdout_silenced():
    """Send file descriptor 1 to /dev/null while native HiGHS code runs. HiGHS writes to the C stdout, past Python's
    ``sys.stdout``: the compiled ``_Highs`` is silent once ``output_flag`` is off, but highspy's Python ``Highs``
    class (the fallback of :func:`highs_core`) prints a banner when it is created. ``--json -`` stays valid and
    notebooks (whose kernels forward fd 1 into cell output) stay clean."""
    try:
        sys.stdout.flush()
    except (AttributeError, ValueError):  # pragma: no cover - a closed or odd stream
        pass
    try:
        saved = os.dup(1)
    except OSError:  # pragma: no cover - no fd 1 at all
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _path_bounds(problem: PartitionProblem, costs: dict[tuple[int, int, int], float]):
    """Least sum of stage costs before each (stage, start layer) and after each (stage, end layer): forward and
    backward min-sum DPs over the feasible segments, as lists indexed ``[stage][layer]`` (infinite where
    unreachable)."""
    S, L = problem.num_stages, problem.num_layers
    by_stage: list[list[tuple[int, int, float]]] = [[] for _ in range(S)]
    for (s, i, j), c in costs.items():
        by_stage[s].append((i, j, c))
    fwd = [[math.inf] * (L + 1) for _ in range(S + 1)]
    fwd[0][0] = 0.0
    for s in range(S):
        cur, nxt = fwd[s], fwd[s + 1]
        for i, j, c in by_stage[s]:
            v = cur[i] + c  # inf where layer i is unreachable: never below nxt[j]
            if v < nxt[j]:
                nxt[j] = v
    bwd = [[math.inf] * (L + 1) for _ in range(S + 1)]
    bwd[S][L] = 0.0
    for s in range(S - 1, -1, -1):
        cur, nxt = bwd[s], bwd[s + 1]
        for i, j, c in by_stage[s]:
            v = nxt[j] + c
            if v < cur[i]:
                cur[i] = v
    return fwd, bwd


def _segment_table(problem: PartitionProblem) -> dict[tuple[int, int, int], float]:
    """Every feasible (stage, first layer, end layer) segment with its cost in s.

    Raises:
        InfeasiblePlanError: no stage has a feasible segment.
    """
    table = {}
    for s in range(problem.num_stages):
        seg = problem.segments(s)
        table.update(zip(((s, i, j) for i, j in seg), problem.segment_costs(s, seg)))
    if not table:
        raise infeasible_error(problem)
    return table


def solve_ilp(problem: PartitionProblem, *, limit: float | IlpBudget = DEFAULT_ILP_BUDGET) -> Partition:
    """Integer linear program over (stage, segment) binaries, solved with HiGHS (``highspy``).

    Variables ``u[s,i,j]`` (stage s owns layers i..j-1) for feasible segments, ``T`` (bottleneck).
    Constraints: one segment per stage; stage 0 starts at layer 0 and stage S-1 ends at L; stage s+1
    starts where stage s ends (``sum_i u[s,i,k] = sum_j u[s+1,k,j]`` for every k); ``T >= cost_r`` per rank; with
    virtual stages, each rank's summed memory <= the limit and (bottleneck objective) ``T >= vpp x cost_s``.
    Objective: ``T`` or ``sum_s cost_s + (m-1) T``; then, with the objective fixed at its optimum, a
    second solve minimises ``sum_s cost_s^2`` (tie-break to the smaller spread).

    Pruning (exact): a segment of cost c forces the objective >= c (bottleneck) or >= m c (schedule,
    since the sum is at least the max); segments above the objective of a feasible plan found by
    :func:`greedy_upper_bound` (or the uniform plan, whichever is better) are left out; with the bottleneck objective
    so are those no path of the remaining segments from layer 0 to layer L passes through (:func:`_on_paths`: every
    plan at or below that objective is such a path). The second pass does the same at the optimum.

    Limit: ``limit``, an :class:`IlpBudget` (default :data:`DEFAULT_ILP_BUDGET`; no clock: a model over its binaries
    is not solved, each pass gets its nodes; the result does not depend on the machine's load), or float seconds of
    wall clock shared by both passes (model building included; the second gets what the first left; where HiGHS
    stops, and so the plan, then depends on the machine's load). When the limit stops the first pass, the better of its
    incumbent and the best heuristic plan (greedy, uniform, or for ``vpp > 1`` the exact DP over virtual stages scored
    per rank) is returned, with ``status`` saying so:
    ``Optimal`` (HiGHS' model status optimal, within its default relative MIP gap 1e-4), ``TimeLimit (feasible, not
    proven optimal)`` (an incumbent; ``SolutionLimit`` at a node budget), or a heuristic plan kept (``... (time
    limit: best heuristic plan)``, ``... (work budget: best heuristic plan)``).

    Raises:
        InfeasiblePlanError: the ILP is infeasible (memory / layer-count constraints).
        PartitionError: highspy is not installed (use ``solve_dp``), or the time limit hit with no solution and no
            feasible heuristic plan.
    """
    t0 = time.perf_counter()
    budget = limit if isinstance(limit, IlpBudget) else None
    deadline = math.inf if budget is not None else t0 + limit
    core = highs_core()
    if core is None:
        raise PartitionError("no ILP solver available (install highspy, or use method 'dp')")
    S, L, m = problem.num_stages, problem.num_layers, problem.microbatches
    all_seg = _segment_table(problem)
    ub, best_heuristic = heuristic_start(problem, all_seg)
    # exact pruning: the objective of any plan using segment k is at least lower_bound(k)
    fwd, bwd = _path_bounds(problem, all_seg)

    def lower_bound(k: tuple[int, int, int], c: float) -> float:
        s, i, j = k
        before, after = fwd[s][i], bwd[s + 1][j]
        if problem.objective == "bottleneck":
            return c if before < math.inf and after < math.inf else math.inf
        return before + c + after + (m - 1) * c

    # bottleneck: only segments of plans at or below the bound remain (schedule: the path bounds already prune; its
    # hard virtual-stage models end at the time limit, where a different model gives a different incumbent)
    paths = _on_paths if problem.objective == "bottleneck" else (lambda seg, S, L: seg)
    seg = paths({k: c for k, c in all_seg.items() if lower_bound(k, c) <= ub * (1 + 1e-9) + 1e-15}, S, L)
    if budget is not None and len(seg) > budget.max_binaries:
        status, chosen, value = f"NotSolved ({len(seg)} binaries over {budget.max_binaries})", None, math.inf
    else:
        status, chosen, value = _run_highs(core, problem, seg, ub, None, (deadline, budget))
    if status == "Infeasible" and best_heuristic is None:
        raise infeasible_error(problem)
    boundaries = _read_boundaries(chosen, S) if chosen is not None else None
    if boundaries is not None:
        cand = score_boundaries(problem, boundaries, "ilp")
        if status != "Optimal" and best_heuristic is not None and best_heuristic.objective < cand.objective:
            boundaries, status = None, status + " (heuristic plan kept: better than the incumbent)"
    if boundaries is None:
        boundaries, status = _heuristic_fallback(status, best_heuristic, limit)
    elif status == "Optimal" and (budget is not None or deadline - time.perf_counter() > 0.05 * limit):
        # second pass: smallest spread among optimal plans (only segments no costlier than the optimum)
        bound = value * (1 + 1e-9) + 1e-15
        seg2 = paths({k: c for k, c in seg.items() if lower_bound(k, c) <= bound}, S, L)
        status2, chosen2, _ = _run_highs(core, problem, seg2, ub, bound, (deadline, budget))
        if status2 == "Optimal":
            boundaries = _read_boundaries(chosen2, S)
    part = score_boundaries(problem, boundaries, "ilp", solver=SOLVER, status=status,
                            gap=0.0 if status == "Optimal" else None, num_variables=len(seg) + 1)
    part.solve_time_s = time.perf_counter() - t0
    return part


def _heuristic_fallback(status: str, best_heuristic: Partition | None, limit: float | IlpBudget
                        ) -> tuple[list[int], str]:
    """``(boundaries, status)`` of the best heuristic plan when the ILP's limit left no better solution.

    Raises:
        SolverLimitError: no heuristic plan fits memory either.
    """
    if best_heuristic is None:
        raise SolverLimitError(f"ILP stopped with status {status} and no solution within {limit_text(limit)}; no "
                             "heuristic plan fits memory either, so perhaps none does (a larger limit lets the solver "
                             "prove it or find one); allowed: a larger --ilp-max-binaries / --ilp-max-nodes or a "
                             "--time-limit, fewer virtual stages (--vpp), recompute (--recompute selective|full) or "
                             "more pipeline ranks")
    word = "work budget" if isinstance(limit, IlpBudget) else "time limit"
    return best_heuristic.boundaries, status if "heuristic" in status else f"{status} ({word}: best heuristic plan)"


def limit_word(status: str | None) -> str:
    """Which limit stopped the ILP, from a :func:`solve_ilp` status: ``"time limit"`` (a wall-clock ``limit``: HiGHS'
    ``TimeLimit``, or the clock spent before a pass) or ``"work budget"`` (an :class:`IlpBudget`)."""
    s = status or ""
    return "time limit" if s.startswith("TimeLimit") or "(time limit" in s else "work budget"


def limit_text(limit: float | IlpBudget) -> str:
    """The ILP's limit in words: ``"10 s"`` or ``"a budget of 2000 binaries and 50 nodes"``."""
    if isinstance(limit, IlpBudget):
        return f"a budget of {limit.max_binaries} binaries and {limit.max_nodes} nodes"
    return f"{limit:g} s"


def _run_highs(core, problem: PartitionProblem, seg: dict[tuple[int, int, int], float], ub: float,
               phase2_bound: float | None, limit: tuple[float, IlpBudget | None]) -> tuple[str, list | None, float]:
    """Build the model of :func:`solve_ilp` over the segments ``seg`` (cost in s) and solve it with HiGHS until
    ``limit``: ``(deadline, budget)``, a ``time.perf_counter`` value (``inf``: none) and an :class:`IlpBudget` (its
    ``max_nodes``) or None. ``phase2_bound`` None: minimise the objective; else fix it ``<= phase2_bound`` and
    minimise ``sum_s cost_s^2``.

    Returns ``(status, chosen, objective)``: ``Optimal``, ``<HiGHS model status> (feasible, not proven optimal)``
    (an incumbent), ``Infeasible``, ``NotSolved`` (the limit was spent before the model was built) or HiGHS' model
    status (no solution); the segments at 1 (None without a solution); the objective's value.

    Rows, in order: one segment per stage; per rank ``T - cost_r >= 0`` (and, with virtual stages and a memory
    model, the rank's memory <= the limit); with virtual stages and the bottleneck objective ``T - vpp cost_s >= 0``
    per stage; flow conservation per (stage boundary, layer); in the second pass the fixed objective. Columns: ``T``,
    then the binaries ordered by their names ``u_s_i_j`` (a fixed order; HiGHS' choice among equal optima follows
    it). Zero coefficients are left out.
    """
    if limit[0] - time.perf_counter() <= 0.01:  # the limit is spent before the model is built
        return "NotSolved", None, math.inf
    inf = core.kHighsInf
    m, vpp, bottleneck = problem.microbatches, problem.vpp, problem.objective == "bottleneck"
    P, S = problem.num_ranks, problem.num_stages
    r = _Rows.lay_out(problem, seg, phase2_bound, inf)
    one, neck, mem, chunk, flow, fixed = r.one, r.neck, r.mem, r.chunk, r.flow, r.fixed
    with _native_stdout_silenced():
        h = core._Highs()
        h.setOptionValue("output_flag", False)
    h.setOptionValue("presolve_rule_off", PRESOLVE_RULE_OFF)
    lp = core.HighsLp()
    lp.num_row_ = lp.a_matrix_.num_row_ = len(r.lower)
    lp.row_lower_, lp.row_upper_ = r.lower, r.upper
    h.passModel(lp)  # rows only; columns follow one by one (scalar calls: no array types, so no numpy)
    add_var, set_cost, set_int, set_coeff = h.addVar, h.changeColCost, h.changeColIntegrality, h.changeCoeff
    # T: continuous, >= 0; bounded by the heuristic's objective for the bottleneck objective without virtual stages
    # (with them T also bounds vpp x each chunk, which can exceed that objective)
    add_var(0.0, ub * (1 + 1e-9) + 1e-15 if bottleneck and ub < math.inf and vpp == 1 else inf)
    t_cost = 0.0 if phase2_bound is not None else 1.0 if bottleneck else m - 1.0
    if t_cost:
        set_cost(0, t_cost)
    t_fixed = 1.0 if bottleneck else m - 1.0
    for row in sorted(neck + chunk + ([fixed] if fixed is not None and t_fixed else [])):
        set_coeff(row, 0, t_fixed if row == fixed else 1.0)
    keys = sorted(seg, key=lambda k: f"u_{k[0]}_{k[1]}_{k[2]}")
    integer = core.HighsVarType.kInteger
    for col, k in enumerate(keys, start=1):
        s, i, j = k
        c = seg[k]
        add_var(0.0, 1.0)
        set_int(col, integer)
        cost = c * c if phase2_bound is not None else 0.0 if bottleneck else c
        if cost:
            set_cost(col, cost)
        entries = [(one[s], 1.0)]
        if c:
            entries.append((neck[s % P], -c))
            if chunk:
                entries.append((chunk[s], -(vpp * c)))
            if fixed is not None and not bottleneck:
                entries.append((fixed, c))
        if mem:
            mb = problem.memory(s, i, j)
            if mb:
                entries.append((mem[s % P], mb))
        if s < S - 1:
            entries.append((flow[(s, j)], 1.0))
        if s > 0:
            entries.append((flow[(s - 1, i)], -1.0))
        for row, v in sorted(entries):
            set_coeff(row, col, v)
    return _solve(core, h, keys, limit)


def _solve(core, h, keys: list[tuple[int, int, int]], limit: tuple[float, IlpBudget | None]
           ) -> tuple[str, list | None, float]:
    """Run the built model ``h`` (columns: ``T``, then ``keys``) under ``limit`` (``(deadline, budget)`` as in
    :func:`_run_highs`); its ``(status, chosen, objective)``."""
    deadline, budget = limit
    seconds = deadline - time.perf_counter()  # what is left once the model is built
    if seconds <= 0.01:
        return "NotSolved", None, math.inf
    if seconds < math.inf:
        h.setOptionValue("time_limit", float(seconds))
    if budget is not None:
        h.setOptionValue("mip_max_nodes", int(budget.max_nodes))
    with _native_stdout_silenced():
        h.run()
    status, solved, value = _status(core, h)
    if not solved:
        return status, None, math.inf
    x = h.getSolution().col_value
    return status, [k for col, k in enumerate(keys, start=1) if x[col] > 0.5], value


@dataclass(frozen=True)
class _Rows:
    """The row layout of :func:`_run_highs`' model, in order: one segment per stage (``one``), per rank the
    bottleneck row (``neck``) and, with virtual stages and a memory model, the memory row (``mem``), per stage the
    chunk row with virtual stages and the bottleneck objective (``chunk``), flow conservation per (stage boundary,
    layer) (``flow``), and in the second pass the fixed objective (``fixed``); their bounds ``lower`` / ``upper``."""
    lower: list[float]
    upper: list[float]
    one: list[int]
    neck: list[int]
    mem: list[int]
    chunk: list[int]
    flow: dict[tuple[int, int], int]
    fixed: int | None

    @staticmethod
    def lay_out(problem: PartitionProblem, seg: dict[tuple[int, int, int], float], phase2_bound: float | None,
                inf: float) -> "_Rows":
        S, L, P, vpp = problem.num_stages, problem.num_layers, problem.num_ranks, problem.vpp
        lower: list[float] = []
        upper: list[float] = []

        def rows(n: int, lo: float, hi: float) -> list[int]:
            lower.extend([lo] * n)
            upper.extend([hi] * n)
            return list(range(len(lower) - n, len(lower)))

        one = rows(S, 1.0, 1.0)
        neck, mem = [], []
        for _ in range(P):
            neck += rows(1, 0.0, inf)
            if vpp > 1 and problem.memory is not None:
                mem += rows(1, -inf, problem.memory_limit)
        chunk = rows(S, 0.0, inf) if vpp > 1 and problem.objective == "bottleneck" else []
        ends, starts = {(k[0], k[2]) for k in seg}, {(k[0], k[1]) for k in seg}
        flow = {(s, x): rows(1, 0.0, 0.0)[0] for s in range(S - 1) for x in range(L + 1)
                if (s, x) in ends or (s + 1, x) in starts}
        fixed = rows(1, -inf, phase2_bound)[0] if phase2_bound is not None else None
        return _Rows(lower, upper, one, neck, mem, chunk, flow, fixed)


def _status(core, h) -> tuple[str, bool, float]:
    """``(status, solved, objective)`` of a finished HiGHS run, in :func:`_run_highs`' words."""
    model_status, info = h.getModelStatus(), h.getInfo()
    solved = info.primal_solution_status == core.kSolutionStatusFeasible
    name = model_status.name.removeprefix("k")
    if model_status == core.HighsModelStatus.kOptimal and solved:
        status = "Optimal"
    elif solved:
        status = f"{name} (feasible, not proven optimal)"
    elif model_status in (core.HighsModelStatus.kInfeasible, core.HighsModelStatus.kUnboundedOrInfeasible):
        status = "Infeasible"
    else:
        status = name
    return status, solved, info.objective_function_value


def _on_paths(seg: dict[tuple[int, int, int], float], S: int, L: int) -> dict[tuple[int, int, int], float]:
    """The segments of ``seg`` on some path stage 0 .. S-1 from layer 0 to layer L that uses only segments of
    ``seg`` (forward reachability from layer 0, backward from layer L); a plan whose segments all lie in ``seg`` is
    such a path, so dropping the others loses no plan. For the bottleneck objective at the greedy bound this
    leaves the segments of near-optimal plans only (measured on the default plan's two models: 8 of 944 and 17 of
    931 segments)."""
    reach = [set() for _ in range(S + 1)]
    reach[0].add(0)
    by_stage: list[list[tuple[int, int, int]]] = [[] for _ in range(S)]
    for k in seg:
        by_stage[k[0]].append(k)
    for s in range(S):
        reach[s + 1].update(k[2] for k in by_stage[s] if k[1] in reach[s])
    back = {L}
    keep: list[tuple[int, int, int]] = []
    for s in range(S - 1, -1, -1):
        here = [k for k in by_stage[s] if k[2] in back and k[1] in reach[s]]
        keep += here
        back = {k[1] for k in here}
    kept = set(keep)
    return {k: c for k, c in seg.items() if k in kept}


def _read_boundaries(chosen: list[tuple[int, int, int]], S: int) -> list[int]:
    """Boundaries from the chosen (stage, start, end) segments."""
    b = [0] + [k[2] for k in sorted(chosen)]
    if len(b) != S + 1:
        raise PartitionError(f"ILP returned {len(chosen)} segments for {S} stages")
    return b
