"""The walks over action lists that run on the pipeline engine reproduce, bit for bit, the outputs recorded before
they moved onto it (tests/data/walkers_golden.json, from tests/_walkers_cases.py): the dynamic controller's
step-by-step execution (static and with controllers over three steps: events, waits, predictions, decisions) and
the CPU testbed's processor sharing (iteration, busy, rates, CPU)."""

from __future__ import annotations

import json

from _walkers_cases import GOLDEN, execute_outputs, shared_outputs


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


def test_online_execution_reproduces_the_recorded_outputs():
    got = json.loads(json.dumps(execute_outputs()))  # same JSON round trip as the recording
    want = _golden()["execute"]
    assert sorted(got) == sorted(want)
    for case in want:
        assert got[case] == want[case], case


def test_processor_sharing_reproduces_the_recorded_outputs():
    got = json.loads(json.dumps(shared_outputs()))
    want = _golden()["shared"]
    assert sorted(got) == sorted(want)
    for case in want:
        assert got[case] == want[case], case
