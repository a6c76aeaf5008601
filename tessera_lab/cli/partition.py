"""``tessera-lab partition``: partition a plain per-layer cost list."""

from __future__ import annotations

import argparse

from tessera_lab.argtypes import positive_int
from tessera_lab.checks import env_name, work_limit
from tessera_lab.cli.common import add_ilp_limit_options, add_json, emit, ilp_limit_from_args, table

#: the largest per-layer cost accepted (any unit); larger values lose precision in the solver's sums
MAX_COST = 1e12


def _cost_list(text: str) -> list[float]:
    out = []
    for idx, part in enumerate(text.split(",")):
        try:
            v = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"costs[{idx}] = {part!r} is not a number; allowed: comma-separated numbers >= 0") from None
        if not 0 <= v <= MAX_COST:
            raise argparse.ArgumentTypeError(
                f"costs[{idx}] = {part} is out of range; allowed: a finite number 0 to {MAX_COST:g}")
        out.append(v)
        if len(out) > (limit := work_limit("costs")):
            raise argparse.ArgumentTypeError(f"costs has more than {limit} entries, the work limit of this kind of "
                                             f"machine (raise it with {env_name('costs')}=N)")
    return out


def cmd_partition(args: argparse.Namespace) -> int:
    from tessera_lab.plan.partition import partition_costs

    if args.stages * args.vpp > len(args.costs):
        from tessera_lab.errors import PartitionError

        raise PartitionError(
            f"field 'stages' x 'vpp' = {args.stages} x {args.vpp} = {args.stages * args.vpp} virtual stages is out of "
            f"range; allowed: at most the number of layers ({len(args.costs)})")
    limit = ilp_limit_from_args(args)
    part = partition_costs(args.costs, args.stages * args.vpp, args.method, vpp=args.vpp,
                           **({} if limit is None else {"limit": limit}))
    from tessera_lab.plan.exports import deepspeed_parts, megatron_layout, torch_split_points

    result = {
        "boundaries": part.boundaries, "stage_costs": part.stage_costs, "bottleneck": part.bottleneck,
        "method": part.method, "solver": part.solver, "status": part.status, "solve_time_s": part.solve_time_s,
        "rank_costs": part.rank_costs, "vpp": args.vpp,
        "exports": {"megatron_pipeline_model_parallel_layout": megatron_layout(part.boundaries),
                    "deepspeed_parts": deepspeed_parts(part.boundaries, vpp=args.vpp),
                    "torch_pipelining_split_points": torch_split_points(part.boundaries)},
    }
    rows = [{"stage": s, "rank": s % args.stages, "layers": f"{part.boundaries[s]}-{part.boundaries[s + 1] - 1}",
             "cost": c} for s, c in enumerate(part.stage_costs)]
    emit(args, result, table(rows) + f"\nbottleneck {part.bottleneck:.6g} ({part.method}"
          + (f", {part.solver} {part.status}" if part.solver else "") + ")")
    return 0



def add_parser(sub) -> None:
    p = sub.add_parser("partition", help="partition a plain per-layer cost list")
    p.add_argument("--costs", type=_cost_list, required=True, help="comma-separated per-layer costs")
    p.add_argument("--stages", type=positive_int("stages"), required=True, help="pipeline ranks")
    p.add_argument("--vpp", type=positive_int("vpp"), default=1,
                   help="virtual stages per rank (stage s runs on rank s %% stages; needs --method ilp)")
    p.add_argument("--method", default="ilp", choices=["ilp", "dp", "uniform"])
    add_ilp_limit_options(p)
    add_json(p)
    p.set_defaults(func=cmd_partition)

