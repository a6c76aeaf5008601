"""Benchmark of ``tessera-lab search``: layouts planned per CPU second and the pruning ratio.

For each case (Qwen3-Next-80B-A3B on 256 H200 with 4,194,304 tokens per iteration, the acceptance case of
docs/search.md; DeepSeek-V3 on 1,024 H200 with the default global batch) it runs the search in this process with
``--jobs 1`` and prints: layouts enumerated, pruned by each rule, planned (full planner runs), the CPU seconds of
the whole search and of the planner runs alone, layouts planned per CPU second (target >= 50 for a 256-GPU search,
docs/search.md), layouts looked at (planned or pruned) per CPU second, and the pruning ratio (pruned by a rule over
enumerated). The load average is printed before and after (CPU seconds grow on a loaded machine). Timings are
printed, never asserted.

Run: python benchmarks/bench_search.py [--max-plans N]
"""

from __future__ import annotations

import argparse
import os
import time

CASES = [("qwen3-next-80b-a3b", 256, 4194304), ("deepseek-v3", 1024, None)]


def run_case(name: str, gpus: int, tokens: int | None, max_plans: int) -> dict:
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.search import search

    model = load_model(name)
    t0 = time.process_time()
    res = search(model, gpus, global_batch_tokens=tokens, max_plans=max_plans)
    cpu = time.process_time() - t0
    planned = len(res.planned)
    plan_cpu = sum(c.result.get("cpu_s", 0.0) for c in res.planned)
    by_rule = sum(v for k, v in res.pruned.items() if k != "budget")
    return {"model": name, "gpus": gpus, "enumerated": res.enumerated, "pruned": res.pruned, "planned": planned,
            "cpu_s": cpu, "planner_cpu_s": plan_cpu, "planned_per_cpu_s": planned / cpu,
            "looked_at_per_cpu_s": (planned + by_rule) / cpu, "pruning_ratio": by_rule / res.enumerated,
            "best_s": res.ranked[0].result["iteration_time_s"] if res.ranked else None}


def main() -> None:
    from tessera_lab.plan.search import DEFAULT_MAX_PLANS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-plans", type=int, default=DEFAULT_MAX_PLANS)
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    for name, gpus, tokens in CASES:
        r = run_case(name, gpus, tokens, args.max_plans)
        print(f"{r['model']} on {r['gpus']} GPUs: {r['enumerated']:,} enumerated, pruned {r['pruned']}, "
              f"{r['planned']} planned; {r['cpu_s']:.1f} CPU s ({r['planner_cpu_s']:.1f} in planner runs); "
              f"{r['planned_per_cpu_s']:.1f} layouts planned per CPU s (target >= 50 at 256 GPUs), "
              f"{r['looked_at_per_cpu_s']:.0f} looked at per CPU s; pruning ratio {r['pruning_ratio']:.1%}; "
              f"best iteration {r['best_s']:.3f} s (simulated)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
