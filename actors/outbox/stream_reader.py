"""The logical source's stream reader: a cycle first hands on what the slot's stream
sends (:mod:`actors.outbox.stream`), as it comes.

>>> read, at = await read_stream(cycle, dsn, await cycle.db.run(wal_mark), batch_size,
...                              max_row_bytes, deadline, in_hand, claims)
>>> read is Read.CAUGHT_UP    # the cycle ends: its last move goes through the stream
>>> read is Read.PEEK         # the stream closed: a peek finishes the cycle
>>> read is Read.STOPPED      # the publisher is gone, or one held key keeps the slot

The stream runs while changes keep coming. Once the walsender has said (its keepalive)
that it sent everything past the WAL position read when the cycle began, and nothing has
come for :data:`STREAM_IDLE` since the last change, the cycle has **caught up**: the
slot's idle mark is the keepalive's position (so an idle outbox holds back no WAL of the
messenger's other tables), and the stream stays open for the cycle's last move (the
pipeline closes it after that: :func:`actors.outbox.logical.run_logical_pipeline`). No
peek is needed, and none runs. Before it ends, a cycle that read events logs a standby
snapshot and reads until the walsender has passed it, so that last move takes the
slot's restart position past them: the next stream decodes none of them again.

When the walsender does not catch up within :data:`~actors.outbox.stream.BUSY_WAIT`, or
at the deadline, the settled events are confirmed through the stream, it is closed, and
the peek reader (:func:`actors.outbox.logical.run_slot_reader`) goes on: its first peek
returns what came since (transactions read already are left out), or nothing, and then
it moves an idle slot past the messenger's other WAL and ends the cycle as before. The
stream leaves the slot free again before that peek (the walsender's exit is waited for).
What the stream read and Kafka had not acknowledged when it closed stays above the
slot's position: the peek reads it again and the progress knows it is in flight.

What cancellation does: the stream is closed at once; what it had not confirmed is read
again by a later cycle (at least once).
"""

from __future__ import annotations

import enum

import trio

from actors.outbox.messages import Claim
from actors.outbox.slot import transactions
from actors.outbox.slot_cycle import READ_BATCHES, ROOM_BATCHES, SlotCycle, hand_on, room_above_slot
from actors.outbox.slot_io import slot_active, wal_mark
from actors.outbox.stream import SlotStream
from actors.outbox.window import InHand
from supervision.errors import InfrastructureError
from supervision.tree.shielding import must_complete

__all__ = ["STREAM_IDLE", "Read", "read_stream", "released"]

STREAM_IDLE = 0.05  # caught up, and no change this long since the last: the cycle ends
RELEASE_WAIT = 2.0  # how long the walsender's exit is waited for after the stream closes


class Read(enum.Enum):
    """How a slot reader ended: the stream's (:func:`read_stream`) or the peeks'
    (:func:`actors.outbox.logical.read_peeks`)."""

    CAUGHT_UP = "caught up"  # every event committed before the cycle began was read
    PEEK = "peek"  # the stream closed without catching up: a peek goes on
    STREAM = "stream"  # peeks found only small transactions: the stream goes on
    STOPPED = "stopped"  # the publisher is gone, or events read stay above the slot


async def read_stream(cycle: SlotCycle, dsn: str, mark: tuple[int, int], batch_size: int,
                      max_row_bytes: int, deadline: float, in_hand: InHand,
                      claims: trio.MemorySendChannel[Claim]) -> tuple[Read, float]:
    """Hand on what the slot's stream sends until it is quiet, and when its last read
    began: caught up (the stream stays open in ``cycle.stream`` for the cycle's last
    move), or not (it is closed: a peek goes on), or the reader stops (the publisher is
    gone, or events read above the slot stay for
    :data:`~actors.outbox.slot_cycle.OPEN_WAIT`). *mark*: the cycle's WAL mark
    (:func:`~actors.outbox.slot_io.wal_mark`), what the stream must reach before quiet."""
    until, xmin = mark
    cycle.progress.marked(until, xmin)
    stream = await SlotStream.open(dsn, cycle.source)
    cycle.stream = stream
    try:
        read, at = await _hand_on_stream(cycle, stream, until, batch_size, max_row_bytes,
                                         deadline, in_hand, claims)
        if read is Read.CAUGHT_UP:
            cycle.progress.caught_up(stream.caught_up)
            return read, at  # the cycle's last move closes it
        async with must_complete(), cycle.slot_lock:
            await cycle.advance_locked()  # through the stream, while it is open
            cycle.stream = None
            stream.close()
    except BaseException:
        cycle.stream = None
        stream.close()  # at once on a cancel: nothing unconfirmed is lost, only re-read
        raise
    if read is Read.PEEK:
        await released(cycle)
    return read, at


async def _hand_on_stream(cycle: SlotCycle, stream: SlotStream, until: int,
                          batch_size: int, max_row_bytes: int, deadline: float,
                          in_hand: InHand, claims: trio.MemorySendChannel[Claim]
                          ) -> tuple[Read, float]:
    relations: dict[int, tuple[int, ...] | None] = {}  # the stream describes each relation once
    upto_n = READ_BATCHES * batch_size
    at = trio.current_time()
    followed = False
    while at < deadline:
        await in_hand.room()
        if not await room_above_slot(cycle, ROOM_BATCHES * batch_size):
            return Read.STOPPED, at
        at = trio.current_time()
        records = await stream.read(upto_n, STREAM_IDLE, until, enough=batch_size)
        if not records:
            if not stream.caught_up_to(until):
                return Read.PEEK, at
            if not followed and cycle.progress.read_upto:
                followed = True  # the restart position follows before the cycle ends
                if await cycle.restart_mark() is not None:
                    # read on until the walsender has passed it (flushed: it reads no
                    # further than the WAL flushed)
                    until = max(until, (await cycle.db.run(wal_mark))[0])
                    continue
            return Read.CAUGHT_UP, at
        # after peeks, the stream sends again what they read above the slot: left out
        txns = transactions(records, max_row_bytes, cycle.progress.read_upto, relations)
        if not await hand_on(cycle, txns, at, batch_size, in_hand, claims):
            return Read.STOPPED, at
        at = trio.current_time()
    return Read.PEEK, at


async def released(cycle: SlotCycle) -> None:
    """Wait for the server to free the slot (its walsender exits after the stream)."""
    with trio.move_on_after(RELEASE_WAIT):
        while True:  # the server's state, polled: no event to wait for
            if not await cycle.db.run(slot_active, cycle.source):
                return
            await trio.sleep(0.005)
    raise InfrastructureError(f"postgres: replication slot {cycle.source.slot} still in "
                              f"use {RELEASE_WAIT:.0f} s after its stream closed")
