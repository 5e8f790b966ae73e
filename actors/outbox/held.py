"""The logical source's held rows: the events of a key a dead letter blocks, which the
slot passes (never published out of order), and ``safetynet replay`` puts back.

>>> await db.atomic(mark_held, ids)          # the reader, before the slot passes them
>>> await run_held(job, counts, deadline)    # each logical cycle, before the slot's

The reader marks them ``last_error = 'held: …'`` (a write of the messenger's table only
for a blocked key's rows), and a key with held rows stays blocked for the events that
follow (they are held too). A replay deletes the dead letter and marks its row held
(``outbox_dead_letters_replay``); each logical cycle then sends the held rows of the keys
nothing blocks any more, in id order, through ``ix_outbox_held`` — the table source's
publisher, marker and dead letters on a claim of those rows: the marker sets
``published_at`` (and clears the mark), so they leave the index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import psycopg
import trio

from actors.outbox.cycle import CycleLedger, RelayCycle
from actors.outbox.dead_letters import run_cycle_dead_letters
from actors.outbox.marker import run_marker
from actors.outbox.messages import Answered, Claim, DeadLetter
from actors.outbox.publisher import run_cycle_publisher
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.rows import Malformed, Row, parse_claimed
from actors.outbox.state import RelayCounts
from actors.outbox.window import Window

if TYPE_CHECKING:
    from actors.outbox.job import RelayJob

__all__ = ["claim_held", "mark_held", "run_held"]

QUEUE = 16


def mark_held(conn: psycopg.Connection, ids: list[int]) -> None:
    conn.execute(OUTBOX_QUERIES["outbox_mark_held"], {"ids": ids})


def claim_held(conn: psycopg.Connection, batch_size: int,
               max_row_bytes: int) -> list[Row | Malformed]:
    """Up to *batch_size* held rows whose key nothing blocks, in id order."""
    records = conn.execute(OUTBOX_QUERIES["outbox_claim_held"], {
        "batch_size": batch_size, "max_row_bytes": max_row_bytes}).fetchall()
    return [parse_claimed(tuple(rec), max_row_bytes) for rec in records]


async def run_held(job: RelayJob, counts: RelayCounts, deadline: float) -> None:
    """Send the released held rows (a batch per call), marked as the table source marks;
    nothing to do: one query through ix_outbox_held."""
    cfg = job.cfg
    rows = await job.db.run(claim_held, cfg.batch_size, job.max_row_bytes)
    if not rows:
        return
    cycle = RelayCycle(job.db, cfg, job.producer, job.state, deadline, job.max_row_bytes,
                       CycleLedger.for_config(cfg, counts))
    cycle.ledger.claimed(rows)
    claims_send, claims_recv = trio.open_memory_channel[Claim](1)
    answers_send, answers_recv = trio.open_memory_channel[Answered](QUEUE)
    letters_send, letters_recv = trio.open_memory_channel[DeadLetter](QUEUE)
    async with claims_send:
        claims_send.send_nowait(Claim(rows, len(rows), at=trio.current_time()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_marker, cycle, answers_recv)
        nursery.start_soon(run_cycle_dead_letters, cycle, letters_recv)
        await run_cycle_publisher(cycle, Window(cycle.ledger.in_hand), claims_recv,
                                  answers_send, letters_send)
