"""Runner faults: a killed, hung or raising rank is named as the root cause within the stated time, every process
exits, and ``tessera-lab run`` exits 3 ("peer failed"); bad ``run`` inputs fail with one line and exit 2 before any
worker starts. Faults are injected with ``TESSERA_LAB_FAULT=RANK:KIND:DELAY`` (see tessera_lab.runner.launch.supervise);
``benchmarks/runner_faults.py --trials 20`` gives the 20-trial figures."""

from __future__ import annotations

import json
import time

import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.runner.launch import supervise
from tessera_lab.runner.launch.spawn import _alive, _has_gpu, spawn
from tessera_lab.runner.runtime.specs import RunnerError, RunSpec, WorldSpec
from tessera_lab.runner.launch.supervise import Cause, parse_fault, root_cause


# ----------------------------------------------------------------------------------------------
# pure parts
# ----------------------------------------------------------------------------------------------


def test_root_cause_prefers_signal_and_heartbeat_over_later_records():
    # hand example: rank 2 SIGKILLed at t=10 (no record); ranks 0 and 3 then record failures at 10.2 and 10.1
    # and are observed first (polled before the killed one); the killed rank is the root cause
    causes = [Cause(0, "exit", 10.3, code=1), Cause(3, "exit", 10.3, code=1), Cause(2, "signal", 10.35, code=-9)]
    assert root_cause(causes, {0: 10.2, 3: 10.1}).rank == 2
    # only recorded exits: the earliest record wins, not the first observed
    assert root_cause(causes[:2], {0: 10.2, 3: 10.1}).rank == 3
    # a lost heartbeat (last beat at t=5) beats a signal death that came later (peer torn down at t=9)
    assert root_cause([Cause(0, "signal", 9.0, code=-15), Cause(1, "heartbeat", 5.0, silent_s=5)], {}).rank == 1
    assert "signal 9 (SIGKILL)" in causes[2].how()
    assert "no heartbeat for 5.0 s" in Cause(1, "heartbeat", 5.0, silent_s=5).how()
    assert supervise.describe(causes[2], 4).endswith("the other 3 ranks were stopped because a peer failed")


def test_parse_fault():
    assert parse_fault(None) is None and parse_fault("") is None
    assert parse_fault("1:kill") == (1, "kill", 1.0)
    assert parse_fault("3:hang:0.5") == (3, "hang", 0.5)
    for bad in ["x:kill", "1:explode", "1:kill:nan", "-1:kill", "1:kill:-2", "1", "1:kill:1:2"]:
        with pytest.raises(ConfigError, match="TESSERA_LAB_FAULT"):
            parse_fault(bad)


def test_heartbeat_timeout_env(monkeypatch):
    monkeypatch.delenv("TESSERA_LAB_HEARTBEAT_TIMEOUT", raising=False)
    assert supervise.heartbeat_timeout() == supervise.HEARTBEAT_TIMEOUT_S
    monkeypatch.setenv("TESSERA_LAB_HEARTBEAT_TIMEOUT", "3")
    assert supervise.heartbeat_timeout() == 3.0
    for bad in ["nan", "0", "abc", "inf"]:
        monkeypatch.setenv("TESSERA_LAB_HEARTBEAT_TIMEOUT", bad)
        with pytest.raises(ConfigError, match="TESSERA_LAB_HEARTBEAT_TIMEOUT"):
            supervise.heartbeat_timeout()


# ----------------------------------------------------------------------------------------------
# bad run inputs: one line, exit 2, no worker started
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "0", "-1", "inf"])
def test_run_timeout_out_of_range_fails_before_workers(value, tmp_path, capsys):
    from tessera_lab.cli.main import main

    t0 = time.monotonic()
    rc = main(["run", "--timeout", value, "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--timeout" in err[0], err
    assert not list(tmp_path.glob("rank*.log"))  # no worker was started
    assert time.monotonic() - t0 < 10


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU")
def test_run_nccl_without_gpu_is_one_line(tmp_path, capsys):
    from tessera_lab.cli.main import main

    rc = main(["run", "--backend", "nccl", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nccl" in err[0] and "GPU" in err[0], err
    assert not list(tmp_path.glob("rank*.log"))


# ----------------------------------------------------------------------------------------------
# injected faults (2 trials each of kill and hang, on different ranks)
# ----------------------------------------------------------------------------------------------


def _launch(kind: str, rank: int, out) -> RunnerError:
    with pytest.raises(RunnerError) as info:
        spawn(WorldSpec(pp=2, ep=2, timeout_s=60, grace_s=10), [RunSpec(name="fault", steps=10_000)], out_dir=out,
              timeout_s=200, env={"TESSERA_LAB_FAULT": f"{rank}:{kind}:0.5"})
    return info.value


@pytest.mark.slow
@pytest.mark.parametrize("kind,rank", [("kill", 1), ("kill", 2), ("hang", 0), ("hang", 3)])
def test_fault_is_named_within_bound(kind, rank, tmp_path):
    err = _launch(kind, rank, tmp_path)
    injected = json.loads((tmp_path / f"fault-{rank}.json").read_text())["time"]
    detect = err.detected_at - injected
    assert err.peer_failed and err.failed_rank == rank, str(err)
    first = str(err).splitlines()[0]
    assert first.startswith(f"rank {rank} ") and "were stopped because a peer failed" in first
    if kind == "kill":
        assert err.exit_codes[rank] == -9 and "killed by signal 9" in first
        assert detect < 2.0, detect  # exit status polled every 50 ms
    else:
        assert "no heartbeat" in first
        # a stopped rank beats for the last time <= one beat before the fault; declared after the timeout
        assert supervise.HEARTBEAT_TIMEOUT_S - supervise.HEARTBEAT_S - 0.5 < detect < supervise.DETECT_BOUND_S, detect
    assert not any(_alive(p) for p in err.pids.values())  # no orphans


@pytest.mark.slow
def test_cli_peer_failure_exit_code_3(tmp_path, capsys, monkeypatch):
    from tessera_lab.cli.main import main

    monkeypatch.setenv("TESSERA_LAB_FAULT", "3:kill:0.5")
    rc = main(["run", "--steps", "10000", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == supervise.EXIT_PEER_FAILED == 3
    assert "rank 3 was killed by signal 9 (SIGKILL)" in err.splitlines()[0]
