"""One logical-source cycle as its reader and advancer see it: the slot, its lock, the
progress, and how read transactions are handed on to the publisher.

>>> cycle = SlotCycle(db, source, job.state.slot)
>>> await hand_on(cycle, txns, at, batch_size, in_hand, claims)   # the readers
>>> await cycle.advance()                                                # behind the fence

Shared by the peek reader (:mod:`actors.outbox.logical`) and the stream reader
(:mod:`actors.outbox.stream_reader`). The slot moves by ``pg_replication_slot_advance``
(a transaction that checks the lease's fence first), or, while a stream is open (the slot
is then *active* and refuses the SQL functions), by the stream's status update, sent right
after a fenced transaction checked the lease: in both, a fenced leader never moves it.
"""

from __future__ import annotations

import math

import structlog
import trio

from actors.outbox.held import mark_held
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.messages import Claim
from actors.outbox.rows import Key, Malformed, Row
from actors.outbox.slot import Piece, SlotProgress, Txn, pieces
from actors.outbox.slot_io import advance_slot, blocking_keys, log_snapshot, may_snapshot
from actors.outbox.stream import SlotStream
from actors.outbox.window import InHand
from supervision.db.database import Database
from supervision.tree.shielding import must_complete

__all__ = ["ABOVE_SLOT_BATCHES", "ADVANCE_EVERY", "READ_BATCHES", "ROOM_BATCHES", "SlotCycle",
           "hand_on", "room_above_slot", "send_claim"]

log = structlog.get_logger("outbox_relay")

ADVANCE_EVERY = 0.1  # the advancer's pace: each move decodes the WAL it passes again
SNAPSHOT_EVERY = 0.25  # standby snapshots the relay logs (when its role may), at most
SNAPSHOT_ASK_EVERY = 300.0  # a role that may not is asked again after this long
OPEN_WAIT = 1.0  # how long a reader waits for read events to settle before the cycle ends
ROOM_BATCHES = 2  # events read above the slot, in batches, past which a reader waits
READ_BATCHES = 8  # what one peek or stream read adds at most, in batches (+ one transaction)
# the crash window: events read above the slot's confirmed position (sent again after a
# kill) stay under ABOVE_SLOT_BATCHES x batch_size + the largest transaction
ABOVE_SLOT_BATCHES = ROOM_BATCHES + READ_BATCHES


def _fence_only(conn: object) -> None:
    """Nothing: run through :meth:`Database.atomic` on a fenced database, the
    transaction's first statement checks the lease (the stream's move comes after)."""


class SlotCycle:
    """What the cycle's reader and advancer share: the slot, its lock, the progress."""

    def __init__(self, db: Database, source: LogicalSource, progress: SlotProgress) -> None:
        self.db, self.source, self.progress = db, source, progress
        self.slot_lock = trio.Lock()
        self.moved = trio.Event()  # set whenever events settle or the slot moves
        self.committed: dict[int, float] = {}  # read, not settled: its commit time (epoch)
        self.advance_due = -math.inf  # the advancer moves the slot no more often than this
        self.blocking = True  # some key is blocked (a dead letter, held rows): look per piece
        self.stream: SlotStream | None = None  # while open, the slot moves through it

    def settled(self, ids: list[int]) -> None:
        self.progress.settle(ids)
        for outbox_id in ids:
            self.committed.pop(outbox_id, None)
        self.moved.set()
        self.moved = trio.Event()

    async def advance(self) -> None:
        """Move the slot as far as the settled events allow (behind the fence)."""
        if self.progress.passable() is None:
            return
        async with must_complete(), self.slot_lock:
            await self.advance_locked()

    async def advance_locked(self) -> None:
        """:meth:`advance`, the slot's lock held."""
        target = self.progress.passable()  # again: the other may have moved it
        if target is None:
            return
        stream = self.stream
        if stream is not None:
            await self.db.atomic(_fence_only)
            stream.confirm(target)  # nothing if it closed meanwhile (a cancel)
            confirmed = target if not stream.closed else self.progress.confirmed
        else:
            confirmed = await self.db.atomic(advance_slot, self.source, target)
        await self._snapshot()
        self.advance_due = trio.current_time() + ADVANCE_EVERY
        self.progress.advanced(confirmed)
        self.settled([])

    async def _snapshot(self) -> None:
        """At most every :data:`SNAPSHOT_EVERY`, after a move, log a standby snapshot if
        the role may (asked again every :data:`SNAPSHOT_ASK_EVERY`): the slot's restart
        position then follows its confirmed one, and a peek decodes a fraction of a second
        of WAL again, not up to the background writer's 15 s."""
        if trio.current_time() >= self.progress.snapshot_due:
            await self.restart_mark()

    async def restart_mark(self) -> int | None:
        """Log a standby snapshot now, if the role may; its WAL position (None: the role
        may not, asked again every :data:`SNAPSHOT_ASK_EVERY`). Once the slot is read
        and moved past it, the restart position moves there."""
        progress, now = self.progress, trio.current_time()
        if not progress.may_snapshot:
            if progress.may_snapshot is False and now < progress.snapshot_due:
                return None
            progress.may_snapshot = await self.db.run(may_snapshot)
        mark = await self.db.run(log_snapshot) if progress.may_snapshot else None
        progress.may_snapshot = mark is not None
        progress.snapshot_due = now + (SNAPSHOT_EVERY if mark is not None
                                       else SNAPSHOT_ASK_EVERY)
        return mark


async def hand_on(cycle: SlotCycle, txns: list[Txn], at: float, batch_size: int,
                  in_hand: InHand, claims: trio.MemorySendChannel[Claim]) -> bool:
    """Hand *txns* on in pieces of at most *batch_size* events, each decoded when the rows
    in hand leave room for it; False once the publisher is gone. Every piece but the
    last says another follows at once (``behind``: a small wave may wait a little for
    it); after the last, the reader's next read may first wait for events to settle,
    which only waves bring, so no wave waits for it."""
    for n, piece in enumerate(pieces(txns, batch_size)):
        if n:
            await in_hand.room()
        rows = await _unsettled_rows(cycle, piece)
        if rows:
            in_hand.add([row for row in rows if isinstance(row, Row)])
            if not await send_claim(claims, Claim(rows, len(rows), at=at,
                                                  behind=not piece.last)):
                return False
    return True


async def room_above_slot(cycle: SlotCycle, limit: int) -> bool:
    """Before a read: wait, up to :data:`OPEN_WAIT` without progress, until fewer than
    *limit* events read would stay above the slot's confirmed position once it moves as
    far as settled events allow, then move it there. A peek returns those events again,
    and a kill sends them again: this bounds both. False if they stay (one held key)."""
    progress = cycle.progress
    while progress.unpassed_events - progress.passable_events() >= limit:
        with trio.move_on_after(OPEN_WAIT) as waited:
            await cycle.moved.wait()
        if waited.cancelled_caught:
            return False
    await cycle.advance()
    return True


async def send_claim(claims: trio.MemorySendChannel[Claim], claim: Claim) -> bool:
    try:
        await claims.send(claim)
    except trio.BrokenResourceError:  # the publisher stopped (Kafka down, deadline)
        return False
    return True


async def _unsettled_rows(cycle: SlotCycle, piece: Piece) -> list[Row | Malformed]:
    """The rows of *piece* to send, decoded and registered with the progress; those
    settled in an earlier cycle left out; those of a key blocked by a dead letter passed
    (settled)."""
    rows: list[Row | Malformed] = []
    for span in piece.spans:
        txn = span.txn
        decoded = txn.decode(span.start, span.stop)
        done = cycle.progress.add(txn.end_lsn, [row.id for row in decoded],
                                  complete=span.stop == len(txn.inserts))
        committed = txn.committed_at
        for row in decoded:
            if row.id not in done:
                rows.append(row)
                cycle.committed[row.id] = committed
    if not cycle.blocking:
        return rows
    keys: list[Key] = sorted({(row.topic, row.message_key) for row in rows})
    blocked = await cycle.db.run(blocking_keys, keys)
    if not blocked:
        return rows
    passed = [row.id for row in rows
              if blocked.get((row.topic, row.message_key), math.inf) < row.id]
    if passed:
        log.warning("outbox_blocked_events_passed", events=len(passed),
                    keys=len(blocked))
        async with must_complete():  # marked held before the slot may pass them
            await cycle.db.atomic(mark_held, passed)
        cycle.settled(passed)
    gone = set(passed)
    return [row for row in rows if row.id not in gone]
