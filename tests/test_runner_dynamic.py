"""The runner's routing skew knob (``run --routing``) and its dynamic W filling (``run --dynamic``)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tessera_lab.errors import ConfigError  # noqa: E402
from tessera_lab.dynamic.routing import expert_shares, parse_routing  # noqa: E402
from tessera_lab.runner.launch import add_run_arguments, routing_bias, specs_from_args  # noqa: E402
from tessera_lab.runner.reference import reference_run  # noqa: E402
from tessera_lab.runner.specs import TinyConfig  # noqa: E402


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p.parse_args(list(argv))


def test_routing_bias_rows_are_the_per_layer_shares():
    bias = np.array(routing_bias("zipf:1.5", {"num_layers": 4, "num_experts": 4}))
    assert bias.shape == (4, 4)
    shares = expert_shares(parse_routing("zipf:1.5"), 4, layers=4, steps=1, seed=0)[0]
    soft = np.exp(bias) / np.exp(bias).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(soft, shares, rtol=1e-12)
    # zipf(1.5) over 4 experts: the most popular gets 1 / H(4, 1.5) of the tokens
    h = sum(k ** -1.5 for k in range(1, 5))
    np.testing.assert_allclose(soft.max(axis=1), 1 / h, rtol=1e-12)
    assert len({int(np.argmax(r)) for r in bias}) >= 1


def test_routing_knob_reaches_the_job_and_skews_the_router():
    _, job = specs_from_args(_args("--routing", "zipf:1.5", "--pp", "2", "--ep", "2"))
    cfg = job.model_config
    assert len(cfg.router_bias) == cfg.num_layers and len(cfg.router_bias[0]) == cfg.num_experts
    skew = reference_run(cfg, ep=2, steps=1, record_grads=())
    flat = reference_run(TinyConfig(), ep=2, steps=1, record_grads=())
    # the tiny router's own logits are small: the skewed layers' busiest expert gets clearly more tokens
    def top_share(res):
        return np.mean([max(r["routed"]) / sum(r["routed"]) for r in res.routing.values()])
    assert top_share(skew) > top_share(flat) + 0.05
    with pytest.raises(ConfigError, match="routing"):
        routing_bias("walk:0.5", {})
    with pytest.raises(ConfigError, match="router_bias"):
        TinyConfig(num_layers=2, router_bias=((0.0,) * 4,))
