"""Noise warnings and the closing text of ``tessera-lab measure``, on recorded figures (the report of a default
cpu run on a busy machine: F[full_attention+moe] alone 409.2 ms in pair 3 and 1310.4 ms in pair 4, pair 4 together
1194.0 ms, efficiency 1.175)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tessera_lab.cli.measure import fit_text, iqr_text, sizing_text
from tessera_lab.runner.measure.noise import noise_warnings

LIN, FULL = "linear_attention+moe", "full_attention+moe"
LOAD = {"before": 14.2, "after": 19.6}


def _res(kf, kb, t_a, t_b, t_ab, iqr_a=(0.99, 1.01), iqr_b=(0.99, 1.01)):
    """A measured pair as the harness records it (seconds; quartiles as fractions of the median)."""
    sp = {"t_a": {"median": t_a, "q1": t_a * iqr_a[0], "q3": t_a * iqr_a[1]},
          "t_b": {"median": t_b, "q1": t_b * iqr_b[0], "q3": t_b * iqr_b[1]}}
    return SimpleNamespace(kind_a=kf, kind_b=kb, t_a=t_a, t_b=t_b, t_ab=t_ab, spread=sp)


def _report():
    # t_b of pair 4 from the reported efficiency: (1310.4 + t_b - 1194.0) / t_b = 1.175 -> t_b = 665.14 ms
    t_b4 = 0.1164 / 0.175
    return [_res(LIN, LIN, 0.300, 0.600, 0.850), _res(LIN, FULL, 0.305, 0.650, 0.900),
            _res(FULL, LIN, 0.4092, 0.610, 0.950), _res(FULL, FULL, 1.3104, t_b4, 1.194)]


def test_the_reported_run_is_flagged_twice_with_pairs_figures_and_load():
    ws = noise_warnings(_report(), LOAD, cores=2)
    checks = {w["check"]: w for w in ws}
    assert set(checks) == {"same side differs", "together faster than a side alone"}
    same = checks["same side differs"]
    assert same["pairs"] == [3, 4] and same["side"] == f"F[{FULL}]"
    assert same["figures_s"]["median"] == [0.4092, 1.3104]  # the measured values, unaltered
    assert "409.2 ms" in same["text"] and "1310.4 ms" in same["text"] and "pair 3" in same["text"]
    assert "noise on a busy machine" in same["text"] and "14.2 -> 19.6 on 2 cores" in same["text"]
    fast = checks["together faster than a side alone"]
    assert fast["pairs"] == [4] and "1194.0 ms" in fast["text"] and "1310.4 ms" in fast["text"]
    assert fast["figures_s"]["efficiency"] == pytest.approx(1.175)
    assert "efficiency 1.18 > 1" in fast["text"] or "efficiency 1.17 > 1" in fast["text"]


def test_a_quiet_run_has_no_warning():
    quiet = [_res(LIN, LIN, 0.300, 0.600, 0.850), _res(LIN, FULL, 0.305, 0.650, 0.900),
             _res(FULL, LIN, 0.410, 0.610, 0.950), _res(FULL, FULL, 0.412, 0.655, 1.000)]
    assert noise_warnings(quiet, LOAD) == []


def test_overlapping_quartiles_are_not_noise_and_touching_a_side_alone_is_not_faster():
    # 300 ms (IQR 270-330) and 320 ms (IQR 304-336) overlap; together == slowest side: efficiency exactly 1
    rs = [_res(LIN, LIN, 0.300, 0.600, 0.600, iqr_a=(0.9, 1.1)), _res(LIN, FULL, 0.320, 0.650, 0.900, iqr_a=(0.95, 1.05))]
    assert noise_warnings(rs, LOAD) == []


def test_the_backward_side_is_checked_too():
    rs = [_res(LIN, FULL, 0.300, 0.600, 0.850), _res(FULL, FULL, 0.300, 0.900, 1.100)]
    (w,) = noise_warnings(rs, LOAD)
    assert w["side"] == f"BW[{FULL}]" and w["pairs"] == [1, 2]


@pytest.mark.parametrize("q1, q3, want", [
    (0.9542, 1.0034, "954.2-1003.4"),  # the reported "954-1e+03"
    (0.0123456, 0.0131, "12.35-13.10"),
    (0.00052, 0.00061, "0.5200-0.6100"),
])
def test_iqr_has_the_same_decimals_on_both_ends(q1, q3, want):
    assert iqr_text(q1, q3) == want


def test_fit_text_says_what_the_fit_is_and_that_0_381_is_poor():
    t = fit_text({"pairs": 4, "compute": 0.0, "comm": 0.0, "rms_relative_error": 0.381})
    assert "fitted" in t and "pair samples" in t
    assert "compute +0 (no slowdown from running together found)" in t
    assert "comm +0 (no slowdown from running together found)" in t
    assert "explains the samples poorly" in t and "38%" in t
    good = fit_text({"pairs": 4, "compute": 0.25, "comm": 0.1, "rms_relative_error": 0.04})
    assert "compute +0.25 (compute 25% slower" in good and "explains the samples well" in good


def _sizing(**kw):
    sz = {"budget_s": 150.0, "wall_s": 151.3, "cpu_s": 80.1, "load_average_1m": LOAD, "size_factor": 0.0625,
          "requested": {"size_factor": 0.125, "repeats": 5, "keep": 4}, "plan": {"repeats": 5, "keep": 4},
          "reductions": ["size factor 0.125 -> 0.0625"], "skipped": []}
    sz.update(kw)
    return sz


def test_sizing_text_prints_what_ran_per_pair_and_no_empty_skipped_line():
    ran = [{"repeats": 5, "orders": 4}, {"repeats": 3, "orders": 3}, {"repeats": 3, "orders": 3},
           {"repeats": 5, "orders": 4}]
    t = sizing_text(_sizing(), ran)
    assert "orders measured per pair 4, 3, 3, 4 (pairs 1-4)" in t and "repeats 5, 3, 3, 5 (pairs 1-4)" in t
    assert "4 orders per pair" not in t
    assert "reduced to fit: size factor 0.125 -> 0.0625" in t and "skipped" not in t
    same = sizing_text(_sizing(), [{"repeats": 5, "orders": 4}] * 4)
    assert "repeats 5, orders measured per pair 4" in same
    cut = sizing_text(_sizing(skipped=["pair 2: halving stopped before the round of 2 orders x 6 runs"]), ran)
    assert "\nskipped: pair 2: halving stopped" in cut
