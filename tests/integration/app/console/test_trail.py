"""The operator trail: the CLI verbs write it (actor, reason), `safetynet history` reads it,
and the database refuses to change or delete a row of it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from supervision.passwords import verify_password
from tests.cli import ROOT, cli, postgres_only_config
from tests.integration.app.console.support import dead_letter, quarantine
from tests.messenger import attempt, new_id


@pytest.fixture
def config(db_dsn: str, tmp_path: Path) -> Path:
    return postgres_only_config(tmp_path, db_dsn)


def test_cli_verbs_record_actor_reason_and_result_and_history_reads_them(
        db_dsn: str, config: Path) -> None:
    """requeue, pause (with --for) and resume write one trail row each with the explicit
    --actor (else the OS user) and --reason; a refused requeue is recorded as refused;
    history prints them newest first, as text and as JSON, and --since filters."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row_id, rec = quarantine(conn, "s3:http_503")
    done = cli(config, "requeue", rec, "--reason", "S3 back", "--actor", "ana")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, rec)["status"] == "Pending"
    unknown = new_id()
    assert cli(config, "requeue", unknown, "--reason", "typo").returncode == 2
    assert cli(config, "pause", "--job", "outbox-relay", "--for", "1h",
               "--reason", "kafka upgrade").returncode == 0
    assert cli(config, "resume", "--job", "outbox-relay", "--reason", "upgraded"
               ).returncode == 0
    lines = cli(config, "history", "--json").stdout.splitlines()
    actions = [json.loads(line) for line in lines]
    assert [a["verb"] for a in actions] == ["resume", "pause", "requeue", "requeue"]
    first = actions[-1]
    assert (first["actor"], first["origin"], first["ids"], first["reason"]) == (
        "ana", "cli", [rec], "S3 back")
    assert first["result"]["changed"] == 1 and first["result"]["rows"][0]["attempt_id"] == row_id
    assert actions[-2]["result"]["refused"] == "unknown ids" and actions[-2]["ids"] == [unknown]
    assert actions[1]["result"]["for_seconds"] == 3600 and actions[1]["actor"] != "ana"
    text = cli(config, "history").stdout
    assert "kafka upgrade" in text and "ana (cli" in text
    assert cli(config, "history", "--json", "--since", "2000-01-01").stdout.count("\n") == 4
    future = cli(config, "history", "--json", "--since", "2999-01-01")
    assert future.returncode == 0 and future.stdout == ""


def test_release_verb_releases_poison_conferences_with_a_reason(
        db_dsn: str, config: Path) -> None:
    """`safetynet release ID --reason` forgets the poison and records it as release."""
    from tests.integration.app.test_runbook import remember_poison
    from tests.messenger import insert_conference

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conf = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
        remember_poison(conn, conf.id, "DataError")
    proc = cli(config, "release", conf.id, "--reason", "row fixed by hand")
    assert proc.returncode == 0, proc.stderr
    assert "released poison conference" in proc.stdout
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT verb, ids, reason FROM safetynet.operator_actions"
                            ).fetchall() == [("release", [conf.id], "row fixed by hand")]


def test_replay_and_purge_of_dead_letters_record_actor_reason_ids_and_result(
        db_dsn: str, config: Path) -> None:
    """`replay ID --reason --actor` and `dead-letters --purge --reason --actor` each write
    one trail row naming the outbox ids with the result; a replay of a non-dead-letter is
    refused (exit 2), changes nothing and is recorded as refused; replay without a reason
    is a usage error that records nothing."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        replayed = dead_letter(conn, "kafka:MESSAGE_TOO_LARGE", key="a")
        old = dead_letter(conn, "kafka:INVALID_RECORD", key="b", days_old=40)
        young = dead_letter(conn, "kafka:INVALID_RECORD", key="c", days_old=1)
    assert cli(config, "replay", str(replayed)).returncode == 2
    refused = cli(config, "replay", str(replayed), "999999", "--reason", "typo")
    assert refused.returncode == 2 and "999999" in refused.stderr
    done = cli(config, "replay", str(replayed), "--reason", "limit raised", "--actor", "ana")
    assert done.returncode == 0, done.stderr
    assert "trail #" in done.stdout
    purged = cli(config, "dead-letters", "--purge", "--older-than", "30d", "--reason",
                 "past retention", "--actor", "bo")
    assert purged.returncode == 0, purged.stderr
    assert "purged 1 dead letter(s)" in purged.stdout
    assert cli(config, "dead-letters", "--actor", "bo").returncode == 2  # not without --purge
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        left = [r[0] for r in conn.execute(
            "SELECT outbox_id FROM safetynet.outbox_dead_letters ORDER BY outbox_id")]
        rows = conn.execute("SELECT actor, origin, verb, ids, reason, result"
                            " FROM safetynet.operator_actions ORDER BY id").fetchall()
    assert left == [young]
    assert [r[:5] for r in rows] == [
        (rows[0][0], "cli", "replay", [str(replayed), "999999"], "typo"),
        ("ana", "cli", "replay", [str(replayed)], "limit raised"),
        ("bo", "cli", "purge-dead-letters", [str(old)], "past retention")]
    assert rows[0][5] == {"refused": "not dead letters", "unknown": ["999999"]}
    assert rows[1][5]["changed"] == 1
    assert rows[1][5]["rows"][0] == {
        "outbox_id": replayed, "reason": "kafka:MESSAGE_TOO_LARGE", "row_gone": False,
        "kind": "replayed"}
    assert rows[2][5] == {"purged": 1, "older_than_seconds": 30 * 86400, "batch": 1,
                          "last": True, "total": 1}
    history = cli(config, "history").stdout
    assert "bo (cli" in history and "purge-dead-letters" in history


def test_purge_writes_one_trail_row_per_batch_naming_its_ids(db_dsn: str) -> None:
    """A purge over more than one batch writes a row per batch transaction with the ids
    it deleted; the last one (here of none) says it is last and carries the total."""
    from supervision.app import actions
    from supervision.app.trail import Actor

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        old = [dead_letter(conn, "kafka:X", key=f"k{i}", days_old=40) for i in range(4)]
        kept = dead_letter(conn, "kafka:X", key="young")
        done = actions.purge_dead_letters(conn, Actor.from_os("ana"), 30 * 86400,
                                          "retention by hand", batch=2)
        rows = conn.execute("SELECT id, ids, result FROM safetynet.operator_actions"
                            " ORDER BY id").fetchall()
        left = conn.execute("SELECT outbox_id FROM safetynet.outbox_dead_letters"
                            ).fetchall()
    assert done.purged == 4 and done.trail_ids == [r[0] for r in rows]
    assert sorted(int(i) for r in rows for i in r[1]) == sorted(old)
    assert [len(r[1]) for r in rows] == [2, 2, 0]
    assert [r[2]["last"] for r in rows] == [False, False, True]
    assert rows[-1][2]["total"] == 4 and left == [(kept,)]


def test_trail_rows_cannot_be_updated_deleted_or_truncated(db_dsn: str) -> None:
    """The trigger refuses UPDATE, DELETE and TRUNCATE, even for the table's owner."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO safetynet.operator_actions (actor, origin, verb)"
                     " VALUES ('x', 'cli', 'requeue')")
        for statement in ("UPDATE safetynet.operator_actions SET reason = 'later'",
                          "DELETE FROM safetynet.operator_actions",
                          "TRUNCATE safetynet.operator_actions"):
            with pytest.raises(psycopg.Error, match="append-only"):
                conn.execute(statement)
        assert conn.execute("SELECT count(*), max(reason) FROM safetynet.operator_actions"
                            ).fetchone() == (1, None)


def test_hash_password_reads_stdin_and_prints_a_verifiable_hash_last() -> None:
    """`safetynet console --hash-password` prints, on its last line, a scrypt hash of the
    password given on stdin; an empty password is refused."""
    proc = subprocess.run([sys.executable, "-m", "supervision.app", "console",
                           "--hash-password"], input="s3cret pass\n", capture_output=True,
                          text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    stored = proc.stdout.splitlines()[-1]
    assert stored.startswith("scrypt$") and "s3cret" not in proc.stdout
    assert verify_password("s3cret pass", stored) and not verify_password("other", stored)
    empty = subprocess.run([sys.executable, "-m", "supervision.app", "console",
                            "--hash-password"], input="\n", capture_output=True, text=True,
                           cwd=ROOT, check=False)
    assert empty.returncode == 2


def test_console_without_credentials_exits_78_naming_the_keys(config: Path) -> None:
    """auth = basic without user/password_hash: one line per missing key, exit 78."""
    proc = cli(config, "console")
    assert proc.returncode == 78
    assert "console.user: required" in proc.stderr
    assert "console.password_hash: required" in proc.stderr


def test_a_pause_past_its_expiry_is_ignored_and_replaced(db_dsn: str) -> None:
    """A pause with an expiry holds the job until then; past it the keepers' read and
    status ignore it, and a new pause replaces it (new, with its own reason)."""
    from supervision.app.pauses import pause_job, paused_jobs
    from supervision.db.queries import QUERIES

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        first = pause_job(conn, "recording-finalize", "upgrade", "ana@h", for_seconds=3600)
        assert first.new
        assert conn.execute(QUERIES["job_pauses_get"], {"job": "recording-finalize"}
                            ).fetchone() is not None
        (listed,) = paused_jobs(conn)
        assert listed["expires_at"] is not None
        conn.execute("UPDATE safetynet.job_pauses SET expires_at = now() - interval '1s'")
        assert conn.execute(QUERIES["job_pauses_get"], {"job": "recording-finalize"}
                            ).fetchone() is None
        assert paused_jobs(conn) == []
        again = pause_job(conn, "recording-finalize", "second", "bo@h")
        assert again.new and again.pause.reason == "second"
        (listed,) = paused_jobs(conn)
        assert listed["expires_at"] is None
