"""``tessera-lab simulate``: simulate a uniform pipeline (and, with ``--routing``, dynamic bubble filling)."""

from __future__ import annotations

import argparse
import sys

from tessera_lab.argtypes import nonneg_float, positive_float, positive_int
from tessera_lab.cli.common import add_json, emit, table


def cmd_simulate(args: argparse.Namespace) -> int:
    from tessera_lab.errors import ScheduleError
    from tessera_lab.pipeline.schedules import build_schedule, canonical_name
    from tessera_lab.pipeline.simulate import simulate, uniform_durations

    if getattr(args, "routing", None) is not None or getattr(args, "dynamic", False):
        return _simulate_routed(args)
    budget = getattr(args, "memory_budget", None)
    if budget is not None and canonical_name(args.schedule) != "zb-auto":
        raise ScheduleError(f"--memory-budget is used only with --schedule zb-auto, not {args.schedule!r}")
    w = args.w or 0.0
    sched = build_schedule(args.schedule, args.stages, args.microbatches, args.vpp, memory_budget=budget,
                           f=args.f, i=max(0.0, args.b - w), w=w, p2p=args.p2p_latency)
    tl = simulate(sched, uniform_durations(args.f, args.b, args.w, args.fb), p2p_latency=args.p2p_latency)
    result = {
        "schedule": sched.name, "stages": args.stages, "microbatches": args.microbatches, "vpp": args.vpp,
        "makespan": tl.iteration_time, "bubble_fraction": tl.bubble_fraction,
        "bubble_overhead": tl.bubble_overhead, "per_rank_idle": tl.per_rank_idle,
        "per_rank_busy": tl.per_rank_busy, "peak_activations": tl.peak_activations,
    }
    if "choice" in sched.meta:  # zb-auto: the budget and the candidate the search kept
        result.update(memory_budget=sched.meta["memory_budget"], search_choice=sched.meta["choice"])
    rows = [{"rank": r, "busy": tl.per_rank_busy[r], "idle": tl.per_rank_idle[r],
             "peak activations": tl.peak_activations[r]} for r in range(len(tl.per_rank_busy))]
    text = (table(rows) + f"\nmakespan {tl.iteration_time:.6g}  bubble_fraction {tl.bubble_fraction:.4f}  "
            f"bubble_overhead {tl.bubble_overhead:.4f}")
    emit(args, result, text)
    if args.trace:
        tl.to_chrome_trace(args.trace)
        print(f"trace: {args.trace}", file=sys.stderr)
    if args.plot:
        from tessera_lab.ui.plots import gantt

        ax = gantt(tl, title=f"{sched.name}: p={args.stages}, m={args.microbatches}")
        from tessera_lab.io import save_figure

        print(f"figure: {save_figure(ax.figure, args.plot)}", file=sys.stderr)
    return 0


def _simulate_routed(args: argparse.Namespace) -> int:
    """``simulate --routing ... [--dynamic]``: routing-dependent durations; static vs dynamic filling."""
    from tessera_lab.dynamic.core import simulate_cli

    result, text, timelines = simulate_cli(
        schedule=args.schedule, stages=args.stages, microbatches=args.microbatches, f=args.f, b=args.b, w=args.w,
        routing=args.routing, dynamic=args.dynamic, vpp=args.vpp, ep=args.ep, experts=args.experts, top_k=args.top_k,
        tokens=args.tokens, layers_per_stage=args.layers_per_stage, expert_fraction=args.expert_fraction,
        groups=args.groups, seed=args.seed, capacity_factor=args.capacity_factor, grad_sync=args.grad_sync,
        p2p_latency=args.p2p_latency, memory_cap=args.memory_cap)
    emit(args, result, text)
    tl = timelines.get("dynamic", timelines["static"])
    if args.trace:
        tl.to_chrome_trace(args.trace)
        print(f"trace: {args.trace}", file=sys.stderr)
    if args.plot:
        from tessera_lab.ui.plots import gantt_pair

        fig = gantt_pair(timelines.get("static"), timelines.get("dynamic"))
        from tessera_lab.io import save_figure

        print(f"figure: {save_figure(fig, args.plot)}", file=sys.stderr)
    return 0



def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate a uniform pipeline")
    p.add_argument("--schedule", default="1f1b", help="gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped|zb-v|zb-auto (default 1f1b)")
    p.add_argument("--stages", type=positive_int("stages"), required=True, help="pipeline ranks (pp)")
    p.add_argument("--microbatches", type=positive_int("microbatches"), required=True)
    p.add_argument("--vpp", type=positive_int("vpp"), default=1, help="chunks per rank (interleaved)")
    p.add_argument("--f", type=nonneg_float("f"), required=True, help="forward time of one stage (one chunk for interleaved and DualPipeV, so a rank with v chunks does "
                        "v times the work), any time unit (seconds if you want units)")
    p.add_argument("--b", type=nonneg_float("b"), required=True, help="full backward time (input + weight gradient) of one stage or chunk, same unit as --f")
    p.add_argument("--w", type=nonneg_float("w"), default=None, help="weight-gradient part of --b (zero-bubble schedules split B into I = b - w and W = w)")
    p.add_argument("--fb", type=positive_float("fb"), default=None, help="time of an overlapped F+B pair (default f + b: no overlap gain)")
    p.add_argument("--p2p-latency", type=nonneg_float("p2p_latency"), default=0.0)
    p.add_argument("--memory-budget", type=nonneg_float("memory_budget"), default=None, metavar="K",
                   help="zb-auto only: activations a rank may hold, in micro-batches (default 2p-1; p with --vpp 2)")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON (opens in Perfetto)")
    p.add_argument("--plot", metavar="PATH", help="save a Gantt chart")
    g = p.add_argument_group("routing skew and dynamic bubble filling (tessera_lab.dynamic.core)")
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

