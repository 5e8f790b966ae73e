"""The relay's logical source (``[outbox_relay] source = "logical"``, issue 37): a cycle
reads the outbox's inserts from a logical replication slot and writes nothing to the
messenger's outbox per event.

>>> await run_logical_pipeline(job, counts, deadline)

    slot reader ──Claim──▶ publisher ──Answered──▶ slot advancer   pg_replication_slot_advance
      ▲ room                  │ waves ≤ 1 row/key       ▲ settled
      └── InHand ◀────────────┤                         │
                              └──DeadLetter──▶ dead letters

The publisher, the window and the dead letters are the table source's; only the two ends
differ:

* the **slot reader**, in a cycle that begins less than ``PEEK_FIRST_BYTES`` of WAL
  behind, reads the slot's *stream* (:mod:`actors.outbox.stream_reader`: the walsender
  sends each change once, as it is committed) until it has caught up, which ends the
  cycle; when the stream does not catch up, or without the stream's DSN, it *peeks* the
  slot (``pg_logical_slot_peek_binary_changes`` through ``pgoutput``, fetched in binary:
  nothing is consumed) until a peek finds nothing new, which ends the cycle. A cycle
  further behind peeks one transaction first: a large one is read by peeks (one result
  per peek, not one message per change: half the server's CPU per event), a small one
  sends the cycle to the stream. Either way it hands on, in commit order, the rows of
  every transaction it has not read in this cycle, in pieces of at most ``batch_size``
  events decoded as the rows in hand leave room
  (:func:`~actors.outbox.slot_cycle.hand_on`: a large transaction's first wave leaves
  while the rest is still to decode); events settled in an earlier cycle are left out,
  and the events of a key a dead letter blocks are passed (never published out of
  order: they stay in the table, where the dead letter's key finds them). A peek starts
  at the slot's confirmed position and returns again every event read above it, and a
  kill sends those again: before each read the reader waits until fewer than
  ``ROOM_BATCHES`` batches of them would be left once the slot moves past the settled
  ones, and moves it there (:func:`~actors.outbox.slot_cycle.room_above_slot`); when
  they stay (one held key) the cycle ends after ``OPEN_WAIT``. A read asks for
  ``READ_BATCHES`` batches more, so a backlog is read in few peeks;
* the **slot advancer** settles what Kafka acknowledged and, at most every
  ``ADVANCE_EVERY`` (each move decodes the WAL it passes again), moves the slot's
  confirmed position to the end of the last transaction whose every event, and every
  earlier one's, is settled (:class:`~actors.outbox.slot.SlotProgress`), in a
  transaction behind the lease's fence (through the stream while it is open); after a
  move, a standby snapshot at most every ``SNAPSHOT_EVERY``, when the role may, lets the
  slot's restart position follow; the cycle's end moves it once more. A transient
  failure is only logged: its event stays unsettled, the slot stays before it, and a
  later cycle sends it again after its back-off.

When a peek finds no outbox change at all, the slot moves up to the WAL position read
before it, so an idle outbox does not hold back the WAL of the messenger's other tables.

What cancellation does: as the table source's — a wave in flight is abandoned; its events
are above the slot's position and are sent again (at least once, same ``event-id``). An
advance in flight completes (``must_complete``); the slot never moves past an event Kafka
has not acknowledged.
"""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING

import structlog
import trio

from actors.outbox.dead_letters import run_dead_letters
from actors.outbox.handover import TableCycle, enter_logical, fall_back, record_passed
from actors.outbox.held import run_held
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.messages import Answered, Claim, DeadLetter
from actors.outbox.metrics import OUTBOX_DELIVERY, OUTBOX_PUBLISHED
from actors.outbox.publisher import run_publisher
from actors.outbox.settings import OutboxRelayConfig
from actors.outbox.slot import transactions
from actors.outbox.slot_cycle import (
    READ_BATCHES,
    ROOM_BATCHES,
    SlotCycle,
    hand_on,
    room_above_slot,
    send_claim,
)
from actors.outbox.slot_io import (
    Peeked,
    SlotGone,
    anything_blocking,
    peek_slot,
    slot_confirmed,
    wal_mark,
)
from actors.outbox.state import RelayCounts
from actors.outbox.stream_reader import Read, read_stream, released
from actors.outbox.window import InHand, Window

if TYPE_CHECKING:
    from actors.outbox.job import RelayJob

__all__ = ["run_logical_pipeline", "source_of"]

log = structlog.get_logger("outbox_relay")

ANSWERS_QUEUE = 16
PEEK_FIRST_BYTES = 1 << 20  # WAL behind the slot past which a cycle peeks before it streams
DEAD_LETTERS_QUEUE = 64


def source_of(cfg: OutboxRelayConfig) -> LogicalSource:
    return LogicalSource(cfg.slot, cfg.publication)


async def run_logical_pipeline(job: RelayJob, counts: RelayCounts, deadline: float,
                               table: TableCycle) -> None:
    """Slot reader → publisher → slot advancer and dead letters, until the publisher is
    done; then the slot moves as far as every settled event allows. A slot missing or
    invalidated: a *table* cycle instead; coming from the table source: a *table* cycle
    first (:mod:`actors.outbox.handover`)."""
    source = source_of(job.cfg)
    try:
        confirmed = await job.db.run(slot_confirmed, source)
    except SlotGone as gone:
        await fall_back(job, counts, deadline, gone, table)
        return
    if job.state.slot.recorded_source != "logical":
        if not await enter_logical(job, source, counts, deadline, table):
            return
        confirmed = await job.db.run(slot_confirmed, source)  # the slot moved
    await run_held(job, counts, deadline)  # a replay released a key: its held rows first
    await _run_slot_pipeline(job, counts, deadline, confirmed)
    await record_passed(job, quiet=counts.published == 0)


async def _run_slot_pipeline(job: RelayJob, counts: RelayCounts, deadline: float,
                             confirmed: int) -> None:
    cfg = job.cfg
    cycle = SlotCycle(job.db, source_of(cfg), job.state.slot)
    cycle.progress.begin_cycle(confirmed)
    cycle.blocking = await job.db.run(anything_blocking)
    in_hand = InHand(max_rows=2 * cfg.batch_size, max_bytes=cfg.claim_max_bytes)
    claims_send, claims_recv = trio.open_memory_channel[Claim](0)
    answers_send, answers_recv = trio.open_memory_channel[Answered](ANSWERS_QUEUE)
    letters_send, letters_recv = trio.open_memory_channel[DeadLetter](DEAD_LETTERS_QUEUE)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_slot_advancer, cycle, counts, answers_recv)
            nursery.start_soon(partial(run_dead_letters, job.db, counts, letters_recv,
                                       written=lambda outbox_id: cycle.settled([outbox_id])))
            async with trio.open_nursery() as feed:
                feed.start_soon(partial(run_slot_reader, cycle, cfg.batch_size,
                                        job.max_row_bytes, deadline, in_hand, claims_send,
                                        job.stream_dsn))
                await run_publisher(job.producer, job.state, Window(in_hand), deadline,
                                    claims_recv, answers_send, letters_send,
                                    min_wave=cfg.batch_size // 4)
                feed.cancel_scope.cancel()  # the reader stops with the publisher
        await cycle.advance()  # through the stream when the reader caught up with it
    finally:
        stream, cycle.stream = cycle.stream, None
        if stream is not None:
            stream.close()
    if stream is not None:
        await released(cycle)  # the next cycle's stream, or a peek, finds the slot free


async def run_slot_reader(cycle: SlotCycle, batch_size: int, max_row_bytes: int,
                          deadline: float, in_hand: InHand,
                          claims: trio.MemorySendChannel[Claim],
                          stream_dsn: str | None = None) -> None:
    """Read the slot until it has caught up (an empty claim is sent on, then the channel
    closes), the *deadline*, the slot held by events that do not settle, or the
    publisher is gone. A cycle that begins less than :data:`PEEK_FIRST_BYTES` of WAL
    behind reads the stream (:func:`~actors.outbox.stream_reader.read_stream`), then, if
    it did not catch up, peeks until one has nothing new. One further behind first peeks
    one transaction: a large one (``batch_size`` events or more) is read by peeks until
    one has nothing new, or until one brings only small transactions (a peek sends a
    large transaction as one result, at half the walsender's PostgreSQL CPU per event);
    a small one goes to the stream, which sends it again with the rest."""
    async with claims:
        read, at = Read.STREAM, trio.current_time()
        # the WAL position now (flushed), and what the stream must reach before quiet
        mark = None if stream_dsn is None else await cycle.db.run(wal_mark)
        if mark is None or mark[0] - cycle.progress.confirmed >= PEEK_FIRST_BYTES:
            read, at = await read_peeks(cycle, batch_size, max_row_bytes, deadline,
                                        in_hand, claims, large_only=mark is not None)
        if read is Read.STREAM and stream_dsn is not None and mark is not None:
            read, at = await read_stream(cycle, stream_dsn, mark, batch_size,
                                         max_row_bytes, deadline, in_hand, claims)
        if read is Read.PEEK:
            read, at = await read_peeks(cycle, batch_size, max_row_bytes, deadline,
                                        in_hand, claims)
        if read is Read.CAUGHT_UP:  # every event committed before the last read is read
            await send_claim(claims, Claim([], 0, at=at))


async def read_peeks(cycle: SlotCycle, batch_size: int, max_row_bytes: int,
                     deadline: float, in_hand: InHand,
                     claims: trio.MemorySendChannel[Claim], *,
                     large_only: bool = False) -> tuple[Read, float]:
    """Peek the slot until a peek has nothing new (caught up: the slot's idle mark is the
    WAL position read before it), the *deadline*, the slot held by events that do not
    settle, or the publisher is gone; *large_only*: or a peek brought no transaction of
    *batch_size* events (:attr:`Read.STREAM`). With when the last peek began. A peek's
    transactions go on in pieces of at most *batch_size* events, each decoded when there
    is room for it, so the first wave of a large transaction leaves while the rest of it
    is still being decoded."""
    # *large_only*: the first peek asks for one transaction, to see whether it is large
    upto_n = 1 if large_only else READ_BATCHES * batch_size
    at = trio.current_time()
    while at < deadline:
        await in_hand.room()
        if not await room_above_slot(cycle, ROOM_BATCHES * batch_size):
            return Read.STOPPED, at  # one held key keeps the slot: the next cycle reads
        at = trio.current_time()
        peeked = await _peek(cycle, upto_n)
        txns = transactions(peeked.records, max_row_bytes, cycle.progress.read_upto)
        behind = len(peeked.records) >= upto_n
        small = large_only and max((len(t.inserts) for t in txns), default=0) < batch_size
        if small and upto_n == 1 and txns:
            return Read.STREAM, at  # the stream sends it again, with what follows
        upto_n = len(peeked.records) + READ_BATCHES * batch_size
        if not txns:
            if not behind:  # all up to wal_position read (in this cycle, or none)
                cycle.progress.caught_up(peeked.wal_position)
                return Read.CAUGHT_UP, at
            continue
        if not await hand_on(cycle, txns, at, batch_size, in_hand, claims):
            return Read.STOPPED, at
        if small:
            return Read.STREAM, at
    return Read.STOPPED, at


async def _peek(cycle: SlotCycle, upto_n: int) -> Peeked:
    async with cycle.slot_lock:
        peeked = await cycle.db.run(peek_slot, cycle.source, upto_n)
    cycle.progress.advanced(peeked.confirmed)
    cycle.progress.marked(peeked.wal_position, peeked.xmin)
    return peeked


async def run_slot_advancer(cycle: SlotCycle, counts: RelayCounts,
                            inbox: trio.MemoryReceiveChannel[Answered]) -> None:
    """Settle every acknowledged event handed over and move the slot behind them, until
    *inbox* is closed and drained."""
    async with inbox:
        try:
            async for answered in inbox:
                _record(cycle, counts, [answered, *_queued(inbox)])
                if trio.current_time() >= cycle.advance_due:
                    await cycle.advance()
        except trio.Cancelled:  # a soft stop: what the broker has is settled all the same
            _record(cycle, counts, _queued(inbox))
            await cycle.advance()
            raise


def _queued(inbox: trio.MemoryReceiveChannel[Answered]) -> list[Answered]:
    queued: list[Answered] = []
    while True:
        try:
            queued.append(inbox.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return queued


def _record(cycle: SlotCycle, counts: RelayCounts, answers: list[Answered]) -> None:
    acked = [outbox_id for answered in answers for outbox_id in answered.acked]
    failed = [failure for answered in answers for failure in answered.failed]
    now = time.time()
    for outbox_id in acked:
        committed = cycle.committed.get(outbox_id)
        if committed is not None:
            OUTBOX_DELIVERY.observe(max(0.0, now - committed))
    cycle.settled(acked)
    counts.published += len(acked)
    counts.failed += len(failed)
    OUTBOX_PUBLISHED.inc(len(acked))
    for failure in failed:
        log.warning("outbox_publish_failed", outbox_id=failure.id, topic=failure.topic,
                    error=failure.error)
