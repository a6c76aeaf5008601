"""Benchmark of the main job.

Prints (1) the end-to-end time of ``tessera-lab plan`` with its defaults (Qwen3-Next-80B-A3B, pp=8, ep=8,
m=32 on H200), measured in-process and as a fresh subprocess (what a user waits for), against the
5 s target; (2) the ILP and DP solve times for Qwen3-235B-A22B (94 layers) on 16 stages with memory limits,
as a ratio ILP/DP measured in this run. Timings are printed, never asserted.

Run: python benchmarks/bench_plan.py [--repeats N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_partition import PROBLEMS, ilp_vs_dp, median_time  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import make_plan

    model = load_model("qwen3-next-80b-a3b")
    t_plan = median_time(lambda: make_plan(model), args.repeats)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tessera_lab", "plan", "--json", "-"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_cli = time.perf_counter() - t0
    print(f"plan (default Qwen3-Next-80B-A3B, pp=8, ep=8, m=32): in-process median {t_plan:.3f} s, "
          f"CLI subprocess {t_cli:.3f} s; target < 5 s -> {t_cli / 5.0:.2f} of the budget")
    print(ilp_vs_dp("qwen3-235b-a22b", ParallelConfig(**PROBLEMS["qwen3-235b-a22b"]), args.repeats))


if __name__ == "__main__":
    main()
