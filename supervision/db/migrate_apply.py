"""Running the plan of :mod:`supervision.db.migrate_plan` against the database: the statements
``--print-sql`` shows, in the same order, in the same session settings.

The session pins its search_path and takes migrate's session-level advisory lock (one
migrate at a time, index builds included), then plans (under the lock) and runs each step:
a transactional step in one transaction, a messenger-side statement on its own. A step
that cannot get a lock within its ``lock_timeout`` (the messenger was busy with the
table) is tried again after a growing pause, for up to 5 minutes, so migrate never
queues in front of the messenger's writers for longer than that. Two guards the script
cannot have: a ledger migration another migrate applied meanwhile is skipped, and a
concurrent build that failed part way (its INVALID leftover) is dropped before it is
tried again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.sql
import stamina
import structlog

from supervision.db import schema_contract as contract
from supervision.db.migrate_plan import DEFAULTS, Options, Plan, Statement, Step, ledger, plan
from supervision.db.pgconn import with_defaults
from supervision.db.queries import QUERIES
from supervision.errors import MigrationError

APPLICATION_NAME = "safetynet-migrate"
log = structlog.get_logger("safetynet.migrate")


def connect(dsn: str) -> psycopg.Connection[Any]:
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(
            with_defaults(dsn, application_name=APPLICATION_NAME), autocommit=True)
    except psycopg.OperationalError as exc:
        if "unsupported startup parameter" in str(exc):
            raise MigrationError(
                "the server refused the session's startup options: migrate needs a direct "
                "connection or a pooler in session mode (a transaction-mode pooler is in "
                "the way)") from exc
        raise
    return conn


def missing_tables(conn: psycopg.Connection[Any]) -> list[str]:
    present = {str(r[0]) for r in conn.execute(
        QUERIES["schema_contract_messenger_tables"]).fetchall()}
    return [t for t in contract.TABLES if t not in present]


def _retrying(step: Step, lock_timeout: float) -> Iterator[Any]:
    """Attempts of one step: a lock not granted within *lock_timeout* is tried again after
    a growing pause, for up to 5 minutes (stamina's retry_scheduled names the step)."""
    return iter(stamina.retry_context(
        on=psycopg.errors.LockNotAvailable, attempts=None, timeout=300.0,
        wait_initial=lock_timeout, wait_max=15.0, wait_jitter=lock_timeout,
    ).with_name(f"migrate step {step.label}", (), {}))


def waited(statement: Statement) -> str:
    """The statement a lock wait is logged with: its first line that is not a comment (a
    migration file's first statement; a DDL whole), at most 200 characters."""
    lines = [line.strip() for line in statement.render().splitlines()]
    first = next((line for line in lines if line and not line.startswith("--")), "")
    return first[:200]


def _execute(conn: psycopg.Connection[Any], statement: Statement) -> None:
    # packaged statements (migration files, named queries, the contract's DDL, grants
    # composed with identifiers), never user input
    try:
        conn.execute(statement.query, statement.params)  # type: ignore[arg-type]
    except psycopg.errors.LockNotAvailable:
        log.warning("migrate_lock_not_granted", statement=waited(statement))
        raise


def _drop_invalid_leftover(conn: psycopg.Connection[Any], name: str) -> None:
    """A concurrent build that failed (its lock_timeout ran out while it waited for the
    messenger's transactions) leaves an INVALID index that ``IF NOT EXISTS`` would take as
    done: drop it, concurrently, before the next try."""
    row = conn.execute(QUERIES["schema_contract_index_invalid"], {"name": name}).fetchone()
    if row is not None:
        conn.execute(psycopg.sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS messenger.{}").format(
            psycopg.sql.Identifier(name)))


def _run_transaction(conn: psycopg.Connection[Any], step: Step) -> None:
    with conn.transaction():
        for statement in step.statements:
            m = step.migration
            if m is not None and statement.query is m.sql and m.version in ledger(conn):
                return  # another migrate applied it meanwhile
            _execute(conn, statement)


def _run_alone(conn: psycopg.Connection[Any], step: Step) -> None:
    for n, statement in enumerate(step.statements):
        if n == 1 and step.builds is not None:  # lock_timeout is set by the first
            _drop_invalid_leftover(conn, step.builds)
        _execute(conn, statement)


def run_step(conn: psycopg.Connection[Any], step: Step, lock_timeout: float) -> None:
    for attempt in _retrying(step, lock_timeout):
        with attempt:
            if step.transaction:
                _run_transaction(conn, step)
            else:
                try:
                    _run_alone(conn, step)
                finally:  # a failed build leaves statement_timeout at 0: the session's own
                    conn.execute(QUERIES["schema_migrations_reset_statement_timeout"])


def migrate(dsn: str, options: Options = DEFAULTS) -> list[Step]:
    """Plan against the database at *dsn* and run the plan; return the steps run."""
    try:
        with connect(dsn) as conn:
            missing = missing_tables(conn)
            if missing:
                raise MigrationError(
                    "messenger tables missing: " + ", ".join(f"messenger.{t}" for t in missing)
                    + "; safetynet installs beside the messenger's schema and never creates "
                    "it (a demo or test database: `safetynet migrate --messenger-fixture`)")
            conn.execute(QUERIES["schema_migrations_pin_session_search_path"])
            conn.execute(QUERIES["schema_migrations_session_lock"])
            try:
                steps = plan(conn, options).steps
                for step in steps:
                    run_step(conn, step, options.lock_timeout)
            finally:
                conn.execute(QUERIES["schema_migrations_session_unlock"])
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {type(exc).__name__}: {exc}") from exc
    return steps


def planned(dsn: str, options: Options = DEFAULTS) -> Plan:
    """The plan of what :func:`migrate` would run now (nothing runs)."""
    try:
        with connect(dsn) as conn:
            conn.execute(QUERIES["schema_migrations_pin_session_search_path"])
            return plan(conn, options)
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {type(exc).__name__}: {exc}") from exc


def print_sql(dsn: str, options: Options = DEFAULTS) -> str:
    """The psql script of what :func:`migrate` would run now (nothing runs)."""
    return planned(dsn, options).script()
