"""Routing variance and the bubble left after dynamic correction, taken from a dynamic simulation or run.

A plan's capacity report simulates the plan under uniform routing, so its ``routing_variance`` row is 0 by
construction. The two numbers the dynamic bubble optimizer is about come from elsewhere:

- ``tessera-lab simulate ... --routing SPEC --dynamic --json F`` (provenance ``simulated``): the online controller's
  static and dynamic iterations under the routing, and the same controller under uniform routing;
- ``tessera-lab run ... --dynamic --json F`` (provenance ``observed``): interleaved static and dynamic trials of the
  runner; routing variance needs a second such run under uniform routing as its control, given as another file:
  the same job in everything but routing (sizes, schedule, pair handler, micro-batches, steps, trials, model),
  else it is refused naming the field.

Definitions (per iteration; seconds of the source's own clock, i.e. of ``--f/--b/--w`` for a synthetic simulation):

``routing_variance_s``
    static iteration under the routing minus the static iteration under uniform routing (simulation: means over
    the steps after warm-up; run: medians of the step times, the control's static side). Share: over the
    uniform static iteration.
``bubble_after_dynamic_s``
    idle time per rank left after dynamic correction (simulation: mean idle per rank of the dynamic timelines;
    run: median host receive-wait per step summed over ranks, divided by the ranks). Share: over the dynamic
    iteration.
``idle_removed_s``
    idle per rank, static minus dynamic (same sources).

Absent numbers are ``None`` and print as ``not measured``, never as 0. :meth:`RoutingTerms.scaled` applies the
shares to another iteration time (a plan's) and says that it is an estimate scaled from the source; a synthetic
simulation (``--f/--b/--w`` in arbitrary units, a toy routed model) is never scaled onto a plan's seconds: it is
shown as shares of its own iteration only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from tessera_lab.errors import ConfigError
from tessera_lab.samples import apart

__all__ = ["RoutingTerms", "routing_terms", "load_routing_terms", "check_same_job", "NOT_MEASURED"]

NOT_MEASURED = "not measured"
_UNIFORM_RUN = ("uniform", "model router (no skew)")


@dataclass
class RoutingTerms:
    """Routing variance and bubble after dynamic correction with their provenance (module docstring).

    Attributes:
        provenance: ``simulated``, ``observed`` or ``None`` (no source: nothing measured).
        source: one line naming what produced the numbers (schedule, sizes, routing, predictor, control).
        routing: the routing spec of the source.
        iteration_uniform_s, iteration_static_s, iteration_dynamic_s: static under uniform routing, static and
            dynamic under the routing; seconds per iteration or ``None``.
        routing_variance_s, bubble_after_dynamic_s, idle_removed_s: seconds (per iteration; per rank for the
            last two) or ``None``.
        units: what the seconds are (``s``, or ``units of --f/--b/--w`` for a synthetic simulation).
        notes: caveats (significance of an observed difference, missing rank counts).
        routing_variance_significant: for observed runs, whether the interquartile ranges of the static step
            times under the routing and under the control are apart (``None``: simulated or not measured).
        idle_removed_significant: for observed runs, whether the interquartile ranges of the host idle per step,
            static and dynamic, are apart (same rule; ``None``: simulated or not measured).
        gain, gain_verdict: for observed runs, the run's own step-time gain of dynamic over static (a fraction)
            and its verdict (``significant`` / ``not significant``); ``None`` otherwise.
    """

    provenance: str | None = None
    source: str = "no dynamic simulation or run given"
    routing: str | None = None
    iteration_uniform_s: float | None = None
    iteration_static_s: float | None = None
    iteration_dynamic_s: float | None = None
    routing_variance_s: float | None = None
    bubble_after_dynamic_s: float | None = None
    idle_removed_s: float | None = None
    units: str = "s"
    notes: list[str] = field(default_factory=list)
    routing_variance_significant: bool | None = None
    idle_removed_significant: bool | None = None
    gain: float | None = None
    gain_verdict: str | None = None
    #: why these shares must not be applied to a plan's iteration (another workload), or ``None``
    foreign_workload: str | None = None

    @property
    def synthetic(self) -> bool:
        """A simulation in synthetic units: its seconds are not a plan's seconds (never scaled onto one)."""
        return self.units != "s"

    @property
    def measured(self) -> bool:
        return self.routing_variance_s is not None or self.bubble_after_dynamic_s is not None

    @property
    def routing_variance_share(self) -> float | None:
        """``routing_variance_s / iteration_uniform_s`` (``None`` when either is absent or the base is 0)."""
        if self.routing_variance_s is None or not self.iteration_uniform_s:
            return None
        return self.routing_variance_s / self.iteration_uniform_s

    @property
    def bubble_after_dynamic_share(self) -> float | None:
        """``bubble_after_dynamic_s / iteration_dynamic_s`` (``None`` when absent)."""
        if self.bubble_after_dynamic_s is None or not self.iteration_dynamic_s:
            return None
        return self.bubble_after_dynamic_s / self.iteration_dynamic_s

    def scaled(self, iteration_s: float) -> dict[str, float | None]:
        """The shares applied to ``iteration_s`` (e.g. a plan's simulated iteration): seconds per iteration of
        routing variance and per-rank bubble after dynamic correction, ``None`` where not measured. An estimate:
        it assumes the plan loses the same share as the source."""
        rv, bb = self.routing_variance_share, self.bubble_after_dynamic_share
        return {"routing_variance_s": None if rv is None else rv * iteration_s,
                "bubble_after_dynamic_s": None if bb is None else bb * iteration_s}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(measured=self.measured, routing_variance_share=self.routing_variance_share,
                 bubble_after_dynamic_share=self.bubble_after_dynamic_share)
        for k in ("routing_variance_s", "bubble_after_dynamic_s"):
            if d[k] is None:
                d[k + "_status"] = NOT_MEASURED
        return d

    def format(self, plan_iteration_s: float | None = None) -> str:
        """Readable lines; ``plan_iteration_s`` adds the shares scaled to that iteration (labelled estimate), except
        for a synthetic simulation, whose shares of its own iteration are the only numbers shown against a plan."""
        def val(x: float | None, share: float | None, of: str) -> str:
            if x is None:
                return NOT_MEASURED
            return f"{_z(x):.5g} {self.units}" + ("" if share is None else f" ({_pct(share)} of the {of} iteration)")

        def ns(flag: bool | None) -> str:
            return {None: "", True: " (significant)", False: " (not significant)"}[flag]

        head = (f"routing and dynamic correction (provenance {self.provenance}; source: {self.source})"
                if self.provenance else
                f"routing and dynamic correction: {NOT_MEASURED} ({self.source}; pass report --dynamic FILE "
                "from 'simulate --routing SPEC --dynamic --json' or 'run --dynamic --json')")
        lines = [head,
                 f"  routing variance: {val(self.routing_variance_s, self.routing_variance_share, 'uniform static')}"
                 + ns(self.routing_variance_significant),
                 f"  bubble after dynamic correction (idle per rank): "
                 f"{val(self.bubble_after_dynamic_s, self.bubble_after_dynamic_share, 'dynamic')}",
                 f"  idle removed per rank: {val(self.idle_removed_s, None, '')}" + ns(self.idle_removed_significant)]
        if self.gain is not None:
            lines.append(f"  the run's own step-time gain, dynamic over static: {_pct(self.gain, sign=True)} "
                         f"(gain_verdict: {self.gain_verdict}; significant only when the interquartile ranges of "
                         "the step times do not overlap)")
        if plan_iteration_s is not None:
            what = {"observed": "the lines above are the measured (observed) terms",
                    "simulated": "the lines above are simulated terms (a simulation, not an observation)"
                    }.get(self.provenance or "")
            lines.append("  (the table's routing variance row is the plan's own simulation under uniform routing: 0 by "
                         "construction" + (f"; {what})" if what else ")"))
        why = (f"the simulation's stage times are {self.units} of a synthetic toy pipeline, not this plan's stages"
               if self.synthetic else self.foreign_workload)
        if plan_iteration_s is not None and self.measured and why:
            lines.append(f"  not scaled to this plan's iteration ({plan_iteration_s:.4g} s): {why}; its numbers "
                         "count only as the shares of its own iteration shown above")
        elif plan_iteration_s is not None and self.measured:
            sc = self.scaled(plan_iteration_s)
            f = lambda x: NOT_MEASURED if x is None else f"{_z(x) * 1e3:.4g} ms"  # noqa: E731
            lines.append(f"  scaled to this plan's iteration ({plan_iteration_s:.4g} s; estimate: same shares as the "
                         f"source): routing variance {f(sc['routing_variance_s'])}"
                         f"{ns(self.routing_variance_significant)}, bubble after dynamic "
                         f"{f(sc['bubble_after_dynamic_s'])} per rank")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _z(x: float) -> float:
    """``x`` with a negative zero (and what prints as zero at 5 digits) turned into ``0.0``."""
    return 0.0 if abs(x) < 1e-12 else x


def _pct(x: float, sign: bool = False) -> str:
    """``x`` (a fraction) as a percentage with 2 decimals; what rounds to zero prints ``0.00%``, never
    ``-0.00%``."""
    v = 0.0 if abs(100 * x) < 0.005 else 100 * x
    return f"{v:+.2f}%" if sign else f"{v:.2f}%"


def _num(d: Mapping[str, Any], key: str, what: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{what}: field {key!r} is missing or not a number; allowed: the JSON of "
                          "'simulate --dynamic' or 'run --dynamic'")
    return float(v)


def _from_simulation(d: Mapping[str, Any], what: str) -> RoutingTerms:
    it_s = _num(d, "iteration_static_s", what)
    rv = _num(d, "routing_variance_s", what)
    bubble = _num(d, "bubble_after_dynamic_s", what)
    src = (f"simulate --dynamic: {d.get('schedule', '?')}, {d.get('stages', '?')} ranks, "
           f"{d.get('microbatches', '?')} micro-batches, routing {d.get('routing', '?')}, predictor "
           f"{d.get('predictor', '?')} (lag {d.get('prediction_lag_steps', 1)} step), {d.get('steps', '?')} steps; "
           f"costs {d.get('costs', '?')}")
    synthetic = "synthetic" in str(d.get("costs", ""))
    return RoutingTerms(provenance="simulated", source=src, routing=str(d.get("routing")),
                        iteration_uniform_s=it_s - rv, iteration_static_s=it_s,
                        iteration_dynamic_s=_num(d, "iteration_dynamic_s", what), routing_variance_s=rv,
                        bubble_after_dynamic_s=bubble, idle_removed_s=_num(d, "idle_removed_s", what),
                        units="units of --f/--b/--w" if synthetic else "s")


def _side(d: Mapping[str, Any], side: str, key: str, what: str) -> dict[str, float]:
    try:
        x = d[side][key]
        return {k: float(x[k]) for k in ("median_s", "q1_s", "q3_s")}
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{what}: field '{side}.{key}' (median_s, q1_s, q3_s) is missing; allowed: the JSON of "
                          "'run --dynamic'") from None


def _ranks(d: Mapping[str, Any]) -> int | None:
    w = d.get("world")
    if isinstance(w, Mapping) and isinstance(w.get("ranks"), int) and w["ranks"] > 0:
        return int(w["ranks"])
    return None


def _pairs(d: Mapping[str, Any]) -> str | None:
    """The run's pair handler (``job.pair_exec``), or ``None`` when the file does not record it."""
    job = d.get("job")
    return job.get("pair_exec") if isinstance(job, Mapping) else None


def _identity(d: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a ``run --dynamic`` result that must match between a run and its control: the top-level
    schedule, steps, trials and world sizes, plus every field of its ``job`` block (pair handler and order,
    micro-batches, model config, ...; ``job_identity`` of the runner's dynamic report) when recorded."""
    w = d.get("world") if isinstance(d.get("world"), Mapping) else {}
    out: dict[str, Any] = {k: d.get(k) for k in ("schedule", "steps", "trials")}
    out.update({k: w.get(k) for k in ("pp", "ep", "dp", "ranks")})
    job = d.get("job")
    if isinstance(job, Mapping):
        for k, v in job.items():
            if isinstance(v, Mapping):
                out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
            else:
                out.setdefault(k, v)
    return out


def check_same_job(run: Mapping[str, Any], control: Mapping[str, Any]) -> list[str]:
    """Refuse a control that is not the run's job under uniform routing; returns notes on fields one file does
    not record (they could not be checked).

    Raises:
        ConfigError: naming every field (sorted) whose values differ, with the control's and the run's values.
    """
    a, b = _identity(run), _identity(control)
    diff = [k for k in sorted(set(a) & set(b)) if a[k] != b[k]]
    if diff:
        said = "; ".join(f"field {'pair handler (pair_exec)' if k == 'pair_exec' else repr(k)} = {b[k]!r}, the run's "
                         f"{a[k]!r}" for k in diff)
        raise ConfigError(f"control run differs from the run: {said}; allowed: the same job under uniform routing "
                          "(only the routing may differ)")
    missing = sorted(set(a) ^ set(b))
    if missing:
        return [f"fields recorded by only one of run and control, not checked: {', '.join(missing)}"]
    return []


def _iqr(side: Mapping[str, Any]) -> tuple[float, float]:
    """``(q1_s, q3_s)`` of one side of a ``run --dynamic`` result (seconds)."""
    return side["q1_s"], side["q3_s"]


def _from_runs(d: Mapping[str, Any], control: Mapping[str, Any] | None, what: str) -> RoutingTerms:
    st, dy = _side(d, "static", "step_time", what), _side(d, "dynamic", "step_time", what)
    ist, idy = _side(d, "static", "host_idle_per_step", what), _side(d, "dynamic", "host_idle_per_step", what)
    ranks = _ranks(d)
    notes = []
    div = ranks or 1
    if ranks is None:
        notes.append("the run does not record its rank count: idle numbers are summed over ranks")
    w = d.get("world") if isinstance(d.get("world"), Mapping) else {}
    sizes = " ".join(f"{k}={w[k]}" for k in ("pp", "ep", "dp") if k in w)
    pairs = _pairs(d)
    src = (f"run --dynamic: {d.get('schedule', '?')}{' ' + sizes if sizes else ''}, pair handler "
           f"{pairs or 'not recorded'}, routing {d.get('routing', '?')}, {d.get('trials', '?')} trials x "
           f"{d.get('steps', '?')} steps interleaved, medians")
    gain = d.get("gain") if isinstance(d.get("gain"), (int, float)) and not isinstance(d.get("gain"), bool) else None
    terms = RoutingTerms(provenance="observed", source=src, routing=str(d.get("routing")),
                         iteration_static_s=st["median_s"], iteration_dynamic_s=dy["median_s"],
                         bubble_after_dynamic_s=idy["median_s"] / div,
                         idle_removed_s=(ist["median_s"] - idy["median_s"]) / div, notes=notes,
                         idle_removed_significant=apart(_iqr(ist), _iqr(idy)), gain=gain,
                         gain_verdict=(d.get("gain_verdict") or ("significant" if apart(_iqr(st), _iqr(dy)) else "not significant"))
                         if gain is not None else None,
                         foreign_workload="the run is the runner's tiny model on this machine's CPU processes, not "
                                          "this plan's model and cluster")
    if not terms.idle_removed_significant:
        notes.append("idle removed not significant: the interquartile ranges of the host idle per step, static and "
                     "dynamic, overlap")
    if control is None:
        notes.append("routing variance needs a control run under uniform routing (the same job in everything but "
                     "routing): pass a second --dynamic FILE")
        return terms
    cst = _side(control, "static", "step_time", "control run")
    notes += check_same_job(d, control)
    terms.iteration_uniform_s = cst["median_s"]
    terms.routing_variance_s = st["median_s"] - cst["median_s"]
    terms.source += f"; control: routing {control.get('routing')}, pair handler {_pairs(control) or 'not recorded'}"
    terms.source += ", static median"
    terms.routing_variance_significant = apart(_iqr(st), _iqr(cst))
    if not terms.routing_variance_significant:
        notes.append("routing variance not significant: the interquartile ranges of the static step times under "
                     "the routing and under the control overlap")
    return terms


def routing_terms(data: Mapping[str, Any] | None, control: Mapping[str, Any] | None = None, *,
                  what: str = "dynamic source") -> RoutingTerms:
    """:class:`RoutingTerms` from a ``simulate --dynamic`` or ``run --dynamic`` JSON dict (``None``: nothing
    measured). ``control``: for a run, the same job's ``run --dynamic`` JSON under uniform routing.

    Raises:
        ConfigError: a dict that is neither, a simulation without ``--dynamic``, or a control that is not the
            same job.
    """
    if data is None:
        return RoutingTerms()
    if not isinstance(data, Mapping):
        raise ConfigError(f"{what}: not a JSON object; allowed: the JSON of 'simulate --dynamic' or 'run --dynamic'")
    if data.get("kind") == "runner_dynamic":
        return _from_runs(data, control, what)
    if "routing_variance_s" in data:
        if control is not None:
            raise ConfigError(f"{what}: a simulation carries its own uniform-routing control; allowed: one "
                              "'simulate --dynamic' file")
        return _from_simulation(data, what)
    raise ConfigError(f"{what}: neither 'simulate --routing SPEC --dynamic --json' (field routing_variance_s) nor "
                      "'run --dynamic --json' (kind runner_dynamic) output")


def load_routing_terms(paths: Sequence[str] | None) -> RoutingTerms:
    """:func:`routing_terms` from one or two JSON files: a simulation, or a run plus (optionally) its
    uniform-routing control run (recognised by its routing, in either order)."""
    from tessera_lab.io import read_json

    paths = list(paths or [])
    if not paths:
        return RoutingTerms()
    if len(paths) > 2:
        raise ConfigError(f"option --dynamic given {len(paths)} times; allowed: once, or twice for a run and its "
                          "uniform-routing control")
    from tessera_lab.report.dynamic_schema import check_dynamic_source

    docs = [check_dynamic_source(read_json(p, "dynamic source"), f"dynamic source '{p}'") for p in paths]
    if len(docs) == 1:
        return routing_terms(docs[0], what=paths[0])
    uni = [i for i, d in enumerate(docs) if isinstance(d, Mapping) and d.get("routing") in _UNIFORM_RUN]
    if len(uni) != 1 or any(not isinstance(d, Mapping) or d.get("kind") != "runner_dynamic" for d in docs):
        raise ConfigError("option --dynamic given twice: allowed: two 'run --dynamic' files, exactly one of them "
                          "under uniform routing (the control)")
    c = uni[0]
    return routing_terms(docs[1 - c], docs[c], what=paths[1 - c])
