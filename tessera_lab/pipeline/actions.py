"""Pipeline actions in ``torch.distributed.pipelining`` notation: :class:`ActionType`, :class:`Action`,
:func:`parse_action` (text -> action) and :func:`overlap` (an ``OVERLAP_F_B`` pair).

An *action* is one unit of pipeline work: ``<stage><type><microbatch>``, e.g. ``0F7`` (forward of
micro-batch 7 on stage 0), ``2B3`` (full backward), ``1I4`` / ``1W4`` (input-gradient and
weight-gradient halves of a backward, as in the Zero Bubble paper), ``1SEND_F4`` / ``2RECV_F4``
(point-to-point transfers), and overlapped pairs ``(0F7;7B3)OVERLAP_F_B``. Errors raise
:class:`~tessera_lab.errors.ScheduleError` quoting the text. Never imports torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from tessera_lab.errors import ScheduleError

__all__ = ["ActionType", "Action", "overlap", "parse_action"]


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
