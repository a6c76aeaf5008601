"""``tessera-lab run``: train the tiny MoE model with pipeline + expert parallelism on local processes."""

from __future__ import annotations

import argparse


def cmd_run(args: argparse.Namespace) -> int:
    """Spawn pp x ep x dp local workers (gloo on CPU, NCCL with GPUs); see tessera_lab.runner.launch.launch."""
    from tessera_lab.runner.launch.launch import run_from_args

    return run_from_args(args)



def add_parser(sub) -> None:
    p = sub.add_parser("run", help="train the tiny MoE model with pipeline + expert parallelism (local processes)",
                       epilog="environment: TESSERA_LAB_SYNC_DEBUG=warn|error (or 1|2; default|0 off) runs each step "
                              "under torch.cuda.set_sync_debug_mode on CUDA, warning about or raising on every host "
                              "sync (docs/gpu.md)")
    from tessera_lab.runner.launch.launch import add_run_arguments

    add_run_arguments(p)  # includes --json
    p.set_defaults(func=cmd_run)
