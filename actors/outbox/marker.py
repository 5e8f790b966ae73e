"""The outbox marker: records what the broker answered, behind the waves still going out.

Inputs: the cycle (:class:`~actors.outbox.cycle.RelayCycle`: its fenced database and
ledger) and :class:`~actors.outbox.messages.Answered` messages (receive channel) from the
publisher. Outputs: ``published_at`` (and one more ``publish_attempts``) on every row the
broker acknowledged, one more attempt and ``last_error`` on every row that failed
transiently, the ``outbox_publish_failed`` log line per such row, the cycle's
``published``/``failed`` counts, ``safetynet_outbox_published`` and
``safetynet_outbox_delivery_seconds`` (created_at → the mark, on the database's clock);
the marked ids leave the ledger's unmarked ids (the claimer skips those). Restart type:
none — it lives for one cycle and ends once its channel is closed and drained.

It waits for one wave's answers, then takes every answer already queued behind it and
records them all in one transaction (one pipelined round trip under the lease's fence),
so the marks keep up with waves however small they are.

What cancellation does: the marking in flight must complete (``must_complete``), and the
answers already handed over are marked too before it stops: rows the broker has are not
sent again after a soft stop. After a hard stop they are (at least once, same
``event-id``).
"""

from __future__ import annotations

from collections import defaultdict

import psycopg
import structlog
import trio

from actors.outbox.cycle import RelayCycle
from actors.outbox.messages import Answered, Failure
from actors.outbox.metrics import OUTBOX_DELIVERY, OUTBOX_PUBLISHED
from actors.outbox.queries import OUTBOX_QUERIES
from supervision.db.database import pipelined
from supervision.tree.shielding import must_complete

log = structlog.get_logger("outbox_marker")


@pipelined
def mark_answered(conn: psycopg.Connection, published: list[int],
                  failed: list[Failure]) -> list[float]:
    """Mark *published* (acknowledged, only those) and count an attempt of each row in
    *failed*, with its error (a statement per distinct error); the marked rows' delivery
    times (created_at → now, on the database's clock)."""
    marked = (conn.execute(OUTBOX_QUERIES["outbox_mark_published"], {"ids": published})
              if published else None)
    by_error: dict[str, list[int]] = defaultdict(list)
    for failure in failed:
        by_error[failure.error[:512]].append(failure.id)
    for error, ids in by_error.items():
        conn.execute(OUTBOX_QUERIES["outbox_mark_failed"], {"ids": ids, "last_error": error})
    return [] if marked is None else [float(r[0]) for r in marked.fetchall()]


def _queued(inbox: trio.MemoryReceiveChannel[Answered]) -> list[Answered]:
    """Every answer already waiting in *inbox*, without waiting."""
    queued: list[Answered] = []
    while True:
        try:
            queued.append(inbox.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return queued


async def run_marker(cycle: RelayCycle, inbox: trio.MemoryReceiveChannel[Answered]) -> None:
    """Record every answer handed over until *inbox* is closed and drained."""
    async with inbox:
        try:
            async for answered in inbox:
                await _record(cycle, [answered, *_queued(inbox)])
        except trio.Cancelled:  # a soft stop: what the broker has is marked all the same
            if queued := _queued(inbox):
                await _record(cycle, queued)
            raise


async def _record(cycle: RelayCycle, answers: list[Answered]) -> None:
    published = [outbox_id for answered in answers for outbox_id in answered.acked]
    failed = [failure for answered in answers for failure in answered.failed]
    async with must_complete():
        delivered = await cycle.db.atomic(mark_answered, published, failed)
    for seconds in delivered:
        OUTBOX_DELIVERY.observe(max(0.0, seconds))
    cycle.counts.acks.observe([round(s * 1000) for s in delivered])
    cycle.ledger.marked(published)
    cycle.counts.published += len(published)
    cycle.counts.failed += len(failed)
    OUTBOX_PUBLISHED.inc(len(published))
    for failure in failed:
        log.warning("outbox_publish_failed", outbox_id=failure.id, topic=failure.topic,
                    error=failure.error)
