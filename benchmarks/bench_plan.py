"""Benchmark of the main job.

Prints (1) the end-to-end time of ``tessera-lab plan`` with its defaults (Qwen3-Next-80B-A3B, pp=8, ep=8,
m=32 on H200), measured in-process and as a fresh subprocess (what a user waits for), against the
5 s target; (2) the ILP and DP solve times for Qwen3-235B-A22B (94 layers) on 16 stages with memory limits,
as a ratio ILP/DP measured in this run; (3) the plan time of each model family's shipped config (CPU seconds).
Timings are printed, never asserted.

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


# ---------------------------------------------------------------------------------------------------------------
# Section: plan time of each model family (issue 23). Kept apart from main() above: CPU seconds (user + sys of this
# process and its children, time.process_time and resource.RUSAGE_CHILDREN) and wall seconds of make_plan with the
# default method, at a layout each model fits at (H200, 4,096-token sequences, m = 2 pp).
FAMILY_LAYOUTS = {
    "kimi-linear-48b-a3b": (4, 8, 1), "minimax-m1": (16, 32, 1), "jamba-1.5-mini": (4, 8, 1),
    "nemotron-h-56b": (4, 1, 8), "qwen3.5-35b-a3b": (4, 8, 1), "glm-4.5-air": (4, 8, 1), "gpt-oss-20b": (4, 8, 1),
    "llama-4-scout-17b-16e": (4, 8, 1), "deepseek-v3.2": (16, 64, 1), "kimi-k2-instruct": (16, 64, 1),
    "olmoe-1b-7b": (4, 8, 1), "qwen3-vl-30b-a3b": (4, 8, 1),
}


def family_plan_times() -> None:
    """Print the plan time of each new model family's shipped config (CPU and wall seconds, one run each)."""
    import os
    import resource

    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.make import make_plan

    def cpu() -> float:
        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + ch.ru_utime + ch.ru_stime

    print(f"plan time per model family (load average {os.getloadavg()[0]:.2f}; CPU = user + sys, measured):")
    for name, (pp, ep, tp) in FAMILY_LAYOUTS.items():
        c0, w0 = cpu(), time.perf_counter()
        model = load_model(name)
        plan = make_plan(model, ParallelConfig(pp=pp, ep=ep, tp=tp, microbatches=2 * pp))
        print(f"  {name:24s} pp={pp:<2d} ep={ep:<2d} tp={tp}  {model.mixer_kinds():32s} "
              f"CPU {cpu() - c0:6.2f} s  wall {time.perf_counter() - w0:6.2f} s  "
              f"(iteration {plan.chosen.iteration_time_s:.3f} s predicted)")
# --------------------------------------------------------------------------------------------- end of section


if __name__ == "__main__":
    main()
    family_plan_times()
