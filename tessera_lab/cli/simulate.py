"""``tessera-lab simulate``: simulate a uniform pipeline (and, with ``--routing``, dynamic bubble filling)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, fields
from typing import Any

from tessera_lab.argtypes import (fraction_below_one, int_at_least, int_in, nonneg_float, positive_float, positive_int,
                                  predictor_spec)
from tessera_lab.cli.common import add_json, emit, table
from tessera_lab.errors import ConfigError


#: seconds per unit of online work (:func:`online_units`) and controller run, measured on the 2-core VM with no other
#: load: ``simulate --dynamic --routing zipf:1.2`` with 1f1b, interleaved and dualpipev gave 0.19-0.26 ms
ONLINE_UNIT_S = 2.5e-4
#: work estimated to take longer than this (seconds) prints its estimate before it starts and progress while it runs
LONG_WORK_S = 10.0


def online_units(sched: Any, steps: int, groups: int) -> int:
    """Units of ``simulate --dynamic`` work: ``steps x groups x (stages x vpp x micro-batches + 4)`` (the 4: the
    per-step overhead of one controller step, measured as about 3-4 stage-micro-batches), checked against the work
    limit ``online_actions`` (:data:`tessera_lab.checks.WORK_LIMITS`, ``TESSERA_LAB_MAX_ONLINE_ACTIONS``).

    Raises:
        ConfigError: over the limit, naming --steps, --groups, the schedule's size and the limit.
    """
    from tessera_lab.checks import check_work

    units = steps * groups * (sched.num_stages * sched.num_microbatches + 4)
    check_work("online_actions", units, field=f"--steps {steps} x --groups {groups} x (stages x vpp x micro-batches "
                                              f"{sched.num_stages * sched.num_microbatches} + 4)")
    return units


def online_progress(sched: Any, steps: int, groups: int, runs: int):
    """``None`` for short work; else prints the estimate (stderr) and returns a ``progress(done, steps)`` callback
    for :func:`tessera_lab.dynamic.online.run_online` that prints each tenth done, the time spent and left."""
    import time

    est = online_units(sched, steps, groups) * runs * ONLINE_UNIT_S
    if est < LONG_WORK_S:
        return None
    total = steps * runs
    print(f"simulate --dynamic: {steps} steps x {groups} group(s) x {runs} run(s) on {sched.num_stages} stages x "
          f"{sched.num_microbatches} micro-batches; estimated {est:.0f} s on one idle core (rate measured on a 2-core "
          f"VM: {ONLINE_UNIT_S * 1e3:.2f} ms per stage-micro-batch-step; longer on a busy machine); progress every 10%",
          file=sys.stderr, flush=True)
    state = {"done": 0, "shown": 0, "t0": time.monotonic()}

    def progress(done: int, of: int) -> None:
        state["done"] += 1
        tenth = state["done"] * 10 // total
        if tenth > state["shown"]:
            state["shown"] = tenth
            spent = time.monotonic() - state["t0"]
            left = spent * (total - state["done"]) / state["done"]
            print(f"simulate --dynamic: {tenth * 10}% ({state['done']} of {total} steps), {spent:.0f} s spent, about "
                  f"{left:.0f} s left", file=sys.stderr, flush=True)

    return progress


def cmd_simulate(args: argparse.Namespace) -> int:
    from tessera_lab.errors import ScheduleError
    from tessera_lab.pipeline.schedules import canonical_name
    from tessera_lab.pipeline.actions import ActionType
    from tessera_lab.pipeline.simulate import simulate, uniform_durations

    _routed_options(args)
    if args.fb is not None and args.fb < max(args.f, args.b):
        from tessera_lab.errors import ConfigError

        raise ConfigError(f"option --fb = {args.fb:g} is out of range; allowed: >= max(--f, --b) = "
                          f"{max(args.f, args.b):g} (an overlapped F+B pair takes at least its longer part; above "
                          f"--f + --b = {args.f + args.b:g} when contention makes overlap slower)")
    if getattr(args, "routing", None) is not None or getattr(args, "dynamic", False):
        return _simulate_routed(args)
    budget = getattr(args, "memory_budget", None)
    if budget is not None and canonical_name(args.schedule) != "zb-auto":
        raise ScheduleError(f"--memory-budget is used only with --schedule zb-auto, not {args.schedule!r}")
    sched = built_schedule(args.schedule, args.stages, args.microbatches, args.vpp, f=args.f, b=args.b, w=args.w,
                           p2p_latency=args.p2p_latency, memory_budget=budget)
    types = {a.type for acts in sched.actions.values() for a in acts}
    if args.fb is not None and ActionType.OVERLAP_F_B not in types:
        from tessera_lab.errors import ConfigError

        raise ConfigError(f"option --fb is used only by schedules with overlapped F+B pairs (e.g. overlapped, "
                          f"interleaved-overlapped); schedule {sched.name!r} has none, so it would be ignored")
    notes = []
    if args.w is None and ActionType.I in types:
        notes.append(f"--w not given: a split backward takes I = --b = {args.b:g} and W = 0 (the split is unknown); "
                     f"{sched.name}'s order is built for W about half of B: give --w")
    gs = getattr(args, "grad_sync", 0.0) or 0.0
    comm = static_grad_sync(sched, gs)
    tl = simulate(sched, uniform_durations(args.f, args.b, args.w, args.fb), p2p_latency=args.p2p_latency, comm=comm)
    result = {
        "schedule": sched.name, "stages": args.stages, "microbatches": args.microbatches, "vpp": args.vpp,
        "makespan": tl.iteration_time, "bubble_fraction": tl.bubble_fraction,
        "bubble_overhead": tl.bubble_overhead, "per_rank_idle": tl.per_rank_idle,
        "per_rank_busy": tl.per_rank_busy, "peak_activations": tl.peak_activations,
    }
    if "choice" in sched.meta:  # zb-auto: the budget and the candidate the search kept
        result.update(memory_budget=sched.meta["memory_budget"], search_choice=sched.meta["choice"])
    if gs > 0:
        result["grad_sync"] = {"seconds_per_stage": gs, "placement_static": "after the rank's last action",
                               "exposed_tail_static_s": sync_tail(tl)}
    rows = [{"rank": r, f"busy ({UNIT})": tl.per_rank_busy[r], f"idle ({UNIT})": tl.per_rank_idle[r],
             "peak activations (micro-batches)": tl.peak_activations[r]} for r in range(len(tl.per_rank_busy))]
    text = (table(rows) + f"\nmakespan {tl.iteration_time:.6g} {UNIT}  bubble_fraction {tl.bubble_fraction:.4f} "
            f"(idle share of rank-time)  bubble_overhead {tl.bubble_overhead:.4f} (idle / busy)"
            + ("" if gs <= 0 else f"\n{_sync_line(gs, sync_tail(tl))}") + f"\n({UNIT_NOTE})"
            + "".join(f"\nnote: {n}" for n in notes))
    if notes:
        result["notes"] = notes
    emit(args, result, text)
    if args.trace:
        tl.to_chrome_trace(args.trace)
        print(f"trace: {args.trace}", file=sys.stderr)
    if args.plot:
        from tessera_lab.ui.plots import gantt

        ax = gantt(tl, title=f"{sched.name}: p={args.stages}, m={args.microbatches}", time_unit=UNIT)
        from tessera_lab.io import save_figure

        print(f"figure: {save_figure(ax.figure, args.plot)}", file=sys.stderr)
    return 0


def built_schedule(schedule: str, stages: int, microbatches: int, vpp: int, *, f: float, b: float, w: float | None,
                   p2p_latency: float = 0.0, memory_budget: float | None = None):
    """The schedule ``simulate`` runs for these options (with and without ``--routing``/``--dynamic``, so both
    simulate the same one): :func:`tessera_lab.pipeline.schedules.build_schedule` with the stage times
    (``zb-auto`` searches with them: I = b - w, W = w).

    Raises:
        ScheduleError: an unknown name or settings the schedule refuses.
    """
    from tessera_lab.pipeline.schedules import build_schedule

    w = w or 0.0
    return build_schedule(schedule, stages, microbatches, vpp, memory_budget=memory_budget, f=f, i=max(0.0, b - w),
                          w=w, p2p=p2p_latency)


#: the unit of every time ``simulate`` prints: the user's unit of --f/--b/--w (seconds if those are seconds)
UNIT = "time units"
UNIT_NOTE = "time units: the unit of --f, --b, --w and --grad-sync (seconds if those are seconds)"


def static_grad_sync(schedule, seconds: float) -> list | None:
    """``--grad-sync S`` for a static simulation: each stage's DP gradient reduce-scatter (``S``, the unit of
    --f/--b/--w) on the comm lane after its rank's last action, as the static plan of ``--dynamic`` places it
    (:func:`tessera_lab.dynamic.planner.grad_sync_tasks`); ``None`` when ``seconds`` is 0."""
    if not seconds or seconds <= 0:
        return None
    from tessera_lab.dynamic.planner import grad_sync_tasks

    return grad_sync_tasks(schedule, [float(seconds)] * schedule.num_stages, placement="static")


def _sync_line(seconds: float, static_tail: float, dynamic_tail: float | None = None) -> str:
    tail = f"{static_tail:.5g}" + ("" if dynamic_tail is None else f" -> {dynamic_tail:.5g}")
    return (f"DP gradient reduce-scatter {seconds:g} {UNIT} per stage on the comm lane: static after the rank's last "
            "action" + ("" if dynamic_tail is None else ", dynamic after the stage's last W part")
            + f"; exposed tail per rank (last step{'' if dynamic_tail is None else ', static -> dynamic'}) "
            f"{tail} {UNIT}, counted in the {'makespan' if dynamic_tail is None else 'iterations'} above")


#: options of ``--routing`` / ``--dynamic`` runs and their defaults (``None`` in the parser, so a given one is known)
_ROUTED_DEFAULTS = {"ep": 8, "experts": 64, "top_k": 8, "tokens": 4096, "layers_per_stage": 4, "expert_fraction": 0.5,
                    "seed": 0, "capacity_factor": None}
#: options read only with ``--dynamic`` and their defaults
_DYNAMIC_DEFAULTS = {"groups": 1, "memory_cap": "max", "predictor": "last-step", "margin": 0.5, "steps": 4}


def _routed_options(args: argparse.Namespace) -> None:
    """Refuse the routing options without ``--routing``/``--dynamic`` and the controller's options without
    ``--dynamic`` (they would be ignored), then fill in the defaults of those not given.

    Raises:
        ConfigError: naming the option and what it needs.
    """
    routed = getattr(args, "routing", None) is not None or getattr(args, "dynamic", False)
    for names, needs, ok in ((_ROUTED_DEFAULTS, "--routing SPEC or --dynamic", routed),
                             (_DYNAMIC_DEFAULTS, "--dynamic", getattr(args, "dynamic", False))):
        for k in names:
            if getattr(args, k, None) is not None and not ok:
                opt = "--" + k.replace("_", "-")
                raise ConfigError(f"option {opt} is used only with {needs} (it would be ignored); allowed: add "
                                  f"{needs.split(' or ')[0]}, or leave {opt} out")
    for k, v in {**_ROUTED_DEFAULTS, **_DYNAMIC_DEFAULTS}.items():
        if getattr(args, k, None) is None:
            setattr(args, k, predictor_spec("predictor")(v) if k == "predictor" else v)


def _simulate_routed(args: argparse.Namespace) -> int:
    """``simulate --routing ... [--dynamic]``: routing-dependent durations; static vs dynamic filling."""
    result, text, timelines = routed_simulation(RoutedRun.from_args(args))
    emit(args, result, text)
    tl = timelines.get("dynamic", timelines["static"])
    if args.trace:
        tl.to_chrome_trace(args.trace)
        print(f"trace: {args.trace}", file=sys.stderr)
    if args.plot:
        from tessera_lab.ui.plots import gantt_pair

        fig = gantt_pair(timelines.get("static"), timelines.get("dynamic"), time_unit=UNIT)
        from tessera_lab.io import save_figure

        print(f"figure: {save_figure(fig, args.plot)}", file=sys.stderr)
    return 0


@dataclass(frozen=True)
class RoutedRun:
    """The options of ``tessera-lab simulate --routing ... [--dynamic]`` (the CLI's names and defaults).

    ``f``, ``b``, ``w`` are per stage (chunk) at uniform routing (``w`` None: no W split); ``tokens`` per EP rank
    and micro-batch (the EP group routes ``ep * tokens``); ``memory_cap``: ``max``, ``max+K``, ``rank`` or a count
    (text is accepted). The rest as the CLI options of the same names (docs/cli.md).
    """

    schedule: str
    stages: int
    microbatches: int
    f: float
    b: float
    w: float | None
    routing: str | None = None
    dynamic: bool = False
    vpp: int = 1
    ep: int = 8
    experts: int = 64
    top_k: int = 8
    tokens: int = 4096
    layers_per_stage: int = 4
    expert_fraction: float = 0.5
    groups: int = 1
    seed: int = 0
    capacity_factor: float | None = None
    grad_sync: float = 0.0
    p2p_latency: float = 0.0
    memory_cap: int | str | None = "max"
    fb: float | None = None
    predictor: str = "last-step"
    margin: float = 0.5
    steps: int = 4

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "RoutedRun":
        """The run the parsed options ask for (after :func:`_routed_options` filled in the defaults)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def routed_simulation(run: RoutedRun) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """What ``tessera-lab simulate --routing ... [--dynamic]`` runs: returns ``(result, text, timelines)``.

    Without ``run.dynamic`` the static order is simulated under the routing; with it, ``run.steps`` consecutive
    steps run static and with the per-EP-group controller (:func:`tessera_lab.dynamic.online.run_online`), and the
    gain is split into its static part (the same run under uniform routing) and its dynamic part.

    Raises:
        ConfigError: ``dynamic`` without ``w`` (nothing deferrable), bad sizes, routing or memory cap.
        ScheduleError: a schedule the filler cannot use.
    """
    from tessera_lab.checks import check_work
    from tessera_lab.dynamic.durations import StageCosts

    from tessera_lab.pipeline.schedules import canonical_name

    spec, log_cache, memory_cap = _routed_inputs(run)
    canonical_name(run.schedule)  # an unknown name is refused before any schedule is built
    # the same schedule as without --routing/--dynamic (zb-auto searches with the --f/--b/--w times)
    sched = built_schedule(run.schedule, run.stages, run.microbatches, run.vpp, f=run.f, b=run.b, w=run.w,
                           p2p_latency=run.p2p_latency)
    if run.dynamic:
        online_units(sched, run.steps, run.groups)  # the work limit, before any step is simulated
    check_work("routing_cells", sched.num_stages * run.layers_per_stage * run.microbatches * run.experts * run.groups,
               field="routed counts layers x micro-batches x experts x groups")
    costs = StageCosts.synthetic(sched.num_stages, run.f, run.b, run.w or 0.0, expert_fraction=run.expert_fraction,
                                 layers_per_stage=run.layers_per_stage, ep=run.ep, num_experts=run.experts,
                                 top_k=run.top_k, tokens=run.tokens * run.ep, grad_sync=run.grad_sync, fb=run.fb)
    if not run.dynamic:
        return _static_routed(run, spec, sched, costs, log_cache)
    return _dynamic_routed(run, spec, sched, costs, memory_cap)


def _routed_inputs(run: RoutedRun) -> tuple[Any, dict, int | str | None]:
    """The routing spec, the routing-log cache and the memory cap of ``run``, every size checked before any work.

    Raises:
        ConfigError: naming the option and the allowed range.
    """
    from tessera_lab.dynamic.routing import parse_routing

    spec = parse_routing(run.routing or "uniform")
    log_cache: dict = {}
    ep, experts = run.ep, run.experts
    if spec.kind != "replay":  # the routed sizes, named as options, before any work
        from tessera_lab.checks import divisors_text

        if experts % ep:
            raise ConfigError(f"option --ep = {ep} must divide --experts = {experts} (each EP rank holds the same "
                              f"number of experts); allowed: {divisors_text(experts)}")
        if run.top_k > experts:
            raise ConfigError(f"option --top-k = {run.top_k} is out of range; allowed: an integer 1 to --experts = "
                              f"{experts} (routed experts per token)")
    if spec.kind == "replay":  # the log is read and checked (schema, work limits) before any schedule is built
        from tessera_lab.dynamic.routing_log import load_routing_log

        log = log_cache[spec.path] = load_routing_log(spec.path)
        if log.num_experts % ep:
            raise ConfigError(f"routing log '{spec.path}': {log.num_experts} experts do not split over --ep {ep}; "
                              f"allowed: --ep a divisor of {log.num_experts}")
    memory_cap = run.memory_cap
    if isinstance(memory_cap, str) and memory_cap not in ("max", "rank") and not memory_cap.startswith("max+"):
        try:
            memory_cap = int(memory_cap)
        except ValueError:
            raise ConfigError(f"field 'memory_cap' = {memory_cap!r} is unknown; allowed: max, max+K, rank or an integer >= 1"
                              ) from None
    if run.dynamic and not run.w:
        raise ConfigError("field 'w' is required with --dynamic and must be > 0: the weight-gradient part of b is "
                          "the deferrable work that fills bubbles")
    return spec, log_cache, memory_cap


def _static_routed(run: RoutedRun, spec: Any, sched: Any, costs: Any,
                   log_cache: dict) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """``simulate --routing`` without ``--dynamic``: the static order simulated under one routed step."""
    from tessera_lab.dynamic.durations import RoutedDurations, slowest_loads
    from tessera_lab.dynamic.evaluate import routing_counts
    from tessera_lab.dynamic.routing import DEFAULT_JITTER
    from tessera_lab.pipeline.simulate import simulate

    ep, grad_sync = run.ep, run.grad_sync
    cnt = routing_counts(spec, costs, run.microbatches, seed=run.seed, group=0, step=1, jitter=DEFAULT_JITTER,
                         log_cache=log_cache)
    kw = ({} if run.capacity_factor is None
          else dict(tokens=run.tokens * ep, top_k=run.top_k, capacity_factor=run.capacity_factor))
    x = slowest_loads(cnt, ep, **kw)
    tl = simulate(sched, RoutedDurations(costs, x), p2p_latency=run.p2p_latency,
                  comm=static_grad_sync(sched, grad_sync))
    result = {"schedule": sched.name, "stages": run.stages, "microbatches": run.microbatches, "vpp": run.vpp,
              "routing": str(spec), "busiest_rank_load_mean": float(x.mean()),
              "busiest_rank_load_max": float(x.max()), "makespan": tl.iteration_time,
              "bubble_fraction": tl.bubble_fraction, "bubble_overhead": tl.bubble_overhead,
              "per_rank_idle": tl.per_rank_idle, "per_rank_busy": tl.per_rank_busy,
              "peak_activations": tl.peak_activations}
    if grad_sync > 0:
        result["grad_sync"] = {"seconds_per_stage": grad_sync, "placement_static": "after the rank's last action",
                               "exposed_tail_static_s": sync_tail(tl)}
    rows = [{"rank": r, f"busy ({UNIT})": tl.per_rank_busy[r], f"idle ({UNIT})": tl.per_rank_idle[r],
             "peak activations (micro-batches)": tl.peak_activations[r]} for r in range(len(tl.per_rank_busy))]
    text = (table(rows) +
            f"\nrouting {spec}: busiest EP rank carries {x.mean():.3f}x its share on average (max {x.max():.3f}x; "
            f"ep={ep}, {run.experts} experts, top-{run.top_k})\nmakespan {tl.iteration_time:.6g} {UNIT}  "
            f"bubble_fraction {tl.bubble_fraction:.4f} (idle share of rank-time)  "
            f"bubble_overhead {tl.bubble_overhead:.4f} (idle / busy)"
            + ("" if grad_sync <= 0 else f"\n{_sync_line(grad_sync, sync_tail(tl))}") + f"\n({UNIT_NOTE})")
    return result, text, {"static": tl}


def _dynamic_routed(run: RoutedRun, spec: Any, sched: Any, costs: Any,
                    memory_cap: int | str | None) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """``simulate --dynamic``: ``run.steps`` steps static and with the controller, under the routing and (for the
    gain's static part) under uniform routing."""
    from tessera_lab.dynamic.online import run_online

    kw = dict(schedule=sched, microbatches=run.microbatches, vpp=run.vpp, groups=run.groups, seed=run.seed,
              steps=run.steps, predictor=run.predictor, margin=run.margin, capacity_factor=run.capacity_factor,
              p2p_latency=run.p2p_latency, memory_cap=memory_cap)
    runs = 1 if spec.kind == "uniform" else 2  # a skewed routing is also run under uniform routing (the control)
    kw["progress"] = online_progress(sched, run.steps, run.groups, runs)
    res = run_online(costs, spec, **kw)
    uni = res if spec.kind == "uniform" else run_online(costs, "uniform", **kw)
    s = res.summary()
    static_part = uni.throughput_gain
    result = {"schedule": res.schedule, "stages": run.stages, "microbatches": run.microbatches, "vpp": run.vpp,
              "routing": str(spec), "dynamic": True, "costs": "analytic (synthetic --f/--b/--w per stage)",
              **{k: v for k, v in s.items() if k not in ("schedule", "routing")},
              "gain_static_part": static_part, "gain_dynamic_part": res.throughput_gain - static_part,
              "idle_removed_uniform_s": uni.idle_static_s - uni.idle_dynamic_s,
              # capacity-report terms from this run: what the routing costs the static plan, and the idle time per
              # rank left after dynamic correction
              "routing_variance_s": res.iteration_static_s - uni.iteration_static_s,
              "bubble_after_dynamic_s": res.idle_dynamic_s}
    if run.grad_sync > 0:
        result["grad_sync"] = {
            "seconds_per_stage": run.grad_sync,
            "placement_static": "after the rank's last action", "placement_dynamic": "after the stage's last W part",
            "exposed_tail_static_s": sync_tail(res.timelines["static"]),
            "exposed_tail_dynamic_s": sync_tail(res.timelines["dynamic"]), "timeline": "last simulated step"}
    text = _dynamic_text(run, spec, res, s, static_part, result)
    return result, text, {"static": res.timelines["static"], "dynamic": res.timelines["dynamic"]}


def _dynamic_text(run: RoutedRun, spec: Any, res: Any, s: dict[str, Any], static_part: float,
                  result: dict[str, Any]) -> str:
    """The text of ``simulate --dynamic``: the as-built / static / dynamic table and what the controller did."""
    from tessera_lab.pipeline.schedules import canonical_name

    name = canonical_name(run.schedule)
    built = res.iteration_as_built_s

    def row(plan: str, it: float, idle: float) -> dict[str, Any]:
        return {"plan": plan, f"iteration ({UNIT})": it, f"idle per rank ({UNIT})": idle,
                "bubble (% of iteration)": 100 * idle / it if it else 0.0}

    rows = ([] if built is None else [row(f"{name} as built (whole B)", built, res.idle_as_built_s)]) + [
        row("static (as built: no whole B to split)" if built is None else "static (B split: I, W at once)", res.iteration_static_s,
            res.idle_static_s),
        row("dynamic (W moved into predicted waits)", res.iteration_dynamic_s, res.idle_dynamic_s)]
    split_line = ("" if built is None else
                  f"\nstatic plan: the {name} schedule with {res.STATIC_PLAN}; as built (whole B, the schedule "
                  f"`simulate` runs without --dynamic) it takes {built:.5g} {UNIT}, so the split alone saves "
                  f"{built - res.iteration_static_s:.5g} {UNIT}; gains below are against the split static plan")
    slower = ", ".join(str(x) for x in s["slower_steps"]) or "none"
    return (table(rows, ".5g") + split_line +
            f"\nrouting {spec}; {name}, {run.stages} ranks, {run.microbatches} micro-batches; simulated, means over steps "
            f"{s['warmup_steps']}..{s['steps'] - 1} (step 0 has no history); ep={run.ep}, {run.experts} experts, "
            f"top-{run.top_k}, {run.groups} EP group(s)"
            f"\ncontroller: predictor {s['predictor']} (waits of earlier steps, lag 1 step), margin {run.margin:g}, "
            f"W in {s['w_chunks']} parts, memory cap {s['memory_cap']} micro-batches per rank; W durations "
            f"({UNIT}) from the counts already routed"
            f"\ndynamic: idle time removed {s['idle_removed_s']:.5g} {UNIT} per rank, iteration "
            f"{s['iteration_static_s']:.5g} {UNIT} -> {s['iteration_dynamic_s']:.5g} {UNIT}, throughput "
            f"{100 * s['throughput_gain']:+.2f}% = static part "
            f"{100 * static_part:+.2f}% (same controller, uniform routing) + dynamic part "
            f"{100 * (res.throughput_gain - static_part):+.2f}% (the extra under this routing)"
            f"\npredicted waits: mean |error| {s['gap_mae_s']:.4g} {UNIT} ({100 * s['gap_rel_error']:.0f}% of realised wait); "
            f"steps slower than static on the realised routing: {slower}"
            + ("" if run.grad_sync <= 0 else "\n" + _sync_line(run.grad_sync, result["grad_sync"]["exposed_tail_static_s"],
                                                              result["grad_sync"]["exposed_tail_dynamic_s"]))
            + f"\n({UNIT_NOTE})")


def sync_tail(timeline) -> float:
    """Mean over ranks of the gradient reduce-scatter time after the rank's last compute (seconds; 0 for a rank
    whose reduce-scatter ends before its compute does)."""
    from tessera_lab.pipeline.passes import GRAD_RS

    R = timeline.num_ranks or 1
    tails = []
    for r in range(R):
        comp = max((e.end for e in timeline.events if e.rank == r and e.lane == "compute"), default=0.0)
        rs = max((e.end for e in timeline.events if e.rank == r and e.type == GRAD_RS), default=comp)
        tails.append(max(0.0, rs - comp))
    return sum(tails) / R


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="simulate a uniform pipeline")
    p.add_argument("--schedule", default="1f1b", help="gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped|zb-v|zb-auto (default 1f1b)")
    p.add_argument("--stages", type=positive_int("stages"), required=True, help="pipeline ranks (pp)")
    p.add_argument("--microbatches", type=positive_int("microbatches"), required=True)
    p.add_argument("--vpp", type=positive_int("vpp"), default=1, help="chunks per rank (interleaved)")
    p.add_argument("--f", type=nonneg_float("f"), required=True, help="forward time of one stage (one chunk for interleaved and DualPipeV, so a rank with v chunks does "
                        "v times the work), any time unit: every time printed is in it (seconds if this is seconds)")
    p.add_argument("--b", type=nonneg_float("b"), required=True, help="full backward time (input + weight gradient) of one stage or chunk, same unit as --f")
    p.add_argument("--w", type=nonneg_float("w"), default=None, help="weight-gradient part of --b (zero-bubble schedules split B into I = b - w and W = w)")
    p.add_argument("--fb", type=positive_float("fb"), default=None, help="time of an overlapped F+B pair (default f + b: no overlap gain)")
    p.add_argument("--p2p-latency", type=nonneg_float("p2p_latency"), default=0.0,
                   help="latency of each stage-to-stage send, same unit as --f (default 0)")
    p.add_argument("--grad-sync", type=nonneg_float("grad_sync"), default=0.0, metavar="S",
                   help="DP gradient reduce-scatter time per stage, same unit as --f (default 0: none); on the comm "
                        "lane after the rank's last action, with or without --routing; with --dynamic the "
                        "controller's plan starts it after the stage's last W part")
    p.add_argument("--memory-budget", type=nonneg_float("memory_budget"), default=None, metavar="K",
                   help="zb-auto only: activations a rank may hold, in micro-batches (default 2p-1; p with --vpp 2)")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON (opens in Perfetto)")
    p.add_argument("--plot", metavar="PATH", help="save a Gantt chart")
    g = p.add_argument_group("routing skew and dynamic bubble filling (tessera_lab.dynamic)")
    g.add_argument("--routing", default=None, metavar="SPEC",
                   help="uniform|zipf:S|drift:S[:R]|replay:PATH: tokens per expert vary per micro-batch and the "
                        "busiest EP rank sets each stage's time")
    g.add_argument("--dynamic", action="store_true",
                   help="compare the static order with the per-EP-group controller that defers W into predicted "
                        "waits (needs --w)")
    g.add_argument("--ep", type=positive_int("ep"), default=None, help="EP ranks per stage (default 8)")
    g.add_argument("--experts", type=positive_int("experts"), default=None, help="routed experts (default 64)")
    g.add_argument("--top-k", type=positive_int("top_k"), default=None, help="experts per token (default 8)")
    g.add_argument("--tokens", type=positive_int("tokens"), default=None,
                   help="tokens per EP rank and micro-batch (default 4096)")
    g.add_argument("--layers-per-stage", type=positive_int("layers_per_stage"), default=None,
                   help="MoE layers per stage, each routed independently (default 4)")
    g.add_argument("--expert-fraction", type=nonneg_float("expert_fraction"), default=None,
                   help="share of f, b, w that scales with the busiest EP rank's load (default 0.5)")
    g.add_argument("--groups", type=positive_int("groups"), default=None,
                   help="with --dynamic: EP groups, each deciding alone (default 1)")
    g.add_argument("--seed", type=int_in("seed", 0, 2**63 - 1), default=None, help="routing seed, an integer >= 0 (default 0)")
    g.add_argument("--capacity-factor", type=nonneg_float("capacity_factor"), default=None,
                   help="drop assignments above ceil(cf * tokens * k / E) per expert")
    g.add_argument("--memory-cap", default=None,
                   help="with --dynamic: live micro-batches per rank: max (default: the static plan's worst rank), max+K, rank, or N")
    g.add_argument("--predictor", default=None, type=predictor_spec("predictor"),
                   help="with --dynamic: how waits of earlier steps predict this step's: last-step (default), moving-average:K, minimum:K")
    g.add_argument("--margin", type=fraction_below_one("margin"), default=None,
                   help="with --dynamic: share of a predicted wait left unfilled, 0 <= margin < 1 (default 0.5)")
    g.add_argument("--steps", type=int_at_least("steps", 2), default=None,
                   help="consecutive training steps simulated with --dynamic, at least 2 (default 4; step 0 has no "
                        "history and is left out of the means); steps x groups x (stages x vpp x micro-batches + 4) "
                        "at most 400000 (TESSERA_LAB_MAX_ONLINE_ACTIONS; about 100 s per run on one idle core)")
    add_json(p)
    p.set_defaults(func=cmd_simulate)

