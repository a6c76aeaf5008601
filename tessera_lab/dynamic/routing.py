"""Routing model: how many tokens each expert receives, per micro-batch, per layer and per step.

Everything here is about one **routing group**: the tokens that one expert-parallel (EP) group routes for
one micro-batch. With ``ep`` ranks each holding ``micro_batch_size * seq_len`` tokens, a routing group has
``tokens = ep * micro_batch_size * seq_len`` tokens, each of which picks ``top_k`` *distinct* experts, so a
micro-batch makes ``tokens * top_k`` assignments and no expert receives more than ``tokens`` of them.

Array shapes (int64 token counts, last axis = experts):

* ``[microbatches, experts]`` for one layer and one step;
* ``[layers, microbatches, experts]``, ``[steps, microbatches, experts]`` or
  ``[steps, layers, microbatches, experts]`` when :func:`token_counts` is asked for layers and/or steps.

Routing kinds (:func:`parse_routing`, written ``uniform | zipf:S | drift:S[:R] | replay:PATH``):

``uniform``
    every expert receives exactly ``tokens * top_k / E`` assignments (the remainder, if any, one extra token
    on a rotating set of experts). No noise: the reference against which skew is measured.
``zipf:S``
    expert shares follow Zipf's law with exponent ``S >= 0``: the expert of popularity rank ``r`` (1 = most
    popular) gets a share proportional to ``r ** -S``. Which expert holds which rank is a random permutation
    per layer (seeded), the same in every EP group and step (it is a property of the trained router). Each
    micro-batch perturbs the shares (different sequences route differently: a log-normal factor ``exp(jitter * N(0, 1))`` per expert and micro-batch, renormalised) and
    then draws its assignments (multinomial). ``zipf:0`` is uniform shares with that
    noise.
``drift:S[:R]``
    ``zipf:S`` whose hot experts move: at step ``t`` the popularity pattern is translated by ``t * R``
    expert indices (cyclically), so the hottest expert walks across EP ranks (experts are placed on EP
    ranks contiguously). ``R`` defaults to ``max(1, E // 32)``.
``replay:PATH``
    counts read from a routing log (:func:`load_routing_log`; format below).

**Top-k cap.** A sampled count vector is capped at ``tokens`` per expert and the overflow is re-drawn on the
experts with room left, in proportion to their shares, until none exceeds the cap. Any vector with total
``tokens * top_k`` and every entry ``<= tokens`` is realisable by ``tokens`` tokens that each pick ``top_k``
distinct experts (:func:`topk_assignment` builds one: list the assignments expert by expert and deal them to
tokens round-robin), so these are exactly the count vectors top-k routing can produce.

**Capacity.** With a capacity factor ``cf`` each expert keeps at most ``C = min(tokens, ceil(cf * tokens *
top_k / E))`` assignments (GShard / Switch Transformer token dropping; the same formula as the runner's
:func:`tessera_lab.runner.moe.capacity_for`); ``kept = min(count, C)``, ``dropped = count - kept``.

**Auxiliary loss.** :func:`switch_aux_loss` is the load-balancing loss of Switch Transformer (Fedus, Zoph and
Shazeer, "Switch Transformers", JMLR 2022, eq. 4) without its coefficient alpha: ``E * sum_e f_e * P_e``
where ``f_e`` is the fraction of the assignments dispatched to expert ``e`` and ``P_e`` the mean router
probability of ``e`` (Megatron-LM's ``switch_load_balancing_loss_func`` normalises ``f`` by ``tokens *
top_k`` the same way). It is 1.0 for perfectly uniform routing and ``E / top_k`` for a router collapsed onto
``top_k`` experts (``E`` for top-1). Without router probabilities, ``P_e = f_e`` (a router whose
probabilities match its dispatch), giving ``E * sum_e f_e**2``.

**Per-EP-rank load.** Experts are split contiguously over the ``ep`` ranks (expert ``e`` on rank ``e //
(E / ep)``, as in the runner and Megatron-LM); a rank's load is the sum of its experts' counts, its
*relative* load that sum over the mean (1.0 = its uniform share), and the imbalance is ``max / mean``.

**Routing log format** (JSON, written by :func:`write_routing_log`, read by :func:`load_routing_log`)::

    {"format": "tessera-lab/routing-log", "version": 1,
     "num_experts": 8, "top_k": 2,
     "records": [
        {"step": 0, "layer": 0, "microbatch": 0, "group": 0, "tokens": 512, "routed": [130, 120, ...]},
        ...]}

``routed`` holds ``num_experts`` ints (assignments per expert before capacity). ``step``, ``microbatch``
and ``group`` (EP group) default to 0, 0 and 0; a record without ``microbatch`` is the next micro-batch of
its (step, layer, group), so the runner's ``route_log`` list (dicts with ``layer``, ``tokens``, ``routed``,
``kept``, ``dropped``, ``capacity``) loads as is. A bare list of records is accepted too.

numpy only; never imports torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tessera_lab.checks import check_int, check_work
from tessera_lab.errors import ConfigError

__all__ = [
    "ROUTING_FORMS",
    "DEFAULT_JITTER",
    "RoutingSpec",
    "parse_routing",
    "zipf_shares",
    "expert_shares",
    "token_counts",
    "topk_assignment",
    "capacity_for",
    "CapacityResult",
    "apply_capacity",
    "switch_aux_loss",
    "ep_rank_load",
    "relative_rank_load",
    "load_imbalance",
    "slowest_rank_load",
    "RoutingLog",
    "load_routing_log",
    "write_routing_log",
    "routing_summary",
]

ROUTING_FORMS = "uniform | zipf:S | drift:S[:R] | replay:PATH (S a number >= 0, R an integer >= 0)"
#: standard deviation of the log-normal per-micro-batch factor on each expert's share (0: micro-batches draw
#: from the same shares). Different sequences prefer different experts; this is a modelling choice, not a
#: measured value. With 512 experts on 8 EP ranks, sigma = 0.5 makes the busiest rank carry about 1.1x its
#: uniform share at zero skew.
DEFAULT_JITTER = 0.5
LOG_FORMAT = "tessera-lab/routing-log"
LOG_VERSION = 1
_KINDS = ("uniform", "zipf", "drift", "replay")


# ---------------------------------------------------------------------------------------- spec
@dataclass(frozen=True)
class RoutingSpec:
    """A parsed routing description (see :func:`parse_routing`).

    Attributes:
        kind: ``uniform``, ``zipf``, ``drift`` or ``replay``.
        skew: Zipf exponent ``S`` (0 for uniform and replay).
        drift_rate: expert indices the popularity moves per step (``drift``; ``None`` = default
            ``max(1, E // 32)``).
        path: routing log path (``replay``).
    """

    kind: str
    skew: float = 0.0
    drift_rate: int | None = None
    path: str | None = None

    def __str__(self) -> str:
        if self.kind == "uniform":
            return "uniform"
        if self.kind == "replay":
            return f"replay:{self.path}"
        s = f"{self.kind}:{self.skew:g}"
        if self.kind == "drift" and self.drift_rate is not None:
            s += f":{self.drift_rate}"
        return s

    def rate(self, num_experts: int) -> int:
        """Experts the popularity moves per step (0 unless ``drift``)."""
        if self.kind != "drift":
            return 0
        return self.drift_rate if self.drift_rate is not None else max(1, num_experts // 32)


def _bad(text: Any, why: str) -> ConfigError:
    return ConfigError(f"field 'routing' = {text!r}: {why}; allowed: {ROUTING_FORMS}")


def parse_routing(text: str | RoutingSpec, *, field_name: str = "routing") -> RoutingSpec:
    """Parse ``uniform``, ``zipf:S``, ``drift:S``, ``drift:S:R`` or ``replay:PATH``.

    Examples: ``parse_routing("zipf:1.2")`` -> ``RoutingSpec(kind="zipf", skew=1.2)``;
    ``parse_routing("drift:0.8:16")`` -> drift with skew 0.8 moving 16 experts per step.

    Raises:
        ConfigError: naming the field (``routing``), the bad part and the allowed forms.
    """
    if isinstance(text, RoutingSpec):
        return text
    if not isinstance(text, str) or not text.strip():
        raise _bad(text, "expected a non-empty string")
    raw = text.strip()
    kind, _, rest = raw.partition(":")
    kind = kind.strip().lower()
    if kind not in _KINDS:
        raise _bad(text, f"unknown kind {kind!r}")
    if kind == "uniform":
        if rest.strip():
            raise _bad(text, "'uniform' takes no parameter")
        return RoutingSpec("uniform")
    if kind == "replay":
        if not rest.strip():
            raise _bad(text, "'replay' needs a log path, e.g. replay:routing.json")
        return RoutingSpec("replay", path=rest.strip())
    parts = rest.split(":") if rest else []
    if not parts or not parts[0].strip():
        raise _bad(text, f"{kind!r} needs a skew S, e.g. {kind}:1.2")
    if kind == "zipf" and len(parts) > 1:
        raise _bad(text, "'zipf' takes one parameter (the skew S)")
    if len(parts) > 2:
        raise _bad(text, "'drift' takes at most two parameters (skew S and rate R)")
    try:
        skew = float(parts[0])
    except ValueError:
        raise _bad(text, f"skew S = {parts[0]!r} is not a number") from None
    if not math.isfinite(skew) or skew < 0:
        raise _bad(text, f"skew S = {parts[0]} is out of range (a finite number >= 0)")
    rate = None
    if len(parts) == 2:
        try:
            rate = int(parts[1])
        except ValueError:
            raise _bad(text, f"drift rate R = {parts[1]!r} is not an integer") from None
        if rate < 0:
            raise _bad(text, f"drift rate R = {rate} is out of range (an integer >= 0)")
    return RoutingSpec(kind, skew, rate)


# ---------------------------------------------------------------------------------------- shares
def _check_int(name: str, value: Any, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ConfigError(f"field '{name}' = {value!r} is out of range; allowed: an integer >= {lo}")
    return int(value)


def zipf_shares(num_experts: int, skew: float, *, ranking: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """Zipf shares ``r ** -skew / sum`` over ``num_experts`` experts, shape ``[E]``, summing to 1.

    Args:
        num_experts: E.
        skew: Zipf exponent S >= 0 (0 = uniform).
        ranking: popularity rank (0 = hottest) of each expert; default ``0..E-1`` (expert 0 hottest).

    Raises:
        ConfigError: E < 1, negative skew, or a ranking that is not a permutation of ``0..E-1``.
    """
    E = _check_int("num_experts", num_experts)
    if not (math.isfinite(skew) and skew >= 0):
        raise ConfigError(f"field 'skew' = {skew!r} is out of range; allowed: a finite number >= 0")
    rank = np.arange(E) if ranking is None else np.asarray(ranking)
    if rank.shape != (E,) or not np.array_equal(np.sort(rank), np.arange(E)):
        raise ConfigError(f"field 'ranking' must be a permutation of 0..{E - 1}")
    w = (rank + 1.0) ** (-float(skew))
    return w / w.sum()


def _base_ranking(num_experts: int, seed: int, layer: int) -> np.ndarray:
    """Popularity rank of each expert for one layer (a seeded permutation; the router's property)."""
    rng = np.random.default_rng([int(seed), 0x5EED, int(layer)])
    return rng.permutation(num_experts)


def expert_shares(
    spec: str | RoutingSpec, num_experts: int, *, layers: int = 1, steps: int = 1, seed: int = 0
) -> np.ndarray:
    """Expected share of the assignments each expert receives, shape ``[steps, layers, E]`` (rows sum to 1).

    ``uniform`` gives ``1/E``; ``zipf:S`` a per-layer Zipf over a seeded permutation, the same every step;
    ``drift:S[:R]`` that pattern translated by ``t * R`` experts at step ``t``.

    Raises:
        ConfigError: ``replay`` (its shares are the log's counts), or bad sizes.
    """
    spec = parse_routing(spec)
    E = _check_int("num_experts", num_experts)
    L, T = _check_int("layers", layers), _check_int("steps", steps)
    out = np.empty((T, L, E))
    if spec.kind == "uniform":
        out[:] = 1.0 / E
        return out
    if spec.kind == "replay":
        raise ConfigError("field 'routing' = 'replay:...' has no model shares; load the log with load_routing_log")
    for t in range(T):
        out[t] = _shares_at(spec, E, L, t, seed)
    return out


def _shares_at(spec: RoutingSpec, E: int, L: int, step: int, seed: int) -> np.ndarray:
    """``[L, E]`` shares of a zipf/drift spec at one step."""
    R = spec.rate(E)
    out = np.empty((L, E))
    for l in range(L):
        base = zipf_shares(E, spec.skew, ranking=_base_ranking(E, seed, l))
        out[l] = np.roll(base, (step * R) % E) if R else base
    return out


def _cap_and_refill(counts: np.ndarray, cap: int, shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Cap every row of ``counts`` ([n, E]) at ``cap``; re-draw the overflow on experts with room (in
    proportion to ``shares``) until no entry exceeds the cap. Row totals are preserved."""
    counts = counts.copy()
    for row in np.nonzero((counts > cap).any(axis=1))[0]:
        c = counts[row]
        p = shares[row].astype(float)
        for _ in range(10 * c.size):
            over = c > cap
            if not over.any():
                break
            excess = int((c[over] - cap).sum())
            c[over] = cap
            room = cap - c
            w = np.where(room > 0, p, 0.0)
            if w.sum() <= 0:
                w = (room > 0).astype(float)
            draw = rng.multinomial(excess, w / w.sum())
            c += draw
        else:  # pragma: no cover - the loop always terminates: each pass moves the excess to experts with room
            raise RuntimeError("capacity refill did not converge")
        counts[row] = c
    return counts


def token_counts(
    spec: str | RoutingSpec,
    *,
    num_experts: int,
    tokens: int,
    top_k: int,
    microbatches: int,
    layers: int | None = None,
    steps: int | None = None,
    seed: int = 0,
    group: int = 0,
    first_step: int = 0,
    jitter: float = DEFAULT_JITTER,
) -> np.ndarray:
    """Assignments per expert per micro-batch (int64), for one routing group (EP group).

    Args:
        spec: ``uniform``, ``zipf:S`` or ``drift:S[:R]`` (a string or :class:`RoutingSpec`); for replay use
            :func:`load_routing_log`.
        num_experts: E.
        tokens: tokens routed per micro-batch by the group (``ep * micro_batch_size * seq_len``).
        top_k: distinct experts per token (1 <= top_k <= E).
        microbatches: micro-batches per step.
        layers: MoE layers (``None``: no layer axis; each layer has its own popularity permutation).
        steps: training steps (``None``: no step axis); step ``t`` is ``first_step + t``.
        seed: seeds the popularity permutations (shared by all groups: one router) and the noise.
        group: EP group index; groups route different data, so their noise differs.
        first_step: index of the first step (``drift`` moves with the absolute step).
        jitter: sigma of the log-normal per-micro-batch factor on each expert's share (0: multinomial noise
            only). Ignored for ``uniform``.

    Returns:
        counts of shape ``[steps?][layers?][microbatches, E]``; every micro-batch sums to ``tokens * top_k``
        and no entry exceeds ``tokens``. The noise of step ``t`` depends only on ``(seed, group, t)``.

    Raises:
        ConfigError: bad sizes (``top_k > E``), a bad spec, or ``replay``.
    """
    spec = parse_routing(spec)
    E = _check_int("num_experts", num_experts)
    N = _check_int("tokens", tokens)
    k = _check_int("top_k", top_k)
    if k > E:
        raise ConfigError(f"field 'top_k' = {k} is out of range; allowed: 1 to num_experts = {E}")
    m = _check_int("microbatches", microbatches)
    L = 1 if layers is None else _check_int("layers", layers)
    T = 1 if steps is None else _check_int("steps", steps)
    _check_int("group", group, 0)
    _check_int("first_step", first_step, 0)
    if spec.kind == "replay":
        raise ConfigError("field 'routing' = 'replay:...': read the counts with load_routing_log(path)")
    if not (isinstance(jitter, (int, float)) and math.isfinite(jitter) and jitter >= 0):
        raise ConfigError(f"field 'jitter' = {jitter!r} is out of range; allowed: a finite number >= 0")
    total = N * k
    out = np.empty((T, L, m, E), dtype=np.int64)
    if spec.kind == "uniform":
        base, rem = divmod(total, E)
        for j in range(m):
            row = np.full(E, base, dtype=np.int64)
            if rem:
                row[(np.arange(rem) + j * rem) % E] += 1
            out[:, :, j, :] = row
    else:
        for t in range(T):
            step = first_step + t
            shares = _shares_at(spec, E, L, step, seed)  # [L, E]
            rng = np.random.default_rng([int(seed), int(group), int(step), 0xC0DE])
            q = np.broadcast_to(shares[:, None, :], (L, m, E))
            if jitter > 0:
                q = q * np.exp(jitter * rng.standard_normal(q.shape))
                q = q / q.sum(axis=-1, keepdims=True)
            q = q.reshape(L * m, E)
            c = rng.multinomial(total, q)
            out[t] = _cap_and_refill(c, N, q, rng).reshape(L, m, E)
    if steps is None:
        out = out[0]
        if layers is None:
            out = out[0]
    elif layers is None:
        out = out[:, 0]
    return out


def topk_assignment(counts: Sequence[int] | np.ndarray, top_k: int) -> np.ndarray:
    """One concrete top-k routing with these counts: ``[tokens, top_k]`` expert ids, distinct in every row.

    ``tokens = sum(counts) / top_k``. Assignments are listed expert by expert and dealt to tokens round-robin
    (assignment ``a`` goes to token ``a mod tokens``); since no expert has more than ``tokens`` assignments,
    no token gets the same expert twice.

    Raises:
        ConfigError: the total is not a multiple of ``top_k``, or an expert has more than ``tokens``.
    """
    c = np.asarray(counts, dtype=np.int64)
    k = _check_int("top_k", top_k)
    total = int(c.sum())
    if c.ndim != 1 or (c < 0).any() or total % k:
        raise ConfigError(f"field 'counts' must be a 1-D vector of ints >= 0 summing to a multiple of top_k = {k}")
    n = total // k
    if n and c.max() > n:
        raise ConfigError(f"field 'counts': expert {int(c.argmax())} has {int(c.max())} > tokens = {n} assignments; "
                          "top-k routing picks distinct experts")
    flat = np.repeat(np.arange(c.size), c)
    out = np.empty((n, k), dtype=np.int64)
    for a in range(k):
        out[:, a] = flat[a * n:(a + 1) * n]
    # column a holds assignments a*n .. a*n+n-1: token i gets flat[i], flat[n+i], ... i.e. round-robin
    return out


# ---------------------------------------------------------------------------------------- capacity
def capacity_for(tokens: int, top_k: int, num_experts: int, capacity_factor: float | None) -> int | None:
    """Per-expert capacity ``min(tokens, ceil(cf * tokens * top_k / E))``; ``None`` when ``cf`` is ``None``.

    Raises:
        ConfigError: ``cf <= 0`` or bad sizes.
    """
    _check_int("tokens", tokens)
    _check_int("top_k", top_k)
    _check_int("num_experts", num_experts)
    if capacity_factor is None:
        return None
    if not (isinstance(capacity_factor, (int, float)) and math.isfinite(capacity_factor) and capacity_factor > 0):
        raise ConfigError(f"field 'capacity_factor' = {capacity_factor!r} is out of range; allowed: a number > 0")
    return int(min(tokens, math.ceil(capacity_factor * tokens * top_k / num_experts)))


@dataclass
class CapacityResult:
    """Token dropping under a capacity factor (counts int64, same shape as the input).

    Attributes:
        capacity: assignments each expert keeps at most (``None``: unlimited).
        kept: ``min(counts, capacity)``.
        dropped: ``counts - kept``.
    """

    capacity: int | None
    kept: np.ndarray
    dropped: np.ndarray

    @property
    def drop_fraction(self) -> float:
        """Dropped assignments over all assignments (0 when there are none)."""
        total = int(self.kept.sum() + self.dropped.sum())
        return float(self.dropped.sum()) / total if total else 0.0


def apply_capacity(counts: np.ndarray | Sequence, tokens: int, top_k: int,
                   capacity_factor: float | None) -> CapacityResult:
    """Exact kept and dropped assignments per expert under capacity factor ``cf`` (last axis = experts).

    Raises:
        ConfigError: negative counts or a bad capacity factor.
    """
    c = np.asarray(counts, dtype=np.int64)
    if (c < 0).any():
        raise ConfigError("field 'counts' must be >= 0")
    cap = capacity_for(tokens, top_k, c.shape[-1], capacity_factor)
    kept = c.copy() if cap is None else np.minimum(c, cap)
    return CapacityResult(cap, kept, c - kept)


# ---------------------------------------------------------------------------------------- metrics
def switch_aux_loss(counts: np.ndarray | Sequence, router_probs: np.ndarray | Sequence | None = None) -> np.ndarray | float:
    """Switch Transformer load-balancing loss ``E * sum_e f_e * P_e`` over the last axis (no coefficient).

    Fedus, Zoph and Shazeer, "Switch Transformers: Scaling to Trillion Parameter Models with Simple and
    Efficient Sparsity", JMLR 23 (2022), eq. 4; ``f_e`` = assignments of expert ``e`` / all assignments
    (``tokens * top_k``, as Megatron-LM), ``P_e`` = mean router probability of ``e`` (``router_probs``, same
    shape as ``counts``, rows summing to 1). Without ``router_probs``, ``P_e = f_e``.

    Values: 1.0 for uniform routing (the minimum when ``P = f``), ``E / top_k`` for a router collapsed onto
    ``top_k`` experts, ``E`` for a collapsed top-1 router.

    Returns:
        an array of shape ``counts.shape[:-1]`` (a float for a 1-D input). Pass ``[layers, E]`` (counts
        summed over micro-batches) for one value per layer.

    Raises:
        ConfigError: shapes differ, or a row has no assignments.
    """
    c = np.asarray(counts, dtype=float)
    tot = c.sum(axis=-1, keepdims=True)
    if (tot <= 0).any():
        raise ConfigError("field 'counts': every row needs at least one assignment for the aux loss")
    f = c / tot
    if router_probs is None:
        P = f
    else:
        P = np.asarray(router_probs, dtype=float)
        if P.shape != c.shape:
            raise ConfigError(f"field 'router_probs' has shape {P.shape}; allowed: the shape of counts {c.shape}")
    out = c.shape[-1] * (f * P).sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def ep_rank_load(counts: np.ndarray | Sequence, ep: int) -> np.ndarray:
    """Assignments received by each EP rank: shape ``[..., ep]`` (experts split contiguously).

    Raises:
        ConfigError: ``ep`` does not divide the number of experts.
    """
    c = np.asarray(counts)
    ep = _check_int("ep", ep)
    E = c.shape[-1]
    if E % ep:
        raise ConfigError(f"field 'ep' = {ep} must divide num_experts = {E}")
    return c.reshape(*c.shape[:-1], ep, E // ep).sum(axis=-1)


def relative_rank_load(counts: np.ndarray | Sequence, ep: int) -> np.ndarray:
    """Per-EP-rank load over the mean rank load (1.0 = the uniform share), shape ``[..., ep]``."""
    load = ep_rank_load(counts, ep).astype(float)
    mean = load.mean(axis=-1, keepdims=True)
    return np.divide(load, mean, out=np.ones_like(load), where=mean > 0)


def load_imbalance(loads: np.ndarray | Sequence) -> np.ndarray | float:
    """``max / mean`` over the last axis (1.0 = balanced). Returns an array of shape ``loads.shape[:-1]``."""
    x = np.asarray(loads, dtype=float)
    mean = x.mean(axis=-1)
    out = np.divide(x.max(axis=-1), mean, out=np.ones_like(mean), where=mean > 0)
    return float(out) if np.ndim(out) == 0 else out


def slowest_rank_load(counts: np.ndarray | Sequence, ep: int) -> np.ndarray | float:
    """Relative load of the busiest EP rank (= :func:`load_imbalance` of the rank loads), shape
    ``counts.shape[:-1]``: the factor by which that rank's expert work exceeds the uniform share."""
    return load_imbalance(ep_rank_load(counts, ep))


def routing_summary(counts: np.ndarray, ep: int, *, tokens: int | None = None, top_k: int | None = None,
                    capacity_factor: float | None = None) -> dict[str, Any]:
    """Plain-data summary of counts ``[..., E]``: mean and max imbalance, aux loss, drop fraction."""
    c = np.asarray(counts)
    imb = np.atleast_1d(slowest_rank_load(c, ep))
    aux = np.atleast_1d(switch_aux_loss(c))
    out = {
        "shape": list(c.shape), "ep": ep,
        "imbalance_mean": float(imb.mean()), "imbalance_max": float(imb.max()),
        "aux_loss_mean": float(aux.mean()), "aux_loss_max": float(aux.max()),
    }
    if capacity_factor is not None and tokens and top_k:
        res = apply_capacity(c, tokens, top_k, capacity_factor)
        out.update(capacity=res.capacity, drop_fraction=res.drop_fraction)
    return out


# ---------------------------------------------------------------------------------------- logs
@dataclass
class RoutingLog:
    """Counts replayed from a routing log.

    Attributes:
        counts: group -> int64 array ``[steps, layers, microbatches, E]`` (zeros where the log has no record).
        num_experts: E.
        top_k: experts per token (``None`` if the log does not say).
        tokens: tokens per routing group and micro-batch (the most common ``tokens`` field, or
            ``sum(routed) / top_k``).
        layers: the log's layer ids, in the order of the layer axis.
        source: where the log came from.
    """

    counts: dict[int, np.ndarray]
    num_experts: int
    top_k: int | None
    tokens: int | None
    layers: list[int] = field(default_factory=list)
    source: str = ""

    @property
    def groups(self) -> list[int]:
        return sorted(self.counts)

    def group_counts(self, group: int = 0) -> np.ndarray:
        """``[steps, layers, microbatches, E]`` of one EP group.

        Raises:
            ConfigError: the group is not in the log.
        """
        if group not in self.counts:
            raise ConfigError(f"field 'group' = {group} is not in the routing log; allowed: {self.groups}")
        return self.counts[group]


def load_routing_log(source: str | os.PathLike | Mapping | Sequence, *, top_k: int | None = None) -> RoutingLog:
    """Read a routing log (path, parsed JSON dict, or a list of records; format in the module docstring).

    Raises:
        ConfigError: unreadable JSON, an unknown format or version, records of different expert counts, or
            a record without ``layer`` / ``routed``.
        FileNotFoundError: the path does not exist.
    """
    src_name = "<object>"
    obj: Any = source
    if isinstance(source, (str, os.PathLike)):
        src_name = str(source)
        from tessera_lab.io import read_json

        if not Path(source).exists():
            raise FileNotFoundError(2, "routing log does not exist", src_name)
        obj = read_json(source, "routing log")
    meta: Mapping = {}
    if isinstance(obj, Mapping):
        meta = obj
        fmt = obj.get("format", LOG_FORMAT)
        if fmt != LOG_FORMAT:
            raise ConfigError(f"routing log {src_name}: field 'format' = {fmt!r}; allowed: {LOG_FORMAT!r}")
        ver = obj.get("version", LOG_VERSION)
        if ver != LOG_VERSION:
            raise ConfigError(f"routing log {src_name}: field 'version' = {ver!r}; allowed: {LOG_VERSION}")
        records = obj.get("records")
        if records is None:
            raise ConfigError(f"routing log {src_name}: missing field 'records' (a list of per-micro-batch records)")
    else:
        records = obj
    if not isinstance(records, (list, tuple)) or not records:
        raise ConfigError(f"routing log {src_name}: field 'records' must be a non-empty list")
    k = top_k if top_k is not None else meta.get("top_k")
    E = meta.get("num_experts")
    next_mb: dict[tuple[int, int, int], int] = {}
    rows: list[tuple[int, int, int, int, list[int]]] = []
    token_fields: list[int] = []
    for n, rec in enumerate(records):
        if not isinstance(rec, Mapping) or "layer" not in rec or "routed" not in rec:
            raise ConfigError(f"routing log {src_name}: record {n} needs fields 'layer' and 'routed'")
        where = f"routing log {src_name}: record {n}"
        if not isinstance(rec["routed"], (list, tuple)):
            raise ConfigError(f"{where} field 'routed' must be a list of token counts per expert")
        check_work("experts", len(rec["routed"]), field="field 'routed' (experts)", where=where)
        routed = [check_int(x, f"routed[{i}]", low=0, high=1 << 40, where=where) for i, x in enumerate(rec["routed"])]
        if E is None:
            E = len(routed)
        if len(routed) != E:
            raise ConfigError(f"routing log {src_name}: record {n} has {len(routed)} experts; allowed: {E}")
        step = check_int(rec.get("step", 0), "step", low=0, where=where, limit="steps")
        layer = check_int(rec["layer"], "layer", low=0, where=where, limit="layers")
        grp = check_int(rec.get("group", 0), "group", low=0, where=where, limit="groups")
        key = (grp, step, layer)
        mb = rec.get("microbatch")
        mb = next_mb.get(key, 0) if mb is None else check_int(mb, "microbatch", low=0, where=where,
                                                                 limit="microbatches")
        next_mb[key] = max(next_mb.get(key, 0), mb + 1)
        rows.append((grp, step, layer, mb, routed))
        if rec.get("tokens") is not None:
            token_fields.append(check_int(rec["tokens"], "tokens", low=0, where=where, limit="tokens"))
    layer_ids = sorted({r[2] for r in rows})
    lpos = {l: i for i, l in enumerate(layer_ids)}
    steps = 1 + max(r[1] for r in rows)
    mbs = 1 + max(r[3] for r in rows)
    check_work("routing_cells", steps * len(layer_ids) * mbs * E * len({r[0] for r in rows}),
               field="steps x layers x micro-batches x experts x groups", where=f"routing log {src_name}")
    counts: dict[int, np.ndarray] = {}
    for grp, step, layer, mb, routed in rows:
        arr = counts.setdefault(grp, np.zeros((steps, len(layer_ids), mbs, E), dtype=np.int64))
        arr[step, lpos[layer], mb] += routed
    tokens = None
    if token_fields:
        vals, freq = np.unique(token_fields, return_counts=True)
        tokens = int(vals[freq.argmax()])
    elif k:
        tokens = int(round(sum(rows[0][4]) / int(k)))
    return RoutingLog(counts, int(E), None if k is None else int(k), tokens, layer_ids, src_name)


def write_routing_log(path: str | os.PathLike, counts: np.ndarray, *, top_k: int, tokens: int,
                      layers: Sequence[int] | None = None, group: int = 0) -> Path:
    """Write counts ``[steps, layers, microbatches, E]`` (or ``[layers, mb, E]`` / ``[mb, E]``) as a routing
    log (atomically); returns the path."""
    from tessera_lab.io import atomic_write_text

    c = np.asarray(counts, dtype=np.int64)
    while c.ndim < 4:
        c = c[None]
    S, L, M, E = c.shape
    layer_ids = list(range(L)) if layers is None else list(layers)
    if len(layer_ids) != L:
        raise ConfigError(f"field 'layers' has {len(layer_ids)} entries; allowed: {L} (the layer axis)")
    records = [{"step": s, "layer": layer_ids[l], "microbatch": j, "group": group, "tokens": int(tokens),
                "routed": c[s, l, j].tolist()} for s in range(S) for l in range(L) for j in range(M)]
    doc = {"format": LOG_FORMAT, "version": LOG_VERSION, "num_experts": E, "top_k": int(top_k), "records": records}
    return atomic_write_text(path, json.dumps(doc) + "\n")

