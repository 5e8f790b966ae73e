"""The finalize claimer: claims due rows batch by batch and routes them.

Inputs: the cycle (:class:`~actors.finalize.state.FinalizeCycle`: its AsOf and deadline,
the database, the breaker). Outputs: rows that need a HEAD go to the S3 reconciler pool;
rows that do not (recording already terminal; no verdict possible: recording or session
missing, unknown session kind, session end in the future) go straight to the committer.
Restart type: none of its own — it lives and dies with its cycle (the lock keeper's nested
nursery).

Each claim is one short transaction (``finalize_attempts_claim_due``) that pre-increments
attempts and moves next_attempt_at, so a row in flight is never claimed twice. A claim
takes ``batch_size`` rows, exactly what the operator set (a smaller batch is how they
shorten transactions). The rows of one claim fit in the pool's queue (the cycle sizes it
so), so the next claim starts as soon as the previous one is queued: claimed ahead, while
the pool works the queued rows. At high ``s3.concurrency`` a claim must hold more than the
pool works during one claim transaction: ``batch_size`` >= 2 x the reconciler pool
(4 x ``s3.concurrency``) keeps every connection busy (bench/latency_drain.py). It claims
until nothing is due, the cycle's ``max_run_duration`` is reached, or the breaker opens —
never stops because Missing verdicts are held for want of evidence
(:mod:`actors.finalize.evidence`), and found rows keep flowing. Each claim is numbered
(``ClaimedRow.batch``) and announced to the verdict gate with its count of rows to HEAD
before the first of them is sent: the gate judges batch by batch. A held row given back
before the claimer is done is due only after its hold-off (past the cycle's AsOf), so it
cannot be claimed twice in one cycle.

What cancellation does: a claim in flight commits or rolls back whole (``atomic``); rows
already claimed but not yet committed keep their pre-incremented attempt and come back
after their back-off — the seed's at-least-once retry, never a lost row.
"""

from __future__ import annotations

import structlog
import trio

from actors.finalize.messages import BadRow, ClaimedRow, ClaimPhase, RowOutcome, Terminal
from actors.finalize.state import FinalizeCycle
from actors.finalize.store import claim_due

log = structlog.get_logger("finalize_claimer")


async def run_finalize_claimer(
    cycle: FinalizeCycle, to_reconcile: trio.MemorySendChannel[ClaimedRow],
    to_commit: trio.MemorySendChannel[RowOutcome],
) -> None:
    """Claim ``batch_size`` rows at a time until drained; closes both send channels when
    done (ends the pipeline)."""
    cfg, counts, breaker = cycle.cfg, cycle.counts, cycle.breaker
    async with to_reconcile, to_commit:
        batch = 0
        while not cycle.stop_claiming:
            claim = await cycle.db.atomic(claim_due, cfg, cycle.as_of,
                                          cycle.s3_down or breaker.open, batch)
            counts.skipped_locked += claim.skipped_locked
            counts.rescheduled += claim.rescheduled
            if not claim.rows and not claim.rescheduled:
                break
            if claim.rows:
                log.info("batch_claimed", rows=len(claim.rows),
                         rescheduled=claim.rescheduled, skipped_locked=claim.skipped_locked)
            reconcile = sum(row.phase is ClaimPhase.RECONCILE for row in claim.rows)
            for closed in cycle.gate.open_batch(batch, reconcile):  # before its first HEAD
                await to_commit.send(closed)
            batch += 1
            for row in claim.rows:
                if row.phase is ClaimPhase.RECONCILE:
                    await to_reconcile.send(row)
                elif row.phase is ClaimPhase.TERMINAL:
                    await to_commit.send(RowOutcome(row, Terminal()))
                else:
                    reason = row.poison_reason or "recording_missing"
                    await to_commit.send(RowOutcome(row, BadRow(reason)))
        if cycle.past_deadline:
            log.info("cycle_deadline_reached")
