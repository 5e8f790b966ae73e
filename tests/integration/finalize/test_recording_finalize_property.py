"""recording-finalize as a property: whatever mix of rows and first-cycle S3 faults, once S3
is healthy the job converges — real PostgreSQL, real SeaweedFS behind the fault proxy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import attrs
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from actors.envelope import TOPIC_RECORDING_AVAILABLE
from supervision.app.settings import Config
from supervision.dev.processes import DevStackError
from supervision.dev.s3 import S3Server
from tests.conftest import make_config
from tests.faults import (
    SLOW_DOWN,
    HttpRule,
    open_fault_proxy,
    put_recordings,
    s3_object,
)
from tests.integration.finalize.test_recording_finalize import run_cycle
from tests.messenger import (
    attempt,
    fetch,
    insert_attempt,
    insert_call_session,
    insert_recording,
    outbox_rows,
    recording,
)

ENDED_AGO = {"long_ago": 3600.0, "recently": 60.0, "live": None}  # SLA is 30 minutes
FAULTS = {
    "http_500": {"status": 500},
    "slow_down": {"status": 503, "headers": SLOW_DOWN},
    "reset": {"reset_after": 0},
}
BAD_BINARIES = {"bad_type": {"content_type": "application/octet-stream"},
                "no_duration": {"duration": None}}


@attrs.frozen
class Row:
    """One finalize row of an example and the world around it."""

    status: str     # the recording's: Recording | Uploading | Available | Failed | Missing
    session: str    # long_ago | recently | live
    binary: str     # none | good | bad_type | no_duration
    published: bool  # Available only: its outbox row already exists
    attempts: int
    fault: str | None  # first-cycle fault on this recording's object HEAD

    @property
    def head_needed(self) -> bool:
        return self.status in ("Recording", "Uploading") and self.session == "long_ago"


def normalised(row: Row) -> Row:
    """Failed recordings have no binary (what the job must never produce, it is not fed);
    Available ones have theirs (the positive canary HEADs them: one without is a fault)."""
    if row.status == "Failed":
        return attrs.evolve(row, binary="none")
    if row.status == "Available" and row.binary == "none":
        return attrs.evolve(row, binary="good")
    return row


ROWS = st.lists(st.builds(  # weighted towards rows that need a HEAD, and faults on them
    Row,
    status=st.sampled_from(["Uploading"] * 3 + ["Recording"] * 2
                           + ["Available", "Failed", "Missing"]),
    session=st.sampled_from(["long_ago"] * 3 + ["recently", "live"]),
    binary=st.sampled_from(["good"] * 3 + ["none"] * 2 + list(BAD_BINARIES)),
    published=st.booleans(),
    attempts=st.integers(min_value=0, max_value=7),
    fault=st.sampled_from([None, None, *FAULTS]),
).map(normalised), min_size=3, max_size=12)


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def seed(conn: psycopg.Connection, rows: list[Row]) -> list[str]:
    """Write an example's rows (after emptying the tables); its recording ids, in order."""
    conn.execute("TRUNCATE messenger.call_sessions, messenger.call_recordings,"
                 " messenger.recording_finalize_attempts, messenger.integration_outbox,"
                 " messenger.realtime_outbox")
    ids = []
    for row in rows:
        sid = insert_call_session(conn, ended_ago=ENDED_AGO[row.session])
        if row.status == "Missing":
            rid = str(uuid.uuid4())
            insert_attempt(conn, rid, sid, attempts=row.attempts)
        else:
            rid = insert_recording(conn, session_id=sid, status=row.status,
                                   attempts=row.attempts).id
            if row.published and row.status == "Available":
                conn.execute(
                    "INSERT INTO messenger.integration_outbox (topic, message_key,"
                    " dedupe_key, event_type, payload) VALUES (%s, %s, %s,"
                    " 'CallRecordingAvailable', '{}')", (TOPIC_RECORDING_AVAILABLE, sid, rid))
        ids.append(rid)
    return ids


async def upload(s3: S3Server, bucket: str, prefix: str, rows: list[Row],
                 ids: list[str]) -> None:
    good = [rid for row, rid in zip(rows, ids, strict=True) if row.binary == "good"]
    # and a recording of an earlier day, as under every prefix in use: the listing shows
    # it, so a 404 is a verdict even in an example where no binary of its own exists
    await put_recordings(s3, bucket, [*good, str(uuid.uuid4())], prefix=prefix)
    for kind, overrides in BAD_BINARIES.items():
        bad = [rid for row, rid in zip(rows, ids, strict=True) if row.binary == kind]
        await put_recordings(s3, bucket, bad, prefix=prefix, **overrides)


def make_all_due(conn: psycopg.Connection) -> None:
    conn.execute("UPDATE messenger.recording_finalize_attempts"
                 " SET next_attempt_at = now() - interval '1 second' WHERE status = 'Pending'")


# Each example costs ~0.5 s of real servers: no shrinking (hundreds of examples); a failure
# reports its example as generated (at most 12 rows, readable) and the database replays it.
@settings(max_examples=20, deadline=None,
          phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rows=ROWS)
async def test_job_converges_after_transient_faults(
        rows: list[Row], db_dsn: str, conn: psycopg.Connection, s3_server: S3Server,
        bucket: str) -> None:
    """After one cycle with transient HEAD faults and further cycles with S3 healthy: every
    row whose session ended long ago is Done or Quarantined (quarantined only for bad
    metadata, a missing recording, or a transient failure of its last attempt) and its
    recording Available exactly when its binary is good, else Failed; rows still
    inside the SLA are untouched; every Available recording has exactly one outbox row; no
    Failed recording has a binary in S3. Rows whose object has an unusable Content-Type may
    instead be given back untouched when at least three of them and no usable object made
    a cycle's configuration fault (issue #25)."""
    prefix = f"prop-{uuid.uuid4().hex[:8]}/"
    ids = seed(conn, rows)
    await upload(s3_server, bucket, prefix, rows, ids)
    endpoint = urlsplit(s3_server.endpoint_url)
    assert endpoint.hostname is not None and endpoint.port is not None
    async with open_fault_proxy(endpoint.hostname, endpoint.port, http=True) as proxy:
        cfg: Config = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                                  s3={"endpoint_url": proxy.url, "key_prefix": prefix})
        max_attempts = cfg.jobs.recording_finalize.max_attempts
        for kind, rule in FAULTS.items():
            keys = {f"{prefix}{rid}" for row, rid in zip(rows, ids, strict=True)
                    if row.fault == kind}
            proxy.rules.append(HttpRule(s3_object("HEAD", prefix=prefix, keys=keys), **rule))
        await run_cycle(cfg)
        proxy.clear()
        for _ in range(2):
            make_all_due(conn)
            await run_cycle(cfg)

    held_types = [rid for row, rid in zip(rows, ids, strict=True) if row.head_needed
                  and row.binary == "bad_type" and attempt(conn, rid)["status"] == "Pending"]
    assert not held_types or len(held_types) >= 3, held_types
    for row, rid in zip(rows, ids, strict=True):
        fin = attempt(conn, rid)
        if rid in held_types:  # the content-type fault: given back, attempts kept as were
            assert fin["attempts"] in (row.attempts, row.attempts + 1), (row, fin)
            assert recording(conn, rid)["status"] == row.status
            continue
        if row.status == "Missing":
            assert (fin["status"], fin["last_error"]) == ("Quarantined", "recording_missing")
            continue
        rec = recording(conn, rid)
        if row.status in ("Available", "Failed"):  # terminal: no S3, no session needed
            assert (fin["status"], rec["status"]) == ("Done", row.status)
        elif not row.head_needed:
            assert (fin["status"], fin["attempts"], rec["status"]) == (
                "Pending", row.attempts, row.status)
        elif fin["status"] == "Quarantined":
            last_attempt_failed = (row.attempts == max_attempts - 1
                                   and fin["last_error"].startswith("s3:"))
            bad_metadata = (row.binary in BAD_BINARIES
                            and fin["last_error"].startswith("object:"))
            assert last_attempt_failed or bad_metadata, (row, fin["last_error"])
            assert rec["status"] == row.status
        else:
            assert row.binary not in BAD_BINARIES and fin["status"] == "Done", row
            assert rec["status"] == ("Available" if row.binary == "good" else "Failed")
    for available in fetch(conn, "SELECT id FROM messenger.call_recordings"
                                 " WHERE status = 'Available'"):
        assert len(outbox_rows(conn, str(available["id"]))) == 1
    for failed in fetch(conn, "SELECT id FROM messenger.call_recordings WHERE status = 'Failed'"):
        with pytest.raises(DevStackError, match="404"):
            s3_server.head_object(bucket, f"{prefix}{failed['id']}")
