"""Schemas of the files ``report --dynamic`` reads (:mod:`tessera_lab.schema`), checked before any work.

Two kinds (:mod:`tessera_lab.report.routing_terms` turns them into the capacity report's routing terms):

- ``simulate --routing SPEC --dynamic --json F`` (:data:`SIMULATION`): per-iteration times of the online controller
  (seconds, or units of ``--f/--b/--w`` for a synthetic simulation); ``routing_variance_s`` and ``idle_removed_s``
  may be negative (a routing can be faster than uniform, dynamic filling can add idle);
- ``run --dynamic --json F`` (:data:`RUN`, ``kind`` ``runner_dynamic``): medians and quartiles of observed step times
  and host idle (seconds >= 0), world sizes, the run's job identity.

Cross-field rules (:func:`check_dynamic_source`): the uniform iteration ``iteration_static_s - routing_variance_s``
is > 0; quartiles are ordered ``q1_s <= median_s <= q3_s``. Standard library only.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.checks import MAX_TIME_S
from tessera_lab.errors import ConfigError
from tessera_lab.schema import F, positive_seconds, seconds, validate

__all__ = ["SIMULATION", "RUN", "check_dynamic_source"]

_SIGNED = dict(low=-MAX_TIME_S, high=MAX_TIME_S, allowed=f"seconds from {-MAX_TIME_S:g} to {MAX_TIME_S:g}")

#: ``simulate --routing SPEC --dynamic --json`` as ``report --dynamic`` reads it
SIMULATION = F("dict", fields={
    "iteration_static_s": positive_seconds(),
    "iteration_dynamic_s": positive_seconds(),
    "routing_variance_s": F("num", **_SIGNED),
    "bubble_after_dynamic_s": seconds(),
    "idle_removed_s": F("num", **_SIGNED),
    "schedule": F("str", required=False), "routing": F("str", required=False), "costs": F("str", required=False),
    "predictor": F("str", required=False),
    "stages": F("int", low=1, limit="stages", required=False),
    "microbatches": F("int", low=1, limit="microbatches", required=False),
    "steps": F("int", low=1, limit="steps", required=False),
    "prediction_lag_steps": F("int", low=0, limit="steps", required=False),
})

_STATS = F("dict", fields={"median_s": seconds(), "q1_s": seconds(), "q3_s": seconds(),
                           "samples": F("int", low=1, limit="steps", required=False)})
_SIDE = F("dict", fields={"step_time": _STATS, "host_idle_per_step": _STATS})

#: ``run --dynamic --json`` as ``report --dynamic`` reads it
RUN = F("dict", fields={
    "kind": F("str", choices=("runner_dynamic",)),
    "routing": F("str"),
    "static": _SIDE, "dynamic": _SIDE,
    "schedule": F("str", required=False),
    "trials": F("int", low=1, limit="steps", required=False),
    "steps": F("int", low=1, limit="steps", required=False),
    "world": F("dict", required=False, fields={
        "pp": F("int", low=1, limit="pp", required=False), "ep": F("int", low=1, limit="ep", required=False),
        "dp": F("int", low=1, limit="dp", required=False),
        "ranks": F("int", low=1, limit="world_size", required=False)}),
    "gain": F("num", low=-1e6, high=1e6, null=True, required=False),
    "gain_verdict": F("str", choices=("significant", "not significant"), null=True, required=False),
    "job": F("dict", required=False, null=True),
})


def check_dynamic_source(data: Any, where: str) -> Any:
    """``data`` (a parsed ``report --dynamic`` file) checked against :data:`RUN` (``kind`` ``runner_dynamic``) or
    :data:`SIMULATION` (anything else that is an object), plus the cross-field rules of the module docstring.
    Returns ``data``.

    Raises:
        ConfigError: one line naming ``where``, the field, the value and what is allowed.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: top level is not a JSON object; allowed: the JSON of 'simulate --routing SPEC "
                          "--dynamic --json' or 'run --dynamic --json'")
    if data.get("kind") == "runner_dynamic":
        validate(data, RUN, where)
        for side in ("static", "dynamic"):
            for key in ("step_time", "host_idle_per_step"):
                st = data[side][key]
                if not st["q1_s"] <= st["median_s"] <= st["q3_s"]:
                    raise ConfigError(f"{where}: field '{side}.{key}' has q1_s = {st['q1_s']:g}, median_s = "
                                      f"{st['median_s']:g}, q3_s = {st['q3_s']:g}; allowed: q1_s <= median_s <= q3_s")
        return data
    if "kind" in data or "routing_variance_s" in data:
        if "kind" in data and "routing_variance_s" not in data:
            raise ConfigError(f"{where}: field 'kind' = {data['kind']!r} is not a dynamic source; allowed: "
                              "'runner_dynamic' (run --dynamic --json) or a 'simulate --routing SPEC --dynamic "
                              "--json' result")
        validate(data, SIMULATION, where)
        uni = data["iteration_static_s"] - data["routing_variance_s"]
        if uni <= 0:
            raise ConfigError(f"{where}: field 'routing_variance_s' = {data['routing_variance_s']:g} is out of range; "
                              f"allowed: below iteration_static_s = {data['iteration_static_s']:g} (the uniform "
                              "iteration, their difference, must be > 0)")
        return data
    raise ConfigError(f"{where}: neither 'simulate --routing SPEC --dynamic --json' (field 'routing_variance_s') nor "
                      "'run --dynamic --json' (field 'kind' = 'runner_dynamic') output; allowed: one of those")
