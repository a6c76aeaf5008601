"""Exports of a stage partition to the formats other frameworks read, and the plan as JSON.

* Megatron-LM ``--pipeline-model-parallel-layout``: one group per (virtual) stage in virtual-stage order
  (all pipeline ranks of chunk 0, then chunk 1, ...), separated by ``|``; ``E`` is the embedding, ``t`` a
  decoder layer, ``L`` the LM head and loss (Megatron-LM ``docs/.../pipeline_parallel_layout.md``; example
  ``Et*3|(tt|)*29,m|L`` for DeepSeek-V3 with PP16 VPP2). We write the letters out, without ``*`` shorthand.
* DeepSpeed ``PipelineModule`` ``parts``: stage s owns ``layers[parts[s]:parts[s+1]]`` of the module list; with
  the embedding as the first entry of that list, decoder layer ``l`` is entry ``l + 1`` and the head the last.
* ``torch.distributed.pipelining`` split points: the names of the decoder layers that begin a stage
  (``layers.6`` means ``SplitPoint.BEGINNING`` at ``model.layers[6]``); the module prefix is configurable.
* The plan itself: schema-versioned JSON that round-trips (:func:`plan_to_json` / :func:`parse_plan_json`; :func:`tessera_lab.plan.load.load_plan` re-evaluates one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from tessera_lab.errors import PartitionError
from tessera_lab.io import atomic_write_text, dumps

PLAN_SCHEMA_VERSION = 1


def _check(boundaries: Sequence[int]) -> list[int]:
    """Boundaries that start at 0 and increase, every stage holding a decoder layer but the first and the last,
    which may hold none where the split counts the embedding or the loss as a stage's share (Megatron-LM's
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: ``E|t|...|t|L``)."""
    b = [int(x) for x in boundaries]
    S = len(b) - 1
    if (S < 1 or b[0] != 0 or b[-1] <= 0 or any(b[s] > b[s + 1] for s in range(S))
            or any(b[s] == b[s + 1] for s in range(1, S - 1))):
        raise PartitionError(f"field 'boundaries' = {list(boundaries)} must start at 0 and increase, every stage "
                             "holding a layer but the first (embedding only) and the last (loss only)")
    return b


def megatron_layout(boundaries: Sequence[int]) -> str:
    """Megatron-LM ``--pipeline-model-parallel-layout`` for stages in virtual-stage order.

    >>> megatron_layout([0, 2, 5])
    'Ett|tttL'
    """
    b = _check(boundaries)
    groups = ["t" * (b[s + 1] - b[s]) for s in range(len(b) - 1)]
    groups[0] = "E" + groups[0]
    groups[-1] = groups[-1] + "L"
    return "|".join(groups)


def parse_megatron_layout(layout: str) -> list[int]:
    """Boundaries from a layout string written by :func:`megatron_layout` (letters E, t, L and ``|``).

    Raises:
        PartitionError: other characters (e.g. ``*`` shorthand or ``m`` MTP layers are not read back).
    """
    bad = set(layout) - set("EtL|")
    if bad:
        raise PartitionError(f"layout has unsupported characters {sorted(bad)}; allowed: E, t, L, |")
    b = [0]
    for group in layout.split("|"):
        b.append(b[-1] + group.count("t"))
    return _check(b)


def deepspeed_parts(boundaries: Sequence[int], *, embedding_is_layer: bool = True, vpp: int = 1) -> list[int] | None:
    """DeepSpeed ``parts`` over a module list ``[embedding, layer 0, ..., layer L-1, head]``.

    With ``embedding_is_layer`` the embedding is entry 0 (owned by stage 0) and the head the last entry
    (owned by the last stage): ``parts = [0, b1 + 1, ..., b_{S-1} + 1, L + 2]``. ``None`` with virtual stages
    (``vpp`` > 1): DeepSpeed's ``PipelineModule`` gives each pipeline rank one contiguous part.
    """
    b = _check(boundaries)
    if vpp > 1:
        return None
    if not embedding_is_layer:
        return b
    return [0] + [x + 1 for x in b[1:-1]] + [b[-1] + 2]


def torch_split_points(boundaries: Sequence[int], prefix: str = "layers") -> list[str] | None:
    """Module names at which ``torch.distributed.pipelining.pipeline`` should split (``SplitPoint.BEGINNING``);
    ``None`` where the last stage holds no decoder layer (the loss alone): its split would begin at the model's
    final norm, whose module name this export does not know."""
    b = _check(boundaries)
    if b[-2] == b[-1]:
        return None
    return [f"{prefix}.{x}" for x in b[1:-1]]


def plan_to_json(plan_dict: dict[str, Any]) -> str:
    """Serialise a plan dict (``Plan.as_dict()``) with the schema version and every export added."""
    d = dict(plan_dict)
    b = d["boundaries"]
    d["schema_version"] = PLAN_SCHEMA_VERSION
    d["exports"] = {
        "megatron_pipeline_model_parallel_layout": megatron_layout(b),
        "deepspeed_parts": deepspeed_parts(b, vpp=int(d.get("parallel", {}).get("vpp", 1))),
        "torch_pipelining_split_points": torch_split_points(b),
    }
    return dumps(d)


def parse_plan_json(text: str) -> dict[str, Any]:
    """Parse a plan written by :func:`plan_to_json`.

    Raises:
        PartitionError: a missing or unknown ``schema_version``, or exports that disagree with ``boundaries``.
    """
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise PartitionError(f"plan is not valid JSON ({str(exc).splitlines()[0][:120]})") from None
    if not isinstance(d, dict):
        raise PartitionError(f"plan holds a JSON {type(d).__name__}; allowed: a JSON object")
    version = d.get("schema_version")
    if version != PLAN_SCHEMA_VERSION:
        raise PartitionError(f"plan field 'schema_version' = {version!r} is not supported; allowed: {PLAN_SCHEMA_VERSION}")
    b = _check(d["boundaries"])
    layout = d.get("exports", {}).get("megatron_pipeline_model_parallel_layout")
    if layout is not None and parse_megatron_layout(layout) != b:
        raise PartitionError("plan field 'exports.megatron_pipeline_model_parallel_layout' disagrees with 'boundaries'")
    return d


def write_plan(plan_dict: dict[str, Any], path: str | Path) -> Path:
    """Write a plan JSON atomically."""
    return atomic_write_text(path, plan_to_json(plan_dict))
