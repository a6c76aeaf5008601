"""The one pair-makespan function (tessera_lab.cost.lanes): its ``streams`` semantics (the compiled
``StreamPair`` that ``pair_makespan`` runs) gives exactly the makespan and every span of an independent reference
executor written here (a dictionary-per-lane event loop) on random graphs, orders and contention; ``host_issue``
gives the hand-worked makespan and spans; the pair-search cache returns the search's own result."""

from __future__ import annotations

import math
import random

import pytest

from tessera_lab.cost.analytic import Contention
from tessera_lab.cost.contention import COMM, COMPUTE, MEMORY
from tessera_lab.cost.lanes import StreamPair, pair_makespan
from tessera_lab.errors import ConfigError


def _reference_streams(order, durations, lanes, deps, contention, classes):
    """Two in-order lanes, one queue per lane in a dict; rates while both run from the compute-lane task's class.
    Returns (makespan, spans) or None when the order cannot complete."""
    known = set(order)
    queues = {"compute": [k for k in order if lanes[k] == "compute"], "comm": [k for k in order if lanes[k] == "comm"]}
    pos = {"compute": 0, "comm": 0}
    running, done, spans, t = {}, {}, {}, 0.0
    while len(done) < len(order):
        progressed = True
        while progressed:
            progressed = False
            for lane, q in queues.items():
                if lane in running or pos[lane] >= len(q):
                    continue
                k = q[pos[lane]]
                if all(d in done or d not in known for d in deps.get(k, ())):
                    pos[lane] += 1
                    if durations[k] <= 0:
                        done[k], spans[k] = t, (t, t)
                    else:
                        running[lane], spans[k] = (k, float(durations[k])), (t, math.nan)
                    progressed = True
        if len(done) == len(order):
            break
        if not running:
            return None
        both = len(running) == 2
        cls = classes.get(running["compute"][0], COMPUTE) if both else COMPUTE
        rate = {"compute": 1.0 / (1.0 + contention.slowdown(cls)) if both else 1.0,
                "comm": 1.0 / (1.0 + contention.comm_slowdown(cls)) if both else 1.0}
        step = min(rem / rate[lane] for lane, (_, rem) in running.items())
        t += step
        for lane in list(running):
            k, rem = running[lane]
            rem -= step * rate[lane]
            if rem <= 1e-15 * max(1.0, t):
                del running[lane]
                done[k], spans[k] = t, (spans[k][0], t)
            else:
                running[lane] = (k, rem)
    return max(done.values(), default=0.0), spans


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
def test_streams_equals_reference_executor_exactly(seed):
    rng = random.Random(seed)
    keys, lanes, deps, dur, classes = _random_graph(rng, rng.randint(1, 12))
    cont = Contention(rng.uniform(0, 0.5), rng.uniform(0, 0.3), rng.uniform(0, 0.8), rng.uniform(0, 0.6))
    sp = StreamPair(keys, dur, lanes, deps, cont, classes)
    for _ in range(5):
        order = _random_order(rng, keys, deps)
        want, want_spans = _reference_streams(order, dur, lanes, deps, cont, classes)
        assert sp.makespan(order) == want  # bit for bit: same arithmetic in the same order
        got = pair_makespan(order, dur, lanes, deps, contention=cont, classes=classes)
        assert got.makespan == want
        assert list(got.spans.items()) == list(want_spans.items())  # same spans, in the order the tasks started


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
    assert got.makespan == pytest.approx(3.0)
    assert got.spans == {"a": (0.0, pytest.approx(3.0)), "c": (0.0, pytest.approx(2.0))}


def test_host_issue_hand_example():
    # host walks: f.x compute 2 (host 0 -> 2); f.c comm issued at 2 on lane f, runs 3 (ends 5), host += 0.5;
    # b.y compute 1 waits only on the host (2.5 -> 3.5); b.z needs f.c (ends 5) -> 5 .. 6
    lanes = {"f.x": "compute", "f.c": "comm", "b.y": "compute", "b.z": "compute"}
    deps = {"f.c": ("f.x",), "b.z": ("f.c",)}
    d = {"f.x": 2.0, "f.c": 3.0, "b.y": 1.0, "b.z": 1.0}
    got = pair_makespan(list(lanes), d, lanes, deps, semantics="host_issue", issue_overhead=0.5)
    assert got.makespan == 6.0
    assert got.spans == {"f.x": (0.0, 2.0), "f.c": (2.0, 5.0), "b.y": (2.5, 3.5), "b.z": (5.0, 6.0)}
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
                    budget=50, demands=cm.demands(g.tasks))
    for res in (first, again):
        assert (res.order, res.makespan, res.evaluated, res.candidates) == (
            fresh.order, fresh.makespan, fresh.evaluated, fresh.candidates)
