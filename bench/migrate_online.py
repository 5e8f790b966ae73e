"""Does `safetynet migrate` stall the messenger's writers? And does outbox retention keep up?

A benchmark (not a test), issue 28 items 3 and 7. It starts its own PostgreSQL
(``supervision.dev.postgres.PostgresServer`` in a temp dir, always stopped), creates the
messenger's tables from the fixture (SPEC §2, with its own indexes) and seeds, set-based,
1,000,000 recordings and a 1,000,000-row outbox (95 % published a month ago), ANALYZE.

1. **migrate beside a writer.** A writer thread INSERTs one recording and UPDATEs another
   every 10 ms (autocommit, as the messenger does), timing each statement; a second
   thread holds, every 3 s, a one-second messenger transaction that wrote to the outbox
   (a lock migrate's trigger must wait behind). Meanwhile `migrate` runs with its
   defaults: every safetynet migration, the nine messenger-side indexes the fixture
   lacks, built CONCURRENTLY (three on call_recordings), and the NOTIFY trigger.
   Printed: migrate's duration, the writer's statements, its worst and p99 wait.
   Target: worst < 1 s.
2. **retention.** The relay's retention statement (batches of 1000, 20 per call) run to
   exhaustion over the 950,000 published rows; printed: rows/s. Target: >= 2,000 rows/s.

Run:

    .venv/bin/python bench/migrate_online.py [--recordings 1000000] [--outbox 1000000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from actors.outbox.queries import OUTBOX_QUERIES
from supervision.db.migrate import apply_messenger_fixture, migrate
from supervision.dev.postgres import PostgresServer

SEED = """
INSERT INTO messenger.call_recordings (id, session_kind, session_id, media_type, trigger,
    status, created_at, updated_at, available_at)
SELECT gen_random_uuid(), CASE WHEN g %% 3 = 0 THEN 'Conference' ELSE 'Direct' END,
       gen_random_uuid(), 'Audio', 'Manual',
       CASE WHEN g %% 1000 = 0 THEN 'Uploading' WHEN g %% 25 = 1 THEN 'Failed'
            ELSE 'Available' END,
       now() - g * interval '1 s', now() - g * interval '1 s', now() - g * interval '1 s'
FROM generate_series(1, %(recordings)s) g;

INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
    payload, created_at, published_at)
SELECT 't', 'k' || (g %% 5000), g::text, 'e', '{}', now() - interval '40 days',
       CASE WHEN g %% 20 = 0 THEN NULL
            ELSE now() - interval '40 days' + g * interval '1 ms' END
FROM generate_series(1, %(outbox)s) g;
"""

INSERT = ("INSERT INTO messenger.call_recordings (id, session_kind, session_id, media_type, "
          "trigger, status, created_at, updated_at) VALUES (%s, 'Direct', %s, 'Audio', "
          "'Manual', 'Recording', now(), now())")
UPDATE = ("UPDATE messenger.call_recordings SET status = 'Uploading', updated_at = now() "
          "WHERE id = %s")
OUTBOX = ("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, "
          "event_type, payload) VALUES ('t', 'k', %s, 'e', '{}')")


def seed(dsn: str, recordings: int, outbox: int) -> float:
    t0 = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SEED.split(";\n\n"):
            conn.execute(statement, {"recordings": recordings, "outbox": outbox})
        conn.execute("CHECKPOINT")
        conn.execute("VACUUM ANALYZE")
    return time.monotonic() - t0


def writer(dsn: str, stop: threading.Event, waits: list[float]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        previous: str | None = None
        while not stop.is_set():
            rid = str(uuid.uuid4())
            t0 = time.monotonic()
            conn.execute(INSERT, (rid, str(uuid.uuid4())))
            waits.append(time.monotonic() - t0)
            if previous:
                t0 = time.monotonic()
                conn.execute(UPDATE, (previous,))
                waits.append(time.monotonic() - t0)
            previous = rid
            time.sleep(0.01)


def long_transactions(dsn: str, stop: threading.Event) -> None:
    """A messenger transaction that wrote an outbox row and stays open 1 s, every 3 s."""
    with psycopg.connect(dsn) as conn:
        while not stop.is_set():
            conn.execute(OUTBOX, (str(uuid.uuid4()),))
            time.sleep(1.0)
            conn.commit()
            stop.wait(2.0)


def migrate_beside_writer(dsn: str) -> None:
    waits: list[float] = []
    stop = threading.Event()
    threads = [threading.Thread(target=writer, args=(dsn, stop, waits)),
               threading.Thread(target=long_transactions, args=(dsn, stop))]
    for t in threads:
        t.start()
    time.sleep(2.0)  # the writer's baseline
    t0 = time.monotonic()
    steps = migrate(dsn)
    took = time.monotonic() - t0
    time.sleep(1.0)
    stop.set()
    for t in threads:
        t.join()
    ordered = sorted(waits)
    print(f"migrate: {len(steps)} steps in {took:.1f}s "
          f"({sum(1 for s in steps if s.concurrent)} CONCURRENTLY index builds)")
    print(f"writer: {len(waits)} statements, worst {ordered[-1] * 1000:.0f} ms, "
          f"p99 {ordered[int(len(ordered) * 0.99)] * 1000:.1f} ms, "
          f"median {ordered[len(ordered) // 2] * 1000:.1f} ms")


def retention(dsn: str) -> None:
    deleted = 0
    t0 = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            n = conn.execute(OUTBOX_QUERIES["outbox_delete_published_before"],
                             {"retention": 7 * 86400, "limit": 1000}).rowcount
            deleted += n
            if n < 1000:
                break
    took = time.monotonic() - t0
    print(f"retention: {deleted} rows in {took:.1f}s = {deleted / took:,.0f} rows/s "
          "(batches of 1000, one transaction each)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recordings", type=int, default=1_000_000)
    parser.add_argument("--outbox", type=int, default=1_000_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="safetynet-bench-migrate-"))
    server = PostgresServer(base)
    try:
        server.start()
        apply_messenger_fixture(server.dsn)
        print(f"seeded {args.recordings} recordings and {args.outbox} outbox rows in "
              f"{seed(server.dsn, args.recordings, args.outbox):.0f}s")
        migrate_beside_writer(server.dsn)
        retention(server.dsn)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
