"""The node-level pair executor: template orders, the handler registry, node programs equal
to the monolithic autograd pass, and bitwise parity with the single-process reference for every pair handler.

Cost: the order tests are pure Python; the in-process node test runs one tiny stage; the quick launch (pp=2,
ep=2, one job) takes a few seconds; the full matrix (10 jobs in one 4-process launch) is marked slow.
"""

from __future__ import annotations

import glob
import math
import os

import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.runner.runtime import orders as od
from tessera_lab.runner.runtime.pairs import PAIR_HANDLERS, get_pair_handler, interleave, register_pair_handler


# ---------------------------------------------------------------------------------------------- orders
def test_template_space_is_every_interleaving_of_two_chains():
    all_t = od.all_templates()
    assert len(all_t) == math.comb(10, 5) == 252
    assert all_t[0] == od.TEMPLATE_KEYS  # program order first
    assert len(set(all_t)) == 252
    for name, o in od.NAMED_ORDERS.items():
        assert od.check_template(o) == o, name


def test_host_issue_makespan_hand_example():
    # pre 3, experts 2, post 2, a2a 1; backward compute doubled. Program order (F layer then B layer):
    # F: pre 0-3, dispatch 3-4 (host waits at experts), experts 4-6, combine 6-7, post 7-9;
    # B: post 9-13, combine 13-14, experts 14-18, dispatch 18-19, pre 19-25 -> 25.
    d = od.nominal_durations(ep=2)
    assert od.host_issue_makespan(od.TEMPLATE_KEYS, d) == 25.0
    # Megatron's order: b.post 0-4, b.combine issued 4 (4-5), f.pre 4-7, b.experts 7-11, f.dispatch and
    # b.dispatch issued 11 (11-12), f.experts 12-14, f.combine 14-15, f.post 15-17, b.pre 17-23 -> 23.
    assert od.host_issue_makespan(od.NAMED_ORDERS["megatron"], d) == 23.0
    best = od.search_template(d, keep=3)
    assert best[0][0] == min(od.host_issue_makespan(o, d) for o in od.all_templates())  # brute force
    assert best[0][0] == 21.0  # the compute total: every all-to-all hidden
    # without communication every order costs the compute total
    d1 = od.nominal_durations(ep=1)
    assert {od.host_issue_makespan(o, d1) for o in od.all_templates()} == {21.0}


def test_check_template_and_resolve_errors():
    with pytest.raises(ConfigError, match="missing"):
        od.check_template(od.TEMPLATE_KEYS[:-1])
    bad = ("f.dispatch", "f.pre") + od.TEMPLATE_KEYS[2:]
    with pytest.raises(ConfigError, match="puts f.dispatch before f.pre"):
        od.check_template(bad)
    with pytest.raises(ConfigError, match="pair_order"):
        od.resolve_order("nope", 2)
    label, tpl = od.resolve_order(None, 2)
    assert label.startswith("searched") and od.host_issue_makespan(tpl, od.nominal_durations(2)) == 21.0
    assert od.resolve_order("megatron", 2) == ("megatron", od.NAMED_ORDERS["megatron"])


def test_registry_and_interleave():
    assert {"serial", "threads", "scheduled"} <= set(PAIR_HANDLERS)
    assert get_pair_handler("scheduled").node_level and not get_pair_handler("threads").node_level
    with pytest.raises(ConfigError, match="pair_exec"):
        get_pair_handler("nope")
    register_pair_handler("test-custom", lambda *a: None, doc="test")
    assert get_pair_handler("test-custom").doc == "test"
    del PAIR_HANDLERS["test-custom"]
    # F of layers 0, 1 (first stage, with embed) with B of layers 2, 3, 4 (last stage, with head)
    seq = interleave(["embed"], [0, 1], ["head"], [2, 3, 4], od.NAMED_ORDERS["program"])
    assert seq[:2] == [("f", "embed"), ("b", "head")]
    assert seq[2] == ("f", "L0.pre") and seq[7] == ("b", "L4.post")  # layer 0 forward pairs layer 4 backward
    assert seq[12] == ("f", "L1.pre") and seq[17] == ("b", "L3.post")
    assert seq[22:] == [("b", f"L2.{n}") for n in od.B_NODES]  # unpaired backward layer last
    assert len(seq) == 2 + 5 * 5


# ---------------------------------------------------------------------------------------------- nodes, in process
def test_node_program_equals_monolithic_autograd():
    torch = pytest.importorskip("torch")
    from tessera_lab.runner.runtime.model import TinyConfig, deterministic, make_batch
    from tessera_lab.runner.runtime.nodes import StageProgram
    from tessera_lab.runner.runtime.topology import build_stages

    cfg = TinyConfig(num_layers=3, attention_ratio=1)
    batch = make_batch(cfg, 0, 2)
    tokens, targets = batch[:, :-1], batch[:, 1:]
    with deterministic(1):
        grads = []
        losses = []
        for mode in ("monolithic", "nodes"):
            model, stages = build_stages(cfg, [0, 3], [0], 1)
            st = stages[0]
            if mode == "monolithic":
                from tessera_lab.runner.runtime.layers import TinyMoEModel

                loss = TinyMoEModel.loss_sum(st(tokens), targets)
                (loss / 100).backward()
                losses.append(float(loss.detach()))
            else:
                sink = []
                events = []
                prog = StageProgram(st, 0, None, lambda *e: events.append(e), lambda: 0.0, targets=targets,
                                    num_tokens=100, loss_sink=sink.append)
                prog.begin(tokens)
                for k in prog.fwd_keys:
                    prog.forward(k)
                prog.begin_backward(None)
                for k in prog.bwd_keys:
                    prog.backward(k)
                losses.append(sink[0])
                assert {e[0] for e in events} == {"node"}
            grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert losses[0] == losses[1]
    assert set(grads[0]) == set(grads[1])
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])


# ---------------------------------------------------------------------------------------------- launches
def _check_bitwise(res, name, torch):
    from tessera_lab.runner.runtime.model import TinyConfig, reference_run

    job = res.job(name)
    spec = job["spec"]
    ref = reference_run(TinyConfig.from_dict(spec["model"]), ep=job["world"]["ep"], dp=job["world"]["dp"],
                        microbatches=spec["microbatches"], micro_batch_size=spec["micro_batch_size"],
                        steps=spec["steps"])
    assert job["losses"] == ref.losses, name
    merged = {}
    for f in sorted(glob.glob(os.path.join(res.out_dir, f"grads_{name}_rank*.pt"))):
        for k, v in torch.load(f).items():
            if k in merged:
                assert torch.equal(merged[k], v), f"{name}: replicas disagree on {k}"
            merged[k] = v
    assert set(merged) == set(ref.grads[0])
    bad = [k for k, g in merged.items() if not torch.equal(g, ref.grads[0][k])]
    assert not bad, f"{name}: gradients differ from the reference in {bad[:4]}"


@pytest.mark.multiprocess
def test_scheduled_pairs_bitwise_quick(tmp_path):
    torch = pytest.importorskip("torch")
    from tessera_lab.runner import RunSpec, WorldSpec, spawn

    job = RunSpec(name="ov-sched", schedule="overlapped", pair_exec="scheduled", steps=2, save_grads=True)
    res = spawn(WorldSpec(pp=2, ep=2, timeout_s=60), [job], out_dir=tmp_path, timeout_s=300)
    _check_bitwise(res, "ov-sched", torch)
    ev = res.job(0)["events"]
    assert any(e["lane"] == "node" for e in ev) and any(e["lane"] == "wait" for e in ev)
    assert any(e["type"] == "OVERLAP_F_B" for e in ev)


MATRIX = {
    "ov-serial": dict(schedule="overlapped", pair_exec="serial"),
    "ov-threads": dict(schedule="overlapped", pair_exec="threads"),
    "ov-megatron": dict(schedule="overlapped", pair_exec="scheduled", pair_order="megatron"),
    "ov-commfirst-defer": dict(schedule="overlapped", pair_exec="scheduled", pair_order="comm-first", defer_w=True),
    "1f1b-sched": dict(schedule="1f1b", pair_exec="scheduled"),
    "zbh1-sched": dict(schedule="zb-h1", pair_exec="scheduled"),
    "zbh1-threads": dict(schedule="zb-h1", pair_exec="threads"),
    "dualpipev-sched": dict(schedule="dualpipev", pair_exec="scheduled"),
    "dualpipev-serial": dict(schedule="dualpipev", pair_exec="serial"),
    "zero-token-sched": dict(schedule="overlapped", pair_exec="scheduled",
                             model={"router_bias": [0.0, 0.0, -30.0, -30.0]}),
    "capacity-sched": dict(schedule="overlapped", pair_exec="scheduled", model={"capacity_factor": 0.6}),
}


@pytest.mark.slow
def test_every_handler_and_schedule_bitwise(tmp_path):
    torch = pytest.importorskip("torch")
    from tessera_lab.runner import RunSpec, WorldSpec, spawn

    jobs = [RunSpec(name=n, steps=2, save_grads=True, **kw) for n, kw in MATRIX.items()]
    res = spawn(WorldSpec(pp=2, ep=2, timeout_s=60), jobs, out_dir=tmp_path, timeout_s=600)
    for n in MATRIX:
        _check_bitwise(res, n, torch)


def test_order_from_measured_node_times(tmp_path):
    import json

    ev = [
        {"lane": "node", "type": "F", "label": "0F0:L0.pre", "start": 0.0, "end": 3.0},
        {"lane": "node", "type": "F", "label": "0F1:L0.pre", "start": 0.0, "end": 5.0},
        {"lane": "node", "type": "B", "label": "0B0:L1.post", "start": 0.0, "end": 2.0},
        {"lane": "node", "type": "F", "label": "0F0:embed", "start": 0.0, "end": 9.0},  # not a template key
        {"lane": "comm", "type": "ep_a2a", "label": "L0.dispatch[0,0]", "start": 1.0, "end": 2.5},
        {"lane": "comm", "type": "ep_a2a", "label": "L1.combine.bwd[0,0]", "start": 0.0, "end": 0.5},
        {"lane": "wait", "type": "a2a_wait", "label": "L0.dispatch[0,0]", "start": 2.0, "end": 2.5},
    ]
    d = od.durations_from_events(ev)
    assert d["f.pre"] == 4.0 and d["b.post"] == 2.0 and d["f.dispatch"] == 1.5 and d["b.combine"] == 0.5
    assert d["f.experts"] == 0.0 and set(d) == set(od.TEMPLATE_KEYS)
    path = tmp_path / "run.json"
    from tessera_lab.runner.runtime.specs import TinyConfig

    # a run result as `tessera-lab run --json` writes it (the reader checks the whole schema), with these events
    job = {"schedule": "overlapped", "tokens_per_step": 64, "spec": {"model": TinyConfig().as_dict()},
           "timing": {"durations": {"f": [1.0], "b": [2.0]}},
           "events": [{**e, "step": 0, "rank": 0} for e in ev]}
    path.write_text(json.dumps({"jobs": [job]}))
    label, tpl = od.resolve_order(f"measured:{path}", 2)
    assert "measured" in label and od.host_issue_makespan(tpl, d) == od.search_template(d, keep=1)[0][0]
    with pytest.raises(ConfigError, match="none.json' does not exist"):
        od.resolve_order(f"measured:{tmp_path / 'none.json'}", 2)


@pytest.mark.slow
def test_measure_with_the_runner_itself():
    """The one harness on the tiny runner model (what --backend runner was): the runtime's node executor on an EP
    group of 2 processes, every candidate measured, halving keeps program order, a decision by the quartile rule."""
    pytest.importorskip("torch")
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.runner.measure.harness import measure_layer_pairs
    from tessera_lab.runner.testbed.predict import runner_model_config

    seq = runner_model_config("tiny-runner")[1]["seq_len"]
    model = load_model("tiny-runner")
    kind = model.stack.layers[0].kind
    (r,) = measure_layer_pairs(model, ParallelConfig(ep=2, pp=1, dp=1, tp=1, seq_len=seq, micro_batch_size=2), "cpu",
                               size_factor=1.0, repeats=2, warmup=0, pairs=[(kind, kind)])
    cands = r.metadata["candidates"]
    assert len(cands) == 4 and cands[0]["order"] == list(od.TEMPLATE_KEYS)
    assert all(len(c["samples"]) >= 2 for c in cands)
    halving = r.metadata["search"]["halving"]
    assert halving and 0 in halving[0]["kept"] and len(halving[0]["kept"]) == 2
    d = r.metadata["search"]["decision"]
    assert d["verdict"] in ("significant", "not significant", "program order is fastest")
    assert list(r.order) == cands[d["chosen"]]["order"]
    od.check_template(r.order)
    assert set(r.durations) == set(od.TEMPLATE_KEYS) and r.durations["f.dispatch"] > 0
    assert r.t_a > 0 and r.t_b > 0 and r.t_ab > 0



def test_default_pair_handler_is_scheduled_on_cuda_with_pairs_only():
    """On CUDA the threads handler would issue a pair's all-to-alls on two NCCL communicators from two host threads;
    the default there is the single-threaded scheduled handler, where the schedule has pairs at all."""
    from tessera_lab.runner.runtime.pairs import default_pair_exec

    assert default_pair_exec("cuda", True) == "scheduled"
    assert default_pair_exec("cuda", False) == "threads"  # no pairs: no handler runs, stages run whole
    assert default_pair_exec("cpu", True) == "threads"
