"""Action durations for the simulator: the :class:`Durations` protocol
``durations(stage, microbatch, type) -> seconds`` and three makers (:func:`uniform_durations`,
:func:`stage_durations`, :func:`override_durations`). Bad times raise
:class:`~tessera_lab.errors.ConfigError`. Never imports torch.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Protocol, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.actions import ActionType

__all__ = ["Durations", "uniform_durations", "stage_durations", "override_durations"]

_F, _B, _I, _W = ActionType.F, ActionType.B, ActionType.I, ActionType.W
_OV = ActionType.OVERLAP_F_B


class Durations(Protocol):
    """``durations(stage, microbatch, type) -> seconds``.

    ``type`` is an :class:`ActionType`: ``F``, ``B`` (full backward), ``I`` (input gradient), ``W``
    (weight gradient) or ``OVERLAP_F_B`` (called with the backward sub-action's stage and
    micro-batch; returns the pair makespan). Any callable with this signature works, e.g. one
    that reads per-(stage, micro-batch) expert loads for variable routing.

    Optionally the object also has ``batch(stages, microbatches, types) -> list[float]``: the values of calling it
    on each triple of the three equal-length lists, in order. The simulator then asks for every action's time in
    one call (the makers below have it).
    """

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float: ...


def _nonneg(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds >= 0, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{name}={value!r} is out of range; allowed: finite seconds >= 0")
    return v


class _Uniform:
    __slots__ = ("f", "b", "w", "i", "fb", "_table")

    def __init__(self, f: float, b: float, w: float | None, fb: float | None):
        self.f = _nonneg("f", f)
        self.b = _nonneg("b", b)
        self.w = 0.0 if w is None else _nonneg("w", w)
        if self.w > self.b:
            raise ConfigError(f"w={w} is out of range; the weight-gradient time must be <= b={b} (b is the full backward)")
        self.i = self.b - self.w
        self.fb = self.f + self.b if fb is None else _nonneg("fb", fb)
        self._table = {_F: self.f, _B: self.b, _I: self.i, _W: self.w, _OV: self.fb}

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        return self._table[type]

    def batch(self, stages, microbatches, types) -> list[float]:
        """``[self(s, i, k) for s, i, k in zip(stages, microbatches, types)]``."""
        return list(map(self._table.__getitem__, types))

    def __repr__(self) -> str:
        return f"uniform_durations(f={self.f}, b={self.b}, w={self.w}, fb={self.fb})"


def uniform_durations(f: float, b: float, w: float | None = None, fb: float | None = None) -> Durations:
    """The same times on every stage and micro-batch (seconds).

    Args:
        f: forward time F.
        b: full backward time B (input gradient + weight gradient).
        w: weight-gradient time W; a split backward then takes ``I = b - w`` and ``W = w``.
            ``None`` means the split is unknown: ``I = b`` and ``W = 0``.
        fb: makespan of an overlapped F+B pair (``OVERLAP_F_B``); default ``f + b`` (no overlap
            gain). Perfect overlap would be ``max(f, b)``; measured values can even exceed
            ``f + b`` (docs/concepts.md, "Overlap of two task bundles").

    Raises:
        ConfigError: a negative or non-finite time, or ``w > b``.
    """
    return _Uniform(f, b, w, fb)


class _PerStage:
    __slots__ = ("tables",)

    def __init__(self, tables: list[dict]):
        self.tables = tables

    def __call__(self, stage: int, microbatch: int, type: ActionType) -> float:
        try:
            return self.tables[stage][type]
        except IndexError:
            raise ConfigError(
                f"stage_durations: no times for stage {stage}; lists cover stages 0..{len(self.tables) - 1}"
            ) from None

    def batch(self, stages, microbatches, types) -> list[float]:
        """``[self(s, i, k) for s, i, k in zip(stages, microbatches, types)]``."""
        tables = self.tables
        try:
            return [tables[s][k] for s, k in zip(stages, types)]
        except IndexError:
            return list(map(self, stages, microbatches, types))  # raises the call's error


def stage_durations(
    f: Sequence[float],
    b: Sequence[float],
    w: Sequence[float] | None = None,
    fb: Sequence[float] | Callable[[float, float], float] | None = None,
) -> Durations:
    """Per-stage times (seconds); index = global stage.

    Args:
        f, b: forward and full-backward time of each stage.
        w: weight-gradient time of each stage (``I = b - w``); ``None``: ``I = b``, ``W = 0``.
        fb: pair makespan of an ``OVERLAP_F_B`` whose backward runs on stage ``s``: a sequence
            (``fb[s]``), or a callable ``fb(f[s], b[s])`` (e.g. ``max`` for perfect overlap), or
            ``None`` for ``f[s] + b[s]``.

    Raises:
        ConfigError: lists of different lengths, negative times, or ``w[s] > b[s]``.
    """
    f, b = list(f), list(b)
    n = len(f)
    if len(b) != n or (w is not None and len(w) != n) or (fb is not None and not callable(fb) and len(fb) != n):
        raise ConfigError(
            f"stage_durations: f, b, w and fb must have one entry per stage; got lengths f={n}, b={len(b)}"
            + (f", w={len(w)}" if w is not None else "")
            + (f", fb={len(fb)}" if fb is not None and not callable(fb) else "")
        )
    tables = []
    for s in range(n):
        fs, bs = _nonneg(f"f[{s}]", f[s]), _nonneg(f"b[{s}]", b[s])
        ws = 0.0 if w is None else _nonneg(f"w[{s}]", w[s])
        if ws > bs:
            raise ConfigError(f"w[{s}]={ws} is out of range; allowed <= b[{s}]={bs}")
        if fb is None:
            fbs = fs + bs
        elif callable(fb):
            fbs = _nonneg(f"fb(f[{s}], b[{s}])", fb(fs, bs))
        else:
            fbs = _nonneg(f"fb[{s}]", fb[s])
        tables.append({_F: fs, _B: bs, _I: bs - ws, _W: ws, _OV: fbs})
    return _PerStage(tables)


def override_durations(
    base: Durations, overrides: Mapping[tuple[int, int, ActionType | str], float]
) -> Durations:
    """``base`` with some (stage, micro-batch, type) entries replaced (seconds).

    Use it for per-micro-batch variation such as routing skew: ``{(3, 7, "F"): 0.012, ...}``.

    Raises:
        ConfigError: a negative override or an unknown type.
    """
    table: dict[tuple[int, int, ActionType], float] = {}
    for key, value in overrides.items():
        stage, mb, kind = key
        try:
            kind = ActionType(kind)
        except ValueError:
            raise ConfigError(f"override_durations: unknown action type {kind!r}; allowed F, B, I, W, OVERLAP_F_B") from None
        table[(int(stage), int(mb), kind)] = _nonneg(f"override {key}", value)

    def durations(stage: int, microbatch: int, type: ActionType) -> float:
        v = table.get((stage, microbatch, type))
        return base(stage, microbatch, type) if v is None else v

    return durations


def _transfer_fn(p2p_latency: float, p2p_time) -> Callable[[int, int], float]:
    lat = _nonneg("p2p_latency", p2p_latency)
    if p2p_time is None:
        return lambda src, dst: lat
    if callable(p2p_time):
        memo: dict[tuple[int, int], float] = {}  # p2p_time is a function of (src, dst): asked once per pair

        def fn(src: int, dst: int) -> float:
            got = memo.get((src, dst))
            if got is not None:
                return got
            v = p2p_time(src, dst)
            if not 0.0 <= v < math.inf:
                raise ConfigError(f"p2p_time({src}, {dst}) returned {v!r}; allowed finite seconds >= 0")
            got = memo[(src, dst)] = lat + v
            return got

        return fn
    t = lat + _nonneg("p2p_time", p2p_time)
    return lambda src, dst: t
