"""A rotated PostgreSQL password needs no restart (issue 36, item 9): the daemon reads
``postgres.dsn_file`` at start and again at every SIGHUP, with a real daemon and a real
role whose password changes under it."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import tomli_w
from psycopg import sql

from supervision.db.migrate import grant
from supervision.dev.ports import free_ports
from supervision.dev.postgres import PostgresServer
from supervision.dev.s3 import S3Server
from tests.integration.app.test_shutdown import events, start_daemon
from tests.waiting import wait_until


@pytest.fixture
def role(pg_server: PostgresServer, db_dsn: str) -> Iterator[str]:
    """A login role granted by `migrate --grant-to`."""
    name = f"sn_rot_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'first-pw-1'").format(
            sql.Identifier(name)))
    grant(db_dsn, name)
    yield name
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE usename = %s", (name,))
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
    with psycopg.connect(pg_server.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def dsn_of(db_dsn: str, user: str, password: str) -> str:
    info = psycopg.conninfo.conninfo_to_dict(db_dsn)
    return psycopg.conninfo.make_conninfo("", **{**info, "user": user, "password": password})


def readyz(port: int) -> int:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def completed(log: Path) -> int:
    return len([e for e in events(log) if e.get("event") == "cycle_completed"])


def test_a_rotated_password_in_the_dsn_file_is_taken_up_by_sighup(
        role: str, db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """The role's password changes and its sessions are ended: the daemon cannot get back
    in (/readyz 503); the new password written to the file and a SIGHUP: the same process
    reconnects, /readyz 200, cycles go on; neither password is ever logged."""
    secret = tmp_path / "dsn"
    secret.write_text(dsn_of(db_dsn, role, "first-pw-1") + "\n")
    port = free_ports(1)[0]
    creds = s3_server.credentials
    config = tmp_path / "c.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn_file": str(secret), "connect_timeout": "2s"},
        "s3": {"endpoint_url": s3_server.endpoint_url, "bucket": bucket,
               "region": creds.region, "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"polling_interval": "1s"},
                 "conference_reaper": {"enabled": False}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{port}"},
        "supervision": {"shutdown_grace": "5s"},
        "logging": {"format": "json"},
    }))
    log = tmp_path / "daemon.log"
    proc = start_daemon(config, log)
    try:
        wait_until(lambda: completed(log) >= 1 and readyz(port) == 200, 60,
                   "a cycle and readiness with the first password")
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD 'second-pw-2'").format(
                sql.Identifier(role)))
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE usename = %s", (role,))
        wait_until(lambda: readyz(port) == 503, 60, "/readyz 503 with the old password")
        secret.write_text(dsn_of(db_dsn, role, "second-pw-2") + "\n")
        before = completed(log)
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: readyz(port) == 200 and completed(log) > before + 1, 60,
                   "readiness and cycles with the second password")
        (reloaded,) = [e for e in events(log) if e.get("event") == "config_reloaded"]
        assert reloaded["changed"] == ["postgres.dsn"]
        assert [e["resources"] for e in events(log)
                if e.get("event") == "resources_reopened"] == [["postgres"]]
        text = log.read_text()
        assert "first-pw-1" not in text and "second-pw-2" not in text
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
        finally:
            proc.kill()
