"""``tessera-lab report``: capacity report (where the lost MFU goes) of a plan, and a model-change diff."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tessera_lab.argtypes import int_at_least
from tessera_lab.cli.common import (add_json, add_plan_options, cluster_from_args, emit, model_from_args, parallel_from_args,
                                    split_from_args)


def cmd_report(args: argparse.Namespace) -> int:
    """``tessera-lab report``: capacity report of a plan (from ``--plan PLAN.json``, re-evaluated under the plan's
    own cost source unless ``--costs`` asks for another, or from plan options), an optional ``--diff OTHER`` (a
    plan JSON, a model name or ``KEY=VALUE,...`` changes), ``--plot PATH`` (:func:`save_report_figure`: the
    waterfall, or with ``--diff`` both waterfalls side by side) and ``--json``."""
    from tessera_lab.plan.load import load_plan
    from tessera_lab.report.capacity import capacity_report, parse_changes
    from tessera_lab.report.routing_terms import load_routing_terms

    _refuse_unused(args)
    if getattr(args, "lifecycle", None):  # the lifecycle decision from the runner's stored observations
        from tessera_lab.io import read_json
        from tessera_lab.report.lifecycle import format_store_lifecycle, store_lifecycle
        from tessera_lab.runner.runtime.schemas import check_runner_store

        store = check_runner_store(read_json(args.lifecycle, "runner observation store"),
                                   f"runner observation store '{args.lifecycle}'")
        res = store_lifecycle(store, args.remaining_steps)
        emit(args, {k: v for k, v in res.items() if k != "lifecycle"} | {"history": res["lifecycle"]["history"]},
             format_store_lifecycle(res))
        return 0
    if getattr(args, "observed", None):  # the capacity report of an actual run
        terms = load_routing_terms(getattr(args, "dynamic", None))  # every input checked before the report
        data, text = _observed(args.observed, getattr(args, "device", None))
        data["routing_dynamic"] = terms.as_dict()
        emit(args, data, text + "\n" + terms.format())
        return 0
    from tessera_lab.plan.make import make_plan

    terms = load_routing_terms(getattr(args, "dynamic", None))  # bad files fail before any planning
    from tessera_lab.report.diff import merge_diff_args

    args.diff = merge_diff_args(args.diff)  # repeated --diff changes accumulate
    diff_changes = None
    if args.diff and "=" in args.diff and "[" not in args.diff and not args.diff.endswith(".json"):
        from tessera_lab.report.diff import check_changes

        diff_changes = check_changes(parse_changes(args.diff))  # bad changes fail before any planning
    if args.plan:
        _refuse_plan_options_with_saved_plan(args)
        plan = load_plan(args.plan, costs=args.costs, allow_stale_profile=args.allow_stale_profile)
    else:
        if args.costs:
            from tessera_lab.errors import ConfigError

            raise ConfigError("option --costs re-evaluates a saved plan; allowed: with --plan PLAN.json")
        model = model_from_args(args)
        parallel = parallel_from_args(args, model)
        cluster = cluster_from_args(args, parallel)
        # the same plan as "tessera-lab plan" with these options: its baselines take part in the choice
        boundaries = split_from_args(args, model, parallel)  # Megatron's embedding/loss-accounted split, if asked
        plan = make_plan(model, parallel, cluster, method="uniform" if boundaries else args.method, gpu=args.gpu,
                         boundaries=boundaries, **({"baselines": ()} if boundaries else {}))
    rep = capacity_report(plan)
    result: dict[str, Any] = {"costs": plan.costs.as_dict(), "capacity": rep.as_dict(), "plan": plan.as_dict()}
    result["routing_dynamic"] = terms.as_dict()
    from tessera_lab.report.headline import mfu_note, mfu_text

    moe = plan.model.moe.num_experts > 0
    where = {"gpu": plan.cluster.gpu.name, "precision": plan.parallel.precision}
    flag = mfu_note(rep.mfu, moe=moe, grouped_gemm=getattr(plan.parallel, "grouped_gemm", None), model=plan.model,
                    **where)
    band = (f"MFU against published runs: {mfu_text(rep.mfu, moe=moe, model=plan.model, **where)}\n"
            + (f"warning: {flag}\n" if flag else ""))
    text = ("".join(f"plan: {line}\n" for line in plan.reevaluation) + rep.format() + "\n" + band
            + _memory_text(plan, result) + _routing_text(terms, rep.iteration_time_s, moe))
    if plan.model.approximate:  # unknown config fields were ignored: said first, as in the plan
        text = plan.model.approximate + "\n" + text
        result["approximate"] = plan.model.approximate
    diff = _diff(args, plan, diff_changes) if args.diff else None
    if diff is not None:
        result["diff"] = diff.as_dict()
        text += "\n\n" + diff.format()
    emit(args, result, text)
    if args.plot:
        from tessera_lab.ui.report_figure import save_report_figure

        save_report_figure(args.plot, plan, rep, diff)
        print(f"figure: {args.plot}", file=sys.stderr)
    return 0


def _routing_text(terms, iteration_s: float, moe: bool) -> str:
    """The routing and dynamic-correction lines; a model without MoE layers, given no dynamic file, has none."""
    if moe or terms.provenance:
        return terms.format(iteration_s)
    return "routing and dynamic correction: none (no MoE layers: nothing is routed)"


def _memory_text(plan, result: dict[str, Any]) -> str:
    """The report's memory line (largest memory per GPU against HBM less the reserve); its numbers go to
    ``result["memory"]``."""
    from tessera_lab.cli.plan import rank_memory, rank_memory_line

    result["memory"] = rank_memory(plan)
    return ("" if plan.chosen.fits_memory else "does not fit: ") + rank_memory_line(plan, rows_note=False) + "\n"


def _diff(args: argparse.Namespace, plan, diff_changes):
    """``report --diff``: the plan against another plan JSON, a model with ``KEY=VALUE,...`` changes, or another
    model by name (:func:`tessera_lab.report.capacity.model_diff`)."""
    from tessera_lab.model.spec import model_from_name
    from tessera_lab.plan.load import load_plan
    from tessera_lab.report.capacity import model_diff

    other = args.diff
    if other.endswith(".json"):
        diff = model_diff(plan.model, plan.model, plan.parallel, plans=(plan, load_plan(
            other, costs=args.costs, allow_stale_profile=args.allow_stale_profile)))
    elif diff_changes is not None:
        diff = model_diff(plan.model, diff_changes, plan.parallel, plan.cluster if args.nodes or plan.cluster.memory_reserve_gib is not None else None,
                          method=getattr(args, "method", "ilp"), gpu=plan.cluster.gpu.name)
    else:
        om = model_from_name(other)
        diff = model_diff(plan.model, om, plan.parallel, plan.cluster if args.nodes or plan.cluster.memory_reserve_gib is not None else None,
                          method=getattr(args, "method", "ilp"), gpu=plan.cluster.gpu.name)
    return diff


def _observed(run_path: str, device_path: str | None) -> tuple[dict[str, Any], str]:
    """``report --observed``: the runner's checked run file and model FLOPs, the calibrated device (``--device``,
    else the first of ``data/devices/``), then :func:`tessera_lab.report.observed.observed_report` of its first
    job.

    Raises:
        ConfigError: unreadable run file, not a runner result, or no device file.
    """
    from tessera_lab.cost.device import load_device
    from tessera_lab.errors import ConfigError
    from tessera_lab.paths import data_dir
    from tessera_lab.report.observed import observed_report
    from tessera_lab.runner.runtime.capacity import read_run_result, run_model_flops

    job = read_run_result(run_path)["jobs"][0]
    if device_path is None:
        found = sorted((data_dir() / "devices").glob("*.json"))
        if not found:
            raise ConfigError("report --observed needs --device FILE (a calibrated device: tessera-lab calibrate)")
        device_path = str(found[0])
    return observed_report(run_path, job, load_device(device_path), run_model_flops(job))


#: the options each report kind reads besides ``--json``; any other given is refused, never ignored
_UNUSED = {"lifecycle": ("observed", "dynamic", "plan", "costs", "diff", "plot", "device", "allow_stale_profile"),
           "observed": ("plan", "costs", "diff", "plot", "allow_stale_profile")}


def _refuse_unused(args: argparse.Namespace) -> None:
    """Refuse an option the chosen report would ignore (``--lifecycle`` reads only its store and
    ``--remaining-steps``; ``--observed`` its run, ``--device`` and ``--dynamic``; ``--device`` needs ``--observed``).

    Raises:
        ConfigError: naming the option and what it is allowed with.
    """
    from tessera_lab.errors import ConfigError

    for kind in ("lifecycle", "observed"):
        if getattr(args, kind, None):
            for other in _UNUSED[kind]:
                if getattr(args, other, None):
                    opt = other.replace("_", "-")
                    raise ConfigError(f"option --{opt} is not used by report --{kind} (it would be ignored); "
                                      f"allowed: report --{kind} FILE without --{opt}")
            return
    if getattr(args, "allow_stale_profile", False) and (not args.costs or args.costs == "analytic"):
        raise ConfigError(f"option --allow-stale-profile applies to a profile given with --costs (got --costs "
                          f"{args.costs!r}; it would be ignored); allowed: with --plan PLAN.json --costs PROFILE.json")
    if getattr(args, "device", None):
        raise ConfigError("option --device sets the peak of an observed run's report; allowed: with --observed "
                          "RUN.json")


def _refuse_plan_options_with_saved_plan(args) -> None:
    """A saved plan (``--plan``) keeps its own layout, model and costs: a plan option set beside it (``--pp``,
    ``--host-sync-ms``, ...) would be ignored, so it is refused (ConfigError, exit 2) before any work."""
    import argparse

    from tessera_lab.defaults import DEFAULT_GPU, DEFAULT_MODEL
    from tessera_lab.errors import ConfigError

    probe = argparse.ArgumentParser(add_help=False)
    add_plan_options(probe, DEFAULT_MODEL, DEFAULT_GPU)
    for action in probe._actions:
        if not action.option_strings or not hasattr(args, action.dest):
            continue
        if getattr(args, action.dest) != action.default:
            opt = max(action.option_strings, key=len)
            raise ConfigError(f"option {opt} sets up a new plan, but --plan {args.plan} is a saved plan with its own "
                              f"layout and costs (it would be ignored); allowed: --plan without {opt}, or {opt} "
                              "without --plan")


def add_parser(sub) -> None:
    from tessera_lab.defaults import DEFAULT_GPU, DEFAULT_MODEL

    from tessera_lab.report.categories import categories_help

    p = sub.add_parser("report", help="capacity report (where the lost MFU goes) of a plan, and a model-change diff",
                       epilog=categories_help())
    p.add_argument("--plan", metavar="PLAN.json", help="a plan from 'tessera-lab plan --json' (else the plan options)")
    p.add_argument("--costs", metavar="SOURCE", default=None,
                   help="with --plan: re-evaluate under another cost source, 'analytic' or a profile JSON (default: "
                        "the plan's own; a report that would change it refuses unless asked)")
    p.add_argument("--allow-stale-profile", action="store_true",
                   help="with --costs PROFILE: use a profile of another model or device anyway (with a warning)")
    p.add_argument("--observed", metavar="RUN.json", help="capacity report of an actual run (tessera-lab run --json)")
    p.add_argument("--lifecycle", metavar="STORE",
                   help="decide hold / re-measure / re-plan (with payback) from the observations that "
                        "tessera-lab run --plan PLAN.json --profile-store STORE appended")
    p.add_argument("--remaining-steps", type=int_at_least("remaining_steps", 0), default=1000,
                   help="with --lifecycle: training steps left after the stored ones (default 1000)")
    p.add_argument("--device", metavar="FILE", default=None,
                   help="with --observed: calibrated device whose GEMM rate is the peak (default data/devices/*.json)")
    p.add_argument("--dynamic", metavar="FILE", action="append", default=None,
                   help="routing variance and bubble after dynamic correction from 'simulate --routing SPEC --dynamic "
                        "--json FILE' or 'run --dynamic --json FILE' (give twice: a run and its uniform-routing "
                        "control); without it they print as 'not measured'")
    add_plan_options(p, DEFAULT_MODEL, DEFAULT_GPU)
    p.add_argument("--diff", metavar="OTHER", action="append",
                   help="compare with OTHER: a plan JSON, a model name, or changes like "
                        "'expert_width=256,top_k=4,seq_len=8192,dtype=fp8' (repeat --diff to add changes)")
    p.add_argument("--plot", metavar="PATH", help="save the waterfall of the capacity report")
    add_json(p)
    p.set_defaults(func=cmd_report)
