"""The input contract of the runner's files: concurrent store appends lose nothing, damaged stores and
tampered runner plans are refused with one line (exit 2) before any worker starts, malformed report inputs too.
Values are worked out by hand from the files written here (no run needed, except where stated)."""

from __future__ import annotations

import copy
import json
import multiprocessing as mp
import time

import pytest

from tessera_lab.errors import ConfigError, ProfileError
from tessera_lab.runner.launch.results import RunResult, check_profile_store, record_profile


def _job(name: str) -> dict:
    """A minimal job result with the fields the store records (hand-made)."""
    return {"name": name, "world": {"pp": 2, "ep": 1, "dp": 1}, "schedule": "1f1b", "boundaries": [0, 2, 4],
            "spec": {"model": {"num_layers": 4}, "microbatches": 4, "micro_batch_size": 1},
            "timing": {"durations": {"f": [0.01, 0.01], "b": [0.02, 0.02]}, "stages": [], "ranks": [],
                       "iteration": {"predicted_s": 0.1, "observed_s": 0.1}},
            "tokens_per_s": 100.0,
            "lifecycle": {"steps": [{"step": 0, "predicted": {"iteration": 0.1}, "observed": {"iteration": 0.11},
                                    "step_time_s": 0.12}]}}


def _append(path: str, name: str, barrier) -> None:
    barrier.wait()
    record_profile(path, RunResult([_job(name)], "gloo", {}))


def test_concurrent_store_appends_keep_every_run(tmp_path):
    """50 rounds of two processes appending to the same store at once (the project's writer): 100 entries."""
    path = str(tmp_path / "store.json")
    ctx = mp.get_context("fork")
    for r in range(50):
        barrier = ctx.Barrier(2)
        ps = [ctx.Process(target=_append, args=(path, f"r{r}-{i}", barrier)) for i in range(2)]
        for p in ps:
            p.start()
        for p in ps:
            p.join(60)
            assert p.exitcode == 0
    runs = check_profile_store(path)["runs"]
    assert len(runs) == 100
    assert sorted(x["job"] for x in runs) == sorted(f"r{r}-{i}" for r in range(50) for i in range(2))


BAD_STORES = {
    "runs a string": {"schema_version": 1, "kind": "runner_observations", "runs": "oops"},
    "runs missing": {"schema_version": 1, "kind": "runner_observations"},
    "garbage entry": {"schema_version": 1, "kind": "runner_observations", "runs": [1, "x"]},
    "entry without lifecycle": {"schema_version": 1, "kind": "runner_observations",
                                "runs": [{k: v for k, v in {"date": "d", "job": "j"}.items()}]},
    "observed a string": None,
}


@pytest.mark.parametrize("case", sorted(BAD_STORES))
def test_damaged_store_refused_before_the_run(case, tmp_path, capsys):
    from tessera_lab.cli.main import main

    store = tmp_path / "store.json"
    if BAD_STORES[case] is None:
        record_profile(store, RunResult([_job("ok")], "gloo", {}))
        data = json.loads(store.read_text())
        data["runs"][0]["lifecycle"]["steps"][0]["observed"]["iteration"] = "slow"
        store.write_text(json.dumps(data))
    else:
        store.write_text(json.dumps(BAD_STORES[case]))
    before = store.read_text()
    t0 = time.monotonic()
    rc = main(["run", "--profile-store", str(store), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "runner profile store" in err[0] and "field" in err[0], err
    assert not list((tmp_path / "out").glob("rank*.log")) if (tmp_path / "out").exists() else True
    assert time.monotonic() - t0 < 20
    assert store.read_text() == before  # never touched
    rc = main(["report", "--lifecycle", str(store)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "field" in err[0], err


def _runner_plan() -> dict:
    """A runner plan as plan --device writes it (fields the runner reads)."""
    return {"kind": "runner_plan", "schema_version": 1, "model": "tiny-runner",
            "model_config": {"num_layers": 4, "hidden_size": 32, "num_experts": 4, "top_k": 2, "seed": 0},
            "parallel": {"pp": 2, "ep": 2, "dp": 1, "microbatches": 4, "micro_batch_size": 1, "schedule": "1f1b",
                         "vpp": None},
            "boundaries": [0, 2, 4], "pair_exec": None, "pair_order": None,
            "costs": {"source": "calibrated device test"},
            "prediction": {"iteration_s": 0.3, "stage_f_s": [0.01, 0.01], "stage_b_s": [0.02, 0.02]},
            "predicted_at": "2026-01-01T00:00:00+00:00"}


TAMPER = {
    "microbatches 1e9": (lambda d: d["parallel"].update(microbatches=1e9), "parallel.microbatches"),
    "hidden_size 1e7": (lambda d: d["model_config"].update(hidden_size=10**7), "runner model parameters"),
    "microbatches 6000 x pp 2 x vpp 2": (lambda d: (d["parallel"].update(microbatches=6000, schedule="interleaved",
                                                                         vpp=2), d.update(boundaries=[0, 1, 2, 3, 4]),
                                                    d["prediction"].update(stage_f_s=[0.1] * 4, stage_b_s=[0.1] * 4)),
                                         "pp x vpp x microbatches = 2 x 2 x 6000"),
    "prediction a string": (lambda d: d["prediction"].update(iteration_s="1"), "prediction.iteration_s"),
    "prediction a list": (lambda d: d["prediction"].update(stage_f_s=[[0.1], 0.1]), "prediction.stage_f_s[0]"),
    "prediction zero": (lambda d: d["prediction"].update(iteration_s=0), "prediction.iteration_s"),
    "prediction negative": (lambda d: d["prediction"]["stage_b_s"].__setitem__(1, -0.5), "prediction.stage_b_s[1]"),
    "prediction per stage": (lambda d: d["prediction"].update(stage_f_s=[0.1]), "prediction.stage_f_s"),
    "fractional boundary": (lambda d: d.update(boundaries=[0, 2.5, 4]), "boundaries[1]"),
    "string boundary": (lambda d: d.update(boundaries=[0, "2", 4]), "boundaries[1]"),
    "boundaries past the model": (lambda d: d.update(boundaries=[0, 2, 6]), "boundaries"),
    "parallel a list": (lambda d: d.update(parallel=[2, 2]), "parallel"),
    "pp a string": (lambda d: d["parallel"].update(pp="2"), "parallel.pp"),
    "model_config a string": (lambda d: d.update(model_config="tiny"), "model_config"),
    "num_experts a list": (lambda d: d["model_config"].update(num_experts=[4]), "model_config.num_experts"),
    "kind changed": (lambda d: d.update(kind="plan"), "kind"),
    "kind removed": (lambda d: d.pop("kind"), "kind"),
    "schedule unknown": (lambda d: d["parallel"].update(schedule="fast"), "parallel.schedule"),
}


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_tampered_runner_plan_refused(case, tmp_path, capsys):
    from tessera_lab.cli.main import main

    plan = _runner_plan()
    change, field = TAMPER[case]
    change(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    t0 = time.monotonic()
    rc = main(["run", "--plan", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert field in err[0] and str(path) in err[0], err
    assert not (tmp_path / "out").exists()  # nothing started
    assert time.monotonic() - t0 < 20


@pytest.mark.parametrize("opts,flag", [(["--layers", "8"], "--layers"), (["--experts", "8"], "--experts"),
                                       (["--hidden", "64"], "--hidden"), (["--pp", "4"], "--pp")])
def test_runner_plan_conflicting_options(opts, flag, tmp_path, capsys):
    from tessera_lab.cli.main import main

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_runner_plan()))
    rc = main(["run", "--plan", str(path), *opts, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and flag in err[0] and "conflicts" in err[0], err


def test_partition_plan_layers_conflict(tmp_path, capsys):
    from tessera_lab.cli.main import main

    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"boundaries": [0, 3, 6]}))
    rc = main(["run", "--plan", str(path), "--layers", "4", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--layers = 4" in err[0] and "layer 6" in err[0], err


@pytest.mark.parametrize("content,field", [
    ({"jobs": "x"}, "jobs"),
    ({"jobs": [{"schedule": "1f1b"}]}, "jobs[0]"),
    ({"jobs": [1]}, "jobs[0]"),
    (None, "UTF-8"),
])
def test_report_observed_malformed(content, field, tmp_path, capsys):
    from tessera_lab.cli.main import main

    path = tmp_path / "run.json"
    if content is None:
        path.write_bytes(b'{"jobs": "\xff\xfe"}')
    else:
        path.write_text(json.dumps(content))
    rc = main(["report", "--observed", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and field in err[0], err


def test_schema_messages_name_file_field_and_range():
    from tessera_lab.schema import F, validate

    s = F("dict", fields={"a": F("list", items=F("int", low=1, high=8))})
    with pytest.raises(ConfigError, match=r"^f 'x': field 'a\[1\]' = 9 is out of range; allowed: an integer 1 to 8$"):
        validate({"a": [1, 9]}, s, "f 'x'")
    with pytest.raises(ConfigError, match=r"field 'a' is missing"):
        validate({}, s, "f 'x'")
    with pytest.raises(ProfileError, match=r"field 'a' = 'no' is not a list"):
        validate({"a": "no"}, s, "f 'x'", error=ProfileError)
    assert validate({"a": [1, 8.0]}, s, "f") == {"a": [1, 8.0]}
