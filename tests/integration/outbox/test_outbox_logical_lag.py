"""Lag you can see (issue 37, item 3): `safetynet_outbox_delivery_seconds` observes one
commit-to-ack time per event in both sources, and the slot's gauges (retained WAL,
confirmed position, lost) follow the slot."""

from __future__ import annotations

import psycopg
import trio
from prometheus_client import REGISTRY

from actors.outbox.gauges import refresh_slot
from actors.outbox.logical_setup import LogicalSource
from supervision.app.daemon import run_once
from supervision.dev.kafka import KafkaServer
from tests.conftest import make_config
from tests.integration.outbox.test_outbox_logical import logical_cfg, source, topic
from tests.integration.outbox.test_outbox_relay import enqueue

__all__ = ["source", "topic"]  # the fixtures, shared with the logical source's tests


def delivered() -> tuple[float, float]:
    """(observations, their sum) of safetynet_outbox_delivery_seconds so far."""
    count = REGISTRY.get_sample_value("safetynet_outbox_delivery_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("safetynet_outbox_delivery_seconds_sum") or 0.0
    return count, total


def gauge(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    assert value is not None, name
    return value


async def test_the_logical_source_observes_each_events_commit_to_ack_time(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 5}" for n in range(50)])
    await trio.sleep(0.3)  # a commit-to-ack time of at least this
    before = delivered()
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    count, total = delivered()
    assert counts["published"] == 50
    assert count - before[0] == 50
    assert 50 * 0.3 <= total - before[1] < 50 * 60


async def test_the_table_source_observes_created_at_to_ack_on_the_database_clock(
        db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 5}" for n in range(30)])
    await trio.sleep(0.3)
    before = delivered()
    cfg = make_config(db_dsn, kafka={"bootstrap_servers": kafka_server.bootstrap_servers})
    counts = await run_once(cfg, "outbox-relay")
    count, total = delivered()
    assert counts["published"] == 30
    assert count - before[0] == 30
    assert 30 * 0.3 <= total - before[1] < 30 * 60


def test_the_slot_gauges_follow_the_slot_and_say_when_it_is_gone(
        db_dsn: str, source: LogicalSource) -> None:
    """Retained WAL grows with the server's writes; a dropped slot reads as lost."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        refresh_slot(conn, source)
        assert gauge("safetynet_outbox_slot_lost") == 0
        first = gauge("safetynet_outbox_replication_lag_bytes")
        conn.execute("CREATE TABLE public.filler AS SELECT g FROM generate_series(1, 20000) g")
        refresh_slot(conn, source)
        assert gauge("safetynet_outbox_replication_lag_bytes") > first
        assert gauge("safetynet_outbox_slot_confirmed_lsn_bytes") > 0
        conn.execute("SELECT pg_drop_replication_slot(%s)", (source.slot,))
        refresh_slot(conn, source)
        assert gauge("safetynet_outbox_slot_lost") == 1
