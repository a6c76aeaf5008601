"""Deterministic data, loss combination, optimizer, the deterministic CPU mode, and the single-process
reference (see :mod:`tessera_lab.runner.runtime.model` for when results are bitwise equal)."""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch

from tessera_lab.errors import ConfigError

from .layers import DecoderLayer, TinyMoEModel, is_expert_param, read_route_log
from .specs import TinyConfig

__all__ = ["make_batch", "shard_rows", "combine_losses", "make_optimizer", "deterministic", "reference_run",
           "ReferenceResult"]


# ----------------------------------------------------------------------------------------------
# data, loss combination, optimizer, determinism
# ----------------------------------------------------------------------------------------------


def make_batch(cfg: TinyConfig, step: int, num_sequences: int, data_seed: int = 1234) -> torch.Tensor:
    """Global batch of step ``step``: ``[num_sequences, seq_len + 1]`` int64 token ids.

    Each sequence is an arithmetic progression mod V with a random start and a random stride in 1..3
    (learnable in context, so the loss falls). Inputs are ``[:, :-1]``, targets ``[:, 1:]``.
    """
    gen = torch.Generator().manual_seed(data_seed * 100_003 + step)
    start = torch.randint(0, cfg.vocab_size, (num_sequences, 1), generator=gen)
    stride = torch.randint(1, 4, (num_sequences, 1), generator=gen)
    pos = torch.arange(cfg.seq_len + 1).unsqueeze(0)
    return (start + stride * pos) % cfg.vocab_size


def shard_rows(microbatch: int, replica: int, num_replicas: int, micro_batch_size: int) -> slice:
    """Rows of the global batch for (micro-batch, replica): micro-batch-major, then replica, then row."""
    start = (microbatch * num_replicas + replica) * micro_batch_size
    return slice(start, start + micro_batch_size)


def combine_losses(sums: Sequence[Sequence[float]], num_tokens: int) -> float:
    """Step loss (mean token cross-entropy, nats) from per-(micro-batch, replica) loss sums, added in
    (micro-batch, replica) order in float64, divided by the global token count."""
    total = 0.0
    for row in sums:
        for s in row:
            total += float(s)
    return total / num_tokens


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """AdamW (betas 0.9/0.95, no weight decay), single-tensor implementation: each parameter's update is
    elementwise and independent of which other parameters the optimizer holds."""
    return torch.optim.AdamW(list(params), lr=lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=False)


@contextlib.contextmanager
def deterministic(threads: int = 1) -> Iterator[None]:
    """Deterministic CPU mode for a block: ``threads`` intra-op threads and deterministic algorithms."""
    old_threads = torch.get_num_threads()
    old_det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.use_deterministic_algorithms(old_det)


# ----------------------------------------------------------------------------------------------
# single-process reference
# ----------------------------------------------------------------------------------------------


@dataclass
class ReferenceResult:
    """Output of :func:`reference_run`.

    Attributes:
        losses: per step, mean token cross-entropy (nats).
        loss_sums: per step, ``[microbatch][replica]`` loss sums (nats).
        grads: per recorded step, ``{parameter name: gradient}`` (after summing replicas, before the update).
        routing: per layer ``{"routed", "kept", "dropped"}``: ``[E]`` ints summed over steps, micro-batches and
            routing groups.
    """

    losses: list[float]
    loss_sums: list[list[list[float]]]
    grads: list[dict[str, torch.Tensor]] = field(default_factory=list)
    routing: dict[int, dict[str, list[int]]] = field(default_factory=dict)


def _add_routing(total: dict, log: list) -> None:
    for rec in log:
        t = total.setdefault(rec["layer"], {"routed": None, "kept": None, "dropped": None})
        for key in ("routed", "kept", "dropped"):
            t[key] = list(rec[key]) if t[key] is None else [a + b for a, b in zip(t[key], rec[key])]


# params: the job's RunSpec sizes and training options, keyword-only, as the tests name them
def reference_run(
    cfg: TinyConfig,
    *,
    ep: int = 1,
    dp: int = 1,
    microbatches: int = 4,
    micro_batch_size: int = 2,
    steps: int = 2,
    lr: float = 1e-2,
    data_seed: int = 1234,
    matched: bool = True,
    record_grads: Sequence[int] = (0,),
    threads: int | None = 1,
) -> ReferenceResult:
    """Train ``cfg`` for ``steps`` steps in one process, the way the pipeline run does with ``ep * dp`` replicas.

    Per step the global batch has ``microbatches * ep * dp * micro_batch_size`` sequences (:func:`make_batch`,
    :func:`shard_rows`); the loss is the mean token cross-entropy over it, so gradients do not depend on how
    the batch is cut into micro-batches. ``matched`` selects the bitwise-comparable decomposition (module
    docstring); ``threads`` (default 1) wraps the run in :func:`deterministic` (``None``: leave the settings).
    """
    ctx = deterministic(threads) if threads is not None else contextlib.nullcontext()
    with ctx:
        return _reference(cfg, ep, dp, microbatches, micro_batch_size, steps, lr, data_seed, matched, set(record_grads))


def _reference(cfg, ep, dp, m, mbs, steps, lr, data_seed, matched, record) -> ReferenceResult:
    for name, v in {"ep": ep, "dp": dp, "microbatches": m, "micro_batch_size": mbs, "steps": steps}.items():
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"reference field '{name}' = {v!r} is out of range; allowed: an integer >= 1")
    if cfg.num_experts % ep:
        raise ConfigError(f"num_experts = {cfg.num_experts} must be a multiple of ep = {ep}")
    R = ep * dp
    G = m * R * mbs
    N = G * cfg.seq_len
    base = TinyMoEModel(cfg)
    opt = make_optimizer(base.parameters(), lr)
    result = ReferenceResult([], [])
    routing: dict = {}
    if matched:
        reps = [copy.deepcopy(base) for _ in range(R)]
        for d in range(dp):
            for j in range(1, ep):
                for li in range(cfg.num_layers):
                    reps[d * ep + j].layers[li].moe.experts = reps[d * ep].layers[li].moe.experts
        rep_params = [dict(r.named_parameters(remove_duplicate=False)) for r in reps]
    for step in range(steps):
        batch = make_batch(cfg, step, G, data_seed)
        log: list = []
        sums: list[list[float]] = []
        if matched:
            for r in reps:
                for p in r.parameters():
                    p.grad = None
                for layer in r.layers:
                    layer.moe.route_log = log
            for i in range(m):
                rows = [batch[shard_rows(i, r, R, mbs)] for r in range(R)]
                hs = [reps[r].embed(rows[r][:, :-1]) for r in range(R)]
                for li in range(cfg.num_layers):
                    new: list[torch.Tensor] = []
                    for d in range(dp):
                        grp = range(d * ep, (d + 1) * ep)
                        new += DecoderLayer.forward_group([reps[r].layers[li] for r in grp], [hs[r] for r in grp])
                    hs = new
                s = [reps[r].loss_sum(reps[r].head(hs[r]), rows[r][:, 1:]) for r in range(R)]
                total = s[0] / N
                for r in range(1, R):
                    total = total + s[r] / N
                total.backward()
                sums.append([float(x.item()) for x in s])
            for name, p in base.named_parameters():
                owners = [d * ep for d in range(dp)] if is_expert_param(name) else list(range(R))
                g = None
                for r in owners:
                    gr = rep_params[r][name].grad
                    gr = torch.zeros_like(p) if gr is None else gr
                    g = gr.clone() if g is None else g + gr
                p.grad = g
        else:
            base.zero_grad(set_to_none=True)
            for layer in base.layers:
                layer.moe.route_log = log
            for i in range(m):
                rows = torch.cat([batch[shard_rows(i, r, R, mbs)] for r in range(R)], 0)
                s = base.loss_sum(base(rows[:, :-1], routing_groups=R), rows[:, 1:])
                (s / N).backward()
                sums.append([float(s.item())])
        if step in record:
            result.grads.append({n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                                 for n, p in base.named_parameters()})
        opt.step()
        if matched:
            with torch.no_grad():
                for name, p in base.named_parameters():
                    for r in range(R):
                        rep_params[r][name].copy_(p)
        _add_routing(routing, read_route_log(log))
        result.loss_sums.append(sums)
        result.losses.append(combine_losses(sums, N))
    result.routing = routing
    for r in (reps if matched else [base]):
        for layer in r.layers:
            layer.moe.route_log = None
    return result
