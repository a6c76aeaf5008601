"""``tessera-lab measure``: measure the overlap table of a model's layer pairs and write a profile.

Usage::

    tessera-lab measure --backend cpu|cuda|analytic --model M [--out data/profiles/NAME.json]
                        [--repeats N] [--warmup N] [--size-factor F] [--timeout S] [--json PATH|-]

Prints the overlap table (milliseconds), the spread between the best and worst combination, and writes
the profile (merging repeated measurements of the same keys when device and versions match). ``cpu`` and
``cuda`` measure with the runner's node-level pair executor on an EP group of ``--ep`` processes
(:mod:`tessera_lab.runner.measure.overlap_measure`); ``analytic`` evaluates the cost model.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tessera_lab.argtypes import int_at_least
from tessera_lab.cli.common import add_json, emit, table


def _size_factor(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size_factor = {text!r} is not a number; allowed: a number in (0, 1]") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"size_factor = {text} is out of range; allowed: a number in (0, 1]")
    return v


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"timeout = {text!r} is not a number; allowed: seconds > 0") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"timeout = {text} is out of range; allowed: seconds > 0")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``tessera-lab measure`` (``--json`` is added by the caller)."""
    from tessera_lab.overlap.bundles import BACKENDS
    from tessera_lab.defaults import DEFAULT_GPU, DEFAULT_MODEL

    p.add_argument("--backend", required=True, choices=list(BACKENDS) + ["runner"],
                   help="measuring backend; runner: the runner's own node-level pair executor on an EP group of "
                        "--ep gloo processes (the tiny runner model)")
    p.add_argument("--model", default=None,
                   help=f"shipped model or config.json (default {DEFAULT_MODEL}; with --backend runner: tiny-runner)")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="profile to write (default data/profiles/<backend>-<model>.json); merged if it exists")
    p.add_argument("--repeats", type=int_at_least("repeats", 1), default=5, help="timed repetitions (default 5)")
    p.add_argument("--warmup", type=int_at_least("warmup", 0), default=1, help="untimed repetitions (default 1)")
    p.add_argument("--size-factor", type=_size_factor, default=None,
                   help="multiply widths and sequence length (default: cpu 0.125, cuda and analytic 1.0; a runner "
                        "model tiny-* is measured at its own shapes and sequence length, factor 1.0)")
    p.add_argument("--ep", type=int_at_least("ep", 1), default=8,
                   help="EP group size (cpu/cuda: that many processes measure, 1..8; default 8)")
    p.add_argument("--tp", type=int_at_least("tp", 1), default=1)
    p.add_argument("--seq-len", type=int_at_least("seq_len", 1), default=4096)
    p.add_argument("--micro-batch-size", type=int_at_least("micro_batch_size", 1), default=1)
    p.add_argument("--gpu", default=DEFAULT_GPU, help="GPU of the analytic model (default H200)")
    p.add_argument("--world-size", type=int_at_least("world_size", 2), default=None,
                   help="processes of the local group; must equal --ep for cpu/cuda (kept for old scripts)")
    p.add_argument("--timeout", type=_seconds, default=600.0, help="kill the measuring processes after S seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _measure_runner(args: argparse.Namespace) -> int:
    """``measure --backend runner``: pair orders of the runner measured by the runner (:mod:`tessera_lab.runner.measure.measure`)."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.io import write_json
    from tessera_lab.paths import data_dir
    from tessera_lab.runner.measure.measure import measure_runner_pair

    from tessera_lab.checks import divisors_text
    from tessera_lab.runner.testbed.predict import runner_model_config
    from tessera_lab.runner.runtime.schemas import check_runner_work
    from tessera_lab.runner.runtime.specs import TinyConfig

    name = args.model or "tiny-runner"
    name, cfg_d = runner_model_config(name)  # refuses a model that is not a runner model
    cfg = TinyConfig.from_dict(cfg_d)
    if not 1 <= args.ep <= 8:
        raise ConfigError(f"option --ep = {args.ep} is out of range for the runner backend; allowed: 1..8 processes")
    if cfg.num_experts % args.ep:
        raise ConfigError(f"option --ep = {args.ep} does not divide {name}'s num_experts = {cfg.num_experts}; "
                          f"allowed: {divisors_text(cfg.num_experts)}")
    check_runner_work(cfg, 1, 1, 2, 2, where=f"measure --backend runner --model {name}")
    r = measure_runner_pair(cfg, ep=args.ep, repeats=args.repeats, timeout_s=args.timeout)
    out = args.out or str(data_dir() / "profiles" / f"runner-{name}-ep{args.ep}.json")
    write_json(out, {"kind": "runner_pair_profile", "schema_version": 1, "backend": "runner", **r})
    d = r["decision"]
    lines = [f"runner pair ({name}, one stage, F of micro-batch 1 with B of micro-batch 0), ep={args.ep} gloo "
             f"processes: F alone {r['t_f'] * 1e3:.2f} ms, B alone {r['t_b'] * 1e3:.2f} ms, together (program order) "
             f"{r['t_program'] * 1e3:.2f} ms, chosen {r['t_ab'] * 1e3:.2f} ms (measured medians)",
             f"{len(r['candidates'])} orders measured (successive halving), decision: {_decision_text(d)}",
             "chosen order: " + " ".join(r["chosen_order"])]
    emit(args, {"profile": out, **r}, "\n".join(lines))
    print(f"profile: {out}", file=sys.stderr)
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    """``tessera-lab measure``: the overlap table of a model's layer kinds, written to a profile."""
    if args.backend == "runner":
        return _measure_runner(args)
    if args.model is None:
        from tessera_lab.plan.make import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    from tqdm import tqdm

    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import ParallelConfig, cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.overlap.bundles import DEFAULT_SIZE_FACTOR
    from tessera_lab.overlap.core import overlap_spread, overlap_table
    from tessera_lab.paths import data_dir
    from tessera_lab.overlap.profiles import update_profile

    model = load_model(args.model)
    seq_len, default_f = args.seq_len, DEFAULT_SIZE_FACTOR[args.backend]
    if args.backend != "analytic":
        from tessera_lab.overlap.kernels import check_measurable

        for layer in model.layers:  # before any work: every layer kind needs a measured kernel
            check_measurable(model, layer.index)
        from tessera_lab.errors import ConfigError as _CE
        from tessera_lab.runner.testbed.predict import runner_model_config

        try:  # a runner model (data/models/tiny-*.json) is measured at its own shapes
            seq_len, default_f = runner_model_config(args.model)[1]["seq_len"], 1.0
        except _CE:
            pass
    parallel = ParallelConfig(ep=args.ep, tp=args.tp, seq_len=seq_len, micro_batch_size=args.micro_batch_size,
                              pp=1, dp=1)
    f = args.size_factor if args.size_factor is not None else default_f
    kwargs: dict[str, Any] = {}
    if args.backend == "analytic":
        kwargs["cost_model"] = CostModel(cluster_for(parallel, args.gpu), parallel)
        f = 1.0
    else:
        kwargs.update(repeats=args.repeats, warmup=args.warmup, size_factor=f, timeout_s=args.timeout,
                      world_size=args.world_size)
    if args.backend != "analytic":
        from tessera_lab.overlap.backends import preflight

        preflight(args.backend)
        if args.world_size is not None and args.world_size != args.ep:
            from tessera_lab.errors import ConfigError

            raise ConfigError(f"--world-size = {args.world_size} differs from --ep = {args.ep}; the {args.backend} "
                              f"backend runs one process per EP rank (leave --world-size out)")
    bar = tqdm(total=len({l.kind for l in model.layers}) ** 2, desc=f"measure {args.backend}", unit="pair",
               file=sys.stderr, disable=args.no_progress, leave=False)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    try:
        if args.backend == "analytic":
            overlap = overlap_table(model, parallel, args.backend, progress=progress, **kwargs)
            results = overlap.attrs["results"]
        else:  # measuring is running: the runner's node-level executor on an EP group of --ep processes
            from tessera_lab.overlap.table import results_table
            from tessera_lab.runner.measure.overlap_measure import measure_layer_pairs

            results = measure_layer_pairs(model, parallel, args.backend, size_factor=f, repeats=args.repeats,
                                          warmup=args.warmup, timeout_s=args.timeout, progress=progress)
            overlap = results_table(results)
    finally:
        bar.close()
    out = args.out or str(data_dir() / "profiles" / f"{args.backend}-{model.name}.json")
    gpu = args.gpu if args.backend == "analytic" else None
    prof = update_profile(out, results, backend=args.backend, model=model.name, parallel=parallel, size_factor=f, gpu=gpu)
    spread = overlap_spread(overlap)
    rows = [{
        "F kind": r.kind_f, "BW kind": r.kind_b, "t_f (ms)": r.t_f * 1e3, "t_b (ms)": r.t_b * 1e3,
        "sum (ms)": r.t_sum * 1e3, "pair (ms)": r.t_pair * 1e3,
        "IQR (ms)": f"{r.t_pair_q1 * 1e3:.3g}-{r.t_pair_q3 * 1e3:.3g}", "gain (ms)": r.gain * 1e3,
        "efficiency": r.efficiency, "hidden comm (share)": r.comm_hidden_fraction,
    } for r in overlap.itertuples()]
    env = prof.environment
    text = (f"{model.name}: overlap of F (micro-batch i+1) with B+W (micro-batch i), backend {args.backend}, "
            f"device {env.get('device')}, size factor {f:g}, repeats {args.repeats if args.backend != 'analytic' else 1}\n"
            + table(rows, ".4g")
            + "\noverlap spread (best gain / worst gain): " + _spread_text(spread, overlap))
    if args.backend != "analytic" and args.ep == 1:
        text += ("\nno communication: EP 1 has no all-to-all, so this table measures two computations side by side "
                 "(profile metadata 'communication': none)")
    decisions = []
    for r in results:
        s = r.metadata.get("search") or {}
        d = s.get("decision")
        if d:
            decisions.append({"pair": f"{r.kind_a} + {r.kind_b}", "orders_measured": s.get("orders_measured"),
                              "decision": d["verdict"], "chosen": d["chosen"]})
            text += (f"\n{r.kind_a} F + {r.kind_b} BW: {s.get('orders_measured')} orders measured (successive "
                     f"halving), decision: {_decision_text(d)}")
    fit = prof.data.get("fit")
    if fit:
        text += (f"\ncontention fit over {fit['pairs']} pairs (measured): compute +{fit['compute']:.3g}, comm "
                 f"+{fit['comm']:.3g}, rms relative error {fit['rms_relative_error']:.3g}")
    result = {
        "model": model.name, "backend": args.backend, "size_factor": f, "profile": str(prof.path),
        "overlap_spread": spread, "environment": env,
        "table": overlap.to_dict(orient="records"), "decisions": decisions, "fit": fit,
    }
    emit(args, result, text)
    print(f"profile: {prof.path}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("measure", help="measure the overlap of layer pairs (F with B+W) and write a profile")
    add_arguments(p)
    add_json(p)
    p.set_defaults(func=cmd_measure)


def _decision_text(d: dict) -> str:
    """A search decision in words: which candidate is kept and why (program order is candidate 0)."""
    ch = d.get("challenger")
    if d["chosen"] == 0 and ch not in (None, 0):
        return (f"{d['verdict']}: keeps program order (candidate 0); best challenger candidate {ch} "
                f"(rule {d['rule']})")
    return f"{d['verdict']} (candidate {d['chosen']}; rule {d['rule']})"


def _spread_text(spread: float, overlap) -> str:
    import math

    if math.isfinite(spread) and spread > 0:
        return f"{spread:.3g}"
    slower = int((overlap["gain"] <= 0).sum()) if "gain" in overlap else 0
    return (f"n/a: {slower} of {len(overlap)} pairs ran no faster together than F + B apart (a ratio against "
            f"a gain <= 0 is undefined)")
