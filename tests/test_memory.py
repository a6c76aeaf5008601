"""Memory model: in-flight micro-batches equal the simulator's peaks; bytes per parameter."""

from __future__ import annotations

import pytest

from tessera_lab.model.hardware import ParallelConfig
from tessera_lab.cost.memory import bytes_per_param, in_flight, layer_memory
from tessera_lab.pipeline.schedules import build_schedule
from tessera_lab.pipeline.simulate import simulate, uniform_durations
from tessera_lab.model.tasks import decompose


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "overlapped", "zb-h1", "zb-h2"])
@pytest.mark.parametrize("p, m", [(2, 4), (3, 7), (4, 4), (4, 8), (4, 16), (8, 24)])
def test_in_flight_matches_simulated_peak(name, p, m):
    tl = simulate(build_schedule(name, p, m), uniform_durations(1.0, 2.0, w=1.0, fb=2.5))
    assert [in_flight(name, p, s, m) for s in range(p)] == [float(x) for x in tl.peak_activations]


@pytest.mark.parametrize("p, v, m", [(4, 2, 8), (2, 2, 4), (4, 3, 12)])
def test_interleaved_in_flight_matches_simulated_peak(p, v, m):
    tl = simulate(build_schedule("interleaved", p, m, v), uniform_durations(1.0, 2.0))
    assert [in_flight("interleaved", p, s, m, v) * v for s in range(p)] == [float(x) for x in tl.peak_activations]


def test_bytes_per_param():
    assert bytes_per_param(ParallelConfig(distributed_optimizer=False), 8) == 18
    assert bytes_per_param(ParallelConfig(), 8) == pytest.approx(6 + 12 / 8)


def test_expert_params_sharded_over_ep(qwen3_next):
    p1 = ParallelConfig(pp=1, ep=1, distributed_optimizer=False)
    p8 = ParallelConfig(pp=1, ep=8, distributed_optimizer=False)
    m1 = layer_memory(qwen3_next, p1, decompose(qwen3_next, p1))[1]
    m8 = layer_memory(qwen3_next, p8, decompose(qwen3_next, p8))[1]
    comp = qwen3_next.layer_params(qwen3_next.stack.layers[0])
    assert m1.param_bytes == 18 * sum(comp.values())
    assert m8.param_bytes == pytest.approx(18 * (sum(comp.values()) - comp["experts"] + comp["experts"] / 8))
