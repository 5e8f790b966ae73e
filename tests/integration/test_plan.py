"""`safetynet plan`: changes nothing, and its decisions are what run-once then does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import tomli_w

from supervision.dev.stack import S3Server
from tests.messenger import (
    attempt,
    insert_attempt,
    insert_call_session,
    insert_conference,
    insert_recording,
    outbox_rows,
    recording,
    upload_recording,
)

ROOT = Path(__file__).resolve().parents[2]
CHECKSUM = """
SELECT md5(string_agg(t::text, '|' ORDER BY t::text)) FROM (
    SELECT a::text AS t FROM messenger.recording_finalize_attempts a
    UNION ALL SELECT r::text FROM messenger.call_recordings r
    UNION ALL SELECT o::text FROM messenger.integration_outbox o
    UNION ALL SELECT x::text FROM messenger.realtime_outbox x) rows
"""


def checksum(conn: psycopg.Connection) -> str:
    row = conn.execute(CHECKSUM).fetchone()
    assert row is not None
    return str(row[0])


def test_plan_changes_nothing_and_predicts_run_once(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """Every kind of row: the plan's decision matches the state after run-once, and the
    tables' checksum is the same before and after the plan."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        sid = insert_call_session(conn)
        found = insert_recording(conn, session_id=sid)
        missing = insert_recording(conn, session_id=sid, status="Recording")
        unpublished = insert_recording(conn, session_id=sid, status="Available")
        failed = insert_recording(conn, session_id=sid, status="Failed")
        live = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=None))
        bad = insert_recording(conn, session_id=sid)
        orphan = str(uuid.uuid4())
        insert_attempt(conn, orphan, sid)
        upload_recording(s3_server, found.id, bucket=bucket)
        upload_recording(s3_server, bad.id, content_type="text/plain", bucket=bucket)
        before = checksum(conn)
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
    }))
    env = {"PATH": os.environ.get("PATH", "")}
    proc = subprocess.run([sys.executable, "-m", "supervision.app", "plan", "--job",
                           "recording-finalize", "--json", "-c", str(config)],
                          capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    decisions = {d["id"]: d["decision"] for d in map(json.loads, proc.stdout.splitlines())}
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert checksum(conn) == before, "plan must not change anything"
    assert decisions == {
        found.id: "Available + event", missing.id: "Failed/Timeout",
        unpublished.id: "enqueue event, close row", failed.id: "close row",
        live.id: "reschedule (not an attempt)", bad.id: "quarantine", orphan: "quarantine",
    }
    run = subprocess.run([sys.executable, "-m", "supervision.app", "run-once", "--job",
                          "recording-finalize", "-c", str(config)],
                         capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert run.returncode == 0, run.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert recording(conn, found.id)["status"] == "Available"
        assert len(outbox_rows(conn, found.id)) == 1
        assert recording(conn, missing.id)["status"] == "Failed"
        assert len(outbox_rows(conn, unpublished.id)) == 1
        assert attempt(conn, unpublished.id)["status"] == "Done"
        assert attempt(conn, failed.id)["status"] == "Done" and not outbox_rows(conn, failed.id)
        assert (attempt(conn, live.id)["status"], attempt(conn, live.id)["attempts"]) == (
            "Pending", 0)
        assert attempt(conn, bad.id)["status"] == "Quarantined"
        assert attempt(conn, orphan)["status"] == "Quarantined"


def test_plan_shows_poison_conferences_held_back(db_dsn: str, tmp_path: Path) -> None:
    """A poison conference still backed off is 'held back (poison)' with its reason; a
    healthy due room beside it is planned as usual."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        poison = insert_conference(conn, last_activity_ago=200, started_ago=-3600)
        healthy = insert_conference(conn, last_activity_ago=120)
        conn.execute("INSERT INTO safetynet.conference_poison (conference_id, phase, reason,"
                     " failures, first_failed_at, last_failed_at, next_attempt_at) VALUES"
                     " (%s, 'empty-room', 'started_after_as_of', 1, now(), now(),"
                     " now() + interval '1m')", (poison.id,))
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({"postgres": {"dsn": db_dsn}}))
    proc = subprocess.run([sys.executable, "-m", "supervision.app", "plan", "--job",
                           "conference-reaper", "--json", "-c", str(config)],
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={"PATH": os.environ.get("PATH", "")})
    assert proc.returncode == 0, proc.stderr
    items = {d["id"]: d for d in map(json.loads, proc.stdout.splitlines())}
    assert items[poison.id]["decision"] == "held back (poison)"
    assert items[poison.id]["why"].startswith("started_after_as_of; retried after ")
    assert items[healthy.id]["decision"] == "Ended/EmptyTimeout + conference-ended event"


def test_plan_and_claim_share_one_phase_definition() -> None:
    """The claim and its dry run both call safetynet.finalize_classify and neither spells
    the phase rules itself, so `safetynet plan` cannot drift from the daemon."""
    from supervision.queries import QUERIES

    for name in ("finalize_attempts_claim_due", "plan_finalize_attempts"):
        sql = QUERIES[name]
        assert "safetynet.finalize_classify(" in sql, name
        assert "THEN 'reconcile'" not in sql and "'session_missing'" not in sql, name
