"""Schemas of the runner's files (:mod:`tessera_lab.schema`): the runner plan (``plan --device``), the runner
observation store (``run --profile-store``) and a run result (``run --json``, read by ``report --observed``), with
the runner's work limits (:func:`check_runner_work`). Each is checked when the file is read, before any work.

Never imports torch.
"""

from __future__ import annotations

from typing import Any

from tessera_lab.checks import MAX_CONFIG_INT, check_work
from tessera_lab.errors import ConfigError
from tessera_lab.schema import F, positive_seconds, seconds, validate

__all__ = ["RUNNER_PLAN", "RUNNER_STORE", "RUN_RESULT", "TINY_MODEL", "VALIDATION_RESULT", "check_runner_plan",
           "check_runner_store", "check_validation_result",
           "check_run_result", "check_runner_work", "runner_params"]

_SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev", "overlapped")

#: the tiny model's fields (:class:`tessera_lab.runner.runtime.specs.TinyConfig`), typed and bounded
TINY_MODEL = F("dict", fields={
    "vocab_size": F("int", low=2, high=MAX_CONFIG_INT, required=False),
    "hidden_size": F("int", low=1, high=MAX_CONFIG_INT, required=False),
    "num_layers": F("int", low=1, limit="layers", required=False),
    "attention_ratio": F("int", low=0, limit="attention_ratio", required=False),
    "num_heads": F("int", low=1, high=MAX_CONFIG_INT, required=False),
    "head_dim": F("int", low=1, high=MAX_CONFIG_INT, required=False),
    "num_kv_heads": F("int", low=1, high=MAX_CONFIG_INT, required=False),
    "num_experts": F("int", low=1, limit="num_experts", required=False),
    "top_k": F("int", low=1, limit="top_k", required=False),
    "expert_width": F("int", low=1, limit="expert_width", required=False),
    "shared_expert_width": F("int", low=0, high=MAX_CONFIG_INT, required=False),
    "seq_len": F("int", low=1, limit="seq_len", required=False),
    "linear_chunk": F("int", low=1, high=MAX_CONFIG_INT, required=False),
    "capacity_factor": F("num", low=0.0, low_open=True, high=1e6, null=True, required=False),
    "ep_dispatch": F("str", choices=("auto", "uneven", "capacity"), required=False),
    "router_bias": F("list", null=True, required=False, limit="experts", items=F("any")),
    "seed": F("int", low=-(2**63), high=2**63 - 1, required=False),
})

_PER_STAGE = F("list", low=1, limit="stages", items=positive_seconds())

#: ``tessera-lab plan --model tiny-runner --device FILE --json`` (:func:`tessera_lab.runner.testbed.predict.device_plan`)
RUNNER_PLAN = F("dict", fields={
    "kind": F("str", choices=("runner_plan",)),
    "schema_version": F("int", choices=(1,), allowed="1"),
    "model": F("str", required=False),
    "model_config": TINY_MODEL,
    "parallel": F("dict", fields={
        "pp": F("int", low=1, limit="pp"), "ep": F("int", low=1, limit="ep"), "dp": F("int", low=1, limit="dp"),
        "microbatches": F("int", low=1, limit="microbatches"),
        "micro_batch_size": F("int", low=1, limit="micro_batch_size"),
        "schedule": F("str", choices=_SCHEDULES),
        "vpp": F("int", low=1, limit="vpp", null=True, required=False),
    }),
    "boundaries": F("list", low=2, limit="layers", items=F("int", low=0, limit="layers")),
    "pair_exec": F("str", null=True, required=False),
    "pair_order": F("dict", null=True, required=False, fields={
        "template": F("list", low=1, high=64, items=F("str")), "label": F("str", required=False)}),
    "costs": F("dict", fields={"source": F("str")}),
    "prediction": F("dict", fields={
        "iteration_s": positive_seconds(), "stage_f_s": _PER_STAGE, "stage_b_s": _PER_STAGE,
        "bubble_s": seconds(null=True, required=False), "ep_a2a_s": seconds(null=True, required=False),
        "cpu_per_step_s": positive_seconds(null=True, required=False)}),
    "predicted_at": F("str", null=True, required=False),
})

_MAP_S = F("map", values=seconds(), limit="costs")

#: one entry of the runner observation store (:func:`tessera_lab.runner.launch.results.record_profile`); what
#: ``report --lifecycle`` reads is required, the rest is checked when present
STORE_RUN = F("dict", fields={
    "predictions": F("str", choices=("plan (before the run)", "in-sample (this run's medians)")),
    "microbatches": F("int", low=1, limit="microbatches", required=False),
    "lifecycle": F("dict", required=False, fields={"steps": F("list", limit="steps", items=F("dict", fields={
        "observed": _MAP_S, "predicted": F("map", values=seconds(), null=True, required=False),
        "step_time_s": seconds(null=True, required=False)}))}),
    "date": F("str", required=False), "job": F("str", required=False), "schedule": F("str", required=False),
    "world": F("dict", required=False, fields={"pp": F("int", low=1), "ep": F("int", low=1), "dp": F("int", low=1)}),
    "model": F("dict", required=False),
    "boundaries": F("list", required=False, items=F("int", low=0)),
    "micro_batch_size": F("int", low=1, required=False),
    "tokens_per_s": F("num", low=0.0, required=False),
    "timing": F("dict", required=False),
})

#: ``tessera-lab run --profile-store STORE`` (appended to: ``schema_version`` required)
RUNNER_STORE = F("dict", fields={
    "schema_version": F("int", choices=(1,), allowed="1"),
    "kind": F("str", choices=("runner_observations",)),
    "runs": F("list", limit="steps", items=STORE_RUN),
})
#: the same store as ``report --lifecycle`` reads it (``schema_version`` checked when present)
RUNNER_STORE_READ = F("dict", fields={**RUNNER_STORE.fields,
                                      "schema_version": F("int", choices=(1,), allowed="1", required=False)})

_STAGE_S = F("list", low=1, limit="stages", items=seconds())

#: ``tessera-lab run --json RUN.json`` as read by ``report --observed`` (its first job is reported)
RUN_RESULT = F("dict", fields={
    "backend": F("str", required=False),
    "jobs": F("list", low=1, limit="steps", items=F("dict", fields={
        "name": F("str", required=False), "schedule": F("str"),
        "tokens_per_step": F("int", low=1, limit="runner_tokens"),
        "spec": F("dict", fields={"model": TINY_MODEL}),
        "ep_dispatch": F("dict", required=False, fields={
            "mode": F("str", choices=("uneven", "capacity")),
            "requested": F("str", choices=("auto", "uneven", "capacity"), required=False),
            "reason": F("str", required=False),
            "padding_factor": F("num", low=0.0, high=1e12, required=False),
            "rows_kept_observed": F("num", low=0.0, high=1e12, required=False),
            **{k: F("int", low=0, high=MAX_CONFIG_INT, required=False)
               for k in ("tokens_per_group", "capacity_per_expert", "capacity_per_destination", "rows_sent",
                         "rows_routed", "expert_rows")}}),
        "timing": F("dict", fields={"durations": F("dict", fields={
            "f": _STAGE_S, "b": _STAGE_S, "w": F("list", items=seconds(), null=True, required=False),
            "fb": F("list", items=seconds(), null=True, required=False)})}),
        "step_times_s": F("list", items=seconds(), limit="steps", required=False),
        "events": F("list", low=1, limit="runner_events", items=F("dict", fields={
            "step": F("int", low=0, limit="steps"), "rank": F("int", low=0, limit="world_size"),
            "lane": F("str"), "type": F("str", required=False),
            "start": F("num", low=-1e12, high=1e12), "end": F("num", low=-1e12, high=1e12)})),
    })),
})


def check_runner_plan(plan: Any, where: str, cfg: Any) -> dict:
    """``plan`` checked against :data:`RUNNER_PLAN` plus its cross-field rules (boundaries strictly increasing from
    0 to ``num_layers``, one prediction per stage) and :func:`check_runner_work`; ``cfg`` is a callable that turns
    the (type-checked) ``model_config`` into a :class:`~tessera_lab.runner.runtime.specs.TinyConfig`.

    Raises:
        ConfigError: naming the file, the field and what is allowed.
    """
    validate(plan, RUNNER_PLAN, where)
    model = cfg(plan["model_config"])
    par = plan["parallel"]
    b = plan["boundaries"]
    if b[0] != 0 or b[-1] != model.num_layers or any(b[i + 1] <= b[i] for i in range(len(b) - 1)):
        raise ConfigError(f"{where}: field 'boundaries' = {b} is not allowed; allowed: strictly increasing layer "
                          f"indices from 0 to model_config.num_layers = {model.num_layers}")
    for key in ("stage_f_s", "stage_b_s"):
        n = len(plan["prediction"][key])
        if n != len(b) - 1:
            raise ConfigError(f"{where}: field 'prediction.{key}' has {n} entries; allowed: one per stage "
                              f"({len(b) - 1}, from 'boundaries')")
    check_runner_work(model, par["pp"], par.get("vpp") or 1, par["microbatches"], par["micro_batch_size"], where=where)
    return plan


def check_runner_store(data: Any, where: str, *, append: bool = False) -> dict:
    """A runner observation store checked against :data:`RUNNER_STORE` (``append``: before a run appends to it)
    or :data:`RUNNER_STORE_READ` (before ``report --lifecycle`` reads it): every entry, so a damaged store is
    refused before any work."""
    return validate(data, RUNNER_STORE if append else RUNNER_STORE_READ, where)


def check_run_result(data: Any, where: str) -> dict:
    """A run result (``run --json``) checked against :data:`RUN_RESULT`, and every event ending no earlier than it
    starts (a negative duration is a damaged file, never a time to replay).

    Raises:
        ConfigError: naming the file, the field (``jobs[0].events[3]``), the values and what is allowed.
    """
    validate(data, RUN_RESULT, where)
    for j, job in enumerate(data["jobs"]):
        for n, e in enumerate(job["events"]):
            if e["end"] < e["start"]:
                raise ConfigError(f"{where}: field 'jobs[{j}].events[{n}]' has end = {e['end']:g} before start = "
                                  f"{e['start']:g}; allowed: end >= start (a duration >= 0 s)")
    return data


def runner_params(cfg: Any) -> int:
    """Parameters of the tiny model (an upper estimate: embeddings, attention projections, router, routed and
    shared experts of every layer; the same count for both mixers)."""
    h, layers = cfg.hidden_size, cfg.num_layers
    attn = h * cfg.num_heads * cfg.head_dim * 4
    experts = cfg.num_experts * 3 * h * cfg.expert_width + 3 * h * cfg.shared_expert_width + h * cfg.num_experts
    return 2 * cfg.vocab_size * h + layers * (attn + experts + 4 * h)


def check_runner_work(cfg: Any, pp: int, vpp: int, microbatches: int, micro_batch_size: int, *,
                      where: str = "run") -> None:
    """Refuse a runner job whose size would exhaust memory or time on this kind of machine (work limits
    ``runner_params``, ``runner_tokens`` and ``runner_actions`` of :mod:`tessera_lab.checks`).

    Raises:
        ConfigError: naming the size, the limit and the variable that raises it.
    """
    check_work("runner_params", runner_params(cfg), field="runner model parameters (estimated from model_config)",
               where=where)
    tokens = micro_batch_size * cfg.seq_len
    check_work("runner_tokens", tokens * max(cfg.hidden_size, cfg.top_k * cfg.expert_width,
                                             cfg.num_heads * cfg.head_dim),
               field=f"activation elements per layer and micro-batch ({micro_batch_size} x {cfg.seq_len} tokens "
                     f"x width)", where=where)
    check_work("runner_actions", pp * vpp * microbatches,
               field=f"stage-micro-batches per step pp x vpp x microbatches = {pp} x {vpp} x {microbatches}",
               where=where)


#: a validation result (``tessera-lab validate --json``) as ``validate --repredict`` reads it
VALIDATION_RESULT = F("dict", fields={
    "cases": F("list", low=1, limit="costs", items=F("dict", fields={
        "name": F("str"), "schedule": F("str", choices=_SCHEDULES),
        "pp": F("int", low=1, limit="pp"), "ep": F("int", low=1, limit="ep"),
        "width": F("int", low=1, high=1024), "boundaries": F("list", low=2, limit="layers",
                                                            items=F("int", low=0, limit="layers")),
        "observed_s": positive_seconds()})),
    "prediction_inputs": F("dict", null=True, required=False, fields={
        "cores_available": F("map", null=True, required=False, values=F("dict", fields={
            "cores_available": F("num", low=0.0, low_open=True, high=1 << 20),
            "work_probe_s": positive_seconds(null=True, required=False)})),
        "cpu_probe_s": F("map", null=True, required=False, values=positive_seconds()),
        "calibration_cpu_probe_s": positive_seconds(null=True, required=False)}),
    "calibration": F("dict", null=True, required=False, fields={
        "device_file": F("dict", null=True, required=False), "path": F("str", null=True, required=False)}),
    "machine": F("dict", required=False),
})


def check_validation_result(data: Any, where: str) -> dict:
    """A validation result checked against :data:`VALIDATION_RESULT`; an embedded calibration
    (``calibration.device_file``) against the device schema."""
    validate(data, VALIDATION_RESULT, where)
    dev = (data.get("calibration") or {}).get("device_file")
    if dev is not None:
        from tessera_lab.cost.device import DEVICE_FILE

        if dev.get("kind") != "calibrated_device":
            raise ConfigError(f"{where}: field 'calibration.device_file.kind' = {dev.get('kind')!r}; allowed: "
                              "'calibrated_device'")
        validate(dev, DEVICE_FILE, f"{where}, field 'calibration.device_file'")
    return data
