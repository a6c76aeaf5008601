"""Where tessera-lab finds its shipped data (``data/`` at the repository root)."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The data folder: ``$TESSERA_LAB_DATA`` if set, else ``data/`` beside the package.

    Raises:
        FileNotFoundError: neither exists (a non-editable install without the data folder).
    """
    env = os.environ.get("TESSERA_LAB_DATA")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve().parent
    candidates += [here / "_data", here.parent / "data"]
    for c in candidates:
        if (c / "models").is_dir():
            return c
    raise FileNotFoundError(
        "tessera-lab data folder not found; install the package in editable mode (pip install -e .) "
        "or set TESSERA_LAB_DATA to the repository's data/ folder"
    )


def read_data_json(relpath: str, what: str):
    """A JSON file of the data folder (:func:`data_dir`, ``$TESSERA_LAB_DATA`` when set), read with one-line errors
    (:func:`tessera_lab.io.read_json`: missing, empty, not UTF-8, not JSON, too large or deep, non-finite numbers).

    Raises:
        ConfigError: ``"data file <what> '<path>' ..."``; callers check the shape they need.
    """
    from tessera_lab.io import read_json

    return read_json(data_dir() / relpath, f"data file ({what}{', TESSERA_LAB_DATA' if os.environ.get('TESSERA_LAB_DATA') else ''})")
