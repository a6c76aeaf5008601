"""Task graph records of the layer decomposition (:mod:`tessera_lab.model.tasks`): collectives, tasks, the F/B/W
lists of a layer and the forward graph under construction. This module never imports torch."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable

from tessera_lab.errors import ConfigError
from tessera_lab.model.flops import gemm_flops

PHASES = ("F", "B", "W")

#: tasks that run on CUDA streams of their own, beside a layer's compute stream and its communication stream, over
#: the data-parallel link: Megatron FSDP's parameter all-gathers and gradient reduce-scatters
#: (:func:`tessera_lab.model.tasks._fsdp_comms`; Megatron-Core issues the gathers as asynchronous
#: ``all_gather_into_tensor`` calls of its ``AllGatherPipeline`` and the reduce-scatters on its ``GradReducePipeline``'s
#: side stream, both on the data-parallel process groups' communicators, not the EP or TP ones:
#: ``megatron/core/distributed/custom_fsdp/param_and_grad_buffer.py``, NVIDIA/Megatron-LM@1e057005959b).
#: The two-lane overlap model leaves them out; :meth:`tessera_lab.cost.analytic.CostModel.own_stream_time` prices them.
OWN_STREAM_TASKS = ("fsdp_gather", "fsdp_gather_experts")


@dataclass(frozen=True)
class Collective:
    """A communication operation.

    Attributes:
        kind: ``all_to_all``, ``all_reduce``, ``reduce_scatter``, ``all_gather`` or ``p2p``.
        bytes: message size S per rank in bytes, as nccl-tests defines it for the collective.
        group: ``ep``, ``tp``, ``pp`` or ``edp`` (the non-expert data-parallel group).
        group_size: ranks in the group; a group of 1 is a no-op.
        routing: for MoE dispatch/combine, ``(tokens, num_experts, top_k, dispatcher, n_group, topk_group)`` so
            the cost model can
            split the bytes by link when the EP group spans nodes (DeepEP forwards one copy per destination node
            over the inter-node link, :func:`tessera_lab.model.ep_traffic.expected_destinations`).
    """

    kind: str
    bytes: float
    group: str
    group_size: int
    routing: tuple | None = None


@dataclass(frozen=True)
class Task:
    """One task of a layer for one micro-batch on one rank.

    Attributes:
        name: unique within the layer and phase, e.g. ``"dispatch"``.
        layer: decoder layer index; ``-1`` for the embedding, ``num_layers`` for LM head and loss.
        phase: ``F`` (forward), ``B`` (input gradient) or ``W`` (weight gradient).
        op: ``gemm``, ``grouped_gemm``, ``attention``, ``linear_attention``, ``elementwise``, ``router``,
            ``embedding``, ``loss`` or a collective kind.
        flops: floating-point operations.
        bytes: HBM bytes read and written (roofline).
        collective: the collective for communication tasks, else ``None``.
        deps: names of tasks of the same bundle this task waits for.
        deferrable: W tasks and gradient reduce-scatter may move later in the schedule.
        saved_bytes: activation bytes kept from forward to backward (F tasks only).
        gemms: forward GEMM shapes ``(m, k, n)`` of one group for GEMM tasks (the cost model's shape-aware
            efficiency, :mod:`tessera_lab.cost.gemm`); empty for other ops.
        groups: GEMMs of each shape in one launch (local experts of a grouped expert GEMM; 1 otherwise).
    """

    name: str
    layer: int
    phase: str
    op: str
    flops: float = 0.0
    bytes: float = 0.0
    collective: Collective | None = None
    deps: tuple[str, ...] = ()
    deferrable: bool = False
    saved_bytes: float = 0.0
    gemms: tuple[tuple[float, float, float], ...] = ()
    groups: int = 1

    @property
    def is_comm(self) -> bool:
        return self.collective is not None

    @property
    def own_stream(self) -> bool:
        """Whether the task runs on a stream of its own (:data:`OWN_STREAM_TASKS`), outside the two lanes."""
        return self.name in OWN_STREAM_TASKS

    @property
    def key(self) -> str:
        """Globally unique label ``L<layer>.<phase>.<name>``."""
        return f"L{self.layer}.{self.phase}.{self.name}"


@dataclass(frozen=True)
class LayerTasks:
    """F, B and W task lists of one layer (each in program order; ``deps`` name tasks of the same list)."""

    layer: int
    kind: str
    F: tuple[Task, ...]
    B: tuple[Task, ...]
    W: tuple[Task, ...]

    def phase(self, name: str) -> tuple[Task, ...]:
        if name not in PHASES:
            raise ConfigError(f"phase {name!r} is unknown; allowed: F, B, W")
        return getattr(self, name)

    def all(self) -> tuple[Task, ...]:
        return self.F + self.B + self.W


# ---------------------------------------------------------------------- builders of forward graphs
@dataclass
class _Fwd:
    """Forward graph under construction: tasks plus which ones own weights (get a W) and the
    B cost multiplier of each."""

    layer: int
    dt: int
    tasks: list[Task] = field(default_factory=list)
    weighted: dict[str, Task] = field(default_factory=dict)  # name -> W task template (phase set later)
    b_scale: dict[str, float] = field(default_factory=dict)
    recompute: str = "none"
    #: task names whose forward re-runs in the backward (selective recompute)
    recomputed: set[str] = field(default_factory=set)
    #: recomputed modules (Megatron-LM names, plus ``_experts``: this project's selective routed experts)
    modules: frozenset = frozenset()
    #: bytes of one saved GEMM input element (1 under FP8: Transformer Engine saves the FP8 copy)
    gemm_in: float = 2.0
    #: sequence-parallel split of the saved activations (``tp`` with sequence parallelism, else 1)
    sp: int = 1

    def add(self, task: Task, *, w: Task | None = None, b_scale: float = 1.0, selective: float | None = None,
            module: str | None = None) -> str:
        """Add a forward task; ``selective``: its saved bytes when ``module`` is recomputed (it is then re-run in
        the backward); with full recompute every task but the layer input re-runs and saves nothing."""
        if module is not None and module in self.modules and selective is not None:
            task = replace(task, saved_bytes=selective)
            self.recomputed.add(task.name)
        self.tasks.append(task)
        if w is not None:
            self.weighted[task.name] = w
        self.b_scale[task.name] = b_scale
        return task.name

    def gemm(self, name: str, m: float, k: float, n: float, deps: Iterable[str], *, saved: bool = True,
             seq: bool = False, module: str | None = None) -> str:
        """A dense GEMM (m, k) x (k, n); F, B and W each 2mkn FLOPs; saves its input (``gemm_in`` bytes an
        element; divided by ``sp`` when the input is in the sequence-parallel region, ``seq``; nothing when
        ``module`` is recomputed)."""
        flops = gemm_flops(m, k, n)
        nbytes = self.dt * (m * k + k * n + m * n)
        kept = self.gemm_in * m * k / (self.sp if seq else 1) if saved else 0.0
        t = Task(name, self.layer, "F", "gemm", flops, nbytes, deps=tuple(deps), saved_bytes=kept, gemms=((m, k, n),))
        return self.add(t, w=replace(t, saved_bytes=0.0), module=module, selective=0.0)

    def elementwise(self, name: str, nbytes: float, deps: Iterable[str], *, saved: float = 0.0, flops: float = 0.0,
                    module: str | None = None) -> str:
        return self.add(Task(name, self.layer, "F", "elementwise", flops, nbytes, deps=tuple(deps), saved_bytes=saved),
                        module=module, selective=0.0)

    def comm(self, name: str, kind: str, nbytes: float, group: str, size: int, deps: Iterable[str],
             routing: tuple | None = None) -> str:
        coll = Collective(kind, nbytes if size > 1 else 0.0, group, size, routing)
        return self.add(Task(name, self.layer, "F", kind, 0.0, 0.0, coll, tuple(deps)))
