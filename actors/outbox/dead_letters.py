"""Dead letters: the one path by which an outbox row leaves the relay unpublished.

Inputs: :class:`~actors.outbox.messages.DeadLetter` messages (receive channel) from the
publisher — a malformed row (``payload``/``headers`` not what :mod:`actors.outbox.rows`
accepts, or larger than the producer's max request size, measured in the database) and a
message the broker rejected permanently (too large, invalid topic). Outputs: a row in
``safetynet.outbox_dead_letters`` and the ``dead-letter:`` mark in the row's
``last_error`` (one transaction per row, ``outbox_dead_letter``), the
``outbox_row_dead_lettered`` log line with the row's id and reason, the
``safetynet_outbox_dead_lettered`` counter, the cycle's ``failed`` count. Restart type:
none — it lives for one cycle and ends once its channel is closed and drained.

A dead letter blocks its key when later rows of that key are already waiting: they are
never published out of order, claims leave them out and ``OutboxKeyBlocked`` fires
(``safetynet replay`` puts the row back). The publisher holds the key for the rest of the
cycle as soon as it hands a row over, so nothing of that key goes out while the dead
letter is being written; dead letters carry the mark that keeps them out of
``ix_outbox_live``, the index every claim reads.

What cancellation does: the dead letter being written commits or rolls back whole; the
ones still queued are dropped — their rows are claimed again by a later cycle and
dead-lettered then.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import structlog
import trio

from actors.outbox.cycle import RelayCycle
from actors.outbox.messages import DeadLetter
from actors.outbox.metrics import OUTBOX_DEAD_LETTERED
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.state import RelayCounts
from supervision.db.database import Database

log = structlog.get_logger("outbox_dead_letters")


def dead_letter(conn: psycopg.Connection, outbox_id: int, reason: str) -> bool:
    """Dead-letter the row; True when it now blocks later rows of its key."""
    rec = conn.execute(OUTBOX_QUERIES["outbox_dead_letter"],
                       {"id": outbox_id, "reason": reason[:512]}).fetchone()
    return bool(rec and rec[0])


async def run_dead_letters(db: Database, counts: RelayCounts,
                           inbox: trio.MemoryReceiveChannel[DeadLetter], *,
                           written: Callable[[int], None] | None = None) -> None:
    """Write every dead letter handed over until *inbox* is closed and drained; *written*
    is told each outbox id once its dead letter is committed (the logical source's slot
    may then pass it)."""
    async with inbox:
        async for letter in inbox:
            blocks = await db.atomic(dead_letter, letter.id, letter.reason)
            if written is not None:
                written(letter.id)
            OUTBOX_DEAD_LETTERED.inc()
            counts.failed += 1
            log.error("outbox_row_dead_lettered", outbox_id=letter.id, topic=letter.topic,
                      error=letter.reason, blocks_key=blocks)


async def run_cycle_dead_letters(cycle: RelayCycle,
                                 inbox: trio.MemoryReceiveChannel[DeadLetter]) -> None:
    """The table source's dead letters: :func:`run_dead_letters` on the cycle's fenced
    database and counts."""
    await run_dead_letters(cycle.db, cycle.counts, inbox)
