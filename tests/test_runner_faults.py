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
    assert supervise.describe(causes[2], 4).endswith("the other 3 ranks were shut down because a peer failed")


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
        spawn(WorldSpec(pp=2, ep=2, timeout_s=60), [RunSpec(name="fault", steps=10_000)], out_dir=out,
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
    assert first.startswith(f"rank {rank} ") and "were shut down because a peer failed" in first
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


# ----------------------------------------------------------------------------------------------
# supervision for busy machines: checks before start, GPUs per rank, dynamic exit 3, temp folders
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["x:kill", "1:boom", "9:kill", "1:kill:-1", "1:kill:nan"])
def test_malformed_fault_env_fails_before_workers(value, tmp_path, capsys, monkeypatch):
    from tessera_lab.cli.main import main

    monkeypatch.setenv("TESSERA_LAB_FAULT", value)
    t0 = time.monotonic()
    rc = main(["run", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "TESSERA_LAB_FAULT" in err[0], err
    assert not list(tmp_path.glob("rank*.log"))
    assert time.monotonic() - t0 < 10


def test_nccl_more_ranks_than_gpus_is_one_line(tmp_path, capsys, monkeypatch):
    from tessera_lab.cli.main import main
    import importlib

    spawn_mod = importlib.import_module("tessera_lab.runner.launch.spawn")

    monkeypatch.setattr(spawn_mod, "gpu_count", lambda: 2)  # a fake machine with 2 GPUs
    rc = main(["run", "--backend", "nccl", "--pp", "2", "--ep", "2", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "4 ranks" in err[0] and "2 visible GPUs" in err[0], err
    assert not list(tmp_path.glob("rank*.log"))


def test_gpu_count_honours_cuda_visible_devices(monkeypatch, tmp_path):
    import importlib

    spawn_mod = importlib.import_module("tessera_lab.runner.launch.spawn")

    class FakeDev:
        def __init__(self, names):
            self.names = names

        def glob(self, pattern):
            return [tmp_path / n for n in self.names]

    monkeypatch.setattr(spawn_mod, "Path", lambda p: FakeDev(["nvidia0", "nvidia1", "nvidia2", "nvidiactl",
                                                             "nvidia-uvm"]) if p == "/dev" else tmp_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert spawn_mod.gpu_count() == 3  # nvidiactl / nvidia-uvm are not devices
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    assert spawn_mod.gpu_count() == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert spawn_mod.gpu_count() == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,0")  # CUDA stops at the first invalid entry
    assert spawn_mod.gpu_count() == 1


def test_busy_hint():
    assert supervise.busy_hint(cores=2, load=1.5) == ""
    hint = supervise.busy_hint(cores=2, load=9.0)
    assert "busy" in hint and "9.0 on 2 cores" in hint and "TESSERA_LAB_HEARTBEAT_TIMEOUT" in hint


@pytest.mark.slow
def test_dynamic_peer_failure_exit_3_and_temp_folder_policy(tmp_path, capsys, monkeypatch):
    """--dynamic exits 3 on a failed rank (the folder is kept and named); a successful run leaves no temp folder."""
    import tempfile

    from tessera_lab.cli.main import main

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TESSERA_LAB_FAULT", "1:raise:0.2")
    rc = main(["run", "--pp", "2", "--ep", "1", "--steps", "10000", "--dynamic", "--trials", "1",
               "--schedule", "zb-h1"])
    err = capsys.readouterr().err
    assert rc == 3 and err.splitlines()[0].startswith("tessera-lab run: error: rank 1 failed with exit status 1"), err
    kept = list(tmp_path.glob("tessera-run-*"))
    assert len(kept) == 1 and str(kept[0]) in err
    monkeypatch.delenv("TESSERA_LAB_FAULT")
    rc = main(["run", "--pp", "2", "--ep", "1", "--steps", "1"])
    assert rc == 0
    assert list(tmp_path.glob("tessera-run-*")) == kept  # the successful run's folder is gone


@pytest.mark.slow
def test_raise_fault_with_sigint_ignored(tmp_path):
    """The raise fault does not depend on SIGINT's disposition (background jobs from a shell ignore it)."""
    import os
    import signal
    import subprocess
    import sys

    env = dict(os.environ, TESSERA_LAB_FAULT="0:raise:0.2")
    p = subprocess.run([sys.executable, "-m", "tessera_lab", "run", "--pp", "2", "--ep", "1", "--steps", "10000",
                        "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert p.returncode == 3, p.stderr
    assert "rank 0 failed with exit status 1" in p.stderr.splitlines()[0]
    assert "FaultInjected" in (tmp_path / "rank0.log").read_text()


@pytest.mark.slow
def test_hang_error_carries_the_python_stack(tmp_path):
    err = _launch("hang", 1, tmp_path)
    text = str(err)
    assert err.failed_rank == 1 and "(stopped)" in text.splitlines()[0]
    assert "Python stack of rank 1 when it was declared hung" in text and 'File "' in text


# ----------------------------------------------------------------------------------------------
# start-up: a rank that never reports ready
# ----------------------------------------------------------------------------------------------


def test_startup_deadline_is_sized_from_the_ranks_that_reported():
    # nothing measured yet: no deadline (only --timeout); then 3 x the slowest report, never under the floor
    assert supervise.startup_deadline([], 30.0) is None
    assert supervise.startup_deadline([4.0, 5.5, 5.0], 30.0) == 30.0  # 3 x 5.5 = 16.5 < floor
    assert supervise.startup_deadline([4.0, 12.5], 30.0) == 37.5  # 3 x 12.5
    assert parse_fault("1:start-hang:0.5") == (1, "start-hang", 0.5)
    assert parse_fault("2:start-block") == (2, "start-block", 1.0)


@pytest.mark.parametrize("value", ["0", "nan", "x"])
def test_malformed_startup_floor_fails_before_workers(value, tmp_path, capsys, monkeypatch):
    from tessera_lab.cli.main import main

    monkeypatch.setenv("TESSERA_LAB_STARTUP_FLOOR", value)
    rc = main(["run", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "TESSERA_LAB_STARTUP_FLOOR" in err[0], err
    assert not list(tmp_path.glob("rank*.log"))


@pytest.mark.slow
@pytest.mark.parametrize("rank", [1, 2])
def test_rank_stopped_before_ready_is_named_with_its_deadline(rank, tmp_path):
    """SIGSTOP 1 s after the worker started (before it imported torch): the stopped rank is named, not the peer
    that times out waiting for it in the rendezvous, within the stated bound; the deadline is printed."""
    with pytest.raises(RunnerError) as info:
        spawn(WorldSpec(pp=2, ep=2, timeout_s=60), [RunSpec(name="fault", steps=10_000)], out_dir=tmp_path,
              timeout_s=300, env={"TESSERA_LAB_FAULT": f"{rank}:start-hang:1"})
    err = info.value
    injected = json.loads((tmp_path / f"fault-{rank}.json").read_text())["time"]
    first = str(err).splitlines()[0]
    assert err.peer_failed and err.failed_rank == rank, first
    assert first.startswith(f"rank {rank} was stopped (process state T) before it reported") and "start-up deadline" in first
    assert not (tmp_path / f"ready-{rank}").exists()
    assert err.detected_at - injected < supervise.STARTUP_DETECT_BOUND_S
    assert "Python stack of rank" in str(err)
    assert not any(_alive(p) for p in err.pids.values())


@pytest.mark.slow
def test_rank_blocked_before_ready_is_named_at_its_startup_deadline(tmp_path):
    """A rank whose main thread blocks after importing torch (its heartbeat goes on): named when its start-up
    deadline, max(floor, 3 x the slowest peer's import), has passed; the peers waiting for it are not blamed."""
    with pytest.raises(RunnerError) as info:
        spawn(WorldSpec(pp=2, ep=2, timeout_s=120), [RunSpec(name="fault", steps=10_000)], out_dir=tmp_path,
              timeout_s=300, env={"TESSERA_LAB_FAULT": "3:start-block", "TESSERA_LAB_STARTUP_FLOOR": "3"})
    err = info.value
    first = str(err).splitlines()[0]
    assert err.failed_rank == 3 and "did not report that it had imported torch" in first, first
    assert "start-up deadline" in first and "the slowest of the 3 ranks that did" in first
    assert "start_checkpoint" in str(err)  # its Python stack shows where it blocked


def test_busy_allowance_scales_with_oversubscription():
    # a starved rank on a machine at load L on C cores gets about C / L of a core: its silence may last L / C times
    # longer before it is called hung (BUSY_FACTOR x the timeout on an idle machine)
    assert supervise.busy_allowance(5.0, cores=2, load=1.5) == supervise.BUSY_FACTOR * 5.0
    assert supervise.busy_allowance(5.0, cores=2, load=9.0) == supervise.BUSY_FACTOR * 5.0 * 4.5
    assert supervise.busy_allowance(30.0, cores=4, load=0.0) == supervise.BUSY_FACTOR * 30.0


def test_heartbeat_goes_through_a_pipe_not_the_disk(tmp_path, monkeypatch):
    # the worker beats into the pipe the spawner passed (no file under out/); the watch drains it and times the beat
    import os
    import time

    from tessera_lab.runner.launch import spawn as spawn_mod

    rfd, wfd = os.pipe()
    os.set_blocking(rfd, False)
    monkeypatch.setenv(supervise.HEARTBEAT_FD_ENV, str(wfd))
    watch = spawn_mod._Watch([], tmp_path, 5.0, 30.0, 60.0)
    watch.spawned[0] = time.time() - 100.0
    watch.beats[0] = rfd
    assert watch._silent(0) >= 99.0  # nothing beat yet: silent since the spawn
    supervise.start_heartbeat(str(tmp_path), 0)
    deadline = time.monotonic() + 30
    while watch._silent(0) > 1.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watch._silent(0) <= 1.0
    assert not list(tmp_path.glob("hb-*"))


def test_a_stopped_rank_gets_no_only_slow_hint(tmp_path, monkeypatch):
    # a rank in process state T was stopped, not starved: the busy-machine hint ("if this rank was only slow")
    # goes with a silent rank that was running, never with a stopped one
    import time

    from tessera_lab.runner.launch import spawn as spawn_mod

    monkeypatch.setattr(spawn_mod, "busy_hint", lambda: "the machine is busy (test)")
    logs = {r: str(tmp_path / f"rank{r}.log") for r in range(2)}
    for path in logs.values():
        open(path, "w").close()
    texts = {}
    for state in ("T", "R"):
        watch = spawn_mod._Watch([], tmp_path, 5.0, 30.0, 60.0)
        watch.codes = {0: -9, 1: -9}
        watch.causes = [supervise.Cause(1, "heartbeat", time.time(), silent_s=5.0, state=state)]
        texts[state] = str(spawn_mod._failure(watch, tmp_path, logs, {0: 1, 1: 2}, 2))
    assert "machine is busy" not in texts["T"] and "machine is busy" in texts["R"]


def test_a_deep_stack_quote_keeps_the_projects_frames():
    # a rank hung inside an import: the innermost 40+ frames are importlib's; the error still names where in the
    # job it was (its tessera_lab frames), after the count of the lines left out
    from tessera_lab.runner.launch.spawn import STACK_QUOTE_LINES, _quote_stack

    main = (["Current thread 0x1 (most recent call first):"]
            + [f'  File "<frozen importlib._bootstrap>", line {i} in _call' for i in range(60)]
            + ['  File "/x/tessera_lab/runner/runtime/train.py", line 91 in run_jobs',
               '  File "/x/tessera_lab/runner/launch/worker.py", line 113 in run_worker'])
    beat = ["Thread 0x2 (most recent call first):", '  File "/x/tessera_lab/runner/launch/supervise.py", line 9 in loop']
    text = "\n".join(beat) + "\n\n" + "\n".join(main)  # faulthandler: newest thread (the beat) first
    out = _quote_stack(text).splitlines()
    assert out[0].startswith("Current thread") and len(out) == STACK_QUOTE_LINES + 3
    assert out[STACK_QUOTE_LINES].startswith("... (") and "frames in tessera_lab" in out[STACK_QUOTE_LINES]
    assert out[-2:] == main[-2:]
    short = "Current thread 0x1 (most recent call first):\n  File \"a.py\", line 1 in f"
    assert _quote_stack(short) == short


def test_run_header_names_the_steps_its_tokens_per_s_is_over():
    # results._observed_steps: steps 1.. when there are several (step 0 warms up), else step 0
    from tessera_lab.runner.launch.launch import _steps_text
    from tessera_lab.runner.launch.results import _observed_steps

    assert _observed_steps(3) == [1, 2] and _steps_text(3) == "median step wall of steps 1-2; step 0 (warm-up) left out"
    assert _observed_steps(2) == [1] and _steps_text(2).startswith("median step wall of step 1;")
    assert _observed_steps(1) == [0] and "step 0, warm-up included" in _steps_text(1)
