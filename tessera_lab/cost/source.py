"""Cost provenance: where the times a plan was made from came from (docs/design-notes.md, "Cost provenance").

A :class:`CostSource` travels with every :class:`~tessera_lab.plan.make.Plan`: into its JSON (key ``costs``), the
CLI output (``costs: analytic`` / ``costs: measured profile P on DEVICE, DATE``) and every report built from it.
Three kinds:

* ``analytic``: the cost model of :mod:`tessera_lab.cost.analytic` with its cited assumptions
  (``data/hardware/cost_model.json``; ``digest`` is its short hash).
* ``profile``: a measured overlap profile (:mod:`tessera_lab.overlap.profiles`): its path, backend, device, torch /
  CUDA / driver versions, date and a hash of the file, so a later re-evaluation can tell whether it still reads
  the same measurements.
* ``observed``: runs of the runner (per-action times), with the path of the run record.
* ``calibrated_device``: a calibrated device file (``tessera-lab calibrate``; :func:`tessera_lab.cost.device.cost_source`
  writes this kind into the runner's plans).

Re-evaluating a plan under another source happens only when asked, and says so
(:func:`check_same_source`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tessera_lab.errors import ConfigError

KINDS = ("analytic", "profile", "observed", "calibrated_device")


def file_digest(path: str | Path) -> str | None:
    """Short sha256 (12 hex digits) of a file's bytes, or ``None`` when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    except OSError:
        return None


@dataclass(frozen=True)
class CostSource:
    """Where a plan's costs came from.

    Attributes:
        kind: ``analytic``, ``profile`` or ``observed``.
        path: the profile or run file (``None`` for analytic).
        device: the device the numbers describe (``analytic model of H200``, ``NVIDIA H200``, a CPU name).
        date: when they were measured (ISO 8601, the profile's ``updated`` stamp), or ``None``.
        backend: measuring backend (``cuda``, ``cpu``, ``analytic``) of a profile.
        versions: torch / CUDA / driver versions recorded with the measurement.
        digest: short hash of the file (profile or run) or of the cost-model file (analytic).
    """

    kind: str = "analytic"
    path: str | None = None
    device: str | None = None
    date: str | None = None
    backend: str | None = None
    versions: Mapping[str, Any] = field(default_factory=dict)
    digest: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"field 'costs.kind' = {self.kind!r} is unknown; allowed: {', '.join(KINDS)}")

    def describe(self) -> str:
        """One line for output: ``analytic`` or ``measured profile P on DEVICE, DATE`` (``observed runs ...``)."""
        if self.kind == "analytic":
            return "analytic" + (f" (cost model {self.digest})" if self.digest else "")
        what = {"profile": "measured profile", "observed": "observed runs",
                "calibrated_device": "calibrated device"}[self.kind]
        return f"{what} {self.path or '(in memory)'} on {self.device or 'unknown device'}, {self.date or 'undated'}"

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "device": self.device, "date": self.date,
                "backend": self.backend, "versions": dict(self.versions), "digest": self.digest,
                "description": self.describe()}

    @classmethod
    def from_dict(cls, data: Any) -> "CostSource":
        """Read the ``costs`` field of a plan JSON (a string ``"analytic"`` is accepted too).

        Raises:
            ConfigError: not an object or a string, or an unknown kind.
        """
        if data is None or data == "analytic":
            return analytic_source()
        if not isinstance(data, Mapping):
            raise ConfigError(f"field 'costs' = {data!r} is invalid; allowed: an object with 'kind' "
                              f"({', '.join(KINDS)})")
        versions = dict(data.get("versions") or {})
        if data.get("torch") and "torch" not in versions:  # the runner's calibrated-device form
            versions["torch"] = data["torch"]
        return cls(kind=str(data.get("kind", "analytic")), path=data.get("path"), device=data.get("device"),
                   date=data.get("date"), backend=data.get("backend"), versions=versions, digest=data.get("digest"))

    def same_as(self, other: "CostSource") -> bool:
        """Same kind and the same measurements: path and file hash (for analytic, the cost-model hash); a
        missing hash (plans written before hashes were recorded) matches any."""
        if self.kind != other.kind or self.path != other.path:
            return False
        return self.digest is None or other.digest is None or self.digest == other.digest


def analytic_source() -> CostSource:
    """The analytic cost model as it is on this checkout (its ``cost_model.json`` hash)."""
    from tessera_lab.paths import data_dir

    return CostSource("analytic", digest=file_digest(data_dir() / "hardware" / "cost_model.json"))


def profile_source(profile: Any) -> CostSource:
    """The source of a loaded :class:`tessera_lab.overlap.profiles.Profile`."""
    env = dict(profile.environment)
    path = str(profile.path) if profile.path is not None else None
    return CostSource("profile", path=path, device=env.get("device"),
                      date=profile.data.get("updated") or profile.data.get("created"), backend=profile.backend,
                      versions={k: env.get(k) for k in ("torch", "cuda", "driver") if env.get(k) is not None},
                      digest=file_digest(path) if path else None)


def observed_source(path: str | Path, device: str | None = None, date: str | None = None) -> CostSource:
    """The source of a plan re-evaluated from observed runs (a run record file)."""
    return CostSource("observed", path=str(path), device=device, date=date, digest=file_digest(path))


def check_same_source(recorded: CostSource, current: CostSource, *, allowed: bool) -> str | None:
    """Refuse a re-evaluation that changes a plan's cost source unless ``allowed``.

    Returns:
        ``None`` when the sources agree, else the sentence that says what changed (to print when allowed).

    Raises:
        ConfigError: the sources differ and the caller did not ask for it (names both and the way to ask).
    """
    if recorded.same_as(current):
        return None
    msg = f"the plan's costs are {recorded.describe()}; re-evaluated under {current.describe()}"
    if not allowed:
        hint = "--costs analytic" if current.kind == "analytic" else "--costs " + current.kind
        raise ConfigError(f"{msg} would change the plan's cost source; ask for it with {hint}")
    return msg
