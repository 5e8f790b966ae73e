"""How fast does recording-finalize drain a backlog, against its two ceilings? (issue 4)

A benchmark (not a test). Each round seeds ``--rows`` due finalize rows the way the
messenger service leaves them (``tests/messenger.py``'s rows, written set-based: an ended
1:1 call, its recording, a Pending finalize row due now; sessions ended an hour ago, the
SLA is 30 min, so every row is past it) and measures:

  mixed drain   70% Uploading with the binary in SeaweedFS (content type and duration
                metadata: reconciled), 20% Uploading with no binary (404: Failed/Timeout),
                10% Available but unpublished (no HEAD: republished). Drained in-process
                with run-once semantics: ``run_finalize_cycle`` on ``open_resources``
                (pool of 6, 2 committers, s3.concurrency 8, batch_size 100,
                max_run_duration 10m) until a cycle finds nothing due; JSON logs rendered
                to /dev/null as in the daemon.
  S3 ceiling    signed HEADs of the same objects (the 90% that need one) through the same
                ``open_object_store`` + ``head_recording`` (the S3 worker process, libcurl,
                s3.concurrency = 8 connections), from as many Trio tasks as the drain's
                reconciler pool (16), no database: half of them right before the drain,
                half right after (so a drift of the machine's load hits both sides).
                ideal = (rows needing a HEAD) / ceiling; ratio = ideal / drain time
                (target >= 0.8).
  reference     (context, not a target) the same HEADs, a quarter of them, through the
                client the daemon used before the S3 worker: in-process httpx + AWS4Auth,
                8 tasks — the source of the issue's "~450 signed HEAD/s". And the serial
                ideal: S3 ceiling time + the same round's DB-bound drain time for the rows
                (drain faster than that = the two kinds of work overlap).
  DB-bound      all rows Available-unpublished (no S3 at all), drained the same way.
  pgbench       the same per-row statement (``finalize_attempts_publish_available``,
                transition=false), one row per transaction, 4 clients, prepared, each
                client walking its own slice of the same seeded rows, right before and
                right after the drain: their mean is the ceiling of the DB-bound drain
                (target >= 0.5). Also shown, not in the ratio: the statement wrapped in
                BEGIN/COMMIT (the transaction ``Database.atomic`` sends, minus its pool
                check query).
  memory        peak RSS during the mixed drain of this process plus the S3 worker
                (psutil every 10 ms; ru_maxrss is this process's lifetime peak);
                target < 150 MB.

Alongside: CPU per row of each process (this one, the S3 worker, the postmaster with its
backends, weed, pgbench) and how many cores they kept busy together — on a shared 2-core
machine it says what saturates; the HEAD latency (request to answer, seen from this
process) in the ceiling and in the drain; how busy the reconciler pool (HEADs awaited /
8 connections; up to 200%, as 16 tasks feed 8) and the two committers (time inside their
database calls / 2) were during each drain.

Then, on the DB-bound workload again (``--profile db``, the default; ``mixed``, ``both``
or ``none``), reported and not timed against anything: one drain with every database call
timed on both sides of its thread crossing, and one drain sampled by py-spy (the
GIL-holding thread of this process: where the Python CPU goes) when py-spy is installed
(``pip install py-spy``).

It starts its own PostgreSQL and SeaweedFS (``supervision.dev.stack``, in a temp dir) and
always stops them. Run:

    .venv/bin/python bench/recording_finalize.py [--rows 5000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio
from httpx_auth import AWS4Auth

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from actors.envelope import TOPIC_RECORDING_AVAILABLE, event_headers
from actors.finalize.cycle import JOB, FinalizeJob, run_finalize_cycle
from actors.finalize.queries import FINALIZE_QUERIES
from actors.finalize.reconciler import pool_size
from actors.finalize.state import FinalizeCounts
from actors.leases.lock_keeper import CycleContext
from actors.s3.process import open_object_store
from bench._measure import (
    CpuMeter,
    RssSampler,
    TimedDatabase,
    py_spy,
    py_spy_available,
    py_spy_report,
    ru_maxrss_bytes,
    spread,
)
from supervision.app.daemon import open_resources
from supervision.app.resources import POOL_SIZE
from supervision.app.settings import Config, config_from_dict
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer, pg_bin_dir
from supervision.dev.processes import start_all, stop_all
from supervision.dev.s3 import S3Server
from supervision.logs import configure_logging
from tests.messenger import PREFIX

BUCKET = "bench-recordings"
PGBENCH_CLIENTS = 4
RESET = """
TRUNCATE messenger.call_sessions, messenger.call_recordings,
         messenger.recording_finalize_attempts, messenger.integration_outbox,
         messenger.realtime_outbox
"""
# The rows of tests/messenger.py's insert_call_session + insert_recording + insert_attempt,
# set-based. Ids are md5(tag || kind || n)::uuid so that Python (the uploads) and pgbench
# (its per-client slices) can name them. Row n is Available-unpublished when n % 10 = 9 in
# the mixed workload, and always in the DB-bound one.
SEED = """
WITH src AS (
    SELECT md5(%(tag)s || 'r' || n)::uuid AS rid, md5(%(tag)s || 's' || n)::uuid AS sid,
           md5(%(tag)s || 'a' || n)::uuid AS aid,
           %(all_available)s OR n %% 10 = 9 AS available
    FROM generate_series(0, %(rows)s - 1) AS n
),
sessions AS (
    INSERT INTO messenger.call_sessions (id, chat_id, deal_id, tenant_id, status,
        started_at, ended_at, created_at, updated_at)
    SELECT sid, gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Ended',
           now() - interval '2 hours', now() - interval '1 hour',
           now() - interval '2 hours', now()
    FROM src
),
recordings AS (
    INSERT INTO messenger.call_recordings (id, session_kind, session_id, chat_id, deal_id,
        tenant_id, media_type, trigger, status, file_id, size_bytes, duration_seconds,
        format, started_at, ended_at, available_at, created_at, updated_at)
    SELECT rid, 'Direct', sid, gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
           'Audio', 'Manual', CASE WHEN available THEN 'Available' ELSE 'Uploading' END,
           CASE WHEN available THEN %(prefix)s || rid END,
           CASE WHEN available THEN 1234 END, CASE WHEN available THEN 42 END,
           CASE WHEN available THEN 'Ogg' END,
           now() - interval '2 hours', now() - interval '1 hour',
           CASE WHEN available THEN now() END, now() - interval '2 hours', now()
    FROM src
)
INSERT INTO messenger.recording_finalize_attempts (id, recording_id, session_kind,
    session_id, status, attempts, next_attempt_at, created_at, updated_at)
SELECT aid, rid, 'Direct', sid, 'Pending', 0, now() - interval '1 second',
       now() - interval '1 hour', now()
FROM src
"""
STATE = """
SELECT (SELECT count(*) FROM messenger.call_recordings WHERE status = 'Available'),
       (SELECT count(*) FROM messenger.call_recordings WHERE status = 'Failed'),
       (SELECT count(*) FROM messenger.recording_finalize_attempts WHERE status = 'Done'),
       (SELECT count(*) FROM messenger.integration_outbox),
       (SELECT count(*) FROM messenger.realtime_outbox)
"""


def rid(tag: str, n: int) -> str:
    import hashlib

    return str(uuid.UUID(hashlib.md5(f"{tag}r{n}".encode()).hexdigest()))


def kind(n: int) -> str:
    """The mixed workload: 70% present, 20% missing, 10% Available-unpublished."""
    return "present" if n % 10 < 7 else "missing" if n % 10 < 9 else "available"


def make_config(dsn: str, s3: S3Server) -> Config:
    creds = s3.credentials
    return config_from_dict({
        "postgres": {"dsn": dsn},
        "s3": {"endpoint_url": s3.endpoint_url, "bucket": BUCKET, "key_prefix": PREFIX,
               "access_key_id": creds.access_key_id,
               "secret_access_key": creds.secret_access_key, "region": creds.region,
               "timeout": "5s", "concurrency": 8},
        "jobs": {"recording_finalize": {"batch_size": 100, "finalize_sla_timeout": "30m",
                                        "max_run_duration": "10m", "lock_ttl": "11m"}},
    })


def seed(dsn: str, tag: str, rows: int, all_available: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESET)
        conn.execute(SEED, {"tag": tag, "rows": rows, "all_available": all_available,
                            "prefix": PREFIX})
        conn.execute("VACUUM ANALYZE messenger.call_sessions, messenger.call_recordings,"
                     " messenger.recording_finalize_attempts")


def db_state(dsn: str) -> tuple[int, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(STATE).fetchone()
    assert row is not None
    return tuple(int(x) for x in row)


# ------------------------------------------------------------------------------ S3 side


async def for_each(items: list[str], tasks: int,
                   fn: Callable[[str], Awaitable[object]]) -> float:
    """Seconds for *tasks* Trio tasks to ``await fn(item)`` for every item, sharing them."""
    send, recv = trio.open_memory_channel[str](len(items))
    for item in items:
        send.send_nowait(item)
    send.close()

    async def worker() -> None:
        async for item in recv:
            await fn(item)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker)
    return time.perf_counter() - started


async def upload(s3: S3Server, keys: list[str], concurrency: int = 16) -> float:
    """PUT the binaries the recorder would have uploaded (64 bytes, audio/ogg, duration)."""
    c = s3.credentials
    auth = AWS4Auth(c.access_key_id, c.secret_access_key, c.region, "s3")
    async with httpx.AsyncClient(base_url=s3.endpoint_url, auth=auth, timeout=30) as client:

        async def put(key: str) -> None:
            response = await client.put(
                f"/{BUCKET}/{key}", content=b"OggS" + b"\0" * 60,
                headers={"Content-Type": "audio/ogg", "x-amz-meta-duration-seconds": "42"})
            response.raise_for_status()

        return await for_each(keys, concurrency, put)


class TimedStore:
    """The ObjectStore, counting HEADs and the time they were in flight."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls = 0
        self.busy = 0.0

    async def head_bucket(self) -> Any:
        return await self._store.head_bucket()

    async def probe(self) -> Any:
        return await self._store.probe()

    async def list_recordings(self) -> Any:
        return await self._store.list_recordings()

    async def head_recording(self, recording_id: str) -> Any:
        started = time.perf_counter()
        try:
            return await self._store.head_recording(recording_id)
        finally:
            self.calls += 1
            self.busy += time.perf_counter() - started


async def s3_ceiling(cfg: Config, recording_ids: list[str]
                     ) -> tuple[float, Counter[str], TimedStore]:
    """Seconds for signed HEADs of *recording_ids* from as many tasks as the drain's
    reconciler pool, no database."""
    outcomes: Counter[str] = Counter()
    async with open_object_store(cfg.s3) as raw_store:
        store = TimedStore(raw_store)
        await store.head_bucket()  # one connection up, as the cycle's probe does

        async def head(r: str) -> None:
            outcomes[type(await store.head_recording(r)).__name__] += 1

        seconds = await for_each(recording_ids, pool_size(cfg.s3.concurrency), head)
        return seconds, outcomes, store


async def httpx_ceiling(cfg: Config, recording_ids: list[str]) -> float:
    """HEAD/s of *recording_ids* through the client the daemon used before the S3 worker:
    one in-process ``httpx.AsyncClient`` signed by httpx-auth's ``AWS4Auth``, s3.concurrency
    connections and tasks. A reference only: the issue's "~450 signed HEAD/s" came from it."""
    c = cfg.s3
    auth = AWS4Auth(c.access_key_id.reveal(), c.secret_access_key.reveal(), c.region, "s3")
    limits = httpx.Limits(max_connections=c.concurrency, max_keepalive_connections=c.concurrency)
    async with httpx.AsyncClient(base_url=c.endpoint_url, auth=auth, limits=limits,
                                 timeout=c.timeout) as client:
        await client.head(f"/{BUCKET}")

        async def head(r: str) -> None:
            status = (await client.head(f"/{BUCKET}/{PREFIX}{r}")).status_code
            assert status in (200, 404), status

        return len(recording_ids) / await for_each(recording_ids, c.concurrency, head)


# ------------------------------------------------------------------------------ drains


def _did_work(c: FinalizeCounts) -> bool:
    return bool(c.reconciled + c.republished + c.failed + c.quarantined + c.transient
                + c.rescheduled + c.config_fault)


async def drain(cfg: Config, wrap_db: Any = None, wrap_store: Any = TimedStore
                ) -> tuple[float, FinalizeCounts, int, Any]:
    """Run cycles until one finds nothing due; (seconds, summed counts, cycles, HEADs)."""
    total = FinalizeCounts()
    cycles = 0
    async with open_resources(cfg) as res:
        # the S3 worker starts on the first request (~0.4 s of Python start-up): once per
        # daemon, not per drain, so the clock starts with it running
        await res.store.probe()
        db = wrap_db(res.db) if wrap_db else res.db
        store = wrap_store(res.store)
        job = FinalizeJob(cfg.jobs.recording_finalize, cfg.s3.concurrency, db,
                          store, res.wakeup.wake,  # type: ignore[arg-type]
                          bucket=cfg.s3.bucket, key_prefix=cfg.s3.key_prefix)
        started = time.perf_counter()
        while True:
            counts = await run_finalize_cycle(job, CycleContext(JOB, str(uuid.uuid4())))
            cycles += 1
            for field in ("reconciled", "republished", "failed", "quarantined", "transient",
                          "rescheduled", "skipped_locked", "config_fault"):
                setattr(total, field, getattr(total, field) + getattr(counts, field))
            if not _did_work(counts):
                break
        return time.perf_counter() - started, total, cycles, store


# ------------------------------------------------------------------------------ pgbench


def pgbench_script(per_client: int, tag: str, explicit_tx: bool) -> str:
    """``finalize_attempts_publish_available`` for row n = client_id * per_client + i."""
    headers = event_headers(TOPIC_RECORDING_AVAILABLE, str(uuid.uuid4()),
                            "CallRecordingAvailable", str(uuid.uuid4()),
                            "safetynet.recording-finalize")
    values = {  # one row: a one-element JSON array, as the committer sends it
        "rows": (f"jsonb_build_array(jsonb_build_object("
                 f"'attempt_id', md5('{tag}a' || :n::text)::uuid,"
                 f" 'recording_id', md5('{tag}r' || :n::text)::uuid,"
                 f" 'transition', false, 'old_attempts', 0,"
                 f" 'headers', '{headers}'::jsonb))::text"),
        "topic": f"'{TOPIC_RECORDING_AVAILABLE}'",
    }
    sql = re.sub(r"%\((\w+)\)s", lambda m: values[m.group(1)],
                 FINALIZE_QUERIES["finalize_attempts_publish_available"])
    # pgbench takes ':MI' inside the to_char() formats for a variable: spell the colons
    # as E'\\x3a' (the same string, no colon in the script)
    sql = re.sub(r"'(YYYY-MM-DD[^']*)'", lambda m: "E'" + m.group(1).replace(":", "\\x3a")
                 + "'", sql)
    body = f"BEGIN;\n{sql};\nCOMMIT;\n" if explicit_tx else f"{sql};\n"
    return f"\\set i :i + 1\n\\set n :client_id * {per_client} + :i - 1\n{body}"


def pgbench(server: PostgresServer, base_dir: Path, per_client: int, tag: str,
            explicit_tx: bool) -> float:
    """Run the script; return pgbench's tps (without connection time)."""
    script = base_dir / f"publish_available{'_tx' if explicit_tx else ''}.sql"
    script.write_text(pgbench_script(per_client, tag, explicit_tx))
    argv = [str(pg_bin_dir() / "pgbench"), "-n", "-M", "prepared",
            "-c", str(PGBENCH_CLIENTS), "-j", "2", "-t", str(per_client), "-D", "i=0",
            "-f", str(script), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres",
            "postgres"]
    done = subprocess.run(argv, env={**os.environ, "PGPASSWORD": server.password},
                          capture_output=True, text=True, check=False)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
    if done.returncode != 0 or match is None or "failed transactions: 0 " not in done.stdout:
        raise RuntimeError(f"pgbench failed:\n{done.stdout}\n{done.stderr}")
    return float(match.group(1))


# ------------------------------------------------------------------------------ rounds


def mixed_round(cfg: Config, servers: dict[str, int | None], rows: int,
                head_ids: list[str]) -> dict[str, Any]:
    """Ceiling on half the objects, the drain, the ceiling on the other half."""
    dsn = cfg.postgres.dsn.reveal()
    seed(dsn, "m", rows, all_available=False)
    ceiling_cpu = CpuMeter(servers)
    half = len(head_ids) // 2
    with ceiling_cpu.measure():
        head_s1, outcomes, heads1 = trio.run(s3_ceiling, cfg, head_ids[:half])
    meter = CpuMeter(servers)
    timed: list[TimedDatabase] = []
    with RssSampler() as rss, meter.measure():
        seconds, counts, cycles, store = trio.run(drain, cfg, _recorder(timed))
    ceiling_cpu2 = CpuMeter(servers)
    with ceiling_cpu2.measure():
        head_s2, outcomes2, heads2 = trio.run(s3_ceiling, cfg, head_ids[half:])
    present = sum(1 for n in range(rows) if kind(n) == "present")
    missing = sum(1 for n in range(rows) if kind(n) == "missing")
    outcomes.update(outcomes2)
    assert outcomes == {"Found": present, "Missing": missing}, outcomes
    state = db_state(dsn)
    assert state == (rows - missing, missing, rows, rows - missing, rows), state
    assert (counts.reconciled, counts.failed, counts.republished) == (
        present, missing, rows - present - missing), counts
    # every row needing a HEAD got exactly one; the positive canary adds up to 3 a cycle
    # once recordings are Available (the drain's last, empty cycle)
    assert len(head_ids) <= store.calls <= len(head_ids) + 3 * cycles, store.calls
    reference = trio.run(httpx_ceiling, cfg, head_ids[::4])
    head_s = head_s1 + head_s2  # = len(head_ids) / ceiling: the ideal drain time
    worker_head = (ceiling_cpu.used["children"] + ceiling_cpu2.used["children"]) / len(head_ids)
    py_head = (ceiling_cpu.used["python"] + ceiling_cpu2.used["python"]) / len(head_ids)
    weed_head = (ceiling_cpu.used["weed"] + ceiling_cpu2.used["weed"]) / len(head_ids)
    py_row = meter.used["python"] / rows
    return {"seconds": seconds, "rate": rows / seconds, "cycles": cycles,
            "ceiling": len(head_ids) / head_s, "ceiling_halves": (half / head_s1,
                                                                  (len(head_ids) - half) / head_s2),
            "ideal": head_s, "ratio": head_s / seconds, "peak_rss": rss.peak,
            "start_rss": rss.start_rss, "cpu": meter, "py_head": py_head,
            "weed_head": weed_head, "py_row": py_row, "worker_head": worker_head,
            "reference": reference, "peak_rss_all": rss.peak_with_children,
            "cores_ceiling": (ceiling_cpu.cores() + ceiling_cpu2.cores()) / 2,
            "cores_drain": meter.cores(),
            "cpu_ratio": py_head * len(head_ids) / (py_row * rows),
            "lat_ceiling": (heads1.busy + heads2.busy) / (heads1.calls + heads2.calls),
            "lat_drain": store.busy / store.calls,
            "pool_busy": store.busy / (cfg.s3.concurrency * seconds),
            "committers_busy": _commit_time(timed[0]) / (COMMITTERS * seconds)}


COMMITTERS = 2  # FinalizeJob's default, as finalize_job() builds it
COMMIT_FNS = ("publish_available", "fail_timeout", "record_transient", "quarantine", "unclaim")


def _recorder(into: list[TimedDatabase]) -> Any:
    def wrap(db: Any) -> TimedDatabase:
        into.append(TimedDatabase(db))
        return into[-1]
    return wrap


def _commit_time(timed: TimedDatabase) -> float:
    """Seconds the committers spent in their database calls (wall, Trio side)."""
    return sum(timed.stats[name][1] for name in COMMIT_FNS if name in timed.stats)


def db_round(cfg: Config, server: PostgresServer, servers: dict[str, int | None],
             rows: int, base_dir: Path) -> dict[str, Any]:
    """pgbench, the drain, pgbench again (the ceiling is their mean), then pgbench with
    BEGIN/COMMIT around the statement."""
    dsn = cfg.postgres.dsn.reveal()
    per_client = rows // PGBENCH_CLIENTS
    results: dict[str, Any] = {}

    def bench(key: str, explicit_tx: bool) -> None:
        seed(dsn, "d", rows, all_available=True)
        meter = CpuMeter(servers)
        with meter.measure():
            results[key] = pgbench(server, base_dir, per_client, "d", explicit_tx)
        done, outbox = db_state(dsn)[2:4]
        assert done == outbox == per_client * PGBENCH_CLIENTS, db_state(dsn)
        results[key + "_cpu"] = meter

    bench("tps1", False)
    seed(dsn, "d", rows, all_available=True)
    meter = CpuMeter(servers)
    timed: list[TimedDatabase] = []
    with meter.measure():
        seconds, counts, cycles, _ = trio.run(drain, cfg, _recorder(timed))
    assert counts.republished == rows and db_state(dsn)[2:4] == (rows, rows), counts
    bench("tps2", False)
    bench("tx_tps", True)
    results.update(seconds=seconds, rate=rows / seconds, cycles=cycles, cpu=meter,
                   tps=(results["tps1"] + results["tps2"]) / 2,
                   committers_busy=_commit_time(timed[0]) / (COMMITTERS * seconds))
    results["ratio"] = results["rate"] / results["tps"]
    return results


INCLUSIVE = (
    "run_finalize_claimer", "run_s3_reconciler", "run_finalize_committer",
    "head_recording", "AWS4Auth.auth_flow", "_commit", "work", "claim_due",
    "publish_available", "fail_timeout", "check_connection", "ConnectionPool.getconn",
    "ConnectionPool.putconn", "Transaction.__enter__", "Transaction.__exit__",
    "to_thread_run_sync", "event_headers", "_proxy_to_logger", "JSONRenderer.__call__",
    "refresh_gauges",
)


def profile(cfg: Config, rows: int, base_dir: Path, which: str, tag: str) -> list[str]:
    """A timed-calls pass and a py-spy pass over one workload (re-seeded for each)."""
    dsn = cfg.postgres.dsn.reveal()
    mixed = which == "mixed"
    title = "mixed" if mixed else "DB-bound"
    lines = [f"\nwhere the time goes, {title} drain of {rows} rows (each pass re-seeded):"]
    seed(dsn, tag, rows, all_available=not mixed)
    timed: list[TimedDatabase] = []
    seconds, _, _, _ = trio.run(drain, cfg, _recorder(timed))
    lines.append(f"1) every database call timed ({rows / seconds:.0f} rows/s in this pass):"
                 " before = to_thread + pool checkout (with its check query) + BEGIN;"
                 " fn = the statement(s); after = COMMIT + check-in + back in Trio")
    lines += timed[0].report(rows, "row")
    if not py_spy_available():
        lines.append("2) py-spy not installed (pip install py-spy): no CPU profile")
        return lines
    seed(dsn, tag, rows, all_available=not mixed)
    with py_spy(base_dir / f"py-spy-{which}.txt") as raw:
        seconds, _, _, _ = trio.run(drain, cfg)
    lines.append(f"2) py-spy, samples of the GIL holder ({rows / seconds:.0f} rows/s while"
                 " sampled):")
    lines += py_spy_report(raw, rows, "row", inclusive=INCLUSIVE)
    return lines


def run(server: PostgresServer, s3: S3Server, rows: int, rounds: int, base_dir: Path,
        profiles: list[str]) -> None:
    dsn = server.dsn
    install_demo(dsn)
    s3.create_bucket(BUCKET)
    cfg = make_config(dsn, s3)
    present = [f"{PREFIX}{rid('m', n)}" for n in range(rows) if kind(n) == "present"]
    upload_s = trio.run(upload, s3, present)
    head_ids = [rid("m", n) for n in range(rows) if kind(n) != "available"]
    servers = {"postgres": server.pid, "weed": s3.pid}
    with psycopg.connect(dsn, autocommit=True) as conn:
        version = conn.execute("SELECT version()").fetchone()[0].split(" on ")[0]  # type: ignore[index]
    print(f"{version} | SeaweedFS (weed mini) | psycopg {psycopg.__version__} | trio"
          f" {trio.__version__} | httpx {httpx.__version__} | {os.cpu_count()} CPUs, load"
          f" {os.getloadavg()[0]:.2f} | rows={rows} rounds={rounds}")
    print(f"mixed: {len(present)} present ({len(present) / upload_s:.0f} PUT/s to seed),"
          f" {len(head_ids) - len(present)} missing, {rows - len(head_ids)} Available-"
          f"unpublished; {len(head_ids)} need a HEAD | s3.concurrency {cfg.s3.concurrency},"
          f" batch_size 100, 2 committers, pool {POOL_SIZE}")

    mixed, dbb = [], []
    for n in range(rounds):
        mixed.append(mixed_round(cfg, servers, rows, head_ids))
        dbb.append(db_round(cfg, server, servers, rows, base_dir))
        print(f"  round {n + 1} done, load {os.getloadavg()[0]:.2f}", file=sys.stderr)

    print(f"\n{'MIXED':8}{'drain s':>8}{'rows/s':>7}{'ceiling HEAD/s':>15}{'(halves)':>11}"
          f"{'ideal s':>8}{'ratio':>6}{'HEAD ms ceil/drain':>19}{'busy: S3 pool':>14}"
          f"{'committers':>11}{'peak RSS':>9}")
    for n, m in enumerate(mixed, 1):
        h1, h2 = m["ceiling_halves"]
        print(f"round {n:<2}{m['seconds']:8.2f}{m['rate']:7.0f}{m['ceiling']:15.0f}"
              f"{h1:6.0f}/{h2:<4.0f}{m['ideal']:8.2f}{m['ratio']:6.2f}"
              f"{1000 * m['lat_ceiling']:11.2f} /{1000 * m['lat_drain']:5.2f}"
              f"{100 * m['pool_busy']:13.0f}%{100 * m['committers_busy']:10.0f}%"
              f"{m['peak_rss'] / 2**20:7.0f}MB")
    print("  CPU ms per HEAD in the ceiling | per row in the drain (python = this process,"
          " s3-worker = the worker process); cores busy (all measured processes) in the"
          " ceiling | the drain:")
    for n, m in enumerate(mixed, 1):
        print(f"  round {n}: python {1000 * m['py_head']:.2f} s3-worker"
              f" {1000 * m['worker_head']:.2f} weed {1000 * m['weed_head']:.2f}"
              f" | {m['cpu'].per_item(rows, ('python', 'children', 'postgres', 'weed'))}"
              .replace("children", "s3-worker")
              + f"; cores {m['cores_ceiling']:.2f} | {m['cores_drain']:.2f}")
    print("  reference, the in-process httpx + AWS4Auth client (before the S3 worker), on a"
          " quarter of the objects:")
    for n, (m, d) in enumerate(zip(mixed, dbb, strict=True), 1):
        serial = len(head_ids) / m["ceiling"] + rows / d["rate"]
        m["serial_ratio"] = serial / m["seconds"]
        print(f"  round {n}: {m['reference']:.0f} HEAD/s; drain rows/s / that"
              f" {m['rate'] / m['reference']:.2f}. Serial ideal (S3 ceiling time + this"
              f" round's DB-bound drain time) {serial:.2f} s; / drain time"
              f" {m['serial_ratio']:.2f}")
    print(f"\n{'DB-BOUND':8}{'drain s':>8}{'rows/s':>7}{'pgbench tps':>12}{'(before/after)':>15}"
          f"{'ratio':>6}{'BEGIN/COMMIT tps':>17}{'committers busy':>16}"
          f"   CPU ms per row: drain | pgbench")
    for n, d in enumerate(dbb, 1):
        print(f"round {n:<2}{d['seconds']:8.2f}{d['rate']:7.0f}{d['tps']:12.0f}"
              f"{d['tps1']:8.0f}/{d['tps2']:<6.0f}{d['ratio']:6.2f}{d['tx_tps']:17.0f}"
              f"{100 * d['committers_busy']:15.0f}%   "
              f"{d['cpu'].per_item(rows, ('python', 'postgres'))} | "
              f"{d['tps1_cpu'].per_item(rows, ('children', 'postgres'))}"
              .replace("children", "pgbench"))

    mixed_ratio = [m["ratio"] for m in mixed]
    db_ratio = [d["ratio"] for d in dbb]
    peak = max(m["peak_rss"] for m in mixed) / 2**20
    peak_all = max(m["peak_rss_all"] for m in mixed) / 2**20
    ok = {True: "ok", False: "MISSED"}
    print(f"\nmixed drain rows/s {spread([m['rate'] for m in mixed])}; S3 ceiling HEAD/s"
          f" {spread([m['ceiling'] for m in mixed])}")
    print(f"mixed ratio (ideal/actual) {spread(mixed_ratio, '{:.2f}')}"
          f"  target >= 0.8: {ok[statistics.median(mixed_ratio) >= 0.8]}")
    print(f"  context: the in-process httpx client's ceiling"
          f" {spread([m['reference'] for m in mixed])} HEAD/s; drain / serial ideal"
          f" {spread([m['serial_ratio'] for m in mixed], '{:.2f}')}; cores busy in the S3"
          f" ceiling {spread([m['cores_ceiling'] for m in mixed], '{:.2f}')} of"
          f" {os.cpu_count()}")
    print(f"DB-bound rows/s {spread([d['rate'] for d in dbb])}; pgbench tps"
          f" {spread([d['tps'] for d in dbb])}")
    print(f"DB-bound ratio (drain/pgbench) {spread(db_ratio, '{:.2f}')}"
          f"  target >= 0.5: {ok[statistics.median(db_ratio) >= 0.5]}")
    print(f"peak RSS during the mixed drain {peak_all:.0f} MB with the S3 worker, {peak:.0f}"
          f" MB this process alone (at its start {mixed[0]['start_rss'] / 2**20:.0f} MB;"
          f" process lifetime ru_maxrss {ru_maxrss_bytes() / 2**20:.0f} MB)"
          f"  target < 150 MB: {ok[peak_all < 150]}")
    for which in profiles:
        print("\n".join(profile(cfg, rows, base_dir, which, "m" if which == "mixed" else "d")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000, help="rows per drain (default 5000)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--profile", choices=("db", "mixed", "both", "none"), default="db",
                        help="which drain to profile after the rounds (default db)")
    args = parser.parse_args()
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix="bench-finalize-"))
    servers = [PostgresServer(base_dir), S3Server(base_dir)]
    try:
        start_all(servers)
        run(servers[0], servers[1], args.rows, args.rounds, base_dir,  # type: ignore[arg-type]
            {"both": ["db", "mixed"], "none": []}.get(args.profile, [args.profile]))
    finally:
        stop_all(servers)
        shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
