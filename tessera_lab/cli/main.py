"""The ``tessera-lab`` command line (DESIGN section 10): one module per subcommand under :mod:`tessera_lab.cli`.

Every subcommand prints a readable table and accepts ``--json PATH`` (``--json -`` for stdout, which
then replaces the table) to write its result. Bad input exits with status 2 and one line naming the
field and the allowed range.
"""

from __future__ import annotations

import sys
from typing import Sequence

from tessera_lab.cli import calibrate, measure, models, partition, plan, report, reproduce, run, simulate, validate
from tessera_lab.cli.common import Parser, check_output_paths
from tessera_lab.errors import TesseraError

#: subcommand modules in the order ``tessera-lab --help`` lists them
COMMANDS = (models, plan, partition, reproduce, simulate, measure, report, run, calibrate, validate)


def build_parser() -> Parser:
    parser = Parser(prog="tessera-lab", description="Pipeline-parallel planning for hybrid MoE models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tessera-lab``; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_output_paths(args)
        return int(args.func(args) or 0)
    except TesseraError as exc:
        print(f"tessera-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # pragma: no cover - e.g. piping into head
        return 0
    except OSError as exc:  # unreadable input or unwritable output named by the user
        where = f" '{exc.filename}'" if getattr(exc, "filename", None) else ""
        print(f"tessera-lab {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
