"""The research knobs of a model, by every name the project uses for them: the one mapping behind the CLI
options, ``report --diff KEY=VALUE`` changes, variant names (``qwen3-next-80b-a3b[expert=256,topk=4]``, as
:meth:`~tessera_lab.model.spec.ModelSpec.with_changes` writes them) and the widgets.

Each knob maps to the keyword of :meth:`ModelSpec.with_changes` it sets.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any, Mapping

from tessera_lab.checks import MAX_CONFIG_INT, did_you_mean, env_name, work_limit
from tessera_lab.errors import ConfigError
from tessera_lab.model.hf_families import DENSE, FULL_ATTENTION, NO_MIXER

#: ``with_changes`` keyword -> (short name in variant names, other accepted names)
KNOBS: dict[str, tuple[str, tuple[str, ...]]] = {
    "attention_ratio": ("ratio", ("attention_ratio",)),
    "moe_intermediate_size": ("expert", ("expert_width", "moe_intermediate_size")),
    "num_experts_per_tok": ("topk", ("top_k", "num_experts_per_tok")),
    "num_experts": ("experts", ("num_experts",)),
    "shared_expert_intermediate_size": ("shared", ("shared_expert_intermediate_size",)),
    "num_layers": ("layers", ("layers", "num_layers")),
    "shared_experts": ("nshared", ("shared_experts",)),
    "moe_every": ("moe_every", ("moe_every",)),
    "window": ("window", ("window",)),
}
#: variant-name key -> ``with_changes`` keyword (``expert`` -> ``moe_intermediate_size``)
VARIANT_KEYS: dict[str, str] = {short: kw for kw, (short, _) in KNOBS.items()}
#: every long name (CLI option, diff change key) -> ``with_changes`` keyword
MODEL_KNOBS: dict[str, str] = {name: kw for kw, (_, names) in KNOBS.items() for name in names}


def model_changes(values: Mapping[str, Any], *, names: Mapping[str, str] = MODEL_KNOBS) -> dict[str, Any]:
    """``with_changes`` keywords from knob values given by any accepted name (``None`` values are left out).

    Raises:
        ConfigError: a name that is not a knob (lists the allowed names).
    """
    out: dict[str, Any] = {}
    for k, v in values.items():
        if v is None:
            continue
        if k not in names:
            raise ConfigError(f"knob {k!r} is unknown{did_you_mean(k, names)}; allowed: {', '.join(sorted(names))}")
        out[names[k]] = v
    return out


#: ``with_changes`` keyword -> (lowest value, work limit name or ``None``, fixed highest value or ``None``): the
#: range every entry point (CLI option, diff change, variant name) states, upper end included
KNOB_RANGES: dict[str, tuple[int, str | None, int | None]] = {
    "attention_ratio": (0, "attention_ratio", None),
    "moe_intermediate_size": (1, "expert_width", None),
    "num_experts_per_tok": (1, "top_k", None),
    "num_experts": (1, "num_experts", None),
    "shared_expert_intermediate_size": (0, None, MAX_CONFIG_INT),
    "num_layers": (1, "layers", None),
    "shared_experts": (0, "experts", None),
    "moe_every": (1, "layers", None),
    "window": (1, None, MAX_CONFIG_INT),
}
#: ``with_changes`` keyword -> the option of ``plan``/``report``/``params`` that sets it (``None``: only as a
#: ``report --diff`` change or in a variant name)
KNOB_OPTIONS: dict[str, str | None] = {
    "attention_ratio": "--attention-ratio", "moe_intermediate_size": "--expert-width",
    "num_experts_per_tok": "--top-k", "num_experts": "--experts", "shared_expert_intermediate_size": None,
    "num_layers": "--layers", "shared_experts": "--shared-experts", "moe_every": "--moe-every", "window": "--window",
}


def knob_allowed(kw: str) -> tuple[int, int, str]:
    """``(low, high, text)`` of the knob ``kw`` (a ``with_changes`` keyword): ``text`` is ``"an integer 1 to
    65536"`` plus, when the top is a work limit, the variable that raises it."""
    low, limit, high = KNOB_RANGES[kw]
    top = work_limit(limit) if limit is not None else high
    text = f"an integer {low} to {top}"
    if limit is not None:
        text += f" ({top}: the work limit of this kind of machine; raise it with {env_name(limit)}=N)"
    return low, int(top), text


def parse_knob(kw: str, value: Any, label: str, *, check_low: bool = True) -> int:
    """``value`` (an int, or text such as ``"256"`` or ``"1e3"``) as the knob ``kw``'s integer, in its range.

    Args:
        label: how the value is named in a message (``"--experts"``, ``"change 'top_k'"``).
        check_low: refuse values below the range (``False``: the caller checks the low end against the model).

    Raises:
        ConfigError: ``"<label> = 'x' is not an integer; allowed: an integer 0 to 4096 (...)"`` or ``"... is out of
            range; ..."``.
    """
    import math

    low, top, text = knob_allowed(kw)
    v: Any = value
    if isinstance(value, str):
        try:
            v = int(value.strip())
        except ValueError:
            try:
                f = float(value)
            except ValueError:
                f = math.nan
            if math.isfinite(f) and f == int(f) and abs(f) >= 2**62:
                raise ConfigError(f"{label} = {value!r} is out of range; allowed: {text}")
            v = int(f) if math.isfinite(f) and f == int(f) else value
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        if abs(v) >= 2**62:
            raise ConfigError(f"{label} = {value!r} is out of range; allowed: {text}")
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{label} = {value!r} is not an integer; allowed: {text}")
    if v > top or (check_low and v < low):
        raise ConfigError(f"{label} = {v} is out of range; allowed: {text}")
    return v


def realises_ratio(m: Any, ratio: int) -> bool:
    """Whether a model's layers realise ``ratio`` linear-mixer layers per full-attention layer: the runs of linear
    mixers (before each full-attention layer, and the trailing run when there is one) are ``ratio`` long more often
    than not (Kimi-Linear's MLA at 4, 8, ..., 24 and 27: six runs of 3, one of 2, realise 3; Jamba's period 27 at
    offset 4 in 32 layers, runs 4 and 26, realises nothing)."""
    runs, run = Counter(), 0
    for layer in m.layers:
        if layer.mtp or layer.mixer == NO_MIXER:
            continue
        if layer.mixer == FULL_ATTENTION:
            runs[run] += 1
            run = 0
        else:
            run += 1
    if run:
        runs[run] += 1
    return runs[ratio] > sum(runs.values()) - runs[ratio]


def side_effects(before: Any, after: Any, asked: set[str]) -> list[str]:
    """Notes naming what a knob changed beyond its name: the dense MLP width (Jamba's experts and dense MLPs share
    ``intermediate_size``) or the shared expert's width (Llama-4's shared expert has the routed width; DeepSeek-V3's
    and Kimi's shared experts are ``n_shared x`` the routed width), when the knob that sets it was not given."""
    notes = []
    dense = [l for l in after.stack.layers if l.ffn == DENSE and not l.dense_width]
    if dense and after.mlp.intermediate_size != before.mlp.intermediate_size and "moe_intermediate_size" in asked:
        notes.append(f"the expert width knob also changed the {len(dense)} dense MLP layers' width "
                     f"{before.mlp.intermediate_size} -> {after.mlp.intermediate_size} (the {after.family} config has one "
                     "intermediate_size for both)")
    if after.moe.shared_expert_intermediate_size != before.moe.shared_expert_intermediate_size and \
            not asked & {"shared_expert_intermediate_size", "shared_experts"}:
        notes.append(f"the expert width knob also changed the shared expert's width "
                     f"{before.moe.shared_expert_intermediate_size} -> {after.moe.shared_expert_intermediate_size} (the "
                     f"{after.family} rule sizes the shared expert from the routed width)")
    return notes


def ratios(reader: Any, cfg: Mapping[str, Any], n: int) -> tuple[int, list[int]]:
    """``(largest, realised)`` attention ratios of a family's rule (``reader.KNOBS['attention_ratio']``) in a model
    of ``n`` decoder layers: the largest that keeps a full-attention layer, and those :func:`realises_ratio` holds for
    (searched over ``0..n``)."""
    from tessera_lab.model import families

    best, ok = 0, []
    for r in range(0, n + 1):
        c = dict(cfg)
        families.apply_knob(reader, c, "attention_ratio", r)
        try:
            layers = reader.build(c)["layers"]
        except ConfigError:
            continue
        if any(l.mixer == FULL_ATTENTION for l in layers):
            best = r
            if realises_ratio(SimpleNamespace(layers=layers), r):
                ok.append(r)
    return best, ok


def check_ratio(spec: Any, ratio: int, reader: Any, cfg: Mapping[str, Any], allow_no_full: bool) -> None:
    """Refuse an attention ratio that leaves ``spec`` (the model the family's rule built) without a full-attention
    layer (unless ``allow_no_full``), or that the rule does not realise (:func:`realises_ratio`).

    Raises:
        ConfigError: naming the ratio and the ratios the rule can realise in the model's layers.
    """
    has_full = any(l.mixer == FULL_ATTENTION for l in spec.stack.layers if not l.mtp)
    n = spec.num_decoder_layers
    if not has_full and not allow_no_full:
        raise ConfigError(f"knob 'attention_ratio' = {ratio} leaves no full-attention layer in {n} layers; allowed: "
                          f"at most {ratios(reader, cfg, n)[0]} (or ask for it: --allow-no-full-attention)")
    if has_full and not realises_ratio(spec.stack, ratio):
        raise ConfigError(f"knob 'attention_ratio' = {ratio} cannot be realised by the {spec.family} rule in {n} "
                          f"layers (it gives the pattern {spec.layer_pattern()}); allowed: "
                          f"{', '.join(map(str, ratios(reader, cfg, n)[1]))}")
