"""A tiny Qwen3-Next-like model, its deterministic data, and the single-process reference.

Model (:class:`TinyMoEModel`, config :class:`TinyConfig`), all float32:

* token embedding ``[V, H]``;
* ``num_layers`` decoder layers; layer ``i`` mixes with **gated full attention** when
  ``(i + 1) % (attention_ratio + 1) == 0`` (Qwen3-Next's rule: ratio 3 -> full attention at layers 3, 7, ...)
  and with **linear attention** otherwise. ``attention_ratio = 0`` gives full attention everywhere.

  - linear attention (:class:`GatedDeltaNet`): q, k, v, decay gate ``g``, write strength ``beta`` and output
    gate ``z`` from one fused projection; L2-normalised q and k; the chunked gated delta rule (state
    ``S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``, output ``S_t q_t``) computed chunk by
    chunk with a triangular solve inside each chunk; per-head RMSNorm times ``silu(z)``; output projection.
    Simplifications against Qwen3-Next: no short causal convolution, no separate head counts for q/k and v.
  - gated full attention (:class:`GatedAttention`): fused q, k, v and output-gate projection, GQA with
    ``num_kv_heads``, q/k RMSNorm, causal ``scaled_dot_product_attention``, ``out * sigmoid(gate)``. No rotary
    embedding (the linear-attention layers carry position).
  - MoE (:class:`MoEBlock`): router ``[E, H]``, top-k routing (:mod:`tessera_lab.runner.runtime.moe`), routed SwiGLU
    experts of width ``expert_width``, and a shared SwiGLU expert of width ``shared_expert_width`` scaled by
    ``sigmoid(shared_gate(x))``.
* final RMSNorm and LM head ``[V, H]``; the loss is the **sum** of token cross-entropies (nats) and callers
  divide by the number of tokens in the global batch (see :func:`combine_losses`).

Every GEMM weight is applied through :class:`DeferrableLinear`, whose backward can stash ``(x, dy)`` instead of
computing ``dW`` (zero-bubble "W deferral", :data:`WEIGHT_GRAD_STORE`). Tensors with more than two consumers
fan out through :func:`fanout`, whose backward sums the consumers' gradients in a fixed order, so the result
never depends on the autograd engine's visiting order.

Initialisation is deterministic: each parameter is drawn from its own generator seeded by ``(seed, name)``,
so a pipeline rank that builds the same model gets exactly the reference's weights whatever it keeps.

The reference (:func:`reference_run`) trains the same modules in one process. Its ``matched`` mode evaluates
the batch with the decomposition the distributed run uses: per-shard (``ep * dp`` shards) non-expert compute,
one GEMM per expert over the rows of all shards of an EP group in shard order, one gradient accumulator per
replica, replicas summed in replica order, per-shard loss sums combined in (micro-batch, shard) order. On CPU
with one intra-op thread and ``torch.use_deterministic_algorithms(True)``, every floating-point operation then
has the same inputs, shapes and order as on the ranks, so losses, gradients and updated weights are bitwise
equal. ``matched=False`` runs the plain model on whole micro-batches (different GEMM shapes, so equal only to
float tolerance).
"""

from __future__ import annotations

import math
import zlib
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .autograd import WEIGHT_GRAD_STORE, DeferrableLinear, WeightGradStore, fanout, forward_key  # noqa: F401
from .specs import TinyConfig  # the config is torch-free so that the spawner can validate it
from .moe import (CapacityDispatch, ExpertParallelComm, capacity_sizes, dispatch_mode, group_exchange,
                  group_exchange_capacity, permute, route, unpermute)

__all__ = [
    "TinyConfig",
    "TinyMoEModel",
    "DecoderLayer",
    "MoEBlock",
    "Expert",
    "GatedDeltaNet",
    "GatedAttention",
    "RMSNorm",
    "DeferrableLinear",
    "WEIGHT_GRAD_STORE",
    "forward_key",
    "fanout",
    "chunk_gated_delta_rule",
    "recurrent_gated_delta_rule",
    "is_expert_param",
    "init_parameter",
    "router_bias_of",
    "read_route_log",
]


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def chunk_gated_delta_rule(q, k, v, g, beta, chunk: int) -> torch.Tensor:
    """Chunked gated delta rule.

    Args:
        q, k: ``[b, h, T, dk]`` (already normalised and scaled); v: ``[b, h, T, dv]``.
        g: ``[b, h, T]`` log decay (<= 0); beta: ``[b, h, T]`` write strength in (0, 1).
        chunk: chunk length C (T is zero-padded to a multiple of C).

    Returns:
        ``[b, h, T, dv]``, equal (to float rounding) to :func:`recurrent_gated_delta_rule`.
    """
    b, h, T, dk = k.shape
    dv = v.shape[-1]
    C = chunk
    pad = (-T) % C
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    N = (T + pad) // C
    v = v * beta.unsqueeze(-1)
    k_beta = k * beta.unsqueeze(-1)
    q, k, v, k_beta = (t.reshape(b, h, N, C, t.shape[-1]) for t in (q, k, v, k_beta))
    g = g.reshape(b, h, N, C).cumsum(-1)
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().tril()  # [b,h,N,C,C]
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    lower = ((k_beta @ k.transpose(-1, -2)) * decay).tril(-1)
    # (I + lower)^-1 by forward substitution (unit lower triangular)
    tinv = torch.linalg.solve_triangular(eye + lower, eye.expand_as(lower), upper=False, unitriangular=True)
    v = tinv @ v
    k_cumdecay = tinv @ (k_beta * g.exp().unsqueeze(-1))
    state = q.new_zeros(b, h, dk, dv)
    strict_upper = torch.triu(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=1)
    outs = []
    for i in range(N):
        q_i, k_i, v_i, g_i = q[:, :, i], k[:, :, i], v[:, :, i], g[:, :, i]
        attn = (q_i @ k_i.transpose(-1, -2) * decay[:, :, i]).masked_fill(strict_upper, 0)
        v_new = v_i - k_cumdecay[:, :, i] @ state
        o_inter = (q_i * g_i.unsqueeze(-1).exp()) @ state
        outs.append(o_inter + attn @ v_new)
        g_last = g_i[..., -1:]
        state = state * g_last.unsqueeze(-1).exp() + (k_i * (g_last - g_i).exp().unsqueeze(-1)).transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(b, h, N * C, dv)
    return o[:, :, :T]


def recurrent_gated_delta_rule(q, k, v, g, beta) -> torch.Tensor:
    """Token-by-token gated delta rule (the definition; slow). Shapes as :func:`chunk_gated_delta_rule`."""
    b, h, T, dk = k.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    outs = []
    for t in range(T):
        state = state * g[:, :, t].exp()[..., None, None]
        kv = (state * k[:, :, t, :, None]).sum(-2)
        delta = (v[:, :, t] - kv) * beta[:, :, t, None]
        state = state + k[:, :, t, :, None] * delta[..., None, :]
        outs.append((state * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outs, dim=2)


class GatedDeltaNet(nn.Module):
    """Linear-attention mixer (gated delta rule). ``[b, T, H] -> [b, T, H]``."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.h, self.d, self.chunk = cfg.num_heads, cfg.head_dim, cfg.linear_chunk
        hd = self.h * self.d
        # fused projection: q, k, v, z (hd each), a, b (h each)
        self.in_proj = DeferrableLinear(cfg.hidden_size, 4 * hd + 2 * self.h)
        self.A_log = nn.Parameter(torch.zeros(self.h))
        self.dt_bias = nn.Parameter(torch.zeros(self.h))
        self.norm = RMSNorm(self.d)
        self.out_proj = DeferrableLinear(hd, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = x.shape
        h, d = self.h, self.d
        q, k, v, z, a, beta = self.in_proj(x).split([h * d] * 4 + [h, h], dim=-1)
        q, k, v = (t.reshape(b, T, h, d).transpose(1, 2) for t in (q, k, v))
        q = F.normalize(q, dim=-1) / math.sqrt(d)
        k = F.normalize(k, dim=-1)
        g = (-self.A_log.exp() * F.softplus(a + self.dt_bias)).transpose(1, 2)  # [b, h, T]
        beta = torch.sigmoid(beta).transpose(1, 2)
        o = chunk_gated_delta_rule(q, k, v, g, beta, self.chunk)  # [b, h, T, d]
        o = self.norm(o.transpose(1, 2)) * F.silu(z.reshape(b, T, h, d))
        return self.out_proj(o.reshape(b, T, h * d))


class GatedAttention(nn.Module):
    """Gated causal full attention (GQA, q/k norm, sigmoid output gate). ``[b, T, H] -> [b, T, H]``."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.h, self.kv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.in_proj = DeferrableLinear(cfg.hidden_size, 2 * self.h * self.d + 2 * self.kv * self.d)
        self.q_norm, self.k_norm = RMSNorm(self.d), RMSNorm(self.d)
        self.out_proj = DeferrableLinear(self.h * self.d, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, T, _ = x.shape
        h, kv, d = self.h, self.kv, self.d
        q, gate, k, v = self.in_proj(x).split([h * d, h * d, kv * d, kv * d], dim=-1)
        q = self.q_norm(q.reshape(b, T, h, d)).transpose(1, 2)
        k = self.k_norm(k.reshape(b, T, kv, d)).transpose(1, 2)
        v = v.reshape(b, T, kv, d).transpose(1, 2)
        if kv != h:
            k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(b, T, h * d)
        return self.out_proj(o * torch.sigmoid(gate))


class Expert(nn.Module):
    """SwiGLU expert: ``down(silu(gate(x)) * up(x))``, ``[M, H] -> [M, H]`` (M may be 0)."""

    def __init__(self, hidden: int, width: int):
        super().__init__()
        self.gate_up = DeferrableLinear(hidden, 2 * width)
        self.down = DeferrableLinear(width, hidden)
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.width, dim=-1)
        return self.down(F.silu(gate) * up)


def router_bias_of(cfg: TinyConfig, layer_index: int, device: torch.device | str | None = None) -> torch.Tensor | None:
    """Layer ``layer_index``'s fixed router logit offsets ``[E]`` float32 from ``cfg.router_bias`` (one list for
    every layer or one per layer), or None."""
    rb = cfg.router_bias
    if rb is not None and rb and isinstance(rb[0], tuple):  # per layer
        rb = rb[layer_index]
    return torch.tensor(rb, dtype=torch.float32, device=device) if rb is not None else None


class MoEBlock(nn.Module):
    """Router, routed experts (all, or this EP rank's subset) and the sigmoid-gated shared expert.

    ``experts`` is a :class:`torch.nn.ModuleDict` keyed by the global expert id, so parameter names
    (``layers.3.moe.experts.5.down.weight``) are the same on every rank and in the reference.
    Set ``route_log`` to a list to record per-call routing counts (dicts with ``layer``, ``tokens``,
    ``capacity``, ``routed``, ``kept``, ``dropped``: lists of ``E`` ints for this routing group). The counts stay
    on the device until :func:`read_route_log` reads the whole log at once (once per step: no host sync per
    layer).

    Dispatch (``cfg.ep_dispatch``, resolved per call by :func:`~tessera_lab.runner.runtime.moe.dispatch_mode`):
    ``uneven`` sizes each expert's GEMM by the routed rows (host-read counts); ``capacity`` gives every local
    expert a block of ``P * Ce`` rows (its rows, peer-major, then zeros) with device-built indices
    (:class:`~tessera_lab.runner.runtime.moe.CapacityDispatch`), with or without an EP group.
    """

    def __init__(self, cfg: TinyConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_experts, self.top_k = cfg.num_experts, cfg.top_k
        self.capacity_factor = cfg.capacity_factor
        self.ep_dispatch = cfg.ep_dispatch
        self.router = DeferrableLinear(cfg.hidden_size, cfg.num_experts)
        self.experts = nn.ModuleDict({str(e): Expert(cfg.hidden_size, cfg.expert_width) for e in range(cfg.num_experts)})
        self.shared = Expert(cfg.hidden_size, cfg.shared_expert_width) if cfg.shared_expert_width else None
        self.shared_gate = DeferrableLinear(cfg.hidden_size, 1) if cfg.shared_expert_width else None
        self.register_buffer("router_bias", router_bias_of(cfg, layer_index), persistent=False)
        self.route_log: list | None = None

    def keep_experts(self, ids: Sequence[int]) -> None:
        """Drop every routed expert not in ``ids`` (an EP rank keeps its own)."""
        keep = {str(e) for e in ids}
        for name in list(self.experts.keys()):
            if name not in keep:
                del self.experts[name]

    # -- pieces ---------------------------------------------------------------------------------
    def _route(self, x: torch.Tensor, fixed: bool = False):
        logits = self.router(x)
        if self.router_bias is not None:
            logits = logits + self.router_bias
        plan = route(logits, self.top_k, self.capacity_factor, fixed=fixed)
        if self.route_log is not None:  # counts stay on the device: read_route_log reads the log once
            self.route_log.append({
                "layer": self.layer_index, "tokens": plan.num_tokens, "capacity": plan.capacity,
                "_counts": torch.stack([plan.routed_counts, plan.send_counts, plan.dropped_counts]).detach(),
            })
        return plan

    def capacity_mode(self, device: torch.device, n: int) -> bool:
        """Whether this block dispatches ``n`` tokens with fixed capacities on ``device`` (``cfg.ep_dispatch``)."""
        return dispatch_mode(self.ep_dispatch, device, n, self.top_k, self.num_experts,
                             self.capacity_factor) == "capacity"

    def capacity(self, n: int, ep: int) -> tuple[int, int]:
        """``(Ce, Cd)`` of a capacity dispatch of ``n`` tokens over ``ep`` ranks
        (:func:`~tessera_lab.runner.runtime.moe.capacity_sizes`)."""
        return capacity_sizes(n, self.top_k, self.num_experts, ep, self.capacity_factor)

    def _shared(self, x: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return self.shared(x) * torch.sigmoid(self.shared_gate(x2))

    def _inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return fanout(x, 4) if self.shared is not None else fanout(x, 2) + (None, None)

    # -- forward ----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, comm: ExpertParallelComm | None = None) -> torch.Tensor:
        """``x`` ``[n, H]`` (this rank's tokens) -> ``[n, H]``. ``comm=None``: all experts are local."""
        x_router, x_perm_in, x_shared, x_gate = self._inputs(x)
        fixed = self.capacity_mode(x.device, x.shape[0])
        plan = self._route(x_router, fixed)
        xp = permute(x_perm_in, plan)
        if fixed:
            P = 1 if comm is None else comm.ep_size
            ce, cd = self.capacity(plan.num_tokens, P)
            if comm is None:  # one "rank": the same fixed blocks, no exchange
                cap = CapacityDispatch(1, self.num_experts, ce, cd)
                xs = cap.expert_inputs(cap.send(xp, plan.send_counts), plan.send_counts)
                ys = [self.experts[str(e)](xs[e]) for e in range(self.num_experts)]
                yp = cap.receive(cap.expert_outputs(ys))
            else:
                xs, cap = comm.dispatch_capacity(xp, plan.send_counts, ce, cd)
                ys = [self.experts[str(e)](xe) for e, xe in zip(comm.local_experts, xs)]
                yp = comm.combine_capacity(ys, cap)
        elif comm is None:
            counts = plan.send_counts.tolist()
            xs = xp.split(counts, dim=0)
            ys = [self.experts[str(e)](xs[e]) for e in range(self.num_experts)]
            yp = torch.cat(ys, dim=0)
        else:
            xs, handle = comm.dispatch(xp, plan.send_counts)
            ys = [self.experts[str(e)](xe) for e, xe in zip(comm.local_experts, xs)]
            yp = comm.combine(ys, handle)
        out = unpermute(yp, plan)
        if self.shared is not None:
            out = out + self._shared(x_shared, x_gate)
        return out

    @staticmethod
    def forward_group(moes: Sequence["MoEBlock"], xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Single-process EP emulation: routing group ``g`` (tokens ``xs[g]`` ``[n_g, H]``) is routed by
        ``moes[g]``'s router and mixed with its shared expert; routed experts (those of ``moes[0]``, all ``E``)
        run one GEMM each over the rows of all groups in group order, as an EP rank does (in capacity mode
        padded with zero rows to ``G * Ce``, as :class:`~tessera_lab.runner.runtime.moe.CapacityDispatch`)."""
        fixed = moes[0].capacity_mode(xs[0].device, xs[0].shape[0])
        ins = [m._inputs(x) for m, x in zip(moes, xs)]
        plans = [m._route(i[0], fixed) for m, i in zip(moes, ins)]
        xps = [permute(i[1], p) for i, p in zip(ins, plans)]
        E = moes[0].num_experts
        counts = [p.send_counts for p in plans]
        if fixed:
            ex_in, split = group_exchange_capacity(xps, counts, E, moes[0].capacity(plans[0].num_tokens, len(xs))[0])
        else:
            ex_in, split = group_exchange(xps, counts, E)
        experts = moes[0].experts
        ys = [experts[str(e)](ex_in[e]) for e in range(E)]
        outs = []
        for m, i, p, yp in zip(moes, ins, plans, split(ys)):
            out = unpermute(yp, p)
            if m.shared is not None:
                out = out + m._shared(i[2], i[3])
            outs.append(out)
        return outs


class DecoderLayer(nn.Module):
    """Pre-norm residual block: ``h + mixer(norm(h))`` then ``h + moe(norm(h))``; ``[b, T, H]``."""

    def __init__(self, cfg: TinyConfig, index: int, kind: str):
        super().__init__()
        self.index, self.kind = index, kind
        self.input_norm = RMSNorm(cfg.hidden_size)
        self.mixer = GatedDeltaNet(cfg) if kind == "linear_attention" else GatedAttention(cfg)
        self.post_norm = RMSNorm(cfg.hidden_size)
        self.moe = MoEBlock(cfg, index)

    def mix(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mixer(self.input_norm(h))

    def forward(self, h: torch.Tensor, comm: ExpertParallelComm | None = None, routing_groups: int = 1) -> torch.Tensor:
        h = self.mix(h)
        x = self.post_norm(h).reshape(-1, h.shape[-1])
        if routing_groups == 1:
            y = self.moe(x, comm)
        else:
            y = torch.cat(MoEBlock.forward_group([self.moe] * routing_groups, list(x.chunk(routing_groups))), 0)
        return h + y.view_as(h)

    @staticmethod
    def forward_group(layers: Sequence["DecoderLayer"], hs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Replica ``g`` of the layer on shard ``hs[g]``; the MoE of all replicas runs as one EP group."""
        hs = [l.mix(h) for l, h in zip(layers, hs)]
        xs = [l.post_norm(h).reshape(-1, h.shape[-1]) for l, h in zip(layers, hs)]
        ys = MoEBlock.forward_group([l.moe for l in layers], xs)
        return [h + y.view_as(h) for h, y in zip(hs, ys)]


def read_route_log(log: list) -> list:
    """Turn the device-held counts of ``log``'s new records into ``routed`` / ``kept`` / ``dropped`` lists of
    ints, with one host read for all of them (one ``torch.stack(...).tolist()``); returns ``log``."""
    pending = [r for r in log if "_counts" in r]
    if pending:
        values = torch.stack([r.pop("_counts") for r in pending]).tolist()
        for r, (routed, kept, dropped) in zip(pending, values):
            r["routed"], r["kept"], r["dropped"] = routed, kept, dropped
    return log


def is_expert_param(name: str) -> bool:
    """True for routed-expert parameters (sharded over EP, replicated over DP)."""
    return ".moe.experts." in name


@torch.no_grad()
def init_parameter(name: str, p: torch.Tensor, seed: int) -> None:
    """Deterministic init of parameter ``name`` (its full name in :class:`TinyMoEModel`, e.g.
    ``layers.1.moe.experts.5.down.weight``) in place, from a CPU generator seeded by ``(seed, crc32(name))``, so
    a module built alone gets the values the whole model would give it, on any device.

    Norm weights 1; ``A_log`` = log of U(1, 16); ``dt_bias`` 0; embedding N(0, 1); GEMM weights N(0, 1/in_features).
    """
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    if name.endswith("norm.weight"):
        p.fill_(1.0)
    elif name.endswith("A_log"):
        p.copy_(torch.empty(p.shape).uniform_(1.0, 16.0, generator=gen).log())
    elif name.endswith("dt_bias"):
        p.zero_()
    elif name == "embed.weight":
        p.copy_(torch.randn(p.shape, generator=gen))
    else:
        p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))


class TinyMoEModel(nn.Module):
    """Embedding, ``num_layers`` :class:`DecoderLayer`, final norm and LM head. ``[b, T]`` ids -> ``[b, T, V]``."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, k) for i, k in enumerate(cfg.layer_kinds()))
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = DeferrableLinear(cfg.hidden_size, cfg.vocab_size)
        self.reset_parameters(cfg.seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Deterministic init of every parameter by :func:`init_parameter` (its full name in this model)."""
        for name, p in self.named_parameters():
            init_parameter(name, p, seed)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: ``[b, T, H] -> [b, T, V]`` logits."""
        return self.lm_head(self.norm(h))

    def forward(self, tokens: torch.Tensor, routing_groups: int = 1) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, routing_groups=routing_groups)
        return self.head(h)

    @staticmethod
    def loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Sum of token cross-entropies (nats): ``[b, T, V]``, ``[b, T]`` -> scalar."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")


