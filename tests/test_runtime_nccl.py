"""Acceptance of the runtime under NCCL's p2p semantics on CPU: every schedule (gpipe, 1f1b, interleaved, zb-h1,
zb-h2, zb-v, dualpipev, overlapped with each pair handler, the ``--dynamic`` pair) at pp 2 and 4, ep 1 and 2 runs
on the NCCL-order transport (:class:`tessera_lab.runner.runtime.transport.NcclOrderP2P`: batches in posting order, a rank
pair's transfers matched in posting order, tags ignored) and gives losses bitwise equal to the single-process
reference (``check_reference``), over two optimizer steps.

Cost on the 2-core machine: one launch per (pp, ep), 12 jobs each; pp 4 x ep 2 is 8 processes (minutes under
load), so the pp 4 launches are marked slow.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tessera_lab.runner import RunSpec, WorldSpec, spawn  # noqa: E402

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev"]


def _jobs(pp: int) -> list[RunSpec]:
    common = dict(steps=2, microbatches=2 * pp, check_reference=True, model={"num_layers": 2 * pp})
    jobs = [RunSpec(name=n, schedule=n, **common) for n in SCHEDULES]
    jobs += [RunSpec(name=f"overlapped-{h}", schedule="overlapped", pair_exec=h, **common)
             for h in ("serial", "threads", "scheduled")]
    jobs += [RunSpec(name="static", schedule="1f1b", defer_w=True, w_lag=0, gaps="observe", **common),
             RunSpec(name="dynamic", schedule="1f1b", defer_w=True, w_lag=None, gaps="fill", **common)]
    return jobs


@pytest.mark.parametrize("pp,ep", [(2, 1), (2, 2),
                                   pytest.param(4, 1, marks=pytest.mark.slow), pytest.param(4, 2, marks=pytest.mark.slow)])
def test_every_schedule_bitwise_under_the_nccl_order_transport(pp, ep, tmp_path):
    res = spawn(WorldSpec(pp=pp, ep=ep, p2p="nccl-order", timeout_s=120), _jobs(pp), out_dir=tmp_path,
                timeout_s=1800)
    assert res.backend == "gloo"
    got = {j["spec"]["name"]: j["reference"] for j in res.jobs}
    assert set(got) == {j.name for j in _jobs(pp)}
    bad = {n: r for n, r in got.items() if not r.get("bitwise_equal")}
    assert not bad, bad
