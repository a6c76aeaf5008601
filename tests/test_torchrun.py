"""torchrun as the launcher: ``python -m torch.distributed.run ... -m tessera_lab.runner [run options]`` runs the job
``tessera-lab run`` runs (same losses, bitwise, on CPU with gloo), standalone and as two "nodes" on one machine
with a c10d rendezvous, and a failing rank is reported by torchelastic as the root cause with its exception."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
JOB = ["--pp", "2", "--ep", "1", "--schedule", "1f1b", "-m", "4", "--steps", "1", "--backend", "gloo"]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(path: Path) -> list[float]:
    return json.loads(path.read_text())["jobs"][0]["losses"]


@pytest.fixture(scope="module")
def run_losses(tmp_path_factory) -> list[float]:
    """The same job through ``tessera-lab run`` (the local spawner): the peer the launches are compared with."""
    out = tmp_path_factory.mktemp("run") / "run.json"
    proc = subprocess.run([sys.executable, "-m", "tessera_lab", "run", *JOB, "--json", str(out)], env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _losses(out)


def test_torchrun_standalone_runs_the_same_job(tmp_path, run_losses):
    out = tmp_path / "torchrun.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tessera_lab.runner", *JOB, "--json", str(out)], env=_env(), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["backend"] == "gloo" and res["world"]["pp"] == 2
    assert _losses(out) == run_losses  # bitwise: the same deterministic job


def test_two_nodes_on_one_machine_with_a_c10d_rendezvous(tmp_path, run_losses):
    """Two torchrun agents, one process each, meeting at a c10d rendezvous on 127.0.0.1 (``--nnodes 2``): global
    ranks from the rendezvous, rank 0 (on whichever node got it) writes the result."""
    port = _free_port()
    outs = [tmp_path / f"node{i}.json" for i in range(2)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "tessera-test",
           "--max-restarts", "0", "-m", "tessera_lab.runner", *JOB]
    procs = [subprocess.Popen(cmd + ["--json", str(o)], env=_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for o in outs]
    try:
        done = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [e[-3000:] for _, e in done]
    written = [o for o in outs if o.exists()]
    assert len(written) == 1  # only global rank 0 writes
    assert _losses(written[0]) == run_losses


def test_a_failing_rank_is_torchelastics_root_cause(tmp_path):
    """An injected fault on rank 1: torchrun exits non-zero and reports rank 1 with its exception, recorded by
    torchelastic's ``record`` in the rank's error file. Torchelastic's root cause is the failure with the smallest
    timestamp, in whole seconds (torch 2.13 ``elastic/multiprocessing/errors/__init__.py``, ``ProcessFailure``): the
    peer that fails on the closed connection in the same second may be listed first, so rank 1's report is looked
    for among the failures, and it is the root cause unless the root cause's second is the same."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tessera_lab.runner", *JOB, "--fault-rank", "1", "--collective-timeout", "30"],
                          env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    report = proc.stderr[proc.stderr.index("Failures:"):] if "Failures:" in proc.stderr else proc.stderr
    blocks = [b for b in report.split("\n[") if "rank      : 1 (local_rank: 1)" in b]
    assert blocks, proc.stderr[-3000:]
    assert "injected fault on rank 1 at step 0" in blocks[0] and "error_file: <N/A>" not in blocks[0]
    root = proc.stderr.split("Root Cause (first observed failure):", 1)[1]
    if "rank      : 1 (local_rank: 1)" not in root:  # a tie on the second: both failures in the same second
        stamp = lambda text: text.split("time      : ", 1)[1].split("\n", 1)[0]  # noqa: E731
        assert stamp(root) == stamp(blocks[0]), (root[:400], blocks[0][:400])
