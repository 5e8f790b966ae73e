"""The outbox's figures in the logical source (issue 37, item 4): unpublished, oldest
and blocked keys from the slot's recorded position, not from published_at (which this
source never sets) — for the gauges, `safetynet status` and the console alike."""

from __future__ import annotations

import psycopg
import trio
from prometheus_client import REGISTRY

from actors.audit.invariants import Invariant, Thresholds, judge_database
from actors.leases.lock_keeper import CycleContext
from actors.outbox.gauges import refresh_outbox
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.relay import relay_idle, run_relay_cycle
from supervision.app.daemon import open_resources, run_once
from supervision.app.runbook import status
from supervision.app.tree import relay_job
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


def unpublished(dsn: str) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [v.subject for v in judge_database(conn, Thresholds())
                if v.invariant is Invariant.UNPUBLISHED]


async def test_an_idle_relay_records_how_far_the_slot_passed_before_it_idles(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """The daemon runs a relay cycle only when the idle probe finds work. A cycle that
    published records the slot's passed position at most every RECORD_EVERY seconds, so
    after a second burst the record lags: the probe is not idle until one more (quiet)
    cycle recorded it; then the auditor finds nothing unpublished on the idle outbox."""
    cfg = logical_cfg(db_dsn, kafka_server, source)
    async with open_resources(cfg) as res:
        job = relay_job(res)
        await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b"])
        assert (await run_relay_cycle(job, CycleContext("outbox-relay", "t1"))).published == 2
        await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "c"])
        assert (await run_relay_cycle(job, CycleContext("outbox-relay", "t2"))).published == 2
        assert not await relay_idle(job), "the record lags the slot: one cycle more is due"
        assert (await run_relay_cycle(job, CycleContext("outbox-relay", "t3"))).published == 0
        assert await relay_idle(job)
    assert await trio.to_thread.run_sync(unpublished, db_dsn) == []
