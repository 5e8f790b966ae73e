"""`safetynet migrate` and `check-schema` with `[outbox_relay] source = "logical"` (issue
37, item 1): migrate creates the publication and the slot last when its role may, or
prints what a DBA must run and exits 1 naming it (`--print-sql` prints it too, and psql
applies it); check-schema verifies wal_level, the publication, the slot's plugin and
health, and warns when max_slot_wal_keep_size is unlimited."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import tomli_w

from actors.outbox.logical_setup import LogicalSource, drop_logical_source, setup_statements
from actors.outbox.queries import OUTBOX_QUERIES
from tests.cli import cli
from tests.integration.db.test_print_sql import new_role, psql


@pytest.fixture
def names(db_dsn: str) -> Iterator[LogicalSource]:
    """A slot and publication name of this test's own; whatever was created is dropped."""
    name = f"sn_{uuid.uuid4().hex[:12]}"
    src = LogicalSource(name, name)
    try:
        yield src
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            drop_logical_source(conn, src)


def logical_config(tmp_path: Path, dsn: str, src: LogicalSource) -> Path:
    path = tmp_path / f"c-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "outbox_relay": {"source": "logical", "slot": src.slot,
                         "publication": src.publication}}))
    return path


def slot_plugin(dsn: str, src: LogicalSource) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": src.slot}
                           ).fetchone()
    return None if row is None else str(row[0])


def test_migrate_creates_the_publication_and_the_slot_last_then_has_nothing_to_do(
        db_dsn: str, names: LogicalSource, tmp_path: Path) -> None:
    config = logical_config(tmp_path, db_dsn, names)
    first = cli(config, "migrate")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-2:] == [f"applied publication {names.publication}",
                                              f"applied slot {names.slot}"]
    assert slot_plugin(db_dsn, names) == "pgoutput"
    second = cli(config, "migrate")
    assert (second.returncode, second.stdout.strip()) == (0, "schema is up to date")


def test_migrate_in_the_table_source_creates_no_slot(
        db_dsn: str, names: LogicalSource, tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text(tomli_w.dumps({"postgres": {"dsn": db_dsn}, "outbox_relay": {
        "slot": names.slot, "publication": names.publication}}))
    done = cli(config, "migrate")
    assert (done.returncode, done.stdout.strip()) == (0, "schema is up to date")
    assert slot_plugin(db_dsn, names) is None


def test_check_schema_names_the_missing_slot_then_passes_with_a_warning(
        db_dsn: str, names: LogicalSource, tmp_path: Path) -> None:
    """Before migrate: exit 2, the publication and the slot missing with the SQL that
    creates them; after: exit 0, only the unlimited max_slot_wal_keep_size warned."""
    config = logical_config(tmp_path, db_dsn, names)
    before = cli(config, "check-schema")
    assert before.returncode == 2, before.stdout
    assert f"publication {names.publication} missing" in before.stdout
    assert f"replication slot {names.slot} missing" in before.stdout
    assert setup_statements(names)[1] in before.stdout
    assert cli(config, "migrate").returncode == 0
    after = cli(config, "check-schema")
    assert after.returncode == 0, after.stdout
    lines = after.stdout.splitlines()
    assert lines[-1] == "schema is compatible (with warnings)"
    assert [line for line in lines[:-1] if not line.startswith("warning: messenger.ix_")] == [
        "warning: messenger.integration_outbox: max_slot_wal_keep_size is unlimited: a "
        "stuck or forgotten slot retains WAL until the disk is full [outbox-relay] fix: "
        "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf(); (a size "
        "the WAL volume holds; docs/operations.md)"]


def test_check_schema_refuses_a_publication_of_updates_too(
        db_dsn: str, names: LogicalSource, tmp_path: Path) -> None:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {names.publication}"
                     " FOR TABLE messenger.integration_outbox")
    report = cli(logical_config(tmp_path, db_dsn, names), "check-schema")
    assert report.returncode == 2
    assert "publishes insert, update, delete, truncate of messenger.integration_outbox" \
        in report.stdout


def test_a_role_that_may_not_is_told_what_a_dba_runs_and_print_sql_applies_it(
        db_dsn: str, names: LogicalSource, tmp_path: Path) -> None:
    """migrate as a role without REPLICATION nor the table's ownership: exit 1 naming
    the publication and the slot, the two statements on stdout; --print-sql prints them
    as well, and psql (as the owner) applies them: then check-schema passes."""
    role, role_dsn = new_role(db_dsn, "nolog")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"GRANT USAGE ON SCHEMA safetynet, messenger TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA safetynet TO {role}")
    refused = cli(logical_config(tmp_path, role_dsn, names), "migrate")
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert refused.stdout.splitlines()[-2:] == setup_statements(names), refused.stderr
    assert (f"publication {names.publication}, slot {names.slot}) is not set up"
            in refused.stderr)
    assert "a DBA must run" in refused.stderr and "Traceback" not in refused.stderr
    printed = cli(logical_config(tmp_path, db_dsn, names), "migrate", "--print-sql")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines()[-2:] == setup_statements(names)
    applied = psql(db_dsn, printed.stdout, tmp_path)
    assert applied.returncode == 0, applied.stderr
    assert slot_plugin(db_dsn, names) == "pgoutput"
    again = cli(logical_config(tmp_path, db_dsn, names), "migrate", "--print-sql")
    assert (again.returncode, again.stdout) == (0, "")
    assert cli(logical_config(tmp_path, db_dsn, names), "check-schema").returncode == 0
