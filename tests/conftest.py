"""Shared fixtures and settings for the test-suite."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# deterministic, bounded property tests on a 2-core CI machine
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

try:  # headless plotting in this process only (notebook kernels keep their inline backend)
    import matplotlib

    matplotlib.use("Agg")
except ImportError:  # pragma: no cover
    pass


#: markers of test kinds that are slow by nature: a test carrying one of them is also ``slow``, so the default
#: ``pytest -q`` (pyproject: ``-m 'not slow'``) leaves it out and ``pytest -m ""`` runs it
SLOW_KINDS = ("browser", "notebook", "multiprocess")


@pytest.hookimpl(tryfirst=True)  # before the -m selection of pytest's mark plugin
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def qwen3_next():
    from tessera_lab.model.spec import load_model

    return load_model("qwen3-next-80b-a3b")
