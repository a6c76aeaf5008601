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

The analytic cost model does not use these class constants: it prices each (compute task, communication task)
overlap from what the two tasks ask of the resources the streams share (:class:`Demand`, :func:`shared_rates`):

* **SMs**: a communication kernel holds ``sm_share`` of the SMs exclusively (NCCL CTAs, DeepEP's configured
  count); the compute task's tensor-core work runs on the rest: ``math / (1 - sm_share)``.
* **HBM**: each task's HBM demand is its bytes over its own time as a share ``u`` of the effective bandwidth
  (a memory-bound kernel ``u = 1``; a collective ``2 x bytes on the link / (t x B_hbm)``); while the two demands
  sum to more than 1 both are stretched by ``max(1, u_c + u_m)`` (proportional sharing).
* **host**: one CPU thread issues both streams' kernels; host demand ``v = host issue seconds / task seconds``
  (a host-issue-bound task ``v = 1``); both are stretched by ``max(1, v_c + v_m)`` (the host's work is
  conserved; it is spread over the task, an approximation for a collective whose one launch comes first).
* **link**: the two micro-batches' collectives run one after the other on the communication stream, so each has
  the link to itself (two transfers sharing a link finish together no sooner than one after the other).

The compute task's time beside the communication is ``max(launch + max(math sigma, hbm phi) + cast phi,
host psi)`` with ``sigma = 1 / (1 - sm_share)``, ``phi`` the HBM and ``psi`` the host stretch: a task bound by
host issue loses nothing to the SMs communication takes; a GEMM loses their share; a norm or permute loses its
HBM share. The communication runs at ``1 / max(phi, psi)``.
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


@dataclass(frozen=True)
class Demand:
    """What one task asks of the resources the compute and communication streams share (seconds, shares).

    Attributes:
        time: standalone seconds (``max(launch + max(math, hbm) + cast, host)`` for a compute task).
        math: tensor-core seconds on all SMs; hbm: seconds of HBM traffic at the effective bandwidth
            (for a collective: its HBM traffic, 2 bytes per byte on the link); cast: FP8 cast seconds (HBM-bound);
        host: seconds of host issue; launch: GPU launch seconds;
        sm_share: share of the SMs the task holds exclusively (a communication kernel), in [0, 1).
    """

    time: float
    math: float = 0.0
    hbm: float = 0.0
    cast: float = 0.0
    host: float = 0.0
    launch: float = 0.0
    sm_share: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.sm_share < 1.0:
            raise ConfigError(f"field 'sm_share' = {self.sm_share} is out of range; allowed: 0 <= sm_share < 1")
        if min(self.time, self.math, self.hbm, self.cast, self.host, self.launch) < 0:
            raise ConfigError("field 'demand' has a negative time; allowed: seconds >= 0")

    def share(self, seconds: float) -> float:
        """``seconds / time`` capped at 1 (the share of a resource the task keeps busy), 0 for a zero-time task."""
        return min(1.0, seconds / self.time) if self.time > 0 else 0.0


def shared_rates(c: Demand, m: Demand) -> tuple[float, float]:
    """Rates (work per second, 1 = as fast as alone) of compute task ``c`` and communication task ``m`` while they
    run together (formulas in the module docstring).

    Example: an expert GEMM bound by host issue (math 0.61, host 1.28 ms) beside an NVLink all-to-all (0.42 ms,
    HBM demand 0.167, 10 us host, 32 of 132 SMs): host stretch 1 + 10/420, GPU 0.61 x 132/100 = 0.81 ms < 1.28:
    rates 0.977 and 0.977.
    """
    sigma = 1.0 / (1.0 - m.sm_share)
    phi = max(1.0, c.share(c.hbm + c.cast) + m.share(m.hbm))
    psi = max(1.0, c.share(c.host) + m.share(m.host))
    together = max(c.launch + max(c.math * sigma, c.hbm * phi) + c.cast * phi, c.host * psi)
    rate_c = c.time / together if together > 0 else 1.0
    return min(1.0, rate_c), 1.0 / max(phi, psi)


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
