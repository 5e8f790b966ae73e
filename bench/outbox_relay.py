"""How fast does the outbox relay publish, against aiokafka alone, and how quickly? (issue 6)

A benchmark (not a test). Each round writes ``--rows`` outbox rows (COPY; ~600-byte JSON
payloads shaped like CallRecordingAvailable, ``--keys`` message keys drawn at random, the
headers a committer writes) to a fresh topic (``--partitions``, created up front), then:

  relay     ``run_once(cfg, Job.OUTBOX_RELAY)`` end to end, as ``safetynet run-once`` does:
            bridge, pool, producer start, advisory lock, cycles (claim 500 rows in id
            order, waves of at most one row per key, mark published) until nothing is
            left; JSON logs rendered to /dev/null as in the daemon.
  ceiling   aiokafka alone under plain ``asyncio.run`` (no database, no Trio): the same
            messages (keys, values, headers) to another fresh topic with the relay's
            producer settings (acks="all", no idempotence, no compression, linger 0,
            256 KiB batches), every send issued at once then every ack awaited; start and
            stop included, as in the relay's figure. Measured right before and right after
            the relay; the ratio uses their mean (target >= 0.8, issue 15).

The relay's topic is read back: every row landed once, each key's rows in id order. Then,
once:

  latency   the relay as in the daemon (``serve_outbox_listener`` + ``serve_lock_keeper(
            relay_locked_job(res), dsn)``, woken by LISTEN/NOTIFY), while
            ``--writers`` connections (4, in a process of their own, spawned, so their
            Python does not take the relay's GIL) commit ``--trickle`` single-row INSERT
            transactions at ``--rate`` per second in all (default 6,000 at 2,000/s;
            after 5 warm-up rows, not counted; the rate reached is printed). Latency per
            event is ``published_at - created_at`` on the database clock: ``created_at`` is
            the INSERT's transaction start (autocommit: ~0.1 ms before its commit) and
            ``published_at`` the start of the relay's marking transaction, which begins
            right after the broker acknowledged — so it is commit-to-ack plus one thread
            crossing and a pool checkout (an upper bound). Target p99 < 50 ms.
  ack floor aiokafka alone with the same settings, idle: the broker's ack of one send of
            1, 25 and 200 messages (p50, p90): waves are sent one after the other, so an
            event of a trickle waits about two of them, plus its claim and its mark.

and, unless ``--profile none``, two more drains of the same rows (reported, not timed
against anything): every database call and every wave timed on both sides of its
crossing (``run_relay_cycle`` in a loop, like run-once), and py-spy samples of the thread
holding the GIL (where the Python CPU goes) when py-spy is installed (``pip install
py-spy``).

It starts its own PostgreSQL and Tansu (``supervision.dev.stack``, in a temp dir) and
always stops them. Run:

    .venv/bin/python bench/outbox_relay.py [--rows 20000] [--rounds 3] [--source logical]

With ``--source logical`` the relay reads the rows from a logical replication slot
(issue 37; the publication and slot are created first); the latency and the profile are
measured for the table source only (they read ``published_at``).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import datetime as dt
import gc
import json
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.envelope import event_headers
from actors.kafka.producer import KafkaProducer, OutMessage
from actors.leases.lock_keeper import CycleContext, serve_lock_keeper
from actors.outbox.handover import write_source
from actors.outbox.listener import serve_outbox_listener
from actors.outbox.logical import source_of
from actors.outbox.logical_setup import ensure_logical_source
from actors.outbox.relay import RelayJob, run_relay_cycle
from bench._measure import (
    CpuMeter,
    TimedDatabase,
    percentile,
    py_spy,
    py_spy_available,
    py_spy_report,
    spread,
)
from supervision.app.daemon import open_resources, run_once
from supervision.app.settings import Config, config_from_dict
from supervision.app.tree import relay_locked_job
from supervision.db.migrate import install_demo
from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from supervision.jobs import Job
from supervision.logs import configure_logging
from supervision.tree.bridge import run_asyncio
from tests.messenger import read_topic

EVENT_TYPE = "CallRecordingAvailable"
SOURCE = "safetynet.recording-finalize"
PRODUCER_SETTINGS: dict[str, Any] = {  # as actors/kafka/producer.py's KafkaProducer._start
    "acks": "all", "enable_idempotence": False, "compression_type": None, "linger_ms": 0,
    "request_timeout_ms": 10_000, "max_request_size": 1_048_576, "max_batch_size": 256 * 1024,
}
COPY = ("COPY messenger.integration_outbox (topic, message_key, dedupe_key, event_type,"
        " payload, headers) FROM STDIN")


# ------------------------------------------------------------------------------ rows


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
            payload["Title"] = "r" * max(0, 600 - len(_compact(payload)))
            self.rows.append((key, rid, payload))

    def value_bytes(self) -> float:
        return statistics.mean(len(_compact(p)) for _, _, p in self.rows)

    def messages(self, topic: str, run_id: str) -> list[tuple[bytes, bytes, list[Any]]]:
        """(key, value, headers) as the relay sends them."""
        out = []
        for key, dedupe, payload in self.rows:
            headers = json.loads(event_headers(topic, dedupe, EVENT_TYPE, run_id, SOURCE))
            out.append((key.encode(), _compact(payload).encode(),
                        [(k, str(v).encode()) for k, v in headers.items()]))
        return out

    def insert(self, dsn: str, topic: str, run_id: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE messenger.integration_outbox,"
                         " safetynet.outbox_dead_letters")
            with conn.cursor() as cur, cur.copy(COPY) as copy:
                for key, dedupe, payload in self.rows:
                    copy.write_row((topic, key, dedupe, EVENT_TYPE, json.dumps(payload),
                                    event_headers(topic, dedupe, EVENT_TYPE, run_id, SOURCE)))
            conn.execute("VACUUM ANALYZE messenger.integration_outbox")


def _iso(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _compact(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def make_config(dsn: str, kafka: KafkaServer, source: str = "table") -> Config:
    return config_from_dict({
        "postgres": {"dsn": dsn},
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "client_id": "bench-relay"},
        "outbox_relay": {"batch_size": 500, "poll_interval": "1s", "source": source},
    })


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
    assert len(messages) == len(work.rows) and got == want, (len(messages), len(work.rows))


# ------------------------------------------------------------------------------ ceiling


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
    bytes, distinct keys) each awaited before the next; (p50, p90) ms per n. The broker's
    ack of one wave: a trickle event waits for about two of them (the wave on the wire
    when it is claimed, then its own), plus its claim and the mark."""
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


# ------------------------------------------------------------------------------ relay


def relay_round(cfg: Config, kafka: KafkaServer, servers: dict[str, int | None],
                work: Workload, tag: str, n: int, partitions: int) -> dict[str, Any]:
    dsn = cfg.postgres.dsn.reveal()
    rows = len(work.rows)
    topics = {k: f"bench.outbox-relay.{tag}.{k}{n}" for k in ("before", "relay", "after")}
    for topic in topics.values():
        kafka.create_topic(topic, partitions)
    run_id = str(uuid.uuid4())
    work.insert(dsn, topics["relay"], run_id)
    result: dict[str, Any] = {}
    for k in ("before", "relay", "after"):
        messages = work.messages(topics[k], run_id)
        meter = CpuMeter(servers)
        with meter.measure():
            if k == "relay":
                counts = trio.run(run_once, cfg, Job.OUTBOX_RELAY)
                assert counts["published"] == rows and counts["failed"] == 0, counts
            else:
                _, result[f"{k}_sends_s"] = aiokafka_ceiling(kafka.bootstrap_servers,
                                                             topics[k], messages)
        result[f"{k}_s"] = meter.wall
        result[f"{k}_cpu"] = meter
    check_landed(kafka, topics["relay"], work)
    if cfg.outbox_relay.source == "table":  # the logical source marks nothing published
        assert published(dsn, topics["relay"]) == rows
    ceiling = rows / ((result["before_s"] + result["after_s"]) / 2)
    result.update(rate=rows / result["relay_s"], ceiling=ceiling,
                  ratio=rows / result["relay_s"] / ceiling)
    return result


class TimedProducer:
    """The KafkaProducer, timing each wave inside and outside the asyncio bridge."""

    def __init__(self, producer: KafkaProducer) -> None:
        self._producer = producer
        self.waves: list[int] = []
        self.wall = 0.0  # Trio side: run_asyncio(...) as a whole
        self.inside = 0.0  # asyncio side: the _send_wave coroutine

    @property
    def started(self) -> bool:
        return self._producer.started

    async def start(self) -> None:
        await self._producer.start()

    async def send_wave(self, messages: list[OutMessage]) -> Any:
        inside: list[float] = []

        async def timed(msgs: list[OutMessage]) -> Any:
            t = time.perf_counter()
            try:
                return await self._producer._send_wave(msgs)
            finally:
                inside.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        results = await run_asyncio(timed, list(messages))
        self.wall += time.perf_counter() - t0
        self.inside += inside[0]
        self.waves.append(len(messages))
        return results


async def timed_drain(cfg: Config) -> tuple[float, TimedDatabase, TimedProducer]:
    async with open_resources(cfg) as res:
        db, producer = TimedDatabase(res.db), TimedProducer(res.producer)
        job = RelayJob(cfg.outbox_relay, db, producer, max_run_duration=30.0)  # type: ignore[arg-type]
        await producer.start()
        started = time.perf_counter()
        while (await run_relay_cycle(job, CycleContext(Job.OUTBOX_RELAY, "bench"))).published:
            pass
        return time.perf_counter() - started, db, producer


INCLUSIVE = (
    "run_relay_cycle", "run_claimer", "claim_batch", "parse_claimed", "parse_row",
    "run_publisher", "Window.next_wave", "send_wave", "_send_wave", "AIOKafkaProducer.send",
    "run_marker", "mark_answered", "work", "to_thread_run_sync", "run_asyncio",
    "check_connection", "Transaction.__exit__", "dumps", "event_id", "_sender_routine",
    "_send_produce_req", "_proxy_to_logger",
)


def profile(cfg: Config, kafka: KafkaServer, work: Workload, tag: str, partitions: int,
            base_dir: Path) -> list[str]:
    dsn = cfg.postgres.dsn.reveal()
    rows = len(work.rows)
    lines = [f"\nwhere the time goes, relay drain of {rows} rows (each pass on a fresh topic):"]
    topic = f"bench.outbox-relay.{tag}.timed"
    kafka.create_topic(topic, partitions)
    work.insert(dsn, topic, str(uuid.uuid4()))
    seconds, db, producer = trio.run(timed_drain, cfg)
    assert published(dsn, topic) == rows
    sizes = Counter(min(w, 500) // 100 * 100 for w in producer.waves)
    n = len(producer.waves)
    lines.append(
        f"1) run_relay_cycle in a loop, every call timed ({rows / seconds:.0f} events/s in"
        f" this pass): {n} waves, mean {rows / n:.0f} messages (by size: "
        + ", ".join(f"{k}-{k + 99}: {v}" for k, v in sorted(sizes.items())) + ")")
    lines.append(f"  send_wave: {producer.wall:.2f} s total, {1000 * producer.wall / n:.2f} ms"
                 f"/wave, of which inside asyncio {1000 * producer.inside / n:.2f} ms/wave"
                 f" (bridge crossing {1000 * (producer.wall - producer.inside) / n:.2f}"
                 f" ms/wave); {1000 * producer.wall / rows:.3f} ms/event")
    lines += db.report(rows, "event")
    lines.append(f"  accounted: {producer.wall + sum(s[1] for s in db.stats.values()):.2f} s"
                 f" of {seconds:.2f} s (the rest: waves(), parse_row(), Trio)")
    if not py_spy_available():
        lines.append("2) py-spy not installed (pip install py-spy): no CPU profile")
        return lines
    topic = f"bench.outbox-relay.{tag}.sampled"
    kafka.create_topic(topic, partitions)
    work.insert(dsn, topic, str(uuid.uuid4()))
    with py_spy(base_dir / "py-spy-relay.txt") as raw:
        seconds, _, _ = trio.run(timed_drain, cfg)
    lines.append(f"2) py-spy, samples of the GIL holder ({rows / seconds:.0f} events/s while"
                 " sampled):")
    lines += py_spy_report(raw, rows, "event", inclusive=INCLUSIVE)
    return lines


# ------------------------------------------------------------------------------ latency


def insert_paced(dsn: str, work: Workload, topic: str, count: int, rate: float,
                 writers: int = 1) -> float:
    """Commit *count* single-row INSERTs, one per transaction, at *rate* per second in
    all, spread over *writers* connections (each paced at rate / writers); the rate
    reached (lower when commits take longer than the pace allows)."""
    run_id = str(uuid.uuid4())
    rows = work.rows[:count]
    started = time.perf_counter()

    def write(first: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(first, len(rows), writers):
                key, dedupe, payload = rows[i]
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                conn.execute(
                    "INSERT INTO messenger.integration_outbox (topic, message_key,"
                    " dedupe_key, event_type, payload, headers) VALUES (%s, %s, %s, %s, %s,"
                    " %s)", (topic, key, f"{dedupe}-{topic}", EVENT_TYPE, json.dumps(payload),
                             event_headers(topic, dedupe, EVENT_TYPE, run_id, SOURCE)))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return count / (time.perf_counter() - started)


def insert_paced_elsewhere(dsn: str, work: Workload, topic: str, count: int, rate: float,
                           writers: int) -> float:
    """:func:`insert_paced` in a spawned process: the writers' Python does not take the
    GIL from the relay under test (in-process, four writer threads reached only ~1,100
    of 2,000 commits/s and slowed the relay they measured)."""
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
        return pool.submit(insert_paced, dsn, work, topic, count, rate, writers).result()


async def trickle(cfg: Config, work: Workload, topic: str, count: int,
                  rate: float, writers: int) -> tuple[list[float], float]:
    dsn = cfg.postgres.dsn.reveal()

    async def poll(check: Any, limit: float) -> None:
        """Poll the database (another process's state) until *check* holds."""
        with trio.fail_after(limit):
            while True:
                if await trio.to_thread.run_sync(check):
                    return
                await trio.sleep(0.05)

    async def wait_published(expected: int, limit: float) -> None:
        await poll(lambda: published(dsn, topic) >= expected, limit)

    async with open_resources(cfg) as res, trio.open_nursery() as nursery:
        await nursery.start(serve_outbox_listener, dsn, res.wakeup)
        await nursery.start(serve_lock_keeper, relay_locked_job(res), dsn)
        await poll(lambda: _listening(dsn), 10)
        warm = Workload(5, 5, seed=7)
        await trio.to_thread.run_sync(insert_paced, dsn, warm, topic, 5, 50.0)
        await wait_published(5, 10)
        await trio.sleep(0.5)
        reached = await trio.to_thread.run_sync(insert_paced_elsewhere, dsn, work, topic,
                                                count, rate, writers)
        await wait_published(5 + count, 30)
        nursery.cancel_scope.cancel()
    with psycopg.connect(dsn, autocommit=True) as conn:
        records = conn.execute(
            "SELECT extract(epoch FROM published_at - created_at) FROM"
            " messenger.integration_outbox WHERE topic = %s ORDER BY id OFFSET 5",
            (topic,)).fetchall()
    return [float(r[0]) for r in records], reached


def _listening(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                           " 'safetynet-listen' AND query ILIKE 'LISTEN%%'").fetchone()
    return bool(row and row[0])


# ------------------------------------------------------------------------------ main


def run(pg: PostgresServer, kafka: KafkaServer, args: argparse.Namespace,
        base_dir: Path) -> None:
    install_demo(pg.dsn)
    cfg = make_config(pg.dsn, kafka, args.source)
    if args.source == "logical":
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            ensure_logical_source(conn, source_of(cfg.outbox_relay))
            write_source(conn, "logical", None)  # the outbox is empty: nothing to hand over
    tag = uuid.uuid4().hex[:8]
    work = Workload(args.rows, args.keys)
    gc.freeze()  # as `safetynet run` does at start; the bench's own rows are not the relay's
    servers = {"postgres": pg.pid, "tansu": kafka.pid}
    import aiokafka

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        version = conn.execute("SELECT version()").fetchone()[0].split(" on ")[0]  # type: ignore[index]
    print(f"{version} | Tansu (memory) | aiokafka {aiokafka.__version__} | psycopg"
          f" {psycopg.__version__} | trio {trio.__version__} | {os.cpu_count()} CPUs, load"
          f" {os.getloadavg()[0]:.2f}")
    print(f"rows={args.rows} keys={args.keys} value {work.value_bytes():.0f} B + 5 headers,"
          f" topics bench.outbox-relay.{tag}.* with {args.partitions} partitions,"
          f" batch_size {cfg.outbox_relay.batch_size}, rounds={args.rounds},"
          f" source {args.source}")

    rounds = []
    for n in range(args.rounds):
        rounds.append(relay_round(cfg, kafka, servers, work, tag, n, args.partitions))
        print(f"  round {n + 1} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    latencies: list[float] = []
    reached = 0.0
    if args.source == "table":  # latency from published_at: the table source only
        topic = f"bench.outbox-relay.{tag}.trickle"
        kafka.create_topic(topic, args.partitions)
        latencies, reached = trio.run(trickle, cfg, work, topic, min(args.trickle, args.rows),
                                      args.rate, args.writers)
    floor_topic = f"bench.outbox-relay.{tag}.ack"
    kafka.create_topic(floor_topic, args.partitions)
    floor = ack_floor(kafka.bootstrap_servers, floor_topic)

    print(f"\n{'DRAIN':8}{'relay s':>8}{'events/s':>9}{'aiokafka s before/after':>24}"
          f"{'(sends only)':>14}{'ceiling/s':>10}{'ratio':>6}   CPU ms per event: relay |"
          " aiokafka")
    for n, r in enumerate(rounds, 1):
        print(f"round {n:<2}{r['relay_s']:8.2f}{r['rate']:9.0f}{r['before_s']:14.2f} /"
              f"{r['after_s']:5.2f}{r['before_sends_s']:9.2f} /{r['after_sends_s']:4.2f}"
              f"{r['ceiling']:10.0f}{r['ratio']:6.2f}   "
              f"{r['relay_cpu'].per_item(args.rows, ('python', 'postgres', 'tansu'))} | "
              f"{r['before_cpu'].per_item(args.rows, ('python', 'tansu'))}")
    ratios = [r["ratio"] for r in rounds]
    ok = {True: "ok", False: "MISSED"}
    print(f"\nrelay events/s {spread([r['rate'] for r in rounds])}; aiokafka alone events/s"
          f" {spread([r['ceiling'] for r in rounds])}")
    print(f"ratio (relay/aiokafka) {spread(ratios, '{:.2f}')}"
          f"  target >= 0.8: {ok[statistics.median(ratios) >= 0.8]}")
    if latencies:
        ms = [1000 * x for x in latencies]
        p99 = percentile(ms, 0.99)
        print(f"commit-to-ack latency, {len(ms)} events at {args.rate:.0f}/s (reached"
              f" {reached:.0f}/s; daemon relay, LISTEN/NOTIFY): p50"
              f" {percentile(ms, 0.5):.1f} ms, p90 {percentile(ms, 0.9):.1f} ms,"
              f" p99 {p99:.1f} ms, max {max(ms):.1f} ms  target p99 < 50 ms:"
              f" {ok[p99 < 50]}")
    else:
        print("commit-to-ack latency: not measured in the logical source (it writes no"
              " published_at)")
    print("broker ack of one send of n messages, aiokafka alone, idle (p50 / p90 ms): "
          + ", ".join(f"n={n}: {p50:.1f} / {p90:.1f}" for n, (p50, p90) in floor.items()))
    if args.profile != "none" and args.source == "table":
        print("\n".join(profile(cfg, kafka, work, tag, args.partitions, base_dir)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="outbox rows (default 20000)")
    parser.add_argument("--keys", type=int, default=1000, help="message keys (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--partitions", type=int, default=3, help="per topic (default 3)")
    parser.add_argument("--trickle", type=int, default=6000,
                        help="latency events (default 6000)")
    parser.add_argument("--rate", type=float, default=2000.0, help="latency events/s (2000)")
    parser.add_argument("--writers", type=int, default=4,
                        help="connections committing the trickle (default 4)")
    parser.add_argument("--profile", choices=("relay", "none"), default="relay")
    parser.add_argument("--source", choices=("table", "logical"), default="table",
                        help="the relay's source (logical: a slot through pgoutput)")
    args = parser.parse_args()
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix="bench-relay-"))
    servers = [PostgresServer(base_dir), KafkaServer(base_dir)]
    try:
        start_all(servers)
        run(servers[0], servers[1], args, base_dir)  # type: ignore[arg-type]
    finally:
        stop_all(servers)
        shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
