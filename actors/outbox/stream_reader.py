"""The logical source's stream reader: a cycle first hands on what the slot's stream
sends (:mod:`actors.outbox.stream`), as it comes, then a peek finishes the cycle.

>>> if not await read_stream(cycle, dsn, batch_size, max_row_bytes, deadline, in_hand,
...                          claims):
...     return                       # the publisher is gone, or one held key keeps the slot

The stream runs while changes keep coming; once the walsender has said it sent
everything (its keepalive) and nothing more has come for :data:`STREAM_IDLE` (or at the
deadline) the settled events are confirmed through it and it is closed, and the peek
reader (:func:`actors.outbox.logical.run_slot_reader`) goes on: its first peek returns
what came since (transactions read already are left out), or nothing, and then it moves
an idle slot past the messenger's other WAL and ends the cycle as before. The stream
leaves the slot free again before that peek (the walsender's exit is waited for). What
the stream read and Kafka had not acknowledged when it closed stays above the slot's
position: the peek reads it again and the progress knows it is in flight.

What cancellation does: the stream is closed at once; what it had not confirmed is read
again by a later cycle (at least once).
"""

from __future__ import annotations

import trio

from actors.outbox.messages import Claim
from actors.outbox.slot import transactions
from actors.outbox.slot_cycle import READ_BATCHES, ROOM_BATCHES, SlotCycle, hand_on, room_above_slot
from actors.outbox.slot_io import slot_active, wal_mark
from actors.outbox.stream import SlotStream
from actors.outbox.window import InHand
from supervision.errors import InfrastructureError
from supervision.tree.shielding import must_complete

__all__ = ["STREAM_IDLE", "read_stream"]

STREAM_IDLE = 0.05  # nothing received this long: the stream closes, a peek ends the cycle
RELEASE_WAIT = 2.0  # how long the walsender's exit is waited for after the stream closes


async def read_stream(cycle: SlotCycle, dsn: str, batch_size: int, max_row_bytes: int,
                      deadline: float, in_hand: InHand,
                      claims: trio.MemorySendChannel[Claim]) -> bool:
    """Hand on what the slot's stream sends until it is quiet; True when the cycle goes
    on with a peek, False when the reader stops (the publisher is gone, or events read
    above the slot stay for :data:`~actors.outbox.slot_cycle.OPEN_WAIT`)."""
    until = (await cycle.db.run(wal_mark))[0]  # what the stream must reach before quiet
    stream = await SlotStream.open(dsn, cycle.source)
    cycle.stream = stream
    try:
        going_on = await _hand_on_stream(cycle, stream, until, batch_size, max_row_bytes,
                                         deadline, in_hand, claims)
        async with must_complete(), cycle.slot_lock:
            await cycle.advance_locked()  # through the stream, while it is open
            cycle.stream = None
            stream.close()
    finally:
        cycle.stream = None
        stream.close()  # at once on a cancel: nothing unconfirmed is lost, only re-read
    if going_on:
        await _released(cycle)
    return going_on


async def _hand_on_stream(cycle: SlotCycle, stream: SlotStream, until: int,
                          batch_size: int, max_row_bytes: int, deadline: float,
                          in_hand: InHand, claims: trio.MemorySendChannel[Claim]) -> bool:
    relations: dict[int, list[int] | None] = {}  # the stream describes each relation once
    upto_n = READ_BATCHES * batch_size
    while trio.current_time() < deadline:
        await in_hand.room()
        if not await room_above_slot(cycle, ROOM_BATCHES * batch_size):
            return False
        at = trio.current_time()
        records = await stream.read(upto_n, STREAM_IDLE, until)
        if not records:
            return True
        txns = transactions(records, max_row_bytes, 0, relations)
        if not await hand_on(cycle, txns, at, batch_size, in_hand, claims):
            return False
    return True


async def _released(cycle: SlotCycle) -> None:
    """Wait for the server to free the slot (its walsender exits after the stream)."""
    with trio.move_on_after(RELEASE_WAIT):
        while True:  # the server's state, polled: no event to wait for
            if not await cycle.db.run(slot_active, cycle.source):
                return
            await trio.sleep(0.005)
    raise InfrastructureError(f"postgres: replication slot {cycle.source.slot} still in "
                              f"use {RELEASE_WAIT:.0f} s after its stream closed")
