"""``tessera-lab reproduce``: the paper's claims on its jobs as scenarios, each with a verdict computed from numbers."""

from __future__ import annotations

import argparse

from tessera_lab.cli.common import add_json, emit, table


def claims_text(rep) -> str:
    """The claim rows and a band per scenario, as text."""
    from tessera_lab.report.claims import GAIN_RULE, ONE_LAYOUT_RULE, RANGE_RULE, VALUE_RULE

    recs = rep.claims.to_dict(orient="records")

    def judged(r) -> str:  # the verdict with the rules (thresholds) it was judged by
        if r["verdict"] == "not modelled":
            return r["verdict"]
        return f"{r['verdict']} [{', '.join(part.split(':')[0] for part in r['rule'].split('; '))}]"

    claims = table([{"claim": r["claim"], "paper": r["paper"], "ours (simulated)": r["ours"], "verdict": judged(r)}
                    for r in recs])
    claims += "\nverdict thresholds: " + "; ".join((GAIN_RULE, VALUE_RULE, RANGE_RULE, ONE_LAYOUT_RULE))
    reasons = "\n".join(f"- {r['verdict']}" + (f" ({r['rule']})" if r["verdict"] != "not modelled" else "")
                         + f": {r['claim']}: {r['reason']}" for r in recs)
    bands = table([{"scenario": s["id"], "GPUs": s["gpus"], "model": s["model"], "MFU after": f"{s['after']['mfu']:.1%}",
                    "MFU band": f"{s['mfu_band'][0]:.1%}-{s['mfu_band'][1]:.1%}",
                    "EP hidden band": f"{s['ep_hidden_band'][0]:.0%}-{s['ep_hidden_band'][1]:.0%}",
                    **{f"gain vs {k}": (f"{b['gain']:+.1%}" if b["fits"] else "no fit")
                       for k, b in s["baselines"].items()},
                    "gain vs megatron_core, host/sync term": (
                        f"{s['baselines']['megatron_core']['gain_with_sync']:+.1%}"
                        if s["baselines"]["megatron_core"]["fits"] else "no fit")} for s in rep.scenarios])
    return ("paper claims (verdict computed from the numbers; docs/reproduce.md)\n" + claims + "\n\nwhy\n" + reasons
            + "\n\nscenarios (simulated; band over EP placement, dispatcher, grouped GEMM, sequence length; gains: "
              "T_baseline / T_plan - 1, setups planned with the host/sync term off; host/sync term: Megatron-Core "
              "re-planned with the planner's term (cost/sync.py's fitted per-layer seconds where its schedule has "
              "no EP overlap))\n" + bands)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from tessera_lab.report.reproduce import reproduce, write
    from tessera_lab.report.scenarios import load_scenarios

    load_scenarios(args.scenario)  # an unknown id: one line, exit 2, before any planning
    rep = reproduce(quick=args.quick, scenarios=args.scenario)
    paths = write(rep, args.out)
    rows = [{"file": p.name, "path": str(p)} for p in paths]
    text = claims_text(rep) + "\n\n" + table(rows) + "\n" + "\n".join(f"- {n}" for n in rep.notes)
    emit(args, rep.as_dict() | {"files": [str(p) for p in paths]}, text)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="the paper's claims on its jobs as scenarios, with computed verdicts "
                                         "(PNG, JSON, Markdown)")
    p.add_argument("--out", metavar="DIR", required=True, help="folder for the figures and tables")
    p.add_argument("--quick", action="store_true", help="fewer expert widths in the width study (seconds, not minutes)")
    p.add_argument("--scenario", action="append", metavar="ID",
                   help="run only this scenario of data/paper/scenarios (repeatable; default all)")
    add_json(p)
    p.set_defaults(func=cmd_reproduce)
