"""The Megatron-MoE-ModelZoo Qwen3 layouts against their published step times: planned from the CLI, and ranked.

Six layouts of ``data/published/megatron_moe_modelzoo.json`` (BF16, sequence 4096, H100): r1..r5 are
Qwen3-235B-A22B on 256 GPUs, n1 Qwen3-Next-80B-A3B on 128 GPUs. Two things are checked:

* **They plan from the CLI.** Each is planned with ``tessera-lab plan``'s parser and planner and the options the
  search issue lists (``LAYOUTS``: TP, EP, PP, VPP, schedule, micro-batches, dispatcher, recompute modules, FSDP,
  the embedding/loss-accounted split); the benchmark prints whether it plans and fits memory and its peak memory.
* **Their order.** The predicted iteration of each is the fidelity set's (:func:`bench_public_runs.predict` of the
  data file's row, with the shipped fitted host/sync term): one mapping of a published run onto a layout, shared
  with ``bench_public_runs.py``, which follows each recipe further than the CLI options do (the expert grid on
  consecutive ranks, as Megatron-Core builds it with expert TP 1; r3's plain schedule, no EP overlap; forced
  balance where the recipe forces it; the fused cross entropy and grouped GEMM of the recipes). The order of r1..r5
  by predicted time is compared with the published order (r2, r3 < r1 < r4 < r5, ties within 5%): Kendall's tau-b
  over the pairs and the pairs that agree, a published tie (within 5%) agreeing with any predicted order. These
  are test runs of the fidelity set (nothing is fitted on them); the result is printed, never tuned to. The order
  is printed again with the fitted host/sync term off (:mod:`tessera_lab.cost.sync`), so a ranking the fitted term
  decides shows as such.

Run: python benchmarks/bench_modelzoo_ranking.py [--json PATH] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import time

BASE = ["--gpu", "H100", "--seq-len", "4096"]
R1 = ["--tp", "2", "--ep", "32", "--ep-spans-tp", "--dp", "1", "--pp", "8", "--vpp", "4", "--schedule", "interleaved",
      "-m", "128", "--dispatcher", "deepep", "--recompute", "selective", "--recompute-modules", "layernorm,moe_act"]
#: label -> (published run id in megatron_moe_modelzoo.json, plan options)
LAYOUTS = {
    "r1": ("mz/qwen3-235b-a22b/256xH100/bf16/deepep-tp2-pp8-vp4-ep32", ["--model", "qwen3-235b-a22b", *R1]),
    "r2": ("mz/qwen3-235b-a22b/256xH100/bf16/deepep-tp2-pp8-vp4-ep32-a2a-overlap",
           ["--model", "qwen3-235b-a22b", *[("interleaved-overlapped" if a == "interleaved" else a) for a in R1]]),
    "r3": ("mz/qwen3-235b-a22b/256xH100/bf16/deepep-tp2-ep8-fsdp",
           ["--model", "qwen3-235b-a22b", "--tp", "2", "--ep", "8", "--dp", "16", "--pp", "1", "--micro-batch-size",
            "4", "-m", "4", "--dispatcher", "deepep", "--recompute", "full", "--fsdp"]),
    "r4": ("mz/qwen3-235b-a22b/256xH100/bf16/a2a-tp2-pp32-vp3-ep8",
           ["--model", "qwen3-235b-a22b", "--tp", "2", "--ep", "8", "--ep-spans-tp", "--dp", "1", "--pp", "32",
            "--vpp", "3", "--schedule", "interleaved", "-m", "512", "--dispatcher", "alltoall", "--recompute",
            "selective", "--recompute-modules", "layernorm,moe_act",
            "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]),
    "r5": ("mz/qwen3-235b-a22b/256xH100/bf16/deepep-tp4-pp8-vp4-ep8",
           ["--model", "qwen3-235b-a22b", "--tp", "4", "--ep", "8", "--dp", "1", "--pp", "8", "--vpp", "4",
            "--schedule", "interleaved", "-m", "256", "--dispatcher", "deepep"]),
    "n1": ("mz/qwen3-next-80b-a3b/128xH100/bf16/deepep-pp4-vp3-ep32",
           ["--model", "qwen3-next-80b-a3b", "--tp", "1", "--ep", "32", "--dp", "1", "--pp", "4", "--vpp", "3",
            "--schedule", "interleaved", "-m", "8", "--dispatcher", "deepep", "--recompute", "selective",
            "--recompute-modules", "layernorm,moe_act,shared_experts"]),
}
#: the published order of r1..r5 (the issue of the search: r2, r3 < r1 < r4 < r5)
ORDERED = ("r1", "r2", "r3", "r4", "r5")
TIE = 0.05
#: settings beside the recipe mapping, planned as a sensitivity (never the acceptance figure): label -> (the data
#: row's fields changed, why). r3's command in the commit that published the table (yanring/Megatron-MoE-ModelZoo@
#: 8017e112, examples/qwen3/run_235b.sh) passes no --grad-reduce-in-bf16, so its Megatron-Core (1e057005) reduces the
#: gradients in fp32 for bf16 training (megatron/training/arguments.py, accumulate_allreduce_grads_in_fp32), as the
#: mapping plans; NVIDIA's own Megatron-FSDP MoE example reduces them in bf16
#: (examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh, --megatron-fsdp-grad-comm-dtype bf16, NVIDIA/Megatron-LM@d98e8a64).
UNPUBLISHED = {"r3": ({"grad_reduce_dtype": "bf16"},
                      "gradients reduce-scattered in bf16 (its published command reduces them in fp32, Megatron-Core "
                      "1e057005's default without --grad-reduce-in-bf16; NVIDIA's Megatron-FSDP DeepSeek-V3 example "
                      "reduces in bf16)")}


def published_times() -> dict[str, float]:
    """Step times of the six layouts from data/published/megatron_moe_modelzoo.json, by run id."""
    from tessera_lab.io import read_json
    from tessera_lab.paths import data_dir

    runs = {r["id"]: r for r in read_json(data_dir() / "published" / "megatron_moe_modelzoo.json")["runs"]}
    return {label: float(runs[run_id]["step_time_s"]) for label, (run_id, _) in LAYOUTS.items()}


def plan_one(argv: list[str]) -> dict:
    """Plan one layout with the CLI's parser and planner; ``fits``/``iteration_time_s``/``peak_gib`` or ``error``."""
    from tessera_lab.cli.common import model_from_args, parallel_from_args, split_from_args
    from tessera_lab.cli.main import build_parser
    from tessera_lab.errors import TesseraError
    from tessera_lab.plan.make import make_plan

    args = build_parser("plan").parse_args(["plan", *BASE, *argv])
    t0 = time.process_time()
    try:
        model, par = model_from_args(args), parallel_from_args(args)
        bounds = split_from_args(args, model, par)
        plan = make_plan(model, par, None, method="uniform" if bounds else args.method, gpu=args.gpu,
                         boundaries=bounds, **({"baselines": ()} if bounds else {}))
    except TesseraError as exc:
        return {"error": str(exc).splitlines()[0], "cpu_s": time.process_time() - t0}
    ev = plan.chosen
    peak = max(ev.rank_memory(par.pp))  # a pipeline rank's virtual stages summed
    return {"fits": bool(ev.fits_memory), "iteration_time_s": ev.iteration_time_s, "peak_gib": peak / 2**30,
            "cpu_s": time.process_time() - t0}


def rank_agreement(pred: dict[str, float], pub: dict[str, float]) -> dict:
    """Pairs of ``ORDERED`` whose predicted order matches the published one (a published tie within ``TIE``
    agrees with any order) and Kendall's tau-b of the two orders (pairs tied in either order left out of the
    numerator, tau-b's denominator). ``predicted_ties``: the disagreeing pairs whose predicted times are within
    ``TIE`` of each other (the acceptance's "ties within 5% allowed" read on the planner's side); ``agree_or_tied``
    counts them with the agreeing pairs. Both counts are reported, the strict one first."""
    have = [k for k in ORDERED if k in pred and k in pub]
    agree, pairs, bad = 0, 0, []
    for i, a in enumerate(have):
        for b in have[i + 1:]:
            pairs += 1
            if _within(pub[a], pub[b]) or (pub[a] < pub[b]) == (pred[a] < pred[b]):
                agree += 1
            else:
                bad.append(f"{a}/{b}")
    tau = _tau_b([pub[k] for k in have], [pred[k] for k in have])
    tied = [ab for ab in bad if _within(*(pred[k] for k in ab.split("/")))]
    return {"layouts": have, "pairs": pairs, "agree": agree, "disagree": bad, "kendall_tau_b": float(tau),
            "predicted_ties": tied, "agree_or_tied": agree + len(tied)}


def _within(a: float, b: float) -> bool:
    """Whether two times are within :data:`TIE` of the smaller."""
    return abs(a - b) <= TIE * min(a, b)


def _tau_b(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b: (concordant - discordant) / sqrt((n0 - ties in x) (n0 - ties in y)); NaN under 2 items."""
    conc = disc = tx = ty = n0 = 0
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            n0 += 1
            dx, dy = x[i] - x[j], y[i] - y[j]
            tx += dx == 0
            ty += dy == 0
            conc += dx * dy > 0
            disc += dx * dy < 0
    den = ((n0 - tx) * (n0 - ty)) ** 0.5
    return (conc - disc) / den if den else float("nan")


def recipe_rows(host_sync_s: float | None = None, changes: dict[str, dict] | None = None) -> dict[str, dict]:
    """Each layout planned as the fidelity set plans its run (:func:`bench_public_runs.predict` of its row in
    data/published; ``host_sync_s`` as there: ``None`` the shipped fitted value, 0 off), with ``changes`` (label ->
    fields) applied to a row first: ``fits``/``iteration_time_s``/``peak_gib`` by label."""
    from bench_public_runs import predict

    from tessera_lab.io import read_json
    from tessera_lab.paths import data_dir

    runs = {r["id"]: r for r in read_json(data_dir() / "published" / "megatron_moe_modelzoo.json")["runs"]}
    out = {}
    for label, (run_id, _) in LAYOUTS.items():
        row = predict(dict(runs[run_id], **(changes or {}).get(label, {})), host_sync_s)
        out[label] = {"fits": bool(row["fits_memory"]), "iteration_time_s": row["iteration_time_s"],
                      "peak_gib": row["peak_memory_gib"]}
    return out


def evaluate() -> dict:
    """Plan every layout from the CLI (``cli_rows``), and as the fidelity set does with the fitted host/sync term
    (``rows``), with it off (``rows_without_sync_term``) and with :data:`UNPUBLISHED` settings
    (``rows_unpublished_settings``); each order's agreement with ``published_s`` (the keys :func:`main` writes with
    ``--json``)."""
    pub = published_times()
    cli = {label: plan_one(argv) for label, (_, argv) in LAYOUTS.items()}
    rows, off = recipe_rows(None), recipe_rows(0.0)
    alt = recipe_rows(None, {label: fields for label, (fields, _) in UNPUBLISHED.items()})

    def times(rs):
        return {k: r["iteration_time_s"] for k, r in rs.items() if r["fits"]}

    return {"cli_rows": cli, "rows": rows, "published_s": pub, "agreement": rank_agreement(times(rows), pub),
            "agreement_cli": rank_agreement(times({k: c for k, c in cli.items() if "error" not in c}), pub),
            "rows_without_sync_term": off, "agreement_without_sync_term": rank_agreement(times(off), pub),
            "rows_unpublished_settings": {k: alt[k] for k in UNPUBLISHED},
            "agreement_unpublished_settings": rank_agreement(times(rows) | times(
                {k: alt[k] for k in UNPUBLISHED}), pub)}


def fsdp_expert_floor_s(model, *, ep: int, gpus: int, tp: int, micro_batch_size: int, global_batch: int,
                        nic_bytes_per_s: float, param_bytes: int = 2, grad_bytes: int = 4) -> dict:
    """The least time Megatron FSDP's expert traffic takes on one GPU's NIC in one iteration (a floor: every byte at
    the NIC's line rate, none hidden behind another, the dense layers' traffic left out): with
    ``optim_grads_params`` sharding (Megatron-Core 1e057005, ``custom_fsdp/fully_sharded_data_parallel.py``:
    parameters released after the forward and the backward, gradients reduce-scattered after every backward,
    "For grads shard mode there will actually always be gradient sync happening") each micro-batch all-gathers a
    rank's experts twice (forward, backward; the full recompute runs inside the backward's gather) in
    ``param_bytes`` and reduce-scatters their gradients once in ``grad_bytes`` (4: fp32, Megatron's default for bf16
    training without --grad-reduce-in-bf16), each moving (edp - 1) / edp of the buffer through every rank's NIC
    (ring; the expert data-parallel group one rank a node when EP fills a node). Micro-batches = global batch /
    (micro_batch_size x gpus / tp). Returns ``{"seconds", "microbatches", "edp", "expert_params_per_rank"}``."""
    experts = sum(1 for ly in model.stack.layers if ly.ffn == "moe") * model.moe.num_experts
    per_rank = experts // ep * 3 * model.hidden_size * model.moe.moe_intermediate_size
    edp = gpus // ep
    microbatches = global_batch // (micro_batch_size * gpus // tp)
    moved = microbatches * per_rank * (2 * param_bytes + grad_bytes) * (edp - 1) / edp
    return {"seconds": moved / nic_bytes_per_s, "microbatches": microbatches, "edp": edp,
            "expert_params_per_rank": per_rank}


def fsdp_floor_text() -> str:
    """r3's published step time against :func:`fsdp_expert_floor_s` of its layout as the table reads (TP 2, DP 128,
    GA 4) and as the commit's script reads (TP 1, GA 2), at the H100's NIC line rate and at the cost model's bus
    efficiency across nodes (``nccl_bus_efficiency_inter_node``); one sentence, computed."""
    from tessera_lab.io import read_json
    from tessera_lab.model.hardware import hardware_data
    from tessera_lab.model.spec import load_model
    from tessera_lab.paths import data_dir

    model = load_model("qwen3-235b-a22b")
    nic = hardware_data()["gpus"]["H100-SXM"]["nic_gb_per_s_per_direction"] * 1e9
    eff = read_json(data_dir() / "hardware" / "cost_model.json")["nccl_bus_efficiency_inter_node"]["value"]
    pub = published_times()["r3"]
    table = fsdp_expert_floor_s(model, ep=8, gpus=256, tp=2, micro_batch_size=4, global_batch=2048,
                                nic_bytes_per_s=nic)
    script = fsdp_expert_floor_s(model, ep=8, gpus=256, tp=1, micro_batch_size=4, global_batch=2048,
                                 nic_bytes_per_s=nic)
    return (f"r3's FSDP floor (computed; fsdp_expert_floor_s): its {table['expert_params_per_rank'] / 1e9:.2f} B "
            f"expert parameters a rank, all-gathered twice in bf16 and reduce-scattered once in fp32 per micro-batch "
            f"over an expert data-parallel group of {table['edp']}, take {table['seconds']:.2f} s of one GPU's "
            f"{nic / 1e9:.0f} GB/s NIC at line rate in the table's layout (TP 2, {table['microbatches']} "
            f"micro-batches), {table['seconds'] / eff:.2f} s at the cost model's inter-node bus efficiency {eff:g}, "
            f"against "
            f"{pub:g} s published: the table's layout reaches its time only with every byte at line rate and hidden; "
            f"the commit's script runs the row at TP 1 ({script['microbatches']} micro-batches, floor "
            f"{script['seconds']:.2f} s)")


def _unpublished_text(res: dict) -> str:
    """The sensitivity to settings the recipes do not use (:data:`UNPUBLISHED`), one sentence, computed."""
    alt, a = res["rows_unpublished_settings"], res["agreement_unpublished_settings"]
    parts = [f"{k} with {UNPUBLISHED[k][1]}: {r['iteration_time_s']:.2f} s (simulated, published "
             f"{res['published_s'][k]:g} s)" for k, r in alt.items()]
    return ("sensitivity to a setting the recipe does not use (not the acceptance figure, which keeps the recipe "
            "mapping): " + "; ".join(parts) + f"; the order then agrees on {a['agree']} of {a['pairs']} "
            f"pairs, disagreeing {', '.join(a['disagree']) or 'none'} (computed)")


def markdown(res: dict) -> str:
    """The table and agreement figures docs/search.md quotes ("The Megatron-MoE-ModelZoo Qwen3 table"), computed
    from :func:`evaluate`'s result: per layout the CLI options and what ``plan`` gives for them (fits, peak memory,
    computed), the recipe mapping's predicted iteration (simulated) with the fitted term and with it off, the
    published step (cited) and predicted / published; then both orders' agreement."""
    rows, pub, off, cli = res["rows"], res["published_s"], res["rows_without_sync_term"], res["cli_rows"]
    out = ["| layout | `plan` options (after `--gpu H100 --seq-len 4096`) | `plan`: peak GiB (computed) | "
           "`plan`: iteration s (simulated) | predicted s (simulated, recipe mapping) | the same, host/sync term off "
           "| published s | predicted / published |", "|---|---|---|---|---|---|---|---|"]
    for label, (_, argv) in LAYOUTS.items():
        r, o, c = rows[label], off[label], cli[label]
        model, opts = argv[1], " ".join(argv[2:])
        planned = (f"cannot plan: {c['error']} | -" if "error" in c
                   else f"{c['peak_gib']:.2f}{'' if c['fits'] else ' (does not fit)'} | {c['iteration_time_s']:.2f}")
        out.append(f"| {label} | {model} `{opts}` | {planned} | {r['iteration_time_s']:.2f}"
                   f"{'' if r['fits'] else ' (does not fit)'} | {o['iteration_time_s']:.2f} | {pub[label]:g} | "
                   f"{r['iteration_time_s'] / pub[label]:.2f} |")
    a, b, p = res["agreement"], res["agreement_without_sync_term"], res["agreement_cli"]
    fits = sum(1 for c in cli.values() if "error" not in c and c["fits"])
    out += ["", f"{fits} of {len(cli)} layouts plan from the CLI and fit; planned with `plan`'s options their order "
            f"agrees with the published one on {p['agree']} of {p['pairs']} pairs (Kendall's tau-b "
            f"{p['kendall_tau_b']:.2f}; disagreeing: {', '.join(p['disagree']) or 'none'}). Rank agreement over "
            f"{', '.join(a['layouts'])} (recipe mapping; published ties within {TIE:.0%} agree with either order): "
            f"{a['agree']} of {a['pairs']} pairs, Kendall's tau-b {a['kendall_tau_b']:.2f}; disagreeing: "
            f"{', '.join(a['disagree']) or 'none'}; of those, predicted within {TIE:.0%} of each other: "
            f"{', '.join(a['predicted_ties']) or 'none'}, so {a['agree_or_tied']} of {a['pairs']} pairs agree or are "
            f"tied. With the fitted host/sync term off: {b['agree']} of {b['pairs']} pairs, Kendall's tau-b "
            f"{b['kendall_tau_b']:.2f}; disagreeing: {', '.join(b['disagree']) or 'none'} (all computed).", "",
            "S" + _unpublished_text(res)[1:] + ".", "", fsdp_floor_text() + "."]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="write the rows and the agreement here")
    ap.add_argument("--markdown", action="store_true", help="print only the table of docs/search.md (markdown)")
    args = ap.parse_args()
    load0 = os.getloadavg()
    res = evaluate()
    if args.markdown:
        print(markdown(res))
        return
    print(f"load average before: {load0}")
    print("layouts: r1..r5 Qwen3-235B-A22B on 256 H100, n1 Qwen3-Next-80B-A3B on 128 H100 (the ModelZoo's Qwen3 table, "
          "BF16, sequence 4096; CLI options in LAYOUTS, recipe mapping in data/published/megatron_moe_modelzoo.json)")
    pub, rows, cli, agr, agr_off = (res[k] for k in ("published_s", "rows", "cli_rows", "agreement",
                                                      "agreement_without_sync_term"))
    for label, r in rows.items():
        c, pt = cli[label], pub.get(label)
        planned = (f"cannot plan ({c['error']})" if "error" in c else
                   f"fits {c['fits']}, peak {c['peak_gib']:.2f} GiB (computed); planner CPU {c['cpu_s']:.1f} s "
                   "(measured)")
        print(f"{label}: from the CLI: {planned}; recipe mapping: iteration {r['iteration_time_s']:.2f} s "
              f"(simulated), published {pt} s (data/published), ratio {r['iteration_time_s'] / pt:.2f}")
    print(f"acceptance figure (target: every pair in the published order, {agr['pairs']} of {agr['pairs']}), rank "
          f"agreement over {agr['layouts']} (recipe mapping): {agr['agree']} of {agr['pairs']} pairs (published ties within "
          f"{TIE:.0%} agree with any order); disagreeing pairs {agr['disagree'] or 'none'}; Kendall tau-b "
          f"{agr['kendall_tau_b']:.2f} (computed); of the disagreeing pairs, predicted within {TIE:.0%} of each "
          f"other (a tie in the prediction): {agr['predicted_ties'] or 'none'}, so {agr['agree_or_tied']} of "
          f"{agr['pairs']} pairs agree or are tied (computed)")
    cli_agr = res["agreement_cli"]
    print("planned with plan's CLI options (each as the issue lists them): " + ", ".join(
        f"{k} {c['iteration_time_s']:.2f} s" for k, c in cli.items() if "error" not in c)
          + f" (simulated); {cli_agr['agree']} of {cli_agr['pairs']} pairs agree, disagreeing "
          f"{cli_agr['disagree'] or 'none'}, Kendall tau-b {cli_agr['kendall_tau_b']:.2f} (computed)")
    print("with the fitted host/sync term off: " + ", ".join(
        f"{k} {r['iteration_time_s']:.2f} s" for k, r in res["rows_without_sync_term"].items())
          + f" (simulated); {agr_off['agree']} of {agr_off['pairs']} pairs agree, disagreeing "
          f"{agr_off['disagree'] or 'none'}, Kendall tau-b {agr_off['kendall_tau_b']:.2f} (computed)")
    print(_unpublished_text(res))
    print(fsdp_floor_text())
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
