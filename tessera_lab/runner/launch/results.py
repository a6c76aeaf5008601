"""What a run returns: per-step records turned into losses, timing (predicted vs observed), lifecycle records,
Chrome traces and the runner's profile store. Torch-free at import time."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tessera_lab.pipeline.schedules import Schedule

from ..runtime.specs import RunSpec, WorldSpec

__all__ = ["timing_report", "lifecycle_records", "summarize_job", "observed_timeline", "write_trace",
           "record_profile", "RunResult", "estimate_p2p_latency"]




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


def _stage_medians(comp: list[dict], typ: str, S: int) -> list[float]:
    """Median duration (s) of the compute actions of type ``typ`` per stage (NaN for a stage without any)."""
    return [_median([e["end"] - e["start"] for e in comp if e["type"] == typ and e["stage"] == s]) for s in range(S)]


def _observed_steps_busy(comp: list[dict], obs: set[int], ranks: list[int]) -> tuple[list[float], dict[int, list]]:
    """Per observed step with compute: the iteration time (the latest compute end) and each rank's busy time (the
    sum of its compute actions), seconds."""
    iters, busy = [], {r: [] for r in ranks}
    for st in sorted(obs):
        ev = [e for e in comp if e["step"] == st]
        if not ev:
            continue
        iters.append(max(e["end"] for e in ev))
        for r in ranks:
            busy[r].append(sum(e["end"] - e["start"] for e in ev if e["rank"] == r))
    return iters, busy


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

    f, i_t, w_t, b_t, fb = (_stage_medians(comp, typ, S) for typ in ("F", "I", "W", "B", "OVERLAP_F_B"))
    has_b = any(e["type"] == "B" for e in comp)
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
    fb_arg = [x if not math.isnan(x) else f[s] + bfull[s] for s, x in enumerate(fb)]
    f_arg = [0.0 if math.isnan(x) else x for x in f]
    tl = simulate(schedule, stage_durations(f_arg, bfull, w_arg, fb_arg), p2p_latency=max(0.0, p2p_latency))
    # observed per global rank and step
    ranks = sorted(pp_of_rank)
    iters, busy = _observed_steps_busy(comp, obs, ranks)
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
    pipeline ranks, replica 0), ``iteration`` and, with EP, ``collective:ep_all_to_all`` (observed only: the
    step's all-to-all spans of replica 0, issue to end of wait, summed over its pipeline ranks). Predictions
    come from :func:`timing_report` (the same for every step); observations from each step.
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
        a2a = [e for e in events if e["lane"] == "comm" and e["type"] == "ep_a2a" and e["step"] == st
               and e["replica"] == 0]
        if a2a:
            obs["collective:ep_all_to_all"] = sum(e["end"] - e["start"] for e in a2a)
        out.append({"step": st, "predicted": dict(pred), "observed": obs, "step_time_s": step_times[st]})
    return {"steps": out}


def summarize_job(raw: dict, spec: RunSpec, world: WorldSpec, device_type: str = "cpu") -> dict[str, Any]:
    """Turn rank 0's gathered per-step records into the job's result dict (JSON-ready). ``device_type``
    (``"cpu"``/``"cuda"``, the ranks' device) resolves the EP dispatch mode reported under ``ep_dispatch``
    (:func:`tessera_lab.runner.runtime.moe.dispatch_summary`)."""
    from ..runtime.moe import dispatch_summary
    from ..runtime.reference import combine_losses

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
    cpu = cpu_summary(records, obs)
    cfg = spec.model_config
    result = {
        "name": spec.name, "spec": spec.as_dict(), "world": asdict(world), "schedule": sched.name,
        "num_stages": S, "stage_to_rank": {str(k): v for k, v in sched.stage_to_rank.items()},
        "actions": {str(r): [str(a) for a in acts] for r, acts in sched.actions.items()},
        "boundaries": list(raw["boundaries"]), "tokens_per_step": N, "losses": losses, "loss_sums": loss_sums,
        "step_times_s": step_times, "tokens_per_s": N / t_step if t_step > 0 else math.nan,
        "routing": routing, "ep_dispatch": dispatch_summary(
            cfg.ep_dispatch, device_type, spec.micro_batch_size * cfg.seq_len, cfg.top_k, cfg.num_experts,
            world.ep, cfg.capacity_factor),
        "events": events, "pair_exec": raw.get("pair_exec"), "cpu": cpu,
        "clocks": "shared (one host)" if all(len({p.get("host") for p in ps}) == 1 for ps in records)
                  else "per rank, aligned by a barrier",
        "timing": timing_report(events, sched, len(records), raw["boundaries"], pp_of_rank,
                                p2p_latency=estimate_p2p_latency(events, len(records))),
    }
    d = result["ep_dispatch"]
    routed = sum(sum(t["routed"]) for t in routing.values())
    if d["mode"] == "capacity" and routed:  # observed: kept rows per rank and call (calls = routed / (n k))
        d["rows_kept_observed"] = sum(sum(t["kept"]) for t in routing.values()) * d["rows_routed"] / routed
    if any(p.get("dynamic") for ps in records for p in ps):
        result["gap_steps"] = [{str(p["rank"]): p.get("dynamic") for p in ps} for ps in records]
    result["lifecycle"] = lifecycle_records(events, result["timing"], len(records), m, sched.num_ranks, step_times)
    if spec.plan_prediction:
        result["plan_vs_observed"] = plan_vs_observed(spec.plan_prediction, events, len(records))
        result["lifecycle_plan"] = plan_lifecycle(spec.plan_prediction, result["lifecycle"])
    return result


def cpu_summary(records: list, observed: Sequence[int]) -> dict[str, Any] | None:
    """Observed CPU work of a job: medians over the observed steps of each rank's CPU-seconds (``time.
    process_time`` of the worker: all its threads, not inflated by waiting for a core) in the step's actions
    and in the gradient sync + optimizer. Returns ``{"actions_s", "sync_opt_s"}`` (sums over ranks, seconds
    per step), ``per_rank_actions_s`` (by rank), ``steps`` (the observed steps) and ``source``; None for
    records without CPU times."""
    if not records or any("cpu_s" not in p for ps in records for p in ps):
        return None
    ranks = sorted(p["rank"] for p in records[0])
    by = {st: {p["rank"]: p["cpu_s"] for p in records[st]} for st in observed}
    per_rank = [_median([by[st][r]["actions"] for st in observed]) for r in ranks]
    return {"actions_s": _median([sum(c["actions"] for c in by[st].values()) for st in observed]),
            "sync_opt_s": _median([sum(c["sync_opt"] for c in by[st].values()) for st in observed]),
            "per_rank_actions_s": per_rank, "steps": list(observed), "source": "observed (process CPU time)"}


def observed_iterations(events: list[dict], steps: int) -> list[float]:
    """Observed iteration time of each observed step (the latest compute end, seconds)."""
    out = []
    for st in _observed_steps(steps):
        ends = [e["end"] for e in events if e["lane"] == "compute" and e["step"] == st]
        if ends:
            out.append(max(ends))
    return out


def plan_vs_observed(pred: dict, events: list[dict], steps: int) -> dict[str, Any]:
    """The plan's iteration prediction (made before the run) against the observed median over the observed
    steps, with the quartiles of the observation and ``error = (predicted - observed) / observed``."""
    from statistics import quantiles

    obs = observed_iterations(events, steps)
    med = _median(obs)
    q = quantiles(obs, n=4, method="inclusive") if len(obs) >= 2 else [med, med, med]
    return {"predicted_s": pred["predicted_s"], "observed_s": med, "observed_q1_s": q[0], "observed_q3_s": q[2],
            "observed_samples_s": obs, "steps": _observed_steps(steps),
            "error": (pred["predicted_s"] - med) / med if med > 0 else math.nan, "costs": pred.get("costs"),
            "predicted_at": pred.get("predicted_at")}


def plan_lifecycle(pred: dict, lifecycle: dict) -> dict[str, Any]:
    """:func:`lifecycle_records` with the predictions replaced by the plan's (made before the run): per stage
    ``(F + B)`` per micro-batch, the iteration, the bubble (idle rank-seconds per step) and the EP all-to-all
    time per step when the plan predicted them; the lifecycle store compares these out-of-sample."""
    steps = []
    for rec in lifecycle["steps"]:
        p = {f"stage:{s}": f + b for s, (f, b) in enumerate(zip(pred["stage_f_s"], pred["stage_b_s"]))}
        p["iteration"] = pred["predicted_s"]
        if pred.get("bubble_s"):
            p["bubble"] = pred["bubble_s"]
        if pred.get("ep_a2a_s"):
            p["collective:ep_all_to_all"] = pred["ep_a2a_s"]
        steps.append({**rec, "predicted": {k: v for k, v in p.items() if k in rec["observed"]}})
    return {"steps": steps, "predictions": "plan (before the run)"}


#: ``--check`` on CUDA: the run is compared with ``torch.allclose`` semantics, ``|run - ref| <= atol + rtol |ref|``
#: element for element (losses: per step; gradients: per parameter element). An assumed bound for fp32 with the
#: GPU's own reduction orders against the CPU reference (each fp32 op rounds by 2^-24 ~ 6e-8 relative; the tiny
#: model's losses and gradients go through a few hundred of them); not yet calibrated on a GPU.
CUDA_CHECK_TOLERANCE = {"losses": {"rtol": 1e-4, "atol": 1e-6}, "grads": {"rtol": 1e-3, "atol": 1e-6}}


def compare_reference(result: dict, spec: RunSpec, world: WorldSpec, out_dir: str | None = None,
                      device_type: str = "cpu") -> dict[str, Any]:
    """Losses (and, when the ranks saved their step-0 gradients into ``out_dir``, the gradients) against the
    single-process CPU reference with the same seed and data (:func:`~tessera_lab.runner.runtime.reference.reference_run`,
    ``matched=True``) and the EP dispatch mode the run used (``result["ep_dispatch"]["mode"]``).

    ``device_type`` ``"cpu"``: bitwise (``mode: "bitwise"``); ``"cuda"``: within :data:`CUDA_CHECK_TOLERANCE`
    (``mode: "allclose"``: another device, other kernels). Returns ``reference_losses``, ``bitwise_equal``,
    ``max_abs_diff``, ``mode``, ``tolerance`` (None for bitwise), ``dispatch``, ``passed`` and, with gradients,
    ``grads_bitwise_equal``, ``grads_max_abs_diff``, ``grads_compared`` (parameter count), ``grads_within``."""
    import dataclasses
    import glob

    import torch

    from ..runtime.reference import reference_run

    with_grads = bool(spec.save_grads and out_dir)
    cfg = spec.model_config
    dispatch = (result.get("ep_dispatch") or {}).get("mode", cfg.ep_dispatch)
    if dispatch in ("uneven", "capacity"):
        cfg = dataclasses.replace(cfg, ep_dispatch=dispatch)  # the reference runs on CPU: auto would pick uneven
    ref = reference_run(cfg, ep=world.ep, dp=world.dp, microbatches=spec.microbatches,
                        micro_batch_size=spec.micro_batch_size, steps=spec.steps, lr=spec.lr,
                        data_seed=spec.data_seed, matched=True, record_grads=(0,) if with_grads else ())
    cuda = device_type == "cuda"
    tol = CUDA_CHECK_TOLERANCE if cuda else None
    diffs = [abs(a - b) for a, b in zip(result["losses"], ref.losses)]
    bitwise = result["losses"] == ref.losses
    within = bitwise or (cuda and len(result["losses"]) == len(ref.losses) and all(
        d <= tol["losses"]["atol"] + tol["losses"]["rtol"] * abs(b) for d, b in zip(diffs, ref.losses)))
    out = {"reference_losses": ref.losses, "bitwise_equal": bitwise, "max_abs_diff": max(diffs) if diffs else 0.0,
           "mode": "allclose" if cuda else "bitwise", "tolerance": tol, "dispatch": dispatch}
    passed = within
    if with_grads:
        merged: dict = {}
        for f in sorted(glob.glob(os.path.join(out_dir, f"grads_{spec.name or 'job'}_rank*.pt"))):
            merged.update(torch.load(f))
        names = sorted(set(merged) & set(ref.grads[0]))
        same_set = bool(names) and set(merged) == set(ref.grads[0])
        equal = same_set and all(torch.equal(merged[n], ref.grads[0][n]) for n in names)
        g_within = equal or (cuda and same_set and all(
            torch.allclose(merged[n], ref.grads[0][n], **tol["grads"]) for n in names))
        out.update({"grads_bitwise_equal": equal, "grads_compared": len(names), "grads_within": g_within,
                    "grads_max_abs_diff": max((float((merged[n] - ref.grads[0][n]).abs().max()) for n in names
                                               if merged[n].numel()), default=0.0)})
        passed = passed and g_within
    out["passed"] = bool(passed)
    return out


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


def check_profile_store(path: str | os.PathLike) -> dict | None:
    """The runner profile store at ``path`` (None when the file does not exist yet), every entry checked against
    :data:`tessera_lab.runner.runtime.schemas.RUNNER_STORE` (so a damaged store is refused before a run, not after it).

    Raises:
        tessera_lab.errors.ProfileError: the file exists but cannot be read, is not a runner store of this schema
            version, or holds a malformed entry (naming the field).
    """
    from tessera_lab.errors import ProfileError
    from tessera_lab.io import read_json
    from tessera_lab.schema import validate

    from ..runtime.schemas import RUNNER_STORE

    path = Path(path)
    if not path.exists():
        return None
    data = read_json(path, "runner profile store", error=ProfileError)
    return validate(data, RUNNER_STORE, f"runner profile store '{path}'", error=ProfileError)


def store_lock(path: str | os.PathLike):
    """The inter-process lock of a store file (:class:`filelock.FileLock` on ``PATH.lock``, 120 s timeout)."""
    from filelock import FileLock

    return FileLock(str(path) + ".lock", timeout=120)


def record_profile(path: str | os.PathLike, result: "RunResult") -> Path:
    """Append the run's per-stage observed action times and predicted-vs-observed tables to the runner's
    profile store (JSON): read, append and atomic replace under the store's file lock (:func:`store_lock`), so
    concurrent runs appending to one store never lose an entry.

    Layout: ``{"schema_version": 1, "kind": "runner_observations", "runs": [{"date", "environment", "world",
    "job", "schedule", "model", "boundaries", "microbatches", "micro_batch_size", "stage_times_s",
    "timing", "tokens_per_s", "lifecycle", "predictions", "plan_vs_observed"}, ...]}`` (``lifecycle``: the
    plan's predictions (:func:`plan_lifecycle`) when the run executed a runner plan, else :func:`lifecycle_records`, readable by
    :func:`tessera_lab.report.lifecycle.load_records`); ``environment`` is :func:`tessera_lab.overlap.profiles.current_environment`
    (device, torch and CUDA versions), so the lifecycle can tell stale observations apart.

    Raises:
        tessera_lab.errors.ProfileError: the file exists but is not a valid runner store of this schema version.
    """
    from filelock import Timeout

    from tessera_lab.errors import OutputError
    from tessera_lab.io import atomic_write_text, dumps
    from tessera_lab.overlap.profiles import current_environment

    path = Path(path)
    backend = "cuda" if result.backend == "nccl" else "cpu"
    env = current_environment(backend)
    date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    entries = []
    for job in result.jobs:
        entries.append({
            "date": date, "environment": env, "world": job["world"], "job": job["name"],
            "schedule": job["schedule"], "model": job["spec"]["model"], "boundaries": job["boundaries"],
            "microbatches": job["spec"]["microbatches"], "micro_batch_size": job["spec"]["micro_batch_size"],
            "stage_times_s": job["timing"]["durations"], "timing": {k: job["timing"][k] for k in ("stages", "ranks", "iteration")},
            "tokens_per_s": job["tokens_per_s"], "lifecycle": job.get("lifecycle_plan") or job["lifecycle"],
            "predictions": "plan (before the run)" if job.get("lifecycle_plan") else "in-sample (this run's medians)",
            "plan_vs_observed": job.get("plan_vs_observed"), "pair_exec": job.get("pair_exec"),
        })
    try:
        with store_lock(path):
            data = check_profile_store(path) or {"schema_version": RUNNER_STORE_SCHEMA, "kind": "runner_observations",
                                                 "runs": []}
            data["runs"].extend(entries)
            return atomic_write_text(path, dumps(data))
    except Timeout:
        raise OutputError(f"runner profile store '{path}' is locked by another process ({path}.lock) for more "
                          "than 120 s; allowed: a store no other run holds") from None


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


