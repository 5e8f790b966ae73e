"""`safetynet plan`: changes nothing, and its decisions are what run-once then does."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
from psycopg import sql

from actors.envelope import TOPIC_CONFERENCE_ENDED
from actors.reaper.messages import PHASES
from actors.reaper.queries import REAPER_QUERIES
from supervision.app.queries import ALL_QUERIES
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.messenger import (
    attempt,
    conference,
    db_now,
    insert_attempt,
    insert_call_session,
    insert_conference,
    insert_recording,
    outbox_rows,
    recording,
    upload_recording,
)

ROOT = Path(__file__).resolve().parents[3]
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


TABLES = ("messenger.recording_finalize_attempts", "messenger.call_recordings",
          "messenger.conference_sessions", "messenger.integration_outbox",
          "messenger.realtime_outbox", "safetynet.conference_poison",
          "safetynet.outbox_dead_letters")


def everything(conn: psycopg.Connection) -> dict[str, list[str]]:
    """Every row of every table a cycle of any job writes, as text (a plan's snapshot)."""
    snapshot = {}
    for table in TABLES:
        query = sql.SQL("SELECT t::text FROM {} t ORDER BY 1").format(
            sql.Identifier(*table.split(".")))
        snapshot[table] = [str(r[0]) for r in conn.execute(query).fetchall()]
    return snapshot


def cli(verb: str, job: str, config: Path) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "supervision.app", verb, "--job", job, "-c", str(config)]
    return subprocess.run([*args, "--json"] if verb == "plan" else args,
                          capture_output=True, text=True, cwd=ROOT, check=False,
                          env={"PATH": os.environ.get("PATH", "")})


def full_config(tmp_path: Path, db_dsn: str, s3_server: S3Server, bucket: str,
                kafka_server: KafkaServer, **extra: Any) -> Path:
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers},
        "logging": {"level": "warning"}, **extra,
    }))
    return config


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


def test_plan_with_a_wrong_prefix_predicts_withheld_and_run_once_withholds(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """A fresh install pointed at the wrong prefix (the binaries exist under the right
    one): the plan predicts "withheld" for every 404, not Failed/Timeout, and run-once
    then withholds them — nothing Failed, no attempt spent."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        sid = insert_call_session(conn)
        recs = [insert_recording(conn, session_id=sid) for _ in range(3)]
        for rec in recs:
            upload_recording(s3_server, rec.id, bucket=bucket)
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "key_prefix": "call-recordngs/", "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
    }))
    plan = cli("plan", "recording-finalize", config)
    assert plan.returncode == 0, plan.stderr
    items = list(map(json.loads, plan.stdout.splitlines()))
    assert {d["decision"] for d in items} == {"withheld (given back untouched)"}
    assert all("no_evidence_for_key_prefix" in d["why"] for d in items)
    run = cli("run-once", "recording-finalize", config)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["withheld"] == 3
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert {(recording(conn, r.id)["status"], attempt(conn, r.id)["attempts"])
                for r in recs} == {("Uploading", 0)}


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
    from supervision.app.queries import ALL_QUERIES

    for name in ("finalize_attempts_claim_due", "plan_finalize_attempts"):
        sql = ALL_QUERIES[name]
        assert "safetynet.finalize_classify(" in sql, name
        assert "THEN 'reconcile'" not in sql and "'session_missing'" not in sql, name


WINDOWS = {"empty_room_grace": "90s", "provision_timeout": "2m", "stale_live_timeout": "2h"}
OUTCOMES = {  # plan decision -> (status, end_reason) after run-once
    "Ended/EmptyTimeout + conference-ended event": ("Ended", "EmptyTimeout"),
    "Failed/Error, no event": ("Failed", "Error"),
    "Ended/Timeout + conference-ended event": ("Ended", "Timeout"),
}


def test_conference_plan_changes_nothing_and_predicts_run_once(
        db_dsn: str, s3_server: S3Server, bucket: str, kafka_server: KafkaServer,
        tmp_path: Path) -> None:
    """Rooms due in each phase, rooms just short of their window and a held poison room:
    the plan writes nothing, names exactly the rooms run-once then ends, with the outcome
    it predicted, and each why shows the age it compared with the window."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        empty = insert_conference(conn, last_activity_ago=200)
        not_yet_empty = insert_conference(conn, last_activity_ago=30)
        provisioning = insert_conference(conn, status="Provisioning", last_activity_ago=300)
        young = insert_conference(conn, status="Provisioning", last_activity_ago=10,
                                  created_ago=10)
        stale = insert_conference(conn, last_activity_ago=9000, active_participants=3)
        busy = insert_conference(conn, last_activity_ago=600, active_participants=2)
        poison = insert_conference(conn, last_activity_ago=200, started_ago=-3600)
        conn.execute("INSERT INTO safetynet.conference_poison (conference_id, phase, reason,"
                     " failures, first_failed_at, last_failed_at, next_attempt_at) VALUES"
                     " (%s, 'empty-room', 'started_after_as_of', 1, now(), now(),"
                     " now() + interval '1h')", (poison.id,))
        before = everything(conn)
    config = full_config(tmp_path, db_dsn, s3_server, bucket, kafka_server,
                         jobs={"conference_reaper": WINDOWS})
    proc = cli("plan", "conference-reaper", config)
    assert proc.returncode == 0, proc.stderr
    items = {d["id"]: d for d in map(json.loads, proc.stdout.splitlines())}
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert everything(conn) == before, "plan must not change anything"
    assert set(items) == {empty.id, provisioning.id, stale.id, poison.id}
    assert re.fullmatch(r"empty room, last seen 3m2\ds ago > empty_room_grace 1m30s",
                        items[empty.id]["why"]), items[empty.id]["why"]
    assert re.fullmatch(r"provisioning since 6m0\ds ago > provision_timeout 2m",
                        items[provisioning.id]["why"]), items[provisioning.id]["why"]
    assert re.fullmatch(r"last activity 2h30m ago > stale_live_timeout 2h "
                        r"\(3 participant\(s\) on record\)", items[stale.id]["why"])
    assert items[poison.id]["decision"] == "held back (poison)"
    run = cli("run-once", "conference-reaper", config)
    assert run.returncode == 0, run.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for cid, item in items.items():
            expected = OUTCOMES.get(item["decision"], ("Active", None))
            row = conference(conn, cid)
            assert (row["status"], row["end_reason"]) == expected, item
        for untouched in (not_yet_empty, young, busy):
            assert conference(conn, untouched.id)["status"] in ("Active", "Provisioning")


def insert_event(conn: psycopg.Connection, key: str) -> int:
    row = conn.execute(
        "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
        " event_type, payload, headers) VALUES (%s, %s, %s, 'Test', '{}', '{}')"
        " RETURNING id", (TOPIC_CONFERENCE_ENDED, key, str(uuid.uuid4()))).fetchone()
    assert row is not None
    return int(row[0])


def test_outbox_plan_changes_nothing_and_predicts_run_once(
        db_dsn: str, s3_server: S3Server, bucket: str, kafka_server: KafkaServer,
        tmp_path: Path) -> None:
    """Publishable rows, a dead-lettered row and a row of its key behind it: the plan
    writes nothing; run-once publishes exactly the rows planned 'send to Kafka' and leaves
    the held ones, whose why names the dead letter."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        sent = [insert_event(conn, "a"), insert_event(conn, "b")]
        dead = insert_event(conn, "c")
        behind = insert_event(conn, "c")
        conn.execute("INSERT INTO safetynet.outbox_dead_letters (outbox_id, topic,"
                     " message_key, reason, blocks_key) VALUES (%s, %s, 'c', 'too large',"
                     " true)", (dead, TOPIC_CONFERENCE_ENDED))
        before = everything(conn)
    config = full_config(tmp_path, db_dsn, s3_server, bucket, kafka_server)
    proc = cli("plan", "outbox-relay", config)
    assert proc.returncode == 0, proc.stderr
    items = {int(d["id"]): d for d in map(json.loads, proc.stdout.splitlines())}
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert everything(conn) == before, "plan must not change anything"
    assert {i: d["decision"] for i, d in items.items()} == {
        sent[0]: "send to Kafka", sent[1]: "send to Kafka", dead: "held", behind: "held"}
    assert re.fullmatch(r".* key a, unpublished for \d+s, attempts 0", items[sent[0]]["why"])
    assert items[dead]["why"].startswith("dead-lettered ")
    assert items[behind]["why"].startswith(f"key blocked behind dead letter {dead} for ")
    run = cli("run-once", "outbox-relay", config)
    assert run.returncode == 0, run.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        published = {int(r[0]) for r in conn.execute(
            "SELECT id FROM messenger.integration_outbox WHERE published_at IS NOT NULL")}
    assert published == {i for i, d in items.items() if d["decision"] == "send to Kafka"}


@pytest.mark.parametrize("windows", [
    {"empty_room_grace": 90.0, "provision_timeout": 120.0, "stale_live_timeout": 600.0},
    # a grace longer than the stale window: an empty room can be stale-live first
    {"empty_room_grace": 900.0, "provision_timeout": 60.0, "stale_live_timeout": 300.0},
], ids=["grace-shorter", "grace-longer"])
def test_conference_claims_take_the_rows_conference_phase_puts_in_their_phase(
        db_dsn: str, windows: dict[str, float]) -> None:
    """Rooms on both sides of every window (and on it): run in the reaper's order, each
    claim takes exactly the rows safetynet.conference_phase puts in its phase, so the
    windows' one definition (used by plan and the backlog gauge) is what the daemon does;
    the backlog gauge counts exactly the rows the function puts in a phase."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        as_of = db_now(conn)
        edges = sorted({w + d for w in windows.values() for d in (-1.0, 0.0, 1.0)} | {5.0})
        for idle in edges:
            for people in (0, 2):
                row = insert_conference(conn, last_activity_ago=idle,
                                        active_participants=people)
                conn.execute("UPDATE messenger.conference_sessions SET last_activity_at = %s"
                             " WHERE id = %s", (as_of - dt.timedelta(seconds=idle), row.id))
            prov = insert_conference(conn, status="Provisioning", last_activity_ago=idle)
            conn.execute("UPDATE messenger.conference_sessions SET created_at = %s"
                         " WHERE id = %s", (as_of - dt.timedelta(seconds=idle), prov.id))
        defined = {str(r[0]): r[1] for r in conn.execute(
            "SELECT id, safetynet.conference_phase(status, active_participant_count,"
            " last_activity_at, created_at, %(as_of)s, %(empty_room_grace)s,"
            " %(provision_timeout)s, %(stale_live_timeout)s)"
            " FROM messenger.conference_sessions", {"as_of": as_of, **windows})}
        with conn.transaction():  # one now() for the gauge and the function
            gauge = conn.execute(REAPER_QUERIES["conference_sessions_active_backlog"], windows
                                 ).fetchone()
            in_a_phase = conn.execute(
                "SELECT count(*) FROM messenger.conference_sessions WHERE"
                " safetynet.conference_phase(status, active_participant_count,"
                " last_activity_at, created_at, now(), %(empty_room_grace)s,"
                " %(provision_timeout)s, %(stale_live_timeout)s) IS NOT NULL", windows
            ).fetchone()
        claimed: dict[str, str] = {}
        with conn.transaction(force_rollback=True):
            for phase, name in zip(PHASES, windows, strict=True):
                rows = conn.execute(ALL_QUERIES[phase.claim_query], {
                    "as_of": as_of, "window": windows[name], "batch_size": 1000}).fetchall()
                for (cid, _skipped) in rows:
                    if cid is not None:
                        claimed.setdefault(str(cid), phase.name)
    assert claimed == {cid: phase for cid, phase in defined.items() if phase is not None}
    assert set(defined.values()) == {None, "empty-room", "provision-timeout", "stale-live"}
    assert gauge == in_a_phase


def test_conference_plan_and_backlog_use_the_shared_phase_definition() -> None:
    """The reaper's plan and its backlog gauge call safetynet.conference_phase; the plan
    spells no window itself (the gauge's ranges are only its access path: the test
    above checks its count against the function)."""
    for name in ("plan_conference_sessions", "conference_sessions_active_backlog"):
        assert "safetynet.conference_phase(" in ALL_QUERIES[name], name
    assert "interval '1 second'" not in ALL_QUERIES["plan_conference_sessions"]
