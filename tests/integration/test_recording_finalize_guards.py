"""recording-finalize against bad rows and numeric edges (issue #13), on real servers."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator

import attrs
import psycopg
import pytest

from actors.finalize_store import claim_due, db_now
from supervision.config import Config
from supervision.devstack import S3Server
from tests.conftest import make_config
from tests.integration.test_recording_finalize import counts_of, run_cycle
from tests.messenger import (
    attempt,
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
