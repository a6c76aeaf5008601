"""Dynamic W filling in the runner (``run --dynamic``): one :class:`~tessera_lab.dynamic.controller.GapController`
per pipeline rank (the controller of that rank's EP group) decides, at each p2p receive wait, whether to run a
deferred weight-gradient pass (W) in the gap.

The job's list is split with W deferred to the end of the rank's list (``split_backward(schedule, None)``). At the
start of a receive wait the filler offers the controller the ready W (their I has run) in the rank's list order;
the controller runs the longest prefix whose W seconds fit the wait predicted for this slot
(:func:`~tessera_lab.dynamic.controller.pick_in_wait` rule, ``last-step`` predictor, margin 0.5). Before a
forward, pending W run while the rank holds ``cap`` or more deferred micro-batches (the memory cap). A W already
run is skipped at its static place. W of one stage therefore always run in micro-batch order, so gradients
accumulate in the same order as the static run and losses and gradients stay bitwise equal on CPU.

One controller per EP group, no extra collective: each rank sends its observed waits (per slot) and W seconds (per
stage) of the previous step, in integer microseconds, with the first count exchange of a step
(``ExpertParallelComm.piggyback``, the :func:`~tessera_lab.dynamic.controller.pack_waits` idea), and feeds the
group maximum to its controller at the end of that step. Decisions use only those group numbers, the list order
and readiness (the same on every rank of the group), never a local clock, so every rank of a group decides
identically. No oracle: predictions lag two steps (step t uses the group's waits of step t - 2); steps 0 and 1
have no history and run the static placement (plus the cap). Without EP (ep = 1) a rank is its own group and the
lag is one step. Not done: filling combine waits inside node-level programs, DP reduce-scatter chunks.
Times are float seconds.
"""

from __future__ import annotations

import time
from typing import Callable

from tessera_lab.dynamic.controller import GapController
from tessera_lab.pipeline.schedules import Action, ActionType

from .layers import WEIGHT_GRAD_STORE

__all__ = ["GapFiller"]


class GapFiller:
    """The executor's side of the controller for one rank's action list ``actions``.

    Args:
        actions: the rank's list (top-level actions; W are leaves there).
        cap: most deferred micro-batches the rank may hold before a forward (the memory cap, >= 1).
        run_w: ``run_w(action, label)`` runs one W now and records it.
        clock: seconds since the step start.
        fill: False only observes the waits (the static run's record: same fields, no W moved).
        comm: the rank's :class:`~tessera_lab.runner.moe.ExpertParallelComm` (its count exchange carries the
            group's waits); None: no EP group, the rank's own observations (lag one step).
    """

    def __init__(self, actions: list[Action], cap: int, run_w: Callable[[Action, str], None],
                 clock: Callable[[], float], fill: bool = True, comm=None):
        self.fill = fill
        self.comm = comm
        if comm is not None:
            comm.piggyback = self._piggyback
            comm.on_piggyback = self._received
        self.actions = actions
        self.cap = max(1, int(cap))
        self.run_w = run_w
        self.clock = clock
        self.ctl = GapController()
        self.slots = [k for k, a in enumerate(actions) if a.type is not ActionType.W]
        self.w_list = [(k, a) for k, a in enumerate(actions) if a.type is ActionType.W]
        # slot right after each W's static place (-1: the end of the list)
        self.after = {k: next((j for j in self.slots if j > k), -1) for k, _ in self.w_list}
        self.w_seconds: dict[int, float] = {}  # stage -> W seconds (group maximum, from earlier steps)
        self.stages = sorted({a.stage for _, a in self.w_list})
        self._outgoing: list[int] | None = None
        self._incoming: list[list[int]] | None = None
        self._sent = True

    # -- step boundaries ------------------------------------------------------------------------
    def begin_step(self) -> None:
        self.ctl.begin_step(self.slots)
        self.done: set[tuple[int, int]] = set()
        self.waits: dict[int, float] = {}
        self.idle: dict[int, float] = {}
        self.slot = -1
        self._w_obs: dict[int, list[float]] = {}
        self.filled: list[str] = []
        self._sent, self._incoming = False, None

    # -- the count-exchange piggyback -------------------------------------------------------------
    def _piggyback(self) -> list[int] | None:
        """Extra ints for the first count exchange of the step: last step's waits per slot, W µs per stage."""
        if self._sent or self._outgoing is None:
            return None
        self._sent = True
        return self._outgoing

    def _received(self, rows: list[list[int]]) -> None:
        self._incoming = rows

    def _fold(self, waits: dict[int, float], w_sec: dict[int, float]) -> None:
        self.ctl.end_step({k: waits.get(k, 0.0) for k in self.slots}, 0.0)
        self.w_seconds.update(w_sec)

    def end_step(self) -> dict:
        """Feed the observed waits to the controller; returns this step's record (predicted and observed wait per
        slot, host idle per slot, decisions)."""
        rec = {"predicted": {str(k): v for k, v in self.ctl.predicted.items() if k in self.waits or v > 0},
               "observed": {str(k): v for k, v in self.waits.items()},
               "idle": {str(k): v for k, v in self.idle.items()},
               "decisions": dict(self.ctl.decisions), "cap": self.cap if self.fill else None,
               "filled": list(self.filled), "group_lag_steps": 2 if self.comm is not None else 1}
        own_w = {s: sum(xs) / len(xs) for s, xs in self._w_obs.items()}
        if self.comm is None:
            self._fold(self.waits, own_w)
        else:
            if self._incoming is not None:  # the group's numbers of the previous step
                n = len(self.slots)
                mx = [max(r[j] for r in self._incoming) / 1e6 for j in range(n + len(self.stages))]
                self._fold(dict(zip(self.slots, mx[:n])),
                           {s: v for s, v in zip(self.stages, mx[n:]) if v > 0})
            self._outgoing = ([max(0, int(round(1e6 * self.waits.get(k, 0.0)))) for k in self.slots]
                              + [max(0, int(round(1e6 * own_w.get(s, 0.0)))) for s in self.stages])
        return rec

    # -- hooks the executor calls ---------------------------------------------------------------
    def at(self, k: int) -> None:
        """The executor is about to run action ``k``."""
        if self.actions[k].type is not ActionType.W:
            self.slot = k

    def skip_w(self, x: Action) -> bool:
        """Whether W ``x`` at its static place already ran in a gap."""
        return (x.stage, x.microbatch) in self.done

    def ran_w(self, x: Action, seconds: float) -> None:
        self.done.add((x.stage, x.microbatch))
        self._w_obs.setdefault(x.stage, []).append(seconds)

    def _oldest_ready(self):
        """The first W of the list not run yet whose I has run (None if that W is not ready: order is kept)."""
        pending = set(WEIGHT_GRAD_STORE.pending())
        for k, a in self.w_list:
            key = (a.stage, a.microbatch)
            if key in self.done:
                continue
            return (k, a) if key in pending else None
        return None

    def before_forward(self) -> None:
        """Memory cap: run the oldest ready W while the rank holds ``cap`` or more deferred micro-batches."""
        while self.fill and len(WEIGHT_GRAD_STORE.pending()) >= self.cap:
            nxt = self._oldest_ready()
            if nxt is None:
                return
            self.ctl.forced()
            self.run_w(nxt[1], "forced")

    def wait(self, work) -> None:
        """Wait for receive ``work``, running W in the gap when the controller says they fit."""
        t0 = self.clock()
        used = 0.0  # planned W seconds so far in this wait (not a local clock: the group decides alike)
        while self.fill:
            nxt = self._oldest_ready()
            if nxt is None:
                break
            k, a = nxt
            sec = self.w_seconds.get(a.stage)
            if sec is None:  # never observed: no estimate, no fill
                break
            name = self.ctl.in_wait(self.slot, used, None, (str(a), sec), later_slot=self.after[k])
            if name is None:
                break
            used += sec
            self.filled.append(f"{self.slot}:{a}")
            self.run_w(a, "fill")
        tb = time.perf_counter()
        work.wait()
        blocked = time.perf_counter() - tb
        self.waits[self.slot] = self.waits.get(self.slot, 0.0) + (self.clock() - t0)
        self.idle[self.slot] = self.idle.get(self.slot, 0.0) + blocked
