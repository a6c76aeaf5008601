"""Measuring is running: the overlap of a runner pair measured with the runner's own node-level executor on
a real EP group (``ep`` spawned gloo processes, the size the shapes assume).

For one stage holding every layer of the tiny model: the forward of micro-batch 1 and the backward of
micro-batch 0 are measured alone (per-node times from the runner's events), the ten-key template orders are
searched over those times (:func:`tessera_lab.runner.runtime.orders.search_template`, the CPU executor's semantics),
the best ``keep`` (>= 4, program order first) are measured together with successive halving
(:func:`tessera_lab.overlap.backends.halve`), and a challenger wins only when its upper quartile is below
program order's lower quartile, else "not significant" keeps program order (the rule of the ``cpu`` backend).
"""

from __future__ import annotations

import datetime as _dt
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera_lab.overlap.results import spread_stats

__all__ = ["measure_runner_pair"]


def _worker(rank: int, ep: int, store: str, cfg_d: dict, mbs: int, repeats: int, keep: int, q) -> None:
    import torch
    import torch.distributed as dist

    from tessera_lab.overlap.backends import halve

    from ..runtime.moe import ExpertParallelComm
    from ..runtime.nodes import StageProgram
    from ..runtime.orders import TEMPLATE_KEYS, durations_from_events, search_template
    from ..runtime.pairs import interleave
    from ..runtime.reference import deterministic, make_batch
    from ..runtime.specs import TinyConfig, WorldSpec
    from ..runtime.topology import build_stages, build_topology

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=ep,
                            timeout=_dt.timedelta(seconds=120))
    cfg = TinyConfig.from_dict(cfg_d)
    topo = build_topology(WorldSpec(pp=1, ep=ep), rank, torch.device("cpu"))
    comm = ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, ep, rank, cfg.num_experts) if ep > 1 else None
    _, stages = build_stages(cfg, [0, cfg.num_layers], [0], 1, comm.local_experts if comm else None)
    st = stages[0]
    st.comm = comm
    batch = make_batch(cfg, 0, 2 * ep * mbs)
    rows = [batch[(i * ep + rank) * mbs:(i * ep + rank + 1) * mbs] for i in range(2)]
    events: list[dict] = []
    t0 = [0.0]

    def clock():
        return time.perf_counter() - t0[0]

    def record(lane, typ, label, s, e):
        events.append({"lane": lane, "type": typ, "label": label, "start": s, "end": e})

    def prog(i):
        p = StageProgram(st, i, comm, record, clock, targets=rows[i][:, 1:], num_tokens=10_000)
        p.begin(rows[i][:, :-1])
        return p

    def fwd_all(p):
        p.run_forward()

    def bwd_all(p):
        p.run_backward(None)

    def timed(fn) -> float:
        dist.barrier()
        t0[0] = time.perf_counter()
        fn()
        return time.perf_counter() - t0[0]

    out: dict[str, Any] = {}
    with deterministic(1):
        # alone: F of mb 1, B of mb 0 (each after an untimed forward of mb 0)
        alone_f, alone_b = [], []
        for r in range(repeats + 1):
            events.clear()
            pb = prog(0)
            fwd_all(pb)
            pf = prog(1)
            tf = timed(lambda: fwd_all(pf))
            tb = timed(lambda: bwd_all(pb))
            bwd_all(pf)
            if r:
                alone_f.append(tf)
                alone_b.append(tb)
                if r == repeats:
                    dur = durations_from_events(events)
        box = [[list(o) for _, o in search_template(dur, keep=max(4, keep))]]
        dist.broadcast_object_list(box, src=0)
        cands = [tuple(o) for o in box[0]]
        if tuple(TEMPLATE_KEYS) not in cands:
            cands = [tuple(TEMPLATE_KEYS)] + cands[:-1]
        else:
            cands.remove(tuple(TEMPLATE_KEYS))
            cands = [tuple(TEMPLATE_KEYS)] + cands
        samples: dict[int, list[float]] = {i: [] for i in range(len(cands))}
        alive, n_rep, halving = list(range(len(cands))), repeats, []
        while True:
            for _ in range(n_rep):
                for i in alive:
                    pb = prog(0)
                    fwd_all(pb)
                    pf = prog(1)
                    pb.begin_backward(None)
                    seq = interleave(pf.fwd_keys, pf.order, pb.bwd_keys, pb.order, cands[i])

                    def pair():
                        for side, key in seq:
                            (pf.forward if side == "f" else pb.backward)(key)

                    samples[i].append(timed(pair))
                    bwd_all(pf)
            if len(alive) <= 2:
                break
            med = {i: statistics.median(samples[i]) for i in alive}
            box = [halve(alive, med)]
            dist.broadcast_object_list(box, src=0)  # rank 0 decides, every rank follows
            halving.append({"repeats": n_rep, "alive": list(alive), "kept": box[0]})
            alive, n_rep = box[0], n_rep * 2
    if rank == 0:
        final = [i for i in range(len(cands)) if len(samples[i]) == max(len(v) for v in samples.values())]
        ch = min(final, key=lambda i: (statistics.median(samples[i]), i))
        p0 = samples[0]
        # the noise rule of the cpu/cuda backends (overlap_measure._result): quartiles from the one spread helper
        sig = ch != 0 and spread_stats(samples[ch])["q3"] < spread_stats(p0)["q1"]
        out = {"ep": ep, "node_durations_s": dur, "t_f": statistics.median(alone_f), "t_b": statistics.median(alone_b),
               "candidates": [{"order": list(o), "samples": samples[i]} for i, o in enumerate(cands)],
               "halving": halving,
               "decision": {"verdict": "significant" if sig else ("not significant" if ch != 0 else
                                                                  "program order is fastest"),
                            "chosen": ch if sig else 0, "challenger": ch,
                            "rule": "challenger q3 < program q1 (quartiles separated)"},
               "chosen_order": list(cands[ch if sig else 0]),
               "t_ab": statistics.median(samples[ch if sig else 0]), "t_program": statistics.median(p0)}
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


def measure_runner_pair(cfg=None, *, ep: int = 2, micro_batch_size: int = 2, repeats: int = 3,
                        keep: int = 4, timeout_s: float = 600.0) -> dict[str, Any]:
    """Measure the runner's pair orders (module docstring) in ``ep`` spawned processes; returns a JSON-ready
    dict (``node_durations_s``, ``t_f``, ``t_b``, ``candidates`` with samples, ``halving``, ``decision``,
    ``chosen_order``, ``t_ab``, ``t_program``, seconds).

    Raises:
        MeasurementError: a process failed, or the measurement ran past ``timeout_s`` (every process killed).
    """
    import torch.multiprocessing as mp

    from tessera_lab.overlap.bundles import MeasurementError

    from ..runtime.specs import TinyConfig

    cfg = cfg or TinyConfig()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="tessera-runner-measure-") as tmp:
        pc = mp.start_processes(_worker, args=(ep, str(Path(tmp) / "store"), cfg.as_dict(), micro_batch_size, repeats,
                                               keep, q), nprocs=ep, start_method="spawn", join=False)
        try:
            while not pc.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise MeasurementError(f"runner measurement did not finish within --timeout {timeout_s:g} s; "
                                           "the measuring processes were killed (lower --repeats, or raise --timeout)")
        except mp.ProcessRaisedException as exc:
            raise MeasurementError(f"a measuring process failed: {str(exc).strip().splitlines()[-1]}") from None
        finally:
            for proc in pc.processes:
                if proc.is_alive():
                    proc.kill()
                    proc.join(5)
    return q.get()
