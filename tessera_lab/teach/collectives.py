"""Collectives (notebook 01): run the five collectives on local gloo processes, the same data movement in plain
Python, and each collective's alpha-beta cost on NVLink and InfiniBand.

Units: bytes, seconds. torch is imported only inside :func:`run_collectives`' worker processes.
"""

from __future__ import annotations

import math
import os
import queue as _queue
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from tessera_lab.checks import check_int
from tessera_lab.cost.analytic import BUS_FACTOR, CostModel
from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.model.hardware import Cluster, GPUSpec, ParallelConfig, cost_assumptions, hardware_data
from tessera_lab.model.tasks import Collective


#: the five collectives notebook 01 teaches, in teaching order.
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
    return check_int(value, name, low=minimum, high=maximum)


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
        "nccl_bus_efficiency_inter_node": cost_assumptions()["nccl_bus_efficiency_inter_node"],
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


