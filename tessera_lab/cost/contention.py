"""Contention by kernel class: how much a task slows while a communication kernel runs beside it.

Kernel classes (:func:`kernel_class`): ``compute`` (GEMMs, grouped expert GEMMs, the attention core, the router),
``memory`` (norms, permute/unpermute, residuals, embedding, loss, and the Gated DeltaNet chunk kernels, bound by
state and activation I/O), ``comm`` (collectives).

While a communication kernel runs (rates, integrated exactly by :func:`tessera_lab.cost.lanes.pair_makespan`):

* a ``compute`` kernel loses the SMs the communication kernel holds: rate ``1 - c/S`` (``c`` SMs of ``S``), i.e.
  slowdown ``S / (S - c) - 1``. NCCL CTAs hold their SM exclusively (NVIDIA/nccl #689); NCCL uses about 32 SMs on
  NVLink and 16 across nodes, DeepEP's normal kernels 24 (``data/hardware/cost_model.json``).
* a ``memory`` kernel and the communication share HBM: communication at link rate ``L`` moves ``2L`` of HBM
  traffic (read at the source, written at the destination), a share ``h = 2L / (B_hbm * eff_hbm)``; under
  proportional sharing both run at ``1 / (1 + h)``: slowdown ``h`` for the memory kernel **and** for the
  communication beside it.
* communication beside a ``compute`` kernel slows by ``comm_slowdown_beside_compute`` (assumption, small).

All parameters can be fitted from measured per-task inflations with :func:`fit_kernel_contention`.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Iterable, Mapping

from tessera_lab.errors import ConfigError

COMPUTE, MEMORY, COMM = "compute", "memory", "comm"
KERNEL_CLASSES = (COMPUTE, MEMORY, COMM)
#: ops whose kernels are bound by HBM bandwidth, not by tensor-core throughput
MEMORY_OPS = frozenset({"elementwise", "embedding", "loss", "linear_attention"})
DISPATCHERS = ("alltoall", "deepep")


def kernel_class(op: str, is_comm: bool = False) -> str:
    """``compute``, ``memory`` or ``comm`` for a task's op (classes in the module docstring)."""
    if is_comm:
        return COMM
    return MEMORY if op in MEMORY_OPS else COMPUTE


@dataclass(frozen=True)
class Contention:
    """Relative slowdowns while compute and communication run together (0 = no interference).

    Attributes:
        compute: slowdown of a ``compute``-class kernel beside communication (its rate is ``1 / (1 + compute)``).
        comm: slowdown of communication beside a ``compute``-class kernel.
        memory: slowdown of a ``memory``-class kernel beside communication; ``None`` = same as ``compute``
            (the two-constant model, used when tasks carry no class).
        comm_beside_memory: slowdown of communication beside a ``memory``-class kernel; ``None`` = ``comm``.
    """

    compute: float = 0.0
    comm: float = 0.0
    memory: float | None = None
    comm_beside_memory: float | None = None

    def __post_init__(self) -> None:
        values = (self.compute, self.comm, self.memory or 0.0, self.comm_beside_memory or 0.0)
        if any(v < 0 for v in values):
            raise ConfigError("field 'contention' must be >= 0 for every kernel class")

    def slowdown(self, cls: str) -> float:
        """Slowdown of a compute-lane kernel of class ``cls`` beside communication."""
        if cls == MEMORY and self.memory is not None:
            return self.memory
        return self.compute

    def comm_slowdown(self, partner_cls: str) -> float:
        """Slowdown of communication beside a compute-lane kernel of class ``partner_cls``."""
        if partner_cls == MEMORY and self.comm_beside_memory is not None:
            return self.comm_beside_memory
        return self.comm

    def as_dict(self) -> dict[str, float | None]:
        return {"compute": self.compute, "comm": self.comm, "memory": self.memory,
                "comm_beside_memory": self.comm_beside_memory}


def sm_slowdown(comm_sms: float, sms: int) -> float:
    """Slowdown of a compute-bound kernel that loses ``comm_sms`` of ``sms`` SMs: ``sms / (sms - comm_sms) - 1``.

    Example: DeepEP's 24 of 132 SMs give 132/108 - 1 = 0.2222.

    Raises:
        ConfigError: ``comm_sms`` not in [0, sms).
    """
    if not 0 <= comm_sms < sms:
        raise ConfigError(f"field 'comm_sms' = {comm_sms} is out of range; allowed: 0 <= comm_sms < {sms}")
    return sms / (sms - comm_sms) - 1.0


def hbm_share(link_bytes_per_s: float, hbm_bytes_per_s: float, bytes_per_link_byte: float = 2.0) -> float:
    """Share ``h`` of HBM bandwidth communication at ``link_bytes_per_s`` takes: ``2 L / B_hbm``.

    Example: H200 NVLink 450 GB/s per direction x 0.8 bus efficiency = 360 GB/s; 720 / (4800 x 0.896) = 0.1674.
    """
    if hbm_bytes_per_s <= 0 or link_bytes_per_s < 0:
        raise ConfigError("bandwidths must be positive")
    return bytes_per_link_byte * link_bytes_per_s / hbm_bytes_per_s


def kernel_contention(*, sms: int, comm_sms: float, link_bytes_per_s: float, hbm_bytes_per_s: float,
                      params: Mapping[str, float]) -> Contention:
    """The class-aware :class:`Contention` of a communication kernel holding ``comm_sms`` SMs and moving data at
    ``link_bytes_per_s`` (effective), beside kernels of a GPU with ``sms`` SMs and effective HBM bandwidth
    ``hbm_bytes_per_s`` (formulas in the module docstring)."""
    h = hbm_share(link_bytes_per_s, hbm_bytes_per_s, params.get("comm_hbm_bytes_per_link_byte", 2.0))
    return Contention(compute=sm_slowdown(comm_sms, sms), comm=params.get("comm_slowdown_beside_compute", 0.0),
                      memory=h, comm_beside_memory=h)


def comm_sms_for(dispatcher: str, spans_nodes: bool, params: Mapping[str, float]) -> float:
    """SMs the EP communication kernel holds: DeepEP's configured count, or NCCL's (intra- or inter-node)."""
    if dispatcher not in DISPATCHERS:
        raise ConfigError(f"field 'dispatcher' = {dispatcher!r} is unknown; allowed: {', '.join(DISPATCHERS)}")
    if dispatcher == "deepep":
        return params["comm_sms_deepep"]
    return params["comm_sms_nccl_inter_node" if spans_nodes else "comm_sms_nccl_intra_node"]


# ---------------------------------------------------------------------- fitting from measurements
@dataclass(frozen=True)
class InflationSample:
    """One measured task of an overlapped pair: its class, and its time together / time alone (>= 0) while a
    partner of class ``partner`` ran beside it for the whole task (``overlap`` = share of its time overlapped,
    0..1; the fit uses samples with ``overlap`` >= 0.5 and rescales by it)."""

    cls: str
    inflation: float
    partner: str = COMM
    overlap: float = 1.0


def fit_kernel_contention(samples: Iterable[InflationSample], *, prior: Contention | None = None) -> Contention:
    """Fit the class-aware contention from measured per-task inflations (for ``run``'s measure-fit-search loop).

    For each (class, partner class) the slowdown is the median over samples of ``(inflation - 1) / overlap``
    (a task overlapped for a share ``o`` of its time at slowdown ``x`` inflates by ``1 + o x``), floored at 0:
    ``compute`` beside ``comm`` -> ``compute``; ``memory`` beside ``comm`` -> ``memory``; ``comm`` beside
    ``compute`` -> ``comm``; ``comm`` beside ``memory`` -> ``comm_beside_memory``. Classes with no sample keep
    ``prior``'s value (default: no contention).

    Example: compute samples with inflations 1.2, 1.25, 1.3 (overlap 1) give ``compute = 0.25``.

    Raises:
        ConfigError: an unknown class or a negative inflation.
    """
    groups: dict[tuple[str, str], list[float]] = {}
    for s in samples:
        if s.cls not in KERNEL_CLASSES or s.partner not in KERNEL_CLASSES:
            raise ConfigError(f"sample class {s.cls!r}/{s.partner!r} is unknown; allowed: {', '.join(KERNEL_CLASSES)}")
        if s.inflation < 0 or not 0 <= s.overlap <= 1:
            raise ConfigError(f"sample inflation {s.inflation} / overlap {s.overlap} out of range")
        if s.overlap < 0.5:
            continue
        groups.setdefault((s.cls, s.partner), []).append(max(0.0, (s.inflation - 1.0) / s.overlap))
    base = prior or Contention()

    def pick(key: tuple[str, str], default: float | None) -> float | None:
        return median(groups[key]) if key in groups else default

    return Contention(
        compute=pick((COMPUTE, COMM), base.compute),
        comm=pick((COMM, COMPUTE), base.comm),
        memory=pick((MEMORY, COMM), base.memory),
        comm_beside_memory=pick((COMM, MEMORY), base.comm_beside_memory),
    )
