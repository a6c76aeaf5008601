"""The headline of a model-change diff (:func:`tessera_lab.report.capacity.model_diff`).

The iteration-time difference per GPU splits exactly into per-category contributions; the headline names the
largest one. A share "x ms of dT ms, p%" is only printed when it reads as a share: the largest term and the net
difference have the same sign and the term is at most the net (``0 < p <= 100%``). Otherwise the other terms
offset it (the net is smaller, of the other sign, or about zero) and the headline says so instead of printing a
percentage of a negative or near-zero base (e.g. "+121.70 ms of -11.19 ms, -1087%").
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from tessera_lab.errors import ConfigError

#: a net difference below this share of the base iteration time is "about unchanged"
UNCHANGED_SHARE = 1e-3


def diff_headline(labels: tuple[str, str], base_s: float, variant_s: float, base_mfu: float, variant_mfu: float,
                  contributions_s: Mapping[str, float]) -> str:
    """One line comparing two plans.

    Args:
        labels: names of the baseline and the variant.
        base_s, variant_s: iteration times (s, > 0).
        base_mfu, variant_mfu: MFU of each (0..1).
        contributions_s: seconds per GPU each category adds to ``variant_s - base_s`` (they sum to it).
    Returns:
        ``"<b> vs <a>: iteration A -> B s (+x%, longer), MFU ...; <largest term clause>"``.
    Raises:
        ValueError: ``base_s`` not positive.
    """
    if not base_s > 0:
        raise ValueError(f"baseline iteration time must be positive, got {base_s}")
    dT = variant_s - base_s
    small = abs(dT) <= UNCHANGED_SHARE * base_s
    direction = "about unchanged" if small else ("longer" if dT > 0 else "shorter")
    head = (f"{labels[1]} vs {labels[0]}: iteration {base_s:.4f} -> {variant_s:.4f} s ({dT / base_s:+.1%}, "
            f"{direction}), MFU {base_mfu:.1%} -> {variant_mfu:.1%}")
    if not contributions_s:
        return head
    top = max(contributions_s, key=lambda k: abs(contributions_s[k]))
    c = contributions_s[top]
    share = c / dT if dT and not small else float("nan")
    if math.isfinite(share) and 0 < share <= 1 + 1e-9:
        verb = "is dominated by" if share >= 0.5 else "has as its largest term"
        return head + f"; the difference {verb} {top} ({c * 1e3:+.2f} ms of {dT * 1e3:+.2f} ms per GPU, {share:.0%})"
    against = [k for k in contributions_s if contributions_s[k] * c < 0]
    by = "the other terms"
    if against:
        k = max(against, key=lambda k: abs(contributions_s[k]))
        by = f"{k} ({contributions_s[k] * 1e3:+.2f} ms)" + (" and others" if len(against) > 1 else "")
    return head + (f"; the largest term is {top} ({c * 1e3:+.2f} ms per GPU), offset by {by}: "
                   f"net {dT * 1e3:+.2f} ms per GPU")


def merge_diff_args(values: str | Sequence[str] | None) -> str | None:
    """``report --diff`` given once or several times -> one ``OTHER``: a plan JSON or model name alone, or the
    change lists of every ``--diff KEY=VALUE,...`` joined (``--diff attention_ratio=1 --diff top_k=4`` is
    ``attention_ratio=1,top_k=4``).

    Raises:
        ConfigError: a plan or model name given with another ``--diff`` (one comparison at a time).
    """
    if values is None or isinstance(values, str):
        return values
    vals = [v for v in values if v is not None]
    if len(vals) <= 1:
        return vals[0] if vals else None
    alone = [v for v in vals if "=" not in v or "[" in v or v.endswith(".json")]
    if alone:
        raise ConfigError(f"option --diff {alone[0]!r} (a plan or model) was given with another --diff "
                          f"({', '.join(repr(v) for v in vals if v != alone[0])}); allowed: one plan or model, or "
                          "any number of KEY=VALUE changes")
    return ",".join(vals)


def check_changes(changes: Mapping[str, object]) -> dict[str, object]:
    """``report --diff KEY=VALUE,...`` changes (from :func:`tessera_lab.report.capacity.parse_changes`) with every
    integer knob typed and in range before any planning: model knobs by
    :func:`tessera_lab.model.knobs.parse_knob` (``"1e3"`` counts as 1000), run sizes (``seq_len``,
    ``micro_batch_size``, ``microbatches``) as integers >= 1 under their work limits. Returns the changes with
    those values as ints; ``dtype``/``precision`` are left to the parallel config's own check.

    Raises:
        ConfigError: ``change 'attention_ratio' = 'x' is not an integer; allowed: an integer 0 to 4096 (...)``.
    """
    from tessera_lab.checks import check_int, env_name, work_limit
    from tessera_lab.model.knobs import MODEL_KNOBS, parse_knob

    out = dict(changes)
    for k, v in changes.items():
        if k in MODEL_KNOBS:
            out[k] = parse_knob(MODEL_KNOBS[k], v, f"change '{k}'")
        elif k in _RUN_SIZES:
            if isinstance(v, str):
                try:
                    f = float(v)
                    v = int(f) if math.isfinite(f) and f == int(f) and abs(f) < 2**62 else v
                except ValueError:
                    pass
            top = work_limit(_RUN_SIZES[k])
            out[k] = check_int(v, k, low=1, high=top, noun="change", allowed=f"an integer 1 to {top} ({top}: the "
                               f"work limit of this kind of machine; raise it with {env_name(_RUN_SIZES[k])}=N)")
    return out


#: run-size keys of a diff change -> their work limit
_RUN_SIZES = {"seq_len": "seq_len", "context_length": "seq_len", "micro_batch_size": "micro_batch_size",
              "microbatches": "microbatches"}

__all__ = ["UNCHANGED_SHARE", "check_changes", "diff_headline"]
