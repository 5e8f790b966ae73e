"""`safetynet plan`'s per-row decision and why: the ages and thresholds it compared."""

from __future__ import annotations

from typing import Any

import pytest

from actors.finalize.evidence import Evidence
from actors.finalize.messages import NotAttempted, Withheld
from actors.finalize.settings import RecordingFinalizeConfig
from actors.reaper.settings import ConferenceReaperConfig
from actors.s3.objectstore import Fault, Found, Missing, Poison, Transient
from supervision.app.plan_items import (
    age,
    compared,
    conference_item,
    decided_item,
    finalize_item,
    outbox_item,
    paused_item,
    reconcile_item,
    skipped_item,
    storage_down_item,
)

RF = RecordingFinalizeConfig(finalize_sla_timeout=1800.0, max_attempts=5)
CR = ConferenceReaperConfig(empty_room_grace=90.0, provision_timeout=120.0,
                            stale_live_timeout=7200.0)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (45.9, "45s"), (95, "1m35s"), (125, "2m05s"), (7380, "2h03m"),
    (3 * 86400 + 4 * 3600 + 59, "3d04h"), (-30, "-30s"),
])
def test_age_is_truncated_to_two_units(seconds: float, text: str) -> None:
    """Ages read like a person writes them, zero-padded below the leading unit."""
    assert age(seconds) == text


def test_compared_names_the_comparison_that_holds() -> None:
    """Greater, equal and smaller ages each get their own operator."""
    assert compared("x", 100, "grace", 90) == "x 1m40s ago > grace 1m30s"
    assert compared("x", 90, "grace", 90) == "x 1m30s ago = grace 1m30s"
    assert compared("x", 10, "grace", 90) == "x 10s ago < grace 1m30s"


def finalize_row(**over: Any) -> dict[str, Any]:
    row = {"recording_id": "r1", "phase": "reconcile", "attempts": 0,
           "recording_status": "Uploading", "session_ended_at": "2024-01-01",
           "ended_s": 7380.0, "has_event": False, "poison_reason": None}
    row.update(over)
    return row


def test_finalize_wait_shows_session_age_below_the_sla() -> None:
    """A session ended 10 minutes ago waits: its age is under finalize_sla_timeout."""
    item = finalize_item(finalize_row(phase="wait", ended_s=600.0), RF)
    assert item is not None and item.decision == "reschedule (not an attempt)"
    assert item.why == "session ended 10m00s ago < finalize_sla_timeout 30m"


def test_finalize_wait_for_a_live_session_says_so() -> None:
    """No end yet: nothing to compare, the why says the session is live."""
    item = finalize_item(finalize_row(phase="wait", session_ended_at=None, ended_s=None), RF)
    assert item is not None and item.why == "session not ended"


def test_finalize_settled_rows_need_no_head() -> None:
    """Poison, terminal and republish rows are decided without S3; a reconcile row is not."""
    poison = finalize_item(finalize_row(phase="poison", poison_reason="session_missing"), RF)
    assert poison is not None and (poison.decision, poison.why) == (
        "quarantine", "session_missing")
    closed = finalize_item(finalize_row(phase="terminal", recording_status="Failed"), RF)
    assert closed is not None and (closed.decision, closed.why) == (
        "close row", "already Failed")
    again = finalize_item(finalize_row(phase="terminal", recording_status="Available"), RF)
    assert again is not None and (again.phase, again.decision) == (
        "republish", "enqueue event, close row")
    assert finalize_item(finalize_row(), RF) is None


def test_reconcile_shows_the_sla_it_exceeded_and_the_head() -> None:
    """Found and missing binaries: the why opens with the session's age against the SLA."""
    found = reconcile_item(finalize_row(), Found("f", 64, "ogg", 3), RF)
    assert found.decision == "Available + event"
    assert found.why == ("session ended 2h03m ago > finalize_sla_timeout 30m; "
                         "binary found (64 bytes, ogg)")
    missing = reconcile_item(finalize_row(), Missing(), RF)
    assert (missing.decision, missing.why) == (
        "Failed/Timeout", "session ended 2h03m ago > finalize_sla_timeout 30m; no binary")


def test_reconcile_transient_counts_attempts_against_max_attempts() -> None:
    """A transient HEAD retries until the attempt that reaches max_attempts quarantines."""
    retry = reconcile_item(finalize_row(attempts=2), Transient("timeout"), RF)
    assert (retry.decision, retry.why) == (
        "retry after back-off", "s3:timeout; attempt 3 of max_attempts 5")
    last = reconcile_item(finalize_row(attempts=4), Transient("timeout"), RF)
    assert (last.decision, last.why) == (
        "quarantine", "s3:timeout; attempt 5 of max_attempts 5")


def test_reconcile_poison_and_fault_heads() -> None:
    """A poison object is quarantined; a configuration fault does nothing."""
    assert reconcile_item(finalize_row(), Poison("content_type"), RF).why == (
        "object:content_type")
    assert reconcile_item(finalize_row(), Fault("403"), RF).decision == (
        "nothing (configuration fault)")
    assert storage_down_item(finalize_row(), Transient("refused")).decision == (
        "nothing (object storage down)")


OCTET = Poison("content_type_unknown:application/octet-stream")


def test_plan_predicts_withheld_with_its_hold_off() -> None:
    """A 404 the gate withheld (no evidence): the reason, the prefix, and when the row's
    next HEAD comes — not an attempt."""
    item = decided_item(finalize_row(), Withheld("no_evidence_for_key_prefix"), None, RF,
                        "call-recordngs/", 240.0)
    assert item.decision == "withheld (given back untouched)"
    assert "no_evidence_for_key_prefix" in item.why and "'call-recordngs/'" in item.why
    assert item.why.endswith("next HEAD in 4m (not an attempt)")


@pytest.mark.parametrize("evidence", list(Evidence))
def test_plan_predicts_failed_with_evidence_and_names_it(evidence: Evidence) -> None:
    """A 404 the gate let through: Failed, naming the evidence."""
    item = decided_item(finalize_row(), Missing(), evidence, RF, "p/", 60.0)
    assert (item.decision, item.why.rsplit("; ", 1)[1]) == (
        "Failed/Timeout", f"no binary (evidence: {evidence})")


def test_plan_predicts_the_content_type_fault_and_one_odd_object_as_poison() -> None:
    """A Content-Type fault is given back and held off; an odd object is quarantined."""
    fault = decided_item(finalize_row(), Fault("content_type_unusable:application/"
                                               "octet-stream"), None, RF, "p/", 900.0)
    assert fault.decision == "nothing (configuration fault)"
    assert fault.why.startswith("content_type_unusable:application/octet-stream: at least 3")
    assert fault.why.endswith("next HEAD in 15m (not an attempt)")
    odd = decided_item(finalize_row(), OCTET, None, RF, "p/", 60.0)
    assert odd.decision == "quarantine"


def test_plan_predicts_rows_deferred_by_the_breaker() -> None:
    """A row the breaker kept from its HEAD (or whose batch it opened in) is deferred."""
    item = decided_item(finalize_row(), NotAttempted("s3_breaker_open"), None, RF, "p/", 60)
    assert (item.decision, item.why) == (
        "deferred (given back untouched)",
        "breaker open (s3_breaker_open) in this claim batch or before it")


def test_rows_held_elsewhere_are_skipped_and_a_paused_job_does_nothing() -> None:
    """A locked finalize row or recording is skipped; a paused job names who paused it."""
    assert skipped_item(finalize_row(held=True)).why == (
        "finalize row held by another transaction right now")
    assert skipped_item(finalize_row(held=False)).why == (
        "recording held by another transaction right now")
    pause = {"paused_by": "ops@h", "paused_at": "2026-01-01", "reason": "INC-9"}
    item = paused_item(finalize_row(), pause)
    assert (item.decision, item.why) == (
        "nothing (job paused)", "job paused by ops@h since 2026-01-01: INC-9")


def conference_row(phase: str, **over: Any) -> dict[str, Any]:
    row = {"id": "c1", "phase": phase, "idle_s": 95.0, "age_s": 190.0,
           "active_participant_count": 0, "poison_held": None, "poison_reason": None,
           "poison_retry_at": None, "recording_active": False}
    row.update(over)
    return row


def test_conference_phases_show_their_window() -> None:
    """Each phase's why compares the age its window is about with that window."""
    empty = conference_item(conference_row("empty-room"), CR)
    assert empty.decision == "Ended/EmptyTimeout + conference-ended event"
    assert empty.why == "empty room, last seen 1m35s ago > empty_room_grace 1m30s"
    provisioning = conference_item(conference_row("provision-timeout"), CR)
    assert provisioning.decision == "Failed/Error, no event"
    assert provisioning.why == "provisioning since 3m10s ago > provision_timeout 2m"
    stale = conference_item(conference_row("stale-live", idle_s=7500.0,
                                           active_participant_count=3), CR)
    assert stale.decision == "Ended/Timeout + conference-ended event"
    assert stale.why == ("last activity 2h05m ago > stale_live_timeout 2h "
                         "(3 participant(s) on record)")


def test_conference_with_a_running_recorder_gets_a_stop_signal() -> None:
    """A room with an active recording is ended and its recorder told to stop."""
    item = conference_item(conference_row("empty-room", recording_active=True), CR)
    assert item.decision.endswith(" + recorder stop signal")


def test_poison_conference_is_held_back_with_its_reason() -> None:
    """A backed-off poison conference is held, whatever its window says."""
    item = conference_item(conference_row("empty-room", poison_held=True,
                                          poison_reason="started_after_as_of",
                                          poison_retry_at="2024-01-01 00:01:00+00"), CR)
    assert (item.decision, item.why) == (
        "held back (poison)", "started_after_as_of; retried after 2024-01-01 00:01:00+00")


def outbox_row(**over: Any) -> dict[str, Any]:
    row = {"id": 7, "topic": "t", "message_key": "k", "publish_attempts": 0,
           "last_error": None, "age_s": 12.0, "held_by": None, "held_reason": None,
           "held_for_s": None}
    row.update(over)
    return row


def test_outbox_row_is_sent_with_its_age() -> None:
    """An unpublished row goes to Kafka; the why has its age and earlier failures."""
    assert outbox_item(outbox_row()).why == "t key k, unpublished for 12s, attempts 0"
    failed = outbox_item(outbox_row(publish_attempts=2, last_error="timeout", age_s=130.0))
    assert (failed.decision, failed.why) == (
        "send to Kafka", "t key k, unpublished for 2m10s, attempts 2, last error: timeout")


def test_outbox_rows_held_by_a_dead_letter_say_which() -> None:
    """A dead-lettered row and a row blocked behind one are held, with the dead letter."""
    own = outbox_item(outbox_row(held_by=7, held_reason="too large", held_for_s=300.0))
    assert (own.decision, own.why) == ("held", "dead-lettered 5m00s ago: too large")
    blocked = outbox_item(outbox_row(held_by=3, held_reason="too large", held_for_s=60.0))
    assert blocked.why == "key blocked behind dead letter 3 for 1m00s: too large"
