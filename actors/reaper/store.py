"""The conference-reaper job's transactions: plain functions run by ``Database.atomic``.

>>> result = await db.atomic(reap_phase, EMPTY_ROOM, cfg, as_of, job_run_id)

One phase's batch is one transaction: the claim (``FOR UPDATE SKIP LOCKED``, the locks are
held to the commit), then the transitions with their integration and realtime outbox rows
in one set-based statement (``conference_sessions_reap``) inside a SAVEPOINT. When that
statement fails on the data of some row (a ``DataError``/``IntegrityError``: a value
that does not fit), the savepoint rolls back and the same statement runs once per claimed
conference, each in its own SAVEPOINT, so the poison is isolated and the rest commits.
Rows the guard rejects (started after AsOf) never fail the statement: they come back as
rejected and are left untouched. SQL is called by name from
``actors/reaper/sql/conference_sessions.sql``.

Poison (rejected or isolated rows) is remembered in ``safetynet.conference_poison`` in the
same transaction (``conference_poison.sql``): the claims pass over it until its back-off
(``polling_interval x 2^failures``, at most ``poison_backoff_cap``) has run out, so
``batch_size`` poison rows cannot starve a phase; reaping a conference forgets it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from psycopg.rows import dict_row

from actors.envelope import TOPIC_CONFERENCE_ENDED, event_headers
from actors.reaper.messages import SOURCE, ItemFailed, Phase, PhaseResult, Reaped
from actors.reaper.queries import REAPER_QUERIES
from actors.reaper.settings import ConferenceReaperConfig

# A row whose data the database rejects: isolate it. Anything else (connection lost,
# a bug in the SQL) fails the whole batch, which rolls back.
POISON_ERRORS = (psycopg.DataError, psycopg.IntegrityError)


def window_of(phase: Phase, cfg: ConferenceReaperConfig) -> float:
    """How long a conference must have been idle (or unadmitted) for *phase*, seconds."""
    if phase.outcome == "empty_timeout":
        return cfg.empty_room_grace
    if phase.outcome == "provision_failed":
        return cfg.provision_timeout
    return cfg.stale_live_timeout


def reap_phase(conn: psycopg.Connection, phase: Phase, cfg: ConferenceReaperConfig,
               as_of: dt.datetime, job_run_id: str) -> PhaseResult:
    """Claim *phase*'s due conferences and make them terminal, in the caller's transaction."""
    rows = conn.execute(REAPER_QUERIES[phase.claim_query], {
        "as_of": as_of, "window": window_of(phase, cfg), "batch_size": cfg.batch_size,
    }).fetchall()
    skipped = int(rows[0][1]) if rows else 0
    ids = [str(r[0]) for r in rows if r[0] is not None]
    if not ids:
        return PhaseResult(phase, 0, skipped, (), (), fallback=False)
    try:
        with conn.transaction():  # SAVEPOINT: a poison row rolls back only this statement
            records = _reap(conn, phase, as_of, job_run_id, ids)
        fallback = False
    except POISON_ERRORS:
        records, fallback = [], True
        for cid in ids:
            try:
                with conn.transaction():
                    records.extend(_reap(conn, phase, as_of, job_run_id, [cid]))
            except POISON_ERRORS as exc:
                records.append({"id": cid, "rejected": _describe(exc)})
    reaped, failed = [], []
    for rec in records:
        if rec.get("status") == phase.to_status:
            reaped.append(Reaped(
                conference_id=str(rec["id"]), chat_id=str(rec["chat_id"]),
                deal_id=str(rec["deal_id"]), tenant_id=_text(rec["tenant_id"]),
                status=rec["status"],
                end_reason=rec["end_reason"], duration_seconds=rec["duration_seconds"],
                active_recordings=tuple(str(r) for r in rec["active_recordings"]),
                enqueued=bool(rec["enqueued"])))
        elif rec.get("rejected"):
            failed.append(ItemFailed(str(rec["id"]), str(rec["rejected"]),
                                     _text(rec.get("tenant_id"))))
    if failed:
        _remember_poison(conn, phase, cfg, as_of, failed)
    return PhaseResult(phase, len(ids), skipped, tuple(reaped), tuple(failed), fallback)


def _remember_poison(conn: psycopg.Connection, phase: Phase, cfg: ConferenceReaperConfig,
                     as_of: dt.datetime, failed: list[ItemFailed]) -> None:
    """Keep *failed* out of the claim for a back-off (same transaction as the batch)."""
    conn.execute(REAPER_QUERIES["conference_poison_record"], {
        "ids": [f.conference_id for f in failed], "reasons": [f.error for f in failed],
        "phase": phase.name, "as_of": as_of, "interval": cfg.polling_interval,
        "cap": cfg.poison_backoff_cap,
    })


def prune_poison(conn: psycopg.Connection) -> None:
    """Forget poison conferences that are no longer active."""
    conn.execute(REAPER_QUERIES["conference_poison_prune"])


def poisoned_count(conn: psycopg.Connection) -> int:
    """Remembered poison conferences that are still active."""
    row = conn.execute(REAPER_QUERIES["conference_poison_count"]).fetchone()
    assert row is not None
    return int(row[0])


def _reap(conn: psycopg.Connection, phase: Phase, as_of: dt.datetime, job_run_id: str,
          ids: list[str]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(REAPER_QUERIES["conference_sessions_reap"],
                           reap_params(phase, as_of, job_run_id, ids)).fetchall()


def reap_params(phase: Phase, as_of: dt.datetime, job_run_id: str,
                ids: list[str]) -> dict[str, Any]:
    """``conference_sessions_reap``'s parameters for *ids* in *phase*."""
    headers = [event_headers(TOPIC_CONFERENCE_ENDED, cid, "ConferenceEnded", job_run_id,
                             SOURCE) for cid in ids]
    return {"ids": ids, "headers": headers, "as_of": as_of,
            "from_status": phase.from_status, "to_status": phase.to_status,
            "end_reason": phase.end_reason, "emit_event": phase.emits_event,
            "topic": TOPIC_CONFERENCE_ENDED, "realtime_kind": phase.realtime_kind}


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _describe(exc: psycopg.Error) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:200]


def active_backlog(conn: psycopg.Connection, cfg: ConferenceReaperConfig) -> int:
    """Active conferences whose window is exceeded now (any phase)."""
    row = conn.execute(REAPER_QUERIES["conference_sessions_active_backlog"], {
        "empty_room_grace": cfg.empty_room_grace, "provision_timeout": cfg.provision_timeout,
        "stale_live_timeout": cfg.stale_live_timeout,
    }).fetchone()
    assert row is not None
    return int(row[0])
