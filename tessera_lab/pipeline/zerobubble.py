"""Zero-bubble schedules built by greedy list scheduling: ZB-H2 within ``2p - 1`` micro-batches, ZB-V, and
the ``zb-auto`` search from per-stage F, I, W times, p2p time and a memory budget.

The engine (:func:`greedy_order`) is a list scheduler in the spirit of the Zero Bubble paper's heuristic
(Qi et al., ICLR 2024, section 3; sail-sg's ``zb.py`` runs several greedy orderings with a few policy switches
and keeps the shortest). Each rank, in order of the time it becomes free, runs the first of:

1. the oldest input gradient (I) whose inputs have arrived (the I chain is the critical path);
2. a forward (F) whose input has arrived, if the rank's activations stay within the memory budget (a
   micro-batch entering a rank's first stage reserves room for its later-stage forwards on that rank; and,
   with ``stagger``, fewer than ``2 (p - r) - 1`` micro-batches await their I on rank ``r``), unless
   ``f_first`` is off and a weight gradient is pending;
3. the oldest pending weight gradient (W), which fills idle time and frees memory; with ``fit`` only when it
   ends before the next known F/I can start (otherwise the rank waits for that one);

and otherwise waits for the next arrival. Memory counts a micro-batch from the start of its F to the end of its W
(the simulator's ``peak_activations``); a stage of a rank holding ``c`` stages weighs ``1/c`` micro-batch of the
rank's activations. Times in seconds (any consistent unit). Never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.actions import Action, ActionType
from tessera_lab.pipeline.durations import stage_durations
from tessera_lab.pipeline.engine import Walk, simulate
from tessera_lab.pipeline.generators import _check_int, zb_h1
from tessera_lab.pipeline.ir import Schedule
from tessera_lab.pipeline.zbsingle import (  # noqa: F401 - Policy, POLICIES re-exported
    GreedyGeneral,
    POLICIES,
    Policy,
    check_single,
    greedy_single,
    replay_single,
)

__all__ = ["Policy", "POLICIES", "greedy_order", "zb_h2", "zb_v", "zb_auto", "peak_memory", "order_peak"]

_F, _I, _W = ActionType.F, ActionType.I, ActionType.W


def _per_stage(name: str, value, n: int) -> list[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        vals = [float(value)] * n
    else:
        try:
            vals = [float(x) for x in value]
        except (TypeError, ValueError):
            raise ScheduleError(f"zb-auto: {name} must be seconds (a number or one per stage), got {value!r}") from None
    if len(vals) != n:
        raise ScheduleError(f"zb-auto: {name} has {len(vals)} entries; expected one per stage ({n})")
    if any(not (0.0 <= x < math.inf) for x in vals):
        raise ScheduleError(f"zb-auto: {name}={vals} is out of range; allowed finite seconds >= 0")
    return vals


def greedy_order(
    stage_to_rank: dict[int, int],
    m: int,
    f: Sequence[float],
    i: Sequence[float],
    w: Sequence[float],
    *,
    p2p: float = 0.0,
    memory_budget: float,
    policy: Policy = Policy(),
    inline: bool = True,
) -> dict[int, list[Action]] | None:
    """Per-rank F/I/W orders from the greedy list scheduler, or ``None`` if it gets stuck (budget too small).

    Args:
        stage_to_rank: global stage -> rank (stage ``s`` feeds stage ``s + 1``).
        m: micro-batches.
        f, i, w: per-stage forward, input-gradient and weight-gradient seconds (index = global stage).
        p2p: seconds per transfer between stages on different ranks.
        memory_budget: activations a rank may hold, in micro-batches of its whole activations.
        policy: the :class:`Policy` switches.
        inline: with one stage per rank (stage ``s`` on rank ``s``), run the inlined loop of
            :func:`~tessera_lab.pipeline.zbsingle.greedy_single` (the same orders, about 3x faster); ``False``
            runs the general loop.
    """
    S = len(stage_to_rank)
    if inline and all(stage_to_rank.get(s) == s for s in range(S)):  # one stage per rank, stage s on rank s: inlined
        return greedy_single(m, f, i, w, p2p, memory_budget, policy)
    return GreedyGeneral(stage_to_rank, m, f, i, w, p2p, memory_budget, policy).run()


def _replay(sched: Schedule, durations, p2p: float, budget: float) -> float | None:
    """Makespan of an F/I/W-only order under per-stage ``durations`` (the simulator's rules with non-blocking
    sends and the same float operations, so the same number: :meth:`Walk.replay`), or ``None`` if a rank's peak
    activations exceed ``budget`` or the order cannot run."""
    s2r, S = sched.stage_to_rank, sched.num_stages
    f, i, w = ([durations(s, 0, kind) for s in range(S)] for kind in (_F, _I, _W))
    R = sched.num_ranks
    lists = [sched.actions.get(r, []) for r in range(R)]
    if any(n / max(1, len(sched.rank_stages(r))) > budget + 1e-9 for r, n in enumerate(order_peak(sched))):
        return None
    return Walk(R, by_clock=False).replay(lists, [s2r[s] for s in range(S)], sched.num_microbatches, f, i, w, p2p)


def _schedule(name: str, stage_to_rank: dict[int, int], m: int, lists, **meta) -> Schedule:
    R = max(stage_to_rank.values()) + 1
    return Schedule(name, R, len(stage_to_rank), m, lists, dict(stage_to_rank), dict(meta))


def order_peak(schedule: Schedule) -> list[int]:
    """Per-rank peak live stage-activations from the action order alone (no durations needed): a rank runs its
    list in order, so the simulator's ``peak_activations`` (F start to B or W end) is the running maximum of
    ``+1`` per forward and ``-1`` per B or W; an ``OVERLAP_F_B`` pair holds its forward's activation while it runs.
    Equal to :attr:`Timeline.peak_activations` for every schedule (tested)."""
    out = []
    B = ActionType.B
    for r in range(schedule.num_ranks):
        live = peak = 0
        for a in schedule.actions.get(r, []):
            subs = a.sub_actions
            if not subs:  # a single action: +1 at a forward, -1 at a B or W
                t = a.type
                if t is _F:
                    live += 1
                    if live > peak:
                        peak = live
                elif t is B or t is _W:
                    live -= 1
                continue
            for x in subs:
                if x.type is _F:
                    live += 1
            if live > peak:
                peak = live
            for x in subs:
                if x.type is B or x.type is _W:
                    live -= 1
        out.append(peak)
    return out


def peak_memory(schedule: Schedule, timeline) -> list[float]:
    """Per-rank peak activations in micro-batches of the rank's whole activations: the timeline's
    ``peak_activations`` (stage-activations) divided by the stages per rank."""
    return [timeline.peak_activations[r] / max(1, len(schedule.rank_stages(r))) for r in range(schedule.num_ranks)]


def zb_h2(pp: int, m: int) -> Schedule:
    """ZB-H2 (Zero Bubble, Qi et al., ICLR 2024, section 2.2) within ``2p - 1`` micro-batches of activations.

    The greedy order (module docstring) at unit times (T_F = T_I = T_W, no communication), the setting in which
    the paper hand-crafts it, with a budget of ``2p - 1`` micro-batches per rank and ``stagger`` (rank ``r``
    holds up to ``2 (p - r) - 1`` micro-batches awaiting their I, so the first rank runs ``2p - 1`` warm-up
    forwards); W passes fill the idle slots and the tail, turning 1F1B's trapezoid into a parallelogram. The
    order is then fixed: simulate it with any durations. With ``m >= 2p - 1`` and ``W <= min(F, I)`` the
    simulated makespan is ``m (F + B) + (p - 1) max(F, F + I - 2W)``: the paper's bubble ``(p - 1)(F + I - 2W)``,
    floored at the start-up skew ``(p - 1) F`` one iteration cannot hide (the paper removes it across iterations
    with optimizer post-validation). Peak live activations ``min(2p - 1, m)`` on every rank (tested;
    :func:`tessera_lab.cost.memory.in_flight` charges the same).

    Raises:
        ScheduleError: ``m < pp``.
    """
    pp = _check_int("pp", pp, 1, schedule="zb-h2")
    m = _check_int("microbatches", m, 1, schedule="zb-h2")
    if m < pp:
        raise ScheduleError(f"zb-h2: microbatches={m} is out of range; allowed microbatches >= {pp} (pp={pp})")
    s2r = {s: s for s in range(pp)}
    ones = [1.0] * pp
    lists = greedy_order(s2r, m, ones, ones, ones, memory_budget=2 * pp - 1, policy=Policy(True, True, False))
    return _schedule("zb-h2", s2r, m, lists)


def _v_placement(pp: int) -> dict[int, int]:
    S = 2 * pp
    return {s: (s if s < pp else S - 1 - s) for s in range(S)}



def zb_v(pp: int, m: int) -> Schedule:
    """ZB-V (Zero Bubble, Qi et al., ICLR 2024, section 6): two chunks per rank in V placement (rank ``r`` holds
    stages ``r`` and ``2 pp - 1 - r``), split backward, within 1F1B's peak memory (``pp`` micro-batches of the
    rank's activations, i.e. ``2 pp`` chunk-activations).

    :func:`zb_auto` at unit times (T_F = T_I = T_W per chunk, no communication) with ``vpp=2`` and
    ``memory_budget=pp``; the order is then fixed (simulate it with any durations). Any ``m >= 1``.

    Raises:
        ScheduleError: ``pp < 1`` or ``m < 1``.
    """
    sched = zb_auto(pp, m, vpp=2, memory_budget=pp)
    sched.name = "zb-v"
    return sched


def zb_auto(
    pp: int,
    m: int,
    f: float | Sequence[float] = 1.0,
    i: float | Sequence[float] = 1.0,
    w: float | Sequence[float] = 1.0,
    *,
    p2p: float = 0.0,
    memory_budget: float | None = None,
    vpp: int = 1,
    search: str = "pruned",
) -> Schedule:
    """The shortest zero-bubble schedule the greedy search finds for these times within ``memory_budget``.

    ``search="pruned"`` (the default, one stage per rank) times a fixed set of about ten candidates
    (:func:`_pruned_candidates`), the rules that sail-sg's heuristic shows are enough; ``search="exhaustive"``
    runs the full candidate set described next (as does ``vpp=2`` under either setting). Both always include
    ZB-H1 and ZB-H2, so both are never slower than those within their memory.

    Runs :func:`greedy_order` under every :data:`POLICIES` switch setting, with the given times and at unit
    times, adds ZB-H1, ZB-H1 with ``1 .. K - p`` (five spread values above 4) extra warm-up forwards on the first ``j`` ranks or extra deferred
    W passes on the last ``j`` ranks (every ``j`` up to ``pp = 6``, six spread values above; and both, on
    either half) and ZB-H2 as candidates (single-chunk
    placement, when they apply), simulates each with the given times
    (:func:`~tessera_lab.pipeline.engine.simulate`, ``p2p`` per cross-rank transfer) and keeps the shortest
    whose per-rank peak activations (:func:`peak_memory`) fit the budget (candidates are timed by a lean replay
    of the simulator's rules; the winner by :func:`~tessera_lab.pipeline.engine.simulate`). Hence never slower than ZB-H1 when
    ``memory_budget >= pp`` nor than ZB-H2 when ``memory_budget >= 2 pp - 1`` (same times).

    Args:
        pp: pipeline ranks.
        m: micro-batches (>= 1).
        f, i, w: forward, input-gradient and weight-gradient seconds per micro-batch, one number for every
            stage or a sequence with one per global stage (``pp * vpp`` stages; the full backward is ``i + w``).
        p2p: seconds per activation/gradient transfer between stages on different ranks.
        memory_budget: micro-batches of a rank's activations it may hold at once (``K``); default ``2 pp - 1``
            for ``vpp=1`` (ZB-H2's), ``pp`` for ``vpp=2`` (1F1B's, as ZB-V).
        vpp: 1 (stage ``r`` on rank ``r``) or 2 (V placement: rank ``r`` holds stages ``r`` and ``2 pp - 1 - r``).
        search: ``"pruned"`` or ``"exhaustive"`` (see above); ``meta["search"]`` says which ran.

    Returns:
        a validated :class:`Schedule` named ``"zb-auto"`` with ``meta``: ``memory_budget``, ``choice`` (the
        winning candidate: a policy or ``"zb-h1"``/``"zb-h2"``), ``makespan`` (simulated seconds), ``peak``
        (per-rank peak, micro-batches), ``candidates`` (name -> makespan, or ``None`` if over budget) and
        ``search``.

    Raises:
        ScheduleError: bad sizes or times, ``vpp`` not 1 or 2, ``search`` not ``"pruned"``/``"exhaustive"``, a
            budget below 1, or no candidate fits.
    """
    z = _ZbInputs.checked(pp, m, f, i, w, p2p, memory_budget, vpp, search)
    durations = stage_durations(z.f, [a + b for a, b in zip(z.i, z.w)], z.w)
    if z.vpp == 1 and search == "pruned":
        return _zb_auto_pruned(z.pp, z.m, z.f, z.i, z.w, z.p2p, z.K, durations)
    return _zb_auto_exhaustive(z, durations)


@dataclass(frozen=True)
class _ZbInputs:
    """:func:`zb_auto`'s checked inputs: ranks ``pp``, micro-batches ``m``, ``vpp``, per-stage ``f``/``i``/``w``
    seconds (lists of ``pp * vpp``), ``p2p`` seconds and the memory budget ``K`` (micro-batches)."""

    pp: int
    m: int
    vpp: int
    f: list
    i: list
    w: list
    p2p: float
    K: float

    @classmethod
    def checked(cls, pp, m, f, i, w, p2p, memory_budget, vpp, search) -> "_ZbInputs":
        """The inputs of :func:`zb_auto`, checked in its argument order; raises :class:`ScheduleError` as it."""
        pp = _check_int("pp", pp, 1, schedule="zb-auto")
        m = _check_int("microbatches", m, 1, schedule="zb-auto")
        if vpp not in (1, 2):
            raise ScheduleError(f"zb-auto: vpp={vpp!r} is out of range; allowed 1 (one stage per rank) or 2 "
                                "(V placement)")
        S = pp * vpp
        f, i, w = _per_stage("f", f, S), _per_stage("i", i, S), _per_stage("w", w, S)
        try:
            p2p = float(p2p)
        except (TypeError, ValueError):
            raise ScheduleError(f"zb-auto: p2p must be seconds >= 0, got {p2p!r}") from None
        if not 0.0 <= p2p < math.inf:
            raise ScheduleError(f"zb-auto: p2p={p2p!r} is out of range; allowed finite seconds >= 0")
        K = float(2 * pp - 1 if vpp == 1 else pp) if memory_budget is None else memory_budget
        if isinstance(K, bool) or not isinstance(K, (int, float)) or not 1 <= K < math.inf:
            raise ScheduleError(f"zb-auto: memory_budget={memory_budget!r} is out of range; allowed >= 1 micro-batch")
        if search not in ("pruned", "exhaustive"):
            raise ScheduleError(f"zb-auto: search={search!r} is out of range; allowed 'pruned' or 'exhaustive'")
        return cls(pp, m, vpp, f, i, w, p2p, K)


def _zb_auto_exhaustive(z: _ZbInputs, durations) -> Schedule:
    """The exhaustive search: every greedy candidate at the given and at unit times (and, for one stage per rank,
    the ZB-H1 variants), each timed by :func:`_replay`; the winner simulated by
    :func:`~tessera_lab.pipeline.engine.simulate` and validated."""
    pp, m, vpp, f, i, w, p2p, K = z.pp, z.m, z.vpp, z.f, z.i, z.w, z.p2p, z.K
    S = pp * vpp
    s2r = {s: s for s in range(S)} if vpp == 1 else _v_placement(pp)
    cands: list[tuple[str, Schedule]] = []
    seen: set[tuple] = set()
    ones = [1.0] * S

    def add_greedy(found: list[tuple[str, tuple | None, dict | None]], label: str) -> None:
        for pol_name, key, lists in found:
            if key is not None and key not in seen:
                seen.add(key)
                cands.append((f"{pol_name}; {label})", _schedule("zb-auto", s2r, m, lists)))

    add_greedy(_greedy_candidates(s2r, m, f, i, w, p2p, K, vpp), "times")
    if (f, i, w, p2p) != (ones, ones, ones, 0.0):  # the unit-time orders depend on (pp, m, K, vpp) only: memoised
        add_greedy(_unit_greedy_candidates(pp, m, K, vpp), "unit times")
    if vpp == 1:
        cands.extend(_h1_candidates(pp, m, K))
    table: dict[str, float | None] = {}
    _, name, sched = _best_candidate(((n, c, _replay(c, durations, p2p, K)) for n, c in cands), table, pp, m, vpp, K)
    actions = {r: list(a) for r, a in sched.actions.items()}  # memoised candidates stay unchanged
    out = Schedule("zb-auto", sched.num_ranks, sched.num_stages, m, actions, dict(sched.stage_to_rank), {})
    tl = simulate(out, durations, p2p_time=p2p)  # the winner, through the simulator itself (compiled once for
    T, peak = tl.iteration_time, peak_memory(out, tl)  # this, validate() and the caller's simulations)
    out.meta.update({"vpp": vpp, "memory_budget": K, "choice": name, "makespan": T, "peak": peak,
                     "candidates": table, "search": "exhaustive"})
    return out.validate()


#: the greedy policies the pruned search runs on the stage times: F first, W filling every gap or (``fit``) only
#: gaps it fits in (sail-sg's ``no_bubble_greedy`` switch), and with or without the per-rank warm-up limit
#: ``2 (p - r) - 1`` (sail-sg sizes each stage's warm-up before the first backward)
PRUNED_POLICIES = (Policy(True, True, False), Policy(True, True, True), Policy(True, False, False))


def _zb_auto_pruned(pp: int, m: int, f, i, w, p2p: float, K: float, durations) -> Schedule:
    """The pruned search (one stage per rank): :data:`PRUNED_POLICIES` on the stage times, then the
    time-independent candidates of :func:`_pruned_candidates`, each timed by
    :func:`~tessera_lab.pipeline.zbsingle.replay_single`; the shortest that fits ``K`` (ties: the first). The
    makespan is the replay's (equal to the simulator's, tested); the winner is checked by
    :func:`~tessera_lab.pipeline.zbsingle.check_single` (the replay has shown that its orders run)."""
    s2r = {s: s for s in range(pp)}
    cands = []
    found: dict[Policy, tuple] = {}
    for pol in PRUNED_POLICIES:
        twin = found.get(Policy(pol.f_first, pol.stagger, False))
        if pol.fit and twin is not None and not twin[1]["fit_differs"]:
            lists = twin[0]  # the same order as without fit (no W ran where fit would wait): not searched again
        else:
            stats: dict = {}
            lists = greedy_single(m, f, i, w, p2p, K, pol, stats)
            found[pol] = (lists, stats)
        if lists is not None:
            cands.append((f"greedy(f_first={pol.f_first}, stagger={pol.stagger}, fit={pol.fit}; times)",
                          _schedule("zb-auto", s2r, m, lists)))
    cands.extend(_pruned_candidates(pp, m, K))
    table: dict[str, float | None] = {}
    # the simulator's per-action times (I = (i + w) - w in floats), as _replay reads them
    fs, is_, ws = ([durations(s, 0, kind) for s in range(pp)] for kind in (_F, _I, _W))
    timed: dict[int, float | None] = {}  # candidates sharing one order (ZB-H2 = the unit-time greedy) replay once

    def timed_cands():
        for name, sched in cands:
            key = id(sched.actions)
            if key not in timed:
                timed[key] = replay_single(sched.actions, m, fs, is_, ws, p2p, K)
            yield name, sched, timed[key]

    T, name, sched = _best_candidate(timed_cands(), table, pp, m, 1, K)
    out = Schedule("zb-auto", pp, pp, m, {r: list(a) for r, a in sched.actions.items()}, dict(s2r), {})
    out.meta.update({"vpp": 1, "memory_budget": K, "choice": name, "makespan": T,
                     "peak": [float(x) for x in order_peak(out)], "candidates": table, "search": "pruned"})
    return check_single(out)


@lru_cache(maxsize=32)
def _pruned_candidates(pp: int, m: int, K: float) -> list[tuple[str, Schedule]]:
    """The time-independent candidates of the pruned search (one stage per rank): the greedy order at unit times
    (F first, warm-up limit, W filling every gap), ZB-H1, ZB-H1 with ``e`` extra warm-up forwards on the first
    ``pp // 2`` ranks for ``e`` in 2, 3 and ``E = min(K - pp, m)``, with ``E`` on the first ``j`` ranks for the other
    ``j`` (every ``j`` up to ``pp = 6``, six spread values above: sail-sg sizes each stage's warm-up before its first
    backward), ZB-H1 with ``E`` extra warm-up forwards on the first half and ``E`` deferred W on the last half, and
    ZB-H2 (``m >= pp``)."""
    s2r = {s: s for s in range(pp)}
    ones = [1.0] * pp
    cands = []
    lists = greedy_single(m, ones, ones, ones, 0.0, K, Policy(True, True, False))
    if lists is not None:
        cands.append(("greedy(f_first=True, stagger=True, fit=False; unit times)",
                      _schedule("zb-auto", s2r, m, lists)))
    cands.append(("zb-h1", zb_h1(pp, m)))
    E = min(int(K) - pp, m)
    half = pp // 2
    if half:
        for extra in sorted({e for e in (2, 3, E) if 1 <= e <= E}):
            e = [extra] * half + [0] * (pp - half)
            cands.append((f"zb-h1(extra_warmup={e})", zb_h1(pp, m, extra_warmup=e)))
        if E >= 1:
            spans = range(1, pp + 1) if pp <= 6 else sorted({1, 2, pp // 4, pp // 2, (3 * pp) // 4, pp})
            for j in spans:  # the most warm-up the budget allows, on the first j ranks
                if j != half:
                    e = [E] * j + [0] * (pp - j)
                    cands.append((f"zb-h1(extra_warmup={e})", zb_h1(pp, m, extra_warmup=e)))
            e = [E] * half + [0] * (pp - half)
            cands.append((f"zb-h1(extra_warmup={e}, extra_deferred={e[::-1]})",
                          zb_h1(pp, m, extra_warmup=e, extra_deferred=e[::-1])))
    if m >= pp:  # ZB-H2 is the unit-time order above when K = 2 pp - 1 (the same call): not built twice
        same = lists is not None and K == 2 * pp - 1
        cands.append(("zb-h2", _schedule("zb-h2", s2r, m, lists) if same else zb_h2(pp, m)))
    return cands


def _greedy_candidates(s2r: dict[int, int], m: int, f, i, w, p2p: float, K: float, vpp: int
                       ) -> list[tuple[str, tuple | None, dict | None]]:
    """:func:`greedy_order` under every :data:`POLICIES` setting that applies: ``(policy label, order key or
    None, lists or None)`` in :data:`POLICIES` order."""
    out = []
    for pol in POLICIES:
        if (vpp == 1 and not pol.reserve_all) or (vpp == 2 and not pol.stagger):
            continue  # reserve_all only matters with several stages per rank, stagger only with one
        lists = greedy_order(s2r, m, f, i, w, p2p=p2p, memory_budget=K, policy=pol)
        key = None if lists is None else tuple(tuple(map(str, lists[r])) for r in sorted(lists))
        out.append((f"greedy(f_first={pol.f_first}, stagger={pol.stagger}, fit={pol.fit}, "
                    f"reserve_all={pol.reserve_all}", key, lists))
    return out


@lru_cache(maxsize=32)
def _unit_greedy_candidates(pp: int, m: int, K: float, vpp: int) -> list[tuple[str, tuple | None, dict | None]]:
    """:func:`_greedy_candidates` at unit times without communication (independent of the stage times)."""
    S = pp * vpp
    s2r = {s: s for s in range(S)} if vpp == 1 else _v_placement(pp)
    ones = [1.0] * S
    return _greedy_candidates(s2r, m, ones, ones, ones, 0.0, K, vpp)


@lru_cache(maxsize=32)
def _h1_candidates(pp: int, m: int, K: float) -> list[tuple[str, Schedule]]:
    """ZB-H1, its variants with extra warm-up forwards / deferred W passes within ``K``, and ZB-H2 (one stage per
    rank; independent of the stage times)."""
    cands = [("zb-h1", zb_h1(pp, m))]
    spans = range(1, pp + 1) if pp <= 6 else sorted({1, 2, pp // 4, pp // 2, (3 * pp) // 4, pp} - {0})
    E = min(int(K) - pp, m)
    for extra in (range(1, E + 1) if E <= 4 else sorted({1, 2, E // 2, (3 * E) // 4, E})):
        for j in spans:  # `extra` more warm-up forwards on the first j ranks, or deferred W on the last j
            e = [extra] * j + [0] * (pp - j)
            cands.append((f"zb-h1(extra_warmup={e})", zb_h1(pp, m, extra_warmup=e)))
            cands.append((f"zb-h1(extra_deferred={e[::-1]})", zb_h1(pp, m, extra_deferred=e[::-1])))
        half = [extra] * (pp // 2) + [0] * (pp - pp // 2)
        cands.append((f"zb-h1(extra_warmup={half}, extra_deferred={half[::-1]})",
                      zb_h1(pp, m, extra_warmup=half, extra_deferred=half[::-1])))
    if m >= pp:
        cands.append(("zb-h2", zb_h2(pp, m)))
    return cands


def _best_candidate(timed, table: dict, pp: int, m: int, vpp: int, K: float) -> tuple:
    """``(T, name, schedule)`` of the shortest of ``timed`` (``(name, schedule, T or None)``; the first of equal
    makespans, within 1e-12 relative), recording every ``T`` in ``table``.

    Raises:
        ScheduleError: no candidate fits the memory budget (every ``T`` is None).
    """
    best = None
    for name, sched, T in timed:
        table[name] = T
        if T is not None and (best is None or T < best[0] - 1e-12 * max(1.0, best[0])):
            best = (T, name, sched)
    if best is None:
        raise ScheduleError(
            f"zb-auto: no schedule fits memory_budget={K:g} micro-batches per rank (pp={pp}, m={m}, vpp={vpp}); "
            "allowed budgets >= 1; raise it"
        )
    return best
