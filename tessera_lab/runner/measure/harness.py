"""The one measurement harness: a layer pair is measured by running it with the runtime's node executor
(:class:`tessera_lab.runner.runtime.nodes.StageProgram`, issued as the ``scheduled`` pair handler issues it) on a
real EP group of ``ep`` spawned processes (gloo on CPU, NCCL on GPUs), timed with the runtime's clock
(:class:`~tessera_lab.runner.runtime.devtime.StepClock`: CUDA events on a GPU, the host clock on CPU). It serves
``tessera-lab measure --backend cpu|cuda`` (any MoE model at its shapes times a size factor, or a runner model
``tiny-*`` at its own shapes).

Each rank builds only the two layers it measures, with only its own experts
(:func:`~tessera_lab.runner.runtime.topology.build_measured_stages`: constructed on the meta device, then allocated
and initialised by name), never the whole model; :mod:`tessera_lab.runner.measure.dryrun` says what that holds.

For every ordered pair of layer kinds ``(kind_f, kind_b)`` (the rows of the overlap table) the forward of a
``kind_f`` runner layer for micro-batch 1 is paired with the full backward (B with W) of a ``kind_b`` runner layer
for micro-batch 0. Runner layers are built at the model's shapes times the size factor ``f``
(:func:`runner_config_for`; the runner's linear attention uses the full-attention head counts and has no short
convolution, which the metadata says). Steps, on every rank of the EP group (rank 0 decides, every rank follows):

0. **sizing** (:mod:`tessera_lab.runner.measure.sizing`): a probe times one forward and one backward of each layer
   kind; rank 0 plans repeats and candidate orders to fit the time left of ``budget_s`` and halves the size factor
   and probes again when even the fewest do not fit; options the caller fixed are never reduced;
2. per pair, each side alone ``warmup + repeats`` times: per-node times from the runtime's events (the ten
   template keys of :mod:`tessera_lab.runner.runtime.orders`);
3. program order together ``warmup + repeats`` times; rank 0 fits the contention term over the pairs measured so
   far (:func:`tessera_lab.overlap.fit.fit_contention_samples`) and picks the candidates: program order,
   Megatron-Core's combined-1F1B order, then the best templates of an exhaustive search (CPU: host-issue semantics,
   :func:`~tessera_lab.runner.runtime.orders.host_issue_makespan`; CUDA: the two-lane model with the fitted
   contention), ``keep`` distinct orders;
4. successive halving (:func:`tessera_lab.runner.measure.sizing.halve`) until two remain, or until the next round
   would pass the pair's share of the budget (then it stops and says so); a challenger wins only when its upper
   quartile is below program order's lower quartile, else "not significant" keeps program order
   (:func:`tessera_lab.runner.measure.assemble.overlap_result`).

Progress (per pair, per candidate order, per halving round) goes to ``progress(line)``. Results are
:class:`~tessera_lab.overlap.results.OverlapResult` objects with per-node durations, every candidate's samples, the
decision and the sizing, so a profile can be refitted from its file (:func:`tessera_lab.overlap.profiles.refit`).
Seconds throughout.
"""

from __future__ import annotations

import datetime as _dt
import os
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from tessera_lab.errors import ConfigError

from .sizing import MIN_KEEP

__all__ = ["runner_config_for", "measure_layer_pairs", "prepare_measurement", "MeasureSetup", "preflight",
           "size_ladder", "MIXERS"]

#: the layer kinds the runner builds (``mixer+ffn``); its FFN is always MoE
MIXERS = ("linear_attention", "full_attention")


def _scaled(x: int, f: float) -> int:
    return max(1, int(round(x * f)))


def runner_config_for(model, size_factor: float, seq_len: int) -> dict[str, Any]:
    """The :class:`~tessera_lab.runner.runtime.specs.TinyConfig` fields (a dict) of four runner layers ``[linear, full,
    linear, full]`` at ``model``'s shapes times ``size_factor`` (hidden, head and expert widths, sequence
    length ``seq_len``; head counts, experts and top-k kept).

    Raises:
        ConfigError: the model has a layer kind the runner cannot build (a dense FFN).
    """
    from tessera_lab.model.spec import MOE

    bad = sorted({layer.kind for layer in model.stack.layers if layer.ffn != MOE})
    if bad:
        raise ConfigError(f"model {model.name}: layer kind(s) {bad} have a dense FFN, which the runner's executor "
                          f"does not build; allowed for --backend cpu/cuda: MoE layers (use --backend analytic)")
    f = size_factor
    seq = _scaled(seq_len, f)
    return {"vocab_size": 64, "hidden_size": _scaled(model.hidden_size, f), "num_layers": 4, "attention_ratio": 1,
            "num_heads": model.attention.num_attention_heads, "head_dim": _scaled(model.attention.head_dim, f),
            "num_kv_heads": model.attention.num_key_value_heads, "num_experts": model.moe.num_experts,
            "top_k": model.moe.num_experts_per_tok, "expert_width": _scaled(model.moe.moe_intermediate_size, f),
            "shared_expert_width": (_scaled(model.moe.shared_expert_intermediate_size, f)
                                    if model.moe.shared_expert_intermediate_size else 0),
            "seq_len": seq, "linear_chunk": min(64, seq)}




def size_ladder(model, size_factor: float, seq_len: int, *, fixed: bool) -> list[tuple[float, dict[str, Any]]]:
    """``(f, runner config)`` for ``f = size_factor / 2^i`` while the hidden size stays >= 32 and the head size >= 4
    (at most 4 steps); only ``size_factor`` when ``fixed``."""
    out = [(size_factor, runner_config_for(model, size_factor, seq_len))]
    while not fixed and len(out) < 4:
        f = out[-1][0] / 2
        cfg = runner_config_for(model, f, seq_len)
        if cfg["hidden_size"] < 32 or cfg["head_dim"] < 4:
            break
        out.append((f, cfg))
    return out


def _worker(rank: int, ep: int, store: str, jobs: list, ladder: list, mbs: int, opts: dict, cuda: bool,
            timeout_s: float, q) -> None:
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=ep,
                                timeout=_dt.timedelta(seconds=max(30.0, timeout_s)))
        if rank == 0:
            q.put(("ready", time.time()))
        try:
            from .ranks import measure_rank

            out = measure_rank(rank, ep, jobs, ladder, mbs, opts, device, cuda,
                               (lambda text: q.put(("progress", text))) if rank == 0 else (lambda text: None))
            dist.barrier()
        finally:
            dist.destroy_process_group()
        if rank == 0:
            q.put(("result", out))
    except BaseException:  # noqa: BLE001 - sent to the parent
        import traceback

        q.put(("error", rank, traceback.format_exc()))
        raise


def preflight(backend: str) -> None:
    """Raise :class:`~tessera_lab.overlap.bundles.MeasurementError` at once if ``backend`` cannot run here (no
    torch, no CUDA GPU, no gloo)."""
    from tessera_lab.overlap.bundles import MeasurementError

    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dev dependency
        raise MeasurementError(f"the {backend} backend needs torch ({exc}); pip install torch") from None
    if backend == "cuda" and not torch.cuda.is_available():
        raise MeasurementError("the cuda backend needs a CUDA GPU; torch.cuda.is_available() is False "
                               "(use --backend cpu or analytic)")
    if backend == "cpu" and not torch.distributed.is_available():
        raise MeasurementError("the cpu backend needs torch.distributed with gloo; this torch build lacks it")


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # pragma: no cover
        return None


@dataclass
class MeasureSetup:
    """A validated measurement before anything starts: ``ep`` processes on ``backend``, the size ``ladder``
    (:func:`size_ladder`), the ``(kind_f, kind_b)`` ``jobs``, ``mbs`` sequences per micro-batch and rank, and the
    options every rank reads (``opts``: repeats, warmup, keep, fixed, budget_s, t_start)."""

    backend: str
    ep: int
    ladder: list
    jobs: list
    mbs: int
    opts: dict


def prepare_measurement(model, parallel, backend: str, *, size_factor: float, repeats: int, warmup: int, keep: int,
                        budget_s: float | None, fixed: Sequence[str] = (),
                        pairs: Sequence[tuple[str, str]] | None = None) -> MeasureSetup:
    """Validate a measurement (arguments of :func:`measure_layer_pairs`) and lay it out, starting nothing and
    without looking at the GPUs (``measure --dry-run`` runs where they are not; :func:`check_gpus` does).

    Raises:
        ConfigError: naming the field, its value and the allowed range.
    """
    if backend not in ("cpu", "cuda"):
        raise ConfigError(f"field 'backend' = {backend!r} is unknown here; allowed: cpu, cuda")
    ep = parallel.ep
    if not 1 <= ep <= 8:
        raise ConfigError(f"field 'ep' = {ep} is out of range for the {backend} backend; allowed: 1..8 processes")
    if not (isinstance(keep, int) and keep >= MIN_KEEP):
        raise ConfigError(f"field 'keep' = {keep!r} is out of range; allowed: an integer >= {MIN_KEEP}")
    if budget_s is not None and not budget_s > 0:
        raise ConfigError(f"field 'budget_s' = {budget_s!r} is out of range; allowed: seconds > 0")
    fixed = frozenset(fixed)
    ladder = size_ladder(model, size_factor, parallel.seq_len, fixed=budget_s is None or "size_factor" in fixed)
    if ladder[0][1]["num_experts"] % ep:
        raise ConfigError(f"field 'ep' = {ep} must divide num_experts = {ladder[0][1]['num_experts']}")
    from tessera_lab.overlap.table import layer_kind_examples

    kinds = list(layer_kind_examples(model))
    jobs = [tuple(p) for p in pairs] if pairs is not None else [(a, b) for a in kinds for b in kinds]
    for kf, kb in jobs:
        for k in (kf, kb):
            if k not in kinds:
                raise ConfigError(f"field 'pairs' names layer kind {k!r}; allowed: {', '.join(kinds)}")
    opts = {"repeats": repeats, "warmup": warmup, "keep": keep, "fixed": sorted(fixed), "budget_s": budget_s,
            "t_start": time.time()}
    return MeasureSetup(backend, ep, ladder, jobs, parallel.micro_batch_size, opts)


def check_gpus(backend: str, ep: int) -> None:
    """Raise :class:`ConfigError` when ``backend`` is ``cuda`` and fewer than ``ep`` GPUs are visible."""
    if backend == "cuda":
        import torch

        if torch.cuda.device_count() < ep:
            raise ConfigError(f"field 'ep' = {ep} needs {ep} GPUs; this machine has {torch.cuda.device_count()}")


def _run_ranks(setup: MeasureSetup, timeout_s: float, say: Callable[[str], None]) -> tuple[dict, float | None]:
    """Spawn the ``ep`` measuring processes, relay their progress, return rank 0's result and when the group was
    ready (wall clock).

    Raises:
        MeasurementError: a rank failed or died, or ``timeout_s`` passed.
    """
    import queue as _queue

    import torch.multiprocessing as mp

    from tessera_lab.overlap.bundles import MeasurementError

    backend, t_start = setup.backend, setup.opts["t_start"]
    q = mp.get_context("spawn").Queue()
    got, ready_at = None, None
    with tempfile.TemporaryDirectory(prefix="tessera-measure-") as tmp:
        pc = mp.start_processes(_worker, args=(setup.ep, str(Path(tmp) / "store"), setup.jobs, setup.ladder,
                                               setup.mbs, setup.opts, backend == "cuda", timeout_s, q),
                                nprocs=setup.ep, start_method="spawn", join=False)
        deadline = time.monotonic() + timeout_s
        try:
            while got is None:
                if time.monotonic() > deadline:
                    raise MeasurementError(f"{backend} measurement did not finish within timeout_s = {timeout_s:g} s; "
                                           f"lower --budget-s, --repeats or --size-factor, or raise --timeout")
                try:
                    msg = q.get(timeout=0.5)
                except _queue.Empty:
                    if any(p.exitcode not in (None, 0) for p in pc.processes):
                        time.sleep(0.5)
                        if q.empty():
                            raise MeasurementError("a measuring process died without a message") from None
                    continue
                if msg[0] == "error":
                    raise MeasurementError(f"measuring rank {msg[1]} failed: {msg[2].strip().splitlines()[-1]}")
                if msg[0] == "ready":
                    ready_at = msg[1]
                    say(f"processes ready after {ready_at - t_start:.1f} s (spawn, torch import, process group)")
                elif msg[0] == "progress":
                    say(msg[1])
                else:
                    got = msg[1]
            pc.join(timeout=30)
        finally:
            for p in pc.processes:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    return got, ready_at


# params: the options of 'tessera-lab measure' (keyword-only after model, parallel and backend)
def measure_layer_pairs(model, parallel, backend: str = "cpu", *, size_factor: float = 0.125, repeats: int = 5,
                        warmup: int = 1, keep: int = 4, budget_s: float | None = None,
                        fixed: Sequence[str] = (), timeout_s: float = 600.0,
                        pairs: Sequence[tuple[str, str]] | None = None,
                        progress: Callable[[str], None] | None = None) -> list:
    """Measure the overlap table's pairs of ``model`` with the runtime's node executor (module docstring).

    Args:
        model: a :class:`~tessera_lab.model.spec.ModelSpec` with MoE layers; parallel: its
            :class:`~tessera_lab.model.hardware.ParallelConfig` (``ep`` processes, 1..8; ``seq_len`` and
            ``micro_batch_size`` set the tokens per rank).
        backend: ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per process).
        size_factor: widths and sequence length multiplier in (0, 1]; repeats >= 1, warmup >= 0; keep: candidate
            orders per pair (>= 2).
        budget_s: wall seconds the whole measurement may take, process start included (None: no sizing, the
            given work is run as is); the sizing reduces repeats, then candidate orders, then the size factor,
            except the options named in ``fixed`` (``"repeats"``, ``"keep"``, ``"size_factor"``).
        pairs: the ``(kind_f, kind_b)`` pairs to measure (default: every ordered pair of the model's layer kinds).
        progress: called with one line of text per step (process start, probe, plan, pair, candidate order,
            halving round).

    Returns:
        one :class:`~tessera_lab.overlap.results.OverlapResult` per pair; each result's metadata ``sizing`` holds
        the budget, the probe, the plan, what was reduced or skipped, wall and CPU seconds and the load average.

    Raises:
        ConfigError: bad sizes or a model the runner cannot build; MeasurementError: a rank failed or the
        measurement ran past ``timeout_s``.
    """
    from tessera_lab.overlap.environment import current_environment

    from .assemble import overlap_result

    cpu0 = time.process_time()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    setup = prepare_measurement(model, parallel, backend, size_factor=size_factor, repeats=repeats, warmup=warmup,
                                keep=keep, budget_s=budget_s, fixed=fixed, pairs=pairs)
    check_gpus(backend, setup.ep)
    t_start, ep = setup.opts["t_start"], setup.ep
    env = current_environment(backend)
    load_before = _loadavg()
    say = progress or (lambda text: None)
    say(f"starting {ep} {'NCCL' if backend == 'cuda' else 'gloo'} processes (load average {load_before})"
        + (f"; budget {budget_s:g} s" if budget_s is not None else ""))
    got, ready_at = _run_ranks(setup, timeout_s, say)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.time() - t_start
    cpu = (time.process_time() - cpu0) + (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    sizing = dict(got["sizing"])
    f = sizing["size_factor"]
    cfg = dict(setup.ladder)[f]
    load_after = _loadavg()
    sizing.update({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                   "cpu_s_note": "user + sys of this process and the measuring processes (spawn and import included)",
                   "startup_s": round(ready_at - t_start, 2) if ready_at else None,
                   "load_average_1m": {"before": load_before, "after": load_after}})
    common = {"backend": backend, "executor": "runner node-level pair executor (runner/runtime/nodes.py)",
              "dtype": "float32", "model_dtype": parallel.dtype,
              "shapes": {"runner_config": cfg, "tokens_per_rank": parallel.micro_batch_size * cfg["seq_len"],
                         "a": {"hidden": cfg["hidden_size"]}, "b": {"hidden": cfg["hidden_size"]}, "ep": ep},
              "spread": "iqr (q1, q3) and min/max over repeats",
              "size_factor": f, "world_size": ep, "comm": "nccl" if backend == "cuda" else "gloo",
              "comm_proxy": None, "clock": "CUDA events" if backend == "cuda" else "host clock (time.perf_counter)",
              "approximations": "runner layers: linear attention with the full-attention head counts, no short "
                                "convolution; fp32",
              "load_average_1m": {"before": load_before, "after": load_after}, "sizing": sizing}
    return [overlap_result(r, backend, env, common) for r in got["pairs"]]
