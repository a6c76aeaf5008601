"""One pair-makespan function for an issue order of tasks on lanes, with an explicit execution semantics.

:func:`pair_makespan` is the makespan every part of the package uses for a forward/backward pair (or any small
task graph issued in one order):

* ``semantics="streams"`` (a GPU: CUDA work is asynchronous, the host never blocks): a compute stream and a
  communication stream, each running its tasks in issue order; a task starts when its stream is free and its
  dependencies are done; while both streams are busy the compute-lane task progresses at
  ``1 / (1 + contention.slowdown(class))`` and the communication at ``1 / (1 + contention.comm_slowdown(class of
  the compute-lane task))`` (:class:`~tessera_lab.cost.contention.Contention`, rates integrated exactly between
  events); or, when ``demands`` are given (the analytic cost model), at the rates
  :func:`~tessera_lab.cost.contention.shared_rates` derives for each (compute task, communication task) from what
  the two ask of the SMs, HBM and the one host thread that issues both streams (docs/cost-model.md).
* ``semantics="host_issue"`` (the CPU testbed): one host thread walks the order; a compute task runs on the host
  when it reaches it and its inputs are there; a communication task is *issued* asynchronously and runs on the
  lane of its side (the key's prefix before the first ``.``, e.g. ``f`` / ``b``: separate process groups);
  ``issue_overhead`` seconds of host time per issued communication.

:class:`StreamPair` is the ``streams`` semantics itself, compiled for one task graph (integer indices, per-task
rates): :func:`pair_makespan` builds one and runs it once; the overlap scheduler's order search
(:mod:`tessera_lab.overlap.search`) keeps one and evaluates thousands of issue orders through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from tessera_lab.cost.contention import COMPUTE, Contention, Demand, shared_rates
from tessera_lab.errors import ConfigError

SEMANTICS = ("streams", "host_issue")


@dataclass(frozen=True)
class LaneResult:
    """Result of :func:`pair_makespan`: makespan (s), each task's ``(start, end)`` seconds by key (in the order the
    tasks started) and the lane of every key."""

    makespan: float
    spans: dict[str, tuple[float, float]]
    lanes: dict[str, str]

    def comm_hidden_fraction(self) -> float:
        """Share of communication time during which the compute lane was busy (0 if no communication)."""
        comm = [(s, e) for k, (s, e) in self.spans.items() if self.lanes[k] == "comm" and e > s]
        comp = sorted((s, e) for k, (s, e) in self.spans.items() if self.lanes[k] == "compute" and e > s)
        total = sum(e - s for s, e in comm)
        if total <= 0:
            return 0.0
        hidden = 0.0
        for cs, ce in comm:
            for s, e in comp:
                hidden += max(0.0, min(ce, e) - max(cs, s))
        return hidden / total


class StreamPair:
    """A task graph compiled for repeated ``streams`` evaluations (seconds).

    Args:
        keys: every task key.
        durations: standalone seconds per key (>= 0).
        lanes: ``compute`` or ``comm`` per key.
        deps: keys each task waits for.
        contention: slowdowns while both lanes are busy; classes: kernel class per key (default ``compute``).
        demands: per key, what the task asks of the shared resources
            (:class:`~tessera_lab.cost.contention.Demand`); a (compute, comm) overlap whose two keys both have one
            runs at :func:`~tessera_lab.cost.contention.shared_rates` instead of the class constants.

    Raises:
        ConfigError: an unknown lane or a negative duration.
    """

    def __init__(self, keys: Sequence[str], durations: Mapping[str, float], lanes: Mapping[str, str],
                 deps: Mapping[str, Sequence[str]], contention: Contention = Contention(),
                 classes: Mapping[str, str] | None = None, demands: Mapping[str, Demand] | None = None):
        self.keys = tuple(keys)
        self.index = {k: i for i, k in enumerate(self.keys)}
        for k in self.keys:
            if lanes[k] not in ("compute", "comm"):
                raise ConfigError(f"task {k!r} has lane {lanes[k]!r}; allowed: compute, comm")
            if durations[k] < 0:
                raise ConfigError(f"task {k!r} has duration {durations[k]}; allowed: >= 0")
        self.dur = [float(durations[k]) for k in self.keys]
        self.is_comm = [lanes[k] == "comm" for k in self.keys]
        idx = self.index
        self.deps = [tuple(idx[d] for d in deps.get(k, ()) if d in idx) for k in self.keys]
        classes = classes or {}
        # rates while both lanes are busy, by the compute-lane task: its own rate and the communication's
        self.rate_c = [1.0 / (1.0 + contention.slowdown(classes.get(k, COMPUTE))) for k in self.keys]
        self.rate_m = [1.0 / (1.0 + contention.comm_slowdown(classes.get(k, COMPUTE))) for k in self.keys]
        self.pair_rates = self._pair_rates(demands) if demands else None

    def _pair_rates(self, demands: Mapping[str, Demand]) -> list:
        """``[compute index][comm index] -> (rate_c, rate_m)`` from the demands (class rates where one is missing)."""
        keys, comm = self.keys, [i for i, c in enumerate(self.is_comm) if c]
        table: list = [None] * len(keys)
        for i, k in enumerate(keys):
            if self.is_comm[i]:
                continue
            row: list = [None] * len(keys)
            for j in comm:
                dc, dm = demands.get(k), demands.get(keys[j])
                row[j] = shared_rates(dc, dm) if dc is not None and dm is not None else (self.rate_c[i], self.rate_m[i])
            table[i] = row
        return table

    def makespan(self, order: Sequence[str]) -> float:
        """Makespan (s) of an issue order (keys, each once; keys left out count as done); ``inf`` when the order
        cannot complete (a task waits on one queued behind it on its lane)."""
        idx = self.index
        ids = [idx[k] for k in order]
        is_comm = self.is_comm
        return self.run([i for i in ids if not is_comm[i]], [i for i in ids if is_comm[i]])

    def projection_makespan(self, comp: Sequence[str], comm: Sequence[str]) -> float:
        """Makespan (s) of the compute-lane key sequence ``comp`` and comm-lane key sequence ``comm``."""
        idx = self.index
        return self.run([idx[k] for k in comp], [idx[k] for k in comm])

    # long: the two-lane model's hot event loop; its steps share state kept in locals for speed
    def run(self, comp: Sequence[int], comm: Sequence[int], spans: list | None = None) -> float:
        """Makespan (s) of the compute-lane sequence ``comp`` and comm-lane sequence ``comm`` (task indices);
        ``inf`` when they cannot complete. ``spans``: a list to append ``(index, start, end)`` of each task to, in
        the order the tasks start (``end`` is filled in when the task finishes)."""
        dur, deps, rate_c, rate_m, pair = self.dur, self.deps, self.rate_c, self.rate_m, self.pair_rates
        n = len(comp) + len(comm)
        done = [True] * len(dur)
        for i in comp:
            done[i] = False
        for i in comm:
            done[i] = False
        lc, lm = len(comp), len(comm)
        ic = im = ndone = 0
        ck = mk = -1
        crem = mrem = 0.0
        t = 0.0
        while ndone < n:
            progressed = True
            while progressed:  # start everything that can start now (zero-length tasks finish at once)
                progressed = False
                if ck < 0 and ic < lc:
                    k = comp[ic]
                    for d in deps[k]:
                        if not done[d]:
                            break
                    else:
                        ic += 1
                        if dur[k] <= 0:
                            done[k] = True
                            ndone += 1
                            if spans is not None:
                                spans.append([k, t, t])
                        else:
                            ck, crem = k, dur[k]
                            if spans is not None:
                                cspan = [k, t, math.nan]
                                spans.append(cspan)
                        progressed = True
                if mk < 0 and im < lm:
                    k = comm[im]
                    for d in deps[k]:
                        if not done[d]:
                            break
                    else:
                        im += 1
                        if dur[k] <= 0:
                            done[k] = True
                            ndone += 1
                            if spans is not None:
                                spans.append([k, t, t])
                        else:
                            mk, mrem = k, dur[k]
                            if spans is not None:
                                mspan = [k, t, math.nan]
                                spans.append(mspan)
                        progressed = True
            if ndone == n:
                break
            if ck >= 0 and mk >= 0:
                rc, rm = pair[ck][mk] if pair is not None else (rate_c[ck], rate_m[ck])
                a, b = crem / rc, mrem / rm
                step = a if a < b else b
                t += step
                crem -= step * rc
                mrem -= step * rm
                thr = 1e-15 * (t if t > 1.0 else 1.0)
                if crem <= thr:
                    done[ck] = True
                    ndone += 1
                    ck = -1
                    if spans is not None:
                        cspan[2] = t
                if mrem <= thr:
                    done[mk] = True
                    ndone += 1
                    mk = -1
                    if spans is not None:
                        mspan[2] = t
            elif ck >= 0:
                t += crem
                done[ck] = True
                ndone += 1
                ck = -1
                if spans is not None:
                    cspan[2] = t
            elif mk >= 0:
                t += mrem
                done[mk] = True
                ndone += 1
                mk = -1
                if spans is not None:
                    mspan[2] = t
            else:
                return math.inf
        return t if n else 0.0


def _host_issue(order: Sequence[str], durations: Mapping[str, float], lanes: Mapping[str, str],
                deps: Mapping[str, Sequence[str]], issue_overhead: float) -> LaneResult:
    """``host_issue`` semantics (module docstring); durations default to 0."""
    host = 0.0
    done: dict[str, float] = {}
    spans: dict[str, tuple[float, float]] = {}
    lane_free: dict[str, float] = {}
    for k in order:
        dep_end = max((done[d] for d in deps.get(k, ())), default=0.0)
        d = float(durations.get(k, 0.0))
        if lanes[k] == COMPUTE:
            start = max(host, dep_end)
            host = done[k] = start + d
        else:
            side = k.split(".")[0]
            start = max(host, dep_end, lane_free.get(side, 0.0))
            lane_free[side] = done[k] = start + d
            host += issue_overhead
        spans[k] = (start, done[k])
    return LaneResult(max([host] + list(done.values())), spans, dict(lanes))


def _streams(order: Sequence[str], durations: Mapping[str, float], lanes: Mapping[str, str],
             deps: Mapping[str, Sequence[str]], contention: Contention,
             classes: Mapping[str, str] | None, demands: Mapping[str, Demand] | None = None) -> LaneResult:
    """``streams`` semantics (module docstring), through :class:`StreamPair`, with every task's span."""
    sp = StreamPair(order, durations, lanes, deps, contention, classes, demands)
    comp = [i for i, c in enumerate(sp.is_comm) if not c]
    comm = [i for i, c in enumerate(sp.is_comm) if c]
    got: list = []
    t = sp.run(comp, comm, got)
    keys = sp.keys
    if t == math.inf:
        started = {k for k, _, _ in got}
        waiting = [keys[q[0]] for q in ([i for i in comp if i not in started], [i for i in comm if i not in started])
                   if q]
        raise ConfigError(f"issue order cannot complete: {', '.join(waiting)} wait on tasks queued behind them")
    return LaneResult(t, {keys[k]: (s, e) for k, s, e in got}, dict(lanes))


def pair_makespan(order: Sequence[str], durations: Mapping[str, float], lanes: Mapping[str, str],
                  deps: Mapping[str, Sequence[str]], *, semantics: str = "streams",
                  contention: Contention = Contention(), classes: Mapping[str, str] | None = None,
                  demands: Mapping[str, Demand] | None = None, issue_overhead: float = 0.0) -> LaneResult:
    """Run tasks issued in ``order`` on their lanes under ``semantics`` and return the makespan and every span.

    Args:
        order: task keys in issue order (every key once).
        durations: standalone seconds per key (>= 0).
        lanes: ``"compute"`` or ``"comm"`` per key.
        deps: keys each task waits for (keys not in ``order`` count as done).
        semantics: ``"streams"`` (a GPU's two streams with contention) or ``"host_issue"`` (the CPU testbed: one
            host thread, communication issued asynchronously); module docstring.
        contention, classes: the slowdown while both streams are busy and each key's kernel class (default
            ``compute``); ``streams`` only.
        demands: per key, what the task asks of the SMs, HBM and the host thread both streams share
            (:class:`~tessera_lab.cost.contention.Demand`); given, overlaps run at
            :func:`~tessera_lab.cost.contention.shared_rates` (``streams`` only; the analytic cost model's
            :meth:`~tessera_lab.cost.analytic.CostModel.demand`).
        issue_overhead: host seconds per issued communication; ``host_issue`` only.

    Returns:
        :class:`LaneResult` (seconds).

    Raises:
        ConfigError: unknown semantics, unknown lane, negative duration, or (streams) an order that cannot complete
            (a task waits on a task queued behind it on its lane).
    """
    if semantics == "host_issue":
        return _host_issue(order, durations, lanes, deps, issue_overhead)
    if semantics != "streams":
        raise ConfigError(f"field 'semantics' = {semantics!r} is unknown; allowed: {', '.join(SEMANTICS)}")
    return _streams(order, durations, lanes, deps, contention, classes, demands)


def side_stream_makespan(lanes_s: float, side: Sequence[tuple[float, float]]) -> float:
    """Seconds of a bundle whose two lanes take ``lanes_s`` alone, beside collectives on streams of their own
    (``side``: ``(seconds, SM share)`` per collective; Megatron FSDP's prefetched gathers and reduce-scatters). They
    run one after another on their own link for ``T = sum t_i`` from the bundle's start; while one runs, its kernel
    holds the share ``s_i`` of the SMs and the lanes progress at ``1 - s_i`` (treated as compute; HBM left out), so
    ``max(T, lanes_s + sum s_i t_i)``. Example: lanes 10 ms beside one 20 ms gather holding 16 of 132 SMs: 20 ms; a
    4 ms one: 10.48 ms."""
    if not side:
        return lanes_s
    return max(sum(t for t, _ in side), lanes_s + sum(t * share for t, share in side))
