"""The profile store: measured overlap of layer pairs as schema-versioned JSON (docs/concepts.md, "Overlap of two
task bundles"; format: docs/file-schemas.md).

File layout (``schema_version`` 1)::

    {
      "schema_version": 1,
      "created": "<ISO date>", "updated": "<ISO date>",
      "backend": "cpu" | "cuda" | "analytic",
      "model": "<model name>",
      "parallel": {"ep": 8, "tp": 1, "seq_len": 4096, "micro_batch_size": 1, "dtype": "bf16"},
      "size_factor": 0.125,
      "environment": {"device": ..., "torch": ..., "cuda": ..., "driver": ..., "python": ..., "platform": ...},
      "entries": {
        "F:linear_attention+moe|BW:full_attention+moe": {
          "kind_f": ..., "kind_b": ..., "phase_f": "F", "phase_b": "BW", "layer_f": 0, "layer_b": 3,
          "t_a": {"median": s, "q1": s, "q3": s, "min": s, "max": s, "n": N, "samples": [...]},
          "t_b": {...}, "t_ab": {...}, "t_program": {...},
          "gain": s, "efficiency": e, "comm_hidden_fraction": x, "inflation": {task: ratio}, "order": [...],
          "metadata": {"backend", "device", "torch", "cuda", "driver", "dtype", "shapes", "repeats", "spread",
                       "date", "dates", "size_factor", "comm_proxy", ...}
        }
      }
    }

Times are seconds. Writes go through :func:`tessera_lab.io.atomic_write_text` (a killed writer leaves the
previous file intact). A profile whose recorded device or versions differ from this machine's is
**stale**: :func:`load_profile` warns with :class:`StaleProfileWarning` and :func:`is_stale` says so;
re-measure it (``tessera-lab measure``). Measuring the same key again on the same device and versions
merges the samples (repeats add up, quartiles are recomputed); a measurement from another environment
replaces the entry.

This module never imports torch (versions come from package metadata).
"""

from __future__ import annotations

import datetime as _dt
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from tessera_lab.checks import check_time
from tessera_lab.errors import ConfigError, ProfileError
from tessera_lab.io import read_json

SCHEMA_VERSION = 1
#: environment fields compared for staleness (a change in any makes a profile stale).
STALE_FIELDS = ("device", "torch", "cuda", "driver", "cost_model")
#: entry metadata fields that must match for repeated measurements to merge.
MERGE_FIELDS = ("backend", "device", "torch", "cuda", "driver", "dtype", "shapes", "size_factor", "comm_proxy",
                "world_size", "cost_model")
_STAT_FIELDS = ("t_a", "t_b", "t_ab", "t_program")


class StaleProfileWarning(UserWarning):
    """The profile was measured on another device or with other torch / CUDA / driver versions."""


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


from .environment import _cpu_name, _nvidia_smi, _torch_version, cost_model_digest, current_environment  # noqa: F401


# ---------------------------------------------------------------------- the profile object
@dataclass
class Profile:
    """An in-memory profile (the JSON document in ``data``) and where it was loaded from."""

    data: dict[str, Any]
    path: Path | None = None
    stale_reasons: list[str] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return self.data["backend"]

    @property
    def model(self) -> str:
        return self.data.get("model", "")

    @property
    def size_factor(self) -> float:
        return float(self.data.get("size_factor", 1.0))

    @property
    def environment(self) -> dict[str, Any]:
        return self.data.get("environment", {})

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        return self.data["entries"]

    def entry(self, kind_f: str, kind_b: str, phase_b: str = "BW") -> dict[str, Any] | None:
        return self.entries.get(pair_key(kind_f, kind_b, phase_b=phase_b))

    def table(self) -> "Any":
        """The entries as a DataFrame like :func:`tessera_lab.overlap.core.results_table` (seconds)."""
        import pandas as pd

        rows = []
        for e in self.entries.values():
            rows.append({
                "kind_f": e["kind_f"], "kind_b": e["kind_b"], "layer_f": e.get("layer_f"), "layer_b": e.get("layer_b"),
                "t_f": e["t_a"]["median"], "t_b": e["t_b"]["median"],
                "t_sum": e["t_a"]["median"] + e["t_b"]["median"], "t_pair": e["t_ab"]["median"],
                "t_program": e["t_program"]["median"], "gain": e["gain"], "efficiency": e["efficiency"],
                "comm_hidden_fraction": e["comm_hidden_fraction"], "t_pair_q1": e["t_ab"]["q1"],
                "t_pair_q3": e["t_ab"]["q3"], "repeats": e["metadata"].get("repeats"), "backend": e["metadata"].get("backend"),
            })
        return pd.DataFrame(rows)


def pair_key(kind_f: str, kind_b: str, *, phase_f: str = "F", phase_b: str = "BW") -> str:
    """Entry key, e.g. ``"F:linear_attention+moe|BW:full_attention+moe"``."""
    return f"{phase_f}:{kind_f}|{phase_b}:{kind_b}"


def new_profile(backend: str, model: str, parallel: Any = None, *, size_factor: float = 1.0,
                environment: Mapping[str, Any] | None = None, gpu: str | None = None) -> Profile:
    """An empty profile for ``backend`` on this machine (or the given environment)."""
    env = dict(environment) if environment is not None else current_environment(backend, gpu)
    par = None
    if parallel is not None:
        par = {k: getattr(parallel, k) for k in ("ep", "tp", "seq_len", "micro_batch_size", "dtype")}
    return Profile({"schema_version": SCHEMA_VERSION, "created": _now(), "updated": _now(), "backend": backend,
                    "model": model, "parallel": par, "size_factor": float(size_factor), "environment": env,
                    "entries": {}})


def _stats(samples: Sequence[float]) -> dict[str, Any]:
    from tessera_lab.overlap.results import spread_stats

    return spread_stats(samples)


def entry_from_result(result: Any) -> tuple[str, dict[str, Any]]:
    """(key, entry) for an :class:`tessera_lab.overlap.core.OverlapResult`."""
    meta = dict(result.metadata)
    shapes = meta.get("shapes", {})
    key = pair_key(result.kind_a, result.kind_b, phase_f=result.phase_a or "F", phase_b=result.phase_b or "BW")
    meta.setdefault("dates", [meta.get("date", _now())])
    entry = {
        "kind_f": result.kind_a, "kind_b": result.kind_b, "phase_f": result.phase_a, "phase_b": result.phase_b,
        "layer_f": (shapes.get("a") or {}).get("layer"), "layer_b": (shapes.get("b") or {}).get("layer"),
        **{name: dict(result.spread[name]) for name in _STAT_FIELDS},
        "gain": result.gain, "efficiency": result.overlap_efficiency,
        "comm_hidden_fraction": result.comm_hidden_fraction, "inflation": dict(result.inflation),
        "order": list(result.order), "metadata": meta,
    }
    if result.durations:
        from tessera_lab.overlap.fit import fit_sample

        entry["tasks"] = {k: {"duration_s": result.durations[k], "lane": result.lanes.get(k),
                              "deps": list(result.deps.get(k, ()))} for k in result.durations}
        entry["fit_sample"] = fit_sample(result)
    return key, entry


#: grid step of the contention fit stored in a profile (``profile.data["fit"]``)
PROFILE_FIT_STEP = 0.1


def refit(profile: "Profile"):
    """Redo the contention fit from the profile's stored per-task data (``fit_sample`` of each entry):
    a :class:`tessera_lab.overlap.fit.ContentionFit` equal to the one stored in ``profile.data["fit"]``.

    Raises:
        ConfigError: the profile holds no entry with per-task data.
    """
    from tessera_lab.overlap.fit import fit_contention_samples

    samples = [e["fit_sample"] for _, e in sorted(profile.entries.items()) if e.get("fit_sample")]
    if not samples:
        raise ConfigError(f"profile '{profile.path}' has no entries with per-task data (field 'fit_sample')")
    step = float((profile.data.get("fit") or {}).get("grid_step", PROFILE_FIT_STEP))
    return fit_contention_samples(samples, step=step)


def _comparable(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in MERGE_FIELDS}


def merge_entries(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Combine two measurements of one key: samples concatenated, statistics recomputed, repeats added,
    inflation and hidden fraction averaged weighted by repeats, the newer order kept. If their metadata
    differ in any of :data:`MERGE_FIELDS` (another device, version, shape or size factor) the new entry
    replaces the old one."""
    if _comparable(old.get("metadata", {})) != _comparable(new.get("metadata", {})):
        return dict(new)
    out = dict(new)
    n_old = int(old["metadata"].get("repeats", old["t_ab"].get("n", 1)))
    n_new = int(new["metadata"].get("repeats", new["t_ab"].get("n", 1)))
    for name in _STAT_FIELDS:
        out[name] = _stats(list(old[name]["samples"]) + list(new[name]["samples"]))
    ta, tb, tab = out["t_a"]["median"], out["t_b"]["median"], out["t_ab"]["median"]
    out["gain"] = ta + tb - tab
    out["efficiency"] = (ta + tb - tab) / min(ta, tb) if min(ta, tb) > 0 else math.nan
    w = n_old + n_new
    out["comm_hidden_fraction"] = (old["comm_hidden_fraction"] * n_old + new["comm_hidden_fraction"] * n_new) / w
    out["inflation"] = {k: (old["inflation"].get(k, v) * n_old + v * n_new) / w for k, v in new["inflation"].items()}
    meta = dict(new["metadata"])
    meta["repeats"] = w
    meta["dates"] = list(old["metadata"].get("dates", [old["metadata"].get("date")])) + list(
        new["metadata"].get("dates", [new["metadata"].get("date")]))
    out["metadata"] = meta
    return out


def add_results(profile: Profile, results: Iterable[Any]) -> Profile:
    """Add overlap results to a profile, merging repeated measurements of the same key (in place)."""
    for r in results:
        if r.backend != profile.backend:
            raise ConfigError(f"result backend {r.backend!r} does not match the profile's {profile.backend!r}")
        key, entry = entry_from_result(r)
        old = profile.entries.get(key)
        profile.entries[key] = merge_entries(old, entry) if old is not None else entry
    profile.data["updated"] = _now()
    if profile.backend != "analytic" and any(e.get("fit_sample") for e in profile.entries.values()):
        profile.data.pop("fit", None)
        profile.data["fit"] = {**refit(profile).as_dict(), "grid_step": PROFILE_FIT_STEP,
                               "method": "least squares of relative t_ab error, grid over [0, 3]^2, then 10x finer"}
    return profile


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write a profile atomically (temporary file, fsync, rename); returns the path."""
    from tessera_lab.io import atomic_write_text, dumps

    p = atomic_write_text(path, dumps(profile.data))
    profile.path = p
    return p


# ---------------------------------------------------------------------- loading and staleness
def validate_profile_data(data: Any, source: str = "profile") -> None:
    """Check the document's structure.

    Raises:
        ProfileError: naming the field (``schema_version``, ``backend``, ``entries``, ``entries[<key>].t_ab``);
            an empty ``entries`` too (nothing measured: costs from it would be analytic under the profile's name).
    """
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: top level must be a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ProfileError(f"{source}: field 'schema_version' = {version!r} is not supported; allowed: {SCHEMA_VERSION}")
    if data.get("backend") not in ("analytic", "cpu", "cuda"):
        raise ProfileError(f"{source}: field 'backend' = {data.get('backend')!r} is unknown; allowed: analytic, cpu, cuda")
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise ProfileError(f"{source}: field 'entries' must be an object")
    if not entries:  # its costs would be the analytic model's under the profile's name
        raise ProfileError(f"{source}: field 'entries' is empty; allowed: at least one measured layer pair "
                           "(tessera-lab measure writes them)")
    for key, e in entries.items():
        if not isinstance(e, dict):
            raise ProfileError(f"{source}: field 'entries[{key}]' must be an object")
        for name in ("kind_f", "kind_b") + _STAT_FIELDS + ("metadata",):
            if name not in e:
                raise ProfileError(f"{source}: field 'entries[{key}].{name}' is missing")
        for name in _STAT_FIELDS:
            if not isinstance(e[name], dict) or "median" not in e[name] or "samples" not in e[name]:
                raise ProfileError(f"{source}: field 'entries[{key}].{name}' needs 'median' and 'samples'")
            # times are seconds: finite and >= 0 (tessera_lab.checks); a negative or NaN time is refused
            check_time(e[name]["median"], f"entries[{key}].{name}.median", where=source, error=ProfileError)
            samples = e[name]["samples"]
            if not isinstance(samples, list):
                raise ProfileError(f"{source}: field 'entries[{key}].{name}.samples' must be a list of seconds")
            for i, v in enumerate(samples):
                check_time(v, f"entries[{key}].{name}.samples[{i}]", where=source, error=ProfileError)


def stale_reasons(profile: Profile, environment: Mapping[str, Any] | None = None) -> list[str]:
    """Why a profile no longer matches this machine (empty when current): one line per differing field of
    :data:`STALE_FIELDS`, for the profile's environment and every entry's metadata."""
    env = dict(environment) if environment is not None else current_environment(
        profile.backend, _gpu_of(profile))
    reasons = []
    recorded = [("profile", profile.environment)] + [(f"entry {k}", e.get("metadata", {})) for k, e in profile.entries.items()]
    for label, meta in recorded:
        for f in STALE_FIELDS:
            if f in meta and f in env and meta.get(f) != env.get(f):
                reasons.append(f"{label}: {f} {meta.get(f)!r} != current {env.get(f)!r}")
    return reasons


def _gpu_of(profile: Profile) -> str | None:
    dev = profile.environment.get("device", "")
    return dev.replace("analytic model of ", "") if isinstance(dev, str) and dev.startswith("analytic model of ") else None


def is_stale(profile: Profile, environment: Mapping[str, Any] | None = None) -> bool:
    """True when the profile's device or torch / CUDA / driver versions (or, for an analytic profile, the
    cost-model file) differ from this machine's."""
    return bool(stale_reasons(profile, environment))


def load_profile(path: str | Path, *, check_stale: bool = True, environment: Mapping[str, Any] | None = None) -> Profile:
    """Read a profile.

    Args:
        path: the JSON file.
        check_stale: compare with this machine and warn (:class:`StaleProfileWarning`) if it differs.
        environment: compare with this environment instead of the current machine's.

    Raises:
        ProfileError: missing or unreadable file, invalid JSON, an unknown ``schema_version`` or a malformed
            entry (naming the field).
    """
    path = Path(path)
    data = read_json(path, "profile", error=ProfileError)  # UTF-8, size, depth, finiteness
    validate_profile_data(data, f"profile '{path}'")
    from tessera_lab.overlap.profile_schema import check_profile

    check_profile(data, f"profile '{path}'")
    prof = Profile(data, path)
    if check_stale:
        prof.stale_reasons = stale_reasons(prof, environment)
        if prof.stale_reasons:
            warnings.warn(f"profile '{path}' is stale ({'; '.join(prof.stale_reasons[:3])}); re-measure it with "
                          f"tessera-lab measure --backend {prof.backend}", StaleProfileWarning, stacklevel=2)
    return prof


def check_profile_fits(profile: Any, path: str, model_name: str, gpu: str | None, *, allow: bool,
                       used_by: str = "this plan") -> None:
    """Refuse a profile that does not fit where it is used (:func:`tessera_lab.checks.profile_mismatches`), or with ``allow``
    (``--allow-stale-profile``) warn once (:class:`StaleProfileWarning`).

    Raises:
        ProfileError: naming the profile, what it was measured for and what it is used for.
    """
    from tessera_lab.checks import profile_mismatches

    wrong = profile_mismatches(profile, model_name, gpu)
    if wrong and not allow:
        raise ProfileError(f"profile '{path}' does not match {used_by} ({'; '.join(wrong)}); re-measure it "
                           f"(tessera-lab measure --backend {profile.backend} --model {model_name}) or pass "
                           "--allow-stale-profile to use it anyway")
    if wrong:
        warnings.warn(f"using profile '{path}' although it does not match ({'; '.join(wrong)})",
                      StaleProfileWarning, stacklevel=2)


def update_profile(path: str | Path, results: Iterable[Any], *, backend: str, model: str, parallel: Any = None,
                   size_factor: float = 1.0, gpu: str | None = None) -> Profile:
    """Load ``path`` if it exists (a stale or foreign profile is replaced), add ``results`` (merging repeats)
    and write it back atomically."""
    path = Path(path)
    prof = None
    if path.exists():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", StaleProfileWarning)
                prof = load_profile(path)
        except ProfileError:
            prof = None
        if prof is not None and (prof.stale_reasons or prof.backend != backend or prof.model != model
                                 or prof.size_factor != float(size_factor)):
            prof = None
    if prof is None:
        prof = new_profile(backend, model, parallel, size_factor=size_factor, gpu=gpu)
    add_results(prof, results)
    save_profile(prof, path)
    return prof


# ---------------------------------------------------------------------- planner lookups
def pair_time(profile: Profile, kind_f: str, kind_b: str, *, t_f: float | None = None, t_b: float | None = None,
              phase_b: str = "BW") -> float | None:
    """Time of the forward of a ``kind_f`` layer together with the backward of a ``kind_b`` layer, seconds,
    or ``None`` when the profile has no such entry.

    Without ``t_f`` / ``t_b``: the measured median ``t_ab`` at the profile's own shapes (size factor
    ``profile.size_factor``, on the profile's device). With the standalone times of the two bundles at the
    planner's scale (``t_f``, ``t_b``, seconds, e.g. from the analytic cost model): the measured overlap
    efficiency ``e`` is transferred, ``t_f + t_b - e * min(t_f, t_b)`` (equal to the measured ``t_ab`` when
    ``t_f``, ``t_b`` are the measured standalone times).
    """
    e = profile.entry(kind_f, kind_b, phase_b)
    if e is None:
        return None
    if t_f is None and t_b is None:
        return float(e["t_ab"]["median"])
    if t_f is None or t_b is None or t_f < 0 or t_b < 0:
        raise ConfigError("fields 't_f' and 't_b' must both be given as seconds >= 0")
    ta, tb, tab = e["t_a"]["median"], e["t_b"]["median"], e["t_ab"]["median"]
    eff = (ta + tb - tab) / min(ta, tb) if min(ta, tb) > 0 else 0.0
    return t_f + t_b - eff * min(t_f, t_b)


def profile_stage_pair_costs(profile: Profile, model: Any, parallel: Any, cost_model: Any = None, *,
                             budget: int = 300) -> dict[tuple[str, str], float]:
    """Pair costs for the planner: ``{(kind_f, kind_b): seconds}`` of the forward of one micro-batch
    together with the full backward (B + W) of another, at the planner's scale.

    When the profile was measured at full scale (``size_factor == 1``) for this model and these ``ep``, ``tp``,
    ``seq_len``, ``micro_batch_size`` and ``dtype``, the measured median ``t_ab`` is used as is. Otherwise
    (a scaled-down CPU profile, or other shapes) the measured overlap efficiency is transferred onto the
    analytic standalone times of this model: ``t_f + t_b - e * min(t_f, t_b)`` (:func:`pair_time`).
    Combinations the profile lacks fall back to the analytic pair time (``overlap.measure_pair`` with the
    analytic backend). Use with :func:`tessera_lab.overlap.core.stage_pair_cost` to cost a stage.
    """
    from tessera_lab.cost.analytic import CostModel
    from tessera_lab.model.hardware import cluster_for
    from tessera_lab.overlap.bundles import analytic_durations, bundle
    from tessera_lab.overlap.measure import measure_pair
    from tessera_lab.overlap.table import layer_kind_examples

    cm = cost_model or CostModel(cluster_for(parallel), parallel)
    par = {k: getattr(parallel, k) for k in ("ep", "tp", "seq_len", "micro_batch_size", "dtype")}
    exact = profile.size_factor == 1.0 and profile.model == model.name and (profile.data.get("parallel") or {}) == par
    ex = layer_kind_examples(model)
    out: dict[tuple[str, str], float] = {}
    standalone: dict[tuple[str, str], float] = {}
    from tessera_lab.cost.lanes import pair_makespan
    from tessera_lab.overlap.bundles import pair_graph

    def alone(layer: int, phase: str) -> float:
        if (str(layer), phase) not in standalone:
            bd = bundle(model, layer, phase, parallel)
            g = pair_graph(bd)
            d = {f"{bd.name}/{k}": v for k, v in analytic_durations(bd, cm).items()}
            standalone[(str(layer), phase)] = pair_makespan(g.keys, d, g.lanes, g.deps, contention=cm.contention,
                                                            classes=g.classes, demands=cm.demands(g.tasks)).makespan
        return standalone[(str(layer), phase)]

    for kf, lf in ex.items():
        for kb, lb in ex.items():
            entry = profile.entry(kf, kb, "BW")
            if entry is not None and exact:
                out[(kf, kb)] = float(entry["t_ab"]["median"])
            elif entry is not None:
                out[(kf, kb)] = pair_time(profile, kf, kb, t_f=alone(lf, "F"), t_b=alone(lb, "BW"))
            else:
                r = measure_pair(bundle(model, lf, "F", parallel, name=f"F{lf}"),
                                 bundle(model, lb, "BW", parallel, name=f"BW{lb}"), "analytic", cost_model=cm,
                                 budget=budget)
                out[(kf, kb)] = r.t_ab
    return out
