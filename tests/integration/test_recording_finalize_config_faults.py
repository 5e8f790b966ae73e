"""A wrong configuration must not turn present binaries into Failed verdicts (issue #13):
the positive canary, the must-not-exist canary and the per-cycle cap on Missing verdicts,
on real PostgreSQL and SeaweedFS."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from supervision.config import Config
from supervision.dev.stack import DevStackError, S3Server
from supervision.health import HEALTH
from supervision.queries import QUERIES
from tests.conftest import make_config
from tests.faults import put_recordings
from tests.integration.test_recording_finalize import counts_of, run_cycle
from tests.messenger import (
    attempt,
    fetch,
    insert_attempt,
    insert_call_session,
    insert_recording,
)

OTHER_BUCKET = "call-recordings-elsewhere"


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture(autouse=True)
def clean_health() -> Iterator[None]:
    yield
    HEALTH.clear_fault("s3")


@pytest.fixture(scope="module")
def other_bucket(s3_server: S3Server) -> str:
    """A bucket that exists but holds none of the recordings."""
    with contextlib.suppress(DevStackError):  # there already from an earlier run
        s3_server.create_bucket(OTHER_BUCKET)
    return OTHER_BUCKET


def config(db_dsn: str, s3_server: S3Server, bucket: str, **s3: Any) -> Config:
    return make_config(db_dsn, s3_server=s3_server, bucket=bucket, s3=s3)


async def due_recordings_with_binaries(conn: psycopg.Connection, s3_server: S3Server,
                                       bucket: str, count: int) -> list[str]:
    """*count* lost callbacks of long-ended calls, due now, each binary uploaded at
    ``call-recordings/{id}``."""
    rows = conn.execute(QUERIES["dev_seed_recordings"], {"n": count, "available": 0}
                        ).fetchall()
    ids = [str(r[0]) for r in rows]
    await put_recordings(s3_server, bucket, ids)
    return ids


async def known_present_recording(conn: psycopg.Connection, s3_server: S3Server,
                                  bucket: str) -> str:
    """An Available recording finalised earlier (its row Done), its binary in place."""
    rid = insert_recording(conn, session_id=insert_call_session(conn), status="Available",
                           with_attempt=False).id
    insert_attempt(conn, rid, str(uuid.uuid4()), status="Done")
    await put_recordings(s3_server, bucket, [rid])
    return rid


def statuses(conn: psycopg.Connection, ids: list[str]) -> dict[str, int]:
    rows = fetch(conn, "SELECT status, count(*) AS n FROM messenger.call_recordings"
                       " WHERE id = ANY(%s::uuid[]) GROUP BY status", ids)
    return {r["status"]: r["n"] for r in rows}


def attempts_spent(conn: psycopg.Connection, ids: list[str]) -> int:
    (row,) = fetch(conn, "SELECT COALESCE(sum(attempts), 0) AS n"
                         " FROM messenger.recording_finalize_attempts"
                         " WHERE recording_id = ANY(%s::uuid[])", ids)
    return int(row["n"])


@pytest.mark.parametrize("wrong", ["key_prefix", "bucket"])
async def test_wrong_prefix_or_bucket_fails_nothing_and_fixing_it_heals_everything(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        other_bucket: str, wrong: str) -> None:
    """1,000 due recordings whose binaries exist, and a daemon pointed at the wrong prefix
    (or at a bucket that exists but is the wrong one): the recording known to be present
    answers 404, so each cycle is a configuration fault — after 5 cycles nothing is Failed
    and no attempt is spent. With the configuration fixed, all 1,000 become Available."""
    ids = await due_recordings_with_binaries(conn, s3_server, bucket, 1000)
    known = await known_present_recording(conn, s3_server, bucket)
    misconfigured = (config(db_dsn, s3_server, bucket, key_prefix="call-recordngs/")
                     if wrong == "key_prefix" else config(db_dsn, s3_server, other_bucket))

    for _ in range(5):
        counts = await run_cycle(misconfigured)
        assert counts_of(counts) == {}
    assert statuses(conn, ids) == {"Uploading": 667, "Recording": 333}
    assert attempts_spent(conn, ids) == 0
    assert HEALTH.reason() == f"configuration fault in s3: known_recording_not_found:{known}"

    healed = await run_cycle(config(db_dsn, s3_server, bucket))
    assert counts_of(healed) == {"reconciled": 1000}
    assert statuses(conn, ids) == {"Available": 1000}
    assert HEALTH.reason() is None


async def test_missing_verdicts_past_the_cycle_cap_are_given_back_untouched(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """With no Available recording to compare with, the canaries cannot see a wrong
    prefix: the cap is the second line. One cycle gives max_failed_per_cycle (50) Failed
    verdicts; the other 70 rows are given back untouched (no attempt spent) and counted
    in safetynet_recording_finalize_verdicts_withheld_total; with the prefix fixed they
    are reconciled."""
    ids = await due_recordings_with_binaries(conn, s3_server, bucket, 120)
    before = REGISTRY.get_sample_value(
        "safetynet_recording_finalize_verdicts_withheld_total") or 0.0
    counts = await run_cycle(config(db_dsn, s3_server, bucket, key_prefix="call-recordngs/"))

    assert counts_of(counts) == {"failed": 50, "withheld": 70}
    assert REGISTRY.get_sample_value(
        "safetynet_recording_finalize_verdicts_withheld_total") == before + 70
    failed = [rid for rid in ids if attempt(conn, rid)["status"] == "Done"]
    held = [rid for rid in ids if rid not in failed]
    assert len(failed) == 50 and attempts_spent(conn, held) == 0
    assert {attempt(conn, rid)["status"] for rid in held} == {"Pending"}

    healed = await run_cycle(config(db_dsn, s3_server, bucket))
    assert counts_of(healed) == {"reconciled": 70}
    assert statuses(conn, held) == {"Available": 70}


async def test_must_not_exist_canary_answering_200_is_a_configuration_fault(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """The probe key under the prefix exists (as behind an endpoint that answers 200 to
    anything): its HEADs cannot tell present from missing, so nothing is claimed."""
    prefix = f"canary-{uuid.uuid4().hex[:8]}/"
    await put_recordings(s3_server, bucket, ["__safetynet_probe__"], prefix=prefix)
    rec = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=3600))
    counts = await run_cycle(config(db_dsn, s3_server, bucket, key_prefix=prefix))
    assert counts_of(counts) == {}
    assert attempt(conn, rec.id)["attempts"] == 0
    assert HEALTH.reason() == "configuration fault in s3: canary_key_exists"
