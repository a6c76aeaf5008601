"""``tessera-lab models`` and ``tessera-lab params``: the shipped models, the supported families and one model's
parameter counts."""

from __future__ import annotations

import argparse

from tessera_lab.cli.common import add_json, add_model_knobs, emit, model_from_args, table


def cmd_models(args: argparse.Namespace) -> int:
    from tessera_lab.model.families import READERS, family_name
    from tessera_lab.model.spec import load_model, shipped_models

    rows = []
    for name in shipped_models():
        m = load_model(name)
        c = m.param_counts()
        rows.append({
            "model": name, "type": m.model_type, "layers": m.num_layers, "hidden": m.hidden_size,
            "experts": m.moe.num_experts, "top_k": m.moe.num_experts_per_tok, "attention_ratio": m.attention_ratio,
            "mixers": m.mixer_kinds(), "total_B": c.total / 1e9, "active_B": c.active / 1e9,
        })
    fams = [{"family": family_name(r), "model_types": ", ".join(r.MODEL_TYPES), "example": r.EXAMPLE,
             "knobs": ", ".join(family_knobs(r)), "options": ", ".join(knob_options(family_knobs(r))),
             "source": r.SOURCE} for r in READERS]
    text_rows = [{**{k: v for k, v in r.items() if k not in ("total_B", "active_B")},
                  "total": _count(r["total_B"] * 1e9), "active": _count(r["active_B"] * 1e9)} for r in rows]
    text = (table(text_rows, ".2f") + "\nparameters: computed from each config (B = 1e9, M = 1e6, k = 1e3; MTP "
            "layers not included, see params)\n\nsupported families (tessera-lab plan --model NAME or a config.json) "
            "and the knob options of plan, report and params each takes (report --diff KEY=VALUE takes the knobs by "
            "their config names too):\n"
            + table([{k: v for k, v in f.items() if k not in ("source", "knobs")} for f in fams]))
    emit(args, {"models": rows, "families": fams}, text)
    return 0


def family_knobs(reader) -> list[str]:
    """The knobs (``with_changes`` keywords) a family takes: its reader's ``KNOBS``, plus ``num_layers``, which
    every family takes (:meth:`~tessera_lab.model.spec.ModelSpec.with_changes` re-derives the layer pattern)."""
    return sorted(set(getattr(reader, "KNOBS", {}) or {}) | {"num_layers"})


def knob_options(knobs: list[str]) -> list[str]:
    """The CLI options of ``knobs`` (``--layers`` for ``num_layers``; a knob without an option keeps its config
    name, set with ``report --diff KEY=VALUE``)."""
    from tessera_lab.model.knobs import KNOB_OPTIONS

    return [KNOB_OPTIONS.get(k) or f"{k}= (report --diff)" for k in knobs]


def _count(n: float) -> str:
    """A parameter count with a decimal prefix: ``79.67 B``, ``36.86 k`` (the tiny runner model is not 0.00 B)."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f}"


def cmd_params(args: argparse.Namespace) -> int:
    from tessera_lab.errors import ConfigError

    given = [x for x in (args.model, args.model_option) if x is not None]
    if not given:
        raise ConfigError("field 'model' is missing; allowed: a shipped model name or a config.json path "
                          "(tessera-lab params MODEL, or --model MODEL)")
    if len(given) == 2 and given[0] != given[1]:
        raise ConfigError(f"field 'model' is given twice, as {given[0]!r} and --model {given[1]!r}; allowed: one")
    args.model = given[0]
    m = model_from_args(args)
    c = m.param_counts().as_dict()
    labels = {"mtp": "mtp (apart: not in total)", "mtp_active": "mtp_active (apart)"}
    rows = [{"count": labels.get(k, k), "parameters": v, "billions": v / 1e9} for k, v in c.items()
            if m.stack.mtp_layers or not k.startswith("mtp")]
    head = (f"{m.name} ({m.model_type}, family {m.family}{f', from {m.path}' if m.path else ''}, "
            f"{m.num_decoder_layers} layers: {m.mixer_kinds()}"
            f"{f'; {len(m.stack.mtp_layers)} MTP layer(s)' if m.stack.mtp_layers else ''})")
    split = layer_split(m)
    split_text = "; ".join(f"{ {'none': 'no FFN'}.get(k, k)}: {v['layers']} layers, {v['parameters'] / 1e9:.3f} B" for k, v in split.items()
                           if v["layers"])
    notes = "".join(f"\nnote: {n}" for n in m.notes)
    text = ((m.approximate + "\n") if m.approximate else "") + head + "\n" \
        + f"pattern {m.layer_pattern()}\n  ({PATTERN_LEGEND})\nlayers by FFN (decoder-layer parameters, computed): " \
        + split_text + "\n" + table(rows, ".3f") + "\nparameters: computed from the config's module shapes" + notes
    emit(args, {"model": m.name, "family": m.family, "mixers": m.mixer_kinds(), **c, "pattern": m.layer_pattern(),
                "pattern_legend": PATTERN_LEGEND, "split": split, "approximate": m.approximate or None,
                "path": m.path or None, "notes": list(m.notes)}, text)
    return 0


#: the letters of :meth:`ModelSpec.layer_pattern`
PATTERN_LEGEND = ("L linear mixer, A full attention, S sliding window, C chunked, T MTP; lower case: dense FFN; "
                  "- / E: MLP / MoE block without mixer")


def layer_split(m) -> dict[str, dict[str, int]]:
    """Decoder layers and their parameters (computed from the module shapes) by FFN: ``dense`` (a dense MLP),
    ``moe``, ``none`` (a block without FFN: Mamba or attention blocks), ``mtp`` (the MTP layers, apart)."""
    out = {k: {"layers": 0, "parameters": 0} for k in ("dense", "moe", "none", "mtp")}
    for layer in [l for l in m.stack.layers if not l.mtp] + list(m.stack.mtp_layers):
        key = "mtp" if layer.mtp else layer.ffn
        out[key]["layers"] += 1
        out[key]["parameters"] += sum(m.layer_params(layer).values())
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="list the shipped models and the supported model families")
    add_json(p)
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("params", help="parameter counts of a model")
    p.add_argument("model", nargs="?", help="a shipped model name or a config.json path (or --model, as plan and "
                   "report take it)")
    p.add_argument("--model", dest="model_option", default=None, metavar="MODEL", help="the same as the positional MODEL")
    add_model_knobs(p)
    add_json(p)
    p.set_defaults(func=cmd_params)
