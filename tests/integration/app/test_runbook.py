"""`safetynet status` and `safetynet requeue` against crafted database states."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cli import cli, postgres_only_config
from tests.messenger import attempt, insert_call_session, insert_conference, insert_recording


@pytest.fixture
def conn(db_dsn: str) -> Any:
    with psycopg.connect(db_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def config(db_dsn: str, tmp_path: Path) -> Path:
    return postgres_only_config(tmp_path, db_dsn)


def test_status_on_a_healthy_database_exits_0_with_every_figure(config: Path) -> None:
    """Nothing stuck: exit 0; the JSON has backlogs, ages, outbox and verdicts."""
    proc = cli(config, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["violated"] is False
    assert data["finalize"] == {"backlog": 0, "due": 0, "quarantined": 0,
                                "oldest_age_seconds": 0.0}
    assert data["outbox"]["unpublished"] == 0 and data["conferences"]["active_backlog"] == 0
    assert len(data["verdicts"]) == 3 and all(v["ok"] for v in data["verdicts"])


def test_status_exits_2_when_a_recording_is_stuck_past_the_slo(
        config: Path, conn: psycopg.Connection) -> None:
    """A recording Uploading for a session ended 2 h ago violates the stuck SLO."""
    insert_recording(conn, session_id=insert_call_session(conn, ended_ago=7200))
    proc = cli(config, "status", "--json")
    assert proc.returncode == 2
    data = json.loads(proc.stdout)
    (stuck,) = [v for v in data["verdicts"] if "stuck" in v["slo"]]
    assert stuck["ok"] is False and stuck["value"] == 1
    assert data["finalize"]["backlog"] == 1 and data["finalize"]["due"] == 1
    human = cli(config, "status")
    assert human.returncode == 2 and "VIOLATED" in human.stdout


def test_status_lists_quarantined_rows_with_last_error(
        config: Path, conn: psycopg.Connection) -> None:
    """Quarantined rows show with their reason."""
    rec = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=None))
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined',"
                 " last_error = 'object:duration_missing' WHERE id = %s", (rec.attempt_id,))
    data = json.loads(cli(config, "status", "--json").stdout)
    assert data["finalize"]["quarantined"] == 1
    assert [(q["recording_id"], q["last_error"]) for q in data["quarantined"]] == [
        (rec.id, "object:duration_missing")]


def test_status_shows_a_last_error_with_markup_and_escapes_verbatim(
        config: Path, conn: psycopg.Connection) -> None:
    """A last_error holding rich markup and a terminal escape is printed as stored text:
    no crash on the stray closing tag, no escape sequence reaches the terminal."""
    rec = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=None))
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined',"
                 " last_error = %s WHERE id = %s", ("video/[/x] \x1b[2J[bold]", rec.attempt_id))
    proc = cli(config, "status")
    assert proc.returncode == 0, proc.stderr
    assert "video/[/x] \\x1b[2J[bold]" in proc.stdout
    assert "\x1b" not in proc.stdout

def test_requeue_quarantined_and_done_rows_by_either_id(
        config: Path, conn: psycopg.Connection) -> None:
    """Quarantined (named by recording id) and Done (named by row id) rows become
    Pending with attempts 0 and due now; the summary says what they were."""
    sid = insert_call_session(conn)
    poisoned = insert_recording(conn, session_id=sid, attempts=8)
    done = insert_recording(conn, session_id=sid, attempts=3)
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined',"
                 " last_error = 's3:http_503' WHERE id = %s", (poisoned.attempt_id,))
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Done'"
                 " WHERE id = %s", (done.attempt_id,))
    assert done.attempt_id is not None
    proc = cli(config, "requeue", poisoned.id, done.attempt_id)
    assert proc.returncode == 0, proc.stderr
    assert "2 row(s) requeued" in proc.stdout
    assert "Quarantined, attempts 8 -> Pending, 0; last_error was s3:http_503" in proc.stdout
    for rec in (poisoned, done):
        row = attempt(conn, rec.id)
        assert (row["status"], row["attempts"], row["last_error"]) == ("Pending", 0, None)
        assert row["next_attempt_at"] <= conn.execute("SELECT now()").fetchone()[0]


def test_requeue_echoes_control_characters_spelled_out(
        config: Path, conn: psycopg.Connection) -> None:
    """A last_error with an OSC title sequence, a bell and a newline is echoed with each
    control character spelled as an escape, on one line."""
    rec = insert_recording(conn, session_id=insert_call_session(conn))
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined',"
                 " last_error = %s WHERE id = %s",
                 ("s3:\x1b]0;owned\x07\nforged line", rec.attempt_id))
    proc = cli(config, "requeue", rec.id)
    assert proc.returncode == 0, proc.stderr
    assert "last_error was s3:\\x1b]0;owned\\x07\\nforged line" in proc.stdout
    assert not any(ch in proc.stdout for ch in "\x1b\x07")
    assert len(proc.stdout.splitlines()) == 2  # the row, the summary

def test_requeue_all_quarantined(config: Path, conn: psycopg.Connection) -> None:
    """--all-quarantined takes exactly the quarantined rows."""
    sid = insert_call_session(conn)
    a, b, pending = (insert_recording(conn, session_id=sid) for _ in range(3))
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined'"
                 " WHERE recording_id = ANY(%s)", ([a.id, b.id],))
    before = attempt(conn, pending.id)
    proc = cli(config, "requeue", "--all-quarantined")
    assert proc.returncode == 0 and "2 row(s) requeued" in proc.stdout
    assert attempt(conn, a.id)["status"] == attempt(conn, b.id)["status"] == "Pending"
    assert attempt(conn, pending.id) == before


def test_requeue_with_an_unknown_id_exits_2_and_changes_nothing(
        config: Path, conn: psycopg.Connection) -> None:
    """One unknown id among known ones: exit 2, the known ones are untouched too."""
    rec = insert_recording(conn, session_id=insert_call_session(conn))
    conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Quarantined'"
                 " WHERE id = %s", (rec.attempt_id,))
    unknown = str(uuid.uuid4())
    proc = cli(config, "requeue", rec.id, unknown, "not-a-uuid")
    assert proc.returncode == 2
    assert unknown in proc.stderr and "nothing changed" in proc.stderr
    assert attempt(conn, rec.id)["status"] == "Quarantined"


def test_requeue_needs_ids_or_the_flag(config: Path) -> None:
    """Neither ids nor --all-quarantined is a usage error."""
    proc = cli(config, "requeue")
    assert proc.returncode == 2 and "--all-quarantined" in proc.stderr


def remember_poison(conn: psycopg.Connection, conference_id: str, reason: str) -> None:
    """What a reaper cycle leaves for a poison conference (see test_conference_reaper)."""
    conn.execute("INSERT INTO safetynet.conference_poison (conference_id, phase, reason,"
                 " failures, first_failed_at, last_failed_at, next_attempt_at)"
                 " VALUES (%s, 'empty-room', %s, 3, now(), now(), now() + interval '8m')",
                 (conference_id, reason))


def test_status_lists_poison_conferences_held_out_of_the_claim(
        config: Path, conn: psycopg.Connection) -> None:
    """Poison conferences show with phase, failures and reason (markup in the reason is
    printed as text); one no longer active is not listed."""
    poison = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
    ended = insert_conference(conn, status="Ended", last_activity_ago=120)
    remember_poison(conn, poison.id, "DataError: video/[/x]")
    remember_poison(conn, ended.id, "started_after_as_of")
    data = json.loads(cli(config, "status", "--json").stdout)
    assert data["conferences"]["poisoned"] == 1
    assert [(p["conference_id"], p["phase"], p["failures"], p["reason"])
            for p in data["poisoned"]] == [(poison.id, "empty-room", "3",
                                            "DataError: video/[/x]")]
    human = cli(config, "status")
    assert "poison conferences" in human.stdout and "video/[/x]" in human.stdout, human.stderr


def test_requeue_releases_poison_conferences_by_id_or_all(
        config: Path, conn: psycopg.Connection) -> None:
    """A poison conference id is a runbook target of requeue: released (the next cycle
    claims it); with an unknown id beside it nothing changes; --all-poisoned takes all."""
    first, second = (insert_conference(conn, last_activity_ago=120, started_ago=-3600)
                     for _ in range(2))
    remember_poison(conn, first.id, "started_after_as_of")
    remember_poison(conn, second.id, "started_after_as_of")

    def remembered() -> set[str]:
        rows = conn.execute("SELECT conference_id FROM safetynet.conference_poison")
        return {str(r[0]) for r in rows.fetchall()}

    refused = cli(config, "requeue", first.id, str(uuid.uuid4()))
    assert refused.returncode == 2 and remembered() == {first.id, second.id}
    one = cli(config, "requeue", first.id)
    assert one.returncode == 0, one.stderr
    assert f"released poison conference {first.id} (empty-room, 3 failure(s))" in one.stdout
    assert remembered() == {second.id}
    rest = cli(config, "requeue", "--all-poisoned")
    assert rest.returncode == 0 and second.id in rest.stdout and remembered() == set()
