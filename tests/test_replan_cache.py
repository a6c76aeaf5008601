"""Re-planning through the library's caches: a micro-batch change does no pair search and rebuilds no stage model,
a pipeline-size change re-uses the pair searches, and every cached plan equals the plan computed with empty
caches (the caches change the time, never the result)."""

from __future__ import annotations

import pytest

from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.model.spec import load_model
from tessera_lab.overlap import search
from tessera_lab.plan import stages
from tessera_lab.plan.make import make_plan


def _fresh(model, parallel):
    search._SEARCHED.clear()
    stages._COSTS.clear()
    stages._pair_result.cache_clear()
    return make_plan(model, parallel)


def _key(pl):
    return (pl.chosen.partition.boundaries, pl.chosen.iteration_time_s,
            {k: (v.partition.boundaries, v.iteration_time_s) for k, v in pl.baselines.items()},
            [st.as_dict() for st in pl.chosen.stages])


@pytest.fixture(scope="module")
def model():
    return load_model("qwen3-next-80b-a3b")


def test_microbatch_replan_uses_caches_and_matches_fresh(model):
    make_plan(model, ParallelConfig())
    pl = make_plan(model, ParallelConfig(microbatches=48))
    assert pl.timing["pair_searches"] == 0 and pl.timing["stage_model"] == "cached"
    assert pl.timing["cpu_s"] > 0 and pl.timing["wall_s"] > 0
    assert _key(pl) == _key(_fresh(model, ParallelConfig(microbatches=48)))


def test_pp_replan_reuses_pair_searches_and_matches_fresh(model):
    make_plan(model, ParallelConfig())
    pl = make_plan(model, ParallelConfig(pp=4))
    assert pl.timing["pair_searches"] == 0 and pl.timing["pair_searches_cached"] == 4
    assert _key(pl) == _key(_fresh(model, ParallelConfig(pp=4)))


def test_fp8_microbatches_are_part_of_the_cost_key():
    from tessera_lab.plan.stages import cost_key_parallel

    assert cost_key_parallel(ParallelConfig(microbatches=48)) == cost_key_parallel(ParallelConfig(microbatches=32))
    fp8 = ParallelConfig(precision="fp8")
    assert cost_key_parallel(fp8.replace(microbatches=48)) != cost_key_parallel(fp8)
