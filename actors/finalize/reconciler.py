"""The S3 reconciler pool: HEAD each claimed recording's object, outside any transaction.

Inputs: claimed rows (receive channel). Outputs: a :class:`RowOutcome` per row (send
channel) — Found / Missing / Transient / Fault / Poison, per SPEC §3. No row lock and no
transaction is held while the request is on the network. :func:`pool_size` workers share
one receive channel: :data:`REQUESTS_PER_CONNECTION` per ``s3.concurrency`` connection, so
that while the S3 worker process has ``s3.concurrency`` HEADs on the wire the next ones
already wait there, and a connection never idles while this process is busy committing.
Restart type: none — the pool lives for one cycle.

Once the breaker is open no further requests are made: the remaining rows were never
attempted, so they are given back untouched (attempts and next_attempt_at as before the
claim), as after a configuration fault. Only rows whose HEAD really failed keep the
attempt they were claimed with.

Every outcome passes the cycle's :class:`~actors.finalize.evidence.VerdictGate`: a Missing
one waits there until the cycle has evidence that its 404s mean "not uploaded" (then it
goes on, with every other held one), and an unusable Content-Type until an object with a
usable one is found; nothing else waits, so a found row goes straight on. Rows not
HEADed (breaker open, fault, no worker) pass the gate too: it counts every row of a claim
batch before it closes the batch.

When no S3 worker process can run (it died and may not restart yet, or cannot start),
nothing is sent: the row is given back untouched and the breaker opens, so a broken
worker spends no attempts; the next cycle's probe starts a new one.

What cancellation does: a HEAD in flight is abandoned; its row stays Pending with the
attempt pre-incremented at claim and is retried after its back-off.
"""

from __future__ import annotations

import structlog
import trio

from actors.finalize.evidence import VerdictGate
from actors.finalize.messages import ClaimedRow, NotAttempted, RowOutcome
from actors.finalize.state import Breaker
from actors.s3.objectstore import Fault, HeadOutcome, ObjectStore, Transient
from actors.s3.process import NOT_SENT

log = structlog.get_logger("s3_reconciler")
REQUESTS_PER_CONNECTION = 2


def pool_size(concurrency: int) -> int:
    """Reconciler workers for ``s3.concurrency`` connections."""
    return REQUESTS_PER_CONNECTION * concurrency


async def run_s3_reconciler(
    store: ObjectStore, breaker: Breaker, gate: VerdictGate,
    inbox: trio.MemoryReceiveChannel[ClaimedRow],
    outbox: trio.MemorySendChannel[RowOutcome],
) -> None:
    """One worker of the pool: runs until *inbox* is closed and drained."""
    async with outbox:
        async for row in inbox:
            outcome: HeadOutcome | NotAttempted
            if breaker.fault is not None:
                outcome = Fault(breaker.fault)
            elif breaker.open:
                outcome = NotAttempted("s3_breaker_open")
            else:
                outcome = await store.head_recording(row.recording_id)
                if isinstance(outcome, Fault):
                    breaker.trip(outcome.error)
                elif isinstance(outcome, Transient) and outcome.error == NOT_SENT:
                    breaker.trip()  # no S3 worker: nothing went out
                    outcome = NotAttempted(NOT_SENT)
                else:
                    breaker.record(isinstance(outcome, Transient))
            # every row passes the gate (it counts its batch's rows), HEADed or not
            for decided in gate.judge(row, outcome, breaker.open):
                await outbox.send(decided)
