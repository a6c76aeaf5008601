"""Launching the runner: job specs, the local spawner, the worker entry, and what a run returns.

Two ways to start ``pp * ep * dp`` processes:

* ``torchrun --nproc-per-node N [--nnodes M --rdzv-backend c10d ...] -m tessera_lab.runner --pp 2 --ep 2 ...``:
  torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; each process runs
  :func:`torchrun_worker` under torchelastic's ``record`` (a failure is written to the agent's error file and
  reported as the root cause), on ``cuda:$LOCAL_RANK`` with NCCL or on CPU with gloo; global rank 0 prints the
  summary and writes ``--json`` / ``--trace`` / ``--profile-store``. Supervision is torchelastic's (docs/cli.md).
* ``tessera-lab run --pp 2 --ep 2 ...`` (or ``python -m tessera_lab.runner`` without torchrun's variables):
  :func:`spawn` starts the workers locally (``127.0.0.1``, a free port), collects rank 0's result and writes
  the outputs. The spawner itself never imports torch.

Backend: NCCL when CUDA is available (one GPU per local rank), else gloo. A world size other than
``pp * ep * dp`` is a :class:`~tessera_lab.errors.ConfigError` raised before any process group exists.

Faults: every collective has a timeout (``init_process_group(timeout=...)``, :attr:`WorldSpec.timeout_s`); a
rank that raises prints its traceback and exits with status 1 at once (``os._exit``, so no destructor can
hang); its peers see the closed connections and fail too. The spawner watches all workers: when one exits
non-zero it gives the others :attr:`WorldSpec.grace_s` seconds to exit, then terminates and kills them, and
raises :class:`RunnerError` with every rank's exit status and the failing rank's log tail (``run`` exits 3,
with ``--dynamic`` too). Workers also exit by themselves when their parent process disappears, so nothing is
left behind. Without ``--out`` a run's temporary folder is removed after success and kept (its path printed)
after a failure; see docs/robustness.md.

This module never imports torch at import time (the worker imports it when it starts). Specs live in
:mod:`.specs`, the spawner in :mod:`.spawn`, the worker in :mod:`.worker`, results in :mod:`.results`; this
module holds the command line and re-exports them.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Sequence

from tessera_lab.argtypes import positive_int
from tessera_lab.errors import ConfigError, TesseraError
from tessera_lab.io import read_json

from .results import RunResult, observed_timeline, record_profile, timing_report, write_trace
from .spawn import _alive, _free_port, spawn
from ..runtime.specs import RunnerError, RunSpec, TinyConfig, WorldSpec
from .worker import _watch_parent, run_worker, worker_main

__all__ = [
    "WorldSpec", "RunSpec", "RunnerError", "RunResult", "spawn", "worker_main", "main", "timing_report",
    "observed_timeline", "write_trace", "record_profile", "TinyConfig", "_alive", "_free_port", "torchrun_worker",
]


# ----------------------------------------------------------------------------------------------
# command line (shared by ``tessera-lab run`` and ``python -m tessera_lab.runner``)
# ----------------------------------------------------------------------------------------------


#: defaults of the options a runner plan fixes (``run --plan`` refuses other values: the plan is run as made)
PLAN_FIXED = {"pp": 2, "ep": 2, "dp": 1, "schedule": "1f1b", "microbatches": 4, "micro_batch_size": 2,
              "pair_exec": None, "vpp": None}


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``tessera-lab run`` (also used by ``python -m tessera_lab.runner``)."""
    d = PLAN_FIXED
    p.add_argument("--pp", type=positive_int("pp"), default=d["pp"], help="pipeline stages (ranks)")
    p.add_argument("--ep", type=positive_int("ep"), default=d["ep"], help="expert-parallel size")
    p.add_argument("--dp", type=positive_int("dp"), default=d["dp"], help="data-parallel size")
    p.add_argument("--schedule", default=d["schedule"],
                   help="gpipe|1f1b|interleaved|zb-h1|zb-h2|dualpipev|overlapped")
    p.add_argument("--vpp", type=positive_int("vpp"), default=d["vpp"],
                   help="chunks per rank (interleaved; default 2)")
    p.add_argument("--microbatches", "-m", type=positive_int("microbatches"), default=d["microbatches"])
    p.add_argument("--micro-batch-size", type=positive_int("micro_batch_size"), default=d["micro_batch_size"],
                   help="sequences per replica")
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
    p.add_argument("--ep-dispatch", choices=["auto", "uneven", "capacity"], default=None,
                   help="EP dispatch: uneven (count exchange, host-read splits) | capacity (fixed blocks, no host "
                        "read; memory: docs/gpu.md) | auto (capacity on CUDA while padding <= 4x, else uneven)")
    p.add_argument("--seed", type=int, default=None, help="model init seed")
    p.add_argument("--defer-w", action="store_true", help="split backwards into I now and W later")
    p.add_argument("--routing", default=None, metavar="SPEC",
                   help="skew the router on purpose: uniform | zipf:S | drift:S[:R] (per-layer logit offsets, "
                        "tessera_lab.dynamic.routing.router_bias; also applied in the --check reference)")
    p.add_argument("--dynamic", action="store_true",
                   help="compare static and dynamic W placement: --trials interleaved pairs of jobs, the dynamic one "
                        "filling p2p receive waits with deferred W (tessera_lab.runner.runtime.gaps)")
    p.add_argument("--trials", type=positive_int("trials"), default=3, help="with --dynamic: static/dynamic pairs")
    p.add_argument("--pair-exec", default=None, metavar="NAME",
                   help="how the two halves of an overlapped pair run: threads (concurrently; the default on CPU) | "
                        "serial | scheduled (node level, async all-to-alls; the default on CUDA, where threads would "
                        "issue all-to-alls on two NCCL communicators from two threads)")
    p.add_argument("--overlap", action=_Replaced, nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--pair-order", default=None, metavar="ORDER",
                   help="issue order for --pair-exec scheduled: searched (default) | measured:RUN.json | program | megatron | "
                        "comm-first | ten comma-separated template keys (f.pre,...,b.pre)")
    p.add_argument("--grad-sync", choices=["ordered", "allreduce"], default="ordered")
    p.add_argument("--no-deterministic", action="store_true", help="use all threads, no deterministic algorithms")
    p.add_argument("--check", action="store_true",
                   help="compare losses and step-0 gradients with the single-process CPU reference (same EP dispatch "
                        "mode): bitwise on CPU, allclose with a stated tolerance on CUDA; exit 4 when it fails")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--p2p", choices=["auto", "nccl-order", "batch"], default="auto",
                   help="pipeline transfers: batch (dist.batch_isend_irecv, one Work per batch as on NCCL; on gloo "
                        "through the CPU layer with NCCL's semantics) | nccl-order (gloo only: the same plus a key "
                        "check on every transfer) | auto (nccl-order on gloo, batch on NCCL); docs/gpu.md")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="wall-clock limit of the whole run, seconds (finite, > 0)")
    p.add_argument("--collective-timeout", type=float, default=60.0, help="per-operation timeout, seconds")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace of the observed actions")
    p.add_argument("--profile-store", metavar="PATH", help="append per-stage observations to this JSON store")
    p.add_argument("--out", metavar="DIR", help="folder for logs and results (default: a temporary folder)")
    p.add_argument("--fault-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--fault-step", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--json", metavar="PATH", help="write the result as JSON to PATH ('-' for stdout)")


class _Replaced(argparse.Action):
    """``--overlap``: refused with one line naming its replacement, ``--pair-exec`` (exit 2)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = f"option {option_string}" + (f" = {values!r}" if values is not None else "")
        parser.exit(2, f"{parser.prog}: error: {given} is replaced by --pair-exec; allowed: --pair-exec threads "
                       "(for --overlap thread) | serial | scheduled\n")


def _pair_order_arg(value: str | None):
    """``--pair-order``: a name, or comma-separated template keys (a list)."""
    if value is None or "," not in value:
        return value
    return [x.strip() for x in value.split(",") if x.strip()]


def routing_bias(spec: str, model: dict) -> list[list[float]]:
    """``--routing``: per-layer router logit offsets ``[layers][E]`` for the tiny model ``model`` (a dict of
    :class:`TinyConfig` fields; defaults for the rest), seeded by the model seed, so every rank and the
    single-process reference build the same router.

    Raises:
        ConfigError: a spec other than uniform, zipf:S or drift:S[:R] (``walk`` varies per micro-batch).
    """
    from tessera_lab.dynamic.routing import router_bias

    cfg = TinyConfig.from_dict(model)
    return router_bias(spec, cfg.num_experts, cfg.num_layers, seed=cfg.seed).tolist()


def specs_from_args(args: argparse.Namespace) -> tuple[WorldSpec, RunSpec]:
    """World and job from parsed ``run`` options (reads ``--plan``)."""
    model = {k: v for k, v in {
        "num_layers": args.layers, "hidden_size": args.hidden, "num_experts": args.experts, "top_k": args.top_k,
        "expert_width": args.expert_width, "attention_ratio": args.attention_ratio, "seq_len": args.seq_len,
        "capacity_factor": args.capacity_factor, "seed": args.seed,
        "ep_dispatch": getattr(args, "ep_dispatch", None)}.items() if v is not None}
    boundaries = None
    if args.plan:
        plan = read_json(args.plan, "plan")
        where = f"plan '{args.plan}'"
        if not isinstance(plan, dict):
            raise ConfigError(f"{where} holds a JSON {type(plan).__name__}; allowed: an object with 'boundaries' "
                              "(tessera-lab partition/plan --json)")
        kind = plan.get("kind")
        if kind == "runner_plan" or (kind is None and "model_config" in plan):
            if kind is None:
                raise ConfigError(f"{where}: field 'kind' is missing but the file has 'model_config' (a runner plan); "
                                  "allowed: 'runner_plan' (write it with tessera-lab plan --model tiny-runner --device)")
            return specs_from_runner_plan(plan, args)
        if kind is not None:
            raise ConfigError(f"{where}: field 'kind' = {kind!r} is not allowed; allowed: 'runner_plan' or no 'kind' "
                              "(a partition/plan --json)")
        from tessera_lab.schema import F, validate

        validate(plan, F("dict", fields={"boundaries": F("list", low=2, limit="layers",
                                                         items=F("int", low=0, limit="layers"))}), where)
        boundaries = [int(x) for x in plan["boundaries"]]
        if model.get("num_layers", boundaries[-1]) != boundaries[-1]:
            raise ConfigError(f"run: --layers = {model['num_layers']} conflicts with {where}: its boundaries end at "
                              f"layer {boundaries[-1]}; allowed: --layers {boundaries[-1]} (or drop --layers)")
        model.setdefault("num_layers", boundaries[-1])
    if getattr(args, "routing", None):
        model["router_bias"] = routing_bias(args.routing, model)
    world = WorldSpec(pp=args.pp, ep=args.ep, dp=args.dp, backend=args.backend, timeout_s=args.collective_timeout,
                      p2p=getattr(args, "p2p", "auto"))
    fault = {"rank": args.fault_rank, "step": args.fault_step, "action": 1} if args.fault_rank is not None else None
    job = RunSpec(name="run", model=model, schedule=args.schedule, vpp=args.vpp, microbatches=args.microbatches,
                  micro_batch_size=args.micro_batch_size, steps=args.steps, lr=args.lr, boundaries=boundaries,
                  defer_w=args.defer_w, deterministic=not args.no_deterministic, grad_sync=args.grad_sync,
                  check_reference=args.check, save_grads=args.check, fault=fault, pair_exec=args.pair_exec,
                  pair_order=_pair_order_arg(args.pair_order))
    return world, job


def specs_from_runner_plan(plan: dict, args: argparse.Namespace) -> tuple[WorldSpec, RunSpec]:
    """World and job that execute a runner plan (:func:`tessera_lab.runner.testbed.predict.device_plan`) exactly:
    its model, sizes, schedule, micro-batches, boundaries, pair handler and pair order. The plan's prediction
    travels with the job (``RunSpec.plan_prediction``) and is reported against the observation."""
    from ..testbed.predict import RUNNER_PLAN_SCHEMA
    from ..runtime.schemas import check_runner_plan

    where = f"runner plan '{args.plan}'"
    if plan.get("schema_version") != RUNNER_PLAN_SCHEMA:
        raise ConfigError(f"{where}: field 'schema_version' = {plan.get('schema_version')!r}; allowed: "
                          f"{RUNNER_PLAN_SCHEMA}")
    check_runner_plan(plan, where, TinyConfig.from_dict)
    for name, default in PLAN_FIXED.items():  # an option set away from its default must agree with the plan
        given = getattr(args, name, default)
        planned = (plan.get("parallel") or {}).get(name, plan.get(name))
        if given != default and given != planned:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"run: {flag} = {given} conflicts with the plan's {name} = {planned}; --plan runs the "
                              f"plan as made (drop {flag}, or plan again with it)")
    model_opts = {"layers": "num_layers", "hidden": "hidden_size", "experts": "num_experts", "top_k": "top_k",
                  "expert_width": "expert_width", "attention_ratio": "attention_ratio", "seq_len": "seq_len",
                  "capacity_factor": "capacity_factor", "seed": "seed", "ep_dispatch": "ep_dispatch"}
    for opt, fieldname in model_opts.items():
        given = getattr(args, opt, None)
        planned = plan["model_config"].get(fieldname, "auto" if fieldname == "ep_dispatch" else None)
        if given is not None and given != planned:
            flag = "--" + opt.replace("_", "-")
            raise ConfigError(f"run: {flag} = {given} conflicts with the plan's model_config.{fieldname} = "
                              f"{planned}; --plan runs the plan's model (drop {flag}, or plan again)")

    try:
        par = plan["parallel"]
        world = WorldSpec(pp=par["pp"], ep=par["ep"], dp=par["dp"], backend=args.backend,
                          timeout_s=args.collective_timeout, p2p=getattr(args, "p2p", "auto"))
        pmodel = dict(plan["model_config"])
        if getattr(args, "routing", None):
            pmodel["router_bias"] = routing_bias(args.routing, pmodel)
        job = RunSpec(name="run", model=pmodel, schedule=par["schedule"], vpp=par.get("vpp"),
                      microbatches=par["microbatches"], micro_batch_size=par["micro_batch_size"], steps=args.steps,
                      lr=args.lr, boundaries=[int(x) for x in plan["boundaries"]],
                      deterministic=not args.no_deterministic, grad_sync=args.grad_sync,
                      check_reference=args.check, save_grads=args.check, pair_exec=plan.get("pair_exec"),
                      pair_order=list(plan["pair_order"]["template"])
                      if plan.get("pair_order") and plan["pair_order"].get("used", True) else None,
                      plan_prediction={"predicted_s": plan["prediction"]["iteration_s"],
                                       "stage_f_s": plan["prediction"]["stage_f_s"],
                                       "stage_b_s": plan["prediction"]["stage_b_s"],
                                       "bubble_s": plan["prediction"].get("bubble_s"),
                                       "ep_a2a_s": plan["prediction"].get("ep_a2a_s"),
                                       "cpu_per_step_s": plan["prediction"].get("cpu_per_step_s"),
                                       "costs": plan["costs"]["source"], "predicted_at": plan.get("predicted_at")})
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"runner plan lacks field {exc}") from None
    return world, job


def format_dispatch(d: dict | None) -> list[str]:
    """Lines naming a job's EP dispatch (``job["ep_dispatch"]``, :func:`tessera_lab.runner.runtime.moe.dispatch_summary`):
    the mode used and why, and in capacity mode the padding figures per rank and MoE call (computed)."""
    if not d:
        return []
    lines = [f"EP dispatch: {d['mode']} ({d['reason']})"]
    if d["mode"] == "capacity":
        lines.append(f"capacity padding (computed from the config, per rank and MoE layer call of {d['tokens_per_group']} "
                     f"tokens): {d['rows_sent']} rows sent ({d['capacity_per_destination']} per destination) vs "
                     f"{d['rows_routed']} rows routed (tokens x top-k); experts compute {d['expert_rows']} rows "
                     f"({d['capacity_per_expert']} per expert and source rank), padding factor {d['padding_factor']:.2f}x"
                     + (f"; observed {d['rows_kept_observed']:.1f} rows kept on average (router's capacity rule)"
                        if d.get("rows_kept_observed") is not None else ""))
    return lines


#: exit status of ``run --check`` when the run differs from the reference beyond the check's rule
EXIT_CHECK_FAILED = 4


def _loss_equal(loss: float, ref: float, tol: dict | None) -> str:
    if loss == ref:
        return "bitwise"
    d = abs(loss - ref)
    if tol is None:
        return f"{d:.2e}"
    ok = d <= tol["losses"]["atol"] + tol["losses"]["rtol"] * abs(ref)
    return f"{d:.2e} ({'allclose' if ok else 'BEYOND tolerance'})"


def _check_line(ref: dict) -> str:
    """The ``--check`` verdict: its rule (bitwise on CPU; allclose with the stated tolerance on CUDA) and result."""
    if ref.get("mode") == "allclose":
        t = ref["tolerance"]
        rule = (f"allclose |run - ref| <= atol + rtol |ref| (losses rtol {t['losses']['rtol']:g} atol "
                f"{t['losses']['atol']:g}; gradients rtol {t['grads']['rtol']:g} atol {t['grads']['atol']:g}; an "
                "assumed fp32 bound, not yet calibrated on a GPU)")
    else:
        rule = "bitwise (CPU, same decomposition as the run)"
    return (f"check: {'passed' if ref.get('passed') else 'FAILED'}, rule {rule}, against the CPU reference with "
            f"EP dispatch {ref.get('dispatch', '?')}")


def _steps_text(steps: int) -> str:
    """Which steps the observed tokens/s is the median over: ``median step wall of steps 1-2; step 0 (warm-up)
    left out``, or of the only step (:func:`~tessera_lab.runner.launch.results._observed_steps`' rule)."""
    if steps <= 1:
        return "wall of the only step, step 0, warm-up included"
    span = "step 1" if steps == 2 else f"steps 1-{steps - 1}"
    return f"median step wall of {span}; step 0 (warm-up) left out"


def format_result(result: RunResult) -> str:
    """Readable summary: losses per step (and the reference), then predicted vs observed per stage."""
    from tessera_lab.textable import simple_table

    lines = []
    for job in result.jobs:
        w = job["world"]
        lines.append(f"job {job['name']}: schedule {job['schedule']}, pp={w['pp']} ep={w['ep']} dp={w['dp']} "
                     f"({result.backend}, p2p {w.get('p2p', 'auto')}), boundaries {job['boundaries']}, {job['tokens_per_step']} tokens/step, "
                     f"{job['tokens_per_s']:.0f} tokens/s observed ({_steps_text(len(job['step_times_s']))})")
        lines.extend(format_dispatch(job.get("ep_dispatch")))
        has_pairs = any("OVERLAP_F_B" in a for acts in (job.get("actions") or {}).values() for a in acts)
        if job.get("pair_exec") and has_pairs:
            pe = job["pair_exec"]
            lines.append(f"overlapped pairs: {pe['handler']}" + (f", order {pe['order_label']}: "
                                                                 f"{' '.join(pe['template'])}" if pe["node_level"] else ""))
        ref = job.get("reference")
        rows = []
        for s, loss in enumerate(job["losses"]):
            row = {"step": s, "loss": f"{loss:.9f}", "step wall (ms)": job["step_times_s"][s] * 1e3}
            if ref:
                row["reference"] = f"{ref['reference_losses'][s]:.9f}"
                row["equal"] = _loss_equal(loss, ref["reference_losses"][s], ref.get("tolerance"))
            rows.append(row)
        text_rows = [{k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
        lines.append(simple_table(text_rows, disable_numparse=True))
        if ref and "grads_bitwise_equal" in ref:
            lines.append(f"gradients of step 0 against the reference ({ref['grads_compared']} parameters): "
                         + ("bitwise equal" if ref["grads_bitwise_equal"]
                            else f"differ, max |diff| {ref['grads_max_abs_diff']:.2e}"
                            + ("" if not ref.get("tolerance") else
                               (", within" if ref.get("grads_within") else ", BEYOND") + " allclose(rtol "
                               f"{ref['tolerance']['grads']['rtol']:g}, atol {ref['tolerance']['grads']['atol']:g})")))
        if ref:
            lines.append(_check_line(ref))
        t = job["timing"]
        srows = []
        for r in t["stages"]:
            srows.append({k.replace("_s", " (ms)") if k.endswith("_s") else k: (v * 1e3 if k.endswith("_s") else v)
                          for k, v in r.items()})
        lines.append("step wall: the slowest rank's whole step (pipeline, gradient sync, optimizer); pipeline time: "
                     "the last compute action's end in the step")
        lines.append("in-sample check, per stage: this run's own median action times (observed) replayed by the "
                     "simulator (not a prediction; its 'predicted_*' columns are that replay"
                     + ("; the plan's prediction, made before the run, is the line after):" if job.get("plan_vs_observed")
                        else "):"))
        lines.append(simple_table(srows, floatfmt=".3f"))
        pv = job.get("plan_vs_observed")
        if pv:
            lines.append(f"plan ({pv['costs']}, predicted {pv['predicted_at']}, before the run): iteration "
                         f"{pv['predicted_s'] * 1e3:.3f} ms; observed pipeline time {pv['observed_s'] * 1e3:.3f} ms (median of steps "
                         f"{pv['steps']}, spread {pv['observed_q1_s'] * 1e3:.3f}-{pv['observed_q3_s'] * 1e3:.3f} ms); "
                         f"error {pv['error'] * 100:+.1f}%")
        cpu = job.get("cpu")
        if cpu:
            pc = ((job.get("spec") or {}).get("plan_prediction") or {}).get("cpu_per_step_s")
            lines.append("CPU of a step's actions over all processes: "
                         + (f"predicted {pc * 1e3:.1f} ms (plan), " if pc else "")
                         + f"observed {cpu['actions_s'] * 1e3:.1f} ms (workers' process CPU time, median of steps "
                           f"{cpu['steps']}; gradient sync + optimizer {cpu['sync_opt_s'] * 1e3:.1f} ms more)")
        pm = job.get("peak_memory")
        if pm:
            pred = pm["predicted_bytes"]
            lines.append(f"peak memory per rank (MiB), observed ({pm['observed']}): "
                         + ", ".join(f"{b / 2**20:.1f}" for b in pm["observed_bytes"])
                         + ("; predicted (" + pm["predicted"] + "): " + ", ".join(f"{b / 2**20:.1f}" for b in pred)
                            if pred else "; predicted: none (no memory formula for this schedule)"))
        it = t["iteration"]
        lines.append(f"in-sample replay of the iteration: simulated {it['predicted_s'] * 1e3:.3f} ms from this run's own "
                     f"action times, observed {it['observed_s'] * 1e3:.3f} ms "
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
            print(f"run result: {args.json}", file=sys.stderr)
    if getattr(args, "trace", None):
        write_trace(result.jobs[0], args.trace)
        print(f"trace: {args.trace}", file=sys.stderr)
    if getattr(args, "profile_store", None):
        record_profile(args.profile_store, result)
        print(f"profile store: {args.profile_store}", file=sys.stderr)


def run_from_args(args: argparse.Namespace) -> int:
    """``tessera-lab run``: spawn locally, print, write outputs. Returns the exit status: 0, 2 bad input,
    3 (:data:`~tessera_lab.runner.launch.supervise.EXIT_PEER_FAILED`) a rank failed and its peers were shut down,
    1 the launch timed out, 4 (:data:`EXIT_CHECK_FAILED`) ``--check`` failed."""
    from .supervise import EXIT_PEER_FAILED

    world, job = specs_from_args(args)
    from tessera_lab.runner.runtime.devtime import sync_debug_mode

    try:  # read by every worker at each step: refused here, before any process starts
        sync_debug_mode()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if getattr(args, "dynamic", False):
        return _run_dynamic(world, job, args)
    if getattr(args, "profile_store", None):  # refuse a bad store before the run, not after it
        from .results import check_profile_store

        check_profile_store(args.profile_store)
    try:
        result = spawn(world, [job], out_dir=args.out, timeout_s=args.timeout, keep=False)
    except RunnerError as exc:
        print(f"tessera-lab run: error: {exc}", file=sys.stderr)
        return EXIT_PEER_FAILED if getattr(exc, "peer_failed", False) else 1
    emit_outputs(result, args)
    failed = [j["name"] for j in result.jobs if (j.get("reference") or {}).get("passed") is False]
    if failed:
        print(f"tessera-lab run: --check failed for job {', '.join(failed)}: the run differs from the reference "
              "beyond the check's rule (see 'check:' above)", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return 0


def _run_dynamic(world: WorldSpec, job: RunSpec, args: argparse.Namespace) -> int:
    """``run --dynamic``: interleaved static/dynamic trials in one launch (:mod:`.dynamic_report`)."""
    from tessera_lab.io import write_json

    from .dynamic_report import dynamic_jobs, dynamic_report, format_dynamic
    from .supervise import EXIT_PEER_FAILED

    if args.trace or args.profile_store:
        raise ConfigError("--trace and --profile-store are not available with --dynamic; run without --dynamic")
    jobs = dynamic_jobs(job, args.trials)
    for j in jobs:
        j.validate(world)
    try:
        result = spawn(world, jobs, out_dir=args.out, timeout_s=args.timeout, keep=False)
    except RunnerError as exc:
        print(f"tessera-lab run: error: {exc}", file=sys.stderr)
        return EXIT_PEER_FAILED if getattr(exc, "peer_failed", False) else 1
    rep = dynamic_report(result.jobs, args.trials, args.routing, world)
    for name in ("static-0", "dynamic-0"):
        ref = result.job(name).get("reference")
        if ref:
            rep.setdefault("reference", {})[name] = {
                "losses_bitwise_equal": result.job(name)["losses"] == ref["reference_losses"],
                "grads_bitwise_equal": ref.get("grads_bitwise_equal")}
    if args.json == "-":
        write_json("-", rep)
    else:
        print(format_dynamic(rep))
        if args.json:
            write_json(args.json, rep)
    return 0


def torchrun_worker(args: argparse.Namespace) -> int:
    """One rank of a job launched by torchrun: the job of ``tessera-lab run`` with the same options, its rank and
    world size from torchrun's ``RANK`` / ``WORLD_SIZE`` (rendezvous through ``MASTER_ADDR`` / ``MASTER_PORT``),
    its GPU from ``LOCAL_RANK`` (NCCL; gloo on CPU); rank 0 prints the summary and writes the outputs. Returns 0;
    raises what failed (:func:`main` runs it under torchelastic's ``record``, which writes the exception to
    ``$TORCHELASTIC_ERROR_FILE`` for the agent to report as the root cause).

    Raises:
        ConfigError: bad options, or ``WORLD_SIZE != pp * ep * dp``, before any process group exists.
    """
    world, job = specs_from_args(args)
    _watch_parent()  # torchrun's agent: a worker whose agent dies exits
    res = run_worker(world, [job], args.out)
    if res is not None:
        emit_outputs(res, args)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and exit status 2 (the CLI's contract, for the runner entry)."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tessera_lab.runner``: a worker under torchrun (``RANK`` set), else the local spawner."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in argv:
        p = _Parser(prog="tessera_lab.runner --worker")
        p.add_argument("--worker", action="store_true")
        p.add_argument("--spec", required=True)
        p.add_argument("--out", default=None)
        a = p.parse_args(argv)
        return worker_main(a.spec, a.out)
    p = _Parser(prog="python -m tessera_lab.runner",
                                description="Run the tiny MoE model with pipeline and expert parallelism.")
    add_run_arguments(p)
    args = p.parse_args(argv)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        if under_torchrun:
            from torch.distributed.elastic.multiprocessing.errors import record

            return record(torchrun_worker)(args)
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
