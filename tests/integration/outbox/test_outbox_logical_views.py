"""The outbox's figures in the logical source (issue 37, item 4): unpublished, oldest
and blocked keys from the slot's recorded position, not from published_at (which this
source never sets) — for the gauges, `safetynet status` and the console alike."""

from __future__ import annotations

import psycopg
import trio
from prometheus_client import REGISTRY

from actors.audit.invariants import Invariant, Thresholds, judge_database
from actors.outbox.gauges import refresh_outbox
from actors.outbox.logical_setup import LogicalSource
from supervision.app.daemon import run_once
from supervision.app.runbook import status
from supervision.dev.kafka import KafkaServer
from tests.integration.outbox.test_outbox_logical import logical_cfg, source, topic
from tests.integration.outbox.test_outbox_relay import enqueue, insert_raw

__all__ = ["source", "topic"]  # the fixtures


def figures(dsn: str) -> tuple[float, float, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        refresh_outbox(conn, logical=True)
    return tuple(REGISTRY.get_sample_value(name) or 0.0 for name in (  # type: ignore[return-value]
        "safetynet_outbox_unpublished", "safetynet_outbox_oldest_unpublished_age_seconds",
        "safetynet_outbox_blocked_keys"))


async def test_the_figures_follow_the_slot_and_count_the_held_rows(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    cfg = logical_cfg(db_dsn, kafka_server, source)
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b", "c"])
    assert figures(db_dsn)[0] == 3, "before the relay's first record: every row waits"
    assert (await run_once(cfg, "outbox-relay"))["published"] == 3
    assert figures(db_dsn)[:1] == (0,), "the slot passed them: none waits"
    await trio.to_thread.run_sync(insert_raw, db_dsn, topic, "k", "[1]", "{}")  # dead letter
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k", "k"])  # held behind it
    waiting = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["x"])
    assert figures(db_dsn)[0] == 4  # the four rows the slot has not passed
    await run_once(cfg, "outbox-relay")
    unpublished, oldest, blocked = figures(db_dsn)
    assert (unpublished, blocked) == (2, 1), "the two held rows wait, one key blocked"
    assert oldest >= 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        shown = status(conn, cfg)
    assert shown.outbox["unpublished"] == 2 and waiting


async def test_the_auditor_judges_unpublished_rows_from_the_slots_position(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """Rows an hour old: those the slot delivered are not `unpublished` violations (their
    published_at stays NULL), one written after and not read is."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE messenger.integration_outbox"
                     " ALTER COLUMN created_at SET DEFAULT now() - interval '1 hour'")
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b"])
    assert (await run_once(logical_cfg(db_dsn, kafka_server, source, retention="2h"),
                           "outbox-relay"))["published"] == 2
    (late,) = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["c"])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        found = judge_database(conn, Thresholds(relay_lag_s=60))
    assert [(v.invariant, v.subject) for v in found
            if v.invariant is Invariant.UNPUBLISHED] == [(Invariant.UNPUBLISHED, str(late))]
