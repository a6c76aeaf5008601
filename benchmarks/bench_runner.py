"""Runner throughput: our 1F1B executor vs torch.distributed.pipelining.Schedule1F1B, and overlapped vs plain 1F1B.

Part 1 (``pp`` processes, ``ep = 1``): the same :class:`~tessera_lab.runner.runtime.pipeline.StageModule` objects (same
model, same micro-batches, same data) are driven alternately by our :class:`~tessera_lab.runner.runtime.pipeline.
PipelineExecutor` walking the ``1f1b`` action list and by ``torch.distributed.pipelining``'s ``PipelineStage`` +
``Schedule1F1B``; each trial is forward + backward of one step (no optimizer), after a barrier. Prints tokens/s
of each and the ratio ours / torch.

Part 2 (``pp * ep`` processes, at the given ep and again at ep = 1): our executor with plain ``1f1b``
(monolithic autograd, and node level), and ``overlapped`` 1F1B with the ``scheduled`` pair handler (node level,
asynchronous all-to-alls; the order searched over nominal node times, the order searched over node times the
runner measured in a plain node-level 1F1B step, and Megatron's combined-1F1B order) and with the
``threads`` handler. Prints tokens/s, ratios, and the **hidden fraction of the all-to-all** measured from the
runner's own events: exposed all-to-all time = the time the host was blocked in all-to-all waits (lane
``wait``); with plain node-level 1F1B every all-to-all is waited for right after it is issued, so its exposed
time is the all-to-all time; hidden fraction = 1 - exposed(scheduled) / exposed(plain node-level 1F1B).
At ep = 1 there is no all-to-all, so a speed-up there is thread parallelism or noise, not hidden communication.

Prints, never asserts: timings on a shared 2-core CI machine are noisy. Run:

    python benchmarks/bench_runner.py [--pp 2] [--ep 2] [--microbatches 8] [--trials 12] [--hidden 64]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, args, part: str, queue) -> None:  # noqa: C901
    import torch
    import torch.distributed as dist

    from tessera_lab.plan.partition import uniform_boundaries
    from tessera_lab.runner.launch.launch import RunSpec, WorldSpec
    from tessera_lab.runner.runtime.model import TinyMoEModel, make_batch, shard_rows
    from tessera_lab.runner.runtime.moe import ExpertParallelComm
    from tessera_lab.runner.runtime.pipeline import ExecutorOptions, PipelineExecutor, build_stages, build_topology

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    ep = 1 if part == "torch" else int(part.split(":")[1])
    world = WorldSpec(pp=args.pp, ep=ep, dp=1)
    topo = build_topology(world, rank, torch.device("cpu"))
    model_cfg = {"hidden_size": args.hidden, "num_layers": args.layers, "expert_width": args.hidden,
                 "shared_expert_width": args.hidden, "seq_len": args.seq_len}
    m, mbs = args.microbatches, args.micro_batch_size
    R = topo.replicas
    cfg = RunSpec(model=model_cfg).model_config
    N = m * R * mbs * cfg.seq_len
    batch = make_batch(cfg, 0, m * R * mbs)
    rows = {i: batch[shard_rows(i, topo.replica, R, mbs)] for i in range(m)}
    inputs = {i: r[:, :-1] for i, r in rows.items()}
    targets = {i: r[:, 1:] for i, r in rows.items()}

    def executor(schedule: str, pair_exec=None, pair_order=None):
        spec = RunSpec(schedule=schedule, microbatches=m, micro_batch_size=mbs, model=model_cfg)
        sched = spec.build_schedule(args.pp)
        comm = (ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, topo.ep, topo.ep_rank, cfg.num_experts)
                if topo.ep > 1 else None)
        _, stages = build_stages(cfg, uniform_boundaries(cfg.num_layers, sched.num_stages),
                                 sched.rank_stages(topo.pp_rank), sched.num_stages,
                                 comm.local_experts if comm else None)
        for st in stages.values():
            st.comm = comm
        ex = PipelineExecutor(topo, sched, stages, (mbs, cfg.seq_len, cfg.hidden_size), N,
                              ExecutorOptions(pair_exec=pair_exec, pair_order=pair_order))
        return ex, stages

    exposed: dict[str, list[float]] = {}

    def ours(ex, stages, name=None):
        for st in stages.values():
            st.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        rec = ex.run_step(0, inputs, targets, t0)
        dist.barrier()
        dt = time.perf_counter() - t0
        if name is not None:
            exposed.setdefault(name, []).append(sum(e[5] - e[4] for e in rec.events if e[0] == "wait"))
        return dt

    results: dict[str, list[float]] = {}
    if part == "torch":
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        ex, stages = executor("1f1b")
        (s, stage_mod), = stages.items()
        pstage = PipelineStage(stage_mod, s, args.pp, torch.device("cpu"))
        sched = Schedule1F1B(pstage, m, loss_fn=lambda out, tgt: TinyMoEModel.loss_sum(out, tgt) / N,
                             scale_grads=False)
        full_in = torch.cat([inputs[i] for i in range(m)])
        full_tgt = torch.cat([targets[i] for i in range(m)])

        def theirs():
            stage_mod.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            if s == 0:
                sched.step(full_in)
            elif s == args.pp - 1:
                sched.step(target=full_tgt, losses=[])
            else:
                sched.step()
            dist.barrier()
            return time.perf_counter() - t0

        for _ in range(2):  # warm-up (torch infers shapes on its first step)
            ours(ex, stages), theirs()
        for _ in range(args.trials):
            results.setdefault("ours 1f1b", []).append(ours(ex, stages))
            results.setdefault("torch Schedule1F1B", []).append(theirs())
        ex.close()
    else:
        # node times measured by the runner itself (plain node-level 1F1B waits for every all-to-all at once),
        # searched on rank 0 and broadcast, so that every rank issues the same order
        from tessera_lab.runner.runtime.orders import durations_from_events, search_template

        probe = executor("1f1b", pair_exec="scheduled")
        ours(*probe)
        rec = probe[0].run_step(0, inputs, targets, time.perf_counter())
        evs = [{"lane": e[0], "type": e[1], "start": e[4], "end": e[5], "label": e[6]} for e in rec.events]
        box = [list(search_template(durations_from_events(evs), keep=1)[0][1])]
        dist.broadcast_object_list(box, src=0)
        probe[0].close()
        measured_order = box[0]
        runs = {"1f1b": executor("1f1b"), "1f1b (nodes)": executor("1f1b", pair_exec="scheduled"),
                "overlapped measured order": executor("overlapped", pair_exec="scheduled", pair_order=measured_order),
                "overlapped scheduled": executor("overlapped", pair_exec="scheduled"),
                "overlapped megatron": executor("overlapped", pair_exec="scheduled", pair_order="megatron"),
                "overlapped threads": executor("overlapped", pair_exec="threads")}
        for _ in range(2):
            for ex, st in runs.values():
                ours(ex, st)
        for _ in range(args.trials):
            for name, (ex, st) in runs.items():
                results.setdefault(name, []).append(ours(ex, st, name))
        for ex, _ in runs.values():
            ex.close()
    out = {k: statistics.median(v) for k, v in results.items()} | {"tokens": N}
    if part == "torch":  # paired trials (ours and theirs back to back): the spread of the per-trial ratio
        pr = sorted(t / o for o, t in zip(results["ours 1f1b"], results["torch Schedule1F1B"]))
        q = statistics.quantiles(pr, n=4) if len(pr) >= 2 else [pr[0]] * 3
        out["paired_ratio"] = {"q1": q[0], "median": statistics.median(pr), "q3": q[2], "trials": len(pr)}
    # exposed all-to-all time summed over the ranks of pipeline rank 0's EP group... gathered from every rank
    mine = {k: statistics.median(v) for k, v in exposed.items()}
    allx: list = [None] * world_size
    dist.all_gather_object(allx, mine)
    if rank == 0:
        if any(allx):
            out["exposed"] = {k: sum(x[k] for x in allx) / world_size for k in mine}
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def _run(part: str, world_size: int, args) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_worker, args=(world_size, _free_port(), args, part, q), nprocs=world_size,
                       start_method="spawn", join=True)
    return q.get()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pp", type=int, default=2, help="pipeline stages, 2 to 4 (default 2)")
    p.add_argument("--ep", type=int, default=2, help="EP size of part 2, 1 to 4 (default 2; part 1 runs ep = 1)")
    p.add_argument("--microbatches", type=int, default=8, help=">= pp (default 8)")
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4, help=">= pp (default 4)")
    p.add_argument("--trials", type=int, default=10, help="timed steps per variant, >= 4 (default 10)")
    p.add_argument("--part", choices=["all", "torch", "overlap"], default="all",
                   help="torch: part 1 only; overlap: part 2 only")
    args = p.parse_args(argv)
    limits = {"pp": (2, 4), "ep": (1, 4), "microbatches": (args.pp, 64), "micro_batch_size": (1, 64),
              "seq_len": (2, 1024), "hidden": (8, 1024), "layers": (args.pp, 64), "trials": (4, 1000)}
    for name, (lo, hi) in limits.items():
        v = getattr(args, name)
        if not lo <= v <= hi:
            print(f"bench_runner: --{name.replace('_', '-')} = {v} is out of range; allowed: {lo} to {hi}",
                  file=sys.stderr)
            return 2

    if args.part != "overlap":
        _part1(args)
    if args.part != "torch":
        import os as _os

        print(f"machine load (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in _os.getloadavg())}, "
              f"{_os.cpu_count()} cores")
        for ep in dict.fromkeys([args.ep, 1]):
            _part2(args, ep)
    return 0


def _part1(args) -> None:
    r = _run("torch", args.pp, args)
    tok = r.pop("tokens")
    pr = r.pop("paired_ratio")
    print(f"[1] pp={args.pp}, ep=1, m={args.microbatches}, {tok} tokens/step, median of {args.trials} steps (fwd+bwd)")
    for k, v in r.items():
        print(f"    {k:<24} {v * 1e3:8.2f} ms/step  {tok / v:10.0f} tokens/s")
    ratio = r["torch Schedule1F1B"] / r["ours 1f1b"]
    print(f"    ratio ours / torch.distributed.pipelining (tokens/s): {ratio:.3f}")
    verdict = ("ours faster beyond the noise" if pr["q1"] > 1.0 else "ours slower beyond the noise"
               if pr["q3"] < 1.0 else "within the noise (the quartiles straddle 1.0)")
    print(f"    paired trials ({pr['trials']}): ratio quartiles {pr['q1']:.3f} / {pr['median']:.3f} / {pr['q3']:.3f}: "
          f"{verdict}; target >= 1.0")


def _part2(args, ep: int) -> None:
    r = _run(f"ours:{ep}", args.pp * ep, args)
    tok = r.pop("tokens")
    exposed = r.pop("exposed", {})
    label = "[2]" if ep > 1 else "[3] control (no all-to-all):"
    print(f"{label} pp={args.pp}, ep={ep}, m={args.microbatches}, {tok} tokens/step, median of {args.trials} steps")
    for k, v in r.items():
        if ep > 1 and k in ("1f1b", "overlapped threads"):  # monolithic autograd: no all-to-all wait events
            x = "  exposed all-to-all not measured (not node level)"
        else:
            x = f"  exposed all-to-all {exposed[k] * 1e3:7.2f} ms/step/rank" if k in exposed and ep > 1 else ""
        print(f"    {k:<24} {v * 1e3:8.2f} ms/step  {tok / v:10.0f} tokens/s{x}")
    for k in ("overlapped scheduled", "overlapped measured order", "overlapped megatron", "overlapped threads",
              "1f1b (nodes)"):
        print(f"    ratio {k} / 1f1b (tokens/s): {r['1f1b'] / r[k]:.3f}")
    print("    (ratios of medians; on a shared 2-core machine single runs of such ratios move 10-20 %)")
    if ep > 1 and exposed.get("1f1b (nodes)", 0) > 0:
        base = exposed["1f1b (nodes)"]
        for k in ("overlapped scheduled", "overlapped measured order", "overlapped megatron"):
            print(f"    hidden fraction of all-to-all, {k}: {1 - exposed[k] / base:.2f} "
                  f"(runner events: exposed {exposed[k] * 1e3:.2f} of {base * 1e3:.2f} ms/step/rank)")


if __name__ == "__main__":
    sys.exit(main())
