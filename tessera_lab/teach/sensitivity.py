"""What moves the needle: why a model knob barely changes the iteration time in one setting and a lot in another.

The attention ratio (linear-attention layers per full-attention layer) swaps a Gated DeltaNet mixer for a full
(gated GQA) attention mixer. It changes the iteration time only as much as those two mixers differ in cost, and
that difference is small next to the rest of the layer (MoE experts, all-to-all) at 4,096 tokens, because the
full-attention core grows with the square of the sequence and the rest linearly.

* :func:`layer_time_split`: per layer kind, the time of one micro-batch's F + B + W split into the attention core,
  the other compute and the communication (analytic, standalone, seconds).
* :func:`attention_ratio_sweep`: the planned iteration time for several attention ratios in several settings
  (sequence length, EP inside or across nodes, TP), and the spread between ratios per setting.

Times from the analytic cost model (``data/hardware/cost_model.json``), seconds; plans with
:func:`tessera_lab.plan.make.make_plan` (overlap-aware ILP, no baselines).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from tessera_lab.cost.analytic import CostModel
from tessera_lab.errors import TesseraError
from tessera_lab.model.hardware import ParallelConfig, cluster_for
from tessera_lab.model.spec import load_model
from tessera_lab.model.tasks import layer_tasks

#: the settings of :func:`attention_ratio_sweep`: name -> ParallelConfig fields (64 to 256 H200 GPUs)
RATIO_SETTINGS: dict[str, dict[str, Any]] = {
    "EP=8 in a node, 4K tokens": {"pp": 8, "ep": 8, "seq_len": 4096, "microbatches": 32},
    "EP=8 in a node, 32K tokens": {"pp": 8, "ep": 8, "seq_len": 32768, "microbatches": 32},
    "EP=32 over 4 nodes, 4K tokens": {"pp": 8, "ep": 32, "seq_len": 4096, "microbatches": 32},
    "TP=2, EP=8, 4K tokens": {"pp": 8, "ep": 8, "tp": 2, "seq_len": 4096, "microbatches": 32},
    "TP=2, EP=8, 32K tokens": {"pp": 8, "ep": 8, "tp": 2, "seq_len": 32768, "microbatches": 32},
}
_CORE_OPS = {"attention", "linear_attention"}


def layer_time_split(model: str = "qwen3-next-80b-a3b", parallel: ParallelConfig | None = None,
                     gpu: str = "H200"):
    """Standalone F + B + W time of one micro-batch for one layer of each kind, split by what it does.

    Returns:
        pandas DataFrame indexed by layer kind (e.g. ``linear_attention+moe``) with columns ``attention core (ms)``,
        ``other compute (ms)``, ``communication (ms)``, ``layer (ms)`` and ``attention core share``.
    """
    import pandas as pd

    spec = load_model(model)
    parallel = parallel or ParallelConfig()
    cm = CostModel(cluster_for(parallel, gpu), parallel)
    rows, seen = [], set()
    for layer in spec.stack.layers:
        lt = layer_tasks(spec, layer, parallel)
        if lt.kind in seen:
            continue
        seen.add(lt.kind)
        core = other = comm = 0.0
        for t in lt.all():
            dt = cm.task_time(t)
            if t.is_comm:
                comm += dt
            elif t.op in _CORE_OPS:
                core += dt
            else:
                other += dt
        total = core + other + comm
        rows.append({"layer kind": lt.kind, "attention core (ms)": core * 1e3, "other compute (ms)": other * 1e3,
                     "communication (ms)": comm * 1e3, "layer (ms)": total * 1e3,
                     "attention core share": core / total if total else math.nan})
    return pd.DataFrame(rows).set_index("layer kind")


def layers_time(model: Any, parallel: ParallelConfig, gpu: str = "H200") -> float:
    """Standalone F + B + W time of all decoder layers for one micro-batch (seconds; no overlap, no bubble): the
    work the pipeline stages share, whatever the partition."""
    from tessera_lab.model.tasks import decompose

    cm = CostModel(cluster_for(parallel, gpu), parallel)
    return sum(cm.task_time(t) for lt in decompose(model, parallel) if 0 <= lt.layer < model.num_layers
               for t in lt.all())


def attention_ratio_sweep(model: str = "qwen3-next-80b-a3b", ratios: Sequence[int] = (1, 3, 7), *,
                          settings: Mapping[str, Mapping[str, Any]] | None = None, gpu: str = "H200"):
    """How much the attention ratio moves the time, in each setting.

    For each (setting, ratio): ``layers (ms)``, the standalone time of all decoder layers for one micro-batch
    (:func:`layers_time`; always defined), and ``iteration (s)`` of the overlap-aware plan where one fits in GPU
    memory (``n/a`` with the reason otherwise: long sequences need activation recompute).

    Args:
        ratios: linear-attention layers per full-attention layer (the model must be hybrid).
        settings: name -> :class:`ParallelConfig` fields (default :data:`RATIO_SETTINGS`).
    Returns:
        ``(table, spread)``: the rows above as a DataFrame, and per setting the relative spread
        ``(max - min) / min`` over the ratios of ``layers (ms)`` and of ``iteration (s)`` (NaN where a ratio
        could not be planned).
    """
    import pandas as pd

    from tessera_lab.plan.make import make_plan

    base = load_model(model)
    rows = []
    for name, fields in (settings or RATIO_SETTINGS).items():
        parallel = ParallelConfig(**fields)
        for r in ratios:
            spec = base.with_changes(attention_ratio=r) if r != base.attention_ratio else base
            row = {"setting": name, "attention ratio": r, "layers (ms)": layers_time(spec, parallel, gpu) * 1e3}
            try:
                plan = make_plan(spec, parallel, gpu=gpu, baselines=())
                row.update({"iteration (s)": plan.chosen.iteration_time_s, "MFU": plan.chosen.mfu, "note": ""})
            except TesseraError as exc:
                row.update({"iteration (s)": math.nan, "MFU": math.nan,
                            "note": "plan n/a: " + str(exc).split(";")[0].split(": even")[0]})
            rows.append(row)
    table = pd.DataFrame(rows)

    def spread(s):
        return (s.max() - s.min()) / s.min() if s.notna().all() else math.nan

    g = table.groupby("setting", sort=False)
    out = pd.DataFrame({"spread of layers time": g["layers (ms)"].agg(spread),
                        "spread of planned iteration": g["iteration (s)"].agg(spread)})
    return table, out
