"""``measure --dry-run``: what a ``cpu`` / ``cuda`` measurement would do and hold, before anything starts.

The measured layers are built on the meta device exactly as a measuring rank builds them
(:func:`~tessera_lab.runner.runtime.topology.build_measured_stages`: layers 1 and 2 alone, this rank's experts), so
the parameter counts are the ones the run allocates, not a formula beside it. Host memory per process
(:func:`host_memory`, bytes):

* ``cuda``: the parameters live on the GPU; the host holds the CPU draws of one parameter while it is initialised
  (the normal draw and its scaled copy: 2 x the largest parameter) or one input ``[mbs, T, H]`` while it is
  copied to the GPU, whichever is larger;
* ``cpu``: parameters, their gradients, the three inputs and the same init draws; the activations of a forward
  are not counted (they depend on the order the pair is run in);

plus this process's peak resident memory after importing torch (measured here; a GPU process adds its CUDA
context, which is not counted). float32 throughout (4 bytes).

The estimated time is the budget (the probe sizes repeats, orders and the size factor to ``--budget-s``, and the
processes are killed after ``--timeout``); initialising the layers is estimated from the normal-draw rate of
torch's CPU generator measured here (one thread, as the ranks run).
"""

from __future__ import annotations

import resource
import time
from typing import Any

from .harness import MeasureSetup
from .sizing import pair_rounds

__all__ = ["measured_layers_meta", "host_memory", "dry_run_text", "GiB"]

#: bytes per GiB
GiB = 2**30
_F32 = 4


def measured_layers_meta(cfg_d: dict[str, Any], ep: int) -> dict:
    """The measured stages of EP rank 0 (every rank keeps ``E / ep`` experts) built on the meta device:
    ``{1: StageModule, 2: StageModule}`` with shapes only."""
    from ..runtime.moe import ExpertParallelComm
    from ..runtime.specs import TinyConfig
    from ..runtime.topology import build_measured_stages

    cfg = TinyConfig.from_dict(cfg_d)
    local = ExpertParallelComm(None, None, ep, 0, cfg.num_experts).local_experts if ep > 1 else None
    return build_measured_stages(cfg, [1, 2], local, "meta")


def host_memory(cfg_d: dict[str, Any], ep: int, mbs: int, backend: str, base_bytes: int) -> dict[str, Any]:
    """Host bytes one measuring process holds at most (module docstring), from the meta-built layers.

    Returns ``{"total", "parameters", "largest_parameter", "input", "staging", "resident", "base",
    "parameter_count", "device"}``: bytes, except ``parameter_count``; ``device`` is the GPU bytes of parameters
    and gradients (``cuda``), else 0.
    """
    stages = measured_layers_meta(cfg_d, ep)
    sizes = [p.numel() for st in stages.values() for p in st.parameters()]
    params = sum(sizes) * _F32
    largest = max(sizes) * _F32
    one_input = mbs * cfg_d["seq_len"] * cfg_d["hidden_size"] * _F32
    if backend == "cuda":
        staging = max(2 * largest, one_input)
        resident, device = 0, 2 * params
    else:
        staging = 2 * largest
        resident, device = 2 * params + 3 * one_input, 0
    return {"total": base_bytes + resident + staging, "parameters": params, "largest_parameter": largest,
            "input": one_input, "staging": staging, "resident": resident, "base": base_bytes,
            "parameter_count": sum(sizes), "device": device}


def _draw_rate() -> float:
    """Normal draws per second of torch's CPU generator on one thread, measured here now (4 Mi draws)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        torch.randn(1024, generator=gen)
        t0 = time.perf_counter()
        torch.randn(1 << 22, generator=gen)
        return (1 << 22) / max(time.perf_counter() - t0, 1e-9)
    finally:
        torch.set_num_threads(threads)


def dry_run_text(model_name: str, setup: MeasureSetup, timeout_s: float) -> str:
    """The dry run's lines: the host memory per process first, then the steps and the estimated time."""
    import torch  # noqa: F401 - imported before the base memory is read, as a measuring process does

    backend, ep, (f0, cfg) = setup.backend, setup.ep, setup.ladder[0]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    mem = host_memory(cfg, ep, setup.mbs, backend, base)
    rate = _draw_rate()
    n_exp = cfg["num_experts"]
    what = ("parameters on the GPU; the host holds the init draws of the largest parameter or one input" if
            backend == "cuda" else "parameters + gradients + 3 inputs + init draws; activations not counted")
    lines = [f"host memory per process: {mem['total'] / GiB:.2f} GiB (computed from the measured layers built on "
             f"the meta device: {what}, {(mem['resident'] + mem['staging']) / GiB:.2f} GiB; plus "
             f"{mem['base'] / GiB:.2f} GiB measured: this process's peak resident memory after importing torch"
             + (", CUDA context not included)" if backend == "cuda" else ")")]
    if backend == "cuda":
        lines.append(f"GPU memory per process: {mem['device'] / GiB:.2f} GiB of parameters and gradients (computed; "
                     f"activations not included)")
    lines.append(f"measure {backend} dry run of {model_name}: nothing is started. Steps:")
    lines.append(f"  1. start {ep} processes ({'NCCL, one GPU each' if backend == 'cuda' else 'gloo'}) and join "
                 f"the group")
    lines.append(f"  2. build layers 1 (full_attention+moe) and 2 (linear_attention+moe) alone at size factor "
                 f"{f0:g}: hidden {cfg['hidden_size']}, {n_exp // ep} of {n_exp} experts per process, "
                 f"{mem['parameter_count']:,} parameters per process; initialising them takes about "
                 f"{mem['parameter_count'] / rate:.1f} s (at {rate / 1e6:.0f} M normal draws/s, measured here)")
    ladder = ", ".join(f"{f:g}" for f, _ in setup.ladder)
    lines.append(f"  3. probe one forward and one backward per layer kind; plan repeats and orders to the budget"
                 + (f"; size factors tried in turn: {ladder}" if len(setup.ladder) > 1 else ""))
    o = setup.opts
    rounds = pair_rounds(o["keep"], o["repeats"], o["warmup"])
    for i, (kf, kb) in enumerate(setup.jobs):
        lines.append(f"  {4 + i}. pair {i + 1}/{len(setup.jobs)}: F[{kf}] + BW[{kb}]: each side alone, program "
                     f"order, {o['keep']} candidate orders with successive halving: {rounds} rounds at repeats "
                     f"{o['repeats']}, warmup {o['warmup']} (sizing.pair_rounds; fewer if the budget says so)")
    budget = o["budget_s"]
    lines.append("estimated time: " + (f"at most about {budget:g} s (--budget-s: the probe sizes the work to it)"
                                       if budget else "no budget: as long as the work takes")
                 + f"; the processes are killed after --timeout {timeout_s:g} s")
    return "\n".join(lines)
