"""Deferrable weight gradients (zero-bubble W deferral) and an order-fixed fan-out, the two autograd pieces every
GEMM and multi-consumer tensor of the runner's model goes through (:mod:`tessera_lab.runner.runtime.layers`).

:class:`DeferrableLinear`'s backward either computes ``dW`` at once or, for a forward key that
:data:`WEIGHT_GRAD_STORE` defers, stashes ``(x, dy)`` for a later W pass; :func:`fanout` sums its consumers'
gradients in a fixed order, so the result never depends on the autograd engine's visiting order.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# deferrable linear (W deferral) and fan-out
# ----------------------------------------------------------------------------------------------

_tls = threading.local()


@contextlib.contextmanager
def forward_key(key: Any) -> Iterator[None]:
    """Tag the GEMMs built inside this block with ``key`` (e.g. ``(stage, microbatch)``) for W deferral."""
    old = getattr(_tls, "key", None)
    _tls.key = key
    try:
        yield
    finally:
        _tls.key = old


def _weight_grad(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """``dW = dy^T x`` over all leading dims: ``[..., out]``, ``[..., in]`` -> ``[out, in]``."""
    return dy.reshape(-1, dy.shape[-1]).t().mm(x.reshape(-1, x.shape[-1]))


def _accumulate(param: torch.Tensor, g: torch.Tensor) -> None:
    if param.grad is None:
        param.grad = g
    else:
        param.grad.add_(g)


class WeightGradStore:
    """Holds ``(weight, x, dy)`` of GEMMs whose weight gradient is deferred (zero-bubble I/W split).

    The pipeline marks a key ``(stage, microbatch)`` with :meth:`defer` before an input-gradient pass (I); the
    backward of every :class:`DeferrableLinear` tagged with that key then computes only ``dx`` and stashes its
    inputs; :meth:`flush` (the W action) computes ``dW = dy^T x`` with the same kernel the undeferred backward
    uses and accumulates into ``weight.grad`` in stash order. Elementwise parameters (norm weights, the decay
    parameters of linear attention, the embedding) keep getting their gradients in the I pass.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deferred: set = set()
        self._stash: dict[Any, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {}

    def defer(self, key: Any) -> None:
        with self._lock:
            self._deferred.add(key)
            self._stash.setdefault(key, [])

    def is_deferred(self, key: Any) -> bool:
        return key is not None and key in self._deferred

    def stash(self, key: Any, weight: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> None:
        with self._lock:
            self._stash[key].append((weight, x, dy))

    def flush(self, key: Any) -> int:
        """Compute and accumulate the deferred weight gradients of ``key``; returns how many GEMMs."""
        with self._lock:
            items = self._stash.pop(key, [])
            self._deferred.discard(key)
        for weight, x, dy in items:
            _accumulate(weight, _weight_grad(x, dy))
        return len(items)

    def record_stream(self, key: Any, stream) -> None:
        """The stashed ``x`` and ``dy`` of ``key`` will be read on ``stream`` (its W runs there, its I ran on
        another CUDA stream): ``record_stream`` each, so the caching allocator keeps them until that work is done."""
        with self._lock:
            items = list(self._stash.get(key, []))
        for _, x, dy in items:
            x.record_stream(stream)
            dy.record_stream(stream)

    def pending(self) -> list:
        """Keys with stashed, not yet flushed, weight gradients."""
        with self._lock:
            return sorted(self._stash, key=str)

    def clear(self) -> None:
        with self._lock:
            self._deferred.clear()
            self._stash.clear()


WEIGHT_GRAD_STORE = WeightGradStore()


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, key):  # noqa: D401
        ctx.save_for_backward(x, weight)
        ctx.key = key
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        gx = dy.matmul(weight) if ctx.needs_input_grad[0] else None
        gw = None
        if ctx.needs_input_grad[1]:
            if WEIGHT_GRAD_STORE.is_deferred(ctx.key):
                WEIGHT_GRAD_STORE.stash(ctx.key, weight, x, dy)
            else:
                gw = _weight_grad(x, dy)
        return gx, gw, None


class DeferrableLinear(nn.Module):
    """``y = x W^T`` (no bias), ``W`` ``[out, in]``; the weight gradient can be deferred (see
    :class:`WeightGradStore`)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LinearFn.apply(x, self.weight, getattr(_tls, "key", None))

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"


class _Fanout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n):  # noqa: D401
        ctx.set_materialize_grads(False)
        return tuple(x.view_as(x) for _ in range(n))

    @staticmethod
    def backward(ctx, *grads):
        total = None
        for g in grads:  # fixed order: consumer 0, 1, ...
            if g is None:
                continue
            total = g.clone() if total is None else total + g
        return total, None


def fanout(x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """``n`` aliases of ``x`` whose gradients are summed in consumer order 0..n-1 (deterministic)."""
    return _Fanout.apply(x, n)


# ----------------------------------------------------------------------------------------------
# layers
# ----------------------------------------------------------------------------------------------
