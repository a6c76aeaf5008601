"""Validation at the boundary and work limits: every bad number, file and size gets one line naming the
field, the file when there is one, the value and the allowed range, with exit status 2; nothing hangs."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from tessera_lab.argtypes import integer, nonneg_float, positive_float, positive_int
from tessera_lab.checks import WORK_LIMITS, check_float, check_int, check_time, check_work, work_limit
from tessera_lab.cli.main import build_parser, main
from tessera_lab.errors import ConfigError, ProfileError

ROOT = Path(__file__).resolve().parents[1]


def one_error_line(capsys) -> str:
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


# ------------------------------------------------------------------------------------------ checks.py
@pytest.mark.parametrize("value, words", [
    (math.nan, "not an integer"), (math.inf, "not an integer"), (2.5, "not an integer"), ("abc", "not an integer"),
    (True, "not an integer"), (None, "not an integer"), (0, "out of range"), (1e300, "out of range"),
    (10**40, "out of range"),
])
def test_check_int_refuses(value, words):
    with pytest.raises(ConfigError) as exc:
        check_int(value, "hidden_size", low=1, high=1 << 24, where="config file 'm.json'")
    msg = str(exc.value)
    assert words in msg and "'hidden_size'" in msg and "m.json" in msg and "1 to 16777216" in msg


def test_check_int_accepts_integral_floats_and_names_work_limits(monkeypatch):
    assert check_int(1024.0, "x") == 1024
    with pytest.raises(ConfigError, match="work limit.*TESSERA_LAB_MAX_LAYERS"):
        check_int(10**6, "num_hidden_layers", limit="layers")
    monkeypatch.setenv("TESSERA_LAB_MAX_LAYERS", str(10**6))
    assert work_limit("layers") == 10**6 and check_int(10**6, "num_hidden_layers", limit="layers") == 10**6


@pytest.mark.parametrize("value", [math.nan, -math.inf, math.inf, -1.0, "fast", None, 2e9])
def test_check_time_refuses(value):
    with pytest.raises(ProfileError) as exc:
        check_time(value, "t_ab", where="profile 'p.json'", error=ProfileError)
    assert "'t_ab'" in str(exc.value) and "p.json" in str(exc.value) and "seconds" in str(exc.value)


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_check_float_accepts_exactly_the_finite_values_in_range(v):
    ok = math.isfinite(v) and 0 <= v <= 10
    try:
        assert check_float(v, "x", low=0, high=10) == v
        assert ok
    except ConfigError:
        assert not ok


@given(st.one_of(st.integers(-10**20, 10**20).map(str), st.floats().map(repr), st.text(max_size=8)))
def test_flag_parsers_give_one_line_or_a_finite_value(text):
    import argparse

    for parse in (positive_int("microbatches"), nonneg_float("f"), positive_float("fb"), integer("top_k")):
        try:
            v = parse(text)
        except argparse.ArgumentTypeError as exc:
            assert "\n" not in str(exc) and str(exc).split(" = ")[0] in ("microbatches", "f", "fb", "top_k")
        else:
            assert math.isfinite(v)
            if parse.__qualname__.startswith("int_in"):
                assert 1 <= v <= WORK_LIMITS["microbatches"][0]


def test_check_work_message_names_the_variable():
    with pytest.raises(ConfigError) as exc:
        check_work("stages", 10**9)
    assert "TESSERA_LAB_MAX_STAGES" in str(exc.value) and "1000000000" in str(exc.value)


# ------------------------------------------------------------------------------------------ flags
@pytest.mark.parametrize("argv, field", [
    (["simulate", "--stages", "4", "--microbatches", "8", "--f", "-inf", "--b", "2"], "f"),
    (["simulate", "--stages", "4", "--microbatches", "8", "--f", "nan", "--b", "2"], "f"),
    (["simulate", "--stages", "4", "--microbatches", "8", "--f", "1e308", "--b", "2"], "f"),
    (["simulate", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2", "--fb", "0"], "fb"),
    (["simulate", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "inf"], "b"),
    (["partition", "--costs", "1,2,3", "--stages", "2", "--time-limit", "0"], "time_limit"),
    (["partition", "--costs", "1,2,1e308", "--stages", "2"], "costs[2]"),
    (["partition", "--costs", "1,nan,3", "--stages", "2"], "costs[1]"),
    (["plan", "--time-limit", "nan"], "time_limit"),
    (["plan", "--ilp-max-nodes", "-1"], "ilp_max_nodes"),
    (["plan", "--ilp-max-binaries", "1e9"], "ilp_max_binaries"),
    (["partition", "--costs", "1,2,3", "--stages", "2", "--ilp-max-binaries", "x"], "ilp_max_binaries"),
    (["plan", "--time-limit", "5", "--ilp-max-nodes", "3"], "time_limit"),
    (["partition", "--costs", "1,2,3", "--stages", "2", "--time-limit", "1", "--ilp-max-binaries", "3"], "time_limit"),
    (["plan", "--top-k", "1e12"], "top_k"),
    (["plan", "--expert-width", "abc"], "expert_width"),
])
def test_bad_numeric_flags_one_line(argv, field, capsys):
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert f"{field} = " in line and "allowed" in line


@pytest.mark.parametrize("argv, words", [
    (["plan", "-m", "10000000"], "TESSERA_LAB_MAX_MICROBATCHES"),
    (["plan", "--layers", "100000"], "TESSERA_LAB_MAX_LAYERS"),
    (["simulate", "--stages", "1000000000", "--microbatches", "8", "--f", "1", "--b", "2"], "TESSERA_LAB_MAX_STAGES"),
    (["simulate", "--stages", "1000", "--microbatches", "10000", "--f", "1", "--b", "2"], "TESSERA_LAB_MAX_ACTIONS"),
    (["plan", "--dp", "1e12"], "TESSERA_LAB_MAX_DP"),
    (["simulate", "--schedule", "zb-auto", "--stages", "64", "--microbatches", "2000", "--f", "1", "--b", "2", "--w",
      "1"], "TESSERA_LAB_MAX_SEARCH_ACTIONS"),
    (["plan", "--dp", "100000", "--pp", "64"], "TESSERA_LAB_MAX_WORLD_SIZE"),
    (["plan", "--vpp", "1000000"], "TESSERA_LAB_MAX_VPP"),
    (["partition", "--costs", ",".join(["1"] * 4097), "--stages", "64"], "TESSERA_LAB_MAX_COSTS"),
])
def test_work_limits_refuse_up_front(argv, words, capsys):
    t0 = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - t0 < 5
    line = one_error_line(capsys)
    assert words in line and "work limit" in line


def test_work_limit_can_be_raised(monkeypatch, capsys):
    monkeypatch.setenv("TESSERA_LAB_MAX_MICROBATCHES", "4")
    assert main(["simulate", "--stages", "2", "--microbatches", "8", "--f", "1", "--b", "2"]) == 2
    assert "work limit 4" in one_error_line(capsys)
    monkeypatch.setenv("TESSERA_LAB_MAX_MICROBATCHES", "100")
    assert main(["simulate", "--stages", "2", "--microbatches", "8", "--f", "1", "--b", "2", "--json", "-"]) == 0


def test_negative_number_values_reach_the_type_check(capsys):
    assert main(["simulate", "--stages", "2", "--microbatches", "4", "--f", "-1e3", "--b", "2"]) == 2
    assert "f = -1e3 is out of range" in one_error_line(capsys)


# ------------------------------------------------------------------------------------------ files
@pytest.fixture()
def config():
    return json.loads((ROOT / "data" / "models" / "qwen3-next-80b-a3b.json").read_text())


@pytest.mark.parametrize("change, words", [
    ({"hidden_size": float("nan")}, "'hidden_size' = nan"),
    ({"hidden_size": 1e300}, "'hidden_size' = 1e+300 is out of range"),
    ({"hidden_size": "abc"}, "'hidden_size' = 'abc' is not an integer"),
    ({"num_experts": float("inf")}, "'num_experts' = inf"),
    ({"num_hidden_layers": 100000}, "TESSERA_LAB_MAX_LAYERS"),
    ({"moe_intermediate_size": -5}, "'moe_intermediate_size' = -5 is out of range"),
])
def test_bad_config_fields(tmp_path, config, change, words, capsys):
    f = tmp_path / "m.json"
    f.write_text(json.dumps({**config, **change}))  # json writes NaN / Infinity tokens
    t0 = time.perf_counter()
    assert main(["plan", "--model", str(f)]) == 2
    assert time.perf_counter() - t0 < 10
    line = one_error_line(capsys)
    assert words in line and str(f) in line


@pytest.mark.parametrize("content, words", [
    (b"\x00\x01\x02binary", "binary"), (b'{"model_type": "caf\xe9"}', "not UTF-8"),
    (b"[" * 100_000, "nested deeper"), (b"{", "not valid JSON"),
])
def test_unreadable_files_for_every_loader(tmp_path, content, words, capsys):
    f = tmp_path / "f.json"
    f.write_bytes(content)
    for argv in (["params", str(f)], ["plan", "--profile", str(f)], ["report", "--plan", str(f)]):
        assert main(argv) == 2
        line = one_error_line(capsys)
        assert words in line and str(f) in line, (argv, line)


def _profile(tmp_path: Path, capsys) -> Path:
    out = tmp_path / "p.json"
    assert main(["measure", "--backend", "analytic", "--model", "qwen3-8b", "--no-progress", "--out", str(out)]) == 0
    capsys.readouterr()
    return out


@pytest.mark.parametrize("value, words", [(-62.99, "out of range"), ("NaN", "not a finite number"),
                                          ("fast", "not a number")])
def test_profile_times_are_checked(tmp_path, capsys, value, words):
    p = _profile(tmp_path, capsys)
    d = json.loads(p.read_text())
    key = next(iter(d["entries"]))
    d["entries"][key]["t_ab"]["median"] = value
    text = json.dumps(d).replace('"NaN"', "NaN")
    p.write_text(text)
    assert main(["plan", "--model", "qwen3-8b", "--profile", str(p)]) == 2
    line = one_error_line(capsys)
    assert words in line and str(p) in line and "t_ab" in line


def test_profile_of_another_model_or_gpu_is_refused_unless_allowed(tmp_path, capsys):
    p = _profile(tmp_path, capsys)  # analytic, qwen3-8b, H200
    assert main(["plan", "--profile", str(p)]) == 2  # default model: qwen3-next-80b-a3b
    assert "qwen3-8b" in one_error_line(capsys)
    assert main(["plan", "--model", "qwen3-8b", "--gpu", "H100", "--profile", str(p)]) == 2
    assert "H100" in one_error_line(capsys)
    assert main(["plan", "--model", "qwen3-8b", "--gpu", "H100", "--pp", "4", "-m", "8", "--profile", str(p),
                 "--allow-stale-profile"]) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "H100" in err and "Traceback" not in err


@pytest.mark.parametrize("par, words", [({"pp": "abc"}, "'parallel.pp' = 'abc'"),
                                        ({"pp": 10**9}, "TESSERA_LAB_MAX_PP"),
                                        ({"microbatches": float("nan")}, "not a finite number")])
def test_plan_json_fields_are_checked(tmp_path, capsys, par, words):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--pp", "4", "-m", "8", "--json", str(plan)]) == 0
    capsys.readouterr()
    d = json.loads(plan.read_text())
    d["parallel"].update(par)
    plan.write_text(json.dumps(d))
    assert main(["report", "--plan", str(plan)]) == 2
    line = one_error_line(capsys)
    assert words in line and str(plan) in line


# ------------------------------------------------------------------------------------------ help
def test_every_option_has_help_and_shows_its_default():
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, p in sub.choices.items():
        text = p.format_help()
        for a in p._actions:
            if isinstance(a, argparse._HelpAction) or not a.option_strings:
                continue
            if not a.help:
                missing.append(f"{name} {a.option_strings[0]}")
            elif a.default not in (None, False, argparse.SUPPRESS) and "default" not in (a.help or "").lower():
                assert f"(default: {a.default})" in " ".join(text.split()), (name, a.option_strings)
    assert missing == []


@pytest.mark.parametrize("argv", [["plan", "--plot", "-"], ["plan", "--export", "-"],
                                  ["simulate", "--stages", "2", "--microbatches", "2", "--f", "1", "--b", "1",
                                   "--trace", "-"]])
def test_only_json_goes_to_stdout(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert "standard output takes only --json" in one_error_line(capsys)
    assert list(tmp_path.iterdir()) == []


def test_plan_json_must_be_consistent(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--pp", "4", "-m", "8", "--json", str(plan)]) == 0
    capsys.readouterr()
    good = json.loads(plan.read_text())
    for change, words in (({"gpus": 7}, "'gpus' = 7"),
                          ({"stages": good["stages"][:1] + good["stages"][2:]}, "must list 4 stages")):
        plan.write_text(json.dumps({**good, **change}))
        assert main(["report", "--plan", str(plan)]) == 2
        assert words in one_error_line(capsys)
    bad = json.loads(json.dumps(good))
    bad["stages"][1]["layers"] = bad["stages"][1]["layers"][1:]
    plan.write_text(json.dumps(bad))
    assert main(["report", "--plan", str(plan)]) == 2
    assert "exactly one stage" in one_error_line(capsys)


def test_a_malformed_limit_variable_is_named(monkeypatch, capsys):
    monkeypatch.setenv("TESSERA_LAB_MAX_STAGES", "lots")
    assert main(["simulate", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "1"]) == 2
    assert "TESSERA_LAB_MAX_STAGES = 'lots'" in one_error_line(capsys)


def test_simulate_fb_range_and_use(capsys):
    """--fb below the longer half of the pair is impossible (exit 2, the range named); on a schedule without
    overlapped pairs it would be ignored (exit 2); a split schedule without --w says what it assumed."""
    from tessera_lab.cli.main import main

    base = ["simulate", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2"]
    assert main(base + ["--schedule", "overlapped", "--fb", "0.5"]) == 2
    assert "allowed: >= max(--f, --b) = 2" in capsys.readouterr().err
    assert main(base + ["--schedule", "1f1b", "--fb", "2.5"]) == 2
    assert "has none, so it would be ignored" in capsys.readouterr().err
    assert main(base + ["--schedule", "overlapped", "--fb", "2"]) == 0  # perfect overlap: the lower end is allowed
    capsys.readouterr()
    assert main(base + ["--schedule", "zb-v"]) == 0
    assert "note: --w not given: a split backward takes I = --b = 2 and W = 0" in capsys.readouterr().out
