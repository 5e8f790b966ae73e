"""Every verdict comes from the database clock: the daemon under a clock skewed by hours.

One dataset — recordings on both sides of the SLA and of their due time, conferences on
both sides of each reaper window — is copied into three databases. ``safetynet run-once``
of recording-finalize and then of conference-reaper runs against each: once with the
machine's clock, once under Debian's ``faketime`` three hours ahead, once three hours
behind. The whole process is skewed, its monotonic clock too (it moves at the true rate
from a shifted origin, which trio's timers do not mind): with
``FAKETIME_DONT_FAKE_MONOTONIC=1``, Debian's libfaketime 0.9.10 makes ``time.sleep`` fail
with EINVAL (its ``clock_nanosleep`` wrapper), which psycopg_pool's reconnect path calls.
The three databases must then hold the same rows: the same terminal states, failure and
end reasons, attempts, outbox and realtime rows, and every timestamp the daemon wrote
within two minutes of the unskewed run's (a wall-clock verdict would be three hours off, or
flip a row across its window).

The S3 worker the daemon spawns gets an allow-listed environment
(:func:`actors.s3.process.worker_environment`), so it does not inherit ``LD_PRELOAD``: it
signs with the true time, as S3 requires (a SigV4 date more than 15 minutes off is refused
by any S3), and reports HEAD outcomes, never verdicts.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from supervision.dev.postgres import PostgresServer
from supervision.dev.s3 import S3Server
from tests.messenger import (
    fetch,
    insert_attempt,
    insert_call_session,
    insert_conference,
    insert_recording,
    upload_recording,
)

ROOT = Path(__file__).resolve().parents[3]
FAKETIME = shutil.which("faketime")
SKEW = dt.timedelta(hours=3)
TOLERANCE = dt.timedelta(minutes=2)  # run-to-run drift; a skew leak would be 3 hours
JOBS = ("recording-finalize", "conference-reaper")

pytestmark = pytest.mark.skipif(
    FAKETIME is None,
    reason="faketime not installed: .ci/run installs Debian's faketime package")

# every table the two jobs write, with the columns that identify a row across databases
TABLES = {
    "call_recordings": ("id",),
    "recording_finalize_attempts": ("id",),
    "conference_sessions": ("id",),
    "conference_participants": ("conference_id", "user_id"),
    "integration_outbox": ("topic", "dedupe_key"),
    "realtime_outbox": ("reference_id", "kind"),
}
DURATIONS = {"duration_seconds", "DurationSeconds"}  # AsOf - started_at: seconds per second
SERIAL = {"id"}  # identity columns of the outbox tables: insertion order, not a verdict


def plant(conn: psycopg.Connection, s3_server: S3Server, bucket: str) -> None:
    """Rows whose verdict flips if the daemon reads its own clock three hours off."""
    ended_long_ago, ended_just_now = 3600.0, 600.0  # the SLA is 30 minutes
    for with_binary in (True, False):  # past the SLA: Available / Failed Timeout
        rec = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=ended_long_ago),
                               status="Uploading" if with_binary else "Recording")
        if with_binary:
            upload_recording(s3_server, rec.id, bucket=bucket)
    # inside the SLA (+3 h would fail it), no binary yet: rescheduled, not failed
    insert_recording(conn, session_id=insert_call_session(conn, ended_ago=ended_just_now),
                     status="Recording")
    # due in an hour (+3 h would claim it): untouched
    insert_recording(conn, session_id=insert_call_session(conn), status="Recording",
                     due_ago=-3600)
    # due two hours ago, though (-3 h would not claim it): Failed Timeout
    insert_recording(conn, session_id=insert_call_session(conn), status="Recording",
                     due_ago=2 * 3600)
    # the session still going on: rescheduled
    insert_recording(conn, session_id=insert_call_session(conn, ended_ago=None),
                     status="Recording")
    # Available, never published: republished once
    rec = insert_recording(conn, session_id=insert_call_session(conn), status="Available")
    upload_recording(s3_server, rec.id, bucket=bucket)
    # a finalize row with no recording: poison
    insert_attempt(conn, str(uuid.uuid4()), insert_call_session(conn))
    # conferences on both sides of each window (grace 90 s, provisioning 2 min, stale 4 h)
    insert_conference(conn, last_activity_ago=900, participants=2)  # ended: EmptyTimeout
    insert_conference(conn, last_activity_ago=20, participants=2)  # inside the grace
    insert_conference(conn, status="Provisioning", created_ago=3600)  # failed
    insert_conference(conn, status="Provisioning", created_ago=20)  # still provisioning
    insert_conference(conn, last_activity_ago=6 * 3600, active_participants=2,
                      participants=2)  # stale: ended
    insert_conference(conn, last_activity_ago=3600, active_participants=2,
                      participants=2)  # live


@pytest.fixture
def three_databases(pg_server: PostgresServer, db_dsn: str, s3_server: S3Server,
                    bucket: str) -> Iterator[list[str]]:
    """The dataset planted once, then copied into three databases (same ids, same times)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        plant(conn, s3_server, bucket)
    source = conninfo_to_dict(db_dsn)["dbname"]
    names = [f"skew_{uuid.uuid4().hex[:12]}" for _ in range(3)]
    with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(str(source))))
    try:
        yield [pg_server.dsn_for(name) for name in names]
    finally:
        with psycopg.connect(pg_server.dsn, autocommit=True) as admin:
            for name in names:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)))


def run_once(dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path,
             skew: str | None) -> list[dict[str, Any]]:
    """Both jobs' ``run-once`` under ``faketime -f <skew>`` (or none); their log lines."""
    creds = s3_server.credentials
    config = tmp_path / f"c-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key, "region": creds.region},
        "jobs": {"recording_finalize": {"finalize_sla_timeout": "30m"}},
        "logging": {"level": "info"},
    }))
    env = {"PATH": os.environ.get("PATH", "")}
    lines: list[dict[str, Any]] = []
    for job in JOBS:
        command = [sys.executable, "-m", "supervision.app", "run-once", "--job", job,
                   "-c", str(config)]
        if skew is not None:
            assert FAKETIME is not None
            command = [FAKETIME, "-f", skew, *command]
        proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines += [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    return lines


def split_times(value: Any, path: str, times: dict[str, Any]) -> Any:
    """*value* with every timestamp (a datetime, or an ISO string in JSON) and every
    duration up to AsOf replaced by a marker and collected into *times* under its path,
    and each run's correlation id (a fresh UUID per cycle) replaced by a marker."""
    if isinstance(value, dt.datetime):
        times[path] = value
        return "<time>"
    if isinstance(value, dict):
        return {k: split_field(k, v, f"{path}.{k}", times) for k, v in value.items()}
    if isinstance(value, list):
        return [split_times(v, f"{path}[{n}]", times) for n, v in enumerate(value)]
    if isinstance(value, str) and len(value) >= 20 and value[4:5] == "-" and "T" in value:
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return value
        times[path] = parsed
        return "<time>"
    return value


def split_field(name: str, value: Any, path: str, times: dict[str, Any]) -> Any:
    if name in DURATIONS and isinstance(value, int):
        times[path] = dt.timedelta(seconds=value)
        return "<duration>"
    if name == "correlation-id":
        return f"<run {uuid.UUID(value).version}>"
    return split_times(value, path, times)


def snapshot(dsn: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every row the jobs write, keyed by what identifies it; timestamps apart."""
    rows: dict[str, Any] = {}
    times: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, key in TABLES.items():
            query = sql.SQL("SELECT * FROM {}").format(sql.Identifier("messenger", table))
            for row in conn.cursor(row_factory=dict_row).execute(query).fetchall():
                ident = f"{table}:" + "/".join(str(row[k]) for k in key)
                body = {k: v for k, v in row.items() if not (k in SERIAL and key != ("id",))}
                rows[ident] = split_times(body, ident, times)
        # one correlation id per cycle, the same in every event of that cycle
        ids = {row["headers"]["correlation-id"]
               for row in fetch(conn, "SELECT headers FROM messenger.integration_outbox")}
        assert len(ids) <= len(JOBS)
    return rows, times


def skew_of(lines: list[dict[str, Any]]) -> dt.timedelta:
    """How far the process's wall clock (its log timestamps) is from the database's
    (``as_of`` of its cycle_started lines)."""
    (started, *_) = [e for e in lines if e["event"] == "cycle_started"]
    logged = dt.datetime.fromisoformat(started["timestamp"].replace("Z", "+00:00"))
    return logged - dt.datetime.fromisoformat(started["as_of"])


def test_a_daemon_clock_skewed_by_hours_gives_the_verdicts_of_the_database_clock(
        three_databases: list[str], s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """Both jobs' run-once under faketime three hours ahead, and three hours behind, write
    exactly the rows of an unskewed run on the same data: states, reasons, attempts,
    outbox and realtime rows, and every timestamp within two minutes of the unskewed
    run's."""
    plain_dsn, ahead_dsn, behind_dsn = three_databases
    plain_log = run_once(plain_dsn, s3_server, bucket, tmp_path, None)
    assert abs(skew_of(plain_log)) < TOLERANCE
    plain, plain_times = snapshot(plain_dsn)
    for skew, sign, dsn in (("+3h", 1, ahead_dsn), ("-3h", -1, behind_dsn)):
        skewed_log = run_once(dsn, s3_server, bucket, tmp_path, skew)
        # the skew applied: the process's own clock is three hours off the database's
        assert abs(skew_of(skewed_log) - sign * SKEW) < TOLERANCE, skew
        skewed, skewed_times = snapshot(dsn)
        assert skewed == plain, skew
        assert set(skewed_times) == set(plain_times), skew
        drift = {path: skewed_times[path] - plain_times[path] for path in plain_times
                 if abs(skewed_times[path] - plain_times[path]) >= TOLERANCE}
        assert drift == {}, skew

    # and the dataset did meet every verdict (the unskewed run is the reference)
    recordings = [v for k, v in plain.items() if k.startswith("call_recordings:")]
    assert sorted((r["status"], r["failure_reason"]) for r in recordings) == sorted([
        ("Available", None), ("Available", None), ("Failed", "Timeout"),
        ("Failed", "Timeout"), ("Recording", None), ("Recording", None),
        ("Recording", None)])
    attempts = [v for k, v in plain.items() if k.startswith("recording_finalize_attempts:")]
    assert sorted(a["status"] for a in attempts) == sorted(
        ["Done"] * 4 + ["Pending"] * 3 + ["Quarantined"])
    conferences = [v for k, v in plain.items() if k.startswith("conference_sessions:")]
    assert sorted((c["status"], c["end_reason"] or "") for c in conferences) == sorted([
        ("Ended", "EmptyTimeout"), ("Active", ""), ("Failed", "Error"),
        ("Provisioning", ""), ("Ended", "Timeout"), ("Active", "")])
    assert sum(k.startswith("integration_outbox:") for k in plain) >= 4
