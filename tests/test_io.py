"""Safe writes and checked JSON reads (tessera_lab.io): special files survive, symlinks are written through,
interrupted writes leave nothing behind after the next write, permissions follow the umask, errors name the
user's path; read_json refuses binary, non-UTF-8, deep, huge and non-finite input with one line."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tessera_lab.cli.main import main
from tessera_lab.errors import ConfigError, OutputError
from tessera_lab.io import atomic_write_bytes, atomic_write_text, read_json, save_figure, write_json

ROOT = Path(__file__).resolve().parents[1]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a character device needs root")


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@needs_root
def test_private_character_device_survives_a_write(tmp_path):
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a private /dev/null
    atomic_write_text(node, "hello\n")
    write_json(node, {"a": 1})
    assert stat.S_ISCHR(node.stat().st_mode)
    assert node.stat().st_rdev == os.makedev(1, 3)
    assert _temps(tmp_path) == []


@needs_root
def test_cli_json_to_a_private_device_node_keeps_it(tmp_path, capsys):
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert main(["params", "qwen3-8b", "--json", str(node)]) == 0
    assert stat.S_ISCHR(os.lstat(node).st_mode)


def test_cli_json_dev_null_leaves_a_character_device(capsys):
    assert main(["plan", "--pp", "4", "-m", "8", "--json", "/dev/null"]) == 0  # a JSON path that is not a regular file
    st = os.lstat("/dev/null")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)


def test_symlink_is_written_through(tmp_path, capsys):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target.name)  # relative link
    assert main(["params", "qwen3-8b", "--json", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == "real.json"
    assert json.loads(target.read_text())["model"] == "qwen3-8b"
    assert _temps(tmp_path) == []


def test_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "sub" / "new.txt")
    atomic_write_text(link, "x")
    assert link.is_symlink() and (tmp_path / "sub" / "new.txt").read_text() == "x"


def test_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    atomic_write_bytes(fifo, b"through the pipe")
    reader.join(10)
    assert got == [b"through the pipe"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_dev_stdout_is_written_not_replaced(tmp_path):
    code = "from tessera_lab.io import write_json; write_json('/dev/stdout', {'k': 3})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"k": 3}


def test_permissions_follow_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    old = os.umask(0o022)
    try:
        p = atomic_write_text(tmp_path / "new.txt", "x")
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
        os.umask(0o077)
        q = atomic_write_text(tmp_path / "private.txt", "x")
        assert stat.S_IMODE(q.stat().st_mode) == 0o600
        os.chmod(p, 0o640)
        atomic_write_text(p, "y")
        assert stat.S_IMODE(p.stat().st_mode) == 0o640 and p.read_text() == "y"
    finally:
        os.umask(old)


def test_trace_and_figure_files_are_not_0600(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        trace, plot = tmp_path / "t.json", tmp_path / "g.png"
        assert main(["simulate", "--stages", "2", "--microbatches", "4", "--f", "1", "--b", "2",
                     "--trace", str(trace), "--plot", str(plot)]) == 0
        err = capsys.readouterr().err
        assert str(plot) in err and str(trace) in err  # the paths of written files are printed
        for p in (trace, plot):
            assert stat.S_IMODE(p.stat().st_mode) == 0o644
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        os.umask(old)


def test_long_valid_name_works(tmp_path):
    name = "n" * 245 + ".json"  # 250 characters: valid on every common file system (limit 255)
    p = atomic_write_text(tmp_path / name, "{}")
    assert p.read_text() == "{}" and _temps(tmp_path) == []


def test_errors_name_the_users_path_not_the_temp_file(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    try:
        if os.geteuid() == 0:  # root ignores folder permissions: use a path whose parent cannot exist
            bad = Path("/proc/version/x.json")
        else:
            bad = locked / "out.json"
        with pytest.raises(OutputError) as exc:
            atomic_write_text(bad, "x")
        assert str(bad) in str(exc.value) and ".tmp" not in str(exc.value)
        assert main(["models", "--json", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(bad) in err[0] and ".tmp" not in err[0]
    finally:
        os.chmod(locked, 0o700)


def test_readonly_file_system_error_names_path(tmp_path):
    with pytest.raises(OutputError) as exc:
        atomic_write_text("/proc/self/status", "x")  # written in place, refused by the kernel
    assert "/proc/self/status" in str(exc.value)


_WRITER = """
import sys, time
from tessera_lab import io
real_write = io.os.write
def slow(fd, data):
    n = real_write(fd, bytes(data[:1024]))
    sys.stdout.write("writing\\n"); sys.stdout.flush()
    time.sleep(0.05)
    return n
io.os.write = slow
io.atomic_write_bytes(sys.argv[1], b"x" * 10_000_000)
"""


def test_interrupted_write_leaves_no_temp_after_the_next_write(tmp_path):
    target = tmp_path / "out.json"
    target.write_text('{"old": true}')
    for _ in range(2):  # two killed writers
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.stdout.readline() == b"writing\n"  # mid-write
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    assert len(_temps(tmp_path)) == 1  # the last killed writer's temp (the second writer removed the first's)
    assert json.loads(target.read_text()) == {"old": True}  # never a partial file
    # a legacy mkstemp-named leftover of an older version is cleaned too
    (tmp_path / ".out.json.abcd1234.tmp").write_text("partial")
    write_json(target, {"new": 1})
    assert json.loads(target.read_text()) == {"new": 1}
    assert _temps(tmp_path) == []


def test_a_live_writers_temp_is_left_alone(tmp_path):
    from tessera_lab.io import _tmp_prefix

    target = tmp_path / "f.txt"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        live = tmp_path / f"{_tmp_prefix(target.name)}{sleeper.pid}.abcdef.tmp"
        live.write_text("in progress")
        atomic_write_text(target, "x")
        assert live.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    atomic_write_text(target, "y")
    assert not live.exists()


def test_closed_stdout_gives_one_line_and_no_traceback():
    code = "import sys; from tessera_lab.cli.main import main; sys.exit(main(['models']))"
    r = subprocess.run(f"{sys.executable} -c \"{code}\" >&-", shell=True, capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "standard output is closed" in r.stderr


def test_broken_pipe_gives_no_traceback():
    code = "import sys; from tessera_lab.cli.main import main; sys.exit(main(['plan', '--pp', '4']))"
    r = subprocess.run(f"{sys.executable} -c \"{code}\" | head -c 10 >/dev/null", shell=True,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "Traceback" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_save_figure_to_a_symlink(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    (tmp_path / "real.svg").write_text("")
    link = tmp_path / "fig.svg"
    link.symlink_to("real.svg")
    save_figure(fig, link)
    plt.close(fig)
    assert link.is_symlink() and (tmp_path / "real.svg").read_text().lstrip().startswith("<?xml")


# ------------------------------------------------------------------------------------------ read_json
@pytest.mark.parametrize("content, words", [
    (b"\x89PNG\r\n\x1a\n\x00\x00", "binary"),
    ('{"a": "caf\xe9"}'.encode("latin-1"), "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
    (b"[" * 70 + b"]" * 70, "nested deeper"),
    (b'{"hidden_size": NaN}', "hidden_size"),
    (b'{"a": {"b": [1, Infinity]}}', "a.b[1]"),
    (b'{"x": 1e400}', "not a finite number"),
    (b'{"x": ' + b"1" * 5000 + b"}", "not valid JSON"),
    (b"{", "not valid JSON"),
    (b"   ", "empty"),
])
def test_read_json_refuses_bad_files_with_one_line(tmp_path, content, words):
    f = tmp_path / "c.json"
    f.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        read_json(f, "config file")
    msg = str(exc.value)
    assert words in msg and str(f) in msg and "\n" not in msg


def test_read_json_size_limit_and_bom(tmp_path, monkeypatch):
    f = tmp_path / "c.json"
    f.write_bytes(b"\xef\xbb\xbf" + json.dumps({"a": [1] * 100}).encode())
    assert read_json(f)["a"][0] == 1
    monkeypatch.setenv("TESSERA_LAB_MAX_JSON_BYTES", "50")
    with pytest.raises(ConfigError, match="larger than 50 bytes.*TESSERA_LAB_MAX_JSON_BYTES"):
        read_json(f)
    with pytest.raises(ConfigError, match="does not exist"):
        read_json(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="is a folder"):
        read_json(tmp_path)


def test_regular_files_under_dev_shm_are_still_created(tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    p = shm / f"tessera-io-test-{os.getpid()}.json"
    try:
        atomic_write_text(p, "{}")
        assert p.read_text() == "{}" and stat.S_ISREG(p.stat().st_mode)
    finally:
        p.unlink(missing_ok=True)


def test_folder_without_create_permission_falls_back_to_writing_the_file(tmp_path, monkeypatch):
    import errno

    from tessera_lab import io as tio

    target = tmp_path / "out.json"
    target.write_text("old")
    real_open = os.open

    def no_temp(path, flags, mode=0o777, **kw):
        if str(path).endswith(".tmp"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(tio.os, "open", no_temp)
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    with pytest.raises(OutputError) as exc:  # a new file in such a folder cannot be made: the error names it
        atomic_write_text(tmp_path / "fresh.json", "x")
    assert "fresh.json" in str(exc.value) and ".tmp" not in str(exc.value)
