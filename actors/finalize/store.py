"""The recording-finalize job's transactions: plain functions ``Database`` runs in a transaction.

Each function is one unit of work on one connection inside one transaction; SQL is
called by name from ``actors/finalize/sql/recording_finalize_attempts.sql``.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import attrs
import psycopg
from psycopg.types.string import TextLoader

from actors.envelope import TOPIC_RECORDING_AVAILABLE, event_header_fields
from actors.finalize.messages import AttemptStatus, ClaimedRow, ClaimPhase
from actors.finalize.queries import FINALIZE_QUERIES
from actors.finalize.settings import RecordingFinalizeConfig
from supervision.jobs import Job

SOURCE = f"safetynet.{Job.RECORDING_FINALIZE}"


@attrs.frozen
class Claim:
    rows: list[ClaimedRow]
    rescheduled: int  # 'wait' rows: session not ended / SLA not passed; not an attempt
    skipped_locked: int


def claim_due(conn: psycopg.Connection, cfg: RecordingFinalizeConfig, as_of: dt.datetime,
              s3_down: bool, batch: int = 0) -> Claim:
    """Claim up to ``cfg.batch_size`` due rows, as the cycle's claim number *batch*."""
    params = {
        "as_of": as_of, "batch_size": cfg.batch_size, "sla": cfg.finalize_sla_timeout,
        "recheck": cfg.polling_interval, "backoff_base": cfg.backoff_base,
        "backoff_factor": cfg.backoff_factor, "backoff_cap": cfg.backoff_cap,
        "backoff_jitter": cfg.backoff_jitter, "s3_down": s3_down,
    }
    # tuple rows, columns looked up by name once per claim, uuid columns loaded as text:
    # a dict and a uuid.UUID per row were a tenth of the daemon's CPU in a drain
    with conn.cursor() as cur:
        cur.adapters.register_loader("uuid", TextLoader)
        cur.execute(FINALIZE_QUERIES["finalize_attempts_claim_plan"])  # SET LOCAL: see the SQL
        records = cur.execute(FINALIZE_QUERIES["finalize_attempts_claim_due"], params).fetchall()
        col = {c.name: i for i, c in enumerate(cur.description or ())}
    rows: list[ClaimedRow] = []
    rescheduled, skipped = 0, 0
    if not records:
        return Claim(rows, rescheduled, skipped)
    (i_id, i_rec, i_kind, i_sess, i_att, i_phase, i_status, i_old_att, i_old_next, i_tenant,
     i_poison, i_ended, i_skipped) = (col[name] for name in (
        "id", "recording_id", "session_kind", "session_id", "attempts", "phase",
        "recording_status", "old_attempts", "old_next_attempt_at", "tenant_id",
        "poison_reason", "session_ended_at", "skipped_locked"))
    for rec in records:
        skipped = int(rec[i_skipped])
        if rec[i_id] is None:
            continue
        if rec[i_phase] == ClaimPhase.WAIT:
            rescheduled += 1
            continue
        rows.append(ClaimedRow(
            attempt_id=rec[i_id], recording_id=rec[i_rec], session_kind=rec[i_kind],
            session_id=rec[i_sess], attempts=rec[i_att], phase=rec[i_phase],
            recording_status=rec[i_status], old_attempts=rec[i_old_att],
            old_next_attempt_at=rec[i_old_next], tenant_id=rec[i_tenant],
            poison_reason=rec[i_poison], session_ended_at=rec[i_ended], batch=batch,
        ))
    return Claim(rows, rescheduled, skipped)


@attrs.frozen
class Applied:
    transitioned: bool
    enqueued: bool
    closed: bool
    # the recording was held by another transaction (the ingest callback): nothing was
    # written, the row got its attempt back and is due again from now
    skipped_locked: bool = False


def publish_available(conn: psycopg.Connection,
                           rows: list[tuple[ClaimedRow, dict[str, Any] | None]],
                           job_run_id: str) -> list[Applied]:
    """Adopt each row's *found* metadata (→ Available) when given, enqueue the event where
    missing, close the finalize rows — one statement; results in input order."""
    items = [{
        "attempt_id": row.attempt_id, "recording_id": row.recording_id,
        "transition": found is not None, "file_id": found and found["file_id"],
        "size_bytes": found and found["size_bytes"],
        "duration_seconds": found and found["duration_seconds"],
        "format": found and found["format"], "old_attempts": row.old_attempts,
        "headers": event_header_fields(TOPIC_RECORDING_AVAILABLE, row.recording_id,
                                       "CallRecordingAvailable", job_run_id, SOURCE),
    } for row, found in rows]
    records = conn.execute(FINALIZE_QUERIES["finalize_attempts_publish_available"], {
        "topic": TOPIC_RECORDING_AVAILABLE, "rows": json.dumps(items)}).fetchall()
    by_attempt = {str(r[0]): Applied(bool(r[1]), bool(r[2]), bool(r[3]), bool(r[4]))
                  for r in records}
    return [by_attempt[row.attempt_id] for row, _ in rows]


def fail_timeout(conn: psycopg.Connection, rows: list[ClaimedRow]) -> list[Applied]:
    """Missing binary past the SLA → Failed/Timeout for each row, one statement; results
    in input order."""
    records = conn.execute(FINALIZE_QUERIES["finalize_attempts_fail_timeout"], {
        "attempt_ids": [row.attempt_id for row in rows],
        "recording_ids": [row.recording_id for row in rows],
        "old_attempts": [row.old_attempts for row in rows],
    }).fetchall()
    by_attempt = {str(r[0]): Applied(bool(r[1]), bool(r[2]), bool(r[3]), bool(r[4]))
                  for r in records}
    return [by_attempt[row.attempt_id] for row in rows]


def record_transient(conn: psycopg.Connection, row: ClaimedRow, error: str,
                     max_attempts: int) -> AttemptStatus | None:
    """Keep the row Pending with its back-off, or quarantine it at max_attempts."""
    rec = conn.execute(FINALIZE_QUERIES["finalize_attempts_record_transient"], {
        "id": row.attempt_id, "last_error": error[:512], "max_attempts": max_attempts,
    }).fetchone()
    return None if rec is None else AttemptStatus(rec[0])


def quarantine(conn: psycopg.Connection, row: ClaimedRow, reason: str) -> bool:
    rec = conn.execute(FINALIZE_QUERIES["finalize_attempts_quarantine"],
                       {"id": row.attempt_id, "last_error": reason[:512]}).fetchone()
    return rec is not None


def unclaim(conn: psycopg.Connection, row: ClaimedRow,
            next_attempt_at: dt.datetime | None = None) -> None:
    """Give a row back untouched: a configuration fault consumes no attempt. Due again at
    *next_attempt_at* (default: when it was due before the claim)."""
    conn.execute(FINALIZE_QUERIES["finalize_attempts_unclaim"], {
        "id": row.attempt_id, "old_attempts": row.old_attempts,
        "old_next_attempt_at": next_attempt_at or row.old_next_attempt_at,
    })


def unclaim_many(conn: psycopg.Connection, rows: list[ClaimedRow],
                 next_attempt_at: list[dt.datetime] | None = None) -> None:
    """Give a group of rows back untouched, in one statement; each due again at its
    *next_attempt_at* (default: when it was due before the claim)."""
    conn.execute(FINALIZE_QUERIES["finalize_attempts_unclaim_many"], {
        "ids": [row.attempt_id for row in rows],
        "old_attempts": [row.old_attempts for row in rows],
        "old_next_attempt_at": (next_attempt_at if next_attempt_at is not None
                                else [row.old_next_attempt_at for row in rows]),
    })


def known_present(conn: psycopg.Connection, limit: int) -> list[str]:
    """Recordings whose binary is known to exist (the positive canary's candidates)."""
    records = conn.execute(FINALIZE_QUERIES["finalize_attempts_known_present"], {"limit": limit})
    return [str(rec[0]) for rec in records.fetchall()]


@attrs.frozen
class Stats:
    backlog: int
    due: int
    quarantined: int
    oldest_age_seconds: float


def stats(conn: psycopg.Connection) -> Stats:
    rec = conn.execute(FINALIZE_QUERIES["finalize_attempts_stats"]).fetchone()
    assert rec is not None
    return Stats(int(rec[0]), int(rec[1]), int(rec[2]), float(rec[3]))
