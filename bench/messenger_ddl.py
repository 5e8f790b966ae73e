"""What does safetynet cost the messenger's own migrations? (issue 36, item 1)

A benchmark (not a test). It starts its own PostgreSQL (``PostgresServer`` in a temp dir,
always stopped), creates the messenger's tables from the fixture and seeds, set-based,
1,000,000 call recordings (and as many finalize rows and 1:1 sessions), ANALYZE.

1. **the messenger's DDL.** Each statement of item 1 that the messenger could run on
   ``call_recordings`` — a compatible type change, an incompatible one, a rename, a drop
   of a contract column, an added and a dropped other column — is timed twice in the same
   run: before ``safetynet migrate`` (the fixture's own indexes only: the baseline) and
   after (safetynet's function, indexes and trigger installed). Each runs in a
   transaction that is rolled back, so both passes see the same table. Printed: each
   statement's time before and after, and the ratio. With safetynet installed a
   statement can only cost more by the indexes it rebuilds (a type change that rewrites
   the table rebuilds every index on it, safetynet's included); nothing fails.
2. **finalize_classify per due row.** The claim's phase decision for 10,000 due rows
   (LIMIT, in ``ix_rfa_queue`` order), with migration 0011's inlined SQL body (kept as
   ``finalize_classify_0011`` for the comparison) and with 0014's PL/pgSQL one. Printed:
   the median of 5 runs of each, and the ratio.

Run:

    .venv/bin/python bench/messenger_ddl.py [--recordings 1000000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from supervision.db.migrate import apply_messenger_fixture, migrate
from supervision.dev.postgres import PostgresServer

SEED = """
INSERT INTO messenger.call_sessions (id, status, started_at, ended_at, created_at,
    updated_at)
SELECT gen_random_uuid(), 'Ended', now() - interval '3 h', now() - g * interval '1 s',
       now() - interval '3 h', now()
FROM generate_series(1, %(n)s) g;

INSERT INTO messenger.call_recordings (id, session_kind, session_id, media_type, trigger,
    status, file_id, created_at, updated_at)
SELECT gen_random_uuid(), 'Direct', s.id, 'Audio', 'Manual',
       CASE WHEN random() < 0.01 THEN 'Uploading' ELSE 'Available' END,
       'call-recordings/' || s.id, s.created_at, s.updated_at
FROM messenger.call_sessions s;

INSERT INTO messenger.recording_finalize_attempts (id, recording_id, session_kind,
    session_id, status, next_attempt_at, created_at, updated_at)
SELECT gen_random_uuid(), r.id, 'Direct', r.session_id,
       CASE WHEN r.status = 'Uploading' THEN 'Pending' ELSE 'Done' END,
       now() - interval '1 min', r.created_at, r.updated_at
FROM messenger.call_recordings r;
"""

T = "ALTER TABLE messenger.call_recordings"
DDL = (
    ("status TYPE varchar(64) (compatible, no rewrite)",
     f"{T} ALTER COLUMN status TYPE varchar(64)"),
    ("status TYPE text (compatible, no rewrite)", f"{T} ALTER COLUMN status TYPE text"),
    ("updated_at TYPE timestamp (incompatible, rewrite)",
     f"{T} ALTER COLUMN updated_at TYPE timestamp USING updated_at AT TIME ZONE 'UTC'"),
    ("status TYPE smallint (incompatible, rewrite)",
     f"{T} ALTER COLUMN status TYPE smallint USING 0"),
    ("RENAME COLUMN status", f"{T} RENAME COLUMN status TO state"),
    ("DROP COLUMN file_id (a contract column)", f"{T} DROP COLUMN file_id"),
    ("ADD COLUMN note text", f"{T} ADD COLUMN note text"),
    ("DROP COLUMN chat_id (another column)", f"{T} DROP COLUMN chat_id"),
)

CLASSIFY = """
SELECT count(*), max(c.phase), max(c.session_ended_at)
FROM (SELECT a.recording_id FROM messenger.recording_finalize_attempts a
      WHERE a.status = 'Pending' AND a.next_attempt_at <= now()
      ORDER BY a.next_attempt_at, a.id LIMIT 10000) a
CROSS JOIN LATERAL safetynet.{fn}(a.recording_id, now(), 1800, 60) c
"""


def seed(dsn: str, n: int) -> float:
    t0 = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SEED.split(";\n\n"):
            conn.execute(statement, {"n": n})  # type: ignore[call-overload]
        conn.execute("CREATE INDEX ix_rfa_queue ON messenger.recording_finalize_attempts "
                     "(status, next_attempt_at, id)")
        conn.execute("CHECKPOINT")
        conn.execute("VACUUM ANALYZE")
    return time.monotonic() - t0


def time_ddl(conn: psycopg.Connection[Any]) -> dict[str, float]:
    """Each statement's duration, in a transaction rolled back (the table stays as it was)."""
    out = {}
    for label, statement in DDL:
        with conn.transaction(force_rollback=True):
            t0 = time.monotonic()
            conn.execute(statement)  # type: ignore[call-overload]
            out[label] = time.monotonic() - t0
    return out


def indexes(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM pg_index "
                       "WHERE indrelid = 'messenger.call_recordings'::regclass").fetchone()
    return int(row[0]) if row else 0


def keep_0011_function(conn: psycopg.Connection[Any]) -> None:
    """Migration 0011's finalize_classify under another name, as 0011 created it."""
    text = (Path(__file__).resolve().parents[1] / "supervision" / "sql" / "migrations"
            / "0011_pinned_functions_and_dead_letters.sql").read_text()
    start = text.index("CREATE OR REPLACE FUNCTION safetynet.finalize_classify(")
    body = text[start:text.index("CREATE OR REPLACE FUNCTION safetynet.lease_acquire")]
    with conn.transaction():
        conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
        conn.execute(body.replace("finalize_classify(", "finalize_classify_0011(", 1))  # type: ignore[call-overload]


def time_classify(conn: psycopg.Connection[Any], fn: str) -> tuple[float, int]:
    """The median of 5 runs, and how many due rows each classified."""
    runs, rows = [], 0
    for _ in range(5):
        t0 = time.monotonic()
        row = conn.execute(CLASSIFY.format(fn=fn)).fetchone()  # type: ignore[call-overload]
        runs.append(time.monotonic() - t0)
        rows = int(row[0]) if row else 0
    return statistics.median(runs), rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recordings", type=int, default=1_000_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="safetynet-bench-ddl-"))
    server = PostgresServer(base)
    try:
        server.start()
        apply_messenger_fixture(server.dsn)
        print(f"seeded {args.recordings:,} recordings, sessions and finalize rows in "
              f"{seed(server.dsn, args.recordings):.0f}s")
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            before_n = indexes(conn)
            before = time_ddl(conn)
            t0 = time.monotonic()
            migrate(server.dsn)
            print(f"migrate: {time.monotonic() - t0:.1f}s; indexes on call_recordings "
                  f"{before_n} -> {indexes(conn)}")
            after = time_ddl(conn)
            for label, _ in DDL:
                print(f"  {label}: {before[label] * 1000:,.0f} ms without safetynet, "
                      f"{after[label] * 1000:,.0f} ms with it "
                      f"(x{after[label] / before[label]:.2f})")
            keep_0011_function(conn)
            inlined, rows = time_classify(conn, "finalize_classify_0011")
            plpgsql, _ = time_classify(conn, "finalize_classify")
            print(f"finalize_classify, {rows:,} due rows: 0011 inlined "
                  f"{inlined * 1000:.0f} ms, 0014 PL/pgSQL {plpgsql * 1000:.0f} ms "
                  f"(x{plpgsql / inlined:.2f}; "
                  f"{(plpgsql - inlined) / max(rows, 1) * 1e6:.1f} us more per row)")
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
