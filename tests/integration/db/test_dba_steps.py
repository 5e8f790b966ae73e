"""docs/operations.md's install, upgrade and uninstall as a DBA runs them (issue 36, item
10): the commands of deploy/dba/safetynet-dba.sh (which the doc shows verbatim), as a
messenger owner that is not a superuser, beside a messenger writer that holds a
transaction open on the outbox while each phase runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import tomli_w
from psycopg import sql

from supervision.db.migrate import apply_messenger_fixture
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.cli import ROOT, cli
from tests.integration.db.test_install import s3_settings
from tests.messenger import insert_conference

SCRIPT = ROOT / "deploy" / "dba" / "safetynet-dba.sh"
PSQL = shutil.which("psql") or "/usr/bin/psql"
# published already: the relay run as the runtime role has nothing of the writer's to send
INSERT = ("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, "
          "event_type, payload, published_at) VALUES ('t', 'k', %s, 'e', '{}', now())")
HOLD = 1.5  # seconds the writer's transaction stays open once a DBA statement waits


def test_the_operations_doc_shows_the_dba_script_verbatim() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert SCRIPT.read_text() in doc


class Writer:
    """The messenger at work: one transaction held open on the outbox at the start of a
    phase, and short INSERTs all along, each one's wait measured."""

    def __init__(self, dsn: str) -> None:
        self.dsn, self.waits = dsn, [0.0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                t0 = time.monotonic()
                conn.execute(INSERT, (str(uuid.uuid4()),))
                self.waits.append(time.monotonic() - t0)
                time.sleep(0.02)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def messenger(empty_db_dsn: str) -> Iterator[dict[str, str]]:
    """The messenger's database, its tables owned by a login role that is no superuser:
    the environment of the DBA script."""
    apply_messenger_fixture(empty_db_dsn)
    owner, password = f"msg_owner_{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(owner), sql.Literal(password)))
        conn.execute(sql.SQL("ALTER SCHEMA messenger OWNER TO {}").format(
            sql.Identifier(owner)))
        for (table,) in conn.execute("SELECT tablename FROM pg_tables "
                                     "WHERE schemaname = 'messenger'").fetchall():
            conn.execute(sql.SQL("ALTER TABLE messenger.{} OWNER TO {}").format(
                sql.Identifier(table), sql.Identifier(owner)))
    info = psycopg.conninfo.conninfo_to_dict(empty_db_dsn)
    yield {"admin": empty_db_dsn, "owner": owner, "db": str(info["dbname"]),
           "owner_dsn": psycopg.conninfo.make_conninfo(
               "", **{**info, "user": owner, "password": password})}


def run_phase(phase: str, env: dict[str, str], admin_dsn: str,
              cwd: Path) -> tuple[subprocess.CompletedProcess[str], bool]:
    """One phase of the script beside the writer: a transaction held open on the outbox as
    the phase starts, committed once migrate (or uninstall) has been seen waiting for a
    lock for a while, or the phase ended. Also whether it was seen waiting."""
    waited = False
    with psycopg.connect(admin_dsn) as holder, \
            psycopg.connect(admin_dsn, autocommit=True) as watcher:
        holder.execute(INSERT, (str(uuid.uuid4()),))
        proc = subprocess.Popen(["sh", str(SCRIPT), phase], env=env, cwd=cwd, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            waited = waited or bool(watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND application_name = 'safetynet-migrate'").fetchone() != (0,))
            if waited:
                time.sleep(HOLD)  # a few of its tries step back meanwhile
                break
            time.sleep(0.05)
        holder.commit()
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), waited


def messenger_indexes(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'messenger'")}


def test_install_upgrade_and_uninstall_as_the_doc_says_beside_a_busy_writer(
        messenger: dict[str, str], s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    admin = messenger["admin"]
    runtime, password = f"sn_rt_{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    config = tmp_path / "owner.toml"
    config.write_text(tomli_w.dumps({"postgres": {"dsn": messenger["owner_dsn"]}}))
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "ADMIN": admin, "OWNER": messenger["owner"], "CONFIG": str(config),
           "RUNTIME": runtime, "RUNTIME_PASSWORD": password, "DB": messenger["db"]}
    own = messenger_indexes(admin)  # the messenger's own, before safetynet
    with Writer(admin) as writer:
        installed, waited = run_phase("install", env, admin, tmp_path)
        assert installed.returncode == 0, (installed.stdout, installed.stderr[-3000:])
        assert "safetynet not installed yet" in installed.stdout
        assert waited and "migrate_lock_not_granted" in installed.stderr  # stepped back
        assert (tmp_path / "safetynet-plan.sql").read_text().startswith("-- safetynet migrate")
        with psycopg.connect(admin, autocommit=True) as conn:
            # a database at the release before migration 0017: its record not kept yet
            conn.execute("DROP TABLE safetynet.created_objects")
            conn.execute("DELETE FROM safetynet.schema_migrations WHERE version = 17")
            assert conn.execute(
                "SELECT has_database_privilege(%s, current_database(), 'CREATE')",
                (messenger["owner"],)).fetchone() == (False,)
        upgraded, _ = run_phase("upgrade", env, admin, tmp_path)
        assert upgraded.returncode == 0, (upgraded.stdout, upgraded.stderr[-3000:])
        assert "applied 0017_created_objects" in upgraded.stdout
        with psycopg.connect(admin) as conn:
            recorded = dict(conn.execute(
                "SELECT name, how FROM safetynet.created_objects").fetchall())
        built = messenger_indexes(admin) - own
        assert set(recorded) == built | {"trg_integration_outbox_notify"}
        assert set(recorded.values()) == {"backfilled"} and not own & set(recorded)
        works_as_the_runtime_role(admin, runtime, password, s3_server, bucket,
                                  kafka_server, tmp_path)
        removed, waited = run_phase("uninstall", env, admin, tmp_path)
        assert removed.returncode == 0, (removed.stdout, removed.stderr[-3000:])
        assert waited and "migrate_lock_not_granted" in removed.stderr  # stepped back
        script = (tmp_path / "safetynet-uninstall.sql").read_text()
        assert "DROP INDEX CONCURRENTLY" in script and "ix_rfa_due" not in script
    assert max(writer.waits) < 1.0, max(writer.waits)  # lock_timeout 0.5 s, never more
    assert len(writer.waits) > 50
    assert messenger_indexes(admin) == own
    with psycopg.connect(admin) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'safetynet'"
                            ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = "
                            "'messenger.integration_outbox'::regclass AND NOT tgisinternal"
                            ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s",
                            (runtime,)).fetchone() == (0,)
        (rows,) = conn.execute("SELECT count(*) FROM messenger.integration_outbox"
                               ).fetchone() or (0,)
    assert rows >= len(writer.waits)  # the messenger's data stays


def works_as_the_runtime_role(admin: str, runtime: str, password: str, s3: S3Server,
                              bucket: str, kafka: KafkaServer, tmp_path: Path) -> None:
    """After the upgrade (no --grant-to), the runtime role runs every job."""
    info = psycopg.conninfo.conninfo_to_dict(admin)
    dsn = psycopg.conninfo.make_conninfo("", **{**info, "user": runtime, "password": password})
    config = tmp_path / "runtime.toml"
    config.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn}, "s3": s3_settings(s3, bucket),
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}}))
    with psycopg.connect(admin, autocommit=True) as conn:
        conf = insert_conference(conn, status="Active", last_activity_ago=7200)
    for job in ("conference-reaper", "recording-finalize", "outbox-relay"):
        proc = cli(config, "run-once", "--job", job)
        assert proc.returncode == 0, (job, proc.stderr[-2000:])
    with psycopg.connect(admin) as conn:
        assert conn.execute("SELECT status FROM messenger.conference_sessions WHERE id = %s",
                            (conf.id,)).fetchone() == ("Ended",)
