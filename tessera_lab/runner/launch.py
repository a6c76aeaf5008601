"""Launching the runner: job specs, the local spawner, the worker entry, and what a run returns.

Two ways to start ``pp * ep * dp`` processes:

* ``torchrun --nproc-per-node N [--nnodes ...] -m tessera_lab.runner --pp 2 --ep 2 ...``: torchrun sets
  ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; each process runs :func:`worker_main`; rank 0
  prints the summary and writes ``--json`` / ``--trace`` / ``--profile-store``. Multi-node works unchanged.
* ``tessera-lab run --pp 2 --ep 2 ...`` (or ``python -m tessera_lab.runner`` without torchrun's variables):
  :func:`spawn` starts the workers locally (``127.0.0.1``, a free port), collects rank 0's result and writes
  the outputs. The spawner itself never imports torch.

Backend: NCCL when CUDA is available (one GPU per local rank), else gloo. A world size other than
``pp * ep * dp`` is a :class:`~tessera_lab.errors.ConfigError` raised before any process group exists.

Faults: every collective has a timeout (``init_process_group(timeout=...)``, :attr:`WorldSpec.timeout_s`); a
rank that raises prints its traceback and exits with status 1 at once (``os._exit``, so no destructor can
hang); its peers see the closed connections and fail too. The spawner watches all workers: when one exits
non-zero it gives the others :attr:`WorldSpec.grace_s` seconds to exit, then terminates and kills them, and
raises :class:`RunnerError` with every rank's exit status and the failing rank's log tail. Workers also
exit by themselves when their parent process disappears, so nothing is left behind.

This module never imports torch at import time (the worker imports it when it starts).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

from tessera_lab.argtypes import positive_int
from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.pipeline.passes import split_backward
from tessera_lab.pipeline.schedules import Action, ActionType, Schedule, build_schedule, canonical_name

__all__ = [
    "WorldSpec",
    "RunSpec",
    "RunnerError",
    "RunResult",
    "spawn",
    "worker_main",
    "main",
    "timing_report",
    "observed_timeline",
    "write_trace",
    "record_profile",
    "TinyConfig",
]

_MAX_WORLD = 64


class RunnerError(TesseraError, RuntimeError):
    """A runner process failed or timed out.

    Attributes:
        exit_codes: global rank -> exit status (negative: killed by that signal; None: never started).
        logs: global rank -> path of that rank's log file.
        pids: global rank -> process id (all reaped when the error is raised).
    """

    def __init__(self, message: str, exit_codes: dict[int, int | None] | None = None,
                 logs: dict[int, str] | None = None, pids: dict[int, int] | None = None):
        super().__init__(message)
        self.exit_codes = dict(exit_codes or {})
        self.logs = dict(logs or {})
        self.pids = dict(pids or {})


def _int_field(where: str, name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{where} field '{name}' = {value!r} is out of range; allowed: an integer >= {low}")
    return value


# ----------------------------------------------------------------------------------------------
# specs
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TinyConfig:
    """Size knobs of the tiny model (the defaults train a step in a fraction of a second on 2 CPU cores).

    Attributes:
        vocab_size: V tokens.
        hidden_size: H.
        num_layers: decoder layers.
        attention_ratio: linear-attention layers per full-attention layer (3 in Qwen3-Next; 0: all full).
        num_heads: attention heads (both mixers); head_dim: per-head width.
        num_kv_heads: key/value heads of full attention (GQA; divides ``num_heads``).
        num_experts: routed experts E; top_k: experts per token.
        expert_width: routed expert intermediate size; shared_expert_width: shared expert intermediate size
            (0: no shared expert).
        seq_len: tokens per sequence T.
        linear_chunk: chunk length of the chunked delta rule.
        capacity_factor: per-expert capacity factor (None: no drops).
        router_bias: optional fixed ``[E]`` logit offsets (not trained), e.g. to force skewed routing or
            leave an EP rank without tokens in tests.
        seed: initialisation seed.
    """

    vocab_size: int = 64
    hidden_size: int = 32
    num_layers: int = 4
    attention_ratio: int = 1
    num_heads: int = 2
    head_dim: int = 16
    num_kv_heads: int = 1
    num_experts: int = 4
    top_k: int = 2
    expert_width: int = 16
    shared_expert_width: int = 32
    seq_len: int = 16
    linear_chunk: int = 8
    capacity_factor: float | None = None
    router_bias: tuple[float, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        ints = {
            "vocab_size": 2, "hidden_size": 1, "num_layers": 1, "attention_ratio": 0, "num_heads": 1,
            "head_dim": 1, "num_kv_heads": 1, "num_experts": 1, "top_k": 1, "expert_width": 1,
            "shared_expert_width": 0, "seq_len": 1, "linear_chunk": 1,
        }
        for name, low in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"model field '{name}' = {v!r} is out of range; allowed: an integer >= {low}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model field 'num_kv_heads' = {self.num_kv_heads} must divide num_heads = {self.num_heads}")
        if self.top_k > self.num_experts:
            raise ConfigError(
                f"model field 'top_k' = {self.top_k} is out of range; allowed: 1..num_experts ({self.num_experts})")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ConfigError(
                f"model field 'capacity_factor' = {self.capacity_factor} is out of range; allowed: > 0 or None")
        if self.router_bias is not None:
            if len(self.router_bias) != self.num_experts:
                raise ConfigError(
                    f"model field 'router_bias' has {len(self.router_bias)} entries; allowed: exactly num_experts "
                    f"({self.num_experts})")
            object.__setattr__(self, "router_bias", tuple(float(x) for x in self.router_bias))

    def layer_kinds(self) -> list[str]:
        """Mixer of each layer: ``"linear_attention"`` or ``"full_attention"``."""
        r = self.attention_ratio + 1
        return ["full_attention" if (i + 1) % r == 0 else "linear_attention" for i in range(self.num_layers)]

    def with_changes(self, **changes) -> "TinyConfig":
        """A copy with some fields changed (validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown model field(s) {sorted(unknown)}; allowed: {[f.name for f in fields(self)]}")
        d = asdict(self)
        d.update(changes)
        return TinyConfig(**d)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["router_bias"] is not None:
            d["router_bias"] = list(d["router_bias"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TinyConfig":
        d = dict(d)
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown model field(s) {sorted(unknown)}; allowed: {[f.name for f in fields(cls)]}")
        if d.get("router_bias") is not None:
            d["router_bias"] = tuple(d["router_bias"])
        return cls(**d)


@dataclass
class WorldSpec:
    """The process grid and its limits.

    Attributes:
        pp, ep, dp: pipeline, expert and data parallel sizes (world size ``pp * ep * dp``).
        backend: ``"auto"`` (NCCL with CUDA, else gloo), ``"gloo"`` or ``"nccl"``.
        timeout_s: seconds a collective or p2p operation may wait before it fails.
        grace_s: after one rank fails, seconds the others get to exit on their own before being killed.
    """

    pp: int = 2
    ep: int = 2
    dp: int = 1
    backend: str = "auto"
    timeout_s: float = 60.0
    grace_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("pp", "ep", "dp"):
            _int_field("run", name, getattr(self, name), 1)
        if self.world_size > _MAX_WORLD:
            raise ConfigError(f"run: pp x ep x dp = {self.world_size} is out of range; allowed: <= {_MAX_WORLD}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"run field 'backend' = {self.backend!r} is unknown; allowed: auto, gloo, nccl")
        if not self.timeout_s > 0 or not self.grace_s >= 0:
            raise ConfigError("run fields 'timeout_s' (> 0) and 'grace_s' (>= 0) are out of range")

    @property
    def world_size(self) -> int:
        return self.pp * self.ep * self.dp

    def check_world_size(self, world_size: int) -> None:
        """Raise :class:`ConfigError` unless ``world_size == pp * ep * dp`` (call before any collective)."""
        if world_size != self.world_size:
            raise ConfigError(
                f"world size {world_size} does not equal pp x ep x dp = {self.pp} x {self.ep} x {self.dp} = "
                f"{self.world_size}; launch {self.world_size} processes (torchrun --nproc-per-node) or change "
                "--pp/--ep/--dp")


@dataclass
class RunSpec:
    """One training job on the world (several jobs can share one launch).

    Attributes:
        name: label (results and gradient files use it).
        model: model config as a dict of :class:`TinyConfig` fields (defaults for the rest).
        schedule: ``gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped``.
        vpp: chunks per rank (None: 2 for interleaved / DualPipeV, else 1).
        microbatches: m per step; micro_batch_size: sequences per micro-batch per replica.
        steps: optimizer steps; lr: AdamW learning rate; data_seed: seed of :func:`~tessera_lab.runner.model.
            make_batch`.
        boundaries: stage boundaries (a plan's ``boundaries``); None: uniform.
        defer_w: split every backward into I now and W later (:func:`tessera_lab.pipeline.passes.split_backward`); w_lag: see there.
        deterministic: one intra-op thread and deterministic algorithms (bitwise reproducible on CPU).
        grad_sync: ``"ordered"`` (deterministic replica sum) or ``"allreduce"``.
        overlap: ``"thread"`` (OVERLAP_F_B pairs run concurrently) or ``"serial"``.
        save_grads: write each rank's step-0 gradients (tests).
        check_reference: rank 0 also runs the single-process reference and reports the comparison.
        fault: ``{"rank": r, "step": s, "action": k}`` raises on rank r before its k-th action of step s.
    """

    name: str = "job"
    model: dict = field(default_factory=dict)
    schedule: str = "1f1b"
    vpp: int | None = None
    microbatches: int = 4
    micro_batch_size: int = 2
    steps: int = 3
    lr: float = 1e-2
    data_seed: int = 1234
    boundaries: list[int] | None = None
    defer_w: bool = False
    w_lag: int | None = None
    deterministic: bool = True
    grad_sync: str = "ordered"
    overlap: str = "thread"
    save_grads: bool = False
    check_reference: bool = False
    fault: dict | None = None

    def __post_init__(self) -> None:
        self.schedule = canonical_name(self.schedule)
        if self.vpp is None:
            self.vpp = 2 if self.schedule in ("interleaved", "dualpipev") else 1

    @property
    def model_config(self) -> TinyConfig:
        """The job's :class:`TinyConfig` (validated)."""
        return TinyConfig.from_dict(self.model)

    def build_schedule(self, pp: int) -> Schedule:
        """The schedule for ``pp`` ranks (with W deferral if ``defer_w``)."""
        sched = build_schedule(self.schedule, pp, self.microbatches, self.vpp)
        return split_backward(sched, self.w_lag) if self.defer_w else sched

    def validate(self, world: WorldSpec) -> Schedule:
        """Check the job against the world without torch; returns its schedule.

        Raises:
            ConfigError / ScheduleError: naming the field and the allowed range.
        """
        w = f"job {self.name!r}"
        for name in ("microbatches", "micro_batch_size", "steps"):
            _int_field(w, name, getattr(self, name), 1)
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"{w} field 'lr' = {self.lr!r} is out of range; allowed: a finite number > 0")
        if self.grad_sync not in ("ordered", "allreduce"):
            raise ConfigError(f"{w} field 'grad_sync' = {self.grad_sync!r} is unknown; allowed: ordered, allreduce")
        if self.overlap not in ("thread", "serial"):
            raise ConfigError(f"{w} field 'overlap' = {self.overlap!r} is unknown; allowed: thread, serial")
        if self.w_lag is not None:
            _int_field(w, "w_lag", self.w_lag, 0)
        sched = self.build_schedule(world.pp)
        cfg = self.model_config
        layers, experts = cfg.num_layers, cfg.num_experts
        if experts % world.ep:
            raise ConfigError(f"{w}: model field 'num_experts' = {experts} must be a multiple of ep = {world.ep}")
        if layers < sched.num_stages:
            raise ConfigError(
                f"{w}: model field 'num_layers' = {layers} is out of range; allowed: >= the number of stages "
                f"({sched.num_stages} = pp x vpp)")
        if self.boundaries is not None:
            b = list(self.boundaries)
            if (len(b) != sched.num_stages + 1 or b[0] != 0 or b[-1] != layers
                    or any(b[s + 1] <= b[s] for s in range(sched.num_stages))):
                raise ConfigError(
                    f"{w}: plan field 'boundaries' = {b} is not allowed; need {sched.num_stages + 1} strictly "
                    f"increasing layer indices from 0 to num_layers = {layers}")
        if self.fault is not None and not isinstance(self.fault, dict):
            raise ConfigError(f"{w} field 'fault' must be a dict with rank, step, action")
        return sched

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunSpec":
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ConfigError(f"unknown job field(s) {sorted(unknown)}; allowed: {[f.name for f in fields(cls)]}")
        return cls(**d)


# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------


def _median(xs: Sequence[float]) -> float:
    xs = sorted(xs)
    if not xs:
        return math.nan
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def _observed_steps(steps: int) -> list[int]:
    return list(range(1, steps)) if steps > 1 else [0]


def estimate_p2p_latency(events: list[dict], steps: int) -> float:
    """Median seconds from a send being issued (or the receive being posted, if later) to the receive
    completing, over the observed steps' stage-to-stage transfers; 0 when none match. Meaningful when the
    ranks share a clock (one host)."""
    obs = set(_observed_steps(steps))
    sends = {(e["step"], e["replica"], e["type"][-1], e["stage"], e["microbatch"]): e["start"]
             for e in events if e["lane"] == "send" and e["step"] in obs}
    samples = []
    for e in events:
        if e["lane"] != "comm" or e["type"] not in ("RECV_F", "RECV_B") or e["step"] not in obs:
            continue
        kind = e["type"][-1]
        src_stage = e["stage"] - 1 if kind == "F" else e["stage"] + 1
        t_send = sends.get((e["step"], e["replica"], kind, src_stage, e["microbatch"]))
        if t_send is not None and e["end"] >= t_send:
            samples.append(e["end"] - max(t_send, e["start"]))
    return _median(samples) if samples else 0.0


def timing_report(events: list[dict], schedule: Schedule, steps: int, boundaries: Sequence[int],
                  pp_of_rank: dict[int, int], p2p_latency: float = 0.0) -> dict[str, Any]:
    """Predicted vs observed timing of a run (seconds).

    Per-stage action times are the medians over the observed steps (all but the first, a warm-up, when there
    are several) and over the replicas. The prediction is :func:`tessera_lab.simulate.simulate` of the same
    schedule with those times (``stage_durations(f, b, w, fb)``) and ``p2p_latency`` (seconds per stage-to-stage
    transfer, e.g. :func:`estimate_p2p_latency`): it tells whether the
    schedule's dependencies plus the per-action times explain the observed iteration time, per-rank busy
    time and idle (bubble) time. Observed busy = sum of a rank's compute actions; observed idle = iteration
    time - busy, with iteration time = the latest compute end over all ranks (on one host all ranks share
    the earliest rank's step start; across hosts each rank's clock starts after a barrier).

    Returns ``{"stages": [...], "ranks": [...], "iteration": {...}, "durations": {...}}``.
    """
    from tessera_lab.pipeline.simulate import simulate, stage_durations

    S = schedule.num_stages
    obs = set(_observed_steps(steps))
    comp = [e for e in events if e["lane"] == "compute" and e["step"] in obs]

    def med(typ: str, s: int) -> float:
        return _median([e["end"] - e["start"] for e in comp if e["type"] == typ and e["stage"] == s])

    f = [med("F", s) for s in range(S)]
    has_b = any(e["type"] == "B" for e in comp)
    i_t = [med("I", s) for s in range(S)]
    w_t = [med("W", s) for s in range(S)]
    b_t = [med("B", s) for s in range(S)]
    split = any(e["type"] in ("I", "W") for e in comp)
    bfull = []
    for s in range(S):
        if not math.isnan(b_t[s]):
            bfull.append(b_t[s])
        else:
            bfull.append((0.0 if math.isnan(i_t[s]) else i_t[s]) + (0.0 if math.isnan(w_t[s]) else w_t[s]))
    w_arg = [0.0 if math.isnan(x) else x for x in w_t] if split else None
    if w_arg is not None and has_b:
        w_arg = [min(w, b) for w, b in zip(w_arg, bfull)]
    fb = [med("OVERLAP_F_B", s) for s in range(S)]
    fb_arg = [x if not math.isnan(x) else f[s] + bfull[s] for s, x in enumerate(fb)]
    f_arg = [0.0 if math.isnan(x) else x for x in f]
    tl = simulate(schedule, stage_durations(f_arg, bfull, w_arg, fb_arg), p2p_latency=max(0.0, p2p_latency))
    # observed per global rank and step
    ranks = sorted(pp_of_rank)
    iters, busy = [], {r: [] for r in ranks}
    for st in sorted(obs):
        ev = [e for e in comp if e["step"] == st]
        if not ev:
            continue
        T = max(e["end"] for e in ev)
        iters.append(T)
        for r in ranks:
            busy[r].append(sum(e["end"] - e["start"] for e in ev if e["rank"] == r))
    T_obs = _median(iters)
    rank_rows = []
    for pr in range(schedule.num_ranks):
        members = [r for r in ranks if pp_of_rank[r] == pr]
        b_obs = _median([x for r in members for x in busy[r]])
        rank_rows.append({
            "rank": pr, "stages": schedule.rank_stages(pr),
            "predicted_busy_s": tl.per_rank_busy[pr], "observed_busy_s": b_obs,
            "predicted_idle_s": tl.per_rank_idle[pr], "observed_idle_s": T_obs - b_obs,
        })
    stage_rows = []
    for s in range(S):
        pr = schedule.stage_to_rank[s]
        row = {"stage": s, "rank": pr, "layers": f"{boundaries[s]}-{boundaries[s + 1] - 1}", "F_s": f[s],
               "B_s": bfull[s]}
        if split:
            row["I_s"], row["W_s"] = i_t[s], w_t[s]
        if not math.isnan(fb[s]):
            row["F&B_s"] = fb[s]
        row.update({k: v for k, v in rank_rows[pr].items() if k.endswith("_s")})
        stage_rows.append(row)
    err = (tl.iteration_time - T_obs) / T_obs if T_obs and T_obs > 0 else math.nan
    pred_stage = [0.0] * S
    for e in tl.events:
        if e.lane == "compute" and 0 <= e.stage < S:
            pred_stage[e.stage] += e.end - e.start
    m = schedule.num_microbatches
    return {
        "predicted_stage_time_s": [t / m for t in pred_stage],
        "stages": stage_rows,
        "ranks": rank_rows,
        "iteration": {"predicted_s": tl.iteration_time, "observed_s": T_obs, "relative_error": err,
                      "predicted_bubble_fraction": tl.bubble_fraction,
                      "observed_bubble_fraction": (sum(r["observed_idle_s"] for r in rank_rows)
                                                   / (T_obs * len(rank_rows)) if T_obs else math.nan)},
        "durations": {"f": f_arg, "b": bfull, "w": w_arg, "fb": fb_arg, "p2p_latency": max(0.0, p2p_latency),
                      "source": "medians of observed actions, steps " + ",".join(map(str, sorted(obs)))},
    }


def lifecycle_records(events: list[dict], timing: dict, steps: int, microbatches: int, num_pp: int,
                      step_times: Sequence[float]) -> dict[str, Any]:
    """Per-step predicted vs observed records in :func:`tessera_lab.report.lifecycle.load_records` format.

    Keys: ``stage:<s>`` (a stage's compute time per micro-batch, seconds: its actions' summed durations / m;
    an overlapped pair counts for its backward's stage), ``bubble`` (idle rank-time of the step, summed over
    pipeline ranks, replica 0) and ``iteration``. Predictions come from :func:`timing_report` (the same for
    every step); observations from each step.
    """
    S = len(timing["stages"])
    pred = {f"stage:{s}": timing["predicted_stage_time_s"][s] for s in range(S)}
    pred["bubble"] = sum(r["predicted_idle_s"] for r in timing["ranks"])
    pred["iteration"] = timing["iteration"]["predicted_s"]
    out = []
    for st in range(steps):
        comp = [e for e in events if e["lane"] == "compute" and e["step"] == st and e["replica"] == 0]
        if not comp:
            continue
        T = max(e["end"] for e in comp)
        obs = {f"stage:{s}": sum(e["end"] - e["start"] for e in comp if e["stage"] == s) / microbatches
               for s in range(S)}
        obs["bubble"] = num_pp * T - sum(e["end"] - e["start"] for e in comp)
        obs["iteration"] = T
        out.append({"step": st, "predicted": dict(pred), "observed": obs, "step_time_s": step_times[st]})
    return {"steps": out}


def summarize_job(raw: dict, spec: RunSpec, world: WorldSpec) -> dict[str, Any]:
    """Turn rank 0's gathered per-step records into the job's result dict (JSON-ready)."""
    from .model import combine_losses

    sched: Schedule = raw["schedule"]
    records = raw["records"]
    N = raw["num_tokens"]
    S, m, R = sched.num_stages, sched.num_microbatches, world.ep * world.dp
    last_pp = sched.stage_to_rank[S - 1]
    losses, loss_sums, step_times = [], [], []
    routing: dict[str, dict[str, list[int]]] = {}
    events: list[dict] = []
    pp_of_rank: dict[int, int] = {}
    for step, payloads in enumerate(records):
        # one host: perf_counter is system-wide, so put every rank on the earliest rank's clock
        same_host = len({p.get("host") for p in payloads}) == 1
        origin = min(p["t0"] for p in payloads) if same_host else 0.0
        by_rep = {p["replica"]: p["loss_sums"] for p in payloads if p["pp_rank"] == last_pp}
        sums = [[by_rep[r][i] for r in range(R)] for i in range(m)]
        loss_sums.append(sums)
        losses.append(combine_losses(sums, N))
        step_times.append(max(p["step_time"] for p in payloads))
        for p in payloads:
            pp_of_rank[p["rank"]] = p["pp_rank"]
            for rec in p["routing"]:
                t = routing.setdefault(str(rec["layer"]), {"routed": [0] * len(rec["routed"]),
                                                           "kept": [0] * len(rec["routed"]),
                                                           "dropped": [0] * len(rec["routed"])})
                for k in ("routed", "kept", "dropped"):
                    t[k] = [a + b for a, b in zip(t[k], rec[k])]
            shift = p["t0"] - origin if same_host else 0.0
            for lane, typ, stage, mb, start, end, label in p["events"]:
                events.append({"step": step, "rank": p["rank"], "pp_rank": p["pp_rank"], "replica": p["replica"],
                               "lane": lane, "type": typ, "stage": stage, "microbatch": mb, "start": start + shift,
                               "end": end + shift, "label": label})
    obs = _observed_steps(len(records))
    t_step = _median([step_times[s] for s in obs])
    result = {
        "name": spec.name, "spec": spec.as_dict(), "world": asdict(world), "schedule": sched.name,
        "num_stages": S, "stage_to_rank": {str(k): v for k, v in sched.stage_to_rank.items()},
        "actions": {str(r): [str(a) for a in acts] for r, acts in sched.actions.items()},
        "boundaries": list(raw["boundaries"]), "tokens_per_step": N, "losses": losses, "loss_sums": loss_sums,
        "step_times_s": step_times, "tokens_per_s": N / t_step if t_step > 0 else math.nan,
        "routing": routing, "events": events,
        "clocks": "shared (one host)" if all(len({p.get("host") for p in ps}) == 1 for ps in records)
                  else "per rank, aligned by a barrier",
        "timing": timing_report(events, sched, len(records), raw["boundaries"], pp_of_rank,
                                p2p_latency=estimate_p2p_latency(events, len(records))),
    }
    result["lifecycle"] = lifecycle_records(events, result["timing"], len(records), m, sched.num_ranks, step_times)
    return result


def _compare_reference(result: dict, spec: RunSpec, world: WorldSpec) -> dict[str, Any]:
    from .model import reference_run

    ref = reference_run(spec.model_config, ep=world.ep, dp=world.dp, microbatches=spec.microbatches,
                        micro_batch_size=spec.micro_batch_size, steps=spec.steps, lr=spec.lr,
                        data_seed=spec.data_seed, matched=True, record_grads=())
    diffs = [abs(a - b) for a, b in zip(result["losses"], ref.losses)]
    return {"reference_losses": ref.losses, "bitwise_equal": result["losses"] == ref.losses,
            "max_abs_diff": max(diffs) if diffs else 0.0}


def observed_timeline(job: dict, step: int | None = None):
    """The observed run as a :class:`tessera_lab.pipeline.simulate.Timeline` (one timeline rank per global rank).

    ``step=None``: all steps laid end to end (each starts where the previous one's last event ended);
    otherwise that step only. Compute events are the actions (pairs as one ``OVERLAP_F_B`` event); the comm
    lane holds receive waits (``RECV_F``/``RECV_B``) and EP all-to-alls (``ep_a2a``). Times in seconds.
    """
    from tessera_lab.pipeline.simulate import Event, Timeline

    steps = sorted({e["step"] for e in job["events"]}) if step is None else [step]
    world = job["world"]["pp"] * job["world"]["ep"] * job["world"]["dp"]
    events, offset = [], 0.0
    for st in steps:
        evs = [e for e in job["events"] if e["step"] == st and e["lane"] in ("compute", "comm")]
        for e in evs:
            mb = e["microbatch"]
            events.append(Event(e["rank"], e["stage"], mb, e["type"], e["start"] + offset, e["end"] + offset,
                                e["lane"], e["label"] if step is not None else f"{e['label']} (step {st})"))
        offset += max((e["end"] for e in evs), default=0.0)
    T = max((e.end for e in events), default=0.0)
    busy = [sum(e.end - e.start for e in events if e.rank == r and e.lane == "compute") for r in range(world)]
    idle = [max(0.0, T - b) for b in busy]
    tot_b, tot_i = sum(busy), sum(idle)
    return Timeline(events=events, iteration_time=T, per_rank_busy=busy, per_rank_idle=idle,
                    bubble_fraction=tot_i / (T * world) if T > 0 else 0.0,
                    bubble_overhead=tot_i / tot_b if tot_b > 0 else 0.0, exposed_comm={}, critical_path=[],
                    peak_activations=[], schedule_name=f"{job['schedule']} (observed)", num_ranks=world)


def write_trace(job: dict, path: str | os.PathLike, step: int | None = None) -> Path:
    """Chrome trace (Perfetto) of the observed actions, via :mod:`tessera_lab.pipeline.trace`; returns the path."""
    from tessera_lab.pipeline.trace import write_chrome_trace

    return write_chrome_trace(observed_timeline(job, step), path)


RUNNER_STORE_SCHEMA = 1


def record_profile(path: str | os.PathLike, result: "RunResult") -> Path:
    """Append the run's per-stage observed action times and predicted-vs-observed tables to the runner's
    profile store (JSON, atomic write).

    Layout: ``{"schema_version": 1, "kind": "runner_observations", "runs": [{"date", "environment", "world",
    "job", "schedule", "model", "boundaries", "microbatches", "micro_batch_size", "stage_times_s",
    "timing", "tokens_per_s", "lifecycle"}, ...]}`` (``lifecycle``: :func:`lifecycle_records`, readable by
    :func:`tessera_lab.report.lifecycle.load_records`); ``environment`` is :func:`tessera_lab.overlap.profiles.current_environment`
    (device, torch and CUDA versions), so the lifecycle can tell stale observations apart.

    Raises:
        tessera_lab.errors.ProfileError: the file exists but is not a runner store of this schema version.
    """
    from tessera_lab.errors import ProfileError
    from tessera_lab.io import atomic_write_text, dumps
    from tessera_lab.overlap.profiles import current_environment

    path = Path(path)
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ProfileError(f"runner profile store '{path}' cannot be read: {exc}") from None
        if data.get("schema_version") != RUNNER_STORE_SCHEMA or data.get("kind") != "runner_observations":
            raise ProfileError(
                f"'{path}' is not a runner profile store: field 'schema_version' = {data.get('schema_version')!r}, "
                f"'kind' = {data.get('kind')!r}; allowed: {RUNNER_STORE_SCHEMA}, 'runner_observations'")
    else:
        data = {"schema_version": RUNNER_STORE_SCHEMA, "kind": "runner_observations", "runs": []}
    backend = "cuda" if result.backend == "nccl" else "cpu"
    env = current_environment(backend)
    date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for job in result.jobs:
        data["runs"].append({
            "date": date, "environment": env, "world": job["world"], "job": job["name"],
            "schedule": job["schedule"], "model": job["spec"]["model"], "boundaries": job["boundaries"],
            "microbatches": job["spec"]["microbatches"], "micro_batch_size": job["spec"]["micro_batch_size"],
            "stage_times_s": job["timing"]["durations"], "timing": {k: job["timing"][k] for k in ("stages", "ranks", "iteration")},
            "tokens_per_s": job["tokens_per_s"], "lifecycle": job["lifecycle"],
        })
    return atomic_write_text(path, dumps(data))


@dataclass
class RunResult:
    """What a launch returns (rank 0's view). ``jobs``: one result dict per :class:`RunSpec` with
    ``losses`` (mean token cross-entropy per step, nats), ``loss_sums``, ``routing`` (per layer routed /
    kept / dropped counts per expert), ``events``, ``timing`` (:func:`timing_report`), ``tokens_per_s``,
    ``step_times_s``, ``lifecycle`` (:func:`lifecycle_records`) and, when asked, ``reference`` (comparison with
    the single-process reference)."""

    jobs: list[dict]
    backend: str
    world: dict
    out_dir: str | None = None
    logs: dict[int, str] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)

    def job(self, name: str | int = 0) -> dict:
        if isinstance(name, int):
            return self.jobs[name]
        for j in self.jobs:
            if j["name"] == name:
                return j
        raise KeyError(f"no job named {name!r}; jobs: {[j['name'] for j in self.jobs]}")

    def losses(self, name: str | int = 0) -> list[float]:
        return list(self.job(name)["losses"])

    def timeline(self, name: str | int = 0, step: int | None = None):
        """Observed :class:`~tessera_lab.pipeline.simulate.Timeline` (see :func:`observed_timeline`)."""
        return observed_timeline(self.job(name), step)

    def timing_table(self, name: str | int = 0):
        """Predicted vs observed per stage as a pandas DataFrame (milliseconds)."""
        import pandas as pd

        rows = []
        for r in self.job(name)["timing"]["stages"]:
            rows.append({k.replace("_s", " (ms)") if k.endswith("_s") else k: (v * 1e3 if k.endswith("_s") else v)
                         for k, v in r.items()})
        return pd.DataFrame(rows).set_index("stage")

    def to_dict(self) -> dict:
        return {"backend": self.backend, "world": self.world, "jobs": self.jobs}


# ----------------------------------------------------------------------------------------------
# spawner
# ----------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _tail(path: str, n: int = 25) -> str:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def spawn(world: WorldSpec, jobs: Sequence[RunSpec], *, out_dir: str | os.PathLike | None = None,
          timeout_s: float = 600.0, python: str | None = None, env: dict | None = None) -> RunResult:
    """Start ``world.world_size`` local worker processes, run ``jobs`` in order, return rank 0's results.

    Args:
        world: the grid and timeouts.
        jobs: the jobs (validated here, before any process starts).
        out_dir: where logs (``rank{r}.log``), the spec, the result and gradient files go (default: a new
            temporary folder, kept so the logs can be read).
        timeout_s: wall-clock limit for the whole launch; on expiry every worker is killed.
        python: interpreter for the workers (default: this one).
        env: extra environment variables for the workers.

    Raises:
        ConfigError / ScheduleError: a bad spec (nothing started).
        RunnerError: a worker failed or the launch timed out (every worker has exited when it is raised).
    """
    jobs = list(jobs)
    if not jobs:
        raise ConfigError("run: no jobs given")
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):
        raise ConfigError(f"run: job names must be unique, got {names}")
    for j in jobs:
        j.validate(world)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="tessera-run-"))
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps({"world": asdict(world), "jobs": [j.as_dict() for j in jobs]}, indent=1))
    result_path = out / "result.json"
    for old in [result_path, *out.glob("failure-*.json")]:
        old.unlink(missing_ok=True)
    port = _free_port()
    n = world.world_size
    base_env = dict(os.environ)
    base_env.update(env or {})
    base_env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(n),
                     "LOCAL_WORLD_SIZE": str(n), "TESSERA_PARENT_PID": str(os.getpid()),
                     "OMP_NUM_THREADS": base_env.get("OMP_NUM_THREADS", "1")})
    procs: list[subprocess.Popen] = []
    logs: dict[int, str] = {}
    handles = []
    codes: dict[int, int | None] = {r: None for r in range(n)}
    try:
        for r in range(n):
            e = dict(base_env, RANK=str(r), LOCAL_RANK=str(r), GROUP_RANK="0")
            log = out / f"rank{r}.log"
            logs[r] = str(log)
            fh = open(log, "w")
            handles.append(fh)
            procs.append(subprocess.Popen(
                [python or sys.executable, "-m", "tessera_lab.runner", "--worker", "--spec", str(spec_path),
                 "--out", str(out)],
                stdout=fh, stderr=subprocess.STDOUT, env=e, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        first_fail: int | None = None
        fail_time = 0.0
        timed_out = False
        while True:
            for r, p in enumerate(procs):
                if codes[r] is None and p.poll() is not None:
                    codes[r] = p.returncode
                    if p.returncode != 0 and first_fail is None:
                        first_fail, fail_time = r, time.monotonic()
            if all(c is not None for c in codes.values()):
                break
            now = time.monotonic()
            if now > deadline:
                timed_out = True
                break
            if first_fail is not None and now - fail_time > world.grace_s:
                break
            time.sleep(0.05)
    finally:
        _kill_all(procs, codes)
        for fh in handles:
            fh.close()
    pids = {r: p.pid for r, p in enumerate(procs)}
    if timed_out:
        raise RunnerError(f"run timed out after {timeout_s:.0f} s; all {n} workers were killed (exit codes {codes}); "
                          f"logs in {out}", codes, logs, pids)
    if any(c != 0 for c in codes.values()):
        bad = first_fail if first_fail is not None else next(r for r, c in codes.items() if c != 0)
        recorded = {}
        for r in codes:
            try:
                recorded[r] = json.loads((out / f"failure-{r}.json").read_text())["time"]
            except (OSError, ValueError, KeyError):
                pass
        if recorded:  # the rank that failed first is the root cause; its peers fail after it
            bad = min(recorded, key=recorded.get)
        raise RunnerError(
            f"rank {bad} failed with exit status {codes[bad]}; exit codes {codes}; log tail of rank {bad}:\n"
            + _tail(logs[bad]), codes, logs, pids)
    data = json.loads(result_path.read_text())
    return RunResult(data["jobs"], data["backend"], data["world"], str(out), logs, pids)


def _kill_all(procs: list, codes: dict) -> None:
    """Terminate (then kill) every still-running worker and reap it; record signals as negative codes."""
    live = [(r, p) for r, p in enumerate(procs) if p.poll() is None]
    for _, p in live:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + 3.0
    for r, p in live:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                p.kill()
            except ProcessLookupError:
                pass
            p.wait()
    for r, p in enumerate(procs):
        if p.returncode is None:
            p.wait()
        codes[r] = p.returncode


# ----------------------------------------------------------------------------------------------
# worker
# ----------------------------------------------------------------------------------------------


def _watch_parent() -> None:
    """Exit this worker if its parent (the spawner or torchrun's agent) goes away."""
    parent = int(os.environ.get("TESSERA_PARENT_PID", os.getppid()))

    def loop() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(5)

    threading.Thread(target=loop, name="tessera-parent-watch", daemon=True).start()


def _env_int(name: str) -> int:
    v = os.environ.get(name)
    try:
        return int(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"environment variable {name} = {v!r} is not an integer (set by torchrun or the spawner)") from None


def run_worker(world: WorldSpec, jobs: Sequence[RunSpec], out_dir: str | None) -> RunResult | None:
    """Body of one worker process: checks the world size, joins the process group, runs the jobs.

    Returns the :class:`RunResult` on rank 0 (None elsewhere). Raises :class:`ConfigError` before any
    collective if ``WORLD_SIZE != pp * ep * dp``.
    """
    rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
    world.check_world_size(world_size)  # before any process group exists
    for j in jobs:
        j.validate(world)
    import datetime

    import torch
    import torch.distributed as dist

    from .pipeline import build_topology, run_job

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and world.backend != "gloo"
    backend = world.backend if world.backend != "auto" else ("nccl" if cuda else "gloo")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=world.timeout_s), **kwargs)
    topo = build_topology(world, rank, device)
    results = []
    for j in jobs:
        raw = run_job(world, topo, j, out_dir)
        if rank == 0:
            res = summarize_job(raw, j, world)
            if j.check_reference:
                res["reference"] = _compare_reference(res, j, world)
            results.append(res)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return RunResult(results, backend, asdict(world), out_dir)


def _record_failure(out_dir: str | None) -> None:
    """Write ``{out_dir}/failure-<rank>.json`` with the wall-clock time of this rank's failure, so the launcher
    can name the rank that failed first (the root cause) rather than the first one it happened to poll."""
    if not out_dir:
        return
    try:
        rank = int(os.environ.get("RANK", "-1"))
        (Path(out_dir) / f"failure-{rank}.json").write_text(json.dumps({"rank": rank, "time": time.time()}))
    except OSError:  # pragma: no cover - best effort while exiting
        pass


def worker_main(spec_path: str, out_dir: str | None) -> int:
    """Entry of a spawned worker: read the spec, run, rank 0 writes ``{out_dir}/result.json``."""
    _watch_parent()
    try:
        data = json.loads(Path(spec_path).read_text())
        world = WorldSpec(**data["world"])
        jobs = [RunSpec.from_dict(j) for j in data["jobs"]]
        res = run_worker(world, jobs, out_dir)
        if res is not None and out_dir:
            from tessera_lab.io import atomic_write_text, dumps

            atomic_write_text(Path(out_dir) / "result.json", dumps(res.to_dict()))
    except TesseraError as exc:
        _record_failure(out_dir)
        print(f"tessera-lab runner: error: {exc}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(2)
    except BaseException:  # noqa: BLE001 - any failure must end this rank at once
        _record_failure(out_dir)
        traceback.print_exc()
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ----------------------------------------------------------------------------------------------
# command line (shared by ``tessera-lab run`` and ``python -m tessera_lab.runner``)
# ----------------------------------------------------------------------------------------------


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``tessera-lab run`` (also used by ``python -m tessera_lab.runner``)."""
    p.add_argument("--pp", type=positive_int("pp"), default=2, help="pipeline stages (ranks)")
    p.add_argument("--ep", type=positive_int("ep"), default=2, help="expert-parallel size")
    p.add_argument("--dp", type=positive_int("dp"), default=1, help="data-parallel size")
    p.add_argument("--schedule", default="1f1b", help="gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped")
    p.add_argument("--vpp", type=positive_int("vpp"), default=None, help="chunks per rank (interleaved; default 2)")
    p.add_argument("--microbatches", "-m", type=positive_int("microbatches"), default=4)
    p.add_argument("--micro-batch-size", type=positive_int("micro_batch_size"), default=2, help="sequences per replica")
    p.add_argument("--steps", type=positive_int("steps"), default=3)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--plan", metavar="PLAN.json", help="plan JSON with 'boundaries' (partition/plan --json)")
    p.add_argument("--layers", type=positive_int("layers"), default=None, help="model layers (default 4)")
    p.add_argument("--hidden", type=positive_int("hidden"), default=None, help="hidden size (default 32)")
    p.add_argument("--experts", type=positive_int("experts"), default=None, help="routed experts (default 4)")
    p.add_argument("--top-k", type=positive_int("top_k"), default=None)
    p.add_argument("--expert-width", type=positive_int("expert_width"), default=None)
    p.add_argument("--attention-ratio", type=int, default=None, help="linear-attention layers per full-attention layer")
    p.add_argument("--seq-len", type=positive_int("seq_len"), default=None)
    p.add_argument("--capacity-factor", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="model init seed")
    p.add_argument("--defer-w", action="store_true", help="split backwards into I now and W later")
    p.add_argument("--overlap", choices=["thread", "serial"], default="thread")
    p.add_argument("--grad-sync", choices=["ordered", "allreduce"], default="ordered")
    p.add_argument("--no-deterministic", action="store_true", help="use all threads, no deterministic algorithms")
    p.add_argument("--check", action="store_true", help="compare losses with the single-process reference")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit of the whole run, seconds")
    p.add_argument("--collective-timeout", type=float, default=60.0, help="per-operation timeout, seconds")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace of the observed actions")
    p.add_argument("--profile-store", metavar="PATH", help="append per-stage observations to this JSON store")
    p.add_argument("--out", metavar="DIR", help="folder for logs and results (default: a temporary folder)")
    p.add_argument("--fault-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--fault-step", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH ('-' for stdout)")


def specs_from_args(args: argparse.Namespace) -> tuple[WorldSpec, RunSpec]:
    """World and job from parsed ``run`` options (reads ``--plan``)."""
    model = {k: v for k, v in {
        "num_layers": args.layers, "hidden_size": args.hidden, "num_experts": args.experts, "top_k": args.top_k,
        "expert_width": args.expert_width, "attention_ratio": args.attention_ratio, "seq_len": args.seq_len,
        "capacity_factor": args.capacity_factor, "seed": args.seed}.items() if v is not None}
    boundaries = None
    if args.plan:
        try:
            plan = json.loads(Path(args.plan).read_text())
        except json.JSONDecodeError as exc:
            raise ConfigError(f"plan '{args.plan}' is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not isinstance(plan, dict) or "boundaries" not in plan:
            raise ConfigError(f"plan '{args.plan}' has no field 'boundaries' (use tessera-lab partition/plan --json)")
        boundaries = [int(x) for x in plan["boundaries"]]
        model.setdefault("num_layers", boundaries[-1])
    world = WorldSpec(pp=args.pp, ep=args.ep, dp=args.dp, backend=args.backend, timeout_s=args.collective_timeout)
    fault = {"rank": args.fault_rank, "step": args.fault_step, "action": 1} if args.fault_rank is not None else None
    job = RunSpec(name="run", model=model, schedule=args.schedule, vpp=args.vpp, microbatches=args.microbatches,
                  micro_batch_size=args.micro_batch_size, steps=args.steps, lr=args.lr, boundaries=boundaries,
                  defer_w=args.defer_w, deterministic=not args.no_deterministic, grad_sync=args.grad_sync,
                  overlap=args.overlap, check_reference=args.check, fault=fault)
    return world, job


def format_result(result: RunResult) -> str:
    """Readable summary: losses per step (and the reference), then predicted vs observed per stage."""
    from tabulate import tabulate

    lines = []
    for job in result.jobs:
        w = job["world"]
        lines.append(f"job {job['name']}: schedule {job['schedule']}, pp={w['pp']} ep={w['ep']} dp={w['dp']} "
                     f"({result.backend}), boundaries {job['boundaries']}, {job['tokens_per_step']} tokens/step, "
                     f"{job['tokens_per_s']:.0f} tokens/s")
        ref = job.get("reference")
        rows = []
        for s, loss in enumerate(job["losses"]):
            row = {"step": s, "loss": f"{loss:.9f}", "step time (ms)": job["step_times_s"][s] * 1e3}
            if ref:
                row["reference"] = f"{ref['reference_losses'][s]:.9f}"
                row["equal"] = "bitwise" if loss == ref["reference_losses"][s] else f"{abs(loss - ref['reference_losses'][s]):.2e}"
            rows.append(row)
        lines.append(tabulate([{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
                              headers="keys", disable_numparse=True))
        t = job["timing"]
        srows = []
        for r in t["stages"]:
            srows.append({k.replace("_s", " (ms)") if k.endswith("_s") else k: (v * 1e3 if k.endswith("_s") else v)
                          for k, v in r.items()})
        lines.append("predicted (simulate) vs observed, per stage:")
        lines.append(tabulate(srows, headers="keys", floatfmt=".3f"))
        it = t["iteration"]
        lines.append(f"iteration: predicted {it['predicted_s'] * 1e3:.3f} ms, observed {it['observed_s'] * 1e3:.3f} ms "
                     f"(error {it['relative_error'] * 100:+.1f}%); bubble fraction predicted "
                     f"{it['predicted_bubble_fraction']:.3f}, observed {it['observed_bubble_fraction']:.3f}")
        lines.append("")
    return "\n".join(lines).rstrip()


def emit_outputs(result: RunResult, args: argparse.Namespace) -> None:
    """Print the summary / write ``--json``, ``--trace``, ``--profile-store``."""
    from tessera_lab.io import write_json

    if getattr(args, "json", None) == "-":
        write_json("-", result.to_dict())
    else:
        print(format_result(result))
        if getattr(args, "json", None):
            write_json(args.json, result.to_dict())
    if getattr(args, "trace", None):
        write_trace(result.jobs[0], args.trace)
        print(f"trace: {args.trace}", file=sys.stderr)
    if getattr(args, "profile_store", None):
        record_profile(args.profile_store, result)
        print(f"profile store: {args.profile_store}", file=sys.stderr)


def run_from_args(args: argparse.Namespace) -> int:
    """``tessera-lab run``: spawn locally, print, write outputs. Returns the exit status (1 if a rank failed)."""
    world, job = specs_from_args(args)
    try:
        result = spawn(world, [job], out_dir=args.out, timeout_s=args.timeout)
    except RunnerError as exc:
        print(f"tessera-lab run: error: {exc}", file=sys.stderr)
        return 1
    emit_outputs(result, args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tessera_lab.runner``: a worker under torchrun (``RANK`` set), else the local spawner."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        p = argparse.ArgumentParser(prog="tessera_lab.runner --worker")
        p.add_argument("--worker", action="store_true")
        p.add_argument("--spec", required=True)
        p.add_argument("--out", default=None)
        a = p.parse_args(argv)
        return worker_main(a.spec, a.out)
    p = argparse.ArgumentParser(prog="python -m tessera_lab.runner",
                                description="Run the tiny MoE model with pipeline and expert parallelism.")
    add_run_arguments(p)
    args = p.parse_args(argv)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        if under_torchrun:
            world, job = specs_from_args(args)
            _watch_parent()
            res = run_worker(world, [job], args.out)
            if res is not None:
                emit_outputs(res, args)
            return 0
        return run_from_args(args)
    except TesseraError as exc:
        print(f"tessera_lab.runner: error: {exc}", file=sys.stderr)
        return 2
    except BaseException:  # noqa: BLE001 - a failing rank must not linger in a collective or a destructor
        if not under_torchrun:
            raise
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
