"""The rows, the sources and the clocks of ``bench/outbox_relay.py`` (not a benchmark itself).

* :class:`Workload` — the outbox rows of one drain (keys, ~600-byte JSON payloads, the
  headers a committer writes) and :func:`insert_rows`, which commits them in one of two
  shapes: ``copy`` (one COPY, one transaction) or ``small`` (the messenger's shape: groups
  of 1 to 5 rows, one transaction each, pipelined on one connection);
* :func:`reset_source` — an empty outbox and the relay's source switched for the next
  drain without a hand-over: the slot moved to the WAL's end, the source recorded;
* :func:`aiokafka_ceiling`, :func:`ack_floor` — aiokafka alone, the relay's settings;
* :func:`check_landed` — every row on the topic exactly once, each key's rows in order;
* :func:`write_paced` / :class:`AckStamps` — the two ends of the commit-to-ack latency on
  one clock (``time.time()``): writers stamp each event's commit as it returns, and the
  relay's producer stamps each event's acknowledgement as ``send_wave`` returns it,
  both keyed by the event's ``event-id`` header.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import json
import multiprocessing
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import trio

from actors.envelope import event_header_fields, event_headers
from actors.kafka.producer import KafkaProducer, OutMessage, SendResult
from actors.outbox.handover import write_source
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.slot_io import advance_slot, wal_mark
from bench._measure import percentile
from supervision.app.settings import Config, config_from_dict
from supervision.db.migrate import install_demo
from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from supervision.logs import configure_logging
from tests.messenger import read_topic

EVENT_TYPE = "CallRecordingAvailable"
SOURCE = "safetynet.recording-finalize"
PRODUCER_SETTINGS: dict[str, Any] = {  # as actors/kafka/producer.py's KafkaProducer._start
    "acks": "all", "enable_idempotence": False, "compression_type": None, "linger_ms": 0,
    "request_timeout_ms": 10_000, "max_request_size": 1_048_576, "max_batch_size": 256 * 1024,
}
COLUMNS = "(topic, message_key, dedupe_key, event_type, payload, headers)"
COPY = f"COPY messenger.integration_outbox {COLUMNS} FROM STDIN"
INSERT = ("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
          " event_type, payload, headers) VALUES (%s, %s, %s, %s, %s, %s)")
SHAPES = ("copy", "small")
SMALL_TXN_ROWS = (1, 5)  # the small shape: rows per transaction, drawn uniformly

# an outbox row as written: (topic, key, dedupe key, event type, payload JSON, headers JSON)
OutboxRow = tuple[str, str, str, str, str, str]


class Workload:
    """The rows of one topic: keys, compact JSON payloads of ~600 bytes, headers."""

    def __init__(self, rows: int, keys: int, seed: int = 6) -> None:
        rng = random.Random(seed)
        self.keys = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(keys)]
        self.rows: list[tuple[str, str, dict[str, Any]]] = []  # (key, dedupe key, payload)
        base = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
        for _ in range(rows):
            key = rng.choice(self.keys)
            rid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
            started = base + dt.timedelta(seconds=rng.randrange(10**6))
            payload: dict[str, Any] = {
                "RecordingId": rid, "SessionKind": "Direct", "SessionId": key,
                "ChatId": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "DealId": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "TenantId": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                "MediaType": "Audio", "FileId": f"call-recordings/{rid}", "Format": "Ogg",
                "DurationSeconds": rng.randrange(5, 3600), "SizeBytes": rng.randrange(10**7),
                "Trigger": "Manual", "StartedAt": _iso(started),
                "EndedAt": _iso(started + dt.timedelta(minutes=30)),
                "AvailableAt": _iso(started + dt.timedelta(minutes=31)),
                "Title": "",
            }
            payload["Title"] = "r" * max(0, 600 - len(compact(payload)))
            self.rows.append((key, rid, payload))
        low, high = SMALL_TXN_ROWS
        self.groups: list[int] = []  # the small shape's transaction sizes
        while sum(self.groups) < rows:
            self.groups.append(min(rng.randint(low, high), rows - sum(self.groups)))

    def value_bytes(self) -> float:
        return statistics.mean(len(compact(p)) for _, _, p in self.rows)

    def messages(self, topic: str, run_id: str) -> list[tuple[bytes, bytes, list[Any]]]:
        """(key, value, headers) as the relay sends them."""
        out = []
        for key, dedupe, payload in self.rows:
            headers = json.loads(event_headers(topic, dedupe, EVENT_TYPE, run_id, SOURCE))
            out.append((key.encode(), compact(payload).encode(),
                        [(k, str(v).encode()) for k, v in headers.items()]))
        return out

    def insert(self, dsn: str, topic: str, run_id: str) -> None:
        """An empty outbox, then the rows for *topic* in one COPY (the other relay
        benches' drain)."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE messenger.integration_outbox,"
                         " safetynet.outbox_dead_letters")
            insert_rows(conn, self.outbox_rows(topic, run_id), "copy", self.groups)

    def outbox_rows(self, topic: str, run_id: str) -> list[OutboxRow]:
        return [(topic, key, dedupe, EVENT_TYPE, json.dumps(payload),
                 event_headers(topic, dedupe, EVENT_TYPE, run_id, SOURCE))
                for key, dedupe, payload in self.rows]


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def compact(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def make_config(dsn: str, kafka: KafkaServer, source: str = "table") -> Config:
    return config_from_dict({
        "postgres": {"dsn": dsn},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "client_id": "bench-relay"},
        "outbox_relay": {"batch_size": 500, "poll_interval": "1s", "source": source},
    })


# ------------------------------------------------------------------------------ outbox


def reset_source(conn: psycopg.Connection[Any], source: str,
                 logical: LogicalSource | None) -> None:
    """Empty the outbox and make *source* the relay's, with nothing to hand over: for the
    logical source the slot moves to the WAL's current end first (the rows of the drains
    before are never read again), and the source is recorded as the one that relayed
    last (``source = None``: the relay before the split, whose schema has no record)."""
    conn.execute("TRUNCATE messenger.integration_outbox, safetynet.outbox_dead_letters")
    if source == "logical":
        assert logical is not None
        _slot_released(conn, logical.slot)
        advance_slot(conn, logical, wal_mark(conn)[0])
        write_source(conn, "logical", None)
    elif source == "table":
        write_source(conn, "table", None)


def _slot_released(conn: psycopg.Connection[Any], slot: str, limit_s: float = 10.0) -> None:
    """Wait until no session holds *slot* (a relay's stream of the run before may take a
    moment to end); a slot still held then fails the advance, naming it."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                           (slot,)).fetchone()
        if row is None or not row[0]:
            return
        time.sleep(0.05)


def insert_rows(conn: psycopg.Connection[Any], rows: Sequence[OutboxRow], shape: str,
                groups: Sequence[int]) -> None:
    """Commit *rows* on an autocommit connection in *shape*: ``copy`` one COPY (one
    transaction); ``small`` one transaction per group of *groups* rows, pipelined. The
    commits are durable (``synchronous_commit = on``, PostgreSQL's default and the
    messenger's; the test server's is off): a walsender sends only flushed WAL."""
    conn.execute("SET synchronous_commit = on")
    if shape == "copy":
        with conn.cursor() as cur, cur.copy(COPY) as copy:
            for row in rows:
                copy.write_row(row)
    else:
        first = 0
        with conn.pipeline(), conn.cursor() as cur:
            for size in groups:
                with conn.transaction():
                    cur.executemany(INSERT, rows[first:first + size])
                first += size
    conn.execute("VACUUM ANALYZE messenger.integration_outbox")


def published(dsn: str, topic: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM messenger.integration_outbox"
                           " WHERE topic = %s AND published_at IS NOT NULL", (topic,)).fetchone()
    assert row is not None
    return int(row[0])


def check_landed(kafka: KafkaServer, topic: str, work: Workload) -> None:
    """Every row is on the topic exactly once, each key's rows in id order.

    (Read back, not from end offsets: Tansu's ListOffsets answers the last batch's base
    offset + 1, not the high watermark.)"""
    messages = read_topic(kafka.bootstrap_servers, topic, expect=len(work.rows), timeout=60)
    got: dict[str, list[str]] = {}
    for m in sorted(messages, key=lambda m: (m.partition, m.offset)):
        assert m.key is not None
        got.setdefault(m.key, []).append(m.value["RecordingId"])
    want: dict[str, list[str]] = {}
    for key, dedupe, _ in work.rows:
        want.setdefault(key, []).append(dedupe)
    assert len(messages) == len(work.rows) and got == want, (topic, len(messages),
                                                             len(work.rows))


# ------------------------------------------------------------------------------ aiokafka


def aiokafka_ceiling(bootstrap: str, topic: str,
                     messages: list[tuple[bytes, bytes, list[Any]]]) -> tuple[float, float]:
    """(seconds start-to-stop, seconds first send to last ack) with aiokafka alone."""
    from aiokafka import AIOKafkaProducer

    async def produce() -> tuple[float, float]:
        t0 = time.perf_counter()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="bench-ceiling",
                                    **PRODUCER_SETTINGS)
        await producer.start()
        try:
            t1 = time.perf_counter()
            futures = [await producer.send(topic, value, key=key, headers=headers)
                       for key, value, headers in messages]
            await asyncio.gather(*futures)
            t2 = time.perf_counter()
        finally:
            await producer.stop()
        return time.perf_counter() - t0, t2 - t1

    return asyncio.run(produce())


def ack_floor(bootstrap: str, topic: str, sizes: tuple[int, ...] = (1, 25, 200),
              repeats: int = 60) -> dict[int, tuple[float, float]]:
    """aiokafka alone, the relay's producer settings: *repeats* sends of n messages (600
    bytes, distinct keys) each awaited before the next; (p50, p90) ms per n."""
    from aiokafka import AIOKafkaProducer

    async def measure() -> dict[int, tuple[float, float]]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, client_id="bench-ack",
                                    **PRODUCER_SETTINGS)
        await producer.start()
        try:
            out = {}
            for n in sizes:
                times = []
                for i in range(repeats):
                    t = time.perf_counter()
                    futures = [await producer.send(topic, b"x" * 600, key=f"{i}-{j}".encode())
                               for j in range(n)]
                    await asyncio.gather(*futures)
                    times.append(1000 * (time.perf_counter() - t))
                out[n] = (percentile(times, 0.5), percentile(times, 0.9))
            return out
        finally:
            await producer.stop()

    return asyncio.run(measure())


# ------------------------------------------------------------------------------ latency


def trickle_rows(work: Workload, topic: str, count: int) -> list[tuple[OutboxRow, str]]:
    """The first *count* rows for *topic*, each with its ``event-id``."""
    run_id = str(uuid.uuid4())
    out = []
    for key, dedupe, payload in work.rows[:count]:
        fields = event_header_fields(topic, dedupe, EVENT_TYPE, run_id, SOURCE)
        out.append(((topic, key, dedupe, EVENT_TYPE, json.dumps(payload), json.dumps(fields)),
                    str(fields["event-id"])))
    return out


def write_paced(dsn: str, rows: list[tuple[OutboxRow, str]], rate: float, writers: int,
                per_txn: int) -> tuple[list[tuple[str, float]], float]:
    """Commit *rows*, *per_txn* to a transaction, at *rate* rows per second in all, over
    *writers* connections (transaction t on connection t mod writers, due at t * per_txn
    / rate); ``(event id, time.time() right after its commit returned)`` per row, and the
    rate reached (lower when commits take longer than the pace allows)."""
    txns = [rows[i:i + per_txn] for i in range(0, len(rows), per_txn)]
    stamps: list[list[tuple[str, float]]] = [[] for _ in range(writers)]
    started = time.perf_counter()

    def write(first: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = on")  # as insert_rows: durable commits
            for t in range(first, len(txns), writers):
                delay = started + t * per_txn / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                if per_txn == 1:
                    conn.execute(INSERT, txns[t][0][0])
                else:
                    with conn.transaction(), conn.cursor() as cur:
                        cur.executemany(INSERT, [row for row, _ in txns[t]])
                now = time.time()
                stamps[first].extend((event, now) for _, event in txns[t])

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reached = len(rows) / (time.perf_counter() - started)
    return [s for per_writer in stamps for s in per_writer], reached


def write_paced_elsewhere(dsn: str, rows: list[tuple[OutboxRow, str]], rate: float,
                          writers: int, per_txn: int) -> tuple[list[tuple[str, float]], float]:
    """:func:`write_paced` in a spawned process: the writers' Python does not take the
    GIL from the relay under test (in-process, four writer threads reached only ~1,100
    of 2,000 commits/s and slowed the relay they measured)."""
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        return pool.submit(write_paced, dsn, rows, rate, writers, per_txn).result()


class AckStamps:
    """Wraps a started-on-demand :class:`KafkaProducer` in place: ``at[event id]`` is
    ``time.time()`` when ``send_wave`` returned the event's first acknowledgement to the
    relay (on the Trio side, after the crossing back from asyncio); ``repeated`` counts
    acknowledgements of events acknowledged before."""

    def __init__(self, producer: KafkaProducer) -> None:
        self.at: dict[str, float] = {}
        self.repeated = 0
        self._answered = trio.Event()
        send = producer.send_wave

        async def stamped(messages: Sequence[OutMessage]) -> list[SendResult]:
            messages = list(messages)
            results = await send(messages)
            now = time.time()
            events = {m.outbox_id: dict(m.headers).get("event-id", b"") for m in messages}
            for result in results:
                if result.ok:
                    event = events[result.outbox_id].decode()
                    if event in self.at:
                        self.repeated += 1
                    else:
                        self.at[event] = now
            self._answered.set()
            self._answered = trio.Event()
            return results

        setattr(producer, "send_wave", stamped)  # noqa: B010 (an instance attribute)

    async def wait_for(self, count: int, limit: float) -> None:
        """Until *count* events are acknowledged (TooSlowError after *limit* seconds)."""
        with trio.fail_after(limit):
            while len(self.at) < count:
                await self._answered.wait()


V = TypeVar("V")
Drain = Callable[[PostgresServer, KafkaServer, Workload, V, str], float]


def alternate_drains(prefix: str, rows: int, keys: int, rounds: int,
                     variants: Sequence[V], name: Callable[[V], str],
                     label: Callable[[V], str], drain: Drain[V]) -> dict[V, list[float]]:
    """The shape of the one-question relay benches (``outbox_acks``, ``outbox_burst``):
    their own PostgreSQL and Tansu in a temp dir (always stopped), the demo schema, one
    workload; per round, ``drain(pg, kafka, work, variant, topic)`` for every variant in
    turn, each on a fresh topic, printed as it goes; the events/s of each variant."""
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))
    pg, kafka = PostgresServer(base_dir), KafkaServer(base_dir)
    try:
        start_all([pg, kafka])
        install_demo(pg.dsn)
        work = Workload(rows, keys)
        tag = uuid.uuid4().hex[:8]
        rates: dict[V, list[float]] = {v: [] for v in variants}
        print(f"rows={rows} keys={keys} rounds={rounds} {os.cpu_count()} CPUs,"
              f" load {os.getloadavg()[0]:.2f}")
        for n in range(rounds):
            for variant in variants:
                seconds = drain(pg, kafka, work, variant,
                                f"bench.{prefix}.{tag}.{name(variant)}{n}")
                rates[variant].append(rows / seconds)
                print(f"round {n + 1} {label(variant)} {seconds:6.2f} s"
                      f" {rows / seconds:8.0f} events/s  load {os.getloadavg()[0]:.2f}",
                      flush=True)
        return rates
    finally:
        stop_all([pg, kafka])
        shutil.rmtree(base_dir, ignore_errors=True)
