"""The schema of an overlap profile (``tessera-lab measure --out``, ``plan --profile``; layout in
:mod:`tessera_lab.overlap.profiles`), checked when the file is read, before any planning.

:data:`PROFILE` types and bounds every field the planner and the profile tools read (times in seconds, finite,
``>= 0`` and at most :data:`tessera_lab.checks.MAX_TIME_S`; sizes under the work limits); :func:`check_profile`
adds the cross-field rules: an entry's key is ``{phase_f}:{kind_f}|{phase_b}:{kind_b}`` (a renamed key would be
silently never looked up), and each timing's ``median`` lies within its quartiles, its ``min``/``max`` and its
samples. Fields the tools do not read (provenance, environment details, notes) may be added freely.

Standard library only; never imports torch.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.checks import MAX_TIME_S
from tessera_lab.errors import ProfileError
from tessera_lab.schema import F, seconds, validate

__all__ = ["PROFILE", "PROFILE_ENTRY", "check_profile"]

#: ``schema_version`` of the profiles this schema describes
PROFILE_VERSION = 1
_STAT_FIELDS = ("t_a", "t_b", "t_ab", "t_program")

#: one timing (:func:`tessera_lab.overlap.results.spread_stats`), seconds
TIMING = F("dict", fields={
    "median": seconds(),
    "samples": F("list", low=1, limit="repeats", items=seconds(), allowed="a non-empty list of seconds"),
    "q1": seconds(required=False), "q3": seconds(required=False), "min": seconds(required=False),
    "max": seconds(required=False), "n": F("int", low=1, limit="repeats", required=False),
})

#: one entry (a measured pair of layer bundles)
PROFILE_ENTRY = F("dict", fields={
    "kind_f": F("str"), "kind_b": F("str"),
    "phase_f": F("str", null=True, required=False), "phase_b": F("str", null=True, required=False),
    "layer_f": F("int", low=0, limit="layers", null=True, required=False),
    "layer_b": F("int", low=0, limit="layers", null=True, required=False),
    **{name: TIMING for name in _STAT_FIELDS},
    "gain": F("num", low=-MAX_TIME_S, high=MAX_TIME_S, required=False,
              allowed=f"seconds from {-MAX_TIME_S:g} to {MAX_TIME_S:g} (t_a + t_b - t_ab: negative when slower)"),
    "efficiency": F("num", low=-1e6, high=1e6, required=False),
    "comm_hidden_fraction": F("num", low=0.0, high=1.0, required=False),
    "inflation": F("map", limit="costs", values=F("num", low=0.0, high=1e6), required=False),
    "order": F("list", limit="costs", items=F("str"), required=False),
    "metadata": F("dict", fields={
        "repeats": F("int", low=1, limit="repeats", required=False),
        "backend": F("str", required=False, null=True),
        "size_factor": F("num", low=0.0, low_open=True, high=1.0, required=False, allowed="a number in (0, 1]"),
    }),
    "tasks": F("map", limit="costs", required=False, values=F("dict", fields={
        "duration_s": seconds(), "lane": F("str", null=True, required=False),
        "deps": F("list", limit="costs", items=F("str"), required=False)})),
})

#: a whole profile (``schema_version`` 1)
PROFILE = F("dict", fields={
    "schema_version": F("int", choices=(PROFILE_VERSION,), allowed=str(PROFILE_VERSION)),
    "backend": F("str", choices=("analytic", "cpu", "cuda")),
    "model": F("str", required=False),
    "created": F("str", required=False), "updated": F("str", required=False),
    "parallel": F("dict", null=True, required=False, fields={
        "ep": F("int", low=1, limit="ep", required=False), "tp": F("int", low=1, limit="tp", required=False),
        "seq_len": F("int", low=1, limit="seq_len", required=False),
        "micro_batch_size": F("int", low=1, limit="micro_batch_size", required=False),
        "dtype": F("str", required=False)}),
    "size_factor": F("num", low=0.0, low_open=True, high=1.0, required=False, allowed="a number in (0, 1]"),
    "environment": F("dict", required=False),
    "fit": F("dict", null=True, required=False, fields={
        "grid_step": F("num", low=0.0, low_open=True, high=1.0, required=False)}),
    "entries": F("map", low=1, limit="costs", values=PROFILE_ENTRY),
}, allowed="an object (a profile from tessera-lab measure)")


def check_profile(data: Any, where: str, *, error: type[Exception] = ProfileError) -> Any:
    """``data`` (a parsed profile) checked against :data:`PROFILE` and the cross-field rules of the module
    docstring; returns ``data`` unchanged.

    Args:
        where: the file as shown first in a message (``"profile 'p.json'"``).

    Raises:
        ``error`` (:class:`~tessera_lab.errors.ProfileError` by default): one line naming ``where``, the field
        (``entries[F:a|BW:b].t_ab.median``), the value and what is allowed.
    """
    validate(data, PROFILE, where, error=error)
    for key, e in data["entries"].items():
        want = f"{e.get('phase_f') or 'F'}:{e['kind_f']}|{e.get('phase_b') or 'BW'}:{e['kind_b']}"
        if key != want:
            raise error(f"{where}: field 'entries' has key {key!r} for an entry of kinds {e['kind_f']!r} / "
                        f"{e['kind_b']!r}; allowed: the key {want!r} (phase_f:kind_f|phase_b:kind_b)")
        for name in _STAT_FIELDS:
            t = e[name]
            med, xs = t["median"], t["samples"]
            bounds = [("q1", t.get("q1"), "q3", t.get("q3")), ("min", t.get("min"), "max", t.get("max")),
                      ("the smallest sample", min(xs), "the largest sample", max(xs))]
            for lo_name, lo, hi_name, hi in bounds:
                if (lo is not None and med < lo) or (hi is not None and med > hi):
                    raise error(f"{where}: field 'entries[{key}].{name}.median' = {med:g} is out of range; allowed: "
                                f"from {lo_name} ({'-' if lo is None else f'{lo:g}'}) to {hi_name} "
                                f"({'-' if hi is None else f'{hi:g}'})")
    return data
