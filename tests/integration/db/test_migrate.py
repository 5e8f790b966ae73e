"""The messenger fixture plus `safetynet migrate` give SPEC §2 exactly (checked from the
catalog); migrate owns only the safetynet schema and its indexes, online and idempotent."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from supervision.db.migrate import (
    LEGACY_CHECKSUMS,
    Options,
    apply_messenger_fixture,
    install_demo,
    migrate,
    migrations,
    print_sql,
)
from supervision.db.queries import QUERIES
from supervision.db.schema_contract import INDEXES
from supervision.errors import MigrationError

ROOT = Path(__file__).resolve().parents[3]

# table -> [(column, type as format_type() prints it, NOT NULL, default or None)]
EXPECTED_COLUMNS: dict[str, list[tuple[str, str, bool, str | None]]] = {
    "call_sessions": [
        ("id", "uuid", True, None), ("chat_id", "uuid", False, None),
        ("deal_id", "uuid", False, None), ("tenant_id", "uuid", False, None),
        ("status", "character varying(16)", True, None),
        ("started_at", "timestamp with time zone", False, None),
        ("ended_at", "timestamp with time zone", False, None),
        ("created_at", "timestamp with time zone", True, None),
        ("updated_at", "timestamp with time zone", True, None),
    ],
    "conference_sessions": [
        ("id", "uuid", True, None), ("chat_id", "uuid", True, None),
        ("deal_id", "uuid", True, None), ("tenant_id", "uuid", False, None),
        ("media_type", "character varying(8)", True, None),
        ("status", "character varying(16)", True, None),
        ("end_reason", "character varying(16)", False, None),
        ("started_by_user_id", "uuid", True, None),
        ("created_at", "timestamp with time zone", True, None),
        ("started_at", "timestamp with time zone", False, None),
        ("last_activity_at", "timestamp with time zone", True, None),
        ("active_participant_count", "integer", True, "0"),
        ("peak_participant_count", "integer", True, "0"),
        ("ended_at", "timestamp with time zone", False, None),
        ("duration_seconds", "integer", False, None),
        ("updated_at", "timestamp with time zone", True, None),
    ],
    "conference_participants": [
        ("conference_id", "uuid", True, None), ("user_id", "uuid", True, None),
        ("role", "character varying(16)", True, "'Participant'::character varying"),
        ("joined_at", "timestamp with time zone", True, None),
        ("left_at", "timestamp with time zone", False, None),
    ],
    "call_recordings": [
        ("id", "uuid", True, None), ("session_kind", "character varying(12)", True, None),
        ("session_id", "uuid", True, None), ("chat_id", "uuid", False, None),
        ("deal_id", "uuid", False, None), ("tenant_id", "uuid", False, None),
        ("media_type", "character varying(8)", True, None),
        ("trigger", "character varying(16)", True, None),
        ("status", "character varying(16)", True, None), ("file_id", "text", False, None),
        ("size_bytes", "bigint", False, None), ("duration_seconds", "integer", False, None),
        ("format", "character varying(8)", False, None),
        ("failure_reason", "character varying(24)", False, None),
        ("started_at", "timestamp with time zone", False, None),
        ("ended_at", "timestamp with time zone", False, None),
        ("available_at", "timestamp with time zone", False, None),
        ("created_at", "timestamp with time zone", True, None),
        ("updated_at", "timestamp with time zone", True, None),
    ],
    "recording_finalize_attempts": [
        ("id", "uuid", True, None), ("recording_id", "uuid", True, None),
        ("session_kind", "character varying(12)", True, None),
        ("session_id", "uuid", True, None),
        ("status", "character varying(16)", True, "'Pending'::character varying"),
        ("attempts", "integer", True, "0"),
        ("next_attempt_at", "timestamp with time zone", True, None),
        ("last_error", "character varying(512)", False, None),
        ("created_at", "timestamp with time zone", True, None),
        ("updated_at", "timestamp with time zone", True, None),
    ],
    "integration_outbox": [
        ("id", "bigint", True, None), ("topic", "text", True, None),
        ("message_key", "text", True, None), ("dedupe_key", "text", True, None),
        ("event_type", "text", True, None), ("payload", "jsonb", True, None),
        ("headers", "jsonb", True, "'{}'::jsonb"),
        ("created_at", "timestamp with time zone", True, "now()"),
        ("published_at", "timestamp with time zone", False, None),
        ("publish_attempts", "integer", True, "0"),
        ("last_error", "character varying(512)", False, None),
    ],
    "realtime_outbox": [
        ("id", "bigint", True, None), ("kind", "character varying(32)", True, None),
        ("target_kind", "character varying(16)", True, None),
        ("chat_id", "uuid", False, None),
        ("session_kind", "character varying(12)", True, None),
        ("reference_id", "uuid", True, None),
        ("payload", "jsonb", True, "'{}'::jsonb"),
        ("created_at", "timestamp with time zone", True, "now()"),
        ("dispatched_at", "timestamp with time zone", False, None),
    ],
}

# index -> (table, unique, columns, predicate or None)
EXPECTED_INDEXES = {
    "ix_conf_active": ("conference_sessions", False, ["status", "last_activity_at"],
                       "((status)::text = ANY ((ARRAY['Provisioning'::character varying, "
                       "'Active'::character varying])::text[]))"),
    "ix_recording_active": ("call_recordings", False, ["session_kind", "session_id"],
                            "((status)::text = ANY ((ARRAY['Pending'::character varying, "
                            "'Recording'::character varying, "
                            "'Uploading'::character varying])::text[]))"),
    "ux_rfa_recording": ("recording_finalize_attempts", True, ["recording_id"], None),
    "ix_rfa_due": ("recording_finalize_attempts", False, ["status", "next_attempt_at"], None),
    "ux_outbox_dedupe": ("integration_outbox", True, ["topic", "dedupe_key"], None),
    "ix_outbox_unpublished": ("integration_outbox", False, ["id"], "(published_at IS NULL)"),
    # the invariant auditor's windows (migration 0008), beyond SPEC §2
    "ix_recording_terminal_updated": ("call_recordings", False, ["updated_at"],
                                      "((status)::text = ANY ((ARRAY['Available'::character "
                                      "varying, 'Failed'::character varying])::text[]))"),
    "ix_conf_terminal_updated": ("conference_sessions", False, ["updated_at"],
                                 "((status)::text = ANY ((ARRAY['Ended'::character varying, "
                                 "'Failed'::character varying])::text[]))"),
    "ix_outbox_created": ("integration_outbox", False, ["created_at"], None),
    # migration 0011: the unpublished rows that are not dead letters (issue #26)
    "ix_outbox_live": ("integration_outbox", False, ["id"],
                       "((published_at IS NULL) AND ((last_error IS NULL) OR (NOT "
                       "((last_error)::text ^@ 'dead-letter:'::text))))"),
    # issue 37: the logical source's held rows (few)
    "ix_outbox_held": ("integration_outbox", False, ["id"],
                       "((published_at IS NULL) AND ((last_error)::text ^@ 'held:'::text))"),
    "ix_realtime_reference": ("realtime_outbox", False, ["reference_id"], None),
    # a million-row backlog (migration 0009): bounded gauges and reaper claims
    "ix_rfa_pending_created": ("recording_finalize_attempts", False, ["created_at"],
                               "((status)::text = 'Pending'::text)"),
    "ix_conf_empty_room": ("conference_sessions", False, ["last_activity_at", "id"],
                           "(((status)::text = 'Active'::text) AND "
                           "(active_participant_count = 0))"),
    "ix_conf_provisioning": ("conference_sessions", False, ["created_at", "id"],
                             "((status)::text = 'Provisioning'::text)"),
    # the reaper's recordings of a batch (migration 0010), terminal ones included
    "ix_recording_session": ("call_recordings", False, ["session_kind", "session_id"], None),
    # the console's search by file id (migration 0012)
    "ix_recording_file_id": ("call_recordings", False, ["file_id"], "(file_id IS NOT NULL)"),
    # the console's keyset pages and the oldest quarantined rows (issue 27)
    "ix_rfa_queue": ("recording_finalize_attempts", False,
                     ["status", "next_attempt_at", "id"], None),
    "ix_rfa_quarantined": ("recording_finalize_attempts", False, ["updated_at"],
                           "((status)::text = 'Quarantined'::text)"),
    # outbox retention's deletes (issue 28)
    "ix_outbox_published": ("integration_outbox", False, ["published_at"],
                            "(published_at IS NOT NULL)"),
}

PRIMARY_KEYS = {
    "call_sessions": ["id"], "conference_sessions": ["id"],
    "conference_participants": ["conference_id", "user_id"], "call_recordings": ["id"],
    "recording_finalize_attempts": ["id"], "integration_outbox": ["id"],
    "realtime_outbox": ["id"],
}

COLUMNS_SQL = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), a.attidentity
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = 'messenger' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY c.relname, a.attnum
"""

INDEXES_SQL = """
SELECT i.relname, t.relname, x.indisunique, x.indisprimary,
       array(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY k(attnum, ord)
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum ORDER BY k.ord),
       pg_get_expr(x.indpred, x.indrelid)
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'messenger'
"""


def catalog(dsn: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(COLUMNS_SQL).fetchall(), conn.execute(INDEXES_SQL).fetchall()


def test_migrate_creates_every_table_and_column_of_spec(empty_db_dsn: str) -> None:
    """Tables, column order, types, nullability and defaults equal SPEC §2."""
    install_demo(empty_db_dsn)
    columns, _ = catalog(empty_db_dsn)
    found: dict[str, list[tuple[str, str, bool, str | None]]] = {}
    identity: dict[str, str] = {}
    for table, column, ctype, notnull, default, ident in columns:
        found.setdefault(str(table), []).append((str(column), str(ctype), bool(notnull),
                                                  default and str(default)))
        if ident:
            identity[f"{table}.{column}"] = str(ident)
    assert found == EXPECTED_COLUMNS
    assert identity == {"integration_outbox.id": "a", "realtime_outbox.id": "a"}


def test_migrate_creates_every_index_with_its_predicate(empty_db_dsn: str) -> None:
    """Named indexes, uniqueness, columns and partial-index predicates equal SPEC §2."""
    install_demo(empty_db_dsn)
    _, indexes = catalog(empty_db_dsn)
    named = {str(name): (str(table), bool(unique), list(cols), pred)  # type: ignore[call-overload]
             for name, table, unique, primary, cols, pred in indexes if not primary}
    primaries = {str(table): list(cols)  # type: ignore[call-overload]
                 for _, table, _, primary, cols, _ in indexes if primary}
    assert named == EXPECTED_INDEXES
    assert primaries == PRIMARY_KEYS


def test_migrate_adds_attempts_check_and_participants_foreign_key(empty_db_dsn: str) -> None:
    """attempts >= 0 is enforced and participants reference their conference."""
    install_demo(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as conn:
        checks = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'messenger.recording_finalize_attempts'::regclass "
            "AND contype = 'c'").fetchall()
        fks = conn.execute(
            "SELECT confrelid::regclass::text FROM pg_constraint "
            "WHERE conrelid = 'messenger.conference_participants'::regclass "
            "AND contype = 'f'").fetchall()
    assert checks == [("CHECK ((attempts >= 0))",)]
    assert fks == [("messenger.conference_sessions",)]


def test_migrate_twice_is_a_no_op(empty_db_dsn: str) -> None:
    """A second run applies nothing and leaves the catalog unchanged."""
    first = install_demo(empty_db_dsn)
    before = catalog(empty_db_dsn)
    second = migrate(empty_db_dsn)
    assert [s.migration.version for s in first if s.migration] == [
        m.version for m in migrations()]
    assert second == []
    assert catalog(empty_db_dsn) == before


def test_messenger_schema_holds_only_spec_tables(empty_db_dsn: str) -> None:
    """Bookkeeping lives in the safetynet schema, not among the contract's tables."""
    install_demo(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as conn:
        tables = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema IN ('messenger', 'safetynet') ORDER BY 1, 2").fetchall()
    assert tables == [("messenger", t) for t in sorted(EXPECTED_COLUMNS)] + [
        ("safetynet", "conference_poison"), ("safetynet", "created_objects"),
        ("safetynet", "dependency_health"),
        ("safetynet", "finalize_redrives"), ("safetynet", "grantees"),
        ("safetynet", "job_minutes"), ("safetynet", "job_pauses"),
        ("safetynet", "leases"), ("safetynet", "missing_verdict_acceptances"),
        ("safetynet", "operator_actions"),
        ("safetynet", "outbox_dead_letters"), ("safetynet", "outbox_relay_source"),
        ("safetynet", "schema_migrations")]


def test_edited_migration_is_refused(empty_db_dsn: str) -> None:
    """A migration whose file changed after it was applied stops migrate with a clear error."""
    install_demo(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as conn:
        conn.execute("UPDATE safetynet.schema_migrations SET checksum = 'x' WHERE version = 1")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(empty_db_dsn)


def test_migrate_command_applies_then_reports_up_to_date(empty_db_dsn: str) -> None:
    """The CLI verb migrates, exits 0, and says so; the second run is a no-op."""
    env = {"SAFETYNET__POSTGRES__DSN": empty_db_dsn, "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "supervision.app", "migrate"]
    first = subprocess.run([*cmd, "--messenger-fixture"], capture_output=True, text=True,
                           env=env, cwd=ROOT, check=False)
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert first.returncode == 0, first.stderr
    names = [f"{m.version:04d}_{m.name}" for m in migrations()]
    assert names[:5] == ["0001_messenger_schema", "0002_outbox_relay",
                         "0003_conference_poison", "0004_finalize_classify", "0005_leases"]
    lines = first.stdout.splitlines()
    assert lines[0] == "created the messenger fixture's tables"
    assert lines[1:len(names) + 1] == [f"applied {name}" for name in names]
    # the messenger side: the indexes the fixture (SPEC §2) lacks, and the NOTIFY trigger
    fixture = (ROOT / "supervision" / "dev" / "messenger_fixture.sql").read_text()
    built = [i.name for i in INDEXES if not i.required and f" {i.name} " not in fixture]
    assert "ix_outbox_published" in built and "ix_conf_active" not in built
    assert lines[len(names) + 1:] == [f"applied index {name}" for name in built] + [
        "applied trigger trg_integration_outbox_notify"]
    assert (second.returncode, second.stdout.strip()) == (0, "schema is up to date")


def test_migrate_against_unreachable_server_exits_1_without_traceback() -> None:
    """A database that does not answer is one error line and exit 1."""
    env = {"SAFETYNET__POSTGRES__DSN": "postgresql://u:pw@127.0.0.1:1/x?connect_timeout=2",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "supervision.app", "migrate"], capture_output=True,
                          text=True, env=env, cwd=ROOT, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: migration failed: OperationalError")
    assert "Traceback" not in proc.stderr and "pw" not in proc.stderr.replace("password", "")


def test_migrate_refuses_a_database_without_the_messenger_tables(empty_db_dsn: str) -> None:
    """migrate never creates a messenger table: on an empty database it says what to do."""
    with pytest.raises(MigrationError, match=r"messenger tables missing: messenger\.recording_fin"):
        migrate(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('messenger')").fetchone() == (None,)


def test_messenger_fixture_refuses_when_messenger_tables_exist(empty_db_dsn: str) -> None:
    """The fixture is for empty databases: one existing messenger table stops it."""
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA messenger")
        conn.execute("CREATE TABLE messenger.call_sessions (id uuid PRIMARY KEY, x int)")
    with pytest.raises(MigrationError, match="messenger tables exist already: call_sessions"):
        apply_messenger_fixture(empty_db_dsn)
    with psycopg.connect(empty_db_dsn) as conn:
        assert conn.execute("SELECT to_regclass('messenger.call_recordings')").fetchone() == (
            None,)


def test_database_of_an_earlier_release_upgrades_without_a_manual_step(
        empty_db_dsn: str) -> None:
    """A ledger holding 0001-0010 under the checksums earlier releases applied (the
    messenger tables were then migration 0001) is accepted: nothing re-runs, nothing is
    refused, and only the indexes it lacks are built."""
    install_demo(empty_db_dsn)
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        for version, sums in LEGACY_CHECKSUMS.items():
            conn.execute("UPDATE safetynet.schema_migrations SET checksum = %s "
                         "WHERE version = %s", (next(iter(sums)), version))
        conn.execute("DROP INDEX messenger.ix_outbox_published")  # not in that release
    steps = migrate(empty_db_dsn)
    assert [s.label for s in steps] == ["index ix_outbox_published"]


def index_names(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [str(r[0]) for r in conn.execute(
            "SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
            "WHERE x.indrelid = %s::regclass AND x.indisvalid ORDER BY 1",
            (f"messenger.{table}",)).fetchall()]


def test_equivalent_index_under_another_name_is_reused_not_duplicated(
        empty_db_dsn: str) -> None:
    """The messenger's own index with safetynet's definition (any name, text casts) serves:
    migrate builds no second one."""
    apply_messenger_fixture(empty_db_dsn)
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute('CREATE INDEX "IX_call_recordings_session_kind_session_id" '
                     "ON messenger.call_recordings (session_kind, session_id)")
        conn.execute('CREATE INDEX "IX_terminal" ON messenger.call_recordings (updated_at) '
                     "WHERE status::text IN ('Available', 'Failed')")
    labels = [s.label for s in migrate(empty_db_dsn)]
    assert "index ix_recording_session" not in labels
    assert "index ix_recording_terminal_updated" not in labels
    names = index_names(empty_db_dsn, "call_recordings")
    assert "IX_call_recordings_session_kind_session_id" in names
    assert "ix_recording_session" not in names
    assert "ix_recording_terminal_updated" not in names


def test_invalid_leftover_index_is_dropped_and_built_again(db_dsn: str) -> None:
    """An INVALID index under safetynet's name (a cancelled CONCURRENTLY build) is not
    taken as done: migrate drops it concurrently and builds it again, VALID."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE pg_index SET indisvalid = false "
                     "WHERE indexrelid = 'messenger.ix_recording_session'::regclass")
    assert "ix_recording_session" not in index_names(db_dsn, "call_recordings")
    script = print_sql(db_dsn)
    assert ("DROP INDEX CONCURRENTLY IF EXISTS messenger.ix_recording_session;\n" in script)
    labels = [s.label for s in migrate(db_dsn)]
    assert labels == ["rebuild INVALID ix_recording_session", "index ix_recording_session"]
    assert "ix_recording_session" in index_names(db_dsn, "call_recordings")


def test_print_sql_shows_exactly_what_would_run_and_runs_nothing(empty_db_dsn: str) -> None:
    """--print-sql lists each pending step with its lock_timeout (index builds
    CONCURRENTLY); the database is untouched; after migrate it prints nothing."""
    apply_messenger_fixture(empty_db_dsn)
    script = print_sql(empty_db_dsn)
    assert ("CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_outbox_published ON "
            "messenger.integration_outbox") in script
    assert "SET LOCAL lock_timeout = '500ms';" in script
    assert script.count("BEGIN;") == len(migrations())
    assert "CREATE TABLE messenger" not in script and "ALTER TABLE messenger" not in script
    with psycopg.connect(empty_db_dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('safetynet')").fetchone() == (None,)
    migrate(empty_db_dsn)
    assert print_sql(empty_db_dsn) == ""


def test_safetynet_only_leaves_the_messenger_tables_untouched(empty_db_dsn: str) -> None:
    """--safetynet-only applies the ledger and builds no index or trigger on a messenger
    table; poll mode drops the NOTIFY trigger."""
    apply_messenger_fixture(empty_db_dsn)
    before = catalog(empty_db_dsn)
    steps = migrate(empty_db_dsn, Options(safetynet_only=True))
    assert all(s.migration is not None for s in steps)
    assert catalog(empty_db_dsn) == before
    migrate(empty_db_dsn)
    assert [s.label for s in migrate(empty_db_dsn, Options(notify_trigger=False))] == [
        "drop trigger trg_integration_outbox_notify (wakeup = poll)"]


BEFORE_ISSUE_28 = "ec9d3a7"  # the last commit whose migrations 0001-0010 held messenger DDL


def test_database_migrated_by_the_release_before_upgrades_in_place(
        empty_db_dsn: str) -> None:
    """A database built by the previous release's own files 0001-0010 (read from git, each
    applied with its ledger row and checksum as that migrate did) upgrades with no manual
    step: no ledger migration re-runs, no index is duplicated, only the indexes added
    since (retention's, the relay's live rows, the console's file id) are built, and
    check-schema finds it compatible."""
    if shutil.which("git") is None or subprocess.run(
            ["git", "cat-file", "-e", f"{BEFORE_ISSUE_28}^{{commit}}"], cwd=ROOT,
            capture_output=True, check=False).returncode != 0:
        pytest.skip(f"git or commit {BEFORE_ISSUE_28} is not available (a shallow clone)")
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute(QUERIES["schema_migrations_create_schema"])
        conn.execute(QUERIES["schema_migrations_create"])
        for m in migrations()[:10]:
            old = subprocess.run(
                ["git", "show", f"{BEFORE_ISSUE_28}:supervision/sql/migrations/{m.label}.sql"],
                cwd=ROOT, capture_output=True, text=True, check=True).stdout
            with conn.transaction():
                conn.execute(old)  # type: ignore[call-overload]
                conn.execute(QUERIES["schema_migrations_insert"],
                             {"version": m.version, "name": m.name,
                              "checksum": hashlib.sha256(old.encode()).hexdigest()})
    before = {name for name, *_ in catalog(empty_db_dsn)[1]}
    steps = migrate(empty_db_dsn)
    new_indexes = {"ix_outbox_published", "ix_outbox_live", "ix_recording_file_id",
                   "ix_rfa_queue", "ix_rfa_quarantined", "ix_outbox_held"}
    assert sorted(s.label for s in steps if s.migration is None) == sorted(
        [f"index {name}" for name in new_indexes]
        + ["record what earlier releases built"])  # 0017's backfill of the old indexes
    assert all(s.migration.version > 10 for s in steps if s.migration is not None)
    after = {name for name, *_ in catalog(empty_db_dsn)[1]}
    assert after - before == new_indexes
    assert check_schema_lines(empty_db_dsn) == []


def check_schema_lines(dsn: str) -> list[str]:
    from supervision.db.migrate import schema_report

    return schema_report(dsn).lines()


def test_grant_to_an_unknown_role_is_one_clear_line(empty_db_dsn: str, tmp_path: Path) -> None:
    """`migrate --grant-to` a role that does not exist: exit 1 saying to create it first."""
    install_demo(empty_db_dsn)
    config = tmp_path / "c.toml"
    config.write_text(f'[postgres]\ndsn = "{empty_db_dsn}"\n')
    proc = subprocess.run([sys.executable, "-m", "supervision.app", "migrate", "--grant-to",
                           "nobody_here", "-c", str(config)], capture_output=True, text=True,
                          cwd=ROOT, check=False, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("error: role 'nobody_here' does not exist; create it first "
                                   "(docs/operations.md)")
