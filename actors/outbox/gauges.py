"""The outbox's database-derived gauges: unpublished rows, oldest age, blocked keys, and the
server's NOTIFY queue the trigger and the listener share. One cheap query each, run by the
gauge refresher on the scan leader."""

from __future__ import annotations

import psycopg

from actors.outbox.metrics import (
    NOTIFY_QUEUE_USAGE,
    OUTBOX_BLOCKED_KEYS,
    OUTBOX_OLDEST_AGE,
    OUTBOX_UNPUBLISHED,
)
from actors.outbox.queries import OUTBOX_QUERIES
from supervision.db.queries import QUERIES


def refresh_outbox(conn: psycopg.Connection) -> None:
    row = conn.execute(OUTBOX_QUERIES["outbox_stats"]).fetchone()
    assert row is not None
    OUTBOX_UNPUBLISHED.set(int(row[0]))
    OUTBOX_OLDEST_AGE.set(float(row[1]))
    OUTBOX_BLOCKED_KEYS.set(int(row[2]))



def refresh_notification_queue(conn: psycopg.Connection) -> None:
    row = conn.execute(QUERIES["notification_queue_usage"]).fetchone()
    assert row is not None
    NOTIFY_QUEUE_USAGE.set(float(row[0]))
