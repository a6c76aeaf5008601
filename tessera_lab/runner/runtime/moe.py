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

**Capacity dispatch** (``ep_dispatch="capacity"``, :class:`CapacityDispatch`): fixed per-destination blocks of
``Cd`` rows and per-expert blocks of ``P * Ce`` rows (:func:`capacity_sizes`), indices built on the device, the
counts sent as an asynchronous all-to-all beside the rows, equal splits: no host read anywhere on the dispatch
path (the count exchange above is the ``uneven`` mode).

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
from typing import Any, Callable, Sequence

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
    "DISPATCH_MODES",
    "dispatch_mode",
    "padding_factor",
    "AUTO_MAX_PADDING",
    "dispatch_summary",
    "capacity_sizes",
    "send_index",
    "recv_index",
    "CapacityDispatch",
    "group_exchange_capacity",
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


def route(logits: torch.Tensor, top_k: int, capacity_factor: float | None = None, *,
          fixed: bool = False) -> RoutingPlan:
    """Route ``n`` tokens given router logits ``[n, E]`` (see the module docstring for the rules).

    Every step is a device op (no ``nonzero``, ``bincount`` or host read: counts are sums of comparisons), so
    routing itself never waits for the device. ``fixed=True`` keeps ``order`` at its full length ``n * k``
    (kept assignments expert-sorted first, then the dropped ones): the shape is known without reading a count
    (capacity dispatch, :class:`CapacityDispatch`). ``fixed=False`` cuts ``order`` to the ``A`` kept
    assignments, which with a capacity factor reads ``A`` on the host (the uneven path's sizes are host values).

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
    onehot = (flat.unsqueeze(1) == torch.arange(E, device=flat.device).unsqueeze(0)).to(torch.int64)  # [n*k, E]
    routed = onehot.sum(dim=0)
    cap = capacity_for(n, top_k, E, capacity_factor)
    if cap is None:
        keep_flat = torch.ones_like(flat, dtype=torch.bool)
        send = routed
    else:
        pos = (torch.cumsum(onehot, dim=0) * onehot).sum(dim=1) - 1  # arrival position inside its expert
        keep_flat = pos < cap
        send = (onehot * keep_flat.unsqueeze(1)).sum(dim=0)
    # stable sort by expert, dropped assignments (key E) last: kept ones in (expert, token, slot) order
    order = torch.sort(torch.where(keep_flat, flat, torch.full_like(flat, E)), stable=True).indices
    if not fixed and cap is not None:
        order = order[:int(send.sum())]  # host read: the uneven path sizes its tensors on the host anyway
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
# capacity-bounded dispatch: fixed shapes, indices built on the device, no host read
# ----------------------------------------------------------------------------------------------

DISPATCH_MODES = ("auto", "uneven", "capacity")


#: ``auto`` picks the capacity dispatch on CUDA only while its expert rows are at most this many times the routed
#: rows (:func:`padding_factor`): a chosen bound on the memory and FLOPs padding may cost to save a host read
AUTO_MAX_PADDING = 4.0


def padding_factor(n: int, top_k: int, num_experts: int, capacity_factor: float | None) -> float:
    """Expert rows a capacity dispatch processes per rank over the routed rows it receives on average:
    ``E * Ce / (n * k)`` (each rank runs ``E/P`` experts of ``P * Ce`` rows and receives ``n * k`` routed rows
    on average); ``E / k`` without a capacity factor, about ``cf`` with one."""
    ce = capacity_for(n, top_k, num_experts, capacity_factor)
    return num_experts * (n if ce is None else ce) / (n * top_k)


def dispatch_mode(mode: str, device: torch.device, n: int = 1, top_k: int = 1, num_experts: int = 1,
                  capacity_factor: float | None = None) -> str:
    """``"uneven"`` or ``"capacity"`` for ``mode``. ``auto``: capacity on CUDA, where a host read of the counts
    stalls the host behind the device queue, while :func:`padding_factor` of ``n`` tokens is at most
    :data:`AUTO_MAX_PADDING`; uneven on CPU (no device queue to wait for; padding only adds compute) and where
    padding would cost more (e.g. 512 experts, top 10, no capacity factor: 51x)."""
    if mode == "auto":
        if device.type != "cuda":
            return "uneven"
        return "capacity" if padding_factor(n, top_k, num_experts, capacity_factor) <= AUTO_MAX_PADDING else "uneven"
    return mode


def capacity_sizes(n: int, top_k: int, num_experts: int, ep: int, capacity_factor: float | None) -> tuple[int, int]:
    """``(Ce, Cd)``: rows one routing group of ``n`` tokens may send to one expert, and to one EP rank.

    ``Ce = capacity_for(n, k, E, cf)`` (the model's per-expert capacity, ``ceil(cf * n * k / E)`` capped at n,
    as Megatron-Core's and DeepSpeed's capacity factor), or ``n`` without a factor (a token picks an expert at
    most once). ``Cd = min(n * min(k, E/P), E/P * Ce)``: a token reaches at most ``min(k, E/P)`` experts of one
    rank, and each of them keeps at most ``Ce``. Every kept assignment therefore fits: a capacity dispatch drops
    nothing beyond the model's own capacity rule (the no-drop bound when ``cf`` is None)."""
    el = num_experts // ep
    ce = capacity_for(n, top_k, num_experts, capacity_factor)
    ce = n if ce is None else ce
    return ce, min(n * min(top_k, el), el * ce)


def dispatch_summary(mode: str, device_type: str, n: int, top_k: int, num_experts: int, ep: int,
                     capacity_factor: float | None) -> dict:
    """What a job's EP dispatch is (computed from the config, the same rule the MoE blocks apply per call):
    ``requested`` mode, resolved ``mode`` (:func:`dispatch_mode` on ``device_type`` ``"cpu"``/``"cuda"``),
    ``reason``, ``tokens_per_group`` ``n`` (tokens one rank routes per micro-batch and MoE layer) and
    ``padding_factor`` (:func:`padding_factor`). In capacity mode also, per rank and MoE call (rows of ``H``):
    ``capacity_per_expert`` Ce and ``capacity_per_destination`` Cd (:func:`capacity_sizes`), ``rows_sent``
    (``ep * Cd``, the fixed all-to-all), ``rows_routed`` (``n * k``, the assignments a rank routes; fewer are
    kept with a capacity factor) and ``expert_rows`` (``E/ep * ep * Ce``, rows its experts compute)."""
    pf = padding_factor(n, top_k, num_experts, capacity_factor)
    resolved = dispatch_mode(mode, torch.device(device_type), n, top_k, num_experts, capacity_factor)
    if mode != "auto":
        reason = "requested with --ep-dispatch or the model field ep_dispatch"
    elif device_type != "cuda":
        reason = "auto on CPU: no device queue to wait for, padding would only add compute"
    else:
        cmp = "<=" if resolved == "capacity" else ">"
        reason = (f"auto on CUDA: padding {pf:.2f}x {cmp} {AUTO_MAX_PADDING:g}x limit (AUTO_MAX_PADDING)")
    out = {"requested": mode, "mode": resolved, "reason": reason, "tokens_per_group": n, "padding_factor": pf,
           "source": "computed from the model config (runner/runtime/moe.py)"}
    if resolved == "capacity":
        ce, cd = capacity_sizes(n, top_k, num_experts, ep, capacity_factor)
        out.update({"capacity_per_expert": ce, "capacity_per_destination": cd, "rows_sent": ep * cd,
                    "rows_routed": n * top_k, "expert_rows": (num_experts // ep) * ep * ce})
    return out


def _pad_select(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``cat([x, one zero row]).index_select(0, index)``: index ``len(x)`` reads zeros (padding)."""
    return torch.cat([x, x.new_zeros((1,) + tuple(x.shape[1:]))], 0).index_select(0, index)


def send_index(send_counts: torch.Tensor, P: int, El: int, cd: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sender side of a capacity dispatch, built on the device.

    Args:
        send_counts: ``[E]`` int64 kept assignments per expert (the rows of ``x_perm`` in expert order).
        rows: ``n * k`` rows of ``x_perm`` (kept first, expert-sorted, then dropped ones).

    Returns:
        ``gather`` ``[P * cd]``: row of ``x_perm`` for slot ``j`` of destination ``d`` (``d * cd + j``), ``rows``
        (the zero row) past that destination's count; ``back`` ``[rows]``: slot of each row of ``x_perm`` in the
        returned ``[P * cd]`` buffer, ``P * cd`` (the zero row) for dropped rows.
    """
    dev = send_counts.device
    per_dest = send_counts.reshape(P, El).sum(1)
    end = torch.cumsum(per_dest, 0)
    start = end - per_dest
    j = torch.arange(cd, device=dev)
    gather = torch.where(j.unsqueeze(0) < per_dest.unsqueeze(1), start.unsqueeze(1) + j.unsqueeze(0),
                         torch.full((P, cd), rows, device=dev, dtype=torch.int64)).reshape(-1)
    a = torch.arange(rows, device=dev)
    d = torch.searchsorted(end, a, right=True)  # destination of row a; P for rows past the kept ones
    dc = d.clamp(max=P - 1)
    back = torch.where(d < P, dc * cd + a - start[dc], torch.full_like(a, P * cd))
    return gather, back


def recv_index(recv_counts: torch.Tensor, P: int, El: int, cd: int, ce: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Receiver side of a capacity dispatch, built on the device.

    Args:
        recv_counts: ``[P, El]`` int64 rows received from peer ``q`` for local expert ``e`` (peer ``q``'s block
            of ``cd`` rows holds them expert-sorted, then padding).

    Returns:
        ``gather`` ``[El * P * ce]``: for expert ``e``'s block of ``P * ce`` rows, the received row of each slot
        (peer-major: the rows of peer 0, then peer 1, ..., then padding ``P * cd``: the zero row), the order an
        uneven dispatch builds; ``back`` ``[P * cd]``: slot in the experts' output ``[El * P * ce]`` of each
        received row, ``El * P * ce`` (the zero row) for padding.
    """
    dev = recv_counts.device
    rc = recv_counts.reshape(P, El)
    cum_e = torch.cumsum(rc, 1)
    start_e = cum_e - rc  # first row of (peer, expert) inside the peer's block
    pc = torch.cumsum(rc, 0)
    poff = pc - rc  # first slot of (peer, expert) inside the expert's block
    s = torch.arange(P * ce, device=dev)
    q = torch.searchsorted(pc.t().contiguous(), s.expand(El, P * ce).contiguous(), right=True)  # [El, P*ce]
    qc = q.clamp(max=P - 1)
    e_idx = torch.arange(El, device=dev).unsqueeze(1).expand(El, P * ce)
    src = qc * cd + start_e[qc, e_idx] + s.unsqueeze(0) - poff[qc, e_idx]
    gather = torch.where(q < P, src, torch.full_like(src, P * cd)).reshape(-1)
    t = torch.arange(cd, device=dev)
    e = torch.searchsorted(cum_e, t.expand(P, cd).contiguous(), right=True)  # [P, cd]
    ec = e.clamp(max=El - 1)
    qq = torch.arange(P, device=dev).unsqueeze(1).expand(P, cd)
    slot = ec * (P * ce) + poff[qq, ec] + t.unsqueeze(0) - start_e[qq, ec]
    back = torch.where(e < El, slot, torch.full_like(slot, El * P * ce)).reshape(-1)
    return gather, back


class CapacityDispatch:
    """One capacity-bounded dispatch and its combine (``P`` ranks, ``El`` experts each, capacities
    :func:`capacity_sizes`): every shape is fixed by the config, every index is built on the device, so nothing
    is read on the host and the all-to-alls have equal splits known in advance.

    Flow: :meth:`send` (``x_perm [n*k, H]`` -> ``[P*cd, H]`` rows per destination, zero-padded) ->
    all-to-all of that buffer and of ``send_counts`` ``[E]`` (the counts travel with the data) ->
    :meth:`expert_inputs` (``[P*cd, H]`` + counts ``[P*El]`` -> one ``[P*ce, H]`` block per local expert:
    the rows of peer 0, 1, ..., then zero padding) -> experts -> :meth:`expert_outputs` (-> ``[P*cd, H]``) ->
    the reverse all-to-all -> :meth:`receive` (-> ``[n*k, H]``, zero rows for dropped assignments).
    Padding rows are zeros; an expert maps zeros to zeros (no biases) and padding outputs are never read back,
    so their gradients are zero. Costs: ``P*cd*H`` per buffer and ``El*P*ce`` expert rows instead of the
    routed ones (:func:`capacity_sizes`)."""

    def __init__(self, P: int, El: int, ce: int, cd: int):
        self.P, self.El, self.ce, self.cd = P, El, ce, cd
        self._back_send = self._back_recv = None

    def send(self, x_perm: torch.Tensor, send_counts: torch.Tensor) -> torch.Tensor:
        gather, self._back_send = send_index(send_counts, self.P, self.El, self.cd, x_perm.shape[0])
        return _pad_select(x_perm, gather)

    def expert_inputs(self, recv: torch.Tensor, recv_counts: torch.Tensor) -> list[torch.Tensor]:
        gather, self._back_recv = recv_index(recv_counts, self.P, self.El, self.cd, self.ce)
        return list(_pad_select(recv, gather).split(self.P * self.ce, dim=0))

    def expert_outputs(self, ys: Sequence[torch.Tensor]) -> torch.Tensor:
        return _pad_select(torch.cat(list(ys), dim=0), self._back_recv)

    def receive(self, ret: torch.Tensor) -> torch.Tensor:
        return _pad_select(ret, self._back_send)


# ----------------------------------------------------------------------------------------------
# all-to-all with autograd
# ----------------------------------------------------------------------------------------------

#: ``hook(name, start, end, bytes, action)``: ``action`` is the ``(stage, microbatch)`` the exchange belongs to, or None
#: for "the calling thread's current action". A hook may carry ``hook.clock`` (the stamp source) and
#: ``hook.current_action()``; the backward exchange passes the action read at the forward, because on CUDA the autograd
#: engine runs a backward Function on its device thread, where the caller's thread-local state is not set.
CommHook = Callable[[str, float, float, int, Any], None]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward is the reverse exchange (splits swapped)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group_fwd, group_bwd, hook, name):  # noqa: D401
        ctx.splits = (list(in_splits), list(out_splits))
        ctx.group_bwd = group_bwd
        ctx.hook = hook
        ctx.name = name
        current = getattr(hook, "current_action", None)
        ctx.action = current() if current is not None else None  # read on the forward's thread
        return _exchange(x, out_splits, in_splits, group_fwd, hook, name)

    @staticmethod
    def backward(ctx, grad):
        in_splits, out_splits = ctx.splits
        g = _exchange(grad.contiguous(), in_splits, out_splits, ctx.group_bwd, ctx.hook, ctx.name + "_bwd",
                      ctx.action)
        return g, None, None, None, None, None, None


def _stamp(hook):
    """A time stamp from ``hook.clock`` (the executor's :class:`~tessera_lab.runner.runtime.devtime.StepClock`: CUDA
    events on a GPU), else the host clock (CPU only)."""
    clock = getattr(hook, "clock", None)
    return clock() if clock is not None else time.perf_counter()


def _exchange(x, out_splits, in_splits, group, hook, name, action=None) -> torch.Tensor:
    t0 = _stamp(hook) if hook is not None else None
    out = x.new_empty((int(sum(out_splits)),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=group)
    if hook is not None:  # opt-in timing: stamps only (CUDA events on a GPU), never a stream synchronize
        hook(name, t0, _stamp(hook), int(x.numel() * x.element_size()), action)
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
        hook: optional :data:`CommHook` ``hook(name, start_s, end_s, bytes, action)`` called after each exchange (traces).

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

    def exchange_counts(self, send_counts: torch.Tensor, action: Any = None) -> tuple[list[list[int]], list[int]]:
        """Count exchange: ``send_counts`` ``[E]`` -> ``(rows received [P][E/P] (peer, local expert), send_counts as
        a list)``, both read on the host in one transfer (on CUDA one drain of the stream per exchange, where reading
        the send counts first would be a second). ``action``: the ``(stage, microbatch)`` the hook records it under
        (None: the calling thread's, :data:`CommHook`)."""
        P, El = self.ep_size, self.experts_per_rank
        extra = self.piggyback() if self.piggyback is not None else None
        K = len(extra) if extra else 0
        sent = send_counts.to(torch.int64).reshape(-1)
        msg = sent.reshape(P, El)
        if K:
            ext = torch.tensor(extra, dtype=torch.int64, device=send_counts.device).reshape(1, K).expand(P, K)
            msg = torch.cat([msg, ext], dim=1)
        recv = torch.empty(P * (El + K), dtype=torch.int64, device=send_counts.device)
        t0 = _stamp(self.hook) if self.hook is not None else None
        dist.all_to_all_single(recv, msg.contiguous().reshape(-1), group=self.group_fwd)
        if self.hook is not None:
            self.hook("ep_counts", t0, _stamp(self.hook), int(msg.numel() * 8), action)
        both = torch.cat([recv, sent]).tolist()  # the one host read
        rows = [both[q * (El + K):(q + 1) * (El + K)] for q in range(P)]
        if K and self.on_piggyback is not None:
            self.on_piggyback([r[El:] for r in rows])
        return [r[:El] for r in rows], both[P * (El + K):]

    def send_counts_async(self, send_counts: torch.Tensor, async_op: bool = False, out: torch.Tensor | None = None):
        """Counts that travel with a capacity dispatch: ``send_counts`` ``[E]`` -> ``(recv [P*E/P] int64 on the
        device, work or None)``, no host read. A pending piggyback (``run --dynamic``, once per step) goes first
        as its own small exchange, read on the host: the one host read of such a step."""
        extra = self.piggyback() if self.piggyback is not None else None
        if extra:
            P, K = self.ep_size, len(extra)
            msg = torch.tensor(extra, dtype=torch.int64, device=send_counts.device).repeat(P)
            rows = torch.empty(P * K, dtype=torch.int64, device=send_counts.device)
            dist.all_to_all_single(rows, msg, group=self.group_fwd)
            if self.on_piggyback is not None:
                self.on_piggyback(rows.view(P, K).tolist())
        recv = torch.empty(send_counts.numel(), dtype=torch.int64, device=send_counts.device) if out is None else out
        work = dist.all_to_all_single(recv, send_counts.to(torch.int64).contiguous(), group=self.group_fwd,
                                      async_op=async_op)
        return recv, work

    def dispatch_capacity(self, x_perm: torch.Tensor, send_counts: torch.Tensor, ce: int, cd: int):
        """Capacity dispatch (:class:`CapacityDispatch`): ``x_perm`` ``[n*k, H]`` -> one ``[P*ce, H]`` block per
        local expert, and the handle for :meth:`combine_capacity`. No host read; equal splits ``cd``."""
        P = self.ep_size
        cap = CapacityDispatch(P, self.experts_per_rank, ce, cd)
        buf = cap.send(x_perm, send_counts)
        rc, _ = self.send_counts_async(send_counts)
        recv = all_to_all(buf, [cd] * P, [cd] * P, self.group_fwd, self.group_bwd, self.hook, "ep_dispatch")
        return cap.expert_inputs(recv, rc), cap

    def combine_capacity(self, ys: Sequence[torch.Tensor], cap: CapacityDispatch) -> torch.Tensor:
        """Inverse of :meth:`dispatch_capacity`: per-expert ``[P*ce, H]`` outputs -> ``[n*k, H]``."""
        P, cd = self.ep_size, cap.cd
        ret = all_to_all(cap.expert_outputs(ys), [cd] * P, [cd] * P, self.group_fwd, self.group_bwd, self.hook,
                         "ep_combine")
        return cap.receive(ret)

    def dispatch(self, x_perm: torch.Tensor, send_counts: torch.Tensor) -> tuple[list[torch.Tensor], _Dispatch]:
        """Send expert-sorted rows ``[A, H]`` to the experts' owners; returns one ``[M_e, H]`` per local expert."""
        P, El = self.ep_size, self.experts_per_rank
        recv_counts, sc = self.exchange_counts(send_counts)
        in_splits = [sum(sc[p * El:(p + 1) * El]) for p in range(P)]
        out_splits = [sum(r) for r in recv_counts]
        # before the all-to-all: the index's blocking copy to the device then waits only for the count exchange
        # (drained by its host read), not for the dispatch
        gather, inverse, per_expert = expert_major(recv_counts, P, El, x_perm.device)
        recv = all_to_all(x_perm, out_splits, in_splits, self.group_fwd, self.group_bwd, self.hook, "ep_dispatch")
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


def group_exchange_capacity(x_perms: Sequence[torch.Tensor], send_counts: Sequence[torch.Tensor], num_experts: int,
                            ce: int):
    """:func:`group_exchange` with the shapes of a capacity dispatch (single process, host counts): ``xs[e]`` is
    ``[G * ce, H]``, the rows of group 0, 1, ... then zero rows; ``split(ys)`` gives each group ``[n_g * k, H]``
    (its kept rows in expert order, then zero rows for dropped assignments). The expert GEMMs then have the
    inputs and shapes an EP rank's :class:`CapacityDispatch` gives them."""
    G = len(x_perms)
    counts = [c.tolist() for c in send_counts]
    kept = [x[:sum(c)] for x, c in zip(x_perms, counts)]
    xs, split = group_exchange(kept, send_counts, num_experts)
    H = x_perms[0].shape[-1]
    padded = [torch.cat([x, x.new_zeros(G * ce - x.shape[0], H)], 0) for x in xs]

    def split_pad(ys: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        used = [y[:x.shape[0]] for y, x in zip(ys, xs)]
        outs = split(used)
        return [torch.cat([o, o.new_zeros(xp.shape[0] - o.shape[0], H)], 0) for o, xp in zip(outs, x_perms)]

    return padded, split_pad
