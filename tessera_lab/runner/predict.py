"""Predicting the runner from a calibrated device (torch-free; see :mod:`tessera_lab.cost.device` for the model):
the iteration time of a job, and stage boundaries balanced on the calibrated per-layer costs."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from tessera_lab.cost.device import a2a_entry, alpha_beta, cost_source, layer_times
from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.passes import split_backward
from tessera_lab.pipeline.schedules import build_schedule, canonical_name
from tessera_lab.pipeline.simulate import simulate, stage_durations
from tessera_lab.plan.partition import uniform_boundaries

__all__ = ["predict_runner", "balanced_boundaries", "oversubscription", "device_plan"]


def predict_runner(device: Mapping[str, Any], cfg: Mapping[str, Any], *, pp: int, ep: int, dp: int = 1,
                   schedule: str = "1f1b", microbatches: int = 4, micro_batch_size: int = 2,
                   boundaries: Sequence[int] | None = None, vpp: int | None = None,
                   defer_w: bool = False, machine_load: float | None = None,
                   cpu_probe_s: float | None = None) -> dict[str, Any]:
    """Predicted iteration time of a runner job (seconds) and its parts (module docstring).

    Returns ``{"iteration_s", "bubble_fraction", "bubble_s", "ep_a2a_s", "stage_f_s", "stage_b_s",
    "stage_w_s", "p2p_s", "oversubscription", "layer_s", "source"}``: ``bubble_s`` is the idle rank-time of a
    step summed over pipeline ranks, ``ep_a2a_s`` the EP all-to-all time of a step summed over the pipeline
    ranks of one replica (micro-batches x layers x F and B x (dispatch + combine); the runner's ``ep_a2a`` events
    time those two, the blocking count exchange is a wait of its own).

    Raises:
        ConfigError / ScheduleError: bad schedule or boundaries.
    """
    name = canonical_name(schedule)
    v = vpp if vpp is not None else (2 if name in ("interleaved", "dualpipev") else 1)
    sched = build_schedule(name, pp, microbatches, v)
    if defer_w:
        sched = split_backward(sched, None)
    S = sched.num_stages
    L = cfg["num_layers"]
    if boundaries is None:
        boundaries = uniform_boundaries(L, S)
    if len(boundaries) != S + 1 or boundaries[0] != 0 or boundaries[-1] != L:
        raise ConfigError(f"plan field 'boundaries' = {list(boundaries)} does not fit {S} stages of {L} layers")
    r = cfg["attention_ratio"] + 1
    kinds = ["full_attention" if (i + 1) % r == 0 else "linear_attention" for i in range(L)]
    tokens = micro_batch_size * cfg["seq_len"]
    H = cfg["hidden_size"]
    world = pp * ep * dp
    per_kind = {k: layer_times(device, cfg, k, tokens) for k in set(kinds)}
    ex = device["extras"]
    a2a = a2a_dc = 0.0  # per layer and direction: all three all-to-alls, and dispatch + combine only
    if ep > 1:
        e = a2a_entry(device, ep)
        rows = tokens * cfg["top_k"] * (ep - 1) / ep
        a2a = float(e["alpha_s"]) + 2 * alpha_beta(e, rows * H * 4)  # count exchange + dispatch + combine
        situ = e.get("in_situ")
        if situ and situ.get("per_all_to_all_s"):
            # measured in situ (peers' skew and wake-ups included) under the calibration's contention of
            # `processes` busy processes: relative to the calibration's one-process share, that contention
            # was probe(processes) / probe(1); the mean-field slowdown below is applied on top, so divide it out
            pw = (device["metadata"].get("cpu_probe_world_s") or {}).get(str(situ.get("processes")))
            p1 = device["metadata"].get("cpu_probe_s")
            cal_over = (float(pw) / float(p1)) if pw and p1 else 1.0
            a2a = max(a2a, 3 * float(situ["per_all_to_all_s"]) / max(cal_over, 1e-9)
                      + 2 * max(0.0, alpha_beta(e, rows * H * 4) - alpha_beta(e, situ.get("bytes", 0))))
        a2a_dc = a2a * (2 / 3) if situ and situ.get("per_all_to_all_s") else a2a - float(e["alpha_s"])
    f, b, w = [], [], []
    for s in range(S):
        lo, hi = boundaries[s], boundaries[s + 1]
        fs = sum(per_kind[kinds[i]]["F"] for i in range(lo, hi)) + (hi - lo) * a2a
        bs = sum(per_kind[kinds[i]]["B"] for i in range(lo, hi)) + (hi - lo) * a2a
        ws = sum(per_kind[kinds[i]]["W"] for i in range(lo, hi))
        if s == 0:
            fs += ex["embed_F_s"]
            bs += ex["embed_B_s"]
        if s == S - 1:
            fs += ex["head_F_s"] * tokens / ex.get("head_tokens", tokens)
            bs += ex["head_B_s"] * tokens / ex.get("head_tokens", tokens)
        fs += ex.get("action_overhead_s", 0.0)
        bs += ex.get("action_overhead_s", 0.0)
        f.append(fs)
        b.append(bs)
        w.append(ws)
    p2p = alpha_beta(device["p2p"], tokens * H * 4)
    split = defer_w or name in ("zb-h1", "zb-h2")
    f0, b0, w0 = f, b, w
    # processor sharing, mean field: the slowdown depends on how many of the job's processes compute at once
    # (busy rank-time / iteration x replicas), which depends on the slowdown; a few fixed-point rounds
    n_busy = float(world)
    for _ in range(4):
        over = oversubscription(device, n_busy, machine_load, probe_s=cpu_probe_s, world_size=world)
        f, b, w = [x * over for x in f0], [x * over for x in b0], [x * over for x in w0]
        durs = stage_durations(f, b, w if split else None, [x + y for x, y in zip(f, b)])
        tl = simulate(sched, durs, p2p_latency=p2p)
        n_busy = max(1.0, ep * dp * sum(tl.per_rank_busy) / tl.iteration_time) if tl.iteration_time > 0 else 1.0
    n_layers = boundaries[-1] - boundaries[0]
    return {"iteration_s": tl.iteration_time, "bubble_fraction": tl.bubble_fraction,
            "bubble_s": float(sum(tl.per_rank_idle)),
            "ep_a2a_s": microbatches * n_layers * 2 * a2a_dc * over, "stage_f_s": f,
            "stage_b_s": b, "stage_w_s": w if split else None, "p2p_s": p2p, "oversubscription": over,
            "busy_processes": n_busy, "cpu_probe_s": cpu_probe_s,
            "layer_s": {k: v for k, v in per_kind.items()}, "schedule": sched.name,
            "boundaries": list(boundaries), "source": cost_source(device)["source"]}


def oversubscription(device: Mapping[str, Any], world: float, machine_load: float | None = None, *,
                     probe_s: float | None = None, world_size: int | None = None) -> float:
    """Slowdown of the runner's one-thread processes against the single-process calibration, when ``world``
    of them (a float: the mean number computing at once) run.

    A process gets ``cores / max(cores, runnable)`` of a core. At calibration ``runnable = L_cal`` (the
    1-minute load average then, which counts the calibrating process itself). At run time ``runnable = L +
    world`` with ``L`` the other tenants' load:

    * with ``probe_s`` (:func:`tessera_lab.runner.probe.cpu_probe` of the job's ``world_size`` = ``w``
      processes, measured now, before the run) and a calibration probe ``metadata.cpu_probe_s`` (one process,
      taken as uncontended): the probe's slowdown ``R = probe_s / cpu_probe_s`` is the slowdown with all ``w``
      busy; ``L = max(0, cores x R - w)`` and the slowdown with ``world`` busy is
      ``R x max(cores, L + world) / max(cores, L + w)`` (the share measured at the moment of the prediction);
    * else ``L = machine_load`` (the 1-minute load average when the prediction is made);
    * without either, a quiet machine: ``max(1, world / cores)``.
    """
    cores = int(device["metadata"].get("cores") or 1)
    cal = max(cores, max(float((device["metadata"].get("load_average_1m") or {}).get("before") or 1.0), 1.0))
    probe_cal = device["metadata"].get("cpu_probe_s")
    if probe_s is not None and probe_cal and world_size:
        ratio = float(probe_s) / float(probe_cal)
        other = max(0.0, cores * ratio - world_size)
        return ratio * max(cores, other + world) / max(cores, other + world_size)
    if machine_load is None:
        return max(1.0, world / cores)
    return max(cores, machine_load + world) / cal


def balanced_boundaries(device: Mapping[str, Any], cfg: Mapping[str, Any], stages: int, tokens: int) -> list[int]:
    """Contiguous stage boundaries minimising the slowest stage's predicted F + B (exact DP over the
    calibrated per-layer costs, embedding on the first stage and LM head on the last)."""
    L = cfg["num_layers"]
    r = cfg["attention_ratio"] + 1
    kinds = ["full_attention" if (i + 1) % r == 0 else "linear_attention" for i in range(L)]
    per = {k: layer_times(device, cfg, k, tokens) for k in set(kinds)}
    cost = [per[k]["F"] + per[k]["B"] for k in kinds]
    ex = device["extras"]
    first, last = ex["embed_F_s"] + ex["embed_B_s"], ex["head_F_s"] + ex["head_B_s"]
    best: dict[tuple[int, int], tuple[float, list[int]]] = {}

    def go(start: int, s: int) -> tuple[float, list[int]]:
        if (start, s) in best:
            return best[(start, s)]
        if s == stages - 1:
            v = sum(cost[start:]) + last + (first if s == 0 else 0.0)
            res = (v, [L])
        else:
            res = (math.inf, [])
            for end in range(start + 1, L - (stages - 1 - s) + 1):
                here = sum(cost[start:end]) + (first if s == 0 else 0.0)
                rest, bs = go(end, s + 1)
                v = max(here, rest)
                if v < res[0] - 1e-15:
                    res = (v, [end] + bs)
        best[(start, s)] = res
        return res

    if stages > L:
        return uniform_boundaries(L, stages)
    return [0] + go(0, 0)[1]


RUNNER_PLAN_SCHEMA = 1


def runner_model_config(name_or_path: str) -> tuple[str, dict[str, Any]]:
    """``(name, TinyConfig dict)`` of a runner model (``data/models/tiny-*.json`` or a path).

    Raises:
        ConfigError: not a runner model.
    """
    import json
    from pathlib import Path

    from tessera_lab.model.spec import load_model, shipped_models

    from .specs import TinyConfig

    spec = load_model(name_or_path)
    path = shipped_models().get(str(name_or_path)) or Path(name_or_path)
    return spec.name, TinyConfig.from_hf_config(json.loads(Path(path).read_text())).as_dict()


def device_plan(device: Mapping[str, Any], model: str, *, pp: int, ep: int, dp: int = 1, schedule: str = "1f1b",
                microbatches: int = 4, micro_batch_size: int = 2, vpp: int | None = None,
                partition: str = "balanced", pair_exec: str = "scheduled", pair_order: Any = None,
                config: Mapping[str, Any] | None = None, machine_load: float | None = None,
                cpu_probe_s: float | None = None) -> dict[str, Any]:
    """A runner plan predicted from a calibrated device: the partition (``balanced`` on the calibrated layer
    costs, or ``uniform``), the schedule, micro-batches, pair handler and order, and the prediction made now,
    before any run. ``tessera-lab run --plan`` executes exactly this plan. ``config``: TinyConfig fields
    (then ``model`` is only the label). ``machine_load``: the 1-minute load average when predicting (see
    :func:`oversubscription`); None: a quiet machine. ``cpu_probe_s``: :func:`tessera_lab.runner.probe.cpu_probe`
    of the job's processes measured now (used instead of the load average when the device has a calibration
    probe).

    Raises:
        ConfigError: not a runner model, bad sizes, or a partition name other than balanced / uniform.
    """
    import datetime as _dt

    from .orders import resolve_order

    if config is not None:
        name, cfg = model, dict(config)
    else:
        name, cfg = runner_model_config(model)
    sched = build_schedule(canonical_name(schedule), pp, microbatches,
                           vpp if vpp is not None else (2 if canonical_name(schedule) in ("interleaved", "dualpipev") else 1))
    S = sched.num_stages
    if partition == "balanced":
        bounds = balanced_boundaries(device, cfg, S, micro_batch_size * cfg["seq_len"])
    elif partition == "uniform":
        bounds = uniform_boundaries(cfg["num_layers"], S)
    else:
        raise ConfigError(f"field 'partition' = {partition!r} is unknown; allowed: balanced, uniform")
    pred = predict_runner(device, cfg, pp=pp, ep=ep, dp=dp, schedule=schedule, microbatches=microbatches,
                          micro_batch_size=micro_batch_size, boundaries=bounds, vpp=vpp, machine_load=machine_load,
                          cpu_probe_s=cpu_probe_s)
    pred["machine_load_at_prediction"] = machine_load
    label, template = resolve_order(pair_order, ep)
    return {
        "kind": "runner_plan", "schema_version": RUNNER_PLAN_SCHEMA, "model": name, "model_config": cfg,
        "parallel": {"pp": pp, "ep": ep, "dp": dp, "microbatches": microbatches,
                     "micro_batch_size": micro_batch_size, "schedule": canonical_name(schedule), "vpp": vpp},
        "partition": partition, "boundaries": bounds, "pair_exec": pair_exec,
        "pair_order": {"label": label, "template": list(template)},
        "costs": cost_source(device), "prediction": pred,
        "predicted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "notes": [f"costs: {cost_source(device)['source']} ({device['metadata'].get('device')}, "
                  f"{device['metadata'].get('date')})", "prediction made before the run (predicted)"],
    }


def format_device_plan(plan: Mapping[str, Any]) -> str:
    """Readable summary of :func:`device_plan`."""
    p, pr = plan["parallel"], plan["prediction"]
    lines = [f"runner plan: {plan['model']}, schedule {p['schedule']}, pp={p['pp']} ep={p['ep']} dp={p['dp']}, "
             f"m={p['microbatches']} x {p['micro_batch_size']} sequences, {plan['partition']} boundaries "
             f"{plan['boundaries']}",
             f"costs: {plan['costs']['source']} ({plan['costs']['device']}, {plan['costs']['date']})",
             "per stage (ms, predicted): F " + ", ".join(f"{x * 1e3:.2f}" for x in pr["stage_f_s"])
             + "; B " + ", ".join(f"{x * 1e3:.2f}" for x in pr["stage_b_s"]),
             f"predicted iteration {pr['iteration_s'] * 1e3:.2f} ms, bubble fraction {pr['bubble_fraction']:.3f}, "
             f"oversubscription x{pr['oversubscription']:.2f}",
             f"overlapped pairs: {plan['pair_exec']}, order {plan['pair_order']['label']}"]
    return "\n".join(lines)


def cmd_plan_device(args) -> int:
    """``tessera-lab plan --model tiny-... --device FILE``: the runner plan (``--json`` / ``--export``)."""
    import os
    import sys

    from tessera_lab.cost.device import load_device
    from tessera_lab.io import write_json

    dev = load_device(args.device)
    probe = None
    if dev["metadata"].get("cpu_probe_s"):
        from .probe import cpu_probe

        probe = cpu_probe(args.pp * args.ep * args.dp)
    plan = device_plan(dev, args.model, pp=args.pp, ep=args.ep, dp=args.dp, schedule=args.schedule,
                       microbatches=args.microbatches, micro_batch_size=args.micro_batch_size,
                       vpp=args.vpp if args.vpp != 1 else None,
                       partition="uniform" if args.method == "uniform" else "balanced",
                       machine_load=os.getloadavg()[0], cpu_probe_s=probe)
    text = format_device_plan(plan)
    if getattr(args, "json", None) == "-":
        write_json("-", plan)
    else:
        print(text)
        if getattr(args, "json", None):
            write_json(args.json, plan)
    if getattr(args, "export", None):
        write_json(args.export, plan)
        print(f"plan written to {args.export} (runner plan: tessera-lab run --plan {args.export})", file=sys.stderr)
    return 0
