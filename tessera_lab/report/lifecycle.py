"""Profile lifecycle: compare predicted with observed times, re-plan only when the error persists and pays
back (docs/design-notes.md, "Reports").

The lifecycle works on plain data so that it serves simulated drifts, the runner's predicted-vs-observed
JSON and the profile store alike: each training step gives a mapping ``key -> seconds`` of predictions and
one of observations. Keys name what is compared, by convention ``stage:<s>`` (a stage's time per
micro-batch), ``collective:<name>`` (e.g. ``collective:all_to_all:ep``, exposed or total per step) and
``bubble`` (idle rank-time per step); any other key works too.

Per step and key the **relative error** is ``(observed - predicted) / predicted``. The step's error is the
largest absolute relative error over its keys; the **rolling error** is the mean step error over the last
``window`` steps. A key whose absolute error exceeds ``threshold`` in ``persistence`` consecutive steps
makes the error *persistent*; a single spike resets nothing and triggers nothing (its streak is 1).

When the error persists, the re-plan is weighed (:func:`payback`):

* cost = profiling time (``profiling_steps`` steps of the job's time, an assumption: re-measuring the
  overlap pairs on the device takes the machine about that long) + re-partition cost = state migration
  (bytes each GPU sends or receives over the link, ``bytes / bandwidth``) + communicator rebuild time
  (:data:`COMMUNICATOR_REBUILD_S`, an assumption);
* expected gain = seconds saved per step by the new plan x remaining steps;
* decision: ``replan`` if the expected gain exceeds the cost (payback steps = cost / gain per step fits in
  the remaining steps), else ``hold``: keep the partition and adopt the observed values as the new
  predictions (the runner's own timings cost nothing to collect).

The gain per step comes from a callable the caller supplies (for a plan, :func:`plan_hooks` re-partitions
with per-stage speed factors observed / predicted); without one the default is the perfect-balance upper
bound ``microbatches x (max_s t_s - mean_s t_s)`` over the ``stage:<s>`` keys, and the log says so.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from tessera_lab.cost.source import analytic_source
from tessera_lab.errors import ConfigError
from tessera_lab.model.hardware import cost_assumptions

#: Assumed time to tear down and rebuild the NCCL communicators (PP, EP, DP groups) after a re-partition,
#: seconds, and the device time re-profiling costs, in training steps: ``data/hardware/cost_model.json``
#: (``communicator_rebuild_s``, ``reprofiling_steps``; both labelled assumptions there). Override per policy.
COMMUNICATOR_REBUILD_S = cost_assumptions()["communicator_rebuild_s"]
REPROFILING_STEPS = cost_assumptions()["reprofiling_steps"]


def _default_bandwidth() -> float:
    """Per-GPU inter-node bandwidth per direction, bytes/s (``data/hardware/hardware.json`` node)."""
    from tessera_lab.model.hardware import hardware_data

    return float(hardware_data()["node"]["inter_node"]["gb_per_s_per_direction"]) * 1e9


@dataclass(frozen=True)
class LifecyclePolicy:
    """When to re-plan, and what it costs.

    Attributes:
        threshold: absolute relative error above which a key misses (0.10 = 10%).
        persistence: consecutive misses of one key that make the error persistent (k >= 1).
        window: steps in the rolling error.
        profiling_steps: re-profiling costs this many steps of job time (assumption; seconds = steps x the
            observed step time when the step time is known, else x ``step_time_s``).
        step_time_s: step time used for the profiling cost when the observations carry none, seconds.
        communicator_rebuild_s: communicator rebuild after a re-partition, seconds (assumption).
        migration_bytes_per_s: bandwidth for moving training state between GPUs, bytes/s per GPU per
            direction (default: the inter-node link of ``data/hardware/hardware.json``, 50e9).
        microbatches: micro-batches per step (used by the default gain estimate).
    """

    threshold: float = 0.10
    persistence: int = 3
    window: int = 8
    profiling_steps: float = REPROFILING_STEPS
    step_time_s: float | None = None
    communicator_rebuild_s: float = COMMUNICATOR_REBUILD_S
    migration_bytes_per_s: float | None = None
    microbatches: int = 32

    def __post_init__(self) -> None:
        if not self.threshold > 0:
            raise ConfigError(f"field 'threshold' = {self.threshold} is out of range; allowed: > 0")
        for name in ("persistence", "window", "microbatches"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"field '{name}' = {v!r} is out of range; allowed: an integer >= 1")
        for name in ("profiling_steps", "communicator_rebuild_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise ConfigError(f"field '{name}' = {v!r} is out of range; allowed: a finite number >= 0")
        if self.migration_bytes_per_s is not None and not self.migration_bytes_per_s > 0:
            raise ConfigError(f"field 'migration_bytes_per_s' = {self.migration_bytes_per_s} is out of range; allowed: > 0")

    @property
    def bandwidth(self) -> float:
        return self.migration_bytes_per_s if self.migration_bytes_per_s is not None else _default_bandwidth()


@dataclass(frozen=True)
class Payback:
    """Cost and expected gain of a re-plan, seconds.

    Attributes:
        profiling_s: re-profiling time.
        migration_s: ``migration_bytes / bandwidth``.
        rebuild_s: communicator rebuild.
        cost_s: the three together.
        gain_per_step_s: time saved per step by the new plan.
        remaining_steps: steps left in the job.
        expected_gain_s: ``gain_per_step_s x remaining_steps``.
        net_s: expected gain minus cost.
        payback_steps: ``cost_s / gain_per_step_s`` (inf without a gain).
        worthwhile: ``net_s > 0``.
    """

    profiling_s: float
    migration_s: float
    rebuild_s: float
    cost_s: float
    gain_per_step_s: float
    remaining_steps: int
    expected_gain_s: float
    net_s: float
    payback_steps: float
    worthwhile: bool


def payback(gain_per_step_s: float, remaining_steps: int, *, profiling_s: float, migration_bytes: float,
            bandwidth_bytes_per_s: float, rebuild_s: float = COMMUNICATOR_REBUILD_S) -> Payback:
    """Weigh a re-plan: cost = profiling + migration bytes / bandwidth + communicator rebuild; expected gain =
    gain per step x remaining steps (all seconds).

    Raises:
        ConfigError: negative inputs or a non-positive bandwidth.
    """
    for name, v in (("profiling_s", profiling_s), ("migration_bytes", migration_bytes), ("rebuild_s", rebuild_s),
                    ("remaining_steps", remaining_steps)):
        if not v >= 0:
            raise ConfigError(f"field '{name}' = {v} is out of range; allowed: >= 0")
    if not bandwidth_bytes_per_s > 0:
        raise ConfigError(f"field 'bandwidth_bytes_per_s' = {bandwidth_bytes_per_s} is out of range; allowed: > 0")
    migration_s = migration_bytes / bandwidth_bytes_per_s
    cost = profiling_s + migration_s + rebuild_s
    gain = max(0.0, float(gain_per_step_s))
    expected = gain * remaining_steps
    steps = cost / gain if gain > 0 else math.inf
    return Payback(profiling_s, migration_s, rebuild_s, cost, gain, int(remaining_steps), expected,
                   expected - cost, steps, expected > cost)


@dataclass
class Decision:
    """One entry of the decision log (one per observed step)."""

    step: int
    action: str  # "ok", "watch", "replan", "hold"
    step_error: float
    rolling_error: float
    worst_key: str | None
    streaks: dict[str, int]
    reason: str
    payback: Payback | None = None

    def as_dict(self) -> dict[str, Any]:
        d = {"step": self.step, "action": self.action, "step_error": self.step_error,
             "rolling_error": self.rolling_error, "worst_key": self.worst_key,
             "max_streak": max(self.streaks.values(), default=0), "reason": self.reason}
        if self.payback is not None:
            pb = self.payback
            d.update({"gain_per_step_s": pb.gain_per_step_s, "remaining_steps": pb.remaining_steps,
                      "expected_gain_s": pb.expected_gain_s, "profiling_s": pb.profiling_s,
                      "migration_s": pb.migration_s, "rebuild_s": pb.rebuild_s, "cost_s": pb.cost_s,
                      "net_s": pb.net_s, "payback_steps": pb.payback_steps})
        return d


GainFn = Callable[[Mapping[str, float], Mapping[str, float]], float]
MigrationFn = Callable[[Mapping[str, float], Mapping[str, float]], float]
ReplanFn = Callable[[Mapping[str, float], Mapping[str, float]], Mapping[str, float]]


class ProfileLifecycle:
    """Track predicted vs observed per step and decide when to re-plan (module docstring).

    Args:
        predicted: initial predictions ``key -> seconds`` (each > 0).
        total_steps: steps of the whole job (for the remaining steps in the payback).
        policy: thresholds and costs.
        gain_fn: ``gain_fn(observed_means, predicted) -> seconds saved per step`` by a re-plan on the
            observed profile (default: the perfect-balance bound over ``stage:<s>`` keys).
        migration_fn: ``migration_fn(observed_means, predicted) -> bytes`` one GPU sends or receives at most
            during the re-partition (default 0 bytes, stated in the log).
        replan_fn: ``replan_fn(observed_means, predicted) -> new predictions`` after a re-plan (default: the
            observed means).
        costs: where the predictions came from (a :class:`~tessera_lab.cost.source.CostSource`, e.g. ``plan.costs``);
            kept in :meth:`as_dict` (default analytic).

    Raises:
        ConfigError: empty or non-positive predictions, ``total_steps`` < 1.
    """

    def __init__(self, predicted: Mapping[str, float], total_steps: int, policy: LifecyclePolicy | None = None, *,
                 gain_fn: GainFn | None = None, migration_fn: MigrationFn | None = None,
                 replan_fn: ReplanFn | None = None, costs: Any = None):
        self.costs = costs or analytic_source()
        self.policy = policy or LifecyclePolicy()
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ConfigError(f"field 'total_steps' = {total_steps!r} is out of range; allowed: an integer >= 1")
        self.total_steps = total_steps
        self.predicted = self._check(predicted, "predicted")
        self.gain_fn, self.migration_fn, self.replan_fn = gain_fn, migration_fn, replan_fn
        self.log: list[Decision] = []
        self.history: list[dict[str, Any]] = []
        self.streaks: dict[str, int] = {}
        self._errors: deque[float] = deque(maxlen=self.policy.window)
        self._recent: dict[str, deque[float]] = {}
        self.charged_s = 0.0
        self.replans = 0

    @staticmethod
    def _check(values: Mapping[str, float], name: str) -> dict[str, float]:
        if not isinstance(values, Mapping) or not values:
            raise ConfigError(f"field '{name}' must be a non-empty mapping key -> seconds")
        out = {}
        for k, v in values.items():
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"field '{name}[{k}]' = {v!r} is not a number; allowed: seconds") from None
            if not math.isfinite(f) or (name == "predicted" and f <= 0) or f < 0:
                raise ConfigError(f"field '{name}[{k}]' = {v!r} is out of range; allowed: finite seconds "
                                  + ("> 0" if name == "predicted" else ">= 0"))
            out[str(k)] = f
        return out

    # ------------------------------------------------------------------ per step
    def observe(self, step: int, observed: Mapping[str, float], predicted: Mapping[str, float] | None = None,
                *, step_time_s: float | None = None) -> Decision:
        """Record one step and return its decision.

        Args:
            step: step number (increasing).
            observed: ``key -> seconds`` observed this step (keys without a prediction are ignored).
            predicted: predictions for this step (default: the current stored predictions).
            step_time_s: this step's wall time (for the profiling cost), seconds.
        """
        obs = self._check(observed, "observed")
        if predicted is not None:
            self.predicted.update(self._check(predicted, "predicted"))
        pred, pol = self.predicted, self.policy
        errors = self._record(step, obs)
        worst = max(errors, key=lambda k: abs(errors[k]))
        step_err = abs(errors[worst])
        self._errors.append(step_err)
        rolling = sum(self._errors) / len(self._errors)
        persistent = [k for k, n in self.streaks.items() if n >= pol.persistence]
        if not persistent:
            if step_err > pol.threshold:
                action = "watch"
                reason = (f"{worst} off by {errors[worst]:+.1%} (streak {self.streaks[worst]} of {pol.persistence}); "
                          "not persistent yet")
            else:
                action, reason = "ok", f"all keys within {pol.threshold:.0%}"
            d = Decision(step, action, step_err, rolling, worst, dict(self.streaks), reason)
            self.log.append(d)
            return d
        # persistent: weigh a re-plan on the observed means of the streak
        means = {k: sum(v) / len(v) for k, v in self._recent.items() if k in pred}
        remaining = max(0, self.total_steps - step - 1)
        st = step_time_s if step_time_s is not None else (pol.step_time_s if pol.step_time_s is not None else None)
        if st is None:
            raise ConfigError("the profiling cost needs a step time: pass step_time_s to observe() or set "
                              "LifecyclePolicy.step_time_s")
        if self.gain_fn is not None:
            gain = float(self.gain_fn(means, pred))
            gain_note = "gain from the re-plan model"
        else:
            gain = balance_bound_gain(means, pol.microbatches)
            gain_note = "gain = perfect-balance upper bound over stage keys"
        mig = float(self.migration_fn(means, pred)) if self.migration_fn is not None else 0.0
        pb = payback(gain, remaining, profiling_s=pol.profiling_steps * st, migration_bytes=mig,
                     bandwidth_bytes_per_s=pol.bandwidth, rebuild_s=pol.communicator_rebuild_s)
        keys = ", ".join(f"{k} {errors.get(k, 0.0):+.1%}" for k in persistent)
        if pb.worthwhile:
            action = "replan"
            new = self.replan_fn(means, pred) if self.replan_fn is not None else means
            self.predicted.update(self._check(new, "predicted"))
            self.charged_s += pb.cost_s
            self.replans += 1
            reason = (f"persistent error ({keys}) for {pol.persistence} steps; {gain_note}: "
                      f"{pb.gain_per_step_s * 1e3:.1f} ms/step x {remaining} steps = {pb.expected_gain_s:.1f} s > cost "
                      f"{pb.cost_s:.1f} s (profiling {pb.profiling_s:.1f} + migration {pb.migration_s:.2f} + rebuild "
                      f"{pb.rebuild_s:.1f}); pays back in {pb.payback_steps:.0f} steps")
        else:
            action = "hold"
            self.predicted.update(means)
            reason = (f"persistent error ({keys}) but no payback: {gain_note} {pb.gain_per_step_s * 1e3:.1f} ms/step x "
                      f"{remaining} steps = {pb.expected_gain_s:.1f} s <= cost {pb.cost_s:.1f} s; partition kept, "
                      "predictions updated from observations")
        if self.migration_fn is None:
            reason += "; migration bytes not given (0)"
        self.streaks = {k: 0 for k in self.streaks}
        self._recent.clear()
        d = Decision(step, action, step_err, rolling, worst, dict(self.streaks), reason, pb)
        self.log.append(d)
        return d

    def _record(self, step: int, obs: Mapping[str, float]) -> dict[str, float]:
        """Record the step's observations of predicted keys (history, recent values, error streaks) and return
        their relative errors ``(observed - predicted) / predicted``.

        Raises:
            ConfigError: no observed key has a prediction.
        """
        pred = self.predicted
        errors = {}
        for k, o in obs.items():
            if k in pred:
                e = (o - pred[k]) / pred[k]
                errors[k] = e
                self.history.append({"step": step, "key": k, "predicted": pred[k], "observed": o, "error": e})
                self._recent.setdefault(k, deque(maxlen=self.policy.persistence)).append(o)
        if not errors:
            raise ConfigError(f"step {step}: no observed key has a prediction; predicted keys: {sorted(pred)}")
        for k, e in errors.items():
            self.streaks[k] = self.streaks.get(k, 0) + 1 if abs(e) > self.policy.threshold else 0
        return errors

    # ------------------------------------------------------------------ views
    def decisions(self):
        """The decision log as a pandas DataFrame (one row per step)."""
        import pandas as pd

        return pd.DataFrame([d.as_dict() for d in self.log])

    def history_table(self):
        """Predicted vs observed per step and key, with the relative error, as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.history)

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy.__dict__, "total_steps": self.total_steps, "replans": self.replans,
                "charged_s": self.charged_s, "decisions": [d.as_dict() for d in self.log],
                "history": self.history, "predicted": self.predicted, "costs": self.costs.as_dict()}


def balance_bound_gain(means: Mapping[str, float], microbatches: int) -> float:
    """Upper bound of the time a re-partition saves per step, seconds: the steady state runs at the slowest
    stage's time per micro-batch; perfect balance would run at the mean, so the bound is
    ``microbatches x (max_s t_s - mean_s t_s)`` over the ``stage:<s>`` keys (0 without stage keys)."""
    stages = [v for k, v in means.items() if k.startswith("stage:")]
    if len(stages) < 2:
        return 0.0
    return microbatches * (max(stages) - sum(stages) / len(stages))


def load_records(source: str | Path | Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Predicted-vs-observed step records: a JSON file or object ``{"steps": [...]}`` or a list of
    ``{"step": int, "predicted": {key: s}, "observed": {key: s}, "step_time_s": s (optional)}``.

    Raises:
        ConfigError: unreadable JSON or records without ``observed``.
    """
    data: Any = source
    if isinstance(source, (str, Path)):
        from tessera_lab.io import read_json

        data = read_json(source, "records file")
    if isinstance(data, Mapping):
        data = data.get("steps")
    if not isinstance(data, list) or not data:
        raise ConfigError("field 'records' must be a non-empty list of steps (or {'steps': [...]})")
    out = []
    for n, r in enumerate(data):
        if not isinstance(r, Mapping) or "observed" not in r:
            raise ConfigError(f"record {n} needs 'observed' (and 'predicted' or earlier predictions)")
        out.append({"step": int(r.get("step", n)), "observed": r["observed"], "predicted": r.get("predicted"),
                    "step_time_s": r.get("step_time_s")})
    return out


def run_lifecycle(records: Iterable[Mapping[str, Any]], total_steps: int, policy: LifecyclePolicy | None = None,
                  **hooks: Any) -> ProfileLifecycle:
    """Feed step records (:func:`load_records` format) through a :class:`ProfileLifecycle`; the first
    record's ``predicted`` are the initial predictions."""
    records = list(records)
    first = records[0].get("predicted")
    if not first:
        raise ConfigError("the first record needs 'predicted'")
    lc = ProfileLifecycle(first, total_steps, policy, **hooks)
    for r in records:
        lc.observe(r["step"], r["observed"], r.get("predicted") if r is not records[0] else None,
                   step_time_s=r.get("step_time_s"))
    return lc


# ---------------------------------------------------------------------- a plan's hooks and a synthetic drift
def plan_predictions(plan: Any, *, collectives: bool = True) -> dict[str, float]:
    """Predictions of a :class:`~tessera_lab.plan.make.Plan`'s chosen evaluation: ``stage:<s>`` time per
    micro-batch, ``bubble`` (idle rank-seconds per step, summed over pipeline ranks), ``iteration``
    (seconds) and, with ``collectives``, ``collective:<name>`` = exposed seconds per GPU per step of each
    collective the capacity report finds (``collective:ep_all_to_all``, ``collective:pp_p2p``, ...)."""
    ev = plan.chosen
    out = {f"stage:{st.index}": st.time_s for st in ev.stages}
    out["bubble"] = sum(ev.timeline.per_rank_idle)
    out["iteration"] = ev.iteration_time_s
    if collectives:
        from tessera_lab.report.capacity import capacity_report

        rep = capacity_report(plan)
        for k, v in rep.exposed_comm_gpu_s.items():
            if v > 0:
                out["collective:" + k[len("exposed_"):]] = v / rep.gpus
    return out


def plan_hooks(plan: Any) -> dict[str, Any]:
    """``gain_fn``, ``migration_fn`` and ``costs`` (the plan's cost source) for a plan: the observed/predicted ratio of each ``stage:<s>`` key is
    taken as that stage's speed factor; the gain is the predicted iteration time of the current partition
    under those factors minus that of the partition re-solved with them
    (:func:`tessera_lab.report.topology.partition_with_factors`); migration bytes are the training state (weights,
    gradients, optimizer) of the layers that change stage, the most any one GPU sends or receives."""
    from tessera_lab.report.topology import factor_plan

    cache: dict[tuple, Any] = {}

    def factors(means, pred):
        return tuple(means.get(f"stage:{s}", pred[f"stage:{s}"]) / pred[f"stage:{s}"] for s in range(plan.parallel.pp))

    def result(means, pred):
        key = factors(means, pred)
        if key not in cache:
            cache[key] = factor_plan(plan, list(key))
        return cache[key]

    def gain_fn(means, pred):
        r = result(means, pred)
        return max(0.0, r.iteration_unaware_s - r.iteration_aware_s)

    def migration_fn(means, pred):
        return result(means, pred).migration_bytes

    return {"gain_fn": gain_fn, "migration_fn": migration_fn, "costs": plan.costs}


def synthetic_drift(predicted: Mapping[str, float], steps: int, *, drift_key: str, drift_factor: float,
                    start: int, spike_step: int | None = None, spike_key: str | None = None,
                    spike_factor: float = 2.0, noise: float = 0.02, seed: int = 0) -> list[dict[str, Any]]:
    """Step records for teaching and tests: observations = predictions x (1 + uniform noise in +-``noise``);
    from step ``start`` on, ``drift_key`` runs ``drift_factor`` times slower (persistent drift); at
    ``spike_step`` one key spikes by ``spike_factor`` for one step. ``step_time_s`` is the ``iteration`` key if
    present, else the sum of the stage keys."""
    import random

    rng = random.Random(seed)
    out = []
    for step in range(steps):
        obs = {}
        for k, v in predicted.items():
            f = 1.0 + rng.uniform(-noise, noise)
            if k == drift_key and step >= start:
                f *= drift_factor
            if spike_step is not None and step == spike_step and k == (spike_key or drift_key):
                f *= spike_factor
            obs[k] = v * f
        st = obs.get("iteration", sum(v for k, v in obs.items() if k.startswith("stage:")))
        out.append({"step": step, "observed": obs, "predicted": dict(predicted) if step == 0 else None,
                    "step_time_s": st})
    return out


# ---------------------------------------------------------------------- the runner's observation store
VERDICTS = {
    "replan": "re-plan: the error persists and re-partitioning pays back within the remaining steps",
    "hold": "re-measure: the error persists but a re-partition does not pay back; partition kept, the stored "
            "observations replace the predictions",
    None: "hold: no persistent error (misses, if any, were transient)",
}


def store_records(store: str | Path | Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Step records (:func:`load_records` format) from the runner's observation store (``tessera-lab run --plan
    PLAN.json --profile-store STORE``), in the order the runs were appended, steps renumbered 0, 1, ...

    Only runs whose predictions were made by a plan before the run (``"predictions": "plan (before the
    run)"``) count; in-sample runs are skipped and counted. A run's predictions are passed on only when they
    differ from the previous run's (a new plan), so observations adopted by a ``hold`` stay in force.

    Returns ``(records, info)`` with ``info = {"runs", "skipped_in_sample", "microbatches", "keys"}``.

    Raises:
        ConfigError: unreadable store, not a runner store, or no run executed from a plan.
    """
    data: Any = store
    if isinstance(store, (str, Path)):
        from tessera_lab.io import read_json

        data = read_json(store, "runner observation store")
    if not isinstance(data, Mapping) or data.get("kind") != "runner_observations" or not isinstance(data.get("runs"), list):
        raise ConfigError("field 'kind' must be 'runner_observations' with a list 'runs' (a store written by "
                          "tessera-lab run --profile-store)")
    records: list[dict[str, Any]] = []
    skipped, used, mbs, keys = 0, 0, None, set()
    last_pred = None
    for run in data["runs"]:
        if run.get("predictions") != "plan (before the run)":
            skipped += 1
            continue
        used += 1
        mbs = run.get("microbatches", mbs)
        for rec in (run.get("lifecycle") or {}).get("steps", []):
            pred = {k: float(v) for k, v in (rec.get("predicted") or {}).items()}
            keys |= set(pred)
            records.append({"step": len(records), "observed": rec["observed"],
                            "predicted": pred if pred != last_pred else None, "step_time_s": rec.get("step_time_s"),
                            "run": run.get("date")})
            last_pred = pred
    if not records:
        raise ConfigError(f"the store has no run executed from a plan ({skipped} in-sample run(s) skipped); "
                          "allowed: runs of tessera-lab run --plan PLAN.json --profile-store STORE")
    return records, {"runs": used, "skipped_in_sample": skipped, "microbatches": mbs, "keys": sorted(keys)}


def store_lifecycle(store: str | Path | Mapping[str, Any], remaining_steps: int,
                    policy: LifecyclePolicy | None = None) -> dict[str, Any]:
    """Run the lifecycle over a runner observation store (:func:`store_records`) as if the job had
    ``remaining_steps`` steps left after the stored ones; default policy with the runs' micro-batches.

    Returns ``{"verdict", "why", "action", "decisions" (the persistent-error decisions: replan / hold),
    "mean_abs_error" (per key, over the stored steps), "steps", "info", "lifecycle"}``.

    Raises:
        ConfigError: as :func:`store_records`; ``remaining_steps`` < 0.
    """
    if isinstance(remaining_steps, bool) or not isinstance(remaining_steps, int) or remaining_steps < 0:
        raise ConfigError(f"field 'remaining_steps' = {remaining_steps!r} is out of range; allowed: an integer >= 0")
    records, info = store_records(store)
    if policy is None:
        policy = LifecyclePolicy(microbatches=int(info["microbatches"] or 32))
    lc = run_lifecycle(records, len(records) + remaining_steps, policy)
    triggered = [d for d in lc.log if d.action in ("replan", "hold")]
    last = triggered[-1] if triggered else None
    errs: dict[str, list[float]] = {}
    for h in lc.history:
        errs.setdefault(h["key"], []).append(abs(h["error"]))
    return {"verdict": VERDICTS[last.action if last else None].split(":")[0],
            "why": last.reason if last else VERDICTS[None],
            "action": last.action if last else "hold", "decisions": [d.as_dict() for d in triggered],
            "mean_abs_error": {k: sum(v) / len(v) for k, v in sorted(errs.items())}, "steps": len(records),
            "info": info, "lifecycle": lc.as_dict()}


def format_store_lifecycle(res: Mapping[str, Any]) -> str:
    """Readable summary of :func:`store_lifecycle`."""
    info = res["info"]
    lines = [f"lifecycle over {res['steps']} stored steps from {info['runs']} run(s) executed from a plan "
             f"({info['skipped_in_sample']} in-sample run(s) skipped); predictions: plan (before each run), "
             "observations: the runner's own events (observed)",
             "mean |error| per key: " + ", ".join(f"{k} {v:.1%}" for k, v in res["mean_abs_error"].items())]
    for d in res["decisions"]:
        lines.append(f"step {d['step']}: {d['action']}: {d['reason']}")
    lines.append(f"decision: {res['verdict']} ({res['why']})")
    lines.append(f"signs: error = observed / predicted - 1 here (negative: faster than predicted; run and validate "
                 f"print (predicted - observed) / observed); a re-plan's gain is the perfect-balance upper bound "
                 f"over the stage keys; the communicator rebuild ({COMMUNICATOR_REBUILD_S:.0f} s) is an assumption "
                 f"(data/hardware/cost_model.json), not measured")
    return "\n".join(lines)
