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

from tessera_lab.checks import check_work
from tessera_lab.errors import ConfigError
from tessera_lab.schema import F, validate

__all__ = ["LOG_FORMAT", "LOG_VERSION", "ROUTING_LOG", "RoutingLog", "check_routing_log", "load_routing_log",
           "write_routing_log"]

LOG_FORMAT = "tessera-lab/routing-log"
LOG_VERSION = 1
#: the most assignments one expert may hold in one record (2**40: far above any real batch, small enough that
#: sums over steps and micro-batches stay exact in int64)
MAX_ROUTED = 1 << 40

#: one record of a routing log (the runner's ``route_log`` entries carry ``kept``/``dropped``/``capacity`` too:
#: not read, so not checked)
ROUTING_RECORD = F("dict", fields={
    "layer": F("int", low=0, limit="layers"),
    "routed": F("list", low=1, limit="experts", items=F("int", low=0, high=MAX_ROUTED),
                allowed="a list of token counts per expert"),
    "step": F("int", low=0, limit="steps", required=False),
    "microbatch": F("int", low=0, limit="microbatches", required=False, null=True),
    "group": F("int", low=0, limit="groups", required=False),
    "tokens": F("int", low=0, limit="tokens", required=False, null=True),
}, allowed="an object with fields 'layer' and 'routed'")

#: a routing log (module docstring); a bare list of records is checked as ``records``
ROUTING_LOG = F("dict", fields={
    "format": F("str", choices=(LOG_FORMAT,), required=False),
    "version": F("int", choices=(LOG_VERSION,), required=False, allowed=str(LOG_VERSION)),
    "num_experts": F("int", low=1, limit="num_experts", required=False, null=True),
    "top_k": F("int", low=1, limit="top_k", required=False, null=True),
    "records": F("list", low=1, limit="routing_cells", items=ROUTING_RECORD,
                 allowed="a non-empty list of per-micro-batch records"),
}, allowed="an object with field 'records', or a list of records")


def check_routing_log(obj: Any, where: str) -> dict:
    """``obj`` (a parsed routing log, or a bare list of records) checked against :data:`ROUTING_LOG` and its
    cross-field rules: every ``routed`` holds ``num_experts`` counts (the first record's count when the log does not
    say), ``top_k <= num_experts``. Returns the log as a dict (a bare list wrapped as ``{"records": list}``).

    Raises:
        ConfigError: one line naming ``where``, the field (``records[3].routed[2]``), the value and what is allowed.
    """
    doc = {"records": obj} if isinstance(obj, (list, tuple)) else obj
    if isinstance(doc, dict) and isinstance(doc.get("records"), tuple):
        doc = {**doc, "records": list(doc["records"])}
    validate(doc, ROUTING_LOG, where)
    E = doc.get("num_experts")
    first = "field 'num_experts'" if E is not None else "in records[0]"
    E = E if E is not None else len(doc["records"][0]["routed"])
    for n, rec in enumerate(doc["records"]):
        if len(rec["routed"]) != E:
            raise ConfigError(f"{where}: field 'records[{n}].routed' has {len(rec['routed'])} entries; allowed: {E} "
                              f"(one count for each of the log's experts, as {first})")
    k = doc.get("top_k")
    if k is not None and k > E:
        raise ConfigError(f"{where}: field 'top_k' = {k} is out of range; allowed: an integer 1 to {E} "
                          "(num_experts)")
    return doc


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


def _check_totals(rec: Mapping, n: int, top_k: int | None, where: str) -> None:
    """A record with ``tokens`` routes each token to ``top_k`` distinct experts: ``sum(routed) == tokens * top_k``
    (when ``top_k`` is known; assignments before capacity) and no expert holds more than ``tokens``.

    Raises:
        ConfigError: naming the record, both sides and what is allowed.
    """
    t = rec.get("tokens")
    if t is None:
        return
    routed = rec["routed"]
    if top_k is not None and sum(routed) != t * top_k:
        raise ConfigError(f"{where}: field 'records[{n}].routed' sums to {sum(routed)} but tokens x top_k = {t} x "
                          f"{top_k} = {t * top_k}; allowed: every token routed to top_k experts (sum == tokens x top_k)")
    worst = max(routed)
    if worst > t:
        raise ConfigError(f"{where}: field 'records[{n}].routed[{routed.index(worst)}]' = {worst} exceeds tokens = "
                          f"{t}; allowed: at most one assignment per token and expert (<= tokens)")


def load_routing_log(source: str | os.PathLike | Mapping | Sequence, *, top_k: int | None = None) -> RoutingLog:
    """Read a routing log (path, parsed JSON dict, or a list of records; format in the module docstring).

    Raises:
        ConfigError: unreadable JSON, or any field out of :data:`ROUTING_LOG` (:func:`check_routing_log`: an unknown
            format or version, a missing ``layer`` / ``routed``, a wrong type, a negative or huge count, records of
            different expert counts), a repeated (group, step, layer, micro-batch), totals that contradict
            ``tokens`` and ``top_k`` (:func:`_check_totals`), or a log over the work limits; one line naming the
            file and the field.
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
    where = f"routing log '{src_name}'" if src_name != "<object>" else "routing log"
    if isinstance(obj, Mapping) and not isinstance(obj, dict):
        obj = dict(obj)
    doc = check_routing_log(obj, where)  # every field typed and bounded before any array is built
    records = doc["records"]
    k = top_k if top_k is not None else doc.get("top_k")
    E = doc.get("num_experts") or len(records[0]["routed"])
    next_mb: dict[tuple[int, int, int], int] = {}
    rows: list[tuple[int, int, int, int, list[int]]] = []
    token_fields: list[int] = []
    seen: dict[tuple[int, int, int, int], int] = {}
    for n, rec in enumerate(records):
        step, layer, grp = int(rec.get("step", 0)), int(rec["layer"]), int(rec.get("group", 0))
        key = (grp, step, layer)
        mb = rec.get("microbatch")
        mb = next_mb.get(key, 0) if mb is None else int(mb)
        next_mb[key] = max(next_mb.get(key, 0), mb + 1)
        if (*key, mb) in seen:
            raise ConfigError(f"{where}: field 'records[{n}]' repeats records[{seen[(*key, mb)]}] (group {grp}, step "
                              f"{step}, layer {layer}, micro-batch {mb}); allowed: one record per micro-batch")
        seen[(*key, mb)] = n
        _check_totals(rec, n, k, where)
        rows.append((grp, step, layer, mb, [int(x) for x in rec["routed"]]))
        if rec.get("tokens") is not None:
            token_fields.append(int(rec["tokens"]))
    check_work("microbatches", max(next_mb.values()), field="micro-batches of one (step, layer, group)",
               where=where)
    layer_ids = sorted({r[2] for r in rows})
    lpos = {l: i for i, l in enumerate(layer_ids)}
    steps = 1 + max(r[1] for r in rows)
    mbs = 1 + max(r[3] for r in rows)
    check_work("routing_cells", steps * len(layer_ids) * mbs * E * len({r[0] for r in rows}),
               field="steps x layers x micro-batches x experts x groups", where=where)
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
