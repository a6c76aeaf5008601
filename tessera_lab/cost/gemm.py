"""GEMM efficiency by shape: the share of the tensor-core peak a GEMM (or a grouped expert GEMM) reaches.

For one GEMM ``(m, k) x (k, n)`` repeated over ``groups`` (the local experts of a grouped GEMM):

    eff = E_p * k / (k + K0_p) * tile(m) * tile(n) * wave(groups * ceil(m/128) * ceil(n/128))

* ``tile(x) = x / (128 * ceil(x / 128))``: tile quantization, each group's rows and the columns padded to the
  128-wide output tile (NVIDIA, "Matrix Multiplication Background User's Guide", tile and wave quantization;
  DeepGEMM's contiguous grouped layout aligns every expert's rows to the 128-row block).
* ``wave(t) = t / (sms * ceil(t / sms))``: the last wave of output tiles leaves SMs idle.
* ``k / (k + K0)``: a fixed per-tile prologue/epilogue cost worth ``K0`` elements of the K loop, so short-K GEMMs
  (an expert down-projection with K = 512, a weight-gradient GEMM whose K is the tokens per expert) run far
  below peak.

``E`` and ``K0`` (``data/hardware/cost_model.json``): FP8 ``E = 0.74``, ``K0 = 730`` fitted (max error 2%) to the
ten large-M rows of the DeepGEMM README tables (H800, FP8, normal GEMMs M = 4096 and contiguous grouped GEMMs;
github.com/deepseek-ai/DeepGEMM, "Performance"); bf16 ``K0 = 365`` (assumption: the same fixed cost is half as
many K elements when the bf16 main loop runs at half the FP8 rate) and ``E = 0.855`` anchored so that an
8192^3 bf16 GEMM gives the 0.794 measured on an H200 (``hardware.json`` ``measured_here``). Small-M GEMMs are
memory-bound; the roofline of :mod:`tessera_lab.cost.analytic` takes care of them through their bytes.

Phases: for forward ``(m, k, n)`` the input gradient is ``(m, n, k)`` and the weight gradient ``(k, m, n)`` (its
K is ``m``, the tokens).

Implementations: ``grouped`` (one grouped kernel: CUTLASS grouped GEMM, DeepGEMM), ``sequential`` (one GEMM
launch per expert, Megatron's SequentialMLP): the same per-shape efficiency, waves counted per expert, and one
kernel launch per expert and GEMM; ``multistream`` (Transformer Engine's ``GroupedLinear``, Megatron's TEGroupedMLP:
``te_general_grouped_gemm`` launches one cuBLAS GEMM per expert round-robin on ``te_gemm_streams`` = 4 compute
streams, "For now, we only have multi-stream cublas backend", ``transformer_engine/pytorch/csrc/extensions/gemm.cpp``;
``get_num_compute_streams()`` in ``transformer_engine/common/util/multi_stream.cpp``): one launch per expert and
GEMM, waves counted over the tiles of ``min(groups, streams)`` experts running at once. Measured GEMMs replace the cited values through :func:`fit_gemm_curve`
(its result is a ``CostModel(assumptions=...)`` override; ``cost/device.py`` calibrations can call it).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.model.flops import gemm_flops

TILE = 128
GROUPED_IMPLS = ("grouped", "sequential", "multistream")
PRECISIONS = ("bf16", "fp8")


def phase_shape(shape: Sequence[float], phase: str) -> tuple[float, float, float]:
    """The ``(m, k, n)`` a phase runs for a forward GEMM ``shape = (m, k, n)``: F as is, B ``(m, n, k)``,
    W ``(k, m, n)``.

    Raises:
        ConfigError: an unknown phase.
    """
    m, k, n = (float(x) for x in shape)
    if phase == "F":
        return m, k, n
    if phase == "B":
        return m, n, k
    if phase == "W":
        return k, m, n
    raise ConfigError(f"phase {phase!r} is unknown; allowed: F, B, W")


def _quant(x: float) -> float:
    if x <= 0:
        return 1.0
    return x / (TILE * math.ceil(x / TILE - 1e-9))


def gemm_efficiency(m: float, k: float, n: float, *, groups: int = 1, sms: int = 132, precision: str = "bf16",
                    impl: str = "grouped", params: Mapping[str, float]) -> float:
    """Share of the ``precision`` peak one ``(m, k) x (k, n)`` GEMM repeated ``groups`` times reaches (formula in
    the module docstring), in (0, 1].

    Args:
        m, k, n: rows (tokens of one group), reduction length and columns; > 0.
        groups: GEMMs of this shape in one launch (local experts); >= 1.
        sms: streaming multiprocessors of the GPU.
        precision: ``bf16`` or ``fp8`` (the GEMM's input type).
        impl: ``grouped``, ``sequential`` (waves per expert) or ``multistream`` (waves over ``min(groups,
            te_gemm_streams)`` experts at once).
        params: ``gemm_peak_efficiency_<p>``, ``gemm_k_half_<p>`` (and ``te_gemm_streams`` for ``multistream``) of
            ``data/hardware/cost_model.json``.

    Raises:
        ConfigError: an unknown precision or implementation, a non-positive size.
    """
    if precision not in PRECISIONS:
        raise ConfigError(f"field 'precision' = {precision!r} is unknown; allowed: {', '.join(PRECISIONS)}")
    if impl not in GROUPED_IMPLS:
        raise ConfigError(f"field 'grouped_gemm' = {impl!r} is unknown; allowed: {', '.join(GROUPED_IMPLS)}")
    if min(m, k, n) <= 0 or groups < 1:
        raise ConfigError(f"GEMM shape ({m}, {k}, {n}) x {groups} groups is out of range; allowed: sizes > 0")
    E = params[f"gemm_peak_efficiency_{precision}"]
    K0 = params[f"gemm_k_half_{precision}"]
    at_once = {"grouped": groups, "sequential": 1,
               "multistream": min(groups, int(params.get("te_gemm_streams", 4)))}[impl]
    tiles = math.ceil(m / TILE - 1e-9) * math.ceil(n / TILE - 1e-9) * at_once
    wave = tiles / (sms * math.ceil(tiles / sms))
    return E * k / (k + K0) * _quant(m) * _quant(n) * wave


def gemms_efficiency(shapes: Sequence[Sequence[float]], phase: str, *, groups: int = 1, sms: int = 132,
                     precision: str = "bf16", impl: str = "grouped", params: Mapping[str, float]) -> float:
    """FLOP-weighted efficiency of a task made of several forward GEMM ``shapes`` (e.g. an expert's gate/up and
    down projections) in ``phase``: total FLOPs / sum(FLOPs_i / eff_i), so the time is exact for the sum."""
    total = 0.0
    time_units = 0.0
    for shape in shapes:
        m, k, n = phase_shape(shape, phase)
        flops = gemm_flops(m, k, n, groups)
        total += flops
        time_units += flops / gemm_efficiency(m, k, n, groups=groups, sms=sms, precision=precision, impl=impl,
                                              params=params)
    if total <= 0:
        raise ConfigError("a GEMM task needs at least one shape")
    return total / time_units


def fit_gemm_curve(samples: Sequence[tuple[float, float, float, int, float]], *, precision: str = "bf16",
                   sms: int = 132) -> dict[str, float]:
    """Fit ``E`` and ``K0`` of the shape model to measured GEMMs (a device profile replaces the cited values).

    Args:
        samples: ``(m, k, n, groups, efficiency)`` per measured GEMM, efficiency = achieved FLOP/s / peak, in (0, 1].
        precision: which entries the result overrides (``bf16`` or ``fp8``).
        sms: the measured GPU's SMs.

    Returns:
        ``{"gemm_peak_efficiency_<p>": E, "gemm_k_half_<p>": K0}``, ready for ``CostModel(assumptions=...)``:
        ``K0`` minimises the squared log error over a grid of 1..4096 elements, ``E`` is then the geometric-mean
        ratio (the least-squares optimum in log space).

    Raises:
        ConfigError: no samples, or an efficiency outside (0, 1].
    """
    if not samples:
        raise ConfigError("fit_gemm_curve needs at least one measured GEMM")
    for s in samples:
        if not 0 < s[4] <= 1:
            raise ConfigError(f"measured efficiency {s[4]} is out of range; allowed: (0, 1]")
    unit = {f"gemm_peak_efficiency_{precision}": 1.0}
    best: tuple[float, float, float] | None = None
    for K0 in range(1, 4097):
        params = {**unit, f"gemm_k_half_{precision}": float(K0)}
        logs = [math.log(eff / gemm_efficiency(m, k, n, groups=int(g), sms=sms, precision=precision, params=params))
                for m, k, n, g, eff in samples]
        log_e = sum(logs) / len(logs)
        err = sum((x - log_e) ** 2 for x in logs)
        if best is None or err < best[0] - 1e-15:
            best = (err, float(K0), math.exp(log_e))
    assert best is not None
    return {f"gemm_peak_efficiency_{precision}": best[2], f"gemm_k_half_{precision}": best[1]}
