"""Discrete-event simulation of pipeline schedules, and the :class:`Timeline` it produces.

Model (times in float seconds):

* Each rank has a **compute lane** that runs its action list strictly in order, and a
  **communication lane** (point-to-point transfers into the rank, and optional extra collectives).
  A rank blocks until the next action's inputs have arrived.
* Dependencies: ``F`` of micro-batch ``i`` on stage ``s`` needs ``F(s-1, i)``; a backward (``B`` or
  ``I``) of ``i`` on ``s`` needs ``F(s, i)`` and the backward of ``i`` on ``s+1`` (the last stage
  only its own ``F``); ``W`` needs ``I`` of the same stage and micro-batch. An ``OVERLAP_F_B`` pair
  needs the inputs of both its sub-actions, runs for the pair makespan and delivers both outputs
  when it ends.
* Transfers between stages on different ranks take ``p2p_latency + p2p_time(src, dst)``;
  transfers between stages on the same rank are free. A zero-time transfer is a no-op (no event,
  no exposed time; with blocking sends it still synchronises sender and receiver).
  Without explicit SEND/RECV actions a transfer starts when its producer ends (batched
  ``isend``/``irecv``, as Megatron and torch do). Explicit ``SEND_*`` actions post the send when the
  rank reaches them; with ``blocking_sends=True`` a send is a rendezvous: it completes (and the
  sender continues) only after the receiver has posted the matching receive (explicit
  ``RECV_*``, or implicitly when it reaches the consuming compute action) and the data moved;
  explicit receives then block until the data arrives. Orders that can never complete raise
  :class:`~tessera_lab.errors.DeadlockError` naming each stuck rank and its next action.

Durations come from a callable ``durations(stage, microbatch, type) -> seconds`` (the
:class:`Durations` protocol). For an ``OVERLAP_F_B`` pair it is called with the *backward*
sub-action's stage and micro-batch and ``ActionType.OVERLAP_F_B``.

Closed forms (:func:`closed_form`) follow GPipe / PipeDream-Flush (1F1B), Megatron-LM interleaved
1F1B (Narayanan et al., SC21), Zero Bubble (Qi et al., ICLR 2024) and DeepSeek's DualPipe README.

This module is the public entry: the engine lives in :mod:`~tessera_lab.pipeline.engine`, durations in
:mod:`~tessera_lab.pipeline.durations`, the result in :mod:`~tessera_lab.pipeline.timeline` and the closed forms
in :mod:`~tessera_lab.pipeline.closedform`; everything is re-exported here. Never imports torch; pandas is
imported only by :meth:`Timeline.to_dataframe` and :func:`compare_with_closed_form`.
"""

from __future__ import annotations

from tessera_lab.pipeline.closedform import closed_form, compare_with_closed_form
from tessera_lab.pipeline.durations import Durations, override_durations, stage_durations, uniform_durations
from tessera_lab.pipeline.engine import _transfer_fn, simulate
from tessera_lab.pipeline.timeline import (
    P2P_COLLECTIVE,
    Event,
    Timeline,
    interval_gaps,
    merge_intervals,
    overlap_length,
)

__all__ = [
    "Durations",
    "uniform_durations",
    "stage_durations",
    "override_durations",
    "Event",
    "Timeline",
    "simulate",
    "closed_form",
    "compare_with_closed_form",
    "merge_intervals",
    "overlap_length",
    "interval_gaps",
    "P2P_COLLECTIVE",
    "_transfer_fn",
]
