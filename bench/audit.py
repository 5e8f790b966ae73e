"""What does one run of the auditor actor cost at 1M recordings?

A benchmark (not a test). It seeds, set-based (``generate_series``), a database the size
issue #18 names: 1,000,000 recordings whose transitions are spread evenly over 30 days
(96 % Available, 4 % Failed, 0.1 % - the finalize backlog - still Uploading), a finalize
row for a fifth of them, the outbox row of every Available one and the realtime row of
every terminal one, and 100,000 ended conferences with theirs; then ANALYZE. It times
``audit_once`` (the actor's run: every cheap invariant in one read-only transaction) with
the default ``[audit]`` thresholds (window 15m; grace 5m, relay lag 5m, retention 7d),
with a 1h window, and with ``--since 24h`` (what an operator's ``safetynet audit`` reads),
and with ``--plans`` prints each query's ``EXPLAIN (ANALYZE, BUFFERS)`` plan
(docs/operations.md quotes them).
Target: < 50 ms per actor run.

It starts its own PostgreSQL (``supervision.dev.postgres.PostgresServer`` in a temp dir) and
always stops it. Run:

    .venv/bin/python bench/audit.py [--recordings 1000000] [--rounds 21] [--plans]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from actors.audit.auditor import audit_once
from actors.audit.invariants import Thresholds
from actors.envelope import TOPIC_CONFERENCE_ENDED, TOPIC_RECORDING_AVAILABLE
from supervision.app.audit import audit_thresholds
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import config_from_dict
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer

SEED = """
INSERT INTO messenger.call_recordings (id, session_kind, session_id, media_type, trigger,
    status, file_id, created_at, updated_at, available_at)
SELECT gen_random_uuid(), 'Direct', gen_random_uuid(), 'Audio', 'Manual',
       CASE WHEN g %% 1000 = 0 THEN 'Uploading' WHEN g %% 25 = 1 THEN 'Failed'
            ELSE 'Available' END,
       NULL, t - interval '1 hour', t, t
FROM generate_series(1, %(n)s) g,
     LATERAL (SELECT now() - (g::float / %(n)s) * interval '30 days' AS t) x;

INSERT INTO messenger.call_sessions (id, status, ended_at, created_at, updated_at)
SELECT session_id, 'Active', NULL, created_at, updated_at
FROM messenger.call_recordings WHERE status = 'Uploading';

INSERT INTO messenger.recording_finalize_attempts (id, recording_id, session_kind,
    session_id, status, attempts, next_attempt_at, created_at, updated_at)
SELECT gen_random_uuid(), id, session_kind, session_id,
       CASE WHEN status = 'Uploading' THEN 'Pending' ELSE 'Done' END, 1, updated_at,
       created_at, updated_at
FROM messenger.call_recordings WHERE abs(hashtext(id::text)) %% 5 = 0;

INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
    payload, created_at, published_at)
SELECT %(rec_topic)s, session_id::text, id::text, 'CallRecordingAvailable', '{}',
       updated_at, updated_at
FROM messenger.call_recordings WHERE status = 'Available';

INSERT INTO messenger.realtime_outbox (kind, target_kind, session_kind, reference_id,
    created_at)
SELECT 'Recording' || status, 'Session', session_kind, id, updated_at
FROM messenger.call_recordings WHERE status IN ('Available', 'Failed');

INSERT INTO messenger.conference_sessions (id, chat_id, deal_id, media_type, status,
    end_reason, started_by_user_id, created_at, last_activity_at, ended_at, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Audio', 'Ended',
       'EmptyTimeout', gen_random_uuid(), t, t, t, t
FROM generate_series(1, %(conferences)s) g,
     LATERAL (SELECT now() - (g::float / %(conferences)s) * interval '30 days' AS t) x;

INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
    payload, created_at, published_at)
SELECT %(conf_topic)s, deal_id::text, id::text, 'ConferenceEnded', '{}', updated_at,
       updated_at
FROM messenger.conference_sessions;

INSERT INTO messenger.realtime_outbox (kind, target_kind, session_kind, reference_id,
    created_at)
SELECT 'ConferenceEnded', 'ChatGroup', 'Conference', id, updated_at
FROM messenger.conference_sessions;
"""


def seed(dsn: str, recordings: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in SEED.split(";\n"):
            if statement.strip():
                conn.execute(statement.encode(), {  # bench-only seeding SQL
                    "n": recordings, "conferences": recordings // 10,
                    "rec_topic": TOPIC_RECORDING_AVAILABLE,
                    "conf_topic": TOPIC_CONFERENCE_ENDED})
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def time_runs(dsn: str, th: Thresholds, rounds: int) -> tuple[list[float], int]:
    times, found = [], 0
    with psycopg.connect(dsn) as conn:
        for _ in range(rounds):
            started = time.perf_counter()
            with conn.transaction():
                found = len(audit_once(conn, th))
            times.append((time.perf_counter() - started) * 1000)
    return times, found


def plans(dsn: str, th: Thresholds) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for name in ("audit_recordings_terminal", "audit_conferences_terminal",
                     "audit_outbox_recent", "audit_outbox_unpublished",
                     "audit_recordings_active", "audit_conferences_active",
                     "audit_finalize_attempts_open"):
            rows = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "
                                + ALL_QUERIES[name].encode(), th.params()).fetchall()
            print(f"\n-- {name}")
            print("\n".join(r[0] for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recordings", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--plans", action="store_true", help="print the EXPLAIN plans")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="safetynet-bench-audit-"))
    server = PostgresServer(base)
    try:
        server.start()
        install_demo(server.dsn)
        took = seed(server.dsn, args.recordings)
        print(f"seeded {args.recordings} recordings in {took:.0f}s")
        cfg = config_from_dict({"postgres": {"dsn": server.dsn}})
        for label, window in (("actor (window 15m, the default)", cfg.audit.window),
                              ("actor (window 1h)", 3600.0),
                              ("cli --since 24h", 86400.0)):
            th = audit_thresholds(cfg, window)
            times, found = time_runs(server.dsn, th, args.rounds)
            print(f"{label}: median {statistics.median(times):.1f} ms, "
                  f"p90 {sorted(times)[int(len(times) * 0.9)]:.1f} ms, "
                  f"min {min(times):.1f} ms over {args.rounds} runs; {found} violation(s)")
        if args.plans:
            plans(server.dsn, audit_thresholds(cfg))
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
