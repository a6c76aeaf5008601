"""What the capacity report of a runner run (``tessera-lab report --observed RUN.json``,
:mod:`tessera_lab.report.observed`) needs from the runner: the checked run file and the tiny model's model FLOPs
(analytic, Megatron-LM convention: 3 x forward GEMM FLOPs, causal attention at half)."""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.model.flops import gemm_flops, runner_layer_flops, training_flops
from tessera_lab.errors import ConfigError

__all__ = ["run_model_flops", "read_run_result"]


def run_model_flops(job: Mapping[str, Any]) -> float:
    """Model FLOPs of one step of a runner job: ``3 x`` (forward FLOPs of every layer + LM head GEMM) over the
    step's tokens (analytic)."""
    from .specs import TinyConfig

    cfg = TinyConfig.from_dict(job["spec"]["model"]).as_dict()
    tokens = int(job["tokens_per_step"])
    kinds = TinyConfig.from_dict(job["spec"]["model"]).layer_kinds()
    fwd = sum(runner_layer_flops(cfg, k, tokens) for k in kinds) + gemm_flops(tokens, cfg["hidden_size"], cfg["vocab_size"])
    return training_flops(fwd)


def read_run_result(run_path: str) -> dict[str, Any]:
    """The runner result in ``run_path`` (``tessera-lab run --json``), checked against its schema.

    Raises:
        ConfigError: unreadable file, or not a runner result.
    """
    from tessera_lab.io import read_json

    from .schemas import check_run_result

    data = read_json(run_path, "run file")
    if not isinstance(data, dict) or "jobs" not in data:
        raise ConfigError(f"run file '{run_path}' is not a runner result (no field 'jobs'); write one with "
                          "tessera-lab run --json")
    check_run_result(data, f"run file '{run_path}'")
    return data
