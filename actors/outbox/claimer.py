"""The outbox claimer: claims the next unpublished rows, size first, and hands them on.

Inputs: the cycle (:class:`~actors.outbox.cycle.RelayCycle`: its fenced database, the
configuration, the deadline; the relay's state, whose topics held by a configuration fault
stay out of the claim; the ledger's rows in hand, as it claims only while there is room,
and ids claimed in this cycle and not marked yet). Outputs: one
:class:`~actors.outbox.messages.Claim` per claim transaction on its send channel, to the
publisher; an empty claim when nothing more is waiting, and then it closes the channel.
Restart type: none of its own — it lives and dies with its cycle.

Each claim is one short transaction (``outbox_claim_batch``: id order, ``SKIP LOCKED``, at
most ``batch_size`` rows and about ``claim_max_bytes`` of payloads, a row over the
producer's max request size measured in the database and taken without its payload, as
:class:`~actors.outbox.rows.Malformed`; its plan walks ``ix_outbox_live`` in id order
whatever the table's statistics say, ``outbox_claim_plan``). It claims the next batch
while the publisher sends the last one: behind a backlog (the last claim was full, or cut
by the byte cap) it takes the rows after the cycle's last claimed id; caught up, it starts
from the beginning again without the rows this cycle has in hand, so a row committed after
rows with higher ids (concurrent writers) is not passed over. It stops at the cycle's
``max_run_duration``.

What cancellation does: a claim in flight rolls back whole (its row locks end with it);
rows claimed and not yet published are claimed again by a later cycle.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import psycopg
import trio

from actors.kafka.producer import MAX_REQUEST_SIZE
from actors.outbox.cycle import RelayCycle
from actors.outbox.messages import Claim
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.rows import parse_claimed
from supervision.db.database import pipelined

MAX_ROW_BYTES = MAX_REQUEST_SIZE  # the producer's: no larger row is ever sent


@pipelined
def claim_batch(conn: psycopg.Connection, batch_size: int,
                held_topics: Sequence[str] = (), after_id: int = 0,
                skip: Sequence[int] = (), *, max_bytes: int = 16 * 1024 * 1024,
                max_row_bytes: int = MAX_ROW_BYTES) -> Claim:
    """The next rows to send: at most *batch_size*, their payloads together at most about
    *max_bytes* (the first row always comes); a row over *max_row_bytes* comes without
    its payload, as :class:`Malformed` (dead-lettered unread). The claim's plan is the
    index-ordered one whatever the table's statistics (``outbox_claim_plan``)."""
    conn.execute(OUTBOX_QUERIES["outbox_claim_plan"])
    records = conn.execute(OUTBOX_QUERIES["outbox_claim_batch"],
                           {"batch_size": batch_size, "held_topics": list(held_topics),
                            "after_id": after_id, "skip": list(skip),
                            "max_bytes": max_bytes, "max_row_bytes": max_row_bytes}
                           ).fetchall()
    locked = int(records[0][-1]) if records else 0
    return Claim([parse_claimed(rec, max_row_bytes) for rec in records], locked)


async def run_claimer(cycle: RelayCycle, claims: trio.MemorySendChannel[Claim]) -> None:
    """Claim until a claim comes back empty (sent on, then the channel closes), the
    cycle's deadline, or the publisher is gone. Every id claimed goes into the cycle's
    ledger (the marker takes out the ids it marks)."""
    cfg, ledger = cycle.cfg, cycle.ledger
    after_id, behind = 0, False
    async with claims:
        while not cycle.past_deadline:
            await ledger.in_hand.room()
            after, skip = (after_id, []) if behind else (0, ledger.skip())
            at = trio.current_time()
            claim = await cycle.db.atomic(
                claim_batch, cfg.batch_size, cycle.state.held_topics(at), after, skip,
                max_bytes=cfg.claim_max_bytes, max_row_bytes=cycle.max_row_bytes)
            behind = claim.locked >= cfg.batch_size or claim.locked > len(claim.rows)
            claim = attrs.evolve(claim, at=at, behind=behind)
            if claim.rows:
                ledger.claimed(claim.rows)
                after_id = max(after_id, max(row.id for row in claim.rows))
            try:
                await claims.send(claim)
            except trio.BrokenResourceError:  # the publisher stopped (Kafka down, deadline)
                return
            if not claim.rows:
                return
