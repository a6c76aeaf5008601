"""Inputs of the golden walker cases (tests/test_engine_walkers.py): the dynamic controller's step-by-step execution
(:func:`tessera_lab.dynamic.online.execute`, static and with controllers over consecutive steps) and the CPU
testbed's processor sharing (:func:`tessera_lab.runner.testbed.sharing.simulate_shared`). The expected outputs in
tests/data/walkers_golden.json were recorded on the code before the walkers moved onto the pipeline engine
(``python tests/_walkers_cases.py --update``); the test checks the engine reproduces them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

GOLDEN = Path(__file__).parent / "data" / "walkers_golden.json"

EXEC_CASES = [("1f1b", 4, 8, 1, 1), ("zb-h1", 4, 8, 1, 2), ("zb-h2", 3, 7, 1, 3), ("overlapped", 4, 8, 1, 2),
              ("dualpipev", 3, 6, 1, 2), ("interleaved", 2, 4, 2, 2), ("gpipe", 3, 5, 1, 1)]
SHARED_CASES = [("gpipe", 2, 4, 1, False), ("1f1b", 4, 8, 1, False), ("zb-h1", 3, 6, 1, True),
                ("overlapped", 4, 8, 1, False), ("interleaved", 2, 4, 2, True)]


def _tl(tl) -> dict:
    return {"T": tl.iteration_time, "busy": list(tl.per_rank_busy), "peak": list(tl.peak_activations),
            "events": [[e.rank, e.stage, e.microbatch, e.type, e.start, e.end, e.lane, e.label] for e in tl.events]}


def execute_outputs() -> dict:
    from tessera_lab.dynamic.controller import GapController, parse_predictor
    from tessera_lab.dynamic.durations import RoutedDurations, StageCosts
    from tessera_lab.dynamic.online import execute
    from tessera_lab.pipeline import passes
    from tessera_lab.pipeline.schedules import build_schedule

    out = {}
    for name, p, m, vpp, chunks in EXEC_CASES:
        base = passes.split_backward(build_schedule(name, p, m, vpp=vpp), 0)
        chunked = passes.chunk_weight_gradients(base, chunks)
        S = base.num_stages
        costs = StageCosts.synthetic(S, 1.0, 2.0, 1.0, layers_per_stage=2, fb=2.5)
        caps = passes.memory_caps(base, "max")
        sync = [0.3 + 0.1 * s for s in range(S)]
        rows = []
        ctls = [GapController(parse_predictor("last-step"), 0.5) for _ in range(chunked.num_ranks)]
        for step in range(3):
            rng = np.random.default_rng(100 * step + p)
            d = RoutedDurations(costs, rng.uniform(0.5, 2.0, size=(2 * S, m)))
            st, _ = execute(chunked, d, w_chunks=chunks, p2p_latency=0.05, grad_sync=sync)
            dy, rec = execute(chunked, d, w_chunks=chunks, controllers=ctls, memory_cap=caps, grad_sync=sync,
                              p2p_latency=0.05)
            for r, c in enumerate(ctls):
                c.end_step(rec[r].waits, rec[r].tail)
            rows.append({"static": _tl(st), "dynamic": _tl(dy),
                         "records": [{"waits": {str(k): v for k, v in x.waits.items()},
                                      "predicted": {str(k): v for k, v in x.predicted.items()},
                                      "tail": x.tail, "last": x.last_compute_end} for x in rec],
                         "decisions": [dict(c.decisions) for c in ctls]})
        out[f"{name}-p{p}-m{m}-v{vpp}-c{chunks}"] = rows
    return out


def shared_outputs() -> dict:
    from tessera_lab.pipeline.actions import ActionType
    from tessera_lab.pipeline.passes import split_backward
    from tessera_lab.pipeline.schedules import build_schedule
    from tessera_lab.runner.testbed.sharing import simulate_shared

    out = {}
    for name, p, m, vpp, defer in SHARED_CASES:
        s = build_schedule(name, p, m, vpp)
        if defer:
            s = split_backward(s, None)
        work = lambda st_, i, t: (1.0 + 0.25 * st_ + 0.05 * ((i or 0) % 3)) * (2.0 if t is not ActionType.F else 1.0)  # noqa: E731
        lat = lambda st_, i, t: 0.1 if t is ActionType.F else 0.0  # noqa: E731
        rows = []
        for kw in (dict(cores=2, procs_per_rank=2, p2p=0.01),
                   dict(cores=1.5, external=1.0, procs_per_rank=1, latency=lat, wait_cpu=0.5),
                   dict(cores=4, procs_per_rank=3, corun={"1": 1.0, "2": 1.1, "4": 1.3}, machine_cores=6, p2p=0.02,
                        latency=lat)):
            rows.append(simulate_shared(s, work, **kw))
        out[f"{name}-p{p}-m{m}-v{vpp}-{'defer' if defer else 'plain'}"] = rows
    return out


if __name__ == "__main__" and "--update" in sys.argv:  # pragma: no cover
    GOLDEN.write_text(json.dumps({"execute": execute_outputs(), "shared": shared_outputs()}))
    print("wrote", GOLDEN, GOLDEN.stat().st_size)
