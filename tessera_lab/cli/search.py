"""``tessera-lab search``: which layout to train on (the parallel-configuration search of
:mod:`tessera_lab.plan.search`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tessera_lab.argtypes import positive_int
from tessera_lab.cli.common import add_json, add_memory_reserve_option, check_memory_reserve, emit, table

HELP = ("search the parallel layouts (TP, CP, EP, PP/VPP, DP, micro-batching, schedule, recompute) for the fastest "
        "that fits")
#: layout fields compared between a candidate and the first one
_FIELDS = ("tp", "cp", "pp", "vpp", "ep", "ep_spans_tp", "dp", "fsdp", "microbatches", "micro_batch_size",
           "schedule", "recompute", "recompute_modules", "dispatcher")
#: fields a dense model has no use for (EP 1, the alltoall dispatcher: no MoE layer to dispatch)
_MOE_FIELDS = ("ep", "ep_spans_tp", "dispatcher")



def _sync_text() -> str:
    """The fitted host/sync values the search's plans carry (tessera_lab.cost.sync), as one clause."""
    from tessera_lab.cost.sync import FITTED_PROVENANCE, per_wait_text

    return f"{per_wait_text()} per host wait ({FITTED_PROVENANCE}; docs/cost-model.md)"


def _row(rank: int, c, moe: bool = True) -> dict[str, Any]:
    from tessera_lab.plan.search_export import schedule_label

    r = c.result
    cols = c.layout.columns(moe)
    cols["schedule"] = schedule_label(c.layout.schedule)
    return {"#": rank, **cols, "iteration (s)": r["iteration_time_s"],
            "tokens/s": f"{r['tokens_per_s']:,.0f}", "MFU": f"{r['mfu']:.1%}", "bubble": r["bubble_fraction"],
            "peak (GiB)": r["peak_memory_gib"], "headroom (GiB)": r["headroom_gib"]}


#: a term whose share of the moved seconds is at least this is named alone; below it the top two are named
_ONE_TERM_SHARE = 2 / 3


def _shown(lay, k: str, moe: bool = True) -> tuple[str, object]:
    """A layout field as the separation line names it: the recompute with the modules it recomputes (a bare
    selective's are the default set; without MoE layers (``moe`` false) the MoE modules are left out, as they
    recompute nothing), the optimizer as the table's column, EP spanning TP as yes / no."""
    if k == "recompute":
        from tessera_lab.model.hardware import selective_modules

        mods = selective_modules(lay.recompute, getattr(lay, "recompute_modules", ()), moe)
        return "recompute", (f"selective({','.join(mods)})" if mods else lay.recompute)
    if k == "fsdp":
        return "optimizer", "fsdp" if lay.fsdp else "dist-opt"
    if k == "ep_spans_tp":
        return "EP spans TP", "yes" if lay.ep_spans_tp else "no"
    return k, getattr(lay, k)


def separation(first, other, moe: bool = True) -> str:
    """What separates ``other`` from ``first``: the layout fields that differ, the iteration change and the terms it
    splits into (seconds, simulated): the slowest (virtual) stage per micro-batch x vpp x m, the idle time (the
    bubble column, idle share x iteration: the mean rank's idle seconds, pipeline fill and drain and waits such as an
    exposed gradient sync, so a one-stage layout has some) and the rest of the mean rank's busy time (gradient sync and
    communication not hidden, ranks lighter than the slowest stage): iteration = slowest x vpp x m + bubble + rest.
    Each term's share is its absolute change over the sum of the three absolute changes; one term of at least two
    thirds is named with its share, else the difference is spread and the top two are named with theirs."""
    a, b = first.layout, other.layout
    diff = [f"{name} {va}->{vb}" for k in _FIELDS if k != "recompute_modules" and (moe or k not in _MOE_FIELDS)
            for name, va, vb in [(*_shown(a, k, moe), _shown(b, k, moe)[1])] if va != vb]
    ra, rb = first.result, other.result
    ta, tb = ra["iteration_time_s"], rb["iteration_time_s"]
    d_it = tb / ta - 1
    d_stage = (rb["slowest_stage_ms"] * b.microbatches * b.vpp - ra["slowest_stage_ms"] * a.microbatches * a.vpp) / 1e3
    d_bub = rb["bubble_fraction"] * tb - ra["bubble_fraction"] * ta
    terms = [("slowest stage x m" if a.vpp == b.vpp == 1 else "slowest stage x vpp x m", d_stage),
             ("idle (pipeline bubble and waits)", d_bub),
             ("rest (sync, exposed comm, lighter ranks)", (tb - ta) - d_stage - d_bub)]
    total = sum(abs(x) for _, x in terms)
    head = f"{', '.join(diff) or 'same layout'}: {d_it:+.1%} iteration"
    if total == 0:
        return head + "; no term moved"
    terms.sort(key=lambda t: -abs(t[1]))
    shown = [f"{name} {_ms(x)} ({abs(x) / total:.0%}" for name, x in terms]
    if abs(terms[0][1]) / total >= _ONE_TERM_SHARE:
        return f"{head}; the term that moved most: {shown[0]} of the moved seconds)"
    return f"{head}; spread across terms (shares of the moved seconds): {shown[0]}), {shown[1]})"


def _ms(x: float) -> str:
    """Signed seconds as milliseconds: one decimal, or two significant digits below 0.1 ms."""
    v = x * 1e3
    return f"{v:+,.1f} ms" if abs(v) >= 0.1 else f"{v:+.2g} ms"


def format_search(res, top: int, model=None) -> str:
    """Readable text of a :class:`~tessera_lab.plan.search.SearchResult`: counts, the top table, the first layout's
    MFU against the published band of ``model``'s family (a ModelSpec; ``None``: no band line), the separations."""
    pr = res.pruned
    precision = getattr(res.planned[0].layout, "precision", "bf16") if res.planned else "bf16"  # the search's is bf16
    lines = [f"search {res.model} on {res.gpus} x {res.gpu} in {precision}: sequence {res.seq_len:,}, global batch "
             f"{res.global_batch} "
             f"sequences ({res.global_batch * res.seq_len:,} tokens); memory limit "
             f"{res.memory_capacity_bytes / 2**30:.1f} GiB per GPU",
             f"layouts: {res.enumerated:,} enumerated; pruned {pr['memory (parameter state)']:,} by parameter-state "
             f"memory, {pr['memory']:,} by the memory bound, {pr['bound']:,} by the time bound (could not beat the "
             f"slowest of the best {res.top} planned); {len(res.planned)} planned ({_cpu_text(res)}; "
             f"{res.settled:,} layouts settled, planned or ruled out, {res.settled_per_cpu_s:.0f} per CPU s, measured)"
             + (f"; {pr['budget']:,} left unplanned at the --max-plans budget (their time bounds from "
                f"{res.unplanned_bound_s:.3f} s)" if pr.get("budget") else ""), ""]
    ranked = res.ranked[:top]
    if not ranked:  # the command line prints the no-fit answer on stderr (cmd_search)
        lines.append("no planned layout fits memory (stderr says what would fit)")
        return "\n".join(lines)
    from tessera_lab.plan.search_export import MEGATRON_SCHEDULES, selective_note

    reserve = res.memory_reserve_gib
    whose = "--memory-reserve-gib" if res.memory_reserve_given else "an assumption of data/hardware"
    moe = getattr(res, "moe", True)
    lines.append(table([_row(i + 1, c, moe) for i, c in enumerate(ranked)], ".3f"))
    lines.append("iteration, tokens/s, MFU, bubble (the ranks' idle share of the iteration: pipeline fill and "
                 "drain, and waits such as an exposed gradient sync): simulated by the planner of `tessera-lab plan` "
                 "(objective auto, "
                 "method dp; ilp with virtual stages; without plan's baseline partitions, so `plan` of a layout may "
                 "keep a baseline's split that simulates a little faster); peak memory: computed; headroom: "
                 f"capacity less peak (capacity: HBM less a {reserve:g} GiB reserve for the CUDA context, "
                 f"NCCL buffers and fragmentation, {whose}; a layout near 0 GiB has no margin "
                 "beyond it for the memory model's error: --memory-reserve-gib asks for more); "
                 + ("ep N*: the EP group spans the TP ranks; dp: data-parallel replicas of one EP group (GPUs = "
                    "pp x dp x ep x tp x cp, tp once when EP spans it); " if moe else "")
                 + "DP (Megatron): GPUs / (tp x cp x pp), Megatron's --data-parallel size"
                 + ("; (†): a zero-bubble schedule Megatron-Core does not run (this project's simulator and runner do)"
                    + ("; the best layout with a Megatron-Core schedule is named below"
                       if ranked[0].layout.schedule not in MEGATRON_SCHEDULES else "")
                    if any(c.layout.schedule not in MEGATRON_SCHEDULES for c in ranked) else "")
                 + (f"; {sel}" if (sel := selective_note([c.layout for c in ranked], moe)) else "")
                 + (f"; every MoE layer's host/sync term at its fitted value, {_sync_text()}" if moe else ""))
    statuses = [c.result.get("solver_status") or "Optimal" for c in ranked]
    heuristic = sum("heuristic" in st for st in statuses)
    proven = sum(st == "Optimal" for st in statuses)
    lines.append(f"partitions of the {len(ranked)} shown: {proven} proven optimal for the solver's objective (exact DP, "
                 f"or the ILP solved), {heuristic} the ILP's heuristic plan at its work budget, "
                 f"{len(ranked) - proven - heuristic} an ILP incumbent not proven optimal; each then refined by "
                 "simulation (--json: solver_status)")
    first_s = ranked[0].result["iteration_time_s"]
    if pr.get("budget") and res.unplanned_bound_s is not None and res.unplanned_bound_s < first_s:
        lines.append(f"not proven: {pr['budget']:,} layouts left unplanned have time bounds from "
                     f"{res.unplanned_bound_s:.3f} s, below #1's {first_s:.3f} s (a bound, not a plan); a larger "
                     "--max-plans may find faster ones")
    if model is not None:
        from tessera_lab.report.headline import mfu_note, mfu_text

        where = {"gpu": res.gpu, "precision": ranked[0].layout.parallel(res.seq_len).precision}
        lines.append(f"MFU of #1 (simulated): {mfu_text(ranked[0].result['mfu'], moe=moe, model=model, **where)}")
        if flag := mfu_note(ranked[0].result["mfu"], moe=moe, model=model, **where):  # as `plan` flags it
            lines.append(f"warning: {flag}")
    if ranked[0].layout.schedule not in MEGATRON_SCHEDULES:
        runs = [(i, c) for i, c in enumerate(res.ranked, start=1) if c.layout.schedule in MEGATRON_SCHEDULES]
        if runs:
            i, c = runs[0]
            t = c.result["iteration_time_s"]
            lines.append(f"best layout with a Megatron-Core schedule: #{i}, {c.layout.text(moe)}: iteration "
                         f"{t:.3f} s (simulated), {t / first_s - 1:+.1%} against #1")
        else:
            lines.append("no planned layout that fits has a Megatron-Core schedule (1f1b, interleaved or an "
                         "EP-overlap one)")
    for i, c in enumerate(ranked[1:], start=2):
        lines.append(f"#{i} against #1: {separation(ranked[0], c, moe)}")
    if res.errors:
        lines.append(f"planner refusals: {sum(res.errors.values())} (" + ", ".join(
            f"{n} {kind}" for kind, n in res.error_kinds.items()) + "; --json lists each message)")
    return "\n".join(lines)


def _cpu_text(res) -> str:
    """CPU seconds of the search, with its planner processes' when ``--jobs`` > 1."""
    kids = getattr(res, "children_cpu_s", 0.0)
    if kids <= 0:
        return f"{res.cpu_s:.1f} CPU s"
    return f"{res.cpu_s + kids:.1f} CPU s: {res.cpu_s:.1f} here, {kids:.1f} in the planner processes"


def no_fit_hint(res) -> str:
    """The smallest change that would fit, from the planned candidates' memory: the lightest peak against the
    capacity, and the options that lower it (more GPUs, recompute, a shorter sequence)."""
    from tessera_lab.plan.problem import SEARCH_POINTER

    rows = [c.result for c in res.planned if c.result and "peak_memory_gib" in c.result]
    cap = res.memory_capacity_bytes / 2**30
    fewest = getattr(res, "fewest_fitting_gpus", None)
    more = (f"--gpus {fewest}: the next count at which some layout passes both memory bounds, computed"
            if fewest else f"--gpus {res.gpus * 2}")
    left = (getattr(res, "pruned", None) or {}).get("budget", 0)
    unplanned = (f"; {left:,} layouts were left unplanned at the --max-plans budget (a larger --max-plans plans "
                 "them; they may fit)" if left else "")
    if not rows:
        errors = getattr(res, "errors", None) or {}
        why = ""
        if errors:  # counted by what each refusal proves, with the most frequent message as an example
            reason = max(errors.items(), key=lambda kv: kv[1])[0].replace(f" {SEARCH_POINTER}", "")
            kinds = getattr(res, "error_kinds", None) or {}
            why = f" ({', '.join(f'{n} {kind}' for kind, n in kinds.items())}; for example: {reason})" if kinds \
                else f" (for example: {reason})"
        pr = getattr(res, "pruned", None) or {}
        if not res.planned:
            mem = pr.get("memory (parameter state)", 0) + pr.get("memory", 0)
            return (f"no layout was planned: {mem:,} of {res.enumerated:,} were ruled out by the memory bounds (they "
                    f"cannot fit {cap:.1f} GiB per GPU){unplanned}; allowed: more GPUs ({more}), a "
                    f"shorter --seq-len (below {res.seq_len}) or a smaller global batch")
        return (f"every planned candidate ({len(res.planned)}) was refused by the planner{why}{unplanned}; allowed: "
                f"more GPUs ({more}), a shorter --seq-len (below {res.seq_len}) or a smaller global "
                "batch")
    from tessera_lab.plan.search_space import CP_MIN_TOKENS

    light = min(r["peak_memory_gib"] for r in rows)
    cp = getattr(res, "max_cp", 1)
    tried = (f"; context parallelism up to --cp {cp} was among the layouts searched (at least {CP_MIN_TOKENS:,} "
             "tokens per CP rank; a CP group may span NVLink domains)" if cp > 1 else "")
    return (f"the lightest planned layout peaks at {light:.1f} GiB against {cap:.1f} GiB; allowed: about "
            f"{light / cap:.2f}x the GPUs ({more}), or a shorter --seq-len (below {res.seq_len})"
            f"{tried}{unplanned}")


def _progress():
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        print(f"\rsearch: {done}/{total} candidates looked at", end=end, file=sys.stderr, flush=True)

    return show


def _write_csv(res, path: str) -> None:
    import pandas as pd

    from tessera_lab.io import atomic_write_text

    rows = res.as_dict()["candidates"]
    # lists (recompute_modules) as comma-separated names, not a Python repr
    frame = pd.DataFrame([{k: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v
                           for k, v in r.items() if k != "boundaries"} for r in rows])
    text = frame.to_csv(index=False)
    if path == "-":
        sys.stdout.write(text)
    else:
        atomic_write_text(path, text)
        print(f"csv: {path}", file=sys.stderr)


def cmd_search(args: argparse.Namespace) -> int:
    from tessera_lab.cli.common import model_from_args
    from tessera_lab.plan.search import search

    model = model_from_args(args)
    check_memory_reserve(args)
    res = search(model, args.gpus, gpu=args.gpu, seq_len=args.seq_len, global_batch_tokens=args.global_batch_tokens,
                 top=args.top, jobs=args.jobs, max_plans=args.max_plans, progress=_progress(),
                 memory_reserve_gib=args.memory_reserve_gib)
    if args.csv:
        _write_csv(res, args.csv)
    if args.csv != "-":
        emit(args, res.as_dict(), format_search(res, args.top, model))
    if args.export:
        _export(res, args.export)
    if not res.ranked:
        print(f"tessera-lab search: error: no planned layout fits memory: {no_fit_hint(res)}", file=sys.stderr)
        return 2
    return 0


def _export(res, path: str) -> None:
    """Write the first layout as Megatron-Core arguments (:func:`tessera_lab.plan.search.megatron_arguments`)."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.io import write_json
    from tessera_lab.plan.search_export import megatron_arguments

    if not res.ranked:
        raise ConfigError("option --export: no layout fits, nothing to export; allowed: a search with a fitting layout")
    out = megatron_arguments(res.ranked[0], res.seq_len, getattr(res, "moe", True))
    write_json(path, out)
    print(f"export: {path} (Megatron-Core arguments of layout #1)", file=sys.stderr)
    for note in out["notes"]:
        print(f"export note: {note}", file=sys.stderr)


def add_parser(sub) -> None:
    from tessera_lab.cli.common import add_model_knobs
    from tessera_lab.defaults import DEFAULT_GPU, DEFAULT_MODEL
    from tessera_lab.plan.search import DEFAULT_GLOBAL_SEQUENCES, DEFAULT_MAX_PLANS

    p = sub.add_parser("search", help=HELP)
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"shipped model or config.json (default {DEFAULT_MODEL})")
    p.add_argument("--gpus", type=positive_int("gpus"), required=True,
                   help="GPUs to lay out: 1, 2 or 4 (part of one node, as on a workstation) or multiples of 8 (whole "
                        "nodes; on GB200 also part of an NVL72 rack)")
    p.add_argument("--gpu", default=DEFAULT_GPU,
                   help=f"H100, H200, B200, B300 (DGX/HGX nodes of 8) or GB200 (NVL72 racks of 72) (default {DEFAULT_GPU})")
    p.add_argument("--seq-len", type=positive_int("seq_len"), default=4096)
    p.add_argument("--global-batch-tokens", type=positive_int("global_batch_tokens"), default=None, metavar="T",
                   help=f"tokens per iteration (default {DEFAULT_GLOBAL_SEQUENCES} sequences of --seq-len)")
    add_memory_reserve_option(p)
    p.add_argument("--top", type=positive_int("top"), default=10, help="layouts printed and kept exact (default 10)")
    p.add_argument("--jobs", type=positive_int("jobs"), default=1, help="planner processes (same result for any)")
    p.add_argument("--max-plans", type=positive_int("max_plans"), default=DEFAULT_MAX_PLANS,
                   help=f"full planner runs (default {DEFAULT_MAX_PLANS}, about 0.1-0.3 CPU s each, more for deeper "
                        "models; planned in batches of up "
                        "to 8, planning stops at the first batch that reaches it, so up to 7 more)")
    p.add_argument("--csv", metavar="PATH", help="write every planned candidate as CSV ('-' for stdout)")
    p.add_argument("--export", metavar="PATH", help="write layout #1 as Megatron-Core arguments (JSON)")
    add_model_knobs(p)
    add_json(p)
    p.set_defaults(func=cmd_search)
