"""``run --check`` on CUDA (checked on CPU with the run's result dict): the reference runs with the EP dispatch
mode the run used, the comparison is allclose with the stated tolerance (``CUDA_CHECK_TOLERANCE``), and a run
beyond it fails the check (``passed`` False; ``tessera-lab run`` then exits 4). CPU keeps the bitwise rule.

The "run" losses here are the reference's own, perturbed by hand-chosen amounts on either side of the bound."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tessera_lab.runner import RunSpec, WorldSpec  # noqa: E402
from tessera_lab.runner.launch.launch import _check_line  # noqa: E402
from tessera_lab.runner.launch.results import CUDA_CHECK_TOLERANCE, compare_reference  # noqa: E402
from tessera_lab.runner.runtime.reference import reference_run  # noqa: E402

SPEC = RunSpec(name="c", schedule="1f1b", microbatches=2, steps=2, model={"num_layers": 2})
WORLD = WorldSpec(pp=2, ep=1)


def _ref_losses(dispatch: str) -> list[float]:
    import dataclasses

    cfg = dataclasses.replace(SPEC.model_config, ep_dispatch=dispatch)
    return reference_run(cfg, microbatches=2, steps=2, record_grads=()).losses


def test_cuda_check_is_allclose_with_the_runs_dispatch():
    cap = _ref_losses("capacity")
    tol = CUDA_CHECK_TOLERANCE["losses"]
    inside = [x * (1 + 0.5 * tol["rtol"]) for x in cap]  # half the relative bound: within
    beyond = [x * (1 + 3 * tol["rtol"]) for x in cap]  # three times it: beyond (atol is 1e-6 << rtol * ~4.6)
    for losses, passed in ((cap, True), (inside, True), (beyond, False)):
        out = compare_reference({"losses": losses, "ep_dispatch": {"mode": "capacity"}}, SPEC, WORLD, None, "cuda")
        assert out["mode"] == "allclose" and out["dispatch"] == "capacity" and out["tolerance"] == CUDA_CHECK_TOLERANCE
        assert out["reference_losses"] == cap  # the reference ran with the capacity dispatch
        assert out["passed"] is passed, (losses, out)
    assert "FAILED" in _check_line(out) and "rtol 0.0001" in _check_line(out)


def test_cpu_check_stays_bitwise():
    ref = _ref_losses("uneven")
    out = compare_reference({"losses": ref, "ep_dispatch": {"mode": "uneven"}}, SPEC, WORLD, None, "cpu")
    assert out["passed"] and out["mode"] == "bitwise" and out["tolerance"] is None
    tiny = [ref[0] + 1e-9 * abs(ref[0]) + 1e-12] + ref[1:]  # far inside the CUDA tolerance, but not bitwise
    out = compare_reference({"losses": tiny, "ep_dispatch": {"mode": "uneven"}}, SPEC, WORLD, None, "cpu")
    assert out["passed"] is False and "bitwise" in _check_line(out)
