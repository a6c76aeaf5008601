"""The schedule IR: :class:`Schedule` (per-rank ordered action lists plus the stage -> rank map), its
validation, and torch.distributed.pipelining CSV import/export (:func:`dump_csv`, :func:`load_csv`,
:func:`schedule_from_lists` for hand-made orders).

:meth:`Schedule.validate` checks the lists and their joint executability with a dependency-only run of
:func:`tessera_lab.pipeline.engine.simulate`. Errors raise :class:`~tessera_lab.errors.ScheduleError`.
Never imports torch.
"""

from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from tessera_lab.errors import DeadlockError, ScheduleError
from tessera_lab.io import atomic_write_text
from tessera_lab.pipeline.actions import _COMPUTE_TYPES, _LEAF_COMPUTE, Action, ActionType, parse_action
from tessera_lab.pipeline.engine import simulate

__all__ = ["Schedule", "dump_csv", "load_csv", "schedule_from_lists"]


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
        self._check_shape()
        seen = self._placed_actions()
        self._check_coverage(seen)
        self._check_executable()
        return self

    def _check_shape(self) -> None:
        """Sizes >= 1, every stage on a rank in ``[0, num_ranks)``, actions only for those ranks."""
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

    def _placed_actions(self) -> dict[tuple[ActionType, int, int], int]:
        """``(type, stage, micro-batch) -> rank`` of every leaf action, each in range, on the rank holding its stage,
        transferring only to real neighbours and listed once (one loop: it runs over every action of every
        schedule built)."""
        S, m = self.num_stages, self.num_microbatches
        seen: dict[tuple[ActionType, int, int], int] = {}
        for rank in range(self.num_ranks):
            for pos, a in enumerate(self.actions.get(rank, [])):
                leaves = (a,) if a.type is not ActionType.OVERLAP_F_B and not a.sub_actions else \
                    self._leaves(rank, pos, a)
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
        return seen

    def _leaves(self, rank: int, pos: int, a: Action) -> tuple[Action, ...]:
        """The leaf actions of ``a``: its two sub-actions for a valid overlapped pair, else ``a`` itself."""
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
            return subs
        if a.sub_actions:
            raise ScheduleError(f"schedule {self.name!r}: rank {rank}: only OVERLAP_F_B may have sub-actions: {a}")
        return (a,)

    def _check_coverage(self, seen: dict) -> None:
        """Every stage runs F once per micro-batch and either B or both I and W."""
        S, m = self.num_stages, self.num_microbatches
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

    def _check_executable(self) -> None:
        """The per-rank orders can all run: a dependency-only simulation with unit times finishes."""
        try:
            simulate(self, lambda stage, mb, kind: 1.0, time_only=True)  # executability only: no timeline analyses
        except DeadlockError as exc:
            raise ScheduleError(
                f"schedule {self.name!r}: the per-rank orders cannot all run (dependency cycle); stuck: "
                + ", ".join(f"rank {r} at {a}" for r, a in sorted(exc.stuck.items()))
            ) from exc

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
