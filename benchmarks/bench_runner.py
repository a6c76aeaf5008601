"""Runner throughput: our 1F1B executor vs torch.distributed.pipelining.Schedule1F1B, and overlapped vs plain 1F1B.

Part 1 (``pp`` processes, ``ep = 1``): the same :class:`~tessera_lab.runner.pipeline.StageModule` objects (same
model, same micro-batches, same data) are driven alternately by our :class:`~tessera_lab.runner.pipeline.
PipelineExecutor` walking the ``1f1b`` action list and by ``torch.distributed.pipelining``'s ``PipelineStage`` +
``Schedule1F1B``; each trial is forward + backward of one step (no optimizer), after a barrier. Prints tokens/s
of each and the ratio ours / torch.

Part 2 (``pp * ep`` processes): our executor with ``1f1b`` and with ``overlapped`` 1F1B (pairs run with the
forward on a side thread while the backward computes, each with its own EP all-to-all group), and the same
overlapped list run serially. Prints tokens/s and ratios.

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


def _worker(rank: int, world_size: int, port: int, args, part: str, queue) -> None:
    import torch
    import torch.distributed as dist

    from tessera_lab.plan.partition import uniform_boundaries
    from tessera_lab.runner.launch import RunSpec, WorldSpec
    from tessera_lab.runner.model import TinyMoEModel, make_batch, shard_rows
    from tessera_lab.runner.moe import ExpertParallelComm
    from tessera_lab.runner.pipeline import PipelineExecutor, build_stages, build_topology

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    ep = 1 if part == "torch" else args.ep
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

    def executor(schedule: str, overlap: str = "thread"):
        spec = RunSpec(schedule=schedule, microbatches=m, micro_batch_size=mbs, model=model_cfg, overlap=overlap)
        sched = spec.build_schedule(args.pp)
        comm = (ExpertParallelComm(topo.ep_fwd, topo.ep_bwd, topo.ep, topo.ep_rank, cfg.num_experts)
                if topo.ep > 1 else None)
        _, stages = build_stages(cfg, uniform_boundaries(cfg.num_layers, sched.num_stages),
                                 sched.rank_stages(topo.pp_rank), sched.num_stages,
                                 comm.local_experts if comm else None)
        for st in stages.values():
            st.comm = comm
        ex = PipelineExecutor(topo, sched, stages, (mbs, cfg.seq_len, cfg.hidden_size), N, overlap=overlap)
        return ex, stages

    def ours(ex, stages):
        for st in stages.values():
            st.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        ex.run_step(0, inputs, targets, t0)
        dist.barrier()
        return time.perf_counter() - t0

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
        runs = {"1f1b": executor("1f1b"), "overlapped (side thread)": executor("overlapped", "thread"),
                "overlapped (serial)": executor("overlapped", "serial")}
        for _ in range(2):
            for ex, st in runs.values():
                ours(ex, st)
        for _ in range(args.trials):
            for name, (ex, st) in runs.items():
                results.setdefault(name, []).append(ours(ex, st))
        for ex, _ in runs.values():
            ex.close()
    if rank == 0:
        queue.put({k: statistics.median(v) for k, v in results.items()} | {"tokens": N})
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
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--part", choices=["all", "torch", "overlap"], default="all",
                   help="torch: part 1 only; overlap: part 2 only")
    args = p.parse_args(argv)

    if args.part != "overlap":
        _part1(args)
    if args.part != "torch":
        _part2(args)
    return 0


def _part1(args) -> None:
    r = _run("torch", args.pp, args)
    tok = r.pop("tokens")
    print(f"[1] pp={args.pp}, ep=1, m={args.microbatches}, {tok} tokens/step, median of {args.trials} steps (fwd+bwd)")
    for k, v in r.items():
        print(f"    {k:<24} {v * 1e3:8.2f} ms/step  {tok / v:10.0f} tokens/s")
    ratio = r["torch Schedule1F1B"] / r["ours 1f1b"]
    print(f"    ratio ours / torch.distributed.pipelining (tokens/s): {ratio:.3f}")


def _part2(args) -> None:
    r = _run("ours", args.pp * args.ep, args)
    tok = r.pop("tokens")
    print(f"[2] pp={args.pp}, ep={args.ep}, m={args.microbatches}, {tok} tokens/step, median of {args.trials} steps")
    for k, v in r.items():
        print(f"    {k:<24} {v * 1e3:8.2f} ms/step  {tok / v:10.0f} tokens/s")
    print(f"    ratio overlapped (side thread) / 1f1b (tokens/s): {r['1f1b'] / r['overlapped (side thread)']:.3f}")
    print(f"    ratio overlapped (side thread) / overlapped serial: "
          f"{r['overlapped (serial)'] / r['overlapped (side thread)']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
