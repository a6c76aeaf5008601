"""The default ``plan``, ``simulate`` and ``report`` outputs stay what they are: the JSON of each command, stored
under ``tests/data/golden``, compared field by field (floats to 1e-9 relative).

The stored files are the outputs of the commit that last changed them, not of a fixed revision:
``git log -- tests/data/golden`` lists every change with its reason. A change that is meant to move these numbers
(a cost-model fix, say) regenerates them with ``python tests/test_golden.py --update`` and says why in its commit
message; a refactor leaves them as they are.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tessera_lab.cli.main import main

GOLDEN = Path(__file__).parent / "data" / "golden"
COMMANDS = {
    "plan": ["plan"],
    "sim": ["simulate", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--f", "1", "--b", "2"],
    "report": ["report"],
}
VOLATILE = {"solve_time_s"}  # wall-clock solver times


def _strip(o):
    if isinstance(o, dict):
        return {k: _strip(v) for k, v in o.items() if k not in VOLATILE}
    if isinstance(o, list):
        return [_strip(v) for v in o]
    return o


def _same(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: missing" for k in set(a) ^ set(b)]
        return out + [d for k in set(a) & set(b) for d in _same(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, (int, float)):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _run(name: str, tmp: Path) -> dict:
    out = tmp / f"{name}.json"
    assert main(COMMANDS[name] + ["--json", str(out)]) == 0
    return _strip(json.loads(out.read_text()))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_default_outputs_unchanged(name, tmp_path, capsys):
    got = _run(name, tmp_path)
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    diffs = _same(want, got)
    assert not diffs, "\n".join(diffs[:20])


if __name__ == "__main__" and "--update" in sys.argv:  # pragma: no cover
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for n in COMMANDS:
            (GOLDEN / f"{n}.json").write_text(json.dumps(_run(n, Path(d)), indent=1, sort_keys=True) + "\n")
    print(f"updated {', '.join(COMMANDS)} under {GOLDEN}")
