"""A work probe: the CPU time of one fixed piece of the runner's own work (one linear-attention layer's
forward + backward of the tiny runner model) on this machine *now*.

On this shared VM the CPU-seconds the same torch work takes move by up to 1.5x over minutes (other tenants'
cache and memory-bandwidth use; a pure-Python loop's speed does not follow them). Calibration records the
probe while it measures (``runner_cpu.work_probe``); a prediction measures it again just before the run it
predicts and scales the calibrated CPU work by the ratio (:func:`tessera_lab.runner.testbed.predict.predict_runner`,
``work_scale``): a measurement made before the run, never one of the predicted runs.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

__all__ = ["cpu_median", "layer_fb", "work_probe"]

_CACHE: dict = {}


def cpu_median(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU-seconds (``time.process_time``: this process, every thread) of ``repeats`` calls of ``fn``
    after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        c = time.process_time()
        fn()
        ts.append(time.process_time() - c)
    return statistics.median(ts)


def layer_fb(cfg=None, mbs: int = 2) -> Callable[[], None]:
    """A closure running forward + backward of the first linear-attention layer of the runner model ``cfg``
    (:class:`tessera_lab.runner.runtime.specs.TinyConfig`, default the tiny runner) on ``mbs`` sequences; built once
    per process and configuration."""
    import torch

    from ..runtime.layers import TinyMoEModel
    from ..runtime.specs import TinyConfig

    cfg = cfg or TinyConfig()
    key = (tuple(sorted(cfg.as_dict().items())), mbs)
    if key not in _CACHE:
        model = TinyMoEModel(cfg)
        layer = model.layers[next(i for i, k in enumerate(cfg.layer_kinds()) if k == "linear_attention")]
        h = torch.randn(mbs, cfg.seq_len, cfg.hidden_size, requires_grad=True)
        g = torch.ones(mbs, cfg.seq_len, cfg.hidden_size) * 1e-3

        def fb() -> None:
            layer(h).backward(g)

        _CACHE[key] = fb
    return _CACHE[key]


def work_probe(cfg=None, mbs: int = 2, *, repeats: int = 5, rounds: int = 16) -> float:
    """CPU-seconds of one :func:`layer_fb` call now, on one intra-op thread: the mean over ``rounds`` short
    windows of the median of ``repeats`` calls (about 0.6 s on this machine). The mean, because this VM's
    cores switch between a fast and a slow state within a second (one window reads 6.6-7.7 ms or 9.5-12.7 ms,
    40 windows in 16 s) and a run takes the time-mean of the states; a median flips between the modes."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fb = layer_fb(cfg, mbs)
        return statistics.fmean(cpu_median(fb, repeats) for _ in range(rounds))
    finally:
        torch.set_num_threads(threads)
