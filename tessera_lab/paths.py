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
