"""Each rank's peak memory in a run, beside the planner's prediction for it.

Observed (per rank, gathered to rank 0 after the jobs): on a GPU ``torch.cuda.max_memory_allocated`` (bytes of
tensors the caching allocator handed out, over the process's jobs); on CPU the process's peak resident set
(``ru_maxrss``), which also holds the torch runtime, so on CPU the two are not comparable (the rehearsal checks the
path, not the number).

Predicted (:func:`predicted_peak_bytes`): the planner's memory model (:mod:`tessera_lab.cost.memory`) applied to the
runner's model (:meth:`~tessera_lab.runner.runtime.specs.TinyConfig.to_hf_config`) at the run's sizes with fp32
activations: per stage, the parameters of its layers times the planner's bytes per parameter
(:func:`~tessera_lab.cost.memory.bytes_per_param`: 18 B, mixed-precision Adam; the runner keeps fp32 weights,
gradients and AdamW's two moments, 16 B) plus its layers' saved activation bytes per micro-batch times the
micro-batches in flight at the stage's peak (:func:`~tessera_lab.cost.memory.in_flight`). Schedules without a
formula there (DualPipeV) have no prediction (None).
"""

from __future__ import annotations

from typing import Any

__all__ = ["observed_peak", "predicted_peak_bytes", "peak_memory_record"]


def observed_peak(device) -> tuple[str, int]:
    """``(what, bytes)`` of this process's peak memory (module docstring)."""
    import resource

    import torch

    if device.type == "cuda":
        return "torch.cuda.max_memory_allocated", int(torch.cuda.max_memory_allocated(device))
    return "peak resident set of the process (ru_maxrss)", int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def predicted_peak_bytes(spec, world, boundaries: list[int], schedule: str) -> list[float] | None:
    """Predicted peak bytes per global rank (module docstring), or None for a schedule without a memory formula
    or more than one stage per rank.

    Args:
        spec: the job's :class:`~tessera_lab.runner.runtime.specs.RunSpec`; world: its ``WorldSpec``;
        boundaries: the stage boundaries run (``pp + 1`` layer indices); schedule: the schedule's name.
    """
    from tessera_lab.cost.memory import in_flight, layer_memory
    from tessera_lab.errors import ConfigError
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import ModelSpec
    from tessera_lab.model.tasks import decompose

    from ..runtime.topology import rank_coords

    if len(boundaries) != world.pp + 1:
        return None
    cfg = spec.model_config
    model = ModelSpec.from_hf_config(cfg.to_hf_config())
    par = ParallelConfig(pp=world.pp, ep=world.ep, dp=world.dp, tp=1, seq_len=cfg.seq_len,
                         micro_batch_size=spec.micro_batch_size, microbatches=spec.microbatches, dtype="fp32")
    mem = layer_memory(model, par, decompose(model, par))  # embedding, layers..., head
    per_stage = []
    for s in range(world.pp):
        lo, hi = boundaries[s], boundaries[s + 1]
        idx = list(range(lo + 1, hi + 1)) + ([0] if s == 0 else []) + ([len(mem) - 1] if s == world.pp - 1 else [])
        try:
            k = in_flight(schedule, world.pp, s, spec.microbatches)
        except ConfigError:
            return None
        per_stage.append(sum(mem[i].param_bytes + mem[i].activation_bytes * k for i in idx))
    return [per_stage[rank_coords(r, world.pp, world.ep, world.dp)[0]] for r in range(world.world_size)]


def peak_memory_record(observed: list[tuple[str, int]], predicted: list[float] | None) -> dict[str, Any]:
    """The job's ``peak_memory`` field: observed bytes per rank (and what they are), predicted bytes per rank."""
    return {"observed": observed[0][0], "observed_bytes": [b for _, b in observed],
            "predicted": "planner memory model (cost/memory.py) at the run's sizes, fp32 activations",
            "predicted_bytes": predicted}
