"""Least privilege, proven by doing the work (issue 36, item 4): the runtime role made by
`migrate --grant-to` runs every job and every verb on real rows, and the console reads and
acts as it; it cannot run DDL. A read-only role (`--grant-read-to`) reads everything (status,
plan, audit, history, the console with allow_actions = false) and every writing verb fails
cleanly: a non-zero exit naming the refusal, never a traceback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import tomli_w
from psycopg import sql

from supervision.app.console.app import build_app
from supervision.app.console.security import Gate
from supervision.app.settings import Config
from supervision.db.database import open_database
from supervision.db.grants import COLUMN_PRIVILEGES
from supervision.db.migrate import Options, migrate
from supervision.db.pgconn import conninfo
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.cli import cli
from tests.integration.app.console.support import basic, console_config, dead_letter, quarantine
from tests.integration.app.test_runbook import remember_poison
from tests.integration.db.test_install import s3_settings
from tests.integration.db.test_print_sql import new_role
from tests.messenger import (
    attempt,
    insert_call_session,
    insert_conference,
    insert_recording,
    upload_recording,
)

JOBS = ("recording-finalize", "conference-reaper", "outbox-relay")


@pytest.fixture
def roles(db_dsn: str) -> dict[str, str]:
    """A runtime role and a read-only role, each granted by migrate only: their DSNs."""
    runtime, runtime_dsn = new_role(db_dsn, "sn_rt")
    reader, reader_dsn = new_role(db_dsn, "sn_ro")
    migrate(db_dsn, Options(grant_to=runtime, grant_read_to=reader))
    return {"runtime": runtime_dsn, "read": reader_dsn}


def role_config(tmp_path: Path, dsn: str, s3: S3Server, bucket: str,
                kafka: KafkaServer) -> Path:
    path = tmp_path / f"{psycopg.conninfo.conninfo_to_dict(dsn)['user']}.toml"
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn}, "s3": s3_settings(s3, bucket),
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "jobs": {"recording_finalize": {"finalize_sla_timeout": "30m"}}}))
    return path


def ok(config: Path, *args: str) -> str:
    """Run a verb: exit 0 (2 allowed only where it is an SLO verdict), no denial."""
    proc = cli(config, *args)
    assert proc.returncode == 0, (args, proc.returncode, proc.stderr[-2000:])
    assert "permission denied" not in proc.stderr, (args, proc.stderr)
    return proc.stdout


def verdict(config: Path, *args: str) -> str:
    """A reading verb whose exit 2 is a verdict (status, audit), never a failure."""
    proc = cli(config, *args)
    assert proc.returncode in (0, 2), (args, proc.returncode, proc.stderr[-2000:])
    assert "permission denied" not in proc.stderr and "Traceback" not in proc.stderr
    return proc.stdout


def scalar(dsn: str, query: str, *params: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()  # type: ignore[arg-type]
    return None if row is None else row[0]


def test_runtime_role_plans_and_runs_every_job_on_real_rows(
        roles: dict[str, str], db_dsn: str, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """plan --job of each job names the due row; run-once of each job finishes it: the
    uploaded recording Available, the abandoned room Ended, the outbox row published. Each
    messenger table has a column of the messenger's own, not in the contract: the role,
    granted only the contract's columns, never needs it (no `*` in a query)."""
    config = role_config(tmp_path, roles["runtime"], s3_server, bucket, kafka_server)
    with psycopg.connect(db_dsn, autocommit=True) as conn:  # the messenger writes them
        for table in COLUMN_PRIVILEGES:
            conn.execute(sql.SQL("ALTER TABLE messenger.{} ADD COLUMN messenger_only text")
                         .format(sql.Identifier(table)))
        rec = insert_recording(conn, session_id=insert_call_session(conn))
        lost = insert_recording(conn, session_id=insert_call_session(conn))  # no binary
        conf = insert_conference(conn, status="Active", last_activity_ago=7200)
    upload_recording(s3_server, rec.id, bucket=bucket)
    assert rec.id in ok(config, "plan", "--job", "recording-finalize", "--json")
    assert conf.id in ok(config, "plan", "--job", "conference-reaper", "--json")
    ok(config, "plan", "--job", "outbox-relay", "--json")
    for job in JOBS:
        ok(config, "run-once", "--job", job)
    assert scalar(db_dsn, "SELECT status FROM messenger.call_recordings WHERE id = %s",
                  rec.id) == "Available"
    assert scalar(db_dsn, "SELECT status FROM messenger.call_recordings WHERE id = %s",
                  lost.id) == "Failed"  # past its SLA, the bucket's evidence listing found
    assert scalar(db_dsn, "SELECT status FROM messenger.conference_sessions WHERE id = %s",
                  conf.id) == "Ended"
    ok(config, "run-once", "--job", "outbox-relay")  # the reaper's events, published
    assert scalar(db_dsn, "SELECT count(*) FROM messenger.integration_outbox"
                  " WHERE published_at IS NULL") == 0
    assert scalar(db_dsn, "SELECT count(*) FROM messenger.integration_outbox") > 0


def test_runtime_role_runs_every_verb_on_real_rows(
        roles: dict[str, str], db_dsn: str, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """requeue of a quarantined row, release of a poison conference, replay and purge of
    dead letters, pause, resume, accept-missing: each changes what it says, and history,
    audit, status and dead-letters (--keys too) read it back."""
    config = role_config(tmp_path, roles["runtime"], s3_server, bucket, kafka_server)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row, rec = quarantine(conn, "s3:http_403")
        conf = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
        remember_poison(conn, conf.id, "DataError")
        live = dead_letter(conn, "kafka:INVALID_RECORD", key="a")
        old = dead_letter(conn, "kafka:MESSAGE_TOO_LARGE", key="b", days_old=30)
    ok(config, "requeue", row, "--reason", "bucket policy fixed")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, rec)["status"] == "Pending"
    ok(config, "release", conf.id, "--reason", "data fixed")
    assert scalar(db_dsn, "SELECT count(*) FROM safetynet.conference_poison") == 0
    keys = json.loads(ok(config, "dead-letters", "--keys", "--json"))
    assert keys, keys
    listed = json.loads(ok(config, "dead-letters", "--json"))
    assert listed["total"] == 2
    ok(config, "replay", str(live), "--reason", "broker limit raised")
    ok(config, "dead-letters", "--purge", "--older-than", "7d", "--reason", "expired")
    assert scalar(db_dsn, "SELECT count(*) FROM safetynet.outbox_dead_letters") == 0
    assert scalar(db_dsn, "SELECT count(*) FROM messenger.integration_outbox WHERE id = %s",
                  old) == 0
    ok(config, "pause", "--job", "recording-finalize", "--reason", "db upgrade")
    assert scalar(db_dsn, "SELECT count(*) FROM safetynet.job_pauses") == 1
    ok(config, "resume", "--job", "recording-finalize", "--reason", "done")
    assert scalar(db_dsn, "SELECT count(*) FROM safetynet.job_pauses") == 0
    ok(config, "accept-missing", "--for", "1h", "--reason", "recorder outage")
    assert scalar(db_dsn, "SELECT count(*) FROM safetynet.missing_verdict_acceptances"
                  " WHERE accepted_until > now()") == 1
    ok(config, "accept-missing", "--revoke", "--reason", "over")
    verdict(config, "audit")
    verdict(config, "status", "--json")
    trail = [json.loads(line) for line in ok(config, "history", "--json").splitlines()]
    assert {a["verb"] for a in trail} >= {"requeue", "release", "replay", "pause", "resume",
                                          "purge-dead-letters", "accept-missing"}, trail


def test_runtime_role_may_not_run_ddl(roles: dict[str, str]) -> None:
    for statement in ("CREATE TABLE messenger.x (id int)",
                      "CREATE TABLE safetynet.x (id int)",
                      "ALTER TABLE messenger.call_recordings ADD COLUMN x int",
                      "DROP TABLE messenger.realtime_outbox",
                      "DROP TABLE safetynet.leases",
                      "TRUNCATE messenger.integration_outbox",
                      "CREATE INDEX ix_x ON messenger.call_recordings (file_id)",
                      "CREATE SCHEMA x"):
        with psycopg.connect(roles["runtime"], autocommit=True) as conn, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)  # type: ignore[call-overload]


async def client_for(cfg: Config) -> AsyncIterator[httpx.AsyncClient]:
    async with open_database(conninfo(cfg.postgres, "console-test"), size=2) as db:
        app = build_app(cfg, db, Gate(cfg.console))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url=f"http://{cfg.console.listen}",
                                     headers=basic()) as client:
            yield client


PAGES = ("/", "/recordings", "/recordings?status=Quarantined", "/conferences", "/outbox",
         "/outbox/keys", "/audit", "/history")


async def post(client: httpx.AsyncClient, path: str, data: dict[str, Any]) -> httpx.Response:
    return await client.post(path, data=data, headers={
        "Sec-Fetch-Site": "same-origin", "Origin": str(client.base_url).rstrip("/")})


def form_token(html: str) -> str:
    marker = 'name="token" value="'
    assert marker in html, "no form token on the page"
    return html.split(marker, 1)[1].split('"', 1)[0]


async def test_console_as_the_runtime_role_reads_every_page_and_acts(
        roles: dict[str, str], db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row, rec = quarantine(conn, "s3:http_403")
        conf = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
        remember_poison(conn, conf.id, "DataError")
        dead = dead_letter(conn, "kafka:INVALID_RECORD", key="a")
    async for client in client_for(console_config(roles["runtime"], allow_actions=True)):
        for page in (*PAGES, f"/outbox/{dead}"):
            response = await client.get(page)
            assert response.status_code == 200, (page, response.text[:500])
        form = form_token((await client.get("/")).text)
        for path, data in (("/actions/requeue", {"ids": [row], "status": "Quarantined"}),
                           ("/actions/release", {"ids": [conf.id]}),
                           ("/actions/replay", {"ids": [str(dead)]}),
                           ("/actions/pause", {"job": "conference-reaper"}),
                           ("/actions/resume", {"job": "conference-reaper"}),
                           ("/actions/audit", {})):
            done = await post(client, path, {**data, "token": form, "confirm": "yes",
                                             "reason": "as the runtime role"})
            assert done.status_code == 200, (path, done.text[:1000])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, rec)["status"] == "Pending"
        verbs = [r[0] for r in conn.execute(
            "SELECT verb FROM safetynet.operator_actions ORDER BY id")]
        assert conn.execute("SELECT count(*) FROM safetynet.outbox_dead_letters"
                            ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM safetynet.conference_poison"
                            ).fetchone() == (0,)
    assert verbs == ["requeue", "release", "replay", "pause", "resume", "audit"]


def test_read_only_role_reads_and_every_writing_verb_fails_cleanly(
        roles: dict[str, str], db_dsn: str, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    config = role_config(tmp_path, roles["read"], s3_server, bucket, kafka_server)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        row, rec = quarantine(conn, "s3:http_403")
        conf = insert_conference(conn, last_activity_ago=120, started_ago=-3600)
        remember_poison(conn, conf.id, "DataError")
        dead = dead_letter(conn, "kafka:INVALID_RECORD", key="a", days_old=30)
    verdict(config, "status", "--json")
    verdict(config, "audit")
    for job in JOBS:
        ok(config, "plan", "--job", job)
    ok(config, "history")
    ok(config, "dead-letters")
    ok(config, "dead-letters", "--keys")
    why = ("--reason", "tried as the reader")
    for args in (["requeue", row, *why], ["release", conf.id, *why],
                 ["replay", str(dead), *why],
                 ["dead-letters", "--purge", "--older-than", "7d", *why],
                 ["pause", "--job", "recording-finalize", *why],
                 ["resume", "--job", "recording-finalize", *why], ["accept-missing", *why],
                 *(["run-once", "--job", job] for job in JOBS)):
        proc = cli(config, *args)
        assert proc.returncode not in (0, 2), (args, proc.returncode, proc.stdout)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "permission denied" in proc.stderr, (args, proc.stderr)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert attempt(conn, rec)["status"] == "Quarantined"
        assert conn.execute("SELECT count(*) FROM safetynet.conference_poison"
                            ).fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM safetynet.outbox_dead_letters"
                            ).fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM safetynet.operator_actions"
                            ).fetchone() == (0,)


async def test_console_as_the_read_only_role_renders_every_page(
        roles: dict[str, str], db_dsn: str) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        quarantine(conn, "s3:http_403")
        dead = dead_letter(conn, "kafka:INVALID_RECORD", key="a")
    async for client in client_for(console_config(roles["read"])):
        for page in (*PAGES, f"/outbox/{dead}"):
            response = await client.get(page)
            assert response.status_code == 200, (page, response.text[:500])
            assert "permission denied" not in response.text
