"""Host/device synchronisation of MoE layers: the time eager Megatron-Core exposes when the host waits on the GPU.

Basis (Megatron-Core's MoE code paths, ``NVIDIA/Megatron-LM`` commit ``bed33f89945f41ae792d7b36a0d770b00f61ed42``,
``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``): in dropless training with
EP > 1, ``preprocess`` copies the per-rank token counts to the host (``.to("cpu", non_blocking=True)`` of
``input_splits``, ``output_splits``, ``num_global_tokens_per_local_expert``) and sets ``cuda_sync_point =
"before_ep_alltoall"``; ``token_permutation`` then calls ``torch.cuda.current_stream().synchronize()`` before the
EP all-to-all, because the all-to-all split sizes and the per-expert GEMM splits (Transformer Engine's
``GroupedLinear`` takes ``m_splits`` as a host list) must be host values. With a capacity factor the sync moves to
``before_permutation_1``; with EP and TP 1 to ``before_finish`` (``preprocess`` still needs the per-expert token
counts on the host for the grouped GEMM's splits; d98e8a64 too): there is one per MoE layer and micro-batch in every
dropless configuration, with or without EP. DeepEP's normal-mode dispatch (the ``flex`` dispatcher) likewise waits on the host
for the received-token counts before it can size its output.

More waits per layer (:func:`host_waits_per_layer`): where the MoE block is recomputed (``full``, the ``moe``
module) its forward, and the dispatcher's wait, runs again in the backward; GPT-OSS's expert activation waits at
every call (:data:`ACTIVATION_WAIT_MODEL_TYPES`), again where ``moe_act`` is recomputed. The term is ``c`` per
wait; a recompute's waits, which run in the backward, are charged to the forward with the others.

Reasoning (written down, not measured here): a sync drains the GPU's queue, so the host's lead over the GPU is
lost at every wait. Afterwards every eager op of the layer (router and aux loss, dispatcher
bookkeeping, permutes, the per-expert loop, and the layer's backward and weight-gradient ops that autograd issues
when the backward reaches it) is issued by a host that is not ahead of the GPU, so the host's issue time adds
to the GPU time instead of hiding under it. The cost is additive and nearly independent of the GPU and of the
expert size: it is a count of host ops after each wait times the per-op host cost. That is why it shows on DeepSeek-V3
(GPU-bound, ~21 ms of GPU work per layer: a ``max(host, GPU)`` floor of :mod:`tessera_lab.cost.host` cannot
bind there) as much as on the small-expert runs.

Under Megatron-Core's combined-1F1B EP overlap (``overlap_moe_expert_parallel_comm``; our ``overlapped`` and
``interleaved-overlapped`` schedules) a steady-state forward of one micro-batch is issued together with the backward
of another. The issue order is fixed (``TransformerLayerSchedulePlan.run`` in
``megatron/core/models/common/model_chunk_schedule_plan.py``, NVIDIA/Megatron-LM@d98e8a64): combine backward,
the forward's attention, router and dispatch preprocessing, the backward's ``mlp`` node (the routed experts' input
gradient; a dense layer's MLP), and only then the forward's dispatch, where the host waits (the ``alltoall``
dispatcher's ``before_ep_alltoall`` sync sits in ``token_dispatch``; DeepEP's in its dispatch). So while the host
waits, the GPU has exactly the paired backward's ``mlp`` node queued: the wait is hidden up to that node's time and
the rest is exposed, :func:`paired_exposed_s` (``max(0, waits - queued)``; all of a layer's waits are set against
that one node, a simplification for the recompute's and GPT-OSS's further waits, which sit elsewhere in the order).
The forwards those schedules run apart (warm-up, and every forward when nothing pairs) are plain forwards and wait
as in 1F1B. The term is therefore a property of the forward: the planner charges it in full to every MoE layer's
forward (:meth:`tessera_lab.plan.stages.StageCostModel.f`) and only the exposed part to the makespan of a paired
forward and backward (:meth:`~tessera_lab.plan.stages.StageCostModel.fb`), whatever the schedule. Under Megatron
FSDP a wait also hides behind the gathers and reduce-scatters on their own streams where they bind the layer
(:func:`own_stream_hidden_s`): the compute stream idles, the link does not.

The planner applies it (:func:`planner_per_layer_s`): :func:`tessera_lab.plan.stages.build_stage_model` adds the
exposed seconds to the forward of every MoE layer (per micro-batch), so the simulator propagates it through the
schedule, when EP > 1, the dispatcher is ``alltoall`` or ``deepep`` (both wait on host counts: DeepEP's normal-mode
dispatch busy-waits on the host for the received-token counter; an assumption for DeepEP, which the DeepSeek-V3
run, planned with ``deepep``, checks) and the costs are analytic (a measured profile already holds what the device
does). ``ParallelConfig.host_sync_s`` (``--host-sync-ms``) sets ``c`` for any dispatcher; ``None`` is the
dispatcher's value in :data:`FITTED_PER_WAIT_S`, 0 turns the term off.

Per dispatcher (why two values): the two syncing dispatchers wait differently. Megatron-Core's ``alltoall``
dispatcher blocks the host in ``cudaStreamSynchronize`` until the whole compute stream has drained, and only then
runs the Python of the permute, the ``all_to_all_single`` with host split sizes, the chunk sort by local expert and
Transformer Engine's per-expert ``GroupedLinear`` set-up, so the GPU idles for all of that host work. DeepEP's
normal-mode dispatch (``deepseek-ai/DeepEP`` commit ``2df3680e42e933bdd827e86cc6e4abb52e94caf3``,
``csrc/deep_ep.cpp``, ``intranode_dispatch`` / ``internode_dispatch``: "Synchronize total received tokens and
tokens per expert", a host busy-wait on ``moe_recv_counter``, mapped host memory the ``notify_dispatch`` kernel
writes) wakes the host as soon as the notify kernel has run and launches the dispatch kernel at once: the same
drain, less host work behind it. The exposure therefore has one value per dispatcher and wait,
:data:`FITTED_PER_WAIT_S`; fitted on disjoint runs (GPT-OSS, two or three waits a layer, and DeepSeek-V3, one, for
``alltoall``; Qwen3-30B-A3B, one, and Nemotron 3 Nano, two where its ``moe`` module is recomputed, for ``deepep``) the
``alltoall`` value is 52% above the ``deepep`` one.

Fit (``benchmarks/bench_public_runs.py``): on the fit set of the published runs only (``split: fit``, written
into data/published by a hash rule before any fitting), each run where every forward carries the term (EP > 1, a
syncing dispatcher, no EP overlap: :func:`fully_exposed`, the iteration formula of :func:`iteration_sync_s`) is
planned with the term off,
the per-layer seconds that close its gap (published - planned) are worked out (:func:`per_layer_needed_s`) and
divided by the layer's waits, and ``c`` of a dispatcher is the **median** of its fit runs' values
(:func:`fit_per_layer_s`; :data:`FIT_SET` names them). The estimator (per dispatcher, median) was chosen by
leave-one-out on the fit set alone, before the recipes were re-read from each container's own Megatron-Bridge
release (docs/fidelity.md): one mean over both dispatchers 27% median |error| left out, per-dispatcher means 17.5%,
per-dispatcher medians 10.8%. On the fit set as it is now (InfiniBand at 0.94 of its line rate) the same
leave-one-out gave 20.3%, 21.8% and 24.8% (seven runs), and with the Nemotron 3 Nano fit run 17.7%, 15.3% and 17.5%
(eight runs); the estimator was not re-chosen after the test set had been seen. Models
from the host's kernel counts (:mod:`tessera_lab.cost.host`, ``c = h x kernels`` or ``a + h x kernels``) did no
better than one constant (27-29%) on the fit set, so the exposure is not the counted kernels' issue time. The
test set judges it (docs/fidelity.md). What the values hold, checked on the fit set alone
(``benchmarks/bench_public_runs.py --split fit --breakdown``, docs/cost-model.md): on the Qwen3-30B-A3B ``deepep``
runs a per-layer constant (about 4 ms at 4,096 and 16,384 tokens per micro-batch; 3.7 ms per wait on the Nemotron 3
Nano run at 8,192), as a sync is; on the GPT-OSS
``alltoall`` runs a time that grows with the layer's GPU work (1.4-1.8 times the modelled compute), three waits'
worth per layer; the EP all-to-all rates, the schedules' critical paths and the
expert load were checked against cited measurements and do not explain it. This module never imports torch.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from tessera_lab.errors import ConfigError

#: ``c`` per dispatcher as ``benchmarks/bench_public_runs.py`` fits it (seconds per host wait, one MoE layer and
#: micro-batch: :func:`host_waits_per_layer`): the median per-wait gap of the dispatcher's fit-set runs (``split:
#: fit`` in data/published, the rule of tessera_lab/report/fidelity_set.py) whose every forward carries the term;
#: FIT_SET names them; tests/test_public_runs.py checks that the bench's fit still gives these values
FITTED_PER_WAIT_S = {"alltoall": 5.819e-3, "deepep": 3.822e-3}
#: the runs each value of ``FITTED_PER_WAIT_S`` is fitted on (data/published, split 'fit', EP > 1, that
#: dispatcher, no EP overlap); none of them is a test run
FIT_SET = {
    "alltoall": ("deepseek-v3/256xB200/fp8/pp16-ep8-gbs2048", "gpt-oss-120b/64xB200/bf16/ep64-mbs4",
                 "gpt-oss-120b/64xB200/bf16/ep8-mbs4", "gpt-oss-120b/64xH100/bf16/pp4-ep8",
                 "gpt-oss-120b/64xH100/bf16/pp4-ep8-mbs4-gbs512"),
    "deepep": ("nemotron-3-nano-30b-a3b/16xH100/fp8/ep8", "qwen3-30b-a3b/16xH100/fp8/ep16",
               "qwen3-30b-a3b/8xB200/fp8/ep8"),
}
#: model types whose expert activation waits on the host at every call in Megatron-Core: GPT-OSS's clamped GLU
#: (Megatron-Bridge's GPT-OSS provider: ``quick_gelu``, ``glu_linear_offset`` 1.0, ``bias_activation_fusion``;
#: ``weighted_bias_quick_geglu_impl`` in ``megatron/core/fusions/fused_bias_geglu.py`` builds
#: ``torch.tensor(linear_offset, device=input.device)`` on every call, a blocking host-to-device copy, which torch runs
#: as ``cudaMemcpyAsync`` then ``cudaStreamSynchronize``; in Megatron-LM since 2e29a5e1e3, 2025-09-09)
ACTIVATION_WAIT_MODEL_TYPES = ("gpt_oss",)
#: schedules that run Megatron-Core's combined-1F1B EP overlap (the sync is hidden in the forwards they pair)
EP_OVERLAP_SCHEDULES = ("overlapped", "interleaved-overlapped")
#: provenance of the default ``c`` as the CLI and the plan's notes state it
FITTED_PROVENANCE = ("fitted per dispatcher and host wait on the fit set of the published runs (median of "
                     + " and ".join(f"{len(ids)} {d}" for d, ids in FIT_SET.items())
                     + " runs, tessera_lab.cost.sync.FIT_SET), benchmarks/bench_public_runs.py")

def per_wait_text(values: dict[str, float] | None = None) -> str:
    """``"alltoall 4.45 ms, deepep 3.91 ms"``: seconds per host wait by dispatcher (default
    :data:`FITTED_PER_WAIT_S`) as the CLI and the benchmark print them."""
    return ", ".join(f"{d} {v * 1e3:.2f} ms" for d, v in (FITTED_PER_WAIT_S if values is None else values).items())


#: dispatchers whose dispatch waits on host copies of the token counts (Megatron-Core's dropless all-to-all; DeepEP
#: normal mode, assumed: its dispatch waits on the host for the received-token counts)
SYNC_DISPATCHERS = ("alltoall", "deepep")
#: where the sync sits in the code the basis cites (repository, commit, path, the lines' content)
BASIS = ("NVIDIA/Megatron-LM@bed33f89945f41ae792d7b36a0d770b00f61ed42 "
         "megatron/core/transformer/moe/token_dispatcher.py: MoEAlltoAllTokenDispatcher.preprocess sets "
         "cuda_sync_point = 'before_ep_alltoall' (dropless, EP > 1); token_permutation calls "
         "torch.cuda.current_stream().synchronize() before the EP all-to-all")


def host_waits(parallel, model=None) -> list[str]:
    """The host waits of :func:`host_waits_per_layer`, named: ``["dispatcher", "dispatcher (recompute)",
    "expert activation", "expert activation (recompute)"]`` as they apply."""
    from tessera_lab.model.hardware import selective_modules

    mods = set(selective_modules(parallel.recompute, parallel.recompute_modules))
    moe_again = parallel.recompute == "full" or "moe" in mods
    out = ["dispatcher"] + (["dispatcher (recompute)"] if moe_again else [])
    if model is not None and getattr(model, "model_type", None) in ACTIVATION_WAIT_MODEL_TYPES:
        out += ["expert activation"] + (["expert activation (recompute)"] if moe_again or "moe_act" in mods else [])
    return out


def host_waits_per_layer(parallel, model=None) -> int:
    """Host waits (stream drains) one MoE layer costs per micro-batch in Megatron-Core, forward and recompute:

    * the dispatcher's wait on the token counts (module docstring): 1, run again where the MoE block is recomputed
      (``recompute = full``, or the ``moe`` module of a selective recompute);
    * for the model types of :data:`ACTIVATION_WAIT_MODEL_TYPES` (GPT-OSS), the expert activation's own wait: 1 per
      call, run again where the activation is recomputed (``moe_act``, which this project's default selective set
      holds, ``moe`` or ``full``).

    Args:
        parallel: a :class:`~tessera_lab.model.hardware.ParallelConfig` (``recompute``, ``recompute_modules`` read).
        model: a :class:`~tessera_lab.model.spec.ModelSpec` (``model_type`` read); ``None``: the dispatcher's waits
            only.
    Returns:
        an integer >= 1.
    """
    return len(host_waits(parallel, model))


def planner_per_layer_s(parallel, *, analytic: bool = True, model=None) -> float:
    """Seconds the planner adds to each MoE layer's forward per micro-batch: ``c`` x
    :func:`host_waits_per_layer`, ``c`` = ``parallel.host_sync_s`` (``None``: the dispatcher's
    :data:`FITTED_PER_WAIT_S`), when the dispatcher is in :data:`SYNC_DISPATCHERS` and the costs are ``analytic``,
    with or without EP (the ``alltoall`` dispatcher syncs at ``before_finish`` when EP and TP are 1, module
    docstring); else 0. Whatever the schedule: a forward the EP-overlap schedules pair with a backward
    hides it up to the paired backward's ``mlp`` node (:func:`paired_exposed_s`, in the pair's makespan,
    :meth:`~tessera_lab.plan.stages.StageCostModel.fb`); a forward run apart carries it (the waits of a recompute, which run in the backward, are charged to the forward
    too).

    Args:
        parallel: a :class:`~tessera_lab.model.hardware.ParallelConfig` (``ep``, ``dispatcher``, ``host_sync_s``,
            the recompute read). analytic: False for costs from a measured profile. model: the ModelSpec
            (:func:`host_waits_per_layer`; a model without MoE layers has no dispatcher and gets 0).
    Raises:
        ConfigError: ``host_sync_s`` negative.
    """
    if not analytic or parallel.dispatcher not in SYNC_DISPATCHERS or not getattr(model, "has_moe", True):
        return 0.0
    c = getattr(parallel, "host_sync_s", None)
    c = FITTED_PER_WAIT_S[parallel.dispatcher] if c is None else c
    if not c >= 0:
        raise ConfigError(f"field 'host_sync_s' = {c!r} is out of range; allowed: seconds >= 0")
    return float(c) * host_waits_per_layer(parallel, model)


#: tasks of Megatron-Core's ``mlp`` schedule node (``build_transformer_layer_callables`` in
#: ``megatron/core/models/gpt/fine_grained_callables.py``: the routed experts' compute, or a dense layer's MLP), whose
#: backward is queued before a paired forward's dispatch waits (:func:`paired_exposed_s`)
MLP_NODE_TASKS = frozenset({"experts", "expert_act", "up_proj", "act", "gate_up_proj", "silu_mul", "down_proj"})


def paired_exposed_s(waits_s: float, queued_s: float) -> float:
    """Seconds a forward's host waits expose when an EP-overlap schedule pairs it with a backward: the waits
    (``waits_s``, :func:`planner_per_layer_s`) less the GPU work queued before them, the paired backward's ``mlp``
    node (``queued_s``: the input-gradient compute of the tasks in :data:`MLP_NODE_TASKS`), never below 0. Source:
    Megatron-Core's issue order (module docstring)."""
    return max(0.0, waits_s - queued_s)


def own_stream_hidden_s(waits: Sequence[str], per_wait_s: float, forward_slack_s: float,
                        backward_slack_s: float) -> float:
    """Seconds of one MoE layer's host waits (:func:`host_waits`, each ``per_wait_s``) that collectives on streams of
    their own hide: while the host waits, the compute stream drains and idles, but Megatron FSDP's gathers and
    reduce-scatters, issued ahead on their own streams (prefetched; nothing they run waits on the compute stream),
    keep the link busy. Where they bind a bundle, its lanes may idle for the bundle's ``lane_slack``
    (:class:`~tessera_lab.cost.analytic.PhaseCost`) and it ends no later. A forward's own waits hide in the forward's
    slack (``forward_slack_s``), a recompute's (named ``(recompute)``: they run at the start of the backward) in the
    backward's and weight-gradient's (``backward_slack_s``); each up to the waits' seconds. Source: CUDA stream
    semantics (work on one stream does not wait for another without an event) and Megatron FSDP's prefetch."""
    again = sum(1 for w in waits if w.endswith("(recompute)"))
    first = len(waits) - again
    return (min(first * per_wait_s, max(0.0, forward_slack_s))
            + min(again * per_wait_s, max(0.0, backward_slack_s)))


def fully_exposed(parallel, model=None) -> bool:
    """Whether every MoE layer forward of the layout carries the term (:func:`planner_per_layer_s` > 0 and no
    EP-overlap schedule, which pairs forwards with backwards): the runs :func:`iteration_sync_s` and the fit
    (:func:`per_layer_needed_s`) describe. ``model`` (a ModelSpec, ``has_moe`` read): False for a model without
    MoE layers, which carries no term at all (a dense run says nothing about ``c``); ``None``: the layout alone.
    Megatron FSDP (``parallel.fsdp``) is False too: its own-stream collectives hide part of the waits
    (:func:`own_stream_hidden_s`)."""
    return (parallel.schedule not in EP_OVERLAP_SCHEDULES and not getattr(parallel, "fsdp", False)
            and planner_per_layer_s(parallel, model=model) > 0)


def iteration_sync_s(moe_layers_per_rank: Sequence[int], microbatches: int, pp: int, vpp: int,
                     per_layer_s: float) -> float:
    """Seconds the sync adds to one iteration: the busiest rank's MoE layers x ``per_layer_s`` per micro-batch,
    over ``m + (pp - 1) / vpp`` stage slots (the 1F1B / interleaved-1F1B iteration in stage times: Narayanan et
    al. 2021, the bubble's ``(pp - 1) / vpp``), since every stage slot of the busiest rank grows by its MoE layers
    x ``per_layer_s``.

    Args:
        moe_layers_per_rank: MoE decoder layers each pipeline rank holds (over all its virtual stages).
        microbatches, pp, vpp: the schedule's sizes; per_layer_s: :func:`sync_exposed_per_layer_s`.
    Raises:
        ConfigError: ``microbatches``, ``pp`` or ``vpp`` below 1.
    """
    for name, v in (("microbatches", microbatches), ("pp", pp), ("vpp", vpp)):
        if v < 1:
            raise ConfigError(f"field '{name}' = {v!r} is out of range; allowed: an integer >= 1")
    if not moe_layers_per_rank:
        return 0.0
    # a virtual stage slot grows by its MoE layers x per_layer_s; the iteration is m x vpp + pp - 1 such slots
    return max(moe_layers_per_rank) * per_layer_s * (microbatches + (pp - 1) / vpp)


def per_layer_needed_s(published_s: float, planned_s: float, moe_layers_per_rank: Sequence[int], microbatches: int,
                       pp: int, vpp: int) -> float:
    """The ``c`` that makes :func:`iteration_sync_s` close a run's gap ``published_s - planned_s`` (iteration
    seconds) exactly: the gap over ``max(layers) x (m + (pp - 1) / vpp)``."""
    slots = max(moe_layers_per_rank) * (microbatches + (pp - 1) / vpp)
    return (published_s - planned_s) / slots if slots > 0 else 0.0


def fit_per_layer_s(needed_s: Sequence[float]) -> float:
    """The fitted ``c`` of one dispatcher: the median over that dispatcher's fit-set runs whose every forward
    carries the term of :func:`per_layer_needed_s` divided by the run's :func:`host_waits_per_layer` (seconds per
    wait); 0 without any."""
    vals = [float(g) for g in needed_s]
    return float(statistics.median(vals)) if vals else 0.0

