"""The runner's gap filler: gradient-sync chunks launched in receive waits (bucket order, finality, the
memory cap, a run with replicas) and W in EP combine waits inside node-level pairs (their own slots, never the
action in progress, a run); losses and gradients stay bitwise equal to the static run."""

from __future__ import annotations

import pytest
import torch

from tessera_lab.pipeline.schedules import Action, ActionType
from tessera_lab.runner.runtime.gaps import GradBuckets

F, I, W = ActionType.F, ActionType.I, ActionType.W


def _buckets(cap_bytes=None):
    # rank holding stages 0 and 2 (interleaved-like): stage 2's last I (index 3) comes before stage 0's (index 5)
    acts = [Action(0, F, 0), Action(2, F, 0), Action(0, F, 1), Action(2, I, 0), Action(2, F, 1), Action(0, I, 0),
            Action(0, W, 0), Action(2, W, 0)]
    p0, e0, p2 = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(5))
    grp = object()
    b = GradBuckets(acts, {0: [("a", p0), ("experts.x", e0)], 2: [("b", p2)]}, (grp, 2, grp, 3),
                    lambda n: n.startswith("experts"), microbatches=1, cap_bytes=cap_bytes)
    launched = []
    b._launch = lambda: (launched.append(b._next), b.launched.append((b._next, None, None, None)),
                         setattr(b, "_next", b._next + 1))
    return b, launched


def test_bucket_order_sizes_and_default_cap():
    b, _ = _buckets()
    # stage 2 first (its last backward is earlier), then stage 0 dense, stage 0 experts
    assert [(s, size, [p.numel() for p in ps]) for s, _, size, ps in b.buckets] == [(2, 2, [5]), (0, 2, [3]),
                                                                                    (0, 3, [2])]
    # reduce-scatter send + receive buffers: 2 x 4 bytes x the elements padded to a multiple of the replicas
    assert b.bytes == [2 * 4 * 6, 2 * 4 * 4, 2 * 4 * 3]
    assert b.cap_bytes == 48 + 32 + 24  # the static sync's buffers, all at once


def test_fill_waits_for_final_stages_and_keeps_order():
    b, launched = _buckets()
    assert b.fill(3, set()) == 0  # stage 2's I sits at index 3: not run before action 3
    assert b.fill(4, set()) == 0  # stage 2's I ran, its W (2, 0) has not
    assert b.fill(4, {(2, 0)}) == 1 and launched == [0]  # stage 2 final; stage 0's I (index 5) not yet
    assert b.fill(6, {(2, 0)}) == 0  # stage 0's W (0, 0) not run
    assert b.fill(7, {(2, 0), (0, 0)}) == 2 and launched == [0, 1, 2]


def test_fill_honours_the_memory_cap():
    b, launched = _buckets(cap_bytes=60)
    assert b.fill(7, {(2, 0), (0, 0)}) == 1 and launched == [0]  # 48 in flight; 48 + 32 > 60
    b.launched.clear()  # (finish would wait and free them)
    assert b.fill(7, {(2, 0), (0, 0)}) == 2  # 32 + 24 <= 60


@pytest.mark.slow
def test_replica_run_with_chunks_in_waits_is_bitwise_equal(tmp_path):
    from tessera_lab.runner import RunSpec, WorldSpec, spawn

    common = dict(schedule="interleaved", defer_w=True, steps=4, save_grads=True)
    res = spawn(WorldSpec(pp=2, ep=1, dp=2, timeout_s=60),
                [RunSpec(name="static", w_lag=0, gaps="observe", **common),
                 RunSpec(name="dynamic", gaps="fill", **common)], out_dir=tmp_path, timeout_s=300)
    s, d = res.job("static"), res.job("dynamic")
    assert s["losses"] == d["losses"]
    for r in range(4):
        gs = torch.load(tmp_path / f"grads_static_rank{r}.pt")
        gd = torch.load(tmp_path / f"grads_dynamic_rank{r}.pt")
        assert gs.keys() == gd.keys() and all(torch.equal(gs[k], gd[k]) for k in gs)
    recs = [v for st in d["gap_steps"] for v in st.values() if v]
    assert all(v["grad_buckets"]["count"] == 4 for v in recs)  # 2 stages x (dense, expert)
    assert all("grad_buckets" not in v for st in s["gap_steps"] for v in st.values() if v)
    assert sum(v["grad_buckets"]["launched_in_waits"] for v in recs) > 0


class _Done:
    def wait(self) -> None:
        pass


def test_combine_waits_get_their_own_slots_and_skip_the_action_in_progress():
    from tessera_lab.runner.runtime.gaps import NODE_SLOT_BASE, GapFiller
    from tessera_lab.runner.runtime.layers import WEIGHT_GRAD_STORE

    acts = [Action(0, F, 0), Action(0, I, 0), Action(0, F, 1), Action(0, I, 1), Action(0, W, 0), Action(0, W, 1)]
    ran = []
    clock = iter(range(1000))
    g = GapFiller(acts, 9, lambda a, how: (ran.append((a.microbatch, how)), WEIGHT_GRAD_STORE.flush((0, a.microbatch)),
                                           g.ran_w(a, 1.0)), lambda: float(next(clock)))
    WEIGHT_GRAD_STORE.clear()
    g.begin_step()
    g.at(3)
    g.wait_node(_Done(), "L0.dispatch.bwd")  # not a combine: no slot
    g.wait_node(_Done(), "L0.combine.bwd")  # step 0: learnt as slot NODE_SLOT_BASE + 0, nothing predicted
    assert ran == [] and NODE_SLOT_BASE in g.waits
    g.ran_w(acts[4], 1.0)
    g.waits[NODE_SLOT_BASE] = 10.0
    g.end_step()
    assert g.slots[-1] == NODE_SLOT_BASE and len(g.slots) == 5  # 4 non-W actions + 1 combine wait
    g.begin_step()
    assert g.ctl.predicted[NODE_SLOT_BASE] == 10.0
    WEIGHT_GRAD_STORE.defer((0, 0))
    WEIGHT_GRAD_STORE.defer((0, 1))  # I1 is the action in progress: part of its W is deferred already
    g.at(3)
    g.wait_node(_Done(), "L0.combine.bwd")
    assert ran == [(0, "fill")] and g.filled == ["c0:0W0"]  # W1 waits: its I (action 3) has not finished
    WEIGHT_GRAD_STORE.clear()


@pytest.mark.slow
def test_node_level_pairs_fill_combine_waits_bitwise_equal(tmp_path):
    from tessera_lab.runner import RunSpec, WorldSpec, spawn
    from tessera_lab.runner.launch.launch import routing_bias

    common = dict(schedule="overlapped", defer_w=True, steps=5, model={"router_bias": routing_bias("zipf:1.5", {})},
                  save_grads=True, pair_exec="scheduled")
    res = spawn(WorldSpec(pp=2, ep=2, timeout_s=60),
                [RunSpec(name="static", w_lag=0, gaps="observe", **common),
                 RunSpec(name="dynamic", gaps="fill", **common)], out_dir=tmp_path, timeout_s=300)
    s, d = res.job("static"), res.job("dynamic")
    assert s["losses"] == d["losses"]
    for r in range(4):
        gs = torch.load(tmp_path / f"grads_static_rank{r}.pt")
        gd = torch.load(tmp_path / f"grads_dynamic_rank{r}.pt")
        assert gs.keys() == gd.keys() and all(torch.equal(gs[k], gd[k]) for k in gs)
    # the EP ranks of a pipeline rank plan alike (the group's predicted waits), but each stops filling as soon as
    # its own input has arrived (a completion query, never a wait), so their fills may differ by that tail; what
    # must hold on every rank: W passes in micro-batch order per stage (the gradients above are bitwise equal)
    from test_runner_dynamic import w_order_kept

    assert all(w_order_kept(v["filled"]) for st in d["gap_steps"] for v in st.values())
    assert any(f.startswith("c") for st in d["gap_steps"] for v in st.values() for f in v["filled"])
