"""The finalize committer: applies each row's outcome in its own transaction.

Inputs: :class:`RowOutcome` messages (receive channel). Outputs: the row's transition,
its finalize row, its integration and realtime outbox rows — one transaction per row,
under the status guard, so each row commits whole or not at all — plus counts, metrics,
the seed's log events, and a wake-up of the outbox relay after each enqueued event.
Restart type: none — it lives for one cycle.

Malformed data (a value the database rejects) quarantines that row with the reason in a
separate transaction; the rest of the batch proceeds. Infrastructure errors end the cycle:
uncommitted rows stay Pending and are retried idempotently by the next cycle.

What cancellation does: the row being committed finishes (``Database.atomic`` is a
must-complete block); outcomes still queued are dropped — their rows keep the attempt
pre-incremented at claim and come back after their back-off.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import psycopg
import structlog
import trio

from actors.finalize_messages import NotAttempted, RecordingMissing, RowOutcome, Terminal
from actors.finalize_state import FinalizeCounts
from actors.finalize_store import (
    fail_timeout,
    publish_available,
    quarantine,
    record_transient,
    unclaim,
)
from supervision.config import RecordingFinalizeConfig
from supervision.database import Database
from supervision.metrics import (
    RF_FAILED,
    RF_QUARANTINED,
    RF_RECONCILED,
    RF_REPUBLISHED,
    RF_TRANSIENT,
)
from supervision.objectstore import Fault, Found, Missing, Poison, Transient
from supervision.tracing import span

log = structlog.get_logger("finalize_committer")


async def serve_finalize_committer(
    db: Database, cfg: RecordingFinalizeConfig, job_run_id: str, counts: FinalizeCounts,
    inbox: trio.MemoryReceiveChannel[RowOutcome], wake_relay: Callable[[], None],
) -> None:
    """Commit outcomes until *inbox* is closed and drained."""
    async for outcome in inbox:
        row = outcome.row
        try:
            with span("recording-finalize.row", recording_id=row.recording_id,
                      phase=row.phase, attempts=row.attempts, tenant_id=row.tenant_id,
                      decision=type(outcome.decision).__name__):
                await _commit(db, cfg, job_run_id, counts, outcome, wake_relay)
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            reason = f"malformed:{type(exc).__name__}"
            log.error("item_failed", recording_id=outcome.row.recording_id, error=reason)
            if await db.atomic(quarantine, outcome.row, reason):
                _quarantined(counts, outcome, reason)


async def _commit(db: Database, cfg: RecordingFinalizeConfig, job_run_id: str,
                  counts: FinalizeCounts, outcome: RowOutcome,
                  wake_relay: Callable[[], None]) -> None:
    row, decision = outcome.row, outcome.decision
    if isinstance(decision, Found | Terminal):
        found = None if isinstance(decision, Terminal) else {
            k: v for k, v in attrs.asdict(decision).items()}
        applied = await db.atomic(publish_available, row, job_run_id, found)
        if applied.enqueued:
            wake_relay()
        if applied.transitioned:
            counts.reconciled += 1
            RF_RECONCILED.inc()
            log.info("recording_reconciled", recording_id=row.recording_id,
                     session_id=row.session_id, file_id=found and found["file_id"],
                     attempts=row.attempts)
        elif applied.enqueued:
            counts.republished += 1
            RF_REPUBLISHED.inc()
            log.info("recording_republished", recording_id=row.recording_id)
        elif applied.closed:
            log.info("recording_already_terminal", recording_id=row.recording_id)
    elif isinstance(decision, Missing):
        applied = await db.atomic(fail_timeout, row)
        if applied.transitioned:
            counts.failed += 1
            RF_FAILED.inc()
            log.warning("recording_failed", recording_id=row.recording_id,
                        failure_reason="Timeout", attempts=row.attempts)
        elif applied.closed:
            log.info("recording_already_terminal", recording_id=row.recording_id)
    elif isinstance(decision, Transient):
        status = await db.atomic(record_transient, row, f"s3:{decision.error}",
                                 cfg.max_attempts)
        RF_TRANSIENT.inc()
        if status == "Quarantined":
            _quarantined(counts, outcome, f"s3:{decision.error}")
        elif status == "Pending":
            counts.transient += 1
            log.info("recording_retry_scheduled", recording_id=row.recording_id,
                     attempts=row.attempts, error=f"s3:{decision.error}")
    elif isinstance(decision, Poison | RecordingMissing):
        reason = "recording_missing" if isinstance(decision, RecordingMissing) else (
            f"object:{decision.error}")
        if await db.atomic(quarantine, row, reason):
            _quarantined(counts, outcome, reason)
    elif isinstance(decision, Fault):
        await db.atomic(unclaim, row)
        counts.config_fault += 1
    elif isinstance(decision, NotAttempted):
        await db.atomic(unclaim, row)
        counts.deferred += 1


def _quarantined(counts: FinalizeCounts, outcome: RowOutcome, reason: str) -> None:
    counts.quarantined += 1
    RF_QUARANTINED.inc()
    log.error("recording_quarantined", recording_id=outcome.row.recording_id,
              attempts=outcome.row.attempts, reason=reason)
