"""The pipeline executed step by step with a :class:`~tessera_lab.dynamic.controller.GapController` per EP group.

:func:`execute` is a discrete-event executor of one step of a split schedule (I and W actions; every W cut into
``w_chunks`` parts): ranks run their non-W actions in the schedule's order; a forward needs the previous stage's
forward (plus the p2p time between ranks), an I or B its own forward and the next stage's input gradient, a W its
I; an overlapped pair needs both halves' inputs. Without a controller it runs the list exactly as given (the
static plan: it agrees with :func:`tessera_lab.pipeline.simulate.simulate`, which the tests check). With one:

* a W part whose I has run is *pending*; at a static W place the oldest pending part of that stage runs (so W
  passes stay in micro-batch order per stage and gradients accumulate in the same order), unless the controller
  defers it (:meth:`~tessera_lab.dynamic.controller.GapController.at_w_place`);
* when the next action's input has not arrived, the controller may run a pending part in the wait
  (:meth:`~tessera_lab.dynamic.controller.GapController.in_wait`); the rank learns that the input arrived only at
  a part's end (no pre-emption), so a wrong prediction can delay the action;
* before a forward that would exceed the rank's memory cap (live micro-batch activations), pending parts run
  (:meth:`~tessera_lab.dynamic.controller.GapController.must_free`); the rest run after the rank's last action.

Each stage's gradient reduce-scatter (``grad_sync`` seconds) runs on the rank's communication lane after the
stage's last W part (dynamic) or after the rank's last action (static). :func:`run_online` runs ``steps``
consecutive steps of routing (each step's waits feed the next step's prediction) for static and dynamic and
splits the gain into a *static part* (the same run under uniform routing) and a *dynamic part* (the extra under
the routing given). Times are float seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from tessera_lab.dynamic.controller import GapController, parse_predictor
from tessera_lab.dynamic.durations import PairDurations, RoutedDurations, StageCosts, slowest_loads
from tessera_lab.dynamic.evaluate import DynamicJob, routing_counts, schedule_for
from tessera_lab.dynamic.planner import grad_sync_tasks
from tessera_lab.dynamic.routing import parse_routing
from tessera_lab.errors import ConfigError
from tessera_lab.pipeline import passes
from tessera_lab.pipeline.engine import ACTIVATION_CHANGE, Walk, action_inputs, action_outputs, serial_lanes
from tessera_lab.pipeline.schedules import Action, ActionType, Schedule
from tessera_lab.pipeline.simulate import Event, Timeline, _transfer_fn, simulate

__all__ = ["StepRecord", "execute", "OnlineResult", "run_online", "has_whole_backward"]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W


@dataclass
class StepRecord:
    """What one rank saw in one step: the wait at each slot (non-W action index), its tail, and predictions."""

    waits: dict[int, float] = field(default_factory=dict)
    predicted: dict[int, float] = field(default_factory=dict)
    tail: float = 0.0
    last_compute_end: float = 0.0


def _needs(a: Action, S: int) -> list[tuple[str, int, int, int]]:
    """Inputs of a compute action's non-W leaves (the engine's rule): (kind, producing stage, micro-batch,
    consumer stage)."""
    return action_inputs(a, S, weight=False)


def execute(schedule: Schedule, durations, *, w_chunks: int = 1, controllers: Sequence[GapController] | None = None,
            memory_cap: Sequence[int] | None = None, grad_sync: Sequence[float] | None = None,
            p2p_latency: float = 0.0) -> tuple[Timeline, list[StepRecord]]:
    """Execute one step of ``schedule`` (split: no B inside pairs needed, W repeated ``w_chunks`` times).

    Args:
        schedule: per-rank action lists (compute only).
        durations: ``durations(stage, microbatch, type) -> seconds`` (the durations that happen); a W part
            takes ``W / w_chunks``.
        w_chunks: parts per W in ``schedule``.
        controllers: one per rank, or ``None`` for the static plan (the list as given).
        memory_cap: live micro-batches per rank (with controllers).
        grad_sync: reduce-scatter seconds per stage (``None``: none).
        p2p_latency: seconds per cross-rank transfer.

    Returns:
        ``(timeline, records)``: the timeline (no critical path) and one :class:`StepRecord` per rank.

    Raises:
        ConfigError: a wrong number of controllers or caps; ScheduleError: the schedule deadlocks.
    """
    R = schedule.num_ranks
    if controllers is not None and len(controllers) != R:
        raise ConfigError(f"field 'controllers' has {len(controllers)} entries; allowed: one per rank ({R})")
    caps = list(memory_cap) if memory_cap is not None else [math.inf] * R
    if len(caps) != R:
        raise ConfigError(f"field 'memory_cap' has {len(caps)} entries; allowed: one per rank ({R})")
    run = _StepRun(schedule, durations, w_chunks, controllers, caps, _transfer_fn(p2p_latency, None))
    run.walk.run(run.step)  # the engine: rank clocks, inputs produced, parked ranks, agenda; run.step its hook
    Walk.check_finished(schedule.name, run.lists, run.pc)
    if grad_sync:
        run.grad_sync(grad_sync)
    return run.timeline(), run.records


class _StepRun:
    """The state of one :func:`execute` and its phases, as the engine's policy hook (:meth:`step`) runs them: a
    static W place (:meth:`w_place`), the memory cap before a forward (:meth:`free_memory`), a wait for a missing
    input (:meth:`wait`), the action itself (:meth:`run_slot`), and after the walk the gradient reduce-scatter
    (:meth:`grad_sync`) and the timeline (:meth:`timeline`). Seconds throughout."""

    def __init__(self, schedule: Schedule, durations, w_chunks: int, controllers, caps: list, xfer):
        R = schedule.num_ranks
        self.schedule, self.durations, self.w_chunks, self.controllers, self.caps = (
            schedule, durations, w_chunks, controllers, caps)
        self.S, self.s2r, self.xfer = schedule.num_stages, schedule.stage_to_rank, xfer
        self.pair_d = PairDurations(durations, schedule)
        self.lists = [list(schedule.actions.get(r, [])) for r in range(R)]
        self.slots = [[k for k, a in enumerate(acts) if a.type is not _W] for acts in self.lists]
        self._static_places()
        self.records = [StepRecord() for _ in range(R)]
        if controllers is not None:
            for r in range(R):
                controllers[r].begin_step(self.slots[r])
                self.records[r].predicted = dict(controllers[r].predicted)
        self.walk = Walk(R)
        self.arrival, self.t_rank = self.walk.arrival, self.walk.clock  # keys: (kind, src stage, mb, dst stage)
        self.events: list[Event] = []
        self.busy = [0.0] * R
        self.pc = [0] * R
        self.pos = [0] * R  # non-W actions run so far
        self.wait_from: list[float | None] = [None] * R
        self.pending: list[dict[int, list[int]]] = [dict() for _ in range(R)]  # stage -> [mb per pending chunk]
        self.pend_s = [0.0] * R  # seconds of pending W parts
        self.displaced_s = [0.0] * R  # of which past their static place (deferred)
        self.tail_static = [0.0] * R  # W seconds the static order itself puts after the last non-W action
        self.w_run: list[dict[int, int]] = [dict() for _ in range(R)]  # stage -> W parts run
        self.w_seen: list[dict[int, int]] = [dict() for _ in range(R)]  # stage -> static W places passed
        self.left: list[dict[tuple[int, int], int]] = [dict() for _ in range(R)]
        self.live = [0] * R
        self.peak = [0] * R
        self.last_w_end: dict[int, float] = {}

    def _static_places(self) -> None:
        """Per rank and stage, the list index of each static W place, and the first non-W slot after each index."""
        self.w_places = [dict() for _ in self.lists]
        self.next_slot: list[list[int]] = []
        for r, acts in enumerate(self.lists):
            for k, a in enumerate(acts):
                if a.type is _W:
                    self.w_places[r].setdefault(a.stage, []).append(k)
            nxt, out = -1, [0] * len(acts)
            for k in range(len(acts) - 1, -1, -1):
                out[k] = nxt
                if acts[k].type is not _W:
                    nxt = k
            self.next_slot.append(out)

    # ---- W parts ------------------------------------------------------------------------------------------------
    def chunk_s(self, s: int, i: int) -> float:
        return self.durations(s, i, _W) / self.w_chunks

    def run_chunk(self, r: int, s: int) -> None:
        """Run the oldest pending W part of stage ``s`` on rank ``r`` at its clock."""
        i = self.pending[r][s].pop(0)
        d = self.chunk_s(s, i)
        if self.w_run[r].get(s, 0) < self.w_seen[r].get(s, 0):
            self.displaced_s[r] = max(0.0, self.displaced_s[r] - d)
        elif self.pos[r] == len(self.slots[r]):
            self.tail_static[r] += d  # placed after the rank's last non-W action by the static order
        t0 = self.t_rank[r]
        self.events.append(Event(r, s, i, "W", t0, t0 + d, "compute", f"{s}W{i}"))
        self.t_rank[r] = t0 + d
        self.busy[r] += d
        self.pend_s[r] -= d
        self.w_run[r][s] = self.w_run[r].get(s, 0) + 1
        self.last_w_end[s] = t0 + d
        n = self.left[r].get((s, i), self.w_chunks) - 1
        self.left[r][(s, i)] = n
        if n == 0:  # the last part ends the W: the engine's memory rule
            self.live[r] += ACTIVATION_CHANGE[_W]

    def oldest_stage(self, r: int) -> int | None:
        pending, best = self.pending[r], None
        for s, q in pending.items():
            if q and (best is None or q[0] < pending[best][0]):
                best = s
        return best

    def displaced_stage(self, r: int) -> int | None:
        pending, best = self.pending[r], None
        for s, q in pending.items():
            if q and self.w_run[r].get(s, 0) < self.w_seen[r].get(s, 0) and (best is None or q[0] < pending[best][0]):
                best = s
        return best

    # ---- non-W actions ------------------------------------------------------------------------------------------
    def run_action(self, r: int, a: Action, start: float) -> None:
        """Run ``a`` from ``start``: its event, then its outputs produced for their consumers (the engine's
        :meth:`Walk.produce`), activations taken and freed, and its W parts pending."""
        if a.sub_actions:
            bwd = next((x for x in a.sub_actions if x.type is not _F), a.sub_actions[-1])
            d, st, mb, typ = self.pair_d(bwd.stage, bwd.microbatch, a.type), bwd.stage, bwd.microbatch, a.type.value
        else:
            d, st, mb, typ = self.durations(a.stage, a.microbatch, a.type), a.stage, a.microbatch, a.type.value
        end = start + d
        label = str(a) if a.sub_actions else f"{a.stage}{typ}{a.microbatch}"
        self.events.append(Event(r, st, mb, typ, start, end, "compute", label))
        self.busy[r] += d
        self.t_rank[r] = end
        for x in a.leaves():
            self._leaf_done(r, x, end)
        self.peak[r] = max(self.peak[r], self.live[r])

    def _leaf_done(self, r: int, x: Action, end: float) -> None:
        produce, s2r = self.walk.produce, self.s2r
        taken = ACTIVATION_CHANGE[x.type]  # the engine's memory rule: a forward takes, a whole backward frees
        if taken > 0:
            self.live[r] += taken
            self.peak[r] = max(self.peak[r], self.live[r])
        # the engine's data-flow rule (W parts are this module's own, so no key for them): a cross-rank transfer
        # arrives xfer(src, dst) after the producer ends, a same-rank one at once
        for key in action_outputs(x, self.S, weight=False):
            dst = key[3]
            produce(key, end + self.xfer(x.stage, dst) if s2r[dst] != r else end)
        if taken < 0:
            self.live[r] += taken
        if x.type is _B:
            self.last_w_end[x.stage] = end
        elif x.type is _I:
            self.pending[r].setdefault(x.stage, []).extend([x.microbatch] * self.w_chunks)
            self.pend_s[r] += self.chunk_s(x.stage, x.microbatch) * self.w_chunks

    def ready_next(self, r: int) -> bool:
        """Whether the rank's next non-W action has all its inputs now (deferring W only pays then)."""
        k = self.next_slot[r][self.pc[r]]  # the first non-W action after the rank's position (-1: none)
        if k < 0:
            return False
        now, arrival = self.t_rank[r], self.arrival
        return all(key in arrival and arrival[key] <= now for key in _needs(self.lists[r][k], self.S))

    # ---- the policy hook and its phases -------------------------------------------------------------------------
    def step(self, r: int) -> bool:
        """The policy hook, called by the engine (:meth:`Walk.run`) while rank ``r`` is due: decide its next action
        at its clock; ``True``: the rank goes on at once (a static W place was passed)."""
        acts = self.lists[r]
        ctl = self.controllers[r] if self.controllers is not None else None
        if self.pc[r] >= len(acts):
            for s in iter(lambda: self.oldest_stage(r), None):  # after the last action: what is still pending
                self.run_chunk(r, s)
            return False
        a = acts[self.pc[r]]
        if a.type is _W:
            self.w_place(r, a, ctl)
            return True
        if ctl is not None and any(x.type is _F for x in a.leaves()):
            self.free_memory(r, a, ctl)
        if self.wait(r, a, ctl):
            return False
        self.run_slot(r, a)
        return False

    def w_place(self, r: int, a: Action, ctl) -> None:
        """A static W place: run the part here, or (the controller deciding) defer it."""
        s = a.stage
        self.w_seen[r][s] = self.w_seen[r].get(s, 0) + 1
        if ctl is None:
            self.pending[r].setdefault(s, [])
            self.run_chunk(r, s)
        elif self.w_run[r].get(s, 0) < self.w_seen[r][s]:  # not covered by a part run earlier
            d = self.chunk_s(s, self.pending[r][s][self.w_seen[r][s] - 1 - self.w_run[r].get(s, 0)])
            if ctl.at_w_place(self.pos[r], self.displaced_s[r], d, next_ready=self.ready_next(r), live=self.live[r],
                              cap=self.caps[r]):
                self.displaced_s[r] += d
            else:
                self.run_chunk(r, s)  # runs where the static order has it
        self.pc[r] += 1

    def free_memory(self, r: int, a: Action, ctl) -> None:
        """Before a forward that would exceed the memory cap, pending parts run."""
        need = sum(1 for x in a.leaves() if x.type is _F)
        while ctl.must_free(self.live[r], need, self.caps[r]):
            s = self.oldest_stage(r)
            if s is None:
                break
            self.run_chunk(r, s)

    def wait(self, r: int, a: Action, ctl) -> bool:
        """When an input of ``a`` is not there at the rank's clock: the controller may fill the wait with a pending
        part (the rank is then due again), else the rank parks on the missing input or waits for the latest
        arrival. ``True``: the rank yielded (it decides again later)."""
        needs = _needs(a, self.S)
        arrival = self.arrival
        missing = [key for key in needs if key not in arrival]
        now = self.t_rank[r]
        arrive = max((arrival[key] for key in needs if key in arrival), default=0.0)
        if not missing and arrive <= now:
            return False
        if self.wait_from[r] is None:
            self.wait_from[r] = now
        if ctl is not None:
            s = self._fill(r, ctl, now)
            if s is not None:
                self.run_chunk(r, s)
                self.walk.resume(r)
                return True
        if missing:
            self.walk.park(r, missing[0])
            return True
        self.t_rank[r] = arrive
        return False

    def _fill(self, r: int, ctl, now: float) -> int | None:
        """The controller's choice of a pending part's stage to run in the wait (``None``: none)."""
        sd, so = self.displaced_stage(r), self.oldest_stage(r)
        later = None
        if so is not None:  # the slot after the oldest pending part's own static place
            n_run = self.w_run[r].get(so, 0)
            places = self.w_places[r].get(so, [])
            later = self.next_slot[r][places[n_run]] if n_run < len(places) else -1
        pending = self.pending[r]
        return ctl.in_wait(self.pc[r], now - self.wait_from[r],
                           None if sd is None else (sd, self.chunk_s(sd, pending[sd][0])),
                           None if so is None else (so, self.chunk_s(so, pending[so][0])), later_slot=later)

    def run_slot(self, r: int, a: Action) -> None:
        """Run the non-W action ``a`` at the rank's clock and record its wait; the rank then yields, to keep global
        time order (others may act before its next decision)."""
        start = self.t_rank[r]
        rec = self.records[r]
        if self.wait_from[r] is not None:
            rec.waits[self.pc[r]] = start - self.wait_from[r]
            self.wait_from[r] = None
        else:
            rec.waits[self.pc[r]] = 0.0
        self.run_action(r, a, start)
        rec.last_compute_end = self.t_rank[r]
        self.pos[r] += 1
        self.pc[r] += 1
        self.walk.resume(r)

    # ---- after the walk -----------------------------------------------------------------------------------------
    def grad_sync(self, grad_sync: Sequence[float]) -> None:
        """Each stage's gradient reduce-scatter on its rank's comm lane, in the order the stages become final: after
        the stage's last W part (dynamic) or the rank's last action (static)."""
        R, events, s2r = self.schedule.num_ranks, self.events, self.s2r
        rank_end = [max((e.end for e in events if e.rank == r and e.lane == "compute"), default=0.0) for r in range(R)]
        tasks = []  # (ready time, stage, rank, seconds): the engine's communication-lane rule lays them out
        for s in range(self.S):
            if float(grad_sync[s]) > 0:
                r = s2r[s]
                after = rank_end[r] if self.controllers is None else self.last_w_end.get(s, rank_end[r])
                tasks.append((after, s, r, float(grad_sync[s])))
        for st, end, (_, s, r, _) in serial_lanes(tasks, R):
            events.append(Event(r, s, None, passes.GRAD_RS, st, end, "comm", f"{passes.GRAD_RS}[{s}]"))

    def timeline(self) -> Timeline:
        """The step's timeline (no critical path); each record's tail: idle after the rank's last non-W action that
        the static order does not already fill."""
        R, events, busy = self.schedule.num_ranks, self.events, self.busy
        T = max((e.end for e in events), default=0.0)
        for r in range(R):
            self.records[r].tail = T - self.records[r].last_compute_end - self.tail_static[r]
        idle = [T - b for b in busy]
        tot_busy = sum(busy)
        return Timeline(events, T, busy, idle, sum(idle) / (T * R) if T > 0 else 0.0,
                        sum(idle) / tot_busy if tot_busy > 0 else 0.0, {}, [], self.peak, self.schedule.name, R)


@dataclass
class OnlineResult:
    """Static vs dynamic over consecutive steps of one routing (times in seconds).

    Attributes:
        routing, schedule, predictor, margin: what ran and how the controller predicted.
        steps: per step, ``{"step", "static_s", "dynamic_s", "gain", "gap_mae_s", "gap_rel_error"}``
            (iteration = slowest EP group; gap errors over the slots of every rank of every group).
        warmup: leading steps left out of the means (the controller has no history in step 0).
        idle_static_s, idle_dynamic_s: mean idle seconds per rank over the evaluated steps.
        decisions: W parts filled into waits, deferred and forced by the memory cap, summed.
        memory_cap: live micro-batches allowed per rank.
        timelines: the last step's ``{"static": Timeline, "dynamic": Timeline}`` of group 0.
        busiest_rank_load_mean: mean busiest-EP-rank load over layers, micro-batches, steps and groups.
        idle_as_built_s: mean idle seconds per rank of the schedule as built (whole B), ``None`` when the static
            plan is the schedule as built (no whole B to split); see :attr:`iteration_as_built_s`.

    The static plan is the schedule with every whole B split into I then W at once
    (:func:`tessera_lab.pipeline.passes.split_backward` with lag 0): the controller's base. For 1F1B that alone
    shortens the iteration, the gradient going upstream after I instead of B: ``(m + p - 1)(F + B)`` as built,
    ``m(F + B) + (p - 1)(F + I)`` split (uniform stages).
    """

    routing: str
    schedule: str
    predictor: str
    margin: float
    steps: list[dict[str, Any]]
    warmup: int
    idle_static_s: float
    idle_dynamic_s: float
    decisions: dict[str, int]
    memory_cap: list[int]
    w_chunks: int
    groups: int
    timelines: dict[str, Timeline] = field(default_factory=dict)
    busiest_rank_load_mean: float = 1.0
    idle_as_built_s: float | None = None

    #: what the static plan is: the schedule with each whole B split into I and W, W at once after its I
    STATIC_PLAN = "each whole B split into I (input gradient, sent upstream at once) then W right after it"

    @property
    def iteration_as_built_s(self) -> float | None:
        """Mean iteration of the schedule as built (whole B, as ``simulate`` without ``--dynamic`` runs it) over
        the evaluated steps, same routing and gradient sync; ``None`` when it has no whole B (then it is the
        static plan itself)."""
        vals = [s["as_built_s"] for s in self.evaluated if "as_built_s" in s]
        return float(np.mean(vals)) if vals else None

    @property
    def evaluated(self) -> list[dict[str, Any]]:
        return self.steps[self.warmup:]

    @property
    def iteration_static_s(self) -> float:
        return float(np.mean([s["static_s"] for s in self.evaluated]))

    @property
    def iteration_dynamic_s(self) -> float:
        return float(np.mean([s["dynamic_s"] for s in self.evaluated]))

    @property
    def throughput_gain(self) -> float:
        """``sum(static) / sum(dynamic) - 1`` over the evaluated steps (tokens per step unchanged)."""
        return self.iteration_static_s / self.iteration_dynamic_s - 1.0 if self.iteration_dynamic_s > 0 else 0.0

    @property
    def never_slower(self) -> bool:
        """Every evaluated step at or below its static time on the realised routing."""
        return all(s["dynamic_s"] <= s["static_s"] * (1 + 1e-12) for s in self.evaluated)

    def summary(self) -> dict[str, Any]:
        ev = self.evaluated
        return {
            "routing": self.routing, "schedule": self.schedule, "predictor": self.predictor,
            "prediction_lag_steps": 1, "margin": self.margin, "steps": len(self.steps), "warmup_steps": self.warmup,
            "groups": self.groups, "w_chunks": self.w_chunks, "memory_cap": self.memory_cap,
            "busiest_rank_load_mean": self.busiest_rank_load_mean,
            "static_plan": self.STATIC_PLAN, "iteration_as_built_s": self.iteration_as_built_s,
            "idle_as_built_s": self.idle_as_built_s,
            "iteration_static_s": self.iteration_static_s, "iteration_dynamic_s": self.iteration_dynamic_s,
            "throughput_gain": self.throughput_gain,
            "idle_static_s": self.idle_static_s, "idle_dynamic_s": self.idle_dynamic_s,
            "idle_removed_s": self.idle_static_s - self.idle_dynamic_s,
            "never_slower": self.never_slower,
            "slower_steps": [s["step"] for s in ev if s["dynamic_s"] > s["static_s"] * (1 + 1e-12)],
            "gap_mae_s": float(np.mean([s["gap_mae_s"] for s in ev])) if ev else 0.0,
            "gap_rel_error": float(np.mean([s["gap_rel_error"] for s in ev])) if ev else 0.0,
            "decisions": dict(self.decisions),
            "per_step": [dict(s) for s in self.steps],
        }


def _gap_errors(records: list[StepRecord]) -> tuple[float, float]:
    """Mean absolute error of predicted waits (seconds, over slots where either side is > 0) and the sum of
    absolute errors over the sum of realised waits."""
    err, tot, n = 0.0, 0.0, 0
    for rec in records:
        for k, w in rec.waits.items():
            p = rec.predicted.get(k, 0.0)
            if w > 0 or p > 0:
                err += abs(p - w)
                tot += w
                n += 1
    return (err / n if n else 0.0), (err / tot if tot > 0 else 0.0)


def run_online(
    costs: StageCosts,
    routing: str = "zipf:1.0",
    *,
    steps: int = 4,
    first_step: int = 0,
    warmup: int = 1,
    predictor: str = "last-step",
    margin: float = 0.5,
    progress: Callable[[int, int], None] | None = None,
    **job: Any,
) -> OnlineResult:
    """Run ``steps`` consecutive steps static and dynamic; the controllers carry their history across steps.

    Args:
        costs: stage times; routing: ``uniform | zipf:S | drift:S[:R] | walk:S[:R] | replay:PATH``.
        steps, first_step, warmup: steps run, index of the first (drift and walk move with it), leading steps
            left out of the means.
        predictor, margin: :class:`~tessera_lab.dynamic.controller.GapController` settings.
        job: the fields of :class:`~tessera_lab.dynamic.evaluate.DynamicJob`: the schedule (any name, or a
            :class:`Schedule`; backwards are split into I and W by
            :func:`tessera_lab.pipeline.passes.split_backward`, also inside overlapped pairs and DualPipeV),
            microbatches, vpp, groups, seed, capacity_factor, memory_cap (a
            :func:`tessera_lab.pipeline.passes.memory_caps` policy on the static order), p2p_latency, jitter and
            w_chunks (parts per W; default: the stage's MoE layers).
        progress: called as ``progress(done, steps)`` after each step (the CLI's progress line).

    Raises:
        ConfigError: bad sizes, routing, predictor or margin.
    """
    spec, pred, j = parse_routing(routing), parse_predictor(predictor), DynamicJob(**job)
    for name, v, lo in (("groups", j.groups, 1), ("warmup", warmup, 0), ("first_step", first_step, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ConfigError(f"field '{name}' = {v!r} is out of range; allowed: an integer >= {lo}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= warmup:
        raise ConfigError(f"field 'steps' = {steps!r} is out of range; allowed: an integer >= {warmup + 1} (the "
                          f"first {warmup} step(s) are warm-up, left out of the means: step 0 has no history)")
    run = _OnlineRun(costs, schedule_for(costs, j.schedule, j.microbatches, j.vpp), j)
    ctls = [[GapController(pred, margin) for _ in range(run.sched.num_ranks)] for _ in range(j.groups)]
    for t in range(steps):
        run.step(first_step + t, spec, ctls, evaluated=t >= warmup)
        if progress is not None:
            progress(t + 1, steps)
    return OnlineResult(str(spec), run.sched.name, str(pred), float(margin), run.rows, warmup,
                        float(np.mean(run.idle_s)), float(np.mean(run.idle_d)), run.decisions, run.caps, run.chunks,
                        j.groups, run.last, float(np.mean(run.loads)),
                        float(np.mean(run.idle_b)) if run.idle_b else None)


class _OnlineRun:
    """:func:`run_online`'s plans (the static ``base``, the schedule ``as_built`` when it has whole backwards, the
    ``chunked`` order the controllers run, memory ``caps``, gradient ``sync``) and what its steps gather."""

    def __init__(self, costs: StageCosts, sched: Schedule, job: DynamicJob) -> None:
        self.costs, self.sched, self.job = costs, sched, job
        self.base = passes.split_backward(sched, 0)
        # the schedule as built, when its backwards are whole B (the static plan splits them): simulated beside it
        # so the iteration ``simulate`` (without --dynamic) prints for the same schedule is shown too
        self.as_built = sched if has_whole_backward(sched) else None
        self.chunks = job.chunks(costs)
        self.chunked = passes.chunk_weight_gradients(self.base, self.chunks)
        self.caps = passes.memory_caps(self.base, job.memory_cap, activation_bytes=costs.activation_bytes)
        self.sync = costs.grad_sync if any(costs.grad_sync) else None
        self.static_comm = self.built_comm = None  # made at the first group (after its routing)
        self.cache: dict = {}
        self.rows, self.idle_s, self.idle_d, self.idle_b, self.loads = [], [], [], [], []
        self.decisions = {"fill": 0, "defer": 0, "forced": 0}
        self.last: dict[str, Timeline] = {}

    def group(self, step: int, g: int, spec, ctls: list[GapController]) -> tuple:
        """EP group ``g`` at ``step``: ``(static, dynamic, records, as-built or None)`` timelines."""
        costs, j = self.costs, self.job
        real = routing_counts(spec, costs, self.sched.num_microbatches, seed=j.seed, group=g, step=step,
                              jitter=j.jitter, log_cache=self.cache)
        kw: dict[str, Any] = {}
        if j.capacity_factor is not None:
            kw = dict(tokens=max(1, int(real.sum(-1).max() // costs.top_k)), top_k=costs.top_k,
                      capacity_factor=j.capacity_factor)
        x = slowest_loads(real, costs.ep, **kw)
        self.loads.append(float(x.mean()))
        d = RoutedDurations(costs, x)
        if self.static_comm is None:
            self.static_comm = grad_sync_tasks(self.base, self.sync, placement="static")
        st = simulate(self.base, PairDurations(d, self.base), comm=self.static_comm, p2p_latency=j.p2p_latency)
        ab = None
        if self.as_built is not None:
            if self.built_comm is None:
                self.built_comm = grad_sync_tasks(self.as_built, self.sync, placement="static")
            ab = simulate(self.as_built, PairDurations(d, self.as_built), comm=self.built_comm,
                          p2p_latency=j.p2p_latency)
        dy, rec = execute(self.chunked, d, w_chunks=self.chunks, controllers=ctls, memory_cap=self.caps,
                          grad_sync=self.sync, p2p_latency=j.p2p_latency)
        for r, c in enumerate(ctls):
            c.end_step(rec[r].waits, rec[r].tail)
        return st, dy, rec, ab

    def step(self, step: int, spec, ctls: list[list[GapController]], evaluated: bool) -> None:
        """One step of every group: its row; its idle times and decisions too when ``evaluated`` (past warm-up)."""
        runs = []
        for g in range(self.job.groups):
            runs.append(self.group(step, g, spec, ctls[g]))
            if evaluated:
                for c in ctls[g]:
                    for k, v in c.decisions.items():
                        self.decisions[k] = self.decisions.get(k, 0) + v
        self.last = {"static": runs[0][0], "dynamic": runs[0][1]}
        Ts, Td = max(st.iteration_time for st, *_ in runs), max(dy.iteration_time for _, dy, *_ in runs)
        ab_T = [ab.iteration_time for *_, ab in runs if ab is not None]
        mae, rel = _gap_errors([r for _, _, rec, _ in runs for r in rec])
        self.rows.append({"step": step, "static_s": Ts, "dynamic_s": Td, "gain": Ts / Td - 1.0 if Td > 0 else 0.0,
                          "gap_mae_s": mae, "gap_rel_error": rel, **({"as_built_s": max(ab_T)} if ab_T else {})})
        if evaluated:
            self.idle_s.append(float(np.mean([Ts - b for st, *_ in runs for b in st.per_rank_busy])))
            self.idle_d.append(float(np.mean([Td - b for _, dy, *_ in runs for b in dy.per_rank_busy])))
            if ab_T:
                self.idle_b.append(float(np.mean([max(ab_T) - b for *_, ab in runs if ab is not None
                                                  for b in ab.per_rank_busy])))


def has_whole_backward(schedule: Schedule) -> bool:
    """Whether any action of ``schedule`` (or a sub-action of an overlapped pair) is a whole backward ``B``: then
    :func:`tessera_lab.pipeline.passes.split_backward` changes it (the input gradient goes upstream after ``I``,
    before ``W``), so the static plan of :func:`run_online` is not the schedule as built."""
    return any(x.type is _B for acts in schedule.actions.values() for a in acts for x in a.leaves())
