"""The bad-input table: one row per distinct input, published on purpose from figures a
test run wrote under build/."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.badinput.cases import CASES
from tests.badinput.report import FIGURES, PUBLISHED_DOC, ROOT, publish, record, stable


def test_the_suite_covers_at_least_thirty_distinct_inputs_in_every_area() -> None:
    """Case ids and inputs are unique, and every area of issue #13 has some."""
    assert len({c.id for c in CASES}) == len({c.input for c in CASES}) == len(CASES) >= 30
    assert {c.area for c in CASES} == {"config", "s3", "messenger", "outbox", "kafka",
                                       "media", "console"}


def test_test_runs_write_figures_under_build_not_docs() -> None:
    assert FIGURES.relative_to(ROOT).parts[0] == "build"
    assert PUBLISHED_DOC.relative_to(ROOT).parts[0] == "docs"


def test_reasons_are_recorded_without_run_specific_ids() -> None:
    """Ids, timestamps and per-run topics are replaced, so the published table changes only
    when behaviour does."""
    assert stable("known_recording_not_found:0e6f3c1a-5f4b-4c1e-9d7a-1b2c3d4e5f60") == (
        "known_recording_not_found:<id>")
    assert stable("session_ended_in_future:2027-11-30T20:54:52Z") == (
        "session_ended_in_future:<time>")
    assert stable("topic badinput.4bfd3ed1ee.missing") == "topic <topic>.missing"


def test_publish_renders_one_row_per_input_with_its_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.badinput.report as report

    source, doc = tmp_path / "build", tmp_path / "bad-input.md"
    monkeypatch.setattr(report, "FIGURES", source)
    record("b-case", area="s3", bad_input="odd | header", did="quarantined", reason="x",
           invariants={"lost_recording": 0}, exempt=1, duration_s=1.0)
    record("a-case", area="config", bad_input="bad key", did="exit 78", reason="y",
           invariants={"lost_recording": 2}, exempt=0, duration_s=1.0)
    assert publish(source, doc) == 2
    text = doc.read_text()
    assert "| 1 | config | bad key | exit 78 | `y` | **VIOLATED** lost_recording 2 |" in text
    assert "| 2 | s3 | odd \\| header | quarantined | `x` | ok (1 held) |" in text
    assert "**2 distinct inputs, 1 with every invariant held.**" in text


def test_publish_without_figures_changes_nothing(tmp_path: Path) -> None:
    doc = tmp_path / "bad-input.md"
    assert publish(tmp_path / "empty", doc) == 0
    assert not doc.exists()
