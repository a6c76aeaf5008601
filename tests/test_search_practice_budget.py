"""The practice benchmark searches with the budget `tessera-lab search` uses by default, so its count is what a
researcher running the search gets (docs/search.md, "Checked against practice")."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_practice_budget_is_the_search_default():
    import bench_search_practice

    from tessera_lab.plan.search import DEFAULT_MAX_PLANS

    assert bench_search_practice.MAX_PLANS == DEFAULT_MAX_PLANS
    assert bench_search_practice.RETRY_PLANS == 0
