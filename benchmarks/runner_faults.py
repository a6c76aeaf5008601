"""Runner fault detection under load: inject a killed / hung / raising rank into ``tessera-lab run --pp 2 --ep 2``
launches (one CLI process per trial, as a user runs it) and count how often the right rank is named, with exit
status 3, within the stated bound; then run clean launches and count false failures.

Usage::

    PYTHONPATH=$PWD python benchmarks/runner_faults.py --trials 20 --clean 10 --load 8 \
        [--kinds kill,raise,hang] [--schedules 1f1b,overlapped,zb-h1,dualpipev,dynamic]
    PYTHONPATH=$PWD python benchmarks/runner_faults.py --kinds start-hang --schedules 1f1b --trials 10 \
        --clean 10 --load 6

``--load N`` starts N busy processes (``while True: pass``) for the whole benchmark and stops them at the end.
Per schedule and fault kind it prints: trials, named correctly, exit status 3, ended within the bound, and the
end time after the fault (median, max). *End time* is measured: the wall-clock time written by the faulty rank
just before its fault (``fault-<rank>.json``) to the moment the ``run`` process has exited (every worker reaped).
The bound is :data:`tessera_lab.runner.launch.supervise.DETECT_BOUND_S` (stated) for faults after ready and
:data:`~tessera_lab.runner.launch.supervise.STARTUP_DETECT_BOUND_S` for ``start-hang`` (SIGSTOP ``--delay`` s after
the worker started, before it reports ready; the first line must also print the start-up deadline). The faulty
rank cycles over the ranks. Clean runs are ``run --pp 2 --ep 2 --steps 3 --check`` with default settings: it prints passed (exit 0,
every loss bitwise equal to the reference) and declared hung. Every line of counts starts with
``COUNT``. The load average and the CPU seconds of the benchmark's children are printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tessera_lab.runner.launch import supervise

SCHEDULES = {
    "1f1b": ["--schedule", "1f1b"],
    "overlapped": ["--schedule", "overlapped", "--pair-exec", "scheduled"],
    "zb-h1": ["--schedule", "zb-h1"],
    "dualpipev": ["--schedule", "dualpipev"],
    "dynamic": ["--schedule", "zb-h1", "--dynamic", "--trials", "1"],
}


def _cli(args: list[str], env: dict, timeout: float) -> tuple[int, str, float, str]:
    try:
        p = subprocess.run([sys.executable, "-m", "tessera_lab", "run", *args], env=env, capture_output=True,
                           text=True, timeout=timeout)
        return p.returncode, p.stderr, time.time(), p.stdout
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return 124, err, time.time(), ""


def fault_trial(schedule: str, kind: str, rank: int, delay: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="tessera-fault-") as d:
        env = dict(os.environ, TESSERA_LAB_FAULT=f"{rank}:{kind}:{delay}")
        rc, err, ended, _ = _cli(["--pp", "2", "--ep", "2", "--steps", "10000", "--out", d, *SCHEDULES[schedule]],
                              env, 300)
        try:
            injected = json.loads((Path(d) / f"fault-{rank}.json").read_text())["time"]
        except (OSError, ValueError, KeyError):
            injected = None
    first = err.strip().splitlines()[0] if err.strip() else ""
    m = re.search(r"error: rank (\d+) ", first)
    named = int(m.group(1)) if m else None
    end_s = ended - injected if injected is not None else None
    ok = named == rank and (kind not in supervise.START_FAULTS or "start-up deadline" in first)
    return {"named": named, "ok": ok, "rc": rc, "end_s": end_s, "first": first[:240]}


def clean_trial() -> dict:
    """``run --pp 2 --ep 2 --steps 3 --check`` with default settings: passed = exit 0 and every loss bitwise equal
    to the single-process reference (the ``equal`` column)."""
    t0 = time.time()
    rc, err, ended, out = _cli(["--pp", "2", "--ep", "2", "--steps", "3", "--check"], dict(os.environ), 900)
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit() and "." in line]
    bitwise = rc == 0 and len(rows) >= 3 and all("bitwise" in r for r in rows[:3])
    return {"rc": rc, "ok": bitwise, "hung": "no heartbeat" in err, "wall_s": ended - t0,
            "first": (err.strip().splitlines() or [""])[0][:160]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20, help="fault trials per schedule and kind")
    p.add_argument("--kinds", default="kill,raise,hang",
                   help="comma-separated: " + ",".join(supervise.FAULT_KINDS))
    p.add_argument("--schedules", default=",".join(SCHEDULES), help="comma-separated: " + ",".join(SCHEDULES))
    p.add_argument("--clean", type=int, default=10, help="clean runs (no fault)")
    p.add_argument("--load", type=int, default=0, help="busy processes to start for the benchmark")
    p.add_argument("--delay", type=float, default=1.0, help="seconds after a rank is ready before the fault")
    args = p.parse_args(argv)
    kinds = args.kinds.split(",")
    scheds = args.schedules.split(",")
    if (args.trials < 0 or args.clean < 0 or args.load < 0 or any(k not in supervise.FAULT_KINDS for k in kinds)
            or any(s not in SCHEDULES for s in scheds)):
        print(f"runner_faults: error: --trials/--clean/--load >= 0, --kinds from {','.join(supervise.FAULT_KINDS)}, "
              "--schedules from "
              + ",".join(SCHEDULES), file=sys.stderr)
        return 2
    load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    t0, wall0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    try:
        print(f"busy processes started: {args.load}; cores {os.cpu_count()}; heartbeat every {supervise.HEARTBEAT_S} s, "
              f"hung after {supervise.heartbeat_timeout()} s ({supervise.MISSED_BEATS} beats); stated bound "
              f"{supervise.DETECT_BOUND_S} s (start faults {supervise.STARTUP_DETECT_BOUND_S} s); start-up deadline "
              f"floor {supervise.startup_floor()} s, {supervise.STARTUP_FACTOR:g} x the slowest rank that reported",
              flush=True)
        for sched in scheds:
            for kind in kinds:
                bound = supervise.STARTUP_DETECT_BOUND_S if kind in supervise.START_FAULTS else supervise.DETECT_BOUND_S
                rows = []
                for i in range(args.trials):
                    rows.append(fault_trial(sched, kind, i % 4, args.delay))
                    r = rows[-1]
                    end = "n/a" if r["end_s"] is None else f"{r['end_s']:.2f}"
                    print(f"  {sched} {kind} #{i + 1}: rank {i % 4} -> named {r['named']}, exit {r['rc']}, ended "
                          f"{end} s after the fault"
                          + ("" if r["ok"] else f" [{r['first']}]"), flush=True)
                if not rows:
                    continue
                ends = [r["end_s"] for r in rows if r["end_s"] is not None]
                print(f"COUNT {sched} {kind}: named correctly {sum(r['ok'] for r in rows)}/{len(rows)}; exit 3 "
                      f"{sum(r['rc'] == 3 for r in rows)}/{len(rows)}; ended within {bound:.0f} s "
                      f"{sum(e <= bound for e in ends)}/{len(rows)}; end after fault (measured) median "
                      f"{statistics.median(ends) if ends else float('nan'):.2f} s, max "
                      f"{max(ends) if ends else float('nan'):.2f} s; load {os.getloadavg()[0]:.1f}", flush=True)
        cl = []
        for i in range(args.clean):
            cl.append(clean_trial())
            c = cl[-1]
            print(f"  clean #{i + 1}: exit {c['rc']}, losses bitwise equal to the reference: {c['ok']}, "
                  f"{c['wall_s']:.1f} s" + ("" if c["rc"] == 0 else f" [{c['first']}]"), flush=True)
        if cl:
            print(f"COUNT clean (run --pp 2 --ep 2 --steps 3 --check, default settings): passed "
                  f"{sum(c['ok'] for c in cl)}/{len(cl)}; declared hung {sum(c['hung'] for c in cl)}/{len(cl)}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        for q in load:
            q.kill()
            q.wait()
    t1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"benchmark: {time.time() - wall0:.0f} s wall; children CPU {t1.ru_utime - t0.ru_utime:.0f} s user + "
          f"{t1.ru_stime - t0.ru_stime:.0f} s sys (busy processes included); 1-min load at the end "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
