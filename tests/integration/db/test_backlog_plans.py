"""The claim, gauge and auditor queries at a backlog: no plan reads a messenger table whole.

At a million due rows a sequential scan of call_recordings is seconds per gauge refresh
and hundreds of milliseconds per claim (docs/benchmarks.md, "A million-row backlog").
The shape that exposed them, 20,000 due rows, is enough for the planner to price a full
scan against the index paths; EXPLAIN without ANALYZE keeps the test cheap.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from actors.audit.invariants import Thresholds
from actors.envelope import TOPIC_RECORDING_AVAILABLE
from actors.finalize.queries import FINALIZE_QUERIES
from actors.reaper.messages import EMPTY_ROOM
from actors.reaper.store import reap_params
from supervision.app.queries import ALL_QUERIES

ROWS = 20_000
SEED = """
WITH src AS (
    SELECT md5('r' || n)::uuid AS rid, md5('s' || n)::uuid AS sid, md5('a' || n)::uuid AS aid,
           n %% 500 = 9 AS available
    FROM generate_series(0, %(rows)s - 1) AS n
),
sessions AS (
    INSERT INTO messenger.call_sessions (id, status, started_at, ended_at, created_at,
        updated_at)
    SELECT sid, 'Ended', now() - interval '2 hours', now() - interval '1 hour',
           now() - interval '2 hours', now()
    FROM src
),
recordings AS (
    INSERT INTO messenger.call_recordings (id, session_kind, session_id, media_type,
        trigger, status, file_id, created_at, updated_at)
    SELECT rid, 'Direct', sid, 'Audio', 'Manual',
           CASE WHEN available THEN 'Available' ELSE 'Uploading' END,
           CASE WHEN available THEN 'f/' || rid END, now() - interval '2 hours', now()
    FROM src
)
INSERT INTO messenger.recording_finalize_attempts (id, recording_id, session_kind,
    session_id, status, attempts, next_attempt_at, created_at, updated_at)
SELECT aid, rid, 'Direct', sid, 'Pending', 0, now() - interval '1 second',
       now() - interval '1 hour', now()
FROM src
"""
# live rooms (not due) and a tenth of due ones in each phase's window
CONFERENCES = """
INSERT INTO messenger.conference_sessions (id, chat_id, deal_id, media_type, status,
    started_by_user_id, created_at, started_at, last_activity_at,
    active_participant_count, peak_participant_count, updated_at)
SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'Video',
       CASE WHEN g %% 30 = 1 THEN 'Provisioning' ELSE 'Active' END, gen_random_uuid(),
       now() - interval '6 hours' - g * interval '1 ms', now() - interval '5 hours',
       CASE WHEN g %% 10 <> 0 THEN now() - random() * interval '1 hour'
            ELSE now() - interval '5 hours' - g * interval '1 ms' END,
       CASE WHEN g %% 20 = 0 THEN 0 ELSE 2 END, 4, now()
FROM generate_series(1, %(rows)s) AS g
"""
TABLES = ("call_recordings", "recording_finalize_attempts", "call_sessions",
          "conference_sessions")


def queries() -> list[tuple[str, str, dict[str, Any]]]:
    claim = {"as_of": dt.datetime.now(dt.UTC), "batch_size": 100, "sla": 1800.0,
             "recheck": 1.0, "backoff_base": 0.2, "backoff_factor": 2.0, "backoff_cap": 1.0,
             "backoff_jitter": 0.1}
    windows = {"empty_room_grace": 90.0, "provision_timeout": 120.0,
               "stale_live_timeout": 14400.0}
    out = [
        ("claim", "finalize_attempts_claim_due", {**claim, "s3_down": False}),
        ("claim while S3 is down", "finalize_attempts_claim_due", {**claim, "s3_down": True}),
        ("finalize stats gauge", "finalize_attempts_stats", {}),
        ("SLO gauge", "slo_recordings", {"sla": 1800.0, "interval": 1.0}),
        ("reaper backlog gauge", "conference_sessions_active_backlog", windows),
    ]
    for phase, window in (("empty_room", 90.0), ("provision_timeout", 120.0),
                          ("stale_live", 14400.0)):
        out.append((f"reaper {phase} claim", f"conference_sessions_claim_{phase}",
                    {"as_of": claim["as_of"], "window": window, "batch_size": 100}))
    audit = Thresholds().params()
    out += [(name, name, audit) for name in AUDIT_ACTIVE]
    return out


def analyze(conn: psycopg.Connection, name: str, params: dict[str, Any]) -> str:
    """The named query's plan as run (EXPLAIN ANALYZE, BUFFERS); its writes stay in the
    open transaction for the caller to look at and roll back."""
    return "\n".join(r[0] for r in conn.execute(
        b"EXPLAIN (ANALYZE, BUFFERS) " + ALL_QUERIES[name].encode(), params).fetchall())


def buffers(plan: str) -> int:
    """Shared buffers hit + read of the plan's largest node."""
    return max(sum(int(n) for n in re.findall(r"shared (?:hit|read)=(\d+)", line))
               for line in plan.splitlines() if "Buffers:" in line)


# the auditor actor's scans of rows that are not terminal yet: every recording and room of
# a backlog is one (terminal transitions and outbox rows are read within a time window)
AUDIT_ACTIVE = ("audit_recordings_active", "audit_conferences_active")
SCANNED = {"audit_recordings_active": "call_recordings",
           "audit_conferences_active": "conference_sessions"}


@pytest.fixture
def backlog(db_dsn: str) -> str:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute(SEED, {"rows": ROWS})
        conn.execute(CONFERENCES, {"rows": ROWS})
        conn.execute("VACUUM ANALYZE messenger.call_sessions, messenger.call_recordings,"
                     " messenger.recording_finalize_attempts, messenger.conference_sessions")
    return db_dsn


def group_commit_params(rows: list[tuple[Any, Any]]) -> dict[str, dict[str, Any]]:
    """The parameters of the two group commits (Failed/Timeout, reconciled Available) for
    *rows* of (attempt id, recording id), as the committer sends them."""
    return {
        "finalize_attempts_fail_timeout": {
            "attempt_ids": [r[0] for r in rows], "recording_ids": [r[1] for r in rows],
            "old_attempts": [0] * len(rows)},
        "finalize_attempts_publish_available": {
            "topic": TOPIC_RECORDING_AVAILABLE, "rows": json.dumps([
                {"attempt_id": str(a), "recording_id": str(r), "transition": True,
                 "file_id": f"f/{r}", "size_bytes": 1, "duration_seconds": 1,
                 "format": "ogg", "old_attempts": 0, "headers": {}} for a, r in rows])},
    }


def applied_groups(conn: psycopg.Connection, rows: list[tuple[Any, Any]],
                   expected: int) -> Iterator[tuple[str, str]]:
    """Each group commit of *rows* run under EXPLAIN ANALYZE: (its name, its plan), once
    the group was seen to apply (*expected* rows Done), then rolled back."""
    for name, params in group_commit_params(rows).items():
        plan = analyze(conn, name, params)
        done = conn.execute("SELECT count(*) FROM messenger.recording_finalize_attempts"
                            " WHERE status = 'Done'").fetchone()
        conn.rollback()
        assert done == (expected,), plan  # the group was applied
        yield name, plan


def test_claims_and_gauges_read_no_messenger_table_whole_at_a_backlog(backlog: str) -> None:
    """20,000 due finalize rows (every 500th recording Available) and 20,000 active rooms
    (a tenth due): every claim and gauge plan reaches those tables through indexes only,
    with the planner free to choose (sequential scans not priced out)."""
    offenders = []
    with psycopg.connect(backlog) as conn:
        for label, name, params in queries():
            plan = "\n".join(r[0] for r in conn.execute(
                b"EXPLAIN " + ALL_QUERIES[name].encode(), params).fetchall())
            conn.rollback()
            offenders += [f"{label}: {line.strip()}" for line in plan.splitlines()
                          if "Seq Scan" in line and any(f" {t} " in line for t in TABLES)]
    assert offenders == [], "\n".join(offenders)


def test_the_auditor_stops_at_its_limit_at_a_backlog_past_the_slo(backlog: str) -> None:
    """Every one of the 20,000 recordings is past the SLO and 2,000 rooms are past a
    reaper window: with a limit of 10, each of the auditor's scans of not-yet-terminal
    rows finds its 10 violations in a few hundred buffers, reading recordings and rooms
    only through the indexes of the not-yet-terminal ones. Ordered by id, they walked the
    primary keys (every recording and room, terminal history included) or, at a million
    rows, probed and sorted every active recording: 12 s (docs/benchmarks.md)."""
    params = Thresholds(limit=10).params()
    read, through = {}, set()
    with psycopg.connect(backlog) as conn:
        for name in AUDIT_ACTIVE:
            plan = analyze(conn, name, params)
            assert conn.execute(ALL_QUERIES[name], params).rowcount == 10, plan
            read[name] = buffers(plan)
            table = SCANNED[name]  # (the recordings' lateral probes of rooms are by key)
            through |= {(index, table) for index in re.findall(
                rf"Scan(?: Backward)? using (\w+) on {table} ", plan)}
    assert all(n < 500 for n in read.values()), read
    assert through == {("ix_recording_active", "call_recordings"),
                       ("ix_conf_provisioning", "conference_sessions"),
                       ("ix_conf_empty_room", "conference_sessions"),
                       ("ix_conf_active", "conference_sessions")}, through


def test_an_available_recording_is_read_by_its_key_when_statistics_predate_a_drain(
        backlog: str) -> None:
    """The statistics were taken with 0.2% of the recordings terminal; then 15,000 became
    Failed (a drain, before autoanalyze). Publishing one Available recording reads it by
    its key: joined, the planner trusted the statistics and walked every terminal
    recording through ix_recording_terminal_updated in each statement (0.3 s per
    statement at 170,000, docs/benchmarks.md)."""
    with psycopg.connect(backlog) as conn:
        conn.execute("ALTER TABLE messenger.call_recordings SET (autovacuum_enabled = off)")
        conn.execute("UPDATE messenger.call_recordings SET status = 'Failed',"
                      " failure_reason = 'Timeout', updated_at = now() WHERE id IN"
                      " (SELECT id FROM messenger.call_recordings WHERE status = 'Uploading'"
                      " LIMIT 15000)")
        conn.commit()
        attempt, recording = conn.execute(
            "SELECT a.id, a.recording_id FROM messenger.recording_finalize_attempts a JOIN"
            " messenger.call_recordings r ON r.id = a.recording_id"
            " WHERE r.status = 'Available' LIMIT 1").fetchone()  # type: ignore[misc]
        rows = [{"attempt_id": str(attempt), "recording_id": str(recording),
                 "transition": False, "old_attempts": 0, "headers": {"event-id": "x"}}]
        plan = analyze(conn, "finalize_attempts_publish_available",
                       {"topic": TOPIC_RECORDING_AVAILABLE, "rows": json.dumps(rows)})
        enqueued = conn.execute("SELECT count(*) FROM messenger.integration_outbox WHERE"
                                " dedupe_key = %s", (str(recording),)).fetchone()
        conn.rollback()
    assert enqueued == (1,)  # the statement did publish it
    assert "ix_recording_terminal_updated" not in plan, plan
    assert buffers(plan) < 300, plan


def test_group_commits_reach_rows_by_key_when_statistics_say_nothing_is_due(
        backlog: str) -> None:
    """Statistics taken at a quiet time (no recording active, no finalize row Pending),
    then 20,000 of each (an outage's backlog, before autoanalyze): a group of 50 Failed
    verdicts and a group of 50 Available outcomes each reach their rows by key. With
    plain status guards the planner believed the partial indexes on status empty and
    scanned them whole in every statement: the backlog read once per group."""
    with psycopg.connect(backlog) as conn:
        for table in ("call_recordings", "recording_finalize_attempts"):
            conn.execute(f"ALTER TABLE messenger.{table} SET (autovacuum_enabled = off)")
        conn.execute("UPDATE messenger.call_recordings SET status = 'Failed',"
                     " failure_reason = 'Timeout' WHERE status = 'Uploading'")
        conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Done'")
        conn.commit()
        conn.execute("ANALYZE messenger.call_recordings, messenger.recording_finalize_attempts")
        conn.execute("UPDATE messenger.call_recordings SET status = 'Uploading',"
                     " failure_reason = NULL WHERE status = 'Failed'")
        conn.execute("UPDATE messenger.recording_finalize_attempts SET status = 'Pending'")
        conn.commit()
        rows = conn.execute(
            "SELECT a.id, a.recording_id FROM messenger.recording_finalize_attempts a JOIN"
            " messenger.call_recordings r ON r.id = a.recording_id"
            " WHERE r.status = 'Uploading' LIMIT 50").fetchall()
        for _name, plan in applied_groups(conn, rows, 50):
            scans = set(re.findall(r"Scan using (ix_\w+) on", plan))
            assert not scans & {"ix_recording_active", "ix_rfa_pending_created",
                                "ix_rfa_due"}, plan


def test_reaping_a_batch_reads_only_its_conferences_recordings(backlog: str) -> None:
    """20,000 recordings of calls and a batch of 100 rooms to end: the reap statement
    finds the rooms' recordings (terminal ones too) through ix_recording_session, never by
    reading call_recordings whole, a cost that grew with every recording ever made."""
    with psycopg.connect(backlog) as conn:
        ids = [str(r[0]) for r in conn.execute(
            "SELECT id FROM messenger.conference_sessions WHERE status = 'Active'"
            " AND active_participant_count = 0 LIMIT 100").fetchall()]
        plan = analyze(conn, "conference_sessions_reap",
                       reap_params(EMPTY_ROOM, dt.datetime.now(dt.UTC), "run", ids))
        ended = conn.execute("SELECT count(*) FROM messenger.conference_sessions"
                             " WHERE status = 'Ended'").fetchone()
        conn.rollback()
    assert ended == (len(ids),), plan  # the batch was reaped
    assert "Seq Scan on call_recordings" not in plan, plan
    assert "ix_recording_session on call_recordings" in plan, plan


def largest_node(plan: str) -> int:
    """The most rows any node of the plan handled (over all its loops)."""
    return max((round(float(rows) * int(loops)) for rows, loops in re.findall(
        r"actual time=[\d.]+\.\.[\d.]+ rows=([\d.]+) loops=(\d+)", plan)), default=0)


def test_a_claim_and_its_group_commit_handle_only_the_batch_under_empty_table_statistics(
        db_dsn: str) -> None:
    """Tables analyzed while empty (a daemon started before an outage's backlog exists,
    autoanalyze not yet run), then 20,000 recordings due at once: the claim of a batch of
    100 and the group commit of those 100 Available outcomes (and of 100 Failed verdicts)
    each handle no more than a few times the batch in any plan node. Believing a handful
    of rows due, the claim read and sorted every due row twice (bitmap scans of ix_rfa_due)
    and the group commits hashed the group against call_recordings read whole: 34 s over
    the seed's SLO in bench/recorder_outage.py (docs/benchmarks.md)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for table in TABLES:
            conn.execute(f"ALTER TABLE messenger.{table} SET (autovacuum_enabled = off)")
        conn.execute("ANALYZE messenger.call_sessions, messenger.call_recordings,"
                     " messenger.recording_finalize_attempts")
        conn.execute(SEED, {"rows": ROWS})
    claim = {"as_of": dt.datetime.now(dt.UTC), "batch_size": 100, "sla": 1800.0,
             "recheck": 1.0, "backoff_base": 0.2, "backoff_factor": 2.0, "backoff_cap": 1.0,
             "backoff_jitter": 0.1, "s3_down": False}
    largest = {}
    with psycopg.connect(db_dsn) as conn:
        conn.execute(FINALIZE_QUERIES["finalize_attempts_claim_plan"])
        plan = analyze(conn, "finalize_attempts_claim_due", claim)
        claimed = conn.execute("SELECT count(*) FROM messenger.recording_finalize_attempts"
                               " WHERE attempts = 1").fetchone()
        assert claimed == (100,), plan  # the batch was claimed
        largest["claim"] = largest_node(plan)
        conn.commit()
        rows = conn.execute(
            "SELECT a.id, a.recording_id FROM messenger.recording_finalize_attempts a JOIN"
            " messenger.call_recordings r ON r.id = a.recording_id"
            " WHERE a.attempts = 1 AND r.status = 'Uploading'").fetchall()
        for name, plan in applied_groups(conn, rows, len(rows)):
            largest[name] = largest_node(plan)
    assert len(rows) >= 90  # (every 500th recording is Available already: terminal)
    assert all(n <= 300 for n in largest.values()), largest
