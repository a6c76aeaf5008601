"""Routing model: how many tokens each expert receives, per micro-batch, per layer and per step.

Everything here is about one **routing group**: the tokens that one expert-parallel (EP) group routes for
one micro-batch. With ``ep`` ranks each holding ``micro_batch_size * seq_len`` tokens, a routing group has
``tokens = ep * micro_batch_size * seq_len`` tokens, each of which picks ``top_k`` *distinct* experts, so a
micro-batch makes ``tokens * top_k`` assignments and no expert receives more than ``tokens`` of them.

Array shapes (int64 token counts, last axis = experts):

* ``[microbatches, experts]`` for one layer and one step;
* ``[layers, microbatches, experts]``, ``[steps, microbatches, experts]`` or
  ``[steps, layers, microbatches, experts]`` when :func:`token_counts` is asked for layers and/or steps.

Routing kinds (:func:`parse_routing`, written ``uniform | zipf:S | drift:S[:R] | walk:S[:R] | replay:PATH``):

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
``walk:S[:R]``
    per-layer popularity that drifts across micro-batches *and* steps, so the slow stage and the busiest EP
    rank move during a step: layer ``l`` at global micro-batch ``g = step * microbatches + j`` has Zipf skew
    ``S * exp(WALK_SIGMA * z_l(g))`` (``z_l`` an AR(1) walk with correlation ``WALK_RHO`` per micro-batch and
    unit variance) over its seeded permutation shifted by ``round(o_l(g))`` experts (``o_l`` a Gaussian random
    walk of ``R`` experts per micro-batch; ``R`` defaults to ``max(1, E // 64)``). Walks are seeded per layer
    (a property of the model and data stream, shared by all EP groups); the per-micro-batch jitter and the
    multinomial draw come on top. A modelling choice, not a measured process.
``replay:PATH``
    counts read from a routing log (:func:`tessera_lab.dynamic.routing_log.load_routing_log`).

**Top-k cap.** A sampled count vector is capped at ``tokens`` per expert and the overflow is re-drawn on the
experts with room left, in proportion to their shares, until none exceeds the cap. Any vector with total
``tokens * top_k`` and every entry ``<= tokens`` is realisable by ``tokens`` tokens that each pick ``top_k``
distinct experts (:func:`topk_assignment` builds one: list the assignments expert by expert and deal them to
tokens round-robin), so these are exactly the count vectors top-k routing can produce.

**Capacity.** With a capacity factor ``cf`` each expert keeps at most ``C = min(tokens, ceil(cf * tokens *
top_k / E))`` assignments (GShard / Switch Transformer token dropping; the same formula as the runner's
:func:`tessera_lab.runner.runtime.moe.capacity_for`); ``kept = min(count, C)``, ``dropped = count - kept``.

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

Routing logs (replay) are read and written by :mod:`tessera_lab.dynamic.routing_log`.

numpy only; never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tessera_lab.checks import check_int
from tessera_lab.errors import ConfigError

__all__ = [
    "ROUTING_FORMS",
    "DEFAULT_JITTER",
    "RoutingSpec",
    "parse_routing",
    "zipf_shares",
    "expert_shares",
    "token_counts",
    "walk_shares",
    "router_bias",
    "topk_assignment",
    "capacity_for",
    "CapacityResult",
    "apply_capacity",
    "switch_aux_loss",
    "ep_rank_load",
    "relative_rank_load",
    "load_imbalance",
    "slowest_rank_load",
    "routing_summary",
]

ROUTING_FORMS = "uniform | zipf:S | drift:S[:R] | walk:S[:R] | replay:PATH (S a number >= 0, R an integer >= 0)"
#: standard deviation of the log-normal per-micro-batch factor on each expert's share (0: micro-batches draw
#: from the same shares). Different sequences prefer different experts; this is a modelling choice, not a
#: measured value. With 512 experts on 8 EP ranks, sigma = 0.5 makes the busiest rank carry about 1.1x its
#: uniform share at zero skew.
DEFAULT_JITTER = 0.5
_KINDS = ("uniform", "zipf", "drift", "walk", "replay")
#: ``walk``: spread of the log skew multiplier and its correlation from one micro-batch to the next
WALK_SIGMA = 0.5
WALK_RHO = 0.9


# ---------------------------------------------------------------------------------------- spec
@dataclass(frozen=True)
class RoutingSpec:
    """A parsed routing description (see :func:`parse_routing`).

    Attributes:
        kind: ``uniform``, ``zipf``, ``drift``, ``walk`` or ``replay``.
        skew: Zipf exponent ``S`` (0 for uniform and replay).
        drift_rate: expert indices the popularity moves per step (``drift``) or per micro-batch (``walk``);
            ``None`` = default
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
        if self.kind in ("drift", "walk") and self.drift_rate is not None:
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
        raise _bad(text, f"{kind!r} takes at most two parameters (skew S and rate R)")
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
            raise _bad(text, f"rate R = {parts[1]!r} is not an integer") from None
        if rate < 0:
            raise _bad(text, f"rate R = {rate} is out of range (an integer >= 0)")
    return RoutingSpec(kind, skew, rate)


# ---------------------------------------------------------------------------------------- shares
def _check_int(name: str, value: Any, lo: int = 1) -> int:
    return check_int(int(value) if isinstance(value, np.integer) else value, name, low=lo)


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
    if spec.kind == "walk":
        raise ConfigError("field 'routing' = 'walk:...' has shares per micro-batch; use walk_shares")
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


def walk_shares(spec: str | RoutingSpec, num_experts: int, layers: int, microbatches: int, step: int,
                seed: int = 0) -> np.ndarray:
    """Expected shares ``[layers, microbatches, E]`` of a ``walk:S[:R]`` spec at one step (rows sum to 1).

    Raises:
        ConfigError: a spec that is not ``walk``.
    """
    spec = parse_routing(spec)
    if spec.kind != "walk":
        raise ConfigError(f"field 'routing' = {str(spec)!r}: walk_shares needs walk:S[:R]")
    E, L, m = num_experts, layers, microbatches
    R = spec.drift_rate if spec.drift_rate is not None else max(1, E // 64)
    g0, G = step * m, (step + 1) * m
    out = np.empty((L, m, E))
    c = math.sqrt(1.0 - WALK_RHO ** 2)
    for l in range(L):
        rng = np.random.default_rng([int(seed), 0x3A1C, int(l)])
        eps = rng.standard_normal((2, G))
        z = np.empty(G)
        z[0] = eps[0, 0]
        for g in range(1, G):
            z[g] = WALK_RHO * z[g - 1] + c * eps[0, g]
        offset = np.cumsum(R * eps[1])
        rank = _base_ranking(E, seed, l) + 1.0
        for j in range(m):
            g = g0 + j
            w = rank ** (-spec.skew * math.exp(WALK_SIGMA * z[g]))
            out[l, j] = np.roll(w / w.sum(), int(round(offset[g])) % E)
    return out


def _cap_and_refill(counts: np.ndarray, cap: int, shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Cap every row of ``counts`` ([n, E]) at ``cap``; re-draw the overflow on experts with room (in
    proportion to ``shares``) until no entry exceeds the cap. Row totals are preserved."""
    counts = counts.copy()
    rows = np.nonzero((counts > cap).any(axis=1))[0]
    for _ in range(10 * counts.shape[1]):  # all capped rows at once: one multinomial draw per pass
        if rows.size == 0:
            return counts
        c = counts[rows]
        excess = np.maximum(c - cap, 0).sum(axis=1)
        c = np.minimum(c, cap)
        room = c < cap
        w = np.where(room, shares[rows].astype(float), 0.0)
        tot = w.sum(axis=1, keepdims=True)
        w = np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), room / np.maximum(room.sum(axis=1, keepdims=True), 1))
        c = c + rng.multinomial(excess, w)
        counts[rows] = c
        rows = rows[(c > cap).any(axis=1)]
    raise RuntimeError("capacity refill did not converge")  # pragma: no cover - each pass moves the excess on


# long, params: the generator's public keyword options, each documented below (the body is ~50 lines)
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
            :func:`tessera_lab.dynamic.routing_log.load_routing_log`.
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
            rng = np.random.default_rng([int(seed), int(group), int(step), 0xC0DE])
            if spec.kind == "walk":
                q = walk_shares(spec, E, L, m, step, seed)
            else:
                q = np.broadcast_to(_shares_at(spec, E, L, step, seed)[:, None, :], (L, m, E))
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


def router_bias(spec: str | RoutingSpec, num_experts: int, layers: int, *, seed: int = 0, step: int = 0) -> np.ndarray:
    """Per-layer router logit offsets ``[layers, E]`` that skew a router on purpose (the runner's skew knob).

    ``bias[l] = log(shares[l])`` minus its mean, so a router whose own logits are equal picks expert ``e`` of layer
    ``l`` with probability ``softmax(bias[l])[e] = shares[l][e]`` (the :func:`expert_shares` of ``zipf`` and
    ``drift`` at ``step``; ``uniform`` gives zeros). Each layer has its own popularity permutation, so the busiest
    EP rank differs between layers.

    Raises:
        ConfigError: ``walk`` or ``replay`` (their shares vary per micro-batch or come from a log).
    """
    spec = parse_routing(spec)
    if spec.kind in ("walk", "replay"):
        raise ConfigError(f"field 'routing' = {str(spec)!r}: a fixed router bias needs uniform, zipf:S or drift:S[:R]")
    shares = expert_shares(spec, num_experts, layers=layers, steps=step + 1, seed=seed)[step]
    logb = np.log(shares)
    return logb - logb.mean(axis=-1, keepdims=True)
