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


# ---------------------------------------------------------------- the whole command on the recorded figures
def _rank0(kind_f, kind_b, t_f_ms, t_b_ms, cands_ms):
    """A rank-0 pair record as :mod:`tessera_lab.runner.measure.ranks` returns it (samples in ms here)."""
    from tessera_lab.runner.runtime.orders import NAMED_ORDERS, TEMPLATE_KEYS

    orders = [list(TEMPLATE_KEYS), list(NAMED_ORDERS["megatron"])]
    dur = {k: 0.01 for k in TEMPLATE_KEYS}
    cands = [{"order": orders[i % 2], "samples": [x / 1e3 for x in s]} for i, s in enumerate(cands_ms)]
    return {"kind_f": kind_f, "kind_b": kind_b, "durations": dur, "t_f": [x / 1e3 for x in t_f_ms],
            "t_b": [x / 1e3 for x in t_b_ms], "together": {}, "candidates": cands, "halving": [],
            "fit": {"compute": 0.0, "comm": 0.0, "rms_relative_error": 0.381, "pairs": 1},
            "plan": {"repeats": len(t_f_ms), "warmup": 1, "keep": len(cands_ms)}}


def test_the_command_on_the_reported_run_warns_and_keeps_the_values(tmp_path, monkeypatch, capsys):
    from tessera_lab.cli import measure as cm
    from tessera_lab.cli.main import main
    from tessera_lab.overlap import profiles as pr
    from tessera_lab.overlap.environment import current_environment
    from tessera_lab.runner.measure.assemble import overlap_result

    sz = _sizing(plan={"repeats": 5, "keep": 4}, reductions=["pair 2: behind the plan, measured with repeats 3 and 3 "
                                                             "orders", "pair 3: behind the plan, measured with "
                                                             "repeats 3 and 3 orders"])
    common = {"backend": "cpu", "size_factor": 0.0625, "world_size": 2, "sizing": sz, "repeats": 5, "warmup": 1}
    recs = [
        _rank0(LIN, LIN, [300, 302, 305, 298, 301], [600, 610, 590, 605, 600],
               [[850, 860, 840, 855, 845]] * 4),
        _rank0(LIN, FULL, [303, 305, 307], [650, 655, 645], [[900, 905, 895]] * 3),
        _rank0(FULL, LIN, [405.0, 409.2, 412.0], [610, 612, 608], [[950, 955, 945]] * 3),
        # pair 4: F alone 1310.4 ms, BW alone 665.14 ms, program order together 1194.0 ms, candidate 1 980.0 ms
        _rank0(FULL, FULL, [1300.0, 1310.4, 1320.0], [660.0, 665.14, 670.0], [[1190.0, 1194.0, 1198.0], [954.2, 980.0, 1003.4]] + [[1194.0, 1194.0, 1194.0]] * 2),
    ]
    env = current_environment("cpu")
    results = [overlap_result(r, "cpu", env, common) for r in recs]

    def fake(args, model, seq_len, default_f):
        from tessera_lab.model.hardware import ParallelConfig

        args.ep = 2
        return results, ParallelConfig(ep=2, tp=1, seq_len=seq_len, micro_batch_size=1, pp=1, dp=1)

    monkeypatch.setattr(cm, "_measure_runtime", fake)
    out = tmp_path / "cpu.json"
    assert main(["measure", "--backend", "cpu", "--model", "qwen3-next-80b-a3b", "--out", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    lines = text.rstrip().splitlines()
    assert lines[-1] == f"profile written: {out}"
    warn = [l for l in lines if l.startswith("noise warning")]
    assert any("F[full_attention+moe] alone measured 409.2 ms" in l and "1310.4 ms" in l and "pair 3" in l
               and "pair 4" in l for l in warn), warn
    # pair 4's chosen order: candidate 1 is significant (its q3 991.7 < program q1 1192.0), so t_ab = 980.0 ms
    assert any(l.startswith("noise warning: pair 4") and "980.0 ms" in l and "1310.4 ms" in l for l in warn), warn
    # the pair's IQR (linear interpolation of 954.2, 980.0, 1003.4: q1 967.1, q3 991.7), same decimals on both ends
    assert "967.1-991.7" in text
    assert "repeats 5, 3, 3, 3 (pairs 1-4)" in text and "orders measured per pair 4, 3, 3, 4 (pairs 1-4)" in text
    assert "skipped" not in text and "reduced to fit: pair 2: behind the plan" in text
    prof = pr.load_profile(out)
    assert [w["text"] for w in prof.data["noise_warnings"]] == warn  # recorded as printed
    e4 = next(e for e in prof.entries.values() if e["kind_f"] == FULL and e["kind_b"] == FULL)
    assert e4["t_a"]["median"] == pytest.approx(1.3104) and e4["t_ab"]["median"] == pytest.approx(0.980)  # unaltered
    assert len(e4["metadata"]["noise_warnings"]) >= 2


def test_a_machine_with_load_below_its_cores_is_not_called_busy():
    ws = noise_warnings(_report(), {"before": 0.4, "after": 1.1}, cores=2)
    assert ws and all("not busy" in w["text"] and "busy machine" not in w["text"] for w in ws)
    assert all("noise on a busy machine" in w["text"] for w in noise_warnings(_report(), {"before": 0.4, "after": 2.5},
                                                                              cores=2))
