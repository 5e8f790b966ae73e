"""recording-finalize against bad rows and numeric edges (issue #13), on real servers."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator

import attrs
import prometheus_client
import psycopg
import pytest

from actors.envelope import db_now
from actors.finalize.gauges import refresh_recording_slo
from actors.finalize.store import Applied, claim_due, fail_timeout
from supervision.app.settings import Config
from supervision.dev.s3 import S3Server
from tests.conftest import make_config
from tests.integration.finalize.test_recording_finalize import counts_of, run_cycle
from tests.messenger import (
    attempt,
    fetch,
    insert_call_session,
    insert_recording,
    outbox_rows,
    realtime_rows,
    recording,
    upload_recording,
)


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def cfg(db_dsn: str, s3_server: S3Server, bucket: str) -> Config:
    return make_config(db_dsn, s3_server=s3_server, bucket=bucket)


@pytest.mark.parametrize("factor", [2.0, 1e300])
def test_backoff_of_a_huge_attempt_count_is_capped_not_an_overflow(
        cfg: Config, conn: psycopg.Connection, factor: float) -> None:
    """attempts = 5000: factor^attempts overflows float8; the claim still takes the row and
    moves it by the cap (± jitter) instead of failing the whole batch."""
    rf = attrs.evolve(cfg.jobs.recording_finalize, backoff_factor=factor)
    rec = insert_recording(conn, session_id=insert_call_session(conn), attempts=5000)
    as_of = db_now(conn)
    with conn.transaction():
        claim = claim_due(conn, rf, as_of, False)
    assert [(r.recording_id, r.attempts) for r in claim.rows] == [(rec.id, 5001)]
    delay = attempt(conn, rec.id)["next_attempt_at"] - as_of
    cap = dt.timedelta(seconds=rf.backoff_cap)
    assert cap * (1 - rf.backoff_jitter) <= delay <= cap * (1 + rf.backoff_jitter)


@pytest.mark.parametrize("binary", [True, False], ids=["found", "missing"])
async def test_recording_locked_by_the_ingest_callback_is_skipped_not_waited_on(
        cfg: Config, db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        binary: bool) -> None:
    """Another transaction holds the recording row (FOR UPDATE, as the ingest callback
    would): the cycle does not wait for it — it writes nothing for that recording, gives
    the row its attempt back and commits the rest; once the lock is gone, the next cycle
    reconciles it. (A watchdog releases the lock after 60 s, so a committer that waits
    fails this test instead of hanging it.)"""
    sid = insert_call_session(conn)
    held = insert_recording(conn, session_id=sid)
    free = insert_recording(conn, session_id=sid)
    if binary:
        for rec in (held, free):
            upload_recording(s3_server, rec.id, bucket=bucket)
    with psycopg.connect(db_dsn) as ingest:
        ingest.execute("SELECT 1 FROM messenger.call_recordings WHERE id = %s FOR UPDATE",
                       (held.id,))
        watchdog = threading.Timer(60, ingest.rollback)
        watchdog.start()
        try:
            first = await run_cycle(cfg)
        finally:
            watchdog.cancel()
        ingest.rollback()
    verdict = "Available" if binary else "Failed"
    assert first.skipped_locked == 1
    assert counts_of(first) == {"reconciled" if binary else "failed": 1, "skipped_locked": 1}
    assert recording(conn, free.id)["status"] == verdict
    row = attempt(conn, held.id)
    assert (row["status"], row["attempts"]) == ("Pending", 0), "the skip is not an attempt"
    assert recording(conn, held.id)["status"] == "Uploading"
    assert outbox_rows(conn, held.id) == [] and realtime_rows(conn, held.id) == []

    second = await run_cycle(cfg)
    assert counts_of(second) == {"reconciled" if binary else "failed": 1}
    assert recording(conn, held.id)["status"] == verdict
    assert attempt(conn, held.id)["status"] == "Done"


def test_missing_rows_of_a_group_fail_in_one_statement_each_row_on_its_own_terms(
        cfg: Config, db_dsn: str, conn: psycopg.Connection) -> None:
    """The set-based Missing verdict: of three claimed rows, a free one goes Failed/Timeout
    with its realtime event, one whose recording another transaction holds is skipped
    (attempt given back, nothing written) and one already Failed is only closed — each
    result in input order, the whole group in one statement."""
    sid = insert_call_session(conn)
    free, held, done = (insert_recording(conn, session_id=sid) for _ in range(3))
    conn.execute("UPDATE messenger.call_recordings SET status = 'Failed',"
                 " failure_reason = 'Timeout' WHERE id = %s", (done.id,))
    with conn.transaction():
        claimed = {r.recording_id: r for r in claim_due(
            conn, cfg.jobs.recording_finalize, db_now(conn), False).rows}
    rows = [claimed[free.id], claimed[held.id], claimed[done.id]]
    with psycopg.connect(db_dsn) as ingest:
        ingest.execute("SELECT 1 FROM messenger.call_recordings WHERE id = %s FOR UPDATE",
                       (held.id,))
        with conn.transaction():
            applied = fail_timeout(conn, rows)
        ingest.rollback()
    assert applied == [Applied(True, True, True), Applied(False, False, False, True),
                       Applied(False, False, True)]
    assert recording(conn, free.id)["failure_reason"] == "Timeout"
    assert [r["kind"] for r in realtime_rows(conn, free.id)] == ["RecordingFailed"]
    assert recording(conn, held.id)["status"] == "Uploading"
    assert (attempt(conn, held.id)["status"], attempt(conn, held.id)["attempts"]) == (
        "Pending", 0)
    assert realtime_rows(conn, held.id) == [] and realtime_rows(conn, done.id) == []
    assert attempt(conn, free.id)["status"] == attempt(conn, done.id)["status"] == "Done"


def stuck_gauge(conn: psycopg.Connection, cfg: Config) -> float | None:
    """``safetynet_recording_finalize_stuck`` as the gauge refresher sets it now."""
    rf = cfg.jobs.recording_finalize
    refresh_recording_slo(conn, rf.finalize_sla_timeout, rf.polling_interval)
    return prometheus_client.REGISTRY.get_sample_value("safetynet_recording_finalize_stuck")


async def quarantined_after_one_cycle(cfg: Config, conn: psycopg.Connection,
                                      recording_id: str) -> str:
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"quarantined": 1}
    row = attempt(conn, recording_id)
    assert row["status"] == "Quarantined"
    assert recording(conn, recording_id)["status"] == "Uploading", "no verdict on bad data"
    reason: str = row["last_error"]
    return reason


async def test_recording_whose_session_row_is_missing_is_quarantined_and_counted_stuck(
        cfg: Config, conn: psycopg.Connection) -> None:
    """No call_sessions row: there is no end to wait for; quarantine (session_missing)
    instead of rescheduling forever, and the stuck SLO counts the recording."""
    rec = insert_recording(conn, session_id=str(uuid.uuid4()))
    assert await quarantined_after_one_cycle(cfg, conn, rec.id) == "session_missing"
    assert stuck_gauge(conn, cfg) == 1


async def test_recording_with_an_unknown_session_kind_is_quarantined_and_counted_stuck(
        cfg: Config, conn: psycopg.Connection) -> None:
    """session_kind 'Webinar' names no session table: quarantine with the kind."""
    rec = insert_recording(conn, session_id=insert_call_session(conn), session_kind="Webinar")
    assert await quarantined_after_one_cycle(cfg, conn, rec.id) == (
        "session_kind_unknown:Webinar")
    assert stuck_gauge(conn, cfg) == 1


async def test_recording_of_a_session_ended_far_in_the_future_is_quarantined_and_counted(
        cfg: Config, conn: psycopg.Connection) -> None:
    """ended_at a year ahead would be waited for a year: quarantine with the date; a few
    seconds ahead (clock skew) is still a bounded wait to ended_at + SLA."""
    far = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=-365 * 86400))
    skewed = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=-5))
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"quarantined": 1, "rescheduled": 1}
    row = attempt(conn, far.id)
    assert row["status"] == "Quarantined"
    assert row["last_error"].startswith("session_ended_in_future:20")
    (ended,) = fetch(conn, "SELECT ended_at FROM messenger.call_sessions WHERE id = %s",
                     skewed.session_id)
    sla = dt.timedelta(seconds=cfg.jobs.recording_finalize.finalize_sla_timeout)
    assert attempt(conn, skewed.id)["next_attempt_at"] == ended["ended_at"] + sla
    assert stuck_gauge(conn, cfg) == 1  # the far one; the skewed one is within its SLA


async def test_failed_call_without_ended_at_waits_a_bounded_time_then_gets_a_verdict(
        cfg: Config, conn: psycopg.Connection) -> None:
    """A call Failed with ended_at NULL has ended when it got that status (updated_at):
    the row waits until then + SLA, not one polling interval after another forever; past
    that the stuck SLO counts it and the next cycle gives the verdict (no binary: Failed)."""
    sid = insert_call_session(conn, ended_ago=None, status="Failed")
    rec = insert_recording(conn, session_id=sid)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"rescheduled": 1}
    (session,) = fetch(conn, "SELECT updated_at FROM messenger.call_sessions WHERE id = %s",
                       sid)
    sla = dt.timedelta(seconds=cfg.jobs.recording_finalize.finalize_sla_timeout)
    assert attempt(conn, rec.id)["next_attempt_at"] == session["updated_at"] + sla
    assert stuck_gauge(conn, cfg) == 0

    conn.execute("UPDATE messenger.call_sessions SET updated_at = now() - interval '2 hours'"
                 " WHERE id = %s", (sid,))
    conn.execute("UPDATE messenger.recording_finalize_attempts SET next_attempt_at = now()"
                 " WHERE recording_id = %s", (rec.id,))
    assert stuck_gauge(conn, cfg) == 1
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"failed": 1}
    assert (recording(conn, rec.id)["status"], attempt(conn, rec.id)["status"]) == (
        "Failed", "Done")
    assert stuck_gauge(conn, cfg) == 0
