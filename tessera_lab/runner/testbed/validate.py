"""``tessera-lab validate``: does the plan predict the runner? A fixed matrix of runner jobs, each predicted
from a calibrated device *before* it runs, then run and observed; the calibration runs (microbenchmarks of
:mod:`tessera_lab.runner.testbed.calibrate`) are separate processes and never one of the validated runs.

Matrix: schedules gpipe, 1f1b, zb-h1, overlapped (node-level ``scheduled`` pairs) x pp 2, 4 x ep 1, 2 x two
model widths (tiny-runner and twice as wide) x two partitions (uniform, balanced on the calibrated costs).
``--quick``: pp 2, ep 1 and 2, the base width, the uniform partition, plus two balanced / wide cases.

Per case: ``predicted_s`` (the plan's iteration time), ``observed_s`` (median over the steps after the first,
with quartiles) and ``error = (predicted - observed) / observed``; and, to tell the model's error from the
machine's drift, ``predicted_cpu_s`` / ``observed_cpu_s`` (CPU-seconds of a step over every process: the
workers' ``process_time``) and ``work_error``, the observed CPU taken back to the state measured before the
group by the work probe after it (:mod:`tessera_lab.runner.testbed.work_probe`). The cases of a group run in one
launch a step of each in turn (``WorldSpec.interleave``), so drift falls on all of them alike. Summary: ``median_abs_error``,
``rank_agreement`` (the share of case pairs that prediction and observation order the same way) and the
machine load (1-minute load average before and after: identical runs differ by 5-12 % on a busy 2-core machine).
The prediction (:func:`tessera_lab.runner.testbed.predict.predict_runner`) is processor sharing over the simulated
timeline (:mod:`tessera_lab.runner.testbed.sharing`): the job's computing processes share the cores *available to
the job*, measured right before each (pp, ep) group's runs in processes of its own
(:func:`tessera_lab.runner.testbed.probe.available_cores`: spinners' CPU share), and the CPU work is scaled by the
work probe measured then against the calibration's; ``prediction_inputs`` keeps them and the median |error| the load average alone would have
given. :func:`repredict` re-predicts a stored result offline (``validate --repredict RESULT --device FILE``).
Targets (printed, not asserted): median |error| <= 10 % busy / <= 5 % quiet, rank agreement >= 90 %.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import sys
import time
from typing import Any

__all__ = ["TARGETS", "cases", "validate", "validate_from_args", "repredict", "summarize"]

TARGETS = {"median_abs_error_busy": 0.10, "median_abs_error_quiet": 0.05, "rank_agreement": 0.90}
SCHEDULES = ("gpipe", "1f1b", "zb-h1", "overlapped")


def cases(quick: bool) -> list[dict[str, Any]]:
    """The validation matrix (module docstring), as dicts with schedule, pp, ep, width, partition."""
    if quick:
        out = [dict(schedule=s, pp=2, ep=ep, width=1, partition="uniform") for ep in (1, 2) for s in SCHEDULES]
        out += [dict(schedule="1f1b", pp=2, ep=2, width=2, partition="balanced"),
                dict(schedule="overlapped", pp=2, ep=1, width=2, partition="balanced")]
        return out
    return [dict(schedule=s, pp=pp, ep=ep, width=w, partition=part)
            for pp, ep, w, part, s in itertools.product((2, 4), (1, 2), (1, 2), ("uniform", "balanced"), SCHEDULES)]


def _name(c: dict) -> str:
    return f"{c['schedule']}-pp{c['pp']}-ep{c['ep']}-w{c['width']}-{c['partition']}"


def validate(device: dict, *, quick: bool = False, steps: int | None = None, microbatches: int = 4,
             micro_batch_size: int = 2, progress=None) -> dict[str, Any]:
    """Predict, run and compare every case; returns the JSON-ready result (module docstring)."""
    from .calibrate import widened
    from .predict import MachineState, PlanChoices, device_plan, device_work_probe
    from .probe import available_cores
    from ..launch.spawn import spawn
    from ..runtime.specs import TinyConfig, WorldSpec

    steps = steps or (9 if quick else 5)
    base = TinyConfig()
    load0 = os.getloadavg()
    t0 = time.time()
    matrix = cases(quick)
    plans = {}
    for c in matrix:  # load-average predictions, all made before any validated run starts
        cfg = widened(base, c["width"]).as_dict()
        plans[_name(c)] = device_plan(device, f"tiny-runner x{c['width']}", pp=c["pp"], ep=c["ep"],
                                      schedule=c["schedule"], microbatches=microbatches,
                                      micro_batch_size=micro_batch_size,
                                      choices=PlanChoices(partition=c["partition"]), config=cfg,
                                      machine=MachineState(machine_load=load0[0]))
    out_cases = []
    by_world: dict[tuple[int, int], list[dict]] = {}
    for c in matrix:
        by_world.setdefault((c["pp"], c["ep"]), []).append(c)
    avail: dict[str, dict[str, float]] = {}
    for (pp, ep), cs in by_world.items():
        # the cores this job gets now, measured right before the group's runs in processes of its own
        # (runner.probe.available_cores); the plans made at the start from the load average stay for comparison
        a = avail[f"pp{pp}-ep{ep}"] = available_cores(int(device["metadata"].get("cores") or os.cpu_count() or 1),
                                                      processes=pp * ep)
        # and the CPU the same work takes now (runner.work_probe), against the calibration's
        a["work_probe_s"] = device_work_probe(device)
        group_plans = {}
        for c in cs:
            group_plans[_name(c)] = device_plan(
                device, f"tiny-runner x{c['width']}", pp=pp, ep=ep, schedule=c["schedule"],
                microbatches=microbatches, micro_batch_size=micro_batch_size,
                choices=PlanChoices(partition=c["partition"]), config=widened(base, c["width"]).as_dict(),
                machine=MachineState(machine_load=os.getloadavg()[0], cores_available=a["cores_available"],
                                     work_probe_s=a["work_probe_s"]))
        jobs = [_job(c, group_plans[_name(c)], microbatches, micro_batch_size, steps) for c in cs]
        # a step of each case in turn: drift of the machine during the group falls on every case alike
        res = spawn(WorldSpec(pp=pp, ep=ep, timeout_s=120, interleave=True), jobs, timeout_s=900, keep=False)
        # the work probe after the group: with the one before, the machine's state the group ran in (a
        # diagnostic of the observation, never an input of the prediction)
        a["work_probe_after_s"] = device_work_probe(device)
        drift = (a["work_probe_after_s"] / a["work_probe_s"]) if a["work_probe_s"] else None
        out_cases += [_case(c, res.job(_name(c)), group_plans[_name(c)], plans[_name(c)], drift) for c in cs]
        if progress:
            progress(len(out_cases), len(matrix))
    errs = [abs(c["error"]) for c in out_cases if math.isfinite(c["error"])]
    ranks = rank_agreement(out_cases)
    agree, total = ranks["agree"], ranks["rank_pairs"]
    meta = device["metadata"]
    errs_la = [abs(c["predicted_loadavg_s"] - c["observed_s"]) / c["observed_s"] for c in out_cases
               if c["observed_s"] > 0]
    return {
        "prediction_inputs": {"cores_available": avail,
                              "work_probe_ref_s": ((device.get("runner_cpu") or {}).get("work_probe") or {}).get("ref_s"),
                              "calibration_cpu_probe_s": meta.get("cpu_probe_s"),
                              "runner_cpu": device.get("runner_cpu"),
                              "load_average_at_start": load0[0],
                              "median_abs_error_from_load_average": statistics.median(errs_la) if errs_la else None},
        "cases": out_cases, "median_abs_error": statistics.median(errs) if errs else math.nan,
        "rank_agreement": agree / total if total else math.nan, "rank_pairs": total,
        "rank_agreement_apart": ranks["rank_agreement_apart"], "rank_pairs_apart": ranks["rank_pairs_apart"],
        "calibration": _calibration(device),
        "machine": {"cores": os.cpu_count(), "load_before": [round(x, 2) for x in load0],
                    "load_after": [round(x, 2) for x in os.getloadavg()], "seconds": round(time.time() - t0, 1)},
        "targets": TARGETS, "steps": steps, "quick": quick,
        "targets_met": _targets_met(statistics.median(errs) if errs else math.nan,
                                    agree / total if total else math.nan),
    }


def _job(c: dict, pl: dict, microbatches: int, micro_batch_size: int, steps: int):
    """The runner job of case ``c`` under its plan ``pl`` (:func:`~.predict.device_plan`), carrying the plan's
    prediction so the run reports plan against observation."""
    from ..runtime.specs import RunSpec

    return RunSpec(name=_name(c), model=pl["model_config"], schedule=c["schedule"],
                   microbatches=microbatches, micro_batch_size=micro_batch_size, steps=steps,
                   boundaries=pl["boundaries"], pair_exec=pl["pair_exec"],
                   pair_order=pl["pair_order"]["template"] if pl["pair_order"].get("used", True) else None,
                   plan_prediction={"predicted_s": pl["prediction"]["iteration_s"],
                                    "stage_f_s": pl["prediction"]["stage_f_s"],
                                    "stage_b_s": pl["prediction"]["stage_b_s"],
                                    "bubble_s": pl["prediction"].get("bubble_s"),
                                    "ep_a2a_s": pl["prediction"].get("ep_a2a_s"),
                                    "costs": pl["costs"]["source"], "predicted_at": pl["predicted_at"]})


def _case(c: dict, job: dict, plan: dict, plan_loadavg: dict, drift: float | None) -> dict[str, Any]:
    """Case ``c``'s row: predicted (now, and from the load average at the start) against observed time and CPU;
    ``drift``: the work probe after the group over the one before."""
    pv = job["plan_vs_observed"]
    pc = plan["prediction"]["cpu_per_step_s"]
    oc = (job.get("cpu") or {}).get("actions_s")
    # the observed CPU in the state the prediction assumed (the probe before): the CPU work error apart
    # from the machine's drift during the group
    oc_ref = oc / ((1 + drift) / 2) if oc is not None and drift else oc
    return {"name": _name(c), **c, "boundaries": plan["boundaries"],
            "predicted_s": pv["predicted_s"], "observed_s": pv["observed_s"],
            "predicted_loadavg_s": plan_loadavg["prediction"]["iteration_s"],
            "observed_q1_s": pv["observed_q1_s"], "observed_q3_s": pv["observed_q3_s"],
            "error": pv["error"], "predicted_cpu_s": pc, "observed_cpu_s": oc,
            "observed_cpu_ref_s": oc_ref,
            "work_error": (pc - oc_ref) / oc_ref if oc_ref else None}


def _calibration(device: dict) -> dict[str, Any]:
    """What the device's calibration ran, and when; disjoint from the validated runs."""
    meta = device["metadata"]
    return {"device": device.get("name"), "path": device.get("_path"), "date": meta.get("date"),
            "runs": [f"layer microbenchmarks ({', '.join(device['layers'])}) x widths 1, 2",
                     "embedding and LM head microbenchmarks", "GEMM and memory throughput",
                     f"gloo p2p ping-pong and all-to-all (groups {', '.join(device['all_to_all'])}) "
                     f"in {meta.get('comm_world')} processes"],
            "disjoint_from_validated_runs": True, "load_average_1m": meta.get("load_average_1m"),
            "warnings": list(meta.get("warnings") or [])}


def _targets_met(median_abs_error: float, rank_agreement: float) -> dict[str, bool]:
    """Which of :data:`TARGETS` a result meets (NaN meets none)."""
    return {"median_abs_error_busy": bool(median_abs_error <= TARGETS["median_abs_error_busy"]),
            "median_abs_error_quiet": bool(median_abs_error <= TARGETS["median_abs_error_quiet"]),
            "rank_agreement": bool(rank_agreement >= TARGETS["rank_agreement"])}


def _inputs_line(r: dict[str, Any]) -> str:
    pi = r.get("prediction_inputs") or {}
    la = pi.get("median_abs_error_from_load_average")
    if pi.get("cores_available"):
        av = ", ".join(f"{k} {v['cores_available']:.2f}" for k, v in pi["cores_available"].items())
        line = (f"processor sharing of the cores available to the job, measured before each group (own "
                f"processes; {av} cores); from the load average alone the median |error| would be {la * 100:.1f}%")
        drift = [(k, v["work_probe_s"], v.get("work_probe_after_s")) for k, v in pi["cores_available"].items()
                 if v.get("work_probe_s") and v.get("work_probe_after_s")]
        if drift:
            line += ("\nwork probe (CPU of one layer F+B, calibration " + f"{pi.get('work_probe_ref_s', 0) * 1e3:.2f} ms)"
                     + " before -> after each group: "
                     + ", ".join(f"{k} {a * 1e3:.2f} -> {b * 1e3:.2f} ms" for k, a, b in drift)
                     + "; 'CPU work error' compares the predicted CPU-seconds of a step with the observed ones "
                       "taken back to the state before the group (observed, not an input of the prediction)")
        return line
    return "slowdown from the 1-minute load average"


def summarize(out_cases: list[dict[str, Any]]) -> dict[str, Any]:
    """``median_abs_error``, ``rank_agreement`` (share of case pairs ordered the same way by prediction and
    observation; ties skipped), ``rank_pairs`` and ``targets_met`` of cases with ``predicted_s`` and
    ``observed_s``."""
    errs = [abs(c["predicted_s"] - c["observed_s"]) / c["observed_s"] for c in out_cases if c["observed_s"] > 0]
    ranks = rank_agreement(out_cases)
    med = statistics.median(errs) if errs else math.nan
    ra = ranks["rank_agreement"]
    return {"median_abs_error": med, "rank_agreement": ra, "rank_pairs": ranks["rank_pairs"],
            "rank_agreement_apart": ranks["rank_agreement_apart"], "rank_pairs_apart": ranks["rank_pairs_apart"],
            "targets_met": _targets_met(med, ra)}


def rank_agreement(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Pairs of cases ordered the same way by ``predicted_s`` and ``observed_s`` (ties skipped).

    Returns ``rank_agreement`` (share over all pairs: the issue's target), ``rank_pairs``, ``agree``, and the same
    share over the pairs whose observations are apart (interquartile ranges ``observed_q1_s``-``observed_q3_s``
    not overlapping): ``rank_agreement_apart`` / ``rank_pairs_apart`` (NaN / 0 without quartiles). A pair whose
    observed IQRs overlap has no observed order beyond the noise, so its agreement is a coin flip.
    """
    agree = total = agree_apart = total_apart = 0
    for a, b in itertools.combinations(cases, 2):
        dp, do = a["predicted_s"] - b["predicted_s"], a["observed_s"] - b["observed_s"]
        if dp == 0 or do == 0:
            continue
        same = (dp > 0) == (do > 0)
        total += 1
        agree += same
        if all(k in c for c in (a, b) for k in ("observed_q1_s", "observed_q3_s")) and (
                a["observed_q3_s"] < b["observed_q1_s"] or b["observed_q3_s"] < a["observed_q1_s"]):
            total_apart += 1
            agree_apart += same
    return {"rank_agreement": agree / total if total else math.nan, "rank_pairs": total, "agree": agree,
            "rank_agreement_apart": agree_apart / total_apart if total_apart else math.nan,
            "rank_pairs_apart": total_apart}


def repredict(result: dict[str, Any], device: dict, *, microbatches: int = 4,
              micro_batch_size: int = 2) -> dict[str, Any]:
    """Offline re-prediction of a stored validation result with ``device`` (the current model): each case's
    boundaries and the group's measured availability (``prediction_inputs.cores_available``, else the stored
    median probes ``cpu_probe_s``) as inputs, the stored observations unchanged. Returns ``{"cases":
    [{name, predicted_s, observed_s, error}], **summarize(...)}``."""
    from .calibrate import widened
    from .predict import MachineState, predict_runner
    from ..runtime.specs import TinyConfig

    pi = result.get("prediction_inputs") or {}
    out = []
    for c in result["cases"]:
        g = f"pp{c['pp']}-ep{c['ep']}"
        av = (pi.get("cores_available") or {}).get(g)
        probe = (pi.get("cpu_probe_s") or {}).get(g)
        dev = device
        if av is None and probe is not None and pi.get("calibration_cpu_probe_s"):
            dev = {**device, "metadata": {**device["metadata"], "cpu_probe_s": pi["calibration_cpu_probe_s"]}}
        p = predict_runner(dev, widened(TinyConfig(), c["width"]).as_dict(), pp=c["pp"], ep=c["ep"],
                           schedule=c["schedule"], microbatches=microbatches, micro_batch_size=micro_batch_size,
                           boundaries=c["boundaries"],
                           machine=MachineState(cores_available=av["cores_available"] if av else None,
                                                cpu_probe_s=probe if av is None else None,
                                                work_probe_s=av.get("work_probe_s") if av else None))
        out.append({"name": c["name"], "predicted_s": p["iteration_s"], "observed_s": c["observed_s"],
                    "error": (p["iteration_s"] - c["observed_s"]) / c["observed_s"]})
    return {"cases": out, **summarize(out)}


def _apart_text(r: dict[str, Any]) -> str:
    n = r.get("rank_pairs_apart")
    if not n:
        return "; no pair of cases is apart beyond the noise (observed interquartile ranges all overlap)"
    return (f"; over the {n} pairs whose observed interquartile ranges are apart (an order beyond the noise): "
            f"{r['rank_agreement_apart'] * 100:.0f}%")


def format_validation(r: dict[str, Any]) -> str:
    from tessera_lab.textable import simple_table

    rows = [{"case": c["name"], "predicted (ms)": c["predicted_s"] * 1e3, "observed (ms)": c["observed_s"] * 1e3,
             "observed IQR (ms)": f"{c['observed_q1_s'] * 1e3:.1f}-{c['observed_q3_s'] * 1e3:.1f}",
             "error": f"{c['error'] * 100:+.1f}%",
             "CPU work error": f"{c['work_error'] * 100:+.1f}%" if c.get("work_error") is not None else "n/a"}
            for c in r["cases"]]
    m, t = r["machine"], r["targets"]
    return "\n".join([
        "CPU testbed (models CPU time sharing on this machine; does not transfer to GPUs)",
        simple_table(rows, floatfmt=".1f"),
        f"median |error| {r['median_abs_error'] * 100:.1f}% (target <= {t['median_abs_error_busy'] * 100:.0f}% busy, "
        f"<= {t['median_abs_error_quiet'] * 100:.0f}% quiet); rank agreement {r['rank_agreement'] * 100:.0f}% over "
        f"{r['rank_pairs']} pairs (target >= {t['rank_agreement'] * 100:.0f}%)" + _apart_text(r),
        "targets: " + ", ".join(f"{k.replace('_', ' ')} {'met' if v else 'NOT met'}"
                                for k, v in r.get("targets_met", {}).items()),
        f"calibration: device {r['calibration']['device']} ({r['calibration']['date']}), separate microbenchmark "
        f"runs, disjoint from the validated runs",
        _inputs_line(r),
        f"machine: {m['cores']} cores, load {m['load_before']} before, {m['load_after']} after; validated runs "
        f"{m['seconds']} s (calibration not included)",
    ] + [f"warning (calibration): {w}" for w in r["calibration"].get("warnings") or []])


def validate_from_args(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``tessera-lab validate``: calibrate (or load ``--device``), then :func:`validate`; returns
    ``(result, text)``."""
    from tessera_lab.cost.device import load_device

    if args.steps is not None and args.steps < 2:
        from tessera_lab.errors import ConfigError

        raise ConfigError(f"--steps = {args.steps} is out of range; allowed: >= 2 (the first step is a warm-up)")
    if args.device:
        device = load_device(args.device)
    else:
        from .calibrate import calibrate

        print("CPU testbed: calibrating (separate microbenchmark runs) ...", file=sys.stderr)
        device = calibrate(name="validate-calibration", repeats=5 if args.quick else 9)
        device["_path"] = None
    r = validate(device, quick=args.quick, steps=args.steps,
                 progress=lambda d, n: print(f"CPU testbed: validate {d}/{n} cases", file=sys.stderr))
    if not args.device:  # a fresh calibration lives nowhere else: keep it with the result (validate --repredict)
        r["calibration"]["device_file"] = {k: v for k, v in device.items() if not k.startswith("_")}
    return r, format_validation(r)
