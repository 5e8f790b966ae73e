"""Self-healing quarantine (issue #18): rows quarantined by an object-storage outage are
requeued once S3 has been healthy for ``redrive_after``, at most ``redrive_max`` times;
poison never is. Real PostgreSQL, real SeaweedFS behind the fault proxy."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
import structlog
from prometheus_client import REGISTRY

from actors.finalize.cycle import run_finalize_cycle
from actors.finalize.queries import FINALIZE_QUERIES
from actors.finalize.redrive import S3, observe_health
from actors.finalize.state import FinalizeCounts
from actors.leases.lock_keeper import CycleContext
from supervision.app.daemon import open_resources
from supervision.app.runbook import requeue
from supervision.app.settings import Config
from supervision.app.tree import finalize_job
from supervision.dev.s3 import S3Server
from tests.faults import (
    SLOW_DOWN,
    FaultProxy,
    HttpRule,
    put_recordings,
    s3_proxy_fixture,  # noqa: F401
)
from tests.integration.finalize.test_recording_finalize_faults import (
    attempts_by_recording,
    heads_of,
    proxied,
    stuck_recordings,
)
from tests.messenger import (
    fetch,
    insert_attempt,
    insert_call_session,
    new_id,
    recording,
    skip_backoff,
    upload_recording,
)

NO_BREAKER = 10**6  # the outage breaker off: every HEAD is tried and can quarantine


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


async def run_cycle(cfg: Config) -> FinalizeCounts:
    """One recording-finalize cycle with the outage breaker off."""
    async with open_resources(cfg) as res:
        job = attrs.evolve(finalize_job(res), breaker_threshold=NO_BREAKER)
        return await run_finalize_cycle(job, CycleContext("recording-finalize",
                                                          str(uuid.uuid4())))


def redriven_metric() -> float:
    return REGISTRY.get_sample_value("safetynet_recording_finalize_redriven_total") or 0.0


def s3_healthy_since(conn: psycopg.Connection) -> Any:
    rows = {r["dependency"]: r for r in fetch(conn, FINALIZE_QUERIES["dependency_health_list"])}
    return rows[S3]["healthy_since"]


def s3_healthy_for(conn: psycopg.Connection, seconds: float) -> None:
    """Object storage has been healthy for *seconds* already (the state the daemon waits
    for, set directly instead of sleeping it out)."""
    conn.execute("UPDATE safetynet.dependency_health"
                 " SET healthy_since = healthy_since - %s * interval '1 second'"
                 " WHERE healthy_since IS NOT NULL", (seconds,))


def poison_rows(conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> list[str]:
    """Quarantine-bound rows that are poison or bad data, not an outage: a finalize row
    without its recording, an object with an unknown Content-Type, and a row already
    quarantined with a malformed value. Returns their recording ids."""
    sid = insert_call_session(conn)
    missing = new_id()
    insert_attempt(conn, missing, sid)
    (bad_object,) = stuck_recordings(conn, 1)
    upload_recording(s3_server, bad_object, bucket=bucket, content_type="text/plain")
    (malformed,) = stuck_recordings(conn, 1)
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined',"
                 " attempts = 3, last_error = 'malformed:value too long' WHERE recording_id = %s",
                 (malformed,))
    return [missing, bad_object, malformed]


def redrive_events(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "recording_redriven"]


async def test_rows_quarantined_by_an_outage_are_redriven_once_s3_was_healthy_long_enough(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """Object HEADs answer 503 until every row has used max_attempts (2) and is quarantined
    (s3:http_503_SlowDown); cycles during the outage never count S3 healthy. After
    recovery the first healthy cycle redrives nothing; once S3 has been healthy for
    redrive_after, every outage row is redriven — batch_size (5) per cycle, each once,
    logged and counted — and reconciled; the poison rows stay quarantined, never redriven."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, batch_size=5, max_attempts=2,
                  backoff_base="50ms", backoff_cap="200ms", redrive_after="10m",
                  redrive_max=2)
    ids = stuck_recordings(conn, 12)
    await put_recordings(s3_server, bucket, ids)
    poison = poison_rows(conn, s3_server, bucket)
    s3_proxy.rules.append(HttpRule(heads_of(ids), status=503, headers=SLOW_DOWN))
    metric_before = redriven_metric()

    with structlog.testing.capture_logs() as logs:
        for _ in range(2):
            counts = await run_cycle(cfg)
            assert counts.redriven == 0
            assert s3_healthy_since(conn) is None  # transient HEADs: not healthy
            skip_backoff(db_dsn)
        rows = attempts_by_recording(conn)
        assert {(rows[r]["status"], rows[r]["last_error"]) for r in ids} == {
            ("Quarantined", "s3:http_503_SlowDown")}
        assert all(rows[r]["status"] == "Quarantined" for r in poison)

        s3_proxy.rules.clear()  # S3 recovers
        counts = await run_cycle(cfg)
        assert counts.redriven == 0  # healthy only since this cycle began
        assert s3_healthy_since(conn) is not None
        s3_healthy_for(conn, 600)
        per_cycle = []
        while (counts := await run_cycle(cfg)).redriven:
            per_cycle.append(counts.redriven)
            assert counts.reconciled == counts.redriven

    assert per_cycle == [5, 5, 2]
    rows = attempts_by_recording(conn)
    for rid in ids:
        assert rows[rid]["status"] == "Done"
        assert recording(conn, rid)["status"] == "Available"
    assert {r: rows[r]["status"] for r in poison} == dict.fromkeys(poison, "Quarantined")
    events = redrive_events(logs)
    assert Counter(e["recording_id"] for e in events) == Counter(ids)
    assert {(e["reason"], e["redrives"]) for e in events} == {("s3:http_503_SlowDown", 1)}
    assert redriven_metric() == metric_before + 12
    assert fetch(conn, FINALIZE_QUERIES["finalize_redrives_list"]) == []  # Done rows: pruned


async def test_a_row_is_redriven_at_most_redrive_max_times_then_waits_for_a_person(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        s3_proxy: FaultProxy) -> None:
    """S3 keeps failing these rows' HEADs while its probe stays green (redrive_after 0):
    each cycle redrives the outage rows and they are quarantined again, until each has
    been redriven redrive_max (2) times; after that no cycle touches them, even once S3
    has recovered, until `requeue` (which also resets the count) — then they reconcile.
    The poison row is never redriven."""
    cfg = proxied(db_dsn, s3_server, bucket, s3_proxy, max_attempts=1, redrive_after="0s",
                  redrive_max=2)
    ids = stuck_recordings(conn, 4)
    await put_recordings(s3_server, bucket, ids)
    (missing, *_) = poison_rows(conn, s3_server, bucket)
    s3_proxy.rules.append(HttpRule(heads_of(ids), status=500))

    with structlog.testing.capture_logs() as logs:
        redriven = [(await run_cycle(cfg)).redriven for _ in range(6)]
        s3_proxy.rules.clear()
        redriven += [(await run_cycle(cfg)).redriven for _ in range(2)]

    assert redriven == [0, 4, 4, 0, 0, 0, 0, 0]
    counts = {str(r["recording_id"]): r["redrives"]
              for r in fetch(conn, FINALIZE_QUERIES["finalize_redrives_list"])}
    assert counts == dict.fromkeys(ids, 2)
    rows = attempts_by_recording(conn)
    assert {(rows[r]["status"], rows[r]["last_error"]) for r in ids} == {
        ("Quarantined", "s3:http_500")}
    assert rows[missing]["status"] == "Quarantined"
    per_row = Counter(e["recording_id"] for e in redrive_events(logs))
    assert per_row == Counter({rid: 2 for rid in ids})

    requeue(conn, ids, all_quarantined=False)
    assert fetch(conn, FINALIZE_QUERIES["finalize_redrives_list"]) == []
    counts_after = await run_cycle(cfg)
    assert counts_after.reconciled == 4
    assert {attempts_by_recording(conn)[r]["status"] for r in ids} == {"Done"}


def test_s3_health_clock_restarts_after_a_failure_or_a_gap(conn: psycopg.Connection) -> None:
    """Healthy observations keep healthy_since; one unhealthy observation clears it; an
    observation after a gap longer than max_gap starts it again from now."""
    def observe(healthy: bool, healthy_for: float = 0.0, max_gap: float = 3600) -> bool:
        with conn.transaction():
            return observe_health(conn, S3, healthy, healthy_for, max_gap)

    assert observe(True, healthy_for=0)
    s3_healthy_for(conn, 600)
    assert observe(True, healthy_for=600)  # still the same healthy stretch
    assert not observe(False)
    assert s3_healthy_since(conn) is None
    assert not observe(True, healthy_for=1)  # starts again from now
    s3_healthy_for(conn, 600)
    conn.execute("UPDATE safetynet.dependency_health"
                 " SET observed_at = observed_at - interval '2 hours'")
    assert not observe(True, healthy_for=600, max_gap=3600)  # nobody watched: from now
