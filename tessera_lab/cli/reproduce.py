"""``tessera-lab reproduce``: the paper's reported figures beside ours."""

from __future__ import annotations

import argparse

from tessera_lab.cli.common import add_json, emit, table


def cmd_reproduce(args: argparse.Namespace) -> int:
    from tessera_lab.report.reproduce import reproduce, write

    rep = reproduce(quick=args.quick)
    paths = write(rep, args.out)
    rows = [{"figure": p.name, "path": str(p)} for p in paths]
    text = table(rows) + "\n" + "\n".join(f"- {n}" for n in rep.notes)
    emit(args, rep.as_dict() | {"files": [str(p) for p in paths]}, text)
    return 0



def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="the paper's reported figures beside ours (PNG, JSON, Markdown)")
    p.add_argument("--out", metavar="DIR", required=True, help="folder for the figures and tables")
    p.add_argument("--quick", action="store_true", help="fewer expert widths in the width study (seconds, not minutes)")
    add_json(p)
    p.set_defaults(func=cmd_reproduce)

