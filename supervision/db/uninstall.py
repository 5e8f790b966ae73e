"""``safetynet uninstall``: remove exactly what safetynet created, online, as a plan of
:class:`~supervision.db.migrate_plan.Step` s that ``--print-sql`` prints and the verb runs
(with migrate's retries: :func:`supervision.db.migrate_apply.run_step`).

What safetynet created is what it recorded when it created it (``safetynet.created_objects``,
migration 0017): each index on a messenger table is dropped ``CONCURRENTLY`` (outside any
transaction, under ``lock_timeout``), then the NOTIFY trigger in a transaction of its own
under the same short ``lock_timeout``, then the grants migrate gave its recorded grantees
on the messenger's tables, schema and sequences, and last ``DROP SCHEMA safetynet
CASCADE`` (its tables, functions and the record itself), under ``lock_timeout`` too. An
index safetynet reused (the messenger's own, under any name) is never in the record, so
never dropped. Roles are the DBA's to drop (docs/operations.md, "Uninstall").
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from supervision.db import grants
from supervision.db.migrate_apply import connect, run_step
from supervision.db.migrate_plan import (
    LOCK_TIMEOUT,
    TRIGGER,
    Plan,
    Statement,
    Step,
    ddl_step,
    transaction_step,
)
from supervision.db.queries import QUERIES
from supervision.errors import MigrationError


def _recorded(conn: psycopg.Connection[Any]) -> list[tuple[str, str, str]]:
    exists = conn.execute(QUERIES["created_objects_exists"]).fetchone()
    if exists is None or exists[0] is None:
        return []
    return [(str(r[0]), str(r[1]), str(r[2]))
            for r in conn.execute(QUERIES["created_objects_list"]).fetchall()]


def _revokes(conn: psycopg.Connection[Any], role: str) -> list[Statement]:
    """What migrate granted *role* outside the safetynet schema (the schema's own grants
    go with it): the messenger's tables, schema and serial sequences."""
    who = sql.Identifier(role)
    out = [Statement(sql.SQL("REVOKE ALL ON messenger.{} FROM {}").format(
        sql.Identifier(table), who)) for table in grants.COLUMN_PRIVILEGES]
    for table in grants.SEQUENCE_TABLES:
        row = conn.execute(QUERIES["schema_migrations_serial_sequence"],
                           {"table": f"messenger.{table}"}).fetchone()
        if row and row[0]:
            out.append(Statement(sql.SQL("REVOKE ALL ON SEQUENCE {} FROM {}").format(
                sql.SQL(row[0]), who)))
    out.append(Statement(sql.SQL("REVOKE ALL ON SCHEMA messenger FROM {}").format(who)))
    return out


def plan_uninstall(conn: psycopg.Connection[Any],
                   lock_timeout: float = LOCK_TIMEOUT) -> Plan:
    """What uninstall would run now, in order (nothing when safetynet is not installed)."""
    schema = conn.execute(QUERIES["schema_migrations_schema_exists"]).fetchone()
    if schema is None:
        return Plan([], verb="uninstall")
    steps: list[Step] = []
    for kind, name, _table in _recorded(conn):
        if kind == "index":
            drop = sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS messenger.{}").format(
                sql.Identifier(name)).as_string(None)
            steps.append(ddl_step(f"drop index {name}", drop, lock_timeout, concurrent=True))
        elif name == TRIGGER:
            steps.append(transaction_step(f"drop trigger {TRIGGER}", (Statement(
                f"DROP TRIGGER IF EXISTS {TRIGGER} ON messenger.integration_outbox"),),
                lock_timeout))
    for role, _access, _digest in grants.recorded(conn):
        steps.append(transaction_step(f"revoke from {role}", tuple(_revokes(conn, role)),
                                      lock_timeout))
    steps.append(transaction_step("drop schema safetynet", (
        Statement(QUERIES["created_objects_drop_schema"]),), lock_timeout))
    return Plan(steps, verb="uninstall")


def planned(dsn: str, lock_timeout: float = LOCK_TIMEOUT) -> Plan:
    try:
        with connect(dsn) as conn:
            conn.execute(QUERIES["schema_migrations_pin_session_search_path"])
            return plan_uninstall(conn, lock_timeout)
    except psycopg.Error as exc:
        raise MigrationError(f"uninstall failed: {type(exc).__name__}: {exc}") from exc


def _refuse_while_running(conn: psycopg.Connection[Any]) -> None:
    left = conn.execute(QUERIES["created_objects_sessions_left"]).fetchall()
    if left:
        raise MigrationError(
            "safetynet sessions are still connected ("
            + ", ".join(f"{name}: {n}" for name, n in left)
            + "); stop every replica, the console and running verbs first")


def uninstall(dsn: str, lock_timeout: float = LOCK_TIMEOUT) -> list[Step]:
    """Plan and run the uninstall under migrate's session lock; the steps run."""
    try:
        with connect(dsn) as conn:
            conn.execute(QUERIES["schema_migrations_pin_session_search_path"])
            _refuse_while_running(conn)
            conn.execute(QUERIES["schema_migrations_session_lock"])
            try:
                steps = plan_uninstall(conn, lock_timeout).steps
                for step in steps:
                    run_step(conn, step, lock_timeout)
            finally:
                conn.execute(QUERIES["schema_migrations_session_unlock"])
    except psycopg.Error as exc:
        raise MigrationError(f"uninstall failed: {type(exc).__name__}: {exc}") from exc
    return steps
