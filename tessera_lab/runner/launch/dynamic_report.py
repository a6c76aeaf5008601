"""``run --dynamic``: static and dynamic trials of one job, interleaved in one launch, and their comparison.

Jobs (same model, seeds, data and routing): ``static-t`` runs the schedule with each W right after its I (the
order of a full backward, ``split_backward(schedule, 0)``) and only records its waits (``gaps="observe"``);
``dynamic-t`` defers W to the end of each rank's list and lets the rank's controller pull them into receive waits
(``gaps="fill"``, :mod:`tessera_lab.runner.runtime.gaps`). Trials alternate static, dynamic, static, ... so slow
drifts of the shared machine hit both alike. With replicas (``dp * ep > 1``, ``grad_sync="ordered"``) the dynamic
side also sums gradients in per-stage chunks that its controller may launch in receive waits
(:class:`~tessera_lab.runner.runtime.gaps.GradBuckets`); the static side keeps one end-of-step sum.

Everything reported is observed on this machine (provenance ``observed``): step times (wall seconds of the step on
its slowest rank, incl. gradient sync and optimizer; on CUDA read after a device synchronize), host idle (the time
a rank waited in a p2p receive, or with the node-level pair handler ``scheduled`` also in an EP combine wait, summed
over ranks: on a CPU the seconds the host was blocked in ``Work.wait()``; on CUDA, where ``Work.wait()`` only makes the
compute stream wait and the host runs on, the seconds the compute stream stalled, timed by CUDA events recorded on
either side of the wait), and the error of the controller's predicted waits against the waits then observed.
Step 0 of every job is left out of the statistics (warm-up; the controller has no history there). A
difference of medians counts as significant only when the interquartile ranges of the two sides do not overlap;
otherwise it is reported as ``not significant``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..runtime.specs import RunSpec

__all__ = ["dynamic_jobs", "dynamic_report", "format_dynamic", "job_identity", "apart"]


def dynamic_jobs(base: RunSpec, trials: int) -> list[RunSpec]:
    """``2 * trials`` jobs from ``base``: static-0, dynamic-0, static-1, ... (``--check`` on trial 0 only)."""
    from dataclasses import replace

    jobs = []
    for t in range(trials):
        common = dict(defer_w=True, check_reference=base.check_reference and t == 0,
                      save_grads=base.save_grads and t == 0)
        jobs.append(replace(base, name=f"static-{t}", w_lag=0, gaps="observe", **common))
        jobs.append(replace(base, name=f"dynamic-{t}", w_lag=None, gaps="fill", **common))
    return jobs


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs, dtype=float)
    q1, med, q3 = (float(v) for v in np.percentile(a, [25, 50, 75]))
    return {"median_s": med, "q1_s": q1, "q3_s": q3, "samples": int(a.size)}


def apart(a: dict[str, float], b: dict[str, float]) -> bool:
    """The significance rule (:func:`tessera_lab.samples.apart`) on two ``run --dynamic`` sides: their
    interquartile ranges (``q1_s``..``q3_s``) do not overlap."""
    from tessera_lab.samples import apart as _apart

    return _apart((a["q1_s"], a["q3_s"]), (b["q1_s"], b["q3_s"]))


def job_identity(spec: dict, world: dict) -> dict[str, Any]:
    """What makes two ``run --dynamic`` results the same job apart from routing (``report --dynamic RUN
    --dynamic CONTROL`` compares these): sizes, schedule, micro-batches, steps, optimizer, data seed, gradient
    sync, pair handler (``spec.pair_exec``, else ``threads`` as the executor picks it) and pair order, and
    the resolved tiny-model config without its routing bias. ``spec``: a :class:`RunSpec` dict; ``world``: a
    :class:`~tessera_lab.runner.runtime.specs.WorldSpec` dict."""
    from ..runtime.specs import TinyConfig

    model = TinyConfig.from_dict({k: v for k, v in (spec.get("model") or {}).items() if k != "router_bias"})
    cfg = {k: v for k, v in model.as_dict().items() if k != "router_bias"}
    return {"pp": world["pp"], "ep": world["ep"], "dp": world["dp"], "schedule": spec["schedule"],
            "vpp": spec.get("vpp"), "microbatches": spec["microbatches"],
            "micro_batch_size": spec["micro_batch_size"], "steps": spec["steps"], "lr": spec["lr"],
            "data_seed": spec.get("data_seed"), "boundaries": spec.get("boundaries"),
            "deterministic": spec.get("deterministic"), "grad_sync": spec.get("grad_sync"),
            "pair_exec": spec.get("pair_exec") or "threads",
            "pair_order": spec.get("pair_order"), "model": cfg}


def _gap_numbers(job: dict, steps: list[int]) -> tuple[list[float], list[float], list[float]]:
    """Per step: host idle summed over ranks; the |predicted - observed| wait of every slot that had one
    (steps from the controller's lag on: before that it has no history); and those same slots' observed waits
    (seconds, >= 0: so their mean is also the mean |error| of predicting no wait)."""
    idle, errs, observed = [], [], []
    for st in steps:
        recs = job["gap_steps"][st]
        idle.append(sum(sum(r["idle"].values()) for r in recs.values() if r))
        for r in recs.values():
            if not r or st < r.get("group_lag_steps", 1):  # no history yet: nothing was predicted
                continue
            for k, obs in r["observed"].items():
                errs.append(abs(r["predicted"].get(k, 0.0) - obs))
                observed.append(obs)
    return idle, errs, observed


def _lag(job: dict) -> int:
    """Steps between an observation and the prediction it feeds (2 with an EP group, else 1)."""
    return max((r.get("group_lag_steps", 1) for st in job["gap_steps"] for r in st.values() if r), default=1)


def dynamic_report(jobs: list[dict], trials: int, routing: str | None, world: Any = None) -> dict[str, Any]:
    """The comparison of :func:`dynamic_jobs`' results (job dicts of :class:`~tessera_lab.runner.launch.results.
    RunResult`); ``world`` (a :class:`~tessera_lab.runner.runtime.specs.WorldSpec`) adds ``world`` (pp, ep, dp, ranks) so
    readers can turn idle summed over ranks into idle per rank (``report --dynamic``)."""
    by = {j["name"]: j for j in jobs}
    steps = len(by["static-0"]["losses"])
    obs = list(range(1, steps)) if steps > 1 else [0]
    side: dict[str, dict] = {}
    for kind in ("static", "dynamic"):
        times, idle, errs, observed, fills, forced, chunks = [], [], [], [], 0, 0, 0
        for t in range(trials):
            j = by[f"{kind}-{t}"]
            times += [j["step_times_s"][s] for s in obs]
            i, e, o = _gap_numbers(j, obs)
            idle += i
            errs += e
            observed += o  # the slots of errs, one for one
            for st in obs:
                for r in j["gap_steps"][st].values():
                    if r:
                        fills += r["decisions"].get("fill", 0)
                        forced += r["decisions"].get("forced", 0)
                        chunks += (r.get("grad_buckets") or {}).get("launched_in_waits", 0)
        side[kind] = {"step_time": _stats(times), "host_idle_per_step": _stats(idle),
                      "gap_prediction": {"mean_abs_error_s": float(np.mean(errs)) if errs else 0.0,
                                         # over the slots of mean_abs_error_s (from the lag on)
                                         "mean_observed_wait_s": float(np.mean(observed)) if observed else 0.0,
                                         # the same slots predicted as 0, the baseline a predictor must beat:
                                         # waits are >= 0, so it equals the mean observed wait by construction
                                         "zero_predictor_mean_abs_error_s":
                                             float(np.mean(np.abs(observed))) if observed else 0.0,
                                         "slots": len(errs), "predictor": "last-step",
                                         "lag_steps": _lag(by[f"{kind}-0"])},
                      "w_filled": fills, "w_forced_by_cap": forced, "grad_sync_chunks_in_waits": chunks}
    s, d = side["static"]["step_time"], side["dynamic"]["step_time"]
    gain = (s["median_s"] - d["median_s"]) / s["median_s"] if s["median_s"] > 0 else 0.0
    significant = apart(s, d)
    idle_apart = apart(side["static"]["host_idle_per_step"], side["dynamic"]["host_idle_per_step"])
    ref = by["static-0"]["losses"]
    bitwise = all(by[f"{k}-{t}"]["losses"] == ref for k in ("static", "dynamic") for t in range(trials))
    return {
        "kind": "runner_dynamic", "provenance": "observed", "schedule": by["static-0"]["schedule"],
        "routing": routing or "model router (no skew)", "trials": trials, "steps": steps,
        "steps_compared": obs, "interleaved": [j["name"] for j in jobs],
        "static": side["static"], "dynamic": side["dynamic"],
        "gain": gain, "gain_verdict": "significant" if significant else "not significant",
        "significance_rule": "interquartile ranges of the step times do not overlap",
        "idle_removed_s": side["static"]["host_idle_per_step"]["median_s"]
        - side["dynamic"]["host_idle_per_step"]["median_s"],
        "idle_removed_verdict": "significant" if idle_apart else "not significant",
        "losses": ref, "losses_bitwise_equal_to_static": bitwise,
        "machine_load_1m": os.getloadavg()[0],
        **({} if world is None else {"world": {"pp": world.pp, "ep": world.ep, "dp": world.dp,
                                               "ranks": world.pp * world.ep * world.dp}}),
        **({"job": job_identity(by["static-0"]["spec"], by["static-0"]["world"])}
           if "spec" in by["static-0"] and "world" in by["static-0"] else {}),
        "not_done": "EP combine waits are filled (with W only) only under --pair-exec scheduled (node-level "
                    "pairs); a gradient-sync chunk can launch in a wait only on ranks holding several stages "
                    "(interleaved, DualPipeV)",
    }


def format_dynamic(rep: dict[str, Any]) -> str:
    """Readable summary of :func:`dynamic_report`: medians with their interquartile range, each difference with
    its verdict (the significance rule), and the gap predictor against predicting no wait."""
    def ms(x: dict) -> str:
        return (f"median {x['median_s'] * 1e3:.1f} ms (interquartile range q1-q3 {x['q1_s'] * 1e3:.1f}-"
                f"{x['q3_s'] * 1e3:.1f} ms, n={x['samples']})")

    def verdict(v: str | None) -> str:
        return "" if v is None else (" (significant)" if v == "significant" else
                                     " (not significant: inside the noise, the interquartile ranges overlap)")

    s, d = rep["static"], rep["dynamic"]
    gp = d["gap_prediction"]
    zero = gp.get("zero_predictor_mean_abs_error_s")
    job = rep.get("job") or {}
    pairs = f", overlapped pairs {job['pair_exec']}" if job.get("pair_exec") else ""
    lines = [f"run --dynamic: schedule {rep['schedule']}{pairs}, routing {rep['routing']}, {rep['trials']} trials x "
             f"{rep['steps']} steps, interleaved static/dynamic (observed; load {rep['machine_load_1m']:.2f})",
             f"step time  static  {ms(s['step_time'])}", f"step time  dynamic {ms(d['step_time'])}",
             f"gain {rep['gain'] * 100:+.2f}%{verdict(rep['gain_verdict'])}; rule: significant only when the "
             "interquartile ranges of the step times do not overlap",
             "host idle per step (summed over ranks; on CUDA the compute stream's stall in the waits): "
             f"static {ms(s['host_idle_per_step'])}, dynamic "
             f"{ms(d['host_idle_per_step'])}; removed {rep['idle_removed_s'] * 1e3:.1f} ms"
             + verdict(rep.get("idle_removed_verdict")),
             f"gap prediction ({gp['predictor']}, group maximum, lag {gp['lag_steps']} steps): mean |error| "
             f"{gp['mean_abs_error_s'] * 1e3:.2f} ms vs mean observed wait {gp['mean_observed_wait_s'] * 1e3:.2f} ms"
             + ("" if zero is None else f" (= the mean |error| of predicting no wait, {zero * 1e3:.2f} ms)")
             + f" over the same {gp['slots']} slots (steps from the lag on)"
             + f"; W filled {d['w_filled']}, forced by the cap {d['w_forced_by_cap']}; gradient-sync chunks "
             f"launched in waits {d.get('grad_sync_chunks_in_waits', 0)}"]
    if zero is not None and gp["slots"] and gp["mean_abs_error_s"] > zero:
        lines.append("note: the gap predictor does worse than predicting no gap (its mean |error| exceeds that of "
                     "predicting a wait of 0 on the same slots)")
    lines.append("losses " + ("bitwise equal to the static run" if rep["losses_bitwise_equal_to_static"]
                              else "DIFFER from the static run"))
    for name, r in rep.get("reference", {}).items():
        lines.append(f"--check {name}: losses {'bitwise equal' if r['losses_bitwise_equal'] else 'DIFFER'} to the "
                     f"single-process reference; gradients of step 0 "
                     f"{'bitwise equal' if r['grads_bitwise_equal'] else 'differ'}")
    return "\n".join(lines)
