"""The command line's start-up: ``tessera-lab --help`` lists every subcommand with the same help line as its
module's parser (the listing is built without importing the modules), and a subcommand's parser is built without
importing the others."""

from __future__ import annotations

import argparse
import subprocess
import sys

from tessera_lab.cli.main import COMMAND_HELP, build_parser


def _sub_helps(parser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {c.dest: c.help for c in action._choices_actions}
    return {}


def test_listing_matches_every_module():
    assert _sub_helps(build_parser(listing=True)) == _sub_helps(build_parser())


def test_help_lists_without_importing_subcommands():
    code = ("import sys; from tessera_lab.cli.main import main; rc = main(['--help']); "
            "print(sorted(m for m in sys.modules if m.startswith(('tessera_lab.runner', 'tessera_lab.plan', "
            "'numpy', 'pulp', 'pandas', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "models" in out and "validate" in out
    assert out.strip().splitlines()[-1] == "[]"


def test_plan_help_imports_no_planning_code():
    code = ("import sys; from tessera_lab.cli.main import main; main(['plan', '--help']); "
            "print(sorted(m for m in sys.modules if m.startswith(('tessera_lab.runner', 'tessera_lab.plan.make', "
            "'numpy', 'pulp', 'pandas', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
