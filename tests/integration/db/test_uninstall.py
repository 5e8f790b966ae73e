"""`safetynet uninstall` removes exactly what safetynet created (issue 36, item 10): what
migrate recorded as it built it, or backfilled when provably its own — never an index the
messenger had under the same name; the grants go with it; the printed plan applies with
psql as the verb would."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from supervision.db.migrate import Options, apply_messenger_fixture, migrate
from supervision.db.schema_contract import INDEXES
from supervision.db.uninstall import planned, uninstall
from supervision.errors import MigrationError
from tests.cli import cli, postgres_only_config
from tests.integration.db.test_print_sql import new_role, psql

OURS = {i.name: i for i in INDEXES if not i.required}


def indexes(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = 'messenger'")}


def recorded(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute("SELECT name, how FROM safetynet.created_objects"
                                 ).fetchall())


def test_an_index_the_messenger_had_under_our_name_is_never_recorded_nor_dropped(
        empty_db_dsn: str) -> None:
    """The messenger built ix_outbox_created (the contract's name and definition) before
    safetynet: migrate reuses it, records every other index it builds and the trigger; the
    backfill of an upgrade to 0017 claims the others again but not that one; uninstall
    leaves it (and the messenger's own) and removes everything else."""
    apply_messenger_fixture(empty_db_dsn)
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute(OURS["ix_outbox_created"].ddl(concurrently=False))
    before = indexes(empty_db_dsn)
    migrate(empty_db_dsn)
    built = indexes(empty_db_dsn) - before
    assert "ix_outbox_created" in before and built and built <= set(OURS)
    assert recorded(empty_db_dsn) == {**dict.fromkeys(built, "built"),
                                      "trg_integration_outbox_notify": "built"}
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:  # a release before 0017
        conn.execute("DROP TABLE safetynet.created_objects")
        conn.execute("DELETE FROM safetynet.schema_migrations WHERE version = 17")
    steps = [s.label for s in migrate(empty_db_dsn)]
    assert steps[:2] == ["0017_created_objects", "record what earlier releases built"]
    assert recorded(empty_db_dsn) == {**dict.fromkeys(built, "backfilled"),
                                      "trg_integration_outbox_notify": "backfilled"}
    uninstall(empty_db_dsn)
    assert indexes(empty_db_dsn) == before


def test_uninstall_revokes_the_grants_and_the_printed_plan_applies_with_psql(
        empty_db_dsn: str, tmp_path: Path) -> None:
    apply_messenger_fixture(empty_db_dsn)
    role, _ = new_role(empty_db_dsn, "sn_rt")
    reader, _ = new_role(empty_db_dsn, "sn_ro")
    migrate(empty_db_dsn, Options(grant_to=role, grant_read_to=reader))
    script = planned(empty_db_dsn).script()
    assert script.startswith("-- safetynet uninstall")
    proc = psql(empty_db_dsn, script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert planned(empty_db_dsn).steps == []  # nothing left to remove
    with psycopg.connect(empty_db_dsn) as conn:
        for who in (role, reader):
            assert conn.execute(
                "SELECT has_any_column_privilege(%s, 'messenger.call_recordings', 'SELECT'),"
                " has_schema_privilege(%s, 'messenger', 'USAGE')", (who, who)
            ).fetchone() == (False, False)
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute(f'DROP ROLE "{role}"')  # nothing of it left in this database
        conn.execute(f'DROP ROLE "{reader}"')


def test_uninstall_needs_yes_or_print_sql(db_dsn: str, tmp_path: Path) -> None:
    config = postgres_only_config(tmp_path, db_dsn)
    proc = cli(config, "uninstall")
    assert proc.returncode == 2 and "--yes" in proc.stderr and "Traceback" not in proc.stderr
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'safetynet'"
                            ).fetchone() == (1,)


def test_uninstall_refuses_while_a_replica_is_connected(db_dsn: str) -> None:
    with psycopg.connect(db_dsn, application_name="safetynet-lock"), \
            pytest.raises(MigrationError, match="safetynet-lock: 1"):
        uninstall(db_dsn)
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'safetynet'"
                            ).fetchone() == (1,)
