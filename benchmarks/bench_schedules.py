"""zb-auto against ZB-H1 and ZB-H2 over a grid of pipeline sizes, time profiles, p2p times and memory budgets.

For every (p, m, profile, p2p) the baselines ZB-H1 (peak p micro-batches) and ZB-H2 (peak 2p - 1) are simulated
in the same run with the same per-stage times; zb-auto is then searched at budgets K from p to 2p - 1 and
simulated. Printed: simulated makespans (provenance: simulated, from the synthetic per-stage times below, no
measurement), the ratios zb-auto / ZB-H1 and zb-auto / ZB-H2 (< 1 is faster; ZB-H2 marked "no fit" when its
peak exceeds K), the search's CPU and wall seconds (measured on this machine, noisy) and the machine load.

Profiles (seconds per micro-batch and stage): ``uniform`` F = I = W = 1; ``jitter`` every F, I, W drawn from
1 +- 25 % (seeded); ``head`` uniform except a last stage 1.5x (an LM head); ``light-w`` W = 0.4.

The targets section (:func:`targets`) runs the same grid's zb-auto searches and the nine cases of
:data:`SAIL_CASES` on the baseline revision (:mod:`baseline`) and on this tree, each in a fresh process in this run:
search CPU seconds summed (targets: no more than the baseline's over the grid, no more than sail-sg's heuristic on
the nine cases) beside the process's CPU and wall seconds, how many makespans are equal, better or worse (target:
none worse) and the load. With ``--sail-sg REPO`` the sail-sg section first prints, per case, sail-sg's search CPU,
the pruned search's (the default) and the exhaustive search's (``search="exhaustive"``, reported beside it) and the
three makespans (simulated here); see docs/performance.md.

With ``--random N`` it prints how the pruned search compares with the exhaustive one on N random cases outside the
grid.

Run: ``python benchmarks/bench_schedules.py [--sail-sg REPO] [--random N] [--targets-only] [--pp 4 8] [--rounds 2 4]
[--seed 0] [--no-targets]``
"""

from __future__ import annotations

import argparse
import os
import random
import time

from tessera_lab.pipeline.schedules import zb_auto, zb_h1, zb_h2
from tessera_lab.pipeline.simulate import simulate, stage_durations


def profiles(p: int, seed: int) -> dict[str, tuple[list[float], list[float], list[float]]]:
    rng = random.Random(seed * 1000 + p)
    jit = [[rng.uniform(0.75, 1.25) for _ in range(p)] for _ in range(3)]
    head = [1.0] * (p - 1) + [1.5]
    return {
        "uniform": ([1.0] * p, [1.0] * p, [1.0] * p),
        "jitter": (jit[0], jit[1], jit[2]),
        "head": (head, head, head),
        "light-w": ([1.0] * p, [1.0] * p, [0.4] * p),
    }


GRID_CODE = """
import json, random, time
from tessera_lab.pipeline.schedules import zb_auto
{profiles_src}
out = []
for p in {pps!r}:
    for rounds in {rounds!r}:
        m = rounds * p
        for prof, (f, i, w) in profiles(p, {seed!r}).items():
            for c in {p2ps!r}:
                for K in sorted({{p, p + 1, (3 * p - 1) // 2, 2 * p - 2, 2 * p - 1}}):
                    t0 = time.process_time()
                    T = zb_auto(p, m, f, i, w, p2p=c, memory_budget=K).meta["makespan"]
                    out.append([p, m, prof, c, K, T, time.process_time() - t0])
print(json.dumps(out))
"""


SAIL_CODE = """
import gc, json, random, time
from tessera_lab.pipeline import zerobubble
try:
    from tessera_lab.pipeline import zbsingle
except ImportError:  # the baseline revision has no fast path
    zbsingle = None
from tessera_lab.pipeline.schedules import zb_auto
{profiles_src}
out = []
for p, rounds, prof in {cases!r}:
    m, K = rounds * p, 2 * p - 1
    f, i, w = profiles(p, {seed!r})[prof]
    best = float("inf")
    for _ in range({repeats!r}):
        for mod, name in ((zerobubble, "_pruned_candidates"), (zbsingle, "action_table"),
                          (zerobubble, "_h1_candidates"), (zerobubble, "_unit_greedy_candidates")):
            if hasattr(mod, name):
                getattr(mod, name).cache_clear()
        gc.collect(); gc.disable()
        t0 = time.process_time()
        T = zb_auto(p, m, f, i, w, p2p=0.05, memory_budget=K).meta["makespan"]
        best = min(best, time.process_time() - t0)
        gc.enable()
    out.append([p, m, prof, T, best])
print(json.dumps(out))
"""


def targets(rev: str, pps, rounds, p2ps, seed: int, sail: dict | None = None, repeats: int = 3) -> None:
    """The zb-auto targets: this tree against the baseline revision over the grid (search CPU seconds, no
    more than the baseline's, makespans none worse) and, on :data:`SAIL_CASES`, against sail-sg's heuristic
    (``sail``: the totals of :func:`sail_sg_section`; search CPU no more than sail-sg's). Each tree runs in a fresh
    process in this run; the CPU of the searches (``time.process_time`` around ``zb_auto``) is printed beside the
    child process's CPU and wall seconds and the load."""
    import inspect
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from baseline import ROOT, TABLE_HEAD, baseline_tree, load, run_code, target_row

    l0 = load()
    trees = {"baseline": baseline_tree(rev), "now": ROOT}
    code = GRID_CODE.format(profiles_src=inspect.getsource(profiles), pps=list(pps), rounds=list(rounds),
                            p2ps=list(p2ps), seed=seed)
    got = {k: run_code(t, code) for k, t in trees.items()}
    b, n = got["baseline"]["out"], got["now"]["out"]
    worse = sum(y[5] > x[5] * (1 + 1e-12) for x, y in zip(b, n))
    better = sum(y[5] < x[5] * (1 - 1e-12) for x, y in zip(b, n))
    scode = SAIL_CODE.format(profiles_src=inspect.getsource(profiles), cases=list(SAIL_CASES), seed=seed,
                             repeats=repeats)
    sg = {k: run_code(t, scode) for k, t in trees.items()}
    print(f"zb-auto targets: baseline {rev} vs this tree, each in a fresh process in this run; CPU = "
          f"user + sys seconds; load average {l0} (2-core machine shared by several agents)")
    print(TABLE_HEAD)
    print(target_row(f"zb-auto search, {len(n)} grid searches (CPU s)", "<= baseline", sum(x[6] for x in b),
                     sum(x[6] for x in n), "CPU s",
                     extra=f"makespans: {len(n) - worse - better} equal, {better} better, {worse} worse; process "
                           f"CPU {got['baseline']['cpu_s']:.2f} -> {got['now']['cpu_s']:.2f} s, wall "
                           f"{got['baseline']['wall_s']:.2f} -> {got['now']['wall_s']:.2f} s"))
    sb, sn = sg["baseline"]["out"], sg["now"]["out"]
    tb, tn = sum(x[4] for x in sb), sum(x[4] for x in sn)
    sw = sum(y[3] > x[3] * (1 + 1e-12) for x, y in zip(sb, sn))
    note = (f"makespans vs baseline: {sum(y[3] <= x[3] * (1 + 1e-12) for x, y in zip(sb, sn))} of {len(sn)} equal "
            f"or shorter, {sw} longer; process CPU {sg['baseline']['cpu_s']:.2f} -> {sg['now']['cpu_s']:.2f} s, wall "
            f"{sg['baseline']['wall_s']:.2f} -> {sg['now']['wall_s']:.2f} s")
    if sail is None:
        tgt = "<= sail-sg (n/a)"
        note += "; sail-sg not measured (pass --sail-sg REPO)"
    else:
        tgt = f"<= sail-sg {sail['sail']:.4f}"
        note += (f"; now / sail-sg {tn / sail['sail']:.2f}x (sail-sg measured in this process, best of {repeats} "
                 f"cold calls); per case: {sail['faster']} of {sail['cases']} no slower, {sail['not_worse']} of "
                 f"{sail['cases']} makespans equal or shorter than sail-sg's")
    print(target_row(f"zb-auto search, {len(sn)} sail-sg cases (CPU s)", tgt, tb, tn, "CPU s", extra=note))
    print(f"load average after: {load()}\n")


#: the cases compared with sail-sg's heuristic: (p, rounds, profile), p2p 0.05, budget 2p - 1 (ZB-H2's)
SAIL_CASES = ((4, 2, "uniform"), (4, 4, "jitter"), (4, 4, "head"), (4, 2, "light-w"), (8, 2, "uniform"),
              (8, 4, "jitter"), (8, 4, "head"), (8, 4, "light-w"), (8, 2, "jitter"))


def _cold_cpu(fn, repeats: int):
    """``(best CPU seconds of ``repeats`` calls, last result)``: each call with zb-auto's memo caches emptied (a cold
    search, as sail-sg's, which keeps none) and the garbage collector paused, as :mod:`timeit` does."""
    import gc

    from tessera_lab.pipeline import zbsingle, zerobubble

    best, out = float("inf"), None
    for _ in range(repeats):
        for cached in (zerobubble._pruned_candidates, zbsingle.action_table, zerobubble._h1_candidates,
                       zerobubble._unit_greedy_candidates):
            cached.cache_clear()
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time()
            out = fn()
            best = min(best, time.process_time() - t0)
        finally:
            gc.enable()
    return best, out


def sail_sg_section(repo: str, seed: int, repeats: int = 3) -> dict:
    """zb-auto beside sail-sg's heuristic (:mod:`sailsg`) on :data:`SAIL_CASES`: search CPU seconds (measured in this
    process, best of ``repeats`` cold calls each, garbage collector paused) of sail-sg's ``initial_solution``, of the
    pruned search (the default) and of the exhaustive search (the guard reported beside it), and the makespans of
    the three orders simulated by this package's simulator. Returns the totals."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import sailsg
    from baseline import load
    from tessera_lab.pipeline.ir import Schedule

    graph_mod, zb_mod = sailsg.load(repo)
    l0, c0, w0 = load(), time.process_time(), time.perf_counter()
    print(f"zb-auto vs sail-sg's heuristic (commit {sailsg.PINNED[:12]}), p2p 0.05, budget 2p - 1; search CPU seconds "
          f"measured here (best of {repeats} cold calls, gc paused), makespans simulated here; load average {l0}")
    head = (f"{'p':>2} {'m':>3} {'profile':<8} {'sail-sg s':>9} {'pruned s':>9} {'ratio':>6} {'exhaust s':>9} "
            f"{'sail-sg T':>10} {'pruned T':>10} {'exhaust T':>10}  pruned vs sail-sg")
    print(head)
    tot = {"sail": 0.0, "pruned": 0.0, "exhaustive": 0.0}
    faster = not_worse = 0
    for p, rounds, prof in SAIL_CASES:
        m, K, c = rounds * p, 2 * p - 1, 0.05
        f, i, w = profiles(p, seed)[prof]
        d = stage_durations(f, [a + b for a, b in zip(i, w)], w)
        t_s, lists = min((sailsg.run(graph_mod, zb_mod, p, m, f, i, w, c, K) for _ in range(repeats)),
                         key=lambda x: x[0])
        T_s = simulate(Schedule("sail-sg", p, p, m, lists, {s: s for s in range(p)}), d, p2p_time=c).iteration_time
        t_z, sz = _cold_cpu(lambda: zb_auto(p, m, f, i, w, p2p=c, memory_budget=K), repeats)
        t_x, sx = _cold_cpu(lambda: zb_auto(p, m, f, i, w, p2p=c, memory_budget=K, search="exhaustive"), repeats)
        T_z = simulate(sz, d, p2p_time=c).iteration_time  # the simulator's makespan of the returned order
        T_x = sx.meta["makespan"]
        tot["sail"] += t_s
        tot["pruned"] += t_z
        tot["exhaustive"] += t_x
        faster += t_z <= t_s
        not_worse += T_z <= T_s * (1 + 1e-12)
        verdict = ("shorter" if T_z < T_s * (1 - 1e-12) else "equal" if T_z <= T_s * (1 + 1e-12) else "LONGER")
        print(f"{p:>2} {m:>3} {prof:<8} {t_s:>9.4f} {t_z:>9.4f} {t_z / t_s:>5.2f}x {t_x:>9.4f} {T_s:>10.4f} "
              f"{T_z:>10.4f} {T_x:>10.4f}  {verdict}")
    n = len(SAIL_CASES)
    print(f"target: pruned search CPU <= sail-sg's on each case with makespans equal or better: {faster} of {n} "
          f"cases no slower, {not_worse} of {n} makespans equal or shorter")
    print(f"total search CPU: sail-sg {tot['sail']:.4f} s, pruned {tot['pruned']:.4f} s "
          f"({tot['pruned'] / tot['sail']:.2f}x sail-sg's), exhaustive {tot['exhaustive']:.4f} s "
          f"({tot['exhaustive'] / tot['sail']:.1f}x); section: CPU {time.process_time() - c0:.2f} s, wall "
          f"{time.perf_counter() - w0:.2f} s; load average {l0} -> {load()}\n")
    return dict(tot, faster=faster, not_worse=not_worse, cases=n)


def random_section(n: int, seed: int) -> None:
    """The pruned search against the exhaustive one on ``n`` random cases outside the grid (p 2-10, m p .. 4p,
    budgets p .. 2p - 1, p2p 0-0.3, jittered, heterogeneous or light-W times; seeded): how many makespans are
    equal, shorter or longer, the largest gap, and the CPU seconds of both searches."""
    from baseline import load

    rng = random.Random(seed)
    l0 = load()
    counts = {"equal": 0, "shorter": 0, "longer": 0}
    gaps: list[float] = []
    cpu = [0.0, 0.0]
    for _ in range(n):
        p = rng.randint(2, 10)
        m = rng.randint(p, 4 * p)
        kind = rng.choice(["jitter", "heterogeneous", "light-w"])
        if kind == "jitter":
            f = [rng.uniform(0.7, 1.3) for _ in range(p)]
            i = [rng.uniform(0.7, 1.3) for _ in range(p)]
            w = [rng.uniform(0.3, 1.2) for _ in range(p)]
        elif kind == "heterogeneous":
            f = [rng.uniform(0.5, 2) for _ in range(p)]
            i = [x * rng.uniform(1, 2) for x in f]
            w = [x * rng.uniform(0.3, 1) for x in f]
        else:
            f, i, w = [1.0] * p, [1.0] * p, [rng.uniform(0.1, 0.6)] * p
        c, K = rng.choice([0.0, 0.02, 0.1, 0.3]), rng.randint(p, 2 * p - 1)
        t0 = time.process_time()
        a = zb_auto(p, m, f, i, w, p2p=c, memory_budget=K).meta["makespan"]
        t1 = time.process_time()
        b = zb_auto(p, m, f, i, w, p2p=c, memory_budget=K, search="exhaustive").meta["makespan"]
        cpu[0] += t1 - t0
        cpu[1] += time.process_time() - t1
        if a > b * (1 + 1e-12):
            counts["longer"] += 1
            gaps.append(a / b - 1)
        elif a < b * (1 - 1e-12):
            counts["shorter"] += 1
        else:
            counts["equal"] += 1
    print(f"pruned vs exhaustive search on {n} random cases (seed {seed}; p 2-10, m p..4p, K p..2p-1, p2p 0-0.3; "
          f"makespans simulated): {counts['equal']} equal, {counts['shorter']} shorter, {counts['longer']} longer "
          f"(largest gap {max(gaps, default=0.0):.2%}); search CPU pruned {cpu[0]:.2f} s, exhaustive {cpu[1]:.2f} s; "
          f"load average {l0} -> {load()}\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--rounds", type=int, nargs="+", default=[2, 4], help="micro-batches = rounds x pp")
    ap.add_argument("--p2p", type=float, nargs="+", default=[0.0, 0.05])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", default=None, help="git revision to compare with (default benchmarks/baseline.py's)")
    ap.add_argument("--no-targets", action="store_true", help="skip the targets section")
    ap.add_argument("--targets-only", action="store_true", help="stop after the sail-sg and targets sections")
    ap.add_argument("--repeats", type=int, default=3, help="cold calls per case in the sail-sg comparison (best)")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="also compare the pruned and the exhaustive search on N random cases (seed 7)")
    ap.add_argument("--sail-sg", metavar="REPO", default=None,
                    help="a git checkout of sail-sg/zero-bubble-pipeline-parallelism: compare with its heuristic")
    args = ap.parse_args(argv)
    sail = sail_sg_section(args.sail_sg, args.seed, args.repeats) if args.sail_sg else None
    if args.random:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        random_section(args.random, 7)
    if not args.no_targets:
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from baseline import BASELINE_REV

        targets(args.baseline or BASELINE_REV, args.pp, args.rounds, args.p2p, args.seed, sail, args.repeats)
    if args.targets_only:
        return 0
    print(f"load average before: {os.getloadavg()[0]:.2f} (2-core machine shared by several agents)")
    head = (f"{'p':>2} {'m':>3} {'profile':<8} {'p2p':>5} {'K':>3} {'ZB-H1':>8} {'ZB-H2':>8} {'zb-auto':>8} "
            f"{'/H1':>6} {'/H2':>12} {'CPU s':>7} {'wall s':>7}  choice")
    print(head)
    print("-" * len(head))
    wins = between = 0
    for p in args.pp:
        for rounds in args.rounds:
            m = rounds * p
            for prof, (f, i, w) in profiles(p, args.seed).items():
                d = stage_durations(f, [a + b for a, b in zip(i, w)], w)
                for c in args.p2p:
                    h1 = simulate(zb_h1(p, m), d, p2p_time=c).iteration_time
                    tl2 = simulate(zb_h2(p, m), d, p2p_time=c)
                    h2, h2_peak = tl2.iteration_time, max(tl2.peak_activations)
                    for K in sorted({p, p + 1, (3 * p - 1) // 2, 2 * p - 2, 2 * p - 1}):
                        t0, c0 = time.perf_counter(), time.process_time()
                        sched = zb_auto(p, m, f, i, w, p2p=c, memory_budget=K)
                        dt, dc = time.perf_counter() - t0, time.process_time() - c0
                        T = sched.meta["makespan"]
                        fits = h2_peak <= K
                        r2 = f"{T / h2:.4f}" + ("" if fits else " no fit")
                        if p < K < 2 * p - 1:
                            between += 1
                            wins += T < h1 * (1 - 1e-9)
                        choice = sched.meta["choice"].split(";")[0][:40]
                        print(f"{p:>2} {m:>3} {prof:<8} {c:>5.2f} {K:>3} {h1:>8.3f} {h2:>8.3f} {T:>8.3f} "
                              f"{T / h1:>6.4f} {r2:>12} {dc:>7.3f} {dt:>7.3f}  {choice}")
    print(f"\nbudgets strictly between p and 2p-1: zb-auto strictly shorter than ZB-H1 in {wins} of {between}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
