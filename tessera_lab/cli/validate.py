"""``tessera-lab validate``: predicted vs observed runner iteration times, calibration runs kept apart from the
validated ones; the CPU cost parameters were tuned on this matrix, so its figures are in sample (see
:mod:`tessera_lab.runner.testbed.validate`, docs/fidelity.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tessera_lab.cli.common import add_json, emit


def cmd_validate(args: argparse.Namespace) -> int:
    """Run the validation matrix and print predicted vs observed per case (or ``--json``)."""
    if getattr(args, "repredict", None):
        return _repredict(args)
    from tessera_lab.runner.testbed.validate import validate_from_args

    result, text = validate_from_args(args)
    emit(args, result, text)
    return 0


def _repredict(args: argparse.Namespace) -> int:  # noqa: C901
    """``validate --repredict RESULT.json --device FILE``: the stored observations against today's model's
    predictions from the stored inputs (boundaries, measured availability), no run."""
    from tessera_lab.cost.device import load_device
    from tessera_lab.errors import ConfigError
    from tessera_lab.io import read_json
    from tessera_lab.runner.testbed.validate import repredict

    from tessera_lab.runner.runtime.schemas import check_validation_result

    stored = read_json(args.repredict, "validation result")
    if not isinstance(stored, dict) or "cases" not in stored:
        raise ConfigError(f"validation result '{args.repredict}' has no field 'cases'; allowed: a tessera-lab "
                          "validate --json result")
    check_validation_result(stored, f"validation result '{args.repredict}'")
    cal = stored.get("calibration") or {}
    embedded, named = cal.get("device_file"), cal.get("path")
    if args.device:
        device, source = load_device(args.device), args.device
    elif isinstance(embedded, dict):
        device, source = embedded, "the calibration stored in the result"
    elif named and Path(named).exists():
        device, source = load_device(named), f"{named}, the device file the result names"
    else:
        raise ConfigError("validate --repredict needs --device FILE (the calibration to predict with); this result "
                          "holds no calibration of its own" + (f" and its device file '{named}' is not here"
                                                                if named else ""))
    r = repredict(stored, device)
    m = stored.get("machine", {})
    lines = [f"{c['name']:36s} predicted {c['predicted_s'] * 1e3:8.1f} ms  observed {c['observed_s'] * 1e3:8.1f} ms"
             f"  {c['error'] * 100:+6.1f}%" for c in r["cases"]]
    lines.append(f"re-predicted (offline, {source}): median |error| {r['median_abs_error'] * 100:.1f}% "
                 f"(stored {stored.get('median_abs_error', float('nan')) * 100:.1f}%), rank agreement "
                 f"{r['rank_agreement'] * 100:.0f}% over {r['rank_pairs']} pairs (stored "
                 f"{stored.get('rank_agreement', float('nan')) * 100:.0f}%); observed at load {m.get('load_before')}"
                 f" -> {m.get('load_after')} on {m.get('cores')} cores")
    lines.append("targets: " + ", ".join(f"{k.replace('_', ' ')} {'met' if v else 'NOT met'}"
                                        for k, v in r["targets_met"].items()))
    emit(args, r, "\n".join(lines))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="run a fixed matrix of runner jobs and compare them with the plan's prediction")
    p.add_argument("--quick", action="store_true",
                   help="a small matrix (about 70 s on 2 cores with its calibration, 30 s with --device)")
    p.add_argument("--device", default=None, metavar="FILE",
                   help="calibrated device to predict with (default: calibrate now, in separate runs)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps per case, the first a warm-up (default 5; --quick 9)")
    p.add_argument("--repredict", default=None, metavar="RESULT.json",
                   help="re-predict a stored validation result with --device, or with the calibration the result "
                        "holds (offline: no run)")
    add_json(p)
    p.set_defaults(func=cmd_validate)
