"""Installing beside a live messenger (issue 28): check-schema against the contract, the
daemon's schema gate, the runtime role's grants, migrate's short lock waits, retention
through its index, and the refusal to start on pending migrations."""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
import tomli_w
from psycopg import sql

from actors.outbox.queries import OUTBOX_QUERIES
from supervision.db.migrate import Options, apply_messenger_fixture, migrate
from supervision.db.queries import QUERIES
from supervision.dev.kafka import KafkaServer
from supervision.dev.ports import free_ports
from supervision.dev.s3 import S3Server
from tests.cli import cli, postgres_only_config
from tests.integration.app.test_shutdown import events, start_daemon
from tests.messenger import insert_conference
from tests.waiting import wait_until


@pytest.fixture
def config(db_dsn: str, tmp_path: Path) -> Path:
    return postgres_only_config(tmp_path, db_dsn)


def test_check_schema_passes_on_the_contracts_own_tables(config: Path) -> None:
    """The fixture's tables (SPEC §2) after migrate: exit 0, no problem line."""
    proc = cli(config, "check-schema")
    assert (proc.returncode, proc.stdout) == (0, "schema is compatible\n"), proc.stderr


def test_check_schema_before_the_first_migrate_says_not_installed_yet(
        empty_db_dsn: str, tmp_path: Path) -> None:
    """On the messenger's database before safetynet's install: exit 0, "not installed yet"
    and no pending migrations named; a broken messenger contract still exits 2."""
    apply_messenger_fixture(empty_db_dsn)
    config = postgres_only_config(tmp_path, empty_db_dsn)
    proc = cli(config, "check-schema")
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "safetynet not installed yet" in proc.stdout
    assert "migrations pending" not in proc.stdout
    assert proc.stdout.endswith("the messenger's tables are compatible (with warnings)\n")
    with psycopg.connect(empty_db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE messenger.conference_sessions ALTER COLUMN "
                     "last_activity_at TYPE timestamp")
    broken = cli(config, "check-schema")
    assert broken.returncode == 2 and "last_activity_at" in broken.stdout
    assert "safetynet not installed yet" in broken.stdout


def break_messenger(dsn: str) -> None:
    """What a messenger could have diverged into: a local timestamp, an integer enum, a
    width too narrow, a NOT NULL column safetynet does not fill, a unique key gone, a
    recommended index gone; plus extras that are fine (a column, an index, a table)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in (
            "ALTER TABLE messenger.conference_sessions ALTER COLUMN last_activity_at "
            "TYPE timestamp",
            "DROP INDEX messenger.ix_rfa_pending_created",
            "ALTER TABLE messenger.recording_finalize_attempts ALTER COLUMN status "
            "DROP DEFAULT, ALTER COLUMN status TYPE smallint USING 0",
            "ALTER TABLE messenger.conference_sessions ALTER COLUMN end_reason "
            "TYPE varchar(8)",
            "ALTER TABLE messenger.realtime_outbox ADD COLUMN tenant_id uuid NOT NULL",
            "DROP INDEX messenger.ux_outbox_dedupe",
            "DROP INDEX messenger.ix_outbox_created",
            "ALTER TABLE messenger.call_recordings ADD COLUMN extra text",
            "CREATE INDEX ix_extra ON messenger.call_recordings (extra)",
            "CREATE TABLE messenger.chats (id uuid PRIMARY KEY)",
        ):
            conn.execute(statement)  # type: ignore[call-overload]


def test_check_schema_names_each_incompatibility_with_the_ddl_that_fixes_it(
        config: Path, db_dsn: str) -> None:
    """One line per problem, each with its fix; extras pass; exit 2."""
    break_messenger(db_dsn)
    proc = cli(config, "check-schema")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stdout.splitlines()
    by_subject = {line.split(": ")[1]: line for line in lines}
    assert set(by_subject) == {
        "messenger.conference_sessions.last_activity_at",
        "messenger.recording_finalize_attempts.status",
        "messenger.conference_sessions.end_reason",
        "messenger.realtime_outbox.tenant_id",
        "messenger.ux_outbox_dedupe",
        "messenger.ix_rfa_pending_created",
        "messenger.ix_outbox_created",
    }
    assert by_subject["messenger.conference_sessions.last_activity_at"].endswith(
        "fix: ALTER TABLE messenger.conference_sessions ALTER COLUMN last_activity_at TYPE "
        "timestamptz USING last_activity_at AT TIME ZONE 'UTC';")
    assert "enum as its names" in by_subject["messenger.recording_finalize_attempts.status"]
    assert by_subject["messenger.conference_sessions.end_reason"].endswith(
        "TYPE varchar(12);")
    assert "NOT NULL without a default" in by_subject["messenger.realtime_outbox.tenant_id"]
    assert by_subject["messenger.ux_outbox_dedupe"].startswith("error: ")
    assert by_subject["messenger.ux_outbox_dedupe"].endswith(
        "fix: CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS ux_outbox_dedupe ON "
        "messenger.integration_outbox (topic, dedupe_key);")
    assert by_subject["messenger.ix_outbox_created"].startswith("warning: ")


def test_missing_recommended_index_alone_is_a_warning_with_exit_0(
        config: Path, db_dsn: str) -> None:
    """A recommended index gone: a warning line with its CREATE INDEX CONCURRENTLY, exit 0."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX messenger.ix_outbox_published")
    proc = cli(config, "check-schema")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[0].startswith("warning: messenger.ix_outbox_published: ")
    assert "CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_outbox_published" in proc.stdout


def test_run_once_of_a_job_whose_contract_is_broken_exits_78_and_touches_no_row(
        config: Path, db_dsn: str) -> None:
    """conference_sessions.last_activity_at as a local timestamp: run-once of the reaper
    exits 78 naming the column; the due conference keeps its status."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conf = insert_conference(conn, status="Active", last_activity_ago=7200)
        conn.execute("ALTER TABLE messenger.conference_sessions ALTER COLUMN "
                     "last_activity_at TYPE timestamp")
    proc = cli(config, "run-once", "--job", "conference-reaper")
    assert proc.returncode == 78, proc.stderr
    assert "messenger.conference_sessions.last_activity_at" in proc.stderr
    with psycopg.connect(db_dsn) as conn:
        row = conn.execute("SELECT status FROM messenger.conference_sessions WHERE id = %s",
                           (conf.id,)).fetchone()
    assert row == ("Active",)


def s3_settings(s3: S3Server, bucket: str) -> dict[str, str]:
    """The ``[s3]`` section pointing at the session's SeaweedFS bucket."""
    creds = s3.credentials
    return {"endpoint_url": s3.endpoint_url, "bucket": bucket, "region": creds.region,
            "access_key_id": creds.access_key_id,
            "secret_access_key": creds.secret_access_key}


def daemon_config(path: Path, dsn: str, s3: S3Server, bucket: str, port: int) -> Path:
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "s3": s3_settings(s3, bucket),
        "jobs": {"recording_finalize": {"polling_interval": "1s"},
                 "conference_reaper": {"polling_interval": "1s"}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{port}"},
        "supervision": {"shutdown_grace": "5s"},
        "logging": {"format": "json"},
    }))
    return path


def test_daemon_runs_the_other_jobs_while_one_jobs_contract_is_broken(
        db_dsn: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    """The reaper's column broken: /readyz 503 names it, the reaper never starts a cycle,
    recording-finalize completes its cycles."""
    import httpx

    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE messenger.conference_sessions ALTER COLUMN "
                     "last_activity_at TYPE timestamp")
    port = free_ports(1)[0]
    config = daemon_config(tmp_path / "c.toml", db_dsn, s3_server, bucket, port)
    log = tmp_path / "daemon.log"
    proc = start_daemon(config, log)
    try:
        def finalize_cycles() -> int:
            return len([e for e in events(log) if e.get("event") == "cycle_completed"
                        and e.get("job") == "recording-finalize"])
        wait_until(lambda: finalize_cycles() >= 2, 30, "two recording-finalize cycles")
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
        assert ready.status_code == 503
        assert "messenger.conference_sessions.last_activity_at" in ready.text
        assert [e for e in events(log) if e.get("job") == "conference-reaper"
                and e.get("event") == "cycle_started"] == []
        (refused,) = [e for e in events(log) if e.get("event") == "job_not_started"]
        assert (refused["job"], refused["fault"]) == ("conference-reaper",
                                                      "ConfigurationFault")
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_daemon_with_pending_migrations_refuses_to_start_naming_them(
        config: Path, db_dsn: str) -> None:
    """A ledger without 0007: `safetynet run` exits 78 naming 0007_conference_phase."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM safetynet.schema_migrations WHERE version = 7")
    proc = cli(config, "run")
    assert proc.returncode == 78
    assert "safetynet migrations pending: 0007_conference_phase" in proc.stderr


def test_schema_ahead_of_the_build_is_a_warning_not_a_stop(config: Path, db_dsn: str) -> None:
    """A ledger with a version this build does not know: check-schema warns, exit 0."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO safetynet.schema_migrations (version, name, checksum) "
                     "VALUES (9999, 'from_the_future', 'x')")
    proc = cli(config, "check-schema")
    assert proc.returncode == 0
    assert "ahead of this build: 9999_from_the_future" in proc.stdout


# The runtime and read-only roles doing the work: tests/integration/db/test_least_privilege.py


def test_migrate_waits_for_a_lock_in_short_tries_so_writers_never_queue_long(
        empty_db_dsn: str, no_secrets_in_logs: io.StringIO) -> None:
    """A messenger transaction holds the outbox (ROW EXCLUSIVE) while migrate must add the
    NOTIFY trigger (SHARE ROW EXCLUSIVE): migrate tries for lock_timeout, steps back and
    retries, so other writers' INSERTs keep going (each waits at most about lock_timeout);
    once the long transaction ends, migrate finishes. Each wait is logged with the step
    and the statement that waited."""
    apply_messenger_fixture(empty_db_dsn)
    migrate(empty_db_dsn, Options(notify_trigger=False))
    insert = ("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, "
              "event_type, payload) VALUES ('t', 'k', %s, 'e', '{}')")
    errors: list[BaseException] = []
    with psycopg.connect(empty_db_dsn) as holder:
        holder.execute(insert, (str(uuid.uuid4()),))  # open transaction, lock held

        def run() -> None:
            try:
                migrate(empty_db_dsn, Options(lock_timeout=0.2))
            except BaseException as exc:
                errors.append(exc)
        worker = threading.Thread(target=run)
        worker.start()
        waits = []
        with psycopg.connect(empty_db_dsn, autocommit=True) as writer:
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                writer.execute(insert, (str(uuid.uuid4()),))
                waits.append(time.monotonic() - t0)
                time.sleep(0.01)
        assert worker.is_alive()  # still retrying behind the long transaction
        holder.commit()
    worker.join(30)
    assert errors == []
    assert max(waits) < 1.0, max(waits)
    assert len(waits) > 50
    with psycopg.connect(empty_db_dsn) as conn:
        assert conn.execute(QUERIES["schema_contract_outbox_trigger"]).fetchone() == (True,)
    lines = [json.loads(line) for line in no_secrets_in_logs.getvalue().splitlines()]
    logged = [e for e in lines if e.get("event") == "migrate_lock_not_granted"]
    assert logged and all(e["statement"].startswith(
        "CREATE TRIGGER trg_integration_outbox_notify AFTER INSERT ON "
        "messenger.integration_outbox") for e in logged), logged
    retries = [e for e in lines if e.get("event") == "stamina.retry_scheduled"]
    assert retries and {e["callable"] for e in retries} == {
        "migrate step trigger trg_integration_outbox_notify"}, retries


def test_retention_deletes_are_found_through_the_published_index(db_dsn: str) -> None:
    """EXPLAIN of the retention delete on a large published outbox: an index scan of
    ix_outbox_published, never a sequential scan of the outbox."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, "
            "event_type, payload, created_at, published_at) "
            "SELECT 't', 'k' || (g % 100), g::text, 'e', '{}', now() - interval '30 days', "
            "CASE WHEN g % 10 = 0 THEN NULL ELSE now() - interval '30 days' "
            "+ g * interval '1 ms' END FROM generate_series(1, 50000) g")
        conn.execute("ANALYZE messenger.integration_outbox")
        plan = conn.execute(
            sql.SQL("EXPLAIN (FORMAT JSON) {}").format(
                sql.SQL(OUTBOX_QUERIES["outbox_delete_published_before"])),
            {"retention": 7 * 86400, "limit": 1000}).fetchone()
    assert plan is not None
    text = json.dumps(plan[0])
    assert "ix_outbox_published" in text
    assert "Seq Scan" not in text


def test_session_settings_dropped_on_the_way_refuse_the_start_naming_the_pooler(
        db_dsn: str, tmp_path: Path) -> None:
    """A statement_timeout of 0 on the server (what a transaction-mode pooler that ignores
    the startup options leaves): `safetynet run` exits 78 saying a direct connection or
    session pooling is needed, instead of running without its timeouts."""
    dsn = psycopg.conninfo.make_conninfo(db_dsn, options="-c statement_timeout=0")
    proc = cli(postgres_only_config(tmp_path, dsn), "run")
    assert proc.returncode == 78, proc.stderr
    assert "statement_timeout is 0 on the server" in proc.stderr
    assert "direct connection to PostgreSQL or a pooler in session mode" in proc.stderr


def test_startup_parameter_refusal_is_named_as_a_pooler_problem() -> None:
    """PgBouncer in transaction mode refuses `options`: the error says what is needed."""
    from supervision.app.schema_gate import pooler_problem

    refused = psycopg.OperationalError(
        'connection failed: ERROR:  unsupported startup parameter: options')
    assert "session mode" in (pooler_problem(refused) or "")
    assert pooler_problem(psycopg.OperationalError("connection refused")) is None


def test_connection_budget_per_replica_holds_in_pg_stat_activity(
        db_dsn: str, s3_server: S3Server, kafka_server: KafkaServer, bucket: str,
        tmp_path: Path) -> None:
    """A replica with every job enabled opens at most POOL_SIZE + 3 job lock sessions +
    1 database-scans lock session + 1 listener = 11 connections (docs/operations.md,
    connection budget)."""
    from supervision.app.resources import POOL_SIZE

    port = free_ports(1)[0]
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "s3": s3_settings(s3_server, bucket),
        "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers},
        "jobs": {"recording_finalize": {"polling_interval": "200ms"},
                 "conference_reaper": {"polling_interval": "200ms"}},
        "http": {"listen": f"127.0.0.1:{port}"},
        "logging": {"format": "json"},
    }))
    log = tmp_path / "daemon.log"
    proc = start_daemon(path, log)
    seen: dict[str, int] = {}
    peak = 0
    try:
        def cycles() -> int:
            return len([e for e in events(log) if e.get("event") == "cycle_completed"])
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            def sample() -> bool:
                nonlocal peak, seen
                rows = conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "GROUP BY 1").fetchall()
                now = {str(r[0]): int(r[1]) for r in rows}
                peak = max(peak, sum(now.values()))
                for name, n in now.items():
                    seen[name] = max(seen.get(name, 0), n)
                return cycles() >= 10
            wait_until(sample, 60, "ten cycles")
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert seen.get("safetynet-lock") == 3 + 1
    assert seen.get("safetynet-listen") == 1
    assert seen.get("safetynet", 0) <= POOL_SIZE
    assert peak <= POOL_SIZE + 3 + 1 + 1


def test_poll_mode_has_no_trigger_and_no_listener_yet_publishes(
        db_dsn: str, kafka_server: KafkaServer, tmp_path: Path) -> None:
    """wakeup = "poll": migrate drops the NOTIFY trigger, the daemon opens no LISTEN
    session, and a row the messenger writes is still published (by polling)."""
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": db_dsn},
        "kafka": {"bootstrap_servers": kafka_server.bootstrap_servers},
        "jobs": {"recording_finalize": {"enabled": False},
                 "conference_reaper": {"enabled": False}},
        "outbox_relay": {"wakeup": "poll", "poll_interval": "200ms"},
        "http": {"listen": f"127.0.0.1:{free_ports(1)[0]}"},
        "logging": {"format": "json"},
    }))
    migrated = cli(path, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "applied drop trigger trg_integration_outbox_notify (wakeup = poll)" in \
        migrated.stdout
    proc = start_daemon(path, tmp_path / "daemon.log")
    try:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO messenger.integration_outbox (topic, message_key, "
                         "dedupe_key, event_type, payload) VALUES ("
                         "'pin.messenger.poll-test.v1', 'k', 'd', 'e', '{}')")

            def published() -> bool:
                row = conn.execute("SELECT published_at IS NOT NULL FROM "
                                   "messenger.integration_outbox WHERE dedupe_key = 'd'"
                                   ).fetchone()
                return bool(row and row[0])
            wait_until(published, 30, "the row to be published by polling")
            listeners = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'safetynet-listen'").fetchone()
            assert listeners == (0,)
            assert conn.execute(QUERIES["schema_contract_outbox_trigger"]).fetchone() == (
                False,)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_a_concurrent_build_that_times_out_is_retried_without_an_invalid_leftover(
        db_dsn: str, no_secrets_in_logs: io.StringIO) -> None:
    """A messenger transaction that wrote call_recordings stays open: the concurrent
    build of ix_recording_session waits for it, runs out of lock_timeout and leaves an
    INVALID index; the retry drops that leftover and builds again, so once the
    transaction ends there is exactly one VALID index and no INVALID one."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX messenger.ix_recording_session")
    errors: list[BaseException] = []
    with psycopg.connect(db_dsn) as holder:
        holder.execute("UPDATE messenger.call_recordings SET updated_at = now() "
                       "WHERE false")  # ROW EXCLUSIVE held until commit
        holder.execute("SELECT txid_current()")

        def run() -> None:
            try:
                migrate(db_dsn, Options(lock_timeout=0.2))
            except BaseException as exc:
                errors.append(exc)
        worker = threading.Thread(target=run)
        worker.start()
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            def failed_once() -> bool:
                return conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'safetynet-migrate' AND wait_event_type = 'Lock'").fetchone() != (0,) \
                    or not worker.is_alive()
            wait_until(failed_once, 10, "the build to wait for the open transaction")
            wait_until(lambda: no_secrets_in_logs.getvalue().count(
                "stamina.retry_scheduled") >= 3, 30, "three timed-out tries, each retried")
        assert worker.is_alive()
        holder.commit()
    worker.join(60)
    assert errors == []
    with psycopg.connect(db_dsn) as conn:
        rows = conn.execute(
            "SELECT c.relname, x.indisvalid FROM pg_index x "
            "JOIN pg_class c ON c.oid = x.indexrelid "
            "WHERE x.indrelid = 'messenger.call_recordings'::regclass "
            "AND c.relname = 'ix_recording_session'").fetchall()
    assert rows == [("ix_recording_session", True)]
