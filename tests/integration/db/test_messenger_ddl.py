"""The messenger's own DDL with safetynet installed (issue 36, item 1): safetynet pins none
of the messenger's columns, so every type change, rename or drop the messenger runs goes
through without CASCADE; check-schema then tells the truth about the contract, and each
job runs or stops exactly as it says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w

from supervision.db import schema_contract as contract
from supervision.db.migrate import messenger_catalog
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from tests.cli import cli
from tests.integration.db.test_install import s3_settings
from tests.messenger import (
    insert_call_session,
    insert_conference,
    insert_recording,
    upload_recording,
)

# Every dependency on a messenger object by an object that is not the messenger's own:
# an index (its own, or one safetynet built) on a messenger table is in the messenger
# schema, and a table's defaults, constraints, TOAST table and row type are the table's.
# What is left must be only the optional NOTIFY trigger.
FOREIGN_DEPENDENCIES = """
WITH m AS (SELECT oid FROM pg_namespace WHERE nspname = 'messenger'),
refs AS (
    SELECT d.* FROM pg_depend d
    WHERE (d.refclassid = 'pg_class'::regclass AND d.refobjid IN (
               SELECT c.oid FROM pg_class c WHERE c.relnamespace IN (SELECT oid FROM m)))
       OR (d.refclassid = 'pg_type'::regclass AND d.refobjid IN (
               SELECT t.oid FROM pg_type t WHERE t.typnamespace IN (SELECT oid FROM m)))
       OR (d.refclassid = 'pg_proc'::regclass AND d.refobjid IN (
               SELECT p.oid FROM pg_proc p WHERE p.pronamespace IN (SELECT oid FROM m)))
       OR (d.refclassid = 'pg_namespace'::regclass AND d.refobjid IN (SELECT oid FROM m))
)
SELECT pg_describe_object(r.classid, r.objid, r.objsubid) AS object,
       pg_describe_object(r.refclassid, r.refobjid, r.refobjsubid) AS depends_on
FROM refs r
WHERE NOT (r.classid = 'pg_class'::regclass AND r.objid IN (
               SELECT c.oid FROM pg_class c
               WHERE c.relnamespace IN (SELECT oid FROM m)
                  OR c.relnamespace = 'pg_toast'::regnamespace))
  AND NOT (r.classid = 'pg_type'::regclass AND r.objid IN (
               SELECT t.oid FROM pg_type t WHERE t.typnamespace IN (SELECT oid FROM m)))
  AND NOT (r.classid = 'pg_attrdef'::regclass AND r.objid IN (
               SELECT a.oid FROM pg_attrdef a JOIN pg_class c ON c.oid = a.adrelid
               WHERE c.relnamespace IN (SELECT oid FROM m)))
  AND NOT (r.classid = 'pg_constraint'::regclass AND r.objid IN (
               SELECT k.oid FROM pg_constraint k WHERE k.connamespace IN (SELECT oid FROM m)))
ORDER BY 1, 2
"""
NOTIFY_TRIGGER = ("trigger trg_integration_outbox_notify on table messenger.integration_outbox",
                  "table messenger.integration_outbox")


def test_no_safetynet_object_but_indexes_and_the_trigger_depends_on_a_messenger_object(
        db_dsn: str) -> None:
    """pg_depend: no function, view, rule or constraint of safetynet's records a dependency
    on a messenger table, column, type or function; only the NOTIFY trigger does (and the
    indexes, which live on the messenger's tables)."""
    with psycopg.connect(db_dsn) as conn:
        found = conn.execute(FOREIGN_DEPENDENCIES).fetchall()
        safetynet_owned = conn.execute(
            "SELECT count(*) FROM pg_depend d JOIN pg_proc p ON d.classid = 'pg_proc'::regclass"
            " AND p.oid = d.objid WHERE p.pronamespace = 'safetynet'::regnamespace"
            " AND d.refclassid = 'pg_class'::regclass").fetchone()
    assert found == [NOTIFY_TRIGGER]
    assert safetynet_owned == (0,)


# The contract's columns, one entry each, with the jobs a problem there stops.
def contract_columns() -> dict[tuple[str, str], frozenset[str]]:
    out: dict[tuple[str, str], frozenset[str]] = {}
    for column in contract.COLUMNS:
        key = (column.table, column.name)
        out[key] = out.get(key, frozenset()) | column.jobs
    return out


CONTRACT = contract_columns()
DOMAINS = ("CREATE DOMAIN messenger.sn_uuid AS uuid",
           "CREATE DOMAIN messenger.sn_bigint AS bigint",
           "CREATE DOMAIN messenger.sn_jsonb AS jsonb")


def compatible_type(col: contract.CatalogColumn, identity: bool) -> str:
    """A type change the contract accepts: wider text, a wider integer, a domain over the
    same base type, a timestamptz of another precision."""
    return {"uuid": "messenger.sn_uuid", "varchar": "text", "text": "varchar(4096)",
            "bpchar": "text", "int4": "bigint",
            "int8": "bigint" if identity else "messenger.sn_bigint",
            "timestamptz": "timestamptz(3)", "jsonb": "messenger.sn_jsonb"}[col.type_name]


def incompatible_type(col: contract.CatalogColumn) -> tuple[str, str]:
    """A type change the contract refuses (check-schema names the column), and a default
    of the new type (the messenger replaces a default along with its column's type)."""
    name = col.name
    return {"uuid": (f"text USING {name}::text", "''"), "varchar": ("smallint USING 0", "0"),
            "text": ("smallint USING 0", "0"), "bpchar": ("smallint USING 0", "0"),
            "int4": ("numeric", "0"), "int8": ("integer", "0"),
            "timestamptz": (f"timestamp USING {name} AT TIME ZONE 'UTC'", "localtimestamp"),
            "jsonb": (f"json USING {name}::json", "'{}'")}[col.type_name]


@pytest.fixture
def ddl_conn(db_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A session of the messenger's owner; the fixture's one foreign key (the messenger's
    own, not safetynet's: it would refuse a type change of conference_sessions.id) and
    safetynet's tables stay as migrate left them."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE messenger.conference_participants "
                     "DROP CONSTRAINT conference_participants_conference_id_fkey")
        for statement in DOMAINS:
            conn.execute(statement)  # type: ignore[call-overload]
        yield conn


def problems_after(conn: psycopg.Connection[Any], *statements: str) -> list[contract.Problem]:
    """Run the messenger's DDL (it must succeed, no CASCADE), read the contract's verdict
    in the same transaction, and roll it all back."""
    with conn.transaction(force_rollback=True):
        for statement in statements:
            conn.execute(statement)  # type: ignore[call-overload]
        return contract.check(*messenger_catalog(conn))


def catalog_columns(conn: psycopg.Connection[Any]) -> dict[tuple[str, str], Any]:
    columns, _ = messenger_catalog(conn)
    return {(c.table, c.name): c for c in columns}


def identity_columns(conn: psycopg.Connection[Any]) -> set[tuple[str, str]]:
    return {(str(t), str(c)) for t, c in conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = 'messenger' AND is_identity = 'YES'").fetchall()}


def blocking(problems: list[contract.Problem]) -> dict[str, frozenset[str]]:
    """subject -> every job its blocking problems stop."""
    out: dict[str, frozenset[str]] = {}
    for p in problems:
        if p.blocking:
            out[p.subject] = out.get(p.subject, frozenset()) | p.jobs
    return out


def test_type_changes_of_every_contract_column_succeed_and_check_schema_tells_the_truth(
        ddl_conn: psycopg.Connection[Any]) -> None:
    """Each contract column changed to a type the contract accepts: the DDL succeeds and
    check-schema finds nothing. Changed to one it refuses: the DDL succeeds too (an index
    on it is rebuilt) and check-schema names exactly that column, with the jobs it stops."""
    catalog = catalog_columns(ddl_conn)
    identity = identity_columns(ddl_conn)
    assert set(CONTRACT) <= set(catalog)
    for (table, name), jobs in CONTRACT.items():
        col = catalog[(table, name)]
        alter = f"ALTER TABLE messenger.{table} ALTER COLUMN {name}"
        fine = problems_after(
            ddl_conn, f"{alter} TYPE {compatible_type(col, (table, name) in identity)}")
        assert [p.line() for p in fine] == [], (table, name)
        new_type, new_default = incompatible_type(col)
        change = f"{alter} TYPE {new_type}"
        if col.has_default and (table, name) not in identity:
            change = (f"{alter} DROP DEFAULT, ALTER COLUMN {name} TYPE {new_type}, "
                      f"ALTER COLUMN {name} SET DEFAULT {new_default}")
        broken = problems_after(ddl_conn, change)
        assert blocking(broken) == {f"{table}.{name}": jobs}, (table, name, broken)


def test_renames_and_drops_of_contract_columns_succeed_and_check_schema_names_them(
        ddl_conn: psycopg.Connection[Any]) -> None:
    """A contract column renamed, or dropped (with the indexes on it, which PostgreSQL
    drops along): no CASCADE needed; check-schema names the column as missing, with its
    jobs, and otherwise only the required keys that went with it (and, renamed in an
    outbox, the new name as a NOT NULL column the INSERTs leave out)."""
    required_on: dict[tuple[str, str], set[str]] = {}
    for index in contract.INDEXES:
        if index.required:
            for column in index.columns:
                required_on.setdefault((index.table, column), set()).add(index.name)
    for (table, name), jobs in CONTRACT.items():
        for statement in (f"ALTER TABLE messenger.{table} RENAME COLUMN {name} TO {name}_old",
                          f"ALTER TABLE messenger.{table} DROP COLUMN {name}"):
            found = blocking(problems_after(ddl_conn, statement))
            assert found.pop(f"{table}.{name}") == jobs, statement
            # a renamed NOT NULL column of an outbox is one the INSERTs do not fill
            renamed = {f"{table}.{name}_old"} if "RENAME" in statement else set()
            allowed = required_on.get((table, name), set()) | renamed
            assert set(found) <= allowed, (statement, found)


def test_adding_and_dropping_other_columns_keeps_the_contract(
        ddl_conn: psycopg.Connection[Any]) -> None:
    """Columns the contract does not name come and go freely: each DDL succeeds and
    check-schema finds nothing."""
    catalog = catalog_columns(ddl_conn)
    others = [key for key in catalog if key not in CONTRACT]
    assert others  # the fixture has some (call_sessions.chat_id, ...)
    drops = [f"ALTER TABLE messenger.{t} DROP COLUMN {c}" for t, c in others]
    adds = [f"ALTER TABLE messenger.{t} ADD COLUMN sn_extra text" for t in contract.TABLES]
    for statement in [*drops, *adds]:
        assert problems_after(ddl_conn, statement) == [], statement
    for table in contract.TABLES:
        assert problems_after(
            ddl_conn, f"ALTER TABLE messenger.{table} ADD COLUMN sn_extra text",
            f"ALTER TABLE messenger.{table} DROP COLUMN sn_extra") == [], table
    assert [p.line() for p in problems_after(ddl_conn, *drops, *adds)] == []


def job_config(path: Path, dsn: str, s3: S3Server, bucket: str, kafka: KafkaServer) -> Path:
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn}, "s3": s3_settings(s3, bucket),
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "logging": {"level": "warning"}}))
    return path


JOBS = ("recording-finalize", "conference-reaper", "outbox-relay")
# One committed change per job that breaks only that job's contract: a type change, a
# rename and a drop, as the messenger's own migrations would run them.
BREAKS = {
    "recording-finalize": (
        "ALTER TABLE messenger.recording_finalize_attempts ALTER COLUMN last_error "
        "TYPE smallint USING NULL", "recording_finalize_attempts.last_error"),
    "conference-reaper": (
        "ALTER TABLE messenger.conference_sessions RENAME COLUMN last_activity_at "
        "TO last_seen_at", "conference_sessions.last_activity_at"),
    "outbox-relay": (
        "ALTER TABLE messenger.integration_outbox DROP COLUMN publish_attempts",
        "integration_outbox.publish_attempts"),
}


def test_each_job_runs_or_stops_exactly_as_check_schema_says(
        ddl_conn: psycopg.Connection[Any], db_dsn: str, s3_server: S3Server, bucket: str,
        kafka_server: KafkaServer, tmp_path: Path) -> None:
    """Every contract column at a compatible type (committed): check-schema exits 0 and
    each job's run-once does its work. Then, per job, one committed change that breaks
    only its contract: check-schema exits 2 naming the column, that job's run-once exits
    78 naming it and touching nothing, the two others run."""
    conn = ddl_conn
    catalog, identity = catalog_columns(conn), identity_columns(conn)
    for (table, name) in CONTRACT:
        conn.execute(f"ALTER TABLE messenger.{table} ALTER COLUMN {name} TYPE "  # type: ignore[call-overload]
                     f"{compatible_type(catalog[(table, name)], (table, name) in identity)}")
    config = job_config(tmp_path / "c.toml", db_dsn, s3_server, bucket, kafka_server)
    check = cli(config, "check-schema")
    assert (check.returncode, check.stdout) == (0, "schema is compatible\n"), check.stdout
    conf = insert_conference(conn, status="Active", last_activity_ago=7200)
    rec = insert_recording(conn, session_id=insert_call_session(conn, ended_ago=3600))
    upload_recording(s3_server, rec.id, bucket=bucket)
    for job in JOBS:
        proc = cli(config, "run-once", "--job", job)
        assert proc.returncode == 0, (job, proc.stderr)
    assert conn.execute("SELECT status FROM messenger.conference_sessions WHERE id = %s",
                        (conf.id,)).fetchone() == ("Ended",)
    assert conn.execute("SELECT status FROM messenger.call_recordings WHERE id = %s",
                        (rec.id,)).fetchone() == ("Available",)
    assert conn.execute("SELECT count(*) FROM messenger.integration_outbox "
                        "WHERE published_at IS NULL").fetchone() == (0,)
    for broken_job, (statement, subject) in BREAKS.items():
        due = insert_conference(conn, status="Active", last_activity_ago=7200)
        conn.execute(statement)  # type: ignore[call-overload]
        check = cli(config, "check-schema")
        assert check.returncode == 2, check.stdout
        assert [line.split(": ")[1] for line in check.stdout.splitlines()
                if line.startswith("error: ")] == [f"messenger.{subject}"]
        for job in JOBS:
            proc = cli(config, "run-once", "--job", job)
            if job == broken_job:
                assert proc.returncode == 78, (job, proc.stderr)
                assert f"messenger.{subject}" in proc.stderr
                assert "Traceback" not in proc.stderr
            else:
                assert proc.returncode == 0, (broken_job, job, proc.stderr)
        reaped = conn.execute("SELECT status FROM messenger.conference_sessions "
                              "WHERE id = %s", (due.id,)).fetchone()
        assert reaped == (("Active",) if broken_job == "conference-reaper" else ("Ended",))
        conn.execute(UNDO[broken_job])  # type: ignore[call-overload]


UNDO = {
    "recording-finalize": "ALTER TABLE messenger.recording_finalize_attempts ALTER COLUMN "
                          "last_error TYPE varchar(512) USING NULL",
    "conference-reaper": "ALTER TABLE messenger.conference_sessions RENAME COLUMN "
                         "last_seen_at TO last_activity_at",
    "outbox-relay": "ALTER TABLE messenger.integration_outbox ADD COLUMN publish_attempts "
                    "int NOT NULL DEFAULT 0",
}
