"""Routing variance and the bubble left after dynamic correction, taken from a dynamic simulation or run.

A plan's capacity report simulates the plan under uniform routing, so its ``routing_variance`` row is 0 by
construction. The two numbers the dynamic bubble optimizer is about come from elsewhere (issue 14):

- ``tessera-lab simulate ... --routing SPEC --dynamic --json F`` (provenance ``simulated``): the online controller's
  static and dynamic iterations under the routing, and the same controller under uniform routing;
- ``tessera-lab run ... --dynamic --json F`` (provenance ``observed``): interleaved static and dynamic trials of the
  runner; routing variance needs a second such run under uniform routing as its control (same schedule and
  sizes), given as another file.

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
shares to another iteration time (a plan's) and says that it is an estimate scaled from the source.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from tessera_lab.errors import ConfigError

__all__ = ["RoutingTerms", "routing_terms", "load_routing_terms", "NOT_MEASURED"]

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
        """Readable lines; ``plan_iteration_s`` adds the shares scaled to that iteration (labelled estimate)."""
        def val(x: float | None, share: float | None, of: str) -> str:
            if x is None:
                return NOT_MEASURED
            u = "s" if self.units == "s" else self.units
            return f"{x:.5g} {u}" + ("" if share is None else f" ({100 * share:.2f}% of the {of} iteration)")

        head = (f"routing and dynamic correction ({self.provenance}: {self.source})" if self.provenance
                else f"routing and dynamic correction: {NOT_MEASURED} ({self.source}; pass report --dynamic FILE "
                     "from 'simulate --routing SPEC --dynamic --json' or 'run --dynamic --json')")
        ns = " (not significant)" if self.routing_variance_significant is False else ""
        lines = [head,
                 f"  routing variance: {val(self.routing_variance_s, self.routing_variance_share, 'uniform static')}"
                 + ns,
                 f"  bubble after dynamic correction (idle per rank): "
                 f"{val(self.bubble_after_dynamic_s, self.bubble_after_dynamic_share, 'dynamic')}",
                 f"  idle removed per rank: {val(self.idle_removed_s, None, '')}"]
        if plan_iteration_s is not None:
            lines.append("  (the table's routing variance row is the plan's own simulation under uniform routing: 0 by "
                         "construction; the lines above are the measured terms)")
        if plan_iteration_s is not None and self.measured:
            sc = self.scaled(plan_iteration_s)
            f = lambda x: NOT_MEASURED if x is None else f"{x * 1e3:.4g} ms"  # noqa: E731
            lines.append(f"  scaled to this plan's iteration ({plan_iteration_s:.4g} s; estimate: same shares as the "
                         f"source): routing variance {f(sc['routing_variance_s'])}{ns}, bubble after dynamic "
                         f"{f(sc['bubble_after_dynamic_s'])} per rank")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


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
    src = (f"observed run --dynamic: {d.get('schedule', '?')}{' ' + sizes if sizes else ''}, routing "
           f"{d.get('routing', '?')}, {d.get('trials', '?')} trials x {d.get('steps', '?')} steps interleaved, "
           f"medians")
    terms = RoutingTerms(provenance="observed", source=src, routing=str(d.get("routing")),
                         iteration_static_s=st["median_s"], iteration_dynamic_s=dy["median_s"],
                         bubble_after_dynamic_s=idy["median_s"] / div,
                         idle_removed_s=(ist["median_s"] - idy["median_s"]) / div, notes=notes)
    if control is None:
        notes.append("routing variance needs a control run under uniform routing (same schedule and sizes): pass a "
                     "second --dynamic FILE")
        return terms
    cst = _side(control, "static", "step_time", "control run")
    for k in ("schedule", "steps"):
        if control.get(k) != d.get(k):
            raise ConfigError(f"control run: field {k!r} = {control.get(k)!r} differs from the run's {d.get(k)!r}; "
                              "allowed: the same job under uniform routing")
    if _ranks(control) != ranks:
        raise ConfigError(f"control run: {_ranks(control)} ranks differ from the run's {ranks}; allowed: the same "
                          "job under uniform routing")
    terms.iteration_uniform_s = cst["median_s"]
    terms.routing_variance_s = st["median_s"] - cst["median_s"]
    terms.source += f"; control: routing {control.get('routing')}, static median"
    terms.routing_variance_significant = bool(st["q3_s"] < cst["q1_s"] or cst["q3_s"] < st["q1_s"])
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
    docs = [read_json(p, "dynamic source") for p in paths]
    if len(docs) == 1:
        return routing_terms(docs[0], what=paths[0])
    uni = [i for i, d in enumerate(docs) if isinstance(d, Mapping) and d.get("routing") in _UNIFORM_RUN]
    if len(uni) != 1 or any(not isinstance(d, Mapping) or d.get("kind") != "runner_dynamic" for d in docs):
        raise ConfigError("option --dynamic given twice: allowed: two 'run --dynamic' files, exactly one of them "
                          "under uniform routing (the control)")
    c = uni[0]
    return routing_terms(docs[1 - c], docs[c], what=paths[1 - c])
