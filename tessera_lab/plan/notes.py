"""The notes a plan carries about its inputs (the model's own, MTP layers, routing load, attention windows, fp8,
the overlap profile its layer-pair costs come from, an EP-overlap schedule Megatron-Core refuses for the layout,
a CP group that leaves one NVLink domain) and about the host/sync term the chosen plan pays."""

from __future__ import annotations

from tessera_lab.model.hardware import Cluster, ParallelConfig, overlap_rule_breaks
from tessera_lab.model.spec import NO_MIXER, ModelSpec
from tessera_lab.model.tasks import routing_load_note
from tessera_lab.plan.evaluate import Evaluation, evaluate
from tessera_lab.plan.stages import StageCostModel


def plan_notes(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster, profile) -> list[str]:
    """The plan's notes on its inputs: the model's own, MTP layers planned or not, routing load, attention
    windows, fp8 precision, the overlap profile the layer-pair costs come from and, for an EP-overlap schedule
    Megatron-Core refuses for this layout, :func:`megatron_overlap_note`."""
    notes = list(model.notes)
    if model.stack.mtp_layers and not model.stack.plan_mtp:
        mtp = model.param_counts().mtp
        notes.append(f"{len(model.stack.mtp_layers)} MTP layer(s) ({mtp / 1e9:.2f} B parameters, computed) are not planned; "
                     "--mtp plans them after the last decoder layer, on the last stage")
    elif model.stack.plan_mtp and model.stack.mtp_layers:
        notes.append(f"{len(model.stack.mtp_layers)} MTP layer(s) planned after the last decoder layer (last stage); "
                     "parameter counts report them apart; model FLOPs and MFU count their layer and logits, as "
                     "Megatron-LM's num_floating_point_operations counts mtp_num_layers")
    if model.has_moe and parallel.ep > 1:
        notes.append(routing_load_note(model, parallel))
    if note := window_note(model, parallel):
        notes.append(note)
    if parallel.precision == "fp8":
        from tessera_lab.plan.precision import precision_note

        notes.append(precision_note(model, parallel, cluster))
    if profile is not None:
        notes.append(f"layer-pair costs from profile {profile.path or '(in memory)'}: backend {profile.backend}, "
                     f"device {profile.environment.get('device', '?')}, size factor {profile.size_factor:g}; its "
                     "measured overlap efficiency is transferred onto this model's analytic standalone times")
        if profile.backend != "cuda":
            notes.append(f"the profile was measured with the {profile.backend} backend, not on a {cluster.gpu.name}: "
                         "its efficiencies describe that device")
    if note := megatron_overlap_note(parallel):
        notes.append(note)
    if note := cp_span_note(model, parallel, cluster):
        notes.append(note)
    return notes


def cp_span_note(model: ModelSpec, parallel: ParallelConfig, cluster: Cluster) -> str | None:
    """Where a CP group (``cp`` ranks ``tp`` apart) leaves one NVLink domain: its KV ring and all-to-alls then run
    on the inter-node link (:meth:`Cluster.link_for`), as the cost model prices them, on the group the links serve
    worst (:func:`~tessera_lab.model.layout.slowest_group`; on GB200's racks of 72 that need not be rank 0's).
    None for ``cp`` 1 or when every CP group sits inside one domain."""
    if parallel.cp <= 1:
        return None
    from tessera_lab.model.layout import ranks_per_node, slowest_group

    ranks = list(slowest_group(parallel, cluster.gpus_per_node, "cp"))  # the group the links serve worst
    domains = sorted(ranks_per_node(ranks, cluster.gpus_per_node))
    if len(domains) <= 1:
        return None
    from tessera_lab.model.context_parallel import HEAD_SHARDED

    kinds = {layer.attention for layer in model.stack.layers} - {NO_MIXER}
    what = [w for w, on in (("KV ring (full attention)", bool(kinds - set(HEAD_SHARDED))),
                            ("all-to-alls (head-sharded mixers)", bool(kinds & set(HEAD_SHARDED)))) if on]
    link = cluster.link_for(ranks)
    return (f"CP groups of {parallel.cp} ranks ({parallel.tp} apart) span NVLink domains (ranks "
            f"{', '.join(map(str, ranks))}: {len(domains)} domains of {cluster.gpus_per_node} GPUs): their "
            f"{' and '.join(what)} run on "
            f"{link.name} at {link.bytes_per_s / 1e9:.0f} GB/s per GPU (data/hardware), not NVLink")


def megatron_overlap_note(parallel: ParallelConfig) -> str | None:
    """For an EP-overlap schedule (``overlapped``, ``interleaved-overlapped``) that Megatron-Core's
    ``TransformerConfig`` refuses for this layout (:func:`tessera_lab.model.hardware.overlap_rule_breaks`), the
    note saying so and naming the broken rules; ``None`` otherwise (another schedule, or a layout it runs)."""
    if not parallel.schedule.endswith("overlapped"):
        return None
    broken = overlap_rule_breaks(parallel)
    if not broken:
        return None
    return (f"Megatron-Core does not run the schedule {parallel.schedule} for this layout (its EP overlap requires: "
            f"{'; '.join(broken)}); the simulator and this project's runner do. tessera-lab search plans the "
            "EP-overlap schedules only where Megatron-Core runs them")


def window_note(model: ModelSpec, parallel: ParallelConfig) -> str | None:
    """A note when sliding-window or chunked layers have a window (chunk) of at least the sequence length: every
    query then sees all earlier tokens, so they cost as full causal attention (:func:`tessera_lab.model.mixers.
    attention_pairs`); ``None`` otherwise."""
    wide = [ly for ly in model.stack.layers if ly.local in ("sliding", "chunked") and ly.window >= parallel.seq_len]
    if not wide:
        return None
    kinds = sorted({f"{ly.local} {ly.window}" for ly in wide})
    return (f"window: {len(wide)} layer(s) ({', '.join(kinds)} tokens) have a window of at least the sequence length "
            f"{parallel.seq_len}: every token sees all earlier tokens, so they compute as full causal attention "
            f"(model/mixers.py attention_pairs); a window below {parallel.seq_len} keeps them local")


def bottleneck_kinds(plan) -> tuple[int, list]:
    """``(s, kinds)``: the chosen plan's slowest stage ``s`` and its per-kind bounds (F + B + W seconds per
    micro-batch before overlap, :func:`tessera_lab.cost.bounds.layers_bounds`) with the stage's host/sync seconds
    (:mod:`tessera_lab.cost.sync`) as one more kind, :data:`~tessera_lab.cost.bounds.HOST_SYNC_KIND`, bound by
    ``the host's waits (fitted)`` or ``(set)``; largest first. The one source of ``plan``'s ``bound:`` lines and
    the panels' bottleneck line."""
    from tessera_lab.cost.bounds import HOST_SYNC_KIND, KindBound, layers_bounds

    stages = plan.chosen.stages
    s = max(range(len(stages)), key=lambda i: stages[i].time_s)
    kinds = layers_bounds(plan.model, plan.parallel, plan.cluster, stages[s].layers, first=s == 0,
                          last=s == len(stages) - 1)
    if (sync := stages[s].host_sync_s) > 0:
        given = "fitted" if plan.parallel.host_sync_s is None else "set"
        kinds.append(KindBound(HOST_SYNC_KIND, sync, {f"the host's waits ({given})": sync}))
    return s, sorted(kinds, key=lambda k: -k.time_s)


def sync_note(model: ModelSpec, parallel: ParallelConfig, cost_model, sm: StageCostModel, chosen: Evaluation,
              flops: float) -> tuple[str, float]:
    """``(note, seconds)``: what the host/sync term (:mod:`tessera_lab.cost.sync`) adds to the chosen plan: its
    per-layer seconds and provenance, and the iteration simulated with and without it (same partition); seconds =
    with - without."""
    from tessera_lab.cost.sync import FITTED_PROVENANCE

    from tessera_lab.cost.sync import host_waits, planner_per_layer_s

    c = max(sm.host_sync)  # exposed seconds of the most-exposed MoE layer
    full = planner_per_layer_s(parallel, model=model)  # the waits' seconds before own-stream hiding
    named = host_waits(parallel, model)
    waits = len(named)
    hidden = (f", of which {(full - c) * 1e3:.2f} ms hide behind Megatron FSDP's own-stream gathers and "
              "reduce-scatters, which bind the layer (cost.sync.own_stream_hidden_s)" if full - c > 1e-12 else "")
    t0 = evaluate(model, parallel, cost_model, sm.without_sync(), chosen.partition, chosen.method, flops,
                  time_only=True)
    t = chosen.iteration_time_s
    given = parallel.host_sync_s is None
    return ((f"host/sync term: {c * 1e3:.2f} ms per MoE layer forward and micro-batch ({waits} host "
             f"wait{'s' if waits != 1 else ''} x {full / waits * 1e3:.2f} ms: {', '.join(named)}{hidden}) "
            f"({FITTED_PROVENANCE if given else 'set by --host-sync-ms'}; "
            + (f"the dropless EP dispatch ({parallel.dispatcher}) waits on the host's token counts before its "
               "all-to-all" if parallel.ep > 1 else f"the dropless dispatch ({parallel.dispatcher}) waits on the "
               "host's token counts for the grouped GEMM's splits (EP 1)")
            + "; carried in full by "
            f"every forward run apart; a forward an EP-overlap schedule pairs with a backward carries only what the "
            f"paired backward's expert (mlp) node, queued before the wait in Megatron-Core's issue order, does not "
            f"hide; tessera_lab/cost/sync.py) adds {t - t0:.4f} s to the iteration (simulated on the chosen "
            f"partition: {t:.4f} s with, {t0:.4f} s without, +{t / t0 - 1:.1%}); --host-sync-ms 0 turns it off, and "
            f"the planner then chooses its partition without it"), t - t0)
