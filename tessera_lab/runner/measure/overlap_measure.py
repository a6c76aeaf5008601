"""The ``cpu`` and ``cuda`` overlap backends of ``tessera-lab measure``: layer-kind pairs measured with the
runner's own node-level pair executor (:mod:`tessera_lab.runner.runtime.nodes`, the ``scheduled`` handler's issue
loop) on a real EP group of ``ep`` spawned processes (gloo on CPU, NCCL on GPUs), so what is measured is what
runs.

For every ordered pair of layer kinds ``(kind_f, kind_b)`` of a model (the rows of the overlap table), the
forward of a ``kind_f`` runner layer for micro-batch 1 is paired with the full backward (B with W) of a
``kind_b`` runner layer for micro-batch 0. The runner layers are built at the model's shapes scaled by the
size factor ``f`` (:func:`runner_config_for`: widths and sequence length times ``f``, head and expert counts
and top-k kept; the runner's linear attention uses the full-attention head counts and has no short
convolution, which the metadata says). Steps per pair, on every rank of the EP group:

1. each side alone, ``warmup + repeats`` times: per-node times from the runner's events (the ten template keys
   of :mod:`tessera_lab.runner.runtime.orders`, lanes and dependencies of :func:`~tessera_lab.runner.runtime.orders.template_graph`);
2. program order together ``warmup + repeats`` times; rank 0 fits the contention term over every pair measured
   so far (:func:`tessera_lab.overlap.fit.fit_contention_samples`), then picks the candidates: program order,
   Megatron-Core's combined-1F1B order, and the best templates of an exhaustive search (CPU: the host-issue
   semantics :func:`~tessera_lab.runner.runtime.orders.host_issue_makespan`; CUDA: the two-lane model with the fitted
   contention), at least ``keep`` (>= 4) distinct orders;
3. successive halving (:func:`tessera_lab.overlap.backends.halve`) until two remain; a challenger wins only when
   its upper quartile is below program order's lower quartile, else "not significant" keeps program order
   (:func:`tessera_lab.overlap.results.assemble_measured`'s rule).

Results are :class:`~tessera_lab.overlap.results.OverlapResult` objects (``backend`` ``cpu`` or ``cuda``) with
the per-node durations, lanes, dependencies, every candidate's samples and the decision, so the profile can
be refitted from its file (:func:`tessera_lab.overlap.profiles.refit`). Seconds throughout.
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tessera_lab.errors import ConfigError

__all__ = ["runner_config_for", "measure_layer_pairs", "MIXERS"]

#: the layer kinds the runner builds (``mixer+ffn``); its FFN is always MoE
MIXERS = ("linear_attention", "full_attention")


def _scaled(x: int, f: float) -> int:
    return max(1, int(round(x * f)))


def runner_config_for(model, size_factor: float, seq_len: int) -> dict[str, Any]:
    """The :class:`~tessera_lab.runner.runtime.specs.TinyConfig` fields (a dict) of four runner layers ``[linear, full,
    linear, full]`` at ``model``'s shapes times ``size_factor`` (hidden, head and expert widths, sequence
    length ``seq_len``; head counts, experts and top-k kept).

    Raises:
        ConfigError: the model has a layer kind the runner cannot build (a dense FFN).
    """
    from tessera_lab.model.spec import MOE

    bad = sorted({layer.kind for layer in model.layers if layer.ffn != MOE})
    if bad:
        raise ConfigError(f"model {model.name}: layer kind(s) {bad} have a dense FFN, which the runner's executor "
                          f"does not build; allowed for --backend cpu/cuda: MoE layers (use --backend analytic)")
    f = size_factor
    seq = _scaled(seq_len, f)
    return {"vocab_size": 64, "hidden_size": _scaled(model.hidden_size, f), "num_layers": 4, "attention_ratio": 1,
            "num_heads": model.num_attention_heads, "head_dim": _scaled(model.head_dim, f),
            "num_kv_heads": model.num_key_value_heads, "num_experts": model.num_experts,
            "top_k": model.num_experts_per_tok, "expert_width": _scaled(model.moe_intermediate_size, f),
            "shared_expert_width": (_scaled(model.shared_expert_intermediate_size, f)
                                    if model.shared_expert_intermediate_size else 0),
            "seq_len": seq, "linear_chunk": min(64, seq)}


def _candidates(dur: dict, fit, cuda: bool, keep: int) -> list[tuple[str, ...]]:
    """Program order, Megatron's order, then the searched templates, distinct, at least ``keep``."""
    from tessera_lab.cost.analytic import two_lane_makespan

    from ..runtime.orders import NAMED_ORDERS, TEMPLATE_KEYS, all_templates, host_issue_makespan, template_graph

    g = template_graph()
    if cuda and fit is not None:
        def score(o):
            return two_lane_makespan(o, dur, g.lanes, g.deps, fit.contention).makespan
    else:
        def score(o):
            return host_issue_makespan(o, dur, graph=g)
    ranked = sorted(all_templates(), key=score)  # stable: program order first among ties
    out = [tuple(TEMPLATE_KEYS), tuple(NAMED_ORDERS["megatron"])]
    for o in ranked:
        if len(out) >= max(4, keep):
            break
        if o not in out:
            out.append(o)
    return out


def _worker(rank: int, ep: int, store: str, jobs: list, cfg_d: dict, mbs: int, repeats: int, warmup: int,
            keep: int, cuda: bool, timeout_s: float, q) -> None:
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}", rank=rank, world_size=ep,
                                timeout=_dt.timedelta(seconds=max(30.0, timeout_s)))
        try:
            out = _measure(rank, ep, jobs, cfg_d, mbs, repeats, warmup, keep, device, cuda)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        if rank == 0:
            q.put(("result", out))
    except BaseException:  # noqa: BLE001 - sent to the parent
        import traceback

        q.put(("error", rank, traceback.format_exc()))
        raise


def _measure(rank, ep, jobs, cfg_d, mbs, repeats, warmup, keep, device, cuda) -> list[dict]:
    import torch
    import torch.distributed as dist

    from tessera_lab.overlap.backends import FIT_STEP, halve
    from tessera_lab.overlap.fit import fit_contention_samples

    from ..runtime.devtime import StepClock
    from ..runtime.moe import ExpertParallelComm
    from ..runtime.nodes import StageProgram
    from ..runtime.orders import TEMPLATE_KEYS, durations_from_events, template_graph
    from ..runtime.pairs import interleave
    from ..runtime.specs import TinyConfig, WorldSpec
    from ..runtime.topology import build_stages, build_topology

    cfg = TinyConfig.from_dict(cfg_d)
    topo = build_topology(WorldSpec(pp=1, ep=ep), rank, device)
    comm = ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, ep, rank, cfg.num_experts) if ep > 1 else None
    # four one-layer stages [linear, full, linear, full]; the middle two (no embedding, no head) are measured
    _, stages = build_stages(cfg, [0, 1, 2, 3, 4], [1, 2], 4, comm.local_experts if comm else None)
    for st in stages.values():
        st.comm = comm
        st.to(device)
    stage_of = {"full_attention": stages[1], "linear_attention": stages[2]}
    gen = torch.Generator().manual_seed(1234 + rank)
    shape = (mbs, cfg.seq_len, cfg.hidden_size)
    x_in = [torch.randn(shape, generator=gen).to(device) for _ in range(2)]
    g_out = torch.randn(shape, generator=gen).to(device) * 1e-2
    raw: list[tuple] = []
    events: list[dict] = []
    graph = template_graph()
    # the runtime's clock: CUDA events on a GPU (the node stamps and the run's span), the host clock on CPU
    step_clock = StepClock(device)
    comm_stream = torch.cuda.Stream(device) if cuda else None

    def record(lane, typ, label, s, e):
        raw.append((lane, typ, 0, None, s, e, label))

    def prog(st, i):
        p = StageProgram(st, i, comm, record, step_clock.now)
        p.comm_stream = comm_stream
        p.begin(x_in[i].detach().requires_grad_(True))
        return p

    def timed(fn) -> float:
        """Seconds of ``fn``'s work: between two stamps of the runtime's clock; ``events`` gets its node events."""
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()
        raw.clear()
        step_clock.start(time.perf_counter())
        fn()
        end = step_clock.now()
        resolved = step_clock.resolve(raw + [("span", "", 0, None, end, end, "")])
        events.clear()
        events.extend({"lane": ln, "type": ty, "label": lb, "start": a, "end": b} for ln, ty, _, _, a, b, lb in resolved
                      if ln != "span")
        return resolved[-1][5]

    def fwd(p):
        p.run_forward()

    def bwd(p):
        p.run_backward(g_out)

    def broadcast(obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    results, fit_samples = [], []
    for ji, (kind_f, kind_b) in enumerate(jobs):
        sf, sb = stage_of[kind_f.split("+")[0]], stage_of[kind_b.split("+")[0]]
        alone_f, alone_b, dur_runs = [], [], []
        for r in range(warmup + repeats):
            pb = prog(sb, 0)
            fwd(pb)
            pf = prog(sf, 1)
            tf = timed(lambda: fwd(pf))
            d_evt = durations_from_events(events)
            tb = timed(lambda: bwd(pb))
            d_evt.update({k: v for k, v in durations_from_events(events).items() if k.startswith("b.")})
            bwd(pf)
            if r >= warmup:
                alone_f.append(tf)
                alone_b.append(tb)
                dur_runs.append(d_evt)
        dur = {k: statistics.median(d[k] for d in dur_runs) for k in TEMPLATE_KEYS}
        together: dict[int, list[dict]] = {}  # candidate -> per-run {key: seconds} and the a2a wait seconds

        def pair_once(order, cand: int | None = None) -> float:
            pb = prog(sb, 0)
            fwd(pb)
            pf = prog(sf, 1)
            pb.begin_backward(g_out)
            seq = interleave(pf.fwd_keys, pf.order, pb.bwd_keys, pb.order, order)

            def run():
                for side, key in seq:
                    (pf.forward if side == "f" else pb.backward)(key)

            t = timed(run)
            if cand is not None:
                d = durations_from_events(events)
                d["a2a_wait"] = sum(e["end"] - e["start"] for e in events  # dispatch/combine waits (not counts)
                                    if e["lane"] == "wait" and ".counts[" not in e["label"])
                together.setdefault(cand, []).append(d)
            bwd(pf)
            return t

        prog_samples = []
        for r in range(warmup + repeats):
            t = pair_once(TEMPLATE_KEYS, 0 if r >= warmup else None)
            if r >= warmup:
                prog_samples.append(t)
        payload = None
        if rank == 0:
            fit_samples.append({"order": list(TEMPLATE_KEYS), "durations": dict(dur), "lanes": dict(graph.lanes),
                                "deps": {k: list(v) for k, v in graph.deps.items()},
                                "t_ab": statistics.median(prog_samples)})
            fit = fit_contention_samples(fit_samples, step=FIT_STEP)
            payload = ([list(o) for o in _candidates(dur, fit, cuda, keep)], fit.as_dict())
        cands_l, fit_d = broadcast(payload)
        cands = [tuple(o) for o in cands_l]
        samples: dict[int, list[float]] = {0: list(prog_samples), **{i: [] for i in range(1, len(cands))}}
        alive, n_rep, halving, first = list(range(len(cands))), repeats, [], True
        while True:
            for r in range(n_rep + (warmup if first else 0)):
                for i in alive:
                    if i == 0 and first:
                        continue  # program order already has its first `repeats` samples
                    keep_it = not first or r >= warmup
                    t = pair_once(cands[i], i if keep_it else None)
                    if keep_it:
                        samples[i].append(t)
            first = False
            if len(alive) <= 2:
                break
            nxt = None
            if rank == 0:
                med = {i: statistics.median(samples[i]) for i in alive}
                nxt = halve(alive, med)
                halving.append({"repeats": n_rep, "alive": list(alive), "medians": [med[i] for i in alive],
                                "kept": nxt})
            alive = broadcast(nxt)
            n_rep *= 2
        tog = {i: {k: statistics.median(d[k] for d in runs) for k in list(TEMPLATE_KEYS) + ["a2a_wait"]}
               for i, runs in together.items()}
        results.append({"kind_f": kind_f, "kind_b": kind_b, "durations": dur, "t_f": alone_f, "t_b": alone_b,
                        "together": tog,
                        "candidates": [{"order": list(o), "samples": samples[i]} for i, o in enumerate(cands)],
                        "halving": halving, "fit": fit_d})
    return results


def _result(r: dict, backend: str, env: dict, meta_common: dict):
    """An :class:`~tessera_lab.overlap.results.OverlapResult` from one measured pair (rank 0's dict)."""
    from tessera_lab.overlap.results import OverlapResult, overlap_efficiency, spread_stats
    from tessera_lab.overlap.search import ScheduleResult

    from ..runtime.orders import template_graph

    g = template_graph()
    stats = [spread_stats(c["samples"]) for c in r["candidates"]]
    most = max(s["n"] for s in stats)
    finalists = [i for i, s in enumerate(stats) if s["n"] == most]
    ch = min(finalists, key=lambda i: (stats[i]["median"], i))
    sig = ch != 0 and stats[ch]["q3"] < stats[0]["q1"]
    best = ch if sig else 0
    verdict = "significant" if sig else ("not significant" if ch != 0 else "program order is fastest")
    decision = {"verdict": verdict, "chosen": best, "challenger": ch,
                "program": {k: stats[0][k] for k in ("median", "q1", "q3", "n")},
                "challenger_stats": {k: stats[ch][k] for k in ("median", "q1", "q3", "n")},
                "rule": "challenger q3 < program q1 (quartiles separated)"}
    ta, tb = spread_stats(r["t_f"]), spread_stats(r["t_b"])
    orders = [tuple(c["order"]) for c in r["candidates"]]
    dur = r["durations"]
    tog = {int(k): v for k, v in r.get("together", {}).items()}.get(best, {})
    # measured: per-node time in the chosen order's runs over its time alone (nodes that take no time alone,
    # e.g. all-to-alls with EP 1, have no ratio and are left out)
    inflation = {k: tog[k] / v for k, v in dur.items() if v > 0 and k in tog}
    # measured: the share of the all-to-all time (alone) the compute did not wait for in the chosen order's runs
    comm_t = sum(v for k, v in dur.items() if g.lanes[k] == "comm")
    hidden = max(0.0, min(1.0, 1.0 - tog.get("a2a_wait", comm_t) / comm_t)) if comm_t > 0 else 0.0
    derived = {"gain": "t_f + t_b - t_pair (medians, seconds)",
               "efficiency": "gain / min(t_f, t_b)",
               "inflation": "median node time in the chosen order's pair runs / median node time alone (runner events)",
               "comm_hidden_fraction": ("1 - median all-to-all wait of the compute in the chosen order's pair runs / "
                                        "sum of the all-to-all times alone (runner events); 0 without communication")}
    meta = {**env, **meta_common, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "derived_fields": derived,
            "communication": "EP all-to-all" if comm_t > 0 else "none (EP 1: no all-to-all in this pair)",
            "candidates_measured": len(orders), "best_candidate": best,
            "candidate_medians": [s["median"] for s in stats],
            "candidates": r["candidates"],
            "search": {"orders_measured": len(orders), "halving": r["halving"], "fit": r["fit"],
                       "decision": decision, "method": "runner node-level executor (issue order of the ten "
                                                       "template keys)"}}
    sched = ScheduleResult(orders[best], stats[best]["median"], orders[0], stats[0]["median"],
                           ta["median"] + tb["median"], sum(dur.values()), ta["median"], tb["median"],
                           f"exhaustive template search, {len(orders)} orders measured", 252, 252,
                           sorted(((s["median"], o) for s, o in zip(stats, orders)), key=lambda x: x[0]), backend)
    t_ab = stats[best]["median"]
    return OverlapResult(f"F[{r['kind_f']}]", f"BW[{r['kind_b']}]", r["kind_f"], r["kind_b"], "F", "BW",
                         ta["median"], tb["median"], t_ab, stats[0]["median"], inflation, hidden,
                         overlap_efficiency(ta["median"], tb["median"], t_ab), backend, orders[best],
                         {"t_a": ta, "t_b": tb, "t_ab": stats[best], "t_program": stats[0]}, dict(dur),
                         dict(g.lanes), {k: tuple(v) for k, v in g.deps.items()}, meta, sched)


def measure_layer_pairs(model, parallel, backend: str = "cpu", *, size_factor: float = 0.125, repeats: int = 3,
                        warmup: int = 1, keep: int = 4, timeout_s: float = 600.0, progress=None) -> list:
    """Measure the overlap table's pairs of ``model`` with the runner's executor (module docstring).

    Args:
        model: a :class:`~tessera_lab.model.spec.ModelSpec` with MoE layers; parallel: its
            :class:`~tessera_lab.model.hardware.ParallelConfig` (``ep`` processes, 1..8; ``seq_len`` and
            ``micro_batch_size`` set the tokens per rank).
        backend: ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per process).
        size_factor: widths and sequence length multiplier in (0, 1]; repeats >= 1, warmup >= 0; keep: orders
            measured per pair (at least 4).

    Returns:
        one :class:`~tessera_lab.overlap.results.OverlapResult` per ordered pair of layer kinds.

    Raises:
        ConfigError: bad sizes or a model the runner cannot build; MeasurementError: a rank failed or the
        measurement ran past ``timeout_s``.
    """
    import queue as _queue

    import torch
    import torch.multiprocessing as mp

    from tessera_lab.overlap.bundles import MeasurementError
    from tessera_lab.overlap.environment import current_environment
    from tessera_lab.overlap.table import layer_kind_examples

    if backend not in ("cpu", "cuda"):
        raise ConfigError(f"field 'backend' = {backend!r} is unknown here; allowed: cpu, cuda")
    ep = parallel.ep
    if not 1 <= ep <= 8:
        raise ConfigError(f"field 'ep' = {ep} is out of range for the {backend} backend; allowed: 1..8 processes")
    if backend == "cuda" and torch.cuda.device_count() < ep:
        raise ConfigError(f"field 'ep' = {ep} needs {ep} GPUs; this machine has {torch.cuda.device_count()}")
    cfg = runner_config_for(model, size_factor, parallel.seq_len)
    if cfg["num_experts"] % ep:
        raise ConfigError(f"field 'ep' = {ep} must divide num_experts = {cfg['num_experts']}")
    kinds = list(layer_kind_examples(model))
    jobs = [(a, b) for a in kinds for b in kinds]
    env = current_environment(backend)
    load_before = round(os.getloadavg()[0], 2)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="tessera-overlap-runner-") as tmp:
        pc = mp.start_processes(_worker, args=(ep, str(Path(tmp) / "store"), jobs, cfg, parallel.micro_batch_size,
                                               repeats, warmup, keep, backend == "cuda", timeout_s, q),
                                nprocs=ep, start_method="spawn", join=False)
        deadline = time.monotonic() + timeout_s
        got = None
        try:
            while got is None:
                if time.monotonic() > deadline:
                    raise MeasurementError(f"{backend} measurement did not finish within timeout_s = {timeout_s:g} s; "
                                           f"lower repeats or size_factor, or raise the timeout")
                try:
                    msg = q.get(timeout=0.5)
                except _queue.Empty:
                    if any(p.exitcode not in (None, 0) for p in pc.processes):
                        time.sleep(0.5)
                        if q.empty():
                            raise MeasurementError("a measuring process died without a message") from None
                    continue
                if msg[0] == "error":
                    raise MeasurementError(f"measuring rank {msg[1]} failed: {msg[2].strip().splitlines()[-1]}")
                got = msg[1]
            pc.join(timeout=30)
        finally:
            for p in pc.processes:
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    common = {"backend": backend, "executor": "runner node-level pair executor (runner/runtime/nodes.py)",
              "dtype": "float32", "model_dtype": parallel.dtype,
              "shapes": {"runner_config": cfg, "tokens_per_rank": parallel.micro_batch_size * cfg["seq_len"],
                         "a": {"hidden": cfg["hidden_size"]}, "b": {"hidden": cfg["hidden_size"]}, "ep": ep},
              "repeats": repeats, "warmup": warmup, "spread": "iqr (q1, q3) and min/max over repeats",
              "size_factor": size_factor, "world_size": ep, "comm": "nccl" if backend == "cuda" else "gloo",
              "comm_proxy": None,
              "approximations": "runner layers: linear attention with the full-attention head counts, no short "
                                "convolution; fp32",
              "load_average_1m": {"before": load_before, "after": round(os.getloadavg()[0], 2)}}
    out = [_result(r, backend, env, common) for r in got]
    if progress:
        progress(len(out), len(out))
    return out
