"""``tessera-lab validate``: predicted vs observed runner iteration times, out of sample (see
:mod:`tessera_lab.runner.validate`)."""

from __future__ import annotations

import argparse

from tessera_lab.cli.common import add_json, emit


def cmd_validate(args: argparse.Namespace) -> int:
    """Run the validation matrix and print predicted vs observed per case (or ``--json``)."""
    from tessera_lab.runner.validate import validate_from_args

    result, text = validate_from_args(args)
    emit(args, result, text)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="run a fixed matrix of runner jobs and compare them with the plan's prediction")
    p.add_argument("--quick", action="store_true", help="a small matrix (about 3 minutes on 2 cores)")
    p.add_argument("--device", default=None, metavar="FILE",
                   help="calibrated device to predict with (default: calibrate now, in separate runs)")
    p.add_argument("--steps", type=int, default=None, help="steps per case (default 4; --quick 3)")
    add_json(p)
    p.set_defaults(func=cmd_validate)
