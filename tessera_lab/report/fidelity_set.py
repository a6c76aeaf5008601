"""The published-run fidelity set: reading a runs file, its fixed fit/test split, and each run's published time.

A runs file (``data/published/*.json``; schema in ``docs/file-schemas.md``) holds ``runs``: public training runs
with their layout as published and one published measurement. The split into ``fit`` (what a fitted parameter may
see) and ``test`` (the headline figure) is written into the data before any fitting, by :func:`split_for_run`;
:func:`load_runs` refuses a file whose written split disagrees with the rule, so a split cannot drift by hand.

Published iteration seconds (:func:`published_iteration_s`): the step time where the source states one, else the
global batch's tokens over the published tokens/s per GPU times the GPUs, else the model FLOPs (Megatron-LM's
convention, :attr:`tessera_lab.plan.make.Plan.model_flops`) over the published Model TFLOP/s per GPU times the GPUs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tessera_lab.errors import ConfigError

#: the runs files the fidelity bench evaluates by default (relative to the repository's data/published)
DEFAULT_FILES = ("megatron_bridge.json", "megatron_moe_modelzoo.json", "tech_reports.json")
#: independent publishers a run may come from
SOURCE_FAMILIES = ("megatron-bridge", "megatron-moe-modelzoo", "tech-report")
SPLITS = ("fit", "test", "reference")
#: source families whose runs are always test runs (another acceptance compares layouts with them)
ALWAYS_TEST = ("megatron-moe-modelzoo",)
REQUIRED = ("id", "source", "source_family", "split", "model", "gpu", "gpus", "precision", "gbs", "mbs", "seq_len",
            "tp", "pp", "ep", "dispatcher", "recompute")
MEASUREMENTS = ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu")
#: the mapped fields a run's ``alternate_reading`` may change (docs/file-schemas.md)
ALTERNATE_FIELDS = ("dispatcher", "ep_overlap", "recompute", "recompute_modules", "expert_load", "grad_reduce_dtype")


def split_for_run(run: dict) -> str:
    """``"test"``, ``"fit"`` or ``"reference"`` for one run, by the stated rule: a run of :data:`ALWAYS_TEST` is a
    test run; a ``reference_only`` run (superseded by a later container's run of the same layout) is in neither
    set; else test when the SHA-256 of the id (UTF-8) read as a hexadecimal integer is even, fit when odd. The
    rule never looks at an error."""
    if run.get("source_family") in ALWAYS_TEST:
        return "test"
    if run.get("reference_only"):
        return "reference"
    return "test" if int(hashlib.sha256(str(run["id"]).encode()).hexdigest(), 16) % 2 == 0 else "fit"


def _positive(v) -> bool:
    """A JSON number (not a boolean) above 0."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _check_run(run: dict, where: str) -> None:
    for key in REQUIRED:
        if key not in run:
            who = f"{where} run {run['id']}" if "id" in run else where
            raise ConfigError(f"{who}: field '{key}' is missing; allowed: a run has {', '.join(REQUIRED)}")
    rid = run["id"]
    if run["source_family"] not in SOURCE_FAMILIES:
        raise ConfigError(f"{where} run {rid}: field 'source_family' = {run['source_family']!r} is unknown; allowed: "
                          f"{', '.join(SOURCE_FAMILIES)}")
    if run["split"] != split_for_run(run):
        raise ConfigError(f"{where} run {rid}: field 'split' = {run['split']!r} disagrees with the split rule "
                          f"({split_for_run(run)!r}); allowed: the rule's value (split_for_run)")
    if not any(_positive(run.get(k)) for k in MEASUREMENTS):
        raise ConfigError(f"{where} run {rid}: no published measurement; allowed: one of {', '.join(MEASUREMENTS)} "
                          "as a number > 0")
    for k in MEASUREMENTS:
        if run.get(k) is not None and not _positive(run[k]):
            raise ConfigError(f"{where} run {rid}: field '{k}' = {run[k]!r} is out of range; allowed: a number > 0")
    from tessera_lab.model.hardware import DISPATCHERS

    if run["dispatcher"] not in DISPATCHERS:
        raise ConfigError(f"{where} run {rid}: field 'dispatcher' = {run['dispatcher']!r} is unknown; allowed: "
                          f"{', '.join(DISPATCHERS)}")
    if not isinstance(run.get("ep_overlap", False), bool):
        raise ConfigError(f"{where} run {rid}: field 'ep_overlap' = {run['ep_overlap']!r} is out of range; allowed: "
                          "true or false")
    load = run.get("expert_load", 1.0)
    if load is not None and not (_positive(load) and load >= 1.0):
        raise ConfigError(f"{where} run {rid}: field 'expert_load' = {run['expert_load']!r} is out of range; allowed: "
                          "a number >= 1 (the busiest EP rank's tokens over the mean) or null")
    mods = run.get("recompute_modules", [])
    if not isinstance(mods, list) or not all(isinstance(m, str) for m in mods):
        raise ConfigError(f"{where} run {rid}: field 'recompute_modules' = {mods!r} is out of range; allowed: a list "
                          "of Megatron module names")
    fields = alternate_fields(run, where)
    if fields is not None:
        _check_run({**run, **fields, "alternate_reading": None}, f"{where} (alternate_reading)")
    if not isinstance(run.get("fsdp", False), bool):
        raise ConfigError(f"{where} run {rid}: field 'fsdp' = {run['fsdp']!r} is out of range; allowed: true or false")
    for key in ("gpus", "gbs", "mbs", "seq_len", "tp", "pp", "ep", "cp", "vp"):
        v = run.get(key, 1) if key in ("cp", "vp") else run[key]
        if key in ("cp", "vp") and v is None:
            continue  # null: none (1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{where} run {rid}: field '{key}' = {v!r} is out of range; allowed: an integer >= 1"
                              + (" or null" if key in ("cp", "vp") else ""))
    cp = run.get("cp") or 1
    if cp > 1 and run["seq_len"] % (2 * cp):
        raise ConfigError(f"{where} run {rid}: field 'seq_len' = {run['seq_len']} is not a multiple of 2 x cp = "
                          f"{2 * cp}; allowed: Megatron's load-balanced split of a sequence into 2 x cp chunks")


def alternate_fields(run: dict, where: str = "runs file") -> dict | None:
    """The fields of ``run``'s ``alternate_reading`` (the other reading of a source that reads two ways), or
    ``None`` without one.

    Raises:
        ConfigError: not an object of a non-empty ``fields`` object (keys among :data:`ALTERNATE_FIELDS`) and a
            ``why`` text, nothing else (one line naming the run and the field)."""
    alt = run.get("alternate_reading")
    if alt is None:
        return None
    fields = alt.get("fields") if isinstance(alt, dict) else None
    if not isinstance(fields, dict) or not fields or not isinstance(alt.get("why"), str) or set(alt) - {"fields", "why"}:
        raise ConfigError(f"{where} run {run.get('id')}: field 'alternate_reading' = {alt!r} is not usable; allowed: "
                          "an object with a non-empty 'fields' object and a 'why' text, nothing else")
    bad = sorted(set(fields) - set(ALTERNATE_FIELDS))
    if bad:
        raise ConfigError(f"{where} run {run.get('id')}: field 'alternate_reading.fields.{bad[0]}' is not a mapped "
                          f"field an alternate reading may change; allowed: {', '.join(ALTERNATE_FIELDS)}")
    return fields


def load_runs(paths) -> tuple[list[dict], dict]:
    """``(runs, sources)``: every run of the runs files ``paths`` (checked), and their ``source_pages`` merged.

    Raises:
        ConfigError: an unreadable file, a run missing a field, a split that disagrees with
            :func:`split_for_run`, an unknown source family, no published measurement, or a repeated id.
    """
    runs, sources, seen = [], {}, set()
    for p in paths:
        p = Path(p)
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"runs file {p}: cannot read it as JSON ({exc}); allowed: a runs file "
                              "(docs/file-schemas.md)") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list):
            raise ConfigError(f"runs file {p}: field 'runs' is missing; allowed: an object with a 'runs' list")
        for run in doc["runs"]:
            _check_run(run, f"runs file {p}")
            if run["id"] in seen:
                raise ConfigError(f"runs file {p}: field 'id' = {run['id']!r} is repeated; allowed: unique ids")
            seen.add(run["id"])
            runs.append(run)
        sources.update(doc.get("source_pages", {}))
    return runs, sources


def published_iteration_s(run: dict, model_flops: float) -> tuple[float, str]:
    """``(seconds, basis)``: one iteration's published wall time and which measurement it comes from
    (``"step time"``, ``"tokens/s per GPU"`` or ``"Model TFLOP/s per GPU"``; formulas in the module docstring).
    ``model_flops``: the iteration's model FLOPs (used only for the last basis)."""
    if run.get("step_time_s"):
        return float(run["step_time_s"]), "step time"
    if run.get("tokens_per_s_per_gpu"):
        return run["gbs"] * run["seq_len"] / (run["tokens_per_s_per_gpu"] * run["gpus"]), "tokens/s per GPU"
    return model_flops / (run["model_tflops_per_gpu"] * 1e12 * run["gpus"]), "Model TFLOP/s per GPU"
