"""The CUDA code paths of the measurement harness, as far as they run without a GPU: the clear errors of the
``cuda`` backend on a machine without enough GPUs. (The runtime's streams and events are tested with the runtime.)
What has never run on a GPU is listed in docs/gpu.md."""

from __future__ import annotations

import pytest

from tessera_lab.errors import ConfigError


def test_runner_cuda_backend_without_enough_gpus_is_one_clear_error():
    torch = pytest.importorskip("torch")
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model
    from tessera_lab.runner.measure.harness import measure_layer_pairs

    n = torch.cuda.device_count()
    with pytest.raises(ConfigError, match=f"needs {n + 1} GPUs; this machine has {n}"):
        measure_layer_pairs(load_model("qwen3-next-80b-a3b"), ParallelConfig(ep=n + 1, pp=1, dp=1, tp=1), "cuda")
    with pytest.raises(ConfigError, match="allowed: cpu, cuda"):
        measure_layer_pairs(load_model("qwen3-next-80b-a3b"), ParallelConfig(ep=2, pp=1, dp=1, tp=1), "tpu")
