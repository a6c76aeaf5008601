"""Expert-parallel traffic per rank: token copies the dispatcher sends, and the busiest rank's load.

Dispatchers:

* ``alltoall`` (Megatron-Core's ``alltoall`` token dispatcher): one copy per (token, selected expert): ``k``
  copies per token.
* ``deepep`` (DeepEP normal kernels, Megatron's ``flex`` dispatcher): one copy per (token, destination rank); the
  receiving rank expands it to its local experts. With the ``k`` experts drawn without replacement from ``E``,
  ``E / ep`` on each rank, the expected number of distinct destination ranks is
  ``D = ep * (1 - C(E - E/ep, k) / C(E, k))`` (each rank is missed when all ``k`` experts fall elsewhere).
  Qwen3-Next (E = 512, k = 10, ep = 8): ``D = 5.92``, 0.592 of the ``alltoall`` bytes.
  :func:`destinations_from_routing` counts ``D`` from routing decisions instead.

Busiest-rank load (the slowest EP rank sets the pace): the copies one rank receives under a balanced router are
Binomial(N, 1/ep) with ``N = ep * T * k`` copies in the EP group per micro-batch; the expected maximum over ``ep``
ranks is about ``N/ep + sigma * z(ep)`` with ``sigma = sqrt(N (1/ep)(1 - 1/ep))`` and ``z(n)`` Blom's
approximation of the expected maximum of ``n`` standard normals, ``Phi^-1((n - 0.375) / (n + 0.25))``. The load
factor is that maximum over the mean. This is the floor a perfectly random balanced router gives (assumption
stated in the plan); skewed routing (``dynamic`` routing models) only raises it. Published Megatron-Bridge
benchmarks force-balance tokens (factor 1.0).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Iterable, Sequence

from tessera_lab.errors import ConfigError


def expected_destinations(num_experts: int, top_k: int, ep: int) -> float:
    """Expected distinct EP ranks a token's ``top_k`` experts live on (formula in the module docstring).

    Raises:
        ConfigError: ``ep`` not dividing ``num_experts`` or ``top_k`` out of 1..num_experts.
    """
    if ep < 1 or num_experts % ep:
        raise ConfigError(f"field 'ep' = {ep} must divide num_experts = {num_experts}")
    if not 1 <= top_k <= num_experts:
        raise ConfigError(f"field 'top_k' = {top_k} is out of range; allowed: 1 to {num_experts}")
    if ep == 1:
        return 1.0
    others = num_experts - num_experts // ep
    miss = math.comb(others, top_k) / math.comb(num_experts, top_k) if top_k <= others else 0.0
    return ep * (1.0 - miss)


def limited_destinations(num_experts: int, top_k: int, ranks: int, n_group: int = 1, topk_group: int = 1) -> float:
    """Expected distinct ranks (of ``ranks`` holding the experts in order) a token's experts live on, under
    group-limited routing (DeepSeek-V3: ``n_group`` contiguous expert groups, the token's ``top_k`` experts drawn
    from ``topk_group`` of them): when the groups fall on whole ranks (``ranks % n_group == 0``) the experts are
    drawn from ``topk_group / n_group`` of the experts on as many of the ranks; otherwise no limit is applied."""
    if n_group > 1 and topk_group < n_group and ranks % n_group == 0 and num_experts % n_group == 0:
        experts = num_experts * topk_group // n_group
        if top_k <= experts:
            return expected_destinations(experts, top_k, ranks * topk_group // n_group)
    return expected_destinations(num_experts, top_k, ranks)


def copies_per_token(dispatcher: str, num_experts: int, top_k: int, ep: int, n_group: int = 1,
                     topk_group: int = 1) -> float:
    """Token copies the dispatcher sends per token: ``top_k`` (alltoall) or the expected destination ranks
    (deepep; group-limited routing as :func:`limited_destinations`)."""
    if dispatcher == "alltoall":
        return float(top_k)
    if dispatcher == "deepep":
        return limited_destinations(num_experts, top_k, ep, n_group, topk_group)
    raise ConfigError(f"field 'dispatcher' = {dispatcher!r} is unknown; allowed: alltoall, deepep")


def destinations_from_routing(topk_ids: Iterable[Sequence[int]], experts_per_rank: int) -> float:
    """Mean distinct destination ranks per token from routing decisions (each row: a token's expert ids)."""
    if experts_per_rank < 1:
        raise ConfigError(f"field 'experts_per_rank' = {experts_per_rank} is out of range; allowed: >= 1")
    total, n = 0, 0
    for row in topk_ids:
        total += len({int(e) // experts_per_rank for e in row})
        n += 1
    if n == 0:
        raise ConfigError("routing has no tokens")
    return total / n


def expected_max_normal(n: int) -> float:
    """Blom's approximation of the expected maximum of ``n`` standard normal draws (0 for ``n`` = 1)."""
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def busiest_rank_load(tokens: int, top_k: int, ep: int) -> float:
    """Expected busiest-rank load factor (>= 1) of a balanced random router: ``1 + sigma z(ep) / (N/ep)`` with
    ``N = ep * tokens * top_k`` (module docstring). Example: T = 4096, k = 10, ep = 8: N/ep = 40960,
    sigma = 189.3, z(8) = 1.4236 -> 1.00658."""
    if tokens < 1 or top_k < 1 or ep < 1:
        raise ConfigError("tokens, top_k and ep must be >= 1")
    if ep == 1:
        return 1.0
    n = ep * tokens * top_k
    mean = n / ep
    sigma = math.sqrt(n * (1 / ep) * (1 - 1 / ep))
    return 1.0 + sigma * expected_max_normal(ep) / mean
