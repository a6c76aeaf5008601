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
``zb-h2``          Zero Bubble ZB-H2 within ``2p - 1`` micro-batches of activations per rank
``zb-v``           Zero Bubble ZB-V: two chunks per rank, V placement, 1F1B's peak memory
``zb-auto``        zero-bubble search from per-stage F/I/W times, p2p time and a memory budget
                   (:func:`tessera_lab.pipeline.zerobubble.zb_auto`)
``dualpipev``      DeepSeek DualPipeV (cut-in-half DualPipe, V placement), as in torch's
                   ``ScheduleDualPipeV`` and DeepSeek's ``dualpipev.py``
``overlapped``     overlapped 1F1B: the steady state runs ``F(i+k)`` together with ``B(i)``
``interleaved-``   interleaved 1F1B with (B; next F) overlapped pairs, as Megatron-Core's EP overlap
``overlapped``     with VPP > 1 (built for the planner: ``build_schedule(..., planner=True)``)
=================  ===========================================================================

Stage placement: one stage per rank for the single-chunk schedules (stage ``r`` on rank ``r``);
"looped" placement for interleaved (stage ``chunk * pp + rank``, as torch); "V" placement for
DualPipeV (rank ``r`` holds stages ``r`` and ``2 pp - 1 - r``).

This module is the public entry: it re-exports the IR (:mod:`~tessera_lab.pipeline.actions`,
:mod:`~tessera_lab.pipeline.ir`) and the generators (:mod:`~tessera_lab.pipeline.generators`,
:mod:`~tessera_lab.pipeline.zerobubble`) and builds schedules by name from its one registry, :data:`SCHEDULES` (:func:`build_schedule`).
Never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from tessera_lab.errors import ScheduleError
from tessera_lab.pipeline.actions import Action, ActionType, overlap, parse_action
from tessera_lab.pipeline.generators import (
    dualpipev,
    INTERLEAVED_OVERLAPPED,
    gpipe,
    interleaved_1f1b,
    interleaved_overlapped,
    one_f_one_b,
    overlapped_1f1b,
    zb_h1,
)
from tessera_lab.pipeline.ir import Schedule, dump_csv, load_csv, schedule_from_lists
from tessera_lab.pipeline.zerobubble import zb_auto, zb_h2, zb_v

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
    "zb_v",
    "zb_auto",
    "dualpipev",
    "overlapped_1f1b",
    "interleaved_overlapped",
    "build_schedule",
    "SCHEDULES",
    "ScheduleEntry",
    "canonical_name",
    "schedule_from_lists",
    "SCHEDULE_NAMES",
    "SEARCHED_SCHEDULE_NAMES",
    "ALL_SCHEDULE_NAMES",
    "dump_csv",
    "load_csv",
]


@dataclass(frozen=True)
class ScheduleEntry:
    """One schedule of the registry.

    Attributes:
        name: canonical name.
        build: ``build(pp, m, vpp, **search)`` -> :class:`Schedule` (``search``: zb-auto's keyword arguments).
        kind: ``"hand"`` (hand-written, with a closed form in :mod:`tessera_lab.pipeline.closedform`),
            ``"searched"`` (built by the zero-bubble search) or ``"planner"`` (built for the planner only: not a
            name :func:`canonical_name` accepts from a user).
        aliases: other spellings accepted by :func:`canonical_name`.
        vpp: the ``vpp`` values it accepts (``None``: any >= 2, the interleaved schedules check it themselves).
    """

    name: str
    build: Callable[..., Schedule]
    kind: str
    aliases: tuple[str, ...] = ()
    vpp: tuple[int, ...] | None = (1,)


def _zb_auto(pp, m, vpp, *, memory_budget=None, f=None, i=None, w=None, p2p=0.0):
    return zb_auto(pp, m, 1.0 if f is None else f, 1.0 if i is None else i, 1.0 if w is None else w,
                   p2p=p2p, memory_budget=memory_budget, vpp=vpp)


#: the one schedule registry: every schedule the package builds, by canonical name (as torch's
#: ``torch.distributed.pipelining.schedules`` keeps one name -> class table)
SCHEDULES: dict[str, ScheduleEntry] = {e.name: e for e in (
    ScheduleEntry("gpipe", lambda pp, m, vpp, **_: gpipe(pp, m), "hand"),
    ScheduleEntry("1f1b", lambda pp, m, vpp, **_: one_f_one_b(pp, m), "hand", ("one_f_one_b",)),
    ScheduleEntry("interleaved", lambda pp, m, vpp, **_: interleaved_1f1b(pp, vpp, m), "hand",
                  ("interleaved_1f1b", "interleaved-1f1b"), None),
    ScheduleEntry("zb-h1", lambda pp, m, vpp, **_: zb_h1(pp, m), "hand", ("zbh1", "zb_h1")),
    ScheduleEntry("zb-h2", lambda pp, m, vpp, **_: zb_h2(pp, m), "hand", ("zbh2", "zb_h2")),
    ScheduleEntry("dualpipev", lambda pp, m, vpp, **_: dualpipev(pp, m), "hand", ("dualpipe-v",), (1, 2)),
    ScheduleEntry("overlapped", lambda pp, m, vpp, **_: overlapped_1f1b(pp, m), "hand",
                  ("overlapped-1f1b", "overlapped_1f1b")),
    ScheduleEntry("zb-v", lambda pp, m, vpp, **_: zb_v(pp, m), "searched", ("zbv", "zb_v"), (1, 2)),
    ScheduleEntry("zb-auto", _zb_auto, "searched", ("zb_auto", "zbauto"), None),
    ScheduleEntry(INTERLEAVED_OVERLAPPED, lambda pp, m, vpp, **_: interleaved_overlapped(pp, vpp, m), "planner",
                  (), None),
)}

#: hand-written schedules (each has a closed form in :mod:`tessera_lab.pipeline.closedform`)
SCHEDULE_NAMES = tuple(n for n, e in SCHEDULES.items() if e.kind == "hand")
#: schedules built by the zero-bubble search (:mod:`tessera_lab.pipeline.zerobubble`)
SEARCHED_SCHEDULE_NAMES = tuple(n for n, e in SCHEDULES.items() if e.kind == "searched")
#: the names a user may give (``canonical_name``)
ALL_SCHEDULE_NAMES = SCHEDULE_NAMES + SEARCHED_SCHEDULE_NAMES
_ALIASES = {a: e.name for e in SCHEDULES.values() for a in (e.name, *e.aliases)}


def canonical_name(name: str, *, planner: bool = False) -> str:
    """The canonical schedule name for ``name`` (case-insensitive, a few aliases); ``planner=True`` also accepts the
    schedules built for the planner only (``interleaved-overlapped``).

    Raises:
        ScheduleError: unknown name; the message lists the allowed names.
    """
    key = str(name).strip().lower()
    got = _ALIASES.get(key)
    if got is None or (SCHEDULES[got].kind == "planner" and not planner):
        raise ScheduleError(f"unknown schedule {name!r}; allowed: {'|'.join(ALL_SCHEDULE_NAMES)}")
    return got


def build_schedule(
    name: str,
    pp: int,
    m: int,
    vpp: int = 1,
    *,
    memory_budget: float | None = None,
    f: float | Sequence[float] | None = None,
    i: float | Sequence[float] | None = None,
    w: float | Sequence[float] | None = None,
    p2p: float = 0.0,
    planner: bool = False,
) -> Schedule:
    """Build a schedule by name: ``gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped|zb-v|zb-auto`` (and,
    with ``planner=True``, ``interleaved-overlapped``), from :data:`SCHEDULES`.

    ``vpp`` (chunks per rank) is used by ``interleaved`` (must be >= 2); DualPipeV and ZB-V always hold two
    chunks per rank and accept ``vpp`` 1 or 2; ``zb-auto`` takes 1 (one stage per rank) or 2 (V placement);
    the others need ``vpp == 1``. The keyword arguments are used by ``zb-auto`` only (ignored by the others):
    ``memory_budget`` in micro-batches of a rank's activations, per-stage ``f``, ``i``, ``w`` seconds (default
    1.0 each) and ``p2p`` seconds per cross-rank transfer; see
    :func:`tessera_lab.pipeline.zerobubble.zb_auto`.

    Raises:
        ScheduleError: unknown name (listing the allowed names) or settings the schedule refuses.
    """
    entry = SCHEDULES[canonical_name(name, planner=planner)]
    key = entry.name
    if entry.vpp == (1, 2) and vpp not in (1, 2):
        raise ScheduleError(f"{key}: vpp={vpp} is out of range; {key} holds exactly 2 stages per rank (vpp 1 or 2)")
    if entry.vpp == (1,) and vpp != 1:
        raise ScheduleError(
            f"{key}: vpp={vpp} is out of range; allowed vpp = 1 (only 'interleaved' takes vpp >= 2)"
        )
    return entry.build(pp, m, vpp, memory_budget=memory_budget, f=f, i=i, w=w, p2p=p2p)


def default_schedule(schedule: str | None, vpp: int, ep_overlap: bool = True) -> str:
    """The schedule ``plan`` and ``report`` use: ``schedule`` as given; else, where Megatron-Core's combined-1F1B EP
    overlap can run (``ep_overlap``, :func:`default_ep_overlap`: MoE layers, EP > 1 and no full or ``moe``-module
    recompute, as ``overlap_moe_expert_parallel_comm`` requires),
    ``overlapped``, or with ``vpp >= 2`` its virtual-stage form ``interleaved-overlapped``; elsewhere (a dense
    model, EP 1) ``1f1b``, or ``interleaved`` with ``vpp >= 2`` (only the interleaved schedules take virtual
    stages)."""
    if schedule is not None:
        return schedule
    if ep_overlap:
        return "interleaved-overlapped" if vpp >= 2 else "overlapped"
    return "interleaved" if vpp >= 2 else "1f1b"


def default_ep_overlap(args: Any, model: Any = None) -> bool:
    """Whether :func:`default_schedule`'s default is an EP-overlap one for ``args`` (``plan``'s options, or any object
    with ``ep``, ``pp``, ``vpp`` and, where set, ``recompute`` and ``recompute_modules``; unset: no recompute): MoE
    layers (``model`` None: assumed) and every rule of Megatron-Core's EP overlap
    (:func:`~tessera_lab.model.hardware.overlap_rule_breaks`) but its virtual-stage rule, which the default meets by
    its interleaved form with ``vpp`` >= 2 and this project's one-chunk schedule waives."""
    from types import SimpleNamespace

    from tessera_lab.model.hardware import VPP_RULE, overlap_rule_breaks

    lay = SimpleNamespace(ep=args.ep, pp=args.pp, vpp=args.vpp, recompute=getattr(args, "recompute", None) or "none",
                          recompute_modules=tuple(getattr(args, "recompute_modules", None) or ()))
    return (model is None or model.has_moe) and not [b for b in overlap_rule_breaks(lay) if b != VPP_RULE]
