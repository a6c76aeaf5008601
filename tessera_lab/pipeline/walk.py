"""The one walker over per-rank action lists (:class:`Walk`) and its replay policy (:class:`_Replay`); the event
engine (:mod:`tessera_lab.pipeline.engine`) re-exports :class:`Walk` and runs its simulation as a policy on it. This
module imports nothing of the pipeline package (the NCCL check in :mod:`tessera_lab.pipeline.p2p`, below the engine,
uses it). Never imports torch."""

from __future__ import annotations

import heapq
from typing import Callable

from tessera_lab.errors import DeadlockError
from tessera_lab.pipeline.actions import ActionType

__all__ = ["Walk"]


def _deadlock(name: str, stuck: dict, blocking: str = "", detail: bool = True) -> DeadlockError:
    """The error for a walk that cannot finish: ``stuck`` maps each rank with actions left to its next action."""
    more = " (" + "; ".join(f"rank {r} waits at {a}" for r, a in sorted(stuck.items())) + ")" if detail else ""
    return DeadlockError(f"deadlock in schedule {name!r}{blocking}: ranks {sorted(stuck)} cannot progress{more}", stuck)


class Walk:
    """The engine's one walker over per-rank action lists; what a walk does at each step is its policy's.

    State: each rank's clock (``clock[r]``, seconds), the inputs produced so far (``arrival[key]``: the time the
    input is at its consumer), the ranks parked on a missing input (``parked``, or a policy's own table of the same
    form), and the agenda of due ranks. The driver (:meth:`run`) takes the due rank the tie order gives and calls the
    policy hook ``step(r)``; a policy with a resource model also passes ``advance()``, which moves time on when no
    rank is due. Tie orders:

    * ``by_clock=True``: the rank due first by clock, ties to the lower rank (global time order: for policies whose
      decisions depend on the time, the dynamic controller's execution, :func:`tessera_lab.dynamic.online.execute`,
      and processor sharing, :meth:`run_shared`);
    * ``by_clock=False``: a stack, the rank made due last first, each running until it parks (the simulation's
      event loop, :func:`simulate`: its times do not depend on the order; the timeline's event order does; and
      zb-auto's candidate replay, :meth:`replay`)."""

    __slots__ = ("clock", "arrival", "parked", "agenda", "queued", "by_clock")

    def __init__(self, num_ranks: int, by_clock: bool = True):
        self.clock = [0.0] * num_ranks
        self.arrival: dict[tuple, float] = {}
        self.parked: dict[tuple, list[int]] = {}
        self.by_clock = by_clock
        self.agenda: list = [(0.0, r) for r in range(num_ranks)] if by_clock else list(range(num_ranks))
        self.queued = [True] * num_ranks  # (stack order) rank is on the agenda

    def resume(self, r: int) -> None:
        """Rank ``r`` is due (by clock: at its clock, after the ranks due earlier)."""
        if self.by_clock:
            heapq.heappush(self.agenda, (self.clock[r], r))
        elif not self.queued[r]:
            self.queued[r] = True
            self.agenda.append(r)

    def park(self, r: int, key: tuple) -> None:
        """Rank ``r`` waits for input ``key`` (due again when it is produced)."""
        self.parked.setdefault(key, []).append(r)

    def wake(self, key: tuple, table: dict | None = None) -> None:
        """The ranks parked on ``key`` (in ``table``, default :attr:`parked`) are due again."""
        waiting = (self.parked if table is None else table).pop(key, ())
        if self.by_clock:
            for q in waiting:
                heapq.heappush(self.agenda, (self.clock[q], q))
        else:
            queued, agenda = self.queued, self.agenda
            for q in waiting:
                if not queued[q]:
                    queued[q] = True
                    agenda.append(q)

    def waker(self, table: dict | None = None) -> Callable[[tuple], None]:
        """:meth:`wake` on ``table`` (default :attr:`parked`) as a one-argument function specialised for the tie
        order, for a policy's hot loop: ``waker(t)(key)`` does what ``wake(key, t)`` does."""
        pop = (self.parked if table is None else table).pop
        if self.by_clock:
            clock, agenda, push = self.clock, self.agenda, heapq.heappush

            def wake_by_clock(key: tuple) -> None:
                for q in pop(key, ()):
                    push(agenda, (clock[q], q))

            return wake_by_clock
        queued, agenda = self.queued, self.agenda

        def wake_stack(key: tuple) -> None:
            for q in pop(key, ()):
                if not queued[q]:
                    queued[q] = True
                    agenda.append(q)

        return wake_stack

    def produce(self, key: tuple, when: float) -> None:
        """Input ``key`` is at its consumer at ``when``: the ranks parked on it are due again."""
        self.arrival[key] = when
        if key in self.parked:
            self.wake(key)

    def run(self, step: Callable[[int], bool], advance: Callable[[], bool] | None = None) -> None:
        """Take the due rank the tie order gives (by clock: move its clock to the time it was due) and call the policy
        hook ``step(r)`` (again while it returns ``True``: the rank goes on at once); when no rank is due, call
        ``advance()`` (a resource model moving time on; ``True``: ranks may be due again) or stop (all finished, or
        the rest parked: see :meth:`check_finished`)."""
        agenda, clock, queued, pop = self.agenda, self.clock, self.queued, heapq.heappop
        while True:
            if self.by_clock:
                while agenda:
                    t, r = pop(agenda)
                    if t > clock[r]:
                        clock[r] = t
                    while step(r):
                        pass
            else:
                while agenda:
                    r = agenda.pop()
                    queued[r] = False
                    while step(r):
                        pass
            if advance is None or not advance():
                return

    @staticmethod
    def check_finished(name: str, lists: list, pc: list[int]) -> None:
        """Raise :class:`DeadlockError` (``stuck``: rank -> its next action) when a rank has actions left."""
        stuck = {r: str(lists[r][pc[r]]) for r in range(len(lists)) if pc[r] < len(lists[r])}
        if stuck:
            raise _deadlock(name, stuck, detail=False)

    def replay(self, lists: list, stage_to_rank: list[int], m: int, f, i, w, p2p: float) -> float | None:
        """Makespan (seconds) of per-rank F/I/W-only orders (``lists[r]``: actions with ``.type`` F, I or W,
        ``.stage`` < ``len(f)`` and ``.microbatch`` < ``m``; ``stage_to_rank[s]``: the rank of stage ``s``) under per-stage
        seconds ``f[s]``, ``i[s]``, ``w[s]``, ``p2p`` seconds per hop between ranks: the simulator's rules with
        non-blocking sends and its float operations (so its number), on flat tables and no events; ``None`` if the
        orders cannot run (a rank waits for an input never produced). Stack order (:class:`_Replay`)."""
        replay = _Replay(self, lists, stage_to_rank, m, f, i, w, p2p)
        self.run(replay.step)
        return replay.makespan()

    def run_shared(self, programs: list[list[tuple]], speed: Callable[[int, int], float],
                   spent: Callable[[float, int], None], p2p: float = 0.0) -> tuple[float, list[float]]:
        """Processor sharing: every rank runs ``programs[r]``, entries ``(needs, produces, work, latency)``
        (``needs``: ``(kind, stage, mb, cross)``; ``produces``: ``(kind, stage, mb)``; ``work`` seconds at speed 1
        then ``latency`` seconds blocked), each action once its inputs are available (``p2p`` seconds after their
        producer ended when ``cross``). The resource model ``speed(computing, waiting)`` gives the speed of each
        computing rank while ``computing`` ranks compute and ``waiting`` ranks wait or block; ``spent(dt,
        computing)`` is told each interval. Time advances to the next completion or arrival (:class:`~tessera_lab.pipeline.walk_policies.SharingPolicy`).

        Returns ``(iteration seconds, per-rank computing + blocked seconds)``.

        Raises:
            ConfigError: no rank can progress (an input never produced)."""
        from tessera_lab.pipeline.walk_policies import SharingPolicy

        sharing = SharingPolicy(self, programs, speed, spent, p2p)
        self.run(sharing.step, sharing.advance)
        return sharing.t, sharing.busy


class _Replay:
    """An F/I/W-only replay as a policy on the walker (stack order): the hook ``step(r)`` runs rank ``r``'s actions
    while their inputs are there (F after its previous stage's F, I after its own F and the next stage's I, W after
    its own I; a cross-rank input ``p2p`` seconds after it ended) and parks it on the first missing one; the ranks
    holding the neighbouring stages of what ``r`` ran, if parked on an input now there, are due again."""

    def __init__(self, walk: Walk, lists, stage_to_rank, m: int, f, i, w, p2p: float):
        R, S = len(lists), len(f)
        self.walk, self.lists, self.pos = walk, lists, [0] * R
        f_end = [[None] * m for _ in range(S)]  # stage -> micro-batch -> end of its F (None: not yet)
        i_end = [[None] * m for _ in range(S)]
        cross = [p2p if stage_to_rank[s] != stage_to_rank[s + 1] else 0.0 for s in range(S - 1)]  # e + 0.0 is e
        #: per stage: its F and I end tables, the previous stage's F table and hop (None: first stage), the next
        #: stage's I table and hop (None: last stage), and its F, I and W seconds
        stages = [(f_end[s], i_end[s], f_end[s - 1] if s else None, cross[s - 1] if s else 0.0,
                   i_end[s + 1] if s < S - 1 else None, cross[s] if s < S - 1 else 0.0, f[s], i[s], w[s])
                  for s in range(S)]
        neighbours: list[set] = [set() for _ in range(R)]  # the ranks of the stages next to a rank's own
        for s in range(S - 1):
            a, b = stage_to_rank[s], stage_to_rank[s + 1]
            if a != b:
                neighbours[a].add(b)
                neighbours[b].add(a)
        self.step = self._hook(stages, [sorted(n) for n in neighbours])

    def _hook(self, stages: list[tuple], neighbours: list[list[int]]) -> Callable[[int], bool]:
        """The hook ``step(r)``: run rank ``r`` until it parks or ends, then make due again each neighbour whose
        missing input (``wait_row[q][wait_mb[q]]``) is now there; always ``False``."""
        lists, pos, clock = self.lists, self.pos, self.walk.clock
        queued, agenda = self.walk.queued, self.walk.agenda  # stack order: Walk.resume inlined (the hot path)
        wait_row: list = [None] * len(lists)  # a parked rank's missing input: its table row and micro-batch
        wait_mb = [0] * len(lists)
        _F, _I = ActionType.F, ActionType.I

        def step(r: int) -> bool:
            acts, p, tr, missing, cur, k = lists[r], pos[r], clock[r], None, -1, 0
            n = len(acts)
            while p < n:
                a = acts[p]
                k, kind = a.microbatch, a.type
                if a.stage != cur:
                    cur = a.stage
                    fe, ie, fprev, hf, inext, hi, fs, is_, ws = stages[cur]
                if kind is _F:
                    if fprev is not None:
                        e = fprev[k]
                        if e is None:
                            missing = fprev
                            break
                        e = e + hf
                        tr = e if e > tr else tr
                    tr = fe[k] = tr + fs
                elif kind is _I:
                    e = fe[k]
                    if e is None:
                        missing = fe
                        break
                    tr = e if e > tr else tr
                    if inext is not None:
                        e = inext[k]
                        if e is None:
                            missing = inext
                            break
                        e = e + hi
                        tr = e if e > tr else tr
                    tr = ie[k] = tr + is_
                else:
                    e = ie[k]
                    if e is None:
                        missing = ie
                        break
                    tr = e if e > tr else tr
                    tr = tr + ws
                p += 1
            pos[r], clock[r], wait_row[r], wait_mb[r] = p, tr, missing, k
            for q in neighbours[r]:
                row = wait_row[q]
                if row is not None and row[wait_mb[q]] is not None:
                    wait_row[q] = None
                    if not queued[q]:
                        queued[q] = True
                        agenda.append(q)
            return False

        return step

    def makespan(self) -> float | None:
        """The last rank's end (seconds), or ``None`` when a rank has actions left."""
        if any(p < len(acts) for p, acts in zip(self.pos, self.lists)):
            return None
        return max(self.walk.clock)
