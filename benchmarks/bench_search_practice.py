"""Checked against practice: the layout search at every published run's GPUs, global batch and sequence, against the
run's own layout.

For each run of ``data/published`` (:data:`tessera_lab.report.fidelity_set.DEFAULT_FILES`, read as
``benchmarks/bench_public_runs.py`` reads them) the benchmark runs :func:`tessera_lab.plan.search.search` on the
run's GPU type and count, its global batch (``gbs x seq_len`` tokens) and sequence length, and plans the recipe's own
layout with the search's planner (:func:`tessera_lab.plan.search.plan_layout`: the same planner options and the same
:class:`~tessera_lab.model.hardware.ParallelConfig` defaults as every searched candidate, so the two are comparable).
Per run it prints the best layout found and its predicted iteration, the recipe layout's predicted iteration, whether
the best is at least as fast, and where the recipe's layout ranks among the searched candidates that fit (1 + the
candidates predicted strictly faster). Where our memory model refuses the recipe's layout (the run exists, so the gap
is the memory model's), the recipe is also planned without the memory limit (a GPU of 1 PiB, as
``bench_public_runs.py`` prices such a run), and a second count compares the best with that time; the first count,
which counts such a run as a miss, is printed beside it.

The recipe's layout in the search's terms (:func:`recipe_layout`): TP, PP, VPP, EP, CP, the data-parallel replicas,
micro-batches and micro-batch size, the schedule and the expert grid as ``bench_public_runs.parallel_for`` maps them
(EP spanning TP where EP > Megatron's DP), the dispatcher and the recompute granularity. The run's training settings
that are not layout choices apply to every candidate of its search alike (:class:`RecipeLayout`, passed to the
search through its ``layouts`` argument): precision (FP8 runs are searched in FP8), Adam moment and gradient dtypes,
the published routing balance, the recipes' cross-entropy fusion, Megatron-Core's contiguous expert grid and the MTP
layers the recipe trains (``mtp_num_layers``, planned after the decoder layers as ``plan --mtp``). The
recipe's own recompute modules and Megatron FSDP are kept on the recipe's layout; a recipe layout the enumeration
does not produce (modules the search does not try, or a VPP, micro-batch size or schedule outside the search's
values) is added to the candidates when the planner accepts it (Megatron-Core can run it), and
the row names the dimension. Both sides get the planner's partition (a recipe's fixed pipeline split is listed, not
imposed).

Ranking agreement of the Megatron-MoE-ModelZoo Qwen3 table (several layouts of one model on the same GPUs with their
step times): :func:`bench_modelzoo_ranking.rank_agreement` over the layouts ``bench_modelzoo_ranking.py`` plans
(``--no-modelzoo`` skips it).

Budget: each search plans at most ``--max-plans`` layouts (default 210, the search's own default, so what a
researcher running ``tessera-lab search`` gets; planned in batches of 8, so 216; ``--top`` 3); with
``--retry-plans`` N above it (default 0: none), where that budget leaves the recipe's layout faster than the best
found and candidates unplanned, the search runs again with N. The row says how many candidates the budget left
unplanned and the smallest lower bound among them (none of them can be faster than that bound). CPU seconds per run
are printed.

Megatron-Core's schedules (:func:`megatron_runs`): the best found may use a schedule of this project's own (ZB-H1,
ZB-H2, or the overlapped 1F1B of several stages without virtual stages, which Megatron-Core's EP overlap refuses);
the row also gives the best layout whose schedule Megatron-Core runs.

Nothing is fitted here and no published time is used by the search; published step times appear only in the
ModelZoo agreement, read from ``data/published``.

Run: python benchmarks/bench_search_practice.py [--json PATH|-] [--max-plans N] [--top K] [--runs ID,...]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import astuple
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: the search's own default budget (``tessera-lab search``'s ``--max-plans``, :data:`tessera_lab.plan.search.
#: DEFAULT_MAX_PLANS`; tests/test_search_practice_budget.py checks they agree)
MAX_PLANS = 210
TOP = 3
RETRY_PLANS = 0


def _recipe_layout_class():
    """:class:`RecipeLayout`, built on first use (the benchmark imports the package lazily)."""
    global RecipeLayout
    if "RecipeLayout" in globals():
        return RecipeLayout
    from dataclasses import dataclass

    from tessera_lab.plan.search import Layout

    @dataclass(frozen=True, order=True)
    class RecipeLayout(Layout):
        """A :class:`~tessera_lab.plan.search.Layout` planned with a published run's training settings: its precision,
        Adam moment and gradient dtypes, routing balance (``expert_load``), the recipes' cross-entropy fusion and
        Megatron-Core's contiguous expert grid (as ``bench_public_runs.parallel_for`` sets them), and, for the recipe's
        own layout, its recompute modules and Megatron FSDP. The search plans every candidate through
        :meth:`parallel`, so all candidates of a run share these settings."""

        precision: str = "bf16"
        adam_moment_dtype: str = "fp32"
        grad_reduce_dtype: str = "fp32"
        expert_load: float | None = None
        recompute_modules: tuple = ()
        fsdp: bool = False

        def parallel(self, seq_len: int):
            return Layout.parallel(self, seq_len).replace(
                precision=self.precision, adam_moment_dtype=self.adam_moment_dtype,
                grad_reduce_dtype=self.grad_reduce_dtype, expert_load=self.expert_load, fused_cross_entropy=True,
                ep_placement="contiguous", fsdp=self.fsdp,
                recompute_modules=self.recompute_modules if self.recompute == "selective" else ())

        def cost_group(self) -> tuple:
            return Layout.cost_group(self) + (self.recompute_modules, self.fsdp)

    globals()["RecipeLayout"] = RecipeLayout
    return RecipeLayout


def run_settings(run: dict) -> dict:
    """The run's training settings every candidate of its search shares (:class:`RecipeLayout`)."""
    return {"precision": run["precision"], "adam_moment_dtype": run.get("adam_moment_dtype", "fp32"),
            "grad_reduce_dtype": run.get("grad_reduce_dtype", "fp32"), "expert_load": run.get("expert_load", 1.0)}


def recipe_layout(run: dict):
    """The run's layout as a :class:`RecipeLayout` (module docstring) and what of the recipe it leaves out."""
    from bench_public_runs import parallel_for

    par, _ = parallel_for(run)
    extra = {"recompute_modules": par.recompute_modules if par.recompute == "selective" else (),
             "fsdp": bool(run.get("fsdp"))}
    lay = _recipe_layout_class()(par.pp, par.vpp, par.ep, par.tp, par.dp, par.microbatches, par.micro_batch_size,
                                 par.schedule, par.recompute, par.dispatcher, par.ep_spans_tp, par.cp,
                                 **run_settings(run), **extra)
    left = []
    if run.get("pipeline_split"):
        left.append("the recipe's pipeline split as the planner's partition")
    if run.get("schedule") and run["schedule"] != par.schedule:
        left.append(f"schedule {run['schedule']}")
    return lay, left


def outside_space(model, lay, node: int, seq_len: int) -> list[str]:
    """Why ``lay`` is not among :func:`tessera_lab.plan.search.enumerate_layouts`' values (empty when the value of
    every dimension is one the search tries)."""
    from tessera_lab.plan.make import VIRTUAL_SCHEDULES
    from tessera_lab.plan.search_space import (SEARCH_MICRO_BATCH_SIZES, SEARCH_SCHEDULES, SEARCH_VPP, cp_choices,
                                               overlap_rule_breaks, recompute_choices, tp_choices)

    why = []
    if lay.vpp > 1 and lay.vpp not in SEARCH_VPP:
        why.append(f"vpp {lay.vpp} (searched {', '.join(map(str, SEARCH_VPP))})")
    if lay.micro_batch_size not in SEARCH_MICRO_BATCH_SIZES:
        why.append(f"micro-batch size {lay.micro_batch_size}")
    overlapped = lay.schedule in ("overlapped", "interleaved-overlapped")
    if (lay.schedule not in SEARCH_SCHEDULES + VIRTUAL_SCHEDULES + ("overlapped",)
            or (lay.pp == 1 and lay.schedule not in ("1f1b", "overlapped"))
            or (lay.schedule == "overlapped" and lay.pp > 1)):
        why.append(f"schedule {lay.schedule} at pp {lay.pp}")
    elif overlapped and overlap_rule_breaks(lay):
        why.append(f"{lay.schedule} breaks Megatron-Core's EP-overlap rules ({'; '.join(overlap_rule_breaks(lay))})")
    if lay.tp not in tp_choices(model, node):
        why.append(f"tp {lay.tp}")
    if lay.cp not in cp_choices(model, seq_len, lay.tp):
        why.append(f"cp {lay.cp}")
    if lay.pp * lay.vpp > model.num_layers:
        why.append(f"pp x vpp {lay.pp * lay.vpp} over {model.num_layers} layers")
    modules = tuple(getattr(lay, "recompute_modules", ()) or ())
    if modules and ("selective", modules) not in recompute_choices(model):
        why.append(f"recompute modules {','.join(modules)}")
    return why


def check_run(run: dict, max_plans: int, top: int, retry_plans: int = 0) -> dict:
    """One row: the search at the run's GPUs, batch and sequence beside the recipe's layout (module docstring).
    ``retry_plans``: the budget of the second search (only when above ``max_plans``; 0: no second search)."""
    from bench_public_runs import model_for, run_split, without_memory_limit

    from tessera_lab.model.hardware import GPUSpec
    from tessera_lab.plan.search import enumerate_layouts, plan_layout, search, search_cluster

    t0 = time.process_time()
    model = model_for(run)  # with the MTP layers the recipe trains (a training setting every candidate shares)
    lay, left = recipe_layout(run)
    gpus, seq = run["gpus"], run["seq_len"]
    node = GPUSpec.named(run["gpu"]).nvlink_domain
    cls, settings = _recipe_layout_class(), run_settings(run)
    space = [cls(*astuple(x), **settings) for x in enumerate_layouts(model, gpus, run["gbs"], gpus_per_node=node,
                                                                       seq_len=seq)]
    own_split = None
    if lay.pp * lay.vpp > model.num_layers and run.get("pipeline_split"):
        # more virtual stages than layers: only the recipe's own split places them (Megatron's embedding/loss
        # accounting leaves the first and last virtual stage without a decoder layer)
        own_split = run_split(run, model)
        left[:] = [x for x in left if "pipeline split" not in x]
        left.append(f"planned with the recipe's own pipeline split ({lay.pp * lay.vpp} virtual stages for "
                    f"{model.num_layers} layers: no other partition places them)")
    cluster = search_cluster(run["gpu"], gpus)
    recipe = plan_layout(model, lay, seq, cluster, boundaries=own_split)
    roomy = None
    if not recipe.get("fits"):
        # the run exists, so our memory model is what refuses it: its time priced without the memory limit, as
        # bench_public_runs prices such a run (a GPU of 1 PiB; the partition is then the planner's fastest)
        roomy = plan_layout(model, lay, seq, without_memory_limit(cluster),
                            boundaries=own_split).get("iteration_time_s")
    outside = [] if lay in set(space) else (outside_space(model, lay, node, seq) or ["not enumerated"])
    # the planner accepts it (Megatron-Core runs it); not a layout only its own split places (the search partitions)
    added = bool(outside) and "error" not in recipe and own_split is None
    layouts = space + [lay] if added else space
    res = search(model, gpus, gpu=run["gpu"], seq_len=seq, global_batch_tokens=run["gbs"] * seq, top=top,
                 max_plans=max_plans, layouts=layouts)
    rt = recipe.get("iteration_time_s") if recipe.get("fits") else None
    retried = None
    if (retry_plans > max_plans and rt is not None and res.pruned.get("budget")
            and (not res.ranked or res.ranked[0].result["iteration_time_s"] > rt)):
        retried = retry_plans  # the budget may hide a faster layout: search again with a larger one
        res = search(model, gpus, gpu=run["gpu"], seq_len=seq, global_batch_tokens=run["gbs"] * seq, top=top,
                     max_plans=retry_plans, layouts=layouts)
    ranked = res.ranked
    mega = [c for c in ranked if megatron_runs(c.layout)]
    best = ranked[0] if ranked else None
    moe = model.has_moe  # a dense model's layouts have no EP and no dispatcher
    row = {"id": run["id"], "split": run["split"], "model": run["model"], "gpu": run["gpu"], "gpus": gpus,
           "global_batch_sequences": run["gbs"], "seq_len": seq, "recipe_layout": lay.text(moe),
           "recipe_left_out": left, "recipe_outside_space": outside, "recipe_added_to_space": added,
           "recipe_fits": bool(recipe.get("fits")), "recipe_iteration_s": recipe.get("iteration_time_s"),
           "recipe_peak_gib": recipe.get("peak_memory_gib"), "recipe_error": recipe.get("error"),
           "recipe_iteration_no_memory_limit_s": roomy,
           "best_layout": best.layout.text(moe) if best else None,
           "best_iteration_s": best.result["iteration_time_s"] if best else None,
           "best_megatron_layout": mega[0].layout.text(moe) if mega else None,
           "best_megatron_iteration_s": mega[0].result["iteration_time_s"] if mega else None,
           "max_plans": retried or max_plans, "retried_with_max_plans": retried,
           "enumerated": res.enumerated, "evaluated": len(res.planned), "pruned": res.pruned,
           "unplanned_bound_s": res.unplanned_bound_s, "fitting_planned": len(ranked)}
    row["recipe_rank"] = (1 + sum(c.result["iteration_time_s"] < rt for c in ranked)) if rt is not None else None
    row["best_at_least_as_fast"] = (best is not None and rt is not None
                                    and row["best_iteration_s"] <= rt * (1 + 1e-9))
    # the recipe over our memory model: the best against the recipe's time without the memory limit (a lower time
    # than any partition that fits, so "at least as fast" holds for whatever memory the run really took)
    row["best_at_least_as_fast_no_memory_limit"] = (row["best_at_least_as_fast"] or (
        best is not None and rt is None and roomy is not None and row["best_iteration_s"] <= roomy * (1 + 1e-9)))
    row["why_not"] = _why_not(row, best, rt)
    row["cpu_s"] = time.process_time() - t0
    return row


def megatron_runs(lay) -> bool:
    """Whether Megatron-Core runs the layout's schedule: 1F1B, interleaved 1F1B, or its combined 1F1B with the EP
    overlap (``overlapped`` / ``interleaved-overlapped``), which ``TransformerConfig`` allows only with EP > 1, no
    full recompute and virtual stages when PP > 1 (``--export``'s notes); the zero-bubble schedules and the overlapped
    1F1B of several stages without virtual stages are this project's own."""
    if lay.schedule in ("1f1b", "interleaved"):
        return True
    if lay.schedule in ("overlapped", "interleaved-overlapped"):
        return lay.ep > 1 and lay.recompute != "full" and (lay.pp == 1 or lay.vpp > 1)
    return False


def _why_not(row: dict, best, rt: float | None) -> str | None:
    """Why the search has no layout at least as fast as the recipe's (``None`` when it has)."""
    if row["best_at_least_as_fast"]:
        return None
    if rt is None:
        return ("the recipe's layout does not fit memory under the search's assumptions"
                if row["recipe_error"] is None else f"the planner refuses the recipe's layout: {row['recipe_error']}")
    if best is None:
        return "no searched layout fits memory within the budget"
    return "the budget left candidates unplanned" if row["pruned"].get("budget") else "not found"


def modelzoo_agreement() -> dict:
    """Rank agreement of the ModelZoo Qwen3 layouts (``bench_modelzoo_ranking.py``: the fidelity set's plans of
    their rows, with the shipped fitted host/sync term, and their published times)."""
    import bench_modelzoo_ranking as mz

    t0 = time.process_time()
    pub = mz.published_times()
    rows = mz.recipe_rows(None)
    pred = {k: r["iteration_time_s"] for k, r in rows.items() if r["fits"]}
    return {"rows": rows, "published_s": pub, "agreement": mz.rank_agreement(pred, pub),
            "cpu_s": time.process_time() - t0}


def _fmt(x, spec=".2f", none="-"):
    return none if x is None else format(x, spec)


def print_table(rows: list[dict], out) -> None:
    print("| run | GPUs | recipe layout (search terms) | recipe s | rank | best layout found | best s | best <= recipe "
          "| best Megatron-Core layout | its s | planned (budget left) | CPU s |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|", file=out)
    for r in rows:
        roomy = r.get("recipe_iteration_no_memory_limit_s")
        rec = _fmt(r["recipe_iteration_s"]) + ("" if r["recipe_fits"] else " (over memory" + (
            f"; {roomy:.2f} without the memory limit)" if roomy is not None else ")"))
        left = r["pruned"].get("budget", 0)
        ok = ("yes" if r["best_at_least_as_fast"] else
              f"no: {r['why_not']}" + ("; against the recipe's time without the memory limit: yes"
                                       if r.get("best_at_least_as_fast_no_memory_limit") else ""))
        print(f"| {r['id']} | {r['gpus']} x {r['gpu']} | {r['recipe_layout']} | {rec} | {_fmt(r['recipe_rank'], 'd')} "
              f"| {r['best_layout'] or '-'} | {_fmt(r['best_iteration_s'])} | {ok} | {r['best_megatron_layout'] or '-'} "
              f"| {_fmt(r['best_megatron_iteration_s'])} | {r['evaluated']} ({left}) | {r['cpu_s']:.1f} |", file=out)
    for r in rows:
        notes = r["recipe_left_out"] + ([f"outside the space: {'; '.join(r['recipe_outside_space'])}"
                                         + (" (added)" if r["recipe_added_to_space"] else " (not added)")]
                                        if r["recipe_outside_space"] else [])
        if r["recipe_error"]:
            notes.append(f"planner: {r['recipe_error']}")
        if notes:
            print(f"- {r['id']}: {'; '.join(notes)}", file=out)


def main(argv=None) -> None:
    from tessera_lab.paths import data_dir
    from tessera_lab.report.fidelity_set import DEFAULT_FILES, load_runs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, metavar="PATH", help="write the rows here ('-': stdout, table to stderr)")
    ap.add_argument("--max-plans", type=int, default=MAX_PLANS, help=f"planner runs per search (default {MAX_PLANS})")
    ap.add_argument("--top", type=int, default=TOP, help=f"the search's --top (default {TOP})")
    ap.add_argument("--retry-plans", type=int, default=RETRY_PLANS,
                    help="search again with this budget where the first budget left a faster recipe unmatched "
                         f"(default {RETRY_PLANS}; 0, or a budget not above --max-plans: no retry)")
    ap.add_argument("--runs", default=None, metavar="IDS", help="comma-separated run ids (default: every run)")
    ap.add_argument("--no-modelzoo", action="store_true", help="skip the ModelZoo rank agreement")
    args = ap.parse_args(argv)
    if args.max_plans < 1 or args.top < 1 or args.retry_plans < 0:
        ap.error(f"--max-plans = {args.max_plans}, --top = {args.top}, --retry-plans = {args.retry_plans}; allowed: "
                 "integers >= 1 (--retry-plans >= 0)")
    runs, _ = load_runs([data_dir() / "published" / f for f in DEFAULT_FILES])
    if args.runs:
        want = args.runs.split(",")
        unknown = [w for w in want if w not in {r["id"] for r in runs}]
        if unknown:
            ap.error(f"--runs: unknown id {unknown[0]!r}; allowed: ids of data/published")
        runs = [r for r in runs if r["id"] in want]
    out = sys.stderr if args.json == "-" else sys.stdout
    load0, t0 = os.getloadavg(), time.process_time()
    rows = []
    for run in runs:
        rows.append(check_run(run, args.max_plans, args.top, args.retry_plans))
        r = rows[-1]
        roomy = r["recipe_iteration_no_memory_limit_s"]
        recipe = (f"recipe {_fmt(r['recipe_iteration_s'])} s (rank {_fmt(r['recipe_rank'], 'd')})" if r["recipe_fits"]
                  else "recipe over our memory model" + (f" ({roomy:.2f} s without the memory limit)"
                                                          if roomy is not None else ""))
        print(f"{r['id']}: {recipe}, best {_fmt(r['best_iteration_s'])} s; {r['evaluated']} planned (batches of 8 "
              f"up to --max-plans {r['max_plans']}); CPU {r['cpu_s']:.1f} s", file=out)
    print_table(rows, out)
    doc = {"max_plans": args.max_plans, "top": args.top, "retry_plans": args.retry_plans, "rows": rows,
           "runs": len(rows), "best_at_least_as_fast": sum(r["best_at_least_as_fast"] for r in rows),
           "best_at_least_as_fast_no_memory_limit": sum(r["best_at_least_as_fast_no_memory_limit"] for r in rows),
           "recipes_over_memory": sum(not r["recipe_fits"] for r in rows)}
    if not args.no_modelzoo:
        mz = modelzoo_agreement()
        a = mz["agreement"]
        print(f"ModelZoo rank agreement over {a['layouts']}: {a['agree']} of {a['pairs']} pairs (ties within 5% "
              f"agree with any order), Kendall tau-b {a['kendall_tau_b']:.2f}; CPU {mz['cpu_s']:.1f} s", file=out)
        doc["modelzoo"] = mz
    doc["cpu_s"] = time.process_time() - t0
    doc["load_average"] = {"before": load0, "after": os.getloadavg()}
    doc["best_megatron_at_least_as_fast"] = sum(
        r["best_megatron_iteration_s"] is not None and r["recipe_iteration_s"] is not None and r["recipe_fits"]
        and r["best_megatron_iteration_s"] <= r["recipe_iteration_s"] * (1 + 1e-9) for r in rows)
    print(f"{doc['best_at_least_as_fast']} of {len(rows)} runs: the search's best is at least as fast as the recipe's "
          f"layout ({doc['best_megatron_at_least_as_fast']} with a schedule Megatron-Core runs); "
          f"{doc['best_at_least_as_fast_no_memory_limit']} of {len(rows)} when each recipe layout our memory model "
          f"refuses ({doc['recipes_over_memory']} of them; the runs exist) is counted at its time without the memory "
          "limit; CPU "
          f"{doc['cpu_s']:.1f} s in all (--max-plans {args.max_plans}, --retry-plans {args.retry_plans}, --top "
          f"{args.top}); load average "
          f"{load0[0]:.1f} -> {doc['load_average']['after'][0]:.1f}", file=out)
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=1, default=str)
        print()
    elif args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
