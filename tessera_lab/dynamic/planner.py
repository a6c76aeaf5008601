"""One EP group's decision: the order that fills predicted idle gaps with deferrable weight-gradient work.

:func:`plan_dynamic` takes a static schedule and *predicted* durations (from routing metadata known at decision
time, :mod:`tessera_lab.dynamic.predict`), splits every backward into I and W (also inside overlapped ``(F;B)``
pairs and DualPipeV, :func:`tessera_lab.pipeline.passes.split_backward`), cuts each W into ``w_chunks`` parts and
simulates three candidates on the prediction:

* ``static``: the given order, whole W tasks, gradient reduce-scatter after the rank's last action;
* ``fill``: W parts pulled back into predicted gaps (:func:`tessera_lab.pipeline.passes.fill_gaps`);
* ``defer+fill``: every W first deferred as late as the memory cap allows, then pulled back into gaps.

In the dynamic candidates each stage's gradient reduce-scatter starts once that stage's last W has run
(:func:`grad_sync_tasks`). The fastest candidate on the prediction wins; the static order wins ties and any
candidate over the memory cap is discarded. :func:`check_dependencies` verifies that W never runs before its I.
Times are float seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tessera_lab.dynamic.durations import ChunkedDurations, PairDurations
from tessera_lab.errors import ConfigError
from tessera_lab.pipeline import passes
from tessera_lab.pipeline.schedules import ActionType, Schedule, parse_action
from tessera_lab.pipeline.simulate import Timeline, simulate

__all__ = ["predict_gaps", "peak_live_activations", "grad_sync_tasks", "DynamicPlan", "plan_dynamic",
           "check_dependencies"]

_W, _B = ActionType.W, ActionType.B


def predict_gaps(schedule: Schedule, durations, *, min_length: float = 0.0, **sim: Any) -> tuple[Timeline, dict[int, list[passes.Gap]]]:
    """Simulate ``schedule`` with ``durations`` (from the routing metadata known before the step) and return
    ``(timeline, gaps per rank)``. Extra keywords go to :func:`~tessera_lab.simulate.simulate`."""
    tl = simulate(schedule, durations, **sim)
    return tl, passes.idle_gaps(tl, min_length=min_length)


def peak_live_activations(timeline: Timeline, w_chunks: int = 1) -> list[int]:
    """Per rank, the most micro-batches whose forward has started and whose backward is not complete
    (B ended, or the last of its ``w_chunks`` W parts ended); frees count first at equal times. Equals the
    simulator's ``peak_activations`` for unchunked schedules."""
    R = timeline.num_ranks or (1 + max((e.rank for e in timeline.events), default=-1))
    deltas: list[list[tuple[float, int]]] = [[] for _ in range(R)]
    w_end: dict[tuple[int, int, int], list[float]] = {}
    for e in timeline.events:
        if e.lane != "compute":
            continue
        if e.type == "OVERLAP_F_B":
            deltas[e.rank].append((e.start, 1))
            deltas[e.rank].append((e.end, -1))
        elif e.type == "F":
            deltas[e.rank].append((e.start, 1))
        elif e.type == "B":
            deltas[e.rank].append((e.end, -1))
        elif e.type == "W":
            w_end.setdefault((e.rank, e.stage, e.microbatch), []).append(e.end)
    for (r, _, _), ends in w_end.items():
        ends.sort()
        for k in range(w_chunks - 1, len(ends), w_chunks):
            deltas[r].append((ends[k], -1))
    peaks = []
    for r in range(R):
        live = peak = 0
        for _, d in sorted(deltas[r]):
            live += d
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def grad_sync_tasks(schedule: Schedule, seconds: Sequence[float] | None, *, placement: str = "static") -> list[tuple]:
    """Gradient reduce-scatter per stage as communication-lane tasks for :func:`simulate` (``comm=``).

    ``placement="static"``: after the rank's last action (the static plan). ``"dynamic"``: after the stage's
    last W (or B) in the rank's order, so one model chunk's reduce-scatter overlaps the rank's remaining
    compute. Zero-second tasks are left out.

    Raises:
        ConfigError: an unknown placement, or one entry per stage missing.
    """
    if not seconds:
        return []
    if placement not in ("static", "dynamic"):
        raise ConfigError(f"field 'placement' = {placement!r}; allowed: static, dynamic")
    if len(seconds) != schedule.num_stages:
        raise ConfigError(f"field 'grad_sync' has {len(seconds)} entries; allowed: one per stage ({schedule.num_stages})")
    tasks = []
    for s in range(schedule.num_stages):
        sec = float(seconds[s])
        if sec <= 0:
            continue
        r = schedule.stage_to_rank[s]
        acts = [a for a in schedule.actions.get(r, []) if a.is_compute]
        if not acts:
            continue
        if placement == "static":
            after = acts[-1]
        else:
            last = [a for a in acts if a.type in (_W, _B) and a.stage == s]
            after = last[-1] if last else acts[-1]
        tasks.append((r, passes.GRAD_RS, sec, after))
    return tasks


@dataclass
class DynamicPlan:
    """One EP group's decision (all on *predicted* durations).

    Attributes:
        static: the static order (backward split into I and W).
        schedule: the chosen order (``static`` itself when nothing beats it; W actions repeated
            ``w_chunks`` times otherwise).
        choice: ``static``, ``fill`` or ``defer+fill``.
        candidates: candidate -> predicted iteration time (seconds); ``None`` for a discarded candidate.
        static_comm, comm: gradient reduce-scatter tasks of the static and the chosen plan.
        memory_cap: live micro-batch activations allowed per rank.
        predicted_static, predicted: simulated timelines of both on the prediction.
        moves: W-part moves made by the chosen candidate's filling.
        w_chunks: parts each W is split into in the chosen order (1 for ``static``).
    """

    static: Schedule
    schedule: Schedule
    choice: str
    candidates: dict[str, float | None]
    static_comm: list
    comm: list
    memory_cap: list[int]
    predicted_static: Timeline
    predicted: Timeline
    moves: int = 0
    w_chunks: int = 1
    sim: dict = field(default_factory=dict)

    @property
    def predicted_gain(self) -> float:
        """Predicted throughput gain ``static / dynamic - 1``."""
        T = self.predicted.iteration_time
        return self.predicted_static.iteration_time / T - 1.0 if T else 0.0

    def realise(self, durations) -> tuple[Timeline, Timeline]:
        """Simulate the static and the chosen order with the durations that actually happen."""
        durations = PairDurations(durations, self.static)
        st = simulate(self.static, durations, comm=self.static_comm, **self.sim)
        dur = ChunkedDurations(durations, self.w_chunks) if self.w_chunks > 1 else durations
        dy = _simulate_chunked(self.schedule, dur, self.comm, self.w_chunks, self.sim)
        return st, dy


def _simulate_chunked(schedule: Schedule, durations, comm: list, chunks: int, sim: dict) -> Timeline:
    tl = simulate(schedule, durations, comm=comm, **sim)
    if chunks > 1:
        tl.peak_activations = peak_live_activations(tl, chunks)
    return tl


def plan_dynamic(
    schedule: Schedule,
    predicted,
    *,
    grad_sync: Sequence[float] | None = None,
    memory_cap: int | Sequence[int] | str | None = "max",
    activation_bytes: Sequence[float] | None = None,
    w_chunks: int = 4,
    p2p_latency: float = 0.0,
    p2p_time: float | Callable[[int, int], float] | None = None,
    max_passes: int = 64,
) -> DynamicPlan:
    """Decide one EP group's order from its predicted durations (see the module docstring, part (c)).

    Args:
        schedule: the static schedule (B actions are split into I and W).
        predicted: durations from the routing metadata known before the step.
        grad_sync: gradient reduce-scatter seconds per stage (``None``: none).
        memory_cap: live micro-batches per rank: ``"max"`` (default), ``"rank"``, an int or one per rank
            (:func:`memory_caps`, measured on the static order).
        activation_bytes: activation bytes per micro-batch of each stage (for ``"max"``).
        w_chunks: parts each W is split into for filling (e.g. one per layer of the stage); 1 = whole.
        p2p_latency, p2p_time: as :func:`~tessera_lab.simulate.simulate`.
        max_passes: fill passes per candidate.

    Returns:
        :class:`DynamicPlan`; its predicted iteration time is never above the static one.

    Raises:
        ScheduleError: a schedule the passes cannot split.
        ConfigError: a bad memory cap, ``w_chunks`` or grad_sync list.
    """
    sim = {"p2p_latency": p2p_latency, "p2p_time": p2p_time}
    base = passes.split_backward(schedule, w_lag=0)
    predicted = PairDurations(predicted, base)
    caps = passes.memory_caps(base, memory_cap, activation_bytes=activation_bytes)
    chunked = passes.chunk_weight_gradients(base, w_chunks)
    pdur = ChunkedDurations(predicted, w_chunks) if w_chunks > 1 else predicted
    static_comm = grad_sync_tasks(base, grad_sync, placement="static")
    static_tl = simulate(base, predicted, comm=static_comm, **sim)
    best = ("static", base, static_comm, static_tl, 0)
    cands: dict[str, float | None] = {"static": static_tl.iteration_time}
    starts = [("fill", chunked), ("defer+fill", passes.defer_weight_gradients(chunked, caps, w_chunks=w_chunks))]
    for name, start in starts:
        if start is None:
            cands[name] = None
            continue
        filled, _, moves = passes.fill_gaps(start, pdur, max_passes=max_passes, **sim)
        comm = grad_sync_tasks(filled, grad_sync, placement="dynamic")
        tl = _simulate_chunked(filled, pdur, comm, w_chunks, sim)
        if any(p > c for p, c in zip(tl.peak_activations, caps)):
            cands[name] = None
            continue
        cands[name] = tl.iteration_time
        if tl.iteration_time < best[3].iteration_time * (1 - 1e-12):
            best = (name, filled, comm, tl, moves)
    name, sched, comm, tl, moves = best
    return DynamicPlan(base, sched, name, cands, static_comm, comm, caps, static_tl, tl, moves,
                       1 if name == "static" else w_chunks, sim)


def check_dependencies(timeline: Timeline, tol: float = 1e-12) -> list[str]:
    """Dependency violations in a timeline (empty list = none).

    Checks: every W starts after its I (same stage and micro-batch; also inside an overlapped pair) has ended; every gradient
    reduce-scatter of a stage starts after that stage's last W (or B) has ended.
    """
    i_end: dict[tuple[int, int], float] = {}
    last_w: dict[int, float] = {}
    for e in timeline.events:
        if e.lane != "compute":
            continue
        if e.type == "OVERLAP_F_B":  # a pair runs the I (or B) of its backward
            for x in parse_action(e.label).leaves():
                if x.type in (ActionType.I, ActionType.B):
                    i_end[(x.stage, x.microbatch)] = e.end
        if e.type in ("I", "B"):
            i_end[(e.stage, e.microbatch)] = e.end
        if e.type in ("W", "B"):
            last_w[e.stage] = max(last_w.get(e.stage, 0.0), e.end)
    bad = []
    for e in timeline.events:
        if e.lane == "compute" and e.type == "W":
            end = i_end.get((e.stage, e.microbatch))
            if end is None:
                bad.append(f"{e.label} has no I")
            elif e.start < end - tol:
                bad.append(f"{e.label} starts at {e.start:.6g} s before its I ends at {end:.6g} s")
        if e.lane == "comm" and e.type == passes.GRAD_RS and e.stage >= 0:
            lw = last_w.get(e.stage, 0.0)
            if e.start < lw - tol:
                bad.append(f"{passes.GRAD_RS} of stage {e.stage} starts at {e.start:.6g} s before its last W ends at {lw:.6g} s")
    return bad
