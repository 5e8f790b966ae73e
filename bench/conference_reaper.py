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
         feeding the two INSERTs; no claim, no locks, no savepoint, no Trio or threads,
         no HTTP, no logs. Two variants: "same writes" builds the same payloads as the
         job (the roster and recording lookups are work the contract requires), "bare"
         writes minimal payloads (a lower bound for any implementation of the rows).

and prints the medians and their ratios (target: cycle < 10 x floor (same writes) and
< 0.5 s). Cycle and floors are measured interleaved in the same run, so background load
affects them alike (the cycle, being multi-threaded Python with HTTP, somewhat more).

It starts its own PostgreSQL (``supervision.dev.postgres.PostgresServer`` in a temp dir:
loopback TCP, fsync and synchronous_commit off) and the media stand-in
(``tests/media_stub.py``) as a separate process, and always stops both. Run:

    .venv/bin/python bench/conference_reaper.py [--batch-size 100] [--rounds 7]
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

import attrs
import psycopg
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script

from actors.leases.lock_keeper import CycleContext
from actors.reaper.cycle import ReaperJob, run_reaper_cycle
from actors.reaper.recorder_signal import open_media_client
from supervision.app.settings import config_from_dict
from supervision.db.database import open_database
from supervision.db.migrate import install_demo
from supervision.dev.postgres import PostgresServer
from supervision.jobs import Job
from supervision.logs import configure_logging

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
# the job's payload (SPEC §4), as conference_sessions.sql builds it
PAYLOAD = """jsonb_build_object(
    'ConferenceId', u.id, 'ChatId', u.chat_id, 'DealId', u.deal_id, 'TenantId', u.tenant_id,
    'MediaType', u.media_type, 'Status', u.status, 'EndReason', u.end_reason,
    'StartedByUserId', u.started_by_user_id,
    'StartedAt', to_char(u.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'EndedAt', to_char(u.ended_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'DurationSeconds', u.duration_seconds, 'PeakParticipantCount', u.peak_participant_count,
    'Participants', COALESCE((
        SELECT jsonb_agg(jsonb_build_object(
                   'UserId', p.user_id, 'Role', p.role,
                   'JoinedAt', to_char(p.joined_at AT TIME ZONE 'UTC',
                                       'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                   'LeftAt', to_char(p.left_at AT TIME ZONE 'UTC',
                                     'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
               ORDER BY p.joined_at, p.user_id)
        FROM messenger.conference_participants p WHERE p.conference_id = u.id), '[]'),
    'WasRecorded', EXISTS (
        SELECT 1 FROM messenger.call_recordings r
        WHERE r.session_kind = 'Conference' AND r.session_id = u.id AND r.status <> 'Failed'),
    'RecordingId', (
        SELECT r.id FROM messenger.call_recordings r
        WHERE r.session_kind = 'Conference' AND r.session_id = u.id AND r.status <> 'Failed'
        ORDER BY r.created_at DESC, r.id DESC LIMIT 1))"""
BARE_PAYLOAD = "jsonb_build_object('ConferenceId', u.id)"
ENDED = """
    WITH u AS (
        UPDATE messenger.conference_sessions SET status = 'Ended', end_reason = %(reason)s,
            ended_at = now(),
            duration_seconds = floor(extract(epoch FROM now() - started_at))::int,
            updated_at = now()
        WHERE status = 'Active' AND last_activity_at <= now() - %(window)s * interval '1s'
          AND (%(empty)s = false OR active_participant_count = 0)
        RETURNING *
    ),
    o AS (
        INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key, event_type,
                                                  payload)
        SELECT 'pin.messenger.conference-ended.v1', u.deal_id::text, u.id::text,
               'ConferenceEnded', {payload}
        FROM u
    )
    INSERT INTO messenger.realtime_outbox (kind, target_kind, chat_id, session_kind,
                                           reference_id, payload)
    SELECT 'ConferenceEnded', 'ChatGroup', u.chat_id, 'Conference', u.id,
           jsonb_build_object('ConferenceId', u.id, 'Status', u.status,
                              'EndReason', u.end_reason)
    FROM u
"""
FAILED = """
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
"""
FLOORS = {"same writes": ENDED.replace("{payload}", PAYLOAD),
          "bare": ENDED.replace("{payload}", BARE_PAYLOAD)}


def seed(dsn: str, per_phase: int, every: int = 10) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(RESET)
        conn.execute(SEED, {"n": per_phase, "every": every})
        conn.execute("VACUUM ANALYZE messenger.conference_sessions")


def floor_once(conn: psycopg.Connection[Any], ended: str) -> tuple[float, int]:
    """The three phases' writes as plain SQL on an open connection, one transaction."""
    started = time.perf_counter()
    with conn.transaction():
        n = conn.execute(ended, {"reason": "EmptyTimeout", "window": 90, "empty": True}
                         ).rowcount
        n += conn.execute(FAILED, {"window": 120}).rowcount
        n += conn.execute(ended, {"reason": "Timeout", "window": 14400, "empty": False}
                          ).rowcount
    return time.perf_counter() - started, n


@attrs.define
class Timings:
    cycle: list[float] = attrs.field(factory=list)
    floors: dict[str, list[float]] = attrs.field(factory=lambda: {k: [] for k in FLOORS})
    reaped: set[int] = attrs.field(factory=set)
    floor_rows: set[int] = attrs.field(factory=set)


async def measure(dsn: str, base_url: str, batch_size: int, rounds: int, every: int
                  ) -> Timings:
    """Rounds of: seed, time one cycle; then for each floor: seed, time it."""
    cfg = config_from_dict({"postgres": {"dsn": dsn}, "media": {"base_url": base_url},
                            "jobs": {"conference_reaper": {"batch_size": batch_size}}})
    out = Timings()
    async with open_database(dsn, size=4) as db, open_media_client(cfg.media) as http:
        job = ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http)
        await run_reaper_cycle(job, CycleContext(Job.CONFERENCE_REAPER, "warm-up"))
        with psycopg.connect(dsn, autocommit=True) as floor_conn:
            for ended in FLOORS.values():  # warm-up
                seed(dsn, batch_size, every)
                floor_once(floor_conn, ended)
            for _ in range(rounds):
                seed(dsn, batch_size, every)
                started = trio.current_time()
                counts = await run_reaper_cycle(
                    job, CycleContext(Job.CONFERENCE_REAPER, str(uuid.uuid4())))
                out.cycle.append(trio.current_time() - started)
                out.reaped.add(counts.empty_timeout + counts.provision_failed
                               + counts.stale_timeout)
                for name, ended in FLOORS.items():
                    seed(dsn, batch_size, every)
                    elapsed, n = floor_once(floor_conn, ended)
                    out.floors[name].append(elapsed)
                    out.floor_rows.add(n)
    return out


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
        install_demo(server.dsn)
        # the stand-in in a process of its own, as the media stack would be (in this one
        # its HTTP threads would compete with the cycle for the GIL)
        with subprocess.Popen([sys.executable, "-m", "tests.media_stub"], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
                              ) as media:
            assert media.stdin is not None and media.stdout is not None
            base_url = media.stdout.readline().strip()
            try:
                timings = trio.run(measure, server.dsn, base_url, args.batch_size,
                                   args.rounds, args.record_every)
            finally:
                media.stdin.close()
                stops = int(media.stdout.readline() or 0)
    finally:
        server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)
    print(f"{3 * args.batch_size} due conferences per cycle (batch_size {args.batch_size} x 3"
          f" phases, 4 participants each, a running recording on every"
          f" {args.record_every or 'no'}th ended room); reaped per cycle:"
          f" {sorted(timings.reaped)}; floor rows: {sorted(timings.floor_rows)};"
          f" recorder stops received by the stand-in: {stops} in {args.rounds} rounds;"
          f" load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    med_cycle = statistics.median(timings.cycle)
    print("cycle (run_reaper_cycle)   ms: " + _ms(timings.cycle))
    for name, values in timings.floors.items():
        print(f"floor, {name + ' (plain SQL)':19s} ms: " + _ms(values))
    for name, values in timings.floors.items():
        floor = statistics.median(values)
        print(f"median cycle {med_cycle * 1e3:.1f} ms / median floor ({name})"
              f" {floor * 1e3:.1f} ms = {med_cycle / floor:.1f}x")
    same = statistics.median(timings.floors["same writes"])
    print(f"target: cycle < 10 x floor (same writes):"
          f" {'ok' if med_cycle < 10 * same else 'MISSED'};"
          f" cycle < 500 ms: {'ok' if med_cycle < 0.5 else 'MISSED'}")


def _ms(values: list[float]) -> str:
    return " ".join(f"{v * 1e3:.1f}" for v in values)


if __name__ == "__main__":
    main()
