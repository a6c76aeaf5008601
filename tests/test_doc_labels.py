"""Labels in docs/ are true: a fitted value is never called unfitted, and a headline is never a fit-set figure."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
UNFITTED = re.compile(r"nothing (is )?fitted|not fitted|unfitted|out of sample", re.I)
#: a row of docs/reproduce.md's per-run table: run, source family, split, published s, published s from,
#: predicted s, error (groups: run, family, split, error)
TABLE_ROW = r"^\| (\S+) \| (\S+) \| (fit|test|reference) \| [\d.]+ \| [^|]+ \| [\d.]+ \| ([+-][\d.]+)% \|"


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def test_a_fitted_value_is_never_named_unfitted():
    # every paragraph that quotes the fitted host/sync term (its claim marker) says it is fitted and nowhere that
    # nothing is fitted; the CPU validation, tuned on its own matrix, is never called out of sample
    hits = 0
    for page in DOCS.glob("*.md"):
        for para in _paragraphs(page.read_text()):
            if "claim:cost.host-sync-ms" in para or "FITTED_PER_WAIT_S" in para:
                hits += 1
                assert re.search(r"fitted", para, re.I), (page.name, para[:120])
                assert not UNFITTED.search(para), (page.name, para[:200])
    assert hits >= 1
    fidelity = (DOCS / "fidelity.md").read_text()
    assert "in sample" in fidelity
    # nothing in docs/ calls the tuned CPU validation out of sample
    for page in DOCS.glob("*.md"):
        assert "out of sample" not in page.read_text().lower(), page.name


def test_the_published_runs_headline_is_the_test_sets():
    # the headline sentence's median and max are recomputed from the doc's own per-run table, test rows only; a
    # fit-set figure in its place fails
    text = (DOCS / "reproduce.md").read_text()
    mark = r"(?:<!-- claim:[\w.\-]+ -->)?"  # a figure's claim marker (scripts/claims.py), if any
    head = re.search(rf"Headline \(test set, (\d+){mark} runs[^)]*\): median \|error\|\s+([\d.]+)%{mark}, largest "
                     rf"([\d.]+)%{mark}", text)
    assert head, "no test-set headline in docs/reproduce.md"
    rows = re.findall(TABLE_ROW, text, re.M)
    test = [abs(float(e)) for _, _, s, e in rows if s == "test"]
    fit = [abs(float(e)) for _, _, s, e in rows if s == "fit"]
    assert int(head.group(1)) == len(test) >= 10
    # both sides are one-decimal roundings of nearby values (the table's error from its rounded times): 0.1 apart
    # at most, plus float noise
    assert abs(float(head.group(2)) - statistics.median(test)) <= 0.1 + 1e-9
    assert abs(float(head.group(3)) - max(test)) <= 0.1 + 1e-9
    assert abs(statistics.median(fit) - statistics.median(test)) > 0.1  # the two figures are told apart
    assert not re.search(r"(headline|median)[^.\n]*\b%.1f%%" % statistics.median(fit), text.split("Headline")[0], re.I)


def test_every_report_category_is_defined_in_docs_and_help(capsys):
    # each capacity-report row has its definition and formula in docs/cli.md and in `report --help`
    from tessera_lab.cli.main import main
    from tessera_lab.report.categories import DOCUMENTED, DEFINITIONS, FORMULAS, LABELS

    cli = (DOCS / "cli.md").read_text()
    assert main(["report", "--help"]) == 0
    helptext = " ".join(capsys.readouterr().out.split())
    for k in DOCUMENTED:
        assert f"| {LABELS[k]} (`{k}`) | {DEFINITIONS[k]} | `{FORMULAS[k]}` |" in cli, k
        assert " ".join(f"{LABELS[k]}: {DEFINITIONS[k]}; = {FORMULAS[k]}".split()) in helptext, k


def test_stage_imbalance_row_has_one_notation(capsys):
    # `report --help` and docs/cli.md give the stage-imbalance formula once, with idle_r' and busy0 defined beside it
    from tessera_lab.cli.main import main

    assert main(["report", "--help"]) == 0
    helptext = " ".join(capsys.readouterr().out.split())
    row = ("stage imbalance: idle while the busiest rank does more work: each rank's idle time, up to the nominal "
           "compute it has less than the busiest rank; = G x sum_r min(idle_r', busy0_max - busy0_r), idle_r' = idle "
           "time left after exposed communication and memory wait, busy0 = compute time at nominal durations")
    assert row in helptext
    cli = (DOCS / "cli.md").read_text()
    for text in (helptext, cli):
        assert "idle left" not in text and text.count("sum_r min(") == 1


def test_every_quote_of_the_fitted_sync_values_says_fitted():
    # wherever a page quotes one of the planner's fitted host/sync values (as `plan --help` prints them), the text
    # around the quote (400 characters before, 100 after, within its paragraph) says the value is fitted, and the
    # paragraph never says it is not
    from tessera_lab.cost.sync import FITTED_PER_WAIT_S

    quotes = [f"{v * 1e3:.2f} ms" for v in FITTED_PER_WAIT_S.values()]
    hits = 0
    for page in [DOCS.parent / "README.md", *DOCS.glob("*.md")]:
        for para in _paragraphs(page.read_text()):
            for q in quotes:
                for m in re.finditer(re.escape(q), para):
                    hits += 1
                    near = para[max(0, m.start() - 400): m.end() + 100]
                    assert re.search(r"fitted", near, re.I), (page.name, near)
                    assert not UNFITTED.search(para), (page.name, para[:200])
    assert hits >= len(quotes)


def test_fidelity_headline_is_the_test_figure_not_the_fit_figure():
    # docs/fidelity.md's published-runs headline quotes the test set's median and max, the same figures the per-run
    # table of docs/reproduce.md gives for its test rows; the fit rows' median (in sample) is never that headline
    text = (DOCS / "fidelity.md").read_text()
    head = re.search(r"Headline \(test set, (\d+)(?:<!-- claim:public\.table\.n-test -->)? runs\): median \|error\| "
                     r"([\d.]+)%<!-- claim:public\.test-median"
                     r"-abs-error -->, largest\s+([\d.]+)%<!-- claim:public\.test-max-abs-error -->", text)
    assert head, "no test-set headline in docs/fidelity.md"
    table = (DOCS / "reproduce.md").read_text()
    rows = re.findall(TABLE_ROW, table, re.M)
    test = [abs(float(e)) for *_, s, e in rows if s == "test"]
    fit = [abs(float(e)) for *_, s, e in rows if s == "fit"]
    assert int(head.group(1)) == len(test)
    # both sides are one-decimal roundings of nearby values (the table's error from its rounded times): 0.1 apart
    # at most, plus float noise
    assert abs(float(head.group(2)) - statistics.median(test)) <= 0.1 + 1e-9
    assert abs(float(head.group(3)) - max(test)) <= 0.1 + 1e-9
    section = text.split("## Published GPU runs")[1].split("\n## ")[0]
    # the fit median as a figure of its own (not the tail of another, as 3.2% of 53.2%, nor a signed run error such
    # as -8.4%: a median |error| carries no sign)
    assert not re.search(r"(?<![\d.+\-])%s%%" % re.escape(f"{statistics.median(fit):.1f}"), section)
