"""Overlapped pairs in the dynamic durations are priced by the one pair model (cost.lanes.pair_makespan), from each
side's compute and exposed communication; hand-worked values."""

import pytest

from tessera_lab.cost.contention import Contention
from tessera_lab.dynamic.durations import PairDurations, RoutedDurations, StageCosts, StagePairModel
from tessera_lab.errors import ConfigError
from tessera_lab.pipeline import passes
from tessera_lab.pipeline.schedules import ActionType, build_schedule


def _pairs(sched):
    return [(a.sub_actions[1].stage, a.sub_actions[1].microbatch, a.sub_actions[1].type)
            for acts in sched.actions.values() for a in acts if a.sub_actions]


def test_synthetic_fb_is_the_pair_makespan_at_uniform_routing():
    # f = 1, b = 2 (I 1 + W 1), fb = 2.5: the backward's I carries f + b - fb = 0.5 s of exposed communication,
    # hidden under the forward's 1 s of compute: F+B = 2 - 0.5 + 1 = 2.5, F+I = 1 - 0.5 + 1 = 1.5
    costs = StageCosts.synthetic(2, 1.0, 2.0, 1.0, layers_per_stage=1, fb=2.5)
    d = RoutedDurations(costs, [[1.0] * 4, [1.0] * 4])
    whole = build_schedule("overlapped", 2, 4)
    pd = PairDurations(d, whole)
    assert [pd(s, i, ActionType.OVERLAP_F_B) for s, i, _ in _pairs(whole)] == pytest.approx([2.5] * len(_pairs(whole)))
    split = passes.split_backward(whole, 0)
    pd = PairDurations(d, split)
    got = {t: pd(s, i, ActionType.OVERLAP_F_B) for s, i, t in _pairs(split)}
    assert got[ActionType.I] == pytest.approx(1.5)


def test_pair_with_contention_takes_the_better_order():
    # forward: 1 s compute; backward: 1.5 s compute then 0.5 s exposed communication; compute beside
    # communication at half speed. Backward first: b.c ends at 1.5; f.c runs at 1/2 beside b.e until 2.0 (0.25 s of
    # work), then 0.75 s alone: 2.75. Forward first: 1 + 1.5 + 0.5 = 3.0. The pair costs 2.75.
    model = StagePairModel(({"F": (1.0, 0.0), "I": (0.5, 0.5), "W": (1.0, 0.0)},), Contention(compute=1.0))
    assert model.side(0, ("I", "W"), 2.0) == (1.5, 0.5)
    assert model.side(0, ("I", "W"), 4.0) == (3.0, 1.0)  # routed: both parts scale with the side's time
    assert model.pair(model.side(0, ("F",), 1.0), model.side(0, ("I", "W"), 2.0)) == pytest.approx(2.75)


def test_no_pair_model_costs_the_sum():
    costs = StageCosts.synthetic(2, 1.0, 2.0, 1.0, layers_per_stage=1)
    costs.pairs = None
    d = RoutedDurations(costs, [[1.0] * 4, [1.0] * 4])
    sched = build_schedule("overlapped", 2, 4)
    pd = PairDurations(d, sched)
    assert [pd(s, i, ActionType.OVERLAP_F_B) for s, i, _ in _pairs(sched)] == pytest.approx([3.0] * len(_pairs(sched)))


@pytest.mark.parametrize("fb", [1.5, 3.5])
def test_fb_out_of_range(fb):
    with pytest.raises(ConfigError, match="field 'fb'"):
        StageCosts.synthetic(2, 1.0, 2.0, 1.0, fb=fb)


def test_from_model_lanes_add_up_to_the_stage_times():
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model

    costs = StageCosts.from_model(load_model("qwen3-next-80b-a3b"), ParallelConfig(pp=4, schedule="zb-h1"))
    for s in range(costs.num_stages):
        ln = costs.pairs.lanes[s]
        for phase, total in (("F", costs.f[s]), ("I", costs.i[s]), ("W", costs.w[s])):
            assert ln[phase][0] + ln[phase][1] == pytest.approx(total)
            assert 0.0 <= ln[phase][1] <= total
        assert ln["F"][1] > 0 and ln["W"][1] == 0.0  # the forward's all-to-alls are partly exposed; W has none


def test_pairs_go_through_the_one_pair_model():
    """The dynamic durations price a pair only through cost.lanes.pair_makespan: no scalar overlap factor."""
    import ast
    import inspect

    import tessera_lab.dynamic.durations as mod

    tree = ast.parse(inspect.getsource(mod))
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "pair_overlap" not in names and "overlap" not in names
    pair_fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "pair")
    calls = {getattr(c.func, "id", None) for c in ast.walk(pair_fn) if isinstance(c, ast.Call)}
    assert "pair_makespan" in calls
