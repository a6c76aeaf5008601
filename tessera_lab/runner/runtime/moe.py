"""Token routing and expert parallelism (EP) for the runner's MoE layers.

Routing (per *routing group*, i.e. the tokens one EP rank holds for one micro-batch):

1. router logits ``[n, E]`` -> softmax (float32) -> top-k experts per token, weights renormalised to sum to 1
   (Qwen3-Next's ``norm_topk_prob``);
2. optional capacity: each expert keeps at most ``C = min(n, ceil(capacity_factor * n * k / E))`` of this
   group's assignments, first come first served in (token, slot) order; the rest are *dropped* (they add
   nothing to the token's output; the residual and shared expert still carry it). Kept and dropped counts are
   exact integers per expert (:class:`RoutingPlan`);
3. kept assignments are sorted by expert (stable) -> a permuted token matrix ``[A, H]`` plus per-expert counts.

Expert parallelism over an EP group of ``P`` ranks holding ``E / P`` experts each (expert ``e`` on EP rank
``e // (E / P)``), :class:`ExpertParallelComm`:

* **count exchange**: ``all_to_all_single`` of the per-expert counts (``E / P`` int64 values to every peer), so
  each rank learns how many rows it receives from each peer for each of its experts;
* **dispatch**: ``all_to_all_single`` with uneven splits moves the permuted rows; the receiver reorders them
  expert-major (for each local expert, the rows of peer 0, then peer 1, ...) and runs one GEMM per expert;
* **combine**: the inverse reorder and the reverse ``all_to_all_single``.

Both all-to-alls are a custom autograd :class:`torch.autograd.Function` whose backward is the reverse
all-to-all (splits swapped). Ranks that send or receive zero rows take part with empty tensors. Forward
collectives run on ``group_fwd`` and backward ones on ``group_bwd`` (two process groups over the same ranks),
so a forward on one thread and a backward on another (overlapped 1F1B) never interleave collectives on one
group.

The single-process emulation :func:`group_exchange` produces, for every expert, exactly the row order an EP rank
sees (peer-major inside each expert), so the expert GEMMs have identical inputs and shapes; this is what makes
the single-process reference bitwise comparable (see :mod:`tessera_lab.runner.runtime.model`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tessera_lab.dynamic.routing import capacity_for
from tessera_lab.errors import ConfigError

__all__ = [
    "RoutingPlan",
    "route",
    "capacity_for",
    "expert_major",
    "permute",
    "unpermute",
    "ExpertParallelComm",
    "group_exchange",
    "all_to_all",
]


def expert_major(recv_counts, P: int, El: int, device):
    """Gather index from peer-major received rows to expert-major rows, its inverse, and rows per local expert
    (source-rank-major ``[p][e]`` -> expert-major ``[e][p]``; used by :meth:`ExpertParallelComm.dispatch` and the
    node-level executor)."""
    offsets, off = [], 0
    for q in range(P):
        row = []
        for e in range(El):
            row.append(off)
            off += recv_counts[q][e]
        offsets.append(row)
    idx = [torch.arange(offsets[q][e], offsets[q][e] + recv_counts[q][e]) for e in range(El) for q in range(P)]
    gather = (torch.cat(idx) if idx else torch.zeros(0, dtype=torch.int64)).to(device)
    inverse = torch.empty_like(gather)
    inverse[gather] = torch.arange(gather.numel(), device=gather.device)
    per_expert = [sum(recv_counts[q][e] for q in range(P)) for e in range(El)]
    return gather, inverse, per_expert


@dataclass
class RoutingPlan:
    """Routing of one group of ``n`` tokens to ``E`` experts with top-``k``.

    Attributes:
        topk_idx: ``[n, k]`` int64 expert of each (token, slot).
        topk_weight: ``[n, k]`` float32 combine weights (differentiable; renormalised top-k softmax).
        keep: ``[n, k]`` bool, False where capacity dropped the assignment.
        order: ``[A]`` int64 flat (token * k + slot) indices of the kept assignments, sorted by expert
            (stable, so token order inside an expert).
        send_counts: ``[E]`` int64 kept assignments per expert (``sum = A``).
        routed_counts: ``[E]`` int64 assignments per expert before capacity.
        dropped_counts: ``[E]`` int64 ``routed - kept``.
        capacity: per-expert capacity, or None.
    """

    topk_idx: torch.Tensor
    topk_weight: torch.Tensor
    keep: torch.Tensor
    order: torch.Tensor
    send_counts: torch.Tensor
    routed_counts: torch.Tensor
    dropped_counts: torch.Tensor
    capacity: int | None

    @property
    def num_tokens(self) -> int:
        return int(self.topk_idx.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.topk_idx.shape[1])


def route(logits: torch.Tensor, top_k: int, capacity_factor: float | None = None) -> RoutingPlan:
    """Route ``n`` tokens given router logits ``[n, E]`` (see the module docstring for the rules).

    Raises:
        ConfigError: ``top_k`` outside ``1..E``.
    """
    n, E = logits.shape
    if not 1 <= top_k <= E:
        raise ConfigError(f"top_k = {top_k} is out of range; allowed: 1..num_experts ({E})")
    probs = torch.softmax(logits.float(), dim=-1)
    w, idx = torch.topk(probs, top_k, dim=-1)
    w = w / w.sum(dim=-1, keepdim=True)
    flat = idx.reshape(-1)
    routed = torch.bincount(flat, minlength=E)
    cap = capacity_for(n, top_k, E, capacity_factor)
    if cap is None:
        keep_flat = torch.ones_like(flat, dtype=torch.bool)
    else:
        onehot = F.one_hot(flat, E)
        pos = (torch.cumsum(onehot, dim=0) * onehot).sum(dim=1) - 1  # arrival position inside its expert
        keep_flat = pos < cap
    kept_idx = torch.nonzero(keep_flat, as_tuple=False).reshape(-1)
    sort = torch.sort(flat[kept_idx], stable=True).indices
    order = kept_idx[sort]
    send = torch.bincount(flat[kept_idx], minlength=E)
    return RoutingPlan(idx, w, keep_flat.view(n, top_k), order, send, routed, routed - send, cap)


def permute(x: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
    """Rows of ``x`` ``[n, H]`` for the kept assignments, expert-sorted: ``[A, H]``."""
    return x.index_select(0, torch.div(plan.order, plan.top_k, rounding_mode="floor"))


def unpermute(y_perm: torch.Tensor, plan: RoutingPlan) -> torch.Tensor:
    """Weighted sum of expert outputs back per token: ``[A, H]`` -> ``[n, H]``.

    ``out[t] = sum_j w[t, j] * y[t, j]`` with dropped slots contributing zero (slot order fixed: j = 0..k-1).
    """
    n, k = plan.num_tokens, plan.top_k
    H = y_perm.shape[-1]
    slots = y_perm.new_zeros(n * k, H).index_copy(0, plan.order, y_perm)
    return (slots.view(n, k, H) * plan.topk_weight.to(y_perm.dtype).unsqueeze(-1)).sum(dim=1)


# ----------------------------------------------------------------------------------------------
# all-to-all with autograd
# ----------------------------------------------------------------------------------------------

CommHook = Callable[[str, float, float, int], None]  # (name, start_s, end_s, bytes)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward is the reverse exchange (splits swapped)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group_fwd, group_bwd, hook, name):  # noqa: D401
        ctx.splits = (list(in_splits), list(out_splits))
        ctx.group_bwd = group_bwd
        ctx.hook = hook
        ctx.name = name
        return _exchange(x, out_splits, in_splits, group_fwd, hook, name)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits = ctx.splits
        g = _exchange(grad.contiguous(), in_splits, out_splits, ctx.group_bwd, ctx.hook, ctx.name + "_bwd")
        return g, None, None, None, None, None, None


def _stamp(hook):
    """A time stamp from ``hook.clock`` (the executor's :class:`~tessera_lab.runner.runtime.devtime.StepClock`: CUDA
    events on a GPU), else the host clock (CPU only)."""
    clock = getattr(hook, "clock", None)
    return clock() if clock is not None else time.perf_counter()


def _exchange(x, out_splits, in_splits, group, hook, name) -> torch.Tensor:
    t0 = _stamp(hook) if hook is not None else None
    out = x.new_empty((int(sum(out_splits)),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
    if hook is not None:  # opt-in timing: stamps only (CUDA events on a GPU), never a stream synchronize
        hook(name, t0, _stamp(hook), int(x.numel() * x.element_size()))
    return out


def all_to_all(x: torch.Tensor, out_splits: Sequence[int], in_splits: Sequence[int], group_fwd, group_bwd=None,
               hook: CommHook | None = None, name: str = "a2a") -> torch.Tensor:
    """Autograd-aware uneven ``all_to_all_single`` over dim 0: ``[sum(in_splits), ...] -> [sum(out_splits), ...]``."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group_fwd,
                           group_fwd if group_bwd is None else group_bwd, hook, name)


# ----------------------------------------------------------------------------------------------
# EP communicator and the single-process emulation
# ----------------------------------------------------------------------------------------------


@dataclass
class _Dispatch:
    recv_counts: list[list[int]]  # [P][E_local]
    in_splits: list[int]
    out_splits: list[int]
    to_expert_major: torch.Tensor  # gather index: src-major rows -> expert-major rows
    to_src_major: torch.Tensor  # inverse permutation
    per_expert: list[int]


class ExpertParallelComm:
    """Dispatch/combine over one EP group.

    Args:
        group_fwd, group_bwd: process groups over the same EP ranks (forward and backward collectives).
        ep_size: ``P``; ep_rank: this rank's index in the group (its experts are
            ``ep_rank * E/P .. (ep_rank + 1) * E/P - 1``).
        num_experts: ``E`` (a multiple of ``P``).
        hook: optional ``hook(name, start_s, end_s, bytes)`` called after each exchange (for traces).

    Raises:
        ConfigError: ``num_experts`` not a multiple of ``ep_size``.
    """

    def __init__(self, group_fwd, group_bwd, ep_size: int, ep_rank: int, num_experts: int,
                 hook: CommHook | None = None):
        if num_experts % ep_size:
            raise ConfigError(f"num_experts = {num_experts} must be a multiple of ep = {ep_size}")
        self.group_fwd, self.group_bwd = group_fwd, group_bwd
        self.ep_size, self.ep_rank = ep_size, ep_rank
        self.num_experts = num_experts
        self.experts_per_rank = num_experts // ep_size
        self.hook = hook
        #: optional ``piggyback() -> list[int] | None``: extra ints sent to every peer with the next count
        #: exchange (the same K on every rank of the group), delivered as ``on_piggyback(rows [P][K])``
        self.piggyback = None
        self.on_piggyback = None

    @property
    def local_experts(self) -> list[int]:
        """Global ids of the experts this rank holds."""
        el = self.experts_per_rank
        return list(range(self.ep_rank * el, (self.ep_rank + 1) * el))

    def exchange_counts(self, send_counts: torch.Tensor) -> list[list[int]]:
        """Count exchange: ``send_counts`` ``[E]`` -> rows received ``[P][E/P]`` (peer, local expert)."""
        P, El = self.ep_size, self.experts_per_rank
        extra = self.piggyback() if self.piggyback is not None else None
        K = len(extra) if extra else 0
        msg = send_counts.to(torch.int64).reshape(P, El)
        if K:
            ext = torch.tensor(extra, dtype=torch.int64, device=send_counts.device).reshape(1, K).expand(P, K)
            msg = torch.cat([msg, ext], dim=1)
        recv = torch.empty(P * (El + K), dtype=torch.int64, device=send_counts.device)
        t0 = _stamp(self.hook) if self.hook is not None else None
        dist.all_to_all_single(recv, msg.contiguous().reshape(-1), group=self.group_fwd)
        if self.hook is not None:
            self.hook("ep_counts", t0, _stamp(self.hook), int(msg.numel() * 8))
        rows = recv.view(P, El + K)
        if K and self.on_piggyback is not None:
            self.on_piggyback(rows[:, El:].tolist())
        return rows[:, :El].tolist()

    def dispatch(self, x_perm: torch.Tensor, send_counts: torch.Tensor) -> tuple[list[torch.Tensor], _Dispatch]:
        """Send expert-sorted rows ``[A, H]`` to the experts' owners; returns one ``[M_e, H]`` per local expert."""
        P, El = self.ep_size, self.experts_per_rank
        sc = send_counts.tolist()
        in_splits = [sum(sc[p * El:(p + 1) * El]) for p in range(P)]
        recv_counts = self.exchange_counts(send_counts)
        out_splits = [sum(r) for r in recv_counts]
        recv = all_to_all(x_perm, out_splits, in_splits, self.group_fwd, self.group_bwd, self.hook, "ep_dispatch")
        gather, inverse, per_expert = expert_major(recv_counts, P, El, x_perm.device)
        xs = list(recv.index_select(0, gather).split(per_expert, dim=0))
        return xs, _Dispatch(recv_counts, in_splits, out_splits, gather, inverse, per_expert)

    def combine(self, ys: Sequence[torch.Tensor], handle: _Dispatch) -> torch.Tensor:
        """Inverse of :meth:`dispatch`: per-local-expert outputs -> this rank's ``[A, H]`` expert-sorted rows."""
        y = torch.cat(list(ys), dim=0).index_select(0, handle.to_src_major)
        return all_to_all(y, handle.in_splits, handle.out_splits, self.group_fwd, self.group_bwd, self.hook,
                          "ep_combine")


def group_exchange(x_perms: Sequence[torch.Tensor], send_counts: Sequence[torch.Tensor], num_experts: int):
    """Single-process emulation of dispatch for several routing groups holding all ``E`` experts.

    Returns ``(xs, split)``: ``xs[e]`` is expert ``e``'s input, the rows of group 0, then group 1, ... (the
    order an EP rank builds), and ``split(ys)`` maps per-expert outputs back to each group's ``[A_g, H]``.
    """
    G = len(x_perms)
    counts = [c.tolist() for c in send_counts]
    pieces = [list(x_perms[g].split(counts[g], dim=0)) for g in range(G)]
    xs = [torch.cat([pieces[g][e] for g in range(G)], dim=0) for e in range(num_experts)]

    def split(ys: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        per = [list(ys[e].split([counts[g][e] for g in range(G)], dim=0)) for e in range(num_experts)]
        return [torch.cat([per[e][g] for e in range(num_experts)], dim=0) for g in range(G)]

    return xs, split
