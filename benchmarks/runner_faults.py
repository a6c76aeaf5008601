"""Runner fault detection: inject a killed / hung / raising rank into ``pp=2, ep=2`` launches and measure how
fast the spawner detects it and whether it names the right rank.

Usage: ``PYTHONPATH=$PWD python benchmarks/runner_faults.py --trials 20 [--kinds kill,hang,raise]``

Prints, per fault kind: trials, named correctly (count), detection time after the injection (median, max;
measured: wall clock of the fault record written by the faulty rank just before the fault, to the spawner's
detection) and the stated bound (analytic: :data:`tessera_lab.runner.launch.supervise.DETECT_BOUND_S`). The faulty
rank cycles over the world's ranks. Report ``uptime`` with the numbers (2 shared cores are noisy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tessera_lab.runner.launch import supervise
from tessera_lab.runner.launch.spawn import _alive, spawn
from tessera_lab.runner.runtime.specs import RunnerError, RunSpec, WorldSpec


def trial(kind: str, rank: int, delay: float, out: Path) -> dict:
    """One launch with ``TESSERA_LAB_FAULT=rank:kind:delay``: named rank, detection seconds, orphans."""
    t0 = time.monotonic()
    try:
        spawn(WorldSpec(pp=2, ep=2, timeout_s=60, grace_s=10), [RunSpec(name="fault", steps=10_000)],
              out_dir=out, timeout_s=300, env={"TESSERA_LAB_FAULT": f"{rank}:{kind}:{delay}"})
    except RunnerError as err:
        try:
            injected = json.loads((out / f"fault-{rank}.json").read_text())["time"]
        except (OSError, ValueError, KeyError):
            injected = None
        det = (err.detected_at - injected) if (injected is not None and err.detected_at) else None
        return {"named": err.failed_rank, "ok": err.failed_rank == rank, "detect_s": det, "cause": err.cause,
                "orphans": sum(_alive(p) for p in err.pids.values()), "total_s": time.monotonic() - t0}
    return {"named": None, "ok": False, "detect_s": None, "cause": "no failure", "orphans": 0,
            "total_s": time.monotonic() - t0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20, help="trials per fault kind")
    p.add_argument("--kinds", default="kill,hang", help="comma-separated: kill,hang,raise")
    p.add_argument("--delay", type=float, default=1.0, help="seconds after joining the group before the fault")
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    if args.trials < 1 or any(k not in supervise.FAULT_KINDS for k in kinds):
        print("runner_faults: error: --trials >= 1 and --kinds from kill,hang,raise", file=sys.stderr)
        return 2
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average); heartbeat every {supervise.HEARTBEAT_S} s, hung after "
          f"{supervise.heartbeat_timeout()} s; stated detection bound {supervise.DETECT_BOUND_S} s (analytic)")
    for kind in kinds:
        rows = []
        for i in range(args.trials):
            with tempfile.TemporaryDirectory(prefix="tessera-fault-") as d:
                rows.append(trial(kind, i % 4, args.delay, Path(d)))
            r = rows[-1]
            print(f"  {kind} #{i + 1}: rank {i % 4} -> named {r['named']} ({r['cause']}); detected "
                  f"{r['detect_s'] if r['detect_s'] is None else round(r['detect_s'], 2)} s; orphans {r['orphans']}",
                  flush=True)
        ds = [r["detect_s"] for r in rows if r["detect_s"] is not None]
        ok = sum(r["ok"] for r in rows)
        within = sum(d <= supervise.DETECT_BOUND_S for d in ds)
        print(f"{kind}: named correctly {ok}/{len(rows)}; detected within {supervise.DETECT_BOUND_S:.0f} s "
              f"{within}/{len(rows)}; detection (measured) median {statistics.median(ds) if ds else float('nan'):.2f} s, "
              f"max {max(ds) if ds else float('nan'):.2f} s; orphans {sum(r['orphans'] for r in rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
