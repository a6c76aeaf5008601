"""The per-EP-group controller of the dynamic bubble optimizer: torch-free, shared by simulator and runner.

One controller runs in every EP group (the EP ranks of one pipeline rank); there is no central controller and no
extra collective. What it knows at a decision (and nothing else, so there is no oracle):

* the exact seconds of each pending weight-gradient chunk: its micro-batch has already been routed (the count
  exchange of the forward precedes the expert compute, and the backward reuses the forward's routing), so its
  expert load is known; the caller passes those seconds in;
* the waits it observed at each slot of its order in earlier steps (a *slot* is the index of a non-W action in
  the rank's action list; its wait is the time from the rank being free until the action's last input arrived,
  whether or not W filled it) and its tail (iteration end minus the end of its last non-W action, less the W
  the static order itself places after that action). A stated
  :class:`WaitPredictor` turns that history into the predicted wait of every slot in the coming step.

In a real EP group every rank folds its observed waits into the next count exchange (a few more ints on a
message that is sent anyway) and the controller uses the group maximum, so every rank of the group holds the
same history and takes the same decisions (needed because the DP reduce-scatter chunks it schedules are
collectives). The simulator models one EP group per pipeline rank (busiest-rank pace), so there the group
maximum is the rank's own observation.

Decisions (:class:`GapController`; the executors only call :meth:`~GapController.at_w_place`,
:meth:`~GapController.in_wait` and :meth:`~GapController.must_free`):

* at a W part's static place: let it wait (defer) only when the rank's next action has its inputs now, the rank
  is under its memory cap and all W seconds past their static place fit in the predicted idle time still ahead
  (remaining predicted waits plus the predicted tail) with a safety margin (:meth:`~GapController.may_defer`);
* in a wait: repay deferred work first (it costs time later anyway); otherwise pull a pending part earlier only if
  it fits the predicted rest of the wait, ``seconds <= (1 - margin) * pred - elapsed``
  (:meth:`~GapController.fits`), and its own static place is busy (no wait or tail predicted right after it);
* before a forward that would exceed the memory cap: run pending parts.

Until a slot has history its predicted wait is 0: the first step runs the static order. Times are float seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from tessera_lab.errors import ConfigError

__all__ = ["PREDICTORS", "WaitPredictor", "parse_predictor", "GapController", "pack_waits", "unpack_waits",
           "pick_in_wait"]

PREDICTORS = "last-step | moving-average:K | minimum:K (K an integer >= 1)"


@dataclass(frozen=True)
class WaitPredictor:
    """How the waits of earlier steps predict the coming step's waits at the same slot.

    Attributes:
        kind: ``last-step`` (the previous step's wait), ``moving-average`` (mean of the last ``window``
            steps) or ``minimum`` (smallest of the last ``window`` steps: conservative).
        window: steps remembered (1 for ``last-step``).
    """

    kind: str = "last-step"
    window: int = 1

    def __str__(self) -> str:
        return self.kind if self.kind == "last-step" else f"{self.kind}:{self.window}"

    def predict(self, history: "deque[float] | list[float]") -> float:
        """Predicted seconds from a slot's history (oldest first); 0.0 without history."""
        if not history:
            return 0.0
        recent = list(history)[-self.window:]
        if self.kind == "last-step":
            return float(recent[-1])
        if self.kind == "moving-average":
            return float(sum(recent) / len(recent))
        return float(min(recent))


def parse_predictor(text: str | WaitPredictor) -> WaitPredictor:
    """Parse ``last-step``, ``moving-average:K`` or ``minimum:K``.

    Raises:
        ConfigError: naming the field ``predictor`` and the allowed forms.
    """
    if isinstance(text, WaitPredictor):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"field 'predictor' = {text!r} is unknown; allowed: {PREDICTORS}")
    kind, _, rest = text.strip().lower().partition(":")
    if kind == "last-step" and not rest:
        return WaitPredictor("last-step", 1)
    if kind in ("moving-average", "minimum"):
        try:
            k = int(rest) if rest else 4
        except ValueError:
            k = 0
        if k >= 1:
            return WaitPredictor(kind, k)
    raise ConfigError(f"field 'predictor' = {text!r} is unknown; allowed: {PREDICTORS}")


@dataclass
class GapController:
    """One EP group's decisions on one pipeline rank (see the module docstring).

    Attributes:
        predictor: how past waits predict the coming ones.
        margin: safety share of a predicted wait left unfilled, in [0, 1).
        waits: slot -> observed waits, oldest first (at most ``predictor.window`` kept).
        tails: observed tails, oldest first.
        predicted: slot -> predicted wait for the current step (set by :meth:`begin_step`).
        decisions: W chunks this step run early in a wait (``fill``), deferred past their static place
            (``defer``), or forced by the memory cap (``forced``).
    """

    predictor: WaitPredictor = field(default_factory=WaitPredictor)
    margin: float = 0.5
    waits: dict[int, deque] = field(default_factory=dict)
    tails: deque = field(default_factory=deque)
    predicted: dict[int, float] = field(default_factory=dict)
    predicted_tail: float = 0.0
    decisions: dict[str, int] = field(default_factory=dict)
    _ahead: list[float] = field(default_factory=list)
    _slots: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.predictor = parse_predictor(self.predictor)
        if not (isinstance(self.margin, (int, float)) and 0.0 <= self.margin < 1.0):
            raise ConfigError(f"field 'margin' = {self.margin!r} is out of range; allowed: 0 <= margin < 1")

    # ---------------------------------------------------------------- step boundaries
    def begin_step(self, slots: list[int]) -> None:
        """Predict every slot's wait for the coming step; ``slots`` are the rank's non-W action indices."""
        self._slots = list(slots)
        self.predicted = {k: self.predictor.predict(self.waits.get(k, ())) for k in self._slots}
        self.predicted_tail = self.predictor.predict(self.tails)
        # suffix sums: predicted idle still ahead after slot position n (waits of later slots + the tail)
        ahead = [self.predicted_tail]
        for k in reversed(self._slots):
            ahead.append(ahead[-1] + self.predicted[k])
        ahead.reverse()
        self._ahead = ahead  # _ahead[n] = idle predicted from slot position n on
        self.decisions = {"fill": 0, "defer": 0, "repaid": 0, "forced": 0}

    def end_step(self, waits: dict[int, float], tail: float) -> None:
        """Record the waits observed this step at each slot (seconds) and the tail."""
        keep = self.predictor.window
        for k, w in waits.items():
            q = self.waits.setdefault(k, deque(maxlen=keep))
            q.append(max(0.0, float(w)))
        if self.tails.maxlen != keep:
            self.tails = deque(self.tails, maxlen=keep)
        self.tails.append(max(0.0, float(tail)))

    # ---------------------------------------------------------------- decisions
    def fits(self, slot: int, elapsed: float, seconds: float, *, count: bool = True) -> bool:
        """Whether a pending chunk of ``seconds`` fits in the predicted rest of the wait at ``slot``."""
        pred = self.predicted.get(slot, 0.0)
        ok = seconds > 0 and seconds <= (1.0 - self.margin) * pred - elapsed
        if ok and count:
            self.decisions["fill"] = self.decisions.get("fill", 0) + 1
        return ok

    def may_defer(self, position: int, pending_s: float, *, count: bool = True) -> bool:
        """Whether a W may wait past its static place: ``position`` = non-W actions of the rank's order run so
        far; ``pending_s`` = seconds of W parts already past their static place, this one included."""
        ahead = self._ahead[position] if 0 <= position < len(self._ahead) else self.predicted_tail
        ok = pending_s > 0 and pending_s <= (1.0 - self.margin) * ahead
        if ok and count:
            self.decisions["defer"] = self.decisions.get("defer", 0) + 1
        return ok

    # ---------------------------------------------------------------- the policy, as the executors call it
    def at_w_place(self, position: int, displaced_s: float, seconds: float, *, next_ready: bool, live: int,
                   cap: float) -> bool:
        """At a W part's place in the static order: ``True`` lets it wait (defer), ``False`` runs it there.

        Deferring pays only when the rank's next action has its inputs now (``next_ready``), needs room under
        the memory cap (``live`` micro-batches held, the deferred one included, below ``cap``) and the budget of
        :meth:`may_defer` for the ``displaced_s + seconds`` of work past its static place."""
        return bool(live < cap and next_ready and self.may_defer(position, displaced_s + seconds))

    def in_wait(self, slot: int, elapsed: float, displaced: tuple | None, oldest: tuple | None, *,
                later_slot: int | None = None):
        """While the rank waits at ``slot``: what to run now, given its oldest displaced part and its oldest
        pending part (each ``(name, seconds)`` or ``None``). Displaced work is repaid in the first wait (it costs
        time later anyway). Other pending work is pulled earlier only into a wait predicted to fit it, and only
        when its own static place is busy: ``later_slot`` is the slot right after that place (``-1``: the end);
        if a wait is predicted there too (or the tail, at the end), the part already runs in idle time where it
        is and pulling it earlier would only risk delaying this slot. Returns a name or ``None`` (stay idle until
        the input arrives)."""
        if displaced is not None:
            self.repaid()
            return displaced[0]
        if oldest is None:
            return None
        if later_slot is not None:
            idle_there = self.predicted_tail if later_slot < 0 else self.predicted.get(later_slot, 0.0)
            if idle_there > 0.0:
                return None
        if self.fits(slot, elapsed, oldest[1]):
            return oldest[0]
        return None

    def must_free(self, live: int, need: int, cap: float) -> bool:
        """Before a forward of ``need`` micro-batches: whether pending W must run first to stay under ``cap``."""
        over = live + need > cap
        if over:
            self.forced()
        return over

    def repaid(self) -> None:
        """Count a deferred chunk run in the first wait after its static place (it would cost time later)."""
        self.decisions["repaid"] = self.decisions.get("repaid", 0) + 1

    def forced(self) -> None:
        """Count a chunk the memory cap forced."""
        self.decisions["forced"] = self.decisions.get("forced", 0) + 1


# -------------------------------------------------------------------- the runner's side of the count exchange
def pack_waits(counts: list[int], waits: dict[int, float], slots: list[int]) -> list[int]:
    """One rank's count-exchange row: its tokens per expert, then its observed wait at each of ``slots`` in
    integer microseconds (the same message the dispatch sends anyway, a few ints longer)."""
    return [int(c) for c in counts] + [max(0, int(round(1e6 * waits.get(k, 0.0)))) for k in slots]


def unpack_waits(rows: list[list[int]], num_experts: int, slots: list[int]) -> tuple[list[list[int]], dict[int, float]]:
    """Split the rows every rank of an EP group received into counts per rank and the group's waits (the
    maximum over its ranks, seconds). Every rank gets the same rows, so every rank gets the same waits and takes
    the same decisions.

    Raises:
        ConfigError: a row of the wrong length.
    """
    n = num_experts + len(slots)
    if any(len(r) != n for r in rows):
        raise ConfigError(f"field 'rows': every row needs {num_experts} counts + {len(slots)} waits = {n} ints")
    counts = [list(r[:num_experts]) for r in rows]
    waits = {k: max(r[num_experts + j] for r in rows) / 1e6 for j, k in enumerate(slots)} if rows else {}
    return counts, waits


def pick_in_wait(ctl: GapController, slot: int, elapsed: float, pending: list[tuple[str, float]]) -> list[str]:
    """Which pending items (``(name, seconds)`` in the order they must run: deferred W parts oldest first, then a
    stage's DP reduce-scatter chunks once its W parts are done) to start now, at ``elapsed`` seconds into the wait
    at ``slot``: the longest prefix that fits the predicted rest of the wait (see :meth:`GapController.fits`)."""
    out, used = [], 0.0
    for name, sec in pending:
        if not ctl.fits(slot, elapsed + used, sec):
            break
        out.append(name)
        used += sec
    return out
