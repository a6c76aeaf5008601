"""Fidelity of the planner's prediction of the runner on this machine: ``tessera-lab validate``'s
matrix, printed with the targets. Prints, never asserts (timings on a shared 2-core machine are noisy).

    python benchmarks/bench_fidelity.py [--quick] [--device data/devices/NAME.json] [--json PATH] [--repeat N]

``--repeat N`` runs the validation N times (each with its own fresh calibration unless ``--device``) and
prints the spread: on this shared VM one run is not a verdict (quick runs minutes apart read 1.6-18.3 %).

Calibration runs (microbenchmarks, separate processes) are disjoint from the validated runs; every prediction
is made before its run. Targets: median |error| <= 10 % on a busy 2-core machine, <= 5 % on a quiet one; rank
agreement >= 90 %.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Fidelity of the planner's prediction of the runner: tessera-lab "
                                             "validate's matrix with the targets")
    p.add_argument("--quick", action="store_true", help="the small matrix")
    p.add_argument("--device", default=None, help="calibrated device file (default: calibrate now, per run)")
    p.add_argument("--steps", type=int, default=None, help="steps per case, >= 2 (the first a warm-up)")
    p.add_argument("--json", default=None, help="the last run's result")
    p.add_argument("--repeat", type=int, default=1, help="runs (each with its own calibration unless --device)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        print(f"bench_fidelity: --repeat = {args.repeat} is out of range; allowed: >= 1", file=sys.stderr)
        return 2
    import statistics

    from tessera_lab.io import write_json
    from tessera_lab.runner.testbed.validate import TARGETS, validate_from_args

    from tessera_lab.errors import TesseraError

    runs = []
    for k in range(args.repeat):
        try:
            result, text = validate_from_args(args)
        except TesseraError as exc:
            print(f"bench_fidelity: {exc}", file=sys.stderr)
            return 2
        runs.append(result)
        print(f"--- run {k + 1} of {args.repeat}" if args.repeat > 1 else "", text, sep="\n")
    if args.repeat > 1:
        me = [r["median_abs_error"] for r in runs]
        ra = [r["rank_agreement"] for r in runs]
        print(f"over {args.repeat} runs: median |error| " + ", ".join(f"{x:.1%}" for x in me)
              + f" (median {statistics.median(me):.1%}); rank agreement " + ", ".join(f"{x:.0%}" for x in ra)
              + f" (median {statistics.median(ra):.0%})")
    print(f"targets: median |error| <= {TARGETS['median_abs_error_busy']:.0%} (busy 2-core machine), "
          f"<= {TARGETS['median_abs_error_quiet']:.0%} (quiet); rank agreement >= {TARGETS['rank_agreement']:.0%}")
    ok_err = result["median_abs_error"] <= TARGETS["median_abs_error_busy"]
    ok_rank = result["rank_agreement"] >= TARGETS["rank_agreement"]
    print(f"median |error| {'meets' if ok_err else 'misses'} the busy-machine target; rank agreement "
          f"{'meets' if ok_rank else 'misses'} its target (load {result['machine']['load_before'][0]} on "
          f"{result['machine']['cores']} cores)")
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
