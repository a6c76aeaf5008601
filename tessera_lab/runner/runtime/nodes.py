"""A stage's forward and backward for one micro-batch as nodes (see :mod:`tessera_lab.runner.runtime.orders` for the
node names), run one node at a time in any dependency-respecting order.

Each compute node runs on detached inputs (leaves that require grad) and keeps its inputs and outputs; its
backward is ``torch.autograd.backward(outputs, output_grads)`` and hands the inputs' ``.grad`` on. The node
boundaries are cut where every tensor has exactly one consumer node, and the tensor ``x`` read by router,
permute, shared expert and shared gate still fans out through :func:`~tessera_lab.runner.runtime.layers.fanout`
inside ``pre`` (its backward sums the four gradients in a fixed order), so every floating-point operation has
the same inputs and order as the monolithic autograd pass: losses and gradients stay bitwise equal.

Communication nodes are issued asynchronously (``async_op=True``: gloo runs them on its own threads; NCCL on
its internal stream, and ``work.wait()`` makes the current CUDA stream wait on an event, without blocking the
host) and waited for by the compute node that consumes them. On CUDA they are issued from a communication
stream that waits only for the event of their producer, so an all-to-all does not wait for compute issued
after it (Megatron-Core's ``ScheduleNode`` does the same with its stream and event). Dispatch sizes
(``cfg.ep_dispatch``): in ``uneven`` mode a small blocking count exchange before each dispatch sizes it (a host
read per layer); in ``capacity`` mode (:class:`~tessera_lab.runner.runtime.moe.CapacityDispatch`) ``pre`` packs the
rows into fixed per-destination blocks with device-built indices, the dispatch node issues the counts and the rows
as two asynchronous all-to-alls with equal splits, and ``experts`` builds its blocks from the received counts on the
device: no host read on the dispatch path. Forward collectives use the EP group ``group_fwd``, backward
ones ``group_bwd``, so a forward and a backward all-to-all can be in flight together. With ``ep == 1`` the
communication nodes are no-ops.

Events (``record(lane, type, label, start, end)``): every compute node (lane ``node``), every all-to-all from
issue to the end of its wait (lane ``comm``, type ``ep_a2a``) and the time the host was blocked in a wait
(lane ``wait``, type ``a2a_wait``): exposed communication, measured by the runner itself.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from .layers import TinyMoEModel, forward_key
from .moe import CapacityDispatch, expert_major, permute

__all__ = ["StageProgram", "node_names"]


def node_names(layer_ids: list[int], first: bool, last: bool) -> tuple[list[str], list[str]]:
    """``(forward node keys, backward node keys)`` of a stage: ``embed``, ``L<i>.<node>``, ``head``."""
    from .orders import B_NODES, F_NODES

    fwd = (["embed"] if first else []) + [f"L{i}.{n}" for i in layer_ids for n in F_NODES] + (["head"] if last else [])
    bwd = (["head"] if last else []) + [f"L{i}.{n}" for i in reversed(layer_ids) for n in B_NODES] + (["embed"] if first else [])
    return fwd, bwd


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().requires_grad_(True)


def _unpermute(y_perm: torch.Tensor, plan, weight: torch.Tensor) -> torch.Tensor:
    """:func:`tessera_lab.runner.runtime.moe.unpermute` with the combine weights given as a tensor (a node input)."""
    n, k = plan.num_tokens, plan.top_k
    H = y_perm.shape[-1]
    slots = y_perm.new_zeros(n * k, H).index_copy(0, plan.order, y_perm)
    return (slots.view(n, k, H) * weight.to(y_perm.dtype).unsqueeze(-1)).sum(dim=1)


class _Layer:
    """Forward state of one layer between its nodes."""

    __slots__ = ("h_in", "outs", "leaves", "plan", "splits", "recv", "y", "yp", "h_out", "cap")

    def __init__(self) -> None:
        for s in self.__slots__:
            setattr(self, s, None)


class StageProgram:
    """Stage ``stage``'s forward and backward of micro-batch ``mb`` as nodes.

    Args:
        stage: the :class:`~tessera_lab.runner.runtime.topology.StageModule`.
        mb: micro-batch index (the W-deferral key is ``(stage, mb)``).
        comm: the :class:`~tessera_lab.runner.runtime.moe.ExpertParallelComm` (None: every expert is local).
        record: ``record(lane, type, label, start_s, end_s)`` for events; clock: seconds since the step start.
        targets, num_tokens, loss_sink: on the last stage, the ``[b, T]`` targets, the loss divisor ``N`` and
            a callable receiving the loss sum (float, nats).
        on_counts: ``on_counts(key, layer, recv_counts, send_counts)`` right after each dispatch's count
            exchange of an uneven dispatch (``recv_counts[peer][local expert]``, ``send_counts[expert]``; a
            capacity dispatch reads no counts on the host and calls no hook): the routing metadata the
            EP group's dynamic controller decides from (identical on every rank of the group).

    Use: :meth:`begin` with the stage input, :meth:`forward` for each key of :attr:`fwd_keys` in order (any
    interleaving with other programs), then :meth:`begin_backward` and :meth:`backward` for each key of
    :attr:`bwd_keys`; :attr:`output` is the stage output (the scaled loss on the last stage) and
    :attr:`input_grad` the gradient of the stage input (None on the first stage).
    """

    def __init__(self, stage, mb: int, comm, record: Callable, clock: Callable[[], float], *, targets=None,
                 num_tokens: int = 1, loss_sink: Callable[[float], None] | None = None,
                 on_counts: Callable[[tuple, int, list, list], None] | None = None):
        self.stage, self.mb, self.comm = stage, mb, comm
        self.on_counts = on_counts
        self.key = (stage.stage, mb)
        self.record, self.clock = record, clock
        self.targets, self.N, self.loss_sink = targets, num_tokens, loss_sink
        self.layers = {layer.index: layer for layer in stage.layers}
        self.order = list(self.layers)
        self.fwd_keys, self.bwd_keys = node_names(self.order, stage.is_first, stage.is_last)
        self.state = {i: _Layer() for i in self.order}
        self.pending: dict[str, tuple[Any, torch.Tensor, float, str]] = {}
        self.input: torch.Tensor | None = None
        self.output: torch.Tensor | None = None
        self.input_grad: torch.Tensor | None = None
        self._embed_out = self._head_in = None
        self._g: dict[str, Any] = {}
        #: ``wait_hook(work, node)`` replaces ``work.wait()`` in all-to-all waits (run --dynamic fills them)
        self.wait_hook: Callable[[Any, str], None] | None = None
        #: on CUDA, the communication stream all-to-alls are issued from (None: the current stream)
        self.comm_stream = None

    # -- helpers ----------------------------------------------------------------------------------
    def _a2a(self, node: str, x: torch.Tensor, out_splits, in_splits, group, counts: torch.Tensor | None = None) -> None:
        """Issue all-to-all ``node`` asynchronously; with ``counts`` (a capacity dispatch) the ``[E]`` counts go
        first, as their own asynchronous all-to-all (pending under ``node + ".counts"``)."""
        out = x.new_empty((int(sum(out_splits)),) + tuple(x.shape[1:]))
        cout = torch.empty(counts.numel(), dtype=torch.int64, device=counts.device) if counts is not None else None
        x = x.contiguous()
        t = self.clock()
        label = f"{node}[{self.key[0]},{self.mb}]"

        def issue():
            if counts is not None:
                _, cwork = self.comm.send_counts_async(counts, async_op=True, out=cout)
                self.pending[node + ".counts"] = (cwork, cout, t, None)
            return dist.all_to_all_single(out, x, list(out_splits), list(in_splits), group=group, async_op=True)

        if self.comm_stream is not None and x.is_cuda:
            # a communication node: issued from the communication stream, which waits only for the event of
            # its producer (this compute stream, now), not for compute issued later; the consumer's
            # work.wait() makes its stream wait for the all-to-all (ProcessGroupNCCL keeps x and out alive)
            produced = torch.cuda.Event()
            produced.record()
            with torch.cuda.stream(self.comm_stream):
                self.comm_stream.wait_event(produced)
                work = issue()
        else:
            work = issue()
        self.pending[node] = (work, out, t, label)

    def _wait(self, node: str) -> torch.Tensor:
        work, out, issued, label = self.pending.pop(node)
        if label is None:  # the counts of a capacity dispatch: waited with its rows, not an event of its own
            work.wait()
            return out
        t = self.clock()
        if self.wait_hook is not None:
            self.wait_hook(work, node)
        else:
            work.wait()
        end = self.clock()
        self.record("wait", "a2a_wait", label, t, end)
        self.record("comm", "ep_a2a", label, issued, end)
        return out

    def _timed(self, name: str, fn: Callable[[], None], direction: str) -> None:
        t = self.clock()
        if direction == "F":
            with forward_key(self.key):
                fn()
        else:
            fn()
        self.record("node", direction, f"{self.key[0]}{direction}{self.mb}:{name}", t, self.clock())

    @staticmethod
    def _autograd(outputs, grads) -> None:
        outs, gs = [], []
        for o, g in zip(outputs, grads):
            if o is not None and o.requires_grad and g is not None:
                outs.append(o)
                gs.append(g)
        if outs:
            torch.autograd.backward(outs, grad_tensors=gs)

    def _first_input(self, i: int) -> torch.Tensor:
        if i == self.order[0]:
            return _leaf(self._embed_out) if self.stage.is_first else self.input
        return _leaf(self.state[self.order[self.order.index(i) - 1]].h_out)

    # -- forward ----------------------------------------------------------------------------------
    def begin(self, inp: torch.Tensor) -> None:
        """Stage input: token ids ``[b, T]`` on the first stage, else a leaf ``[b, T, H]`` requiring grad."""
        self.input = inp

    def forward(self, name: str) -> None:
        """Run (compute) or issue (communication) forward node ``name``."""
        if name == "embed":
            def run():
                self._embed_out = self.stage.embed(self.input)
            return self._timed(name, run, "F")
        if name == "head":
            def run():
                self._head_in = _leaf(self.state[self.order[-1]].h_out)
                loss = TinyMoEModel.loss_sum(self.stage.lm_head(self.stage.norm(self._head_in)), self.targets)
                if self.loss_sink is not None:
                    self.loss_sink(loss.detach())  # a tensor: read at the end of the step
                self.output = loss / self.N
            return self._timed(name, run, "F")
        lid, node = name[1:].split(".")
        i = int(lid)
        if node == "pre":
            return self._forward_pre(name, i)
        if node == "dispatch":
            return self._forward_dispatch(name, i)
        if node == "experts":
            return self._forward_experts(name, i)
        st, c, moe = self.state[i], self.comm, self.layers[i].moe
        if node == "combine":
            if c is None:
                st.yp = st.y.detach()
                return
            self._a2a(name, st.y.detach(), st.splits[0], st.splits[1], c.group_fwd)
            return
        if node == "post":
            def run():
                if c is not None:
                    st.yp = self._wait(f"L{i}.combine")
                st.yp = _leaf(st.yp)
                h_mid, _, xs, xg, w = st.leaves
                out = _unpermute(st.yp if st.cap is None else st.cap.receive(st.yp), st.plan, w)
                if moe.shared is not None:
                    out = out + moe._shared(xs, xg)
                st.h_out = h_mid + out.view_as(h_mid)
                if i == self.order[-1] and not self.stage.is_last:
                    self.output = st.h_out
            return self._timed(name, run, "F")
        raise KeyError(name)  # pragma: no cover - names come from node_names()

    def _forward_pre(self, name: str, i: int) -> None:
        """Layer ``i``'s mixer, post-norm and router: the routing plan, the permuted expert inputs (packed per
        destination under capacity dispatch) and the leaves the backward starts from."""
        layer, st = self.layers[i], self.state[i]
        moe, c = layer.moe, self.comm

        def run():
            st.h_in = h = self._first_input(i)
            h_mid = layer.mix(h)
            x = layer.post_norm(h_mid).reshape(-1, h_mid.shape[-1])
            x_router, x_perm, x_shared, x_gate = moe._inputs(x)
            fixed = moe.capacity_mode(x.device, x.shape[0])
            st.plan = moe._route(x_router, fixed)
            xp = permute(x_perm, st.plan)
            if fixed:  # capacity dispatch: rows packed per destination here, indices built on the device
                P = 1 if c is None else c.ep_size
                st.cap = CapacityDispatch(P, moe.num_experts // P, *moe.capacity(st.plan.num_tokens, P))
                xp = st.cap.send(xp, st.plan.send_counts)
            st.outs = [h_mid, xp, x_shared, x_gate, st.plan.topk_weight]
            st.leaves = [_leaf(o) for o in st.outs]
        return self._timed(name, run, "F")

    def _forward_dispatch(self, name: str, i: int) -> None:
        """Issue layer ``i``'s dispatch all-to-all (after the blocking count exchange that sizes it, unless capacity
        dispatch fixed the splits); without expert parallelism the inputs stay local."""
        st, c = self.state[i], self.comm
        xp = st.leaves[1].detach()
        if c is None:
            st.recv = xp
            return
        P, El = c.ep_size, c.experts_per_rank
        if st.cap is not None:  # equal splits known in advance, counts sent with the rows: no host read
            cd = [st.cap.cd] * P
            st.splits = (cd, cd, None)
            self._a2a(name, xp, cd, cd, c.group_fwd, counts=st.plan.send_counts)
            return
        t = self.clock()
        recv_counts, sc = c.exchange_counts(st.plan.send_counts, self.key)  # blocking: it sizes the dispatch
        in_splits = [sum(sc[q * El:(q + 1) * El]) for q in range(P)]
        self.record("wait", "a2a_wait", f"L{i}.counts[{self.key[0]},{self.mb}]", t, self.clock())
        if self.on_counts is not None:
            self.on_counts(self.key, i, recv_counts, sc)
        # the expert-major index is copied to the device here, where the count exchange's host read has just drained
        # the stream: after the dispatch's wait its blocking copy would hold the host until the all-to-all finished
        index = expert_major(recv_counts, P, El, xp.device)
        st.splits = (in_splits, [sum(r) for r in recv_counts], index)
        self._a2a(name, xp, st.splits[1], in_splits, c.group_fwd)

    def _forward_experts(self, name: str, i: int) -> None:
        """Layer ``i``'s local experts on the received rows (capacity slots, local splits, or expert-major order of
        the received counts)."""
        layer, st = self.layers[i], self.state[i]
        moe, c = layer.moe, self.comm

        def run():
            if st.cap is not None:
                if c is None:
                    st.recv, counts = _leaf(st.recv), st.plan.send_counts
                else:
                    st.recv = _leaf(self._wait(f"L{i}.dispatch"))
                    counts = self._wait(f"L{i}.dispatch.counts")
                xs = st.cap.expert_inputs(st.recv, counts)
                ids = range(moe.num_experts) if c is None else c.local_experts
                st.y = st.cap.expert_outputs([moe.experts[str(e)](xe) for e, xe in zip(ids, xs)])
                return
            if c is None:
                st.recv = _leaf(st.recv)
                xs = st.recv.split(st.plan.send_counts.tolist(), dim=0)
                st.y = torch.cat([moe.experts[str(e)](xs[e]) for e in range(moe.num_experts)], dim=0)
                return
            st.recv = _leaf(self._wait(f"L{i}.dispatch"))
            gather, inverse, per_expert = st.splits[2]  # built before the dispatch (_forward_dispatch)
            xs = list(st.recv.index_select(0, gather).split(per_expert, dim=0))
            ys = [moe.experts[str(e)](xe) for e, xe in zip(c.local_experts, xs)]
            st.y = torch.cat(ys, dim=0).index_select(0, inverse)
        return self._timed(name, run, "F")

    def _backward_a2a(self, name: str, st: Any, attr: str, local_key: str, splits: tuple[int, int]) -> None:
        """Backward of an all-to-all node: the gradient of ``st.<attr>`` goes back with the forward's splits
        swapped (``st.splits[splits[0]]`` out, ``st.splits[splits[1]]`` in), issued asynchronously; without an
        EP group (no splits) it is kept under ``local_key``."""
        g = getattr(st, attr).grad
        setattr(st, attr, None)
        if self.comm is None:
            self._g[local_key] = g
            return
        self._a2a(name + ".bwd", g, st.splits[splits[0]], st.splits[splits[1]], self.comm.group_bwd)

    def run_forward(self) -> None:
        """Every forward node in program order (one bundle alone, as the pair measurements time it)."""
        for k in self.fwd_keys:
            self.forward(k)

    def run_backward(self, grad: torch.Tensor | None) -> None:
        """:meth:`begin_backward` with ``grad``, then every backward node in program order."""
        self.begin_backward(grad)
        for k in self.bwd_keys:
            self.backward(k)

    # -- backward ---------------------------------------------------------------------------------
    def begin_backward(self, grad: torch.Tensor | None) -> None:
        """Gradient of the stage output (None on the last stage, where backward starts at the loss)."""
        self._g["out"] = grad

    def backward(self, name: str) -> None:
        """Run (compute) or issue (communication) backward node ``name``. Weight gradients go to
        ``param.grad`` unless the pipeline deferred this key's W
        (:meth:`~tessera_lab.runner.runtime.layers.WeightGradStore.defer`)."""
        if name == "head":
            def run():
                torch.autograd.backward(self.output)
                self._g["out"] = self._head_in.grad
                self._head_in = None
            return self._timed(name, run, "B")
        if name == "embed":
            def run():
                self._autograd([self._embed_out], [self._g.pop("h")])
                self._embed_out = None
            return self._timed(name, run, "B")
        lid, node = name[1:].split(".")
        i = int(lid)
        st, c = self.state[i], self.comm
        if node == "post":
            def run():
                g = self._g.pop("out") if i == self.order[-1] else self._g.pop("h")
                self._autograd([st.h_out], [g])
                st.h_out = None
            return self._timed(name, run, "B")
        if node == "combine":  # the combine's backward is a dispatch of the output gradient
            return self._backward_a2a(name, st, "yp", f"L{i}.y", (1, 0))
        if node == "experts":
            def run():
                g = self._g.pop(f"L{i}.y") if c is None else self._wait(f"L{i}.combine.bwd")
                self._autograd([st.y], [g])
                st.y = None
            return self._timed(name, run, "B")
        if node == "dispatch":  # and the dispatch's backward a combine of the expert-input gradient
            return self._backward_a2a(name, st, "recv", f"L{i}.xp", (0, 1))
        if node == "pre":
            def run():
                g_xp = self._g.pop(f"L{i}.xp") if c is None else self._wait(f"L{i}.dispatch.bwd")
                grads = [x.grad if x is not None else None for x in st.leaves]
                grads[1] = g_xp
                self._autograd(st.outs, grads)
                st.outs = st.leaves = st.plan = st.cap = None
                if i == self.order[0]:
                    if self.stage.is_first:
                        self._g["h"] = st.h_in.grad
                    else:
                        self.input_grad = st.h_in.grad
                else:
                    self._g["h"] = st.h_in.grad
                st.h_in = None
            return self._timed(name, run, "B")
        raise KeyError(name)  # pragma: no cover
