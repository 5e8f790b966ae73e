"""How fast does the outbox relay publish from each source, against aiokafka alone, and how
quickly? (issues 6 and 37)

A benchmark (not a test). It starts its own PostgreSQL (``wal_level = logical``) and Tansu
(``supervision.dev.stack``, in a temp dir) and always stops them. Run:

    .venv/bin/python bench/outbox_relay.py [--rows 20000] [--rounds 3]
        [--sources table,logical] [--shapes copy,small] [--rates 2000,10000]
        [--before-split] [--profile none]

The rows: ``--rows`` outbox rows (~600-byte JSON payloads shaped like
CallRecordingAvailable, ``--keys`` message keys drawn at random, the headers a committer
writes; ``bench/_relay_workload.py``), committed before each timed drain in one of two
shapes (``--shapes``): ``copy``, one COPY (one transaction), and ``small``, the
messenger's shape: groups of 1 to 5 rows, one transaction each, pipelined on one connection.

**Drains, alternating** (each round, each shape; every drain on a fresh topic of
``--partitions`` partitions):

  aiokafka  the ceiling: aiokafka alone under plain ``asyncio.run`` (no database, no
            Trio), the same messages (keys, values, headers) with the relay's producer
            settings (acks="all", no idempotence, no compression, linger 0, 256 KiB
            batches), every send issued at once then every ack awaited; start and stop
            included, as in the relay's figure. Measured first and last in the round; a
            source's ratio is to the mean of the two, taken within a minute or two.
  table     ``run_once(cfg, Job.OUTBOX_RELAY)`` end to end, as ``safetynet run-once``
  logical   does (bridge, pool, producer start, advisory lock, cycles until nothing is
            left; JSON logs to /dev/null as in the daemon), with ``[outbox_relay]
            source`` set: claim, wave, mark (``table``), or read the slot through
            pgoutput, wave, advance the slot (``logical``).
  before-split  (``--before-split``) the relay before the pipeline split, its own code
            (an export of 46b2891's parent, in a subprocess, against a database of its
            own on the same server: ``bench/_relay_before.py`` says how).

The sources run in between the two aiokafka drains, their order rotated by one each
round. Before each drain the outbox is emptied and the rows written again; the source is
switched without a hand-over: the publication and the slot are set up once, and before a
logical drain the slot is moved to the WAL's end (the earlier drains' rows are never read
again) and the source recorded, as before a table drain (``reset_source``). Every drain's
topic is read back: every row landed exactly once, each key's rows in id order, and the
relay's counts say it published exactly the rows (nothing re-read or re-published).
CPU per event: this process (``python``; the subprocess's own for the relay before the
split) and the PostgreSQL server's process tree (:class:`~bench._measure.CpuMeter`).
Each interval starts once the server has reaped the backends of the sessions that wrote
the rows and no autovacuum worker runs, and ends once it has reaped the relay's, so CPU
is charged where it was spent. What a drain leaves behind is charged to it, and nothing
else: autovacuum is off on the outbox (in both databases), the rows are written,
vacuumed and checkpointed before the drain (untimed), and after it a ``VACUUM`` of the
outbox and a ``CHECKPOINT`` are timed, their PostgreSQL CPU shown as ``+after`` (the dead
row versions and dirty pages the table source's marks leave). Targets (issue 37):
logical >= 0.9 of aiokafka alone; table >= 0.8 and not below the relay before the split;
PostgreSQL CPU per event of logical <= 1/3 of table's (drain and what it leaves behind
together; the drains alone are printed beside). The medians of each source are printed
per shape, with each round's figures under them.

**Commit-to-ack latency**, then, for each source at each rate of ``--rates`` (default
``--rate``, 2,000/s): the relay as in the daemon (``serve_outbox_listener`` +
``serve_lock_keeper(relay_locked_job(res), dsn)``, woken by LISTEN/NOTIFY, ``source`` set
per run), while ``--writers`` connections (4, threads of one spawned process, so their
Python does not take the relay's GIL) commit ``--trickle`` events at 2,000/s (the same
duration at other rates: 3 s by default) after 5 warm-up events (not counted). Up to
2,500/s each event is its own transaction; above, ``ceil(rate / 2000)`` rows share one
(``--txn-rows``), so the writers can keep the pace on two cores. Both ends are stamped on
this machine's clock (``time.time()``): each writer right after its COMMIT returned (an
event's commit time is its transaction's), and the relay's producer, wrapped in place,
when ``send_wave`` returned the event's acknowledgement to the relay (after the crossing
back into Trio), keyed by the event's ``event-id`` header (``AckStamps``). Latency = ack
- commit, per event; p50/p90/p99/max and the rate the writers reached are printed.
Targets: p99 < 25 ms at 2,000/s, < 100 ms at 10,000/s. Then the ack floor: aiokafka alone,
idle, the broker's ack of one send of 1, 25 and 200 messages (p50, p90).

Unless ``--profile none``, for each shape and source two more drains of the same rows
(reported, not timed against anything): every database call and every wave timed on both
sides of its crossing (``run_relay_cycle`` in a loop, like run-once), and py-spy samples
of the thread holding the GIL (where the Python CPU goes) when py-spy is installed
(``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.kafka.producer import KafkaProducer, OutMessage
from actors.leases.lock_keeper import CycleContext, serve_lock_keeper
from actors.outbox.listener import serve_outbox_listener
from actors.outbox.logical import source_of
from actors.outbox.logical_setup import LogicalSource, ensure_logical_source
from actors.outbox.relay import RelayJob, run_relay_cycle
from bench._measure import (
    CpuMeter,
    TimedDatabase,
    backends_gone,
    percentile,
    py_spy,
    py_spy_available,
    py_spy_report,
)
from bench._relay_before import BeforeSplit
from bench._relay_workload import (
    SHAPES,
    AckStamps,
    Workload,
    ack_floor,
    aiokafka_ceiling,
    check_landed,
    insert_rows,
    make_config,
    published,
    reset_source,
    trickle_rows,
    write_paced,
    write_paced_elsewhere,
)
from supervision.app.daemon import open_resources, run_once
from supervision.app.settings import Config
from supervision.app.tree import relay_locked_job
from supervision.db.migrate import install_demo
from supervision.dev.kafka import KafkaServer
from supervision.dev.postgres import PostgresServer
from supervision.dev.processes import start_all, stop_all
from supervision.jobs import Job
from supervision.logs import configure_logging
from supervision.tree.bridge import run_asyncio

SOURCES = ("table", "logical")
BEFORE = "before-split"
AIOKAFKA = "aiokafka"
SHAPE_NAMES = {"copy": "one COPY, one transaction",
               "small": "transactions of 1-5 rows, the messenger's shape"}
RATIO_TARGETS = {"table": 0.8, "logical": 0.9}
OK = {True: "ok", False: "MISSED"}


class Bench:
    """The servers, the relay's configuration per source, the topics of one run."""

    def __init__(self, pg: PostgresServer, kafka: KafkaServer, args: argparse.Namespace,
                 base_dir: Path) -> None:
        self.pg, self.kafka, self.args = pg, kafka, args
        self.servers = {"postgres": pg.pid, "tansu": kafka.pid}
        assert pg.pid is not None
        self.postmaster = pg.pid
        self.tag = uuid.uuid4().hex[:8]
        self.cfgs = {s: make_config(pg.dsn, kafka, s) for s in SOURCES}
        self.logical: LogicalSource = source_of(self.cfgs["logical"].outbox_relay)
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            ensure_logical_source(conn, self.logical)
        self.before = BeforeSplit(pg.dsn, base_dir) if args.before_split else None
        for dsn in (pg.dsn, *([self.before.dsn] if self.before else [])):
            with psycopg.connect(dsn, autocommit=True) as conn:  # vacuumed after each drain
                conn.execute("ALTER TABLE messenger.integration_outbox SET"
                             " (autovacuum_enabled = off)")

    def settled(self) -> None:
        """The server at rest: no client backend, nothing left to reap."""
        if not backends_gone(self.postmaster):
            print("  (PostgreSQL did not settle within 5 s: a CPU figure may hold work"
                  " not its own)", file=sys.stderr)

    def topic(self, name: str) -> str:
        topic = f"bench.outbox-relay.{self.tag}.{name}"
        self.kafka.create_topic(topic, self.args.partitions)
        return topic

    def dsn(self, source: str) -> str:
        """The database *source* drains (the relay before the split has its own)."""
        return self.before.dsn if source == BEFORE and self.before else self.pg.dsn

    def prepare(self, source: str, work: Workload | None, topic: str, shape: str) -> None:
        """An empty outbox, *source* the relay's, then *work*'s rows for *topic*."""
        with psycopg.connect(self.dsn(source), autocommit=True) as conn:
            reset_source(conn, source, self.logical)
            if work is not None:
                insert_rows(conn, work.outbox_rows(topic, str(uuid.uuid4())), shape,
                            work.groups)
                conn.execute("CHECKPOINT")  # the drain starts with no dirty page

    def drain(self, source: str, work: Workload, shape: str, name: str) -> dict[str, Any]:
        """One timed drain of *work* from *source* (or aiokafka alone) on a fresh topic:
        seconds, events/s, CPU ms per event by component."""
        topic, rows = self.topic(name), len(work.rows)
        meter = CpuMeter(self.servers, self.settled)
        if source == AIOKAFKA:
            messages = work.messages(topic, str(uuid.uuid4()))
            with meter.measure():
                aiokafka_ceiling(self.kafka.bootstrap_servers, topic, messages)
            return _drained(meter, meter.wall, rows)
        self.prepare(source, work, topic, shape)
        if source == BEFORE:
            assert self.before is not None
            with meter.measure():
                done = self.before.drain(self.kafka.bootstrap_servers)
            counts, seconds = done["counts"], done["seconds"]
            meter.used["python"] = done["python_cpu"]
        else:
            with meter.measure():
                counts = trio.run(run_once, self.cfgs[source], Job.OUTBOX_RELAY)
            seconds = meter.wall
        assert counts["published"] == rows and counts["failed"] == 0, (source, counts)
        check_landed(self.kafka, topic, work)
        if source != "logical":  # the logical source marks nothing published
            assert published(self.dsn(source), topic) == rows
        drained = _drained(meter, seconds, rows)
        drained["cpu"]["after"] = self.after(self.dsn(source)) / rows
        return drained

    def after(self, dsn: str) -> float:
        """PostgreSQL CPU ms of a VACUUM of the outbox and a CHECKPOINT: the dead row
        versions and the dirty pages a drain left behind (autovacuum is off on the
        outbox here)."""
        meter = CpuMeter({"postgres": self.pg.pid}, self.settled)
        with meter.measure(), psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM messenger.integration_outbox")
            conn.execute("CHECKPOINT")
        return 1000 * meter.used["postgres"]


def _drained(meter: CpuMeter, seconds: float, rows: int) -> dict[str, Any]:
    return {"seconds": seconds, "rate": rows / seconds,
            "cpu": {k: 1000 * v / rows for k, v in meter.used.items()} | {"after": 0.0}}


# ------------------------------------------------------------------------------ rounds


def one_round(bench: Bench, work: Workload, shape: str, n: int,
              sources: list[str]) -> dict[str, dict[str, Any]]:
    """aiokafka, each source (rotated by *n*), aiokafka; each source's ratio to the mean
    of the two aiokafka drains."""
    order = sources[n % len(sources):] + sources[:n % len(sources)]
    out = {}
    first = bench.drain(AIOKAFKA, work, shape, f"{shape}.aiokafka-first{n}")
    for source in order:
        out[source] = bench.drain(source, work, shape, f"{shape}.{source}{n}")
    last = bench.drain(AIOKAFKA, work, shape, f"{shape}.aiokafka-last{n}")
    ceiling = len(work.rows) / ((first["seconds"] + last["seconds"]) / 2)
    for result in out.values():
        result["ratio"] = result["rate"] / ceiling
    out[AIOKAFKA] = first | {"rate": ceiling, "ratio": 1.0, "order": order}
    return out


def summary(shape: str, rounds: list[dict[str, dict[str, Any]]], rows: int) -> list[str]:
    sources = [s for s in (AIOKAFKA, *SOURCES, BEFORE) if s in rounds[0]]
    lines = [f"\nshape {shape} ({SHAPE_NAMES[shape]}), {rows} rows, {len(rounds)} rounds;"
             " orders: " + "; ".join(" ".join(r[AIOKAFKA]["order"]) for r in rounds),
             f"  {'source':13}{'events/s median (min-max)':>27}{'ratio to aiokafka':>19}"
             "   CPU ms/event: python postgres  +after  target"]
    median: dict[str, dict[str, float]] = {}
    for source in sources:
        rates = [r[source]["rate"] for r in rounds]
        ratios = [r[source]["ratio"] for r in rounds]
        cpu = {k: statistics.median(r[source]["cpu"].get(k, 0.0) for r in rounds)
               for k in ("python", "postgres", "after")}
        median[source] = {"ratio": statistics.median(ratios), **cpu}
        target = ""
        if source in RATIO_TARGETS:
            goal = RATIO_TARGETS[source]
            target = f">= {goal}: {OK[median[source]['ratio'] >= goal]}"
        lines.append(f"  {source:13}{statistics.median(rates):>11.0f} ({min(rates):.0f}-"
                     f"{max(rates):.0f})  {median[source]['ratio']:>6.2f} ({min(ratios):.2f}-"
                     f"{max(ratios):.2f}){cpu['python']:>19.3f}{cpu['postgres']:>9.3f}"
                     f"{cpu['after']:>9.3f}  {target}")
    for n, r in enumerate(rounds, 1):
        lines.append(f"    round {n}: aiokafka {r[AIOKAFKA]['rate']:.0f}/s; " + "; ".join(
            f"{s} {r[s]['rate']:.0f}/s {r[s]['ratio']:.2f} pg {r[s]['cpu']['postgres']:.3f}"
            f"+{r[s]['cpu']['after']:.3f}" for s in r[AIOKAFKA]["order"]))
    if "table" in median and BEFORE in median:
        lines.append(f"  table >= the relay before the split (median ratio"
                     f" {median['table']['ratio']:.2f} vs {median[BEFORE]['ratio']:.2f}):"
                     f" {OK[median['table']['ratio'] >= median[BEFORE]['ratio']]}")
    if "table" in median and "logical" in median and median["table"]["postgres"]:
        lines.append(_pg_share(median["logical"], median["table"]))
    return lines


def _pg_share(logical: dict[str, float], table: dict[str, float]) -> str:
    """PostgreSQL CPU per event, logical / table: the drains, and with the VACUUM and
    CHECKPOINT after each (the target is on the latter)."""
    drains = logical["postgres"] / table["postgres"]
    whole = ((logical["postgres"] + logical["after"])
             / (table["postgres"] + table["after"]))
    return (f"  PostgreSQL CPU per event, logical / table: drains {logical['postgres']:.3f}"
            f" / {table['postgres']:.3f} ms = {drains:.2f}; with what each leaves"
            f" {logical['postgres'] + logical['after']:.3f} /"
            f" {table['postgres'] + table['after']:.3f} ms = {whole:.2f}"
            f"  target <= 1/3: {OK[whole <= 1 / 3]}")


# ------------------------------------------------------------------------------ latency


async def trickle(cfg: Config, rows: list[Any], rate: float, writers: int,
                  per_txn: int) -> tuple[list[float], float, int]:
    """Commit-to-ack (ms) per event through the daemon's relay, the rate reached, and the
    acknowledgements repeated."""
    dsn = cfg.postgres.dsn.reveal()

    async with open_resources(cfg) as res, trio.open_nursery() as nursery:
        acks = AckStamps(res.producer)
        await nursery.start(serve_outbox_listener, dsn, res.wakeup)
        await nursery.start(serve_lock_keeper, relay_locked_job(res), dsn)
        listening = 0
        while not listening:
            listening = await trio.to_thread.run_sync(_listening, dsn)
            await trio.sleep(0.05)
        warm, rows = rows[:5], rows[5:]
        await trio.to_thread.run_sync(write_paced, dsn, warm, 50.0, 1, 1)
        await acks.wait_for(len(warm), 10)
        await trio.sleep(0.5)
        stamps, reached = await trio.to_thread.run_sync(write_paced_elsewhere, dsn, rows,
                                                        rate, writers, per_txn)
        await acks.wait_for(len(warm) + len(rows), 60)
        nursery.cancel_scope.cancel()
    return [1000 * (acks.at[event] - committed) for event, committed in stamps], reached, \
        acks.repeated


def _listening(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name ="
                           " 'safetynet-listen' AND query ILIKE 'LISTEN%%'").fetchone()
    return int(row[0]) if row else 0


def latency(bench: Bench, sources: list[str], rates: list[float]) -> list[str]:
    args = bench.args
    counts = {rate: max(10, round(args.trickle * rate / 2000)) for rate in rates}
    work = Workload(5 + max(counts.values()), args.keys, seed=8)
    lines = [f"\ncommit-to-ack latency (daemon relay, LISTEN/NOTIFY; commit and ack stamped"
             f" on this machine's clock; {args.writers} writer connections):",
             f"  {'source':9}{'asked/s':>8}{'reached/s':>10}{'rows/txn':>9}{'events':>7}"
             f"{'p50':>7}{'p90':>7}{'p99':>7}{'max':>8} ms  target"]
    for rate in rates:
        per_txn = args.txn_rows or (1 if rate <= 2500 else math.ceil(rate / 2000))
        goal = 25.0 if rate <= 2000 else 100.0 if rate >= 10_000 else None
        for source in sources:
            topic = bench.topic(f"trickle.{source}.{rate:.0f}")
            bench.prepare(source, None, topic, "copy")
            rows = trickle_rows(work, topic, 5 + counts[rate])
            ms, reached, repeated = trio.run(trickle, bench.cfgs[source], rows, rate,
                                             args.writers, per_txn)
            p99 = percentile(ms, 0.99)
            target = "" if goal is None else f"p99 < {goal:.0f} ms: {OK[p99 < goal]}"
            if goal is not None and reached < 0.95 * rate:
                target += " (rate not reached)"
            if repeated:
                target += f"; {repeated} acks repeated"
            lines.append(f"  {source:9}{rate:8.0f}{reached:10.0f}{per_txn:9d}{len(ms):7d}"
                         f"{percentile(ms, 0.5):7.1f}{percentile(ms, 0.9):7.1f}{p99:7.1f}"
                         f"{max(ms):8.1f}     {target}")
            print(f"  latency {source} at {rate:.0f}/s done, load {os.getloadavg()[0]:.2f}",
                  file=sys.stderr)
    return lines


# ------------------------------------------------------------------------------ profile


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
    "run_logical_pipeline", "peek_slot", "advance_slot", "transactions",
    "run_publisher", "Window.next_wave", "send_wave", "_send_wave", "AIOKafkaProducer.send",
    "run_marker", "mark_answered", "work", "to_thread_run_sync", "run_asyncio",
    "check_connection", "Transaction.__exit__", "dumps", "event_id", "_sender_routine",
    "_send_produce_req", "_proxy_to_logger",
)


def profile(bench: Bench, work: Workload, source: str, shape: str,
            base_dir: Path) -> list[str]:
    cfg, rows = bench.cfgs[source], len(work.rows)
    lines = [f"\nwhere the time goes, {source} source, a drain of {rows} rows ({shape} shape,"
             " each pass on a fresh topic):"]
    topic = bench.topic(f"timed.{shape}.{source}")
    bench.prepare(source, work, topic, shape)
    seconds, db, producer = trio.run(timed_drain, cfg)
    if source == "table":
        assert published(bench.pg.dsn, topic) == rows
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
                 f" of {seconds:.2f} s (the rest: waves(), parsing, Trio)")
    if not py_spy_available():
        lines.append("2) py-spy not installed (pip install py-spy): no CPU profile")
        return lines
    topic = bench.topic(f"sampled.{shape}.{source}")
    bench.prepare(source, work, topic, shape)
    with py_spy(base_dir / f"py-spy-relay-{shape}-{source}.txt") as raw:
        seconds, _, _ = trio.run(timed_drain, cfg)
    lines.append(f"2) py-spy, samples of the GIL holder ({rows / seconds:.0f} events/s while"
                 " sampled):")
    lines += py_spy_report(raw, rows, "event", inclusive=INCLUSIVE)
    return lines


# ------------------------------------------------------------------------------ main


def run(pg: PostgresServer, kafka: KafkaServer, args: argparse.Namespace,
        base_dir: Path) -> None:
    install_demo(pg.dsn)
    bench = Bench(pg, kafka, args, base_dir)
    work = Workload(args.rows, args.keys)
    gc.freeze()  # as `safetynet run` does at start; the bench's own rows are not the relay's
    import aiokafka

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        version = conn.execute("SELECT version()").fetchone()[0].split(" on ")[0]  # type: ignore[index]
    print(f"{version} | Tansu (memory) | aiokafka {aiokafka.__version__} | psycopg"
          f" {psycopg.__version__} | trio {trio.__version__} | {os.cpu_count()} CPUs, load"
          f" {os.getloadavg()[0]:.2f} | {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"rows={args.rows} keys={args.keys} value {work.value_bytes():.0f} B + 5 headers,"
          f" topics bench.outbox-relay.{bench.tag}.* with {args.partitions} partitions,"
          f" batch_size {bench.cfgs['table'].outbox_relay.batch_size}, rounds={args.rounds},"
          f" sources {','.join(args.sources)}{' + before-split' if args.before_split else ''},"
          f" shapes {','.join(args.shapes)} ({len(work.groups)} transactions when small)")
    drained = [*args.sources, *([BEFORE] if args.before_split else [])]
    results: dict[str, list[dict[str, dict[str, Any]]]] = {s: [] for s in args.shapes}
    loads = []
    for n in range(args.rounds):
        for shape in args.shapes:
            results[shape].append(one_round(bench, work, shape, n, drained))
            loads.append(os.getloadavg()[0])
            print(f"  round {n + 1} {shape} done, load {loads[-1]:.2f}", file=sys.stderr)
    for shape in args.shapes:
        print("\n".join(summary(shape, results[shape], args.rows)))
    print(f"  (load average during the rounds: {min(loads):.1f}-{max(loads):.1f})")
    print("\n".join(latency(bench, args.sources, args.rates or [args.rate])))
    floor = ack_floor(kafka.bootstrap_servers, bench.topic("ack"))
    print("broker ack of one send of n messages, aiokafka alone, idle (p50 / p90 ms): "
          + ", ".join(f"n={n}: {p50:.1f} / {p90:.1f}" for n, (p50, p90) in floor.items()))
    if args.profile != "none":
        for shape in args.shapes:
            for source in args.sources:
                print("\n".join(profile(bench, work, source, shape, base_dir)))


def _names(allowed: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"{text!r}: pick from {', '.join(allowed)}")
        return names
    return parse


def _rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: rates per second, comma-separated"
                                         ) from None
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: rates must be positive")
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="outbox rows (default 20000)")
    parser.add_argument("--keys", type=int, default=1000, help="message keys (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--partitions", type=int, default=3, help="per topic (default 3)")
    parser.add_argument("--sources", type=_names(SOURCES), default=list(SOURCES),
                        help="the relay's sources, comma-separated (default table,logical)")
    parser.add_argument("--shapes", type=_names(SHAPES), default=list(SHAPES),
                        help="transaction shapes of the rows (default copy,small)")
    parser.add_argument("--before-split", action="store_true",
                        help="also drain with the relay before the pipeline split")
    parser.add_argument("--trickle", type=int, default=6000,
                        help="latency events at 2,000/s, scaled to the rate (default 6000)")
    parser.add_argument("--rate", type=float, default=2000.0, help="latency events/s (2000)")
    parser.add_argument("--rates", type=_rates, default=None,
                        help="latency at each of these rates, e.g. 2000,10000")
    parser.add_argument("--writers", type=int, default=4,
                        help="connections committing the trickle (default 4)")
    parser.add_argument("--txn-rows", type=int, default=0,
                        help="trickle rows per transaction (default: 1 up to 2,500/s)")
    parser.add_argument("--profile", choices=("relay", "none"), default="relay")
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
