"""Atomic file writes and JSON output shared by the CLI, the profile store and plan exports."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically: a temporary file in the same folder, fsync, ``os.replace``.

    A reader sees either the old file or the new one, never a partial write, even if the process is
    killed mid-write. Creates parent folders. Returns the path.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the permissions a plain open() would
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


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
    return json.dumps(_clean(obj), indent=2, sort_keys=False, default=str) + "\n"


def write_json(target: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as JSON to a file (atomically) or to stdout when ``target`` is ``-``."""
    text = dumps(obj)
    if str(target) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write_text(target, text)
