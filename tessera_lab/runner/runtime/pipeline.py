"""Pipeline stages and the executor that walks :mod:`tessera_lab.pipeline.schedules` action lists on torch.distributed.

Rank layout (world size ``pp * dp * ep``)::

    rank = pp_rank * (dp * ep) + dp_rank * ep + ep_rank        replica = dp_rank * ep + ep_rank

EP is innermost (an EP group is ``ep`` consecutive ranks, i.e. inside a node), PP outermost (only stage
boundaries talk, so PP may cross nodes). Every rank of a pipeline stage holds the same non-expert weights
(replicated over the ``dp * ep`` replicas, like Megatron's expert-data-parallel layout) and ``E / ep`` experts
(replicated over ``dp``); replica ``r`` trains on rows :func:`~tessera_lab.runner.runtime.model.shard_rows` of each
micro-batch. After the last action of a step the gradients are summed: non-expert ones over the replica group,
expert ones over the DP group, either with ``all_reduce`` or (``grad_sync="ordered"``, the deterministic
mode) with a reduce-scatter summing each shard in replica order and an all-gather of the shards
(:mod:`~tessera_lab.runner.runtime.gradsync`), which is what makes multi-step runs bitwise equal to the reference.

The executor runs each rank's action list in order:

* ``F``: the stage input arrives (token ids on stage 0; else an activation received with ``irecv`` from the
  previous stage's rank, or handed over locally when that stage is on this rank), the stage module runs, the
  output is sent (``isend``) to the next stage's rank. On the last stage the loss sum is divided by the global
  token count ``N`` (so gradient accumulation over micro-batches and replicas sums to the batch mean).
* ``B``: the output gradient arrives (on the last stage backward starts from the scaled loss), autograd runs
  the backward, the input gradient goes to the previous stage.
* ``I`` / ``W``: as ``B`` but the GEMM weight gradients are deferred (:class:`~tessera_lab.runner.runtime.model.
  WeightGradStore`); ``W`` computes them later with the same kernels, in the same accumulation order, so the
  gradients equal the undeferred ones bit for bit.
* ``OVERLAP_F_B``: both inputs are received, then the forward runs on a side thread (CPU), on one of two side
  CUDA streams driven by that thread (GPU; never the stream the paired backward runs on,
  :class:`~tessera_lab.runner.runtime.pairs.PairStreams`), while the backward runs on the main thread; each has its own EP process
  group (forward collectives on one, backward on the other), so the dispatch/combine all-to-alls of one
  micro-batch proceed while the other computes. (It is the forward that moves because autograd runs backward
  kernels on the streams their forward ops used.) Caveat on GPUs: NCCL collectives on two communicators
  issued concurrently from two threads can deadlock if ranks launch them in different orders; each group here
  sees one order on all ranks, but this path is untested without two GPUs.
* ``SEND_*`` / ``RECV_*``: the executor runs lowered lists only (:func:`tessera_lab.pipeline.passes.lower`); each
  maximal run of them is one batch (one ``batch_isend_irecv``, one NCCL group), posted where the list has it.

Point-to-point transfers go through :mod:`tessera_lab.runner.runtime.transport`: ``batch_isend_irecv``, one handle per
batch (NCCL returns one coalesced Work per batch); on gloo through the CPU layer
:mod:`~tessera_lab.runner.runtime.nccl_cpu` with NCCL's observable semantics (batches in posting order, a rank pair's
transfers matched in posting order, tags ignored, completion once the peer has posted), so an order NCCL would
deadlock on fails on CPU too. Sends are non-blocking and waited for
at the end of the step. Every action's start and end (``time.perf_counter``, seconds after a barrier at the start of the
step) is recorded, with receive waits and EP all-to-alls on the communication lane.
"""
from __future__ import annotations

from .executor import ExecutorOptions, PipelineExecutor, StepRecord
from .topology import StageModule, Topology, build_stages, build_topology, check_boundaries, rank_coords
from .train import run_job, sync_grads

__all__ = ["Topology", "rank_coords", "build_topology", "StageModule", "build_stages", "check_boundaries",
           "ExecutorOptions", "PipelineExecutor", "StepRecord", "sync_grads", "run_job"]
