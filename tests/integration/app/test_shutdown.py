"""`safetynet run` as a real process: graceful SIGTERM, double SIGTERM, escalation exit 1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import tomli_w

from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.logscan import KNOWN_SECRETS, leaks

ROOT = Path(__file__).resolve().parents[3]
ROWS = 3000


def seed_lost_callbacks(dsn: str, rows: int) -> None:
    """*rows* Uploading recordings of long-ended calls, no binaries: each will fail."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO messenger.call_sessions (id, status, started_at, ended_at,"
            " created_at, updated_at) SELECT gen_random_uuid(), 'Ended',"
            " now() - interval '3 hours', now() - interval '2 hours', now(), now()"
            " FROM generate_series(1, %s)", (rows,))
        conn.execute(
            "INSERT INTO messenger.call_recordings (id, session_kind, session_id, chat_id,"
            " media_type, trigger, status, created_at, updated_at)"
            " SELECT gen_random_uuid(), 'Direct', id, gen_random_uuid(), 'Audio', 'Auto',"
            " 'Uploading', now(), now() FROM messenger.call_sessions")
        conn.execute(
            "INSERT INTO messenger.recording_finalize_attempts (id, recording_id,"
            " session_kind, session_id, next_attempt_at, created_at, updated_at)"
            " SELECT gen_random_uuid(), id, 'Direct', session_id, now() - interval '1 minute',"
            " now(), now() FROM messenger.call_recordings")


def write_config(path: Path, dsn: str, s3: S3Server, bucket: str, only_finalize: bool = False,
                 **jobs: object) -> Path:
    creds = s3.credentials
    rf = {"polling_interval": "1s", "batch_size": 25, "lock_ttl": "3m",
          "max_run_duration": "2m", **jobs}
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": bucket, "region": creds.region,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": rf,
                 "conference_reaper": {"enabled": not only_finalize}},
        "outbox_relay": {"enabled": not only_finalize},
        "supervision": {"shutdown_grace": "5s", "max_restarts": 2, "restart_window": "60s"},
        "logging": {"format": "json"},
        # a port of its own: under pytest-xdist another worker's daemon may hold the
        # default one, and this daemon would give up before its first cycle
        "http": {"listen": f"127.0.0.1:{free_ports(1)[0]}"},
    }))
    return path


def start_daemon(config: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "supervision.app", "run", "-c", str(config)],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def scalar(dsn: str, query: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()  # type: ignore[call-overload]
        assert row is not None
        return int(row[0])


def log_tail(log: Path | None) -> str:
    return f"; the daemon's log ends:\n{log.read_text()[-3000:]}" if log else ""


def wait_for(dsn: str, query: str, at_least: int, limit_s: float = 60,
             log: Path | None = None) -> None:
    deadline = time.monotonic() + limit_s
    while scalar(dsn, query) < at_least:
        assert time.monotonic() < deadline, f"timed out waiting for {query}{log_tail(log)}"
        time.sleep(0.05)


DONE = "SELECT count(*) FROM messenger.recording_finalize_attempts WHERE status = 'Done'"
HALF_DONE = """
SELECT count(*) FROM messenger.call_recordings r
JOIN messenger.recording_finalize_attempts a ON a.recording_id = r.id
WHERE (r.status = 'Failed') <> (a.status = 'Done')
   OR (r.status = 'Failed') <> EXISTS (SELECT 1 FROM messenger.realtime_outbox o
                                       WHERE o.reference_id = r.id)
"""
ADVISORY = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"


def events(log: Path) -> list[dict[str, object]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_sigterm_mid_cycle_exits_0_within_grace_with_nothing_half_done(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """SIGTERM while a cycle drains: exit 0 within the grace period, every row either
    fully finalised or untouched, and no advisory lock left held."""
    seed_lost_callbacks(db_dsn, ROWS)
    log = tmp_path / "daemon.log"
    proc = start_daemon(write_config(tmp_path / "c.toml", db_dsn, s3_server, bucket), log)
    try:
        wait_for(db_dsn, DONE, 100, log=log)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(timeout=15)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert code == 0, log.read_text()[-3000:]
    assert took < 5 + 2
    done = scalar(db_dsn, DONE)
    assert 100 <= done < ROWS, "the signal must land mid-cycle for this test to mean much"
    assert scalar(db_dsn, HALF_DONE) == 0
    assert scalar(db_dsn, ADVISORY) == 0
    names = [e.get("event") for e in events(log)]
    assert "shutdown_requested" in names and names[-1] == "daemon_stopped"
    assert leaks(log.read_text(), KNOWN_SECRETS) == [], "the daemon logged a secret"


def test_second_sigterm_stops_at_once_and_still_leaves_nothing_half_done(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """Committers blocked on a lock keep the graceful stop waiting; a second SIGTERM
    forces the stop at once, and PostgreSQL rolls back what did not commit.

    The blocker holds the realtime outbox (a recording row held by another transaction is
    skipped, never waited on, so it cannot hold a committer)."""
    seed_lost_callbacks(db_dsn, 200)
    log = tmp_path / "daemon.log"
    config = write_config(tmp_path / "c.toml", db_dsn, s3_server, bucket)
    config.write_text(config.read_text().replace('shutdown_grace = "5s"',
                                                 'shutdown_grace = "60s"'))
    with psycopg.connect(db_dsn) as blocker:
        blocker.execute("LOCK TABLE messenger.realtime_outbox IN EXCLUSIVE MODE")
        proc = start_daemon(config, log)
        try:
            wait_for(db_dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type ="
                             " 'Lock' AND query LIKE '%call_recordings%'", 1, log=log)
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)  # in-flight rows hold the graceful stop
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            code = proc.wait(timeout=15)
            took = time.monotonic() - sent
        finally:
            proc.kill()
        blocker.rollback()
    assert code == 0, log.read_text()[-3000:]
    assert took < 3
    assert scalar(db_dsn, DONE) == 0
    assert scalar(db_dsn, HALF_DONE) == 0
    assert scalar(db_dsn, ADVISORY) == 0
    names = [e.get("event") for e in events(log)]
    assert "shutdown_forced" in names and names[-1] == "daemon_stopped"


def test_actor_crashing_on_every_start_escalates_and_exits_1(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """safetynet's tables gone behind a ledger that says migrated (a pending migration is
    refused at start instead: test_install) make the job fail every cycle: after
    max_restarts the root gives up with exit 1 and a log line naming the actor and its
    last error."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE safetynet.job_pauses, safetynet.leases CASCADE")
    log = tmp_path / "daemon.log"
    config = write_config(tmp_path / "c.toml", db_dsn, s3_server, bucket,
                          only_finalize=True, polling_interval="100ms")
    proc = start_daemon(config, log)
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert code == 1, log.read_text()[-3000:]
    (failure,) = [e for e in events(log) if e.get("event") == "daemon_failed"]
    assert failure["actor"] == "lock-keeper:recording-finalize"
    # the first thing a keeper reads (the pause flag, then the lease) is in the missing schema
    assert re.search(r'(InvalidSchemaName|UndefinedTable): (schema|relation) "safetynet[.\w]*"'
                     r' does not exist', str(failure["error"])), failure["error"]
    restarts = [e["actor"] for e in events(log) if e.get("event") == "actor_restarted"]
    # the jobs supervisor is itself restarted twice by the root before the root gives up,
    # and each of its three incarnations restarts the keeper twice
    assert restarts.count("jobs") == 2
    assert restarts.count("lock-keeper:recording-finalize") == 6
