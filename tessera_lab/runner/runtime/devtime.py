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

import time

import torch

__all__ = ["StepClock"]


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
