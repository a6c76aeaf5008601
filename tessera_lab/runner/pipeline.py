"""Pipeline stages and the executor that walks :mod:`tessera_lab.pipeline.schedules` action lists on torch.distributed.

Rank layout (world size ``pp * dp * ep``)::

    rank = pp_rank * (dp * ep) + dp_rank * ep + ep_rank        replica = dp_rank * ep + ep_rank

EP is innermost (an EP group is ``ep`` consecutive ranks, i.e. inside a node), PP outermost (only stage
boundaries talk, so PP may cross nodes). Every rank of a pipeline stage holds the same non-expert weights
(replicated over the ``dp * ep`` replicas, like Megatron's expert-data-parallel layout) and ``E / ep`` experts
(replicated over ``dp``); replica ``r`` trains on rows :func:`~tessera_lab.runner.model.shard_rows` of each
micro-batch. After the last action of a step the gradients are summed: non-expert ones over the replica group,
expert ones over the DP group, either with ``all_reduce`` or (``grad_sync="ordered"``, the deterministic
mode) with ``all_gather`` and a sum in replica order, which is what makes multi-step runs bitwise equal to
the reference.

The executor runs each rank's action list in order:

* ``F``: the stage input arrives (token ids on stage 0; else an activation received with ``irecv`` from the
  previous stage's rank, or handed over locally when that stage is on this rank), the stage module runs, the
  output is sent (``isend``) to the next stage's rank. On the last stage the loss sum is divided by the global
  token count ``N`` (so gradient accumulation over micro-batches and replicas sums to the batch mean).
* ``B``: the output gradient arrives (on the last stage backward starts from the scaled loss), autograd runs
  the backward, the input gradient goes to the previous stage.
* ``I`` / ``W``: as ``B`` but the GEMM weight gradients are deferred (:class:`~tessera_lab.runner.model.
  WeightGradStore`); ``W`` computes them later with the same kernels, in the same accumulation order, so the
  gradients equal the undeferred ones bit for bit.
* ``OVERLAP_F_B``: both inputs are received, then the forward runs on a side thread (CPU), on a side CUDA
  stream driven by that thread (GPU), while the backward runs on the main thread; each has its own EP process
  group (forward collectives on one, backward on the other), so the dispatch/combine all-to-alls of one
  micro-batch proceed while the other computes. (It is the forward that moves because autograd runs backward
  kernels on the streams their forward ops used.) Caveat on GPUs: NCCL collectives on two communicators
  issued concurrently from two threads can deadlock if ranks launch them in different orders; each group here
  sees one order on all ranks, but this path is untested without two GPUs.
* ``SEND_*`` / ``RECV_*`` (lowered schedules): the send is issued / the receive posted at that point.

Point-to-point transfers use ``batch_isend_irecv`` with tags ``(kind, producing stage, micro-batch)`` (gloo
matches by tag; NCCL by order, which the schedules keep). Sends are non-blocking and waited for at the end of
the step. Every action's start and end (``time.perf_counter``, seconds after a barrier at the start of the
step) is recorded, with receive waits and EP all-to-alls on the communication lane.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from tessera_lab.errors import ConfigError
from tessera_lab.model.layout import RankGrid
from tessera_lab.plan.partition import uniform_boundaries
from tessera_lab.pipeline.schedules import Action, ActionType, Schedule

from .launch import RunSpec, WorldSpec
from .model import (
    WEIGHT_GRAD_STORE,
    TinyConfig,
    TinyMoEModel,
    deterministic,
    forward_key,
    is_expert_param,
    make_batch,
    make_optimizer,
    shard_rows,
)
from .moe import ExpertParallelComm

__all__ = [
    "Topology",
    "rank_coords",
    "build_topology",
    "StageModule",
    "build_stages",
    "PipelineExecutor",
    "sync_grads",
    "run_job",
]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W


# ----------------------------------------------------------------------------------------------
# topology
# ----------------------------------------------------------------------------------------------


def rank_coords(rank: int, pp: int, ep: int, dp: int) -> tuple[int, int, int]:
    """``(pp_rank, dp_rank, ep_rank)`` of a global rank (:class:`~tessera_lab.model.layout.RankGrid` with tp=1)."""
    return RankGrid(pp=pp, dp=dp, ep=ep).coords(rank)[:3]


@dataclass
class Topology:
    """This rank's place in the ``pp x dp x ep`` grid and its process groups (None where size 1)."""

    pp: int
    ep: int
    dp: int
    rank: int
    pp_rank: int
    dp_rank: int
    ep_rank: int
    device: torch.device
    ep_fwd: Any = None
    ep_bwd: Any = None
    replica_group: Any = None
    dp_group: Any = None

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.ep

    @property
    def replicas(self) -> int:
        """``dp * ep``: ranks per pipeline stage, each with its own shard of every micro-batch."""
        return self.dp * self.ep

    @property
    def replica(self) -> int:
        return self.dp_rank * self.ep + self.ep_rank

    def global_rank(self, pp_rank: int, replica: int | None = None) -> int:
        """Global rank of ``pp_rank`` with this rank's (or the given) replica index."""
        return pp_rank * self.replicas + (self.replica if replica is None else replica)


def build_topology(world: WorldSpec, rank: int, device: torch.device) -> Topology:
    """Create the EP (forward and backward), replica and DP groups; every rank must call it (same order)."""
    pp, ep, dp = world.pp, world.ep, world.dp
    p, d, e = rank_coords(rank, pp, ep, dp)
    topo = Topology(pp, ep, dp, rank, p, d, e, device)
    R = dp * ep
    for pr in range(pp):
        for dr in range(dp):
            ranks = [pr * R + dr * ep + x for x in range(ep)]
            if ep > 1:
                gf = dist.new_group(ranks)
                gb = dist.new_group(ranks)
                if rank in ranks:
                    topo.ep_fwd, topo.ep_bwd = gf, gb
        if R > 1:
            ranks = [pr * R + x for x in range(R)]
            if dp == 1 and ep > 1:
                grp = None  # the EP forward group has the same members
            else:
                grp = dist.new_group(ranks)
            if rank in ranks:
                topo.replica_group = grp if grp is not None else topo.ep_fwd
        if dp > 1:
            for er in range(ep):
                ranks = [pr * R + dr * ep + er for dr in range(dp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    topo.dp_group = g
    return topo


# ----------------------------------------------------------------------------------------------
# stages
# ----------------------------------------------------------------------------------------------


class StageModule(nn.Module):
    """Stage ``stage`` of ``num_stages``: layers ``boundaries[stage] .. boundaries[stage+1]-1`` of ``model``,
    plus the embedding on stage 0 and the final norm and LM head on the last stage.

    ``forward(x)``: stage 0 takes token ids ``[b, T]`` int64, the others hidden states ``[b, T, H]`` float32;
    the last stage returns logits ``[b, T, V]``, the others hidden states ``[b, T, H]``. Set ``comm`` to an
    :class:`~tessera_lab.runner.moe.ExpertParallelComm` for expert parallelism (None: all experts local).
    """

    def __init__(self, model: TinyMoEModel, stage: int, num_stages: int, boundaries: list[int]):
        super().__init__()
        self.stage, self.num_stages = stage, num_stages
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        lo, hi = boundaries[stage], boundaries[stage + 1]
        self.layer_ids = list(range(lo, hi))
        self.embed = model.embed if self.is_first else None
        self.layers = nn.ModuleList(model.layers[i] for i in self.layer_ids)
        self.norm = model.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        self.comm: ExpertParallelComm | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.is_first else x
        for layer in self.layers:
            h = layer(h, comm=self.comm)
        if self.is_last:
            h = self.lm_head(self.norm(h))
        return h


def check_boundaries(boundaries, num_layers: int, num_stages: int) -> list[int]:
    """Validate a plan's ``boundaries`` (``num_stages + 1`` increasing layer indices from 0 to ``num_layers``).

    Raises:
        ConfigError: naming the field and what is allowed.
    """
    b = list(boundaries)
    if len(b) != num_stages + 1:
        raise ConfigError(
            f"plan field 'boundaries' has {len(b)} entries; allowed: num_stages + 1 = {num_stages + 1} "
            f"(one stage per rank x vpp)")
    if b[0] != 0 or b[-1] != num_layers:
        raise ConfigError(f"plan field 'boundaries' = {b} must start at 0 and end at num_layers = {num_layers}")
    if any(b[s + 1] <= b[s] for s in range(num_stages)):
        raise ConfigError(f"plan field 'boundaries' = {b} must be strictly increasing (every stage >= 1 layer)")
    return b


def build_stages(cfg: TinyConfig, boundaries: list[int], stages: list[int], num_stages: int,
                 local_experts: list[int] | None = None) -> tuple[TinyMoEModel, dict[int, StageModule]]:
    """The full model (deterministic init) cut into the given stages; with ``local_experts`` every MoE layer
    keeps only those experts. Returns ``(model, {stage: StageModule})``."""
    model = TinyMoEModel(cfg)
    if local_experts is not None:
        for layer in model.layers:
            layer.moe.keep_experts(local_experts)
    return model, {s: StageModule(model, s, num_stages, boundaries) for s in stages}


# ----------------------------------------------------------------------------------------------
# executor
# ----------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What one rank did in one step: ``loss_sums[mb]`` (last-stage holder, else None), ``events``
    ``(lane, type, stage, microbatch, start_s, end_s, label)`` and ``routing`` (per-call routing logs)."""

    loss_sums: dict[int, float] | None
    events: list[tuple]
    routing: list[dict] = field(default_factory=list)


class PipelineExecutor:
    """Runs one rank's action list per step (see the module docstring).

    Args:
        topo: this rank's :class:`Topology`.
        schedule: the :class:`~tessera_lab.pipeline.schedules.Schedule` (compute-only or lowered with SEND/RECV).
        stages: ``{stage: StageModule}`` held by this rank (``schedule.rank_stages(pp_rank)``).
        act_shape: ``(micro_batch_size, seq_len, hidden)`` of the tensors crossing stage boundaries.
        num_tokens: global tokens per step ``N`` (the loss divisor).
        overlap: ``"thread"`` (overlapped pairs run concurrently) or ``"serial"``.
        fault: ``{"rank", "step", "action"}``: raise before that action (tests).
        prefetch: post the next action's receives before running the current one (compute-only lists).
    """

    def __init__(self, topo: Topology, schedule: Schedule, stages: dict[int, StageModule], act_shape: tuple,
                 num_tokens: int, *, overlap: str = "thread", fault: dict | None = None, prefetch: bool = True):
        self.topo = topo
        self.sched = schedule
        self.stages = stages
        self.S = schedule.num_stages
        self.m = schedule.num_microbatches
        self.s2r = schedule.stage_to_rank
        self.me = topo.pp_rank
        self.actions = list(schedule.actions.get(self.me, []))
        self.explicit = any(a.is_comm for a in self.actions)
        self.act_shape = tuple(act_shape)
        self.N = num_tokens
        if overlap not in ("thread", "serial"):
            raise ConfigError(f"field 'overlap' = {overlap!r} is unknown; allowed: thread, serial")
        self.overlap = overlap
        self.fault = fault
        self.prefetch = prefetch
        init = (lambda: torch.cuda.set_device(topo.device)) if topo.device.type == "cuda" else None
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-side", initializer=init)
        self._side_stream = torch.cuda.Stream(topo.device) if topo.device.type == "cuda" else None
        self._lock = threading.Lock()
        self._tls = threading.local()
        for st in stages.values():
            if st.comm is not None:
                st.comm.hook = self._comm_hook

    def close(self) -> None:
        self._side.shutdown(wait=True)

    # -- recording ------------------------------------------------------------------------------
    def _now(self) -> float:
        return time.perf_counter() - self._t0

    def _event(self, lane: str, typ: str, stage: int, mb, start: float, end: float, label: str) -> None:
        with self._lock:
            self._events.append((lane, typ, stage, mb, start, end, label))

    def _comm_hook(self, name: str, start: float, end: float, nbytes: int) -> None:
        cur = getattr(self._tls, "action", (-1, None))
        self._event("comm", "ep_a2a", cur[0], cur[1], start - self._t0, end - self._t0, f"{name}[{cur[0]},{cur[1]}]")

    # -- p2p --------------------------------------------------------------------------------------
    def _tag(self, key: tuple) -> int:
        kind, stage, mb = key
        return ((0 if kind == "F" else 1) * self.S + stage) * self.m + mb + 1

    def _post_recvs(self, items: list[tuple[tuple, int]]) -> None:
        """Post receives for ``(key, src_pp_rank)`` pairs not yet posted (one ``batch_isend_irecv``)."""
        ops, keys = [], []
        for key, src in items:
            if key in self._recvs:
                continue
            buf = torch.empty(self.act_shape, dtype=torch.float32, device=self.topo.device)
            ops.append(dist.P2POp(dist.irecv, buf, self.topo.global_rank(src), tag=self._tag(key)))
            keys.append((key, buf))
        if not ops:
            return
        t = self._now()
        works = dist.batch_isend_irecv(ops)
        for (key, buf), w in zip(keys, works):
            self._recvs[key] = (w, buf, t)

    def _wait_recv(self, key: tuple) -> torch.Tensor:
        w, buf, t = self._recvs.pop(key)
        w.wait()
        kind, stage, mb = key
        typ = "RECV_F" if kind == "F" else "RECV_B"
        dst = stage + 1 if kind == "F" else stage - 1
        self._event("comm", typ, dst, mb, t, self._now(), f"{dst}{typ}{mb}")
        return buf

    def _send(self, items: list[tuple[tuple, torch.Tensor, int]]) -> None:
        """Issue non-blocking sends of ``(key, tensor, dst_pp_rank)`` (one ``batch_isend_irecv``)."""
        if not items:
            return
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.topo.global_rank(dst), tag=self._tag(key))
               for key, t, dst in items]
        now = self._now()
        for key, _, _ in items:
            typ = "SEND_F" if key[0] == "F" else "SEND_B"
            self._event("send", typ, key[1], key[2], now, now, f"{key[1]}{typ}{key[2]}")
        works = dist.batch_isend_irecv(ops)
        self._pending_sends.extend(zip(works, ops))

    # -- inputs -----------------------------------------------------------------------------------
    def _need_input(self, x: Action) -> tuple:
        """Make sure the input of leaf action ``x`` is on its way; returns a handle for :meth:`_get_input`."""
        s, i = x.stage, x.microbatch
        if x.type is _F:
            if s == 0:
                return ("tokens", i)
            key, src = ("F", s - 1, i), self.s2r[s - 1]
        elif x.type in (_B, _I):
            if s == self.S - 1:
                return ("none", None)
            key, src = ("G", s + 1, i), self.s2r[s + 1]
        else:
            return ("none", None)
        if src == self.me:
            return ("local", key)
        self._post_recvs([(key, src)])
        return ("recv", key)

    def _prefetch(self, a: Action) -> None:
        """Post the receives of the next action early, so its data can land while this action computes."""
        items = []
        for x in a.leaves():
            s, i = x.stage, x.microbatch
            if x.type is _F and s > 0 and self.s2r[s - 1] != self.me:
                items.append((("F", s - 1, i), self.s2r[s - 1]))
            elif x.type in (_B, _I) and s < self.S - 1 and self.s2r[s + 1] != self.me:
                items.append((("G", s + 1, i), self.s2r[s + 1]))
        self._post_recvs(items)

    def _get_input(self, handle: tuple, forward: bool):
        kind, key = handle
        if kind == "tokens":
            return self._inputs[key]
        if kind == "none":
            return None
        t = self._local.pop(key) if kind == "local" else self._wait_recv(key)
        return t.detach().requires_grad_(True) if forward else t

    # -- compute ----------------------------------------------------------------------------------
    def _forward(self, x: Action, inp: torch.Tensor, record: bool = True) -> torch.Tensor:
        s, i = x.stage, x.microbatch
        self._tls.action = (s, i)
        t = self._now()
        with forward_key((s, i)):
            out = self.stages[s](inp)
            if s == self.S - 1:
                loss = TinyMoEModel.loss_sum(out, self._targets[i])
                self._loss_sums[i] = float(loss.detach().item())
                out = loss / self.N
        self._event("compute" if record else "sub", "F", s, i, t, self._now(), f"{s}F{i}")
        self._saved[(s, i)] = (inp, out)
        return out

    def _backward(self, x: Action, grad, record: bool = True):
        s, i = x.stage, x.microbatch
        self._tls.action = (s, i)
        t = self._now()
        inp, out = self._saved.pop((s, i))
        if x.type is _I:
            WEIGHT_GRAD_STORE.defer((s, i))
        if grad is None:
            torch.autograd.backward(out)
        else:
            torch.autograd.backward(out, grad_tensors=grad)
        gx = inp.grad if s > 0 else None
        self._event("compute" if record else "sub", x.type.value, s, i, t, self._now(), f"{s}{x.type.value}{i}")
        return gx

    def _forward_side(self, x: Action, inp: torch.Tensor) -> torch.Tensor:
        """The forward of an overlapped pair, on the side thread (and, on GPU, the side stream: forward kernels
        go to the current stream, while autograd runs backward kernels on the streams of their forward ops,
        so it is the forward that has to move)."""
        if self._side_stream is None:
            return self._forward(x, inp, record=False)
        with torch.cuda.stream(self._side_stream):
            out = self._forward(x, inp, record=False)
        self._side_stream.synchronize()
        return out

    def _finish(self, x: Action, result, sends: list) -> None:
        """Route the output of leaf ``x`` (activation after F, input gradient after B/I)."""
        s, i = x.stage, x.microbatch
        if x.type is _F:
            if s == self.S - 1:
                return
            key, dst, t = ("F", s, i), self.s2r[s + 1], result.detach()
        else:
            if s == 0:
                return
            key, dst, t = ("G", s, i), self.s2r[s - 1], result
        if dst == self.me:
            self._local[key] = t
        elif self.explicit:
            self._outbox[key] = (t, dst)
        else:
            sends.append((key, t, dst))

    def _run_leaf(self, x: Action) -> None:
        if x.type is _W:
            t = self._now()
            WEIGHT_GRAD_STORE.flush((x.stage, x.microbatch))
            self._event("compute", "W", x.stage, x.microbatch, t, self._now(), str(x))
            return
        h = self._need_input(x)
        sends: list = []
        if x.type is _F:
            out = self._forward(x, self._get_input(h, True))
            self._finish(x, out, sends)
        else:
            gx = self._backward(x, self._get_input(h, False))
            self._finish(x, gx, sends)
        self._send(sends)

    def _run_pair(self, a: Action) -> None:
        f = next(x for x in a.sub_actions if x.type is _F)
        b = next(x for x in a.sub_actions if x.type is not _F)
        hf, hb = self._need_input(f), self._need_input(b)
        inp, grad = self._get_input(hf, True), self._get_input(hb, False)
        t = self._now()
        if self.overlap == "thread":
            if self._side_stream is not None:
                self._side_stream.wait_stream(torch.cuda.current_stream(self.topo.device))
            fut = self._side.submit(self._forward_side, f, inp)
            try:
                gx = self._backward(b, grad, record=False)
            finally:
                out = fut.result()  # re-raises a forward failure
        else:
            gx = self._backward(b, grad, record=False)
            out = self._forward(f, inp, record=False)
        self._event("compute", "OVERLAP_F_B", b.stage, b.microbatch, t, self._now(), str(a))
        sends: list = []
        self._finish(b, gx, sends)
        self._finish(f, out, sends)
        self._send(sends)

    def _run_comm(self, a: Action) -> None:
        s, i = a.stage, a.microbatch
        if a.type in (ActionType.SEND_F, ActionType.SEND_B):
            key = ("F", s, i) if a.type is ActionType.SEND_F else ("G", s, i)
            if key not in self._outbox:
                raise ConfigError(f"rank {self.me}: {a} comes before the action producing its data")
            t, dst = self._outbox.pop(key)
            self._send([(key, t, dst)])
        else:
            key, src = (("F", s - 1, i), self.s2r[s - 1]) if a.type is ActionType.RECV_F else (("G", s + 1, i), self.s2r[s + 1])
            if src != self.me:
                self._post_recvs([(key, src)])

    # -- step -------------------------------------------------------------------------------------
    def run_step(self, step: int, inputs: dict[int, torch.Tensor], targets: dict[int, torch.Tensor],
                 t0: float) -> StepRecord:
        """Run the action list once. ``inputs`` / ``targets``: micro-batch -> ``[b, T]`` token ids (only needed
        on the first / last stage's rank). ``t0``: ``time.perf_counter()`` at the step's start."""
        self._t0 = t0
        self._events: list[tuple] = []
        self._inputs, self._targets = inputs, targets
        self._saved: dict = {}
        self._local: dict = {}
        self._recvs: dict = {}
        self._outbox: dict = {}
        self._pending_sends: list = []
        self._loss_sums: dict[int, float] = {}
        fault = self.fault
        n = len(self.actions)
        for k, a in enumerate(self.actions):
            if fault and fault.get("rank") == self.topo.rank and fault.get("step", 0) == step and fault.get("action", 0) == k:
                raise RuntimeError(f"injected fault on rank {self.topo.rank} at step {step} before action {k} ({a})")
            if self.prefetch and k + 1 < n and not self.explicit:
                self._prefetch(self.actions[k + 1])
            if a.type is ActionType.OVERLAP_F_B:
                self._run_pair(a)
            elif a.is_comm:
                self._run_comm(a)
            else:
                self._run_leaf(a)
        for w, _ in self._pending_sends:
            w.wait()
        leftovers = [k for k in WEIGHT_GRAD_STORE.pending() if k[0] in self.stages]
        if self._saved or self._recvs or leftovers:
            raise RuntimeError(
                f"rank {self.me}: step ended with unfinished work: activations {sorted(self._saved)}, "
                f"receives {sorted(self._recvs)}, deferred W {leftovers}")
        holds_last = (self.S - 1) in self.stages
        return StepRecord(dict(self._loss_sums) if holds_last else None, list(self._events))


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------


def _reduce_flat(params: list[torch.Tensor], group, size: int, mode: str) -> None:
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    if mode == "ordered":
        parts = [torch.empty_like(flat) for _ in range(size)]
        dist.all_gather(parts, flat, group=group)
        acc = parts[0].clone()
        for q in parts[1:]:
            acc = acc + q
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
    stage), routed-expert parameters over the DP group. ``mode``: ``"ordered"`` (all_gather, then a sum in
    replica order: deterministic, bitwise equal to the reference) or ``"allreduce"``."""
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
    sched = spec.validate(world)
    cfg = spec.model_config
    S = sched.num_stages
    boundaries = check_boundaries(spec.boundaries or uniform_boundaries(cfg.num_layers, S), cfg.num_layers, S)
    # deterministic mode is a CPU mode (on CUDA it would need CUBLAS_WORKSPACE_CONFIG and still not be bitwise
    # equal to the CPU reference)
    ctx = deterministic(1) if spec.deterministic and topo.device.type == "cpu" else contextlib.nullcontext()
    with ctx:
        return _run_job(world, topo, spec, sched, boundaries, out_dir)


def _run_job(world, topo, spec, sched, boundaries, out_dir):
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
    names = {id(p): n for n, p in model.named_parameters()}
    seen: set[int] = set()
    named = []
    for s in my_stages:
        for p in stages[s].parameters():
            if id(p) not in seen:
                seen.add(id(p))
                named.append((names[id(p)], p))
    model.to(topo.device)
    opt = make_optimizer([p for _, p in named], spec.lr)
    N = m * R * mbs * T
    ex = PipelineExecutor(topo, sched, stages, (mbs, T, cfg.hidden_size), N, overlap=spec.overlap, fault=spec.fault)
    route_log: list = []
    for s in my_stages:
        for layer in stages[s].layers:
            layer.moe.route_log = route_log
    records = []
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
            t0 = time.perf_counter()
            rec = ex.run_step(step, inputs, targets, t0)
            t_sync = time.perf_counter()
            sync_grads(named, topo, spec.grad_sync)
            if spec.save_grads and step == 0 and out_dir:
                torch.save({n: p.grad.detach().cpu().clone() for n, p in named},
                           Path(out_dir) / f"grads_{spec.name or 'job'}_rank{topo.rank}.pt")
            opt.step()
            t_end = time.perf_counter()
            rec.events.append(("step", "grad_sync+optimizer", -1, None, t_sync - t0, t_end - t0, "sync+opt"))
            payload = {"rank": topo.rank, "pp_rank": topo.pp_rank, "replica": topo.replica, "t0": t0,
                       "host": socket.gethostname(),
                       "loss_sums": rec.loss_sums, "events": rec.events, "routing": list(route_log),
                       "step_time": t_end - t0}
            gathered: list = [None] * topo.world_size
            dist.all_gather_object(gathered, payload)
            records.append(gathered)
    finally:
        ex.close()
        for s in my_stages:
            for layer in stages[s].layers:
                layer.moe.route_log = None
    if topo.rank != 0:
        return None
    return {"schedule": sched, "boundaries": boundaries, "records": records, "num_tokens": N}
