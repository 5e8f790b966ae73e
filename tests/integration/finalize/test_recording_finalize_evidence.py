"""Genuine verdicts at full speed (issue #25): with default settings a real incident is
finalised in one run (or, for the daemon, within one polling interval), because a Missing
verdict needs evidence, not a quota — real PostgreSQL, SeaweedFS, the S3 worker."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
import tomli_w

from actors.leases.lease import LockConnection
from actors.leases.lock_keeper import LockedJob
from actors.s3.objectstore import Fault, Found, Missing
from actors.s3.process import open_object_store
from supervision.app.daemon import run_once
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import Config
from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.conftest import make_config
from tests.faults import HttpRule, open_fault_proxy, put_recordings, s3_object
from tests.integration.app.test_shutdown import events, start_daemon
from tests.integration.finalize.test_recording_finalize_config_faults import (
    known_present_recording,
    statuses,
)
from tests.messenger import fetch
from tests.waiting import wait_until

FINALIZE = "recording-finalize"
DRAIN_HANG_S = 170.0  # see test_daemon_drains_a_recorder_outage_in_its_first_whole_cycle


@pytest.fixture
def conn(db_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def _seed(conn: psycopg.Connection, count: int) -> list[str]:
    """*count* lost callbacks of calls that ended two hours ago, due now."""
    rows = conn.execute(ALL_QUERIES["dev_seed_recordings"], {"n": count, "available": 0})
    return [str(r[0]) for r in rows.fetchall()]


def pending(conn: psycopg.Connection) -> int:
    (row,) = fetch(conn, "SELECT count(*) AS n FROM messenger.recording_finalize_attempts"
                         " WHERE status = 'Pending'")
    return int(row["n"])


def finalised(counts: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in counts.items() if v and k != "duration_ms"}


async def test_2000_due_with_10_percent_never_uploaded_finish_in_one_run_once(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """Default settings, 2,000 due recordings, 200 of them never uploaded: one run-once
    gives all 2,000 their verdict (1,800 Available, 200 Failed/Timeout), nothing left."""
    ids = _seed(conn, 2000)
    await put_recordings(s3_server, bucket, ids[200:])
    counts = await run_once(make_config(db_dsn, s3_server=s3_server, bucket=bucket), FINALIZE)
    assert finalised(counts) == {"reconciled": 1800, "failed": 200}
    assert statuses(conn, ids) == {"Available": 1800, "Failed": 200}
    assert pending(conn) == 0


async def test_4000_due_at_20ms_s3_latency_with_30_percent_missing_finish_in_one_run_once(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """Default settings, every S3 answer held 20 ms (a real object store, not a local
    one), 4,000 due recordings of which 1,200 have no binary: one run-once finalises all
    4,000 (2,800 Available, 1,200 Failed)."""
    ids = _seed(conn, 4000)
    await put_recordings(s3_server, bucket, ids[1200:])
    endpoint = urlsplit(s3_server.endpoint_url)
    assert endpoint.hostname is not None and endpoint.port is not None
    async with open_fault_proxy(endpoint.hostname, endpoint.port, http=True) as proxy:
        proxy.rules.append(HttpRule(s3_object("HEAD"), latency=0.02, hold=True))
        cfg = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                          s3={"endpoint_url": proxy.url})
        counts = await run_once(cfg, FINALIZE)
    assert finalised(counts) == {"reconciled": 2800, "failed": 1200}
    assert pending(conn) == 0


async def test_standby_of_a_frozen_leader_fails_8000_genuinely_missing_in_one_run_once(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """The leader froze holding the lease, which then expired; its standby's run-once
    takes the lease over and gives all 8,000 genuinely missing recordings (no binary found
    in the whole cycle; the evidence is a recording known to exist) their Failed/Timeout
    verdict at once, not 2,500 a minute."""
    await known_present_recording(conn, s3_server, bucket)
    ids = _seed(conn, 8000)
    frozen = LockConnection(db_dsn)
    job: LockedJob[Any] = LockedJob(FINALIZE, interval=60, lock_ttl=300,
                                    cycle=None)  # type: ignore[arg-type]
    assert await frozen.acquire(job) is not None
    conn.execute("UPDATE safetynet.leases SET expires_at = clock_timestamp() WHERE job = %s",
                 (FINALIZE,))
    try:
        counts = await run_once(make_config(db_dsn, s3_server=s3_server, bucket=bucket),
                                FINALIZE)
    finally:
        frozen.discard()
    assert finalised(counts) == {"failed": 8000}
    assert statuses(conn, ids) == {"Failed": 8000}


def daemon_config(tmp_path: Path, dsn: str, s3_server: S3Server, bucket: str) -> Path:
    creds = s3_server.credentials
    path = tmp_path / "daemon.toml"
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key, "region": creds.region},
        "jobs": {"recording_finalize": {"polling_interval": "1s"},
                 "conference_reaper": {"enabled": False}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{free_ports(1)[0]}"},
    }))
    return path


async def test_daemon_drains_a_recorder_outage_in_its_first_whole_cycle(
        db_dsn: str, conn: psycopg.Connection, s3_server: S3Server, bucket: str,
        tmp_path: Path) -> None:
    """`safetynet run` (1 s polling, everything else default) after a recorder outage
    that lost 95% of the binaries — 6,000 due recordings, 5,700 without a binary (the
    issue's 57,000 of 60,000, scaled to a shared test machine): the first cycle that runs
    to its end gives every recording its verdict, which is what keeps each one within the
    seed's SLO of one polling interval after it became due; the cap that did 50 verdicts a
    cycle would have needed 114 cycles. How long the drain takes is a figure of
    bench/recorder_outage.py, not of this test (a loaded machine took 68 s here)."""
    ids = _seed(conn, 6000)
    await put_recordings(s3_server, bucket, ids[:300])
    log = tmp_path / "daemon.log"
    daemon = start_daemon(daemon_config(tmp_path, db_dsn, s3_server, bucket), log)
    try:
        # a bound on a hang, not on speed: below max_run_duration (180 s by default), so
        # no cycle of this wait can have been cut short by its own deadline
        wait_until(lambda: pending(conn) == 0, DRAIN_HANG_S, "every due recording terminal",
                   step_s=0.2)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    assert statuses(conn, ids) == {"Available": 300, "Failed": 5700}
    worked = [c for c in finalize_cycles(log) if c.get("reconciled") or c.get("failed")]
    assert worked, "no cycle gave a verdict"
    # every cycle before the last one that gave verdicts was cut short, and says so:
    # cancelled (a lost lock) or its breaker opened (S3 answers lost to the load)
    for cycle in worked[:-1]:
        assert cycle["status"] != "ok" or cycle.get("deferred") or cycle.get("transient"), (
            "a whole cycle left verdicts to the next", worked)
    withheld = [e for e in events(log) if e.get("event") == "missing_verdicts_withheld"]
    assert withheld == []


def finalize_cycles(log: Path) -> list[dict[str, Any]]:
    """The daemon's ``cycle_completed`` lines of recording-finalize, in order."""
    return [e for e in events(log)
            if e.get("event") == "cycle_completed" and e.get("job") == FINALIZE]


async def test_listing_under_the_prefix_finds_recordings_and_nothing_elsewhere(
        s3_server: S3Server, bucket: str, db_dsn: str) -> None:
    """The S3 worker's ListObjectsV2 (signed by libcurl, through the same worker as the
    HEADs): a recording-named key under the prefix is found, an empty prefix is not, and
    a store refusing the credentials is a fault, not evidence."""
    prefix = f"list-{uuid.uuid4().hex[:8]}/"
    await put_recordings(s3_server, bucket, ["README", str(uuid.uuid4())], prefix=prefix)
    cfg: Config = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                              s3={"key_prefix": prefix})
    async with open_object_store(cfg.s3) as store:
        listed = await store.list_recordings()
    assert isinstance(listed, Found) and listed.file_id.startswith(prefix)
    empty = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                        s3={"key_prefix": f"empty-{uuid.uuid4().hex[:8]}/"})
    async with open_object_store(empty.s3) as store:
        assert await store.list_recordings() == Missing()
    denied = make_config(db_dsn, s3_server=s3_server, bucket=bucket,
                         s3={"secret_access_key": "not-the-key"})
    async with open_object_store(denied.s3) as store:
        refused = await store.list_recordings()
    assert isinstance(refused, Fault) and refused.error.startswith("access_denied_http_403")
