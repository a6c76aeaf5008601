"""``python -m tessera_lab.runner`` (the torchrun entry) refuses a bad rendezvous environment and bad options in
one line with exit 2, before any process group exists (no traceback, no wait on a rendezvous)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera_lab.errors import ConfigError
from tessera_lab.runner.launch.worker import check_rendezvous_env

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("change, words", [
    ({"MASTER_ADDR": None}, "MASTER_ADDR = None"), ({"MASTER_ADDR": ""}, "MASTER_ADDR = ''"),
    ({"MASTER_PORT": None}, "MASTER_PORT = None"), ({"MASTER_PORT": "x"}, "MASTER_PORT = 'x'"),
    ({"MASTER_PORT": "0"}, "1..65535"), ({"MASTER_PORT": "65536"}, "1..65535"),
    ({"LOCAL_RANK": "x"}, "LOCAL_RANK = 'x'"), ({"LOCAL_RANK": "-1"}, "LOCAL_RANK = '-1'"),
])
def test_rendezvous_env_refused(monkeypatch, change, words):
    for k, v in {**GOOD, **change}.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(".", r"\.")):
        check_rendezvous_env(0, 4)


@pytest.mark.parametrize("rank", [-1, 4, 9])
def test_rank_outside_world_refused(monkeypatch, rank):
    for k, v in GOOD.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=r"RANK = %d is outside 0\.\.WORLD_SIZE-1 = 0\.\.3" % rank):
        check_rendezvous_env(rank, 4)


def test_good_env_passes(monkeypatch):
    for k, v in GOOD.items():
        monkeypatch.setenv(k, v)
    check_rendezvous_env(3, 4)  # the last rank of four
    monkeypatch.delenv("LOCAL_RANK")
    check_rendezvous_env(0, 4)  # LOCAL_RANK is optional (the rank is used)


def _entry(args: list[str], env_change: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in GOOD}
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: v for k, v in env_change.items() if v is not None})
    return subprocess.run([sys.executable, "-m", "tessera_lab.runner", *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, env_change, words", [
    ([], {**GOOD, "MASTER_ADDR": None}, "MASTER_ADDR"),  # torch's env:// rendezvous raised a ValueError traceback
    ([], {**GOOD, "RANK": "4"}, "RANK = 4"),
    (["--pp", "x"], {}, "argument --pp"),  # argparse's multi-line usage before
])
def test_entry_refuses_in_one_line(args, env_change, words):
    r = _entry(args, env_change)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr, r.stderr
