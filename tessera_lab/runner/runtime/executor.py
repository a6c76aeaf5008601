"""The executor that walks one rank's lowered action list (see :mod:`tessera_lab.runner.runtime.pipeline` for what each
action does).

It executes only lowered lists (:func:`tessera_lab.pipeline.passes.lower`: ``with_comms`` inserts SEND/RECV,
``batch_p2p`` places them): every maximal run of SEND/RECV actions is posted as one batch through a
:mod:`~tessera_lab.runner.runtime.transport` (one ``batch_isend_irecv``, one NCCL group), compute actions wait for the
receives of their inputs. Nothing is posted that the list does not say, so the order NCCL sees is the order the
NCCL-rule check (:func:`tessera_lab.pipeline.p2p.check_nccl_order`) proved deadlock-free."""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.p2p import comm_route, lowered_steps
from tessera_lab.pipeline.passes import lower
from tessera_lab.pipeline.schedules import Action, ActionType, Schedule

from .devtime import StepClock, sync_debug
from .layers import WEIGHT_GRAD_STORE, TinyMoEModel, forward_key
from .nodes import StageProgram
from .orders import resolve_order
from .pairs import PairStreams, default_pair_exec, get_pair_handler
from .topology import StageModule, Topology
from .transport import make_transport

__all__ = ["StepRecord", "ExecutorOptions", "PipelineExecutor"]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W


# ----------------------------------------------------------------------------------------------
# executor
# ----------------------------------------------------------------------------------------------


@dataclass
class StepRecord:
    """What one rank did in one step: ``loss_sums[mb]`` (last-stage holder, else None), ``events``
    ``(lane, type, stage, microbatch, start_s, end_s, label)`` and ``routing`` (per-call routing logs)."""

    loss_sums: dict[int, float] | None
    events: list[tuple]
    routing: list[dict] = field(default_factory=list)
    dynamic: dict | None = None


@dataclass(frozen=True)
class ExecutorOptions:
    """How a :class:`PipelineExecutor` runs its list (every field has the default of a plain ``run``).

    Attributes:
        pair_exec: a pair handler of :mod:`tessera_lab.runner.runtime.pairs` (None: ``threads``); a node-level one
            runs every forward and backward as nodes (:mod:`tessera_lab.runner.runtime.nodes`).
        pair_order: issue order of the ``scheduled`` handler (:func:`tessera_lab.runner.runtime.orders.resolve_order`).
        fault: ``{"rank", "step", "action"}``: raise before that action (tests).
        timing: time every EP all-to-all (lane ``comm``); None (default): on CPU yes, on CUDA no (opt-in:
            CUDA events, no host sync either way).
        p2p: the transport mode (:data:`tessera_lab.runner.runtime.transport.P2P_MODES`; ``auto``: NCCL's semantics
            emulated on gloo, ``batch_isend_irecv`` on NCCL); ``p2p_timeout_s``: seconds before the gloo
            emulation declares a batch deadlocked.
        w_cap: with an int, fill receive waits with deferred W (:class:`tessera_lab.runner.runtime.gaps.GapFiller`, the
            rank's controller) and hold at most ``w_cap`` deferred micro-batches before a forward; None: static.
        fill: with ``w_cap``, False only records the waits (the static side of ``run --dynamic``).
    """

    pair_exec: str | None = None
    pair_order: object = None
    fault: dict | None = None
    timing: bool | None = None
    p2p: str = "auto"
    p2p_timeout_s: float = 60.0
    w_cap: int | None = None
    fill: bool = True


class PipelineExecutor:
    """Runs one rank's action list per step (see the module docstring).

    Args:
        topo: this rank's :class:`Topology`.
        schedule: the :class:`~tessera_lab.pipeline.schedules.Schedule`: compute-only (lowered here with
            :func:`~tessera_lab.pipeline.passes.lower`) or already lowered (checked by the NCCL rule).
        stages: ``{stage: StageModule}`` held by this rank (``schedule.rank_stages(pp_rank)``).
        act_shape: ``(micro_batch_size, seq_len, hidden)`` of the tensors crossing stage boundaries.
        num_tokens: global tokens per step ``N`` (the loss divisor).
        options: :class:`ExecutorOptions` (pair handler and order, transport, W filling, timing, fault); None: the
            defaults.

    Raises:
        ConfigError: an unknown pair handler or pair order.
    """

    def __init__(self, topo: Topology, schedule: Schedule, stages: dict[int, StageModule], act_shape: tuple,
                 num_tokens: int, options: ExecutorOptions | None = None):
        opts = options if options is not None else ExecutorOptions()
        self.topo = topo
        self.sched = schedule
        self.stages = stages
        self.S = schedule.num_stages
        self.m = schedule.num_microbatches
        self.s2r = schedule.stage_to_rank
        self.me = topo.pp_rank
        self.lowered = lower(schedule)
        self.steps = list(lowered_steps(self.lowered.actions.get(self.me, [])))
        #: this rank's compute actions in order (fault and gap-slot indices count these)
        self.actions = [acts[0] for kind, _, acts in self.steps if kind == "compute"]
        self.act_shape = tuple(act_shape)
        self.N = num_tokens
        # from every rank's list, so that all ranks pick the same handler
        pairs = any(a.type is ActionType.OVERLAP_F_B for acts in self.lowered.actions.values() for a in acts)
        self.handler = get_pair_handler(opts.pair_exec or default_pair_exec(topo.device.type, pairs))
        self.node_level = self.handler.node_level
        self.pair_order_label, self.pair_template = resolve_order(opts.pair_order, topo.ep)
        self._comm = next((st.comm for st in stages.values()), None)
        #: node-level runs call ``dispatch_hook(key, layer, recv_counts, send_counts)`` after every count
        #: exchange (the seam for a per-EP-group dynamic controller); None: no hook
        self.dispatch_hook = None
        self.fault = opts.fault
        backend = dist.get_backend() if dist.is_initialized() else "gloo"
        self.transport = make_transport(opts.p2p, backend, topo.rank, opts.p2p_timeout_s)
        self.transport.barrier()  # the p2p group's first collective: every rank (NCCL's rule for batches)
        init = (lambda: torch.cuda.set_device(topo.device)) if topo.device.type == "cuda" else None
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tessera-side", initializer=init)
        #: the threads handler's side streams on a GPU (:class:`~tessera_lab.runner.runtime.pairs.PairStreams`)
        self.pair_streams = PairStreams(topo.device) if topo.device.type == "cuda" else None
        #: node-level all-to-alls are issued from this stream, which waits only for each producer's event
        self._comm_stream = torch.cuda.Stream(topo.device) if topo.device.type == "cuda" else None
        self._lock = threading.Lock()
        self._tls = threading.local()
        self.clock = StepClock(topo.device)
        if opts.timing if opts.timing is not None else topo.device.type != "cuda":
            hook = functools.partial(self._comm_hook)
            hook.clock = self.clock.now  # the all-to-all's stamps come from this rank's step clock
            hook.current_action = self._current_action  # read at the forward, for its backward exchange
            for st in stages.values():
                if st.comm is not None:
                    st.comm.hook = hook
        self.gaps = None
        if opts.w_cap is not None:
            from .gaps import GapFiller

            self.gaps = GapFiller(self.actions, opts.w_cap, self._run_w, self.clock.host, fill=opts.fill,
                                  comm=self._comm, cuda=topo.device.type == "cuda")

    def close(self) -> None:
        self._side.shutdown(wait=True)
        self.transport.close()

    # -- recording ------------------------------------------------------------------------------
    def _now(self):
        """A stamp (:class:`~tessera_lab.runner.runtime.devtime.StepClock`: seconds on CPU, a CUDA event on a GPU)."""
        return self.clock.now()

    def _event(self, lane: str, typ: str, stage: int, mb, start: float, end: float, label: str) -> None:
        with self._lock:
            self._events.append((lane, typ, stage, mb, start, end, label))

    def _current_action(self) -> tuple:
        """The ``(stage, microbatch)`` this host thread runs now, ``(-1, None)`` outside an action."""
        return getattr(self._tls, "action", (-1, None))

    def _comm_hook(self, name: str, start: float, end: float, nbytes: int, action=None) -> None:
        cur = self._current_action() if action is None else action
        self._event("comm", "ep_a2a", cur[0], cur[1], start, end, f"{name}[{cur[0]},{cur[1]}]")

    # -- p2p --------------------------------------------------------------------------------------
    def _post_batch(self, acts: tuple[Action, ...]) -> None:
        """Post one run of SEND/RECV actions as one batch (same-rank transfers move nothing)."""
        ops, meta = [], []
        for a in acts:
            key, src, dst = comm_route(a)
            if a.type in (ActionType.SEND_F, ActionType.SEND_B):
                if self.s2r[dst] == self.me:
                    continue
                if key not in self._outbox:
                    raise ConfigError(f"rank {self.me}: {a} comes before the action producing its data")
                ops.append(("send", key, self._outbox.pop(key).contiguous(), self.topo.global_rank(self.s2r[dst])))
            else:
                if self.s2r[src] == self.me:
                    continue
                buf = torch.empty(self.act_shape, dtype=torch.float32, device=self.topo.device)
                ops.append(("recv", key, buf, self.topo.global_rank(self.s2r[src])))
            meta.append(a)
        if not ops:
            return
        t = self._now()
        h = self.transport.post(ops)  # one handle for the whole batch (NCCL: one coalesced Work per batch)
        for a, (op, key, buf, _) in zip(meta, ops):
            if op == "recv":
                self._recvs[key] = (h, buf, t)
            else:
                self._event("send", a.type.value, a.stage, a.microbatch, t, t, str(a))

    def _wait_recv(self, key: tuple) -> torch.Tensor:
        if key not in self._recvs:
            raise RuntimeError(f"rank {self.me}: input {key} is read before its receive was posted")
        w, buf, t = self._recvs.pop(key)
        if self.gaps is not None:
            self.gaps.wait(w)
        else:
            w.wait()
        kind, stage, mb = key
        typ = "RECV_F" if kind == "F" else "RECV_B"
        dst = stage + 1 if kind == "F" else stage - 1
        self._event("comm", typ, dst, mb, t, self._now(), f"{dst}{typ}{mb}")
        return buf

    # -- inputs -----------------------------------------------------------------------------------
    def _need_input(self, x: Action) -> tuple:
        """Make sure the input of leaf action ``x`` is on its way; returns a handle for :meth:`_get_input`."""
        s, i = x.stage, x.microbatch
        if x.type is _F:
            if s == 0:
                return ("tokens", i)
            key, src = ("F", s - 1, i), self.s2r[s - 1]
        elif x.type in (_B, _I):
            if s == self.S - 1:
                return ("none", None)
            key, src = ("G", s + 1, i), self.s2r[s + 1]
        else:
            return ("none", None)
        return ("local", key) if src == self.me else ("recv", key)

    def _get_input(self, handle: tuple, forward: bool):
        kind, key = handle
        if kind == "tokens":
            return self._inputs[key]
        if kind == "none":
            return None
        t = self._local.pop(key) if kind == "local" else self._wait_recv(key)
        return t.detach().requires_grad_(True) if forward else t

    # -- compute ----------------------------------------------------------------------------------
    def defer_weight_grads(self, x: Action) -> None:
        """Defer the GEMM weight gradients of backward leaf ``x`` (an I) to its later W action."""
        WEIGHT_GRAD_STORE.defer((x.stage, x.microbatch))

    def _program(self, x: Action, inp: torch.Tensor) -> StageProgram:
        """A node-level program for forward leaf ``x`` with its input set."""
        s, i = x.stage, x.microbatch

        def record(lane, typ, label, start, end):
            self._event(lane, typ, s, i, start, end, label)

        def sink(v: float) -> None:
            self._loss_sums[i] = v

        prog = StageProgram(self.stages[s], i, self.stages[s].comm, record, self._now,
                            targets=self._targets.get(i) if s == self.S - 1 else None, num_tokens=self.N,
                            loss_sink=sink, on_counts=self.dispatch_hook)
        if self.gaps is not None:
            prog.wait_hook = self.gaps.wait_node
        prog.comm_stream = self._comm_stream
        prog.begin(inp)
        return prog

    def _forward(self, x: Action, inp: torch.Tensor, record: bool = True) -> torch.Tensor:
        s, i = x.stage, x.microbatch
        self._tls.action = (s, i)
        t = self._now()
        if self.node_level:
            prog = self._program(x, inp)
            for k in prog.fwd_keys:
                prog.forward(k)
            self._event("compute" if record else "sub", "F", s, i, t, self._now(), f"{s}F{i}")
            self._saved[(s, i)] = (inp, prog)
            return prog.output
        with forward_key((s, i)):
            out = self.stages[s](inp)
            if s == self.S - 1:
                loss = TinyMoEModel.loss_sum(out, self._targets[i])
                self._loss_sums[i] = loss.detach()  # read at the end of the step (no host sync here)
                out = loss / self.N
        self._event("compute" if record else "sub", "F", s, i, t, self._now(), f"{s}F{i}")
        self._saved[(s, i)] = (inp, out)
        return out

    def _backward(self, x: Action, grad, record: bool = True):
        s, i = x.stage, x.microbatch
        self._tls.action = (s, i)
        t = self._now()
        inp, out = self._saved.pop((s, i))
        if x.type is _I:
            WEIGHT_GRAD_STORE.defer((s, i))
        if self.node_level:
            out.begin_backward(grad)
            for k in out.bwd_keys:
                out.backward(k)
            self._event("compute" if record else "sub", x.type.value, s, i, t, self._now(), f"{s}{x.type.value}{i}")
            return out.input_grad
        if grad is None:
            torch.autograd.backward(out)
        else:
            torch.autograd.backward(out, grad_tensors=grad)
        gx = inp.grad if s > 0 else None
        self._event("compute" if record else "sub", x.type.value, s, i, t, self._now(), f"{s}{x.type.value}{i}")
        return gx

    def _finish(self, x: Action, result) -> None:
        """Route the output of leaf ``x`` (activation after F, input gradient after B/I)."""
        s, i = x.stage, x.microbatch
        if x.type is _F:
            if s == self.S - 1:
                return
            key, dst, t = ("F", s, i), self.s2r[s + 1], result.detach()
        else:
            if s == 0:
                return
            key, dst, t = ("G", s, i), self.s2r[s - 1], result
        if dst == self.me:
            self._local[key] = t
        else:
            self._outbox[key] = t  # sent by its SEND action

    def _run_w(self, x: Action, how: str = "static") -> None:
        """Run W leaf ``x`` now (``how``: static place, ``fill`` of a wait, ``forced`` by the memory cap)."""
        if self.pair_streams is not None and self.pair_streams.i_ran.pop((x.stage, x.microbatch), None) is not None:
            WEIGHT_GRAD_STORE.record_stream((x.stage, x.microbatch), torch.cuda.current_stream(self.topo.device))
        t = self._now()
        WEIGHT_GRAD_STORE.flush((x.stage, x.microbatch))
        t1 = self._now()
        self._event("compute", "W", x.stage, x.microbatch, t, t1, str(x) if how == "static" else f"{x}:{how}")
        if self.gaps is not None:
            self.gaps.ran_w(x, t, t1)  # the waits' clock: seconds on CPU, CUDA events on a GPU

    def _run_leaf(self, x: Action) -> None:
        if x.type is _W:
            if self.gaps is None or not self.gaps.skip_w(x):
                self._run_w(x)
            return
        h = self._need_input(x)
        if x.type is _F:
            if self.gaps is not None:
                self.gaps.before_forward()
            self._finish(x, self._forward(x, self._get_input(h, True)))
        elif self.pair_streams is None:
            self._finish(x, self._backward(x, self._get_input(h, False)))
        else:  # its forward may have run on a side stream (a pair's): hand the tensors crossing streams
            grad = self._get_input(h, False)
            bs = self.pair_streams.backward_stream(x, grad)
            gx = self._backward(x, grad)
            if bs is not None:
                PairStreams.hand(gx, torch.cuda.current_stream(self.topo.device))
            self._finish(x, gx)

    def _run_pair(self, a: Action) -> None:
        f = next(x for x in a.sub_actions if x.type is _F)
        b = next(x for x in a.sub_actions if x.type is not _F)
        if self.gaps is not None:
            self.gaps.before_forward()
        hf, hb = self._need_input(f), self._need_input(b)
        inp, grad = self._get_input(hf, True), self._get_input(hb, False)
        t = self._now()
        out, gx = self.handler.run(self, f, b, inp, grad)
        self._event("compute", "OVERLAP_F_B", b.stage, b.microbatch, t, self._now(), str(a))
        self._finish(b, gx)
        self._finish(f, out)

    # -- step -------------------------------------------------------------------------------------
    def _run_actions(self, step: int, fault: dict | None) -> None:
        """The step's actions in list order: each run of SEND/RECV posted as one batch, the rest run."""
        k = -1
        for kind, _, acts in self.steps:
            if kind == "batch":
                self._post_batch(acts)
                continue
            k += 1
            a = acts[0]
            if self.gaps is not None:
                self.gaps.at(k)
            if fault and fault.get("rank") == self.topo.rank and fault.get("step", 0) == step and fault.get("action", 0) == k:
                raise RuntimeError(f"injected fault on rank {self.topo.rank} at step {step} before action {k} ({a})")
            if a.type is ActionType.OVERLAP_F_B:
                self._run_pair(a)
            else:
                self._run_leaf(a)

    def run_step(self, step: int, inputs: dict[int, torch.Tensor], targets: dict[int, torch.Tensor],
                 t0: float) -> StepRecord:
        """Run the action list once. ``inputs`` / ``targets``: micro-batch -> ``[b, T]`` token ids (only needed
        on the first / last stage's rank). ``t0``: ``time.perf_counter()`` at the step's start."""
        self._t0 = t0
        self.clock.start(t0)
        self._events: list[tuple] = []
        self._inputs, self._targets = inputs, targets
        self._saved: dict = {}
        self._local: dict = {}
        self._recvs: dict = {}
        self._outbox: dict = {}
        self._loss_sums: dict[int, float] = {}
        fault = self.fault
        if self.gaps is not None:
            self.gaps.begin_step()
        if self.pair_streams is not None:
            self.pair_streams.fwd.clear()
            self.pair_streams.i_ran.clear()
        with sync_debug(self.topo.device):  # $TESSERA_LAB_SYNC_DEBUG: the actions' host syncs warned of or raised
            self._run_actions(step, fault)
            self.transport.finish()
        leftovers = [k for k in WEIGHT_GRAD_STORE.pending() if k[0] in self.stages]
        if self._saved or self._recvs or self._outbox or leftovers:
            raise RuntimeError(
                f"rank {self.me}: step ended with unfinished work: activations {sorted(self._saved)}, "
                f"receives {sorted(self._recvs)}, unsent {sorted(self._outbox)}, deferred W {leftovers}")
        holds_last = (self.S - 1) in self.stages
        dyn = self.gaps.end_step() if self.gaps is not None else None
        events = self.clock.resolve(list(self._events))
        losses = {i: float(v) for i, v in self._loss_sums.items()}  # one host read per step, at its end
        return StepRecord(losses if holds_last else None, events, dynamic=dyn)


