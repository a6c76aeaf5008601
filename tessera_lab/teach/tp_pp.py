"""Tensor vs pipeline parallelism (notebook 02): the TP all-reduces of each layer (two in the forward, two in the
backward), the pipeline's point-to-point bytes per stage boundary, the link each runs on and the resulting time.

Units: bytes, seconds, bytes/s per GPU per direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from tessera_lab.cost.analytic import CostModel
from tessera_lab.model.hardware import Cluster, Link, ParallelConfig, hardware_data
from tessera_lab.model.spec import ModelSpec, load_model
from tessera_lab.model.tasks import Collective, layer_tasks, p2p_activation_bytes
from tessera_lab.teach.collectives import _check_int

# =====================================================================================================
# 3. tensor vs pipeline parallelism
# =====================================================================================================
@dataclass(frozen=True)
class TpPpVolumes:
    """Communication of tensor and pipeline parallelism for one micro-batch (result of :func:`tp_vs_pp_volumes`).

    Attributes:
        model, gpu: names.
        tp, pp: parallel sizes; ``nodes`` of 8 GPUs hold the ``tp * pp`` ranks (TP innermost).
        layers: decoder layers; ``layers_per_stage`` the most any stage holds.
        tokens: tokens per micro-batch (``micro_batch_size * seq_len``).
        allreduces_per_layer_forward, allreduces_per_layer_backward: TP all-reduces of one layer (the most
            any layer has; 0 when tp = 1).
        allreduce_bytes: S of one TP all-reduce (the full activation ``tokens * hidden * dtype``).
        tp_link: the link a TP group runs on (NVLink while ``tp <= 8``).
        tp_time_each_s: time of one TP all-reduce on ``tp_link``; ``tp_time_each_other_link_s`` on the other
            link (what it would cost if the group sat across nodes, or inside one).
        tp_time_per_stage_s: all TP all-reduce time of one stage for one micro-batch, forward + backward. These
            all-reduces are on the critical path: the next GEMM needs their result.
        p2p_bytes: bytes one rank sends across a stage boundary per micro-batch and direction (activations
            forward, their gradient backward; with TP each rank sends its 1/tp share).
        boundary_links: link of each stage boundary ``s -> s+1`` (InfiniBand where the stages sit on
            different nodes).
        p2p_time_each_s: time of one p2p transfer per boundary.
        compute_per_stage_s: standalone compute (F + B + W) of the busiest stage per micro-batch.
        rows: one dict per kind of communication (see :meth:`frame`).
    """

    model: str
    gpu: str
    tp: int
    pp: int
    nodes: int
    layers: int
    layers_per_stage: int
    tokens: int
    allreduces_per_layer_forward: int
    allreduces_per_layer_backward: int
    allreduce_bytes: float
    tp_link: str
    tp_time_each_s: float
    tp_time_each_other_link_s: float
    tp_time_per_stage_s: float
    p2p_bytes: float
    boundary_links: tuple[str, ...]
    p2p_time_each_s: tuple[float, ...]
    compute_per_stage_s: float
    rows: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    def frame(self):
        """The rows as a pandas DataFrame indexed by communication."""
        import pandas as pd

        return pd.DataFrame(list(self.rows)).set_index("communication")

    def summary(self) -> dict[str, Any]:
        """Headline numbers (plain values, easy to compare in tests)."""
        return {
            "allreduces per layer (forward)": self.allreduces_per_layer_forward,
            "allreduces per layer (backward)": self.allreduces_per_layer_backward,
            "bytes per all-reduce": self.allreduce_bytes,
            "TP link": self.tp_link,
            "TP time per stage per micro-batch (ms)": self.tp_time_per_stage_s * 1e3,
            "p2p bytes per boundary per direction": self.p2p_bytes,
            "boundaries crossing nodes": sum(link != "NVLink" for link in self.boundary_links),
            "p2p time per boundary per micro-batch (ms)": 2 * max(self.p2p_time_each_s, default=0.0) * 1e3,
            "compute per stage per micro-batch (ms)": self.compute_per_stage_s * 1e3,
        }


def _as_model(model: str | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


def _layer_allreduces(spec: ModelSpec, parallel: ParallelConfig, cm: CostModel) -> tuple[list, list, list, float]:
    """Per layer: its TP all-reduces in the forward and the backward (0 without TP) and its standalone compute
    (seconds); and the largest all-reduce's bytes (0 without TP)."""
    tp = parallel.tp
    f_counts, b_counts, compute = [], [], []
    ar_bytes = 0.0
    for layer in spec.stack.layers:
        lt = layer_tasks(spec, layer, parallel)
        f_ar = [t for t in lt.F if t.collective is not None and t.collective.kind == "all_reduce" and t.collective.group == "tp"]
        b_ar = [t for t in lt.B if t.collective is not None and t.collective.kind == "all_reduce" and t.collective.group == "tp"]
        f_counts.append(len(f_ar) if tp > 1 else 0)
        b_counts.append(len(b_ar) if tp > 1 else 0)
        if f_ar and tp > 1:
            ar_bytes = max(ar_bytes, max(t.collective.bytes for t in f_ar))
        compute.append(sum(cm.compute_time(t) for t in lt.all() if t.collective is None))
    return f_counts, b_counts, compute, ar_bytes


def _pp_rows(pp: int, p2p_bytes: float, links: list[str], p2p_times: list[float], intra: str) -> list[dict[str, Any]]:
    """The table's two PP rows (forward activations, backward gradients) at the slowest stage boundary."""
    rows = []
    crossing = [i for i, name in enumerate(links) if name != intra]
    worst = max(range(len(p2p_times)), key=lambda i: p2p_times[i]) if p2p_times else None
    for phase, what in (("forward", "activations"), ("backward", "gradients")):
        rows.append({
            "communication": f"PP send {what} ({phase})", "parallelism": "PP", "pattern": "send/recv",
            "group size": 2 if pp > 1 else 1, "per layer": 0, "per stage per micro-batch": 1 if pp > 1 else 0,
            "bytes each (MiB)": p2p_bytes / 2**20 if pp > 1 else 0.0,
            "bytes per stage per micro-batch (MiB)": p2p_bytes / 2**20 if pp > 1 else 0.0,
            "link": (links[worst] if worst is not None else "-")
            + (f" ({len(crossing)} of {len(links)} boundaries cross nodes)" if links else ""),
            "time each (us)": p2p_times[worst] * 1e6 if worst is not None else 0.0,
            "time per stage per micro-batch (ms)": p2p_times[worst] * 1e3 if worst is not None else 0.0,
            "on the critical path": "only at stage boundaries; overlaps other micro-batches' compute",
        })
    return rows


def tp_vs_pp_volumes(model: str | ModelSpec = "qwen3-8b", tp: int = 8, pp: int = 4, *, seq_len: int = 4096,
                     micro_batch_size: int = 1, gpu: str = "H100", dtype: str = "bf16") -> TpPpVolumes:
    """Tensor-parallel all-reduces vs pipeline point-to-point traffic for one micro-batch.

    The all-reduces are those :func:`tessera_lab.model.tasks.layer_tasks` emits with ``tp > 1``: one after the
    attention's output projection and one after the MLP's down projection (or the shared expert of a MoE
    layer; routed experts are split by EP, not TP), in the forward; the backward has the mirror pair on the
    input gradients. Each moves ``S = tokens * hidden * dtype`` bytes. Ranks are placed TP innermost on nodes
    of 8 GPUs, so a TP group of up to 8 stays on NVLink, and stage ``s`` occupies ranks ``s*tp`` to
    ``(s+1)*tp - 1``: a boundary whose two stages sit on different nodes goes over InfiniBand. Times come from
    :class:`~tessera_lab.cost.analytic.CostModel` (alpha-beta with nccl-tests bus factors).

    Args:
        model: a shipped model name or a :class:`~tessera_lab.model.spec.ModelSpec`.
        tp: tensor-parallel size (1 to 64); pp: pipeline stages (1 to the number of layers).
        seq_len, micro_batch_size: tokens per micro-batch = their product.
        gpu: ``H100``, ``H200`` or ``B200``; dtype: ``bf16``, ``fp16``, ``fp8`` or ``fp32``.

    Raises:
        ConfigError: a size out of range.
    """
    spec = _as_model(model)
    _check_int("tp", tp, 1, 64)
    _check_int("pp", pp, 1, spec.num_layers)
    parallel = ParallelConfig(pp=pp, tp=tp, ep=1, dp=1, microbatches=max(pp, 1), micro_batch_size=micro_batch_size,
                              seq_len=seq_len, dtype=dtype)
    per_node = int(hardware_data()["node"]["gpus_per_node"])
    nodes = max(1, -(-parallel.world_size // per_node))
    cluster = Cluster.dgx(gpu, nodes)
    cm = CostModel(cluster, parallel)
    intra, inter = cluster.intra_link(), cluster.inter_link()
    tp_link = cluster.link_for(parallel.group_ranks("tp"))
    other = inter if tp_link.name == intra.name else intra

    f_counts, b_counts, compute, ar_bytes = _layer_allreduces(spec, parallel, cm)
    if tp == 1:  # what one all-reduce would carry if the layer were split
        ar_bytes = float(parallel.tokens_per_microbatch * spec.hidden_size * parallel.dtype_bytes)
    bounds = [round(s * spec.num_layers / pp) for s in range(pp + 1)]
    stages = [range(bounds[s], bounds[s + 1]) for s in range(pp)]
    per_stage_ar = [sum(f_counts[i] + b_counts[i] for i in st) for st in stages]
    per_stage_compute = [sum(compute[i] for i in st) for st in stages]
    busiest = max(range(pp), key=lambda s: (per_stage_ar[s], per_stage_compute[s]))

    def ar_time(link: Link) -> float:
        return cm.collective_time(Collective("all_reduce", ar_bytes, "tp", max(tp, 2)), link) if tp > 1 else 0.0

    t_each, t_other = ar_time(tp_link), ar_time(other)
    tp_stage = per_stage_ar[busiest] * t_each
    p2p_bytes = p2p_activation_bytes(spec, parallel)
    links, p2p_times = [], []
    for s in range(pp - 1):
        link = cluster.link_for([parallel.rank(s), parallel.rank(s + 1)])
        links.append(link.name)
        p2p_times.append(cm.collective_time(Collective("p2p", p2p_bytes, "pp", 2), link))

    f_max, b_max = max(f_counts, default=0), max(b_counts, default=0)
    n_stage_layers = len(stages[busiest])
    rows = []
    for phase, count in (("forward", f_max), ("backward", b_max)):
        n_ops = sum((f_counts if phase == "forward" else b_counts)[i] for i in stages[busiest])
        rows.append({
            "communication": f"TP all-reduce ({phase})", "parallelism": "TP", "pattern": "all-reduce",
            "group size": tp, "per layer": count, "per stage per micro-batch": n_ops,
            "bytes each (MiB)": ar_bytes / 2**20 if tp > 1 else 0.0,
            "bytes per stage per micro-batch (MiB)": n_ops * ar_bytes / 2**20,
            "link": tp_link.name if tp > 1 else "-", "time each (us)": t_each * 1e6,
            "time per stage per micro-batch (ms)": n_ops * t_each * 1e3,
            "on the critical path": "yes: the next GEMM needs the sum",
        })
    rows += _pp_rows(pp, p2p_bytes, links, p2p_times, intra.name)
    return TpPpVolumes(
        model=spec.name, gpu=cluster.gpu.name, tp=tp, pp=pp, nodes=nodes, layers=spec.num_layers,
        layers_per_stage=n_stage_layers, tokens=parallel.tokens_per_microbatch,
        allreduces_per_layer_forward=f_max, allreduces_per_layer_backward=b_max, allreduce_bytes=ar_bytes,
        tp_link=tp_link.name if tp > 1 else "-", tp_time_each_s=t_each, tp_time_each_other_link_s=t_other,
        tp_time_per_stage_s=tp_stage, p2p_bytes=p2p_bytes if pp > 1 else 0.0, boundary_links=tuple(links),
        p2p_time_each_s=tuple(p2p_times), compute_per_stage_s=per_stage_compute[busiest], rows=tuple(rows),
    )


def tp_pp_layouts(model: str | ModelSpec = "qwen3-8b", gpus: int = 32, *, seq_len: int = 4096,
                  micro_batch_size: int = 1, gpu: str = "H100", dtype: str = "bf16"):
    """Every (tp, pp) split of ``gpus`` ranks (powers of two, pp at most the layers): where each kind of
    traffic runs and what it costs per micro-batch on the busiest stage. Columns ``tp``, ``pp``, ``TP link``,
    ``boundaries crossing nodes``, ``TP all-reduce per stage (ms)``, ``PP p2p per boundary (ms)``,
    ``compute per stage (ms)``, ``TP comm / compute``."""
    import pandas as pd

    spec = _as_model(model)
    _check_int("gpus", gpus, 1, 1024)
    rows = []
    tp = 1
    while tp <= gpus:
        pp = gpus // tp
        if tp * pp == gpus and pp <= spec.num_layers:
            v = tp_vs_pp_volumes(spec, tp, pp, seq_len=seq_len, micro_batch_size=micro_batch_size, gpu=gpu, dtype=dtype)
            rows.append({"tp": tp, "pp": pp, "TP link": v.tp_link,
                         "boundaries crossing nodes": f"{sum(k != 'NVLink' for k in v.boundary_links)} of {pp - 1}",
                         "TP all-reduce per stage (ms)": v.tp_time_per_stage_s * 1e3,
                         "PP p2p per boundary (ms)": 2 * max(v.p2p_time_each_s, default=0.0) * 1e3,
                         "compute per stage (ms)": v.compute_per_stage_s * 1e3,
                         "TP comm / compute": v.tp_time_per_stage_s / v.compute_per_stage_s})
        tp *= 2
    return pd.DataFrame(rows).set_index(["tp", "pp"])


def tp_link_sweep(model: str | ModelSpec = "qwen3-8b", tps: Sequence[int] = (1, 2, 4, 8, 16, 32), *,
                  seq_len: int = 4096, micro_batch_size: int = 1, gpu: str = "H100", dtype: str = "bf16"):
    """Per layer and micro-batch: TP all-reduce time (forward + backward) vs the layer's compute, for each tp.

    Compute shrinks as 1/tp, while the all-reduce bytes stay ``tokens * hidden * dtype``; past 8 the group
    leaves the node and the all-reduces go over InfiniBand. Returns a DataFrame with columns ``tp``, ``link``,
    ``compute per layer (ms)``, ``TP all-reduce per layer (ms)``, ``comm / compute``.
    """
    import pandas as pd

    spec = _as_model(model)
    rows = []
    for tp in tps:
        v = tp_vs_pp_volumes(spec, tp, 1, seq_len=seq_len, micro_batch_size=micro_batch_size, gpu=gpu, dtype=dtype)
        per_layer_comm = (v.allreduces_per_layer_forward + v.allreduces_per_layer_backward) * v.tp_time_each_s
        per_layer_compute = v.compute_per_stage_s / v.layers
        rows.append({"tp": tp, "link": v.tp_link if tp > 1 else "none",
                     "compute per layer (ms)": per_layer_compute * 1e3,
                     "TP all-reduce per layer (ms)": per_layer_comm * 1e3,
                     "comm / compute": per_layer_comm / per_layer_compute})
    return pd.DataFrame(rows)


