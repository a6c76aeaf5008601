"""Dynamic bubble optimizer over many seeds, and its dynamic part over ZB-H1 at Qwen3-Next scale (simulated).

Part 1 (the issue's acceptance): ``simulate --schedule S --stages 8 --microbatches 32 --f 1 --b 2 --w 1
--routing zipf:1.2 --dynamic`` for S in overlapped, dualpipev, 1f1b, zb-h1 over ``--seeds`` routing seeds (200 by
default): mean, spread and range of the throughput gain on the *realised* routing (means over steps 1..3; step 0
has no history), the static part (same controller, uniform routing) and every (seed, step) that ended slower than
the static plan, with its loss.

Part 2: Qwen3-Next-80B-A3B stage costs from the analytic cost model (pp=8, ep=8, 32 micro-batches, H200), ZB-H1,
per-layer drifting skew ``walk:1.2``: static part, total gain and dynamic part, idle time removed per rank (ms),
gap prediction error, for the memory caps ``max`` (ZB-H1's own peak on every rank) and ``max+2``.

Everything printed is simulated (analytic durations, no measurement). Nothing is asserted. Prints the machine load.

Run: ``python benchmarks/bench_dynamic.py [--seeds 200] [--model-seeds 5] [--part 1|2|both]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from tessera_lab.dynamic.durations import StageCosts
from tessera_lab.dynamic.online import run_online


def part1(seeds: int) -> None:
    print(f"== part 1: 8 stages, 32 micro-batches, F=1 B=2 W=1 (s), zipf:1.2, {seeds} seeds, 4 steps (simulated)")
    for name in ("overlapped", "dualpipev", "1f1b", "zb-h1"):
        t0 = time.perf_counter()
        per = 2 if name == "dualpipev" else 1
        costs = StageCosts.synthetic(8 * per, 1.0, 2.0, 1.0, layers_per_stage=4, ep=8, num_experts=64, top_k=8,
                                     tokens=8 * 4096)
        kw = dict(schedule=name, microbatches=32, steps=4)
        static_part = run_online(costs, "uniform", **kw).throughput_gain
        gains, lost = [], []
        for seed in range(seeds):
            r = run_online(costs, "zipf:1.2", seed=seed, **kw)
            gains.append(r.throughput_gain)
            lost += [(seed, s["step"], s["gain"]) for s in r.evaluated if s["dynamic_s"] > s["static_s"] * (1 + 1e-12)]
        g = np.array(gains)
        print(f"{name:11s} gain mean {100 * g.mean():+.3f}%  std {100 * g.std():.3f}  min {100 * g.min():+.3f}%  "
              f"max {100 * g.max():+.3f}%  | static part {100 * static_part:+.3f}%  dynamic part "
              f"{100 * (g.mean() - static_part):+.3f}%  | losing (seed, step) {len(lost)} of {3 * seeds}"
              + (f": {', '.join(f'({a},{b}) {100 * c:+.3f}%' for a, b, c in lost[:12])}" if lost else "")
              + f"  [{time.perf_counter() - t0:.0f} s]")


def part2(seeds: int) -> None:
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model

    par = ParallelConfig(pp=8, ep=8, microbatches=32, schedule="zb-h1")
    costs = StageCosts.from_model(load_model("qwen3-next-80b-a3b"), par)
    print(f"== part 2: {costs.description}; ZB-H1, 32 micro-batches, walk:1.2, {seeds} seeds (simulated)")
    for cap in ("max", "max+2"):
        kw = dict(schedule="zb-h1", microbatches=32, steps=4, memory_cap=cap)
        uni = run_online(costs, "uniform", **kw)
        rs = [run_online(costs, "walk:1.2", seed=s, **kw) for s in range(seeds)]
        g = np.array([r.throughput_gain for r in rs])
        idle = np.array([r.idle_static_s - r.idle_dynamic_s for r in rs]) * 1e3
        err = np.array([r.summary()["gap_rel_error"] for r in rs])
        slow = sum(len(r.summary()["slower_steps"]) for r in rs)
        print(f"cap {cap:6s} static part {100 * uni.throughput_gain:+.3f}%  total {100 * g.mean():+.3f}% "
              f"(min {100 * g.min():+.3f}, max {100 * g.max():+.3f})  dynamic part "
              f"{100 * (g.mean() - uni.throughput_gain):+.3f}%  idle removed {idle.mean():.2f} ms/rank  "
              f"gap error {100 * err.mean():.0f}% of realised wait  slower steps {slow}  "
              f"iteration {1e3 * np.mean([r.iteration_static_s for r in rs]):.1f} ms static")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200)
    ap.add_argument("--model-seeds", type=int, default=5)
    ap.add_argument("--part", choices=("1", "2", "both"), default="both")
    args = ap.parse_args()
    print(f"machine load (1, 5, 15 min): {os.getloadavg()}")
    if args.part in ("1", "both"):
        part1(args.seeds)
    if args.part in ("2", "both"):
        part2(args.model_seeds)
    print(f"machine load (1, 5, 15 min): {os.getloadavg()}")


if __name__ == "__main__":
    main()
