"""``tessera-lab calibrate``: measure this machine at the runner's shapes and write a calibrated device file."""

from __future__ import annotations

import argparse
import re
import sys

from tessera_lab.argtypes import positive_int
from tessera_lab.cli.common import add_json, emit, table


def _rate(fit: dict) -> str:
    """``"N MB/s"`` of an alpha-beta fit, or the reason it has no byte term."""
    if fit.get("bytes_per_s", 0) > 0:
        return f"{fit['bytes_per_s'] / 1e6:.1f} MB/s"
    return "bandwidth n/a: " + fit.get("fit_note", "no byte term")


def parse_group_sizes(text: str) -> list[int]:
    """``--group-sizes "2,4"`` -> ``[2, 4]`` (sorted, unique).

    Raises:
        ConfigError: an empty list, an entry that is not an integer, or one outside 2..8.
    """
    from tessera_lab.errors import ConfigError

    allowed = "comma-separated integers 2 to 8, e.g. 2,4"
    items = [x.strip() for x in str(text).split(",")]
    if not any(items):
        raise ConfigError(f"option --group-sizes = {text!r} is empty; allowed: {allowed}")
    out = set()
    for x in items:
        if not re.fullmatch(r"[0-9]{1,3}", x) or not 2 <= int(x) <= 8:
            raise ConfigError(f"option --group-sizes = {text!r}: entry {x!r} is not allowed; allowed: {allowed}")
        out.add(int(x))
    return sorted(out)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run the calibration (:mod:`tessera_lab.runner.testbed.calibrate`), write ``--out`` atomically, print a summary."""
    from pathlib import Path

    from tessera_lab.errors import ConfigError
    from tessera_lab.io import write_json
    from tessera_lab.runner.testbed.calibrate import calibrate
    from tessera_lab.runner.runtime.specs import TinyConfig

    groups = parse_group_sizes(args.group_sizes)  # every option before any work
    name = args.name or Path(args.out).stem
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise ConfigError(f"device name {name!r} is not allowed; allowed: letters, digits, '.', '_', '-'")
    cfg = TinyConfig()
    if args.model:
        from tessera_lab.model.spec import load_model

        cfg = TinyConfig.from_model_spec(load_model(args.model))  # the one config reader, then the runner's model
    dev = calibrate(cfg, name=name, micro_batch_size=args.micro_batch_size, group_sizes=groups,
                    repeats=args.repeats)
    write_json(args.out, dev)
    rows = []
    for kind, e in dev["layers"].items():
        for ph in ("F", "B"):
            for flops, t in e[ph]:
                rows.append({"layer kind": kind, "phase": ph, "GFLOP (analytic)": flops / 1e9, "time (ms, measured)": t * 1e3})
    meta = dev["metadata"]
    lines = ["CPU testbed (models CPU time sharing on this machine; does not transfer to GPUs)",
             f"calibrated device {name}: {meta.get('device')}, torch {meta['torch']}, "
             f"load {meta['load_average_1m']['before']} -> {meta['load_average_1m']['after']}, {meta['seconds']} s",
             table(rows, ".4g"),
             f"GEMM {dev['throughput']['gemm_flop_per_s'] / 1e9:.2f} GFLOP/s at {dev['throughput']['gemm_shape']}, "
             f"memory {dev['throughput']['memory_bytes_per_s'] / 1e9:.2f} GB/s (measured)",
             f"gloo p2p: alpha {dev['p2p']['alpha_s'] * 1e6:.1f} us, {_rate(dev['p2p'])}"]
    for g, e in dev["all_to_all"].items():
        lines.append(f"gloo all-to-all, group {g}: alpha {e['alpha_s'] * 1e6:.1f} us, {_rate(e)}")
    print(f"device file: {args.out}", file=sys.stderr)
    if "wait_cpu_share" in dev["p2p"]:
        lines.append(f"gloo blocked receive: {dev['p2p']['wait_cpu_share'] * 100:.1f}% of a core (waits sleep, not "
                     f"spin); one send or receive {dev['p2p'].get('cpu_per_op_s', 0.0) * 1e6:.0f} us of CPU (measured)")
    for ep, rc in sorted((k, v) for k, v in (dev.get("runner_cpu") or {}).items() if k.isdigit()):
        lines.append(f"runner CPU, one-stage job at ep={ep}: {rc['cpu_per_step_s'] * 1e3:.1f} ms per process and step "
                     f"= x{rc['factor']:.2f} the layer microbenchmarks; blocked {rc['blocked_s'] * 1e3:.2f} ms per "
                     f"layer action (measured, {rc['cores_available']:.2f} cores available)")
    rcx = dev.get("runner_cpu") or {}
    if rcx.get("corun"):
        lines.append("co-running slowdown of a layer's CPU time with n processes at once: "
                     + ", ".join(f"n={n} x{v:.3f}" for n, v in rcx["corun"]["table"].items() if n != "1")
                     + " (measured)")
    if "transfer_cpu_s" in rcx:
        lines.append(f"runner CPU of one stage-to-stage transfer (both ends): {rcx['transfer_cpu_s'] * 1e6:.0f} us "
                     f"(measured, fitted on GPipe jobs at pp 2 and 4)")
    lines += [f"warning: {w}" for w in meta.get("warnings") or []]
    emit(args, dev, "\n".join(lines))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine at the runner's shapes (data/devices/NAME.json; "
                                         "about 40 s on a quiet 2-core machine, 90 s on a busy one)")
    p.add_argument("--out", required=True, metavar="PATH", help="device file to write, e.g. data/devices/cpu.json")
    p.add_argument("--name", default=None, help="device name (default: the file's stem)")
    p.add_argument("--model", default=None, help="runner model (default tiny-runner)")
    p.add_argument("--micro-batch-size", type=positive_int("micro_batch_size"), default=2)
    p.add_argument("--group-sizes", default="2,4", help="EP / world sizes for gloo all-to-all (default 2,4)")
    p.add_argument("--repeats", type=positive_int("repeats"), default=7,
                   help="timed repeats of each calibration measurement (median kept)")
    add_json(p)
    p.set_defaults(func=cmd_calibrate)
