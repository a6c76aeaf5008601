"""The one rank layout of tessera-lab, torch-free: a ``pp x dp x ep x tp`` grid, TP innermost, then EP, then DP,
PP outermost (an EP group of 8 sits inside one node; only stage boundaries cross nodes), and where a group's ranks
fall on nodes (:func:`ranks_per_node`, :func:`slowest_group`: the group of a kind the links serve worst).

``rank = ((pp_i * dp + dp_i) * ep + ep_i) * tp + tp_i`` (picotron-style ``arange(world).view(pp, dp, ep, tp)``).
Used by :class:`~tessera_lab.model.hardware.ParallelConfig` (planner, costs, topology) and by the runner, so
that what the planner places is what the runner spawns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tessera_lab.errors import ConfigError

__all__ = ["RankGrid", "GROUP_KINDS", "ranks_per_node", "slowest_group"]

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


_SLOWEST: dict[tuple, tuple[int, ...]] = {}


def ranks_per_node(ranks: Sequence[int], gpus_per_node: int) -> dict[int, int]:
    """How many of ``ranks`` sit on each node (NVLink domain) of ``gpus_per_node`` GPUs: ``{node: count}``, nodes
    numbered from 0 (rank ``r`` on node ``r // gpus_per_node``). The one count the cost model prices a group's
    links from (inside one node: NVLink; else the fewest ranks on a node set the NIC share)."""
    per: dict[int, int] = {}
    for r in ranks:
        per[r // gpus_per_node] = per.get(r // gpus_per_node, 0) + 1
    return per


def _placement_key(ranks: Sequence[int], gpus_per_node: int) -> tuple[bool, int, int]:
    """How badly the links serve a group: spans nodes, then fewer ranks in its least-populated node (a larger
    share of an all-to-all leaves that node), then more nodes."""
    per = ranks_per_node(ranks, gpus_per_node)
    return len(per) > 1, -min(per.values()), len(per)


def slowest_group(parallel: Any, gpus_per_node: int, kind: str) -> tuple[int, ...]:
    """The ranks of the ``kind`` group (``tp``, ``cp``, ``ep``, ``dp``, ``edp``) of ``parallel`` (a
    :class:`~tessera_lab.model.hardware.ParallelConfig`, not imported here: it imports this module) whose placement
    on nodes of ``gpus_per_node`` the links serve worst (:func:`_placement_key`).

    The first group (rank 0's; the EP group as ``ep_placement`` puts it,
    :meth:`~tessera_lab.model.hardware.ParallelConfig.ep_link_ranks`) stands for all when the world fits in one
    node, or when the node size and every grid dimension are powers of two: the groups are then translates whose
    rank offsets do not share bits with the group's own, so each spans nodes as the first does. Otherwise (a GB200
    NVL72 rack of 72, a dimension of 3 or 6) the groups are enumerated as translates of the first, smallest
    uncovered rank first, and the worst kept; where the translates do not tile the ranks (a group structure that
    is not a translate family) the first group is kept. Memoised per grid, node size and kind.

    A ``tp``, ``cp`` or ``ep`` group lies inside a block of consecutive ranks that the pipeline stage and the
    data-parallel replica only index, so on a given world size its worst placement does not depend on how the
    world splits into stages and replicas (what lets :func:`tessera_lab.plan.stages.cost_key_parallel` share
    per-layer costs across them).
    """
    g = parallel.grid
    key = (g.pp, g.dp, g.ep, g.tp, parallel.tp, parallel.cp, parallel.ep_spans_tp, parallel.ep_placement,
           gpus_per_node, kind)
    got = _SLOWEST.get(key)
    if got is not None:
        return got
    base = sorted(parallel.ep_link_ranks() if kind == "ep" else parallel.group_ranks(kind))
    world = parallel.world_size

    def pow2(n: int) -> bool:
        return n > 0 and n & (n - 1) == 0

    worst = tuple(base)
    if world > gpus_per_node and not (pow2(gpus_per_node) and all(pow2(d) for d in (g.pp, g.dp, g.ep, g.tp))):
        offsets = [b - base[0] for b in base]
        covered = bytearray(world)
        worst_key = _placement_key(base, gpus_per_node)
        for r in range(world):
            if covered[r]:
                continue
            grp = [r + o for o in offsets]
            if grp[-1] >= world or any(covered[x] for x in grp):
                worst = tuple(base)  # not a translate family: keep the first group
                break
            for x in grp:
                covered[x] = 1
            k = _placement_key(grp, gpus_per_node)
            if k > worst_key:
                worst, worst_key = tuple(grp), k
    _SLOWEST[key] = worst
    return worst
