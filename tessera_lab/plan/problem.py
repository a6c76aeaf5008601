"""The contiguous partition problem and its result (shared by the DP and the ILP; see
:mod:`tessera_lab.plan.partition` for the objectives and methods).

Segment functions take ``(s, i, j)``: (virtual) stage ``s`` owning layers ``i .. j-1``; costs in seconds per
micro-batch, memory in bytes per GPU.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from tessera_lab.errors import InfeasiblePlanError, PartitionError

SegmentFn = Callable[[int, int, int], float]
GIB = 2**30
#: the refusal of a problem no partition satisfies for layer counts alone (every other
#: :class:`~tessera_lab.errors.InfeasiblePlanError` is a memory refusal)
LAYER_COUNT_REFUSAL = "no partition satisfies the layer-count constraints"
#: the end of a memory refusal: where to look next (the search lists layouts of the same GPUs that fit, or names the
#: fewest GPUs at which one could; the panels word it as their suggest button, :func:`tessera_lab.ui.panel.panel_wording`)
SEARCH_POINTER = "(tessera-lab search lists layouts that fit, or the GPUs one needs)"


#: feasible segments per (memory function, limit, sizes, bounds, stage): see :meth:`PartitionProblem.segments`
_SEGMENTS: dict[tuple, tuple[tuple[int, int], ...]] = {}


@dataclass(frozen=True)
class PartitionProblem:
    """A contiguous partition problem.

    Attributes:
        num_layers: L (>= 1).
        num_stages: S (1 <= S <= L).
        cost: ``cost(s, i, j)`` seconds per micro-batch of stage s owning layers i..j-1.
        memory: ``memory(s, i, j)`` bytes on stage s, or None (no memory constraint).
        memory_limit: bytes available per GPU (required with ``memory``).
        objective: ``"bottleneck"`` or ``"schedule"``.
        microbatches: m, used by the ``schedule`` objective.
        min_layers / max_layers: per-stage layer-count bounds.
        first_stage_layers / last_stage_layers: pinned layer counts of the first / last stage.
        vpp: virtual stages per pipeline rank. ``num_stages`` then counts virtual stages (``p * vpp``);
            virtual stage ``s`` runs on rank ``s % p`` (Megatron-LM's interleaved placement), a rank's
            cost and memory are the sums over its virtual stages, and the objective is taken over ranks.
        monotone: the caller guarantees cost and memory never decrease when a segment grows (true for sums of
            non-negative per-layer values); large bottleneck problems then take the O(S L log L) DP.
        has_experts: the model has routed experts (a memory refusal then suggests ep; else tp and dp).
        recompute: the activation recomputation already planned (``none``, ``selective`` or ``full``): a memory
            refusal suggests only more than that.
        schedule: the pipeline schedule planned, or ``None``: a memory refusal names the schedule that keeps fewer
            micro-batches in flight where there is one (:data:`FEWER_IN_FLIGHT`).
        given_split: the problem only scores a given split (``score_boundaries``), which may leave the first and
            last stage only the embedding and the loss (Megatron's embedding/loss-accounted split): up to
            ``L + 2`` stages; never solved.
    """

    num_layers: int
    num_stages: int
    cost: SegmentFn
    memory: SegmentFn | None = None
    memory_limit: float | None = None
    objective: str = "bottleneck"
    microbatches: int = 1
    min_layers: int = 1
    max_layers: int | None = None
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    vpp: int = 1
    monotone: bool = False
    has_experts: bool = True
    recompute: str = "none"
    given_split: bool = False
    schedule: str | None = None

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise PartitionError(f"field 'layers' = {self.num_layers} is out of range; allowed: >= 1")
        most = self.num_layers + (2 if self.given_split else 0)  # + 2: an embedding-only and a loss-only stage
        if not 1 <= self.num_stages <= most:
            raise PartitionError(
                f"field 'stages' = {self.num_stages} is out of range; allowed: 1 to the number of layers ({most})"
            )
        if self.objective not in ("bottleneck", "schedule"):
            raise PartitionError(f"field 'objective' = {self.objective!r} is unknown; allowed: bottleneck, schedule")
        if self.memory is not None and self.memory_limit is None:
            raise PartitionError("field 'memory_limit' is required when a memory function is given")
        if self.min_layers < 1:
            raise PartitionError(f"field 'min_layers' = {self.min_layers} is out of range; allowed: >= 1")
        if self.max_layers is not None and self.max_layers < self.min_layers:
            raise PartitionError(f"field 'max_layers' = {self.max_layers} is out of range; allowed: >= min_layers")
        if self.vpp < 1 or self.num_stages % self.vpp:
            raise PartitionError(
                f"field 'vpp' = {self.vpp} is out of range; allowed: a divisor of the virtual stage count {self.num_stages}"
            )
        if self.microbatches < 1:
            raise PartitionError(f"field 'microbatches' = {self.microbatches} is out of range; allowed: >= 1")

    # ---------------------------------------------------------------- feasibility of one segment
    def length_ok(self, s: int, i: int, j: int) -> bool:
        n = j - i
        if n < self.min_layers or (self.max_layers is not None and n > self.max_layers):
            return False
        if s == 0 and self.first_stage_layers is not None and n != self.first_stage_layers:
            return False
        if s == self.num_stages - 1 and self.last_stage_layers is not None and n != self.last_stage_layers:
            return False
        # room for the other stages: each needs at least min_layers
        if i < s * self.min_layers or self.num_layers - j < (self.num_stages - 1 - s) * self.min_layers:
            return False
        return True

    def memory_ok(self, s: int, i: int, j: int) -> bool:
        return self.memory is None or self.memory(s, i, j) <= self.memory_limit * (1 + 1e-12)

    def memory_ok_rank(self, rank_bytes: float) -> bool:
        """Whether a rank's summed memory (bytes) fits the limit."""
        return self.memory is None or rank_bytes <= self.memory_limit * (1 + 1e-12)

    def segments(self, s: int) -> list[tuple[int, int]]:
        """Feasible (i, j) of stage s (length bounds, pins, memory); memoised by everything they depend on (the
        memory function by identity: it is a function of ``(s, i, j)``), so problems that differ only in their cost
        or objective share them."""
        key = (self.memory, self.memory_limit, self.num_layers, self.num_stages, self.min_layers, self.max_layers,
               self.first_stage_layers, self.last_stage_layers, s)
        got = _SEGMENTS.get(key)
        if got is None:
            if len(_SEGMENTS) >= 1024:
                _SEGMENTS.clear()
            got = _SEGMENTS[key] = tuple(self._segments(s))
        return list(got)

    def _segments(self, s: int) -> list[tuple[int, int]]:
        L, S = self.num_layers, self.num_stages
        lo_i = 0 if s == 0 else s * self.min_layers
        hi_i = 0 if s == 0 else L - (S - s) * self.min_layers
        out = []
        memory, limit = self.memory, (self.memory_limit or 0.0) * (1 + 1e-12)
        length_ok = self.length_ok
        owner = getattr(memory, "__self__", None)  # a stage cost model's memory_bytes: one row per start
        row = owner.memory_row if getattr(memory, "__name__", "") == "memory_bytes" and hasattr(
            owner, "memory_row") else None
        for i in range(lo_i, hi_i + 1):
            j_end = L if s == S - 1 else L - (S - 1 - s) * self.min_layers
            j_start = L if s == S - 1 else i + self.min_layers
            js = [j for j in range(j_start, j_end + 1) if length_ok(s, i, j)]
            if memory is None:
                out += [(i, j) for j in js]
            elif row is not None:
                out += [(i, j) for j, m in zip(js, row(s, i, js)) if m <= limit]
            else:  # memory_ok, inlined
                out += [(i, j) for j in js if memory(s, i, j) <= limit]
        return out

    def segment_costs(self, s: int, segments) -> list[float]:
        """``cost(s, i, j)`` for every ``(i, j)`` of ``segments``: one batched call where the cost is a stage cost
        model's :meth:`~tessera_lab.plan.stages.StageCostModel.cost` (its ``cost_table``, the same numbers), else
        one call per segment."""
        owner = getattr(self.cost, "__self__", None)
        if getattr(self.cost, "__name__", "") == "cost" and hasattr(owner, "cost_table"):
            return owner.cost_table(s, segments)
        return [self.cost(s, i, j) for i, j in segments]

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks (``num_stages / vpp``)."""
        return self.num_stages // self.vpp

    def rank_values(self, per_stage: Sequence[float]) -> list[float]:
        """Per-rank sums of per-virtual-stage values (identity when vpp = 1)."""
        out = [0.0] * self.num_ranks
        for s, v in enumerate(per_stage):
            out[s % self.num_ranks] += v
        return out

    def objective_value(self, stage_costs: Sequence[float]) -> float:
        """Objective of per-(virtual-)stage costs, taken over ranks."""
        ranks = self.rank_values(stage_costs)
        if self.objective == "bottleneck":
            return max(ranks)
        return sum(ranks) + (self.microbatches - 1) * max(ranks)


@dataclass
class Partition:
    """A partition of layers into stages.

    Attributes:
        boundaries: S + 1 increasing layer indices; stage s owns layers ``boundaries[s] .. boundaries[s+1]-1``.
        stage_costs: seconds per micro-batch of each stage.
        bottleneck: the slowest stage, seconds.
        objective: value of the problem's objective, seconds.
        method: ``uniform``, ``dp``, ``ilp`` (or a baseline name).
        solver / status / gap / solve_time_s / num_variables: ILP bookkeeping (``dp`` reports its own time).
        stage_memory: bytes per stage when a memory model was given.
    """

    boundaries: list[int]
    stage_costs: list[float]
    bottleneck: float
    objective: float
    method: str
    solver: str = ""
    status: str = ""
    gap: float | None = None
    solve_time_s: float = 0.0
    num_variables: int = 0
    stage_memory: list[float] = field(default_factory=list)
    rank_costs: list[float] = field(default_factory=list)
    rank_memory: list[float] = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return len(self.boundaries) - 1

    @property
    def proven(self) -> bool:
        """Whether this partition is a proven optimum of its objective: an exact DP (no status), or an ILP solved to
        optimality (``status`` ``Optimal``); not a solver's incumbent or heuristic plan at its limit."""
        return (self.status or "Optimal") == "Optimal"

    def stage_layers(self) -> list[list[int]]:
        return [list(range(self.boundaries[s], self.boundaries[s + 1])) for s in range(self.num_stages)]

    def layer_counts(self) -> list[int]:
        return [self.boundaries[s + 1] - self.boundaries[s] for s in range(self.num_stages)]

    def as_dict(self) -> dict:
        d = asdict(self)
        d["layer_counts"] = self.layer_counts()
        return d


def score_boundaries(problem: PartitionProblem, boundaries: Sequence[int], method: str, **extra) -> Partition:
    """The :class:`Partition` of given boundaries under a problem's costs, memory and objective (no solving)."""
    S = problem.num_stages
    costs = [problem.cost(s, boundaries[s], boundaries[s + 1]) for s in range(S)]
    mem = [problem.memory(s, boundaries[s], boundaries[s + 1]) for s in range(S)] if problem.memory else []
    ranks = problem.rank_values(costs)
    return Partition(list(boundaries), costs, max(ranks), problem.objective_value(costs), method, stage_memory=mem,
                     rank_costs=ranks, rank_memory=problem.rank_values(mem) if mem else [], **extra)


def uniform_boundaries(num_layers: int, num_stages: int) -> list[int]:
    """Layer counts as even as possible; the earlier stages take the remainder (``[13, 13, 12, 12]``)."""
    if not 1 <= num_stages <= num_layers:
        raise PartitionError(
            f"field 'stages' = {num_stages} is out of range; allowed: 1 to the number of layers ({num_layers})"
        )
    q, r = divmod(num_layers, num_stages)
    b = [0]
    for s in range(num_stages):
        b.append(b[-1] + q + (1 if s < r else 0))
    return b


def check_memory(problem: PartitionProblem, part: Partition) -> None:
    """Raise InfeasiblePlanError naming the first stage over the memory limit and the shortfall in GiB."""
    if problem.memory is None:
        return
    for r, mem in enumerate(part.rank_memory):
        if mem > problem.memory_limit * (1 + 1e-12):
            where = (f"stage {r} (layers {part.boundaries[r]}-{part.boundaries[r + 1] - 1})" if problem.vpp == 1
                     else f"rank {r} (virtual stages {list(range(r, problem.num_stages, problem.num_ranks))})")
            raise InfeasiblePlanError(
                f"{where} needs {mem / GIB:.2f} GiB, "
                f"{(mem - problem.memory_limit) / GIB:.2f} GiB more than the {problem.memory_limit / GIB:.2f} GiB available"
            )


def infeasible_error(problem: PartitionProblem) -> InfeasiblePlanError:
    """The error for a problem with no feasible partition: among partitions that satisfy the
    layer-count rules, the one whose worst memory excess is smallest names its worst stage and the
    shortfall in GiB (a min-max DP over memory excess). Its advice leaves out more pipeline stages when that stage
    already holds a single layer."""
    if problem.memory is None:
        return InfeasiblePlanError(LAYER_COUNT_REFUSAL)
    if problem.vpp > 1:
        return InfeasiblePlanError(
            f"no partition into {problem.num_stages} virtual stages fits {problem.memory_limit / GIB:.2f} GiB on every "
            f"rank; add pipeline ranks, {_recompute_hint(problem)}{_schedule_hint(problem)}{_shard_hint(problem)} or "
            "shorten the sequence "
            f"{SEARCH_POINTER}"
        )
    S, L, limit = problem.num_stages, problem.num_layers, problem.memory_limit
    best: dict[int, tuple[float, tuple[int, ...]]] = {0: (-math.inf, (0,))}
    for s in range(S):
        nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
        for i, (worst, path) in best.items():
            for j in range(i + 1, L + 1):
                if not problem.length_ok(s, i, j):
                    continue
                v = max(worst, problem.memory(s, i, j) - limit)
                if j not in nxt or v < nxt[j][0]:
                    nxt[j] = (v, path + (j,))
        best = nxt
    if L not in best:
        return InfeasiblePlanError(LAYER_COUNT_REFUSAL)
    b = list(best[L][1])
    excess = [problem.memory(s, b[s], b[s + 1]) - limit for s in range(S)]
    s = max(range(S), key=lambda k: excess[k])
    need = excess[s] + limit
    one = b[s + 1] - b[s] == 1  # a stage of one layer: more stages cannot make it smaller
    return InfeasiblePlanError(
        f"no partition fits in memory: even the closest one puts stage {s} ("
        f"{f'layer {b[s]}' if one else f'layers {b[s]}-{b[s + 1] - 1}'}) at "
        f"{need / GIB:.2f} GiB, {excess[s] / GIB:.2f} GiB more than the {limit / GIB:.2f} GiB available; "
        f"{'' if one else 'add pipeline stages, '}{_recompute_hint(problem)}{_schedule_hint(problem)}"
        f"{_shard_hint(problem)} or shorten the sequence "
        f"{SEARCH_POINTER}"
    )


def _recompute_hint(problem: PartitionProblem) -> str:
    """The recomputation advice of a memory refusal: only what goes beyond the recomputation already planned."""
    if problem.recompute == "full":
        return ""
    if problem.recompute == "none":
        return "recompute activations (--recompute selective|full), "
    return "recompute more (--recompute full), "


#: schedule -> the schedule of the same pipeline that keeps fewer micro-batches in flight on the first rank
#: (:func:`tessera_lab.plan.vschedules.plan_in_flight`: the EP-overlap schedules pair a forward with a backward, so
#: they hold about twice 1F1B's; ZB-H2 holds more than ZB-H1)
FEWER_IN_FLIGHT = {"overlapped": "1f1b", "interleaved-overlapped": "interleaved", "zb-h2": "zb-h1"}
#: the schedule advice of a memory refusal (:func:`_schedule_hint`)
SCHEDULE_HINT = "keep fewer micro-batches in flight (--schedule {schedule}), "


def _schedule_hint(problem: PartitionProblem) -> str:
    """The schedule advice of a memory refusal: the schedule that keeps fewer micro-batches in flight, if any."""
    other = FEWER_IN_FLIGHT.get(problem.schedule or "")
    return SCHEDULE_HINT.format(schedule=other) if other else ""


def without_advice(text: str) -> str:
    """A memory refusal of :func:`infeasible_error` without its advice: the finding before the first ``"; "``
    (which stage needs how much against the GiB available), for a caller whose own advice replaces it."""
    return text.split("; ", 1)[0]


def without_schedule_hint(text: str) -> str:
    """A memory refusal's advice without its schedule advice (:data:`SCHEDULE_HINT`), for a refusal that tried every
    schedule."""
    return re.sub(re.escape(SCHEDULE_HINT).replace(re.escape("{schedule}"), r"[\w-]+"), "", text)


def _shard_hint(problem: PartitionProblem) -> str:
    """The sharding advice of a memory refusal: ep only for a model with routed experts."""
    if problem.has_experts:
        return "shard further (ep for experts, dp with a distributed optimizer)"
    return "shard further (tp, dp with a distributed optimizer)"


def uniform(problem: PartitionProblem) -> Partition:
    """The uniform baseline (layer counts as even as possible), evaluated on the problem's costs."""
    return score_boundaries(problem, uniform_boundaries(problem.num_layers, problem.num_stages), "uniform")


