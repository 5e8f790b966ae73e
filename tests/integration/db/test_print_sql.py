"""`migrate --print-sql` is the script a DBA runs (issue 36, item 3), and grants survive
upgrades (item 2): the printed plan, applied with psql as printed, leaves nothing for
migrate to do; a granted role keeps working across a migration that adds a table."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
import tomli_w
from psycopg import sql

from supervision.db.migrate import (
    Options,
    apply_messenger_fixture,
    migrate,
    migrations,
    print_sql,
    schema_report,
)
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.cli import cli
from tests.integration.db.test_install import s3_settings
from tests.messenger import insert_conference

PSQL = shutil.which("psql") or "/usr/bin/psql"
PACKAGED = Path(__file__).resolve().parents[3] / "supervision" / "db" / "sql" / "migrations"


def psql(dsn: str, script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"plan-{uuid.uuid4().hex[:6]}.sql"
    path.write_text(script)
    return subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(path), dsn],
                          capture_output=True, text=True, check=False, timeout=120)


def release_folder(tmp_path: Path, upto: int, extra: dict[str, str] | None = None) -> Path:
    """The packaged migrations up to *upto* (a previous release's ledger), plus *extra*."""
    folder = tmp_path / f"migrations-{upto}-{uuid.uuid4().hex[:4]}"
    folder.mkdir()
    for m in migrations():
        if m.version <= upto:
            shutil.copy(PACKAGED / f"{m.label}.sql", folder)
    for name, text in (extra or {}).items():
        (folder / name).write_text(text)
    return folder


def applied_by_psql(dsn: str, tmp_path: Path, options: Options | None = None) -> str:
    script = print_sql(dsn, options or Options())
    proc = psql(dsn, script, tmp_path)
    assert proc.returncode == 0, (proc.stderr, script[:2000])
    return script


def new_role(dsn: str, prefix: str) -> tuple[str, str]:
    role, password = f"{prefix}_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)))
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    info.update(user=role, password=password)
    return role, psycopg.conninfo.make_conninfo("", **info)


def test_print_sql_applied_with_psql_to_a_fresh_messenger_database_leaves_nothing_to_do(
        empty_db_dsn: str, tmp_path: Path) -> None:
    """On a messenger database without safetynet: the script creates the schema and the
    ledger, pins search_path, takes the advisory lock, runs every migration with its
    ledger row, builds the indexes CONCURRENTLY outside transactions; then migrate has
    nothing to do and check-schema finds nothing."""
    apply_messenger_fixture(empty_db_dsn)
    script = applied_by_psql(empty_db_dsn, tmp_path)
    assert script.index("SET search_path = pg_catalog, pg_temp;") < script.index("BEGIN;")
    assert "pg_advisory_lock(" in script and "SET LOCAL lock_timeout = '500ms';" in script
    assert migrate(empty_db_dsn) == []
    report = schema_report(empty_db_dsn)
    assert (report.blocking, report.lines()) == (False, [])
    assert print_sql(empty_db_dsn) == ""


def test_print_sql_upgrades_a_database_of_the_previous_release(
        empty_db_dsn: str, tmp_path: Path) -> None:
    """A database migrated up to 0013 (the previous release): the script applies only
    what is new; afterwards migrate has nothing to do and check-schema exits 0."""
    apply_messenger_fixture(empty_db_dsn)
    migrate(empty_db_dsn, Options(folder=release_folder(tmp_path, 13)))
    script = applied_by_psql(empty_db_dsn, tmp_path)
    assert "-- 0014_" in script and "-- 0013_" not in script
    assert migrate(empty_db_dsn) == []
    assert schema_report(empty_db_dsn).lines() == []


def test_print_sql_safetynet_only_applied_with_psql(empty_db_dsn: str, tmp_path: Path) -> None:
    """--safetynet-only: the script has no messenger-side statement; applied, migrate
    --safetynet-only has nothing to do, check-schema exits 0 (missing indexes warn), and a
    full migrate builds only the messenger-side objects."""
    apply_messenger_fixture(empty_db_dsn)
    only = Options(safetynet_only=True)
    script = applied_by_psql(empty_db_dsn, tmp_path, only)
    code = "\n".join(line for line in script.splitlines() if not line.startswith("--"))
    assert "CONCURRENTLY" not in code and "ON messenger.integration_outbox FOR" not in code
    assert migrate(empty_db_dsn, only) == []
    assert not schema_report(empty_db_dsn).blocking
    assert all(s.migration is None for s in migrate(empty_db_dsn))


def test_print_sql_with_grant_to_applied_with_psql_grants_and_records_the_role(
        empty_db_dsn: str, tmp_path: Path) -> None:
    """--grant-to in the script: the role is recorded and granted by psql; migrate then
    has nothing to do, and the role reads a contract column but no other."""
    apply_messenger_fixture(empty_db_dsn)
    role, role_dsn = new_role(empty_db_dsn, "sn_dba")
    script = applied_by_psql(empty_db_dsn, tmp_path, Options(grant_to=role))
    assert f'GRANT USAGE ON SCHEMA messenger, safetynet TO "{role}";' in script
    assert migrate(empty_db_dsn) == []
    with psycopg.connect(role_dsn, autocommit=True) as conn:
        conn.execute("SELECT id, status FROM messenger.call_recordings")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT chat_id FROM messenger.call_sessions")


ADDED = """CREATE TABLE safetynet.sn_test_added (id bigint PRIMARY KEY, note text NOT NULL);
CREATE FUNCTION safetynet.sn_test_added_count() RETURNS bigint
LANGUAGE sql STABLE AS $$ SELECT pg_catalog.count(*) FROM safetynet.sn_test_added $$;
"""


def test_grants_survive_an_upgrade_that_adds_a_table(
        empty_db_dsn: str, s3_server: S3Server, bucket: str, kafka_server: KafkaServer,
        tmp_path: Path) -> None:
    """A runtime role and a read-only role granted once; a later migrate without any
    grant flag (the Kubernetes Job) applies a migration that adds a table and a function:
    both roles reach them as their access says, the runtime role runs every job's
    run-once, the read-only role reads (status, plan) and cannot write."""
    apply_messenger_fixture(empty_db_dsn)
    runtime, runtime_dsn = new_role(empty_db_dsn, "sn_rt")
    reader, reader_dsn = new_role(empty_db_dsn, "sn_ro")
    migrate(empty_db_dsn, Options(grant_to=runtime, grant_read_to=reader))
    assert migrate(empty_db_dsn) == []  # granted by this build, nothing ran: nothing to do
    upgrade = release_folder(tmp_path, 9998, {"9999_test_added.sql": ADDED})
    steps = migrate(empty_db_dsn, Options(folder=upgrade))
    assert [s.label for s in steps] == ["9999_test_added", f"grants to {runtime}, {reader}"
                                        if runtime < reader else
                                        f"grants to {reader}, {runtime}"]
    with psycopg.connect(runtime_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO safetynet.sn_test_added VALUES (1, 'x')")
        assert conn.execute("SELECT safetynet.sn_test_added_count()").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO safetynet.grantees (role_name, access) "
                         "VALUES ('intruder', 'runtime')")
    with psycopg.connect(reader_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM safetynet.sn_test_added").fetchone() == (1,)
        for statement in ("INSERT INTO safetynet.sn_test_added VALUES (2, 'y')",
                          "UPDATE messenger.call_recordings SET status = 'Failed'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)  # type: ignore[call-overload]
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conf = insert_conference(conn, status="Active", last_activity_ago=7200)
    settings = {"s3": s3_settings(s3_server, bucket),
                "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers}}
    as_runtime, as_reader = tmp_path / "rt.toml", tmp_path / "ro.toml"
    as_runtime.write_text(tomli_w.dumps({"postgres": {"dsn": runtime_dsn}, **settings}))
    as_reader.write_text(tomli_w.dumps({"postgres": {"dsn": reader_dsn}, **settings}))
    for job in ("conference-reaper", "recording-finalize", "outbox-relay"):
        proc = cli(as_runtime, "run-once", "--job", job)
        assert proc.returncode == 0, (job, proc.stderr)
    with psycopg.connect(empty_db_dsn) as conn:
        assert conn.execute("SELECT status FROM messenger.conference_sessions WHERE id = %s",
                            (conf.id,)).fetchone() == ("Ended",)
        assert conn.execute("SELECT count(*) FROM messenger.integration_outbox "
                            "WHERE published_at IS NULL").fetchone() == (0,)
    for args in (["status", "--json"], ["plan", "--job", "recording-finalize"],
                 ["plan", "--job", "conference-reaper"], ["plan", "--job", "outbox-relay"]):
        proc = cli(as_reader, *args)
        assert proc.returncode in (0, 2), (args, proc.stderr)  # 2: an SLO verdict
        assert "permission denied" not in proc.stderr, (args, proc.stderr)
