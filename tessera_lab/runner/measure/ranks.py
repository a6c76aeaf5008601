"""What every rank of the measuring EP group runs (:mod:`tessera_lab.runner.measure.harness` spawns them): the
probe and sizing, then each pair alone, in program order and in the candidate orders with successive halving.
Rank 0 decides (plans, candidates, halving) and broadcasts; every rank runs the same collectives in the same
order. Seconds throughout (wall clock of the runtime's :class:`~tessera_lab.runner.runtime.devtime.StepClock`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

from .sizing import FIT_STEP, MIN_KEEP, halve, pair_rounds, plan_work, round_cost

__all__ = ["measure_rank"]


def _candidates(dur: dict, fit, cuda: bool, keep: int) -> list[tuple[str, ...]]:
    """Program order, Megatron's order, then the searched templates, ``keep`` (>= 2) distinct orders."""
    from tessera_lab.cost.lanes import pair_makespan

    from ..runtime.orders import NAMED_ORDERS, TEMPLATE_KEYS, all_templates, host_issue_makespan, template_graph

    g = template_graph()
    if cuda and fit is not None:
        def score(o):
            return pair_makespan(o, dur, g.lanes, g.deps, contention=fit.contention).makespan
    else:
        def score(o):
            return host_issue_makespan(o, dur, graph=g)
    ranked = sorted(all_templates(), key=score)  # stable: program order first among ties
    out = [tuple(TEMPLATE_KEYS), tuple(NAMED_ORDERS["megatron"])]
    for o in ranked:
        if len(out) >= keep:
            break
        if o not in out:
            out.append(o)
    return out[:max(MIN_KEEP, keep)]


def _name(i: int) -> str:
    return ("program", "megatron")[i] if i < 2 else f"searched #{i - 1}"


def measure_rank(rank: int, ep: int, jobs: list, ladder: list, mbs: int, opts: dict, device, cuda: bool,
                 say: Callable[[str], None]) -> dict:
    """Measure ``jobs`` (``(kind_f, kind_b)`` pairs) on this rank; rank 0's return value is the harness's
    result (``{"sizing": ..., "pairs": [...]}``), the other ranks' is the same shape."""
    import torch
    import torch.distributed as dist

    from tessera_lab.overlap.fit import fit_contention_samples

    from ..runtime.devtime import StepClock
    from ..runtime.moe import ExpertParallelComm
    from ..runtime.nodes import StageProgram
    from ..runtime.orders import TEMPLATE_KEYS, durations_from_events, template_graph
    from ..runtime.pairs import interleave
    from ..runtime.specs import TinyConfig, WorldSpec
    from ..runtime.topology import build_stages, build_topology

    topo = build_topology(WorldSpec(pp=1, ep=ep), rank, device)
    n_exp = ladder[0][1]["num_experts"]
    comm = ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, ep, rank, n_exp) if ep > 1 else None
    raw: list[tuple] = []
    events: list[dict] = []
    graph = template_graph()
    # the runtime's clock: CUDA events on a GPU (the node stamps and the run's span), the host clock on CPU
    step_clock = StepClock(device)
    comm_stream = torch.cuda.Stream(device) if cuda else None
    bench: dict = {}

    def build(cfg_d: dict) -> None:
        """Four one-layer stages [linear, full, linear, full]; the middle two (no embedding, no head) are measured."""
        cfg = TinyConfig.from_dict(cfg_d)
        _, stages = build_stages(cfg, [0, 1, 2, 3, 4], [1, 2], 4, comm.local_experts if comm else None)
        for st in stages.values():
            st.comm = comm
            st.to(device)
        gen = torch.Generator().manual_seed(1234 + rank)
        shape = (mbs, cfg.seq_len, cfg.hidden_size)
        bench.clear()
        bench.update(stage_of={"full_attention": stages[1], "linear_attention": stages[2]},
                     x_in=[torch.randn(shape, generator=gen).to(device) for _ in range(2)],
                     g_out=torch.randn(shape, generator=gen).to(device) * 1e-2)

    def record(lane, typ, label, s, e):
        raw.append((lane, typ, 0, None, s, e, label))

    def prog(st, i):
        p = StageProgram(st, i, comm, record, step_clock.now)
        p.comm_stream = comm_stream
        p.begin(bench["x_in"][i].detach().requires_grad_(True))
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
        p.run_backward(bench["g_out"])

    def broadcast(obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    budget = opts["budget_s"]
    reserve = min(10.0, 0.05 * budget) if budget else 0.0  # teardown and writing the profile

    def left() -> float:
        return opts["t_start"] + budget - reserve - time.time() if budget else math.inf

    fixed = frozenset(opts["fixed"])
    kinds = sorted({k for job in jobs for k in job})

    def mixer(kind: str) -> str:
        return kind.split("+")[0]

    # ---- 0. probe and sizing: the size factor is halved (and probed again) only when even the fewest repeats
    # and candidate orders do not fit the time left
    probes, reductions, li = [], [], 0
    while True:
        f, cfg_d = ladder[li]
        build(cfg_d)
        tp0 = time.time()
        fw, bw = {}, {}
        for k in kinds:
            st = bench["stage_of"][mixer(k)]
            p = prog(st, 0)  # untimed: first-touch allocations
            fwd(p)
            bwd(p)
            p = prog(st, 0)
            fw[k] = timed(lambda: fwd(p))
            bw[k] = timed(lambda: bwd(p))
        payload = None
        if rank == 0:
            costs = [round_cost(fw, bw, kf, kb) for kf, kb in jobs]
            plan = plan_work(costs, left(), repeats=opts["repeats"], warmup=opts["warmup"], keep=opts["keep"],
                             fixed=fixed)
            smaller = not plan.fits and li + 1 < len(ladder)
            probe = {"size_factor": f, "fwd_s": fw, "bwd_s": bw, "probe_wall_s": round(time.time() - tp0, 3),
                     "round_s": costs, "seconds_left": round(left(), 2) if budget else None, "plan": plan.as_dict()}
            say(f"probe at size factor {f:g}: " + ", ".join(f"{k} F {fw[k] * 1e3:.1f} ms, B+W {bw[k] * 1e3:.1f} ms"
                                                          for k in kinds)
                + f"; plan: repeats {plan.repeats}, {plan.keep} orders per pair, about {plan.estimate_s:.0f} s"
                + (f" of {left():.0f} s left" if budget else "")
                + ("" if plan.fits or not budget else (" -- does not fit: halving the size factor" if smaller
                                                       else " -- does not fit even so: going on, over the budget")))
            payload = (probe, plan.as_dict(), smaller)
        probe, plan_d, smaller = broadcast(payload)
        probes.append(probe)
        if not smaller:
            break
        reductions.append(f"size factor {ladder[li][0]:g} -> {ladder[li + 1][0]:g}")
        li += 1
    reductions += plan_d["reductions"]
    costs = [round_cost(probe["fwd_s"], probe["bwd_s"], kf, kb) for kf, kb in jobs]
    # reductions: work made smaller to fit (fewer repeats or orders, a smaller size factor); skipped: work planned
    # and then not run (a halving round cut at the pair's share of the budget); over_budget: the plan did not fit
    skipped: list[str] = []
    over_budget = (f"the smallest plan needs about {plan_d['estimate_s']:.0f} s"
                   if budget and not plan_d["fits"] else None)

    results, fit_samples = [], []
    spent_wall, spent_est = 0.0, 0.0  # measured seconds vs the probe's estimate for them (corrects later plans)
    for ji, (kind_f, kind_b) in enumerate(jobs):
        t_pair0 = time.time()
        sf, sb = bench["stage_of"][mixer(kind_f)], bench["stage_of"][mixer(kind_b)]
        payload = None
        if rank == 0:
            scale = min(4.0, max(0.5, spent_wall / spent_est)) if spent_est > 0 else 1.0
            rest = [c * scale for c in costs[ji:]]
            pp = plan_work(rest, left(), repeats=plan_d["repeats"], warmup=plan_d["warmup"], keep=plan_d["keep"],
                           fixed=fixed)
            share = left() * rest[0] / sum(rest) if budget else math.inf
            payload = {"repeats": pp.repeats, "warmup": pp.warmup, "keep": pp.keep, "scale": round(scale, 3),
                       "estimate_s": round(rest[0] * pair_rounds(pp.keep, pp.repeats, pp.warmup), 2),
                       "share_s": round(share, 2) if budget else None, "halving_cut": None}
            say(f"pair {ji + 1}/{len(jobs)}: F[{kind_f}] + BW[{kind_b}]: repeats {pp.repeats}, {pp.keep} orders, "
                f"about {payload['estimate_s']:.0f} s")
            if pp.repeats < plan_d["repeats"] or pp.keep < plan_d["keep"]:
                reductions.append(f"pair {ji + 1}: behind the plan, measured with repeats {pp.repeats} and "
                                  f"{pp.keep} orders")
        pplan = broadcast(payload)
        repeats, warmup, keep = pplan["repeats"], pplan["warmup"], pplan["keep"]
        rounds = 0
        alone_f, alone_b, dur_runs = [], [], []
        for r in range(warmup + repeats):
            pb = prog(sb, 0)
            fwd(pb)
            pf = prog(sf, 1)
            tf = timed(lambda: fwd(pf))
            d_evt = durations_from_events(events)
            tb = timed(lambda: bwd(pb))
            d_evt.update({k: v for k, v in durations_from_events(events).items() if k.startswith("b.")})
            del pf  # its backward is not needed: dropping the graph frees it
            rounds += 1
            if r >= warmup:
                alone_f.append(tf)
                alone_b.append(tb)
                dur_runs.append(d_evt)
        dur = {k: statistics.median(d[k] for d in dur_runs) for k in TEMPLATE_KEYS}
        say(f"  alone: F {statistics.median(alone_f) * 1e3:.1f} ms, B+W {statistics.median(alone_b) * 1e3:.1f} ms "
            f"(medians of {repeats})")
        together: dict[int, list[dict]] = {}  # candidate -> per-run {key: seconds} and the a2a wait seconds

        def pair_once(order, cand: int | None = None) -> float:
            pb = prog(sb, 0)
            fwd(pb)
            pf = prog(sf, 1)
            pb.begin_backward(bench["g_out"])
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
            return t

        prog_samples = []
        for r in range(warmup + repeats):
            t = pair_once(TEMPLATE_KEYS, 0 if r >= warmup else None)
            rounds += 1
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
                for i in alive:  # interleaved, so drift affects every candidate alike
                    if i == 0 and first:
                        continue  # program order already has its first `repeats` samples
                    keep_it = not first or r >= warmup
                    t = pair_once(cands[i], i if keep_it else None)
                    rounds += 1
                    if keep_it:
                        samples[i].append(t)
            say("  " + "; ".join(f"order {i + 1}/{len(cands)} {_name(i)}: median {statistics.median(samples[i]) * 1e3:.1f} "
                                 f"ms ({len(samples[i])} runs)" for i in alive))
            first = False
            if len(alive) <= 2:
                break
            nxt = None
            if rank == 0:
                med = {i: statistics.median(samples[i]) for i in alive}
                kept = halve(alive, med)
                halving.append({"repeats": n_rep * 2, "alive": list(alive), "medians": [med[i] for i in alive],
                                "kept": kept})
                next_s = len(kept) * n_rep * 2 * costs[ji] * pplan["scale"]
                spent = time.time() - t_pair0
                if budget and spent + next_s > pplan["share_s"]:
                    pplan["halving_cut"] = (f"halving stopped before the round of {len(kept)} orders x {n_rep * 2} "
                                            f"runs: about {next_s:.0f} s more, the pair's share of the budget is "
                                            f"{pplan['share_s']:.0f} s and {spent:.0f} s are spent")
                    skipped.append(f"pair {ji + 1}: {pplan['halving_cut']}")
                    halving[-1]["cut"] = True
                    say(f"  {pplan['halving_cut']}")
                    kept = None
                else:
                    say(f"  halving: keep {', '.join(f'{i + 1} {_name(i)}' for i in kept)}; {n_rep * 2} runs each")
                nxt = kept
            alive = broadcast(nxt)
            if alive is None:
                break
            n_rep *= 2
        tog = {i: {k: statistics.median(d[k] for d in runs) for k in list(TEMPLATE_KEYS) + ["a2a_wait"]}
               for i, runs in together.items()}
        wall = time.time() - t_pair0
        spent_wall += wall
        spent_est += rounds * costs[ji]
        pplan.update(rounds=rounds, wall_s=round(wall, 2))
        say(f"  pair {ji + 1}/{len(jobs)} done in {wall:.1f} s ({rounds} rounds)")
        results.append({"kind_f": kind_f, "kind_b": kind_b, "durations": dur, "t_f": alone_f, "t_b": alone_b,
                        "together": tog,
                        "candidates": [{"order": list(o), "samples": samples[i]} for i, o in enumerate(cands)],
                        "halving": halving, "fit": fit_d, "plan": pplan})
    sizing = {"budget_s": budget, "requested": {"size_factor": ladder[0][0], "repeats": opts["repeats"],
                                                "warmup": opts["warmup"], "keep": opts["keep"]},
              "fixed": sorted(fixed), "size_factor": ladder[li][0], "probes": probes, "plan": plan_d,
              "reductions": reductions, "skipped": skipped, "over_budget": over_budget,
              "method": "probe: one forward and one backward of each layer kind, timed after one untimed round; "
                        "a round of pair (F kind, B kind) costs F[B kind] + F[F kind] + B[B kind]; rounds per pair "
                        "from the halving loop (sizing.pair_rounds); later pairs re-planned with the measured/"
                        "estimated ratio of the pairs before them"}
    return {"sizing": sizing, "pairs": results}
