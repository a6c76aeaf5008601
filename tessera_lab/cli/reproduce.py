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
              "T_baseline / T_plan - 1, setups planned with the host/sync term off; host/sync term: both sides "
              "planned again with the planner's term (cost/sync.py's fitted seconds per host wait: all of them in a "
              "forward run apart, beyond the paired expert backward in a forward the EP overlap pairs))\n" + bands)


#: the line that heads the per-scenario table of :func:`claims_markdown`
SCENARIO_HEAD = ("Per scenario (gain = `T_baseline / T_plan - 1`; band over the knobs; \"partition\": proven optimal or "
                 "the ILP's work budget decided -- a count of binaries and branch-and-bound nodes, so the same on an "
                 "idle and on a loaded machine):")


def claims_markdown(rep) -> str:
    """The verdicts (with the rules they were judged by), their reasons and the per-scenario gains as Markdown: the
    block docs/reproduce.md holds (``scripts/claims.py`` checks it against a fresh run)."""
    import math

    def pct(x) -> str:
        return "no fit" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.1%}"

    recs = rep.claims.to_dict(orient="records")
    out = ["| claim | paper | ours (simulated) | verdict (rule) |", "|---|---|---|---|"]
    for r in recs:
        rules = ", ".join(part.split(":")[0].strip() for part in r["rule"].split("; ") if ":" in part)
        out.append(f"| {r['claim']} | {r['paper']} | {r['ours']} | **{r['verdict']}**"
                   + (f" ({rules}) |" if rules else " |"))
    out += ["", "Why (as `reproduce` prints it):", ""]
    out += [f"- {r['verdict']}" + (f" ({r['rule']})" if r["verdict"] != "not modelled" else "")
            + f": {r['claim']}: {r['reason']}" for r in recs]
    out += ["", SCENARIO_HEAD, "",
            "| scenario | plan | MFU after | band | vs even 1F1B | vs even | vs standalone | vs parameters | "
            "vs Megatron-Core | vs Megatron-Core, host/sync term | partition |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    bands = {s["id"]: s["mfu_band"] for s in rep.scenarios}
    for b in sorted(rep.baselines.to_dict(orient="records"), key=lambda r: r["scenario"]):
        lo, hi = bands[b["scenario"]]
        out.append(f"| `{b['scenario']}` | {b['after_schedule']} | {b['after_mfu']:.1%} | {lo:.1%}-{hi:.1%} | "
                   + " | ".join(pct(b.get(f"gain_vs_{k}")) for k in ("even_1f1b", "even", "standalone", "parameters",
                                                                     "megatron_core", "megatron_core_with_sync"))
                   + f" | {'proven optimal' if b['proven_optimal'] else 'work budget: heuristic plan'} |")
    return "\n".join(out) + "\n"


def cmd_reproduce(args: argparse.Namespace) -> int:
    from tessera_lab.report.reproduce import reproduce, write
    from tessera_lab.report.scenarios import load_scenarios

    load_scenarios(args.scenario)  # an unknown id: one line, exit 2, before any planning
    rep = reproduce(quick=args.quick, scenarios=args.scenario)
    paths = write(rep, args.out)
    rows = [{"file": p.name, "path": str(p)} for p in paths]
    text = claims_text(rep) + "\n\n" + table(rows) + "\n" + "\n".join(f"- {n}" for n in rep.notes)
    if args.markdown:
        text = claims_markdown(rep)
    emit(args, rep.as_dict() | {"files": [str(p) for p in paths]}, text)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("reproduce", help="the paper's claims on its jobs as scenarios, with computed verdicts "
                                         "(PNG, JSON, Markdown)")
    p.add_argument("--out", metavar="DIR", required=True, help="folder for the figures and tables")
    p.add_argument("--quick", action="store_true", help="fewer expert widths in the width study (seconds, not minutes)")
    p.add_argument("--markdown", action="store_true",
                   help="print the verdicts, their reasons and the per-scenario gains as Markdown (docs/reproduce.md)")
    p.add_argument("--scenario", action="append", metavar="ID",
                   help="run only this scenario of data/paper/scenarios (repeatable; default all)")
    add_json(p)
    p.set_defaults(func=cmd_reproduce)
