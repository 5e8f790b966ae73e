"""The chaos report is published on purpose, from figures a test run wrote under build/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.chaos.report import FIGURES, PUBLISHED, ROOT, publish, record


def test_test_runs_write_figures_under_build_not_docs() -> None:
    """A test run's figures land in the untracked build folder (the tree stays clean)."""
    assert FIGURES.relative_to(ROOT).parts[0] == "build"
    assert PUBLISHED.relative_to(ROOT).parts[0] == "docs"


def test_publish_copies_the_figures_and_renders_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """publish() copies each scenario's JSON next to the report and renders one table row
    per scenario, with its verdict."""
    import tests.chaos.report as report

    source, target, doc = tmp_path / "build", tmp_path / "docs", tmp_path / "reliability.md"
    monkeypatch.setattr(report, "FIGURES", source)  # record() writes where tests write
    record("s3_blip", title="t", proves="p", injected=["503 x3"], rows={"rows": 5},
           faults=3, invariants={"nothing_lost": 0}, duration_s=1.0)
    record("kafka_gone", title="t", proves="p", injected=["refused"], rows={"rows": 5},
           faults=1, invariants={"nothing_lost": 2}, duration_s=2.0)
    assert publish(source, target, doc) == 2
    assert sorted(p.name for p in target.glob("*.json")) == ["kafka_gone.json", "s3_blip.json"]
    assert json.loads((target / "s3_blip.json").read_text())["faults"] == 3
    text = doc.read_text()
    assert "| [s3_blip](#s3_blip) | 3 | 0 | 1.0 | ok |" in text
    assert "| [kafka_gone](#kafka_gone) | 1 | 2 | 2.0 | **VIOLATED** |" in text


def test_publish_without_figures_changes_nothing(tmp_path: Path) -> None:
    """No figures (the chaos suite did not run): nothing is written."""
    doc = tmp_path / "reliability.md"
    assert publish(tmp_path / "empty", tmp_path / "docs", doc) == 0
    assert not doc.exists() and not (tmp_path / "docs").exists()


def test_the_report_prints_duplicates_per_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each scenario that read Kafka back has a row of its redeliveries and their bound,
    and each source its totals."""
    import tests.chaos.report as report

    monkeypatch.setattr(report, "FIGURES", tmp_path)
    for name, source, events, copies, bound in (("kill-table", "table", 1, 1, 400),
                                                 ("kill-logical", "logical", 50, 52, 900),
                                                 ("soak-logical", "logical", 3, 3, 900)):
        record(name, title="t", proves="p", injected=[], rows={}, faults=2,
               invariants={}, duration_s=1.0, source=source,
               duplicates={"events delivered more than once": events,
                           "copies beyond the first": copies, "bound": bound})
    record("s3_only", title="t", proves="p", injected=[], rows={}, faults=1,
           invariants={}, duration_s=1.0)
    text = report.render(report.load(tmp_path))
    assert "| kill-logical | logical | 50 | 52 | 900 |" in text
    assert "| **all, logical** | logical | 53 | 55 | 1800 |" in text
    assert "| **all, table** | table | 1 | 1 | 400 |" in text
    assert "| s3_only |" not in text
