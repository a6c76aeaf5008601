"""This rank's place in the ``pp x dp x ep`` grid, its process groups, and the stage modules cut from the tiny
model (see :mod:`tessera_lab.runner.runtime.pipeline` for the rank layout)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from tessera_lab.errors import ConfigError
from tessera_lab.model.layout import RankGrid

from .layers import DecoderLayer, TinyMoEModel, init_parameter, router_bias_of
from .moe import ExpertParallelComm
from .specs import TinyConfig, WorldSpec

__all__ = ["Topology", "rank_coords", "build_topology", "StageModule", "check_boundaries", "build_stages",
           "build_layers_alone", "build_measured_stages"]


# ----------------------------------------------------------------------------------------------
# topology
# ----------------------------------------------------------------------------------------------


def rank_coords(rank: int, pp: int, ep: int, dp: int) -> tuple[int, int, int]:
    """``(pp_rank, dp_rank, ep_rank)`` of a global rank (:class:`~tessera_lab.model.layout.RankGrid` with tp=1)."""
    return RankGrid(pp=pp, dp=dp, ep=ep).coords(rank)[:3]


@dataclass
class Topology:
    """This rank's place in the ``pp x dp x ep`` grid and its process groups (None where size 1)."""

    pp: int
    ep: int
    dp: int
    rank: int
    pp_rank: int
    dp_rank: int
    ep_rank: int
    device: torch.device
    ep_fwd: Any = None
    ep_bwd: Any = None
    replica_group: Any = None
    dp_group: Any = None

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.ep

    @property
    def replicas(self) -> int:
        """``dp * ep``: ranks per pipeline stage, each with its own shard of every micro-batch."""
        return self.dp * self.ep

    @property
    def replica(self) -> int:
        return self.dp_rank * self.ep + self.ep_rank

    def global_rank(self, pp_rank: int, replica: int | None = None) -> int:
        """Global rank of ``pp_rank`` with this rank's (or the given) replica index."""
        return pp_rank * self.replicas + (self.replica if replica is None else replica)


def build_topology(world: WorldSpec, rank: int, device: torch.device) -> Topology:
    """Create the EP (forward and backward), replica and DP groups; every rank must call it (same order)."""
    pp, ep, dp = world.pp, world.ep, world.dp
    p, d, e = rank_coords(rank, pp, ep, dp)
    topo = Topology(pp, ep, dp, rank, p, d, e, device)
    R = dp * ep
    for pr in range(pp):
        for dr in range(dp):
            ranks = [pr * R + dr * ep + x for x in range(ep)]
            if ep > 1:
                gf = dist.new_group(ranks)
                gb = dist.new_group(ranks)
                if rank in ranks:
                    topo.ep_fwd, topo.ep_bwd = gf, gb
        if R > 1:
            ranks = [pr * R + x for x in range(R)]
            # a communicator of its own even where the EP forward group has the same members (dp 1): run --dynamic
            # launches gradient chunks in whichever wait finds them ready, which may differ between the ranks, and
            # NCCL matches a communicator's collectives in issue order, so sharing ep_fwd could pair a chunk's
            # reduction with another rank's forward all-to-all (a hang or wrong data; gloo shows neither)
            grp = dist.new_group(ranks)
            if rank in ranks:
                topo.replica_group = grp
        if dp > 1:
            for er in range(ep):
                ranks = [pr * R + dr * ep + er for dr in range(dp)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    topo.dp_group = g
    return topo


# ----------------------------------------------------------------------------------------------
# stages
# ----------------------------------------------------------------------------------------------


class StageModule(nn.Module):
    """Stage ``stage`` of ``num_stages``: layers ``boundaries[stage] .. boundaries[stage+1]-1`` of ``model``,
    plus the embedding on stage 0 and the final norm and LM head on the last stage.

    ``forward(x)``: stage 0 takes token ids ``[b, T]`` int64, the others hidden states ``[b, T, H]`` float32;
    the last stage returns logits ``[b, T, V]``, the others hidden states ``[b, T, H]``. Set ``comm`` to an
    :class:`~tessera_lab.runner.runtime.moe.ExpertParallelComm` for expert parallelism (None: all experts local).
    """

    def __init__(self, model: TinyMoEModel | Any, stage: int, num_stages: int, boundaries: list[int]):
        super().__init__()
        self.stage, self.num_stages = stage, num_stages
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        lo, hi = boundaries[stage], boundaries[stage + 1]
        self.layer_ids = list(range(lo, hi))
        self.embed = model.embed if self.is_first else None
        self.layers = nn.ModuleList(model.layers[i] for i in self.layer_ids)
        self.norm = model.norm if self.is_last else None
        self.lm_head = model.lm_head if self.is_last else None
        self.comm: ExpertParallelComm | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.is_first else x
        for layer in self.layers:
            h = layer(h, comm=self.comm)
        if self.is_last:
            h = self.lm_head(self.norm(h))
        return h


def check_boundaries(boundaries, num_layers: int, num_stages: int) -> list[int]:
    """Validate a plan's ``boundaries`` (``num_stages + 1`` increasing layer indices from 0 to ``num_layers``).

    Raises:
        ConfigError: naming the field and what is allowed.
    """
    b = list(boundaries)
    if len(b) != num_stages + 1:
        raise ConfigError(
            f"plan field 'boundaries' has {len(b)} entries; allowed: num_stages + 1 = {num_stages + 1} "
            f"(one stage per rank x vpp)")
    if b[0] != 0 or b[-1] != num_layers:
        raise ConfigError(f"plan field 'boundaries' = {b} must start at 0 and end at num_layers = {num_layers}")
    if any(b[s + 1] <= b[s] for s in range(num_stages)):
        raise ConfigError(f"plan field 'boundaries' = {b} must be strictly increasing (every stage >= 1 layer)")
    return b


def build_stages(cfg: TinyConfig, boundaries: list[int], stages: list[int], num_stages: int,
                 local_experts: list[int] | None = None) -> tuple[TinyMoEModel, dict[int, StageModule]]:
    """The full model (deterministic init) cut into the given stages; with ``local_experts`` every MoE layer
    keeps only those experts. Returns ``(model, {stage: StageModule})``."""
    model = TinyMoEModel(cfg)
    if local_experts is not None:
        for layer in model.layers:
            layer.moe.keep_experts(local_experts)
    return model, {s: StageModule(model, s, num_stages, boundaries) for s in stages}




def build_layers_alone(cfg: TinyConfig, layer_ids: list[int], local_experts: list[int] | None,
                       device: torch.device | str) -> dict[int, DecoderLayer]:
    """Decoder layers ``layer_ids`` of ``cfg``'s model, built alone: each is constructed on the meta device (no
    memory), keeps only ``local_experts`` (None: all), and is then allocated on ``device`` and initialised
    parameter by parameter with the whole model's names (:func:`~tessera_lab.runner.runtime.layers.init_parameter`),
    so every value equals what :func:`build_stages` gives the same layer and expert (tested), and EP ranks agree.
    The host holds at most one parameter's CPU draw at a time besides the layers themselves (none of them when
    ``device`` is a GPU). ``device="meta"``: shapes only, nothing allocated or initialised.

    Raises:
        IndexError: a layer id outside ``0 .. cfg.num_layers - 1``.
    """
    kinds = cfg.layer_kinds()
    dev = torch.device(device)
    out: dict[int, DecoderLayer] = {}
    for i in layer_ids:
        with torch.device("meta"):
            layer = DecoderLayer(cfg, i, kinds[i])
        if local_experts is not None:
            layer.moe.keep_experts(local_experts)
        if dev.type != "meta":
            layer = layer.to_empty(device=dev)
            for name, p in layer.named_parameters():
                init_parameter(f"layers.{i}.{name}", p, cfg.seed)
            layer.moe.router_bias = router_bias_of(cfg, i, dev)  # to_empty left it uninitialised
        out[i] = layer
    return out


def build_measured_stages(cfg: TinyConfig, layer_ids: list[int], local_experts: list[int] | None,
                          device: torch.device | str) -> dict[int, StageModule]:
    """One single-layer :class:`StageModule` per id in ``layer_ids`` (stage ``i`` of ``cfg.num_layers``, layer
    ``i``; no embedding, no head, so ``0 < i < num_layers - 1``), built by :func:`build_layers_alone`: what the
    overlap measurement runs, without ever building the rest of the model.

    Raises:
        ConfigError: a layer id that is the first or the last layer (those stages carry the embedding or the head).
    """
    n = cfg.num_layers
    bad = [i for i in layer_ids if not 0 < i < n - 1]
    if bad:
        raise ConfigError(f"measured layer ids {bad} are out of range; allowed: 1..{n - 2} (the first and last "
                          f"stages carry the embedding and the head)")
    layers = build_layers_alone(cfg, layer_ids, local_experts, device)
    holder = SimpleNamespace(layers=layers, embed=None, norm=None, lm_head=None)
    return {i: StageModule(holder, i, n, list(range(n + 1))) for i in layer_ids}
