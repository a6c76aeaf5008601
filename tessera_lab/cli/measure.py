"""``tessera-lab measure``: measure the overlap table of a model's layer pairs and write a profile.

Usage::

    tessera-lab measure --backend cpu|cuda|analytic --model M [--out data/profiles/NAME.json] [--budget-s S]
                        [--repeats N] [--orders K] [--warmup N] [--size-factor F] [--ep N] [--timeout S]
                        [--json PATH|-]

Prints the overlap table (milliseconds), the spread between the best and worst combination, and writes
the profile (merging repeated measurements of the same keys when device and versions match). ``cpu`` and
``cuda`` measure with the runtime's node executor on an EP group of ``--ep`` processes
(:mod:`tessera_lab.runner.measure.harness`), sized to ``--budget-s`` wall seconds, with one progress line per
step on stderr, noise warnings computed from the run's samples
(:func:`tessera_lab.runner.measure.noise.noise_warnings`), and the sizing (what ran per pair, what was reduced or
skipped, wall and CPU seconds, load) at the end; ``analytic`` evaluates the cost model. The last line names the
profile written.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tessera_lab.argtypes import int_at_least
from tessera_lab.cli.common import add_json, emit, table

#: fallback start of this process when /proc cannot say (the time this module was imported)
_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """Wall-clock time (seconds since the epoch) this process started: ``/proc/self/stat`` field 22 (clock ticks
    after boot) plus ``btime`` of ``/proc/stat`` (Linux, about 1 s resolution); elsewhere the time this module was
    imported (later than the true start)."""
    import os

    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return min(_IMPORTED_AT, btime + ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


def _size_factor(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size_factor = {text!r} is not a number; allowed: a number in (0, 1]") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"size_factor = {text} is out of range; allowed: a number in (0, 1]")
    return v


#: default wall-clock budget of a cpu/cuda measurement (seconds), default repeats and candidate orders per pair
DEFAULT_BUDGET_S = 150.0
DEFAULT_REPEATS = 5
DEFAULT_ORDERS = 4


def _positive(name: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} = {text!r} is not a number; allowed: seconds > 0") from None
        if not 0 < v < float("inf"):
            raise argparse.ArgumentTypeError(f"{name} = {text} is out of range; allowed: seconds > 0")
        return v
    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``tessera-lab measure`` (``--json`` is added by the caller)."""
    from tessera_lab.overlap.bundles import BACKENDS
    from tessera_lab.defaults import DEFAULT_GPU, DEFAULT_MODEL

    p.add_argument("--backend", required=True, choices=list(BACKENDS) + ["runner"],
                   help="cpu / cuda: the runtime's node executor on an EP group of --ep processes (gloo / NCCL); "
                        "analytic: the cost model (runner: merged into cpu, refused with the replacement)")
    p.add_argument("--model", default=None,
                   help=f"shipped model or config.json (default {DEFAULT_MODEL}; a runner model tiny-* is measured "
                        f"at its own shapes)")
    p.add_argument("--out", metavar="PATH", default=None,
                   help="profile to write, merged if it exists (default data/profiles/<backend>-<model>.json in the "
                        "package's data folder, where `tessera-lab reproduce` looks profiles up); the path written "
                        "is the output's last line")
    p.add_argument("--budget-s", type=_positive("budget_s"), default=DEFAULT_BUDGET_S,
                   help=f"cpu/cuda: wall seconds the measurement may take, process start included (default "
                        f"{DEFAULT_BUDGET_S:g}); a probe sizes repeats, candidate orders and the size factor to it, "
                        f"never reducing an option given explicitly")
    p.add_argument("--repeats", type=int_at_least("repeats", 1), default=None,
                   help=f"timed repetitions (default {DEFAULT_REPEATS}, reduced to fit --budget-s down to 3)")
    p.add_argument("--orders", type=int_at_least("orders", 2), default=None,
                   help=f"cpu/cuda: candidate orders measured per pair (default {DEFAULT_ORDERS}, reduced to fit "
                        f"--budget-s down to 2)")
    p.add_argument("--warmup", type=int_at_least("warmup", 0), default=1, help="untimed repetitions (default 1)")
    p.add_argument("--size-factor", type=_size_factor, default=None,
                   help="multiply widths and sequence length (default: cpu 0.125, halved to fit --budget-s; cuda "
                        "and analytic 1.0; a runner model tiny-* at its own shapes, factor 1.0)")
    p.add_argument("--ep", type=int_at_least("ep", 1), default=None,
                   help="EP group size (cpu/cuda: that many processes measure, 1..8; default cpu: the largest "
                        "divisor of the expert count <= min(8, cores), cuda: <= min(8, GPUs); analytic: 8)")
    p.add_argument("--tp", type=int_at_least("tp", 1), default=1)
    p.add_argument("--seq-len", type=int_at_least("seq_len", 1), default=4096)
    p.add_argument("--micro-batch-size", type=int_at_least("micro_batch_size", 1), default=1)
    p.add_argument("--gpu", default=DEFAULT_GPU, help="GPU of the analytic model (default H200)")
    p.add_argument("--world-size", type=int_at_least("world_size", 2), default=None,
                   help="processes of the local group; must equal --ep for cpu/cuda (kept for old scripts)")
    p.add_argument("--timeout", type=_positive("timeout"), default=600.0, help="kill the measuring processes after S seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--pair", default=None, metavar="F_KIND,BW_KIND",
                   help="cpu/cuda: measure only this pair of layer kinds, e.g. linear_attention+moe,full_attention+moe "
                        "(default: every ordered pair of the model's kinds)")
    p.add_argument("--dry-run", action="store_true",
                   help="cpu/cuda: print the host memory per process, the steps and the estimated time, and start "
                        "nothing (runs without the GPUs)")


def _default_ep(backend: str, model) -> int:
    import os

    from tessera_lab.runner.measure.sizing import default_ep

    if backend == "cpu":
        return default_ep(model.moe.num_experts or 1, os.cpu_count() or 1)
    import torch

    return default_ep(model.moe.num_experts or 1, torch.cuda.device_count())


def _measure_runtime(args: argparse.Namespace, model, seq_len: int, default_f: float):
    """cpu / cuda: the one harness (:func:`tessera_lab.runner.measure.harness.measure_layer_pairs`)."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.runner.measure.harness import measure_layer_pairs, preflight

    preflight(args.backend)
    if args.ep is None:
        args.ep = _default_ep(args.backend, model)
    if args.world_size is not None and args.world_size != args.ep:
        raise ConfigError(f"--world-size = {args.world_size} differs from --ep = {args.ep}; the {args.backend} "
                          f"backend runs one process per EP rank (leave --world-size out)")
    parallel = ParallelConfig(ep=args.ep, tp=args.tp, seq_len=seq_len, micro_batch_size=args.micro_batch_size,
                              pp=1, dp=1)
    fixed = [name for name, v in (("repeats", args.repeats), ("keep", args.orders), ("size_factor", args.size_factor))
             if v is not None]

    def line(text: str) -> None:
        if not args.no_progress:
            print(f"measure {args.backend}: {text}", file=sys.stderr, flush=True)

    # the budget counts from this process's start (interpreter, imports, model) to the last byte written: the
    # harness gets what is left of it now; the write reserve is the harness's
    spent = time.time() - process_start_time()
    left = max(1.0, args.budget_s - spent)
    if spent > 0.5:
        line(f"{spent:.1f} s of the {args.budget_s:g} s budget spent before the measurement (process start, imports)")
    results = measure_layer_pairs(
        model, parallel, args.backend, size_factor=args.size_factor if args.size_factor is not None else default_f,
        repeats=args.repeats or DEFAULT_REPEATS, warmup=args.warmup, keep=args.orders or DEFAULT_ORDERS,
        budget_s=left, fixed=fixed, timeout_s=args.timeout, pairs=_pairs(args), progress=line)
    for r in results:  # one sizing dict shared by every result: the budget as given, the clock from process start
        sz = r.metadata.get("sizing")
        if sz is not None and sz.get("budget_s") == left:
            sz.update(budget_s=args.budget_s, harness_budget_s=round(left, 2), startup_before_harness_s=round(spent, 2))
    return results, parallel


def _pairs(args: argparse.Namespace) -> list[tuple[str, str]] | None:
    """``--pair F,B`` as ``[(F, B)]`` (the kinds are checked against the model by the harness), else None.

    Raises:
        ConfigError: not two comma-separated kinds.
    """
    from tessera_lab.errors import ConfigError

    if args.pair is None:
        return None
    parts = [x.strip() for x in args.pair.split(",")]
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"option --pair = {args.pair!r} is not two layer kinds; allowed: F_KIND,BW_KIND "
                          f"(e.g. linear_attention+moe,full_attention+moe)")
    return [(parts[0], parts[1])]


def _dry_run(args: argparse.Namespace, model, seq_len: int, default_f: float) -> int:
    """``measure --dry-run``: the validated measurement laid out (:mod:`tessera_lab.runner.measure.dryrun`);
    nothing is started and no GPU is needed."""
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.runner.measure.dryrun import dry_run_text
    from tessera_lab.runner.measure.harness import prepare_measurement

    if args.ep is None:
        args.ep = _default_ep(args.backend, model)
    parallel = ParallelConfig(ep=args.ep, tp=args.tp, seq_len=seq_len, micro_batch_size=args.micro_batch_size,
                              pp=1, dp=1)
    fixed = [name for name, v in (("repeats", args.repeats), ("keep", args.orders), ("size_factor", args.size_factor))
             if v is not None]
    setup = prepare_measurement(
        model, parallel, args.backend, size_factor=args.size_factor if args.size_factor is not None else default_f,
        repeats=args.repeats or DEFAULT_REPEATS, warmup=args.warmup, keep=args.orders or DEFAULT_ORDERS,
        budget_s=args.budget_s, fixed=fixed, pairs=_pairs(args))
    print(dry_run_text(model.name, setup, args.timeout))
    return 0


def _per_pair(values: list) -> str:
    """``"4"`` when every pair has the same value, else ``"4, 3, 3, 4 (pairs 1-4)"``."""
    if len(set(values)) == 1:
        return f"{values[0]}"
    return ", ".join(str(v) for v in values) + f" (pairs 1-{len(values)})"


def sizing_text(sz: dict, ran: list[dict] | None = None) -> str:
    """The sizing of a measurement in words: budget, wall and CPU seconds, load, what was reduced or skipped.

    Args:
        sz: the sizing dict of the harness (``metadata["sizing"]``).
        ran: per pair, in the order measured, ``{"repeats", "orders"}`` as the run's records say (each result's
            ``metadata["repeats"]`` and ``metadata["candidates_measured"]``); without it the plan's values are
            printed and named as planned.
    """
    load = sz.get("load_average_1m") or {}
    req = sz.get("requested") or {}
    plan = sz.get("plan") or {}
    if ran:
        what = (f"repeats {_per_pair([p['repeats'] for p in ran])}, orders measured per pair "
                f"{_per_pair([p['orders'] for p in ran])}")
    else:
        what = f"planned: repeats {plan.get('repeats')}, {plan.get('keep')} orders per pair"
    lines = [f"sizing (budget {sz.get('budget_s'):g} s): took {sz.get('wall_s')} s wall, {sz.get('cpu_s')} s CPU "
             f"(user + sys, all processes), load average {load.get('before')} -> {load.get('after')}; "
             f"size factor {sz.get('size_factor'):g}, {what}"]
    red = list(sz.get("reductions") or [])
    lines.append("reduced to fit: " + ("; ".join(red) if red else "nothing")
                 + f" (requested size factor {req.get('size_factor'):g}, repeats {req.get('repeats')}, "
                   f"{req.get('keep')} orders)")
    if sz.get("over_budget"):
        lines.append(f"over budget: {sz['over_budget']}")
    sk = list(sz.get("skipped") or [])
    if sk:
        lines.append("skipped: " + "; ".join(sk))
    return "\n".join(lines)


def iqr_text(q1_s: float, q3_s: float) -> str:
    """``"954.2-1003.4"``: an interquartile range (seconds in) as milliseconds with the same decimals on both
    ends, enough for four significant digits of the lower end (at most 6 decimals)."""
    import math

    lo_ms, hi_ms = q1_s * 1e3, q3_s * 1e3
    mag = math.floor(math.log10(abs(lo_ms))) if lo_ms and math.isfinite(lo_ms) else 0
    d = min(6, max(0, 3 - mag))
    return f"{lo_ms:.{d}f}-{hi_ms:.{d}f}"


def fit_text(fit: dict) -> str:
    """The contention fit in words (:func:`tessera_lab.overlap.fit.fit_contention_samples`): the compute and
    communication slowdowns while both run at once, fitted to the measured pair samples, and what its rms
    relative error says."""
    err = fit["rms_relative_error"]
    c, k = fit["compute"], fit["comm"]

    def slow(name: str, v: float) -> str:
        if v == 0:
            return f"{name} +0 (no slowdown from running together found)"
        return f"{name} +{v:.3g} ({name} {v * 100:.0f}% slower while both run)"

    quality = ("the fitted model explains the samples well" if err <= 0.1 else
               "the fitted model explains the samples poorly (its predictions miss the measured pair times by "
               f"{err * 100:.0f}% on average)")
    return (f"contention fit over {fit['pairs']} pairs (computed from the measured pair samples): the slowdown of "
            f"compute and of communication while both run at once, fitted so that the two-lane model's pair time "
            f"matches the measured one: {slow('compute', c)}, {slow('comm', k)}; rms relative error {err:.3g}: "
            f"{quality} (rule of this output: <= 0.1 well, above poorly)")


def _measure_analytic(args: argparse.Namespace, model: Any, seq_len: int) -> tuple[Any, Any]:
    """``measure --backend analytic``: the overlap table from the cost model (with a progress bar) and the
    parallel configuration it was computed for."""
    from tqdm import tqdm

    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import ParallelConfig, cluster_for
    from tessera_lab.overlap.core import overlap_table

    parallel = ParallelConfig(ep=args.ep or 8, tp=args.tp, seq_len=seq_len,
                              micro_batch_size=args.micro_batch_size, pp=1, dp=1)
    bar = tqdm(total=len({l.kind for l in model.stack.layers}) ** 2, desc="measure analytic", unit="pair",
               file=sys.stderr, disable=args.no_progress, leave=False)

    def progress(done: int, total: int) -> None:
        bar.total, bar.n = total, done
        bar.refresh()

    try:
        overlap = overlap_table(model, parallel, "analytic", progress=progress,
                                cost_model=CostModel(cluster_for(parallel, args.gpu), parallel))
    finally:
        bar.close()
    return overlap, parallel


def _measure_text(args: argparse.Namespace, model: Any, overlap: Any, results: list, prof: Any, f: float,
                  spread: Any, noise: list, sizing: dict | None) -> tuple[str, list[dict[str, Any]]]:
    """The text of ``measure`` (table, spread, decisions, fit, noise, sizing, profile path) and the order
    decisions of each pair."""
    rows = [{
        "F kind": r.kind_f, "BW kind": r.kind_b, "t_f (ms)": r.t_f * 1e3, "t_b (ms)": r.t_b * 1e3,
        "sum (ms)": r.t_sum * 1e3, "pair (ms)": r.t_pair * 1e3,
        "IQR (ms)": iqr_text(r.t_pair_q1, r.t_pair_q3), "gain (ms)": r.gain * 1e3,
        "efficiency": r.efficiency, "hidden comm (share)": r.comm_hidden_fraction,
    } for r in overlap.itertuples()]
    env = prof.environment
    reps = _per_pair([r.metadata.get("repeats") for r in results]) if args.backend != "analytic" else 1
    text = (f"{model.name}: overlap of F (micro-batch i+1) with B+W (micro-batch i), backend {args.backend}, "
            f"device {env.get('device')}, size factor {f:g}, repeats {reps}"
            + (f", EP {args.ep} processes" if args.backend != "analytic" else "") + " (measured medians)\n"
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
        text += "\n" + fit_text(fit)
    for w in noise:
        text += "\n" + w["text"]
    if sizing is not None:
        ran = [{"repeats": r.metadata.get("repeats"), "orders": r.metadata.get("candidates_measured")}
               for r in results]
        text += "\n" + sizing_text(sizing, ran)
    text += f"\nprofile written: {prof.path}"
    return text, decisions


def cmd_measure(args: argparse.Namespace) -> int:
    """``tessera-lab measure``: the overlap table of a model's layer kinds, written to a profile."""
    from tessera_lab.errors import ConfigError

    if args.backend == "runner":
        raise ConfigError("option --backend = 'runner' is merged into --backend cpu (one harness: the runtime's node "
                          "executor); use: tessera-lab measure --backend cpu --model tiny-runner --ep 2")
    if args.model is None:
        from tessera_lab.plan.make import DEFAULT_MODEL

        args.model = DEFAULT_MODEL
    from tessera_lab.model.spec import load_model
    from tessera_lab.overlap.bundles import DEFAULT_SIZE_FACTOR
    from tessera_lab.overlap.core import overlap_spread
    from tessera_lab.overlap.profiles import save_profile, update_profile
    from tessera_lab.overlap.table import results_table
    from tessera_lab.paths import data_dir

    model = load_model(args.model)
    seq_len, default_f = args.seq_len, DEFAULT_SIZE_FACTOR[args.backend]
    if args.dry_run and args.backend == "analytic":
        raise ConfigError("option --dry-run applies to --backend cpu or cuda (the analytic backend starts no "
                          "processes); allowed: drop --dry-run")
    if args.backend != "analytic" and args.budget_s > args.timeout:
        raise ConfigError(f"option --budget-s = {args.budget_s:g} is over --timeout = {args.timeout:g}: the measuring "
                          "processes would be killed before the budget is spent; allowed: --budget-s <= --timeout")
    sizing = None
    if args.backend == "analytic":
        overlap, parallel = _measure_analytic(args, model, seq_len)
        results, f = overlap.attrs["results"], 1.0
    else:
        from tessera_lab.runner.testbed.predict import runner_model_config

        try:  # a runner model (data/models/tiny-*.json) is measured at its own shapes
            seq_len, default_f = runner_model_config(args.model)[1]["seq_len"], 1.0
        except ConfigError:
            pass
        if args.dry_run:
            return _dry_run(args, model, seq_len, default_f)
        results, parallel = _measure_runtime(args, model, seq_len, default_f)
        overlap = results_table(results)
        sizing = results[0].metadata.get("sizing")
        f = results[0].metadata["size_factor"]
    noise = []
    if sizing is not None:  # computed from this run's samples; the measured values are kept as they are
        from tessera_lab.runner.measure.noise import noise_warnings

        import os

        noise = noise_warnings(results, sizing.get("load_average_1m"), os.cpu_count())
        for i, r in enumerate(results):
            r.metadata["noise_warnings"] = [w["text"] for w in noise if i + 1 in w["pairs"]]
    sizing = _stamp_wall(results) if sizing is not None else None
    # a model named by its config's _name_or_path ("Org/Model") gets one file name, not a sub-folder
    out = args.out or str(data_dir() / "profiles" / f"{args.backend}-{model.name.replace('/', '--')}.json")
    gpu = args.gpu if args.backend == "analytic" else None
    prof = update_profile(out, results, backend=args.backend, model=model.name, parallel=parallel, size_factor=f, gpu=gpu)
    if sizing is not None:  # the last measurement's sizing and noise warnings, also in every entry's metadata
        prof.data["sizing"] = sizing
        prof.data["noise_warnings"] = noise
        save_profile(prof, prof.path)
    spread = overlap_spread(overlap)
    text, decisions = _measure_text(args, model, overlap, results, prof, f, spread, noise, sizing)
    fit = prof.data.get("fit")
    result = {
        "model": model.name, "backend": args.backend, "size_factor": f, "profile": str(prof.path),
        "overlap_spread": spread, "environment": prof.environment,
        "table": overlap.to_dict(orient="records"), "decisions": decisions, "fit": fit, "sizing": sizing,
        "noise_warnings": noise,
    }
    emit(args, result, text)
    if getattr(args, "json", None):  # the text (ending with the path) was not printed
        print(f"profile written: {prof.path}", file=sys.stderr)
    if sizing is not None:  # the budget's clock: process start to the last byte written (profile and --json)
        _say_wall(args)
    return 0


def _stamp_wall(results: list) -> dict:
    """Set every result's sizing ``wall_s`` to the seconds from process start to now (just before the profile is
    written; the write takes milliseconds); returns the sizing."""
    wall = {"wall_s": round(time.time() - process_start_time(), 2),
            "wall_s_note": "process start to the profile's write (the write itself takes milliseconds)"}
    for r in results:
        if r.metadata.get("sizing") is not None:
            r.metadata["sizing"].update(wall)
    return results[0].metadata["sizing"]


def _say_wall(args: argparse.Namespace) -> None:
    took = time.time() - process_start_time()
    print(f"measure {args.backend}: {took:.1f} s wall from process start to the last byte written (budget "
          f"{args.budget_s:g} s{'; over it' if took > args.budget_s else ''})", file=sys.stderr)


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
