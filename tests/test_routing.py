"""Routing model: specs, top-k counts, capacity drops, Switch aux loss, per-EP-rank load, routing logs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_lab.errors import ConfigError
from tessera_lab.dynamic.routing_log import load_routing_log, write_routing_log
from tessera_lab.dynamic.routing import (
    RoutingSpec,
    apply_capacity,
    capacity_for,
    ep_rank_load,
    expert_shares,
    load_imbalance,
    parse_routing,
    relative_rank_load,
    routing_summary,
    slowest_rank_load,
    switch_aux_loss,
    token_counts,
    topk_assignment,
    zipf_shares,
)


# ------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("text, expected", [
    ("uniform", RoutingSpec("uniform")),
    ("UNIFORM", RoutingSpec("uniform")),
    ("zipf:1.2", RoutingSpec("zipf", 1.2)),
    ("zipf:0", RoutingSpec("zipf", 0.0)),
    ("drift:0.8", RoutingSpec("drift", 0.8)),
    ("drift:0.8:16", RoutingSpec("drift", 0.8, 16)),
    ("replay:some/log.json", RoutingSpec("replay", path="some/log.json")),
])
def test_parse_routing_forms(text, expected):
    assert parse_routing(text) == expected
    assert parse_routing(str(expected)) == expected  # str() round-trips


@pytest.mark.parametrize("text, needle", [
    ("zipf", "needs a skew"),
    ("zipf:", "needs a skew"),
    ("zipf:abc", "'abc' is not a number"),
    ("zipf:-1", "out of range"),
    ("zipf:nan", "out of range"),
    ("zipf:1:2", "one parameter"),
    ("drift:1:x", "not an integer"),
    ("drift:1:-3", "out of range"),
    ("uniform:3", "takes no parameter"),
    ("pareto:1", "unknown kind"),
    ("replay:", "needs a log path"),
    ("", "non-empty"),
])
def test_parse_routing_errors_name_the_field_and_the_forms(text, needle):
    with pytest.raises(ConfigError) as exc:
        parse_routing(text)
    msg = str(exc.value)
    assert "field 'routing'" in msg and needle in msg
    assert "uniform | zipf:S | drift:S[:R]" in msg


# ------------------------------------------------------------------------------------------- shares and counts
def test_zipf_shares_by_hand():
    np.testing.assert_allclose(zipf_shares(3, 1.0), np.array([6, 3, 2]) / 11)
    np.testing.assert_allclose(zipf_shares(4, 0.0), [0.25] * 4)
    np.testing.assert_allclose(zipf_shares(3, 2.0, ranking=[2, 0, 1]), np.array([1 / 9, 1, 1 / 4]) / (1 + 1 / 4 + 1 / 9))
    with pytest.raises(ConfigError, match="permutation"):
        zipf_shares(3, 1.0, ranking=[0, 0, 1])


def test_uniform_counts_are_exact():
    c = token_counts("uniform", num_experts=8, tokens=16, top_k=2, microbatches=3)
    assert c.shape == (3, 8) and (c == 4).all()
    c = token_counts("uniform", num_experts=8, tokens=5, top_k=3, microbatches=4)  # 15 = 8 + 7 remainder
    assert (c.sum(-1) == 15).all() and set(np.unique(c)) <= {1, 2}


@pytest.mark.parametrize("layers, steps, shape", [
    (None, None, (4, 16)), (3, None, (3, 4, 16)), (None, 2, (2, 4, 16)), (3, 2, (2, 3, 4, 16)),
])
def test_count_shapes(layers, steps, shape):
    c = token_counts("zipf:1.0", num_experts=16, tokens=64, top_k=2, microbatches=4, layers=layers, steps=steps)
    assert c.shape == shape and c.dtype == np.int64


@settings(max_examples=40)
@given(
    kind=st.sampled_from(["uniform", "zipf", "drift"]),
    skew=st.floats(0.0, 3.0),
    E=st.sampled_from([4, 8, 16, 64]),
    tokens=st.integers(1, 300),
    k=st.integers(1, 4),
    m=st.integers(1, 4),
    seed=st.integers(0, 5),
)
def test_topk_invariants(kind, skew, E, tokens, k, m, seed):
    k = min(k, E)
    spec = "uniform" if kind == "uniform" else f"{kind}:{skew}"
    c = token_counts(spec, num_experts=E, tokens=tokens, top_k=k, microbatches=m, layers=2, seed=seed)
    assert (c.sum(-1) == tokens * k).all()  # each token picks k experts
    assert (c >= 0).all() and (c <= tokens).all()  # ... distinct ones: at most one per token per expert
    a = topk_assignment(c[0, 0], k)  # and a concrete routing exists
    assert a.shape == (tokens, k)
    assert all(len(set(row)) == k for row in a.tolist())
    np.testing.assert_array_equal(np.bincount(a.ravel(), minlength=E), c[0, 0])


def test_heavy_skew_hits_the_top_k_cap():
    c = token_counts("zipf:3", num_experts=16, tokens=100, top_k=4, microbatches=5)
    assert c.max() == 100  # the hottest expert gets every token, never more


def test_counts_are_deterministic_and_groups_differ():
    kw = dict(num_experts=32, tokens=256, top_k=2, microbatches=4, layers=2)
    a = token_counts("zipf:1", seed=3, **kw)
    np.testing.assert_array_equal(a, token_counts("zipf:1", seed=3, **kw))
    b = token_counts("zipf:1", seed=3, group=1, **kw)
    assert not np.array_equal(a, b)
    # the popularity (router) is shared by the groups: the hottest expert of a layer agrees
    assert a[0].sum(0).argmax() == b[0].sum(0).argmax()


def test_step_noise_depends_only_on_its_step():
    kw = dict(num_experts=32, tokens=256, top_k=2, microbatches=2, layers=1, seed=1)
    many = token_counts("drift:1", steps=3, **kw)
    np.testing.assert_array_equal(many[2], token_counts("drift:1", first_step=2, **kw))


def test_drift_moves_the_hot_experts():
    sh = expert_shares("drift:1.5:3", 32, layers=1, steps=4)
    hot = [int(sh[t, 0].argmax()) for t in range(4)]
    assert [(h - hot[0]) % 32 for h in hot] == [0, 3, 6, 9]
    assert (expert_shares("zipf:1.5", 32, steps=3)[0] == expert_shares("zipf:1.5", 32, steps=3)[2]).all()


def test_skew_knob_raises_imbalance():
    imb = []
    for s in (0.0, 0.5, 1.0, 1.5):
        c = token_counts(f"zipf:{s}", num_experts=64, tokens=4096, top_k=4, microbatches=8, layers=8)
        imb.append(float(slowest_rank_load(c, 8).mean()))
    assert imb == sorted(imb) and imb[-1] > 1.3 * imb[0]
    assert float(slowest_rank_load(token_counts("uniform", num_experts=64, tokens=4096, top_k=4,
                                                 microbatches=8), 8).max()) == 1.0


def test_bad_sizes_raise():
    with pytest.raises(ConfigError, match="top_k"):
        token_counts("uniform", num_experts=4, tokens=8, top_k=5, microbatches=1)
    with pytest.raises(ConfigError, match="tokens"):
        token_counts("uniform", num_experts=4, tokens=0, top_k=1, microbatches=1)
    with pytest.raises(ConfigError, match="jitter"):
        token_counts("zipf:1", num_experts=4, tokens=8, top_k=1, microbatches=1, jitter=-1.0)
    with pytest.raises(ConfigError, match="load_routing_log"):
        token_counts("replay:x.json", num_experts=4, tokens=8, top_k=1, microbatches=1)


# ------------------------------------------------------------------------------------------- capacity
def test_capacity_by_hand():
    # 10 tokens, top-2, 4 experts: uniform share 5; cf = 1.0 -> capacity ceil(5) = 5
    assert capacity_for(10, 2, 4, 1.0) == 5
    assert capacity_for(10, 2, 4, 1.1) == 6  # ceil(5.5)
    assert capacity_for(10, 2, 4, 10.0) == 10  # never above the token count
    assert capacity_for(10, 2, 4, None) is None
    res = apply_capacity([9, 6, 3, 2], 10, 2, 1.0)
    assert res.capacity == 5
    assert res.kept.tolist() == [5, 5, 3, 2] and res.dropped.tolist() == [4, 1, 0, 0]
    assert res.drop_fraction == pytest.approx(5 / 20)
    none = apply_capacity([9, 6, 3, 2], 10, 2, None)
    assert none.dropped.sum() == 0 and none.drop_fraction == 0.0
    batch = apply_capacity([[9, 6, 3, 2], [5, 5, 5, 5]], 10, 2, 1.0)
    assert batch.dropped.tolist() == [[4, 1, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ConfigError, match="capacity_factor"):
        capacity_for(10, 2, 4, 0.0)


# ------------------------------------------------------------------------------------------- aux loss
def test_switch_aux_loss_by_hand():
    E, k = 8, 2
    assert switch_aux_loss([4] * E) == pytest.approx(1.0)  # perfectly uniform
    assert switch_aux_loss([10] + [0] * (E - 1)) == pytest.approx(E)  # collapsed top-1 router
    # collapsed top-2: every token goes to experts 0 and 1: f = (1/2, 1/2, 0, ...) -> E * 2 * 1/4 = E / k
    assert switch_aux_loss([10, 10] + [0] * (E - 2)) == pytest.approx(E / k)
    # with router probabilities: f = (3/4, 1/4), P = (1/2, 1/2) -> 2 * (3/8 + 1/8) = 1.0
    assert switch_aux_loss([3, 1], [0.5, 0.5]) == pytest.approx(1.0)
    assert switch_aux_loss([3, 1], [0.75, 0.25]) == pytest.approx(2 * (0.75 ** 2 + 0.25 ** 2))
    per_layer = switch_aux_loss(np.array([[4] * E, [10] + [0] * (E - 1)]))
    np.testing.assert_allclose(per_layer, [1.0, E])
    with pytest.raises(ConfigError, match="router_probs"):
        switch_aux_loss([1, 2], [1.0])
    with pytest.raises(ConfigError, match="assignment"):
        switch_aux_loss([0, 0])


# ------------------------------------------------------------------------------------------- per-rank load
def test_rank_load_by_hand():
    c = np.arange(1, 9)  # experts 0..7 get 1..8 tokens; ep=4 -> ranks hold (0,1), (2,3), (4,5), (6,7)
    np.testing.assert_array_equal(ep_rank_load(c, 4), [3, 7, 11, 15])
    assert load_imbalance([3, 7, 11, 15]) == pytest.approx(15 / 9)
    assert slowest_rank_load(c, 4) == pytest.approx(15 / 9)
    np.testing.assert_allclose(relative_rank_load(c, 4), np.array([3, 7, 11, 15]) / 9)
    np.testing.assert_array_equal(ep_rank_load(np.stack([c, c[::-1]]), 2), [[10, 26], [26, 10]])
    with pytest.raises(ConfigError, match="ep"):
        ep_rank_load(c, 3)
    s = routing_summary(np.stack([c, c]), 4, tokens=18, top_k=2, capacity_factor=1.0)
    assert s["imbalance_max"] == pytest.approx(15 / 9) and s["capacity"] == 5


# ------------------------------------------------------------------------------------------- logs
def test_routing_log_round_trip(tmp_path):
    c = token_counts("zipf:1", num_experts=8, tokens=32, top_k=2, microbatches=3, layers=2, steps=2)
    path = write_routing_log(tmp_path / "routing.json", c, top_k=2, tokens=32, layers=[5, 9])
    doc = json.loads(path.read_text())
    assert doc["format"] == "tessera-lab/routing-log" and doc["version"] == 1
    log = load_routing_log(path)
    assert log.num_experts == 8 and log.top_k == 2 and log.tokens == 32 and log.layers == [5, 9]
    np.testing.assert_array_equal(log.group_counts(0), c)
    with pytest.raises(ConfigError, match="group"):
        log.group_counts(3)


def test_runner_route_log_loads_in_order():
    recs = [{"layer": 0, "tokens": 4, "capacity": None, "routed": [3, 1, 2, 2], "kept": [3, 1, 2, 2],
             "dropped": [0, 0, 0, 0]},
            {"layer": 1, "tokens": 4, "routed": [2, 2, 2, 2]},
            {"layer": 0, "tokens": 4, "routed": [4, 4, 0, 0]}]
    log = load_routing_log(recs, top_k=2)
    arr = log.group_counts(0)
    assert arr.shape == (1, 2, 2, 4)  # steps, layers, micro-batches (order of appearance), experts
    assert arr[0, 0, 1].tolist() == [4, 4, 0, 0] and arr[0, 1, 1].sum() == 0


@pytest.mark.parametrize("doc, needle", [
    ({"format": "other", "records": []}, "format"),
    ({"version": 9, "records": [{"layer": 0, "routed": [1]}]}, "version"),
    ({"records": [{"routed": [1, 2]}]}, r"field 'records\[0\].layer' is missing"),
    ({"records": [{"layer": 0, "routed": [1, 2]}, {"layer": 0, "routed": [1]}]}, "experts"),
    ({"records": []}, "field .records. has 0 entries; allowed: at least 1"),
])
def test_bad_logs(doc, needle):
    with pytest.raises(ConfigError, match=needle):
        load_routing_log(doc)


def test_bad_json_file(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_routing_log(p)


# ---------------------------------------------------------------------------------------- walk
def test_walk_parse_and_shares():
    from tessera_lab.dynamic.routing import walk_shares

    assert str(parse_routing("walk:1.2")) == "walk:1.2" and str(parse_routing("walk:1:3")) == "walk:1:3"
    with pytest.raises(ConfigError, match="routing"):
        parse_routing("walk:1:2:3")
    q = walk_shares("walk:1.0", 64, 3, 8, step=2, seed=5)
    assert q.shape == (3, 8, 64) and np.allclose(q.sum(-1), 1.0)
    assert np.array_equal(q, walk_shares("walk:1.0", 64, 3, 8, step=2, seed=5))  # deterministic
    assert not np.allclose(q[:, 0], q[:, 7])  # popularity moves within a step
    assert not np.allclose(q[0], q[1])  # each layer walks on its own
    with pytest.raises(ConfigError, match="walk"):
        walk_shares("zipf:1", 64, 1, 1, step=0)
    with pytest.raises(ConfigError, match="walk"):
        expert_shares("walk:1", 64)


def test_walk_is_continuous_across_steps():
    """Step t's micro-batch 0 continues step t-1's last one (one walk over global micro-batches)."""
    from tessera_lab.dynamic.routing import walk_shares

    a = walk_shares("walk:1.0:0", 32, 1, 4, step=0, seed=1)  # rate 0: only the skew walks
    b = walk_shares("walk:1.0:0", 32, 1, 8, step=0, seed=1)
    assert np.allclose(a[0], b[0, :4])
    c = walk_shares("walk:1.0:0", 32, 1, 4, step=1, seed=1)
    assert np.allclose(c[0], b[0, 4:])


def test_walk_counts_are_top_k_routings_and_move_the_busiest_rank():
    c = token_counts("walk:1.5", num_experts=64, tokens=512, top_k=4, microbatches=32, layers=4, seed=0)
    assert c.shape == (4, 32, 64)
    assert (c.sum(-1) == 512 * 4).all() and c.max() <= 512
    busiest = ep_rank_load(c, 8).argmax(-1)  # [layers, microbatches]
    assert len(set(busiest[0].tolist())) > 1  # the busiest EP rank changes during the step
    load = slowest_rank_load(c, 8).mean(-1)
    assert load.max() - load.min() > 0.05  # layers differ: the slow stage depends on the layer


def test_router_bias_reproduces_the_shares():
    from tessera_lab.dynamic.routing import router_bias

    b = router_bias("zipf:1.2", 16, 3, seed=4)
    p = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
    assert np.allclose(p, expert_shares("zipf:1.2", 16, layers=3, seed=4)[0])
    assert not np.allclose(b[0], b[1])  # each layer its own hot experts
    assert np.allclose(router_bias("uniform", 8, 2), 0.0)
    with pytest.raises(ConfigError, match="router bias"):
        router_bias("walk:1", 8, 2)
