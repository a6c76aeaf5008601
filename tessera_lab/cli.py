"""The ``tessera-lab`` command line (DESIGN section 10).

Every subcommand prints a readable table and accepts ``--json PATH`` (``--json -`` for stdout, which
then replaces the table) to write its result. Bad input exits with status 2 and one line naming the
field and the allowed range.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Any, Sequence

from .argtypes import nonneg_float, positive_int
from .errors import TesseraError

GIB = 2**30


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def _cost_list(text: str) -> list[float]:
    out = []
    for idx, part in enumerate(text.split(",")):
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"costs[{idx}] = {part!r} is not a number; allowed: comma-separated numbers >= 0") from None
        if not v >= 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"costs[{idx}] = {part} is out of range; allowed: a finite number >= 0")
        out.append(v)
    return out


def _table(rows: list[dict[str, Any]], floatfmt: str = ".4g") -> str:
    from tabulate import tabulate

    return tabulate(rows, headers="keys", floatfmt=floatfmt, tablefmt="simple")


def _emit(args: argparse.Namespace, result: Any, text: str) -> None:
    from .io import write_json

    if getattr(args, "json", None) == "-":
        write_json("-", result)
        return
    print(text)
    if getattr(args, "json", None):
        write_json(args.json, result)


def _layer_summary(layers: list[int], kinds: list[str]) -> str:
    if not layers:
        return "-"
    short = {"linear_attention": "L", "full_attention": "A"}
    counts = Counter(short.get(k.split("+")[0], "?") + ("" if k.endswith("moe") else "d") for k in kinds)
    parts = " ".join(f"{k}x{n}" for k, n in sorted(counts.items()))
    return f"{layers[0]}-{layers[-1]} ({parts})"


# ---------------------------------------------------------------------- subcommands
def cmd_models(args: argparse.Namespace) -> int:
    from .models import load_model, shipped_models

    rows = []
    for name in shipped_models():
        m = load_model(name)
        c = m.param_counts()
        rows.append({
            "model": name, "type": m.model_type, "layers": m.num_layers, "hidden": m.hidden_size,
            "experts": m.num_experts, "top_k": m.num_experts_per_tok, "attention_ratio": m.attention_ratio,
            "total_B": c.total / 1e9, "active_B": c.active / 1e9,
        })
    _emit(args, {"models": rows}, _table(rows, ".2f"))
    return 0


def cmd_params(args: argparse.Namespace) -> int:
    from .models import load_model

    m = load_model(args.model)
    c = m.param_counts().as_dict()
    rows = [{"count": k, "parameters": v, "billions": v / 1e9} for k, v in c.items()]
    _emit(args, {"model": m.name, **c}, f"{m.name} ({m.model_type}, {m.num_layers} layers)\n" + _table(rows, ".3f"))
    return 0


def _model_from_args(args: argparse.Namespace):
    from .models import load_model

    m = load_model(args.model)
    changes = {k: v for k, v in {
        "attention_ratio": args.attention_ratio, "moe_intermediate_size": args.expert_width,
        "num_experts_per_tok": args.top_k, "num_experts": args.num_experts, "num_layers": args.layers,
    }.items() if v is not None}
    return m.with_changes(**changes) if changes else m


def _parallel_from_args(args: argparse.Namespace):
    from .hardware import ParallelConfig

    return ParallelConfig(
        pp=args.pp, vpp=args.vpp, tp=args.tp, ep=args.ep, dp=args.dp, microbatches=args.microbatches,
        micro_batch_size=args.micro_batch_size, seq_len=args.seq_len, schedule=args.schedule,
        distributed_optimizer=not args.no_distributed_optimizer,
    )


def _evaluation_rows(ev) -> list[dict[str, Any]]:
    return [{
        "stage": st.index, "layers": _layer_summary(st.layers, st.kinds), "n": len(st.layers),
        "time/mb (ms)": st.time_s * 1e3, "standalone F+B+W (ms)": st.standalone_s * 1e3,
        "memory (GiB)": st.memory_bytes / GIB,
    } for st in ev.stages]


def format_plan(plan) -> str:
    """Readable text of a plan: per-stage tables for the chosen method and each baseline, then a summary."""
    p, m = plan.parallel, plan.model
    lines = [
        f"model {m.name}: {m.num_layers} layers, pattern {m.layer_pattern()}  (L linear attention, A full attention; lower case: dense FFN)",
        f"cluster {plan.cluster.num_nodes} x {plan.cluster.gpus_per_node} {plan.cluster.gpu.name}; "
        f"pp={p.pp} ep={p.ep} tp={p.tp} dp={p.dp} ({p.world_size} GPUs), schedule {p.schedule}, "
        f"m={p.microbatches} micro-batches of {p.micro_batch_size} x {p.seq_len} tokens; "
        f"memory limit {plan.memory_capacity_bytes / GIB:.1f} GiB per GPU",
        "",
    ]
    summary = []
    if p.schedule == "overlapped":
        lines.append("time/mb: per micro-batch after overlap (forward of one micro-batch paired with the backward of "
                     "another, best issue order); standalone: the same work run one task after the other")
        lines.append("")
    for label, ev in [(f"{plan.chosen.method} (chosen)", plan.chosen)] + list(plan.baselines.items()):
        lines.append(f"[{label}] boundaries {ev.partition.boundaries}"
                     + ("" if ev.fits_memory else "  ** exceeds GPU memory **")
                     + (f"; solver {ev.partition.solver} {ev.partition.status} in {ev.partition.solve_time_s:.3f} s"
                        if ev.partition.solver else ""))
        lines.append(_table(_evaluation_rows(ev), ".3f"))
        lines.append("")
        summary.append({
            "method": ev.method, "iteration (s)": ev.iteration_time_s, "tokens/s": ev.tokens_per_s,
            "MFU": ev.mfu, "bubble_fraction": ev.bubble_fraction,
            "slowest stage (ms)": max(st.time_s for st in ev.stages) * 1e3,
        })
    lines.append(_table(summary, ".4g"))
    lines.append("MFU: Megatron-LM model FLOPs (3 x forward GEMM + attention FLOPs, causal at half) / "
                 f"(iteration time x {p.world_size} GPUs x {plan.cluster.gpu.peak_flops / 1e12:.0f} TFLOP/s dense bf16)")
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    from .hardware import Cluster
    from .plan import make_plan

    model = _model_from_args(args)
    parallel = _parallel_from_args(args)
    cluster = Cluster.dgx(args.gpu, args.nodes) if args.nodes else None
    profile = None
    if args.profile:
        from .profiles import load_profile

        profile = load_profile(args.profile)
    plan = make_plan(model, parallel, cluster, method=args.method, objective=args.objective,
                     time_limit_s=args.time_limit, gpu=args.gpu, profile=profile)
    _emit(args, plan.as_dict(), format_plan(plan))
    if args.export:
        from .exports import write_plan

        write_plan(plan.as_dict(), args.export)
        print(f"plan written to {args.export} (schema-versioned JSON with Megatron-LM, DeepSpeed and "
              "torch.distributed.pipelining exports)", file=sys.stderr)
    if args.plot:
        from .plots import save_plan_figures

        paths = save_plan_figures(plan, args.plot)
        print("figures: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from .partition import partition_costs

    if args.stages * args.vpp > len(args.costs):
        from .errors import PartitionError

        raise PartitionError(
            f"field 'stages' x 'vpp' = {args.stages} x {args.vpp} = {args.stages * args.vpp} virtual stages is out of "
            f"range; allowed: at most the number of layers ({len(args.costs)})")
    part = partition_costs(args.costs, args.stages * args.vpp, args.method, time_limit_s=args.time_limit,
                           vpp=args.vpp)
    from .exports import deepspeed_parts, megatron_layout, torch_split_points

    result = {
        "boundaries": part.boundaries, "stage_costs": part.stage_costs, "bottleneck": part.bottleneck,
        "method": part.method, "solver": part.solver, "status": part.status, "solve_time_s": part.solve_time_s,
        "rank_costs": part.rank_costs, "vpp": args.vpp,
        "exports": {"megatron_pipeline_model_parallel_layout": megatron_layout(part.boundaries),
                    "deepspeed_parts": deepspeed_parts(part.boundaries),
                    "torch_pipelining_split_points": torch_split_points(part.boundaries)},
    }
    rows = [{"stage": s, "rank": s % args.stages, "layers": f"{part.boundaries[s]}-{part.boundaries[s + 1] - 1}",
             "cost": c} for s, c in enumerate(part.stage_costs)]
    _emit(args, result, _table(rows) + f"\nbottleneck {part.bottleneck:.6g} ({part.method}"
          + (f", {part.solver} {part.status}" if part.solver else "") + ")")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from .schedules import build_schedule
    from .simulate import simulate, uniform_durations

    if getattr(args, "routing", None) is not None or getattr(args, "dynamic", False):
        return _simulate_routed(args)
    sched = build_schedule(args.schedule, args.stages, args.microbatches, args.vpp)
    tl = simulate(sched, uniform_durations(args.f, args.b, args.w, args.fb), p2p_latency=args.p2p_latency)
    result = {
        "schedule": sched.name, "stages": args.stages, "microbatches": args.microbatches, "vpp": args.vpp,
        "makespan": tl.iteration_time, "bubble_fraction": tl.bubble_fraction,
        "bubble_overhead": tl.bubble_overhead, "per_rank_idle": tl.per_rank_idle,
        "per_rank_busy": tl.per_rank_busy, "peak_activations": tl.peak_activations,
    }
    rows = [{"rank": r, "busy": tl.per_rank_busy[r], "idle": tl.per_rank_idle[r],
             "peak activations": tl.peak_activations[r]} for r in range(len(tl.per_rank_busy))]
    text = (_table(rows) + f"\nmakespan {tl.iteration_time:.6g}  bubble_fraction {tl.bubble_fraction:.4f}  "
            f"bubble_overhead {tl.bubble_overhead:.4f}")
    _emit(args, result, text)
    if args.trace:
        tl.to_chrome_trace(args.trace)
    if args.plot:
        from .plots import gantt

        ax = gantt(tl, title=f"{sched.name}: p={args.stages}, m={args.microbatches}")
        ax.figure.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0


def _simulate_routed(args: argparse.Namespace) -> int:
    """``simulate --routing ... [--dynamic]``: routing-dependent durations; static vs dynamic filling."""
    from .dynamic import simulate_cli

    result, text, timelines = simulate_cli(
        schedule=args.schedule, stages=args.stages, microbatches=args.microbatches, f=args.f, b=args.b, w=args.w,
        routing=args.routing, dynamic=args.dynamic, vpp=args.vpp, ep=args.ep, experts=args.experts, top_k=args.top_k,
        tokens=args.tokens, layers_per_stage=args.layers_per_stage, expert_fraction=args.expert_fraction,
        groups=args.groups, seed=args.seed, capacity_factor=args.capacity_factor, grad_sync=args.grad_sync,
        p2p_latency=args.p2p_latency, memory_cap=args.memory_cap)
    _emit(args, result, text)
    tl = timelines.get("dynamic", timelines["static"])
    if args.trace:
        tl.to_chrome_trace(args.trace)
    if args.plot:
        from .plots import gantt_pair

        fig = gantt_pair(timelines.get("static"), timelines.get("dynamic"))
        fig.savefig(args.plot, dpi=120, bbox_inches="tight")
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from .measure_cli import run_measure

    return run_measure(args, _emit, _table)


def cmd_report(args: argparse.Namespace) -> int:
    from .report import run_report

    return run_report(args, _emit, _table)


def cmd_run(args: argparse.Namespace) -> int:
    """Spawn pp x ep x dp local workers (gloo on CPU, NCCL with GPUs); see tessera_lab.runner.launch."""
    from .runner.launch import run_from_args

    return run_from_args(args)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from .reproduce import reproduce, write

    rep = reproduce(quick=args.quick)
    paths = write(rep, args.out)
    rows = [{"figure": p.name, "path": str(p)} for p in paths]
    text = _table(rows) + "\n" + "\n".join(f"- {n}" for n in rep.notes)
    _emit(args, rep.as_dict() | {"files": [str(p) for p in paths]}, text)
    return 0


def _add_plan_options(p: argparse.ArgumentParser, default_model: str, default_gpu: str) -> None:
    """The model, hardware, parallel and partition options that build a plan (``plan`` and ``report``; read
    by :func:`_model_from_args`, :func:`_parallel_from_args` and ``Cluster.dgx(gpu, nodes)``)."""
    p.add_argument("--model", default=default_model, help=f"shipped model or config.json (default {default_model})")
    p.add_argument("--gpu", default=default_gpu, help=f"H100, H200 or B200 (default {default_gpu})")
    p.add_argument("--nodes", type=positive_int("nodes"), default=None,
                   help="nodes of 8 GPUs (default: the fewest that hold pp*dp*ep*tp)")
    p.add_argument("--pp", type=positive_int("pp"), default=8)
    p.add_argument("--vpp", type=positive_int("vpp"), default=1)
    p.add_argument("--ep", type=positive_int("ep"), default=8)
    p.add_argument("--tp", type=positive_int("tp"), default=1)
    p.add_argument("--dp", type=positive_int("dp"), default=1)
    p.add_argument("--microbatches", "-m", type=positive_int("microbatches"), default=32)
    p.add_argument("--micro-batch-size", type=positive_int("micro_batch_size"), default=1)
    p.add_argument("--seq-len", type=positive_int("seq_len"), default=4096)
    p.add_argument("--schedule", default="overlapped",
                   help="overlapped (default: F of one micro-batch with B of another), 1f1b, gpipe, zb-h1 or zb-h2")
    p.add_argument("--method", default="ilp", choices=["ilp", "dp", "uniform"])
    p.add_argument("--no-distributed-optimizer", action="store_true")
    p.add_argument("--attention-ratio", type=int, default=None, help="linear-attention layers per full-attention layer")
    p.add_argument("--expert-width", type=int, default=None, help="routed expert intermediate size")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--num-experts", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)


# ---------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    from .plan import DEFAULT_GPU, DEFAULT_MODEL

    parser = _Parser(prog="tessera-lab", description="Pipeline-parallel planning for hybrid MoE models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add_json(p: argparse.ArgumentParser) -> None:
        p.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH ('-' for stdout)")

    p = sub.add_parser("models", help="list the shipped models")
    add_json(p)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("params", help="parameter counts of a model")
    p.add_argument("model", help="a shipped model name or a config.json path")
    add_json(p)
    p.set_defaults(func=cmd_params)

    p = sub.add_parser("plan", help="the main job: partition, simulate and report a pipeline plan")
    _add_plan_options(p, DEFAULT_MODEL, DEFAULT_GPU)
    p.add_argument("--objective", default="auto", choices=["auto", "bottleneck", "schedule"],
                   help="auto (default): solve the bottleneck and the schedule objective, keep the faster in simulation")
    p.add_argument("--time-limit", type=nonneg_float("time_limit"), default=10.0, help="ILP time limit, seconds")
    p.add_argument("--plot", metavar="PATH",
                   help="save figures: PATH.png gives PATH-stages.png (stage costs) and PATH-timeline.png (Gantt)")
    p.add_argument("--profile", metavar="PATH",
                   help="measured overlap profile (tessera-lab measure); layer-pair costs come from it")
    p.add_argument("--export", metavar="PATH",
                   help="write the plan as schema-versioned JSON with Megatron-LM layout, DeepSpeed parts and "
                        "torch.distributed.pipelining split points")
    add_json(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("partition", help="partition a plain per-layer cost list")
    p.add_argument("--costs", type=_cost_list, required=True, help="comma-separated per-layer costs")
    p.add_argument("--stages", type=positive_int("stages"), required=True, help="pipeline ranks")
    p.add_argument("--vpp", type=positive_int("vpp"), default=1,
                   help="virtual stages per rank (stage s runs on rank s %% stages; needs --method ilp)")
    p.add_argument("--method", default="ilp", choices=["ilp", "dp", "uniform"])
    p.add_argument("--time-limit", type=nonneg_float("time_limit"), default=10.0)
    add_json(p)
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("reproduce", help="the paper's reported figures beside ours (PNG, JSON, Markdown)")
    p.add_argument("--out", metavar="DIR", required=True, help="folder for the figures and tables")
    p.add_argument("--quick", action="store_true", help="fewer expert widths in the width study (seconds, not minutes)")
    add_json(p)
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("simulate", help="simulate a uniform pipeline")
    p.add_argument("--schedule", default="1f1b", help="gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped (default 1f1b)")
    p.add_argument("--stages", type=positive_int("stages"), required=True, help="pipeline ranks (pp)")
    p.add_argument("--microbatches", type=positive_int("microbatches"), required=True)
    p.add_argument("--vpp", type=positive_int("vpp"), default=1, help="chunks per rank (interleaved)")
    p.add_argument("--f", type=nonneg_float("f"), required=True, help="forward time of one stage (one chunk for interleaved and DualPipeV, so a rank with v chunks does "
                        "v times the work), any time unit (seconds if you want units)")
    p.add_argument("--b", type=nonneg_float("b"), required=True, help="full backward time (input + weight gradient) of one stage or chunk, same unit as --f")
    p.add_argument("--w", type=nonneg_float("w"), default=None, help="weight-gradient part of --b (zero-bubble schedules split B into I = b - w and W = w)")
    p.add_argument("--fb", type=nonneg_float("fb"), default=None, help="time of an overlapped F+B pair (default f + b: no overlap gain)")
    p.add_argument("--p2p-latency", type=nonneg_float("p2p_latency"), default=0.0)
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON (opens in Perfetto)")
    p.add_argument("--plot", metavar="PATH", help="save a Gantt chart")
    g = p.add_argument_group("routing skew and dynamic bubble filling (tessera_lab.dynamic)")
    g.add_argument("--routing", default=None, metavar="SPEC",
                   help="uniform|zipf:S|drift:S[:R]|replay:PATH: tokens per expert vary per micro-batch and the "
                        "busiest EP rank sets each stage's time")
    g.add_argument("--dynamic", action="store_true",
                   help="compare the static order with W deferred into predicted bubbles (needs --w)")
    g.add_argument("--ep", type=positive_int("ep"), default=8, help="EP ranks per stage (default 8)")
    g.add_argument("--experts", type=positive_int("experts"), default=64, help="routed experts (default 64)")
    g.add_argument("--top-k", type=positive_int("top_k"), default=8, help="experts per token (default 8)")
    g.add_argument("--tokens", type=positive_int("tokens"), default=4096,
                   help="tokens per EP rank and micro-batch (default 4096)")
    g.add_argument("--layers-per-stage", type=positive_int("layers_per_stage"), default=4,
                   help="MoE layers per stage, each routed independently (default 4)")
    g.add_argument("--expert-fraction", type=nonneg_float("expert_fraction"), default=0.5,
                   help="share of f, b, w that scales with the busiest EP rank's load (default 0.5)")
    g.add_argument("--groups", type=positive_int("groups"), default=1, help="EP groups, each deciding alone")
    g.add_argument("--seed", type=int, default=0, help="routing seed")
    g.add_argument("--capacity-factor", type=nonneg_float("capacity_factor"), default=None,
                   help="drop assignments above ceil(cf * tokens * k / E) per expert")
    g.add_argument("--grad-sync", type=nonneg_float("grad_sync"), default=0.0,
                   help="gradient reduce-scatter seconds per stage (comm lane)")
    g.add_argument("--memory-cap", default="max",
                   help="live micro-batches per rank: max (default: the static plan's worst rank), rank, or N")
    add_json(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("measure", help="measure the overlap of layer pairs (F with B+W) and write a profile")
    from .measure_cli import add_arguments as add_measure_arguments

    add_measure_arguments(p)
    add_json(p)
    p.set_defaults(func=cmd_measure)

    p = sub.add_parser("report", help="capacity report (where the lost MFU goes) of a plan, and a model-change diff")
    p.add_argument("--plan", metavar="PLAN.json", help="a plan from 'tessera-lab plan --json' (else the plan options)")
    _add_plan_options(p, DEFAULT_MODEL, DEFAULT_GPU)
    p.add_argument("--diff", metavar="OTHER",
                   help="compare with OTHER: a plan JSON, a model name, or changes like "
                        "'expert_width=256,top_k=4,seq_len=8192,dtype=fp8'")
    p.add_argument("--plot", metavar="PATH", help="save the waterfall of the capacity report")
    add_json(p)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("run", help="train the tiny MoE model with pipeline + expert parallelism (local processes)")
    from .runner.launch import add_run_arguments

    add_run_arguments(p)  # includes --json
    p.set_defaults(func=cmd_run)
    return parser


#: options that name an output file, and the commands whose ``--out`` is a folder
_FILE_OUTPUTS = ("json", "plot", "export", "trace", "profile_store")
_DIR_OUT_COMMANDS = ("reproduce", "run")
_PLOT_SUFFIXES = ("", ".png", ".pdf", ".svg", ".jpg", ".jpeg")


def _check_output_paths(args: argparse.Namespace) -> None:
    """Refuse unusable output paths before any work is done (a folder where a file goes, a file where a
    folder goes, an unknown figure format), so that a long measurement never ends in a failed write.

    Raises:
        ConfigError: naming the option and what is allowed.
    """
    from pathlib import Path

    from .errors import ConfigError

    def blocked_by_file(path: Path) -> Path | None:
        for parent in path.parents:
            if parent.exists():
                return None if parent.is_dir() else parent
        return None

    outputs = [(name, getattr(args, name, None)) for name in _FILE_OUTPUTS]
    out = getattr(args, "out", None)
    if out is not None and args.command not in _DIR_OUT_COMMANDS:
        outputs.append(("out", out))
    for name, value in outputs:
        if value is None or value == "-":
            continue
        path, opt = Path(value), "--" + name.replace("_", "-")
        if path.is_dir():
            raise ConfigError(f"option {opt} = '{value}' is a folder; allowed: a file path")
        bad = blocked_by_file(path)
        if bad is not None:
            raise ConfigError(f"option {opt} = '{value}': '{bad}' is a file, not a folder")
        if name == "plot" and path.suffix.lower() not in _PLOT_SUFFIXES:
            raise ConfigError(f"option --plot = '{value}' has an unknown figure format '{path.suffix}'; "
                              f"allowed: .png, .pdf, .svg, .jpg")
    if out is not None and args.command in _DIR_OUT_COMMANDS:
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"option --out = '{out}' is a file; allowed: a folder")
        bad = blocked_by_file(path)
        if bad is not None:
            raise ConfigError(f"option --out = '{out}': '{bad}' is a file, not a folder")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``tessera-lab``; returns the exit status (0 ok, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_output_paths(args)
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
