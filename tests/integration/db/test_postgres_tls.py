"""PostgreSQL over TLS with ``sslmode=verify-full`` and ``sslrootcert`` in the DSN: a real
server with ``ssl=on`` that takes TCP clients over TLS only, its certificate signed by a
throwaway CA (see ``tls_pg_server``), and the real daemon in a process of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import tomli_w
from psycopg import sql

from actors.outbox.listener import APPLICATION_NAME as LISTEN_NAME
from supervision.db.migrate import install_demo
from supervision.dev.kafka import KafkaServer
from supervision.dev.ports import free_ports
from supervision.dev.postgres import PostgresServer
from supervision.dev.s3 import S3Server
from tests.pki import PrivateCa
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
DAEMON_NAMES = {"safetynet", "safetynet-lock", LISTEN_NAME}  # pool, lock keepers, LISTEN


def verify_full(dsn: str, ca: PrivateCa) -> str:
    return f"{dsn}?sslmode=verify-full&sslrootcert={ca.ca_file}"


@pytest.fixture
def tls_db(tls_pg_server: PostgresServer, private_ca: PrivateCa) -> Iterator[str]:
    """A fresh database on the TLS server, migrated over verify-full; yields its name."""
    name = f"tls_{os.urandom(6).hex()}"
    admin = verify_full(tls_pg_server.dsn, private_ca)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    install_demo(verify_full(tls_pg_server.dsn_for(name), private_ca))
    try:
        yield name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def write_config(path: Path, dsn: str, kafka: KafkaServer, s3: S3Server, port: int) -> Path:
    creds = s3.credentials
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "s3": {"endpoint_url": s3.endpoint_url, "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key},
        "jobs": {"recording_finalize": {"polling_interval": "1s"},
                 "conference_reaper": {"polling_interval": "1s"}},
        "http": {"listen": f"127.0.0.1:{port}"},
    }))
    return path


def safetynet(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "supervision.app", *args], cwd=ROOT,
                            env={"PATH": os.environ.get("PATH", "")}, text=True,
                            **kwargs)  # type: ignore[call-overload]


def sessions(admin: str, db: str) -> dict[str, set[bool]]:
    """application_name -> the TLS flags of its sessions in *db* (pg_stat_ssl)."""
    with psycopg.connect(admin, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT a.application_name, s.ssl FROM pg_stat_activity a"
            " JOIN pg_stat_ssl s USING (pid) WHERE a.datname = %s", (db,)).fetchall()
    out: dict[str, set[bool]] = {}
    for name, ssl in rows:
        out.setdefault(name, set()).add(ssl)
    return out


def readyz(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_daemon_pool_lock_and_listen_connections_all_use_verify_full(
        tls_pg_server: PostgresServer, private_ca: PrivateCa, tls_db: str,
        kafka_server: KafkaServer, s3_server: S3Server, tmp_path: Path) -> None:
    """With sslmode=verify-full and sslrootcert in postgres.dsn, `safetynet run` opens
    its pool, its lock keepers' connections and its LISTEN connection over TLS to a
    server that takes nothing else, and is ready."""
    port = free_ports(1)[0]
    dsn = verify_full(tls_pg_server.dsn_for(tls_db), private_ca)
    config = write_config(tmp_path / "c.toml", dsn, kafka_server, s3_server, port)
    admin = verify_full(tls_pg_server.dsn, private_ca)
    with (tmp_path / "daemon.log").open("w") as log:
        proc = safetynet("run", "-c", str(config), stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: set(sessions(admin, tls_db)) >= DAEMON_NAMES, 30,
                       "the pool, lock and LISTEN connections")
            wait_until(lambda: readyz(port) == 200, 30, "/readyz to answer 200")
            ours = {k: v for k, v in sessions(admin, tls_db).items()
                    if k.startswith("safetynet")}
            assert set(ours) >= DAEMON_NAMES
            assert all(flags == {True} for flags in ours.values()), ours
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0, (tmp_path / "daemon.log").read_text()[-3000:]


def test_wrong_sslrootcert_is_a_clear_error_never_a_crash_loop(
        tls_pg_server: PostgresServer, stranger_ca: PrivateCa, tls_db: str,
        kafka_server: KafkaServer, s3_server: S3Server, tmp_path: Path) -> None:
    """sslrootcert names a CA that did not sign the server's certificate: run-once,
    migrate and status exit 1 saying `certificate verify failed`; the daemon stays up,
    not ready (503), logs the cause on its lock connection and its deferred schema check
    (the jobs wait on it), restarts no actor,
    and stops cleanly on SIGTERM."""
    port = free_ports(1)[0]
    dsn = verify_full(tls_pg_server.dsn_for(tls_db), stranger_ca)
    config = write_config(tmp_path / "c.toml", dsn, kafka_server, s3_server, port)
    for command in (["run-once", "--job", "conference-reaper"], ["migrate"], ["status"]):
        proc = safetynet(*command, "-c", str(config), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (command, err)
        assert "certificate verify failed" in err.splitlines()[-1], (command, err)
    log_path = tmp_path / "daemon.log"
    with log_path.open("w") as log:
        proc = safetynet("run", "-c", str(config), stdout=log, stderr=subprocess.STDOUT)
        try:
            # the jobs (the outbox's LISTEN among them) wait on the schema check, which
            # logs the cause as the scan leader's lock connection does
            for event in ("lock_connection_failed", "schema_check_deferred"):
                wait_until(lambda event=event: any(
                    event in line and "certificate verify failed" in line
                    for line in log_path.read_text().splitlines()), 30, event)
            wait_until(lambda: readyz(port) == 503, 30, "/readyz to answer 503")
            metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            restarts = [line for line in metrics.splitlines()
                        if line.startswith("safetynet_actor_restarts_total{")]
            assert all(line.endswith(" 0.0") for line in restarts), restarts
            assert proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0, log_path.read_text()[-3000:]
