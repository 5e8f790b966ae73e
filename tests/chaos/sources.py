"""The relay's two sources in the chaos suite (issue 37): ``table`` (claims rows and marks
them ``published_at``) and ``logical`` (reads the outbox's inserts from a logical
replication slot and writes nothing to the outbox per event).

>>> source = open_source(dsn, "logical")   # this test's publication and slot
>>> daemon_config(..., outbox_relay=source.settings())
>>> waiting(dsn, source)                    # events not yet delivered, as the database knows
>>> unread(dsn, source)                     # outbox ids the slot has not passed
>>> close_source(dsn, source)               # the slot dropped (the database can go)

The logical runs set up the publication and the slot as the integration tests do
(:func:`actors.outbox.logical_setup.ensure_logical_source`, then the relay's source
recorded as ``logical``: the switch from the table is done, nothing was waiting), before
the scenario seeds its rows, so every seeded event is in the slot's WAL.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import attrs
import psycopg

from actors.audit.queries import AUDIT_QUERIES
from actors.envelope import event_id
from actors.outbox.handover import write_source
from actors.outbox.logical_setup import (
    LogicalSource,
    drop_logical_source,
    ensure_logical_source,
)
from actors.outbox.slot import transactions
from actors.outbox.slot_io import peek_slot
from supervision.errors import InfrastructureError

__all__ = ["SOURCES", "RelaySource", "backlog", "close_source", "moved", "open_source",
           "undelivered_event_ids", "unread", "waiting"]

SOURCES = ("table", "logical")
PEEK_TRIES = 50  # the relay holds the slot for one short call at a time


@attrs.frozen
class RelaySource:
    """Which source the scenario's relay reads, and (logical) its publication and slot."""

    name: str = "table"
    logical: LogicalSource | None = None

    def settings(self, **more: Any) -> dict[str, Any]:
        """The ``[outbox_relay]`` keys that select this source (with *more*)."""
        keys: dict[str, Any] = {"source": self.name}
        if self.logical is not None:
            keys.update(slot=self.logical.slot, publication=self.logical.publication)
        return {**keys, **more}


def open_source(dsn: str, name: str) -> RelaySource:
    """The source *name* ready on *dsn*: for ``logical``, a publication and a slot of
    this test's own (slots are per server) and the relay's source recorded as logical."""
    if name == "table":
        return RelaySource()
    if name != "logical":
        raise ValueError(f"relay source must be one of {', '.join(SOURCES)}; got {name!r}")
    slot = f"chaos_{uuid.uuid4().hex[:12]}"
    logical = LogicalSource(slot, slot)
    with psycopg.connect(dsn, autocommit=True) as conn:
        ensure_logical_source(conn, logical)
        write_source(conn, "logical", None)
    return RelaySource("logical", logical)


def close_source(dsn: str, source: RelaySource) -> None:
    """Drop the logical source's slot and publication (a database holding a slot cannot
    be dropped); the daemons must have stopped. A backend still holding the slot (a
    killed daemon's, not yet gone) is waited for."""
    if source.logical is None:
        return
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            try:
                drop_logical_source(conn, source.logical)
                return
            except psycopg.errors.ObjectInUse:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def waiting(dsn: str, source: RelaySource) -> int:
    """Events not yet delivered as the database records it: the table source's rows
    without ``published_at``; the logical source's rows the slot has not passed as the
    relay last recorded it (the shipped auditor's ``unpublished`` query, no age bound)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if source.logical is None:
            row = conn.execute("SELECT count(*) FROM messenger.integration_outbox"
                               " WHERE published_at IS NULL").fetchone()
            return int(row[0]) if row else 0
        return len(conn.execute(AUDIT_QUERIES["audit_outbox_unpublished"],
                                {"relay_lag": 0, "limit": 10**9}).fetchall())


def unread(dsn: str, source: RelaySource) -> list[int]:
    """The outbox ids of the inserts past the slot's confirmed position (nothing is
    consumed: a peek). Tried again while the relay holds the slot."""
    assert source.logical is not None
    for attempt in range(PEEK_TRIES):
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                records = peek_slot(conn, source.logical, 10**9).records
        except InfrastructureError:  # the relay's peek or advance holds the slot
            if attempt == PEEK_TRIES - 1:
                raise
            time.sleep(0.1)
            continue
        return [row.id for txn in transactions(records, 1 << 30) for row in txn.rows]
    raise AssertionError("unreachable")


def moved(dsn: str, source: RelaySource) -> int:
    """A figure that changes whenever the relay records progress: the rows with
    ``published_at`` (table), the slot's confirmed position (logical)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if source.logical is None:
            row = conn.execute("SELECT count(*) FROM messenger.integration_outbox"
                               " WHERE published_at IS NOT NULL").fetchone()
        else:
            row = conn.execute("SELECT coalesce(confirmed_flush_lsn - '0/0', 0)"
                               " FROM pg_replication_slots WHERE slot_name = %s",
                               (source.logical.slot,)).fetchone()
    return int(row[0]) if row else 0


def backlog(dsn: str, source: RelaySource) -> int:
    """Events the relay has not recorded delivered yet: rows without ``published_at``
    (table), inserts past the slot's confirmed position (logical)."""
    return waiting(dsn, source) if source.logical is None else len(unread(dsn, source))


def undelivered_event_ids(dsn: str, source: RelaySource) -> list[str]:
    """The event ids the relay has not recorded delivered: rows without ``published_at``
    (table), inserts past the slot's confirmed position (logical)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if source.logical is None:
            rows = conn.execute("SELECT topic, dedupe_key FROM messenger.integration_outbox"
                                " WHERE published_at IS NULL").fetchall()
        else:
            rows = conn.execute("SELECT topic, dedupe_key FROM messenger.integration_outbox"
                                " WHERE id = ANY(%s)", (unread(dsn, source),)).fetchall()
    return [event_id(topic, dedupe) for topic, dedupe in rows]
