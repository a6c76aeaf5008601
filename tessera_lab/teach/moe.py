"""MoE dispatch/combine all-to-all and routing skew (notebook 04): tokens per (source rank, expert) from the shared
routing model, the traffic between EP ranks, the per-rank expert load and the all-to-all time (the slowest rank
sets it).

Units: tokens, bytes, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from tessera_lab.cost.analytic import CostModel, bus_efficiency
from tessera_lab.errors import ConfigError
from tessera_lab.model.flops import gemm_flops
from tessera_lab.model.hardware import DTYPE_BYTES, Cluster, ParallelConfig, cost_assumptions
from tessera_lab.model.spec import ModelSpec
from tessera_lab.model.tasks import Collective
from tessera_lab.teach.collectives import _check_int
from tessera_lab.teach.tp_pp import _as_model

# =====================================================================================================
# 4. MoE dispatch / combine all-to-all and routing skew
# =====================================================================================================
def sample_routing(tokens_per_rank: int, ep: int, num_experts: int, top_k: int, skew: float = 0.0, *,
                   seed: int = 0, jitter: float | None = None):
    """Token copies per (source EP rank, expert), from the shared routing model (:mod:`tessera_lab.dynamic.routing`).

    Each of the ``ep`` ranks routes ``tokens_per_rank`` tokens to ``top_k`` distinct experts. ``skew = 0`` is
    the exact uniform split (``routing`` spec ``uniform``: no noise, the closed-form reference); ``skew > 0``
    is ``zipf:skew``: expert shares follow Zipf's law over a seeded permutation of the experts (the same for
    every rank: one router), each rank's tokens perturb the shares by a log-normal factor of sigma ``jitter``
    (default :data:`tessera_lab.dynamic.routing.DEFAULT_JITTER`; different sequences prefer different experts) and draw
    their assignments, capped at ``tokens_per_rank`` per expert. Each source rank is one draw of
    :func:`tessera_lab.dynamic.routing.token_counts` (its ``microbatches`` axis).

    Returns:
        int64 numpy array of shape ``(ep, num_experts)``; every row sums to ``tokens_per_rank * top_k`` and no
        entry exceeds ``tokens_per_rank``. Deterministic for a given ``seed``.
    """
    from tessera_lab.dynamic import routing as routing

    _check_int("ep", ep, 1)
    if not (isinstance(skew, (int, float)) and 0 <= skew <= 10):
        raise ConfigError(f"field 'skew' = {skew!r} is out of range; allowed: 0 to 10")
    spec = "uniform" if skew == 0 else f"zipf:{float(skew)!r}"
    kwargs = {} if jitter is None else {"jitter": jitter}
    return routing.token_counts(spec, num_experts=num_experts, tokens=tokens_per_rank, top_k=top_k, microbatches=ep,
                                seed=seed, **kwargs)


@dataclass(frozen=True)
class AllToAllVolumes:
    """Dispatch and combine traffic of one MoE layer for one micro-batch (result of :func:`all_to_all_volumes`).

    Attributes:
        ep: EP ranks; ``experts_per_rank`` experts each (contiguous: rank r owns experts
            ``r*E/ep .. (r+1)*E/ep - 1``).
        send: ``send[src][dst]`` token copies rank ``src`` sends to rank ``dst`` in the dispatch (the
            diagonal stays local); the combine sends the same copies back (the transpose).
        token_bytes: bytes of one token copy (``hidden * dtype``).
        dispatch_sent, dispatch_received: bytes each rank sends to / receives from other ranks in the
            dispatch; the combine swaps the two.
        expert_tokens: token copies each rank's experts process (its load).
        link: the link of the EP group (NVLink while ``ep <= 8``); ``"none"`` at ``ep = 1``, where every token
            stays on its rank and nothing crosses a link.
        time_s: time of one all-to-all: ``alpha + max over ranks of max(sent, received) / (B * eta)``; the
            slowest rank sets it. ``uniform_time_s``: the same with perfectly even routing
            (:meth:`CostModel.collective_time` of an all-to-all of the same total).
        expert_time_s: expert GEMM time of each rank (3 GEMMs of width ``expert_width``, roofline).
    """

    ep: int
    experts_per_rank: int
    send: tuple[tuple[int, ...], ...]
    token_bytes: float
    dispatch_sent: tuple[float, ...]
    dispatch_received: tuple[float, ...]
    expert_tokens: tuple[int, ...]
    link: str
    time_s: float
    uniform_time_s: float
    expert_time_s: tuple[float, ...]

    @property
    def load_imbalance(self) -> float:
        """Busiest rank's expert tokens / the mean (1 = balanced)."""
        mean = sum(self.expert_tokens) / len(self.expert_tokens)
        return max(self.expert_tokens) / mean if mean else 1.0

    def frame(self):
        """Per-rank table: dispatch and combine MiB, expert tokens, load vs mean, expert GEMM time."""
        import pandas as pd

        mean = sum(self.expert_tokens) / self.ep or 1.0
        rows = []
        for r in range(self.ep):
            rows.append({
                "rank": r,
                "dispatch sent (MiB)": self.dispatch_sent[r] / 2**20,
                "dispatch received (MiB)": self.dispatch_received[r] / 2**20,
                "combine sent (MiB)": self.dispatch_received[r] / 2**20,
                "combine received (MiB)": self.dispatch_sent[r] / 2**20,
                "kept local (tokens)": self.send[r][r],
                "expert tokens": self.expert_tokens[r],
                "load / mean": self.expert_tokens[r] / mean,
                "expert GEMMs (us)": self.expert_time_s[r] * 1e6,
            })
        return pd.DataFrame(rows).set_index("rank")

    def summary(self) -> dict[str, Any]:
        return {
            "EP ranks": self.ep, "link": self.link,
            "dispatch per rank, mean (MiB)": sum(self.dispatch_sent) / self.ep / 2**20,
            "dispatch, busiest rank (MiB)": max(max(self.dispatch_sent), max(self.dispatch_received)) / 2**20,
            "all-to-all time (us)": self.time_s * 1e6,
            "all-to-all time if uniform (us)": self.uniform_time_s * 1e6,
            "load imbalance (max / mean)": self.load_imbalance,
            "slowest expert GEMMs (us)": max(self.expert_time_s) * 1e6,
            "dispatch + combine vs slowest expert GEMMs": 2 * self.time_s / max(max(self.expert_time_s), 1e-30),
        }


def all_to_all_volumes(counts, ep: int, hidden: int, *, dtype: str = "bf16", expert_width: int = 0,
                       gpu: str = "H100", nodes_per_group: int | None = None) -> AllToAllVolumes:
    """Dispatch/combine volumes, per-rank load and all-to-all time from tokens per (source rank, expert).

    Args:
        counts: ``(ep, num_experts)`` token copies (e.g. from :func:`sample_routing`; any nested sequence).
        ep: EP ranks (must divide the number of experts); experts are placed contiguously.
        hidden: hidden size; one token copy is ``hidden * dtype`` bytes.
        expert_width: routed expert intermediate size (for the expert GEMM time; 0 skips it).
        gpu: sets the NVLink bandwidth. The group is on NVLink while ``ep <= 8`` (one node), else on
            InfiniBand (the per-GPU NIC is the bottleneck).

    Raises:
        ConfigError: shapes that do not match, ``ep`` not dividing the experts.
    """
    import numpy as np

    c = np.asarray(counts, dtype=np.int64)
    _check_int("ep", ep, 1)
    if c.ndim != 2 or c.shape[0] != ep:
        raise ConfigError(f"field 'counts' has shape {c.shape}; allowed: (ep={ep}, num_experts)")
    if (c < 0).any():
        raise ConfigError("field 'counts' has negative entries; allowed: token counts >= 0")
    E = c.shape[1]
    if E % ep:
        raise ConfigError(f"field 'ep' = {ep} must divide num_experts = {E}")
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"field 'dtype' = {dtype!r} is unknown; allowed: {', '.join(DTYPE_BYTES)}")
    per = E // ep
    send = c.reshape(ep, ep, per).sum(axis=2)  # [src, dst]
    tb = float(hidden * DTYPE_BYTES[dtype])
    remote = send - np.diag(np.diag(send))
    sent = remote.sum(axis=1) * tb
    received = remote.sum(axis=0) * tb
    load = send.sum(axis=0)
    cluster = Cluster.dgx(gpu, max(1, -(-ep // 8)))
    link = cluster.intra_link() if ep <= cluster.gpus_per_node else cluster.inter_link()
    eta = bus_efficiency(link)
    worst = float(max(sent.max(), received.max())) if ep > 1 else 0.0
    time_s = link.latency_s + worst / (link.bytes_per_s * eta) if worst > 0 else 0.0
    total_per_rank = float(send.sum()) / ep * tb  # S: the mean send buffer
    cm = CostModel(cluster, ParallelConfig(pp=1, ep=1))
    uniform = cm.collective_time(Collective("all_to_all", total_per_rank, "ep", ep), link)
    gpu_spec = cluster.gpu
    a = cost_assumptions()
    expert_t = []
    for r in range(ep):
        flops = gemm_flops(float(load[r]), hidden, expert_width, 3)
        nbytes = DTYPE_BYTES[dtype] * (3 * hidden * expert_width * per + float(load[r]) * (2 * hidden + 3 * expert_width))
        expert_t.append(0.0 if expert_width <= 0 else a["kernel_launch_s"] + max(
            flops / (gpu_spec.peak_flops * a["gemm_efficiency"]), nbytes / (gpu_spec.hbm_bytes_per_s * a["hbm_efficiency"])))
    return AllToAllVolumes(
        ep=ep, experts_per_rank=per, send=tuple(tuple(int(v) for v in row) for row in send), token_bytes=tb,
        dispatch_sent=tuple(float(v) for v in sent), dispatch_received=tuple(float(v) for v in received),
        expert_tokens=tuple(int(v) for v in load), link=link.name if ep > 1 else "none", time_s=time_s, uniform_time_s=uniform,
        expert_time_s=tuple(expert_t),
    )


def moe_all_to_all(model: str | ModelSpec = "qwen3-30b-a3b", *, ep: int = 8, top_k: int | None = None,
                   skew: float = 0.0, tokens_per_rank: int = 4096, seed: int = 0, jitter: float | None = None,
                   gpu: str = "H100", dtype: str = "bf16") -> AllToAllVolumes:
    """Sample routing for a shipped MoE model and return its dispatch/combine volumes and per-rank load.

    Args:
        model: a MoE model (name or spec): experts, top-k, hidden and expert width come from it.
        ep: EP ranks (divides the experts). top_k: override the model's experts per token.
        skew: Zipf exponent of expert popularity (0: the exact uniform split; 1-1.5 strongly skewed).
        jitter: per-rank noise on the expert shares (see :func:`sample_routing`).
        tokens_per_rank: tokens each rank routes per micro-batch (micro-batch size x sequence).
    """
    spec = _as_model(model)
    if not spec.has_moe:
        raise ConfigError(f"field 'model' = {spec.name!r} has no MoE layers; allowed: a MoE model")
    k = spec.moe.num_experts_per_tok if top_k is None else top_k
    counts = sample_routing(tokens_per_rank, ep, spec.moe.num_experts, k, skew, seed=seed, jitter=jitter)
    return all_to_all_volumes(counts, ep, spec.hidden_size, dtype=dtype, expert_width=spec.moe.moe_intermediate_size,
                              gpu=gpu)


def a2a_volume_vs_topk(model: str | ModelSpec = "qwen3-30b-a3b", *, top_ks: Sequence[int] = (1, 2, 4, 8),
                       eps: Sequence[int] = (2, 4, 8, 16, 32), tokens_per_rank: int = 4096, gpu: str = "H100",
                       dtype: str = "bf16"):
    """Expected (uniform routing) dispatch volume and time per rank vs top-k and EP size.

    Each rank sends ``tokens * top_k`` copies of ``hidden * dtype`` bytes, of which ``(ep-1)/ep`` leave the
    rank. Columns: ``top-k``, ``ep``, ``link``, ``dispatch per rank (MiB)``, ``dispatch + combine (us)``.
    """
    import pandas as pd

    spec = _as_model(model)
    rows = []
    for ep in eps:
        cluster = Cluster.dgx(gpu, max(1, -(-ep // 8)))
        link = cluster.intra_link() if ep <= cluster.gpus_per_node else cluster.inter_link()
        cm = CostModel(cluster, ParallelConfig(pp=1, ep=1))
        for k in top_ks:
            s = float(tokens_per_rank * k * spec.hidden_size * DTYPE_BYTES[dtype])
            t = cm.collective_time(Collective("all_to_all", s, "ep", ep), link)
            rows.append({"top-k": k, "ep": ep, "link": link.name,
                         "dispatch per rank (MiB)": s * (ep - 1) / ep / 2**20, "dispatch + combine (us)": 2 * t * 1e6})
    return pd.DataFrame(rows)


def skew_sweep(model: str | ModelSpec = "qwen3-30b-a3b", *, skews: Sequence[float] = (0.0, 0.5, 1.0, 1.5),
               ep: int = 8, tokens_per_rank: int = 4096, seed: int = 0, jitter: float | None = None,
               gpu: str = "H100"):
    """Load imbalance and all-to-all time vs routing skew. Columns: ``skew``, ``load imbalance``,
    ``all-to-all (us)``, ``uniform all-to-all (us)``, ``slowest expert GEMMs (us)``, ``mean expert GEMMs (us)``."""
    import pandas as pd

    spec = _as_model(model)
    rows = []
    for s in skews:
        v = moe_all_to_all(spec, ep=ep, skew=float(s), tokens_per_rank=tokens_per_rank, seed=seed, jitter=jitter,
                           gpu=gpu)
        rows.append({"skew": float(s), "load imbalance": v.load_imbalance, "all-to-all (us)": v.time_s * 1e6,
                     "uniform all-to-all (us)": v.uniform_time_s * 1e6,
                     "slowest expert GEMMs (us)": max(v.expert_time_s) * 1e6,
                     "mean expert GEMMs (us)": sum(v.expert_time_s) / ep * 1e6})
    return pd.DataFrame(rows)


