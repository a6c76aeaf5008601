"""The one pair-makespan function (tessera_lab.cost.lanes): its compiled ``streams`` evaluator gives exactly the
makespan of the reference two-lane executor (cost.analytic.two_lane_makespan, which also returns spans) on random
graphs, orders and contention; ``host_issue`` gives the hand-worked makespan; the pair-search cache returns the
search's own result."""

from __future__ import annotations

import math
import random

import pytest

from tessera_lab.cost.analytic import Contention, two_lane_makespan
from tessera_lab.cost.contention import COMM, COMPUTE, MEMORY
from tessera_lab.cost.lanes import StreamPair, pair_makespan
from tessera_lab.errors import ConfigError


def _random_graph(rng: random.Random, n: int):
    keys = [f"t{i}" for i in range(n)]
    lanes = {k: rng.choice(["compute", "comm"]) for k in keys}
    deps = {k: tuple(keys[j] for j in range(i) if rng.random() < 0.3) for i, k in enumerate(keys)}
    dur = {k: (0.0 if rng.random() < 0.1 else rng.uniform(0.1, 3.0)) for k in keys}
    classes = {k: (COMM if lanes[k] == "comm" else rng.choice([COMPUTE, MEMORY])) for k in keys}
    return keys, lanes, deps, dur, classes


def _random_order(rng: random.Random, keys, deps):
    """A random topological order (the makespan is defined for those; others may deadlock)."""
    done, out = set(), []
    while len(out) < len(keys):
        ready = [k for k in keys if k not in done and all(d in done for d in deps[k])]
        k = rng.choice(ready)
        out.append(k)
        done.add(k)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_streams_equals_two_lane_executor_exactly(seed):
    rng = random.Random(seed)
    keys, lanes, deps, dur, classes = _random_graph(rng, rng.randint(1, 12))
    cont = Contention(rng.uniform(0, 0.5), rng.uniform(0, 0.3), rng.uniform(0, 0.8), rng.uniform(0, 0.6))
    sp = StreamPair(keys, dur, lanes, deps, cont, classes)
    for _ in range(5):
        order = _random_order(rng, keys, deps)
        want = two_lane_makespan(order, dur, lanes, deps, cont, classes).makespan
        assert sp.makespan(order) == want  # bit for bit: same arithmetic in the same order
        assert pair_makespan(order, dur, lanes, deps, contention=cont, classes=classes) == want


def test_streams_deadlock_is_inf_and_refused():
    lanes = {"a": "compute", "b": "compute"}
    deps = {"b": ("a",)}
    dur = {"a": 1.0, "b": 1.0}
    assert StreamPair(["a", "b"], dur, lanes, deps).makespan(["b", "a"]) == math.inf
    with pytest.raises(ConfigError):
        pair_makespan(["b", "a"], dur, lanes, deps)


def test_streams_hand_example_with_contention():
    # compute a (2 s) beside comm c (1 s), contention 1.0 each: both at half rate until c ends at t = 2
    # (1 s of c's work), a has 1 s left at full rate: makespan 3 s
    lanes = {"a": "compute", "c": "comm"}
    got = pair_makespan(["a", "c"], {"a": 2.0, "c": 1.0}, lanes, {}, contention=Contention(1.0, 1.0))
    assert got == pytest.approx(3.0)


def test_host_issue_hand_example():
    # host walks: f.x compute 2 (host 0 -> 2); f.c comm issued at 2 on lane f, runs 3 (ends 5), host += 0.5;
    # b.y compute 1 waits only on the host (2.5 -> 3.5); b.z needs f.c (ends 5) -> 5 .. 6
    lanes = {"f.x": "compute", "f.c": "comm", "b.y": "compute", "b.z": "compute"}
    deps = {"f.c": ("f.x",), "b.z": ("f.c",)}
    d = {"f.x": 2.0, "f.c": 3.0, "b.y": 1.0, "b.z": 1.0}
    assert pair_makespan(list(lanes), d, lanes, deps, semantics="host_issue", issue_overhead=0.5) == 6.0
    with pytest.raises(ConfigError, match="semantics"):
        pair_makespan(list(lanes), d, lanes, deps, semantics="gpu")


def test_pair_search_cache_returns_the_search_result():
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.overlap.core import bundle, layer_kind_examples, schedule_pair
    from tessera_lab.overlap.search import _search, search_cache_info
    from tessera_lab.overlap.bundles import _default_cost_model, _keyed_durations, analytic_durations, pair_graph

    model = load_model("qwen3-next-80b-a3b")
    par = ParallelConfig()
    ex = layer_kind_examples(model)
    kind = sorted(ex)[0]
    a = bundle(model, ex[kind], "F", par, name="F")
    b = bundle(model, ex[kind], "BW", par, name="BW")
    cm = _default_cost_model(par)
    first = schedule_pair(a, b, cost_model=cm, budget=50)
    hits = search_cache_info()["hits"]
    again = schedule_pair(a, b, cost_model=cm, budget=50)
    assert search_cache_info()["hits"] == hits + 1
    g = pair_graph(a, b)
    fresh = _search(g, _keyed_durations(a, b, analytic_durations(a, cm), analytic_durations(b, cm)), cm.contention,
                    budget=50)
    for res in (first, again):
        assert (res.order, res.makespan, res.evaluated, res.candidates) == (
            fresh.order, fresh.makespan, fresh.evaluated, fresh.candidates)
