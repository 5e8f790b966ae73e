"""``check-schema`` for the logical source (``[outbox_relay] source = "logical"``):
``wal_level``, the publication's table and operations, the slot's plugin and health, and
a warning when ``max_slot_wal_keep_size`` is unlimited.

>>> logical_problems(conn, LogicalSource("safetynet_outbox", "safetynet_outbox"))
[Problem(subject='integration_outbox', message='wal_level is replica, ...', ...)]

Each finding is a :class:`~supervision.db.schema_contract.Problem` of the outbox relay,
so it prints like the contract's (the fix: what to run, the statements of
:func:`~actors.outbox.logical_setup.setup_statements`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from actors.outbox.logical_setup import (
    LogicalSource,
    LogicalSourceMismatch,
    ensure_logical_source,
    pending_statements,
    setup_statements,
)
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.slot_io import may_snapshot
from supervision.db.migrate_apply import connect
from supervision.db.schema_contract import Problem
from supervision.errors import MigrationError
from supervision.jobs import Job

T = TypeVar("T")

__all__ = ["logical_problems", "logical_report", "logical_script", "migrate_logical"]

SUBJECT = "integration_outbox"
JOBS = frozenset({Job.OUTBOX_RELAY.value})


def logical_problems(conn: psycopg.Connection[Any], source: LogicalSource) -> list[Problem]:
    """Every way the database keeps the logical source from running (errors) or risks the
    server's disk (warnings)."""
    level = conn.execute(OUTBOX_QUERIES["outbox_wal_level"]).fetchone()
    problems = []
    if level is None or level[0] != "logical":
        problems.append(Problem(
            SUBJECT, f"wal_level is {level[0] if level else 'unknown'}, the logical source "
            "needs logical", "ALTER SYSTEM SET wal_level = logical; then restart the server",
            JOBS))
    try:
        missing = pending_statements(conn, source)
    except LogicalSourceMismatch as exc:
        problems.append(Problem(SUBJECT, str(exc), "drop it, or name another in "
                                "[outbox_relay] slot / publication, then safetynet migrate",
                                JOBS))
        missing = []
    publication, slot = setup_statements(source)
    if publication in missing:
        problems.append(Problem(SUBJECT, f"publication {source.publication} missing",
                                f"safetynet migrate, or a DBA: {publication}", JOBS))
    if slot in missing:
        problems.append(Problem(SUBJECT, f"replication slot {source.slot} missing",
                                f"safetynet migrate, or a DBA: {slot}", JOBS))
    return problems + _slot_health(conn, source)


def _slot_health(conn: psycopg.Connection[Any], source: LogicalSource) -> list[Problem]:
    problems = []
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": source.slot}
                       ).fetchone()
    if row is not None and row[3] == "lost":
        problems.append(Problem(
            SUBJECT, f"replication slot {source.slot} was invalidated by PostgreSQL "
            "(wal_status lost: it retained more than max_slot_wal_keep_size); the relay reads "
            "the table until it is created again",
            f"SELECT pg_drop_replication_slot('{source.slot}'); then safetynet migrate "
            "(docs/operations.md)", JOBS))
    if row is not None and not may_snapshot(conn):
        problems.append(Problem(
            SUBJECT, "this role may not log standby snapshots: the slot's restart position "
            "moves only with the background writer's (every 15 s), and each peek decodes "
            "up to 15 s of the outbox's WAL again",
            "on PostgreSQL 16 or later, as a superuser: GRANT EXECUTE ON FUNCTION "
            "pg_catalog.pg_log_standby_snapshot() TO <the runtime role> "
            "(docs/operations.md)", JOBS, blocking=False))
    keep = conn.execute(OUTBOX_QUERIES["outbox_slot_wal_keep_size"]).fetchone()
    if keep is not None and str(keep[0]).strip() == "-1":
        problems.append(Problem(
            SUBJECT, "max_slot_wal_keep_size is unlimited: a stuck or forgotten slot "
            "retains WAL until the disk is full",
            "ALTER SYSTEM SET max_slot_wal_keep_size = '50GB'; SELECT pg_reload_conf(); "
            "(a size the WAL volume holds; docs/operations.md)", JOBS, blocking=False))
    return problems


def migrate_logical(dsn: str, source: LogicalSource) -> list[str]:
    """``safetynet migrate``'s last step: create what is missing of the publication and
    the slot; what it created. :class:`~actors.outbox.logical_setup.LogicalSetupRefused`
    carries the statements a DBA must run."""
    return _on(dsn, "logical source set-up", lambda conn: ensure_logical_source(conn, source))


def logical_script(dsn: str, source: LogicalSource) -> str:
    """``migrate --print-sql``'s tail: the statements of what is missing, outside any
    transaction (a slot's creation cannot run in one); empty when nothing is."""
    def script(conn: psycopg.Connection[Any]) -> str:
        missing = pending_statements(conn, source)
        if not missing:
            return ""
        level = conn.execute(OUTBOX_QUERIES["outbox_wal_level"]).fetchone()
        head = ("-- the outbox relay's logical source (needs ownership of "
                "messenger.integration_outbox, then REPLICATION; outside a transaction)\n")
        if level is None or level[0] != "logical":
            head += ("-- first: wal_level is not logical (ALTER SYSTEM SET wal_level = "
                     "logical; restart the server)\n")
        return head + "\n".join(missing) + "\n"

    return _on(dsn, "logical source check", script)


def logical_report(dsn: str, source: LogicalSource) -> list[Problem]:
    """``check-schema``'s findings about the logical source."""
    return _on(dsn, "schema check", lambda conn: logical_problems(conn, source))


def _on(dsn: str, what: str, work: Callable[[psycopg.Connection[Any]], T]) -> T:
    try:
        with connect(dsn) as conn:
            return work(conn)
    except psycopg.Error as exc:
        raise MigrationError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
