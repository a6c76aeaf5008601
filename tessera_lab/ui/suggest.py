"""The "suggest a layout that fits" button of the planning panels (notebooks 00 and 06).

Where a panel cannot plan, the button runs :func:`tessera_lab.plan.search.search` (the search of ``tessera-lab
search``, docs/search.md) on the panel's GPU count, global batch and sequence over the layouts its controls can
set, and applies the fastest that fits (:class:`~tessera_lab.ui.panel.Action`).
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable

from tessera_lab.plan.search import Candidate, SearchResult
from tessera_lab.ui.panel import Action, panel_wording

#: full planner runs a suggestion makes at most
SUGGEST_MAX_PLANS = 24


def panel_schedule(spec, ep: int, recompute: str = "none", recompute_modules: tuple[str, ...] = ()) -> str:
    """The schedule the planning panels simulate, as ``plan`` picks it without ``--schedule`` and ``--vpp``
    (:func:`~tessera_lab.pipeline.schedules.default_schedule`): the overlapped 1F1B where Megatron-Core's EP-overlap
    rules allow it (:func:`~tessera_lab.pipeline.schedules.default_ep_overlap`: MoE layers, ``ep`` > 1, neither full
    recompute nor the ``moe`` recompute module), else 1F1B. ``recompute`` / ``recompute_modules``: the layout's."""
    from types import SimpleNamespace

    from tessera_lab.pipeline.schedules import default_ep_overlap, default_schedule

    lay = SimpleNamespace(ep=ep, pp=1, vpp=1, recompute=recompute, recompute_modules=tuple(recompute_modules))
    return default_schedule(None, 1, ep_overlap=default_ep_overlap(lay, spec))


def suggest_layout(spec, gpus: int, *, gpu: str, seq_len: int, global_batch_tokens: int,
                   settable: Callable[[Any], bool], max_plans: int = SUGGEST_MAX_PLANS) -> tuple[Candidate, SearchResult]:
    """The fastest layout that fits memory among those a planning panel can set: :func:`search` of ``spec`` on
    ``gpus`` GPUs (the panel's count, global batch and sequence) over the enumerated layouts with micro-batch size
    1, the panel's schedule (:func:`panel_schedule`), the alltoall dispatcher and every recompute, kept where
    ``settable(layout)`` holds.

    Raises:
        ConfigError: what :func:`search` refuses (a GPU count :func:`~tessera_lab.plan.search_space.gpu_count_ok`
            refuses, too few for the model),
            no layout the panel can set, or none of them fits memory (the lightest peak against the capacity).
    """
    from dataclasses import replace

    from tessera_lab.errors import ConfigError
    from tessera_lab.model.hardware import GPUSpec
    from tessera_lab.plan.search import check_search_inputs, enumerate_layouts, search

    node = GPUSpec.named(gpu).nvlink_domain
    seqs = check_search_inputs(spec, gpus, seq_len, global_batch_tokens, node)
    # the panels plan one chunk per rank with plan's default schedule (panel_schedule: this project's overlapped
    # 1F1B with MoE, EP > 1 and no full or moe-module recompute, as `plan` does; Megatron-Core's EP overlap would
    # need virtual stages, so the search proper enumerates it only with them): the search's one-chunk 1F1B layouts
    # with pp > 1, the default recompute module set and the distributed optimizer, run with the panel's schedule
    layouts = [replace(lay, schedule=panel_schedule(spec, lay.ep, lay.recompute, lay.recompute_modules))
               for lay in enumerate_layouts(spec, gpus, seqs, gpus_per_node=node, schedules=("1f1b",), vpps=(),
                                            dispatchers=("alltoall",), micro_batch_sizes=(1,))
               if lay.schedule == "1f1b" and lay.pp > 1 and not lay.recompute_modules and not lay.fsdp]
    layouts = [lay for lay in layouts if settable(lay)]
    if not layouts:
        raise ConfigError(f"no layout of {gpus} {gpu} GPUs that this panel can set makes a global batch of {seqs} "
                          f"sequences; allowed: notebook 11's search, which also varies TP, DP and micro-batching")
    res = search(spec, gpus, gpu=gpu, seq_len=seq_len, global_batch_tokens=global_batch_tokens, top=1,
                 max_plans=max_plans, layouts=layouts)
    if not res.ranked:
        peaks = [c.result["peak_memory_gib"] for c in res.planned if c.result and "peak_memory_gib" in c.result]
        cap = res.memory_capacity_bytes / 2**30
        light = (f"the lightest planned peaks at {min(peaks):.1f} GiB against {cap:.1f} GiB" if peaks else
                 f"each ruled out by its memory bound against {cap:.1f} GiB")
        raise ConfigError(f"no layout this panel can set fits on {gpus} {gpu} at sequence {seq_len:,} "
                          f"({len(layouts)} tried, {light}); "
                          "allowed: more GPUs, a shorter sequence, or notebook 11's search (TP, DP, VPP too)")
    return res.ranked[0], res


def suggestion_line(cand: Candidate, res: SearchResult, seconds: float, cpu: float) -> str:
    """What a suggestion applied: the layout, its planned tokens/s and peak memory, how many layouts were looked at
    and the wall and CPU seconds of the search (measured)."""
    r = cand.result
    return (f"suggested (search of the {res.enumerated} layouts this panel can set: {len(res.planned)} planned, the "
            f"others ruled out by the memory or time bound): pp {cand.layout.pp} x ep {cand.layout.ep}, {cand.layout.microbatches} micro-batches, "
            f"recompute {cand.layout.recompute}: {r['tokens_per_s']:,.0f} tokens/s, peak {r['peak_memory_gib']:.1f} "
            f"of {res.memory_capacity_bytes / 2**30:.1f} GiB (tokens/s simulated, memory computed); searched in {seconds:.2f} s wall, "
            f"{cpu:.2f} s CPU (measured)")



def panel_message(text: str, gpus: str, lever: str) -> str:
    """A refusal of the search (worded for the CLI: ``--gpus = 64 is too small ...``) in a planning panel's terms:
    ``gpus`` names how the panel's controls make its GPU count (``"stages 2 x ep 32 (the model's layout)"``),
    ``lever`` the controls that change it (``"more stages"``); the global batch and the sequence by the panel's
    micro-batches and sequence, any other option by its name without dashes. The CLI's own text is unchanged."""
    text = re.sub(r"--gpus = ([\d,]+) is too small", lambda m: f"{m.group(1)} GPUs ({gpus}) are too few", text)
    text = re.sub(r"--gpus = ([\d,]+) is", lambda m: f"{m.group(1)} GPUs ({gpus}) are", text)
    text = text.replace("--global-batch-tokens =", "the global batch (micro-batches x sequence) =")
    text = panel_wording(text.replace("--seq-len", "sequence"))
    return f"{text}; in this panel: {lever}"


def pp_ep_terms(values: dict[str, Any], par) -> tuple[str, str]:
    """Notebook 00's words for its GPU count (:func:`panel_message`): its pp and ep dropdowns (tp 1, dp 1)."""
    return f"pp {par.pp} x ep {par.ep}", "a larger pp or ep (GPUs = pp x ep), or another GPU"


def stage_terms(values: dict[str, Any], par) -> tuple[str, str]:
    """Notebook 06's words for its GPU count (:func:`panel_message`): its stages at the model's ep and tp."""
    tp = f" x tp {par.tp}" if par.tp > 1 else ""
    return (f"stages {par.pp} x ep {par.ep}{tp} of the model's layout",
            f"more stages (each adds {par.ep * par.tp} GPUs), or another model")


def suggest_action(current, settable, apply, terms=None):
    """The "suggest a layout that fits" button of a planning panel (:class:`~tessera_lab.ui.panel.Action`), shown
    while the panel cannot plan (an error, or a chosen partition over memory).

    Args:
        current: the controls' values -> ``(model spec, ParallelConfig, GPU name)`` of the panel's setting; the
            search keeps its GPU count (``world_size``), global batch (``tokens_per_iteration``) and sequence.
        settable: ``(layout, values, the panel's ParallelConfig) -> bool``: whether the panel's controls can
            express a searched :class:`~tessera_lab.plan.search.Layout`.
        apply: ``(layout, values) -> {control name: value}``: the controls that set it.
        terms: ``(values, the panel's ParallelConfig) -> (how its controls make the GPU count, the controls that
            change it)``: a refusal of the search is shown in those words (:func:`panel_message`).

    A click runs :func:`suggest_layout` and applies the fastest layout that fits; the
    line beside the button says what was applied, its planned tokens/s and peak memory, and the search's wall and
    CPU seconds (measured), or why nothing fits.
    """
    def run(v: dict[str, Any]) -> tuple[dict[str, Any], str]:
        t0, c0 = time.perf_counter(), time.process_time()
        from tessera_lab.errors import ConfigError

        spec, par, gpu = current(v)
        try:
            cand, res = suggest_layout(spec, par.world_size, gpu=gpu, seq_len=par.seq_len,
                                       global_batch_tokens=par.tokens_per_iteration,
                                       settable=lambda lay: settable(lay, v, par))
        except ConfigError as exc:
            if terms is None:
                raise
            raise ConfigError(panel_message(str(exc), *terms(v, par))) from None
        return apply(cand.layout, v), suggestion_line(cand, res, time.perf_counter() - t0, time.process_time() - c0)

    def when(state: dict[str, Any]) -> bool:
        return "error" in state or ("plan" in state and not state["plan"].chosen.fits_memory)

    return Action("suggest a layout that fits", run, when, busy="searching the layouts this panel can set")


__all__ = ["suggest_layout", "suggestion_line", "suggest_action", "panel_message", "SUGGEST_MAX_PLANS"]
