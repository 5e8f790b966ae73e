"""The logical source's stream (actors/outbox/stream.py, stream_reader.py) on real
PostgreSQL and Tansu: events committed come through the walsender, not a peek; what the
stream confirms is where the slot resumes; a fenced leader's stream confirms nothing; a
slot streams to one session at a time."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from typing import Any

import attrs
import psycopg
import pytest
import trio

from actors.envelope import event_id
from actors.leases.lock_keeper import CycleContext
from actors.outbox import logical, stream
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.relay import run_relay_cycle
from actors.outbox.slot import Txn, transactions
from actors.outbox.slot_cycle import SlotCycle
from actors.outbox.stream import SlotStream
from supervision.app.daemon import open_resources, run_once
from supervision.app.tree import relay_job
from supervision.db.database import Fence
from supervision.dev.kafka import KafkaServer
from supervision.errors import InfrastructureError, LeaseLost
from supervision.jobs import Job
from tests.integration.outbox.test_outbox_logical import (
    confirmed_lsn,
    enqueue_in_transactions,
    logical_cfg,
    peek,
    restart_lsn,
    source,
    topic,
)
from tests.integration.outbox.test_outbox_relay import outbox_by_event_id, read

__all__ = ["source", "topic"]  # fixtures


async def test_committed_events_come_through_the_stream_not_a_peek(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """300 events over 9 keys, committed durably: the drain hands every one on from the
    walsender's stream (no peek hands any on), each reaches the topic once, per key in
    commit order, and the slot ends past them."""
    from_peeks: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        txns = transactions(*args, **kwargs)
        from_peeks.extend(len(txn.inserts) for txn in txns)
        return txns

    monkeypatch.setattr(logical, "transactions", counted)
    ids = await trio.to_thread.run_sync(enqueue_in_transactions, db_dsn, topic,
                                        [f"k{n % 9}" for n in range(300)], True)
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert counts["published"] == 300
    assert sum(from_peeks) == 0, "every event came through the stream"
    messages = await read(kafka_server, topic, expect=300)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    seen = [by_event[m.headers["event-id"]] for m in messages]
    assert sorted(seen) == ids
    per_key: dict[str, list[int]] = defaultdict(list)
    for m, outbox_id in zip(messages, seen, strict=True):
        per_key[m.key or ""].append(outbox_id)
    assert all(v == sorted(v) for v in per_key.values()), "per-key order"
    assert await trio.to_thread.run_sync(peek, db_dsn, source) == []


async def read_all(opened: SlotStream) -> list[Txn]:
    """Every transaction the stream sends until it is quiet for half a second (a read
    returns as soon as one is whole)."""
    relations: dict[int, tuple[int, ...] | None] = {}
    txns: list[Txn] = []
    while records := await opened.read(10_000, 0.5):
        txns += transactions(records, 1 << 20, 0, relations)
    return txns


async def test_the_stream_resumes_after_what_it_confirmed(
        db_dsn: str, source: LogicalSource, topic: str) -> None:
    """Three transactions streamed, the first confirmed, the stream closed: a new stream
    sends the second and the third again, not the first."""
    first, second, third = [await trio.to_thread.run_sync(
        enqueue_in_transactions, db_dsn, topic, ["a"], True) for _ in range(3)]
    opened = await SlotStream.open(db_dsn, source)
    try:
        txns = await read_all(opened)
        assert [[row.id for row in txn.rows] for txn in txns] == [first, second, third]
        opened.confirm(txns[0].end_lsn)
    finally:
        opened.close()
    with trio.fail_after(10):
        while True:
            try:
                again = await SlotStream.open(db_dsn, source)
                break
            except InfrastructureError:  # the walsender is still leaving
                await trio.sleep(0.05)
    try:
        txns = await read_all(again)
        assert [[row.id for row in txn.rows] for txn in txns] == [second, third]
    finally:
        again.close()


async def test_a_fenced_leaders_stream_confirms_nothing(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """A cycle under a term that is not the live one streams and publishes, but its move
    is refused by the fence before the stream is told: the slot stays where it was."""
    await trio.to_thread.run_sync(enqueue_in_transactions, db_dsn, topic, ["a", "b", "c"],
                                  True)
    start = await trio.to_thread.run_sync(confirmed_lsn, db_dsn, source)
    async with open_resources(logical_cfg(db_dsn, kafka_server, source)) as res:
        job = relay_job(res)
        assert job.stream_dsn is not None
        ctx = attrs.evolve(CycleContext(Job.OUTBOX_RELAY, "t"), fence=Fence("outbox-relay", 99))
        with pytest.RaisesGroup(pytest.RaisesExc(LeaseLost), flatten_subgroups=True):
            await run_relay_cycle(job, ctx)
    await trio.sleep(0.2)  # a status update, had one been sent, would have landed
    assert await trio.to_thread.run_sync(confirmed_lsn, db_dsn, source) == start


async def test_a_slot_streams_to_one_session_at_a_time(
        db_dsn: str, source: LogicalSource, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one stream is open a second is refused (after a short wait: a walsender of
    our own may be leaving); once the first closes, the slot streams again."""
    monkeypatch.setattr(stream, "IN_USE_WAIT", 0.3)
    first = await SlotStream.open(db_dsn, source)
    try:
        with pytest.raises(InfrastructureError, match="in use"):
            await SlotStream.open(db_dsn, source)
    finally:
        first.close()
    monkeypatch.setattr(stream, "IN_USE_WAIT", 10.0)
    second = await SlotStream.open(db_dsn, source)
    second.close()


def wal_position(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Count the calls of *module*.*name* (one list entry per call)."""
    calls: list[int] = []
    original = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


async def test_a_cycle_caught_up_on_the_stream_ends_without_a_peek_and_passes_idle_wal(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Events streamed, then the walsender's keepalive says it sent everything: the cycle
    ends there, with no peek, and the slot moves past the events and past the WAL of
    another table committed after them (an idle outbox holds back no WAL)."""
    peeks = counting(monkeypatch, logical, "peek_slot")
    await trio.to_thread.run_sync(enqueue_in_transactions, db_dsn, topic,
                                  [f"k{n % 5}" for n in range(60)], True)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TABLE IF NOT EXISTS public.not_the_outbox (n int)")
        conn.execute("INSERT INTO public.not_the_outbox SELECT generate_series(1, 500)")
    after_other = await trio.to_thread.run_sync(wal_position, db_dsn)
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert counts["published"] == 60
    assert peeks == [], "no cycle peeked: each caught up on its stream"
    assert await trio.to_thread.run_sync(confirmed_lsn, db_dsn, source) >= after_other


async def test_the_restart_position_follows_when_a_stream_cycle_ends(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no standby snapshot logged while it moves the slot, a stream cycle still
    logs one when it has caught up and reads past it, so its last move takes the slot's
    restart position past every event it relayed: the next stream, peek or move decodes
    none of them again."""
    async def no_snapshot_on_moves(self: SlotCycle) -> None:
        return None

    monkeypatch.setattr(SlotCycle, "_snapshot", no_snapshot_on_moves)
    await trio.to_thread.run_sync(enqueue_in_transactions, db_dsn, topic,
                                  [f"k{n % 5}" for n in range(60)], True)
    after_events = await trio.to_thread.run_sync(wal_position, db_dsn)
    async with open_resources(logical_cfg(db_dsn, kafka_server, source)) as res:
        job = relay_job(res)
        counts = await run_relay_cycle(job, CycleContext(Job.OUTBOX_RELAY, "t"))
    assert counts.published == 60
    assert await trio.to_thread.run_sync(restart_lsn, db_dsn, source) >= after_events


def enqueue_one_transaction(dsn: str, topic: str, rows: int) -> list[int]:
    """*rows* outbox rows in one durable transaction, over 7 keys."""
    ids: list[int] = []
    with psycopg.connect(dsn) as conn:
        conn.execute("SET LOCAL synchronous_commit = on")
        for n in range(rows):
            dedupe = str(uuid.uuid4())
            row = conn.execute(
                "INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
                " event_type, payload, headers) VALUES (%s, %s, %s, 'Test', %s, %s)"
                " RETURNING id", (topic, f"k{n % 7}", dedupe, json.dumps({"N": n}),
                                  json.dumps({"event-id": event_id(topic, dedupe)}))
            ).fetchone()
            assert row is not None
            ids.append(int(row[0]))
    return ids


async def test_a_cycle_far_behind_reads_a_large_transaction_by_peeks_alone(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle that begins PEEK_FIRST_BYTES of WAL or more behind the slot reads a
    transaction of more than batch_size events by peeks (one result per peek, not one
    walsender message per change) and opens no stream; every event is published and the
    slot passes them all."""
    monkeypatch.setattr(logical, "PEEK_FIRST_BYTES", 0)
    opened = counting(monkeypatch, SlotStream, "open")
    peeks = counting(monkeypatch, logical, "peek_slot")
    ids = await trio.to_thread.run_sync(enqueue_one_transaction, db_dsn, topic, 450)
    after_events = await trio.to_thread.run_sync(wal_position, db_dsn)
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert counts["published"] == 450
    assert opened == [] and peeks
    messages = await read(kafka_server, topic, expect=450)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert sorted(by_event[m.headers["event-id"]] for m in messages) == ids
    assert await trio.to_thread.run_sync(confirmed_lsn, db_dsn, source) >= after_events


async def test_a_cycle_far_behind_streams_once_its_peeks_bring_only_small_transactions(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Far behind, a first peek brings transactions of 1 to 20 events (batch_size is
    200): the cycle goes on with the stream, which leaves out what the peek read, so
    each event reaches the topic once."""
    monkeypatch.setattr(logical, "PEEK_FIRST_BYTES", 0)
    monkeypatch.setattr(logical, "READ_BATCHES", 1)  # the first peek: about 200 events
    opened = counting(monkeypatch, SlotStream, "open")
    peeks = counting(monkeypatch, logical, "peek_slot")
    ids = await trio.to_thread.run_sync(enqueue_in_transactions, db_dsn, topic,
                                        [f"k{n % 7}" for n in range(600)], True)
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert counts["published"] == 600
    assert peeks and opened
    messages = await read(kafka_server, topic, expect=600)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert sorted(by_event[m.headers["event-id"]] for m in messages) == ids
