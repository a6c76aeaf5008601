"""Routing logs: tokens per expert per layer per micro-batch, recorded by the runner and replayed by the simulator.

**Routing log format** (JSON, written by :func:`write_routing_log`, read by :func:`load_routing_log`)::

    {"format": "tessera-lab/routing-log", "version": 1,
     "num_experts": 8, "top_k": 2,
     "records": [
        {"step": 0, "layer": 0, "microbatch": 0, "group": 0, "tokens": 512, "routed": [130, 120, ...]},
        ...]}

``routed`` holds ``num_experts`` ints (assignments per expert before capacity). ``step``, ``microbatch``
and ``group`` (EP group) default to 0, 0 and 0; a record without ``microbatch`` is the next micro-batch of
its (step, layer, group), so the runner's ``route_log`` list (dicts with ``layer``, ``tokens``, ``routed``,
``kept``, ``dropped``, ``capacity``) loads as is. A bare list of records is accepted too.

numpy only; never imports torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from tessera_lab.checks import check_int, check_work
from tessera_lab.errors import ConfigError

__all__ = ["LOG_FORMAT", "LOG_VERSION", "RoutingLog", "load_routing_log", "write_routing_log"]

LOG_FORMAT = "tessera-lab/routing-log"
LOG_VERSION = 1


@dataclass
class RoutingLog:
    """Counts replayed from a routing log.

    Attributes:
        counts: group -> int64 array ``[steps, layers, microbatches, E]`` (zeros where the log has no record).
        num_experts: E.
        top_k: experts per token (``None`` if the log does not say).
        tokens: tokens per routing group and micro-batch (the most common ``tokens`` field, or
            ``sum(routed) / top_k``).
        layers: the log's layer ids, in the order of the layer axis.
        source: where the log came from.
    """

    counts: dict[int, np.ndarray]
    num_experts: int
    top_k: int | None
    tokens: int | None
    layers: list[int] = field(default_factory=list)
    source: str = ""

    @property
    def groups(self) -> list[int]:
        return sorted(self.counts)

    def group_counts(self, group: int = 0) -> np.ndarray:
        """``[steps, layers, microbatches, E]`` of one EP group.

        Raises:
            ConfigError: the group is not in the log.
        """
        if group not in self.counts:
            raise ConfigError(f"field 'group' = {group} is not in the routing log; allowed: {self.groups}")
        return self.counts[group]


def load_routing_log(source: str | os.PathLike | Mapping | Sequence, *, top_k: int | None = None) -> RoutingLog:
    """Read a routing log (path, parsed JSON dict, or a list of records; format in the module docstring).

    Raises:
        ConfigError: unreadable JSON, an unknown format or version, records of different expert counts, or
            a record without ``layer`` / ``routed``.
        FileNotFoundError: the path does not exist.
    """
    src_name = "<object>"
    obj: Any = source
    if isinstance(source, (str, os.PathLike)):
        src_name = str(source)
        from tessera_lab.io import read_json

        if not Path(source).exists():
            raise FileNotFoundError(2, "routing log does not exist", src_name)
        obj = read_json(source, "routing log")
    meta: Mapping = {}
    if isinstance(obj, Mapping):
        meta = obj
        fmt = obj.get("format", LOG_FORMAT)
        if fmt != LOG_FORMAT:
            raise ConfigError(f"routing log {src_name}: field 'format' = {fmt!r}; allowed: {LOG_FORMAT!r}")
        ver = obj.get("version", LOG_VERSION)
        if ver != LOG_VERSION:
            raise ConfigError(f"routing log {src_name}: field 'version' = {ver!r}; allowed: {LOG_VERSION}")
        records = obj.get("records")
        if records is None:
            raise ConfigError(f"routing log {src_name}: missing field 'records' (a list of per-micro-batch records)")
    else:
        records = obj
    if not isinstance(records, (list, tuple)) or not records:
        raise ConfigError(f"routing log {src_name}: field 'records' must be a non-empty list")
    k = top_k if top_k is not None else meta.get("top_k")
    E = meta.get("num_experts")
    next_mb: dict[tuple[int, int, int], int] = {}
    rows: list[tuple[int, int, int, int, list[int]]] = []
    token_fields: list[int] = []
    for n, rec in enumerate(records):
        if not isinstance(rec, Mapping) or "layer" not in rec or "routed" not in rec:
            raise ConfigError(f"routing log {src_name}: record {n} needs fields 'layer' and 'routed'")
        where = f"routing log {src_name}: record {n}"
        if not isinstance(rec["routed"], (list, tuple)):
            raise ConfigError(f"{where} field 'routed' must be a list of token counts per expert")
        check_work("experts", len(rec["routed"]), field="field 'routed' (experts)", where=where)
        routed = [check_int(x, f"routed[{i}]", low=0, high=1 << 40, where=where) for i, x in enumerate(rec["routed"])]
        if E is None:
            E = len(routed)
        if len(routed) != E:
            raise ConfigError(f"routing log {src_name}: record {n} has {len(routed)} experts; allowed: {E}")
        step = check_int(rec.get("step", 0), "step", low=0, where=where, limit="steps")
        layer = check_int(rec["layer"], "layer", low=0, where=where, limit="layers")
        grp = check_int(rec.get("group", 0), "group", low=0, where=where, limit="groups")
        key = (grp, step, layer)
        mb = rec.get("microbatch")
        mb = next_mb.get(key, 0) if mb is None else check_int(mb, "microbatch", low=0, where=where,
                                                                 limit="microbatches")
        next_mb[key] = max(next_mb.get(key, 0), mb + 1)
        rows.append((grp, step, layer, mb, routed))
        if rec.get("tokens") is not None:
            token_fields.append(check_int(rec["tokens"], "tokens", low=0, where=where, limit="tokens"))
    layer_ids = sorted({r[2] for r in rows})
    lpos = {l: i for i, l in enumerate(layer_ids)}
    steps = 1 + max(r[1] for r in rows)
    mbs = 1 + max(r[3] for r in rows)
    check_work("routing_cells", steps * len(layer_ids) * mbs * E * len({r[0] for r in rows}),
               field="steps x layers x micro-batches x experts x groups", where=f"routing log {src_name}")
    counts: dict[int, np.ndarray] = {}
    for grp, step, layer, mb, routed in rows:
        arr = counts.setdefault(grp, np.zeros((steps, len(layer_ids), mbs, E), dtype=np.int64))
        arr[step, lpos[layer], mb] += routed
    tokens = None
    if token_fields:
        vals, freq = np.unique(token_fields, return_counts=True)
        tokens = int(vals[freq.argmax()])
    elif k:
        tokens = int(round(sum(rows[0][4]) / int(k)))
    return RoutingLog(counts, int(E), None if k is None else int(k), tokens, layer_ids, src_name)


def write_routing_log(path: str | os.PathLike, counts: np.ndarray, *, top_k: int, tokens: int,
                      layers: Sequence[int] | None = None, group: int = 0) -> Path:
    """Write counts ``[steps, layers, microbatches, E]`` (or ``[layers, mb, E]`` / ``[mb, E]``) as a routing
    log (atomically); returns the path."""
    from tessera_lab.io import atomic_write_text

    c = np.asarray(counts, dtype=np.int64)
    while c.ndim < 4:
        c = c[None]
    S, L, M, E = c.shape
    layer_ids = list(range(L)) if layers is None else list(layers)
    if len(layer_ids) != L:
        raise ConfigError(f"field 'layers' has {len(layer_ids)} entries; allowed: {L} (the layer axis)")
    records = [{"step": s, "layer": layer_ids[l], "microbatch": j, "group": group, "tokens": int(tokens),
                "routed": c[s, l, j].tolist()} for s in range(S) for l in range(L) for j in range(M)]
    doc = {"format": LOG_FORMAT, "version": LOG_VERSION, "num_experts": E, "top_k": int(top_k), "records": records}
    return atomic_write_text(path, json.dumps(doc) + "\n")
