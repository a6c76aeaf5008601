"""``tessera-lab models`` and ``tessera-lab params``: the shipped models and one model's parameter counts."""

from __future__ import annotations

import argparse

from tessera_lab.cli.common import add_json, emit, table


def cmd_models(args: argparse.Namespace) -> int:
    from tessera_lab.model.spec import load_model, shipped_models

    rows = []
    for name in shipped_models():
        m = load_model(name)
        c = m.param_counts()
        rows.append({
            "model": name, "type": m.model_type, "layers": m.num_layers, "hidden": m.hidden_size,
            "experts": m.num_experts, "top_k": m.num_experts_per_tok, "attention_ratio": m.attention_ratio,
            "total_B": c.total / 1e9, "active_B": c.active / 1e9,
        })
    text_rows = [{**{k: v for k, v in r.items() if k not in ("total_B", "active_B")},
                  "total": _count(r["total_B"] * 1e9), "active": _count(r["active_B"] * 1e9)} for r in rows]
    emit(args, {"models": rows}, table(text_rows, ".2f") + "\nparameters: computed from each config (B = 1e9, M = 1e6, k = 1e3)")
    return 0


def _count(n: float) -> str:
    """A parameter count with a decimal prefix: ``79.67 B``, ``36.86 k`` (the tiny runner model is not 0.00 B)."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f}"


def cmd_params(args: argparse.Namespace) -> int:
    from tessera_lab.model.spec import load_model

    m = load_model(args.model)
    c = m.param_counts().as_dict()
    rows = [{"count": k, "parameters": v, "billions": v / 1e9} for k, v in c.items()]
    emit(args, {"model": m.name, **c}, f"{m.name} ({m.model_type}, {m.num_layers} layers)\n" + table(rows, ".3f"))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the shipped models")
    add_json(p)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("params", help="parameter counts of a model")
    p.add_argument("model", help="a shipped model name or a config.json path")
    add_json(p)
    p.set_defaults(func=cmd_params)
