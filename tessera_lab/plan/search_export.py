"""Megatron-Core command-line arguments of a searched layout (:mod:`tessera_lab.plan.search`), and the layout read
back from them (the round trip the tests check). Flag names: ``megatron/training/arguments.py``."""

from __future__ import annotations

import itertools
from dataclasses import asdict
from typing import Any, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import selective_modules
from tessera_lab.plan.search import Candidate
from tessera_lab.plan.search_space import Layout, overlap_rule_breaks


#: Megatron-Core's names (``megatron/training/arguments.py``) of the layout options :func:`megatron_arguments` writes
_MEGATRON_FLAGS = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
                   "vpp": "--num-virtual-stages-per-pipeline-rank", "ep": "--expert-model-parallel-size",
                   "micro_batch_size": "--micro-batch-size"}
#: this project's schedules Megatron-Core runs (``overlapped``: its combined 1F1B with the EP communication
#: overlapped, ``--overlap-moe-expert-parallel-comm``); the zero-bubble ones it does not
MEGATRON_SCHEDULES = ("1f1b", "interleaved", "overlapped", "interleaved-overlapped")
#: the mark tables put after a schedule Megatron-Core does not run (the search's text table, notebook 11)
NOT_MEGATRON_MARK = " (†)"
#: what Megatron-Core recomputes under ``--recompute-granularity selective`` without ``--recompute-modules``
#: (``TransformerConfig.__post_init__``, ``megatron/core/transformer/transformer_config.py``,
#: NVIDIA/Megatron-LM@d98e8a64)
MEGATRON_DEFAULT_RECOMPUTE_MODULES = ("core_attn",)


def schedule_label(schedule: str) -> str:
    """A schedule as the tables show it: marked :data:`NOT_MEGATRON_MARK` where Megatron-Core does not run it."""
    return schedule if schedule in MEGATRON_SCHEDULES else f"{schedule}{NOT_MEGATRON_MARK}"


def selective_note(layouts: Sequence[Layout], moe: bool = True) -> str | None:
    """What a bare ``selective`` in a table's recompute column recomputes, or ``None`` when no layout shown has it:
    this project's default set (:data:`~tessera_lab.model.hardware.SELECTIVE_DEFAULT_MODULES`, which
    :func:`megatron_arguments` writes out) in a model with MoE layers (``moe``); without, the part of it that acts,
    core_attn alone (:func:`~tessera_lab.model.hardware.selective_modules`), which is Megatron-Core's own default."""
    if not any(l.recompute == "selective" and not l.recompute_modules for l in layouts):
        return None
    mods = selective_modules("selective", (), moe)
    if mods == MEGATRON_DEFAULT_RECOMPUTE_MODULES:
        return f"selective: recompute module {mods[0]}, Megatron-Core's own default; selective(...) names its modules"
    return (f"selective: recompute modules {', '.join(mods)} (the export writes them out: "
            "Megatron-Core's own default is core_attn alone); selective(...) names its modules")


def megatron_arguments(cand: Candidate, seq_len: int, moe: bool = True) -> dict[str, Any]:
    """A planned candidate as Megatron-Core command-line arguments: ``argv`` (TP, PP, VPP, EP with expert TP 1,
    CP 1, sequence parallelism with TP, the pipeline layout of the planned partition, micro-batch and global batch
    sizes, sequence length, recompute, dispatcher, the EP-overlap flag) plus ``layout`` (the search's fields,
    read back by :func:`layout_from_megatron`) and ``notes`` (what Megatron-Core does not run as planned). ``moe``
    false (a model without MoE layers): the recompute modules leave out the MoE ones, which act on nothing there
    (and ``moe_act`` without ``--moe-grouped-gemm``, a dense model's setting, Megatron-Core refuses:
    ``TransformerConfig.__post_init__``, NVIDIA/Megatron-LM@d98e8a64)."""
    from tessera_lab.plan.exports import megatron_layout

    lay = cand.layout
    argv = []
    for key, flag in _MEGATRON_FLAGS.items():
        if key != "vpp" or lay.vpp > 1:
            argv += [flag, str(getattr(lay, key))]
    dense_dp = lay.ep * lay.dp // (lay.tp if lay.ep_spans_tp else 1)
    argv += ["--expert-tensor-parallel-size", "1", "--context-parallel-size", str(lay.cp),
             "--global-batch-size", str(lay.microbatches * lay.micro_batch_size * dense_dp),
             "--seq-length", str(seq_len), "--use-distributed-optimizer"]
    if lay.fsdp:  # Megatron FSDP sharding parameters, gradients and optimizer state (the recipes keep the flag above)
        argv += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"]
    if lay.tp > 1:
        argv.append("--sequence-parallel")
    if cand.result and cand.result.get("boundaries"):
        argv += ["--pipeline-model-parallel-layout", megatron_layout(cand.result["boundaries"])]
    if lay.recompute == "full":
        argv += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif lay.recompute == "selective":
        # always the modules planned: without --recompute-modules Megatron-Core recomputes core_attn alone
        # (TransformerConfig.__post_init__, NVIDIA/Megatron-LM@d98e8a64), not this project's default set
        argv += ["--recompute-granularity", "selective", "--recompute-modules",
                 *selective_modules(lay.recompute, lay.recompute_modules, moe)]
    argv += ["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"] if lay.dispatcher == "deepep" else \
        ["--moe-token-dispatcher-type", "alltoall"]
    notes = [] if lay.schedule in MEGATRON_SCHEDULES else [
        f"schedule {lay.schedule} is not a Megatron-Core schedule (it runs 1F1B or interleaved 1F1B)"]
    if lay.schedule.endswith("overlapped"):
        argv.append("--overlap-moe-expert-parallel-comm")
        notes += overlap_notes(lay)
    layout = asdict(lay)
    if lay.recompute == "selective":  # the modules the argv names, as planned
        layout["recompute_modules"] = list(selective_modules(lay.recompute, lay.recompute_modules, moe))
    return {"argv": argv, "layout": layout, "seq_len": seq_len, "notes": notes}


def overlap_notes(lay: Any) -> list[str]:
    """A note naming the rules of Megatron-Core's ``TransformerConfig`` that refuse
    ``--overlap-moe-expert-parallel-comm`` for ``lay`` (:func:`tessera_lab.plan.search.overlap_rule_breaks`; the
    search enumerates no such layout, a layout given by hand may be one); empty when Megatron-Core runs it."""
    broken = overlap_rule_breaks(lay)
    if not broken:
        return []
    return [f"Megatron-Core refuses --overlap-moe-expert-parallel-comm for this layout: it requires {', '.join(broken)}; "
            "the planned time assumes the EP overlap this project's overlapped schedule runs, which Megatron-Core "
            "would run as plain 1F1B here"]


def layout_from_megatron(argv: Sequence[str], gpus: int, *, ep_spans_tp: bool = False,
                         moe: bool = True) -> tuple[Layout, list[int]]:
    """The :class:`Layout` and stage boundaries of Megatron-Core arguments written by :func:`megatron_arguments` on
    ``gpus`` GPUs. Megatron's expert grid (expert TP 1) forms EP groups from consecutive ranks of the TP x DP grid,
    so whether an EP group spans the TP ranks is this project's placement, not a Megatron flag: pass it, and whether
    the model has MoE layers (``moe``; without, core_attn alone is the default module set as it acts).

    Raises:
        ConfigError: a size flag missing or not an integer, or sizes that do not divide ``gpus``.
    """
    from tessera_lab.plan.exports import parse_megatron_layout

    args = list(argv)
    vals = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--") and not args[i + 1].startswith("--")}
    flags = {a for a in args if a.startswith("--")} - set(vals)
    modules: tuple[str, ...] = MEGATRON_DEFAULT_RECOMPUTE_MODULES  # Megatron-Core's, when the flag is absent
    if "--recompute-modules" in args:  # nargs='*': the words up to the next flag
        rest = args[args.index("--recompute-modules") + 1:]
        modules = tuple(itertools.takewhile(lambda a: not a.startswith("--"), rest))
    if set(modules) == set(selective_modules("selective", (), moe)) or \
            vals.get("--recompute-granularity") != "selective":
        modules = ()  # this project's default set as it acts (or no selective recompute at all)
    try:
        get = {k: int(vals.get(flag, "1")) for k, flag in _MEGATRON_FLAGS.items()}
        gbs = int(vals["--global-batch-size"])
        cp = int(vals.get("--context-parallel-size", "1"))
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"Megatron arguments: {exc} is missing or not an integer; allowed: the arguments "
                          "megatron_arguments writes") from None
    tp, pp, ep = get["tp"], get["pp"], get["ep"]
    per_stage = ep * (1 if ep_spans_tp else tp) * cp
    if gpus % (per_stage * pp):
        raise ConfigError(f"Megatron arguments: pp {pp} x ep {ep}{'' if ep_spans_tp else f' x tp {tp}'} x cp {cp} "
                          f"does not divide {gpus} GPUs; allowed: sizes whose product divides the GPUs")
    dp = gpus // (per_stage * pp)
    dense_dp = ep * dp // (tp if ep_spans_tp else 1)
    m = gbs // (get["micro_batch_size"] * dense_dp)
    overlap = "--overlap-moe-expert-parallel-comm" in flags
    sched = (("interleaved-overlapped" if overlap else "interleaved") if get["vpp"] > 1
             else ("overlapped" if overlap else "1f1b"))
    layout = Layout(pp, get["vpp"], ep, tp, dp, m, get["micro_batch_size"], sched,
                    vals.get("--recompute-granularity", "none"),
                    "deepep" if "--moe-enable-deepep" in flags else vals.get("--moe-token-dispatcher-type", "alltoall"),
                    ep_spans_tp, cp, modules, "--use-megatron-fsdp" in flags)
    layout_text = vals.get("--pipeline-model-parallel-layout")
    return layout, (parse_megatron_layout(layout_text) if layout_text else [])
