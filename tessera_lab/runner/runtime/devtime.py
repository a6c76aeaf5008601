"""Time stamps of the runtime: a host clock on CPU, CUDA events on a GPU (a host clock does not time a GPU: CUDA
work is asynchronous, ``work.wait()`` on NCCL returns at once).

:class:`StepClock` hands out stamps: on CPU seconds since the step's start (``time.perf_counter``); on CUDA a
``torch.cuda.Event(enable_timing=True)`` recorded on the calling thread's current stream, i.e. the moment the GPU
reaches that point of the stream. :meth:`StepClock.resolve` turns a step's stamps into seconds after the step's
start event, with one ``torch.cuda.synchronize`` at the end of the step (off the critical path: the step's work
is all issued). Host-side measurements (a host wait, the host time of a W run for the gap controller) use
:meth:`StepClock.host` on every device; :meth:`StepClock.settle` reads the host clock once the device has run
everything issued (a step's end after its gradient sync and optimizer, which never wait on the host).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator

import torch

__all__ = ["StepClock", "SYNC_DEBUG_ENV", "sync_debug", "sync_debug_mode"]

#: environment variable: ``warn`` or ``error`` runs a step's actions under ``torch.cuda.set_sync_debug_mode`` (CUDA
#: only), which warns about or raises on every operation that synchronises the host with the device (``.item()``,
#: ``.tolist()``, a blocking copy, ``torch.cuda.synchronize``): the GPU's own check that a path claimed free of host
#: syncs is (the CPU tests guard the host reads they can see, ``tests/test_capacity_dispatch.py``)
SYNC_DEBUG_ENV = "TESSERA_LAB_SYNC_DEBUG"


#: the values ``torch.cuda.set_sync_debug_mode`` takes (torch/cuda/__init__.py: ``"default"`` or 0 off, ``"warn"`` or 1,
#: ``"error"`` or 2), each spelled as a string in the environment, to the mode set (None: off)
SYNC_DEBUG_VALUES = {"": None, "default": None, "0": None, "warn": "warn", "1": "warn", "error": "error", "2": "error"}


def sync_debug_mode() -> str | None:
    """``"warn"``, ``"error"`` or None (off: unset, empty, ``default`` or ``0``) from :data:`SYNC_DEBUG_ENV`, which
    takes what ``torch.cuda.set_sync_debug_mode`` takes (:data:`SYNC_DEBUG_VALUES`; case and surrounding blanks
    ignored, as for the other variables a shell sets).

    Raises:
        ValueError: any other value (one line naming the variable, the value and the allowed ones).
    """
    raw = os.environ.get(SYNC_DEBUG_ENV, "")
    mode = raw.strip().lower()
    if mode in SYNC_DEBUG_VALUES:
        return SYNC_DEBUG_VALUES[mode]
    raise ValueError(f"{SYNC_DEBUG_ENV} = {raw!r} is not allowed; allowed: warn or 1, error or 2, default or 0 "
                     "(off), or unset (torch.cuda.set_sync_debug_mode's values)")


@contextlib.contextmanager
def sync_debug(device: torch.device) -> Iterator[None]:
    """Run the block under :func:`sync_debug_mode`'s setting on a CUDA ``device`` (the setting is process-wide: every
    thread's operations count), restoring the previous setting after; nothing on CPU or when unset."""
    mode = sync_debug_mode()
    if mode is None or device.type != "cuda":
        yield
        return
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(old)


class StepClock:
    """Stamps for one rank's steps on ``device`` (module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.t0 = 0.0
        self._ev0 = None

    def start(self, t0: float) -> None:
        """Start a step; ``t0``: ``time.perf_counter()`` at its start (host)."""
        self.t0 = t0
        if self.cuda:
            self._ev0 = torch.cuda.Event(enable_timing=True)
            self._ev0.record()

    def host(self) -> float:
        """Host seconds since the step's start."""
        return time.perf_counter() - self.t0

    def settle(self) -> float:
        """``time.perf_counter()`` (host seconds) once the device has run everything issued so far: after a
        ``torch.cuda.synchronize`` on CUDA (the gradient collectives and the optimizer only enqueue kernels, so
        the host clock alone would time their launches), at once on CPU."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def now(self):
        """A stamp: host seconds on CPU, a recorded CUDA event on a GPU."""
        if not self.cuda:
            return time.perf_counter() - self.t0
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, stamp) -> float:
        """Seconds after the step's start of ``stamp`` (after :meth:`resolve`'s synchronize on CUDA)."""
        if isinstance(stamp, (int, float)):
            return float(stamp)
        return self._ev0.elapsed_time(stamp) / 1e3  # elapsed_time: milliseconds

    def resolve(self, events: list[tuple]) -> list[tuple]:
        """``(lane, type, stage, mb, start, end, label)`` events with stamps -> with seconds."""
        if not self.cuda:
            return events
        torch.cuda.synchronize(self.device)
        return [(lane, typ, s, mb, self.seconds(a), self.seconds(b), label)
                for lane, typ, s, mb, a, b, label in events]
