"""Every figure quoted in README.md and docs/ is an entry of docs/claims.json (scripts/claims.py).

The quoted text must equal the entry's value in the entry's format; the cheap deterministic entries (the analytic
planner's simulated and derived figures, stored validation results) are re-computed and must agree within their
tolerance. The check itself is shown to fail on a changed figure, an unknown id and a marker without a figure.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import claims  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def registry():
    return claims.load_registry()


def test_every_entry_has_command_environment_date_load_kind_and_tolerance(registry):
    assert registry
    assert claims.check_entries(registry) == []


def test_quoted_figures_in_readme_and_docs_match_the_registry(registry):
    assert claims.check_docs(registry) == []


def test_readme_quotes_the_default_plan_through_the_registry():
    ids = {cid for cid, *_ in claims.quoted((ROOT / "README.md").read_text())}
    assert {"default-plan.mfu", "default-plan.iteration", "fast-suite.cpu"} <= ids


def test_the_check_fails_on_a_changed_figure_an_unknown_id_and_a_bare_marker(registry):
    e = registry["default-plan.mfu"]
    good = f"MFU {claims.text_of(e)}<!-- claim:default-plan.mfu -->"
    assert claims.check_text("x.md", good, registry) == []
    changed = good.replace(claims.text_of(e), "99.9%")
    assert "quotes '99.9%'" in claims.check_text("x.md", changed, registry)[0]
    assert "not in" in claims.check_text("x.md", "1.0 s<!-- claim:no-such-claim -->", registry)[0]
    assert "no figure" in claims.check_text("x.md", "MFU<!-- claim:default-plan.mfu -->", registry)[0]
    assert claims.rewrite(changed, registry) == good


def test_cheap_deterministic_claims_rerun_within_tolerance(registry):
    """Re-runs the default plan (and one grouped-GEMM variant), two knob variants, the six published-run
    predictions and re-reads the stored validation results (a few seconds of CPU)."""
    values, bad = claims.rerun(registry)
    assert not bad, "\n".join(bad)
    rerun_kinds = {registry[cid]["kind"] for cid in values}
    assert {"simulated", "derived"} <= rerun_kinds
    assert "default-plan.mfu" in values and "public.median-abs-error" in values
    # the generated per-run table of docs/reproduce.md is what bench_public_runs.py --markdown prints now
    texts, bad = claims.rerun_blocks([p for p in claims.PROBES if p not in claims.SLOW_PROBES])
    assert not bad, "\n".join(bad)
    assert "public-runs.table" in texts and texts["public-runs.table"].startswith("| run | source family |")


@pytest.mark.slow
def test_reproduce_verdicts_block_matches_a_fresh_run():
    """docs/reproduce.md's verdicts, reasons and per-scenario gains are what ``tessera-lab reproduce --quick
    --markdown`` prints now (about 40 CPU s), each verdict naming its rule."""
    texts, bad = claims.rerun_blocks(["reproduce"])
    assert not bad, "\n".join(bad)
    block = texts["reproduce.verdicts"]
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and "**" in ln]
    assert rows and all(re.search(r"\*\* \((value|gain|range|one-layout) rule", ln) or "not modelled" in ln
                        for ln in rows), rows


@pytest.mark.slow
def test_modelzoo_block_matches_a_fresh_run():
    """docs/search.md's ModelZoo table and its agreement figures are what ``bench_modelzoo_ranking.py --markdown``
    prints now (twelve plans)."""
    texts, bad = claims.rerun_blocks(["modelzoo"])
    assert not bad, "\n".join(bad)
    assert texts["modelzoo.table"].startswith("| layout | `plan` options")


def test_a_generated_block_is_checked_and_rewritten(monkeypatch, tmp_path):
    table = "| a |\n|---|\n| 1 |\n"
    monkeypatch.setitem(claims.BLOCKS, "t.table", ("default-plan", "echo table", lambda: table))
    good = f"x\n<!-- claim-block:t.table -->\n\n{table}\n<!-- /claim-block:t.table -->\ny\n"
    assert claims.check_blocks("x.md", good) == []
    assert "not a block" in claims.check_blocks("x.md", good.replace("t.table", "no.such"))[0]
    assert "not closed" in claims.check_blocks("x.md", good.replace("<!-- /claim-block:t.table -->", ""))[0]
    assert claims.check_blocks("x.md", "a marker quoted in a sentence, `<!-- claim-block:no.such -->`, is none") == []
    changed = good.replace("| 1 |", "| 2 |")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(changed)
    texts, bad = claims.rerun_blocks(["default-plan"], root=tmp_path)
    assert texts == {"t.table": table} and len(bad) == 1 and "docs/x.md: claim-block:t.table differs" in bad[0]
    assert claims.rewrite_blocks(changed, texts) == good
    (tmp_path / "docs" / "x.md").write_text(good)
    assert claims.rerun_blocks(["default-plan"], root=tmp_path)[1] == []
    assert claims.rerun_blocks(["knobs"], root=tmp_path) == ({}, [])  # another probe's run: the block is not made


def test_every_result_figure_in_the_readme_is_registered():
    """README: a percentage or a time (s, ms, minutes) is a result, so it carries a claim marker (sizes such as
    pp 8 or 4096 tokens are the inputs the text names, not results)."""
    import re

    text = (ROOT / "README.md").read_text()
    figure = re.compile(r"(?<![\w.\-])[+\-]?\d[\d,]*(?:\.\d+)?(?: ?(?:%|s|ms|minutes))(?![\w/])")
    bare = [m.group(0) for m in figure.finditer(text) if not text[m.end():].lstrip().startswith("<!-- claim:")]
    assert not bare, f"README figures without a claim marker: {bare}"
