"""Pipeline schedules as per-rank action lists, in ``torch.distributed.pipelining`` notation.

An *action* is one unit of pipeline work: ``<stage><type><microbatch>``, e.g. ``0F7`` (forward of
micro-batch 7 on stage 0), ``2B3`` (full backward), ``1I4`` / ``1W4`` (input-gradient and
weight-gradient halves of a backward, as in the Zero Bubble paper), ``1SEND_F4`` / ``2RECV_F4``
(point-to-point transfers), and overlapped pairs ``(0F7;7B3)OVERLAP_F_B`` (the forward of one
micro-batch run together with the backward of another, DualPipe style).

A :class:`Schedule` maps each pipeline rank to its ordered action list. Generators:

=================  ===========================================================================
``gpipe``          all forwards then all backwards (Huang et al., 2019)
``1f1b``           PipeDream-Flush / Megatron 1F1B (Narayanan et al., SC21)
``interleaved``    Megatron interleaved 1F1B with ``vpp`` stages per rank, flexible micro-batch
                   counts as in ``torch.distributed.pipelining.ScheduleInterleaved1F1B``
``zb-h1``          Zero Bubble ZB-H1 (Qi et al., ICLR 2024), identical to torch's ZB1P with one
                   stage per rank
``zb-h2``          Zero Bubble ZB-H2: up to ``2(p-r)-1`` forwards in flight on rank ``r``
``dualpipev``      DeepSeek DualPipeV (cut-in-half DualPipe, V placement), as in torch's
                   ``ScheduleDualPipeV`` and DeepSeek's ``dualpipev.py``
``overlapped``     overlapped 1F1B: the steady state runs ``F(i+k)`` together with ``B(i)``
=================  ===========================================================================

Stage placement: one stage per rank for the single-chunk schedules (stage ``r`` on rank ``r``);
"looped" placement for interleaved (stage ``chunk * pp + rank``, as torch); "V" placement for
DualPipeV (rank ``r`` holds stages ``r`` and ``2 pp - 1 - r``).

This module never imports torch.
"""

from __future__ import annotations

import csv
import io
import os
import re
import tempfile
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Iterable, Sequence

from tessera_lab.errors import ScheduleError
from tessera_lab.io import atomic_write_text

__all__ = [
    "ActionType",
    "Action",
    "Schedule",
    "parse_action",
    "overlap",
    "gpipe",
    "one_f_one_b",
    "interleaved_1f1b",
    "zb_h1",
    "zb_h2",
    "dualpipev",
    "overlapped_1f1b",
    "build_schedule",
    "canonical_name",
    "schedule_from_lists",
    "SCHEDULE_NAMES",
    "dump_csv",
    "load_csv",
]


class ActionType(str, Enum):
    """Kinds of pipeline actions (values are torch.distributed.pipelining's spellings).

    ``B`` is a full backward (= ``I`` + ``W``); ``I`` computes the gradient of the stage input
    ("backward input", the Zero Bubble paper's *B*); ``W`` computes the weight gradients.
    """

    F = "F"
    B = "B"
    I = "I"  # noqa: E741 - torch's name
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    OVERLAP_F_B = "OVERLAP_F_B"

    def __str__(self) -> str:  # "F", not "ActionType.F"
        return self.value

    @property
    def is_compute(self) -> bool:
        """True for F, B, I, W and OVERLAP_F_B."""
        return self in _COMPUTE_TYPES

    @property
    def is_comm(self) -> bool:
        """True for SEND_F, RECV_F, SEND_B, RECV_B."""
        return self in _COMM_TYPES


_COMPUTE_TYPES = frozenset({ActionType.F, ActionType.B, ActionType.I, ActionType.W, ActionType.OVERLAP_F_B})
_COMM_TYPES = frozenset({ActionType.SEND_F, ActionType.RECV_F, ActionType.SEND_B, ActionType.RECV_B})
_LEAF_COMPUTE = frozenset({ActionType.F, ActionType.B, ActionType.I, ActionType.W})


@dataclass(frozen=True)
class Action:
    """One pipeline action.

    Attributes:
        stage: global stage index (``-1`` for an ``OVERLAP_F_B`` container, as in torch).
        type: the :class:`ActionType`.
        microbatch: micro-batch index (``None`` for an ``OVERLAP_F_B`` container).
        sub_actions: for ``OVERLAP_F_B``, the overlapped ``(F, B)`` or ``(F, I)`` pair; else ``()``.

    ``str(action)`` gives torch.distributed.pipelining notation (``0F7``, ``2B3``, ``1SEND_F4``,
    ``(0F7;7B3)OVERLAP_F_B``); :func:`parse_action` is its inverse.
    """

    stage: int
    type: ActionType
    microbatch: int | None
    sub_actions: tuple["Action", ...] = ()

    def __str__(self) -> str:
        if self.sub_actions:
            return "(" + ";".join(str(a) for a in self.sub_actions) + ")" + self.type.value
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.type.value}{mb}"

    @property
    def is_compute(self) -> bool:
        return self.type in _COMPUTE_TYPES

    @property
    def is_comm(self) -> bool:
        return self.type in _COMM_TYPES

    def leaves(self) -> tuple["Action", ...]:
        """The leaf actions: the sub-actions of a pair, else ``(self,)``."""
        return self.sub_actions if self.sub_actions else (self,)


def overlap(forward: Action, backward: Action) -> Action:
    """An ``OVERLAP_F_B`` action running ``forward`` together with ``backward`` (B or I)."""
    if forward.type is not ActionType.F or backward.type not in (ActionType.B, ActionType.I):
        raise ScheduleError(
            f"overlap() needs a forward (F) and a backward (B or I) action, got {forward} and {backward}"
        )
    return Action(-1, ActionType.OVERLAP_F_B, None, (forward, backward))


_LEAF_RE = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|OVERLAP_F_B|F|B|I|W)(\d*)")


def parse_action(text: str) -> Action:
    """Parse torch.distributed.pipelining notation (inverse of ``str(action)``).

    Examples: ``"0F7"``, ``"2B3"``, ``"1I4"``, ``"3SEND_B2"``, ``"(0F7;7B3)OVERLAP_F_B"``.

    Raises:
        ScheduleError: the text is not an action; the message quotes the text.
    """
    if not isinstance(text, str):
        raise ScheduleError(f"cannot parse action {text!r}: expected a string such as '0F7'")
    s = text.strip()
    if s.startswith("("):
        close = s.find(")")
        if close < 0:
            raise ScheduleError(f"cannot parse action {text!r}: missing ')' in an overlapped pair")
        type_text = s[close + 1 :]
        if type_text != ActionType.OVERLAP_F_B.value:
            raise ScheduleError(
                f"cannot parse action {text!r}: a parenthesised pair must end in OVERLAP_F_B, got {type_text!r}"
            )
        inner = s[1:close]
        subs = tuple(_parse_leaf(part.strip(), text) for part in inner.split(";") if part.strip())
        if not subs:
            raise ScheduleError(f"cannot parse action {text!r}: empty overlapped pair")
        return Action(-1, ActionType.OVERLAP_F_B, None, subs)
    return _parse_leaf(s, text)


def _parse_leaf(s: str, original: str) -> Action:
    m = _LEAF_RE.fullmatch(s)
    if m is None or m.group(2) == ActionType.OVERLAP_F_B.value:
        raise ScheduleError(
            f"cannot parse action {original!r}: expected <stage><type><microbatch> with type one of "
            "F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B (e.g. '0F7'), or '(0F7;7B3)OVERLAP_F_B'"
        )
    stage, kind, mb = m.groups()
    return Action(int(stage), ActionType(kind), int(mb) if mb else None)


# ----------------------------------------------------------------------------------------------
# Schedule
# ----------------------------------------------------------------------------------------------


@dataclass
class Schedule:
    """Per-rank ordered action lists for one training iteration.

    Attributes:
        name: schedule name (``"1f1b"``, ...).
        num_ranks: pipeline ranks ``pp``.
        num_stages: global stages (``pp * vpp`` for interleaved, ``2 pp`` for DualPipeV).
        num_microbatches: micro-batches per iteration ``m``.
        actions: rank -> ordered actions (compute actions, plus SEND/RECV actions if the schedule
            was lowered with explicit communication).
        stage_to_rank: stage -> rank holding it.
    """

    name: str
    num_ranks: int
    num_stages: int
    num_microbatches: int
    actions: dict[int, list[Action]]
    stage_to_rank: dict[int, int]
    meta: dict = field(default_factory=dict)

    # -- views -------------------------------------------------------------------------------
    @property
    def stages_per_rank(self) -> int:
        """Stages held by each rank (1, ``vpp`` or 2)."""
        return max(1, self.num_stages // max(1, self.num_ranks))

    def rank_stages(self, rank: int) -> list[int]:
        """Stages held by ``rank``, ascending."""
        return sorted(s for s, r in self.stage_to_rank.items() if r == rank)

    def compute_actions(self, rank: int) -> list[Action]:
        """The rank's compute actions (F, B, I, W, OVERLAP_F_B) in order."""
        return [a for a in self.actions[rank] if a.type in _COMPUTE_TYPES]

    def compute_order(self, rank: int, *, flatten: bool = False) -> list[str]:
        """The rank's compute actions as strings; ``flatten`` expands overlapped pairs."""
        out: list[str] = []
        for a in self.compute_actions(rank):
            if flatten and a.sub_actions:
                out.extend(str(x) for x in a.sub_actions)
            else:
                out.append(str(a))
        return out

    @property
    def num_compute_actions(self) -> int:
        """Leaf compute actions over all ranks (an overlapped pair counts as two)."""
        return sum(len(a.leaves()) for acts in self.actions.values() for a in acts if a.type in _COMPUTE_TYPES)

    def format_table(self) -> str:
        """A step x rank grid of the action lists (like torch's ``_format_pipeline_order``)."""
        ranks = sorted(self.actions)
        cols = [[str(a) for a in self.actions[r]] for r in ranks]
        steps = max((len(c) for c in cols), default=0)
        widths = [max([len(f"rank {r}")] + [len(x) for x in c]) for r, c in zip(ranks, cols)]
        lines = ["step  " + " ".join(f"{'rank ' + str(r):<{w}}" for r, w in zip(ranks, widths))]
        for i in range(steps):
            cells = [(c[i] if i < len(c) else "") for c in cols]
            lines.append(f"{i:<5} " + " ".join(f"{x:<{w}}" for x, w in zip(cells, widths)))
        return "\n".join(lines)

    # -- validation --------------------------------------------------------------------------
    def validate(self) -> "Schedule":
        """Check the schedule and return it.

        Checks: every stage maps to a rank in ``[0, num_ranks)``; every action sits on the rank
        holding its stage; each stage runs F exactly once per micro-batch and either B once or
        I and W once each (never both B and I/W); overlapped pairs are one F plus one B/I on one
        rank, the backward not depending on the forward of the same pair; SEND/RECV actions
        name real neighbours; and the per-rank orders are jointly executable (a dependency-only
        simulation with non-blocking sends finishes).

        Raises:
            ScheduleError: naming the first problem found (rank, stage, micro-batch, action).
        """
        p, S, m = self.num_ranks, self.num_stages, self.num_microbatches
        if p < 1 or S < 1 or m < 1:
            raise ScheduleError(
                f"schedule {self.name!r}: num_ranks={p}, num_stages={S}, num_microbatches={m}; all must be >= 1"
            )
        if set(self.stage_to_rank) != set(range(S)):
            raise ScheduleError(
                f"schedule {self.name!r}: stage_to_rank must map every stage 0..{S - 1}, got stages "
                f"{sorted(self.stage_to_rank)}"
            )
        for s, r in self.stage_to_rank.items():
            if not 0 <= r < p:
                raise ScheduleError(f"schedule {self.name!r}: stage {s} maps to rank {r}, allowed 0..{p - 1}")
        if set(self.actions) - set(range(p)):
            raise ScheduleError(
                f"schedule {self.name!r}: actions for ranks {sorted(set(self.actions) - set(range(p)))}, "
                f"allowed 0..{p - 1}"
            )
        seen: dict[tuple[ActionType, int, int], int] = {}
        for rank in range(p):
            for pos, a in enumerate(self.actions.get(rank, [])):
                if a.type is ActionType.OVERLAP_F_B:
                    subs = a.sub_actions
                    kinds = sorted(x.type.value for x in subs)
                    if len(subs) != 2 or kinds not in (["B", "F"], ["F", "I"]):
                        raise ScheduleError(
                            f"schedule {self.name!r}: rank {rank} position {pos}: {a} must pair one F with one B or I"
                        )
                    fwd = next(x for x in subs if x.type is ActionType.F)
                    bwd = next(x for x in subs if x.type is not ActionType.F)
                    if bwd.stage == fwd.stage and bwd.microbatch == fwd.microbatch:
                        raise ScheduleError(
                            f"schedule {self.name!r}: rank {rank} position {pos}: {a} pairs a backward with its "
                            "own forward, which it depends on"
                        )
                    leaves = subs
                elif a.sub_actions:
                    raise ScheduleError(f"schedule {self.name!r}: rank {rank}: only OVERLAP_F_B may have sub-actions: {a}")
                else:
                    leaves = (a,)
                for x in leaves:
                    if not 0 <= x.stage < S:
                        raise ScheduleError(
                            f"schedule {self.name!r}: rank {rank} position {pos}: {x} names stage {x.stage}, "
                            f"allowed 0..{S - 1}"
                        )
                    if x.microbatch is None or not 0 <= x.microbatch < m:
                        raise ScheduleError(
                            f"schedule {self.name!r}: rank {rank} position {pos}: {x} names micro-batch "
                            f"{x.microbatch}, allowed 0..{m - 1}"
                        )
                    if self.stage_to_rank[x.stage] != rank:
                        raise ScheduleError(
                            f"schedule {self.name!r}: {x} is listed on rank {rank} but stage {x.stage} is on rank "
                            f"{self.stage_to_rank[x.stage]}"
                        )
                    if x.type is ActionType.SEND_F and x.stage == S - 1:
                        raise ScheduleError(f"schedule {self.name!r}: {x}: the last stage has no forward successor")
                    if x.type is ActionType.RECV_F and x.stage == 0:
                        raise ScheduleError(f"schedule {self.name!r}: {x}: the first stage receives no activations")
                    if x.type is ActionType.SEND_B and x.stage == 0:
                        raise ScheduleError(f"schedule {self.name!r}: {x}: the first stage sends no gradients")
                    if x.type is ActionType.RECV_B and x.stage == S - 1:
                        raise ScheduleError(f"schedule {self.name!r}: {x}: the last stage receives no gradients")
                    key = (x.type, x.stage, x.microbatch)
                    if key in seen:
                        raise ScheduleError(
                            f"schedule {self.name!r}: {x} appears twice (ranks {seen[key]} and {rank})"
                        )
                    seen[key] = rank
        F, B, I, W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
        for s in range(S):
            for i in range(m):
                if (F, s, i) not in seen:
                    raise ScheduleError(f"schedule {self.name!r}: stage {s} never runs the forward of micro-batch {i}")
                has_b, has_i, has_w = (B, s, i) in seen, (I, s, i) in seen, (W, s, i) in seen
                if has_b and (has_i or has_w):
                    raise ScheduleError(
                        f"schedule {self.name!r}: stage {s} micro-batch {i} has both a full backward (B) and a "
                        "split backward (I/W); use one or the other"
                    )
                if not has_b and not (has_i and has_w):
                    missing = "B (or I and W)" if not (has_i or has_w) else ("W" if has_i else "I")
                    raise ScheduleError(f"schedule {self.name!r}: stage {s} micro-batch {i} is missing {missing}")
        # jointly executable orders: dependency-only simulation (lazy import: simulate imports us)
        from tessera_lab.errors import DeadlockError
        from tessera_lab.pipeline.simulate import simulate

        try:
            simulate(self, lambda stage, mb, kind: 1.0)
        except DeadlockError as exc:
            raise ScheduleError(
                f"schedule {self.name!r}: the per-rank orders cannot all run (dependency cycle); stuck: "
                + ", ".join(f"rank {r} at {a}" for r, a in sorted(exc.stuck.items()))
            ) from exc
        return self

    # -- CSV ---------------------------------------------------------------------------------
    def to_csv_text(self) -> str:
        """torch.distributed.pipelining CSV: one row per rank, comma-separated action strings."""
        buf = io.StringIO()
        writer = csv.writer(buf)
        for rank in range(self.num_ranks):
            writer.writerow([str(a) for a in self.actions.get(rank, [])])
        return buf.getvalue()

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_csv_text` to ``path`` atomically (temp file + ``os.replace``)."""
        return Path(atomic_write_text(path, self.to_csv_text()))

    @classmethod
    def from_csv_text(
        cls,
        text: str,
        *,
        name: str = "csv",
        num_microbatches: int | None = None,
        num_stages: int | None = None,
        ignore: Iterable[str] = (),
        stage_to_rank: dict[int, int] | None = None,
    ) -> "Schedule":
        """Parse torch.distributed.pipelining CSV (``_dump_csv`` output).

        Empty cells (torch's idle steps) are skipped. Action types in ``ignore`` (for example
        ``("UNSHARD", "RESHARD", "REDUCE_GRAD")`` from torch's lowered schedules) are dropped.
        Stages, micro-batches and the stage -> rank map are inferred from the actions unless given
        (``stage_to_rank`` given: no inference, :meth:`validate` then checks the placement).

        Raises:
            ScheduleError: a cell is not an action, or (inferring) a stage appears on two ranks.
        """
        ignore_re = re.compile(r"^\d*(" + "|".join(re.escape(x) for x in ignore) + r")\d*$") if ignore else None
        actions: dict[int, list[Action]] = {}
        for rank, row in enumerate(csv.reader(io.StringIO(text))):
            acts = []
            for cell in row:
                cell = cell.strip()
                if not cell or (ignore_re is not None and ignore_re.match(cell)):
                    continue
                acts.append(parse_action(cell))
            actions[rank] = acts
        inferred: dict[int, int] = {}
        max_stage, max_mb = -1, -1
        for rank, acts in actions.items():
            for a in acts:
                for x in a.leaves():
                    if x.type in _LEAF_COMPUTE and stage_to_rank is None:
                        prev = inferred.setdefault(x.stage, rank)
                        if prev != rank:
                            raise ScheduleError(f"CSV: stage {x.stage} appears on ranks {prev} and {rank}")
                    max_stage = max(max_stage, x.stage)
                    if x.microbatch is not None:
                        max_mb = max(max_mb, x.microbatch)
        if stage_to_rank is not None:
            inferred = dict(stage_to_rank)
            max_stage = max(max_stage, max(inferred, default=-1))
        S = num_stages if num_stages is not None else max_stage + 1
        m = num_microbatches if num_microbatches is not None else max_mb + 1
        return cls(
            name=name,
            num_ranks=max(len(actions), 1 + max(inferred.values(), default=-1)),
            num_stages=S,
            num_microbatches=m,
            actions=actions,
            stage_to_rank=dict(sorted(inferred.items())),
        )

    @classmethod
    def from_csv(cls, path: str | os.PathLike, **kwargs) -> "Schedule":
        """Read a torch.distributed.pipelining CSV file; see :meth:`from_csv_text`."""
        return cls.from_csv_text(Path(path).read_text(), **kwargs)


def dump_csv(schedule: Schedule, path: str | os.PathLike) -> Path:
    """Write ``schedule`` as torch.distributed.pipelining CSV (see :meth:`Schedule.to_csv`)."""
    return schedule.to_csv(path)


def load_csv(path: str | os.PathLike, **kwargs) -> Schedule:
    """Read torch.distributed.pipelining CSV (see :meth:`Schedule.from_csv_text`)."""
    return Schedule.from_csv(path, **kwargs)


# ----------------------------------------------------------------------------------------------
# Generators
# ----------------------------------------------------------------------------------------------


def _check_int(name: str, value, low: int, *, schedule: str, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            if float(value) != int(value):
                raise ValueError
            value = int(value)
        except (TypeError, ValueError):
            raise ScheduleError(f"{schedule}: {name} must be an integer >= {low}, got {value!r}") from None
    if value < low:
        raise ScheduleError(f"{schedule}: {name}={value} is out of range; allowed: {name} >= {low}{hint}")
    return value


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


def zb_h1(pp: int, m: int) -> Schedule:
    """ZB-H1 (Zero Bubble, Qi et al., ICLR 2024, section 2.1; torch's ZB1P with one stage per rank).

    The backward is split into I (input gradient) and W (weight gradient). Rank ``r`` keeps
    1F1B's ``p - 1 - r`` warm-up forwards (so 1F1B's peak memory), runs ``F, I`` pairs and delays
    its first ``r`` weight-gradient passes, which then fill the cool-down. Uniform bubble per
    rank ``(p - 1)(F + I - W)`` in the paper's notation (I = input-gradient time = ``b - w``).

    Raises:
        ScheduleError: ``m < pp``.
    """
    pp = _check_int("pp", pp, 1, schedule="zb-h1")
    m = _check_int("microbatches", m, 1, schedule="zb-h1")
    if m < pp:
        raise ScheduleError(
            f"zb-h1: microbatches={m} is out of range; allowed microbatches >= {pp} (pp={pp})"
        )
    F, I, W = ActionType.F, ActionType.I, ActionType.W
    lists: dict[int, list[Action]] = {}
    for r in range(pp):
        warmup = min(pp - 1 - r, m)
        acts = [Action(r, F, i) for i in range(warmup)]
        nb = nw = 0
        nf = warmup
        # steady: F, I and (after the first r steps) the oldest pending W
        for step in range(m - warmup):
            acts.append(Action(r, F, nf))
            nf += 1
            acts.append(Action(r, I, nb))
            nb += 1
            if step >= r:
                acts.append(Action(r, W, nw))
                nw += 1
        # cool-down: I then (if past the first r backward steps) a W
        for step in range(m - warmup, m):
            acts.append(Action(r, I, nb))
            nb += 1
            if step >= r:
                acts.append(Action(r, W, nw))
                nw += 1
        acts.extend(Action(r, W, j) for j in range(nw, m))
        lists[r] = acts
    return _single_chunk("zb-h1", pp, m, lists)


def zb_h2(pp: int, m: int) -> Schedule:
    """ZB-H2 (Zero Bubble, Qi et al., ICLR 2024, section 2.2): more warm-up forwards, W at the tail.

    Built by list scheduling at unit times (T_F = T_I = T_W, no communication), the setting in
    which the paper hand-crafts it. Whenever rank ``r`` is free it runs, in priority order:

    1. an input gradient (I) whose inputs are ready (the I chain is the critical path);
    2. the oldest weight gradient (W) if more than ``p - 1 + r`` are pending (bounds the backlog);
    3. a forward if fewer than ``2 (p - r) - 1`` micro-batches await their I (the paper's
       ``2p - 1`` in-flight micro-batches on the first rank);
    4. the oldest pending W.

    So the first rank runs ``2p - 1`` warm-up forwards and the W passes collect in the idle slots
    and at the tail, turning 1F1B's trapezoid into a parallelogram. The order is then fixed:
    simulate it with any durations. With ``m >= 2p - 1`` and uniform times the simulated makespan
    is ``m (F + B) + (p - 1) max(F, F + I - 2W)``: the paper's bubble ``(p - 1)(F + I - 2W)``, but
    never below the start-up skew ``(p - 1) F`` that one iteration cannot hide (the paper removes
    it across iterations with optimizer post-validation). Peak live activations (counted until W)
    stay below ``3p``.

    Raises:
        ScheduleError: ``m < pp``.
    """
    pp = _check_int("pp", pp, 1, schedule="zb-h2")
    m = _check_int("microbatches", m, 1, schedule="zb-h2")
    if m < pp:
        raise ScheduleError(
            f"zb-h2: microbatches={m} is out of range; allowed microbatches >= {pp} (pp={pp})"
        )
    F, I, W = ActionType.F, ActionType.I, ActionType.W
    INF = float("inf")
    f_end = [[INF] * m for _ in range(pp)]
    i_end = [[INF] * m for _ in range(pp)]
    nf = [0] * pp
    ni = [0] * pp
    nw = [0] * pp
    f_limit = [min(2 * (pp - r) - 1, m) for r in range(pp)]
    w_cap = [pp - 1 + r for r in range(pp)]
    lists: dict[int, list[Action]] = {r: [] for r in range(pp)}
    t = 0
    remaining = 3 * m * pp
    while remaining:
        for r in range(pp):  # decisions at time t only see results that ended by t
            if ni[r] < m and f_end[r][ni[r]] <= t and (r == pp - 1 or i_end[r + 1][ni[r]] <= t):
                lists[r].append(Action(r, I, ni[r]))
                i_end[r][ni[r]] = t + 1
                ni[r] += 1
            elif ni[r] - nw[r] > w_cap[r]:
                lists[r].append(Action(r, W, nw[r]))
                nw[r] += 1
            elif nf[r] < m and nf[r] - ni[r] < f_limit[r] and (r == 0 or f_end[r - 1][nf[r]] <= t):
                lists[r].append(Action(r, F, nf[r]))
                f_end[r][nf[r]] = t + 1
                nf[r] += 1
            elif nw[r] < ni[r]:
                lists[r].append(Action(r, W, nw[r]))
                nw[r] += 1
            else:
                continue
            remaining -= 1
        t += 1
    return _single_chunk("zb-h2", pp, m, lists)


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
    F, B, I, W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
    lists: dict[int, list[Action]] = {}
    for r in range(pp):
        s0, s1 = r, 2 * pp - 1 - r
        acts: list[Action] = []
        count: dict[tuple[int, ActionType], int] = {}
        wq: list[tuple[int, int]] = []

        def nxt(stage: int, kind: ActionType) -> int:
            return count.get((stage, kind), 0)

        def bump_backward(stage: int) -> None:  # a full B advances both I and W counters
            count[(stage, I)] = nxt(stage, I) + 1
            count[(stage, W)] = nxt(stage, W) + 1

        def add(stage: int, kind: ActionType) -> None:
            if kind is B:
                acts.append(Action(stage, B, nxt(stage, I)))
                bump_backward(stage)
                return
            mb = nxt(stage, kind)
            acts.append(Action(stage, kind, mb))
            if kind is I:
                wq.append((stage, mb))
            count[(stage, kind)] = mb + 1

        def add_pair(f_stage: int, b_stage: int) -> None:
            f_mb, b_mb = nxt(f_stage, F), nxt(b_stage, I)
            acts.append(overlap(Action(f_stage, F, f_mb), Action(b_stage, B, b_mb)))
            count[(f_stage, F)] = f_mb + 1
            bump_backward(b_stage)

        def add_w() -> None:
            if wq:
                stage, mb = wq.pop(0)
                acts.append(Action(stage, W, mb))
                count[(stage, W)] = nxt(stage, W) + 1

        for _ in range(2 * (pp - r - 1)):  # step 1: F0
            add(s0, F)
        for _ in range(r + 1):  # step 2: F0 F1
            add(s0, F)
            add(s1, F)
        for _ in range(pp - r - 1):  # step 3: I1 W F1
            add(s1, I)
            add_w()
            add(s1, F)
        for i in range(m - 2 * pp + r + 1):  # step 4: (F0,B1) (F1,B0)
            if i == 0 and r == pp - 1:
                add(s0, F)  # not overlapped: shortens the bubble (DeepSeek)
                add(s1, B)
            else:
                add_pair(s0, s1)
            add_pair(s1, s0)
        for _ in range(pp - r - 1):  # step 5: B1 (F1,B0)
            add(s1, B)
            add_pair(s1, s0)
        zb = False  # step 6: B1 B0, second half split into I (W deferred)
        n6 = r + 1
        for i in range(n6):
            if i == n6 // 2 and r % 2 == 1:
                zb = True
            add(s1, I if zb else B)
            if i == n6 // 2 and r % 2 == 0:
                zb = True
            add(s0, I if zb else B)
        for _ in range(pp - r - 1):  # step 7: W B0
            add_w()
            add(s0, I if zb else B)
        for _ in range(r + 1):  # step 8: W
            add_w()
        lists[r] = acts
    S = 2 * pp
    s2r = {s: (s if s < pp else S - 1 - s) for s in range(S)}
    return Schedule("dualpipev", pp, S, m, lists, s2r, {"vpp": 2})


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


SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "dualpipev", "overlapped")
_ALIASES = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "one_f_one_b": "1f1b",
    "interleaved": "interleaved",
    "interleaved_1f1b": "interleaved",
    "interleaved-1f1b": "interleaved",
    "zb-h1": "zb-h1",
    "zbh1": "zb-h1",
    "zb_h1": "zb-h1",
    "zb-h2": "zb-h2",
    "zbh2": "zb-h2",
    "zb_h2": "zb-h2",
    "dualpipev": "dualpipev",
    "dualpipe-v": "dualpipev",
    "overlapped": "overlapped",
    "overlapped-1f1b": "overlapped",
    "overlapped_1f1b": "overlapped",
}


def canonical_name(name: str) -> str:
    """The canonical schedule name for ``name`` (case-insensitive, a few aliases).

    Raises:
        ScheduleError: unknown name; the message lists the allowed names.
    """
    key = str(name).strip().lower()
    if key not in _ALIASES:
        raise ScheduleError(f"unknown schedule {name!r}; allowed: {'|'.join(SCHEDULE_NAMES)}")
    return _ALIASES[key]


def build_schedule(name: str, pp: int, m: int, vpp: int = 1) -> Schedule:
    """Build a schedule by name: ``gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped``.

    ``vpp`` (chunks per rank) is used by ``interleaved`` (must be >= 2); DualPipeV always holds
    two chunks per rank and accepts ``vpp`` 1 or 2; the others need ``vpp == 1``.

    Raises:
        ScheduleError: unknown name (listing the allowed names) or settings the schedule refuses.
    """
    key = canonical_name(name)
    if key == "interleaved":
        return interleaved_1f1b(pp, vpp, m)
    if key == "dualpipev":
        if vpp not in (1, 2):
            raise ScheduleError(f"dualpipev: vpp={vpp} is out of range; DualPipeV holds exactly 2 stages per rank (vpp 1 or 2)")
        return dualpipev(pp, m)
    if vpp != 1:
        raise ScheduleError(
            f"{key}: vpp={vpp} is out of range; allowed vpp = 1 (only 'interleaved' takes vpp >= 2)"
        )
    return {
        "gpipe": gpipe,
        "1f1b": one_f_one_b,
        "zb-h1": zb_h1,
        "zb-h2": zb_h2,
        "overlapped": overlapped_1f1b,
    }[key](pp, m)


def schedule_from_lists(
    name: str,
    lists: dict[int, Sequence[str | Action]],
    stage_to_rank: dict[int, int] | None = None,
    num_microbatches: int | None = None,
) -> Schedule:
    """Build a :class:`Schedule` from per-rank lists of actions or action strings (hand-made orders).

    ``stage_to_rank`` defaults to what the compute actions imply (stage -> the rank listing it).
    Nothing is validated; call :meth:`Schedule.validate`.

    Raises:
        ScheduleError: an entry is not an action.
    """
    actions = {
        r: [a if isinstance(a, Action) else parse_action(a) for a in lists[r]] for r in sorted(lists)
    }
    buf = io.StringIO()
    csv.writer(buf).writerows([[str(a) for a in actions.get(r, [])] for r in range(max(actions, default=-1) + 1)])
    sched = Schedule.from_csv_text(
        buf.getvalue(), name=name, num_microbatches=num_microbatches, stage_to_rank=stage_to_rank
    )
    if stage_to_rank is None:  # comm-only stages (a RECV on a stage with no compute listed)
        for r, acts in sched.actions.items():
            for a in acts:
                for x in a.leaves():
                    sched.stage_to_rank.setdefault(x.stage, r)
        sched.num_stages = max(sched.stage_to_rank, default=-1) + 1
    return sched
