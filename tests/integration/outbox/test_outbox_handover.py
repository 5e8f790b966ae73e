"""The relay's hand-over between its sources (issue 37, items 3 and 5), on real
PostgreSQL (wal_level = logical) and Tansu: a slot dropped mid-life loses no event (the
relay falls back to the table from the last position the slot passed, duplicates
counted); table → logical and logical → table lose none, with events committed during
the switch; after a switch to the table the rows the slot delivered are not sent again."""

from __future__ import annotations

from collections import Counter

import psycopg
import trio
from prometheus_client import REGISTRY

from actors.outbox.handover import read_source
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.retention import apply_retention
from supervision.app.daemon import run_once
from supervision.app.runbook import replay
from supervision.app.settings import Config
from supervision.db.database import open_database
from supervision.dev.kafka import KafkaServer
from tests.conftest import make_config
from tests.integration.outbox.test_outbox_logical import (
    logical_cfg,
    outbox_writes,
    source,
    topic,
)
from tests.integration.outbox.test_outbox_relay import (
    enqueue,
    insert_raw,
    outbox_by_event_id,
    read,
)

__all__ = ["source", "topic"]  # the fixtures


def table_cfg(dsn: str, kafka: KafkaServer) -> Config:
    return make_config(dsn, kafka={"bootstrap_servers": kafka.bootstrap_servers},
                       outbox_relay={"batch_size": 200, "poll_interval": "30s"})


def recorded(dsn: str) -> tuple[str | None, int | None]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return read_source(conn)


def set_recorded(dsn: str, source: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE safetynet.outbox_relay_source SET source = %s, passed_xid = NULL",
                     (source,))


async def published_ids(dsn: str, kafka: KafkaServer, topic: str,
                        expect: int) -> Counter[int]:
    """How many times each outbox id reached the topic."""
    messages = await read(kafka, topic, expect=expect)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, dsn)
    return Counter(by_event[m.headers["event-id"]] for m in messages)


def republished() -> float:
    return REGISTRY.get_sample_value("safetynet_outbox_fallback_republished_total") or 0.0


async def test_a_slot_dropped_mid_life_loses_no_event_and_counts_what_went_out_again(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """The slot delivers A; B is committed, the slot is dropped, C is committed: the
    relay falls back to the table, marks A (passed) published without sending it again,
    and publishes B and C from the table, counted as republished."""
    cfg = logical_cfg(db_dsn, kafka_server, source)
    a = await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 4}" for n in range(40)])
    assert (await run_once(cfg, "outbox-relay"))["published"] == 40
    assert recorded(db_dsn)[0] == "logical" and recorded(db_dsn)[1] is not None
    b = await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 4}" for n in range(30)])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (source.slot,))
    c = await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 4}" for n in range(20)])
    before = republished()
    counts = await run_once(cfg, "outbox-relay")
    assert counts["published"] == 50
    assert republished() - before == 50
    seen = await published_ids(db_dsn, kafka_server, topic, expect=90)
    assert set(seen) == set(a + b + c), "no event lost"
    assert all(n == 1 for n in seen.values()), "A was passed: not sent again"
    assert recorded(db_dsn)[0] == "table"


async def test_table_to_logical_with_events_committed_during_the_switch_loses_none(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """The table source publishes A; B waits; the relay switches to the logical source
    while C is being committed: A, B and C all reach the topic, then D goes through the
    slot without one UPDATE of the outbox."""
    set_recorded(db_dsn, "table")
    a = await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 4}" for n in range(30)])
    assert (await run_once(table_cfg(db_dsn, kafka_server), "outbox-relay"))["published"] == 30
    b = await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 4}" for n in range(30)])
    c: list[int] = []

    async def writer() -> None:
        for _ in range(10):
            c.extend(await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k1", "k2"]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert recorded(db_dsn)[0] == "logical"
    await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    seen = await published_ids(db_dsn, kafka_server, topic, expect=80)
    assert set(seen) >= set(a + b + c), "no event lost"
    before = await trio.to_thread.run_sync(outbox_writes, db_dsn)
    d = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k1"] * 10)
    assert (await run_once(logical_cfg(db_dsn, kafka_server, source),
                           "outbox-relay"))["published"] == 10
    assert await trio.to_thread.run_sync(outbox_writes, db_dsn) == before
    seen = await published_ids(db_dsn, kafka_server, topic, expect=sum(seen.values()) + 10)
    assert set(d) <= set(seen)
    print("duplicates over the switch:", sum(seen.values()) - len(seen))


async def test_logical_to_table_sends_only_what_the_slot_had_not_delivered(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """The logical source delivers A; B is committed; the relay switches to the table
    while C is being committed: A is marked published (not sent again), B and C go out."""
    a = await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 4}" for n in range(40)])
    assert (await run_once(logical_cfg(db_dsn, kafka_server, source),
                           "outbox-relay"))["published"] == 40
    b = await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 4}" for n in range(25)])
    c: list[int] = []

    async def writer() -> None:
        for _ in range(10):
            c.extend(await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k1", "k2"]))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        await run_once(table_cfg(db_dsn, kafka_server), "outbox-relay")
    await run_once(table_cfg(db_dsn, kafka_server), "outbox-relay")
    assert recorded(db_dsn)[0] == "table"
    seen = await published_ids(db_dsn, kafka_server, topic, expect=85)
    assert set(seen) == set(a + b + c), "no event lost"
    assert all(n == 1 for n in seen.values()), "nothing sent twice"


async def test_retention_in_the_logical_source_deletes_only_rows_the_slot_passed(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """Rows 8 days old (an UPDATE would give them a new transaction id: the writer's
    default says it): A, delivered by the slot, goes with the relay's own retention pass
    (7 days); B, committed after and not read, stays through a retention pass, and is
    published next."""
    cfg = logical_cfg(db_dsn, kafka_server, source)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE messenger.integration_outbox"
                     " ALTER COLUMN created_at SET DEFAULT now() - interval '8 days'")
    a = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k"] * 20)
    assert (await run_once(cfg, "outbox-relay"))["published"] == 20
    b = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k"] * 5)
    async with open_database(db_dsn, size=1) as db:
        assert await apply_retention(db, cfg.outbox_relay, batch=7) == 0
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        left = [r[0] for r in conn.execute(
            "SELECT id FROM messenger.integration_outbox ORDER BY id").fetchall()]
    assert left == b and not set(a) & set(left)
    assert (await run_once(cfg, "outbox-relay"))["published"] == 5


async def test_replay_in_the_logical_source_publishes_the_held_rows_after_it_in_order(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """A malformed event of key a is dead-lettered and the later ones of a are held (the
    slot passes them); fixed and replayed, it goes out, then the held ones, then an event
    of a committed after the replay: per-key order kept, each once."""
    cfg = logical_cfg(db_dsn, kafka_server, source)
    bad = await trio.to_thread.run_sync(insert_raw, db_dsn, topic, "a", "[1]", "{}")
    held = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "a", "a"])
    await run_once(cfg, "outbox-relay")
    more = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])  # held too
    await run_once(cfg, "outbox-relay")
    assert await read(kafka_server, topic) == []
    with psycopg.connect(db_dsn) as conn:
        conn.execute("UPDATE messenger.integration_outbox SET payload = '{\"fixed\": 1}'"
                     " WHERE id = %s", (bad,))
        conn.commit()
        assert [r.outbox_id for r in replay(conn, [str(bad)])] == [bad]
        conn.commit()
    after = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])
    await run_once(cfg, "outbox-relay")
    messages = await read(kafka_server, topic, expect=6)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    # the malformed row had no event-id header (the relay derived one): the one not found
    assert [by_event.get(m.headers["event-id"], bad) for m in messages] == [
        bad, *held, *more, *after]
