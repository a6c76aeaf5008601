"""Predicted vs published training time for public runs: the cost model judged on runs it was not fitted on.

Plans every run of the runs files in ``data/published`` (:data:`tessera_lab.report.fidelity_set.DEFAULT_FILES`:
NVIDIA Megatron-Bridge performance pages, the Megatron-MoE-ModelZoo best-practice tables, model technical reports;
schema in docs/file-schemas.md) with the analytic cost model at the run's own layout, and prints the published
against the predicted iteration time, ``error = published / predicted - 1`` (= predicted throughput / published -
1), each with its source, source family and split. The published time is the source's step time, else its global
batch tokens over its tokens/s per GPU x GPUs, else the model FLOPs over its Model TFLOP/s per GPU x GPUs
(:func:`tessera_lab.report.fidelity_set.published_iteration_s`).

Split: ``split: fit | test`` is written into the data before any fitting, by the rule of
:func:`tessera_lab.report.fidelity_set.split_for_run` (ModelZoo runs test; otherwise SHA-256 parity of the id); a
file whose split disagrees is refused. The headline (``HEADLINE`` line, ``summary.test_median_abs_error`` and
``test_max_abs_error``) is the test set's; target: median <= 15%, no test run beyond 35%; a miss stays printed.

Host/synchronisation term (:mod:`tessera_lab.cost.sync`, basis cited there): ``c`` seconds per MoE layer forward
and micro-batch, one value per syncing dispatcher (``alltoall``, ``deepep``), which the planner itself applies (to every
forward run apart; hidden in the forwards the combined-1F1B EP overlap pairs with a backward). The fit plans every run with the planner's term off (``host_sync_s = 0``) and
takes, per dispatcher, the median over the fit set's runs the term applies to (EP > 1, that dispatcher, no EP
overlap) of the per-layer seconds that close each run's gap (published - planned iteration over the busiest rank's
MoE layers x ``(m + (pp - 1) / vpp)``); then every run is planned again by the planner with its dispatcher's
``host_sync_s = c`` (:func:`apply_sync_term`; the bench adds nothing itself). ``--runs FILE`` and ``--split
test`` use the shipped values (no refit). The error with the term off is printed beside.

Layout mapping (stated per run): Megatron's data-parallel size ``DP = GPUs / (TP * CP * PP)``; our non-expert
data-parallel group is ``ParallelConfig.dense_dp``. Where ``EP <= DP``: ``ep = EP``, ``dp = DP / EP`` (EP inside
DP). Where Megatron spreads EP over TP x DP ranks (``EP > DP``, Megatron-Core's expert grid with expert TP 1,
``EP * EDP = TP * DP``, ``megatron/core/parallel_state.py``): ``ep_spans_tp`` with ``tp = TP``, ``ep = EP`` and
``dp = TP * DP / EP`` expert replicas, so the dense part keeps its TP (sequence parallel) and its DP, and each TP
rank routes ``T / TP`` tokens. The EP group sits on ``ep`` consecutive ranks (``ep_placement = contiguous``:
Megatron-Core's ``expert_decoder_rank_generator``, order ``tp-cp-ep-dp-pp``), so with TP 2 an EP 64 group spans
8 nodes, not 16. With CP the world is TP x CP x PP x DP and the EP groups take CP ranks as Megatron-Core's expert
grid does (``ParallelConfig.cp``); an EP larger than TP x DP (Megatron's grid would fill it with CP ranks) is not
expressible and the run is refused. Micro-batches per pipeline ``m = GBS / (MBS * DP)``. Schedule: ``1f1b``; with VP,
Megatron's interleaved 1F1B (``--vpp VP``); with the recipe's EP overlap (``overlap_moe_expert_parallel_comm``) the
combined 1F1B, ``overlapped`` without VP and ``interleaved-overlapped`` with it (Megatron requires VP for the EP overlap
when PP > 1, ``megatron/core/transformer/transformer_config.py``; one more warm-up micro-batch,
``get_pp_rank_microbatches`` in ``megatron/core/pipeline_parallel/schedules.py``). Sequence parallelism on with
TP > 1, as the recipes set it; per-run recipe fields from ``data/published``: ``recompute_modules`` (Megatron's
names), ``adam_moment_dtype`` (DeepSeek-V3's precision-aware optimizer keeps bf16 moments), ``fsdp`` (Megatron FSDP
with ``optim_grads_params`` sharding, ``ParallelConfig.fsdp``: its memory and its per-layer gathers and
reduce-scatters are planned as ``plan --fsdp`` plans them).

Pipeline split: the recipe's (``pipeline_split`` in ``data/published``, :func:`split_for`): Megatron's even
split, ``account_for_embedding/loss_in_pipeline_split`` (Qwen3-235B-A22B) or DeepSeek-V3's explicit layouts
(``Et|(tt|)*30mL``), passed to the planner as ``boundaries``.

MTP: a recipe's MTP layers (``mtp_num_layers``: DeepSeek-V3's recipes, Qwen3-Next's ModelZoo run) are planned as
``plan --mtp`` plans them (:func:`model_for`): after the decoder layers, on the last virtual stage (:func:`split_for`),
time and memory. Weights stay at 2 bytes under FP8 (assumption: the recipes' ``fp8_param_gather`` keeps FP8 primary weights, whose
row-wise and column-wise (transposed) FP8 copies take the 2 bytes of the bf16 weight; not checked line by line
against Transformer Engine).

Expert GEMMs: ``grouped_gemm = multistream`` (the recipes' ``moe_grouped_gemm`` with Transformer Engine runs
TEGroupedMLP, whose GroupedLinear launches one cuBLAS GEMM per expert on 4 streams; :mod:`tessera_lab.cost.gemm`).

Partition: the recipe's own, Megatron's even split of the layers over the stages (``method = uniform``), not the
planner's choice: a memory-driven uneven split (stage 0 holding ``p`` micro-batches in flight gets fewer layers)
makes the last stages the bottleneck of a layout the recipe does not use. Where our memory model does not fit that
split, the time is priced without the memory limit (the run exists) and the row's ``fits`` column says ``NO``.
Rows marked ``reference_only`` (split ``reference``) are printed but in neither set. Tokens are balanced (``expert_load = 1``) as
the pages state.

Table: one row per run (units in the headers: Model TFLOP/s per GPU, tokens/s per GPU, GiB per GPU), precision as
the source states it (the B200 rows' MXFP8, ``source_precision``, is planned as FP8: ``mxfp8 (planned as fp8)``),
peak and capacity GiB with a ``fits`` column; sources and mapping notes below it. ``--breakdown``: one MoE layer's
standalone F + B + W (before overlap) beside the plan's per-layer time (after overlap) and the published per-layer
budget, and the gap budget - standalone sum the README quotes (:func:`breakdown`); then, per run, the component
classes of the mean decoder layer (expert GEMMs, dense GEMMs, attention core, memory-bound kernels, FP8 casts,
host-bound issue, EP all-to-all, TP collectives: :func:`layer_components`) beside the time per layer the plan
without the host/sync term leaves unexplained and its ratio to the modelled compute (:func:`components_table`).
``--markdown``: only the per-run Markdown table of docs/reproduce.md (:func:`markdown_table`) on stdout, the report
on stderr; ``python scripts/claims.py regen`` writes the same table into that page, and the figures its reading
quotes come from :func:`reading_figures` on the same rows.

Run: python benchmarks/bench_public_runs.py [--json PATH|-] [--markdown] [--runs FILE] [--split fit|test]
[--breakdown]   (analytic; about 10 s of CPU for the 32 shipped runs)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tessera_lab.report.fidelity_set import DEFAULT_FILES  # noqa: E402


def parallel_for(run: dict, host_sync_s: float | None = 0.0):
    """The ParallelConfig and the mapping notes of a published run (mapping in the module docstring);
    ``host_sync_s``: the planner's host/sync seconds per MoE layer (:mod:`tessera_lab.cost.sync`; 0 = off, the
    fit's setting; ``None`` = the shipped fitted value).

    Raises:
        ConfigError: GPUs not a multiple of TP x CP x PP, a global batch not of whole micro-batches, or an EP no
            layout of :class:`~tessera_lab.model.hardware.ParallelConfig` expresses (one line naming the field)."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.hardware import ParallelConfig

    tp, pp, vp, cp = run["tp"], run["pp"], run["vp"] or 1, run.get("cp") or 1
    rid = run.get("id")
    if run["gpus"] % (tp * cp * pp):
        raise ConfigError(f"run {rid}: field 'gpus' = {run['gpus']} is not a multiple of tp x cp x pp = "
                          f"{tp * cp * pp}; allowed: Megatron's GPUs = TP x CP x PP x DP")
    dp_megatron = run["gpus"] // (tp * cp * pp)  # Megatron's data-parallel size: GPUs / (TP x CP x PP)
    if run["gbs"] % (run["mbs"] * dp_megatron):
        raise ConfigError(f"run {rid}: field 'gbs' = {run['gbs']} is not a multiple of mbs x DP = {run['mbs']} x "
                          f"{dp_megatron}; allowed: a global batch of whole micro-batches on every data-parallel rank")
    notes = []
    spans = run["ep"] > dp_megatron  # Megatron spreads EP over TP x DP (expert TP 1)
    ep = run["ep"]
    if not spans and dp_megatron % ep:
        raise ConfigError(f"run {rid}: field 'ep' = {ep} does not divide Megatron's DP = {dp_megatron}; allowed: an EP "
                          "dividing the data-parallel ranks, or one larger than them that spans whole TP groups")
    if spans:
        if (tp * dp_megatron) % ep or ep % tp:
            raise ConfigError(f"run {rid}: field 'ep' = {ep} over TP {tp} x DP {dp_megatron} (CP {cp}) is not "
                              "expressible; allowed: EP dividing DP, or a multiple of TP dividing TP x DP (CP "
                              "multiplies the world; Megatron's grid would fill a larger EP with CP ranks)")
        dp = tp * dp_megatron // ep  # expert data-parallel replicas (of one CP slice)
    else:
        dp = dp_megatron // ep
    if cp > 1:
        notes.append(f"CP {cp}: each sequence split over {cp} ranks (Megatron DP = {run['gpus']} / (TP {tp} x CP "
                     f"{cp} x PP {pp}) = {dp_megatron})" + ("; the EP groups take CP ranks as Megatron-Core's expert "
                                                            "grid does (docs/context-parallel.md)" if ep > 1 else ""))
    m = run["gbs"] // (run["mbs"] * dp_megatron)
    if vp > 1:  # Megatron's interleaved 1F1B; with the EP overlap its combined-1F1B variant (one more warm-up)
        schedule = "interleaved-overlapped" if run.get("ep_overlap") else "interleaved"
    else:  # Megatron refuses the EP overlap with PP > 1 and no VP (transformer_config.py)
        schedule = "overlapped" if run.get("ep_overlap") else "1f1b"
    schedule = run.get("schedule") or schedule  # a run whose source names its schedule (DualPipe: dualpipev)
    par = ParallelConfig(pp=pp, vpp=vp, tp=tp, ep=ep, dp=dp, cp=cp, microbatches=m, ep_spans_tp=spans,
                         micro_batch_size=run["mbs"], seq_len=run["seq_len"], schedule=schedule,
                         precision=run["precision"], dispatcher=run["dispatcher"], recompute=run["recompute"],
                         recompute_modules=tuple(run.get("recompute_modules", ())),
                         adam_moment_dtype=run.get("adam_moment_dtype", "fp32"),
                         sequence_parallel=tp > 1,  # the recipes set sequence_parallel = True with TP > 1
                         grad_reduce_dtype=run.get("grad_reduce_dtype", "fp32"),
                         # balanced unless the run says otherwise (null: our routing model's busiest rank)
                         expert_load=run.get("expert_load", 1.0),
                         fused_cross_entropy=True,  # _benchmark_common: cross_entropy_fusion_impl = "te"
                         ep_placement="contiguous",  # Megatron-Core's expert grid: EP on consecutive ranks (ETP 1)
                         host_sync_s=host_sync_s,
                         fsdp=bool(run.get("fsdp", False)),  # Megatron FSDP (optim_grads_params) where the run used it
                         grouped_gemm="multistream")  # TEGroupedMLP -> TE GroupedLinear: per-expert cuBLAS, 4 streams
    if spans:
        notes.insert(0, f"EP {ep} spans {par.ep_span_text()} (Megatron-Core's expert grid, expert TP 1; Megatron DP "
                        f"{dp_megatron}): planned with ep_spans_tp (dense TP {tp} with sequence parallelism, DP "
                        f"{dp_megatron}; experts EP {ep})")
    if tp > 1 and ep > 1 and not spans:
        notes.append(f"EP {ep} on {ep} consecutive ranks (Megatron-Core's expert rank generator, expert TP 1): "
                     f"{-(-ep // 8)} node(s), not the {-(-ep * tp // 8)} a TP-strided EP group would span")
    if vp > 1:
        notes.append(f"VP {vp}: {schedule} over {pp * vp} virtual stages")
    return par, notes


def split_for(run: dict, num_layers: int, mtp_layers: int = 0) -> list[int] | None:
    """Layer boundaries of the recipe's pipeline split over its ``pp * vp`` virtual stages, or ``None`` for
    Megatron's even split. ``account_for_embedding_and_loss``: Megatron-Core's ``get_num_layers_to_build``
    (:func:`tessera_lab.plan.stages.accounted_boundaries`, as ``plan --account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split``); a list: decoder layers per virtual stage (an explicit layout).
    ``mtp_layers`` (the recipe's ``mtp_num_layers``, planned after the ``num_layers`` decoder layers): on the last
    virtual stage, where Megatron-Core builds them without a custom layout (``mtp_on_this_rank``,
    ``megatron/core/transformer/multi_token_prediction.py``) and DeepSeek-V3's layouts put them (``...mL``); the
    even split is then the planner's even split of the decoder layers (``uniform_boundaries``: Megatron's where
    ``pp * vp`` divides them), so never ``None``.

    Raises:
        ConfigError: a split that is neither, or one that does not place ``num_layers`` on ``pp * vp`` stages."""
    from tessera_lab.plan.problem import uniform_boundaries
    from tessera_lab.plan.stages import accounted_boundaries

    split = run.get("pipeline_split")
    stages = run["pp"] * (run["vp"] or 1)
    if split is None and not mtp_layers:
        return None
    if split is None or split == "account_for_embedding_and_loss":
        bounds = (uniform_boundaries(num_layers, stages) if split is None
                  else accounted_boundaries(num_layers, stages, embedding=True, loss=True))
        return list(bounds[:-1]) + [bounds[-1] + mtp_layers]
    from tessera_lab.errors import ConfigError

    counts = list(split) if isinstance(split, list) else []
    if (len(counts) != stages or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts)
            or sum(counts) != num_layers):
        raise ConfigError(f"run {run.get('id')}: field 'pipeline_split' = {split} does not place {num_layers} layers "
                          f"on {stages} virtual stages; allowed: 'account_for_embedding_and_loss' or {stages} layer "
                          f"counts summing to {num_layers}")
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    bounds[-1] += mtp_layers
    return bounds


def model_for(run: dict):
    """The run's model with the MTP layers its recipe trains planned (``mtp_num_layers``: after the decoder
    layers, on the last stage, as ``plan --mtp``), else without them.

    Raises:
        ConfigError: ``mtp_num_layers`` not an integer >= 0, or not the number of MTP layers the model's config
            declares."""
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.spec import load_model

    n = run.get("mtp_num_layers") or 0
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"run {run.get('id')}: field 'mtp_num_layers' = {n!r}; allowed: an integer >= 0")
    model = load_model(run["model"], plan_mtp=n > 0)
    declared = len(model.stack.mtp_layers)
    if n and n != declared:
        raise ConfigError(f"run {run.get('id')}: field 'mtp_num_layers' = {n}; allowed: "
                          + (f"0 or {declared} (the MTP layers {run['model']}'s config declares)" if declared
                             else f"0 ({run['model']}'s config declares no MTP layers)"))
    return model


def planned_mtp(model) -> int:
    """MTP layers a model from :func:`model_for` plans (0 where its recipe trains none)."""
    return len(model.stack.mtp_layers) if model.stack.plan_mtp else 0


def run_split(run: dict, model) -> list[int] | None:
    """:func:`split_for` of a model from :func:`model_for` (its MTP layers on the last virtual stage)."""
    return split_for(run, model.num_layers - planned_mtp(model), planned_mtp(model))


def without_memory_limit(cluster):
    """``cluster`` with GPUs of 1 PiB: a published run our memory model refuses is priced at its own layout (the run
    exists, so the gap is the memory model's); everything but the capacity as ``cluster`` has it."""
    import dataclasses

    return dataclasses.replace(cluster, gpu=dataclasses.replace(cluster.gpu, memory_bytes=float(2**50)))


def predict(run: dict, host_sync_s: float | None = 0.0) -> dict:
    """Plan a published run with the planner (its recipe's split, ``method = uniform``) and compare with the
    page: one row. ``host_sync_s``: the planner's host/sync term per MoE layer (0: off, as the fit plans)."""
    from tessera_lab.cost.memory import memory_capacity
    from tessera_lab.errors import InfeasiblePlanError
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.plan.make import make_plan

    par, notes = parallel_for(run, host_sync_s)
    model = model_for(run)
    cluster = cluster_for(par, run["gpu"])
    capacity = memory_capacity(cluster)
    t0 = time.perf_counter()
    bounds = run_split(run, model)
    if bounds is not None:
        split, mtp = run.get("pipeline_split"), planned_mtp(model)
        counts = [b - a for a, b in zip(bounds, bounds[1:])]
        counts[-1] -= mtp
        where = ("the layout's 'm' before 'L'" if isinstance(split, list) else
                 "Megatron-Core's mtp_on_this_rank without a custom layout"
                 if run["source_family"].startswith("megatron") else "where the run's source puts it, its recipe says")
        notes.append(f"the recipe's split: {split if isinstance(split, str) else 'layout' if split else 'even split'} "
                     f"-> decoder layers per virtual stage {counts}"
                     + (f", and {mtp} MTP layer after them on the last virtual stage, with the output head ({where}; "
                        "planned as plan --mtp: eh_proj, a decoder layer, the shared head and a second loss)"
                        if mtp else ""))
    try:  # the recipe's layer split (Megatron's even split unless the recipe sets one)
        plan = make_plan(model, par, cluster=cluster, method="uniform", baselines=(),
                         boundaries=bounds)
    except InfeasiblePlanError as exc:
        # the run exists, so price its time at its own layout; the memory gap is the memory model's, its "fits" column says NO
        notes.append(f"our memory model does not fit the recipe's even split ({exc}); time priced without the "
                     "memory limit")
        plan = make_plan(model, par, cluster=without_memory_limit(cluster), method="uniform",
                         baselines=(), boundaries=bounds)
    ev = plan.chosen
    # per GPU: a rank holds every chunk of its virtual stages (the partition's rank memory), else one stage each
    rank_mem = list(ev.partition.rank_memory) or [st.memory_bytes for st in ev.stages]
    tflops = plan.model_flops / (ev.iteration_time_s * par.world_size) / 1e12
    moe_per_rank = [0] * par.pp
    b = ev.partition.boundaries
    for v in range(len(b) - 1):  # Megatron's interleaving: virtual stage v on rank v % pp
        moe_per_rank[v % par.pp] += sum(1 for i in range(b[v], b[v + 1]) if model.stack.layers[i].ffn == "moe")
    from tessera_lab.cost.sync import host_waits_per_layer, per_layer_needed_s, planner_per_layer_s
    from tessera_lab.report.fidelity_set import published_iteration_s

    published_s, basis = published_iteration_s(run, plan.model_flops)
    published_tflops = plan.model_flops / (published_s * par.world_size) / 1e12
    published_tokens = run["gbs"] * run["seq_len"] / (published_s * run["gpus"])

    return {
        "host_sync_per_layer_s": planner_per_layer_s(par, model=model),
        "host_waits_per_layer": host_waits_per_layer(par, model),
        "moe_layers_per_rank": moe_per_rank, "iteration_published_s": published_s,
        "sync_needed_per_layer_s": per_layer_needed_s(published_s, ev.iteration_time_s, moe_per_rank,
                                                      par.microbatches, par.pp, par.vpp),
        "id": run["id"], "source_family": run["source_family"], "split": run["split"],
        "published": {"iteration_s": published_s, "basis": basis},
        "predicted": {"iteration_s": ev.iteration_time_s},
        "precision_label": precision_label(run), "tflops_per_gpu_at_published_time": published_tflops,  # computed
        "source_tflops_per_gpu": run.get("model_tflops_per_gpu"),
        "predicted_tflops_per_gpu": tflops, "error": published_s / ev.iteration_time_s - 1.0,
        "predicted_mfu_bf16_peak": ev.mfu, "iteration_time_s": ev.iteration_time_s,
        "fits_memory": max(rank_mem) <= capacity,
        "peak_memory_gib": max(rank_mem) / 2**30,
        "capacity_gib": capacity / 2**30,
        "parallel": {k: getattr(par, k) for k in ("pp", "vpp", "tp", "ep", "dp", "microbatches", "schedule",
                                                  "precision", "dispatcher", "recompute", "ep_spans_tp",
                                                  "recompute_modules", "adam_moment_dtype", "fsdp")},
        "mapping_notes": notes + ([run["recipe"]] if run.get("recipe") else []),
        "reference_only": run["split"] == "reference",
        "source": (f"Megatron-Bridge {run['container']}: " if run.get("container") else "") + run["source"],
        "plan_s": time.perf_counter() - t0,
        "tokens_per_s_per_gpu_at_published_time": published_tokens,
        "predicted_tokens_per_s_per_gpu": ev.tokens_per_s / par.world_size,
    }


def fit_ids_of(rows: list[dict]) -> list[str]:
    """The fit set: the runs whose data file says ``split: fit`` (written before any fitting by the rule of
    :func:`tessera_lab.report.fidelity_set.split_for_run`), in id order."""
    return sorted(r["id"] for r in rows if r["split"] == "fit")


def apply_sync_term(rows: list[dict], runs: dict[str, dict], c: dict[str, float] | None = None) -> dict:
    """Fit the per-MoE-layer host/sync seconds ``c`` per dispatcher (:mod:`tessera_lab.cost.sync`) on the fit set's
    runs whose every forward carries the planner's term (MoE layers, EP > 1, a dispatcher that waits on host counts,
    no EP overlap: :func:`~tessera_lab.cost.sync.fully_exposed`), from ``rows`` planned with the planner's term off (``predict(run, 0)``: the fit never sees its own
    term): per dispatcher, the median of the runs' :func:`~tessera_lab.cost.sync.per_layer_needed_s`. With ``c``
    given (dispatcher -> seconds), use it as it is (no fit: ``--runs FILE``). Then re-plan every run whose layout
    the rule gives a non-zero term through the planner with its dispatcher's ``c`` (``ParallelConfig.host_sync_s``);
    a run it gives 0 keeps its row. Rows are updated in place and keep the error without the term as
    ``error_without_sync``; ``sync_s_per_iteration`` is the planner's simulated iteration with the term minus
    without. ``runs``: id -> published run. Returns the fit (``per_layer_s``: dispatcher -> seconds).

    Raises:
        ValueError: a row planned with the term on (the fit would be circular).
    """
    from tessera_lab.cost.sync import BASIS, SYNC_DISPATCHERS, fit_per_layer_s, fully_exposed, planner_per_layer_s
    from tessera_lab.model.spec import load_model

    if any(r.get("host_sync_per_layer_s", 0.0) for r in rows):
        raise ValueError("apply_sync_term fits on rows planned with the host/sync term off (predict(run, 0.0))")
    fit_ids = fit_ids_of(rows)
    by = {r["id"]: r for r in rows}
    used = [by[i] for i in fit_ids if fully_exposed(parallel_for(runs[i], 1.0)[0], load_model(runs[i]["model"]))]
    fitted = c is None
    if fitted:  # per dispatcher, the median per-layer gap over its fit runs (the estimator fixed on the fit set)
        c = {d: fit_per_layer_s([r["sync_needed_per_layer_s"] / r["host_waits_per_layer"] for r in used
                                 if r["parallel"]["dispatcher"] == d]) for d in SYNC_DISPATCHERS}
    for r in rows:
        off = {"error_without_sync": r["error"], "iteration_without_sync_s": r["iteration_time_s"],
               "sync_needed_per_layer_s": r["sync_needed_per_layer_s"]}
        run = runs[r["id"]]
        c_run = c.get(run["dispatcher"], 0.0)
        if planner_per_layer_s(parallel_for(run, c_run)[0], model=load_model(run["model"])) > 0:
            plan_s = r["plan_s"]
            r.update(predict(run, c_run))  # the planner's own term: no addition here
            r["plan_s"] += plan_s
        r.update(off)
        r["sync_s_per_iteration"] = r["iteration_time_s"] - r["iteration_without_sync_s"]
    if not fitted:  # the shipped values: their own fit set (cost/sync.py FIT_SET), not this file's fit rows
        from tessera_lab.cost.sync import FIT_SET

        fit_ids = sorted(i for ids in FIT_SET.values() for i in ids)
    return {"per_layer_s": dict(c), "fitted_here": fitted, "fit_ids": fit_ids,
            "fit_runs_used": {d: sorted(r["id"] for r in used if r["parallel"]["dispatcher"] == d) for d in c}
            if fitted else {}, "basis": BASIS}


def precision_label(run: dict) -> str:
    """The run's precision as its source states it, and what the plan uses where that differs: ``"fp8"`` or
    ``"mxfp8 (planned as fp8)"`` (``source_precision`` in ``data/published``: the B200 rows' MXFP8 recipes are
    priced with the FP8 cost model, the recipe field says under which assumption)."""
    src = run.get("source_precision") or run["precision"]
    return src if src == run["precision"] else f"{src} (planned as {run['precision']})"


def breakdown(run: dict, predicted_tokens_per_s_per_gpu: float | None = None) -> dict:
    """Where the predicted time of one MoE decoder layer goes (one micro-batch, one rank), in seconds.

    ``phase_s`` / ``standalone_layer_s``: F, B and W of the layer's tasks each priced alone and summed, *before*
    overlap (the plan hides part of dispatch/combine behind compute; bubble, optimizer and DP sync are not in it).
    ``tasks``: per task, GPU (or link) seconds, the host-bound excess (eager kernel issue beyond the GPU time,
    :mod:`tessera_lab.cost.host`) and the kernels it issues (``None`` for communication tasks).
    ``published_layer_budget_s``: the published tokens/s per GPU turned into seconds per micro-batch and layer,
    ``tokens per micro-batch / (tokens/s per GPU * tp * layers)`` (= iteration time ``* pp / (micro-batches *
    layers)``: a stage runs every micro-batch through ``layers / pp`` layers), bubble, optimizer and exposed DP
    included. ``plan_layer_time_s`` (with ``predicted_tokens_per_s_per_gpu``): the same formula on the plan's
    predicted tokens/s, i.e. the plan's per-layer time after overlap. ``gap_vs_standalone_s`` = budget -
    standalone sum (the README's "missing per layer and micro-batch"); ``gap_vs_plan_s`` = budget - plan."""
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.cost.host import task_kernels
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.model.spec import load_model
    from tessera_lab.model.tasks import layer_tasks

    par, _ = parallel_for(run)
    model = load_model(run["model"])
    cm = CostModel(cluster_for(par, run["gpu"]), par)
    layer = next((ly.index for ly in model.stack.layers if ly.ffn == "moe"), 0)
    lt = layer_tasks(model, layer, par)
    tasks: dict[str, dict] = {}
    for ph in "FBW":
        for t in lt.phase(ph):
            row = tasks.setdefault(t.name, {"gpu_s": 0.0, "host_excess_s": 0.0,
                                            "kernels": None if t.is_comm else 0.0, "is_comm": t.is_comm})
            row["gpu_s"] += cm.task_time(t) if t.is_comm else cm.gpu_time(t)
            row["host_excess_s"] += cm.host_excess(t)
            if not t.is_comm:
                row["kernels"] += task_kernels(t, precision=par.precision, grouped_impl=par.grouped_gemm, params=cm.a,
                                              microbatches=par.microbatches)
    phases = {ph: cm.phase_cost(lt.phase(ph)).time for ph in "FBW"}
    # component classes averaged over every decoder layer (the budget per layer is an average over all layers;
    # GPT-OSS alternates sliding-window and full attention, DeepSeek-V3 starts with dense layers)
    per = [layer_components(cm, [t for ph in "FBW" for t in layer_tasks(model, i, par).phase(ph)])
           for i in range(model.num_layers)]
    components = {k: sum(c[k] for c in per) / len(per) for k in COMPONENTS}

    def per_layer(tokens_per_s_per_gpu: float) -> float:
        return par.tokens_per_microbatch / (tokens_per_s_per_gpu * par.tp * model.num_layers)

    standalone = sum(phases.values())
    budget = per_layer(run["tokens_per_s_per_gpu"])
    out = {"id": run["id"], "layer": layer, "tasks": tasks, "phase_s": phases, "published_layer_budget_s": budget,
           "standalone_layer_s": standalone, "gap_vs_standalone_s": budget - standalone,
           "tokens_per_s_per_gpu_at_published_time": run["tokens_per_s_per_gpu"],
           "components_s": components,  # mean over the decoder layers (layer_components)
           "experts_host_bound": tasks.get("experts", {}).get("host_excess_s", 0.0) > 0,
           "reference_only": bool(run.get("reference_only"))}
    if predicted_tokens_per_s_per_gpu:
        plan_layer = per_layer(predicted_tokens_per_s_per_gpu)
        out.update(plan_layer_time_s=plan_layer, gap_vs_plan_s=budget - plan_layer,
                   predicted_tokens_per_s_per_gpu=predicted_tokens_per_s_per_gpu)
    return out


#: component classes of one layer's time (:func:`component_of`), in print order
COMPONENTS = ("expert GEMMs", "dense GEMMs", "attention core", "memory-bound kernels", "FP8 casts",
              "host-bound issue", "EP all-to-all", "TP collectives", "other communication")


def component_of(task) -> str:
    """The component class of one task (its GPU time without FP8 casts): by ``Task.op`` (``grouped_gemm`` ->
    expert GEMMs; ``gemm`` and ``router`` -> dense GEMMs; ``attention`` / ``linear_attention`` -> attention core;
    any other compute op -> memory-bound kernels) and, for communication, by the collective's group (``ep`` -> EP
    all-to-all, ``tp`` -> TP collectives)."""
    if task.is_comm:
        return {"ep": "EP all-to-all", "tp": "TP collectives"}.get(task.collective.group, "other communication")
    return {"grouped_gemm": "expert GEMMs", "gemm": "dense GEMMs", "router": "dense GEMMs",
            "attention": "attention core", "linear_attention": "attention core"}.get(task.op, "memory-bound kernels")


def layer_components(cm, tasks) -> dict[str, float]:
    """Seconds of one layer's ``tasks`` (F, B and W, one micro-batch, each priced alone) per component class
    (:data:`COMPONENTS`): a compute task's GPU time minus its FP8 quantization (``FP8 casts``, the ``cast`` term
    of :meth:`~tessera_lab.cost.analytic.CostModel.gpu_terms`) goes to its class, the host's issue time beyond the
    GPU time to ``host-bound issue``; a communication task's link time to its class. The sum is the breakdown's
    per-task GPU/link + host-bound sum (before overlap)."""
    out = dict.fromkeys(COMPONENTS, 0.0)
    for t in tasks:
        if t.is_comm:
            out[component_of(t)] += cm.task_time(t)
            continue
        cast = cm.gpu_terms(t)["cast"]
        out[component_of(t)] += cm.gpu_time(t) - cast
        out["FP8 casts"] += cast
        out["host-bound issue"] += cm.host_excess(t)
    return out


def needed_and_compute(row: dict, b: dict) -> tuple[float, float]:
    """``(needed, compute)`` seconds per layer and micro-batch of one run: the time the plan without the host/sync
    term leaves unexplained, ``budget x (1 - predicted iteration without the term / published iteration)`` (the
    per-layer formula of :func:`breakdown` is proportional to the iteration time), and the modelled compute of the
    mean decoder layer (every class of :func:`layer_components` but communication). ``row``: :func:`predict`'s row
    (``iteration_without_sync_s`` once :func:`apply_sync_term` ran, else its term-off ``iteration_time_s``);
    ``b``: :func:`breakdown` of the same run."""
    off = row.get("iteration_without_sync_s", row["iteration_time_s"])
    needed = b["published_layer_budget_s"] * (1.0 - off / row["published"]["iteration_s"])
    comm = ("EP all-to-all", "TP collectives", "other communication")
    return needed, sum(v for k, v in b["components_s"].items() if k not in comm)


def components_table(rows: list[dict], breakdowns: list[dict]) -> str:
    """Per run, the component classes of the mean decoder layer (ms per layer and micro-batch, before overlap)
    beside the time
    the plan without the host/sync term leaves unexplained per layer: ``needed = budget x (1 - predicted
    iteration without the term / published iteration)`` (the per-layer formula of :func:`breakdown` is
    proportional to the iteration time), and that as a multiple of the run's modelled compute (all classes but
    communication)."""
    import tabulate as tabulate_mod

    body = []
    for r, b in zip(rows, breakdowns):
        c = b["components_s"]
        needed, compute = needed_and_compute(r, b)
        body.append([r["id"], r["split"], r["parallel"]["dispatcher"], r["parallel"]["schedule"]]
                    + [f"{c[k] * 1e3:.2f}" for k in COMPONENTS] + [f"{needed * 1e3:+.2f}", f"{needed / compute:+.2f}"])
    heads = ["run", "split", "dispatcher", "schedule"] + list(COMPONENTS) + ["needed\nper layer", "needed /\ncompute"]
    return tabulate_mod.tabulate(body, headers=heads, tablefmt="simple", disable_numparse=True)


BREAKDOWN_HEAD = """\
where the time goes: one MoE decoder layer, one micro-batch, one rank (analytic; ms)
  standalone sum    F + B + W of the layer's tasks, each priced alone: BEFORE overlap (the plan hides part of
                    dispatch/combine behind compute); no bubble, optimizer or DP sync
  plan per layer    the plan's time per layer and micro-batch AFTER overlap, bubble etc. included:
                    tokens per micro-batch / (predicted tokens/s per GPU x tp x layers)
  published budget  the same formula on the published tokens/s per GPU (= published iteration time x pp /
                    (micro-batches x layers))
  gap               published budget - standalone sum (the README's "missing per layer and micro-batch");
                    budget - plan beside it
  per task: GPU (link for communication) ms summed over F, B, W; host-bound = eager kernel issue beyond the GPU
  time (tessera_lab/cost/host.py); kernels issued (communication tasks: n/a)"""


def print_breakdown(b: dict, out=sys.stdout) -> None:
    ph, ms = b["phase_s"], 1e3

    def emit(line: str) -> None:
        print(line, file=out)


    tag = " (reference only)" if b.get("reference_only") else ""
    emit(f"{b['id']}{tag}: MoE layer {b['layer']}")
    emit(f"  standalone sum (before overlap) {b['standalone_layer_s'] * ms:8.2f} ms  = F {ph['F'] * ms:.2f} + "
          f"B {ph['B'] * ms:.2f} + W {ph['W'] * ms:.2f}")
    if "plan_layer_time_s" in b:
        emit(f"  plan per layer (after overlap)  {b['plan_layer_time_s'] * ms:8.2f} ms  (predicted "
              f"{b['predicted_tokens_per_s_per_gpu']:.0f} tokens/s per GPU)")
    emit(f"  published budget per layer      {b['published_layer_budget_s'] * ms:8.2f} ms  (published "
          f"{b['tokens_per_s_per_gpu_at_published_time']:.0f} tokens/s per GPU)")
    plan_gap = f"  (budget - plan {b['gap_vs_plan_s'] * ms:+.2f} ms)" if "gap_vs_plan_s" in b else ""
    emit(f"  gap: budget - standalone sum    {b['gap_vs_standalone_s'] * ms:+8.2f} ms{plan_gap}")
    emit(f"    {'task':20s} {'GPU/link ms':>11s} {'host-bound ms':>14s}  kernels")
    rows = sorted(b["tasks"].items(), key=lambda kv: -(kv[1]["gpu_s"] + kv[1]["host_excess_s"]))
    for name, r in rows[:8]:
        kern = "n/a (communication)" if r["kernels"] is None else f"{r['kernels']:.0f}"
        emit(f"    {name:20s} {r['gpu_s'] * ms:11.3f} {'+' + format(r['host_excess_s'] * ms, '.3f'):>14s}  {kern}")


def gap_summary(breakdowns: list[dict]) -> str:
    """The line the README quotes: budget - standalone sum on the counted rows whose expert task is host-bound
    (the small-expert rows: the host's kernel issue, not the GPU, sets the expert time; the coarse-expert rows'
    GEMMs hide it)."""
    hb = [b for b in breakdowns if b["experts_host_bound"] and not b["reference_only"]]
    if not hb:
        return "gap (budget - standalone sum): none of the counted rows has a host-bound expert task"
    gaps = [b["gap_vs_standalone_s"] * 1e3 for b in hb]
    lo, hi = min(gaps), max(gaps)
    span = f"{lo:.1f}-{hi:.1f}" if lo >= 0 else f"{lo:.1f} to {hi:.1f}"
    each = "; ".join(f"{b['id']} {g:.2f}" for b, g in zip(hb, gaps))
    return (f"gap per layer and micro-batch (published budget - standalone sum) on the counted rows whose expert "
            f"task is host-bound (the small-expert rows): {span} ms\n  ({each})")


def table_rows(rows: list[dict]) -> list[list]:
    """The main table's cells, one list per run (headers: :data:`HEADERS`)."""
    out = []
    for r in rows:
        out.append([r["id"], r["source_family"], r["split"], r["precision_label"],
                    f"{r['published']['iteration_s']:.3f}", basis_label(r["published"].get("basis"), short=True),
                    f"{r['predicted']['iteration_s']:.3f}",
                    f"{r['error']:+.1%}", f"{r.get('error_without_sync', r['error']):+.1%}",
                    round(r["tflops_per_gpu_at_published_time"]), round(r["predicted_tflops_per_gpu"], 1),
                    f"{r['peak_memory_gib']:.1f}", f"{r['capacity_gib']:.1f}", "yes" if r["fits_memory"] else "NO"])
    return out


#: the published time's basis (``published.basis``) -> (the main table's short word, the Markdown table's words,
#: provenance): the page's step time is cited, the others computed from its tokens/s or Model TFLOP/s per GPU
BASIS = {"step time": ("step", "step time", "cited"), "tokens/s per GPU": ("tok/s", "tokens/s per GPU", "computed"),
         "Model TFLOP/s per GPU": ("TFLOP/s", "Model TFLOP/s per GPU", "computed")}


def basis_label(basis: str | None, short: bool = False) -> str:
    """``step (cited)`` (short) or ``step time (cited)``: what a published time comes from; ``?`` for an unknown
    basis."""
    if basis not in BASIS:
        return "?"
    words = BASIS[basis]
    return f"{words[0] if short else words[1]} ({words[2]})"


HEADERS = ["run", "source\nfamily", "\nsplit", "precision\n(per source)", "iteration s\npublished",
           "published\ns from", "iteration s\npredicted", "\n\nerror", "error\nwithout\nsync term",
           "Model\nTFLOP/s/GPU\nat published", "Model\nTFLOP/s/GPU\npredicted", "memory\npeak\nGiB/GPU",
           "memory\ncapacity\nGiB/GPU", "\n\nfits"]


def tflops_line(rows: list[dict], tolerance: float = 0.02) -> str:
    """What the Model TFLOP/s columns are (this model's FLOPs of an iteration, Megatron-LM's convention with MTP
    layers counted, over the published or the predicted time: computed) and, where a source states its own Model
    TFLOP/s and it differs from the published-time column by more than ``tolerance``, both figures: a source that
    counts its FLOPs otherwise."""
    off = [r for r in rows if r.get("source_tflops_per_gpu")
           and abs(r["tflops_per_gpu_at_published_time"] / r["source_tflops_per_gpu"] - 1) > tolerance]
    text = ("Model TFLOP/s per GPU: this model's FLOPs of an iteration (Megatron-LM's convention, MTP layers counted) "
            "over the published or predicted time (computed)")
    if not off:
        return text + f"; every source's own figure is within {tolerance:.0%} of the published-time column"
    return text + (f"; sources whose own figure differs by more than {tolerance:.0%} (they count FLOPs otherwise): "
                   + ", ".join(f"{r['id']} {r['source_tflops_per_gpu']:g} (ours "
                               f"{r['tflops_per_gpu_at_published_time']:.0f}, "
                               f"{r['tflops_per_gpu_at_published_time'] / r['source_tflops_per_gpu'] - 1:+.0%})"
                               for r in off))


#: the target the headline is judged against (test set)
TARGET_MEDIAN, TARGET_MAX = 0.15, 0.35


def summary(rows: list[dict], sync: dict) -> dict:
    """The headline over the test set (and the fit set's beside it, never as the headline)."""
    test = [r for r in rows if r["split"] == "test"]
    fit = [r for r in rows if r["split"] == "fit"]

    def med(rs, key="error"):  # None (JSON null) for an empty set: --json stays strict JSON
        return statistics.median(abs(r[key]) for r in rs) if rs else None

    return {"test_median_abs_error": med(test), "test_max_abs_error": max((abs(r["error"]) for r in test),
                                                                          default=None),
            "n_test": len(test), "n_fit": len(fit), "fit_ids": sync["fit_ids"],
            "fit_median_abs_error": med(fit),
            "fit_max_abs_error": max((abs(r["error"]) for r in fit), default=None),
            "test_median_abs_error_without_sync": med(test, "error_without_sync"),
            "source_families": sorted({r["source_family"] for r in rows}), "n_runs": len(rows),
            "target": {"median": TARGET_MEDIAN, "max": TARGET_MAX},
            "target_met": bool(test) and med(test) <= TARGET_MEDIAN and max(abs(r["error"]) for r in test) <= TARGET_MAX,
            "sync_per_layer_s": sync["per_layer_s"], "sync_fitted_on": sync["fit_runs_used"]}


#: the columns of :func:`markdown_table` (docs/reproduce.md's per-run table)
MARKDOWN_HEADERS = ("run", "source family", "split", "published s", "published s from", "predicted s", "error",
                    "error without the term", "dispatcher")


#: the markdown table's words for :func:`~tessera_lab.report.fidelity_set.published_iteration_s`'s basis
def markdown_table(rows: list[dict]) -> str:
    """The per-run table docs/reproduce.md quotes, as Markdown (one line per row, ending in a newline): id, source
    family, split, published iteration seconds (3 decimals) and what they come from (``published.basis``: the
    page's step time, or computed from its tokens/s or Model TFLOP/s per GPU), predicted iteration seconds, ``error``
    and the error without the
    host/sync term (``error_without_sync`` once :func:`apply_sync_term` ran, else ``error``) as signed percentages
    with one decimal, and the dispatcher; rows in the order given (the data files' order)."""
    lines = ["| " + " | ".join(MARKDOWN_HEADERS) + " |", "|" + "---|" * len(MARKDOWN_HEADERS)]
    for r in rows:
        cells = [r["id"], r["source_family"], r["split"], f"{r['published']['iteration_s']:.3f}",
                 basis_label(r["published"].get("basis")), f"{r['predicted']['iteration_s']:.3f}", f"{r['error']:+.1%}",
                 f"{r.get('error_without_sync', r['error']):+.1%}", r["parallel"]["dispatcher"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


#: the rows docs/reproduce.md's reading of the table names: the ModelZoo's cross-node EP pair (without and with the
#: combined-1F1B EP overlap) and its long-context table's forced-balance and dropless rows
PAIR_IDS = ("mz/qwen3-235b-a22b/256xH100/bf16/deepep-tp2-pp8-vp4-ep32",
            "mz/qwen3-235b-a22b/256xH100/bf16/deepep-tp2-pp8-vp4-ep32-a2a-overlap")
LOAD_IDS = ("mz/qwen3-235b-a22b/256xH100/bf16/seq16k-tp4-pp8-vp4-ep8-forced-balance",
            "mz/qwen3-235b-a22b/256xH100/bf16/seq16k-tp4-pp8-vp4-ep8-dropless")
#: the same table's longer rows (CP 2 at 32k, CP 4 at 64k): sequence label -> (forced-balance id, dropless id)
LOAD_IDS_CP = {f"{k}k": (f"mz/qwen3-235b-a22b/256xH100/bf16/seq{k}k-tp4-cp{cp}-pp8-vp4-ep8-forced-balance",
                         f"mz/qwen3-235b-a22b/256xH100/bf16/seq{k}k-tp4-cp{cp}-pp8-vp4-ep8-dropless")
               for k, cp in ((32, 2), (64, 4))}


def reading_figures(rows: list[dict]) -> dict[str, float]:
    """The figures the reading of the per-run table quotes (docs/reproduce.md, docs/fidelity.md), computed from
    ``rows`` after :func:`apply_sync_term` (errors as fractions, ``error = published / predicted - 1``; seconds;
    counts as floats). "Every forward carries the term": the planner gave the run a non-zero
    ``host_sync_per_layer_s``, its schedule pairs no forward with a backward (no EP overlap) and it runs no Megatron
    FSDP, whose own-stream collectives hide part of the waits (:func:`~tessera_lab.cost.sync.fully_exposed`);
    reference rows are in no count.

    Keys: ``term.runs`` / ``term.too-fast-without``: fit and test runs whose every forward carries the term, and of
    them those whose error without the term is > 0 (predicted too fast); ``deepep.test.{n,min,max,median-abs}``: the
    ``deepep`` test runs whose every forward carries it, their error with it;
    ``qwen3-alltoall.test.{n,min,max,without-min,without-max}``: the Qwen3 ``alltoall`` test runs whose every forward
    carries it, with and without it; ``pair.plain`` / ``pair.overlap``: the errors of :data:`PAIR_IDS`;
    ``load.{published,predicted}.{forced,dropless}`` (s) and ``load.{published,predicted}.slowdown`` (dropless /
    forced - 1) of :data:`LOAD_IDS`; ``load.{32k,64k}.{published,predicted}.slowdown``: the same of
    :data:`LOAD_IDS_CP`, and ``load.{32k,64k}.{forced,dropless}.error`` their errors; ``test.beyond-target`` /
    ``test.beyond-target.ep-overlap``: test runs with |error| above :data:`TARGET_MAX`, and of them those planned
    with an EP-overlap schedule.

    Raises:
        KeyError: a row of :data:`PAIR_IDS`, :data:`LOAD_IDS` or :data:`LOAD_IDS_CP` is missing (a runs file
            without them).
    """
    from tessera_lab.cost.sync import EP_OVERLAP_SCHEDULES

    counted = [r for r in rows if r["split"] in ("fit", "test")]
    overlap = {r["id"] for r in counted if r["parallel"].get("schedule") in EP_OVERLAP_SCHEDULES}
    term = [r for r in counted if r["host_sync_per_layer_s"] > 0 and r["id"] not in overlap
            and not r["parallel"].get("fsdp")]
    deepep = [r for r in term if r["split"] == "test" and r["parallel"]["dispatcher"] == "deepep"]
    a2a = [r for r in term if r["split"] == "test" and r["parallel"]["dispatcher"] == "alltoall"
           and r["id"].startswith(("qwen3", "mz/qwen3"))]
    by = {r["id"]: r for r in rows}
    beyond = [r for r in counted if r["split"] == "test" and abs(r["error"]) > TARGET_MAX]

    def published_s(r):
        return r["published"]["iteration_s"]

    def predicted_s(r):
        return r["iteration_time_s"]

    t = {k: predicted_s(by[i]) for k, i in zip(("forced", "dropless"), LOAD_IDS)}
    p = {k: published_s(by[i]) for k, i in zip(("forced", "dropless"), LOAD_IDS)}
    return {
        "term.runs": float(len(term)),
        "term.too-fast-without": float(sum(r["error_without_sync"] > 0 for r in term)),
        "deepep.test.n": float(len(deepep)), "deepep.test.min": min(r["error"] for r in deepep),
        "deepep.test.max": max(r["error"] for r in deepep),
        "deepep.test.median-abs": statistics.median(abs(r["error"]) for r in deepep),
        "qwen3-alltoall.test.n": float(len(a2a)), "qwen3-alltoall.test.min": min(r["error"] for r in a2a),
        "qwen3-alltoall.test.max": max(r["error"] for r in a2a),
        "qwen3-alltoall.test.without-min": min(r["error_without_sync"] for r in a2a),
        "qwen3-alltoall.test.without-max": max(r["error_without_sync"] for r in a2a),
        "pair.plain": by[PAIR_IDS[0]]["error"], "pair.overlap": by[PAIR_IDS[1]]["error"],
        "load.published.forced": p["forced"], "load.published.dropless": p["dropless"],
        "load.predicted.forced": t["forced"], "load.predicted.dropless": t["dropless"],
        "load.published.slowdown": p["dropless"] / p["forced"] - 1.0,
        "load.predicted.slowdown": t["dropless"] / t["forced"] - 1.0,
        **{f"load.{k}.{side}.slowdown": seconds(by[d]) / seconds(by[f]) - 1.0
           for k, (f, d) in LOAD_IDS_CP.items() for side, seconds in (("published", published_s),
                                                                      ("predicted", predicted_s))},
        **{f"load.{k}.{kind}.error": by[i]["error"]
           for k, ids in LOAD_IDS_CP.items() for kind, i in zip(("forced", "dropless"), ids)},
        "test.beyond-target": float(len(beyond)),
        "test.beyond-target.ep-overlap": float(sum(r["id"] in overlap for r in beyond)),
    }


def evaluate(files: list | None = None, split: str | None = None, out=sys.stderr) -> tuple:
    """Plan the runs and apply the host/sync term as the bench does: ``(runs, rows, sync, summary, sources)``.

    ``files``: runs files (default :data:`DEFAULT_FILES` in ``data/published``, the term fitted on their fit set;
    given files use the shipped fitted values, no refit); ``split``: keep only that split's runs (``test`` and
    ``reference`` use the shipped values too). A run that cannot be planned is named on ``out`` and left out.

    Raises:
        tessera_lab.errors.ConfigError: a runs file that cannot be used (``load_runs``), or a run whose model, layout
            or pipeline split maps onto no planner layout (:func:`parallel_for`, :func:`split_for`), before any
            planning.
    """
    from tessera_lab.report.fidelity_set import load_runs

    runs, sources = load_runs(files or [ROOT / "data" / "published" / f for f in DEFAULT_FILES])
    if split:
        runs = [r for r in runs if r["split"] == split]
    for run in runs + alternate_runs(runs)[0]:  # every mapping before any planning: refused, not skipped
        parallel_for(run)
        run_split(run, model_for(run))
    shipped = bool(files) or split in ("test", "reference")  # no fit rows to fit on: the shipped values
    rows, sync = plan_and_fit(runs, shipped, out)
    return runs, rows, sync, summary(rows, sync), sources


def plan_and_fit(runs: list[dict], shipped: bool, out=sys.stderr, label: str = "") -> tuple[list[dict], dict]:
    """Plan every run with the host/sync term off (what the fit sees; a run that cannot be planned is named on
    ``out``, with ``label``, and left out), then fit the term on the fit rows (or take the shipped values,
    ``shipped``) and re-plan with it (:func:`apply_sync_term`): ``(rows, sync)``."""
    from tessera_lab.cost.sync import FITTED_PER_WAIT_S

    rows = []
    for run in runs:
        try:
            rows.append(predict(run, 0.0))
        except Exception as exc:  # noqa: BLE001 - a benchmark prints what failed and goes on
            print(f"{run['id']}{label}: not planned: {exc}", file=out)
    return rows, apply_sync_term(rows, {r["id"]: r for r in runs}, dict(FITTED_PER_WAIT_S) if shipped else None)


def alternate_runs(runs: list[dict]) -> tuple[list[dict], list[str]]:
    """The runs with every ``alternate_reading`` applied (a run whose source can be read two ways carries the other
    reading's fields, ``{"fields": {...}, "why": "..."}``; the row itself holds the reading the bench plans), and
    the ids that changed. The split and everything else stay as they are.

    Raises:
        ConfigError: an ``alternate_reading`` that :func:`tessera_lab.report.fidelity_set.alternate_fields`
            refuses (one line naming the run and the field)."""
    from tessera_lab.report.fidelity_set import alternate_fields

    out, changed = [], []
    for run in runs:
        fields = alternate_fields(run)
        out.append(run if fields is None else {**run, **fields})
        if fields is not None:
            changed.append(run["id"])
    return out, changed


def alternate_summary(runs: list[dict], files: list | None, out=sys.stderr) -> dict | None:
    """The headline with every ambiguous run read the other way (:func:`alternate_runs`), planned and fitted as
    :func:`evaluate` does (refitted on the fit set unless ``files`` were given): ``{"ids", "test_median_abs_error",
    "test_max_abs_error", "target_met", "sync_per_layer_s"}``, or ``None`` when no run carries one."""
    alt, ids = alternate_runs(runs)
    if not ids:
        return None
    rows, sync = plan_and_fit(alt, bool(files), out, " (alternate reading)")
    s = summary(rows, sync)
    test = [r for r in rows if r["split"] == "test"]
    return {"ids": ids, **{k: s[k] for k in ("test_median_abs_error", "test_max_abs_error", "target_met",
                                              "sync_per_layer_s")},
            "refitted": not files, "test_beyond_target": sum(abs(r["error"]) > TARGET_MAX for r in test),
            "errors": {r["id"]: r["error"] for r in rows if r["id"] in ids}}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="write the rows and the summary as JSON ('-': stdout, and the "
                    "table goes to stderr)")
    ap.add_argument("--markdown", action="store_true",
                    help="print only the per-run Markdown table of docs/reproduce.md on stdout (markdown_table); "
                         "the report goes to stderr")
    ap.add_argument("--runs", metavar="FILE", action="append",
                    help="evaluate this runs file (schema: docs/file-schemas.md) with the shipped fitted values, no "
                         "refit; repeatable (default: data/published/" + ", ".join(DEFAULT_FILES) + ", fitted on their "
                         "fit set)")
    ap.add_argument("--split", choices=("fit", "test", "reference"),
                    help="plan and print only this split's runs (a fit of the sync term still sees only fit runs; "
                         "'fit' is what model development looks at, so test errors stay unseen)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also print where the predicted time of one MoE layer goes, per run (GPU and host-bound)")
    args = ap.parse_args(argv)
    if args.markdown and args.json == "-":
        ap.error("--markdown and --json - both write to stdout; give --json a PATH")
    try:  # the tables are printed with tabulate (the [dev] extra): say so before any work, not after it
        import tabulate  # noqa: F401
    except ImportError:
        ap.error("this benchmark prints its tables with tabulate, which is not installed; allowed: an environment "
                 "with it (pip install -e '.[dev]', or pip install tabulate)")
    from tessera_lab.errors import ConfigError

    out = sys.stderr if args.json == "-" or args.markdown else sys.stdout
    try:
        runs, rows, sync, summ, sources = evaluate(args.runs, args.split, out)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not args.split:  # the headline again with every ambiguous run read the other way (its own refit)
        summ["alternate_readings"] = alternate_summary(runs, args.runs, out)
    print_report(rows, sync, summ, out)
    result = {"rows": rows, "summary": summ, "sync_term": sync, "source_pages": sources}
    if args.breakdown:
        print(BREAKDOWN_HEAD, file=out)
        bds = []
        for run, r in zip(runs, rows):
            b = breakdown({**run, "tokens_per_s_per_gpu": r["tokens_per_s_per_gpu_at_published_time"]},
                          r["predicted_tokens_per_s_per_gpu"])
            bds.append(b)
            print_breakdown(b, out)
        print(gap_summary(bds), file=out)
        print("\ncomponents of the mean decoder layer (ms per layer and micro-batch, F + B + W each priced alone, "
              "before overlap; layer_components) and the time per layer the plan without the host/sync term leaves "
              "unexplained (needed; components_table)", file=out)
        print(components_table(rows, bds), file=out)
        result["breakdown"] = bds
    if args.markdown:
        print(markdown_table(rows), end="")
    if args.json:
        if args.json == "-":
            json.dump(result, sys.stdout, indent=1, default=str)
            print()
        else:
            from tessera_lab.io import write_json

            write_json(args.json, result)


def print_report(rows: list[dict], sync: dict, summ: dict, out) -> None:
    """The human-readable table and the headline (test set) lines."""
    import tabulate as tabulate_mod

    used = sync["fit_runs_used"]
    how = ("per dispatcher, the median over the fit set's runs to which the term applies ("
           + "; ".join(f"{d}: {', '.join(ids) or 'none'}" for d, ids in used.items()) + ")"
           if sync["fitted_here"] else "the shipped fitted values (tessera_lab/cost/sync.py), not refitted on this file")
    from tessera_lab.cost.sync import per_wait_text

    each = per_wait_text(sync["per_layer_s"])
    print("costs: analytic (data/hardware/cost_model.json; no measured profile), the planner's per-MoE-layer "
          f"host/sync term included: {each} per host wait (a MoE layer waits once per micro-batch, a GPT-OSS layer two "
          f"or three times: the row's host_waits_per_layer), {how}; "
          f"basis: {sync['basis']}", file=out)
    print("error = published iteration time / predicted - 1 (= predicted throughput / published - 1); published "
          "time from the source's step time, else its tokens/s per GPU, else its Model TFLOP/s per GPU", file=out)
    padding = tabulate_mod.MIN_PADDING
    tabulate_mod.MIN_PADDING = 0  # columns as wide as their widest cell or header line (restored: a module global)
    try:
        table = tabulate_mod.tabulate(table_rows(rows), headers=HEADERS, tablefmt="simple", disable_numparse=True,
                                      colalign=("left",) * 4 + ("right",) * 8 + ("left",) * 2)
    finally:
        tabulate_mod.MIN_PADDING = padding
    print(table, file=out)
    print("\n" + tflops_line(rows), file=out)
    print("\nper run: source and how it was planned", file=out)
    for r in rows:
        print(f"  {r['id']} [{r['split']}]: {r['source']}", file=out)
        for n in r["mapping_notes"]:
            print(f"      note: {n}", file=out)
    met = "met" if summ["target_met"] else "MISSED"

    def verdict(value, target):
        return "met" if value <= target else "missed"

    if not summ["n_test"]:
        fit = (f"median |error| {summ['fit_median_abs_error']:.1%}, max {summ['fit_max_abs_error']:.1%}"
               if summ["n_fit"] else "no run planned")
        print(f"no test runs in this selection: no headline; fit set ({summ['n_fit']} runs): {fit}", file=out)
        return
    print(f"HEADLINE (test set, {summ['n_test']} run{'' if summ['n_test'] == 1 else 's'} from "
          f"{len(summ['source_families'])} source "
          f"famil{'y' if len(summ['source_families']) == 1 else 'ies'}): median "
          f"|error| {summ['test_median_abs_error']:.1%} (target <= {TARGET_MEDIAN:.0%}: "
          f"{verdict(summ['test_median_abs_error'], TARGET_MEDIAN)}), max {summ['test_max_abs_error']:.1%} (target "
          f"<= {TARGET_MAX:.0%}: {verdict(summ['test_max_abs_error'], TARGET_MAX)}); target {met}; without the sync "
          f"term the test median is {summ['test_median_abs_error_without_sync']:.1%}", file=out)
    alt = summ.get("alternate_readings")
    if alt:
        each = ", ".join(f"{i} {e:+.1%}" for i, e in alt["errors"].items())
        print(f"with the {len(alt['ids'])} run{'' if len(alt['ids']) == 1 else 's'} whose source reads two ways read the other way (each run's "
              f"alternate_reading; {'refitted on the fit set' if alt['refitted'] else 'the shipped fitted values'}): "
              f"{each}; test median |error| {alt['test_median_abs_error']:.1%} (target: "
              f"{verdict(alt['test_median_abs_error'], TARGET_MEDIAN)}), max {alt['test_max_abs_error']:.1%} (target: "
              f"{verdict(alt['test_max_abs_error'], TARGET_MAX)}), test runs beyond 35%: {alt['test_beyond_target']}",
              file=out)
    if summ["n_fit"]:
        print(f"fit set ({summ['n_fit']} runs; not the headline): median |error| {summ['fit_median_abs_error']:.1%}",
              file=out)
    beyond = [r for r in rows if r["split"] == "test" and abs(r["error"]) > TARGET_MAX]
    if beyond:
        print("test runs beyond 35%: " + ", ".join(f"{r['id']} {r['error']:+.1%}" for r in beyond), file=out)


if __name__ == "__main__":
    main()
