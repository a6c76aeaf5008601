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


class _Bench:
    """One rank's measuring state: its EP group and communicator, the measured stages (built by :meth:`build`),
    the runtime's clock and the node events of the last timed call. Every rank calls the same methods in the same
    order (each may run collectives)."""

    def __init__(self, rank: int, ep: int, n_exp: int, mbs: int, device, cuda: bool):
        import torch

        from ..runtime.devtime import StepClock
        from ..runtime.moe import ExpertParallelComm
        from ..runtime.specs import WorldSpec
        from ..runtime.topology import build_topology

        topo = build_topology(WorldSpec(pp=1, ep=ep), rank, device)
        self.rank, self.mbs, self.device, self.cuda = rank, mbs, device, cuda
        self.comm = ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, ep, rank, n_exp) if ep > 1 else None
        self.raw: list[tuple] = []
        self.events: list[dict] = []
        # the runtime's clock: CUDA events on a GPU (the node stamps and the run's span), the host clock on CPU
        self.step_clock = StepClock(device)
        self.comm_stream = torch.cuda.Stream(device) if cuda else None
        self.stage_of: dict = {}
        self.x_in: list = []
        self.g_out = None

    def build(self, cfg_d: dict) -> None:
        """Layers 1 (full attention) and 2 (linear attention) of four ``[linear, full, linear, full]``, built alone
        with this rank's experts (:func:`~tessera_lab.runner.runtime.topology.build_measured_stages`), and the
        inputs ``[mbs, T, H]``: two forward inputs and one output gradient (times 1e-2), seeded by the rank."""
        import torch

        from ..runtime.specs import TinyConfig
        from ..runtime.topology import build_measured_stages

        cfg = TinyConfig.from_dict(cfg_d)
        self.stage_of.clear()  # the previous size's layers go before the next are built
        stages = build_measured_stages(cfg, [1, 2], self.comm.local_experts if self.comm else None, self.device)
        for st in stages.values():
            st.comm = self.comm
        gen = torch.Generator().manual_seed(1234 + self.rank)
        shape = (self.mbs, cfg.seq_len, cfg.hidden_size)
        self.stage_of = {"full_attention": stages[1], "linear_attention": stages[2]}
        self.x_in = [torch.randn(shape, generator=gen).to(self.device) for _ in range(2)]
        self.g_out = torch.randn(shape, generator=gen).to(self.device) * 1e-2

    def stage(self, kind: str):
        return self.stage_of[kind.split("+")[0]]

    def _record(self, lane, typ, label, s, e):
        self.raw.append((lane, typ, 0, None, s, e, label))

    def prog(self, st, i: int):
        """A fresh node program of stage ``st`` for micro-batch ``i`` (input ``x_in[i]``)."""
        from ..runtime.nodes import StageProgram

        p = StageProgram(st, i, self.comm, self._record, self.step_clock.now)
        p.comm_stream = self.comm_stream
        p.begin(self.x_in[i].detach().requires_grad_(True))
        return p

    def timed(self, fn) -> float:
        """Seconds of ``fn``'s work: between two stamps of the runtime's clock; ``events`` gets its node events."""
        import torch
        import torch.distributed as dist

        if self.cuda:
            torch.cuda.synchronize(self.device)
        dist.barrier()
        self.raw.clear()
        self.step_clock.start(time.perf_counter())
        fn()
        end = self.step_clock.now()
        resolved = self.step_clock.resolve(self.raw + [("span", "", 0, None, end, end, "")])
        self.events[:] = [{"lane": ln, "type": ty, "label": lb, "start": a, "end": b}
                          for ln, ty, _, _, a, b, lb in resolved if ln != "span"]
        return resolved[-1][5]

    def fwd(self, p) -> None:
        p.run_forward()

    def bwd(self, p) -> None:
        p.run_backward(self.g_out)


def _broadcast(obj):
    """Rank 0's ``obj`` on every rank (``broadcast_object_list``)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class _Budget:
    """Seconds left of ``opts["budget_s"]`` (counted from ``opts["t_start"]``, less a reserve for teardown and
    writing the profile); infinite without a budget."""

    def __init__(self, opts: dict):
        self.budget = opts["budget_s"]
        self.t_start = opts["t_start"]
        self.reserve = min(10.0, 0.05 * self.budget) if self.budget else 0.0

    def left(self) -> float:
        return self.t_start + self.budget - self.reserve - time.time() if self.budget else math.inf


def _probe(b: _Bench, kinds: list[str]) -> tuple[dict, dict]:
    """One timed forward and backward of each layer kind after one untimed round: ``(fwd_s, bwd_s)`` by kind."""
    fw, bw = {}, {}
    for k in kinds:
        st = b.stage(k)
        p = b.prog(st, 0)  # untimed: first-touch allocations
        b.fwd(p)
        b.bwd(p)
        p = b.prog(st, 0)
        fw[k] = b.timed(lambda: b.fwd(p))
        bw[k] = b.timed(lambda: b.bwd(p))
    return fw, bw


def _size(b: _Bench, jobs: list, ladder: list, opts: dict, budget: _Budget, say) -> dict:
    """Phase 0, probe and sizing: the size factor is halved (and probed again) only when even the fewest repeats
    and candidate orders do not fit the time left. Returns ``{probes, reductions, li, plan, probe}``."""
    fixed = frozenset(opts["fixed"])
    kinds = sorted({k for job in jobs for k in job})
    probes, reductions, li = [], [], 0
    while True:
        f, cfg_d = ladder[li]
        b.build(cfg_d)
        tp0 = time.time()
        fw, bw = _probe(b, kinds)
        payload = None
        if b.rank == 0:
            left = budget.left()
            costs = [round_cost(fw, bw, kf, kb) for kf, kb in jobs]
            plan = plan_work(costs, left, repeats=opts["repeats"], warmup=opts["warmup"], keep=opts["keep"],
                             fixed=fixed)
            smaller = not plan.fits and li + 1 < len(ladder)
            probe = {"size_factor": f, "fwd_s": fw, "bwd_s": bw, "probe_wall_s": round(time.time() - tp0, 3),
                     "round_s": costs, "seconds_left": round(left, 2) if budget.budget else None,
                     "plan": plan.as_dict()}
            say(f"probe at size factor {f:g}: " + ", ".join(f"{k} F {fw[k] * 1e3:.1f} ms, B+W {bw[k] * 1e3:.1f} ms"
                                                          for k in kinds)
                + f"; plan: repeats {plan.repeats}, {plan.keep} orders per pair, about {plan.estimate_s:.0f} s"
                + (f" of {left:.0f} s left" if budget.budget else "")
                + ("" if plan.fits or not budget.budget else (" -- does not fit: halving the size factor" if smaller
                                                              else " -- does not fit even so: going on, over the budget")))
            payload = (probe, plan.as_dict(), smaller)
        probe, plan_d, smaller = _broadcast(payload)
        probes.append(probe)
        if not smaller:
            return {"probes": probes, "reductions": reductions + plan_d["reductions"], "li": li, "plan": plan_d,
                    "probe": probe}
        reductions.append(f"size factor {ladder[li][0]:g} -> {ladder[li + 1][0]:g}")
        li += 1


def _pair_plan(ji: int, jobs: list, costs: list, sized: dict, opts: dict, budget: _Budget, spent: list,
               say) -> dict:
    """Rank 0's plan for pair ``ji`` (repeats, warmup, orders, its share of the time left), re-planned with the
    measured/estimated ratio ``spent`` = ``[wall, estimate]`` of the pairs before it; broadcast to every rank."""
    payload = None
    if sized["rank"] == 0:
        plan_d = sized["plan"]
        kind_f, kind_b = jobs[ji]
        scale = min(4.0, max(0.5, spent[0] / spent[1])) if spent[1] > 0 else 1.0
        rest = [c * scale for c in costs[ji:]]
        left = budget.left()
        pp = plan_work(rest, left, repeats=plan_d["repeats"], warmup=plan_d["warmup"], keep=plan_d["keep"],
                       fixed=frozenset(opts["fixed"]))
        share = left * rest[0] / sum(rest) if budget.budget else math.inf
        payload = {"repeats": pp.repeats, "warmup": pp.warmup, "keep": pp.keep, "scale": round(scale, 3),
                   "estimate_s": round(rest[0] * pair_rounds(pp.keep, pp.repeats, pp.warmup), 2),
                   "share_s": round(share, 2) if budget.budget else None, "halving_cut": None}
        say(f"pair {ji + 1}/{len(jobs)}: F[{kind_f}] + BW[{kind_b}]: repeats {pp.repeats}, {pp.keep} orders, "
            f"about {payload['estimate_s']:.0f} s")
        if pp.repeats < plan_d["repeats"] or pp.keep < plan_d["keep"]:
            sized["reductions"].append(f"pair {ji + 1}: behind the plan, measured with repeats {pp.repeats} and "
                                       f"{pp.keep} orders")
    return _broadcast(payload)


def _alone(b: _Bench, sf, sb, warmup: int, repeats: int) -> tuple[list, list, dict]:
    """Phase 2: each side alone ``warmup + repeats`` times; ``(t_f samples, t_b samples, median node seconds by
    template key)``."""
    from ..runtime.orders import TEMPLATE_KEYS, durations_from_events

    alone_f, alone_b, dur_runs = [], [], []
    for r in range(warmup + repeats):
        pb = b.prog(sb, 0)
        b.fwd(pb)
        pf = b.prog(sf, 1)
        tf = b.timed(lambda: b.fwd(pf))
        d_evt = durations_from_events(b.events)
        tb = b.timed(lambda: b.bwd(pb))
        d_evt.update({k: v for k, v in durations_from_events(b.events).items() if k.startswith("b.")})
        del pf  # its backward is not needed: dropping the graph frees it
        if r >= warmup:
            alone_f.append(tf)
            alone_b.append(tb)
            dur_runs.append(d_evt)
    return alone_f, alone_b, {k: statistics.median(d[k] for d in dur_runs) for k in TEMPLATE_KEYS}


def _together(b: _Bench, sf, sb, order, together: dict, cand: int | None = None) -> float:
    """One round of the pair in ``order``: F of micro-batch 1 on ``sf`` interleaved with B+W of micro-batch 0 on
    ``sb``; seconds. With ``cand``, its node seconds and all-to-all wait go to ``together[cand]``."""
    from ..runtime.orders import durations_from_events
    from ..runtime.pairs import interleave

    pb = b.prog(sb, 0)
    b.fwd(pb)
    pf = b.prog(sf, 1)
    pb.begin_backward(b.g_out)
    seq = interleave(pf.fwd_keys, pf.order, pb.bwd_keys, pb.order, order)

    def run():
        for side, key in seq:
            (pf.forward if side == "f" else pb.backward)(key)

    t = b.timed(run)
    if cand is not None:
        d = durations_from_events(b.events)
        d["a2a_wait"] = sum(e["end"] - e["start"] for e in b.events  # dispatch/combine waits (not counts)
                            if e["lane"] == "wait" and ".counts[" not in e["label"])
        together.setdefault(cand, []).append(d)
    return t


def _halving_step(alive: list, samples: dict, n_rep: int, cost_s: float, pplan: dict, t_pair0: float,
                  halving: list, skipped: list, ji: int, say) -> list | None:
    """Rank 0's successive-halving decision: the survivors, or None when the next round would pass the pair's
    share of the budget (said, and recorded in ``skipped`` and ``pplan["halving_cut"]``)."""
    med = {i: statistics.median(samples[i]) for i in alive}
    kept = halve(alive, med)
    halving.append({"repeats": n_rep * 2, "alive": list(alive), "medians": [med[i] for i in alive], "kept": kept})
    next_s = len(kept) * n_rep * 2 * cost_s * pplan["scale"]
    spent = time.time() - t_pair0
    if pplan["share_s"] is not None and spent + next_s > pplan["share_s"]:
        pplan["halving_cut"] = (f"halving stopped before the round of {len(kept)} orders x {n_rep * 2} "
                                f"runs: about {next_s:.0f} s more, the pair's share of the budget is "
                                f"{pplan['share_s']:.0f} s and {spent:.0f} s are spent")
        skipped.append(f"pair {ji + 1}: {pplan['halving_cut']}")
        halving[-1]["cut"] = True
        say(f"  {pplan['halving_cut']}")
        return None
    say(f"  halving: keep {', '.join(f'{i + 1} {_name(i)}' for i in kept)}; {n_rep * 2} runs each")
    return kept


def _search(b: _Bench, sf, sb, cands: list, samples: dict, together: dict, ctx: dict, say) -> tuple[list, int]:
    """Phase 4: the candidates interleaved (so drift affects them alike), then successive halving until two
    remain or the budget cuts it; program order's first ``repeats`` samples are already in ``samples[0]``.
    Returns ``(halving rounds, rounds run)``."""
    warmup, n_rep = ctx["warmup"], ctx["repeats"]
    alive, halving, first, rounds = list(range(len(cands))), [], True, 0
    while True:
        for r in range(n_rep + (warmup if first else 0)):
            for i in alive:
                if i == 0 and first:
                    continue
                keep_it = not first or r >= warmup
                t = _together(b, sf, sb, cands[i], together, i if keep_it else None)
                rounds += 1
                if keep_it:
                    samples[i].append(t)
        say("  " + "; ".join(f"order {i + 1}/{len(cands)} {_name(i)}: median {statistics.median(samples[i]) * 1e3:.1f} "
                             f"ms ({len(samples[i])} runs)" for i in alive))
        first = False
        if len(alive) <= 2:
            return halving, rounds
        nxt = None
        if b.rank == 0:
            nxt = _halving_step(alive, samples, n_rep, ctx["cost_s"], ctx["pplan"], ctx["t_pair0"], halving,
                                ctx["skipped"], ctx["ji"], say)
        alive = _broadcast(nxt)
        if alive is None:
            return halving, rounds
        n_rep *= 2


def _measure_pair(b: _Bench, ji: int, jobs: list, costs: list, sized: dict, opts: dict, budget: _Budget,
                  spent: list, fit_samples: list, say) -> dict:
    """One pair, phases 2-4 (alone, program order, candidates and halving); ``spent`` (``[wall, estimate]``) and
    ``fit_samples`` accumulate over the pairs. Returns the pair's record."""
    from tessera_lab.overlap.fit import fit_contention_samples

    from ..runtime.orders import TEMPLATE_KEYS, template_graph

    t_pair0 = time.time()
    kind_f, kind_b = jobs[ji]
    sf, sb = b.stage(kind_f), b.stage(kind_b)
    pplan = _pair_plan(ji, jobs, costs, sized, opts, budget, spent, say)
    repeats, warmup, keep = pplan["repeats"], pplan["warmup"], pplan["keep"]
    alone_f, alone_b, dur = _alone(b, sf, sb, warmup, repeats)
    say(f"  alone: F {statistics.median(alone_f) * 1e3:.1f} ms, B+W {statistics.median(alone_b) * 1e3:.1f} ms "
        f"(medians of {repeats})")
    together: dict[int, list[dict]] = {}  # candidate -> per-run {key: seconds} and the a2a wait seconds
    prog_samples = [_together(b, sf, sb, TEMPLATE_KEYS, together, 0 if r >= warmup else None)
                    for r in range(warmup + repeats)][warmup:]
    payload = None
    if b.rank == 0:
        graph = template_graph()
        fit_samples.append({"order": list(TEMPLATE_KEYS), "durations": dict(dur), "lanes": dict(graph.lanes),
                            "deps": {k: list(v) for k, v in graph.deps.items()},
                            "t_ab": statistics.median(prog_samples)})
        fit = fit_contention_samples(fit_samples, step=FIT_STEP)
        payload = ([list(o) for o in _candidates(dur, fit, b.cuda, keep)], fit.as_dict())
    cands_l, fit_d = _broadcast(payload)
    cands = [tuple(o) for o in cands_l]
    samples: dict[int, list[float]] = {0: list(prog_samples), **{i: [] for i in range(1, len(cands))}}
    ctx = {"warmup": warmup, "repeats": repeats, "cost_s": costs[ji], "pplan": pplan, "t_pair0": t_pair0,
           "skipped": sized["skipped"], "ji": ji}
    halving, search_rounds = _search(b, sf, sb, cands, samples, together, ctx, say)
    rounds = 2 * (warmup + repeats) + search_rounds
    tog = {i: {k: statistics.median(d[k] for d in runs) for k in list(TEMPLATE_KEYS) + ["a2a_wait"]}
           for i, runs in together.items()}
    wall = time.time() - t_pair0
    spent[0] += wall
    spent[1] += rounds * costs[ji]
    pplan.update(rounds=rounds, wall_s=round(wall, 2))
    say(f"  pair {ji + 1}/{len(jobs)} done in {wall:.1f} s ({rounds} rounds)")
    return {"kind_f": kind_f, "kind_b": kind_b, "durations": dur, "t_f": alone_f, "t_b": alone_b, "together": tog,
            "candidates": [{"order": list(o), "samples": samples[i]} for i, o in enumerate(cands)],
            "halving": halving, "fit": fit_d, "plan": pplan}


def measure_rank(rank: int, ep: int, jobs: list, ladder: list, mbs: int, opts: dict, device, cuda: bool,
                 say: Callable[[str], None]) -> dict:
    """Measure ``jobs`` (``(kind_f, kind_b)`` pairs) on this rank; rank 0's return value is the harness's
    result (``{"sizing": ..., "pairs": [...]}``), the other ranks' is the same shape. Phases: sizing
    (:func:`_size`), then per pair :func:`_measure_pair`."""
    b = _Bench(rank, ep, ladder[0][1]["num_experts"], mbs, device, cuda)
    budget = _Budget(opts)
    sized = _size(b, jobs, ladder, opts, budget, say)
    sized.update(rank=rank, skipped=[])
    probe, plan_d = sized["probe"], sized["plan"]
    costs = [round_cost(probe["fwd_s"], probe["bwd_s"], kf, kb) for kf, kb in jobs]
    # reductions: work made smaller to fit (fewer repeats or orders, a smaller size factor); skipped: work planned
    # and then not run (a halving round cut at the pair's share of the budget); over_budget: the plan did not fit
    over_budget = (f"the smallest plan needs about {plan_d['estimate_s']:.0f} s"
                   if budget.budget and not plan_d["fits"] else None)
    spent, fit_samples = [0.0, 0.0], []  # measured seconds vs the probe's estimate for them (corrects later plans)
    results = [_measure_pair(b, ji, jobs, costs, sized, opts, budget, spent, fit_samples, say)
               for ji in range(len(jobs))]
    sizing = {"budget_s": budget.budget, "requested": {"size_factor": ladder[0][0], "repeats": opts["repeats"],
                                                       "warmup": opts["warmup"], "keep": opts["keep"]},
              "fixed": sorted(opts["fixed"]), "size_factor": ladder[sized["li"]][0], "probes": sized["probes"],
              "plan": plan_d, "reductions": sized["reductions"], "skipped": sized["skipped"],
              "over_budget": over_budget,
              "method": "probe: one forward and one backward of each layer kind, timed after one untimed round; "
                        "a round of pair (F kind, B kind) costs F[B kind] + F[F kind] + B[B kind]; rounds per pair "
                        "from the halving loop (sizing.pair_rounds); later pairs re-planned with the measured/"
                        "estimated ratio of the pairs before them"}
    return {"sizing": sizing, "pairs": results}
