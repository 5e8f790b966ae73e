"""The outbox relay's logical source on real PostgreSQL (wal_level = logical) and Tansu:
the pgoutput decoder on real changes, the publication and slot set-up, a drain that
writes nothing to the outbox, at least once when Kafka fails mid-drain, per-key order,
a restart from the slot's confirmed position, the lease's fence."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import attrs
import psycopg
import pytest
import trio

from actors.envelope import event_id
from actors.leases.lock_keeper import CycleContext
from actors.outbox import slot_cycle
from actors.outbox.claimer import claim_batch
from actors.outbox.handover import write_source
from actors.outbox.logical_setup import (
    LogicalSetupRefused,
    LogicalSource,
    LogicalSourceMismatch,
    drop_logical_source,
    ensure_logical_source,
    setup_statements,
)
from actors.outbox.pgoutput import Begin, Commit, Insert, Relation, decode
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.relay import run_relay_cycle
from actors.outbox.rows import Row
from actors.outbox.slot import transactions
from actors.outbox.slot_io import log_snapshot, may_snapshot, peek_slot
from supervision.app.daemon import open_resources, run_once
from supervision.app.settings import Config
from supervision.app.tree import relay_job
from supervision.db.database import Fence
from supervision.dev.kafka import KafkaServer
from supervision.dev.ports import free_ports
from supervision.errors import LeaseLost
from tests.conftest import make_config
from tests.faults import FaultProxy
from tests.integration.db.test_print_sql import new_role
from tests.integration.outbox.test_outbox_relay import (
    CLAIM_CASES,
    dead_letters,
    enqueue,
    insert_raw,
    outbox_by_event_id,
    read,
)
from tests.waiting import wait_until


@pytest.fixture
def topic() -> str:
    return f"test.logical.{uuid.uuid4().hex[:10]}"


@pytest.fixture
def source(db_dsn: str) -> Iterator[LogicalSource]:
    """This test's publication and slot (slots are per server: a name of its own), dropped
    after it (a database with a slot cannot be dropped); recorded as the relay's source
    (actors.outbox.handover: the switch from the table is done)."""
    name = f"sn_{uuid.uuid4().hex[:12]}"
    src = LogicalSource(name, name)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert ensure_logical_source(conn, src) == [f"publication {name}", f"slot {name}"]
        write_source(conn, "logical", None)  # switched in: the table had nothing waiting
    try:
        yield src
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            drop_logical_source(conn, src)


def logical_cfg(dsn: str, kafka: KafkaServer | str, src: LogicalSource,
                **relay: Any) -> Config:
    bootstrap = kafka if isinstance(kafka, str) else kafka.bootstrap_servers
    return make_config(dsn, kafka={"bootstrap_servers": bootstrap},
                       outbox_relay={"source": "logical", "slot": src.slot,
                                     "publication": src.publication, "batch_size": 200,
                                     "poll_interval": "30s", **relay})


def peek(dsn: str, src: LogicalSource, upto_n: int = 100_000) -> list[tuple[int, bytes]]:
    """What the slot has past its confirmed position (the WAL flushed first, as the relay
    does: the test server commits asynchronously)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return peek_slot(conn, src, upto_n).records


def outbox_writes(dsn: str) -> tuple[int, int]:
    """(UPDATEs, DELETEs) of the outbox counted by the statistics collector (this
    session's and the others' flushed counts)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT n_tup_upd, n_tup_del FROM pg_stat_user_tables"
                           " WHERE schemaname = 'messenger'"
                           " AND relname = 'integration_outbox'").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def confirmed_lsn(dsn: str, src: LogicalSource) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(OUTBOX_QUERIES["outbox_slot_describe"], {"slot": src.slot}
                           ).fetchone()
    assert row is not None
    return int(row[5])


def test_the_decoder_reads_real_inserts_of_the_outbox(
        db_dsn: str, source: LogicalSource, topic: str) -> None:
    """Two transactions of inserts through pgoutput: Begin, the outbox's Relation, one
    Insert per row with the columns as text, Commit; and the relay's rows built from them
    carry the stored payload, key, topic and event-id."""
    first = enqueue(db_dsn, topic, ["a", "b"])
    second = enqueue(db_dsn, topic, ["a"])
    records = peek(db_dsn, source)
    messages = [decode(data) for _, data in records]
    kinds = [type(m).__name__ for m in messages]
    assert kinds.count("Begin") == kinds.count("Commit") == 3  # autocommit: one per row
    relation = next(m for m in messages if isinstance(m, Relation))
    assert (relation.namespace, relation.name) == ("messenger", "integration_outbox")
    inserts = [m for m in messages if isinstance(m, Insert)]
    ids = [int(m.values[0]) for m in inserts]  # type: ignore[arg-type]
    assert ids == first + second
    begins = [m for m in messages if isinstance(m, Begin)]
    commits = [m for m in messages if isinstance(m, Commit)]
    assert [c.commit_time for c in commits] == [b.commit_time for b in begins]
    assert [lsn for lsn, data in records if data[:1] == b"C"] == [c.end_lsn for c in commits]
    txns = transactions(records, 1024 * 1024)
    rows = [row for txn in txns for row in txn.rows]
    assert all(isinstance(row, Row) for row in rows)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        stored = dict(conn.execute("SELECT id, payload::text FROM"
                                   " messenger.integration_outbox").fetchall())
    for row in rows:
        assert isinstance(row, Row) and row.topic == topic
        assert row.message.value == stored[row.id].encode()
        assert dict(row.message.headers)["event-type"] == b"Test"


def test_setup_is_idempotent_and_checks_what_exists(db_dsn: str,
                                                    source: LogicalSource) -> None:
    """Run again, nothing is created; a publication of the wrong operations is named."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert ensure_logical_source(conn, source) == []
        other = f"{source.publication}_all"
        conn.execute(f"CREATE PUBLICATION {other} FOR TABLE messenger.integration_outbox")
        try:
            with pytest.raises(LogicalSourceMismatch, match="insert, update, delete"):
                ensure_logical_source(conn, LogicalSource(source.slot, other))
        finally:
            conn.execute(f"DROP PUBLICATION {other}")


def test_a_role_without_the_rights_gets_the_statements_a_dba_runs(db_dsn: str) -> None:
    """A role that owns nothing and lacks REPLICATION: refused, naming what it needs and
    giving the exact SQL, nothing half-created."""
    role = f"r_{uuid.uuid4().hex[:10]}"
    src = LogicalSource(f"sn_{uuid.uuid4().hex[:12]}", "sn_pub_refused")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")
    try:
        dsn = psycopg.conninfo.make_conninfo(db_dsn, user=role, password=f"pw-{role}")
        with psycopg.connect(dsn, autocommit=True) as conn, \
                pytest.raises(LogicalSetupRefused, match=r"ownership of messenger\.") as refused:
            ensure_logical_source(conn, src)
        assert refused.value.statements == setup_statements(src)
        assert 'CREATE PUBLICATION "sn_pub_refused" FOR TABLE messenger.integration_outbox' \
               " WITH (publish = 'insert');" in str(refused.value)
    finally:
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


async def test_a_drain_publishes_every_event_once_in_key_order_without_updating_the_outbox(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """1,000 events over 40 keys, written in transactions of 1 to 20 rows: each reaches
    the topic once, per key in commit order; the outbox sees 0 UPDATEs and 0 DELETEs;
    the slot ends past the last transaction (nothing left to peek)."""
    keys = [f"k{n % 40}" for n in range(1000)]
    ids = await trio.to_thread.run_sync(enqueue_in_transactions, db_dsn, topic, keys)
    before = await trio.to_thread.run_sync(outbox_writes, db_dsn)
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert counts["published"] == 1000 and counts["failed"] == 0
    assert await trio.to_thread.run_sync(outbox_writes, db_dsn) == before
    messages = await read(kafka_server, topic, expect=1000)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    seen = [by_event[m.headers["event-id"]] for m in messages]
    assert sorted(seen) == ids, "every event exactly once"
    per_key: dict[str, list[int]] = defaultdict(list)
    for m, outbox_id in zip(messages, seen, strict=True):
        per_key[m.key or ""].append(outbox_id)
    assert all(v == sorted(v) for v in per_key.values()), "per-key order"
    assert await trio.to_thread.run_sync(peek, db_dsn, source) == []


def enqueue_in_transactions(dsn: str, topic: str, keys: list[str],
                            durable: bool = False) -> list[int]:
    """Outbox rows in transactions of 1, 2, ... 20 rows (commit order = id order);
    *durable*: committed with synchronous_commit on (the test server's default is off),
    so the WAL is flushed and a stream sends them at once."""
    ids: list[int] = []
    size, start = 1, 0
    with psycopg.connect(dsn) as conn:
        if durable:
            conn.execute("SET synchronous_commit = on")
            conn.commit()
        while start < len(keys):
            for key in keys[start:start + size]:
                dedupe = str(uuid.uuid4())
                row = conn.execute(
                    "INSERT INTO messenger.integration_outbox (topic, message_key,"
                    " dedupe_key, event_type, payload, headers) VALUES (%s, %s, %s, 'Test',"
                    " %s, %s) RETURNING id",
                    (topic, key, dedupe, json.dumps({"Key": key}),
                     json.dumps({"event-id": event_id(topic, dedupe)}))).fetchone()
                assert row is not None
                ids.append(int(row[0]))
            conn.commit()
            start, size = start + size, size % 20 + 1
    return ids


async def test_per_key_order_is_commit_order_when_ids_commit_out_of_order(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """A row of key k with a lower id commits after a row of k with a higher id: the
    logical source publishes them in commit order (the table source's order is ids)."""
    early = psycopg.connect(db_dsn)
    try:
        low = early.execute("INSERT INTO messenger.integration_outbox (topic, message_key,"
                            " dedupe_key, event_type, payload) VALUES (%s, 'k', 'low',"
                            " 'Test', '{}') RETURNING id", (topic,)).fetchone()
        (high,) = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["k"])
        early.commit()
    finally:
        early.close()
    assert low is not None and int(low[0]) < high
    await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    messages = await read(kafka_server, topic, expect=2)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    by_event[event_id(topic, "low")] = int(low[0])
    assert [by_event[m.headers["event-id"]] for m in messages] == [high, int(low[0])]


async def test_kafka_failing_mid_drain_loses_nothing_and_the_slot_never_passes_an_unacked_event(
        db_dsn: str, tmp_path: Any, source: LogicalSource, topic: str) -> None:
    """Every connection to the broker goes through the fault proxy; mid-drain it goes
    down. The slot's confirmed position then never passes an event missing from the
    topic; once the broker is back, every event is on it (duplicates allowed)."""
    port = free_ports(1)[0]
    kafka = KafkaServer(tmp_path, advertised_port=port)
    await trio.to_thread.run_sync(kafka.start)
    try:
        proxy = FaultProxy("127.0.0.1", kafka.port)
        proxy.port = port
        async with trio.open_nursery() as nursery:
            await nursery.start(proxy.serve)
            await _drain_through_outage(db_dsn, kafka, proxy, source, topic)
            nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(kafka.stop)


async def _drain_through_outage(db_dsn: str, kafka: KafkaServer, proxy: FaultProxy,
                                src: LogicalSource, topic: str) -> None:
    ids = await trio.to_thread.run_sync(enqueue, db_dsn, topic,
                                        [f"k{n % 25}" for n in range(3000)], 100)
    cfg = logical_cfg(db_dsn, f"127.0.0.1:{proxy.port}", src, batch_size=50)
    start = await trio.to_thread.run_sync(confirmed_lsn, db_dsn, src)
    async with open_resources(cfg) as res:
        job = relay_job(res)

        async def cut_when_started() -> None:
            await trio.to_thread.run_sync(
                wait_until, lambda: confirmed_lsn(db_dsn, src) != start, 30,
                "the slot to move", 0.005)
            proxy.down = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_when_started)
            await run_relay_cycle(job, CycleContext("outbox-relay", "t1"))
            nursery.cancel_scope.cancel()
        assert proxy.down, "the outage came mid-drain"
        cut = await trio.to_thread.run_sync(peek, db_dsn, src)
        left = [row.id for txn in transactions(cut, 1 << 20) for row in txn.rows]
        assert left, "the drain stopped with events left"
        proxy.down = False
        published = await read(kafka, topic)
        by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
        on_topic = {by_event[m.headers["event-id"]] for m in published}
        passed = [i for i in ids if i not in set(left)]
        assert set(passed) <= on_topic, "the slot passed only acknowledged events"
        job.state.kafka_retry_at = 0.0
        while await trio.to_thread.run_sync(peek, db_dsn, src):
            job.state.kafka_retry_at = 0.0
            await run_relay_cycle(job, CycleContext("outbox-relay", "t2"))
    published = await read(kafka, topic)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert {by_event[m.headers["event-id"]] for m in published} == set(ids)


async def test_a_restart_resumes_from_the_slots_confirmed_position(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """A relay publishes 300 events and stops; 200 more are written; a new relay (fresh
    memory) publishes only those 200: nothing before the slot's position again."""
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, [f"k{n % 7}" for n in range(300)])
    cfg = logical_cfg(db_dsn, kafka_server, source)
    assert (await run_once(cfg, "outbox-relay"))["published"] == 300
    later = await trio.to_thread.run_sync(enqueue, db_dsn, topic,
                                          [f"k{n % 7}" for n in range(200)])
    assert (await run_once(cfg, "outbox-relay"))["published"] == 200
    messages = await read(kafka_server, topic, expect=500)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    ids = [by_event[m.headers["event-id"]] for m in messages]
    assert len(ids) == len(set(ids)) == 500
    assert set(later) <= set(ids)


async def test_a_fenced_leaders_acknowledgements_never_move_the_slot(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """A cycle under a term that is not the live one publishes (Kafka has the events) but
    its advance is refused by the fence: the slot stays where it was (the next leader
    sends them again: at least once)."""
    await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a", "b", "c"])
    start = await trio.to_thread.run_sync(confirmed_lsn, db_dsn, source)
    async with open_resources(logical_cfg(db_dsn, kafka_server, source)) as res:
        job = relay_job(res)
        ctx = attrs.evolve(CycleContext("outbox-relay", "t"), fence=Fence("outbox-relay", 99))
        with pytest.RaisesGroup(pytest.RaisesExc(LeaseLost), flatten_subgroups=True):
            await run_relay_cycle(job, ctx)
    assert await trio.to_thread.run_sync(confirmed_lsn, db_dsn, source) == start
    assert len(await trio.to_thread.run_sync(peek, db_dsn, source)) > 0


async def test_a_malformed_event_is_dead_lettered_and_the_later_events_of_its_key_are_held(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str) -> None:
    """A payload that is not a JSON object is dead-lettered (blocking its key: a later
    event of the key waits in the table); the later event is never published, the other
    key's is; the slot passes all of them; the writes to the outbox are the dead
    letter's mark and the held event's (actors/outbox/held.py)."""
    bad = await trio.to_thread.run_sync(insert_raw, db_dsn, topic, "a", "[1]", "{}")
    (later,) = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["a"])
    (other,) = await trio.to_thread.run_sync(enqueue, db_dsn, topic, ["b"])
    before = await trio.to_thread.run_sync(outbox_writes, db_dsn)
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert counts["published"] == 1 and counts["failed"] == 1
    messages = await read(kafka_server, topic)
    by_event = await trio.to_thread.run_sync(outbox_by_event_id, db_dsn)
    assert [by_event[m.headers["event-id"]] for m in messages] == [other]
    letters = await trio.to_thread.run_sync(dead_letters, db_dsn)
    assert {k: v["blocks_key"] for k, v in letters.items()} == {bad: True}
    assert later not in letters
    assert await trio.to_thread.run_sync(peek, db_dsn, source) == []
    updates, deletes = await trio.to_thread.run_sync(outbox_writes, db_dsn)
    assert (updates - before[0], deletes - before[1]) == (2, 0)


def test_the_slot_builds_each_message_as_the_claim_does(
        db_dsn: str, source: LogicalSource, topic: str) -> None:
    """For rows of every shape the table source's test knows (good, malformed, JSON null
    headers, own defaults, non-ASCII), the rows decoded from the slot are the claim's."""
    ids = [insert_raw(db_dsn, topic, f"k{n}", payload, headers)
           for n, (payload, headers) in enumerate(CLAIM_CASES)]
    decoded = [row for txn in transactions(peek(db_dsn, source), 1 << 20) for row in txn.rows]
    with psycopg.connect(db_dsn, autocommit=True) as conn, conn.transaction():
        claimed = claim_batch(conn, 100, (), ids[0] - 1).rows
    assert [row.id for row in decoded] == ids
    assert [type(d) for d in decoded] == [type(c) for c in claimed]
    for got, want in zip(decoded, claimed, strict=True):
        assert got == want


def restart_lsn(dsn: str, src: LogicalSource) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT restart_lsn - '0/0'::pg_lsn FROM pg_replication_slots"
                           " WHERE slot_name = %s", (src.slot,)).fetchone()
    assert row is not None
    return int(row[0])


async def test_the_slots_restart_position_follows_the_relay_when_it_may_log_snapshots(
        db_dsn: str, kafka_server: KafkaServer, source: LogicalSource, topic: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A peek and a move decode from the slot's restart position, which moves only past a
    running-transactions record the slot has read: a relay that may log one (here a
    superuser, at every move) leaves the restart position past the events it relayed,
    where the background writer's record (every 15 s) would have left it before them."""
    monkeypatch.setattr(slot_cycle, "SNAPSHOT_EVERY", 0.0)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        before = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
                              ).fetchone()[0]  # type: ignore[index]
    await trio.to_thread.run_sync(enqueue_in_transactions, db_dsn, topic,
                                  [f"k{n % 9}" for n in range(300)])
    counts = await run_once(logical_cfg(db_dsn, kafka_server, source), "outbox-relay")
    assert counts["published"] == 300
    assert restart_lsn(db_dsn, source) > int(before)


def test_a_role_that_may_not_log_snapshots_is_told_and_its_transaction_goes_on(
        db_dsn: str) -> None:
    """Without EXECUTE on pg_log_standby_snapshot the relay learns it may not (and reads
    on, with the background writer's records only): the refusal is a None, not an
    aborted transaction."""
    _, role_dsn = new_role(db_dsn, "sn_nosnap")
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        assert may_snapshot(conn) is True  # the test server's superuser
    with psycopg.connect(role_dsn) as conn, conn.transaction():
        assert may_snapshot(conn) is False
        assert log_snapshot(conn) is None
        assert conn.execute("SELECT 1").fetchone() == (1,)
