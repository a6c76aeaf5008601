"""Dynamic W filling in the runner (``run --dynamic``): one :class:`~tessera_lab.dynamic.controller.GapController`
per pipeline rank (the controller of that rank's EP group) decides, at each p2p receive wait, whether to run a
deferred weight-gradient pass (W) in the gap.

The job's list is split with W deferred to the end of the rank's list (``split_backward(schedule, None)``). At the
start of a receive wait the filler offers the controller the ready W (their I has run) in the rank's list order;
the controller runs the longest prefix whose W seconds fit the wait predicted for this slot
(:func:`~tessera_lab.dynamic.controller.pick_in_wait` rule, ``last-step`` predictor, margin 0.5), and a completion
query of the awaited transfer before each W (``work.is_completed()``: c10d's query of its CUDA event on NCCL, no
wait) ends the fill once the input has arrived: nothing in the fill blocks, and the one ``work.wait()`` after it is,
on NCCL, a stream wait. Waits and W are measured with host clocks on CPU and CUDA events on a GPU (one clock
for both: a W timed by its host launches would "fit" every wait); on a GPU the completion query reports the
device's progress, which lags the host that issues ahead, so it only ever ends a fill early: the prediction
bounds it (the query is advisory, never needed for correctness). Before a
forward, pending W run while the rank holds ``cap`` or more deferred micro-batches (the memory cap). A W already
run is skipped at its static place. W of one stage therefore always run in micro-batch order, so gradients
accumulate in the same order as the static run and losses and gradients stay bitwise equal on CPU.

One controller per EP group, no extra collective: each rank sends its observed waits (per slot) and W seconds (per
stage) of the previous step, in integer microseconds, with the first count exchange of a step
(``ExpertParallelComm.piggyback``, the :func:`~tessera_lab.dynamic.controller.pack_waits` idea), and feeds the
group maximum to its controller at the end of that step. The plan (which W, how many seconds fit) uses only those
group numbers, the list order and readiness (the same on every rank of the group), never a local clock; the
completion query can end a rank's fill earlier than a peer's, which moves only where its W run (W of one stage
stay in micro-batch order, so results do not change). No oracle: predictions lag two steps (step t uses the group's waits of step t - 2); steps 0 and 1
have no history and run the static placement (plus the cap). Without EP (ep = 1) a rank is its own group and the
lag is one step.

Combine waits (node-level pair handler ``scheduled``, :mod:`tessera_lab.runner.runtime.nodes`): a program's wait for an EP
combine all-to-all calls :meth:`GapFiller.wait_node`. Such waits get slots of their own, numbered in the order they
occur in a step (``NODE_SLOT_BASE + n``; the same on every rank of a group, which runs the same node order); they
are learnt in step 0 and join the group's numbers from then on. In them only W whose I finished before the
current action may run (the action in progress may have deferred part of its own W already); no gradient-sync
chunk launches there. A W run in such a wait is recorded inside the node that waits.

Gradient-sync chunks (:class:`GradBuckets`, ``grad_sync="ordered"`` with replicas, ``dp * ep > 1``): the
replica gradient sum is cut into buckets, one per (stage of this rank, dense | expert) in the order of the
stages' last backward in the list. A bucket is final once every backward (B / I, alone or in a pair) and
every W of its stage has run. In a receive wait with a predicted wait > 0 (the group's numbers, as for W), after
the W fills, the filler launches the next buckets in order whose stage is final, as asynchronous collectives
(the reduce-scatter of :class:`~tessera_lab.runner.runtime.gradsync.OrderedReduceScatter`; the wait itself hides
it), while the buffers in flight stay
within the memory cap ``cap_bytes`` (default: what the static end-of-step sync allocates at once, so the dynamic
run never holds more). :meth:`GradBuckets.finish` (end of step) launches the rest in the same order, waits, sums
each shard in replica order and all-gathers the shards: element for element the sum of the static sync, so gradients stay bitwise
equal. Every rank issues the buckets of a group in the same order, so the collectives match whichever slot each
rank launched them in. Only ranks holding several stages (interleaved, DualPipeV) have waits after a stage's
gradients are final; with one stage per rank all buckets launch at the end of the step.
Times are float seconds.
"""

from __future__ import annotations

import time
from typing import Callable

from tessera_lab.dynamic.controller import GapController
from tessera_lab.pipeline.schedules import Action, ActionType

from .layers import WEIGHT_GRAD_STORE

__all__ = ["GapFiller", "GradBuckets", "NODE_SLOT_BASE"]

#: slot ids of combine waits inside node programs start here (above any action index)
NODE_SLOT_BASE = 1_000_000


class GradBuckets:
    """Replica gradient sum in buckets launched in gaps (module docstring).

    Args:
        actions: the rank's top-level action list (as for :class:`GapFiller`).
        stage_params: stage -> that stage's ``(name, parameter)`` list on this rank (a parameter listed under
            several stages belongs to the one whose gradients become final last).
        groups: ``(dense group, dense size, expert group, expert size)``; a group of None or size 1 is not
            reduced (the static :func:`~tessera_lab.runner.runtime.train.sync_grads` rule).
        is_expert: ``is_expert(name)``: the parameter is reduced over the expert (DP) group.
        microbatches: m (W per stage).
        cap_bytes: most gather-buffer bytes in flight (None: the static sync's, all buckets at once).
    """

    def __init__(self, actions, stage_params, groups, is_expert, microbatches: int, cap_bytes: int | None = None):
        import torch

        self._torch = torch
        last: dict[int, int] = {}  # stage -> index of its last backward (B / I, alone or in a pair)
        last_any: dict[int, int] = {}  # ... or W (tie-break of the bucket order)
        for k, a in enumerate(actions):
            for x in (a.sub_actions or (a,)):
                if x.stage in stage_params and x.type in (ActionType.B, ActionType.I, ActionType.W):
                    last_any[x.stage] = k
                    if x.type is not ActionType.W:
                        last[x.stage] = k
        order = sorted(stage_params, key=lambda s: (last.get(s, len(actions)), last_any.get(s, len(actions)), s))
        owner: dict[int, int] = {}
        for s in order:
            for _, p in stage_params[s]:
                owner[id(p)] = s
        dg, dn, eg, en = groups
        self.buckets = []  # (stage, group, size, params)
        for s in order:
            seen: set[int] = set()
            dense, expert = [], []
            for n, p in stage_params[s]:
                if owner[id(p)] != s or id(p) in seen:
                    continue
                seen.add(id(p))
                (expert if is_expert(n) else dense).append(p)
            for grp, size, ps in ((dg, dn, dense), (eg, en, expert)):
                if ps and grp is not None and size > 1:
                    self.buckets.append((s, grp, size, ps))
        self.m = microbatches
        self.w_static = {s: {x.microbatch for k, a in enumerate(actions) for x in (a.sub_actions or (a,))
                             if x.type is ActionType.W and x.stage == s} for s in stage_params}
        self.last = last
        # send + receive buffers of each bucket's reduce-scatter (flat gradient padded to a multiple of size)
        self.bytes = [2 * 4 * size * -(-sum(p.numel() for p in ps) // size) for _, _, size, ps in self.buckets]
        self.cap_bytes = sum(self.bytes) if cap_bytes is None else int(cap_bytes)
        self.begin_step()

    def begin_step(self) -> None:
        self.launched: list[tuple] = []  # (bucket index, OrderedReduceScatter)
        self.in_gap: list[int] = []  # buckets launched in a wait, by slot
        self._next = 0

    def _final(self, s: int, slot: int, w_done: set) -> bool:
        """Every backward of stage ``s`` sits before ``slot`` and every W of it has run."""
        return self.last.get(s, -1) < slot and all((s, mb) in w_done for mb in self.w_static.get(s, ()))

    def _launch(self) -> None:
        torch = self._torch
        from .gradsync import OrderedReduceScatter

        b = self._next
        _, grp, size, ps = self.buckets[b]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps])
        self.launched.append((b, OrderedReduceScatter(flat, grp, size, async_op=True)))
        self._next += 1

    def next_stage(self) -> int | None:
        """Stage of the next bucket to launch (None: all launched)."""
        return self.buckets[self._next][0] if self._next < len(self.buckets) else None

    def in_flight_bytes(self) -> int:
        return sum(self.bytes[b] for b, *_ in self.launched)

    def fill(self, slot: int, w_done: set) -> int:
        """Launch, in order, the buckets whose stage is final before action ``slot`` while within the cap;
        returns how many were launched."""
        n = 0
        while self._next < len(self.buckets):
            s = self.buckets[self._next][0]
            if not self._final(s, slot, w_done):
                break
            if self.in_flight_bytes() + self.bytes[self._next] > self.cap_bytes:
                break
            self.in_gap.append(self._next)
            self._launch()
            n += 1
        return n

    def finish(self) -> None:
        """End of step: launch the remaining buckets in order, wait, sum each in replica order into ``.grad``."""
        while self._next < len(self.buckets):
            self._launch()
        for b, rs in self.launched:
            acc = rs.result()
            off = 0
            for p in self.buckets[b][3]:
                n = p.numel()
                p.grad = acc[off:off + n].view_as(p).clone()
                off += n
        self.launched = []


class GapFiller:
    """The executor's side of the controller for one rank's action list ``actions``.

    Args:
        actions: the rank's list (top-level actions; W are leaves there).
        cap: most deferred micro-batches the rank may hold before a forward (the memory cap, >= 1).
        run_w: ``run_w(action, label)`` runs one W now and records it.
        clock: seconds since the step start.
        fill: False only observes the waits (the static run's record: same fields, no W moved).
        comm: the rank's :class:`~tessera_lab.runner.runtime.moe.ExpertParallelComm` (its count exchange carries the
            group's waits); None: no EP group, the rank's own observations (lag one step).
        cuda: the rank runs on a GPU: waits are measured with CUDA events on the compute stream (host clocks do
            not time a GPU), read once at the end of the step.
    """

    def __init__(self, actions: list[Action], cap: int, run_w: Callable[[Action, str], None],
                 clock: Callable[[], float], fill: bool = True, comm=None, cuda: bool = False):
        self.fill = fill
        self.cuda = cuda
        self._device_waits: list[tuple] = []
        self._device_w: list[tuple] = []  # (stage, start event, end event) of this step's W on a GPU
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
        self.buckets: GradBuckets | None = None  # gradient-sync chunks (set by the job when replicas sync)
        # I / B keys finished before each action (what a wait inside action k may flush)
        self.i_before: list[frozenset] = []
        done_i: set = set()
        for a in actions:
            self.i_before.append(frozenset(done_i))
            done_i |= {(x.stage, x.microbatch) for x in (a.sub_actions or (a,))
                       if x.type in (ActionType.I, ActionType.B)}
        self._node_slots_learnt = False

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
        self._node_n = 0
        self._device_waits = []
        self._device_w = []
        if self.buckets is not None:
            self.buckets.begin_step()

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
        slot, idle per slot, decisions)."""
        self._resolve_device_waits()
        rec = {"predicted": {str(k): v for k, v in self.ctl.predicted.items() if k in self.waits or v > 0},
               "observed": {str(k): v for k, v in self.waits.items()},
               "idle": {str(k): v for k, v in self.idle.items()},
               "decisions": dict(self.ctl.decisions), "cap": self.cap if self.fill else None,
               "filled": list(self.filled), "group_lag_steps": 2 if self.comm is not None else 1}
        if self.buckets is not None:
            rec["grad_buckets"] = {"count": len(self.buckets.buckets), "launched_in_waits": len(self.buckets.in_gap),
                                   "cap_bytes": self.buckets.cap_bytes}
        own_w = {s: sum(xs) / len(xs) for s, xs in self._w_obs.items()}
        if not self._node_slots_learnt:  # step 0: the combine waits of a step become slots of their own
            self._node_slots_learnt = True
            self.slots = self.slots + [NODE_SLOT_BASE + n for n in range(self._node_n)]
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

    def ran_w(self, x: Action, start, end=None) -> None:
        """W ``x`` ran from stamp ``start`` to ``end`` (:class:`~tessera_lab.runner.runtime.devtime.StepClock`
        stamps: seconds on CPU, CUDA events on a GPU, read only in :meth:`end_step` after a synchronize; a host
        clock would time the W's launches, not its kernels). ``end=None``: ``start`` is the W's seconds."""
        self.done.add((x.stage, x.microbatch))
        if end is None:
            self._w_obs.setdefault(x.stage, []).append(float(start))
        elif isinstance(start, (int, float)):
            self._w_obs.setdefault(x.stage, []).append(float(end) - float(start))
        else:
            self._device_w.append((x.stage, start, end))

    def _oldest_ready(self, complete: frozenset | None = None):
        """The first W of the list not run yet whose I has run (None if that W is not ready: order is kept).
        With gradient buckets, the W of the next bucket's stage come first once all its backwards have run (so
        its bucket can launch in this wait); W of one stage still run in micro-batch order."""
        pending = set(WEIGHT_GRAD_STORE.pending())
        if complete is not None:  # inside an action: only W whose I finished before it
            pending &= complete
        b = self.buckets.next_stage() if self.buckets is not None else None
        if b is not None and self.buckets.last.get(b, -1) < self.slot:
            for k, a in self.w_list:
                if a.stage == b and (a.stage, a.microbatch) not in self.done:
                    return (k, a) if (a.stage, a.microbatch) in pending else None
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

    def wait_node(self, work, node: str) -> None:
        """A node program's wait for all-to-all ``work`` (``node``: its name): combine waits are filled like
        receive waits, in a slot of their own; other waits just wait."""
        if "combine" not in node:
            work.wait()
            return
        sid = NODE_SLOT_BASE + self._node_n
        self._node_n += 1
        k = self.slot if 0 <= self.slot < len(self.i_before) else 0
        self._fill_wait(work, sid, self.i_before[k], f"c{sid - NODE_SLOT_BASE}")

    def wait(self, work) -> None:
        """Wait for receive ``work``, running W in the gap when the controller says they fit."""
        self._fill_wait(work, self.slot, None, str(self.slot))

    @staticmethod
    def completed(work) -> bool:
        """Completion query, never a wait: ``work.is_completed()`` (c10d ``Work``: on NCCL a query of its CUDA
        event; the transports' batch handle likewise); a handle without it counts as not completed (the
        prediction alone bounds the fill)."""
        query = getattr(work, "is_completed", None)
        return bool(query()) if query is not None else False

    def _fill_wait(self, work, slot: int, complete: frozenset | None, tag: str) -> None:
        """Fill the wait for ``work``: before each W, a completion query (:meth:`completed`) ends the fill as soon
        as the input is there (no gap left); the controller bounds the W seconds by the group's predicted wait.
        Nothing in the loop blocks; ``work.wait()`` comes once, after it (on NCCL a stream wait, not a host
        wait). Measured: the wait from its start to the input's arrival (``waits``) and the time blocked in
        ``wait()`` (``idle``): host seconds on CPU, CUDA events on a GPU (the compute stream's view, read at
        the step's end, :meth:`end_step`)."""
        t0 = self.clock()
        ev0 = self._event()
        used = 0.0  # planned W seconds so far in this wait (not a local clock: the group plans alike)
        while self.fill and not self.completed(work):
            nxt = self._oldest_ready(complete)
            if nxt is None:
                break
            k, a = nxt
            sec = self.w_seconds.get(a.stage)
            if sec is None:  # never observed: no estimate, no fill
                break
            name = self.ctl.in_wait(slot, used, None, (str(a), sec), later_slot=self.after[k])
            if name is None:
                break
            used += sec
            self.filled.append(f"{tag}:{a}")
            self.run_w(a, "fill")
        if (complete is None and self.fill and self.buckets is not None
                and self.ctl.predicted.get(slot, 0.0) > 0):
            self.buckets.fill(slot, self.done)
        ev1 = self._event()
        tb = time.perf_counter()
        work.wait()
        blocked = time.perf_counter() - tb
        if ev0 is not None:  # on a GPU: device times, resolved at the end of the step
            self._device_waits.append((slot, ev0, ev1, self._event()))
            return
        self.waits[slot] = self.waits.get(slot, 0.0) + (self.clock() - t0)
        self.idle[slot] = self.idle.get(slot, 0.0) + blocked

    def _event(self):
        """A CUDA event recorded on the current stream (None on CPU)."""
        if not self.cuda:
            return None
        import torch

        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _resolve_device_waits(self) -> None:
        """Turn this step's CUDA-event waits and W times into seconds (synchronized at the step's end)."""
        for stage, e0, e1 in self._device_w:
            e1.synchronize()
            self._w_obs.setdefault(stage, []).append(e0.elapsed_time(e1) / 1e3)  # elapsed_time: milliseconds
        self._device_w = []
        if not self._device_waits:
            return
        for slot, e0, e1, e2 in self._device_waits:
            e2.synchronize()  # each: a pair's waits may sit on another stream than the last one
            self.waits[slot] = self.waits.get(slot, 0.0) + e0.elapsed_time(e2) / 1e3
            self.idle[slot] = self.idle.get(slot, 0.0) + e1.elapsed_time(e2) / 1e3
        self._device_waits = []
