"""Checks of numbers where they enter tessera-lab (flags, config fields, profile entries, plan fields), and the
work limits of this kind of machine.

Every check raises one line naming the field, the file when there is one, the value and the allowed range, e.g.
``config file 'm.json': field 'hidden_size' = 1e+300 is out of range; allowed: an integer 1 to 1048576``.

Work limits (:data:`WORK_LIMITS`) bound the sizes whose work grows with them (layers, stages, micro-batches, world
size, list lengths): an input over a limit is refused up front, with the limit and the environment variable that
raises it (``TESSERA_LAB_MAX_<NAME>``), instead of hanging or exhausting memory.

Standard library only (no numpy, no torch).
"""

from __future__ import annotations

import difflib
import math
import os
from typing import Any, Iterable

from tessera_lab.errors import ConfigError

__all__ = ["did_you_mean", "WORK_LIMITS", "work_limit", "check_environment", "check_work", "check_int", "check_float", "check_time", "allowed_range",
           "MAX_TIME_S", "MAX_CONFIG_INT", "profile_mismatches"]

#: name -> (default limit, what it counts). ``TESSERA_LAB_MAX_<NAME>`` (upper case) overrides the default.
WORK_LIMITS: dict[str, tuple[int, str]] = {
    "layers": (2048, "decoder layers"),
    "stages": (1024, "pipeline stages"),
    "pp": (1024, "pipeline stages"),
    "vpp": (64, "virtual stages per rank"),
    "virtual_stages": (4096, "stages x vpp"),
    "partition_segments": (262_144, "layer segments a partition weighs: stages x vpp x (layers - stages x vpp + 1)"),
    "microbatches": (100_000, "micro-batches"),
    "actions": (500_000, "stages x vpp x micro-batches to simulate"),
    "search_actions": (4096, "stages x vpp x micro-batches searched by zb-auto (about 10 s at the limit)"),
    "world_size": (1_048_576, "GPUs (pp x dp x ep x tp)"),
    "dp": (1_048_576, "data-parallel replicas"),
    "ep": (4096, "expert-parallel ranks"),
    "tp": (1024, "tensor-parallel ranks"),
    "nodes": (131_072, "nodes"),
    "costs": (4096, "per-layer costs"),
    "experts": (65_536, "routed experts"),
    "num_experts": (65_536, "routed experts"),
    "top_k": (65_536, "experts per token"),
    "tokens": (1 << 24, "tokens per EP rank and micro-batch"),
    "layers_per_stage": (4096, "layers per stage"),
    "groups": (65_536, "EP groups"),
    "seq_len": (1 << 24, "tokens per sequence"),
    "micro_batch_size": (1 << 20, "sequences per micro-batch"),
    "repeats": (100_000, "repetitions"),
    "warmup": (100_000, "repetitions"),
    "steps": (1_000_000, "training steps"),
    "online_actions": (400_000, "steps x groups x (stages x vpp x micro-batches + 4) simulated online by simulate "
                                "--dynamic (at the limit about 100 s per run on one idle core; a skewed routing adds a "
                                "uniform control run)"),
    "expert_width": (1 << 22, "expert intermediate size"),
    "routing_cells": (50_000_000, "token counts held from a routing log (8 bytes each)"),
    "attention_ratio": (4096, "linear-attention layers per full-attention layer"),
    "runner_params": (50_000_000, "parameters of the CPU runner's model"),
    "runner_tokens": (50_000_000, "activation elements per layer and micro-batch of the runner"),
    "runner_actions": (20_000, "stage-micro-batches per step of the runner"),
    "runner_events": (5_000_000, "events in a run result"),
    "max_plans": (2000, "full planner runs of one search (search --max-plans; about 0.1 CPU s each)"),
    "jobs": (64, "planner processes of one search (search --jobs)"),
    "gpus": (65_536, "GPUs laid out by one search (search --gpus; the layouts enumerated grow with it)"),
}

#: the largest time accepted in seconds (about 31.7 years): larger values overflow sums and mean a typo
MAX_TIME_S = 1e9
#: the largest size accepted in a model config (hidden size, vocabulary, widths, heads)
MAX_CONFIG_INT = 1 << 24


def check_environment() -> None:
    """Parse every ``TESSERA_LAB_MAX_*`` variable that is set (the work limits and ``TESSERA_LAB_MAX_JSON_BYTES``)
    before any work: a malformed value, or a ``TESSERA_LAB_MAX_`` name that is no limit (a typo), is one line.

    Raises:
        ConfigError: naming the variable, its value and what is allowed.
    """
    known = {env_name(n) for n in WORK_LIMITS} | {"TESSERA_LAB_MAX_JSON_BYTES"}
    for var in sorted(os.environ):
        if not var.startswith("TESSERA_LAB_MAX_"):
            continue
        if var not in known:
            raise ConfigError(f"environment variable {var} is not a work limit; allowed: TESSERA_LAB_MAX_<NAME> with "
                              f"NAME one of {', '.join(sorted(n.upper() for n in WORK_LIMITS))}, JSON_BYTES")
        if var == "TESSERA_LAB_MAX_JSON_BYTES":
            from tessera_lab.io import _max_json_bytes

            _max_json_bytes()
        else:
            work_limit(var[len("TESSERA_LAB_MAX_"):].lower())


def env_name(name: str) -> str:
    """The environment variable that raises the work limit ``name``."""
    return "TESSERA_LAB_MAX_" + name.upper()


def work_limit(name: str) -> int | None:
    """The work limit of ``name`` (``$TESSERA_LAB_MAX_<NAME>`` when set), or None when ``name`` has no limit.

    Raises:
        ConfigError: the environment variable is set to something other than an integer >= 1.
    """
    if name not in WORK_LIMITS:
        return None
    env = os.environ.get(env_name(name), "").strip()
    if env:
        try:
            v = int(env)
        except ValueError:
            v = 0
        if v < 1:
            raise ConfigError(f"environment variable {env_name(name)} = {env!r} is not a limit; allowed: an integer "
                              ">= 1")
        return v
    return WORK_LIMITS[name][0]


def _where(where: str) -> str:
    return f"{where}: " if where else ""


def allowed_range(low: float | None, high: float | None, integer: bool, *, low_open: bool = False) -> str:
    """Text of an allowed range: ``an integer 1 to 64``, ``a finite number >= 0``, ``a number > 0``."""
    kind = "an integer" if integer else "a finite number"
    if low is not None and high is not None and not low_open:
        return f"{kind} {low:g} to {high:g}" if not integer else f"{kind} {int(low)} to {int(high)}"
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low:g}" if not integer else f">= {int(low)}")
    if high is not None:
        parts.append(f"<= {high:g}" if not integer else f"<= {int(high)}")
    return f"{kind} {' and '.join(parts)}".rstrip()


def divisors_text(n: int, *, limit: int = 24) -> str:
    """``"a divisor of 512: 1, 2, 4, ..., 512"`` (all divisors when at most ``limit`` of them, else the first and
    last few): the allowed values of a size that must divide ``n``."""
    ds = [d for d in range(1, int(n) + 1) if n % d == 0] if n >= 1 else []
    shown = ", ".join(map(str, ds)) if len(ds) <= limit else \
        ", ".join(map(str, ds[:limit // 2])) + ", ..., " + ", ".join(map(str, ds[-3:]))
    return f"a divisor of {n}: {shown}"


def check_work(name: str, value: int, *, field: str | None = None, where: str = "",
               error: type[Exception] = ConfigError) -> int:
    """Refuse ``value`` over the work limit ``name`` (see :data:`WORK_LIMITS`); returns ``value``.

    Raises:
        ``error``: ``"field = value is over the work limit L of this machine (what); raise it with ENV=N"``.
    """
    limit = work_limit(name)
    if limit is not None and value > limit:
        label = field or name
        raise error(f"{_where(where)}{label} = {value} is over the work limit for {WORK_LIMITS[name][1]} on this kind "
                    f"of machine; allowed: at most {limit} (raise it with {env_name(name)}=N)")
    return value


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_int(value: Any, field: str, *, low: int | None = 1, high: int | None = None, where: str = "",
              limit: str | None = None, error: type[Exception] = ConfigError, allowed: str | None = None,
              noun: str = "field") -> int:
    """``value`` as an int if it is an integer (an integral float such as ``1024.0`` counts) in ``[low, high]``.

    Args:
        field: the name shown (``'hidden_size'``, ``--pp``).
        where: the file, shown first (``"config file 'm.json'"``).
        limit: a :data:`WORK_LIMITS` name also applied as an upper bound (with its own message).
        allowed: text of the allowed range (default from ``low`` and ``high``).
        noun: the word before the field name (``"config field"``, ``"option"``).

    Raises:
        ``error``: not a number, not an integer (NaN, inf, 2.5, "abc", true), or out of range.
    """
    text = allowed or allowed_range(low, high, True)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is not an integer; allowed: {text}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is not an integer; allowed: {text}")
        if abs(value) > 2**62:
            raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is out of range; allowed: {text}")
        value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is out of range; allowed: {text}")
    if limit is not None:
        check_work(limit, value, field=f"{noun} '{field}'", where=where, error=error)
    return value


def check_float(value: Any, field: str, *, low: float | None = 0.0, high: float | None = None,
                low_open: bool = False, where: str = "", error: type[Exception] = ConfigError,
                allowed: str | None = None, noun: str = "field") -> float:
    """``value`` as a float if it is a finite number in the range (``low_open``: strictly above ``low``).

    Raises:
        ``error``: not a number ("fast", None, true), NaN or infinite, or out of range.
    """
    text = allowed or allowed_range(low, high, False, low_open=low_open)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is not a number; allowed: {text}")
    try:
        v = float(value)
    except OverflowError:
        raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is out of range; allowed: {text}") from None
    if not math.isfinite(v):
        raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is not a finite number; allowed: {text}")
    if (low is not None and (v <= low if low_open else v < low)) or (high is not None and v > high):
        raise error(f"{_where(where)}{noun} '{field}' = {_shown(value)} is out of range; allowed: {text}")
    return v


def check_time(value: Any, field: str, *, where: str = "", positive: bool = False,
               error: type[Exception] = ConfigError, noun: str = "field") -> float:
    """A time in seconds: finite, ``>= 0`` (``> 0`` when ``positive``) and at most :data:`MAX_TIME_S`."""
    return check_float(value, field, low=0.0, high=MAX_TIME_S, low_open=positive, where=where, error=error, noun=noun,
                       allowed=f"seconds {'>' if positive else '>='} 0 and <= {MAX_TIME_S:g}")


def profile_mismatches(profile: Any, model_name: str, gpu: str | None = None) -> list[str]:
    """Why a measured profile does not fit a plan (empty when it does): a different model, an analytic or CUDA
    profile of another GPU, or a stale environment (``profile.stale_reasons``: device or versions changed).

    ``profile`` is a :class:`tessera_lab.overlap.profiles.Profile` (read through ``model``, ``backend``,
    ``environment`` and ``stale_reasons``). A profile measured with the ``cpu`` (or ``runner``) backend describes
    that CPU, not a GPU: for a plan on ``gpu`` it is a mismatch too, so using it takes an explicit
    ``--allow-stale-profile`` (its overlap efficiencies are then transferred onto the GPU plan, with a warning).
    """
    reasons: list[str] = []
    if getattr(profile, "model", None) != model_name:
        reasons.append(f"measured for model {getattr(profile, 'model', None)!r}, not {model_name!r}")
    device = str((getattr(profile, "environment", None) or {}).get("device", ""))
    backend = getattr(profile, "backend", None)
    if gpu and backend in ("analytic", "cuda") and device and gpu.lower() not in device.lower():
        reasons.append(f"measured on {device!r}, not on a {gpu}")
    elif gpu and backend not in ("analytic", "cuda"):
        reasons.append(f"measured with the {backend} backend on {device or 'a CPU'!r}, not on a {gpu}")
    stale = list(getattr(profile, "stale_reasons", None) or [])
    if stale:
        reasons.append(f"stale: {stale[0]}" + (f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""))
    return reasons


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``" (did you mean 'num_hidden_layers'?)"`` for a mistyped ``name``: the closest of ``known`` by
    the names ``name`` begins (a family named without its size: ``gpt-oss`` -> ``gpt-oss-120b`` or ``gpt-oss-20b``;
    at most four), else the closest by :func:`difflib.get_close_matches` (similarity ratio at least 0.75), or
    ``""``."""
    known = [str(k) for k in known]
    close = [k for k in known if k.startswith(str(name)) and k != str(name)] if len(str(name)) >= 3 else []
    if not close or len(close) > 4:
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.75)
    if not close:
        return ""
    return " (did you mean " + " or ".join(f"'{c}'" for c in close) + "?)"
