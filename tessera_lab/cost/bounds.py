"""What bounds each kind of task of a pipeline stage: host issue, compute, HBM or communication.

A compute task's analytic time is ``max(t_gpu, t_host)`` with ``t_gpu = launch + max(t_compute, t_hbm) + t_cast``
(:meth:`tessera_lab.cost.analytic.CostModel.compute_time`); its *bound* is the term that sets it:

* ``host issue`` when the host's eager issue time of its kernels exceeds its GPU time (:mod:`tessera_lab.cost.host`):
  making the task's GPU work smaller (a narrower expert, fewer FLOPs) does not shorten it;
* ``compute`` when FLOPs at the efficient peak are the larger roofline term, ``HBM`` when bytes are (FP8 cast
  bytes count as HBM), ``kernel launch`` when the GPU launch overhead exceeds both.

A communication task is bound by its link: ``link bandwidth`` when its bytes over the link's bandwidth exceed the
link's latency, else ``link latency`` (alpha-beta, :meth:`CostModel.collective_time`). How much of it the schedule
hides under compute is the capacity report's (``tessera-lab report``: exposed EP all-to-all). Times are the
standalone F + B + W seconds per micro-batch of one rank of the stage, before overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from tessera_lab.cost.analytic import CostModel
from tessera_lab.model.tasks import LayerTasks, Task

#: the kind of the collectives that run on streams of their own beside the two lanes (Megatron FSDP's parameter
#: all-gathers and gradient reduce-scatters, :attr:`~tessera_lab.model.graph.Task.own_stream`)
OWN_STREAM_KIND = "FSDP gathers/reduce-scatters (own streams)"
#: the host/sync term (:mod:`tessera_lab.cost.sync`) reported beside the task kinds of a stage
HOST_SYNC_KIND = "host/sync"
#: task kinds in the order they are reported
KIND_ORDER = ("expert GEMMs", "EP all-to-all", "attention core", "linear-attention core", "dense GEMMs",
              "elementwise", "TP all-reduce", "CP communication", OWN_STREAM_KIND, "other communication")


def task_kind(task: Task) -> str:
    """The kind a task is reported under (``expert GEMMs``, ``EP all-to-all``, ``attention core``, ...)."""
    if task.own_stream:
        return OWN_STREAM_KIND
    if task.is_comm:
        c = task.collective
        if c.kind == "all_to_all" and c.group == "ep":
            return "EP all-to-all"
        if c.kind == "all_reduce" and c.group == "tp":
            return "TP all-reduce"
        if c.group == "cp":  # the KV ring or the head-sharding all-to-alls (model/context_parallel.py)
            return "CP communication"
        return "other communication"
    return {"grouped_gemm": "expert GEMMs", "attention": "attention core", "linear_attention": "linear-attention core",
            "gemm": "dense GEMMs"}.get(task.op, "elementwise")


def compute_bound(cm: CostModel, task: Task) -> str:
    """``host issue``, ``compute``, ``HBM`` or ``kernel launch``: the term that sets a compute task's time."""
    t = cm.gpu_terms(task)
    gpu = t["launch"] + max(t["compute"], t["hbm"]) + t["cast"]
    if cm.host_time(task) > gpu:
        return "host issue"
    memory = t["hbm"] + t["cast"] if t["hbm"] >= t["compute"] else t["cast"]
    compute = t["compute"] if t["compute"] > t["hbm"] else 0.0
    return max((("compute", compute), ("HBM", memory), ("kernel launch", t["launch"])), key=lambda kv: kv[1])[0]


def comm_bound(cm: CostModel, task: Task) -> str:
    """``link bandwidth`` or ``link latency``: the alpha-beta term that sets a collective's time."""
    t = cm.collective_time(task.collective)
    if t <= 0:
        return "link latency"
    ranks = cm.group_link_ranks(task.collective.group) if task.collective.group != "pp" else [0, 1]
    latency = cm.cluster.link_for(ranks).latency_s if len(ranks) > 1 else 0.0
    return "link latency" if latency >= t - latency else "link bandwidth"


@dataclass
class KindBound:
    """One task kind of a stage: its time (s, F + B + W per micro-batch), seconds by bound, and for compute kinds
    the host issue time and GPU time summed over its tasks."""

    kind: str
    time_s: float = 0.0
    by_bound: dict[str, float] = field(default_factory=dict)
    host_s: float = 0.0
    gpu_s: float = 0.0

    @property
    def bound(self) -> str:
        """The bound holding most of this kind's time."""
        return max(self.by_bound.items(), key=lambda kv: kv[1])[0] if self.by_bound else "-"

    @property
    def share(self) -> float:
        """Share of this kind's time under :attr:`bound` (0..1)."""
        return self.by_bound.get(self.bound, 0.0) / self.time_s if self.time_s > 0 else 0.0


def stage_bounds(cm: CostModel, layer_tasks: Iterable[LayerTasks]) -> list[KindBound]:
    """Bounds per task kind over the given layers' F, B and W tasks (one stage), largest time first."""
    kinds: dict[str, KindBound] = {}
    for lt in layer_tasks:
        for phase in (lt.F, lt.B, lt.W):
            if not phase:
                continue
            for task in phase:
                k = kinds.setdefault(task_kind(task), KindBound(task_kind(task)))
                t = cm.task_time(task)
                k.time_s += t
                if task.is_comm:
                    b = comm_bound(cm, task)
                    k.by_bound[b] = k.by_bound.get(b, 0.0) + t
                else:
                    b = compute_bound(cm, task)
                    k.by_bound[b] = k.by_bound.get(b, 0.0) + t
                    k.host_s += cm.host_time(task)
                    k.gpu_s += cm.gpu_time(task)
    return sorted(kinds.values(), key=lambda k: -k.time_s)


def bound_text(k: KindBound) -> str:
    """``expert GEMMs 24.6 ms: host issue (100%; GPU work 21.8 ms)`` for people."""
    extra = ""
    if k.bound == "host issue":
        extra = f"; GPU work {k.gpu_s * 1e3:.1f} ms"
    return f"{k.kind} {k.time_s * 1e3:.1f} ms: {k.bound} ({k.share:.0%}{extra})"


def layers_bounds(model, parallel, cluster, layers: Iterable[int], *, first: bool = False, last: bool = False,
                  expert_load: float = 1.0) -> list[KindBound]:
    """:func:`stage_bounds` of a stage holding ``layers`` (decoder layer indices) of ``model``; ``first`` adds the
    embedding, ``last`` the LM head and loss. Analytic terms (:class:`CostModel` of ``cluster`` and ``parallel``)."""
    from tessera_lab.model.tasks import decompose

    wanted = set(layers) | ({-1} if first else set()) | ({model.num_layers} if last else set())
    cm = CostModel(cluster, parallel)
    return stage_bounds(cm, [lt for lt in decompose(model, parallel, expert_load=expert_load) if lt.layer in wanted])


def knob_hint(kinds: list[KindBound], microbatches: int | None = None) -> str | None:
    """Why a knob may not move the stage: a line when Megatron FSDP's own-stream traffic outweighs the stage's compute
    kinds together, or when the stage's largest compute kind is host-issue bound. ``microbatches``: the plan's
    micro-batch count (with one, fewer micro-batches are not an option and the line does not offer them)."""
    compute = [k for k in kinds if k.host_s > 0]
    side = next((k for k in kinds if k.kind == OWN_STREAM_KIND), None)
    if side is not None and (not compute or side.time_s >= sum(k.time_s for k in compute)):
        fewer = ("" if microbatches == 1 else "fewer, larger micro-batches (--micro-batch-size) or ")
        return (f"{side.kind} take {side.time_s * 1e3:.1f} ms, more than the stage's compute kinds together "
                f"({sum(k.time_s for k in compute) * 1e3:.1f} ms): they repeat every micro-batch, so {fewer}the "
                "distributed optimizer (no --fsdp) move this stage; a compute knob barely does")
    if compute and compute[0].bound == "host issue":
        k = compute[0]
        fewer = ("--grouped-gemm grouped, fewer local experts" if k.kind == "expert GEMMs"
                 else "fused kernels, fewer layers on the stage, or larger micro-batches (--micro-batch-size) that "
                      "issue the same kernels for more tokens")
        return (f"{k.kind} are host-issue bound ({k.host_s * 1e3:.1f} ms to issue their kernels, {k.gpu_s * 1e3:.1f} ms "
                "of GPU work): a knob that shrinks their GPU work (expert width, top-k, sequence) barely moves this "
                f"stage; fewer kernels do ({fewer})")
    return None
