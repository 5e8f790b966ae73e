"""recording-finalize against bad rows and numeric edges (issue #13), on real servers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import attrs
import psycopg
import pytest

from actors.finalize_store import claim_due, db_now
from supervision.config import Config
from supervision.devstack import S3Server
from tests.conftest import make_config
from tests.messenger import attempt, insert_call_session, insert_recording


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
