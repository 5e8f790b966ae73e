"""The outbox relay on real PostgreSQL and Tansu: exactly-once in a healthy run, per-key
order under failures, broker restarts, parallel relays, LISTEN wake-up, retention."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import psycopg
import pytest
import trio
from prometheus_client import REGISTRY

from actors.envelope import event_id
from actors.kafka.producer import KafkaProducer
from actors.leases.lock_keeper import (
    CycleContext,
    CycleStatus,
    LockConnection,
    run_locked_cycle,
    serve_lock_keeper,
)
from actors.outbox.claimer import claim_batch
from actors.outbox.listener import serve_outbox_listener
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.relay import RelayCounts, run_relay_cycle
from actors.outbox.retention import apply_retention
from actors.outbox.rows import Row, parse_row
from supervision.app import resources
from supervision.app.daemon import open_resources, run_once
from supervision.app.settings import Config
from supervision.app.tree import relay_job, relay_locked_job
from supervision.db.database import Database
from supervision.dev.kafka import KafkaServer
from supervision.dev.s3 import S3Server
from supervision.errors import ConfigurationFault, InfrastructureError
from supervision.metrics import LAST_CYCLES
from supervision.tree.health import HEALTH
from tests.conftest import make_config
from tests.faults import open_fault_proxy
from tests.messenger import KafkaMessage, fetch, read_topic
from tests.waiting import wait_until


@pytest.fixture
def topic() -> str:
    return f"test.outbox.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cfg(db_dsn: str, kafka_server: KafkaServer, s3_server: S3Server) -> Config:
    return make_config(db_dsn, kafka_server=kafka_server, s3_server=s3_server,
                       outbox_relay={"batch_size": 200, "poll_interval": "30s"})


def enqueue(dsn: str, topic: str, keys: list[str], payload_size: int = 600) -> list[int]:
    """Write outbox rows as any writer would; returns their ids in order."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = []
        for n, key in enumerate(keys):
            dedupe = str(uuid.uuid4())
            payload = {"N": n, "Key": key, "Pad": "x" * payload_size}
            headers = {"event-type": "Test", "event-id": event_id(topic, dedupe),
                       "correlation-id": "test", "source": "tests",
                       "content-type": "application/json"}
            row = conn.execute(
                "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
                " event_type, payload, headers) VALUES (%s, %s, %s, 'Test', %s, %s)"
                " RETURNING id", (topic, key, dedupe, json.dumps(payload),
                                  json.dumps(headers))).fetchone()
            assert row is not None
            ids.append(int(row[0]))
        return ids


def unpublished(dsn: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return fetch(conn, "SELECT * FROM messenger.integration_outbox"
                           " WHERE published_at IS NULL ORDER BY id")


def outbox_by_event_id(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = fetch(conn, "SELECT id, headers FROM messenger.integration_outbox")
    return {r["headers"]["event-id"]: r["id"] for r in rows
            if isinstance(r["headers"], dict) and "event-id" in r["headers"]}


async def read(kafka: KafkaServer, topic: str, expect: int | None = None) -> list[KafkaMessage]:
    return await trio.to_thread.run_sync(
        lambda: read_topic(kafka.bootstrap_servers, topic, expect=expect, timeout=15))


async def test_healthy_run_publishes_every_row_exactly_once(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """1,000 rows over 50 keys: each appears once on the topic, in id order per key, with
    its headers; every row is marked published; run-once reports the counts."""
    keys = [f"k{n % 50}" for n in range(1000)]
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic, keys)
    counts = await run_once(cfg, "outbox-relay")
    assert counts["published"] == 1000 and counts["failed"] == 0
    messages = await read(kafka_server, topic, expect=1000)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    seen = [by_event[m.headers["event-id"]] for m in messages]
    assert sorted(seen) == ids, "every row exactly once"
    per_key: dict[str, list[int]] = defaultdict(list)
    for m, outbox_id in zip(messages, seen, strict=True):
        per_key[m.key or ""].append(outbox_id)
        assert m.headers["content-type"] == "application/json"
        assert m.headers["event-type"] == "Test" and m.headers["source"] == "tests"
    assert all(v == sorted(v) for v in per_key.values()), "per-key order is id order"
    assert await trio.to_thread.run_sync(unpublished, db_dsn) == []


async def test_rejected_message_blocks_only_its_key_when_rows_wait_behind_it(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """A row too large for the broker is dead-lettered; the later rows of its key stay
    unpublished (never reordered) while every other key is published."""
    first = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b"])
    big = await trio.to_thread.run_sync(lambda: enqueue(db_dsn, topic, ["a"], 2_000_000))
    after = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b", "a"])
    counts = await run_once(cfg, "outbox-relay")
    assert counts["failed"] == 1
    messages = await read(kafka_server, topic)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    published = [by_event[m.headers["event-id"]] for m in messages]
    assert sorted(published) == [first[0], first[1], after[1]]
    waiting = [r["id"] for r in await trio.to_thread.run_sync(unpublished, db_dsn)]
    assert waiting == [big[0], after[0], after[2]]
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        dead = fetch(conn, "SELECT * FROM safetynet.outbox_dead_letters")
        stats = fetch(conn, OUTBOX_QUERIES["outbox_stats"])[0]
    assert [(d["outbox_id"], d["blocks_key"]) for d in dead] == [(big[0], True)]
    # measured in the database and dead-lettered unread (issue #26)
    assert dead[0]["reason"].startswith("too_large: row of 2000"), dead[0]["reason"]
    assert stats["blocked_keys"] == 1


async def test_rejected_last_message_of_a_key_is_skipped(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """With nothing of its key behind it, a rejected row is skipped: rows of that key
    written later are published normally."""
    big = await trio.to_thread.run_sync(lambda: enqueue(db_dsn, topic, ["solo"], 2_000_000))
    await run_once(cfg, "outbox-relay")
    later = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["solo"])
    counts = await run_once(cfg, "outbox-relay")
    assert counts["published"] == 1
    assert [r["id"] for r in await trio.to_thread.run_sync(unpublished, db_dsn)] == big
    messages = await read(kafka_server, topic)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert [by_event[m.headers["event-id"]] for m in messages] == later


@asynccontextmanager
async def running_relay(cfg: Config) -> AsyncIterator[None]:
    """The relay's part of the tree: listener + lock-keeper-driven relay."""
    async with open_resources(cfg) as res, trio.open_nursery() as nursery:
        dsn = cfg.postgres.dsn.reveal()
        await nursery.start(serve_outbox_listener, dsn, res.wakeup)
        await nursery.start(serve_lock_keeper, relay_locked_job(res), dsn)
        yield
        nursery.cancel_scope.cancel()


ROWS_RESTART = 6000


def relay_cycle_ended_since(since: float) -> bool:
    """This process recorded the end of an outbox-relay cycle at or after *since*."""
    ended = LAST_CYCLES.collect()[1]
    return any(s.labels["job"] == "outbox-relay" and s.value >= since for s in ended.samples)


def published_count(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM messenger.integration_outbox"
                           " WHERE published_at IS NOT NULL").fetchone()
        assert row is not None
        return int(row[0])


async def wait_published(dsn: str, limit_s: float = 30) -> None:
    await trio.to_thread.run_sync(
        wait_until, lambda: not unpublished(dsn), limit_s, "every row published")


async def test_kafka_killed_mid_drain_then_restarted_ends_with_every_row_published(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """Tansu SIGKILLed mid-drain: while it is down nothing more is marked published (rows
    wait, the relay backs off instead of crashing); after it restarts every row ends
    published, and whatever reaches the topic carries a known event-id.

    Tansu's memory storage loses messages across its own restart (seen here: acks for
    2,733 messages, 783 readable), so the consumer-side ledger across a broker outage is
    checked through the fault proxy instead, where the broker keeps its data."""
    fast = make_config(db_dsn, kafka_server=kafka_server,
                       outbox_relay={"batch_size": 50, "poll_interval": "200ms"})
    await trio.to_thread.run_sync(enqueue, db_dsn, topic,
                                  [f"k{n % 20}" for n in range(ROWS_RESTART)])
    async with running_relay(fast):
        await trio.to_thread.run_sync(
            wait_until, lambda: published_count(db_dsn) >= 200, 30, "the drain to start", 0.005)
        await trio.to_thread.run_sync(kafka_server.kill)
        await trio.sleep(0.5)  # in-flight sends finish failing
        frozen = await trio.to_thread.run_sync(published_count, db_dsn)
        await trio.sleep(1.5)  # an observation window: nothing more is marked published
        assert await trio.to_thread.run_sync(published_count, db_dsn) == frozen < ROWS_RESTART
        await trio.to_thread.run_sync(kafka_server.start)
        await wait_published(db_dsn, 60)
    messages = await read(kafka_server, topic)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert {m.headers["event-id"] for m in messages} <= set(by_event)


async def test_two_relays_never_publish_a_row_twice(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """Two relays draining at once: each row reaches the topic once."""
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic,
                                        [f"k{n % 30}" for n in range(600)])
    results: list[dict[str, Any]] = []
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            async def drain() -> None:
                results.append(await run_once(cfg, "outbox-relay"))
            nursery.start_soon(drain)
    messages = await read(kafka_server, topic, expect=600)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert sorted(by_event[m.headers["event-id"]] for m in messages) == ids
    assert sum(r.get("published", 0) for r in results) == 600


async def test_notify_wakes_the_relay_long_before_the_poll_interval(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """With poll_interval 30 s, a row written by another writer is published in < 2 s."""
    since = time.time()
    async with running_relay(cfg):  # LISTEN is in place once it is entered
        await trio.to_thread.run_sync(
            wait_until, partial(relay_cycle_ended_since, since), 10, "the first (empty) cycle")
        started = trio.current_time()
        await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["late"])
        await wait_published(db_dsn, 10)
        latency = trio.current_time() - started
    assert latency < 2.0


async def test_retention_deletes_only_published_rows_past_retention(
        cfg: Config, db_dsn: str, topic: str) -> None:
    """The relay's retention pass deletes old published rows in small batches; recent
    published rows and unpublished rows stay."""
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"] * 5 + ["b", "c"])
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("UPDATE messenger.integration_outbox SET published_at = now() -"
                     " interval '8 days' WHERE id = ANY(%s)", (ids[:5],))
        conn.execute("UPDATE messenger.integration_outbox SET published_at = now() -"
                     " interval '1 day' WHERE id = %s", (ids[5],))
    async with open_resources(cfg) as res:
        job = relay_job(res)
        deleted = await apply_retention(job.db, job.cfg, batch=2)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        left = [r[0] for r in conn.execute(
            "SELECT id FROM messenger.integration_outbox ORDER BY id").fetchall()]
    assert deleted == 5
    assert left == ids[5:]


async def test_unreachable_kafka_leaves_rows_unpublished_and_fails_run_once(
        db_dsn: str, topic: str) -> None:
    """No broker: run-once fails (exit 1 path) and nothing is marked published."""
    cfg = make_config(db_dsn, kafka={"bootstrap_servers": "127.0.0.1:1"})
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])
    with pytest.RaisesGroup(pytest.RaisesExc(InfrastructureError, match="kafka"),
                            flatten_subgroups=True):
        await run_once(cfg, "outbox-relay")
    assert len(await trio.to_thread.run_sync(unpublished, db_dsn)) == 1


@attrs.define
class CommitsLateRow:
    """The relay's database, committing another writer's open transaction (its row has a
    lower id than the rows already claimed) right after the cycle's first claim."""

    db: Database
    late: psycopg.Connection

    async def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self.db.run(fn, *args, **kwargs)

    async def atomic(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = await self.db.atomic(fn, *args, **kwargs)
        if fn is claim_batch and not self.late.closed:
            self.late.commit()
            self.late.close()
        return result


async def test_a_row_committed_after_higher_ids_were_claimed_goes_in_the_same_cycle(
        cfg: Config, db_dsn: str, topic: str) -> None:
    """Writers commit out of id order: a row whose id is below what the cycle already
    claimed, committed while the cycle runs, is claimed by the cycle's next claim (not
    passed over until the next cycle)."""
    late = psycopg.connect(db_dsn)
    late.execute("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
                 " event_type, payload) VALUES (%s, 'late', 'late', 'Test', '{}')", (topic,))
    try:
        await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["early"])
        async with open_resources(cfg) as res:
            job = attrs.evolve(relay_job(res),
                               db=CommitsLateRow(res.db, late))  # type: ignore[arg-type]
            counts = await run_relay_cycle(job, CycleContext("outbox-relay", "t"))
    finally:
        late.close()
    assert counts.published == 2
    assert await trio.to_thread.run_sync(unpublished, db_dsn) == []


def lease_term(dsn: str, job: str) -> int | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT term FROM safetynet.leases WHERE job = %s",
                           (job,)).fetchone()
    return None if row is None else int(row[0])


async def test_an_idle_relay_skips_its_ticks_without_taking_the_lease(
        cfg: Config, db_dsn: str, topic: str) -> None:
    """With nothing to publish, a tick of the relay's keeper that was not woken reads the
    outbox once and skips (no new lease term, no cycle); a wake-up, or a row waiting,
    makes the next tick run as before."""
    async with open_resources(cfg) as res:
        locked = relay_locked_job(res)
        lock = LockConnection(db_dsn)
        try:
            first = await run_locked_cycle(locked, lock)  # starts the producer
            assert first.status is CycleStatus.RAN
            term = await trio.to_thread.run_sync(lease_term, db_dsn, "outbox-relay")
            idle = await run_locked_cycle(locked, lock)
            assert idle.status is CycleStatus.SKIPPED_IDLE
            assert await trio.to_thread.run_sync(lease_term, db_dsn, "outbox-relay") == term
            woken = await run_locked_cycle(locked, lock, probe=False)
            assert woken.status is CycleStatus.RAN
            await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])
            ran = await run_locked_cycle(locked, lock)
            assert ran.status is CycleStatus.RAN and ran.result is not None
            assert ran.result.published == 1
        finally:
            lock.discard()


async def test_lock_keeper_serialises_relays(cfg: Config, db_dsn: str) -> None:
    """The relay's cycle runs under its own lease (one publisher per fleet)."""
    async with open_resources(cfg) as res:
        job = relay_locked_job(res)
        holder, a, b = (LockConnection(db_dsn) for _ in range(3))
        lease = await holder.acquire(job)
        assert lease is not None
        outcome = await run_locked_cycle(job, a)
        assert outcome.status == "skipped_locked"
        await holder.release(job, lease)
        outcome = await run_locked_cycle(job, b)
        assert outcome.status == "ran" and isinstance(outcome.result, RelayCounts)
        for conn in (holder, a, b):
            conn.discard()


def insert_raw(dsn: str, topic: str, key: str, payload: str, headers: str) -> int:
    """One outbox row with *payload*/*headers* given as JSON text, as another service
    might write it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
            " event_type, payload, headers) VALUES (%s, %s, %s, 'Test', %s::jsonb,"
            " %s::jsonb) RETURNING id", (topic, key, str(uuid.uuid4()), payload,
                                         headers)).fetchone()
        assert row is not None
        return int(row[0])


def dead_letters(dsn: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return {d["outbox_id"]: d for d in fetch(
            conn, "SELECT * FROM safetynet.outbox_dead_letters")}


MALFORMED = [  # (payload, headers, reason)
    ('{"N": 1}', "[1, 2]", "malformed_row: headers is a JSON array, not an object"),
    ('{"N": 1}', '{"event-id": 5}',
     "malformed_row: header 'event-id' is a JSON number, not a string"),
    ('"just text"', "{}", "malformed_row: payload is a JSON string, not an object"),
    ("42", "{}", "malformed_row: payload is a JSON number, not an object"),
]


CLAIM_CASES = [*((p, h) for p, h, _ in MALFORMED), ('{"N": 1}', "null"),
               ('{"N": 1}', "{}"), ('{"N": 1}', '{"a": null}'), ('{"N": 1}', '{"a": {"b": 1}}'),
               ('{"N": 1}', '{"event-type": "Own", "content-type": "text/plain", "x": "y"}'),
               ('{"N": 1, "T": "ü"}', '{"event-id": "e1", "ß": "ä"}'), ("null", "{}"),
               ('[1]', '{"a": "b"}')]


async def test_the_claim_builds_each_message_as_parse_row_does(
        db_dsn: str, topic: str) -> None:
    """The claim's fast path (tuple rows, no record dict) builds each message as
    ``parse_row`` does: for rows of every shape (good, malformed, JSON null headers, own
    defaults, non-ASCII) it yields what ``parse_row`` makes of the stored row."""
    ids = [await trio.to_thread.run_sync(insert_raw, db_dsn, topic, f"k{n}", payload,
                                         headers)
           for n, (payload, headers) in enumerate(CLAIM_CASES)]

    def both() -> tuple[list[Any], list[Any]]:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            with conn.transaction():
                claimed = claim_batch(conn, 100, (), ids[0] - 1).rows
            stored = fetch(conn, "SELECT id, topic, message_key, dedupe_key, event_type,"
                                 " payload::text AS payload, jsonb_typeof(payload) AS"
                                 " payload_type, headers FROM messenger.integration_outbox"
                                 " WHERE id = ANY(%s) ORDER BY id", ids)
        return claimed, [parse_row(rec) for rec in stored]

    claimed, expected = await trio.to_thread.run_sync(both)
    assert [type(c) for c in claimed] == [type(e) for e in expected]
    for got, want in zip(claimed, expected, strict=True):
        if isinstance(got, Row):
            assert isinstance(want, Row)
            assert dict(got.message.headers) == dict(want.message.headers)
            assert attrs.evolve(got.message, headers=()) == attrs.evolve(want.message,
                                                                          headers=())
        else:
            assert got == want
    assert sum(isinstance(c, Row) for c in claimed) == 4


async def test_malformed_rows_are_dead_lettered_while_the_relay_keeps_publishing(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """Bad headers/payloads among good rows: the running relay (lock keeper and all)
    dead-letters each with its reason, publishes every good row, blocks only the key of
    a bad row that had later rows waiting, and goes on publishing what comes next."""
    good = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b", "c"])
    bad = [await trio.to_thread.run_sync(insert_raw, db_dsn, topic, f"bad{n}", payload,
                                         headers)
           for n, (payload, headers, _reason) in enumerate(MALFORMED)]
    good += await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b", "c"])
    # a bad row with a later row of its key waiting: that key is blocked, in order
    blocker = await trio.to_thread.run_sync(insert_raw, db_dsn, topic, "a", "[]", "{}")
    behind = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])
    expected_waiting = sorted([*bad, blocker, *behind])
    async with running_relay(cfg):
        await trio.to_thread.run_sync(
            wait_until, lambda: [r["id"] for r in unpublished(db_dsn)] == expected_waiting
            and len(dead_letters(db_dsn)) == len(MALFORMED) + 1, 30,
            "the good rows published and the bad ones dead-lettered")
        later = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["d"])
        await trio.to_thread.run_sync(
            wait_until, lambda: later[0] not in {r["id"] for r in unpublished(db_dsn)},
            30, "a row written afterwards to be published")
    dead = await trio.to_thread.run_sync(dead_letters, db_dsn)
    assert {outbox_id: d["reason"] for outbox_id, d in dead.items()} == {
        **{outbox_id: reason for outbox_id, (_p, _h, reason) in zip(bad, MALFORMED,
                                                                      strict=True)},
        blocker: "malformed_row: payload is a JSON array, not an object"}
    assert [outbox_id for outbox_id, d in dead.items() if d["blocks_key"]] == [blocker]
    messages = await read(kafka_server, topic, expect=len(good) + 1)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert sorted(by_event[m.headers["event-id"]] for m in messages) == [*good, *later]


@pytest.fixture
def no_topic_creation(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every producer the app opens asks the broker not to create topics: Tansu then
    answers like a broker with auto-create off."""
    monkeypatch.setattr(resources, "KafkaProducer", partial(KafkaProducer, create_topics=False))
    yield
    HEALTH.clear_fault("kafka")


async def test_missing_topic_is_a_configuration_fault_that_heals_once_created(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str,
        no_topic_creation: None) -> None:
    """Rows for a topic that does not exist (auto-create off): at once — not after a
    metadata wait per row — nothing is dead-lettered, no attempt is counted, readiness
    names the topic, run-once fails; other topics publish meanwhile. Once the topic is
    created, the next try publishes them and readiness recovers."""
    other = f"{topic}.ok"
    await trio.to_thread.run_sync(kafka_server.create_topic, other)
    missing = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b", "a"])
    fine = await trio.to_thread.run_sync(enqueue, db_dsn, other, ["a", "b"])
    async with open_resources(cfg) as res:
        job = relay_job(res)
        with trio.fail_after(5):  # aiokafka alone waits 10 s per row, then says "unknown"
            counts = await run_relay_cycle(job, CycleContext("outbox-relay", "t1"))
        assert (counts.published, counts.failed) == (2, 0)
        assert HEALTH.reason() == (f"configuration fault in kafka: topic {topic}:"
                                   " kafka:UnknownTopicOrPartitionError")
        rows = await trio.to_thread.run_sync(unpublished, db_dsn)
        assert [r["id"] for r in rows] == missing
        assert {(r["publish_attempts"], r["last_error"]) for r in rows} == {(0, None)}
        assert await trio.to_thread.run_sync(dead_letters, db_dsn) == {}
        with pytest.RaisesGroup(pytest.RaisesExc(ConfigurationFault, match=topic),
                                flatten_subgroups=True):
            await run_once(cfg, "outbox-relay")

        await trio.to_thread.run_sync(kafka_server.create_topic, topic)
        await trio.sleep_until(job.state.topic_faults[topic].retry_at)  # the fault's back-off
        counts = await run_relay_cycle(job, CycleContext("outbox-relay", "t2"))
        assert counts.published == 3 and HEALTH.reason() is None
    messages = await read(kafka_server, topic, expect=3)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert [by_event[m.headers["event-id"]] for m in messages] == missing
    assert fine[0] not in {r["id"] for r in await trio.to_thread.run_sync(unpublished, db_dsn)}


async def test_retry_state_of_rows_settled_elsewhere_is_dropped(
        cfg: Config, db_dsn: str, topic: str) -> None:
    """The relay forgets the back-off of rows it will never send again (published by
    another relay, dead-lettered): its memory is bounded by the pending rows."""
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b"])
    async with open_resources(cfg) as res:
        job = relay_job(res)
        for outbox_id in ids:
            job.state.rows.failed(outbox_id, trio.current_time(), delay=3600.0)
        with psycopg.connect(db_dsn, autocommit=True) as conn:  # another relay's work
            conn.execute("UPDATE messenger.integration_outbox SET published_at = now()"
                         " WHERE id = %s", (ids[0],))
        counts = await run_relay_cycle(job, CycleContext("outbox-relay", "t"))
        assert counts.published == 0  # row b is still in its back-off
        assert len(job.state.rows) == 1 and job.state.rows.due_at(ids[1]) > 0


async def test_row_with_an_invalid_topic_name_is_dead_lettered_at_once(
        cfg: Config, db_dsn: str, kafka_server: KafkaServer, topic: str) -> None:
    """A topic name the broker calls invalid is that row's fault: the topic probe's answer
    dead-letters it without a metadata wait, and the other rows are published."""
    bad = await trio.to_thread.run_sync(enqueue, db_dsn, "not a topic!", ["a"])
    good = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b"])
    with trio.fail_after(5):  # aiokafka alone waits 10 s, then calls it unknown (transient)
        counts = await run_once(cfg, "outbox-relay")
    assert (counts["published"], counts["failed"]) == (2, 1)
    dead = await trio.to_thread.run_sync(dead_letters, db_dsn)
    assert {k: d["reason"] for k, d in dead.items()} == {bad[0]: "kafka:InvalidTopicError"}
    messages = await read(kafka_server, topic, expect=2)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert sorted(by_event[m.headers["event-id"]] for m in messages) == good


def listener_connected() -> float | None:
    return REGISTRY.get_sample_value("safetynet_outbox_listener_connected")


def listener_reconnects() -> float:
    return REGISTRY.get_sample_value("safetynet_outbox_listener_reconnects_total") or 0.0


async def test_relay_publishes_on_its_poll_while_the_listen_connection_is_half_open(
        db_dsn: str, kafka_server: KafkaServer, s3_server: S3Server, topic: str) -> None:
    """The LISTEN connection goes through a proxy that turns into a black hole: the
    listener finds it dead (connected 0), the relay keeps publishing on its poll
    fallback, and once the path heals the listener reconnects (counted)."""
    cfg = make_config(db_dsn, kafka_server=kafka_server, s3_server=s3_server,
                      outbox_relay={"poll_interval": "1s"})
    params = psycopg.conninfo.conninfo_to_dict(db_dsn)
    async with open_fault_proxy(str(params["host"]), int(params["port"])) as proxy, \
            open_resources(cfg) as res, trio.open_nursery() as nursery:
        listen_dsn = psycopg.conninfo.make_conninfo(db_dsn, port=proxy.port)
        await nursery.start(partial(serve_outbox_listener, listen_dsn, res.wakeup,
                                    check_every=0.2, deadline=1.0))
        await nursery.start(serve_lock_keeper, relay_locked_job(res), db_dsn)
        assert listener_connected() == 1
        before = listener_reconnects()
        proxy.faults.blackhole = True
        await trio.to_thread.run_sync(wait_until, lambda: listener_connected() == 0, 15,
                                      "the listener to find its connection dead")
        await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k1", "k2", "k1"])
        await wait_published(db_dsn, 3 * cfg.outbox_relay.poll_interval + 10)
        proxy.faults.blackhole = False
        await trio.to_thread.run_sync(
            wait_until, lambda: listener_reconnects() == before + 1, 30,
            "the listener to reconnect once the path healed")
        assert listener_connected() == 1
        nursery.cancel_scope.cancel()
    assert len(await read(kafka_server, topic, expect=3)) == 3
