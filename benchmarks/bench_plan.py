"""Benchmark of the main job.

Prints (1) the end-to-end time of ``tessera-lab plan`` with its defaults (Qwen3-Next-80B-A3B, pp=8, ep=8,
m=32 on H200), measured in-process and as a fresh subprocess (what a user waits for), against the
5 s target; (2) the ILP and DP solve times for Qwen3-235B-A22B (94 layers) on 16 stages with memory limits,
as a ratio ILP/DP measured in this run. Timings are printed, never asserted.

Run: python benchmarks/bench_plan.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from tessera_lab.hardware import ParallelConfig, cluster_for
    from tessera_lab.models import load_model
    from tessera_lab.partition import solve_dp, solve_ilp
    from tessera_lab.plan import make_plan, planning_problem

    model = load_model("qwen3-next-80b-a3b")
    t_plan = median_time(lambda: make_plan(model), args.repeats)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tessera_lab", "plan", "--json", "-"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_cli = time.perf_counter() - t0
    print(f"plan (default Qwen3-Next-80B-A3B, pp=8, ep=8, m=32): in-process median {t_plan:.3f} s, "
          f"CLI subprocess {t_cli:.3f} s; target < 5 s -> {t_cli / 5.0:.2f} of the budget")

    big = load_model("qwen3-235b-a22b")
    # overlapped 1F1B holds up to 2p micro-batches on the first stage: dp=2 shards optimizer state enough to fit
    parallel = ParallelConfig(pp=16, ep=8, dp=2, microbatches=32)
    prob, _ = planning_problem(big, parallel, cluster_for(parallel))
    dp_res, ilp_res = solve_dp(prob), solve_ilp(prob)
    t_dp = median_time(lambda: solve_dp(prob), args.repeats)
    t_ilp = median_time(lambda: solve_ilp(prob), args.repeats)
    assert abs(dp_res.objective - ilp_res.objective) <= 1e-9 * dp_res.objective
    print(f"Qwen3-235B-A22B, 94 layers on 16 stages (overlap-aware costs, memory limits): DP {t_dp * 1e3:.1f} ms, "
          f"ILP ({ilp_res.solver}, {ilp_res.status}, {ilp_res.num_variables} variables) {t_ilp * 1e3:.1f} ms; "
          f"ILP/DP = {t_ilp / t_dp:.1f}x; same optimum {dp_res.objective * 1e3:.3f} ms/micro-batch")


if __name__ == "__main__":
    main()
