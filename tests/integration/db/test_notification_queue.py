"""The NOTIFY queue gauge on a real PostgreSQL: a listener that stops consuming makes
``safetynet_pg_notification_queue_usage`` rise above 0."""

from __future__ import annotations

import psycopg
from prometheus_client import REGISTRY

from actors.outbox.gauges import refresh_notification_queue


def usage() -> float | None:
    return REGISTRY.get_sample_value("safetynet_pg_notification_queue_usage")


def test_queue_usage_gauge_rises_while_a_listener_sits_in_a_transaction(db_dsn: str) -> None:
    """Notifications a listener inside an open transaction cannot read stay queued: the
    refreshed gauge shows a non-zero fraction (it read 0 before)."""
    with psycopg.connect(db_dsn, autocommit=True) as probe:
        refresh_notification_queue(probe)
        assert usage() == 0.0
        with psycopg.connect(db_dsn, autocommit=True) as listener, \
                psycopg.connect(db_dsn, autocommit=True) as notifier:
            listener.execute("LISTEN safetynet_queue_test")
            listener.execute("BEGIN")
            listener.execute("SELECT 1")  # the transaction pins the queue's tail
            with notifier.transaction():
                for i in range(2000):  # ~14 MB (distinct: equal ones are folded into one)
                    notifier.execute("SELECT pg_notify('safetynet_queue_test', %s)",
                                     (f"{i}:{'x' * 7000}",))
            refresh_notification_queue(probe)
            held = usage()
            listener.execute("ROLLBACK")
        assert held is not None and 0.0 < held < 1.0
