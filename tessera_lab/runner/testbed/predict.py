"""Predicting the runner from a calibrated device (torch-free; see :mod:`tessera_lab.cost.device` for the model):
the iteration time of a job, and stage boundaries balanced on the calibrated per-layer costs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tessera_lab.cost.device import a2a_entry, alpha_beta, cost_source, layer_times
from tessera_lab.errors import ConfigError
from tessera_lab.pipeline.passes import split_backward
from tessera_lab.pipeline.schedules import build_schedule, canonical_name, default_ep_overlap, default_schedule
from tessera_lab.pipeline.simulate import stage_durations
from tessera_lab.plan.partition import uniform_boundaries

__all__ = ["MachineState", "PlanChoices", "predict_runner", "balanced_boundaries", "device_plan", "available_cores", "work_scale",
           "runner_cpu_entry"]


@dataclass(frozen=True)
class MachineState:
    """What was measured of this machine when a prediction is made (each None: not measured).

    Attributes:
        machine_load: the 1-minute load average.
        cpu_probe_s: :func:`tessera_lab.runner.testbed.probe.cpu_probe` of the job's processes, seconds.
        cores_available: :func:`tessera_lab.runner.testbed.probe.available_cores` with the job's processes.
        work_probe_s: :func:`tessera_lab.runner.testbed.work_probe.work_probe`, seconds.
    """

    machine_load: float | None = None
    cpu_probe_s: float | None = None
    cores_available: float | None = None
    work_probe_s: float | None = None


@dataclass(frozen=True)
class PlanChoices:
    """What a runner plan chooses besides its sizes: the partition (``balanced`` on the calibrated layer costs,
    or ``uniform``), the pair handler and its issue order (:mod:`tessera_lab.runner.runtime.orders`)."""

    partition: str = "balanced"
    pair_exec: str = "scheduled"
    pair_order: Any = None


# params: one per runner-plan option, keyword-only as device_plan passes them (MachineState groups the machine's)
def predict_runner(device: Mapping[str, Any], cfg: Mapping[str, Any], *, pp: int, ep: int, dp: int = 1,
                   schedule: str = "1f1b", microbatches: int = 4, micro_batch_size: int = 2,
                   boundaries: Sequence[int] | None = None, vpp: int | None = None,
                   defer_w: bool = False, machine: MachineState = MachineState()) -> dict[str, Any]:
    """Predicted iteration time of a runner job (seconds) and its parts.

    Per stage, the CPU work of F / B / W (the calibrated layer times, embedding and LM head, times the
    device's ``runner_cpu`` factor at this EP size: the runner's own execution measured in calibration jobs;
    plus the CPU of each stage-to-stage send or receive: half of ``runner_cpu.transfer_cpu_s``, fitted on
    GPipe calibration jobs at pp 2 and 4, else ``p2p.cpu_per_op_s`` from the ping-pong)
    and the time blocked on all-to-all peers per action; then processor sharing over the schedule's timeline
    (:func:`tessera_lab.runner.testbed.sharing.simulate_shared`, with the co-running slowdown table
    ``runner_cpu.corun.table`` of processes computing at once): the job's computing processes (``ep * dp`` per busy
    pipeline rank) share the cores available to this job, ``C``: ``machine.cores_available`` (measured just before
    the run by :func:`tessera_lab.runner.testbed.probe.available_cores` with as many processes as the job, each in a
    session of its own as the spawned workers are), else from
    ``cpu_probe_s`` (the older median probe of ``world`` processes: ``world x calibration probe / probe``),
    else ``machine_load`` (the 1-minute load average: ``cores x cores / max(cores, load + world)``... as a
    per-process share), else all the cores (a quiet machine).

    ``machine.work_probe_s``: :func:`tessera_lab.runner.testbed.work_probe.work_probe` measured just before the run; every
    CPU work term is scaled by it over the calibration's (``runner_cpu.work_probe.ref_s``; :func:`work_scale`).

    Returns ``{"iteration_s", "bubble_fraction", "bubble_s", "ep_a2a_s", "stage_f_s", "stage_b_s",
    "stage_w_s", "p2p_s", "oversubscription", "cores_available", "layer_s", "source", ...}``: stage times are
    the CPU work at the simulated mean speed; ``bubble_s`` the idle rank-time of a step summed over pipeline
    ranks; ``ep_a2a_s`` the blocked all-to-all time of a step summed over the pipeline ranks of one replica;
    ``oversubscription`` = 1 / the mean speed of a computing process; ``cpu_per_step_s`` the CPU-seconds of
    a step over every process (work times its co-running slowdown), comparable with a run's observed
    ``cpu.actions_s``; ``work_scale`` the factor applied from ``work_probe_s``.

    Raises:
        ConfigError / ScheduleError: bad schedule or boundaries.
    """
    from .sharing import simulate_shared

    machine_load, cpu_probe_s = machine.machine_load, machine.cpu_probe_s
    cores_available, work_probe_s = machine.cores_available, machine.work_probe_s
    name, sched, boundaries = _schedule_and_split(schedule, pp, microbatches, vpp, defer_w, cfg["num_layers"],
                                                  boundaries)
    S, L = sched.num_stages, cfg["num_layers"]
    r = cfg["attention_ratio"] + 1
    kinds = ["full_attention" if (i + 1) % r == 0 else "linear_attention" for i in range(L)]
    tokens = micro_batch_size * cfg["seq_len"]
    world = pp * ep * dp
    per_kind = {k: layer_times(device, cfg, k, tokens) for k in set(kinds)}
    rc = runner_cpu_entry(device, ep)
    factor = float(rc["factor"]) if rc else 1.0
    a2a_block = _a2a_blocked(device, cfg, ep, tokens, rc)
    scale = work_scale(device, work_probe_s)  # the machine's state now against the calibration's
    factor *= scale
    tx = (device.get("runner_cpu") or {}).get("transfer_cpu_s")  # in situ, both ends of one transfer
    p2p_cpu = scale * (float(tx) / 2 if tx is not None else float(device["p2p"].get("cpu_per_op_s", 0.0)))
    f, b, w, blk = _stage_work(device["extras"], per_kind, kinds, boundaries, tokens, factor, p2p_cpu, a2a_block)
    p2p = alpha_beta(device["p2p"], tokens * cfg["hidden_size"] * 4)
    split = defer_w or name in ("zb-h1", "zb-h2")
    cores = int(device["metadata"].get("cores") or 1)
    avail = available_cores(device, world, cores_available=cores_available, cpu_probe_s=cpu_probe_s,
                            machine_load=machine_load)
    work = stage_durations(f, b, w if split else None, [x + y for x, y in zip(f, b)])
    zero = [0.0] * S
    block = stage_durations(blk, blk, zero if split else None, [2 * x for x in blk])
    corun = ((device.get("runner_cpu") or {}).get("corun") or {}).get("table") or 1.0
    sim = simulate_shared(sched, work, cores=avail, procs_per_rank=ep * dp, p2p=p2p,
                          latency=block, wait_cpu=float(device["p2p"].get("wait_cpu_share", 0.0)),
                          corun=corun, machine_cores=cores)
    over = 1.0 / sim["mean_rate"] if sim["mean_rate"] > 0 else 1.0
    T = sim["iteration_s"]
    busy = sim["per_rank_busy_s"]
    n_layers = boundaries[-1] - boundaries[0]
    return {"iteration_s": T, "bubble_fraction": (sum(max(0.0, T - x) for x in busy) / (T * len(busy))) if T else 0.0,
            "bubble_s": float(sum(max(0.0, T - x) for x in busy)),
            "ep_a2a_s": microbatches * n_layers * 2 * a2a_block, "stage_f_s": [x * over for x in f],
            "stage_b_s": [x * over for x in b], "stage_w_s": [x * over for x in w] if split else None,
            "stage_work_f_s": f, "stage_work_b_s": b, "cpu_per_step_s": sim["cpu_s"], "p2p_s": p2p, "oversubscription": over,
            "busy_processes": sim["busy_processes"], "cores_available": avail, "cores": cores,
            "runner_cpu_factor": factor, "corun": corun, "cpu_probe_s": cpu_probe_s,
            "work_scale": scale, "work_probe_s": work_probe_s,
            "layer_s": {k: v for k, v in per_kind.items()}, "schedule": sched.name,
            "boundaries": list(boundaries), "source": cost_source(device)["source"]}


def _schedule_and_split(schedule: str, pp: int, microbatches: int, vpp: int | None, defer_w: bool, L: int,
                        boundaries: Sequence[int] | None):
    """``(canonical name, schedule, boundaries)``: the schedule built (two chunks per rank by default for interleaved
    and DualPipeV; W split off when ``defer_w``) and the boundaries checked against it (default uniform).

    Raises:
        ConfigError: boundaries that do not cut ``L`` layers into the schedule's stages.
    """
    name = canonical_name(schedule)
    v = vpp if vpp is not None else (2 if name in ("interleaved", "dualpipev") else 1)
    sched = build_schedule(name, pp, microbatches, v)
    if defer_w:
        sched = split_backward(sched, None)
    S = sched.num_stages
    if boundaries is None:
        boundaries = uniform_boundaries(L, S)
    if len(boundaries) != S + 1 or boundaries[0] != 0 or boundaries[-1] != L:
        raise ConfigError(f"plan field 'boundaries' = {list(boundaries)} does not fit {S} stages of {L} layers")
    return name, sched, boundaries


def _a2a_blocked(device: Mapping[str, Any], cfg: Mapping[str, Any], ep: int, tokens: int, rc) -> float:
    """Seconds blocked on all-to-all peers per layer and F or B action: the in-situ calibration's at this EP size
    (``rc``), else the all-to-all microbenchmark's time for the routed rows; 0 without expert parallelism."""
    if ep <= 1:
        return 0.0
    if rc:
        return float(rc["blocked_s"])
    e = a2a_entry(device, ep)  # no in-situ calibration: the all-to-all microbenchmark, as blocked time
    rows = tokens * cfg["top_k"] * (ep - 1) / ep
    return float(e["alpha_s"]) + 2 * alpha_beta(e, rows * cfg["hidden_size"] * 4)


def _stage_work(ex: Mapping[str, Any], per_kind: dict, kinds: list[str], boundaries: Sequence[int], tokens: int,
                factor: float, p2p_cpu: float, a2a_block: float) -> tuple[list, list, list, list]:
    """Per stage ``(F, B, W, blocked)`` seconds: its layers' calibrated times (embedding on the first stage, LM
    head on the last, the per-action overhead) times ``factor``, plus ``p2p_cpu`` per stage-to-stage transfer
    posted; blocked: the all-to-all wait of its layers."""
    S = len(boundaries) - 1
    f, b, w, blk = [], [], [], []
    for s in range(S):
        lo, hi = boundaries[s], boundaries[s + 1]
        fs = sum(per_kind[kinds[i]]["F"] for i in range(lo, hi))
        bs = sum(per_kind[kinds[i]]["B"] for i in range(lo, hi))
        ws = sum(per_kind[kinds[i]]["W"] for i in range(lo, hi))
        if s == 0:
            fs += ex["embed_F_s"]
            bs += ex["embed_B_s"]
        if s == S - 1:
            fs += ex["head_F_s"] * tokens / ex.get("head_tokens", tokens)
            bs += ex["head_B_s"] * tokens / ex.get("head_tokens", tokens)
        fs += ex.get("action_overhead_s", 0.0)
        bs += ex.get("action_overhead_s", 0.0)
        # CPU of posting / completing the stage-to-stage transfers: F receives from s-1 and sends to s+1,
        # B the reverse (calibrated send or receive CPU, ping-pong)
        hops = (s > 0) + (s < S - 1)
        f.append(fs * factor + hops * p2p_cpu)
        b.append(bs * factor + hops * p2p_cpu)
        w.append(ws * factor)
        blk.append((hi - lo) * a2a_block)
    return f, b, w, blk


def work_scale(device: Mapping[str, Any], work_probe_s: float | None) -> float:
    """``work_probe_s`` over the device's calibration probe (``runner_cpu.work_probe.ref_s``): how much more
    CPU the same work takes now than during calibration; 1 without either."""
    ref = ((device.get("runner_cpu") or {}).get("work_probe") or {}).get("ref_s")
    if not work_probe_s or not ref:
        return 1.0
    return float(work_probe_s) / float(ref)


def device_work_probe(device: Mapping[str, Any]) -> float | None:
    """The work probe measured now on the device's calibration model and micro-batch size (None for a device
    calibrated without one): the input of :func:`work_scale`. Needs torch."""
    if not ((device.get("runner_cpu") or {}).get("work_probe") or {}).get("ref_s"):
        return None
    from ..runtime.specs import TinyConfig
    from .work_probe import work_probe

    meta = device["metadata"]
    return work_probe(TinyConfig.from_dict(meta["model"]), int(meta.get("micro_batch_size") or 2))


def runner_cpu_entry(device: Mapping[str, Any], ep: int) -> Mapping[str, Any] | None:
    """The device's in-situ runner CPU calibration (``runner_cpu``) at EP size ``ep`` (the nearest size
    calibrated), or None for a device calibrated before it existed."""
    table = {k: v for k, v in (device.get("runner_cpu") or {}).items() if k.isdigit()}
    if not table:
        return None
    if str(ep) in table:
        return table[str(ep)]
    return table[str(min((int(k) for k in table), key=lambda k: (abs(k - ep), -k)))]


def available_cores(device: Mapping[str, Any], world: int, *, cores_available: float | None = None,
                    cpu_probe_s: float | None = None, machine_load: float | None = None) -> float:
    """Cores available to the job for :func:`predict_runner` (see there), in ``(0, cores]``."""
    cores = float(device["metadata"].get("cores") or 1)
    if cores_available is not None:
        return min(cores, max(1e-3, float(cores_available)))
    probe_cal = device["metadata"].get("cpu_probe_s")
    if cpu_probe_s is not None and probe_cal:
        return min(cores, max(1e-3, world * float(probe_cal) / float(cpu_probe_s)))
    if machine_load is not None:
        return min(cores, cores * world / max(cores, float(machine_load) + world))
    return cores


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
    from tessera_lab.model.spec import load_model

    from ..runtime.specs import TinyConfig

    spec = load_model(name_or_path)
    return spec.name, TinyConfig.from_model_spec(spec).as_dict()


# params: one per 'plan --device' option; PlanChoices and MachineState already group the rest
def device_plan(device: Mapping[str, Any], model: str, *, pp: int, ep: int, dp: int = 1, schedule: str = "1f1b",
                microbatches: int = 4, micro_batch_size: int = 2, vpp: int | None = None,
                choices: PlanChoices = PlanChoices(), config: Mapping[str, Any] | None = None,
                machine: MachineState = MachineState()) -> dict[str, Any]:
    """A runner plan predicted from a calibrated device: the partition (``balanced`` on the calibrated layer
    costs, or ``uniform``), the schedule, micro-batches, pair handler and order, and the prediction made now,
    before any run. ``tessera-lab run --plan`` executes exactly this plan. ``config``: TinyConfig fields
    (then ``model`` is only the label). ``machine``: what was measured of the machine now
    (:func:`predict_runner`); ``machine.machine_load`` None and nothing else measured: a quiet machine.

    Raises:
        ConfigError: not a runner model, bad sizes, or a partition name other than balanced / uniform.
    """
    import datetime as _dt

    from tessera_lab.pipeline.actions import ActionType

    from ..runtime.orders import resolve_order

    partition, pair_exec, pair_order = choices.partition, choices.pair_exec, choices.pair_order
    if config is not None:
        name, cfg = model, dict(config)
    else:
        name, cfg = runner_model_config(model)
    ne = int(cfg.get("num_experts") or 0)
    if ne and (ep < 1 or ne % ep):
        raise ConfigError(f"plan field 'ep' = {ep} does not divide the runner model's num_experts = {ne}; allowed: "
                          + ", ".join(str(k) for k in range(1, ne + 1) if ne % k == 0))
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
                          micro_batch_size=micro_batch_size, boundaries=bounds, vpp=vpp, machine=machine)
    pred["machine_load_at_prediction"] = machine.machine_load
    label, template = resolve_order(pair_order, ep)
    return {
        "kind": "runner_plan", "schema_version": RUNNER_PLAN_SCHEMA, "model": name, "model_config": cfg,
        "parallel": {"pp": pp, "ep": ep, "dp": dp, "microbatches": microbatches,
                     "micro_batch_size": micro_batch_size, "schedule": canonical_name(schedule), "vpp": vpp},
        "partition": partition, "boundaries": bounds, "pair_exec": pair_exec,
        # the runner reads a pair order only where the scheduled handler runs overlapped pairs (RunSpec refuses it
        # elsewhere as ignored): "used" says whether the job carries it
        "pair_order": {"label": label, "template": list(template),
                       "used": pair_exec == "scheduled" and any(a.type is ActionType.OVERLAP_F_B
                                                                for acts in sched.actions.values() for a in acts)},
        "costs": cost_source(device), "prediction": pred,
        "predicted_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "notes": [f"costs: {cost_source(device)['source']} ({device['metadata'].get('device')}, "
                  f"{device['metadata'].get('date')})", "prediction made before the run (predicted)"],
    }


def format_device_plan(plan: Mapping[str, Any]) -> str:
    """Readable summary of :func:`device_plan`."""
    p, pr = plan["parallel"], plan["prediction"]
    lines = ["CPU testbed (models CPU time sharing on this machine; does not transfer to GPUs)",
             f"runner plan: {plan['model']}, schedule {p['schedule']}, pp={p['pp']} ep={p['ep']} dp={p['dp']}, "
             f"m={p['microbatches']} x {p['micro_batch_size']} sequences, {plan['partition']} boundaries "
             f"{plan['boundaries']}",
             f"costs: {plan['costs']['source']} ({plan['costs']['device']}, {plan['costs']['date']})",
             "per stage (ms, predicted): F " + ", ".join(f"{x * 1e3:.2f}" for x in pr["stage_f_s"])
             + "; B " + ", ".join(f"{x * 1e3:.2f}" for x in pr["stage_b_s"]),
             f"predicted iteration {pr['iteration_s'] * 1e3:.2f} ms, bubble fraction {pr['bubble_fraction']:.3f}, "
             f"oversubscription x{pr['oversubscription']:.2f} (processor sharing of "
             f"{pr.get('cores_available', 0.0):.2f} available cores and CPU work x{pr.get('work_scale', 1.0):.2f} "
             f"from the work probe, both measured now: a prediction for the machine as it is at planning time)"]
    if p["schedule"] in ("overlapped", "interleaved-overlapped", "dualpipev"):
        lines.append(f"overlapped pairs: {plan['pair_exec']}, order {plan['pair_order']['label']}")
    return "\n".join(lines)


def cmd_plan_device(args) -> int:
    """``tessera-lab plan --model tiny-... --device FILE``: the runner plan (``--json`` / ``--export``)."""
    import os
    import sys

    from tessera_lab.cost.device import load_device
    from tessera_lab.io import write_json

    from tessera_lab.model.hardware import dp_for_gpus

    dev = load_device(args.device)
    from .probe import available_cores

    if args.ep is None:  # plan's default EP (the runner's models are MoE)
        args.ep = 8
    dp = dp_for_gpus(getattr(args, "gpus", None), args.dp, args.pp * args.ep)  # the runner's world: pp x ep x dp
    avail = available_cores(int(dev["metadata"].get("cores") or os.cpu_count() or 1),
                            processes=args.pp * args.ep * dp)
    # plan's default schedule rule (default_ep_overlap: Megatron-Core's EP-overlap rules); the runner has no
    # recompute (plan --device refuses --recompute and --recompute-modules), so here it turns on EP > 1 alone
    schedule = default_schedule(args.schedule, args.vpp, ep_overlap=default_ep_overlap(args))
    plan = device_plan(dev, args.model, pp=args.pp, ep=args.ep, dp=dp, schedule=schedule,
                       microbatches=args.microbatches, micro_batch_size=args.micro_batch_size,
                       vpp=args.vpp if args.vpp != 1 else None,
                       choices=PlanChoices(partition="uniform" if args.method == "uniform" else "balanced"),
                       machine=MachineState(machine_load=os.getloadavg()[0], cores_available=avail["cores_available"],
                                            work_probe_s=device_work_probe(dev)))
    text = format_device_plan(plan)
    if getattr(args, "json", None) == "-":
        write_json("-", plan)
    else:
        print(text)
        if getattr(args, "json", None):
            write_json(args.json, plan)
    if getattr(args, "export", None):
        write_json(args.export, plan)
        print(f"CPU testbed: plan written to {args.export} (runner plan: tessera-lab run --plan {args.export})", file=sys.stderr)
    return 0
