"""recording-finalize on real PostgreSQL and SeaweedFS: the seed's test table and SPEC §3/§4."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import psycopg
import pytest
import structlog
import trio

from actors.envelope import TOPIC_RECORDING_AVAILABLE, event_id
from actors.finalize.cycle import run_finalize_cycle
from actors.finalize.state import FinalizeCounts
from actors.leases.lock_keeper import CycleContext, serve_lock_keeper
from supervision.app.daemon import open_resources
from supervision.app.settings import Config
from supervision.dev.s3 import S3Server
from supervision.tree.health import HEALTH
from tests.conftest import make_config
from tests.messenger import (
    attempt,
    insert_attempt,
    insert_call_session,
    insert_recording,
    outbox_rows,
    realtime_rows,
    recording,
    upload_recording,
)
from tests.waiting import wait_until


async def run_cycle(cfg: Config) -> FinalizeCounts:
    async with open_resources(cfg) as res:
        from supervision.app.tree import finalize_job

        ctx = CycleContext("recording-finalize", str(uuid.uuid4()))
        return await run_finalize_cycle(finalize_job(res), ctx)


@pytest.fixture
def conn(db_dsn: str) -> Any:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def cfg(db_dsn: str, s3_server: S3Server, bucket: str) -> Config:
    return make_config(db_dsn, s3_server=s3_server, bucket=bucket)


def counts_of(c: FinalizeCounts) -> dict[str, int]:
    data = c.as_json()
    data.pop("duration_ms")
    return {k: v for k, v in data.items() if v}


async def test_empty_batch_is_a_no_op(cfg: Config, conn: psycopg.Connection) -> None:
    """Nothing due: success with no mutation and no event."""
    sid = insert_call_session(conn)
    future = insert_recording(conn, session_id=sid, due_ago=-600)  # due in 10 minutes
    before = attempt(conn, future.id)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {}
    assert attempt(conn, future.id) == before
    assert outbox_rows(conn) == [] and realtime_rows(conn) == []


async def test_lost_callback_with_binary_becomes_available_with_event(
        cfg: Config, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """Uploading, session ended > SLA ago, binary present: adopt metadata, Available,
    one call-recording-available outbox row, realtime RecordingAvailable, row Done."""
    sid = insert_call_session(conn, ended_ago=3600)
    rec = insert_recording(conn, session_id=sid)
    upload_recording(s3_server, rec.id, body=b"x" * 777, content_type="video/webm",
                     duration="95", bucket=bucket)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"reconciled": 1}
    row = recording(conn, rec.id)
    assert (row["status"], row["file_id"], row["size_bytes"], row["format"],
            row["duration_seconds"]) == ("Available", f"call-recordings/{rec.id}", 777,
                                         "Webm", 95)
    assert row["available_at"] is not None
    (event,) = outbox_rows(conn, rec.id)
    assert event["topic"] == TOPIC_RECORDING_AVAILABLE
    assert event["message_key"] == sid
    assert event["event_type"] == "CallRecordingAvailable"
    assert event["headers"]["event-id"] == event_id(TOPIC_RECORDING_AVAILABLE, rec.id)
    assert event["headers"]["source"] == "safetynet.recording-finalize"
    assert event["headers"]["content-type"] == "application/json"
    (rt,) = realtime_rows(conn, rec.id)
    assert (rt["kind"], rt["target_kind"], rt["session_kind"]) == (
        "RecordingAvailable", "ChatGroup", "Direct")
    assert attempt(conn, rec.id)["status"] == "Done"


async def test_event_payload_matches_spec_field_by_field(
        cfg: Config, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """PascalCase fields of SPEC §4, ISO-8601 UTC timestamps with Z, no URL."""
    sid = insert_call_session(conn)
    rec = insert_recording(conn, session_id=sid)
    upload_recording(s3_server, rec.id, bucket=bucket)
    await run_cycle(cfg)
    (event,) = outbox_rows(conn, rec.id)
    payload = event["payload"]
    row = recording(conn, rec.id)
    assert list(payload) == sorted(payload) or set(payload) == {
        "RecordingId", "SessionKind", "SessionId", "ChatId", "DealId", "TenantId", "MediaType",
        "FileId", "Format", "DurationSeconds", "SizeBytes", "Trigger", "StartedAt", "EndedAt",
        "AvailableAt"}
    assert set(payload) == {
        "RecordingId", "SessionKind", "SessionId", "ChatId", "DealId", "TenantId", "MediaType",
        "FileId", "Format", "DurationSeconds", "SizeBytes", "Trigger", "StartedAt", "EndedAt",
        "AvailableAt"}
    assert payload["RecordingId"] == rec.id and payload["SessionId"] == sid
    assert payload["ChatId"] == str(row["chat_id"]) and payload["DealId"] == str(row["deal_id"])
    assert (payload["MediaType"], payload["Trigger"], payload["Format"]) == (
        "Audio", "Manual", "Ogg")
    assert payload["DurationSeconds"] == 42 and payload["SizeBytes"] == 64
    for field in ("StartedAt", "EndedAt", "AvailableAt"):
        assert payload[field].endswith("Z")
        parsed = dt.datetime.fromisoformat(payload[field].replace("Z", "+00:00"))
        assert abs(parsed - row[field.replace("At", "_at").lower()]) < dt.timedelta(
            milliseconds=1)
    assert "http" not in json.dumps(payload)


async def test_lost_callback_without_binary_fails_with_timeout(
        cfg: Config, conn: psycopg.Connection) -> None:
    """No binary after the SLA: Failed/Timeout, realtime RecordingFailed, no Kafka event."""
    sid = insert_call_session(conn, ended_ago=3600)
    rec = insert_recording(conn, session_id=sid, status="Recording")
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"failed": 1}
    row = recording(conn, rec.id)
    assert (row["status"], row["failure_reason"]) == ("Failed", "Timeout")
    assert [r["kind"] for r in realtime_rows(conn, rec.id)] == ["RecordingFailed"]
    assert outbox_rows(conn) == []
    assert attempt(conn, rec.id)["status"] == "Done"


async def test_available_but_unpublished_is_republished_once(
        cfg: Config, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """A crash between → Available and publish: one outbox row; a second cycle adds none."""
    sid = insert_call_session(conn)
    rec = insert_recording(conn, session_id=sid, status="Available")
    upload_recording(s3_server, rec.id, bucket=bucket)  # Available: its binary is there
    first = await run_cycle(cfg)
    insert_attempt(conn, str(uuid.uuid4()), sid)  # unrelated noise: recording missing
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Pending',"
                 " next_attempt_at = now() - interval '1 second' WHERE recording_id = %s",
                 (rec.id,))
    second = await run_cycle(cfg)
    assert first.republished == 1 and second.republished == 0
    assert len(outbox_rows(conn, rec.id)) == 1
    assert [r["kind"] for r in realtime_rows(conn, rec.id)] == ["RecordingAvailable"]
    assert attempt(conn, rec.id)["status"] == "Done"


async def test_a_claim_takes_batch_size_rows_however_large_the_reconciler_pool(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """batch_size 2 at s3.concurrency 8 (a pool of 16 reconcilers): the operator's batch
    size stands — 5 due rows take claims of 2, 2 and 1 — and every row is committed once."""
    cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket, s3={"concurrency": 8},
                      jobs={"recording_finalize": {"batch_size": 2}})
    sid = insert_call_session(conn)
    recs = [insert_recording(conn, session_id=sid, status="Available") for _ in range(5)]
    for rec in recs:
        upload_recording(s3_server, rec.id, bucket=bucket)
    with structlog.testing.capture_logs() as logs:
        counts = await run_cycle(cfg)
    assert [e["rows"] for e in logs if e["event"] == "batch_claimed"] == [2, 2, 1]
    assert counts.republished == 5
    assert {attempt(conn, rec.id)["status"] for rec in recs} == {"Done"}


async def test_callback_won_the_race_so_the_transition_is_a_no_op(
        cfg: Config, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """Version guard: the ingest callback committed Available (with its event) before the
    tick; the worker neither transitions nor duplicates the event."""
    sid = insert_call_session(conn)
    rec = insert_recording(conn, session_id=sid, status="Available",
                           file_id="call-recordings/from-callback")
    conn.execute(
        "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,"
        " payload) VALUES (%s, %s, %s, 'CallRecordingAvailable', '{}')",
        (TOPIC_RECORDING_AVAILABLE, sid, rec.id))
    upload_recording(s3_server, rec.id, bucket=bucket)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {}
    assert recording(conn, rec.id)["file_id"] == "call-recordings/from-callback"
    assert len(outbox_rows(conn, rec.id)) == 1 and realtime_rows(conn, rec.id) == []
    assert attempt(conn, rec.id)["status"] == "Done"


async def test_transient_s3_error_backs_off_and_keeps_the_row_pending(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """Object storage unreachable: Pending, attempts+1, next_attempt_at moved by the
    back-off (within ± jitter), last_error says class and code."""
    cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                      s3={"endpoint_url": "http://127.0.0.1:9", "timeout": "1s"})
    sid = insert_call_session(conn)
    rec = insert_recording(conn, session_id=sid, attempts=2)
    counts = await run_cycle(cfg)
    # the bucket probe fails first, so no attempt is consumed: the breaker holds the row
    assert counts_of(counts) == {}
    assert attempt(conn, rec.id)["attempts"] == 2


async def test_poison_recording_missing_is_quarantined_with_reason(
        cfg: Config, conn: psycopg.Connection) -> None:
    """A finalize row whose recording does not exist: quarantined at once, with why."""
    orphan = str(uuid.uuid4())
    insert_attempt(conn, orphan, str(uuid.uuid4()))
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"quarantined": 1}
    row = attempt(conn, orphan)
    assert (row["status"], row["last_error"]) == ("Quarantined", "recording_missing")


@pytest.mark.parametrize(("content_type", "duration", "reason"), [
    ("application/octet-stream", "42", "object:content_type_unknown:application/octet-stream"),
    ("audio/ogg", None, "object:duration_missing"),
    ("audio/ogg", "forty", "object:duration_invalid:forty"),
])
async def test_object_with_bad_metadata_is_quarantined_at_once(
        cfg: Config, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        content_type: str, duration: str | None, reason: str) -> None:
    """Unknown Content-Type or missing/invalid duration: quarantine with a reason; the
    recording is not touched."""
    sid = insert_call_session(conn)
    rec = insert_recording(conn, session_id=sid)
    upload_recording(s3_server, rec.id, content_type=content_type, duration=duration,
                     bucket=bucket)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"quarantined": 1}
    assert (attempt(conn, rec.id)["status"], attempt(conn, rec.id)["last_error"]) == (
        "Quarantined", reason)
    assert recording(conn, rec.id)["status"] == "Uploading"


async def test_session_not_ended_is_rescheduled_without_an_attempt(
        cfg: Config, conn: psycopg.Connection) -> None:
    """A live session (or one inside the SLA) is not an attempt: attempts unchanged, the
    row comes back at ended_at + SLA (or after a polling interval while it is live)."""
    live = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=None))
    recent = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=60))
    counts = await run_cycle(cfg)
    assert counts.rescheduled == 2 and counts_of(counts) == {"rescheduled": 2}
    for rec in (live, recent):
        row = attempt(conn, rec.id)
        assert (row["status"], row["attempts"]) == ("Pending", 0)
    ended = conn.execute("SELECT ended_at FROM messenger.call_sessions WHERE id = %s",
                         (recent.session_id,)).fetchone()
    assert ended is not None
    assert attempt(conn, recent.id)["next_attempt_at"] == ended[0] + dt.timedelta(minutes=30)
    assert recording(conn, live.id)["status"] == "Uploading"


async def test_bucket_missing_is_a_config_fault_that_consumes_nothing(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server) -> None:
    """No bucket: claim nothing, attempts untouched, readiness fault raised."""
    cfg = make_config(db_dsn, s3_server=s3_server, bucket="no-such-bucket-here")
    rec = insert_recording(conn, session_id=insert_call_session(conn))
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {}
    assert (attempt(conn, rec.id)["attempts"], attempt(conn, rec.id)["status"]) == (
        0, "Pending")
    assert HEALTH.reason() == "configuration fault in s3: bucket_missing"
    HEALTH.clear_fault("s3")


async def test_access_denied_is_a_config_fault_that_consumes_nothing(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """Wrong credentials (403): nothing claimed, readiness fault raised."""
    cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                      s3={"secret_access_key": "wrong-secret"})
    rec = insert_recording(conn, session_id=insert_call_session(conn))
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {}
    assert attempt(conn, rec.id)["attempts"] == 0
    reason = HEALTH.reason()
    assert reason is not None and "access_denied" in reason
    HEALTH.clear_fault("s3")


async def test_malformed_row_is_quarantined_and_the_rest_of_the_group_commits(
        cfg: Config, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """A duration that would overflow the column is quarantined with the reason (it is
    refused when the HEAD is classified, before any statement could fail on it); the
    others of its group are reconciled with their events."""
    sid = insert_call_session(conn)
    good = [insert_recording(conn, session_id=sid) for _ in range(4)]
    bad = insert_recording(conn, session_id=sid)
    for rec in good:
        upload_recording(s3_server, rec.id, bucket=bucket)
    upload_recording(s3_server, bad.id, duration="99999999999", bucket=bucket)
    counts = await run_cycle(cfg)
    assert counts_of(counts) == {"reconciled": 4, "quarantined": 1}
    for rec in good:
        assert recording(conn, rec.id)["status"] == "Available"
        assert len(outbox_rows(conn, rec.id)) == 1
    row = attempt(conn, bad.id)
    assert (row["status"], row["last_error"]) == ("Quarantined",
                                                 "object:duration_invalid:99999999999")
    assert recording(conn, bad.id)["status"] == "Uploading"
    assert outbox_rows(conn, bad.id) == []


async def test_no_recording_stays_uploading_past_sla_plus_interval(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """SLO: with the job running (SLA 2 s, interval 0.5 s), a recording whose session just
    ended is terminal no later than ended_at + SLA + interval (+ 1.5 s for the cycle)."""
    sla, interval = 2.0, 0.5
    cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket, jobs={"recording_finalize": {
        "finalize_sla_timeout": sla, "polling_interval": interval, "lock_ttl": "30s",
        "max_run_duration": "20s"}})
    found = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=0))
    missing = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=0))
    upload_recording(s3_server, found.id, bucket=bucket)
    async with open_resources(cfg) as res, trio.open_nursery() as nursery:
        from supervision.app.tree import locked_jobs

        (job,) = [j for j in locked_jobs(res) if j.name == "recording-finalize"]
        await nursery.start(serve_lock_keeper, job, db_dsn)
        await trio.to_thread.run_sync(wait_until, lambda: all(
            recording(conn, r.id)["status"] in ("Available", "Failed")
            for r in (found, missing)), 20, "both recordings terminal")
        nursery.cancel_scope.cancel()
    for rec, status in ((found, "Available"), (missing, "Failed")):
        row = recording(conn, rec.id)
        ended = conn.execute("SELECT ended_at FROM messenger.call_sessions WHERE id = %s",
                             (rec.session_id,)).fetchone()
        assert ended is not None and row["status"] == status
        deadline = ended[0] + dt.timedelta(seconds=sla + interval + 1.5)  # + cycle time
        assert row["updated_at"] <= deadline, (row["updated_at"] - ended[0])
        assert attempt(conn, rec.id)["attempts"] == 1, "waiting for the SLA is not an attempt"
