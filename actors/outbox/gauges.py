"""The outbox's database-derived gauges: unpublished rows, oldest age, blocked keys, the
logical source's slot (retained WAL, confirmed position, lost), and the server's NOTIFY
queue the trigger and the listener share. One cheap query each, run by the
gauge refresher on the scan leader."""

from __future__ import annotations

import psycopg

from actors.outbox.logical_setup import LogicalSource
from actors.outbox.metrics import (
    NOTIFY_QUEUE_USAGE,
    OUTBOX_BLOCKED_KEYS,
    OUTBOX_OLDEST_AGE,
    OUTBOX_REPLICATION_LAG,
    OUTBOX_SLOT_CONFIRMED,
    OUTBOX_SLOT_LOST,
    OUTBOX_UNPUBLISHED,
)
from actors.outbox.queries import OUTBOX_QUERIES
from supervision.db.queries import QUERIES


def refresh_outbox(conn: psycopg.Connection, logical: bool = False) -> None:
    """The outbox's figures; in the logical source from the slot's recorded position
    (``outbox_stats_logical``: the newest 10,000 live rows)."""
    row = conn.execute(OUTBOX_QUERIES["outbox_stats_logical" if logical else
                                      "outbox_stats"]).fetchone()
    assert row is not None
    OUTBOX_UNPUBLISHED.set(int(row[0]))
    OUTBOX_OLDEST_AGE.set(float(row[1]))
    OUTBOX_BLOCKED_KEYS.set(int(row[2]))


def refresh_slot(conn: psycopg.Connection, source: LogicalSource) -> None:
    """The logical source's slot: the WAL it retains, its confirmed position, and whether
    it is gone (missing, or invalidated by PostgreSQL: ``wal_status = 'lost'``)."""
    row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": source.slot}
                       ).fetchone()
    lost = row is None or row[3] == "lost"
    OUTBOX_SLOT_LOST.set(1 if lost else 0)
    if row is not None:
        OUTBOX_SLOT_CONFIRMED.set(int(row[5] or 0))
        OUTBOX_REPLICATION_LAG.set(int(row[6] or 0))


def refresh_notification_queue(conn: psycopg.Connection) -> None:
    row = conn.execute(QUERIES["notification_queue_usage"]).fetchone()
    assert row is not None
    NOTIFY_QUEUE_USAGE.set(float(row[0]))
