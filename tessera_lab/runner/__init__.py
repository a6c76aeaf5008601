"""The runner: a tiny Qwen3-Next-like MoE model trained with pipeline and expert parallelism on torch.distributed.

Packages, one per job:

=============  ===============================================================================================
``runtime``    the training runtime: ``specs`` (``TinyConfig``, ``WorldSpec``, ``RunSpec``; torch-free),
               ``layers`` / ``reference`` / ``model`` (the tiny model, the single-process reference), ``moe``
               (routing, expert parallelism), ``nodes`` (a stage as nodes on compute and communication
               streams), ``orders`` / ``pairs`` (issue orders, pair handlers), ``transport`` (p2p batches),
               ``nccl_cpu`` (ProcessGroupNCCL's p2p API over gloo), ``devtime`` (CUDA events / host clock), ``executor`` (lowered
               action lists only), ``gradsync`` (ordered reduce-scatter), ``gaps`` (run --dynamic), ``topology``,
               ``train``, ``pipeline``, ``capacity``
``launch``     ``spawn`` (local spawner), ``supervise`` (heartbeats, faults), ``worker``, ``results``,
               ``dynamic_report``, ``memory`` (peak memory and its prediction), ``launch`` (the ``run`` command
               line and the torchrun entry)
``measure``    layer pairs measured by running them with the runtime (``harness``, ``ranks``, ``sizing``, ``assemble``,
               ``dryrun``), and the op table (``optable``)
``testbed``    the CPU testbed (``calibrate``, ``predict``, ``sharing``, ``probe``, ``work_probe``, ``validate``):
               models CPU time sharing, does not transfer to GPUs; the runtime never imports it
=============  ===============================================================================================

Quick use (spawns 4 local processes on CPU with gloo)::

    from tessera_lab.runner import WorldSpec, RunSpec, spawn
    res = spawn(WorldSpec(pp=2, ep=2), [RunSpec(schedule="1f1b", steps=3, check_reference=True)])
    res.losses(), res.job(0)["reference"], res.timing_table()

Command line: ``tessera-lab run --pp 2 --ep 2 [--dp 1] [--schedule 1f1b] [--microbatches 4] [--steps 3]
[--plan PLAN.json] [--check] [--trace PATH] [--profile-store PATH] [--json PATH|-]``, or
``torchrun --nproc-per-node 4 -m tessera_lab.runner --pp 2 --ep 2 ...``.

When results are bitwise equal
------------------------------
Per-step losses, step-0 gradients and the weights after every update equal the single-process reference
(:func:`~tessera_lab.runner.runtime.model.reference_run` with ``matched=True``) bit for bit, for every schedule
(GPipe, 1F1B, interleaved, ZB-H1, ZB-H2, DualPipeV, overlapped 1F1B with or without W deferral, overlapped
pairs concurrent or serial; tested with pp 1, 2, 4, ep 1, 2, dp 1, 2, with capacity drops and with an EP rank
that receives no tokens), when all of these hold:

* CPU, ``RunSpec.deterministic=True`` (the default): one intra-op thread and
  ``torch.use_deterministic_algorithms(True)`` on the ranks and in the reference;
* ``grad_sync="ordered"`` (the default): replica gradients are reduce-scattered with each shard summed in replica
  order (the order the reference uses), then the shards all-gathered. With ``"allreduce"`` gloo's ring order differs; two replicas still agree (a + b =
  b + a) but from three on the sums round differently (seen: 1.5e-8 on the step-3 loss with ``ep=2, dp=2``);
* the reference uses the same decomposition (``matched=True``): per-shard GEMMs of the non-expert layers, one
  GEMM per expert over the rows of the EP group in rank order, per-replica gradient accumulators, loss sums
  added in (micro-batch, replica) order. Against the plain model on whole micro-batches (``matched=False``) the
  GEMM shapes differ, so agreement is to float tolerance (~1e-7 relative on the loss);
* tensors read by more than two consumers fan out through :func:`~tessera_lab.runner.runtime.model.fanout`, so the
  gradient sum does not depend on the autograd engine's visiting order (already built into the model).

Why the schedule does not matter: each micro-batch's forward and backward are the same operations whatever the
order, and each parameter receives its per-micro-batch gradients in micro-batch order on every schedule (W
deferral keeps W in micro-batch order per stage). On GPUs (NCCL) results match to float tolerance only:
other kernels than the CPU reference, and no deterministic mode is set.

Importing this package does not import torch; ``model``, ``moe`` and ``pipeline`` do.
"""

__all__ = ["RunnerError", "RunResult", "RunSpec", "TinyConfig", "WorldSpec",
           "observed_timeline", "spawn", "write_trace"]


def __getattr__(name: str):
    """The public names, imported from :mod:`.launch.launch` on first use (PEP 562), so that importing a light
    submodule (``launch.supervise`` when the CLI parses ``TESSERA_LAB_*`` before every command) does not import
    the launcher, its results and numpy."""
    if name in __all__:
        from .launch import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
