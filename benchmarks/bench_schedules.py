"""zb-auto against ZB-H1 and ZB-H2 over a grid of pipeline sizes, time profiles, p2p times and memory budgets.

For every (p, m, profile, p2p) the baselines ZB-H1 (peak p micro-batches) and ZB-H2 (peak 2p - 1) are simulated
in the same run with the same per-stage times; zb-auto is then searched at budgets K from p to 2p - 1 and
simulated. Printed: simulated makespans (provenance: simulated, from the synthetic per-stage times below, no
measurement), the ratios zb-auto / ZB-H1 and zb-auto / ZB-H2 (< 1 is faster; ZB-H2 marked "no fit" when its
peak exceeds K), the search's wall time (measured on this machine, noisy) and the machine load.

Profiles (seconds per micro-batch and stage): ``uniform`` F = I = W = 1; ``jitter`` every F, I, W drawn from
1 +- 25 % (seeded); ``head`` uniform except a last stage 1.5x (an LM head); ``light-w`` W = 0.4.

Run: ``python benchmarks/bench_schedules.py [--pp 4 8] [--rounds 2 4] [--seed 0]``
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--rounds", type=int, nargs="+", default=[2, 4], help="micro-batches = rounds x pp")
    ap.add_argument("--p2p", type=float, nargs="+", default=[0.0, 0.05])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f} (2-core machine shared by several agents)")
    head = (f"{'p':>2} {'m':>3} {'profile':<8} {'p2p':>5} {'K':>3} {'ZB-H1':>8} {'ZB-H2':>8} {'zb-auto':>8} "
            f"{'/H1':>6} {'/H2':>12} {'search s':>8}  choice")
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
                        t0 = time.perf_counter()
                        sched = zb_auto(p, m, f, i, w, p2p=c, memory_budget=K)
                        dt = time.perf_counter() - t0
                        T = sched.meta["makespan"]
                        fits = h2_peak <= K
                        r2 = f"{T / h2:.4f}" + ("" if fits else " no fit")
                        if p < K < 2 * p - 1:
                            between += 1
                            wins += T < h1 * (1 - 1e-9)
                        choice = sched.meta["choice"].split(";")[0][:40]
                        print(f"{p:>2} {m:>3} {prof:<8} {c:>5.2f} {K:>3} {h1:>8.3f} {h2:>8.3f} {T:>8.3f} "
                              f"{T / h1:>6.4f} {r2:>12} {dt:>8.2f}  {choice}")
    print(f"\nbudgets strictly between p and 2p-1: zb-auto strictly shorter than ZB-H1 in {wins} of {between}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
