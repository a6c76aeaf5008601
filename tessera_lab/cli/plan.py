"""``tessera-lab plan``: the main job (partition, simulate and report a pipeline plan)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tessera_lab.errors import InfeasiblePlanError, PartitionError
from tessera_lab.cli.common import (GIB, add_ilp_limit_options, add_json, add_plan_options, cluster_from_args, emit,
                                    ilp_limit_from_args,
                                    model_from_args, parallel_from_args, split_from_args, table)
from tessera_lab.model.hardware import layout_text
from tessera_lab.model.spec import kind_letter, layer_summary
from tessera_lab.plan.proof import kept_baseline, solve_line
from tessera_lab.report.headline import mfu_line, mfu_note


def _evaluation_rows(ev, pp: int | None = None, model=None) -> list[dict[str, Any]]:
    """Per-stage rows; with ``pp`` (virtual stages) each row names the rank it runs on; with ``model`` each row names
    the stage's mixer kinds (``KDA x3 + MLA``; MTP layers as ``MTP``)."""
    return [{
        "stage": st.index, **({"rank": st.index % pp} if pp else {}), "layers": layer_summary(st.layers, st.kinds),
        **({"mixers": model.mixer_kinds(list(st.layers))} if model is not None else {}), "n": len(st.layers),
        "time/mb (ms)": st.time_s * 1e3, "standalone F+B+W (ms)": st.standalone_s * 1e3,
        "memory (GiB)": st.memory_bytes / GIB,
    } for st in ev.stages]


def _bottleneck_line(ev) -> str:
    """``bottleneck: stage S (layers ..., T ms per micro-batch): CAUSE`` for the slowest stage of an evaluation."""
    stages = ev.stages
    s = max(range(len(stages)), key=lambda i: stages[i].time_s)
    st = stages[s]
    others = [x.time_s for i, x in enumerate(stages) if i != s]
    causes = []
    if s == len(stages) - 1:
        causes.append("it holds the LM head and loss")
    if s == 0:
        causes.append("it holds the embedding")
    n_full = sum(1 for k in st.kinds if kind_letter(k) == "A")  # global attention: not sliding, chunked or MTP
    if n_full:
        causes.append(f"{n_full} full-attention layer{'s' if n_full > 1 else ''}")
    mean_layers = sum(len(x.layers) for x in stages) / len(stages)
    if len(st.layers) > mean_layers:
        causes.append(f"{len(st.layers)} layer{'s' if len(st.layers) != 1 else ''} against {mean_layers:.1f} on "
                      "average")
    against = (f"{st.time_s / (sum(others) / len(others)) - 1:+.1%} against the other stages' mean" if others
               else "the only stage")
    return (f"bottleneck: stage {s} ({layer_summary(st.layers, st.kinds)}, {st.time_s * 1e3:.2f} ms per micro-batch, "
            f"{against})" + (": " + "; ".join(causes) if causes else ""))


def _chosen_name(plan) -> str:
    """The chosen partition's method (:func:`tessera_lab.plan.proof.method_name`: ``given split`` for a recipe's)."""
    from tessera_lab.plan.proof import method_name

    return method_name(plan)


def _bound_lines(plan) -> list[str]:
    """``bound: ...`` of the chosen plan's slowest stage per task kind (:mod:`tessera_lab.cost.bounds`), the stage's
    host/sync term (:mod:`tessera_lab.cost.sync`, part of its forward time) beside them with its per-MoE-layer value
    and source, the kinds under 2% summed, and the terms' sum against the stage's standalone F+B+W; then why a knob
    may not move the stage."""
    from tessera_lab.cost.bounds import HOST_SYNC_KIND, OWN_STREAM_KIND, bound_text, knob_hint
    from tessera_lab.cost.sync import FITTED_PROVENANCE
    from tessera_lab.plan.notes import bottleneck_kinds

    s, kinds = bottleneck_kinds(plan)
    st = plan.chosen.stages[s]
    cut = 0.02 * st.time_s
    sync = st.host_sync_s
    terms = []
    for k in kinds:
        if k.kind == HOST_SYNC_KIND:
            n_moe = sum(1 for l in st.layers if plan.model.stack.layers[l].ffn == "moe")
            src = FITTED_PROVENANCE if plan.parallel.host_sync_s is None else "set by --host-sync-ms"
            if plan.parallel.fsdp:  # what is left of the waits beside FSDP's own-stream collectives (the note says)
                src = "exposed beside Megatron FSDP's own streams; the waits " + src
            per = sync / max(n_moe, 1)
            per = round(per * 1e9) / 1e9  # 4.445 ms stays 4.445, not 4.4449999 (printed as the notes print it)
            terms.append((sync, f"host/sync {sync * 1e3:.1f} ms: {n_moe} MoE layer{'s' if n_moe != 1 else ''} x "
                                f"{per * 1e3:.2f} ms per forward ({src}; tessera_lab/cost/sync.py; "
                                "--host-sync-ms sets it)"))
        elif k.time_s > cut:
            terms.append((k.time_s, bound_text(k)))
    kinds = [k for k in kinds if k.kind != HOST_SYNC_KIND]
    rest = sum(k.time_s for k in kinds if k.time_s <= cut)
    if rest > 0:
        terms.append((rest, f"smaller kinds {rest * 1e3:.1f} ms"))
    total = sum(t for t, _ in terms)
    side = next((k for k in kinds if k.kind == OWN_STREAM_KIND), None)
    beside = (f"; {side.kind} run beside the other kinds, so the sum exceeds the standalone time"
              if side is not None and total > st.standalone_s * (1 + 1e-9) else "")
    lines = [f"bound: stage {s} per task kind (F+B+W per micro-batch before overlap, analytic terms; sum "
             f"{total * 1e3:.1f} ms, the stage's standalone F+B+W {st.standalone_s * 1e3:.1f} ms{beside}): "
             + "; ".join(text for _, text in terms)]
    hint = knob_hint(kinds, plan.parallel.microbatches)
    if sync > 0 and (hint or sync >= max((k.time_s for k in kinds), default=0.0)):
        from tessera_lab.cost.sync import EP_OVERLAP_SCHEDULES

        p = plan.parallel
        if p.schedule not in EP_OVERLAP_SCHEDULES:
            from tessera_lab.model.hardware import VPP_RULE, overlap_rule_breaks

            needs = [b for b in overlap_rule_breaks(p) if b != VPP_RULE]
            knob = "an EP-overlap schedule" + (f" (Megatron-Core's needs {', '.join(needs)})" if needs else "")
        elif p.pp > 1:
            knob = ("fewer pipeline stages (this schedule hides it in the forwards it pairs with a backward up to the "
                    "paired backward's expert node; its warm-up forwards, more the more stages, carry all of it)")
        else:
            knob = ("larger micro-batches (this schedule hides it up to the paired backward's expert node, which they "
                    "lengthen)")
        said = (f"the host/sync term ({sync * 1e3:.1f} ms) counts MoE layers, not kernels: fewer MoE layers on the "
                f"stage, {knob} or a runtime without the sync (--host-sync-ms) move it")
        # the larger of the two first: a stage the sync dominates is not moved by the compute kinds' knobs
        hint = said + (f"; {hint}" if hint else "") if sync >= max((k.time_s for k in kinds), default=0.0) \
            else f"{hint}; {said}"
    if hint:
        lines.append(f"bound: {hint}")
    return lines


def _cluster_text(cluster, used: int) -> str:
    """``cluster 8 x 8 H200``; where the layout leaves GPUs of its last node idle, how many it uses
    (``cluster 64 GPUs of 1 x 72 GB200 ...``); a node that is not 8 GPUs is named as the NVLink domain it is."""
    c = cluster
    head = f"cluster {c.num_nodes} x {c.gpus_per_node} {c.gpu.name}"
    if used < c.num_gpus:
        head = f"cluster {used} GPUs of {c.num_nodes} x {c.gpus_per_node} {c.gpu.name}"
    if c.gpus_per_node != 8:
        head += f" (a node is one NVLink domain of {c.gpus_per_node} GPUs)"
    return head


def _recompute_text(p, moe: bool = True) -> str:
    """``none``, ``full`` or ``selective (core_attn, moe_act)``: the module names recomputed (the default set
    :data:`~tessera_lab.model.hardware.SELECTIVE_DEFAULT_MODULES` when none are given; without MoE layers, ``moe``
    false, the MoE modules are left out: ``selective (core_attn)``)."""
    from tessera_lab.model.hardware import selective_modules

    if p.recompute != "selective":
        return p.recompute
    return f"selective ({', '.join(selective_modules(p.recompute, p.recompute_modules, moe))})"


#: one line per baseline, printed under the summary table
BASELINE_TEXT = {
    "uniform": "even layer counts per stage",
    "standalone": "balanced on standalone F+B+W sums (what a planner without overlap measurement picks)",
    "parameters": "balanced on parameter bytes per stage (DeepSpeed's default partition_method='parameters')",
}
#: decimals per column of the summary table (fixed, so that 1.480 stands beside 1.794)
SUMMARY_FLOATFMT = ("", ".3f", ",.0f", "", ".3f", ".2f", "")


def _header_lines(plan) -> list[str]:
    """The plan's header: the model (and its approximation note), the pattern legend, cluster and layout, costs."""
    p, m = plan.parallel, plan.model
    lines = [m.approximate] if m.approximate else []
    return lines + [
        f"model {m.name} ({m.family}{f', from {m.path}' if m.path else ''}): {m.num_layers} layers "
        f"({m.mixer_kinds()})"
        + (f"; MoE {m.moe.num_experts} experts of width {m.moe.moe_intermediate_size}"
           + (f" on a latent of {m.moe.moe_latent_size}" if m.moe.moe_latent_size else "")
           + f", top-{m.moe.num_experts_per_tok}, shared "
           f"expert width {m.moe.shared_expert_intermediate_size or 'none'}" if m.has_moe else "; dense")
        + f", pattern {m.layer_pattern()}",
        "  (pattern: L linear mixer, A full attention, S sliding window, C chunked, T MTP; lower case: dense FFN; "
        "- / E: MLP / MoE block without mixer; stage tables count them: Ax2 Ldx1 = two A layers, one L with a dense "
        "FFN)",
        _cluster_text(plan.cluster, p.world_size) + "; "
        + layout_text(p, m.has_moe) + f", schedule {p.schedule}, "
        f"m={p.microbatches} micro-batches of {p.micro_batch_size} x {p.seq_len} tokens; "
        f"memory limit {plan.memory_capacity_bytes / GIB:.1f} GiB per GPU"
        + (f" (HBM less the {plan.cluster.memory_reserve_gib:g} GiB of --memory-reserve-gib)"
           if plan.cluster.memory_reserve_gib is not None
           else "") + f"; recompute {_recompute_text(p, m.has_moe)}, "
        + (f"dispatcher {getattr(p, 'dispatcher', 'alltoall')}, " if m.has_moe else "")
        + f"precision {getattr(p, 'precision', p.dtype)}"
        + (f", expert GEMMs {getattr(p, 'grouped_gemm', 'grouped')}" if m.has_moe else ""),
        f"costs: {plan.costs.describe()}",
        "",
    ]


def _trial_lines(plan) -> list[str]:
    """The schedules ``--schedule auto`` tried, with what the host/sync term adds to each, and every refusal in
    full; a schedule refused because no partition fits memory shows ``NO`` under fits memory, any other refusal
    ``not planned (refused)``; none without trials."""
    lines: list[str] = []
    if not plan.schedule_trials:
        return lines
    lines.append("")
    lines.append("schedules tried (--schedule auto); 'of which host/sync': what the host/sync term adds to "
                 "that schedule's iteration (a value per host wait FITTED per dispatcher, tessera_lab/cost/sync.py; the "
                 "EP-overlap schedules pay all of it in the forwards they run apart and, in a paired forward, what the "
                 "paired backward's expert node does not hide), so a ranking it changes is visible:")
    lines.append(table([{"schedule": t["schedule"], "vpp": t.get("vpp", 1),
                         "iteration (s)": (f"{t['iteration_time_s']:.3f}" if "iteration_time_s" in t else "refused"),
                         "of which host/sync (s)": (f"{t.get('host_sync_s', 0.0):.3f}"
                                                    if "iteration_time_s" in t else "-"),
                         "without it (s)": (f"{t['iteration_time_s'] - t.get('host_sync_s', 0.0):.3f}"
                                            if "iteration_time_s" in t else "-"),
                         "fits memory": ("yes" if t.get("fits_memory") else "NO" if "fits_memory" in t
                                         else "not planned (refused)")}
                        for t in plan.schedule_trials]))
    for t in plan.schedule_trials:  # full reasons, never cut
        if "error" in t:
            lines.append(f"refused {t['schedule']}" + (f" vpp {t['vpp']}" if t.get("vpp", 1) > 1 else "")
                         + f": {t['error']}")
    return lines


#: where the memory reserve comes from when the user gives none
RESERVE_DEFAULT_SOURCE = "assumed in data/hardware/cost_model.json"


def rank_memory(plan, ev=None) -> dict:
    """The largest memory per GPU of ``ev`` (default: the chosen evaluation): a pipeline rank's virtual stages summed
    (:meth:`~tessera_lab.plan.evaluate.Evaluation.rank_memory`), against the plan's limit per GPU, the GPU's HBM
    less the reserve, and where the reserve comes from. Keys: ``rank``, ``largest_gib``, ``limit_gib``,
    ``hbm_gib``, ``reserve_gib``, ``reserve_from`` (``--memory-reserve-gib`` or :data:`RESERVE_DEFAULT_SOURCE`);
    GiB = 2**30 bytes, computed by the memory model."""
    from tessera_lab.cost.memory import cluster_reserve_gib

    ev = plan.chosen if ev is None else ev
    pp = plan.parallel.pp
    ranks = ev.rank_memory(pp)
    r = max(range(pp), key=lambda k: ranks[k])
    return {"rank": r, "largest_gib": ranks[r] / GIB, "limit_gib": plan.memory_capacity_bytes / GIB,
            "hbm_gib": plan.cluster.gpu.memory_bytes / GIB, "reserve_gib": cluster_reserve_gib(plan.cluster),
            "reserve_from": (RESERVE_DEFAULT_SOURCE if plan.cluster.memory_reserve_gib is None
                             else "--memory-reserve-gib")}


def rank_memory_line(plan, ev=None, *, rows_note: bool = True) -> str:
    """One line of :func:`rank_memory`: ``memory per GPU (computed; ...): largest X GiB on rank r, of Y GiB (...)``;
    ``rows_note`` (``plan``'s per-stage tables) says the rows above are one chunk's when a rank holds several."""
    p, mem = plan.parallel, rank_memory(plan, ev)
    what = (f"a rank's {p.vpp} chunks summed" + ("; rows above are one chunk's" if rows_note else "")
            if p.vpp > 1 else "one stage per rank")
    return (f"memory per GPU (computed; {what}): largest {mem['largest_gib']:.2f} GiB on rank {mem['rank']}, of "
            f"{mem['limit_gib']:.2f} GiB ({mem['hbm_gib']:.2f} GiB HBM less a {mem['reserve_gib']:g} GiB reserve, "
            f"{mem['reserve_from']})")


def format_plan(plan) -> str:
    """Readable text of a plan: the header and the summary of every method first (infeasible ones marked), the
    bottleneck stage and its cause, then per-stage tables for the chosen method and each baseline, notes last."""
    p, m = plan.parallel, plan.model
    lines = _header_lines(plan)
    summary, details = [], []
    origin = getattr(plan, "partition_from", "")
    unguarded = getattr(plan, "solver_result", None) if origin else None
    name = _chosen_name(plan)
    entries = [(f"{name} (chosen)", plan.chosen, name)]
    if unguarded is not None:  # a guarded result is reported beside the unguarded one
        kept = kept_baseline(plan)
        moved = ", moved by simulator refinement" if origin.endswith("refinement") else ""
        # an optimum only where the solver proved one; at its limit the solver's partition is a heuristic plan
        own = (f"{unguarded.method} optimum" if unguarded.partition.proven
               else f"{unguarded.method} partition (not proven optimal)")
        entries = [(f"{plan.chosen.method} (chosen: the {kept} baseline's partition{moved}; it simulates faster than "
                    f"the {own})", plan.chosen, f"{plan.chosen.method} (from {kept})"),
                   (f"{own} (not chosen: slower when simulated)", unguarded, own)]
    # with --method uniform the chosen plan is the uniform baseline itself: one row, not two identical ones
    entries += [(name, ev, ev.method) for name, ev in plan.baselines.items()
                if not (name == plan.chosen.method == "uniform"
                        and list(ev.partition.boundaries) == list(plan.chosen.partition.boundaries))]
    for label, ev, row in entries:
        solver = ev.partition.solver and not (unguarded is not None and ev is plan.chosen)
        details.append(f"[{label}] boundaries {ev.partition.boundaries}"
                       + ("" if ev.fits_memory else "  ** exceeds GPU memory **")
                       + (f"; solver {ev.partition.solver} {ev.partition.status} in {ev.partition.solve_time_s:.3f} s"
                          if solver else "")
                       + ("; then moved by simulator refinement (proves nothing)" if solver and ev is plan.chosen
                          and (plan.refinement or {}).get("gain_s", 0.0) > 0 else ""))
        details.append(table(_evaluation_rows(ev, p.pp if p.vpp > 1 else None, m), ".3f"))
        if p.vpp > 1:  # a rank holds vpp chunks: what fits is their sum, not a row's memory
            details.append(rank_memory_line(plan, ev))
        details.append("")
        summary.append({
            "method": row + ("" if ev.fits_memory else " (!)"), "iteration (s)": ev.iteration_time_s,
            "tokens/s": ev.tokens_per_s, "MFU": f"{ev.mfu:.1%}", "bubble_fraction": ev.bubble_fraction,
            "slowest stage (ms)": max(st.time_s for st in ev.stages) * 1e3,
            "fits memory": "yes" if ev.fits_memory else "NO",
        })
    lines.append(table(summary, SUMMARY_FLOATFMT))
    lines.append("iteration, tokens/s, MFU, bubble and stage times: simulated (the schedule on the costs above); "
                 "memory: computed (memory model) against the GPU's capacity less its reserve "
                 f"({RESERVE_DEFAULT_SOURCE if plan.cluster.memory_reserve_gib is None else '--memory-reserve-gib'})")
    lines.append(solve_line(plan))
    lines.append("baselines (same schedule and simulator): " + ("; ".join(
        f"{name}: {BASELINE_TEXT.get(name, name)}" for name in plan.baselines) or "none (the split is given or "
        "even, so there is no partition to compare it with)")
        + ("; standalone: not shown (without overlap the planner balances the same standalone costs)"
           if plan.baselines and "standalone" not in plan.baselines and "uniform" in plan.baselines else ""))
    if any(not ev.fits_memory for ev in [plan.chosen, *plan.baselines.values()]):
        lines.append("(!) does not fit in GPU memory: its times are shown for comparison only")
    lines.append(_bottleneck_line(plan.chosen))
    if plan.costs.kind == "analytic":
        lines.extend(_bound_lines(plan))
    lines.append("")
    if plan.chosen.stages[0].overlap_s is not None:
        lines.append("time/mb: per micro-batch after overlap (forward of one micro-batch paired with the backward of "
                     "another, best issue order); standalone: the same work run one task after the other"
                     + ("; a stage the schedule never pairs (here: " + ", ".join(
                         str(st.index) for st in plan.chosen.stages if not st.paired)
                        + f", with {p.microbatches} micro-batch(es)) shows its standalone time"
                        if not all(st.paired for st in plan.chosen.stages) else ""))
        lines.append("")
    lines.extend(details)
    lines.extend(_trial_lines(plan))
    lines.append(mfu_line(plan))
    flag = mfu_note(plan.chosen.mfu, moe=m.moe.num_experts > 0, model=m, gpu=plan.cluster.gpu.name,
                    precision=p.precision, grouped_gemm=getattr(p, "grouped_gemm", None))  # validity flag
    if flag:
        lines.append(f"warning: {flag}")
    lines.append("MFU: Megatron-LM model FLOPs (3 x forward GEMM + attention FLOPs, causal at half) / "
                 f"(iteration time x {p.world_size} GPUs x {plan.cluster.gpu.peak_flops / 1e12:.0f} TFLOP/s dense bf16)")
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


#: the options a runner plan (``plan --model tiny-* --device FILE``) uses; any other set away from its default is
#: refused, never silently ignored
DEVICE_PLAN_OPTIONS = {"model", "pp", "vpp", "ep", "dp", "microbatches", "micro_batch_size", "schedule", "method",
                       "json", "export", "device"}


def check_device_plan_options(args: argparse.Namespace) -> None:
    """Refuse options ``plan --device`` does not use (``--tp``, ``--gpu``, ``--profile``, ``--seq-len``, ...).

    Raises:
        ConfigError: naming the first such option and its value.
    """
    from tessera_lab.errors import ConfigError

    defaults = getattr(args, "_plan_defaults", {}) or {}
    for dest, default in defaults.items():
        if dest in DEVICE_PLAN_OPTIONS:
            continue
        given = getattr(args, dest, default)
        if given != default:
            flag = "--" + dest.replace("_", "-")
            raise ConfigError(f"plan --device: option {flag} = {given!r} is not used by a runner plan (the runner "
                              f"plans its tiny model on the calibrated device); allowed: leave {flag} out, or plan "
                              "without --device")


def cp_fit_hint(model, parallel, nodes, opts: dict) -> str:
    """``"; --cp N fits ..."`` for a memory refusal at a long sequence (at least twice the search's
    :data:`~tessera_lab.plan.search_space.CP_MIN_TOKENS` per sequence) where a larger context-parallel size than
    ``parallel.cp`` (each larger one Megatron-Core can run with this TP, smallest first,
    :func:`~tessera_lab.plan.search_space.cp_choices`) plans and fits on the GPUs it needs; ``""`` otherwise. Each
    try is a planner run with the refused plan's options (the refusal path only)."""
    from tessera_lab.errors import TesseraError
    from tessera_lab.plan.make import make_plan
    from tessera_lab.plan.search_space import CP_MIN_TOKENS, cp_choices

    if parallel.seq_len < 2 * CP_MIN_TOKENS:
        return ""
    for cp in [c for c in cp_choices(model, parallel.seq_len, parallel.tp) if c > parallel.cp]:
        try:
            pl = make_plan(model, parallel.replace(cp=cp), None, **opts)
        except TesseraError:
            continue
        if pl.chosen.fits_memory:
            ranks = pl.chosen.rank_memory(pl.parallel.pp)
            return (f"; context parallelism would fit: --cp {cp} plans with a peak of {max(ranks) / 2**30:.1f} GiB "
                    f"per GPU (computed) on {pl.parallel.world_size} GPUs, each CP rank holding 1/{cp} of a "
                    "sequence's activations")
    return ""


def search_command(args: argparse.Namespace, parallel) -> str:
    """The ``tessera-lab search`` command for the plan's model, GPU type and sequence (and its MTP and config
    options), to which a refusal adds ``--gpus N``; the GPU and sequence always, so that no default can differ."""
    import shlex

    parts = ["tessera-lab search --model", shlex.quote(str(args.model)), "--gpu", args.gpu,
             "--seq-len", str(parallel.seq_len)]
    parts += [flag for flag, on in (("--mtp", getattr(args, "mtp", False)),
                                    ("--allow-unknown-fields", getattr(args, "allow_unknown_fields", False))) if on]
    return " ".join(parts)


def cmd_plan(args: argparse.Namespace) -> int:
    if getattr(args, "device", None):  # the runner on a calibrated device
        from tessera_lab.runner.testbed.predict import cmd_plan_device

        check_device_plan_options(args)
        return cmd_plan_device(args)
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.plan.make import AUTO_ILP_BUDGET, make_plan
    from tessera_lab.plan.search import with_gpu_count

    limit = ilp_limit_from_args(args, AUTO_ILP_BUDGET if args.schedule == "auto" else None)
    model = model_from_args(args)
    parallel = parallel_from_args(args, model)
    cluster = cluster_from_args(args, parallel)
    profile = None
    if args.profile:
        import warnings

        from tessera_lab.overlap.profiles import StaleProfileWarning, check_profile_fits, load_profile

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StaleProfileWarning)  # reported below, once
            profile = load_profile(args.profile)
        check_profile_fits(profile, args.profile, model.name, args.gpu, allow=args.allow_stale_profile)
    boundaries = split_from_args(args, model, parallel)
    opts = dict(method="uniform" if boundaries else args.method, objective=args.objective,
                limit=limit, gpu=args.gpu, profile=profile, boundaries=boundaries,
                memory_reserve_gib=args.memory_reserve_gib,
                **({"baselines": ()} if boundaries else {}))
    try:
        plan = make_plan(model, parallel, cluster, **opts)
    except PartitionError as exc:
        # only more GPUs close it: the refusal's finding with the count, without advice that cannot help
        counted = with_gpu_count(exc, model, parallel, cluster or cluster_for(parallel, args.gpu),
                                 search_command(args, parallel))
        if counted is not None:
            raise counted from None
        if not isinstance(exc, InfeasiblePlanError):
            raise
        hint = cp_fit_hint(model, parallel, args.nodes, opts) if args.nodes is None else ""
        raise InfeasiblePlanError(f"{exc}{hint}") from None
    emit(args, plan.as_dict(), format_plan(plan))
    if args.export:
        from tessera_lab.plan.exports import write_plan

        write_plan(plan.as_dict(), args.export)
        print(f"plan written to {args.export} (schema-versioned JSON with Megatron-LM, DeepSpeed and "
              "torch.distributed.pipelining exports)", file=sys.stderr)
    if args.plot:
        from tessera_lab.ui.plots import save_plan_figures

        paths = save_plan_figures(plan, args.plot)
        print("figures: " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0



def add_parser(sub) -> None:
    from tessera_lab.defaults import DEFAULT_GPU, DEFAULT_MODEL

    p = sub.add_parser("plan", help="the main job: partition, simulate and report a pipeline plan")
    add_plan_options(p, DEFAULT_MODEL, DEFAULT_GPU)
    p.add_argument("--objective", default="auto", choices=["auto", "bottleneck", "schedule"],
                   help="auto (default): solve the schedule-aware and the bottleneck objective, start from the "
                        "fastest in simulation (baselines included) and refine by simulation")
    add_ilp_limit_options(p)
    p.add_argument("--plot", metavar="PATH",
                   help="save figures: PATH.png gives PATH-stages.png (stage costs) and PATH-timeline.png (Gantt)")
    p.add_argument("--profile", metavar="PATH",
                   help="measured overlap profile (tessera-lab measure); layer-pair costs come from it")
    p.add_argument("--allow-stale-profile", action="store_true",
                   help="use a --profile of another model or device (a CPU-measured profile for a GPU plan "
                        "included), or a stale one, with a warning instead of refusing it")
    p.add_argument("--export", metavar="PATH",
                   help="write the plan as schema-versioned JSON with Megatron-LM layout, DeepSpeed parts and "
                        "torch.distributed.pipelining split points")
    p.add_argument("--device", metavar="FILE", default=None,
                   help="calibrated device (tessera-lab calibrate); with a runner model (tiny-runner) the plan "
                        "predicts the runner on that device (costs: 'calibrated device NAME')")
    add_json(p)
    p.set_defaults(func=cmd_plan, _plan_defaults={a.dest: a.default for a in p._actions
                                                  if a.option_strings and a.dest != "help"})

