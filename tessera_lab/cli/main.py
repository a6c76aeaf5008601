"""The ``tessera-lab`` command line (docs/cli.md): one module per subcommand under :mod:`tessera_lab.cli`.

Every subcommand prints a readable table and accepts ``--json PATH`` (``--json -`` for stdout, which
then replaces the table) to write its result; the paths of written files are printed on stderr. Bad input
exits with status 2 and one line naming the field and the allowed range; sizes over the work limits of
:mod:`tessera_lab.checks` are refused up front (raise them with ``TESSERA_LAB_MAX_<NAME>``); Ctrl-C exits
with status 130 and one line; a closed or broken stdout never prints a traceback.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from typing import Sequence

from tessera_lab.argtypes import finite_float, integer, positive_float
from tessera_lab.checks import check_work
from tessera_lab.cli.common import Parser, check_output_paths
from tessera_lab.errors import ConfigError, TesseraError

#: subcommands in the order ``tessera-lab --help`` lists them; each is the module ``tessera_lab.cli.<name>``,
#: imported only when its parser is needed (a run of one subcommand imports that one alone)
COMMAND_NAMES = ("models", "plan", "search", "partition", "reproduce", "simulate", "measure", "report", "run", "calibrate",
                 "validate")


#: each subcommand's one-line help, for ``tessera-lab --help`` (which lists them without importing the modules; each
#: module's ``add_parser`` states the same line, tests/test_cli_startup.py checks that they agree)
COMMAND_HELP = {
    "models": "list the shipped models and the supported model families",
    "params": "parameter counts of a model",
    "plan": "the main job: partition, simulate and report a pipeline plan",
    "search": "search the parallel layouts (TP, CP, EP, PP/VPP, DP, micro-batching, schedule, recompute) for the fastest "
              "that fits",
    "partition": "partition a plain per-layer cost list",
    "reproduce": "the paper's claims on its jobs as scenarios, with computed verdicts (PNG, JSON, Markdown)",
    "simulate": "simulate a uniform pipeline",
    "measure": "measure the overlap of layer pairs (F with B+W) and write a profile",
    "report": "capacity report (where the lost MFU goes) of a plan, and a model-change diff",
    "run": "train the tiny MoE model with pipeline + expert parallelism (local processes)",
    "calibrate": "measure this machine at the runner's shapes (data/devices/NAME.json; about 40 s on a quiet 2-core "
                 "machine, 90 s on a busy one)",
    "validate": "run a fixed matrix of runner jobs and compare them with the plan's prediction",
}


def _command_module(name: str):
    import importlib

    return importlib.import_module(f"tessera_lab.cli.{name}")

#: help of options whose subcommand module gives none (``--help`` shows help and the default of every option)
OPTION_HELP = {
    "--pp": "pipeline-parallel stages (ranks in one pipeline)",
    "--vpp": "virtual stages (model chunks) per pipeline rank; > 1 needs an interleaved schedule",
    "--ep": "expert-parallel ranks (the all-to-all group of each MoE layer)",
    "--tp": "tensor-parallel ranks (must divide the attention heads)",
    "--dp": "data-parallel replicas",
    "--microbatches": "micro-batches per iteration (m)",
    "--micro-batch-size": "sequences per micro-batch",
    "--seq-len": "tokens per sequence",
    "--method": "partition method: ilp (HiGHS, exact DP fallback), dp (exact dynamic program) or uniform",
    "--no-distributed-optimizer": "replicate optimizer state on every data-parallel rank (no ZeRO-1 sharding)",
    "--top-k": "experts per token (num_experts_per_tok)",
    "--num-experts": "routed experts per MoE layer",
    "--layers": "number of decoder layers (the family's layer pattern is re-derived)",
    "--p2p-latency": "latency of one point-to-point send between stages, same unit as --f",
    "--time-limit": "ILP solver wall-clock limit, seconds (> 0); the result then depends on the machine's load",
    "--steps": "training steps",
    "--lr": "learning rate (SGD)",
    "--expert-width": "routed expert intermediate size",
    "--capacity-factor": "drop expert assignments above ceil(cf x tokens x top_k / experts) per expert",
    "--grad-sync": "data-parallel gradient sum: ordered (all-gather, summed in replica order: deterministic) or allreduce",
    "--backend": "torch.distributed backend: auto (NCCL with GPUs, else gloo), gloo or nccl",
}

_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*([eE][-+]?\d+)?|\.\d+([eE][-+]?\d+)?|inf|infinity|nan)$", re.IGNORECASE)


class HelpFormatter(argparse.HelpFormatter):
    """Help with the default of every option that has one (unless its help already states it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (action.option_strings and default not in (None, False, argparse.SUPPRESS)
                and "default" not in text.lower() and not isinstance(action, argparse._HelpAction)):
            text += f" (default: {default})".replace("%", "%%")
        return text

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        """Descriptions and epilogs keep their line breaks (the report's rows, one a line); each line is wrapped."""
        import textwrap

        return "\n".join(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent + "    ",
                                       break_on_hyphens=False, break_long_words=False)
                         for line in text.splitlines() if line.strip())

    # on/off switches (argtypes.Switch: nargs "?" only to name a stray value) show no metavar, as store_true does
    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        from tessera_lab.argtypes import Switch

        return "" if isinstance(action, Switch) else super()._format_args(action, default_metavar)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        from tessera_lab.argtypes import Switch

        return ", ".join(action.option_strings) if isinstance(action, Switch) else \
            super()._format_action_invocation(action)

    def _format_usage(self, usage, actions, groups, prefix) -> str:
        from tessera_lab.argtypes import Switch

        text = super()._format_usage(usage, actions, groups, prefix)
        for a in actions:
            if isinstance(a, Switch):
                text = text.replace(f"[{a.option_strings[0]} ]", f"[{a.option_strings[0]}]")
        return text


def _walk_parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                yield from _walk_parsers(child)


def build_parser(only: str | None = None, *, listing: bool = False) -> Parser:
    """The full parser; with ``only`` (a subcommand name) that subcommand's parser in full and the others as bare
    names (what parsing one command line needs: the other modules are not imported); with ``listing`` every
    subcommand as a bare name with its :data:`COMMAND_HELP` line (what ``tessera-lab --help`` prints)."""
    parser = Parser(prog="tessera-lab", description="Pipeline-parallel planning for hybrid MoE models.",
                    formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    if listing:
        for name, text in COMMAND_HELP.items():
            sub.add_parser(name, help=text)
        return parser
    for name in COMMAND_NAMES:
        if only is None or name == only:
            _command_module(name).add_parser(sub)
        else:
            sub.add_parser(name)
    for p in _walk_parsers(parser):
        p.formatter_class = HelpFormatter
        p._negative_number_matcher = _NEGATIVE_NUMBER  # so "--f -inf" or "--seed -1e3" reach the type check
        for action in p._actions:
            if action.type is int:  # a bare int: accept 1e3, bound by the work limit, one clear line
                action.type = integer(action.dest)
            elif action.type is float:  # a bare float: finite only; timeouts and limits > 0
                timed = "timeout" in action.dest or "time_limit" in action.dest
                action.type = positive_float(action.dest) if timed else finite_float(action.dest)
            if action.help is None and action.option_strings:
                action.help = next((OPTION_HELP[o] for o in action.option_strings if o in OPTION_HELP), None)
    return parser


def check_environment() -> None:
    """Every ``TESSERA_LAB_*`` variable parsed before any work (one line, exit 2 when malformed): the work limits
    (:func:`tessera_lab.checks.check_environment`), ``TESSERA_LAB_FAULT``, ``TESSERA_LAB_HEARTBEAT_TIMEOUT`` and
    ``TESSERA_LAB_STARTUP_FLOOR`` (:mod:`tessera_lab.runner.launch.supervise`; torch-free)."""
    from tessera_lab.checks import check_environment as check_limits
    from tessera_lab.runner.launch.supervise import heartbeat_timeout, parse_fault, startup_floor

    check_limits()
    parse_fault(os.environ.get("TESSERA_LAB_FAULT"))
    heartbeat_timeout()
    startup_floor()


def check_work_limits(args: argparse.Namespace) -> None:
    """Refuse, before any work, sizes over the work limits of :mod:`tessera_lab.checks`: every integer option
    named in ``WORK_LIMITS``, the world size pp x dp x ep x tp, stages x vpp, and the length of ``--costs``.

    Raises:
        ConfigError: naming the option, the limit and the variable that raises it.
    """
    from tessera_lab.checks import WORK_LIMITS

    for name, value in vars(args).items():
        if name in WORK_LIMITS and isinstance(value, int) and not isinstance(value, bool):
            check_work(name, value, field="--" + name.replace("_", "-"))
    sizes = [getattr(args, k, None) for k in ("pp", "dp", "ep", "tp")]
    if sizes[1] is None and "dp" in vars(args):  # plan / report: dp left to --gpus (itself limited) or 1
        sizes[1] = 1
    if all(isinstance(v, int) for v in sizes):
        world = sizes[0] * sizes[1] * sizes[2] * sizes[3]
        check_work("world_size", world, field=f"world size pp x dp x ep x tp = {' x '.join(map(str, sizes))}")
    stages = getattr(args, "stages", None) or getattr(args, "pp", None)
    vpp = getattr(args, "vpp", None)
    if isinstance(stages, int) and isinstance(vpp, int):
        check_work("virtual_stages", stages * vpp, field=f"virtual stages {stages} x {vpp}")
        m = getattr(args, "microbatches", None)
        if isinstance(m, int):
            check_work("actions", stages * vpp * m, field=f"stage-micro-batches {stages} x {vpp} x {m}")
            if getattr(args, "schedule", None) in ("zb-auto", "auto"):  # a search: far more work per action
                check_work("search_actions", stages * vpp * m,
                           field=f"--schedule {args.schedule} over stages x vpp x micro-batches {stages} x {vpp} x {m}")
    costs = getattr(args, "costs", None)
    if isinstance(costs, list):
        check_work("costs", len(costs), field="--costs (number of layers)")


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush cannot fail."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, AttributeError, ValueError):
        pass


def _one_line_warning(command: str):
    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001 - warnings API
        text = " ".join(str(message).split())
        print(f"tessera-lab {command}: warning: {text}", file=file or sys.stderr)

    return show


def _run(args: argparse.Namespace) -> int:
    if sys.stdout is None and getattr(args, "json", None) in (None, "-"):
        raise ConfigError("standard output is closed; allowed: an open stdout, or --json PATH for the result")
    for name in ("plot", "export", "trace", "profile_store", "out"):
        if getattr(args, name, None) == "-":  # only --json may go to stdout; never a file literally named '-'
            raise ConfigError(f"option --{name.replace('_', '-')} = '-': standard output takes only --json; "
                              "allowed: a file path")
    check_environment()
    check_output_paths(args)
    check_work_limits(args)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning(args.command)  # one line per warning, no source line
        return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tessera-lab``; returns the exit status (0 ok, 2 bad input, 130 interrupted)."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=words[0] if words and words[0] in COMMAND_NAMES else None,
                          listing=words in (["-h"], ["--help"]))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2, already printed as one line)
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    prefix = f"tessera-lab {args.command}: error:"
    try:
        return _run(args)
    except TesseraError as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (e.g. piping into head): not an error of ours
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print(f"tessera-lab {args.command}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:
        print(f"{prefix} out of memory; use smaller sizes (see the work limits in tessera_lab.checks)",
              file=sys.stderr)
        return 2
    except OSError as exc:  # unreadable input or unwritable output named by the user
        where = f" '{exc.filename}'" if getattr(exc, "filename", None) else ""
        print(f"{prefix} {exc.strerror or exc}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
