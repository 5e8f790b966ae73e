"""The finalize claimer: claims due rows batch by batch and routes them.

Inputs: the cycle's AsOf and deadline, the database, the breaker. Outputs: rows that need a
HEAD go to the S3 reconciler pool; rows that do not (recording already terminal; no verdict
possible: recording or session missing, unknown session kind, session end in the future)
go straight to the committer. Restart type: none of its own — it lives and dies
with its cycle (the lock keeper's nested nursery).

Each claim is one short transaction (``finalize_attempts_claim_due``) that pre-increments
attempts and moves next_attempt_at, so a row in flight is never claimed twice. A claim
takes :func:`claim_size` rows: ``batch_size``, or more when the reconciler pool is larger
— at ``s3.concurrency`` 64 and 20 ms per HEAD a claim of 100 rows is worked in ~30 ms,
less than one claim transaction lasts on a loaded machine, and the pool went short of work
while the claimer was inside it (bench/latency_drain.py). The rows of one claim fit in
the pool's queue (the cycle sizes it so), so the next claim starts as soon as the previous
one is queued: claimed ahead, while the pool works the queued rows. It claims
until nothing is due, the cycle's ``max_run_duration`` is reached, the breaker opens, or
the cycle's ``max_failed_per_cycle`` Missing verdicts are spent.

What cancellation does: a claim in flight commits or rolls back whole (``atomic``); rows
already claimed but not yet committed keep their pre-incremented attempt and come back
after their back-off — the seed's at-least-once retry, never a lost row.
"""

from __future__ import annotations

import datetime as dt

import structlog
import trio

from actors.finalize_messages import BadRow, ClaimedRow, ClaimPhase, RowOutcome, Terminal
from actors.finalize_state import Breaker, FinalizeCounts, VerdictBudget
from actors.finalize_store import claim_due
from supervision.config import RecordingFinalizeConfig
from supervision.database import Database

log = structlog.get_logger("finalize_claimer")

# a claim holds up to this many reconciler pools' worth of rows
CLAIM_AHEAD_POOLS = 2


def claim_size(cfg: RecordingFinalizeConfig, pool: int, concurrency: int,
               s3_timeout: float) -> int:
    """Rows per claim: ``batch_size``, raised to ``CLAIM_AHEAD_POOLS`` x *pool* (the
    reconciler pool's size) — but never past what ``concurrency`` connections can work,
    at the worst HEAD (``s3_timeout``) each, before the earliest back-off a claim sets
    (``backoff_base`` less its jitter) expires: a claimed row is not due again until then,
    and the rows of a claim and of the one queued before it wait at most that long."""
    expiry = cfg.backoff_base * (1 - cfg.backoff_jitter)
    workable = int(concurrency * expiry / s3_timeout) // 2  # two claims in hand at once
    return max(cfg.batch_size, min(CLAIM_AHEAD_POOLS * pool, workable))


async def run_finalize_claimer(
    db: Database, cfg: RecordingFinalizeConfig, as_of: dt.datetime, deadline: float,
    breaker: Breaker, budget: VerdictBudget, counts: FinalizeCounts, s3_down: bool,
    to_reconcile: trio.MemorySendChannel[ClaimedRow],
    to_commit: trio.MemorySendChannel[RowOutcome], size: int | None = None,
) -> None:
    """Claim *size* rows at a time (default ``batch_size``) until drained; closes both
    send channels when done (ends the pipeline)."""
    size = size or cfg.batch_size
    async with to_reconcile, to_commit:
        while trio.current_time() < deadline and not breaker.open and not budget.spent:
            claim = await db.atomic(claim_due, cfg, as_of, s3_down or breaker.open, size)
            counts.skipped_locked += claim.skipped_locked
            counts.rescheduled += claim.rescheduled
            if not claim.rows and not claim.rescheduled:
                break
            if claim.rows:
                log.info("batch_claimed", rows=len(claim.rows),
                         rescheduled=claim.rescheduled, skipped_locked=claim.skipped_locked)
            for row in claim.rows:
                if row.phase is ClaimPhase.RECONCILE:
                    await to_reconcile.send(row)
                elif row.phase is ClaimPhase.TERMINAL:
                    await to_commit.send(RowOutcome(row, Terminal()))
                else:
                    reason = row.poison_reason or "recording_missing"
                    await to_commit.send(RowOutcome(row, BadRow(reason)))
        if trio.current_time() >= deadline:
            log.info("cycle_deadline_reached")
