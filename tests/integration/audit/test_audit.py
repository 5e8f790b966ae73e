"""`safetynet audit` (exit 0 clean, 2 on a violation, 1 when it cannot judge) and the
auditor actor's gauge, against a real PostgreSQL; the auditor's queries read through
indexes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
import trio
from prometheus_client import REGISTRY

from actors.audit.auditor import serve_auditor
from actors.audit.invariants import Thresholds
from actors.envelope import TOPIC_RECORDING_AVAILABLE
from supervision.app.queries import ALL_QUERIES
from supervision.db.database import open_database
from tests.messenger import insert_call_session, insert_recording

ROOT = Path(__file__).resolve().parents[3]
NO_AGE_BOUNDS = {"grace": "0s", "relay_lag": "0s"}


@pytest.fixture
def conn(db_dsn: str) -> Any:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


def write_config(tmp_path: Path, dsn: str, **audit: Any) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({"postgres": {"dsn": dsn},
                                   "audit": {**NO_AGE_BOUNDS, "s3_sample": 0, **audit}}))
    return path


def audit(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervision.app", "audit", *args,
                           "-c", str(config)], capture_output=True, text=True, cwd=ROOT,
                          check=False, timeout=120,
                          env={"PATH": os.environ.get("PATH", ""),
                               "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT))})


def available_without_event(conn: psycopg.Connection) -> str:
    """An Available recording whose finalize row is Done but whose event was never
    written: a terminal transition without its outbox row."""
    rec = insert_recording(conn, session_id=insert_call_session(conn), status="Available")
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Done'"
                 " WHERE id = %s", (rec.attempt_id,))
    conn.execute("INSERT INTO messenger.realtime_outbox (kind, target_kind, session_kind,"
                 " reference_id) VALUES ('RecordingAvailable', 'Session', 'Direct', %s)",
                 (rec.id,))
    return rec.id


def old_unpublished_row(conn: psycopg.Connection) -> int:
    row = conn.execute(
        "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
        " event_type, payload, created_at) VALUES (%s, 'k', 'not-a-uuid',"
        " 'CallRecordingAvailable', '{}', now() - interval '1 hour') RETURNING id",
        (TOPIC_RECORDING_AVAILABLE,)).fetchone()
    assert row is not None
    return int(row[0])


def test_audit_of_a_clean_database_exits_0(db_dsn: str, tmp_path: Path) -> None:
    """Nothing broken: exit 0, "ok", and the JSON lists every judged invariant at 0."""
    config = write_config(tmp_path, db_dsn)
    human = audit(config)
    assert (human.returncode, human.stdout.strip()) == (0, "ok"), human.stderr
    data = json.loads(audit(config, "--json").stdout)
    assert data["exit"] == 0 and data["violations"] == [] and data["unjudged"] == []
    assert data["counts"]["missing_outbox"] == 0 and data["counts"]["unpublished"] == 0


def test_audit_exits_2_with_one_line_per_violation(
        db_dsn: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """A transition without its event and an old unpublished row: exit 2, one line each
    naming the invariant and the id; --json carries the same."""
    rid = available_without_event(conn)
    oid = old_unpublished_row(conn)
    config = write_config(tmp_path, db_dsn)
    human = audit(config)
    assert human.returncode == 2, human.stderr
    lines = human.stdout.splitlines()
    assert any(line.startswith(f"missing_outbox: {rid} ") for line in lines), lines
    assert any(line.startswith(f"unpublished: {oid} ") for line in lines), lines
    data = json.loads(audit(config, "--json").stdout)
    found = {(v["invariant"], v["subject"]) for v in data["violations"]}
    assert {("missing_outbox", rid), ("unpublished", str(oid))} <= found
    assert data["exit"] == 2 and data["counts"]["missing_outbox"] == 1


def test_audit_does_not_judge_rows_younger_than_the_age_bounds(
        db_dsn: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """The same rows within audit.grace / audit.relay_lag are in flight, not violations."""
    available_without_event(conn)
    old_unpublished_row(conn)
    config = write_config(tmp_path, db_dsn, grace="10m", relay_lag="2h")
    proc = audit(config)
    assert (proc.returncode, proc.stdout.strip()) == (0, "ok"), proc.stdout


def test_audit_outside_the_window_or_retention_is_not_judged(
        db_dsn: str, conn: psycopg.Connection, tmp_path: Path) -> None:
    """A transition older than --since (or than outbox retention: its row may be pruned)
    is not reported."""
    rid = available_without_event(conn)
    conn.execute("UPDATE messenger.call_recordings SET updated_at = now() - interval '3 days'"
                 " WHERE id = %s", (rid,))
    config = write_config(tmp_path, db_dsn)
    assert audit(config, "--since", "7d").returncode == 2
    assert audit(config, "--since", "24h").returncode == 0
    pruned = tmp_path / "retention.toml"
    pruned.write_text(config.read_text() + '\n[outbox_relay]\nretention = "2d"\n')
    assert audit(pruned, "--since", "7d").returncode == 0


def test_audit_exits_1_when_it_cannot_judge(tmp_path: Path) -> None:
    """No database to read: exit 1 and a "could not judge" line, no violation claimed."""
    config = write_config(tmp_path, "postgresql://nobody@127.0.0.1:1/none",
                          )
    proc = audit(config)
    assert proc.returncode == 1
    assert "could not judge: postgres" in proc.stderr and proc.stdout == ""


def test_audit_rejects_a_bad_since_as_usage(db_dsn: str, tmp_path: Path) -> None:
    """--since must be a duration."""
    proc = audit(write_config(tmp_path, db_dsn), "--since", "soon")
    assert proc.returncode == 2 and "--since" in proc.stderr and "Traceback" not in proc.stderr


def gauge(invariant: str) -> float | None:
    return REGISTRY.get_sample_value("safetynet_invariant_violations",
                                     {"invariant": invariant})


async def test_auditor_actor_exports_each_invariant_as_a_gauge(db_dsn: str) -> None:
    """After its first run the actor's gauge counts the broken invariant and shows 0 for
    the others; a later run after the repair brings it back to 0."""
    with psycopg.connect(db_dsn, autocommit=True) as c:
        rid = available_without_event(c)
    async with open_database(db_dsn, size=2) as db, trio.open_nursery() as nursery:
        await nursery.start(serve_auditor, db, Thresholds(), 3600.0)
        assert gauge("missing_outbox") == 1
        assert gauge("unpublished") == 0 and gauge("lost_recording") == 0
        nursery.cancel_scope.cancel()
    with psycopg.connect(db_dsn, autocommit=True) as c:
        c.execute("UPDATE messenger.call_recordings SET status = 'Failed' WHERE id = %s",
                  (rid,))
        c.execute("UPDATE messenger.realtime_outbox SET kind = 'RecordingFailed'"
                  " WHERE reference_id = %s", (rid,))
    async with open_database(db_dsn, size=2) as db, trio.open_nursery() as nursery:
        await nursery.start(serve_auditor, db, Thresholds(), 3600.0)
        assert gauge("missing_outbox") == 0
        nursery.cancel_scope.cancel()


AUDITED_TABLES = ("call_recordings", "conference_sessions", "integration_outbox",
                  "realtime_outbox", "recording_finalize_attempts")


@pytest.mark.parametrize("name", [
    "audit_recordings_terminal", "audit_conferences_terminal", "audit_outbox_recent",
    "audit_outbox_unpublished", "audit_recordings_active", "audit_conferences_active",
    "audit_finalize_attempts_open", "audit_recordings_failed_sample"])
def test_audit_query_reads_every_table_through_an_index(
        conn: psycopg.Connection, name: str) -> None:
    """With sequential scans priced out, the plan still has none on a messenger table: an
    index path exists for every table the query reads (docs/operations.md shows the plans
    at 1M recordings)."""
    conn.execute("SET enable_seqscan = off")
    params = {**Thresholds(window_s=3600, retention_s=7 * 86400, grace_s=300).params(),
              "window": 3600.0}
    plan = "\n".join(r[0] for r in conn.execute(
        b"EXPLAIN " + ALL_QUERIES[name].encode(), params).fetchall())
    seq = [line.strip() for line in plan.splitlines()
           if "Seq Scan" in line and any(t in line for t in AUDITED_TABLES)]
    assert seq == [], plan
