"""Plans back from JSON (``tessera-lab plan --json`` / ``--export``), re-evaluated under their cost source.

:func:`load_plan` reads the recorded model, parallel sizes, cluster and boundaries, and evaluates the partition
with :func:`tessera_lab.plan.evaluate.evaluate` under the plan's recorded :class:`~tessera_lab.cost.source.CostSource`
(its ``costs`` field: the analytic model, or the measured profile it names), so the iteration time round-trips.
Re-evaluating under another source happens only when asked (``costs="analytic"`` or a profile path) and the
plan's notes say so; a recorded profile that is missing or changed refuses unless asked.

Raises (all functions): :class:`~tessera_lab.errors.ConfigError` naming the field.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any, Mapping

from tessera_lab.checks import WORK_LIMITS, check_int, check_work, did_you_mean
from tessera_lab.cost.memory import memory_capacity
from tessera_lab.cost.source import CostSource, analytic_source, check_same_source, profile_source
from tessera_lab.errors import ConfigError, ProfileError
from tessera_lab.io import read_json
from tessera_lab.model.hardware import Cluster, ParallelConfig, cluster_for
from tessera_lab.model.spec import ModelSpec, model_from_name
from tessera_lab.model.tasks import model_flops_per_iteration
from tessera_lab.plan.evaluate import evaluate
from tessera_lab.plan.make import Plan
from tessera_lab.plan.partition import Partition
from tessera_lab.plan.stages import build_stage_model

PARALLEL_KEYS = ("pp", "vpp", "tp", "ep", "dp", "microbatches", "micro_batch_size", "seq_len", "dtype",
                 "distributed_optimizer", "schedule", "dispatcher", "recompute", "precision", "grad_reduce_dtype",
                 "expert_load", "grouped_gemm", "fused_cross_entropy", "ep_placement", "ep_spans_tp",
                 "sequence_parallel", "adam_moment_dtype", "recompute_modules", "host_sync_s", "cp", "fsdp")


def _model_of(data: Mapping[str, Any], where: str) -> ModelSpec:
    """The plan's model: from its ``hf_config`` (a model planned from a config.json path; ``hf_config_options``:
    ``plan_mtp``, ``allow_unknown_fields``), else by name (:func:`model_from_name`)."""
    cfg = data.get("hf_config")
    if cfg is None:
        return model_from_name(str(data["model"]))
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{where}: field 'hf_config' is a JSON {type(cfg).__name__}; allowed: an object (the model's "
                          "config.json, as 'tessera-lab plan --json' writes it)")
    opts = data.get("hf_config_options", {})
    if not isinstance(opts, Mapping) or set(opts) - {"plan_mtp", "allow_unknown_fields", "allow_structural_fields"} \
            or not all(isinstance(v, bool) for v in opts.values()):
        raise ConfigError(f"{where}: field 'hf_config_options' = {opts!r} is invalid; allowed: an object with the "
                          "booleans plan_mtp, allow_unknown_fields and allow_structural_fields")
    return ModelSpec.from_hf_config(dict(cfg), name=str(data["model"]), plan_mtp=opts.get("plan_mtp", False),
                                    allow_unknown_fields=opts.get("allow_unknown_fields", False),
                                    allow_structural_fields=opts.get("allow_structural_fields", False))


def read_plan_json(data: Mapping[str, Any] | str | Path) -> tuple[dict[str, Any], str]:
    """``(plan dict, where)`` of a file path (UTF-8 JSON with size and depth limits, :func:`tessera_lab.io.read_json`)
    or an already parsed dict (checked to be a JSON object); ``where`` names the file for error messages."""
    where = "plan"
    if not isinstance(data, Mapping):
        path = Path(data)
        where = f"plan '{path}'"
        if not path.is_file():
            raise ConfigError(f"field 'plan' = {str(path)!r} is not a file; allowed: a JSON file from "
                              "'tessera-lab plan --json'")
        data = read_json(path, "plan")
    if not isinstance(data, Mapping):
        raise ConfigError("field 'plan' must be a JSON object from 'tessera-lab plan --json'")
    return dict(data), where


def _check_plan_consistency(data: Mapping[str, Any], parallel: Any, b: list[int], where: str) -> None:
    """The plan's recorded sizes agree with its parallel settings and boundaries: ``gpus`` is pp x dp x ep x tp and
    each recorded stage holds exactly the layers its boundaries give (every layer once)."""
    gpus = data.get("gpus")
    if gpus is not None and gpus != parallel.world_size:
        raise ConfigError(f"{where}: field 'gpus' = {gpus!r} disagrees with pp x dp x ep x tp x cp = {parallel.world_size}")
    stages = data.get("stages")
    if stages is None:
        return
    if not isinstance(stages, list) or len(stages) != len(b) - 1:
        raise ConfigError(f"{where}: field 'stages' must list {len(b) - 1} stages (one per pipeline stage)")
    for s, st in enumerate(stages):
        layers = st.get("layers") if isinstance(st, Mapping) else None
        if layers is not None and layers != list(range(b[s], b[s + 1])):
            raise ConfigError(f"{where}: field 'stages[{s}].layers' disagrees with 'boundaries' "
                              f"(layers {b[s]} to {b[s + 1] - 1}); every layer belongs to exactly one stage")


MOVED = ", moved by simulator refinement"


def _check_partition_from(data: Mapping[str, Any], b: list[int], where: str) -> str:
    """The plan's ``partition_from`` (``""`` when absent), checked against the plan itself: ``"baseline NAME"``
    (optionally ``+ MOVED``) with NAME one of the plan's own ``baselines``, the plan carrying the ``solver_result``
    it was kept over, and, unless moved, the chosen ``boundaries`` equal to that baseline's.

    Raises:
        ConfigError: naming the field, its value and the plan's baselines.
    """
    origin = data.get("partition_from", "")
    if origin == "":
        return ""
    own = data.get("baselines") if isinstance(data.get("baselines"), Mapping) else {}
    names = sorted(own)
    allowed = (f"'baseline NAME' or 'baseline NAME{MOVED}' with NAME one of the plan's baselines "
               f"({', '.join(names) or 'none recorded'})")
    if not isinstance(origin, str):
        raise ConfigError(f"{where}: field 'partition_from' = {origin!r} is not a string; allowed: {allowed}")
    if not origin.startswith("baseline "):
        raise ConfigError(f"{where}: field 'partition_from' = {origin!r} is invalid; allowed: {allowed}")
    name = origin.removeprefix("baseline ").removesuffix(MOVED)
    if name not in own:
        raise ConfigError(f"{where}: field 'partition_from' = {origin!r} names no baseline of this plan; allowed: "
                          f"{allowed}")
    if not isinstance(data.get("solver_result"), Mapping):
        raise ConfigError(f"{where}: field 'partition_from' = {origin!r} without field 'solver_result' (the solver's "
                          "partition it was kept over); allowed: the output of 'tessera-lab plan --json'")
    kept = own[name].get("boundaries") if isinstance(own[name], Mapping) else None
    if not origin.endswith(MOVED) and kept != b:
        raise ConfigError(f"{where}: field 'partition_from' = {origin!r} but field 'boundaries' = {b} differs from "
                          f"baseline {name}'s {kept}; allowed: the boundaries of the baseline it names")
    return origin


def _load_profile_for(path: str, why: str):
    from tessera_lab.overlap.profiles import StaleProfileWarning, load_profile

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", StaleProfileWarning)
            return load_profile(path)
    except ProfileError as exc:
        raise ConfigError(f"{why}: {exc}; re-evaluate under the analytic model with --costs analytic") from None


def _layout_of(data: Mapping[str, Any], where: str) -> tuple[ParallelConfig, Cluster, str]:
    """``(parallel, cluster, gpu)`` of plan JSON: field ``parallel`` (known keys, integers in range and within the
    work limits), ``gpu`` (default H200), ``nodes`` (default the smallest cluster holding the world size) and
    ``memory_reserve_gib`` (default the data file's reserve).

    Raises:
        ConfigError: naming the field, its value and the allowed range.
    """
    par = data["parallel"]
    if not isinstance(par, Mapping):
        raise ConfigError("field 'plan.parallel' must be an object with pp, ep, tp, dp, ...")
    unknown = set(par) - set(PARALLEL_KEYS)
    if unknown:
        hint = "".join(did_you_mean(k, PARALLEL_KEYS) for k in sorted(unknown)[:1])
        raise ConfigError(f"field 'plan.parallel' has unknown keys {sorted(unknown)}{hint}; allowed: "
                          f"{', '.join(PARALLEL_KEYS)}")
    for key in ("pp", "vpp", "tp", "ep", "dp", "microbatches", "micro_batch_size", "seq_len", "cp"):
        if key in par:  # type, range and work limits before any planning work
            check_int(par[key], f"parallel.{key}", where=where, limit=key if key in WORK_LIMITS else None)
    parallel = ParallelConfig(**par)
    check_work("world_size", parallel.world_size, field="field 'parallel' world size pp x dp x ep x tp", where=where)
    check_work("actions", parallel.pp * parallel.vpp * parallel.microbatches,
               field="field 'parallel' pp x vpp x microbatches", where=where)
    gpu = data.get("gpu", "H200")
    nodes = check_int(data["nodes"], "nodes", where=where, limit="nodes") if data.get("nodes") is not None else None
    reserve = data.get("memory_reserve_gib")  # written only when the plan was made with its own reserve
    cluster = Cluster.dgx(gpu, nodes, reserve) if nodes else cluster_for(parallel, gpu, reserve)
    if parallel.world_size > cluster.num_gpus:  # as 'plan --nodes' refuses it
        raise ConfigError(f"{where}: field 'nodes' = {nodes} holds {cluster.num_gpus} GPUs but field 'parallel' needs "
                          f"pp x dp x ep x tp = {parallel.world_size}; allowed: nodes >= "
                          f"{-(-parallel.world_size // cluster.gpus_per_node)}")
    return parallel, cluster, gpu


def _cost_source(recorded: CostSource, costs: str | None, model: ModelSpec, gpu: str, allow_stale_profile: bool,
                 where: str):
    """``(profile or None, the cost source to re-evaluate under)``: the recorded source (rebuilt; refused when it
    cannot be, e.g. a runner plan's observed costs, or when it changed), or the one ``costs`` names (a profile
    checked against the model and GPU as ``plan --profile`` checks it).

    Raises:
        ConfigError / ProfileError: as :func:`load_plan` says.
    """
    profile = None
    if costs is None:
        if recorded.kind in ("observed", "calibrated_device"):
            raise ConfigError(f"the plan's costs are {recorded.describe()}, which this re-evaluation cannot rebuild "
                              "(runner plans: tessera-lab run --plan / validate); ask for another source with "
                              "--costs analytic or --costs PROFILE.json")
        if recorded.kind == "profile":
            profile = _load_profile_for(recorded.path, f"the plan's costs name profile {recorded.path!r}")
        current = profile_source(profile) if profile is not None else analytic_source()
        check_same_source(recorded, current, allowed=False)
    else:
        if costs != "analytic":
            from tessera_lab.overlap.profiles import check_profile_fits

            profile = _load_profile_for(costs, f"--costs {costs}")
            check_profile_fits(profile, costs, model.name, gpu, allow=allow_stale_profile,
                               used_by=f"{where} ({model.name} on {gpu})")
        current = profile_source(profile) if profile is not None else analytic_source()
    return profile, current


def load_plan(data: Mapping[str, Any] | str | Path, *, costs: str | None = None,
              allow_stale_profile: bool = False) -> Plan:
    """Rebuild a :class:`~tessera_lab.plan.make.Plan` from plan JSON (keys ``model``, ``parallel``,
    ``boundaries``, ``gpu``, ``nodes``, ``costs``) and re-evaluate its partition (baselines are not rebuilt).

    Args:
        data: a path or a parsed dict.
        costs: ``None`` (default): under the recorded cost source; ``"analytic"`` or a profile path: under that
            source, with a note when it differs from the recorded one. A profile of another model or device
            (:func:`tessera_lab.checks.profile_mismatches`) is refused unless ``allow_stale_profile`` (then a
            :class:`~tessera_lab.overlap.profiles.StaleProfileWarning`), as ``plan --profile`` does.

    Raises:
        ConfigError: missing keys, a malformed file, boundaries that do not partition the model's layers, or a
            re-evaluation that would change the cost source without ``costs`` (e.g. the recorded profile is
            missing or its file changed).
    """
    data, where = read_plan_json(data)
    for key in ("model", "parallel", "boundaries"):
        if key not in data:
            raise ConfigError(f"field 'plan.{key}' is missing; allowed: the output of 'tessera-lab plan --json'")
    model = _model_of(data, where)
    parallel, cluster, gpu = _layout_of(data, where)
    b = data["boundaries"]
    L, S = model.num_layers, parallel.pp * parallel.vpp
    if (not isinstance(b, list) or len(b) != S + 1 or not all(isinstance(x, int) for x in b)
            or b[0] != 0 or b[-1] != L or any(y < x for x, y in zip(b, b[1:]))):
        raise ConfigError(f"field 'plan.boundaries' = {b!r} is invalid; allowed: {S + 1} non-decreasing "
                          f"integers from 0 to {L}")
    _check_plan_consistency(data, parallel, b, where)
    origin = _check_partition_from(data, b, where)
    recorded = CostSource.from_dict(data.get("costs"))
    profile, current = _cost_source(recorded, costs, model, gpu, allow_stale_profile, where)
    changed = check_same_source(recorded, current, allowed=True)
    cost_model, sm = build_stage_model(model, parallel, cluster, profile)
    part = Partition(list(b), [sm.cost(s, b[s], b[s + 1]) for s in range(S)], 0.0, 0.0,
                     str(data.get("method", "from-json")), solver=str(data.get("solver") or ""),
                     status=str(data.get("solver_status") or ""),
                     stage_memory=[sm.memory_bytes(s, b[s], b[s + 1]) for s in range(S)])
    part.bottleneck = part.objective = max(part.stage_costs)
    flops = model_flops_per_iteration(model, parallel)
    ev = evaluate(model, parallel, cost_model, sm, part, part.method, flops)
    notes = [str(n) for n in data.get("notes", [])]
    how = [f"re-evaluated from plan JSON under {current.describe()}"] + ([changed] if changed else [])
    was = data.get("iteration_time_s")
    if isinstance(was, (int, float)) and not math.isclose(was, ev.iteration_time_s, rel_tol=1e-9):
        how.append(f"the recorded iteration time {was:.4f} s differs from the re-evaluated "
                     f"{ev.iteration_time_s:.4f} s" + ("" if changed else " (the cost model or simulator changed)"))
    return Plan(model, parallel, cluster, ev, {}, sm.costs, flops, memory_capacity(cluster), notes, costs=current,
                reevaluation=how, partition_from=origin)
