"""Benchmark of ``tessera-lab search``: layouts settled and layouts planned per CPU second, the planned rate against a
baseline of the same run, and the pruning ratio.

For each case (Qwen3-Next-80B-A3B on 256 H200 with 4,194,304 tokens per iteration, the acceptance case of
docs/search.md; DeepSeek-V3 on 1,024 H200 with the default global batch) it runs the search in this process and
prints:

* layouts enumerated, pruned by each rule, planned (full planner runs, refusals included);
* the CPU seconds of the whole search (this process plus, with ``--jobs`` > 1, its planner processes:
  ``getrusage(RUSAGE_SELF)`` and ``RUSAGE_CHILDREN``, measured around the call) and of its planner runs alone;
* **layouts settled per CPU second**: layouts planned plus layouts ruled out by a rule that is a proof (parameter
  memory, memory bound, time bound) over the CPU seconds of the whole search (target >= 50 for a 256-GPU search,
  docs/search.md, "Planning rate"); the layouts left at the plan budget are not settled and are printed apart;
* **layouts planned per CPU second**: full planner runs over the same CPU seconds;
* **baseline**: the first ``--baseline N`` layouts the search planned, planned again one by one with nothing shared
  between runs (every cache a run shares with earlier ones emptied before it: stage costs, pair searches, stage pair
  sums, partition segments) and the ILP with virtual stages at ``--baseline-limit`` seconds of wall clock (default
  0.05; the search itself runs that ILP under a work budget, :data:`~tessera_lab.plan.search.VIRTUAL_ILP_BUDGET`;
  ``plan``'s own default is 10 s); layouts per CPU second, and the search's rate over it;
* the pruning ratio: layouts ruled out by a rule (parameter memory, memory bound, time bound) over the enumerated.

The load average is printed before and after (CPU seconds grow on a loaded machine). Timings are printed, never
asserted.

Run: python benchmarks/bench_search.py [--max-plans N] [--jobs J] [--baseline N] [--baseline-limit S]
[--case qwen|dsv3|all]
"""

from __future__ import annotations

import argparse
import os
import resource

CASES = {"qwen": ("qwen3-next-80b-a3b", 256, 4194304), "dsv3": ("deepseek-v3", 1024, None)}


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its waited-for children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


def _clear_shared_caches() -> None:
    """Empty the caches a planner run shares with earlier runs in the same process (a fresh ``plan`` process
    starts with them empty)."""
    from tessera_lab.overlap import search as osearch
    from tessera_lab.plan import problem, stages

    osearch._SEARCHED.clear()
    stages._COSTS.clear()
    stages._FB_CACHES.clear()
    stages._pair_result.cache_clear()
    problem._SEGMENTS.clear()


def baseline_rate(model, layouts, seq_len: int, gpus: int, limit_s: float) -> tuple[float, float]:
    """``(layouts per CPU second, CPU seconds)`` of planning ``layouts`` one by one with the search's planner options
    (objective auto, the DP with one chunk per rank, the ILP with virtual stages at ``limit_s`` seconds, the uniform
    baseline) and every shared cache emptied before each run; refusals count as runs."""
    from tessera_lab.errors import TesseraError
    from tessera_lab.model.hardware import Cluster
    from tessera_lab.plan.make import make_plan
    from tessera_lab.plan.search import PLAN_OPTIONS

    cluster = Cluster.dgx("H200", gpus // 8)
    t0 = _cpu()
    for lay in layouts:
        _clear_shared_caches()
        opts = dict(PLAN_OPTIONS, **({"method": "ilp", "limit": limit_s} if lay.vpp > 1 else {}))
        try:
            make_plan(model, lay.parallel(seq_len), cluster, **opts)
        except TesseraError:
            pass
    cpu = _cpu() - t0
    return len(layouts) / cpu, cpu


def run_case(name: str, gpus: int, tokens: int | None, args) -> dict:
    from tessera_lab.model.spec import load_model
    from tessera_lab.plan.search import search

    model = load_model(name)
    _clear_shared_caches()
    t0 = _cpu()
    res = search(model, gpus, global_batch_tokens=tokens, max_plans=args.max_plans, jobs=args.jobs)
    cpu = _cpu() - t0
    planned = len(res.planned)
    plan_cpu = sum(c.result.get("cpu_s", 0.0) for c in res.planned)
    by_rule = res.settled - planned  # ruled out by parameter memory, the memory bound or the time bound
    base_rate, base_cpu = baseline_rate(model, [c.layout for c in res.planned[:args.baseline]], res.seq_len, gpus,
                                        args.baseline_limit)
    return {"model": name, "gpus": gpus, "enumerated": res.enumerated, "pruned": res.pruned, "planned": planned,
            "errors": sum(res.errors.values()), "cpu_s": cpu, "planner_cpu_s": plan_cpu,
            "planned_per_cpu_s": planned / cpu, "baseline_per_cpu_s": base_rate, "baseline_cpu_s": base_cpu,
            "settled_per_cpu_s": res.settled / cpu, "unsettled": res.pruned.get("budget", 0),
            "pruning_ratio": by_rule / res.enumerated,
            "best_s": res.ranked[0].result["iteration_time_s"] if res.ranked else float("nan")}


def main() -> None:
    from tessera_lab.plan.search import DEFAULT_MAX_PLANS

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--max-plans", type=int, default=DEFAULT_MAX_PLANS)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--baseline", type=int, default=24, help="layouts planned again for the baseline (default 24)")
    ap.add_argument("--baseline-limit", type=float, default=0.05, help="the baseline's ILP limit, s (default 0.05)")
    ap.add_argument("--case", choices=[*CASES, "all"], default="all")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    for key in (CASES if args.case == "all" else [args.case]):
        r = run_case(*CASES[key], args)
        print(f"{r['model']} on {r['gpus']} GPUs (--jobs {args.jobs}): {r['enumerated']:,} enumerated, pruned "
              f"{r['pruned']}, {r['planned']} planned ({r['errors']} refused by the planner); {r['cpu_s']:.1f} CPU s "
              f"with the planner processes ({r['planner_cpu_s']:.1f} in planner runs that returned a plan); "
              f"{r['settled_per_cpu_s']:.0f} layouts settled per CPU s (planned or ruled out by a proof; target >= 50 "
              f"at 256 GPUs; {r['unsettled']:,} left unsettled at the plan budget), "
              f"{r['planned_per_cpu_s']:.1f} layouts planned per CPU s; baseline (the "
              f"first {args.baseline} planned again one by one, nothing shared, ILP limit {args.baseline_limit:g} s): "
              f"{r['baseline_per_cpu_s']:.1f} per CPU s ({r['baseline_cpu_s']:.1f} CPU s), ratio "
              f"{r['planned_per_cpu_s'] / r['baseline_per_cpu_s']:.1f}x (planned rates); pruning ratio "
              f"{r['pruning_ratio']:.1%}; best iteration {r['best_s']:.3f} s (simulated)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
