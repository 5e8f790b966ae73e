"""The logical source's publication and slot: create them, check them, or say what a DBA
must run.

>>> with psycopg.connect(dsn, autocommit=True) as conn:
...     created = ensure_logical_source(conn, LogicalSource("safetynet_outbox",
...                                                         "safetynet_outbox"))
['publication safetynet_outbox', 'slot safetynet_outbox']

The publication (``FOR TABLE messenger.integration_outbox WITH (publish = 'insert')``)
needs the table's owner; the slot (``pg_create_logical_replication_slot(slot,
'pgoutput')``) needs the REPLICATION attribute. The publication is created first: pgoutput
reads it as of each change's time, so the slot must not start before it exists. When the
role may not, :class:`LogicalSetupRefused` carries exactly the statements a DBA runs
(:func:`setup_statements`, also for ``migrate --print-sql``). Existing ones are checked,
never changed: a publication of other tables or operations, or a slot of another plugin or
database, is :class:`LogicalSourceMismatch`. ``wal_level`` must be ``logical`` (a server
restart applies it).

``safetynet migrate`` runs :func:`ensure_logical_source` last when ``[outbox_relay] source
= "logical"`` (``--print-sql`` prints :func:`pending_statements`); :func:`drop_logical_source`
is the uninstall (a forgotten slot keeps the server's WAL for ever).

The slot's creation waits for the transactions running at that moment to end; it holds no
lock on the messenger's tables.
"""

from __future__ import annotations

from typing import Any

import attrs
import psycopg
from psycopg import sql

from actors.outbox.queries import OUTBOX_QUERIES
from supervision.errors import SafetynetError

__all__ = ["LogicalSetupRefused", "LogicalSource", "LogicalSourceMismatch",
           "drop_logical_source", "ensure_logical_source", "pending_statements",
           "setup_statements"]

OUTBOX_TABLE = "messenger.integration_outbox"


@attrs.frozen
class LogicalSource:
    """The slot and the publication the logical source reads (``[outbox_relay] slot``,
    ``publication``)."""

    slot: str
    publication: str


class LogicalSetupRefused(SafetynetError):
    """The database does not let this role set up the logical source; a DBA must."""

    def __init__(self, reason: str, statements: list[str]) -> None:
        self.reason, self.statements = reason, statements
        super().__init__(f"{reason}; a DBA must run: " + " ".join(statements))


class LogicalSourceMismatch(SafetynetError):
    """The publication or the slot exists but is not what the logical source reads."""


def setup_statements(source: LogicalSource) -> list[str]:
    """The publication and the slot as SQL a DBA runs by hand, in order."""
    publication = sql.Identifier(source.publication).as_string()
    return [
        f"CREATE PUBLICATION {publication} FOR TABLE {OUTBOX_TABLE}"
        " WITH (publish = 'insert');",
        f"SELECT pg_create_logical_replication_slot({sql.Literal(source.slot).as_string()},"
        " 'pgoutput');",
    ]


def pending_statements(conn: psycopg.Connection[Any], source: LogicalSource) -> list[str]:
    """The statements of :func:`setup_statements` whose object is missing (what
    ``migrate --print-sql`` prints); :class:`LogicalSourceMismatch` if one exists but is
    not what the relay reads."""
    publication, slot = setup_statements(source)
    return ([publication] if _check_publication(conn, source) is None else []) + (
        [slot] if _check_slot(conn, source) is None else [])


def _publication(source: LogicalSource) -> dict[str, Any]:
    return {"publication": source.publication}


def ensure_logical_source(conn: psycopg.Connection[Any], source: LogicalSource) -> list[str]:
    """Create what is missing of the publication and the slot (*conn* in autocommit);
    what it created. Raises :class:`LogicalSetupRefused` (``wal_level`` not logical, or
    the role may not) or :class:`LogicalSourceMismatch`."""
    if not conn.autocommit:
        raise ValueError("ensure_logical_source needs a connection in autocommit")
    level = conn.execute(OUTBOX_QUERIES["outbox_wal_level"]).fetchone()
    if level is None or level[0] != "logical":
        raise LogicalSetupRefused(
            f"wal_level is {level[0] if level else 'unknown'}, not logical (set wal_level ="
            " logical and restart the server)", pending_statements(conn, source))
    created = []
    if _check_publication(conn, source) is None:
        _create(conn, source, sql.SQL(OUTBOX_QUERIES["outbox_publication_create"]).format(
            publication=sql.Identifier(source.publication)), {},
            f"CREATE on the database and ownership of {OUTBOX_TABLE}")
        created.append(f"publication {source.publication}")
    if _check_slot(conn, source) is None:
        _create(conn, source, OUTBOX_QUERIES["outbox_slot_create"], {"slot": source.slot},
                "the REPLICATION attribute")
        created.append(f"slot {source.slot}")
    return created


def _create(conn: psycopg.Connection[Any], source: LogicalSource,
            statement: sql.Composable | str, params: dict[str, Any], needs: str) -> None:
    try:
        conn.execute(statement, params)  # type: ignore[arg-type]  # a named query
    except psycopg.errors.InsufficientPrivilege as exc:
        first = str(exc).strip().splitlines()[0]
        raise LogicalSetupRefused(f"postgres: {first} (it needs {needs})",
                                  pending_statements(conn, source)) from exc


def _check_publication(conn: psycopg.Connection[Any],
                       source: LogicalSource) -> tuple[Any, ...] | None:
    row = conn.execute(OUTBOX_QUERIES["outbox_publication_describe"],
                       _publication(source)).fetchone()
    if row is None:
        return None
    inserts, updates, deletes, truncates, tables = row
    if list(tables) != [OUTBOX_TABLE] or not inserts or updates or deletes or truncates:
        ops = [name for name, on in (("insert", inserts), ("update", updates),
                                     ("delete", deletes), ("truncate", truncates)) if on]
        raise LogicalSourceMismatch(
            f"publication {source.publication} publishes {', '.join(ops) or 'nothing'} of "
            f"{', '.join(tables) or 'no table'}; the outbox relay needs insert of "
            f"{OUTBOX_TABLE} only")
    return tuple(row)


def _check_slot(conn: psycopg.Connection[Any],
                source: LogicalSource) -> tuple[Any, ...] | None:
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": source.slot}
                       ).fetchone()
    if row is None:
        return None
    plugin, database, slot_type = row[0], row[1], row[2]
    here = conn.info.dbname
    if slot_type != "logical" or plugin != "pgoutput" or database != here:
        raise LogicalSourceMismatch(
            f"replication slot {source.slot} is a {slot_type} slot of plugin {plugin} in "
            f"database {database}; the outbox relay needs a logical pgoutput slot in {here}")
    return tuple(row)


def drop_logical_source(conn: psycopg.Connection[Any], source: LogicalSource) -> None:
    """Drop the slot (the WAL it held is freed) and the publication, if they exist. The
    slot must not be in use (the relay stopped)."""
    conn.execute(OUTBOX_QUERIES["outbox_slot_drop"], {"slot": source.slot})
    conn.execute(sql.SQL(OUTBOX_QUERIES["outbox_publication_drop"]).format(
        publication=sql.Identifier(source.publication)))
