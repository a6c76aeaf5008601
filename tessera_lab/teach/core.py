"""Pure functions behind the teaching notebooks: 01 collectives, 02 tensor vs pipeline parallelism and
04 MoE all-to-all and routing skew.

Three groups:

* **Collectives** (notebook 01). :func:`run_collectives` runs all-reduce, all-gather, reduce-scatter,
  all-to-all and point-to-point send/recv on small tensors in ``world_size`` local gloo processes and returns,
  per collective, each rank's input and output; :func:`expected_collective` is the same data movement written
  in plain Python (the reference the tests compare with). :func:`collective_cost_table` gives each
  collective's alpha-beta formula with nccl-tests' bus-bandwidth factor and its time on NVLink and on
  InfiniBand for one message size (:class:`~tessera_lab.cost.analytic.CostModel`).
* **Tensor vs pipeline parallelism** (notebook 02). :func:`tp_vs_pp_volumes` counts the tensor-parallel
  all-reduces of each layer (two per layer in the forward: after the attention and after the MLP or shared
  expert; two more in the backward), their bytes, the pipeline's point-to-point bytes per stage boundary, the
  link each runs on and the resulting time. :func:`tp_link_sweep` shows the cliff when a TP group leaves the
  node.
* **MoE all-to-all** (notebook 04). :func:`sample_routing` draws tokens per (source rank, expert) from the
  shared routing model :mod:`tessera_lab.dynamic.routing` (Zipf-skewed expert popularity, top-k distinct experts per
  token); :func:`all_to_all_volumes` turns that into the dispatch and
  combine traffic between EP ranks, the per-rank expert load and the resulting all-to-all time (the slowest
  rank sets it). :func:`moe_all_to_all` does both for a shipped model.

Units: bytes, seconds, bytes/s per GPU per direction. Planning modules never import torch; this module
imports torch only inside :func:`run_collectives`' worker processes, and ipywidgets / matplotlib only inside
the panel and plot builders.
"""

from __future__ import annotations

import math
import os
import queue as _queue
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from tessera_lab.cost.analytic import BUS_FACTOR, CostModel
from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.model.hardware import DTYPE_BYTES, Cluster, GPUSpec, Link, ParallelConfig, cost_assumptions, hardware_data
from tessera_lab.model.spec import ModelSpec, load_model
from tessera_lab.model.tasks import Collective, layer_tasks, p2p_activation_bytes

__all__ = [
    "COLLECTIVES", "CollectiveRun", "collective_inputs", "expected_collective", "run_collectives",
    "collectives_frame", "collective_cost_table", "collective_cost_sweep", "link_bandwidths",
    "TpPpVolumes", "tp_vs_pp_volumes", "tp_pp_layouts", "tp_link_sweep",
    "sample_routing", "AllToAllVolumes", "all_to_all_volumes", "moe_all_to_all",
    "a2a_volume_vs_topk", "skew_sweep",
    "plot_collectives", "plot_cost_bars", "plot_cost_vs_size", "plot_tp_sweep", "plot_moe", "plot_a2a_vs_topk",
    "plot_skew_sweep", "reference_collectives",
    "collective_cost_panel", "tp_pp_panel", "moe_panel",
]

#: the five collectives of DESIGN section 12, in teaching order.
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")

_DESCRIPTION = {
    "all_reduce": "sum of every rank's buffer, everywhere",
    "all_gather": "every rank's piece, concatenated, everywhere",
    "reduce_scatter": "rank r keeps slice r of the sum",
    "all_to_all": "rank r sends its j-th chunk to rank j (a transpose; n(n-1) pairs)",
    "p2p": "one rank sends, one receives (ring: r -> r+1)",
}
_TORCH_CALL = {
    "all_reduce": "dist.all_reduce(x, op=SUM)",
    "all_gather": "dist.all_gather_single(out, x)",
    "reduce_scatter": "dist.reduce_scatter_single(out, x, op=SUM)",
    "all_to_all": "dist.all_to_all_single(out, x)",
    "p2p": "dist.isend(x, r+1); dist.irecv(out, r-1)",
}
#: nccl-tests' definition of the message size S of each collective (doc/PERFORMANCE.md).
_S_DEFINITION = {
    "all_reduce": "buffer per rank",
    "all_gather": "gathered output per rank",
    "reduce_scatter": "input per rank",
    "all_to_all": "send buffer per rank",
    "p2p": "message",
}
_FACTOR_TEXT = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
                "all_to_all": "(n-1)/n", "p2p": "1"}


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum is not None and value > maximum):
        allowed = f"an integer >= {minimum}" if maximum is None else f"an integer from {minimum} to {maximum}"
        raise ConfigError(f"field '{name}' = {value!r} is out of range; allowed: {allowed}")
    return value


def _check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    bad = [k for k in kinds if k not in COLLECTIVES]
    if bad:
        raise ConfigError(f"field 'kinds' has {bad}; allowed: {', '.join(COLLECTIVES)}")
    return tuple(kinds)


# =====================================================================================================
# 1. collectives on local gloo processes
# =====================================================================================================
@dataclass(frozen=True)
class CollectiveRun:
    """One collective as it ran: per rank, the input and output buffers (flat lists of floats).

    Attributes:
        kind: one of :data:`COLLECTIVES`.
        inputs: ``inputs[r]`` is rank r's buffer before the call.
        outputs: ``outputs[r]`` is rank r's buffer after the call.
        call: the ``torch.distributed`` call that ran.
        backend: ``"gloo"`` (real processes) or ``"reference"`` (:func:`expected_collective`).
    """

    kind: str
    inputs: list[list[float]]
    outputs: list[list[float]]
    call: str
    backend: str = "gloo"

    @property
    def world_size(self) -> int:
        return len(self.inputs)


def _value_base(world_size: int, chunk: int) -> int:
    return 10 ** max(1, len(str(world_size * chunk - 1)))


def collective_inputs(kind: str, world_size: int = 4, chunk: int = 1) -> list[list[float]]:
    """Readable input buffers: element j of rank r is ``base * r + j`` (``base`` = 10 for up to 10 elements).

    The tens digit names the rank a value came from, so after the call one can read off where each element
    travelled. All-gather gives each rank only its own ``chunk`` elements (``[base * r + j for j < chunk]``);
    every other collective gives each rank ``world_size * chunk`` elements.
    """
    _check_kinds([kind])
    n = _check_int("world_size", world_size, 2, 16)
    c = _check_int("chunk", chunk, 1, 64)
    base = _value_base(n, c)
    length = c if kind == "all_gather" else n * c
    return [[float(base * r + j) for j in range(length)] for r in range(n)]


def expected_collective(kind: str, inputs: Sequence[Sequence[float]]) -> list[list[float]]:
    """The data movement of a collective in plain Python (sum reductions; p2p is the ring r -> r+1).

    Args:
        kind: one of :data:`COLLECTIVES`.
        inputs: per-rank buffers; for ``reduce_scatter`` and ``all_to_all`` each length must divide by the
            number of ranks.

    Returns:
        per-rank output buffers.
    """
    _check_kinds([kind])
    n = len(inputs)
    if n < 2:
        raise ConfigError(f"field 'inputs' has {n} rank(s); allowed: at least 2")
    xs = [list(map(float, x)) for x in inputs]
    if kind == "all_reduce":
        total = [sum(col) for col in zip(*xs)]
        return [list(total) for _ in range(n)]
    if kind == "all_gather":
        gathered = [v for x in xs for v in x]
        return [list(gathered) for _ in range(n)]
    if kind == "p2p":
        return [list(xs[(r - 1) % n]) for r in range(n)]
    length = len(xs[0])
    if length % n:
        raise ConfigError(f"field 'inputs' has {length} elements per rank; allowed: a multiple of {n} for {kind}")
    c = length // n
    if kind == "reduce_scatter":
        total = [sum(col) for col in zip(*xs)]
        return [total[r * c:(r + 1) * c] for r in range(n)]
    # all_to_all: rank r receives chunk r of every rank, in rank order
    return [[v for src in range(n) for v in xs[src][r * c:(r + 1) * c]] for r in range(n)]


def _collectives_worker(rank: int, world_size: int, chunk: int, kinds: tuple[str, ...], init_file: str,
                        timeout_s: float, results) -> None:
    """Entry of one gloo process: run each collective, put ``("ok", rank, {kind: (in, out)})`` or
    ``("error", rank, traceback)`` on ``results``."""
    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        if os.path.exists("/sys/class/net/lo"):  # loopback only: no lookup of this host's name
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        n = world_size
        out: dict[str, tuple[list[float], list[float]]] = {}
        try:
            for kind in kinds:
                x = torch.tensor(collective_inputs(kind, n, chunk)[rank], dtype=torch.float64)
                inp = x.tolist()
                if kind == "all_reduce":
                    dist.all_reduce(x, op=dist.ReduceOp.SUM)
                    y = x
                elif kind == "all_gather":
                    y = torch.empty(n * chunk, dtype=x.dtype)
                    # torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor
                    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(y, x)
                elif kind == "reduce_scatter":
                    y = torch.empty(chunk, dtype=x.dtype)
                    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(
                        y, x, op=dist.ReduceOp.SUM)
                elif kind == "all_to_all":
                    y = torch.empty_like(x)
                    dist.all_to_all_single(y, x)
                else:  # p2p ring: non-blocking both ways so that no rank waits for a partner that is sending
                    y = torch.empty_like(x)
                    reqs = [dist.isend(x, (rank + 1) % n), dist.irecv(y, (rank - 1) % n)]
                    for req in reqs:
                        req.wait()
                out[kind] = (inp, y.tolist())
            dist.barrier()
        finally:
            dist.destroy_process_group()
        results.put(("ok", rank, out))
    except BaseException:  # noqa: BLE001 - report anything to the parent, which raises it
        results.put(("error", rank, traceback.format_exc()))


def run_collectives(world_size: int = 4, *, chunk: int = 1, kinds: Sequence[str] = COLLECTIVES,
                    timeout_s: float = 120.0) -> dict[str, CollectiveRun]:
    """Run the collectives on ``world_size`` local gloo processes and return what each rank held.

    The processes start from a fork server that has imported torch once (so four ranks start in about two
    seconds instead of four torch imports), meet through a ``FileStore`` in a temporary folder (no port to
    pick), run every collective in ``kinds`` on the buffers of :func:`collective_inputs` and exit.

    Args:
        world_size: processes (2 to 16).
        chunk: elements per rank per chunk (1 keeps the printout small).
        kinds: which of :data:`COLLECTIVES` to run.
        timeout_s: bound on the whole run; past it every process is terminated and an error raised.

    Returns:
        ``{kind: CollectiveRun}`` in the order of ``kinds``.

    Raises:
        TesseraError: a rank failed (its traceback is in the message) or the run passed ``timeout_s``. Every
            process has been stopped when it is raised.
    """
    import multiprocessing as mp

    n = _check_int("world_size", world_size, 2, 16)
    _check_int("chunk", chunk, 1, 64)
    kinds = _check_kinds(kinds)
    if not timeout_s > 0:
        raise ConfigError(f"field 'timeout_s' = {timeout_s!r} is out of range; allowed: > 0")
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed"])
    else:  # pragma: no cover - Windows
        ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    got: dict[int, dict[str, tuple[list[float], list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="tessera-collectives-") as tmp:
        init_file = str(Path(tmp) / "store")
        deadline = time.monotonic() + timeout_s
        try:
            for r in range(n):
                p = ctx.Process(target=_collectives_worker, name=f"collectives-rank{r}",
                                args=(r, n, chunk, kinds, init_file, float(timeout_s), results), daemon=True)
                p.start()
                procs.append(p)
            while len(got) < n:
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise _queue.Empty
                    status, rank, payload = results.get(timeout=min(0.2, remaining))
                except _queue.Empty:
                    if time.monotonic() >= deadline:
                        raise TesseraError(f"collectives did not finish within timeout_s = {timeout_s} s "
                                           f"(ranks done: {sorted(got)})") from None
                    dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in got]
                    if dead:
                        raise TesseraError(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} "
                                           "before reporting") from None
                    continue
                if status == "error":
                    raise TesseraError(f"rank {rank} failed:\n{payload}")
                got[rank] = payload
        finally:
            for p in procs:
                p.join(timeout=5)
            for p in procs:
                if p.is_alive():
                    p.terminate()
                    p.join(timeout=5)
                if p.is_alive():  # pragma: no cover - last resort
                    p.kill()
                    p.join(timeout=5)
            results.close()
            results.join_thread()
    return {k: CollectiveRun(k, [got[r][k][0] for r in range(n)], [got[r][k][1] for r in range(n)], _TORCH_CALL[k])
            for k in kinds}


def reference_collectives(world_size: int = 4, *, chunk: int = 1,
                          kinds: Sequence[str] = COLLECTIVES) -> dict[str, CollectiveRun]:
    """:func:`expected_collective` on :func:`collective_inputs` for each kind (no processes, no torch)."""
    out = {}
    for k in _check_kinds(kinds):
        inputs = collective_inputs(k, world_size, chunk)
        out[k] = CollectiveRun(k, inputs, expected_collective(k, inputs), _TORCH_CALL[k], backend="reference")
    return out


def collectives_frame(runs: Mapping[str, CollectiveRun]):
    """One row per (collective, rank): input, output, and whether the output equals :func:`expected_collective`."""
    import pandas as pd

    rows = []
    for kind, run in runs.items():
        expected = expected_collective(kind, run.inputs)
        for r in range(run.world_size):
            rows.append({"collective": kind, "rank": r, "input": _fmt(run.inputs[r]), "output": _fmt(run.outputs[r]),
                         "as expected": run.outputs[r] == expected[r]})
    return pd.DataFrame(rows).set_index(["collective", "rank"])


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _sources(kind: str, n: int, chunk: int, rank: int, length: int) -> list[int | None]:
    """For each output element of ``rank``, the rank it came from (``None`` for a sum of all ranks)."""
    if kind in ("all_reduce", "reduce_scatter"):
        return [None] * length
    if kind == "all_gather":
        return [j // chunk for j in range(length)]
    if kind == "all_to_all":
        return [j // chunk for j in range(length)]
    return [(rank - 1) % n] * length  # p2p ring


# =====================================================================================================
# 2. cost formulas: NVLink vs InfiniBand
# =====================================================================================================
def link_bandwidths(gpu: str = "H100") -> dict[str, float]:
    """Per-GPU, per-direction bandwidths (bytes/s) and latencies (s) of the two links, and their ratio.

    Datasheet NVLink figures (900 GB/s on H100/H200, 1,800 GB/s on B200) are bidirectional totals; the cost
    model uses half per direction, against InfiniBand NDR's 50 GB/s per direction. So the per-direction ratio
    is 9 (H100) or 18 (B200); the often quoted 18-36x compares bidirectional NVLink with one direction of IB.
    """
    cluster = Cluster.dgx(gpu, 2)
    intra, inter = cluster.intra_link(), cluster.inter_link()
    seed = hardware_data()["seed_teaching_figures"]
    return {
        "gpu": cluster.gpu.name,
        "nvlink_bytes_per_s": intra.bytes_per_s,
        "infiniband_bytes_per_s": inter.bytes_per_s,
        "nvlink_latency_s": intra.latency_s,
        "infiniband_latency_s": inter.latency_s,
        "ratio_per_direction": intra.bytes_per_s / inter.bytes_per_s,
        "ratio_bidirectional_nvlink_vs_ib": 2 * intra.bytes_per_s / inter.bytes_per_s,
        "quoted_ratio_range": tuple(seed["nvlink_over_ib_ratio_range"]),
        "nccl_bus_efficiency": cost_assumptions()["nccl_bus_efficiency"],
    }


def _cost_model(gpu: str | GPUSpec, nodes: int = 2) -> CostModel:
    return CostModel(Cluster.dgx(gpu, nodes), ParallelConfig(pp=1, ep=1))


def collective_cost_table(message_bytes: float, n: int = 8, gpu: str = "H100"):
    """Each collective's alpha-beta formula and its time on NVLink and on InfiniBand.

    ``t = alpha + S * factor(n) / (B * eta)``: ``S`` as nccl-tests defines it for the collective, ``factor``
    nccl-tests' bus-bandwidth factor (the share of ``S`` each rank must move over its busiest link), ``B`` the
    per-GPU per-direction link bandwidth, ``eta`` the achieved bus efficiency and ``alpha`` the base latency
    (``data/hardware/cost_model.json``). Times come from :meth:`tessera_lab.cost.analytic.CostModel.collective_time`
    with the link given explicitly; the InfiniBand column assumes every rank of the group is on its own node
    (one NIC per GPU), the NVLink column that all are in one node.

    Args:
        message_bytes: ``S`` in bytes (> 0).
        n: ranks in the group (2 to 1024; p2p always has 2).
        gpu: ``H100``, ``H200`` or ``B200`` (sets the NVLink bandwidth).

    Returns:
        pandas DataFrame indexed by collective with columns ``what it does``, ``S is``, ``formula``,
        ``factor``, ``bytes per rank on the wire``, ``NVLink (us)``, ``InfiniBand (us)``, ``IB / NVLink``.
    """
    import pandas as pd

    if not (isinstance(message_bytes, (int, float)) and message_bytes > 0 and math.isfinite(message_bytes)):
        raise ConfigError(f"field 'message_bytes' = {message_bytes!r} is out of range; allowed: > 0")
    _check_int("n", n, 2, 1024)
    cm = _cost_model(gpu)
    intra, inter = cm.cluster.intra_link(), cm.cluster.inter_link()
    rows = []
    for kind in COLLECTIVES:
        size = 2 if kind == "p2p" else n
        coll = Collective(kind, float(message_bytes), "tp", size)
        t_nv, t_ib = cm.collective_time(coll, intra), cm.collective_time(coll, inter)
        factor = BUS_FACTOR[kind](size)
        rows.append({
            "collective": kind,
            "what it does": _DESCRIPTION[kind],
            "S is": _S_DEFINITION[kind],
            "formula": f"alpha + S*{_FACTOR_TEXT[kind]}/(B*eta)",
            "factor": factor,
            "bytes per rank on the wire": message_bytes * factor,
            "NVLink (us)": t_nv * 1e6,
            "InfiniBand (us)": t_ib * 1e6,
            "IB / NVLink": t_ib / t_nv,
        })
    return pd.DataFrame(rows).set_index("collective")


def collective_cost_sweep(sizes: Sequence[float], n: int = 8, gpu: str = "H100",
                          kinds: Sequence[str] = ("all_reduce", "all_to_all", "p2p")):
    """Long table of time vs message size on both links: columns ``collective``, ``link``, ``bytes``,
    ``time (us)``, ``bus bandwidth (GB/s)`` (nccl-tests' ``busbw = S * factor / t``)."""
    import pandas as pd

    _check_kinds(kinds)
    _check_int("n", n, 2, 1024)
    cm = _cost_model(gpu)
    rows = []
    for kind in kinds:
        size = 2 if kind == "p2p" else n
        for link in (cm.cluster.intra_link(), cm.cluster.inter_link()):
            for s in sizes:
                t = cm.collective_time(Collective(kind, float(s), "tp", size), link)
                rows.append({"collective": kind, "link": link.name, "bytes": float(s), "time (us)": t * 1e6,
                             "bus bandwidth (GB/s)": s * BUS_FACTOR[kind](size) / t / 1e9})
    return pd.DataFrame(rows)


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

    # tasks of each layer: TP all-reduces and standalone compute
    f_counts, b_counts, compute = [], [], []
    ar_bytes = 0.0
    for layer in spec.layers:
        lt = layer_tasks(spec, layer, parallel)
        f_ar = [t for t in lt.F if t.collective is not None and t.collective.kind == "all_reduce" and t.collective.group == "tp"]
        b_ar = [t for t in lt.B if t.collective is not None and t.collective.kind == "all_reduce" and t.collective.group == "tp"]
        f_counts.append(len(f_ar) if tp > 1 else 0)
        b_counts.append(len(b_ar) if tp > 1 else 0)
        if f_ar and tp > 1:
            ar_bytes = max(ar_bytes, max(t.collective.bytes for t in f_ar))
        compute.append(sum(cm.compute_time(t) for t in lt.all() if t.collective is None))
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
    crossing = [i for i, name in enumerate(links) if name != intra.name]
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
        link: the link of the EP group (NVLink while ``ep <= 8``).
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
    eta = cost_assumptions()["nccl_bus_efficiency"]
    worst = float(max(sent.max(), received.max())) if ep > 1 else 0.0
    time_s = link.latency_s + worst / (link.bytes_per_s * eta) if worst > 0 else 0.0
    total_per_rank = float(send.sum()) / ep * tb  # S: the mean send buffer
    cm = CostModel(cluster, ParallelConfig(pp=1, ep=1))
    uniform = cm.collective_time(Collective("all_to_all", total_per_rank, "ep", ep), link)
    gpu_spec = cluster.gpu
    a = cost_assumptions()
    expert_t = []
    for r in range(ep):
        flops = 2.0 * float(load[r]) * hidden * expert_width * 3
        nbytes = DTYPE_BYTES[dtype] * (3 * hidden * expert_width * per + float(load[r]) * (2 * hidden + 3 * expert_width))
        expert_t.append(0.0 if expert_width <= 0 else a["kernel_launch_s"] + max(
            flops / (gpu_spec.peak_flops * a["gemm_efficiency"]), nbytes / (gpu_spec.hbm_bytes_per_s * a["hbm_efficiency"])))
    return AllToAllVolumes(
        ep=ep, experts_per_rank=per, send=tuple(tuple(int(v) for v in row) for row in send), token_bytes=tb,
        dispatch_sent=tuple(float(v) for v in sent), dispatch_received=tuple(float(v) for v in received),
        expert_tokens=tuple(int(v) for v in load), link=link.name, time_s=time_s, uniform_time_s=uniform,
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
    k = spec.num_experts_per_tok if top_k is None else top_k
    counts = sample_routing(tokens_per_rank, ep, spec.num_experts, k, skew, seed=seed, jitter=jitter)
    return all_to_all_volumes(counts, ep, spec.hidden_size, dtype=dtype, expert_width=spec.moe_intermediate_size,
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


# =====================================================================================================
# 5. figures (laptop-sized, opaque white background so they read in light and dark themes)
# =====================================================================================================
def _style():
    import seaborn as sns

    return sns.axes_style("whitegrid", {"axes.facecolor": "white", "figure.facecolor": "white"})


def _text_colour(rgb) -> str:
    r, g, b = rgb[:3]
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.5 else "white"


def plot_collectives(runs: Mapping[str, CollectiveRun], *, width: float = 10.0):
    """One row per collective: each rank's buffer before (left) and after (right), one cell per element,
    coloured by the rank the value came from (grey hatched = a sum over all ranks). Returns the figure."""
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.patches import Patch, Rectangle

    kinds = list(runs)
    n = max(run.world_size for run in runs.values())
    palette = sns.color_palette("colorblind", max(n, 3))
    grey = (0.78, 0.78, 0.78)
    with _style():
        fig, axes = plt.subplots(len(kinds), 2, figsize=(width, 0.55 * n * len(kinds) + 1.2), squeeze=False,
                                 facecolor="white", layout="constrained")
        for row, kind in enumerate(kinds):
            run = runs[kind]
            chunk = max(1, len(run.inputs[0]) // n) if kind != "all_gather" else len(run.inputs[0])
            for col, (bufs, title) in enumerate(((run.inputs, "before"), (run.outputs, "after"))):
                ax = axes[row][col]
                width_cells = max(len(b) for b in bufs)
                for r, buf in enumerate(bufs):
                    srcs = [r] * len(buf) if col == 0 else _sources(kind, n, chunk, r, len(buf))
                    for j, (v, src) in enumerate(zip(buf, srcs)):
                        colour = grey if src is None else palette[src]
                        ax.add_patch(Rectangle((j, n - 1 - r), 0.94, 0.9, facecolor=colour, edgecolor="white",
                                               hatch="//" if src is None else None))
                        ax.text(j + 0.47, n - 1 - r + 0.45, f"{v:g}", ha="center", va="center", fontsize=9,
                                color=_text_colour(colour))
                ax.set_xlim(-0.1, max(width_cells, 1))
                ax.set_ylim(-0.1, n)
                ax.set_yticks([n - 1 - r + 0.45 for r in range(n)], [f"rank {r}" for r in range(n)])
                ax.set_xticks([])
                ax.grid(False)
                for spine in ax.spines.values():
                    spine.set_visible(False)
                ax.set_title(f"{kind}: {title}", fontsize=10, loc="left")
                if col == 1:
                    ax.set_xlabel(run.call, fontsize=8, family="monospace")
        handles = [Patch(facecolor=palette[r], label=f"from rank {r}") for r in range(n)]
        handles.append(Patch(facecolor=grey, hatch="//", label="sum of all ranks"))
        fig.legend(handles=handles, loc="outside lower center", ncol=n + 1, frameon=False)
    return fig


def plot_cost_bars(table, *, title: str | None = None):
    """Grouped bars of :func:`collective_cost_table`: NVLink vs InfiniBand time per collective (log scale)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = table[["NVLink (us)", "InfiniBand (us)"]].reset_index().melt(
        id_vars="collective", var_name="link", value_name="time (us)")
    long["link"] = long["link"].str.replace(" (us)", "", regex=False)
    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.6), facecolor="white", layout="constrained")
        sns.barplot(data=long, x="collective", y="time (us)", hue="link", palette="colorblind", ax=ax)
        ax.set_yscale("log")
        ax.set_xlabel("")
        if title:
            ax.set_title(title, fontsize=10)
        for container in ax.containers:
            ax.bar_label(container, fmt="%.3g", fontsize=8, padding=2)
    return fig


def plot_cost_vs_size(sweep, *, title: str | None = None):
    """Log-log time vs message size per collective and link (from :func:`collective_cost_sweep`)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.8), facecolor="white", layout="constrained")
        sns.lineplot(data=sweep, x="bytes", y="time (us)", hue="collective", style="link", palette="colorblind",
                     marker="o", ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size S (bytes)")
        if title:
            ax.set_title(title, fontsize=10)
        sns.move_legend(ax, "upper left", fontsize=8, frameon=True)
    return fig


def plot_tp_sweep(sweep, *, title: str | None = None):
    """Bars of compute vs TP all-reduce time per layer for each tp (from :func:`tp_link_sweep`); the
    all-reduce bar's label names its link."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = sweep.melt(id_vars=["tp", "link"], value_vars=["compute per layer (ms)", "TP all-reduce per layer (ms)"],
                      var_name="", value_name="ms per layer per micro-batch")
    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.6), facecolor="white", layout="constrained")
        sns.barplot(data=long, x="tp", y="ms per layer per micro-batch", hue="", palette="colorblind", ax=ax)
        comm = ax.containers[1]
        ax.bar_label(comm, labels=[lk if lk != "none" else "" for lk in sweep["link"]], fontsize=8, padding=2)
        ax.set_xlabel("tensor-parallel size (8 GPUs per node)")
        if title:
            ax.set_title(title, fontsize=10)
    return fig


def plot_moe(volumes: AllToAllVolumes, *, title: str | None = None):
    """Left: dispatch token copies from each rank to each rank (heatmap; the combine is its transpose).
    Right: expert tokens per rank with the mean (the slowest rank sets the pace)."""
    import matplotlib.pyplot as plt
    import numpy as np
    import seaborn as sns

    send = np.asarray(volumes.send)
    with _style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8), facecolor="white", layout="constrained",
                                   width_ratios=[1, 1.3])
        sns.heatmap(send, ax=a, cmap="viridis", annot=volumes.ep <= 8, fmt="d", cbar_kws={"label": "token copies"},
                    annot_kws={"fontsize": 7})
        a.set_xlabel("to rank (dispatch)")
        a.set_ylabel("from rank")
        a.set_title("dispatch all-to-all (combine = transpose)", fontsize=10)
        palette = sns.color_palette("colorblind", 4)
        load = np.asarray(volumes.expert_tokens)
        b.bar(range(volumes.ep), load, color=[palette[3] if v == load.max() else palette[0] for v in load])
        b.axhline(load.mean(), color=palette[1], linestyle="--", label="mean")
        b.set_xlabel("EP rank")
        b.set_ylabel("token copies for its experts")
        b.set_title(f"per-rank load: max / mean = {volumes.load_imbalance:.2f}", fontsize=10)
        b.legend(fontsize=8)
        if title:
            fig.suptitle(title, fontsize=11)
    return fig


def plot_a2a_vs_topk(table, *, title: str | None = None):
    """Dispatch + combine time per rank vs top-k, one line per EP size (from :func:`a2a_volume_vs_topk`);
    dashed lines run over InfiniBand."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    df = table.assign(**{"EP size": table["ep"].astype(str)})
    with _style():
        fig, ax = plt.subplots(figsize=(8, 3.6), facecolor="white", layout="constrained")
        sns.lineplot(data=df, x="top-k", y="dispatch + combine (us)", hue="EP size", style="link",
                     palette="colorblind", marker="o", ax=ax)
        ax.set_yscale("log")
        ax.set_ylabel("dispatch + combine per layer (us)")
        if title:
            ax.set_title(title, fontsize=10)
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    return fig


def plot_skew_sweep(table, *, title: str | None = None):
    """Left: load imbalance (max / mean) vs skew. Right: all-to-all and expert GEMM time of the slowest rank
    vs skew, beside the uniform all-to-all and the mean expert time (from :func:`skew_sweep`)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    palette = sns.color_palette("colorblind", 4)
    with _style():
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.4), facecolor="white", layout="constrained")
        a.plot(table["skew"], table["load imbalance"], marker="o", color=palette[0])
        a.axhline(1.0, color="grey", linestyle=":")
        a.set_xlabel("routing skew (Zipf exponent)")
        a.set_ylabel("busiest rank / mean")
        a.set_title("per-rank expert load", fontsize=10)
        b.plot(table["skew"], table["all-to-all (us)"], marker="o", color=palette[1], label="all-to-all (slowest rank)")
        b.plot(table["skew"], table["uniform all-to-all (us)"], linestyle="--", color=palette[1], label="all-to-all if uniform")
        b.plot(table["skew"], table["slowest expert GEMMs (us)"], marker="s", color=palette[2], label="expert GEMMs (slowest rank)")
        b.plot(table["skew"], table["mean expert GEMMs (us)"], linestyle="--", color=palette[2], label="expert GEMMs (mean)")
        b.set_xlabel("routing skew (Zipf exponent)")
        b.set_ylabel("us per layer per micro-batch")
        b.set_title("the slowest rank sets the pace", fontsize=10)
        b.legend(fontsize=8)
        if title:
            fig.suptitle(title, fontsize=11)
    return fig


# =====================================================================================================
# 6. widget panels: each callback is a thin shell over one pure function above
# =====================================================================================================
def _show(fig) -> None:
    import matplotlib.pyplot as plt
    from IPython.display import display

    display(fig)
    plt.close(fig)


def collective_cost_panel(n: int = 8, gpu: str = "H100", message_mib: float = 64.0, *, show_figure: bool = True):
    """Notebook 01's panel: a message-size slider (1 KiB to 4 GiB), the group size and the GPU.

    Returns:
        ``(panel, controls, state)``: the widget, the controls by name (set ``.value`` to recompute) and a dict
        with the latest :func:`collective_cost_table` under ``"table"`` (or ``"error"``).
    """
    import ipywidgets as w
    from IPython.display import display

    from tessera_lab.ui.widgets import LABEL_STYLE, panel

    controls = {
        "message_mib": w.FloatLogSlider(value=message_mib, base=2, min=-10, max=12, step=0.5,
                                        description="S (MiB)", style=LABEL_STYLE, continuous_update=False,
                                        readout_format=".4g"),
        "n": w.IntSlider(value=n, min=2, max=64, description="ranks n", style=LABEL_STYLE,
                         continuous_update=False),
        "gpu": w.Dropdown(options=["H100", "H200", "B200"], value=gpu, description="GPU", style=LABEL_STYLE),
    }

    def compute(v: dict[str, Any]):
        return collective_cost_table(v["message_mib"] * 2**20, v["n"], v["gpu"])

    def render(table) -> None:
        display(table[["formula", "factor", "NVLink (us)", "InfiniBand (us)", "IB / NVLink"]])
        if show_figure:
            _show(plot_cost_bars(table, title=f"S = {controls['message_mib'].value:.4g} MiB, "
                                              f"n = {controls['n'].value}, {controls['gpu'].value}"))

    return panel(controls, compute, render, state_key="table")


def tp_pp_panel(model: str = "qwen3-8b", tp: int = 8, pp: int = 4, seq_len: int = 4096, gpu: str = "H100", *,
                show_figure: bool = True):
    """Notebook 02's panel: tp, pp, sequence length and GPU; shows :func:`tp_vs_pp_volumes` as a table and a
    bar chart of the communication time per stage and micro-batch. ``state["result"]`` holds the result."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns
    from IPython.display import display

    from tessera_lab.ui.widgets import LABEL_STYLE, panel

    spec = _as_model(model)
    pps = sorted({p for p in (1, 2, 4, 8, 16, pp) if p <= spec.num_layers})
    controls = {
        "tp": w.Dropdown(options=sorted({1, 2, 4, 8, 16, 32, tp}), value=tp, description="tp", style=LABEL_STYLE),
        "pp": w.Dropdown(options=pps, value=pp, description="pp", style=LABEL_STYLE),
        "seq_len": w.Dropdown(options=sorted({1024, 2048, 4096, 8192, 16384, seq_len}), value=seq_len,
                              description="seq len", style=LABEL_STYLE),
        "gpu": w.Dropdown(options=["H100", "H200", "B200"], value=gpu, description="GPU", style=LABEL_STYLE),
    }

    def compute(v: dict[str, Any]) -> TpPpVolumes:
        return tp_vs_pp_volumes(spec, v["tp"], v["pp"], seq_len=v["seq_len"], gpu=v["gpu"])

    def render(res: TpPpVolumes) -> None:
        display(pd.Series(res.summary(), name=f"tp={res.tp}, pp={res.pp} on {res.nodes} node(s)").to_frame())
        if show_figure:
            frame = res.frame().reset_index()
            with _style():
                fig, ax = plt.subplots(figsize=(8, 3), facecolor="white", layout="constrained")
                sns.barplot(data=frame, y="communication", x="time per stage per micro-batch (ms)",
                            hue="parallelism", palette="colorblind", ax=ax)
                ax.axvline(res.compute_per_stage_s * 1e3, color="grey", linestyle="--",
                           label="compute per stage")
                ax.legend(fontsize=8)
                ax.set_ylabel("")
            _show(fig)

    return panel(controls, compute, render)


def moe_panel(model: str = "qwen3-30b-a3b", ep: int = 8, top_k: int | None = None, skew: float = 1.0,
              tokens_per_rank: int = 4096, *, seed: int = 0, jitter: float | None = None, show_figure: bool = True):
    """Notebook 04's panel: top-k, EP size and routing skew; shows :func:`moe_all_to_all` as a per-rank table
    and :func:`plot_moe`. ``state["result"]`` holds the :class:`AllToAllVolumes`."""
    import ipywidgets as w
    import pandas as pd
    from IPython.display import display

    from tessera_lab.ui.widgets import LABEL_STYLE, panel

    spec = _as_model(model)
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if spec.num_experts % e == 0]
    controls = {
        "top_k": w.IntSlider(value=top_k or spec.num_experts_per_tok, min=1, max=min(spec.num_experts, 32),
                             description="top-k", style=LABEL_STYLE, continuous_update=False),
        "ep": w.Dropdown(options=sorted(set(eps) | {ep}), value=ep, description="ep", style=LABEL_STYLE),
        "skew": w.FloatSlider(value=skew, min=0.0, max=2.0, step=0.1, description="skew", style=LABEL_STYLE,
                              continuous_update=False),
    }

    def compute(v: dict[str, Any]) -> AllToAllVolumes:
        return moe_all_to_all(spec, ep=v["ep"], top_k=v["top_k"], skew=v["skew"], tokens_per_rank=tokens_per_rank,
                              seed=seed, jitter=jitter)

    def render(res: AllToAllVolumes) -> None:
        display(pd.Series(res.summary(), name=spec.name).to_frame())
        if show_figure:
            _show(plot_moe(res, title=f"{spec.name}: top-k {controls['top_k'].value}, ep {controls['ep'].value}, "
                                      f"skew {controls['skew'].value:.1f}"))

    return panel(controls, compute, render)
