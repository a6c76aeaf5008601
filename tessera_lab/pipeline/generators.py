"""Hand-written schedule generators: GPipe, 1F1B, interleaved 1F1B, ZB-H1, DualPipeV, overlapped 1F1B and
interleaved-overlapped (interleaved 1F1B with overlapped pairs).

Each ``generator(pp, m)`` (``interleaved_1f1b(pp, vpp, m)``) returns a :class:`~tessera_lab.pipeline.ir.Schedule`
whose per-rank orders match ``torch.distributed.pipelining``'s generators where torch has the schedule, and
raises :class:`~tessera_lab.errors.ScheduleError` for settings it cannot run. ZB-H2, ZB-V and the zero-bubble
search live in :mod:`tessera_lab.pipeline.zerobubble`. Never imports torch.
"""

from __future__ import annotations

from typing import Sequence

from tessera_lab.checks import check_int
from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.actions import Action, ActionType, overlap
from tessera_lab.pipeline.ir import Schedule

__all__ = ["gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "dualpipev", "overlapped_1f1b"]


def _check_int(name: str, value, low: int, *, schedule: str, hint: str = "") -> int:
    """:func:`tessera_lab.checks.check_int` as a :class:`ScheduleError` naming the schedule (``hint``: what to use
    instead)."""
    return check_int(value, name, low=low, where=schedule, error=ScheduleError,
                     allowed=f"an integer >= {low}{hint}")


def _single_chunk(name: str, pp: int, m: int, lists: dict[int, list[Action]], **meta) -> Schedule:
    return Schedule(name, pp, pp, m, lists, {s: s for s in range(pp)}, dict(meta))


def gpipe(pp: int, m: int) -> Schedule:
    """GPipe (fill-drain): every rank runs ``F0..F(m-1)`` then ``B0..B(m-1)``.

    Same per-rank order as ``torch.distributed.pipelining.ScheduleGPipe``. Any ``m >= 1`` runs.
    Peak live activations ``m`` on every stage. Uniform makespan ``(m + p - 1)(F + B)``.

    Raises:
        ScheduleError: ``pp < 1`` or ``m < 1``.
    """
    pp = _check_int("pp", pp, 1, schedule="gpipe")
    m = _check_int("microbatches", m, 1, schedule="gpipe")
    F, B = ActionType.F, ActionType.B
    lists = {r: [Action(r, F, i) for i in range(m)] + [Action(r, B, i) for i in range(m)] for r in range(pp)}
    return _single_chunk("gpipe", pp, m, lists)


def one_f_one_b(pp: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush; Megatron-LM's non-interleaved schedule, Narayanan et al. SC21).

    Rank ``r`` runs ``p - 1 - r`` warm-up forwards, then alternates ``F(w + j), B(j)``, then drains
    the remaining backwards. Same order as ``torch.distributed.pipelining.Schedule1F1B``.
    Peak live activations on stage ``s``: ``min(p - s, m)``.

    Raises:
        ScheduleError: ``m < pp`` (torch.distributed.pipelining and Megatron refuse it too).
    """
    pp = _check_int("pp", pp, 1, schedule="1f1b")
    m = _check_int("microbatches", m, 1, schedule="1f1b")
    if m < pp:
        raise ScheduleError(
            f"1f1b: microbatches={m} is out of range; 1F1B needs at least as many micro-batches as stages: "
            f"allowed microbatches >= {pp} (pp={pp}); use gpipe for fewer"
        )
    F, B = ActionType.F, ActionType.B
    lists: dict[int, list[Action]] = {}
    for r in range(pp):
        w = min(pp - 1 - r, m)
        acts = [Action(r, F, i) for i in range(w)]
        for j in range(m - w):
            acts.append(Action(r, F, w + j))
            acts.append(Action(r, B, j))
        acts.extend(Action(r, B, j) for j in range(m - w, m))
        lists[r] = acts
    return _single_chunk("1f1b", pp, m, lists)


def interleaved_1f1b(pp: int, vpp: int, m: int) -> Schedule:
    """Interleaved 1F1B (Megatron-LM, Narayanan et al. SC21) with ``vpp`` model chunks per rank.

    Looped placement: stage ``chunk * pp + rank``. Flexible micro-batch counts exactly as
    ``torch.distributed.pipelining.ScheduleInterleaved1F1B``: ``rounds = max(1, m // pp)``,
    ``m`` must be a multiple of ``rounds``, and micro-batches advance through the chunks in
    groups of ``m // rounds`` (``= pp`` when ``m`` is a multiple of ``pp``, Megatron's case).
    Rank ``r`` runs ``(vpp - 1) * group + 2 (pp - 1 - r)`` warm-up forwards (capped at ``vpp m``).
    Uniform bubble overhead ``(p - 1) / (v m)`` when ``m`` is a multiple of ``p``.

    Raises:
        ScheduleError: ``vpp < 2``, or ``m`` not a multiple of ``max(1, m // pp)``.
    """
    pp = _check_int("pp", pp, 1, schedule="interleaved")
    vpp = _check_int("vpp", vpp, 2, schedule="interleaved", hint=" (use 1f1b for one chunk per rank)")
    m = _check_int("microbatches", m, 1, schedule="interleaved")
    rounds = max(1, m // pp)
    if m % rounds:
        ok = sorted({x for x in range(max(1, m - pp), m + pp + 1) if x % max(1, x // pp) == 0})
        raise ScheduleError(
            f"interleaved: microbatches={m} is not allowed with pp={pp}: it must be a multiple of "
            f"max(1, microbatches // pp) = {rounds} (as torch's ScheduleInterleaved1F1B); nearby allowed values: "
            + ", ".join(str(x) for x in ok)
        )
    group = m // rounds
    F, B = ActionType.F, ActionType.B
    lists: dict[int, list[Action]] = {}
    for r in range(pp):
        warmup = min((vpp - 1) * group + 2 * (pp - 1 - r), m * vpp)
        total = vpp * m
        fwd_mb = [0] * vpp
        bwd_mb = [0] * vpp
        acts: list[Action] = []

        def f_stage(step: int) -> int:
            return ((step // group) % vpp) * pp + r

        def b_stage(step: int) -> int:
            return (vpp - 1 - ((step - warmup) // group) % vpp) * pp + r

        def add_f(step: int) -> None:
            s = f_stage(step)
            c = s // pp
            acts.append(Action(s, F, fwd_mb[c]))
            fwd_mb[c] += 1

        def add_b(step: int) -> None:
            s = b_stage(step)
            c = s // pp
            acts.append(Action(s, B, bwd_mb[c]))
            bwd_mb[c] += 1

        for step in range(warmup):
            add_f(step)
        for step in range(warmup, total):
            add_f(step)
            add_b(step)
        for step in range(total, total + warmup):
            add_b(step)
        lists[r] = acts
    S = pp * vpp
    return Schedule("interleaved", pp, S, m, lists, {s: s % pp for s in range(S)}, {"vpp": vpp})


def zb_h1(pp: int, m: int, *, extra_warmup: int | Sequence[int] = 0, extra_deferred: int | Sequence[int] = 0
          ) -> Schedule:
    """ZB-H1 (Zero Bubble, Qi et al., ICLR 2024, section 2.1; torch's ZB1P with one stage per rank).

    The backward is split into I (input gradient) and W (weight gradient). Rank ``r`` keeps
    1F1B's ``p - 1 - r`` warm-up forwards (so 1F1B's peak memory, ``min(p, m)``), runs ``F, I``
    pairs and delays its first ``r`` weight-gradient passes, which then fill the cool-down. Uniform
    bubble per rank ``(p - 1)(F + I - W)`` in the paper's notation (I = input-gradient time =
    ``b - w``). Any ``m >= 1`` (as torch; ``m < p`` gives the same order as torch's ZB1P).
    ``extra_warmup`` ``e`` (one number, or one per rank, non-increasing so that the orders stay
    executable) adds ``e_r`` warm-up forwards on rank ``r``, and ``extra_deferred`` ``d`` (one number or
    one per rank) defers ``d_r`` more weight gradients (rank ``r`` then holds back its first ``r + d_r``
    W passes); peak ``min(p + e_r + d_r, m)``. This is the family
    :func:`tessera_lab.pipeline.zerobubble.zb_auto` searches between ZB-H1 and ZB-H2 memory.

    Raises:
        ScheduleError: ``pp < 1``, ``m < 1``, ``extra_warmup`` or ``extra_deferred`` negative or of the wrong
            length, or ``extra_warmup`` increasing.
    """
    pp = _check_int("pp", pp, 1, schedule="zb-h1")
    m = _check_int("microbatches", m, 1, schedule="zb-h1")
    extra, defer = ([_check_int(name, x, 0, schedule="zb-h1") for x in ([v] * pp if isinstance(v, int) else list(v))]
                    for name, v in (("extra_warmup", extra_warmup), ("extra_deferred", extra_deferred)))
    if len(extra) != pp or len(defer) != pp or any(a < b for a, b in zip(extra, extra[1:])):
        raise ScheduleError(
            f"zb-h1: extra_warmup={extra_warmup!r}, extra_deferred={extra_deferred!r} are not allowed; give one "
            f"number or {pp} numbers >= 0 each (extra_warmup non-increasing)"
        )
    F, I, W = ActionType.F, ActionType.I, ActionType.W
    lists: dict[int, list[Action]] = {}
    for r in range(pp):
        warmup = min(pp - 1 - r + extra[r], m)
        acts = [Action(r, F, i) for i in range(warmup)]
        nb = nw = 0
        nf = warmup
        # steady: F, I and (after the first r steps) the oldest pending W
        for step in range(m - warmup):
            acts.append(Action(r, F, nf))
            nf += 1
            acts.append(Action(r, I, nb))
            nb += 1
            if step >= r + defer[r]:
                acts.append(Action(r, W, nw))
                nw += 1
        # cool-down: I then (if past the first r backward steps) a W
        for step in range(m - warmup, m):
            acts.append(Action(r, I, nb))
            nb += 1
            if step >= r + defer[r]:
                acts.append(Action(r, W, nw))
                nw += 1
        acts.extend(Action(r, W, j) for j in range(nw, m))
        lists[r] = acts
    return _single_chunk("zb-h1", pp, m, lists)


def dualpipev(pp: int, m: int) -> Schedule:
    """DualPipeV (DeepSeek DualPipe README; "cut-in-half" by Sea AI Lab), V placement.

    Rank ``r`` holds stages ``r`` and ``2 pp - 1 - r``; the steady state overlaps the forward of
    one chunk with the full backward of the other as ``OVERLAP_F_B`` pairs; the warm-up and
    cool-down use split backwards (I/W). Same order as ``torch.distributed.pipelining.
    ScheduleDualPipeV`` (which follows DeepSeek's ``dualpipev.py``). Published bubble
    ``(PP/2 - 1)(F&B + B - 3W)`` with ``PP = 2 pp`` stages and per-chunk times.

    Raises:
        ScheduleError: ``m < 2 pp`` (DeepSeek's and torch's requirement: micro-batches >= stages).
    """
    pp = _check_int("pp", pp, 1, schedule="dualpipev")
    m = _check_int("microbatches", m, 1, schedule="dualpipev")
    if m < 2 * pp:
        raise ScheduleError(
            f"dualpipev: microbatches={m} is out of range; DualPipeV needs at least as many micro-batches as "
            f"stages (2 x pp = {2 * pp}): allowed microbatches >= {2 * pp}"
        )
    lists = {r: _dualpipev_rank(pp, m, r) for r in range(pp)}
    S = 2 * pp
    s2r = {s: (s if s < pp else S - 1 - s) for s in range(S)}
    return Schedule("dualpipev", pp, S, m, lists, s2r, {"vpp": 2})


class _RankOrder:
    """One rank's action list as DualPipeV appends to it: each stage's next micro-batch per kind, and the W
    passes an I leaves for later (first in, first out)."""

    def __init__(self) -> None:
        self.acts: list[Action] = []
        self.count: dict[tuple[int, ActionType], int] = {}
        self.wq: list[tuple[int, int]] = []

    def nxt(self, stage: int, kind: ActionType) -> int:
        return self.count.get((stage, kind), 0)

    def bump_backward(self, stage: int) -> None:  # a full B advances both I and W counters
        self.count[(stage, ActionType.I)] = self.nxt(stage, ActionType.I) + 1
        self.count[(stage, ActionType.W)] = self.nxt(stage, ActionType.W) + 1

    def add(self, stage: int, kind: ActionType) -> None:
        if kind is ActionType.B:
            self.acts.append(Action(stage, ActionType.B, self.nxt(stage, ActionType.I)))
            self.bump_backward(stage)
            return
        mb = self.nxt(stage, kind)
        self.acts.append(Action(stage, kind, mb))
        if kind is ActionType.I:
            self.wq.append((stage, mb))
        self.count[(stage, kind)] = mb + 1

    def add_pair(self, f_stage: int, b_stage: int) -> None:
        f_mb, b_mb = self.nxt(f_stage, ActionType.F), self.nxt(b_stage, ActionType.I)
        self.acts.append(overlap(Action(f_stage, ActionType.F, f_mb), Action(b_stage, ActionType.B, b_mb)))
        self.count[(f_stage, ActionType.F)] = f_mb + 1
        self.bump_backward(b_stage)

    def add_w(self) -> None:
        if self.wq:
            stage, mb = self.wq.pop(0)
            self.acts.append(Action(stage, ActionType.W, mb))
            self.count[(stage, ActionType.W)] = self.nxt(stage, ActionType.W) + 1


def _dualpipev_rank(pp: int, m: int, r: int) -> list[Action]:
    """Rank ``r``'s DualPipeV order, in the eight steps of DeepSeek's ``dualpipev.py`` (chunk 0 = stage ``r``,
    chunk 1 = stage ``2 pp - 1 - r``)."""
    F, B, I = ActionType.F, ActionType.B, ActionType.I
    s0, s1 = r, 2 * pp - 1 - r
    o = _RankOrder()
    for _ in range(2 * (pp - r - 1)):  # step 1: F0
        o.add(s0, F)
    for _ in range(r + 1):  # step 2: F0 F1
        o.add(s0, F)
        o.add(s1, F)
    for _ in range(pp - r - 1):  # step 3: I1 W F1
        o.add(s1, I)
        o.add_w()
        o.add(s1, F)
    for i in range(m - 2 * pp + r + 1):  # step 4: (F0,B1) (F1,B0)
        if i == 0 and r == pp - 1:
            o.add(s0, F)  # not overlapped: shortens the bubble (DeepSeek)
            o.add(s1, B)
        else:
            o.add_pair(s0, s1)
        o.add_pair(s1, s0)
    for _ in range(pp - r - 1):  # step 5: B1 (F1,B0)
        o.add(s1, B)
        o.add_pair(s1, s0)
    zb = False  # step 6: B1 B0, second half split into I (W deferred)
    n6 = r + 1
    for i in range(n6):
        if i == n6 // 2 and r % 2 == 1:
            zb = True
        o.add(s1, I if zb else B)
        if i == n6 // 2 and r % 2 == 0:
            zb = True
        o.add(s0, I if zb else B)
    for _ in range(pp - r - 1):  # step 7: W B0
        o.add_w()
        o.add(s0, I if zb else B)
    for _ in range(r + 1):  # step 8: W
        o.add_w()
    return o.acts


def overlapped_1f1b(pp: int, m: int) -> Schedule:
    """Overlapped 1F1B: steady-state forwards run together with earlier backwards (OVERLAP_F_B).

    Rank ``r`` runs ``k_r = min(2 (p - 1 - r) + 1, m)`` warm-up forwards, then pairs
    ``(F(j + k_r); B(j))`` for ``j = 0 .. m - k_r - 1``, then drains the last ``k_r`` backwards.
    A pair's outputs (activation to the next stage, gradient to the previous) appear when the
    pair ends, so the offset must grow by two per hop (``k_{r-1} = k_r + 2``) for the steady
    state to run without waiting, and the last stage needs ``k >= 1`` (a backward cannot overlap
    its own forward). With pair time ``F&B = F + B`` the makespan equals plain 1F1B's; with real
    overlap (``F&B < F + B``) each steady step is shorter. Peak live activations on rank ``r``
    are ``k_r + 1`` (the pair holds two micro-batches), ``2p`` on the first rank.

    Raises:
        ScheduleError: ``m < pp``.
    """
    pp = _check_int("pp", pp, 1, schedule="overlapped")
    m = _check_int("microbatches", m, 1, schedule="overlapped")
    if m < pp:
        raise ScheduleError(
            f"overlapped: microbatches={m} is out of range; allowed microbatches >= {pp} (pp={pp})"
        )
    F, B = ActionType.F, ActionType.B
    lists: dict[int, list[Action]] = {}
    for r in range(pp):
        k = min(2 * (pp - 1 - r) + 1, m)
        acts = [Action(r, F, i) for i in range(k)]
        for j in range(m - k):
            acts.append(overlap(Action(r, F, j + k), Action(r, B, j)))
        acts.extend(Action(r, B, j) for j in range(m - k, m))
        lists[r] = acts
    return _single_chunk("overlapped", pp, m, lists)


#: name of the interleaved 1F1B schedule with overlapped pairs (built for the planner)
INTERLEAVED_OVERLAPPED = "interleaved-overlapped"


def interleaved_overlapped(pp: int, vpp: int, m: int) -> Schedule:
    """Interleaved 1F1B (``vpp`` chunks per rank, Megatron-LM placement) whose steady state runs each backward
    together with the next forward as one ``OVERLAP_F_B`` pair, as Megatron-Core's EP-overlap path does (combined
    1F1B with VPP > 1).

    Built from the interleaved lists by one rewrite: every rank runs one more warm-up forward (Megatron's extra
    warm-up micro-batch in ``get_pp_rank_microbatches``), and each steady-state ``B`` is fused with the ``F`` that
    follows it. The forward and the backward of a pair may belong to different chunks; the simulator times a pair
    by its backward's stage (``fb[stage of B]``). Peak live activations per rank: one chunk-micro-batch more than
    interleaved 1F1B.

    Raises:
        ScheduleError: as :func:`interleaved_1f1b`.
    """
    base = interleaved_1f1b(pp, vpp, m)
    F, B = ActionType.F, ActionType.B
    lists = {}
    for r, acts in base.actions.items():
        n = len(acts)
        warm = 0  # warm-up forwards: up to the first F that a B follows
        while warm < n and not (acts[warm].type == F and warm + 1 < n and acts[warm + 1].type == B):
            warm += 1
        out = list(acts[:warm + 1])  # one more warm-up forward
        rest = acts[warm + 1:]
        k = 0
        while k < len(rest):
            if rest[k].type == B and k + 1 < len(rest) and rest[k + 1].type == F:
                out.append(overlap(rest[k + 1], rest[k]))
                k += 2
            else:
                out.append(rest[k])
                k += 1
        lists[r] = out
    return Schedule(INTERLEAVED_OVERLAPPED, pp, base.num_stages, m, lists, dict(base.stage_to_rank), {"vpp": vpp})
