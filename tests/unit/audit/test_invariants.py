"""The auditor's judging of facts (actors.audit.invariants, actors.audit.ledger) and the verdict
of `safetynet audit`: pure logic, no servers."""

from __future__ import annotations

from actors.audit.invariants import (
    Invariant,
    Violation,
    dedupe,
    judge_attempts,
    judge_conference,
    judge_outbox_row,
    judge_recording,
)
from actors.audit.ledger import Entry, Ledger, OutboxRow, check_ledger
from actors.envelope import TOPIC_RECORDING_AVAILABLE, event_id
from supervision.app.audit import Report

REC = {"id": "r1", "status": "Available", "finalize_status": "Done", "attempts": 1,
       "has_outbox": True, "own_realtime": 1, "realtime_rows": 1}


def names(violations: list[Violation]) -> set[str]:
    return {str(v.invariant) for v in violations}


def test_a_consistent_terminal_recording_breaks_nothing() -> None:
    assert judge_recording(REC, 8) == []


def test_available_recording_without_its_event_is_missing_outbox() -> None:
    assert names(judge_recording({**REC, "has_outbox": False}, 8)) == {"missing_outbox"}


def test_available_recording_the_job_never_handled_is_not_judged_for_its_event() -> None:
    """No finalize row: the messenger's happy path owns it (finalize republishes it)."""
    row = {**REC, "has_outbox": False, "finalize_status": None, "attempts": None}
    assert judge_recording(row, 8) == []


def test_recording_realtime_rows_missing_doubled_and_attempts_past_the_bound() -> None:
    assert names(judge_recording({**REC, "own_realtime": 0, "realtime_rows": 0}, 8)) == {
        "missing_realtime"}
    assert names(judge_recording({**REC, "realtime_rows": 2}, 8)) == {"duplicate_realtime"}
    assert names(judge_recording({**REC, "attempts": 9}, 8)) == {"attempts_exceeded"}


def test_conference_ended_by_the_reaper_needs_its_event_a_failed_one_does_not() -> None:
    ended = {"id": "c1", "status": "Ended", "end_reason": "EmptyTimeout",
             "has_outbox": False, "realtime_rows": 1, "terminal_rows": 1}
    assert names(judge_conference(ended)) == {"missing_outbox"}
    failed = {**ended, "status": "Failed", "end_reason": "Error"}
    assert judge_conference(failed) == []
    assert names(judge_conference({**failed, "realtime_rows": 0})) == {"missing_realtime"}


def test_outbox_row_for_a_non_available_recording_or_doubled_key() -> None:
    row = {"id": 1, "topic": TOPIC_RECORDING_AVAILABLE, "dedupe_key": "r1",
           "subject_status": "Failed", "same_key": 1}
    (v,) = judge_outbox_row(row)
    assert (v.invariant, v.subject, v.detail) == (
        Invariant.UNEXPECTED_OUTBOX, "r1", "event for a Failed recording")
    doubled = judge_outbox_row({**row, "subject_status": "Available", "same_key": 2})
    assert [str(v) for v in doubled] == [f"duplicate_outbox: {TOPIC_RECORDING_AVAILABLE}/r1"
                                         " 2 rows"]


def test_finalize_row_bounds() -> None:
    """Pending with every attempt used is a violation only once settled; an s3 quarantine
    must come at max_attempts exactly."""
    pending = {"id": "r1", "status": "Pending", "attempts": 8, "last_error": "", "settled": True}
    assert names(judge_attempts(pending, 8)) == {"not_quarantined"}
    assert judge_attempts({**pending, "settled": False}, 8) == []
    early = {**pending, "status": "Quarantined", "attempts": 3, "last_error": "s3:Timeout"}
    assert names(judge_attempts(early, 8)) == {"quarantine_early"}
    assert judge_attempts({**early, "last_error": "object:duration_missing"}, 8) == []


def test_dedupe_keeps_one_violation_per_invariant_and_subject() -> None:
    v = Violation(Invariant.DUPLICATE_OUTBOX, "t/k", "2 rows")
    assert dedupe([v, v, Violation(Invariant.ORDER, "t/k")]) == [
        v, Violation(Invariant.ORDER, "t/k")]


def _row(oid: int, key: str, dedupe_key: str, judged: bool = True) -> OutboxRow:
    return OutboxRow(oid, TOPIC_RECORDING_AVAILABLE, key, dedupe_key,
                     {"RecordingId": dedupe_key}, True, judged)


def _entry(row: OutboxRow, offset: int, payload: object = None) -> Entry:
    return Entry(row.topic, 0, offset, row.key, event_id(row.topic, row.dedupe_key),
                 row.payload if payload is None else payload)


def test_ledger_matching_the_outbox_breaks_nothing() -> None:
    a, b = _row(1, "k", "a"), _row(2, "k", "b")
    assert check_ledger([a, b], Ledger([_entry(a, 0), _entry(b, 1)])) == []


def test_ledger_missing_reordered_inconsistent_and_unknown_events() -> None:
    a, b, c = _row(1, "k", "a"), _row(2, "k", "b"), _row(3, "j", "c")
    stranger = Entry(TOPIC_RECORDING_AVAILABLE, 0, 9, "k", "nobody", {})
    ledger = Ledger([_entry(b, 0), _entry(a, 1), _entry(a, 2, {"RecordingId": "x"}),
                     stranger])
    found = {(str(v.invariant), v.subject) for v in check_ledger([a, b, c], ledger)}
    assert found == {("order", f"{TOPIC_RECORDING_AVAILABLE}/k"),
                     ("ledger_inconsistent", event_id(a.topic, "a")),
                     ("not_in_ledger", event_id(c.topic, "c")),
                     ("unknown_event", "nobody")}


def test_a_row_published_outside_the_read_window_is_not_required_on_the_topic() -> None:
    assert check_ledger([_row(1, "k", "a", judged=False)], Ledger()) == []


def test_audit_exit_code_violation_beats_unjudged_beats_clean() -> None:
    v = Violation(Invariant.UNPUBLISHED, "1")
    assert Report([v], [], ["kafka: timeout"]).exit_code == 2
    assert Report([], [], ["kafka: timeout"]).exit_code == 1
    assert Report([], list(Invariant), []).exit_code == 0
    assert Report([v], [Invariant.UNPUBLISHED], []).as_json()["counts"] == {"unpublished": 1}
