"""Overlap of two bundles: the scheduler (never worse than program order, equal to brute force on small
bundles), the analytic backend (negative efficiency under contention, worked by hand), the overlap table,
the contention fit, and the measuring backends (cpu: real, small; cuda: skipped without a GPU)."""

from __future__ import annotations

import math
from typing import Iterable
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera_lab.cost.analytic import Contention
from tessera_lab.cost.lanes import pair_makespan
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.overlap import core as ov
from tessera_lab.model.tasks import Collective, Task

COMM_COLL = Collective("all_to_all", 1.0, "ep", 8)


def brute_force_orders(graph) -> Iterable[tuple[str, ...]]:
    """Every topological order of a pair graph (exponential: for tests on small bundles)."""
    done: set[str] = set()
    out: list[str] = []

    def rec():
        if len(out) == len(graph.keys):
            yield tuple(out)
            return
        for k in graph.keys:
            if k not in done and all(d in done for d in graph.deps[k]):
                out.append(k); done.add(k)
                yield from rec()
                out.pop(); done.discard(k)

    yield from rec()



def synthetic(name: str, spec: list[tuple[bool, float, list[int]]]) -> ov.Bundle:
    """A bundle from (is_comm, duration, deps as indices of earlier tasks)."""
    tasks, durations = [], {}
    for i, (is_comm, dur, deps) in enumerate(spec):
        t = Task(f"t{i}", 0, "F", "all_to_all" if is_comm else "gemm", collective=COMM_COLL if is_comm else None,
                 deps=tuple(f"t{j}" for j in deps))
        tasks.append(t)
        durations[f"F.t{i}"] = dur
    return ov.Bundle.from_tasks(name, tasks, durations=durations)


@st.composite
def bundle_specs(draw, max_tasks: int):
    n = draw(st.integers(1, max_tasks))
    spec = []
    for i in range(n):
        is_comm = draw(st.booleans())
        dur = draw(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]) | st.floats(0.0, 4.0))
        deps = sorted(draw(st.sets(st.integers(0, i - 1), max_size=2))) if i else []
        spec.append((is_comm, dur, deps))
    return spec


contentions = st.builds(Contention, st.sampled_from([0.0, 0.25, 1.0, 2.0]) | st.floats(0, 2),
                        st.sampled_from([0.0, 0.1, 1.0]) | st.floats(0, 2))


def brute_force(a: ov.Bundle, b: ov.Bundle, cont: Contention) -> float:
    g = ov.pair_graph(a, b)
    d = ov._keyed_durations(a, b, a.durations, b.durations)
    return min(pair_makespan(o, d, g.lanes, g.deps, contention=cont).makespan for o in brute_force_orders(g))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bundle_specs(3), bundle_specs(4), contentions)
def test_scheduler_equals_brute_force_on_small_bundles(sa, sb, cont):
    a, b = synthetic("A", sa), synthetic("B", sb)
    res = ov.schedule_pair(a, b, contention=cont, budget=6000)  # 7 tasks: at most 7! lane sequences
    assert res.method == "exhaustive"
    best = brute_force(a, b, cont)
    assert res.makespan == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert res.makespan <= res.program_makespan + 1e-12
    # the returned order is a real dependency-respecting order with that makespan
    g = ov.pair_graph(a, b)
    d = ov._keyed_durations(a, b, a.durations, b.durations)
    assert sorted(res.order) == sorted(g.keys)
    assert pair_makespan(res.order, d, g.lanes, g.deps, contention=cont).makespan == pytest.approx(res.makespan, abs=1e-12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bundle_specs(12), bundle_specs(12), contentions, st.integers(1, 60))
def test_scheduler_never_slower_than_program_order(sa, sb, cont, budget):
    a, b = synthetic("A", sa), synthetic("B", sb)
    res = ov.schedule_pair(a, b, contention=cont, budget=budget)
    g = ov.pair_graph(a, b)
    d = ov._keyed_durations(a, b, a.durations, b.durations)
    program = pair_makespan(g.program_order, d, g.lanes, g.deps, contention=cont).makespan
    assert res.program_makespan == pytest.approx(program, abs=1e-12)
    assert res.makespan <= program + 1e-12
    # each bundle alone, in program order, on the pair model itself: the serial makespan is the two one after the other
    alone = [pair_makespan(g.of(side), {k: d[k] for k in g.of(side)}, g.lanes, g.deps, contention=cont).makespan
             for side in ("a", "b")]
    assert [res.t_a, res.t_b] == pytest.approx(alone, abs=1e-12)
    assert res.serial_makespan == pytest.approx(sum(alone), abs=1e-12)


QWEN = load_model("qwen3-next-80b-a3b")


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([0, 3]), st.sampled_from([0, 3]), st.sampled_from([128, 512, 2048]), st.sampled_from([2, 10]),
       st.sampled_from([8, 16]), contentions)
def test_scheduler_on_real_layers_never_slower_than_program_order(lf, lb, width, k, ep, cont):
    m = QWEN.with_changes(moe_intermediate_size=width, num_experts_per_tok=k)
    p = ParallelConfig(ep=ep, pp=1)
    a, b = ov.bundle(m, lf, "F", p), ov.bundle(m, lb, "BW", p)
    res = ov.schedule_pair(a, b, contention=cont, budget=300)
    assert res.method == "heuristic"
    assert res.makespan <= res.program_makespan + 1e-15
    assert res.makespan <= res.one_lane_makespan + 1e-15


def test_negative_efficiency_under_heavy_contention_worked_by_hand():
    # Bundle a: one 2 s GEMM; bundle b: one 1 s all-to-all. They are independent and on different lanes,
    # so both start at t = 0. Contention (compute 1.0, comm 1.5): while both run, compute progresses at
    # 1/2 and comm at 1/2.5 = 0.4. Comm ends at 1/0.4 = 2.5 s, when compute has done 1.25 s of its 2 s;
    # the remaining 0.75 s run alone: t_ab = 3.25 s. t_a + t_b = 3 s, so
    # e = (3 - 3.25) / min(2, 1) = -0.25.
    a = synthetic("A", [(False, 2.0, [])])
    b = synthetic("B", [(True, 1.0, [])])
    r = ov.measure_pair(a, b, "analytic", contention=Contention(1.0, 1.5))
    assert (r.t_a, r.t_b) == (2.0, 1.0)
    assert r.t_ab == pytest.approx(3.25)
    assert r.overlap_efficiency == pytest.approx(-0.25)
    assert r.gain == pytest.approx(-0.25)
    assert r.inflation["A/F.t0"] == pytest.approx(3.25 / 2.0)
    assert r.inflation["B/F.t0"] == pytest.approx(2.5)
    assert r.comm_hidden_fraction == pytest.approx(1.0)
    # contention 1.0 / 1.0 on equal 1 s tasks: both at half speed, t_ab = 2 = t_a + t_b, e = 0 exactly;
    # 2.0 / 2.0: both at a third, t_ab = 3, e = -1.
    c = synthetic("C", [(False, 1.0, [])])
    assert ov.measure_pair(c, b, contention=Contention(1.0, 1.0)).overlap_efficiency == pytest.approx(0.0)
    assert ov.measure_pair(c, b, contention=Contention(2.0, 2.0)).overlap_efficiency == pytest.approx(-1.0)
    # no contention: perfect overlap, e = 1
    assert ov.measure_pair(c, b, contention=Contention(0.0, 0.0)).overlap_efficiency == pytest.approx(1.0)


def test_negative_efficiency_on_a_real_layer_pair_under_heavy_contention():
    p = ParallelConfig(ep=8, pp=1, grouped_gemm="grouped")
    a, b = ov.bundle(QWEN, 0, "F", p), ov.bundle(QWEN, 0, "BW", p)
    light = ov.measure_pair(a, b, contention=Contention(0.25, 0.1), budget=300)
    assert light.overlap_efficiency > 0.5 and light.comm_hidden_fraction > 0.9
    heavy = Contention(3.0, 3.0)
    # program order (all of a, then all of b, per lane) overlaps nothing on this pair: b's compute queues behind
    # a's and b's all-to-alls wait for b's compute, so it is serial and e = 0 whatever the contention
    program = ov.measure_pair(a, b, contention=heavy, order=ov.pair_graph(a, b).program_order)
    assert program.overlap_efficiency == pytest.approx(0.0, abs=1e-9) and program.comm_hidden_fraction == 0.0
    # the order chosen for light contention hides the all-to-alls under GEMMs that now slow each other 4x
    naive = ov.measure_pair(a, b, contention=heavy, order=light.order)
    assert naive.overlap_efficiency < -0.5
    # re-run for heavy contention, the scheduler stops overlapping: e ~ 0, the serial time
    best = ov.measure_pair(a, b, contention=heavy, budget=300)
    assert best.overlap_efficiency >= naive.overlap_efficiency
    assert best.overlap_efficiency == pytest.approx(0.0, abs=1e-9) and best.comm_hidden_fraction == 0.0


def test_overlap_table_and_stage_cost_differs_from_standalone_sum():
    p = ParallelConfig()
    table = ov.overlap_table(QWEN, p, budget=600)
    assert len(table) == 4
    assert set(table["kind_f"]) == {"linear_attention+moe", "full_attention+moe"}
    assert set(zip(table["kind_f"], table["kind_b"])) == {
        (f, b) for f in ("linear_attention+moe", "full_attention+moe") for b in ("linear_attention+moe", "full_attention+moe")}
    assert (table["t_sum"] == table["t_f"] + table["t_b"]).all()
    assert (table["gain"] - (table["t_sum"] - table["t_pair"])).abs().max() < 1e-15
    assert (table["t_pair"] <= table["t_program"] + 1e-15).all()
    assert (table["t_pair"] - table["t_sum"]).abs().max() > 1e-6  # at least one combination differs
    kinds = [layer.kind for layer in QWEN.stack.layers[:6]]  # L L L A L L
    pair = ov.pair_costs_from_table(table)
    standalone = ov.pair_costs_from_table(table, "t_sum")
    after, before = ov.stage_pair_cost(kinds, pair), ov.stage_pair_cost(kinds, standalone)
    assert after < before
    assert ov.overlap_spread(table) >= 1.0


def test_stage_pair_cost_pairs_forward_up_with_backward_down():
    costs = {("x", "x"): 1.0, ("x", "y"): 10.0, ("y", "x"): 100.0, ("y", "y"): 1000.0}
    assert ov.stage_pair_cost(["x", "y"], costs) == 110.0  # F(x) with B(y), F(y) with B(x)
    assert ov.stage_pair_cost(["x", "x", "y"], costs) == 10.0 + 1.0 + 100.0
    with pytest.raises(ConfigError, match="missing"):
        ov.stage_pair_cost(["z"], costs)


def test_overlap_spread():
    import pandas as pd

    assert ov.overlap_spread(pd.DataFrame({"gain": [1.0, 3.0, 2.0]})) == 3.0
    assert ov.overlap_spread(pd.DataFrame({"gain": [-1.0, 3.0]})) == math.inf
    assert math.isnan(ov.overlap_spread(pd.DataFrame({"gain": [-1.0, 0.0]})))


def test_fit_contention_recovers_the_generating_values():
    p = ParallelConfig(ep=16, pp=1)
    true = Contention(0.6, 0.2)
    ms = [ov.measure_pair(ov.bundle(QWEN, lf, "F", p), ov.bundle(QWEN, lb, "BW", p), contention=true, budget=200)
          for lf, lb in ((0, 0), (3, 0))]
    ms.append(ov.measure_pair(synthetic("A", [(False, 2.0, [])]), synthetic("B", [(True, 1.0, [])]), contention=true))
    fit = ov.fit_contention(ms, step=0.1)
    assert fit.contention.compute == pytest.approx(0.6, abs=0.011)
    assert fit.contention.comm == pytest.approx(0.2, abs=0.011)
    assert fit.rms_relative_error < 1e-3
    with pytest.raises(ConfigError, match="measurements"):
        ov.fit_contention([])


def test_bad_input_is_named():
    with pytest.raises(ConfigError, match="phase"):
        ov.bundle(QWEN, 0, "X")
    with pytest.raises(ConfigError, match="layer"):
        ov.bundle(QWEN, 99, "F")
    a = ov.bundle(QWEN, 0, "F")
    with pytest.raises(ConfigError, match="same name|both named"):
        ov.measure_pair(a, ov.bundle(QWEN, 3, "F", name="F0"))
    b = ov.bundle(QWEN, 3, "BW")
    with pytest.raises(ConfigError, match="backend"):
        ov.measure_pair(a, b, "tpu")
    with pytest.raises(ConfigError, match="budget"):
        ov.schedule_pair(a, b, budget=0)
    g = ov.pair_graph(a, b)
    with pytest.raises(ConfigError, match="order"):
        ov.measure_pair(a, b, order=list(reversed(g.keys)))
    with pytest.raises(ConfigError, match="order"):
        ov.measure_pair(a, b, order=g.keys[:-1])
    for backend in ("cpu", "cuda"):  # measurements run the pair with the runtime; the refusal names it
        with pytest.raises(ConfigError, match="runner.measure.harness.measure_layer_pairs"):
            ov.measure_pair(a, b, backend)
        with pytest.raises(ConfigError, match=f"tessera-lab measure --backend {backend}"):
            ov.schedule_pair(a, b, backend)
    with pytest.raises(ConfigError, match="durations"):
        ov.Bundle.from_tasks("A", [Task("x", 0, "F", "gemm")], durations={"F.x": -1.0})
    with pytest.raises(ConfigError, match="cycle"):
        ov.Bundle.from_tasks("A", [Task("x", 0, "F", "gemm", deps=("y",)), Task("y", 0, "F", "gemm", deps=("x",))])


def test_given_order_is_used_and_bw_bundle_links_w_to_its_gradient():
    p = ParallelConfig()
    a, b = ov.bundle(QWEN, 0, "F", p), ov.bundle(QWEN, 0, "BW", p)
    # backward: combine (reverse all-to-all) -> the SwiGLU kernel -> expert GEMMs; W waits for the same gradient as B
    assert b.deps["W.experts"] == b.deps["B.experts"] == ("B.expert_act",) and b.deps["B.expert_act"] == ("B.combine",)
    g = ov.pair_graph(a, b)
    r = ov.measure_pair(a, b, order=g.program_order)
    assert r.t_ab == pytest.approx(r.t_program)
    assert r.order == g.program_order


def test_lane_timeline_and_hidden_fraction_falls_as_expert_gemms_get_short():
    p = ParallelConfig(ep=16, pp=1)  # EP across two nodes: communication outweighs compute
    spans = ov.lane_timeline(ov.bundle(QWEN, 0, "F", p))
    assert set(spans["lane"]) == {"compute", "comm"}
    assert (spans["end"] >= spans["start"]).all()
    df = ov.hidden_fraction_sweep(QWEN, p, expert_widths=(64, 512, 2048), top_ks=(10,), budget=400)
    hf = list(df["comm_hidden_fraction"])
    assert hf[0] < hf[1] < hf[2]
    assert hf[2] - hf[0] > 0.2
    wide = ov.overlap_point(QWEN, p, expert_width=512, top_k=2, budget=400)
    assert wide["comm_hidden_fraction"] > df["comm_hidden_fraction"][1]  # fewer copies: more hidden


def test_planning_modules_do_not_import_torch():
    code = ("import sys, tessera_lab.overlap.core, tessera_lab.overlap.profiles, tessera_lab.cli.measure; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_overlap_heatmap_colour_scale_starts_at_zero():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    import pandas as pd

    from tessera_lab.ui.plots import overlap_heatmap

    kinds = ("a", "b")
    table = pd.DataFrame([{"kind_f": f, "kind_b": b, "efficiency": e, "gain": g, "backend": "analytic"}
                          for (f, b), e, g in zip([(f, b) for f in kinds for b in kinds],
                                                  (0.685, 0.685, 0.662, 0.662), (1e-3, 1e-3, -2e-3, 5e-4))])
    ax = overlap_heatmap(table, value="efficiency")
    assert ax.collections[0].norm.vmin == 0 and ax.collections[0].norm.vmax == 1  # a 3% spread looks small
    assert "0.662 to 0.685" in ax.get_title()
    plt.close(ax.figure)
    ax = overlap_heatmap(table, value="gain")  # both signs: symmetric around 0
    norm = ax.collections[0].norm
    assert norm.vmin == pytest.approx(-norm.vmax) and norm.vmax == pytest.approx(2.0)
    plt.close(ax.figure)


@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=9))
def test_successive_halving_round_keeps_program_order_and_shrinks(meds):
    from tessera_lab.runner.measure.sizing import halve

    alive = list(range(len(meds)))
    kept = halve(alive, dict(enumerate(meds)))
    assert 0 in kept and set(kept) <= set(alive) and len(kept) == max(2, (len(meds) + 1) // 2)
    if len(meds) >= 3:
        assert len(kept) < len(meds)
    others = [i for i in kept if i != 0]
    dropped = [i for i in alive if i not in kept and i != 0]
    assert all(meds[k] <= meds[d] for k in others for d in dropped)  # the kept challengers are the fastest


def _seed_reference(graph, pick):
    """The seed orders by their definition: at each step test every task's dependencies against those issued and
    let ``pick`` choose among the ready ones (listed in program order)."""
    done, out = set(), []
    while len(out) < len(graph.keys):
        ready = [k for k in graph.keys if k not in done and all(d in done for d in graph.deps[k])]
        k = pick(ready, done, out)
        out.append(k)
        done.add(k)
    return tuple(out)


@pytest.mark.parametrize("name", ["qwen3-next-80b-a3b", "deepseek-v3"])
def test_search_seeds_equal_their_definition(name):
    """The pair search's seed orders (priority and list scheduling, kept ready sets) equal the orders their
    definition gives, ties included (a priority that ties everything keeps program order among the ready)."""
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import Cluster
    from tessera_lab.overlap import search as osearch
    from tessera_lab.overlap.bundles import COMM, COMPUTE, pair_graph

    m = load_model(name)
    p = ParallelConfig(pp=2, ep=8, dp=2, tp=2, recompute="selective", schedule="overlapped")
    cm, ex = CostModel(Cluster.dgx("H200", 4), p), ov.layer_kind_examples(m)
    for kf, kb in [(a, b) for a in ex for b in ex]:
        g = pair_graph(ov.bundle(m, ex[kf], "F", p, name="F"), ov.bundle(m, ex[kb], "BW", p, name="BW"))
        dur = {k: cm.task_time(g.tasks[k]) for k in g.keys}
        bl, pos = osearch._bottom_levels(g, dur), {k: i for i, k in enumerate(g.keys)}
        for prio in (lambda k: (g.lanes[k] != COMM, -bl[k], pos[k]), lambda k: 0):
            assert osearch._priority_order(g, prio) == _seed_reference(g, lambda ready, *_: min(ready, key=prio))
        for comm_first in (False, True):
            finish, free = {}, {COMPUTE: 0.0, COMM: 0.0}

            def earliest(ready, done, out, comm_first=comm_first, finish=finish, free=free):
                if out:  # account for the task issued last
                    k = out[-1]
                    finish[k] = max([free[g.lanes[k]]] + [finish[d] for d in g.deps[k]]) + dur.get(k, 0.0)
                    free[g.lanes[k]] = finish[k]
                return min(ready, key=lambda k: (max([free[g.lanes[k]]] + [finish[d] for d in g.deps[k]]),
                                                 0 if (comm_first and g.lanes[k] == COMM) else 1, -bl[k]))

            assert osearch._list_schedule(g, dur, bl, comm_first) == _seed_reference(g, earliest)
