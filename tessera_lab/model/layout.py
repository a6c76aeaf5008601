"""The one rank layout of tessera-lab, torch-free: a ``pp x dp x ep x tp`` grid, TP innermost, then EP, then DP,
PP outermost (an EP group of 8 sits inside one node; only stage boundaries cross nodes).

``rank = ((pp_i * dp + dp_i) * ep + ep_i) * tp + tp_i`` (picotron-style ``arange(world).view(pp, dp, ep, tp)``).
Used by :class:`~tessera_lab.model.hardware.ParallelConfig` (planner, costs, topology) and by the runner, so
that what the planner places is what the runner spawns.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera_lab.errors import ConfigError

__all__ = ["RankGrid", "GROUP_KINDS"]

#: group kinds: tp, ep, dp (expert data-parallel), edp (non-expert data-parallel: ep x dp, the replicas of a
#: stage), pp
GROUP_KINDS = ("tp", "ep", "dp", "edp", "pp")


@dataclass(frozen=True)
class RankGrid:
    """A ``pp x dp x ep x tp`` grid of global ranks (sizes >= 1)."""

    pp: int = 1
    dp: int = 1
    ep: int = 1
    tp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.ep * self.tp

    def rank(self, pp_i: int, dp_i: int = 0, ep_i: int = 0, tp_i: int = 0) -> int:
        """Global rank of a coordinate."""
        return ((pp_i * self.dp + dp_i) * self.ep + ep_i) * self.tp + tp_i

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """``(pp_i, dp_i, ep_i, tp_i)`` of a global rank (the inverse of :meth:`rank`).

        Raises:
            ConfigError: ``rank`` is outside ``[0, world_size)``.
        """
        if not 0 <= rank < self.world_size:
            raise ConfigError(f"rank = {rank} is out of range; allowed: 0 to {self.world_size - 1}")
        tp_i = rank % self.tp
        ep_i = (rank // self.tp) % self.ep
        dp_i = (rank // (self.tp * self.ep)) % self.dp
        return rank // (self.tp * self.ep * self.dp), dp_i, ep_i, tp_i

    def group_ranks(self, kind: str, pp_i: int = 0, dp_i: int = 0, ep_i: int = 0, tp_i: int = 0) -> list[int]:
        """Ranks of the ``kind`` group (see :data:`GROUP_KINDS`) that contains the given coordinate.

        Raises:
            ConfigError: unknown ``kind``.
        """
        if kind == "tp":
            return [self.rank(pp_i, dp_i, ep_i, t) for t in range(self.tp)]
        if kind == "ep":
            return [self.rank(pp_i, dp_i, e, tp_i) for e in range(self.ep)]
        if kind == "dp":
            return [self.rank(pp_i, d, ep_i, tp_i) for d in range(self.dp)]
        if kind == "edp":
            return [self.rank(pp_i, d, e, tp_i) for d in range(self.dp) for e in range(self.ep)]
        if kind == "pp":
            return [self.rank(p, dp_i, ep_i, tp_i) for p in range(self.pp)]
        raise ConfigError(f"group kind {kind!r} is unknown; allowed: {', '.join(GROUP_KINDS)}")
