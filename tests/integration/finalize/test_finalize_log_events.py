"""The finalize seed's log events (its Observability table, "Logs") in a real cycle.

The seed lists: cycle started (jobRunId, AsOf); batch claimed (rows); recording reconciled
(RecordingId, SessionId, FileId, Attempts); recording republished (RecordingId); recording
failed (RecordingId, FailureReason=Timeout); recording quarantined (RecordingId, poison);
cycle completed (reconciled, republished, failed, quarantined, DurationMs) — and no URL or
binary in a log line. One cycle of ``safetynet run-once`` (in process, under the job's
lock, as the daemon runs it) meets one row of each kind on the real servers; the JSON
lines the suite's log buffer caught are read back field by field.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from supervision.app.daemon import run_once
from supervision.dev.s3 import S3Server
from tests.conftest import make_config
from tests.messenger import (
    PREFIX,
    db_now,
    insert_attempt,
    insert_call_session,
    insert_recording,
    upload_recording,
)

JOB = "recording-finalize"


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def job_events(buffer: io.StringIO) -> list[dict[str, Any]]:
    """The JSON lines logged inside the finalize job's cycle (bound to its job name)."""
    lines = (json.loads(line) for line in buffer.getvalue().splitlines() if line.strip())
    return [e for e in lines if e.get("job") == JOB]


def one(events: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (event,) = [e for e in events if e["event"] == name]
    return event


async def test_a_cycle_logs_the_seed_events_with_their_fields_and_counts(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        no_secrets_in_logs: io.StringIO) -> None:
    """One reconciled, one republished, one failed and one quarantined row: cycle_started
    with the run id and AsOf (the database clock), batch_claimed with its rows, one event
    per row with the seed's fields, cycle_completed last with counts 1/1/1/1 and the
    duration; every line carries the same job_run_id and none an URL."""
    found = insert_recording(conn, session_id=insert_call_session(conn))
    upload_recording(s3_server, found.id, bucket=bucket)
    available = insert_recording(conn, session_id=insert_call_session(conn), status="Available")
    upload_recording(s3_server, available.id, bucket=bucket)
    lost = insert_recording(conn, session_id=insert_call_session(conn), status="Recording")
    orphan = str(uuid.uuid4())  # a finalize row whose recording does not exist: poison
    insert_attempt(conn, orphan, insert_call_session(conn))
    cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket)
    before = db_now(conn)

    counts = await run_once(cfg, JOB)

    after = db_now(conn)
    events = job_events(no_secrets_in_logs)
    names = [e["event"] for e in events]
    assert names[0] == "cycle_started" and names[-1] == "cycle_completed", names
    run_ids = {e.get("job_run_id") for e in events}
    assert len(run_ids) == 1 and uuid.UUID(str(run_ids.pop()))

    started = one(events, "cycle_started")
    as_of = dt.datetime.fromisoformat(started["as_of"])
    assert before <= as_of <= after  # AsOf is the database's now()

    assert sum(e["rows"] for e in events if e["event"] == "batch_claimed") == 4

    reconciled = one(events, "recording_reconciled")
    assert (reconciled["recording_id"], reconciled["session_id"], reconciled["file_id"],
            reconciled["attempts"]) == (found.id, found.session_id, f"{PREFIX}{found.id}", 1)
    assert one(events, "recording_republished")["recording_id"] == available.id
    failed = one(events, "recording_failed")
    assert (failed["recording_id"], failed["failure_reason"]) == (lost.id, "Timeout")
    quarantined = one(events, "recording_quarantined")
    assert quarantined["recording_id"] == orphan
    assert quarantined["reason"] == "recording_missing"

    completed = one(events, "cycle_completed")
    assert completed["status"] == "ok"
    assert {k: completed[k] for k in ("reconciled", "republished", "failed", "quarantined")
            } == {"reconciled": 1, "republished": 1, "failed": 1, "quarantined": 1}
    assert isinstance(completed["duration_ms"], int) and completed["duration_ms"] >= 0
    assert completed["duration_ms"] == counts["duration_ms"]
    assert not any("http://" in json.dumps(e) or "https://" in json.dumps(e) for e in events)
