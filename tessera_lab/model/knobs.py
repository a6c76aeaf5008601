"""The research knobs of a model, by every name the project uses for them: the one mapping behind the CLI
options, ``report --diff KEY=VALUE`` changes, variant names (``qwen3-next-80b-a3b[expert=256,topk=4]``, as
:meth:`~tessera_lab.model.spec.ModelSpec.with_changes` writes them) and the widgets.

Each knob maps to the keyword of :meth:`ModelSpec.with_changes` it sets.
"""

from __future__ import annotations

from typing import Any, Mapping

from tessera_lab.errors import ConfigError

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
            raise ConfigError(f"knob {k!r} is unknown; allowed: {', '.join(sorted(names))}")
        out[names[k]] = v
    return out
