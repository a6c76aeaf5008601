"""The analytic overlap spread between layer-kind combinations, at the default plan and where a large spread
can arise (long sequences, EP across nodes, TP), from the mechanism alone (no constant tuned to a target).

For every ordered pair of layer kinds (forward of a ``kind_f`` layer for micro-batch i+1 against the backward,
B then W, of a ``kind_b`` layer for micro-batch i) the analytic backend gives ``t_a``, ``t_b`` and ``t_ab`` in the
best issue order (kernel-class contention, :mod:`tessera_lab.cost.contention`). Printed per condition:

* overlap gain ``g = t_a + t_b - t_ab`` (seconds saved) and its share of the standalone sum;
* spread = max / min over the combinations of that condition, of the gain and of its share (the paper reports
  "up to 3x"); a pair that hides under 1 us has nothing to overlap (no collective in either layer, e.g. two
  dense layers at TP 1) and makes the spread infinite, so ``comm_spread`` gives max / min over the pairs that do.

Overlap rates come from what the two streams share (SMs held by the collective, HBM, the one host thread,
``cost.contention.shared_rates``), each rate cited in ``data/hardware/cost_model.json``; nothing is fitted.
Per model (``MODELS``): each shipped model's layer kinds at the default layout (64 H200, EP 8 inside a node) and
at TP 2 (the mixers then communicate too).

Run: python benchmarks/bench_overlap_spread.py [--json PATH]   (costs: analytic; ~10 s)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: condition -> (model, ParallelConfig keywords, GPU); pp=1 so the pair runs on one rank of the stage
CONDITIONS = {
    "default (Qwen3-Next, seq 4k, ep 8 in a node)": ("qwen3-next-80b-a3b", {}, "H200"),
    "long sequence (seq 32k)": ("qwen3-next-80b-a3b", {"seq_len": 32768}, "H200"),
    "EP across nodes (ep 32, 4 nodes)": ("qwen3-next-80b-a3b", {"ep": 32, "pp": 1}, "H200"),
    "TP 2 (ep 8, tp 2)": ("qwen3-next-80b-a3b", {"tp": 2}, "H200"),
    "long sequence + EP across nodes": ("qwen3-next-80b-a3b", {"seq_len": 32768, "ep": 32, "pp": 1}, "H200"),
}


#: models whose layer-pair kinds the per-model table covers (hybrid linear/full attention, dense + MoE, Mamba)
MODELS = ("qwen3-next-80b-a3b", "qwen3.5-35b-a3b", "qwen3-235b-a22b", "qwen3-30b-a3b", "kimi-linear-48b-a3b",
          "minimax-m1", "deepseek-v3", "glm-4.5-air", "jamba-1.5-mini", "nemotron-h-56b", "gpt-oss-120b")
#: per-model layouts: the default (EP 8 inside a node, TP 1) and TP 2
MODEL_LAYOUTS = {"default (ep 8, tp 1)": {}, "tp 2": {"tp": 2}}
#: a pair hiding less than this (seconds) has nothing to overlap
NO_GAIN_S = 1e-6


def _ratio(values: list[float]) -> float:
    """max / min of ``values`` (inf when the smallest is 0, nan when empty or all 0)."""
    if not values or max(values) <= 0:
        return float("nan")
    return max(values) / min(values) if min(values) > 0 else float("inf")


def model_spreads(gpu: str = "H200") -> dict:
    """Per model of :data:`MODELS` and layout of :data:`MODEL_LAYOUTS`: :func:`spread_for`'s result, or the
    error line when the layout does not fit the model."""
    from tessera_lab.errors import TesseraError
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model

    out: dict = {}
    for name in MODELS:
        for layout, kw in MODEL_LAYOUTS.items():
            try:
                out[f"{name} | {layout}"] = spread_for(load_model(name), ParallelConfig(**kw), gpu)
            except TesseraError as exc:
                out[f"{name} | {layout}"] = {"error": str(exc)}
    return out


def spread(model_name: str, kw: dict, gpu: str) -> dict:
    """The pair rows and spreads of one condition: ``model_name`` at ``ParallelConfig(**kw)`` on ``gpu``."""
    from tessera_lab.model.hardware import ParallelConfig
    from tessera_lab.model.spec import load_model

    return spread_for(load_model(model_name), ParallelConfig(**kw), gpu)


def scenario_spreads(gpu: str = "H200") -> dict:
    """Per paper scenario (``data/paper/scenarios``): the spread at the scenario's own stand-in model and layout
    (its EP placement, sequence and dispatcher), so each model the paper's jobs stand for gets its figure; a model
    with one layer kind has one pair kind, spread 1 by construction."""
    from tessera_lab.report.scenarios import load_scenarios

    out = {}
    for sc in load_scenarios():
        res = spread_for(sc.model(), sc.parallel(), gpu)
        res.update(model=sc.model().name, layout=f"pp {sc.layout['pp']} x ep {sc.layout['ep']} x dp {sc.layout['dp']}, "
                   f"seq {sc.layout.get('seq_len', 4096)}, {sc.layout.get('dispatcher', 'alltoall')}")
        out[sc.id] = res
    return out


def spread_for(model, par, gpu: str) -> dict:
    """Pair rows (ms), the spread of the gain and of its share, and the contention used, for ``model`` (a
    ModelSpec) at ``par`` on ``gpu``; analytic backend, best issue order."""
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.cost.host import task_kernels
    from tessera_lab.model.tasks import layer_tasks
    from tessera_lab.overlap.core import bundle, layer_kind_examples, measure_pair

    cm = CostModel(cluster_for(par, gpu), par)
    rows = []
    ex = layer_kind_examples(model)
    for kf, lf in ex.items():
        for kb, lb in ex.items():
            r = measure_pair(bundle(model, lf, "F", par, name="F"), bundle(model, lb, "BW", par, name="BW"),
                             "analytic", cost_model=cm, budget=2000)
            gain = r.t_a + r.t_b - r.t_ab
            # one host thread issues both sides' kernels (cost/host.py counts, host_s_per_kernel each): a floor
            issue = sum(task_kernels(t, precision=par.precision, grouped_impl=par.grouped_gemm, params=cm.a,
                                     microbatches=par.microbatches)
                        for t in layer_tasks(model, lf, par).F + layer_tasks(model, lb, par).B
                        + layer_tasks(model, lb, par).W) * cm.a["host_s_per_kernel"]
            rows.append({"pair": f"F[{kf}] + BW[{kb}]", "t_a_ms": r.t_a * 1e3, "t_b_ms": r.t_b * 1e3,
                         "t_ab_ms": r.t_ab * 1e3, "gain_ms": gain * 1e3, "gain_share": gain / (r.t_a + r.t_b),
                         "hidden_comm": r.comm_hidden_fraction, "host_issue_ms": issue * 1e3})
    for row in rows:
        if row["gain_ms"] < NO_GAIN_S * 1e3:
            row["gain_ms"] = row["gain_share"] = 0.0
    gains = [row["gain_ms"] for row in rows]
    shares = [row["gain_share"] for row in rows]
    return {"rows": rows, "spread": _ratio(gains), "share_spread": _ratio(shares),
            "comm_spread": _ratio([g for g in gains if g > 0]), "no_overlap_pairs": sum(g <= 0 for g in gains),
            "contention": "shared resources per task pair (cost.contention.shared_rates)" if cm.shared
            else cm.contention.as_dict()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    out = {}
    print("costs: analytic (contention from shared SMs, HBM and host issue per task pair; no measured profile)")
    for name, (model, kw, gpu) in CONDITIONS.items():
        res = out[name] = spread(model, kw, gpu)
        print(f"\n{name}: spread of the overlap gain {res['spread']:.2f}x (seconds saved), "
              f"{res['share_spread']:.2f}x (share of the standalone sum)")
        for row in res["rows"]:
            print(f"  {row['pair']:52s} t_a {row['t_a_ms']:7.3f}  t_b {row['t_b_ms']:7.3f}  t_ab {row['t_ab_ms']:7.3f} ms"
                  f"  gain {row['gain_ms']:6.3f} ms ({row['gain_share']:5.1%})  comm hidden {row['hidden_comm']:5.1%}")
    print("\nper paper scenario, at its own stand-in model and layout (the paper: up to 3x between layer combinations)")
    out["scenarios"] = scen = scenario_spreads()
    for sid, res in scen.items():
        kinds = len(res["rows"])
        print(f"  {sid:22s} {res['model'][:40]:40s} {res['layout']:44s} pair kinds {kinds:2d}  spread of the gain "
              f"{res['spread']:.2f}x, of its share {res['share_spread']:.2f}x  comm hidden "
              f"{min(r['hidden_comm'] for r in res['rows']):.0%}-{max(r['hidden_comm'] for r in res['rows']):.0%}  "
              f"host issue / together <= {max(r['host_issue_ms'] / r['t_ab_ms'] for r in res['rows']):.2f}")
    print("\nper model, at the default layout (64 H200, EP 8 in a node) and at TP 2 (the paper: up to 3x, measured on its"
          " Qwen3-Next and Qwen3 jobs; no per-model figure)")
    out["models"] = models = model_spreads()
    for key, res in models.items():
        if "error" in res:
            print(f"  {key:44s} not planned: {res['error']}")
            continue
        print(f"  {key:44s} pair kinds {len(res['rows']):2d}  spread of the gain {res['spread']:.2f}x, of its share "
              f"{res['share_spread']:.2f}x; among pairs that communicate {res['comm_spread']:.2f}x "
              f"({res['no_overlap_pairs']} with nothing to overlap)")
    if args.json:
        from tessera_lab.io import write_json

        write_json(args.json, out)


if __name__ == "__main__":
    main()
