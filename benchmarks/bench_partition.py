"""Benchmark of the partitioner.

(a) ILP vs exact DP solve time on the planner's own problem (overlap-aware stage costs, memory limits) for
    Qwen3-Next-80B-A3B (48 layers, 8 stages) and Qwen3-235B-A22B (94 layers, 16 stages), as a ratio measured
    in this run; both must reach the same optimum.
(b) Simulated iteration time (overlapped 1F1B) of the overlap-aware plan against the uniform and the
    standalone-balanced plans, for Qwen3-Next and variants (attention ratio 1, 3, 7; expert width 256, 512,
    2048), printed as ratios (> 1 means the overlap-aware plan is faster). Timings are printed, never asserted.
(c) Solver limits: 1,000 and 3,000 layers on 64 stages (``partition --costs`` sizes) with the exact DP:
    time and peak Python memory (tracemalloc; the bar is under 1 GiB), and the ILP's wall time against its
    ``limit`` on a virtual-stage problem it cannot close quickly.

Run: python benchmarks/bench_partition.py
"""

from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int = 3) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def ilp_vs_dp(name: str, parallel, repeats: int = 3) -> str:
    """One line: DP and ILP solve times on the planner's problem for a shipped model, their ratio, same optimum."""
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.partition import solve_dp, solve_ilp
    from tessera_lab.plan.make import planning_problem

    model = load_model(name)
    prob, _ = planning_problem(model, parallel, cluster_for(parallel))
    dp_res, ilp_res = solve_dp(prob), solve_ilp(prob)
    t_dp, t_ilp = median_time(lambda: solve_dp(prob), repeats), median_time(lambda: solve_ilp(prob), repeats)
    same = abs(dp_res.objective - ilp_res.objective) <= 1e-9 * dp_res.objective
    return (f"{name}: {model.num_layers} layers on {parallel.pp} stages (overlap-aware costs, memory limits): "
            f"DP {t_dp * 1e3:.1f} ms, ILP {t_ilp * 1e3:.1f} ms ({ilp_res.solver} {ilp_res.status}, "
            f"{ilp_res.num_variables} variables), ILP/DP {t_ilp / t_dp:.2f}x, same optimum: {same}")


#: the two partition problems of the benchmarks; overlapped 1F1B holds up to 2p micro-batches on the first stage,
#: so Qwen3-235B needs dp=2 (optimizer state sharded) to fit
PROBLEMS = {"qwen3-next-80b-a3b": dict(pp=8, ep=8, microbatches=32),
            "qwen3-235b-a22b": dict(pp=16, ep=8, dp=2, microbatches=32)}


def main() -> None:
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import make_plan

    print("(a) ILP vs DP, overlap-aware stage costs with memory limits")
    for name, sizes in PROBLEMS.items():
        print("  " + ilp_vs_dp(name, ParallelConfig(**sizes)))

    print("(b) simulated iteration time, overlapped 1F1B: ratio baseline / overlap-aware (> 1: overlap-aware faster)")
    base = load_model("qwen3-next-80b-a3b")
    variants = [("Qwen3-Next (ratio 3, width 512)", {}, {}),
                ("attention ratio 1", {"attention_ratio": 1}, {}),
                ("attention ratio 7", {"attention_ratio": 7}, {}),
                ("expert width 256", {"moe_intermediate_size": 256}, {}),
                ("expert width 2048 (dp=2 to fit memory)", {"moe_intermediate_size": 2048}, {"dp": 2})]
    for label, changes, par in variants:
        model = base.with_changes(**changes) if changes else base
        plan = make_plan(model, ParallelConfig(**par))
        t = plan.chosen.iteration_time_s
        ub, sb = plan.baselines["uniform"], plan.baselines["standalone"]
        u, s = ub.iteration_time_s, sb.iteration_time_s
        flag = lambda ev: "" if ev.fits_memory else ", EXCEEDS GPU MEMORY"  # noqa: E731
        print(f"  {label:40s} overlap-aware {t:.4f} s | uniform {u:.4f} s ({u / t:.3f}x{flag(ub)}) | "
              f"standalone {s:.4f} s ({s / t:.3f}x{flag(sb)})")
    print("(c) solver limits")
    solver_limits()


def solver_limits() -> None:
    """(c): time and peak memory of the large DP, and the ILP's wall time against its limit."""
    import random
    import tracemalloc

    from tessera_lab.plan.partition import additive_problem, partition_costs, solve_ilp

    rng = random.Random(0)
    for L in (1000, 3000):
        costs = [rng.uniform(1.0, 3.0) for _ in range(L)]
        tracemalloc.start()
        t0 = time.perf_counter()
        part = partition_costs(costs, 64, "ilp", limit=10.0)
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"  {L} layers on 64 stages: {dt:.2f} s (under tracemalloc), peak {peak / 2**20:.1f} MiB, "
              f"{part.solver}, bottleneck {part.bottleneck:.4g} (mean {sum(costs) / 64:.4g})")
    prob = additive_problem([rng.uniform(1.0, 3.0) for _ in range(96)], 32, vpp=4)
    for limit in (1.0, 3.0):
        t0 = time.perf_counter()
        part = solve_ilp(prob, limit=limit)
        print(f"  ILP 96 layers, 8 ranks x vpp 4, time limit {limit:g} s: returned after "
              f"{time.perf_counter() - t0:.2f} s ({part.status})")


if __name__ == "__main__":
    main()
