"""Safe file writes and checked JSON reads shared by the CLI, the profile store, plan exports and figures.

Writes (:func:`atomic_write_bytes`, :func:`atomic_write_text`, :func:`write_json`, :func:`save_figure`):

- a regular file (or a path that does not exist yet) is replaced atomically: a short-named temporary file in the
  same folder, fsync, ``os.replace``; a reader sees the old file or the new one, never a partial write;
- a symlink is resolved and its target is written (the link stays a link);
- anything else that exists (a character device such as ``/dev/null``, a FIFO, a socket), ``/dev/stdout``,
  ``/dev/stderr``, ``/dev/fd/N`` and paths under ``/proc/`` are written in place, never replaced;
- temporary files left by an interrupted write of the same file (a killed process) are removed by the next write;
- new files get the permissions a plain ``open()`` gives (``0o666`` minus the umask); a replaced file keeps its mode;
- errors raise :class:`~tessera_lab.errors.OutputError` naming the user's path, never the temporary file.

Several files of one output (:func:`staged_folder`): written into a temporary folder beside the target folder and
moved into it at the end; on failure the temporary folder is removed and nothing new is left.

Reads (:func:`read_json`): UTF-8 JSON with one-line errors (naming the file) for a missing, unreadable, binary,
non-UTF-8, oversized, too deeply nested or malformed file, and for non-finite numbers (``NaN``, ``Infinity``,
``1e400``), which are refused wherever they appear (field path in the message).
"""

from __future__ import annotations

import errno as _errno
import hashlib
import io as _io
import json
import math
import os
import re
import stat
import sys
import time
from pathlib import Path
from typing import Any

from tessera_lab.errors import ConfigError, OutputError

__all__ = ["atomic_write_bytes", "atomic_write_text", "dumps", "write_json", "save_figure", "read_json", "staged_folder",
           "MAX_JSON_BYTES", "MAX_JSON_DEPTH"]

#: files read by :func:`read_json` larger than this are refused (bytes; ``TESSERA_LAB_MAX_JSON_BYTES`` raises it)
MAX_JSON_BYTES = 64 * 2**20
#: deepest nesting of arrays/objects :func:`read_json` accepts
MAX_JSON_DEPTH = 64
#: a temporary file older than this (seconds) is removed even if its writer's pid is alive (pid reuse)
_STALE_TMP_S = 3600.0
#: characters of the target's name kept in the temporary name (so a 250-character name stays valid)
_NAME_KEEP = 32
#: paths always written in place: the process's own file descriptors and /proc (never a temp file beside them)
_IN_PLACE_ROOTS = ("/proc/", "/dev/fd/")
_IN_PLACE_PATHS = ("/dev/stdout", "/dev/stderr", "/dev/tty")


# ---------------------------------------------------------------------------------------------- writes
def _tmp_prefix(name: str) -> str:
    """The part of a temporary name that identifies its target: a short readable head and a hash of the name."""
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:10]
    return f".{name[:_NAME_KEEP]}.{digest}."


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # our own leftover (an interrupted write in this process already unwound)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


def _remove_stale_temps(folder: Path, name: str) -> None:
    """Remove temporary files of earlier interrupted writes of ``folder/name``: ours (``.HEAD.HASH.PID.RAND.tmp``,
    writer gone or older than an hour) and the previous scheme's (``.NAME.XXXXXXXX.tmp`` from ``mkstemp``)."""
    prefix = _tmp_prefix(name)
    legacy = re.compile(r"^\.?" + re.escape(name) + r"\.[A-Za-z0-9_]{8}\.tmp$")
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if not entry.endswith(".tmp"):
            continue
        if entry.startswith(prefix):
            parts = entry[len(prefix):].split(".")
            try:
                pid = int(parts[0])
            except (ValueError, IndexError):
                continue
            full = folder / entry
            try:
                old = now - full.lstat().st_mtime > _STALE_TMP_S
            except OSError:
                continue
            if old or not _pid_alive(pid):
                _unlink_quietly(full)
        elif legacy.match(entry):
            _unlink_quietly(folder / entry)


def _unlink_quietly(path: Path | str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _error(exc: OSError, path: Path | str, verb: str = "write") -> OutputError:
    reason = exc.strerror or str(exc)
    return OutputError(exc.errno, f"cannot {verb} '{path}': {reason}", str(path))


def _write_in_place(path: str, data: bytes) -> None:
    """Write to an existing non-regular file (device, FIFO, /dev/stdout): open it for writing, never replace it."""
    flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            flags |= os.O_TRUNC  # e.g. /dev/stdout redirected to a file: overwrite it as the shell would
    except OSError:
        pass
    fd = os.open(path, flags)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)


def _destination(path: Path) -> tuple[str, bool]:
    """``(where to write, in place?)`` for the user's ``path``."""
    text = os.fspath(path)
    absolute = os.path.abspath(text)
    if absolute.startswith(_IN_PLACE_ROOTS) or absolute in _IN_PLACE_PATHS:
        return text, True
    try:
        st = os.stat(text)  # follows symlinks
    except FileNotFoundError:
        st = None
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(_errno.EISDIR, f"cannot write '{path}': it is a folder; allowed: a file path", text)
        return text, True
    real = os.path.realpath(text) if os.path.islink(text) else text
    if real != text and os.path.abspath(real).startswith(_IN_PLACE_ROOTS):
        return text, True
    return real, False


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` safely (see the module docstring); creates parent folders; returns ``path``.

    Raises:
        OutputError: the file cannot be written (the message names ``path`` and the reason).
    """
    user = Path(path)
    target, in_place = _destination(user)
    if in_place:
        try:
            _write_in_place(target, data)
        except OSError as exc:
            raise _error(exc, user) from None
        return user
    dest = Path(target)
    folder, name = dest.parent, dest.name
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _error(exc, user) from None
    _remove_stale_temps(folder, name)
    import secrets  # here: importing it (random, base64) costs every command's start-up; only writers need it

    tmp = folder / f"{_tmp_prefix(name)}{os.getpid()}.{secrets.token_hex(3)}.tmp"
    try:
        old = os.stat(dest)
    except OSError:
        old = None
    fd = -1
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)  # umask applies
    except OSError as exc:
        # a folder we may not create files in, holding a file we may write: write it in place (not atomic), as
        # a plain open() would
        if exc.errno in (_errno.EACCES, _errno.EPERM, _errno.EROFS) and old is not None and os.access(dest, os.W_OK):
            try:
                _write_in_place(str(dest), data)
            except OSError as exc2:
                raise _error(exc2, user) from None
            return user
        raise _error(exc, user) from None
    try:
        if old is not None:  # a replaced file keeps its mode (and owner, when we may set it)
            os.fchmod(fd, stat.S_IMODE(old.st_mode))
            try:
                if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                    os.fchown(fd, old.st_uid, old.st_gid)
            except OSError:
                pass
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, dest)
    except BaseException as exc:
        if fd >= 0:
            os.close(fd)
        _unlink_quietly(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, OutputError):
            raise _error(exc, user) from None
        raise
    try:  # make the rename durable; not every file system allows opening a folder
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return user


class staged_folder:
    """``with staged_folder(out) as tmp:`` write every file of one output into ``tmp``, a new temporary folder
    beside ``out`` (same file system); on a clean exit each file is renamed into ``out`` (created if missing; a
    missing ``out`` is the renamed folder itself), on an exception ``tmp`` is removed and ``out`` is left as it was.
    Files of ``out`` not written this time are kept. The renames at the end are the only step that is not atomic
    as a whole: each file is replaced atomically (``os.replace``).

    Raises:
        OutputError: the temporary folder cannot be made or its files moved (naming ``out`` and the reason).
    """

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self.tmp: Path | None = None

    def __enter__(self) -> Path:
        import tempfile

        parent = self.out.absolute().parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
            self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name[:_NAME_KEEP]}.", suffix=".tmp", dir=parent))
        except OSError as exc:
            raise _error(exc, self.out) from None
        return self.tmp

    def __exit__(self, kind, exc, tb) -> bool:
        import shutil

        assert self.tmp is not None
        if kind is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        try:
            if not self.out.exists():
                os.rename(self.tmp, self.out)
                return False
            for f in sorted(self.tmp.iterdir()):
                os.replace(f, self.out / f.name)
            self.tmp.rmdir()
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise _error(e, self.out) from None
        return False


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` safely: :func:`atomic_write_bytes`. Returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _clean(obj: Any) -> Any:
    """Make an object JSON-safe: non-finite floats become None, tuples lists, sets sorted lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, set):
        return sorted(_clean(v) for v in obj)
    return obj


def dumps(obj: Any) -> str:
    """JSON text of ``obj`` (indented, non-finite floats as ``null``, trailing newline)."""
    return json.dumps(_clean(obj), indent=2, sort_keys=False, default=str) + "\n"


def write_stdout(text: str) -> None:
    """Write ``text`` to standard output and flush.

    Raises:
        OutputError: standard output is closed (``>&-``).
    """
    if sys.stdout is None:
        raise OutputError(_errno.EBADF, "cannot write the result: standard output is closed", "-")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:
        raise OutputError(getattr(exc, "errno", None) or _errno.EBADF,
                          "cannot write the result: standard output is closed", "-") from None


def write_json(target: str | os.PathLike, obj: Any) -> Path | None:
    """Write ``obj`` as JSON to a file (:func:`atomic_write_text`) or to stdout when ``target`` is ``-``.

    Returns the path written (None for stdout).
    """
    text = dumps(obj)
    if str(target) == "-":
        write_stdout(text)
        return None
    return atomic_write_text(target, text)


_FIGURE_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg", ".jpg": "jpg", ".jpeg": "jpg", ".eps": "eps",
                   ".ps": "ps", ".tif": "tif", ".tiff": "tif", ".webp": "webp"}


def save_figure(fig: Any, path: str | os.PathLike, **kwargs: Any) -> Path:
    """Render a matplotlib figure into memory and write it with :func:`atomic_write_bytes` (format from the
    suffix, PNG when there is none; ``kwargs`` go to ``savefig``, default ``dpi=120, bbox_inches='tight'``)."""
    fmt = _FIGURE_FORMATS.get(Path(path).suffix.lower(), "png")
    kwargs.setdefault("dpi", 120)
    kwargs.setdefault("bbox_inches", "tight")
    buf = _io.BytesIO()
    fig.savefig(buf, format=fmt, **kwargs)
    return atomic_write_bytes(path, buf.getvalue())


# ---------------------------------------------------------------------------------------------- reads
def _max_json_bytes() -> int:
    """:data:`MAX_JSON_BYTES`, or ``$TESSERA_LAB_MAX_JSON_BYTES`` (an integer >= 1).

    Raises:
        ConfigError: the variable is set to anything else.
    """
    env = os.environ.get("TESSERA_LAB_MAX_JSON_BYTES", "").strip()
    if not env:
        return MAX_JSON_BYTES
    try:
        v = int(env)
    except ValueError:
        v = 0
    if v < 1:
        raise ConfigError(f"environment variable TESSERA_LAB_MAX_JSON_BYTES = {env!r} is out of range; allowed: an "
                          "integer >= 1 (bytes)")
    return v


def _field_path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _walk(data: Any, err, max_depth: int, finite: bool = True) -> None:
    """Iterative check of depth and (with ``finite``) finiteness (no recursion, so no RecursionError)."""
    stack: list[tuple[Any, list[Any]]] = [(data, [])]
    while stack:
        obj, where = stack.pop()
        if len(where) > max_depth:
            raise err(f"is nested deeper than {max_depth} levels (at '{_field_path(where[:6])}...'); "
                      f"allowed: at most {max_depth}")
        if isinstance(obj, float):
            if finite and not math.isfinite(obj):
                raise err(f"field '{_field_path(where)}' = {obj} is not a finite number; allowed: finite numbers")
        elif isinstance(obj, dict):
            stack.extend((v, where + [k]) for k, v in obj.items())
        elif isinstance(obj, list):
            stack.extend((v, where + [i]) for i, v in enumerate(obj))


def read_json(path: str | os.PathLike, what: str = "file", *, error: type[Exception] = ConfigError,
              max_bytes: int | None = None, max_depth: int = MAX_JSON_DEPTH, finite: bool = True) -> Any:
    """Read a UTF-8 JSON file (a BOM is allowed) with one-line errors.

    Args:
        path: the file.
        what: what the file is, for messages ("config file", "profile", "plan").
        error: the exception class raised (``ConfigError``; ``ProfileError`` for profiles).
        max_bytes: size limit (default :data:`MAX_JSON_BYTES`, or ``$TESSERA_LAB_MAX_JSON_BYTES``).
        max_depth: nesting limit of arrays and objects.
        finite: refuse ``NaN`` / ``Infinity`` anywhere (default); ``False`` leaves them to the reader of each
            field (a model config's readers check only the fields they read).

    Returns:
        The parsed JSON value (any type; callers check the shape they need).

    Raises:
        ``error``: ``"<what> '<path>' ..."`` for a missing, unreadable or binary file, bytes that are not UTF-8, a
        file over the size limit, nesting over the depth limit, invalid JSON, or a non-finite number.
    """
    label = f"{what} '{os.fspath(path)}'"
    limit = _max_json_bytes() if max_bytes is None else max_bytes

    def err(msg: str) -> Exception:
        return error(f"{label} {msg}")

    try:
        if os.path.isdir(path):
            raise err("is a folder; allowed: a JSON file")
        with open(path, "rb") as fh:
            raw = fh.read(limit + 1)
    except FileNotFoundError:
        raise err("does not exist") from None
    except OSError as exc:
        raise err(f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise err(f"is larger than {limit} bytes; allowed: at most {limit} "
                  "(raise it with TESSERA_LAB_MAX_JSON_BYTES)")
    if b"\x00" in raw:
        raise err(f"is binary (NUL byte at offset {raw.index(0)}), not JSON text; allowed: UTF-8 JSON")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise err(f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); allowed: UTF-8 JSON") \
            from None
    if not text.strip():
        raise err("is empty; allowed: a JSON document")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        where = "" if exc.msg.endswith(" at") else " at"  # json's "Unterminated string starting at"
        raise err(f"is not valid JSON ({exc.msg}{where} line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise err(f"is nested deeper than {max_depth} levels; allowed: at most {max_depth}") from None
    except ValueError as exc:  # e.g. an integer literal over Python's 4300-digit limit
        raise err(f"is not valid JSON ({str(exc).splitlines()[0]})") from None
    _walk(data, err, max_depth, finite)
    return data
