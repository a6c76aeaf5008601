"""One training job on this rank: build the stages, run the steps, sum gradients over replicas, step the optimizer."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tessera_lab.errors import ConfigError
from tessera_lab.plan.partition import uniform_boundaries

from .executor import ExecutorOptions, PipelineExecutor
from .gradsync import ordered_all_reduce
from .layers import WEIGHT_GRAD_STORE, is_expert_param, read_route_log
from .moe import ExpertParallelComm
from .reference import deterministic, make_batch, make_optimizer, shard_rows
from .specs import RunSpec, WorldSpec
from .topology import Topology, build_stages, check_boundaries

__all__ = ["sync_grads", "run_job", "run_jobs"]


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------


def _reduce_flat(params: list[torch.Tensor], group, size: int, mode: str) -> None:
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    if mode == "ordered":
        acc = ordered_all_reduce(flat, group, size)
    else:
        dist.all_reduce(flat, group=group)
        acc = flat
    off = 0
    for p in params:
        n = p.numel()
        p.grad = acc[off:off + n].view_as(p).clone()
        off += n


def sync_grads(named_params: list[tuple[str, torch.Tensor]], topo: Topology, mode: str = "ordered") -> None:
    """Sum gradients over replicas: non-expert parameters over the replica group (``dp * ep`` ranks of the
    stage), routed-expert parameters over the DP group. ``mode``: ``"ordered"`` (a reduce-scatter summing each
    shard in replica order, then an all-gather of the shards, :mod:`tessera_lab.runner.runtime.gradsync`: deterministic,
    bitwise equal to the reference) or ``"allreduce"`` (``dist.all_reduce``, the backend's order)."""
    if mode not in ("ordered", "allreduce"):
        raise ConfigError(f"field 'grad_sync' = {mode!r} is unknown; allowed: ordered, allreduce")
    dense = [p for n, p in named_params if not is_expert_param(n)]
    experts = [p for n, p in named_params if is_expert_param(n)]
    if topo.replica_group is not None:
        _reduce_flat(dense, topo.replica_group, topo.replicas, mode)
    if topo.dp_group is not None:
        _reduce_flat(experts, topo.dp_group, topo.dp, mode)


# ----------------------------------------------------------------------------------------------
# one job
# ----------------------------------------------------------------------------------------------


def run_job(world: WorldSpec, topo: Topology, spec: RunSpec, out_dir: str | None = None) -> dict | None:
    """Train ``spec`` on this rank; returns the job's raw per-step records gathered on rank 0 (None elsewhere).

    With ``spec.save_grads`` every rank writes ``{out_dir}/grads_{spec.name}_rank{rank}.pt`` holding the
    gradients of step 0 (after the replica sum, before the update) by parameter name.
    """
    return run_jobs(world, topo, [spec], out_dir)[0]


def run_jobs(world: WorldSpec, topo: Topology, specs: list[RunSpec], out_dir: str | None = None, *,
             interleave: bool = False) -> list[dict | None]:
    """Run ``specs`` on this rank, one after the other, or with ``interleave`` a step of each in turn
    (round robin, every rank in the same order): drift of the machine's speed during the launch then falls
    on every job alike, so their comparison is fair. Each job keeps its own model, optimizer and executor;
    a step is whole (forward, backward, gradient sync, optimizer) before the next job's step starts, so the
    results equal those of separate runs. Returns :func:`run_job`'s value per job."""
    runs = [_job_steps(world, topo, spec, out_dir) for spec in specs]
    out: list[dict | None] = [None] * len(specs)
    alive = list(range(len(specs)))
    while alive:
        for k in list(alive) if interleave else alive[:1]:
            with _job_context(specs[k], topo):
                try:
                    next(runs[k])
                except StopIteration as stop:
                    out[k] = stop.value
                    alive.remove(k)
    return out


def _torch_profiler(topo: Topology):
    """With ``$TESSERA_LAB_TORCH_PROFILE`` set (a directory): a started ``torch.profiler.profile`` recording CPU
    and, on a GPU, CUDA activity (every stream: compute, the communication stream, NCCL's), exported as a Chrome
    trace per rank and job at the end; else None."""
    if not os.environ.get("TESSERA_LAB_TORCH_PROFILE"):
        return None
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if topo.device.type == "cuda" else [])
    prof = profile(activities=acts, record_shapes=False)
    prof.__enter__()
    return prof


def _job_context(spec: RunSpec, topo: Topology):
    # deterministic mode is a CPU mode (on CUDA it would need CUBLAS_WORKSPACE_CONFIG and still not be bitwise
    # equal to the CPU reference)
    return deterministic(1) if spec.deterministic and topo.device.type == "cpu" else contextlib.nullcontext()


def _job_steps(world: WorldSpec, topo: Topology, spec: RunSpec, out_dir: str | None):
    """Generator: builds the job on its first step, yields after each step, returns the raw records."""
    sched = spec.validate(world)
    cfg = spec.model_config
    S = sched.num_stages
    boundaries = check_boundaries(spec.boundaries or uniform_boundaries(cfg.num_layers, S), cfg.num_layers, S)
    return (yield from _run_job(world, topo, spec, sched, boundaries, out_dir))


def _rank_parameters(model, stages: dict, my_stages) -> tuple[dict[int, str], list[tuple[str, Any]]]:
    """``(name by parameter id, [(name, parameter)])``: this rank's parameters over its stages in order, each once
    (a parameter shared by two of its stages is listed at its first)."""
    names = {id(p): n for n, p in model.named_parameters()}
    seen: set[int] = set()
    named = []
    for s in my_stages:
        for p in stages[s].parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((names[id(p)], p))
    return names, named


def _export_profile(prof, spec, topo) -> None:
    """Close the torch profiler and write its Chrome trace to ``$TESSERA_LAB_TORCH_PROFILE/<job>-rank<r>.json``."""
    prof.__exit__(None, None, None)
    out = Path(os.environ["TESSERA_LAB_TORCH_PROFILE"])
    out.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(out / f"{spec.name or 'job'}-rank{topo.rank}.json"))


def _attach_route_log(stages: dict, my_stages, log: list | None) -> None:
    """Point the MoE router of every layer of this rank's stages at ``log`` (None: detach)."""
    for s in my_stages:
        for layer in stages[s].layers:
            layer.moe.route_log = log


def _run_job(world, topo, spec, sched, boundaries, out_dir):
    """Run one job on this rank, a step per ``next()``; rank 0 returns every rank's step records at the end."""
    cfg = spec.model_config
    S, m, mbs, T = sched.num_stages, spec.microbatches, spec.micro_batch_size, cfg.seq_len
    R = topo.replicas
    comm = None
    local = None
    if topo.ep > 1:
        comm = ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, topo.ep, topo.ep_rank, cfg.num_experts)
        local = comm.local_experts
    my_stages = sched.rank_stages(topo.pp_rank)
    model, stages = build_stages(cfg, boundaries, my_stages, S, local)
    for st in stages.values():
        st.comm = comm
    names, named = _rank_parameters(model, stages, my_stages)
    model.to(topo.device)
    opt = make_optimizer([p for _, p in named], spec.lr)
    N = m * R * mbs * T
    ex = PipelineExecutor(topo, sched, stages, (mbs, T, cfg.hidden_size), N, ExecutorOptions(
        pair_exec=spec.pair_exec, pair_order=spec.pair_order, fault=spec.fault,
        w_cap=(spec.w_cap or world.pp) if spec.gaps else None, fill=spec.gaps == "fill",
        p2p=getattr(world, "p2p", "auto"), p2p_timeout_s=world.timeout_s))
    buckets = None  # run --dynamic: the replica gradient sum in chunks launched in receive waits (runner/runtime/gaps.py)
    if ex.gaps is not None and ex.gaps.fill and spec.grad_sync == "ordered" and topo.replicas > 1:
        from .gaps import GradBuckets

        buckets = ex.gaps.buckets = GradBuckets(
            ex.gaps.actions, {s: [(names[id(p)], p) for p in stages[s].parameters()] for s in my_stages},
            (topo.replica_group, topo.replicas, topo.dp_group, topo.dp), is_expert_param, m)
    route_log: list = []
    _attach_route_log(stages, my_stages, route_log)
    records = []
    prof = _torch_profiler(topo)
    try:
        for step in range(spec.steps):
            batch = make_batch(cfg, step, m * R * mbs, spec.data_seed).to(topo.device)
            rows = {i: batch[shard_rows(i, topo.replica, R, mbs)] for i in range(m)}
            inputs = {i: r[:, :-1] for i, r in rows.items()}
            targets = {i: r[:, 1:] for i, r in rows.items()}
            for _, p in named:
                p.grad = None
            route_log.clear()
            WEIGHT_GRAD_STORE.clear()
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            rec = ex.run_step(step, inputs, targets, t0)
            t_sync, c_sync = time.perf_counter(), time.process_time()
            if buckets is not None:
                buckets.finish()
            else:
                sync_grads(named, topo, spec.grad_sync)
            if spec.save_grads and step == 0 and out_dir:
                torch.save({n: p.grad.detach().cpu().clone() for n, p in named},
                           Path(out_dir) / f"grads_{spec.name or 'job'}_rank{topo.rank}.pt")
            opt.step()
            t_end, c_end = ex.clock.settle(), time.process_time()  # on CUDA after the sync's and step's kernels ran
            rec.events.append(("step", "grad_sync+optimizer", -1, None, t_sync - t0, t_end - t0, "sync+opt"))
            payload = {"rank": topo.rank, "pp_rank": topo.pp_rank, "replica": topo.replica, "t0": t0,
                       "host": socket.gethostname(),
                       "loss_sums": rec.loss_sums, "events": rec.events, "routing": list(read_route_log(route_log)),  # one host read per step
                       "step_time": t_end - t0, "dynamic": rec.dynamic,
                       # CPU-seconds of this process (every thread: gloo's included) in the step's actions and
                       # in the gradient sync + optimizer; not inflated by waiting for a core
                       "cpu_s": {"actions": c_sync - c0, "sync_opt": c_end - c_sync}}
            gathered: list = [None] * topo.world_size
            dist.all_gather_object(gathered, payload)
            records.append(gathered)
            if prof is not None:
                prof.step()
            yield
    finally:
        if prof is not None:
            _export_profile(prof, spec, topo)
        ex.close()
        _attach_route_log(stages, my_stages, None)
    if topo.rank != 0:
        return None
    pair = {"handler": ex.handler.name, "node_level": ex.node_level, "order_label": ex.pair_order_label,
            "template": list(ex.pair_template)}
    return {"schedule": sched, "boundaries": boundaries, "records": records, "num_tokens": N, "pair_exec": pair}
