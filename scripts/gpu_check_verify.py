"""The checks of scripts/gpu_check.sh: each reads what a step wrote and prints one line, ``ok: ...`` (exit 0) or
``FAIL: ...`` (exit 1), that goes to the step's line in summary.txt.

    python scripts/gpu_check_verify.py run RESULT.json bitwise|close
    python scripts/gpu_check_verify.py same-losses A.json B.json bitwise|close
    python scripts/gpu_check_verify.py trace DIR
    python scripts/gpu_check_verify.py measure RESULT.json comm|no-comm LOG
    python scripts/gpu_check_verify.py optable TABLE.json

``bitwise``: CPU (gloo, deterministic mode): losses and step-0 gradients equal the single-process reference bit for
bit. ``close``: CUDA (other kernels than the CPU reference): every loss within a relative 1e-3 of the reference
(fp32; a wrong result from a lost or misrouted transfer is off by far more).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

RTOL = 1e-3


def _close(a: float, b: float) -> bool:
    return math.isfinite(a) and abs(a - b) <= RTOL * max(abs(a), abs(b))


def check_run(path: str, mode: str) -> str:
    res = json.loads(Path(path).read_text())
    job = res["jobs"][0]
    ref = job.get("reference")
    if not ref:
        raise AssertionError("no reference in the result (run without --check?)")
    got, want = job["losses"], ref["reference_losses"]
    if mode == "bitwise":
        if got != want or not ref.get("grads_bitwise_equal"):
            raise AssertionError(f"losses {got} vs reference {want}, grads bitwise {ref.get('grads_bitwise_equal')}")
    elif not all(_close(a, b) for a, b in zip(got, want)) or len(got) != len(want):
        raise AssertionError(f"losses {got} vs reference {want}: beyond rtol {RTOL}")
    mem = job.get("peak_memory") or {}
    mem_text = ""
    if mem.get("observed_bytes"):
        mem_text = (f"; peak memory {max(mem['observed_bytes']) / 2**20:.1f} MiB ({mem['observed']}) vs predicted "
                    f"{max(mem['predicted_bytes']) / 2**20:.1f} MiB")
    d = (job.get("ep_dispatch") or {}).get("mode")
    return (f"{len(got)} losses {'bitwise equal to' if mode == 'bitwise' else f'within rtol {RTOL} of'} the reference"
            + (f", EP dispatch {d}" if d else "") + mem_text)


def check_same(a: str, b: str, mode: str) -> str:
    la = json.loads(Path(a).read_text())["jobs"][0]["losses"]
    lb = json.loads(Path(b).read_text())["jobs"][0]["losses"]
    ok = la == lb if mode == "bitwise" else (len(la) == len(lb) and all(_close(x, y) for x, y in zip(la, lb)))
    if not ok:
        raise AssertionError(f"losses {la} vs {lb}")
    return f"{len(la)} losses {'equal' if mode == 'bitwise' else 'close'} to tessera-lab run's"


def check_trace(folder: str) -> str:
    files = sorted(Path(folder).glob("*.json"))
    good = [f for f in files if "traceEvents" in json.loads(f.read_text())]
    if not good:
        raise AssertionError(f"no Chrome trace with traceEvents under {folder}")
    return f"{len(good)} torch profiler trace(s) under {folder}"


def check_measure(path: str, comm: str, log: str) -> str:
    res = json.loads(Path(path).read_text())
    rows = res["table"]
    if not rows:
        raise AssertionError("empty overlap table")
    prof = json.loads(Path(res["profile"]).read_text())
    kinds = {e["metadata"].get("communication") for e in prof["entries"].values()}
    text = Path(log).read_text()
    if comm == "no-comm":
        if "no communication" not in text or not all(str(k).startswith("none") for k in kinds):
            raise AssertionError(f"EP 1 not labelled 'no communication' (communication: {kinds})")
    elif kinds != {"EP all-to-all"}:
        raise AssertionError(f"communication: {kinds}; expected EP all-to-all")
    return f"{len(rows)} pair(s) measured, communication {sorted(map(str, kinds))}"


def check_optable(path: str) -> str:
    from tessera_lab.cost.optable import load_op_table

    t = load_op_table(path)
    ops = sorted({r["op"] for r in t["ops"]})
    return f"{len(t['ops'])} rows, ops {', '.join(ops)} (schema checked)"


def main(argv: list[str]) -> int:
    cmds = {"run": check_run, "same-losses": check_same, "trace": check_trace, "measure": check_measure,
            "optable": check_optable}
    try:
        print("ok: " + cmds[argv[0]](*argv[1:]))
        return 0
    except Exception as exc:  # noqa: BLE001 - one line for the summary
        print(f"FAIL: {type(exc).__name__}: {exc}".splitlines()[0][:400])
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
