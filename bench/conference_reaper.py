"""How long does one conference-reaper cycle take, against the plain SQL of its writes?

A benchmark (not a test). Each round seeds 3 x batch_size due conferences — batch_size
empty rooms, batch_size unadmitted Provisioning rooms and batch_size stale live rooms —
each with 4 roster rows, and a running recording on every 10th ended room
(``--record-every``); then it times

  cycle  ``run_reaper_cycle`` as the daemon runs it: AsOf, three claims with SKIP LOCKED,
         three set-based batch statements (payloads with the roster and recordings),
         the recorder stop POSTs to a real HTTP stand-in, the backlog gauge, JSON logs
         rendered (to /dev/null);
  floor  the same transitions with their outbox and realtime rows as plain SQL by psycopg
         on an open connection, in one transaction: per phase one UPDATE ... RETURNING
         feeding the two INSERTs, minimal payloads, no claim, no Trio, no HTTP.

and prints the medians and their ratio (target: cycle < 10 x floor and < 0.5 s).

It starts its own PostgreSQL (``supervision.devstack.PostgresServer`` in a temp dir:
loopback TCP, fsync and synchronous_commit off) and the media stand-in
(``tests/media_stub.py``) as a separate process, and always stops both. Run:

    cd /work/main && .venv/bin/python bench/conference_reaper.py [--batch-size 100] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from actors.conference_reaper import ReaperJob, run_reaper_cycle
from actors.lock_keeper import CycleContext
from actors.recorder_signal import open_media_client
from supervision.config import config_from_dict
from supervision.database import open_database
from supervision.devstack import PostgresServer
from supervision.logs import configure_logging
from supervision.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]

RESET = """
TRUNCATE messenger.conference_participants, messenger.conference_sessions,
         messenger.call_recordings, messenger.integration_outbox, messenger.realtime_outbox;
"""
# n due rooms per phase; %(n)s rows each, with 4 roster rows per room.
SEED = """
WITH rooms AS (
    INSERT INTO messenger.conference_sessions (id, chat_id, deal_id, tenant_id, media_type,
        status, started_by_user_id, created_at, started_at, last_activity_at,
        active_participant_count, peak_participant_count, updated_at)
    SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid(),
           'Video', k.status, gen_random_uuid(),
           now() - interval '6 hours' + g * interval '1 second',
           CASE WHEN k.status = 'Active' THEN now() - interval '5 hours' END,
           now() - k.idle + g * interval '1 millisecond',
           k.active, 4, now()
    FROM (VALUES ('Active', interval '10 minutes', 0),      -- empty-room
                 ('Provisioning', interval '6 hours', 0),  -- provision-timeout
                 ('Active', interval '5 hours', 2)         -- stale-live
         ) AS k(status, idle, active),
         generate_series(1, %(n)s) AS g
    RETURNING id, chat_id, deal_id, tenant_id, status, created_at
),
roster AS (
    INSERT INTO messenger.conference_participants (conference_id, user_id, role, joined_at,
                                                   left_at)
    SELECT r.id, gen_random_uuid(), CASE WHEN p = 1 THEN 'Host' ELSE 'Participant' END,
           r.created_at + p * interval '1 second', now() - interval '10 minutes'
    FROM rooms r, generate_series(1, 4) AS p
)
INSERT INTO messenger.call_recordings (id, session_kind, session_id, chat_id, deal_id,
    tenant_id, media_type, trigger, status, started_at, created_at, updated_at)
SELECT gen_random_uuid(), 'Conference', r.id, r.chat_id, r.deal_id, r.tenant_id, 'Video',
       'Manual', 'Recording', now() - interval '1 hour', now() - interval '1 hour', now()
FROM (SELECT r.*, row_number() OVER (ORDER BY r.id) AS k FROM rooms r
      WHERE r.status = 'Active') r
WHERE %(every)s > 0 AND r.k %% greatest(%(every)s, 1) = 0;
"""
FLOOR = [
    """
    WITH u AS (
        UPDATE messenger.conference_sessions SET status = 'Ended', end_reason = %(reason)s,
            ended_at = now(),
            duration_seconds = floor(extract(epoch FROM now() - started_at))::int,
            updated_at = now()
        WHERE status = 'Active' AND last_activity_at <= now() - %(window)s * interval '1s'
          AND (%(empty)s = false OR active_participant_count = 0)
        RETURNING id, chat_id, deal_id, status, end_reason
    ),
    o AS (
        INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
                                                  payload)
        SELECT 'pin.messenger.conference-ended.v1', deal_id::text, id::text,
               'ConferenceEnded', jsonb_build_object('ConferenceId', id)
        FROM u
    )
    INSERT INTO messenger.realtime_outbox (kind, target_kind, chat_id, session_kind,
                                           reference_id, payload)
    SELECT 'ConferenceEnded', 'ChatGroup', chat_id, 'Conference', id,
           jsonb_build_object('ConferenceId', id, 'Status', status, 'EndReason', end_reason)
    FROM u
    """,
    """
    WITH u AS (
        UPDATE messenger.conference_sessions SET status = 'Failed', end_reason = 'Error',
            ended_at = now(), updated_at = now()
        WHERE status = 'Provisioning' AND created_at <= now() - %(window)s * interval '1s'
        RETURNING id, chat_id, status, end_reason
    )
    INSERT INTO messenger.realtime_outbox (kind, target_kind, chat_id, session_kind,
                                           reference_id, payload)
    SELECT 'ConferenceSignal', 'ChatGroup', chat_id, 'Conference', id,
           jsonb_build_object('ConferenceId', id, 'Status', status, 'EndReason', end_reason)
    FROM u
    """,
]


def seed(dsn: str, per_phase: int, every: int = 10) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESET)
        conn.execute(SEED, {"n": per_phase, "every": every})
        conn.execute("VACUUM ANALYZE messenger.conference_sessions")


def floor_once(conn: psycopg.Connection[Any]) -> tuple[float, int]:
    started = time.perf_counter()
    with conn.transaction():
        n = conn.execute(FLOOR[0], {"reason": "EmptyTimeout", "window": 90, "empty": True}
                         ).rowcount
        n += conn.execute(FLOOR[1], {"window": 120}).rowcount
        n += conn.execute(FLOOR[0], {"reason": "Timeout", "window": 14400, "empty": False}
                          ).rowcount
    return time.perf_counter() - started, n


async def cycles(dsn: str, base_url: str, batch_size: int, rounds: int, every: int
                 ) -> tuple[list[float], list[float], list[int], int]:
    cfg = config_from_dict({"postgres": {"dsn": dsn}, "media": {"base_url": base_url},
                            "jobs": {"conference_reaper": {"batch_size": batch_size}}})
    cycle_s, floor_s, reaped = [], [], []
    async with open_database(dsn, size=4) as db, open_media_client(cfg.media) as http:
        job = ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http)
        await run_reaper_cycle(job, CycleContext("conference-reaper", "warm-up"))
        with psycopg.connect(dsn, autocommit=True) as floor_conn:
            for _ in range(rounds):
                seed(dsn, batch_size, every)
                started = trio.current_time()
                counts = await run_reaper_cycle(
                    job, CycleContext("conference-reaper", str(uuid.uuid4())))
                cycle_s.append(trio.current_time() - started)
                reaped.append(counts.empty_timeout + counts.provision_failed
                              + counts.stale_timeout)
                seed(dsn, batch_size, every)
                elapsed, n = floor_once(floor_conn)
                floor_s.append(elapsed)
                floor_rows = n
    return cycle_s, floor_s, reaped, floor_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--record-every", type=int, default=10,
                        help="a running recording on every Nth ended room (0: none)")
    args = parser.parse_args()
    configure_logging("info", "json", stream=open(os.devnull, "w"))  # noqa: SIM115
    base_dir = Path(tempfile.mkdtemp(prefix="bench-reaper-"))
    server = PostgresServer(base_dir)
    try:
        server.start()
        migrate(server.dsn)
        # the stand-in in a process of its own, as the media stack would be (in this one
        # its HTTP threads would compete with the cycle for the GIL)
        with subprocess.Popen([sys.executable, "-m", "tests.media_stub"], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                              ) as media:
            assert media.stdin is not None and media.stdout is not None
            base_url = media.stdout.readline().strip()
            try:
                cycle_s, floor_s, reaped, floor_rows = trio.run(
                    cycles, server.dsn, base_url, args.batch_size, args.rounds,
                    args.record_every)
            finally:
                media.stdin.close()
                stops = int(media.stdout.readline() or 0)
    finally:
        server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)
    med_cycle, med_floor = statistics.median(cycle_s), statistics.median(floor_s)
    print(f"conferences per cycle: {3 * args.batch_size} due (batch_size {args.batch_size}"
          f" x 3 phases, 4 participants each); reaped per cycle: {sorted(set(reaped))};"
          f" floor rows: {floor_rows}; recorder stops sent: {stops} over {args.rounds} rounds")
    print("cycle  (run_reaper_cycle) ms: " + " ".join(f"{x * 1e3:.1f}" for x in cycle_s))
    print("floor  (plain SQL, 1 tx)  ms: " + " ".join(f"{x * 1e3:.1f}" for x in floor_s))
    print(f"median cycle {med_cycle * 1e3:.1f} ms, median floor {med_floor * 1e3:.1f} ms,"
          f" ratio {med_cycle / med_floor:.1f}x"
          f"  (target < 10x: {'ok' if med_cycle < 10 * med_floor else 'MISSED'};"
          f" < 500 ms: {'ok' if med_cycle < 0.5 else 'MISSED'})")


if __name__ == "__main__":
    main()
