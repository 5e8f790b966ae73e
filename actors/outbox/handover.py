"""The relay's hand-over between its two sources (issue 37): a switch of ``[outbox_relay]
source``, either way, and the fall back to the table when the slot is lost, lose no event.

>>> await enter_table(job)                                  # before a table cycle claims
>>> if await enter_logical(job, counts, deadline, table):   # before a logical cycle reads
...     ...

``safetynet.outbox_relay_source`` (migration 0018) records the source that relayed last
and, for the logical source, ``passed_xid``: every transaction whose id is below it had
ended before a WAL position the slot has passed since (the oldest transaction running
when a peek read the WAL position, :meth:`~actors.outbox.slot.SlotProgress.marked`), so
its rows are delivered. The logical source never marks rows published, so:

* **into the table** (a switch, or the slot dropped or invalidated): the rows the slot
  passed are marked published first, in batches (:data:`MARK_BATCH`) through
  ``ix_outbox_live``; the table source then claims the rest — the rows of transactions
  after the last recorded mark, some of them delivered already (duplicates, same
  ``event-id``; counted by ``safetynet_outbox_fallback_republished_total`` when the slot
  was lost);
* **into the logical source**: the WAL position and the oldest running transaction are
  read, the table source drains what is unpublished, and once no row of a transaction
  below that mark is left unpublished (a failure or a back-off: the next cycle goes on),
  the slot moves to that position and the logical source reads from there. Rows committed
  during the drain go out twice at worst.

The record is written at a change of source and, while the slot advances, at most every
:data:`RECORD_EVERY` seconds (and after a cycle that published nothing): never per
event. Every write runs behind the lease's fence.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
import structlog
import trio

from actors.outbox.logical_setup import LogicalSource
from actors.outbox.metrics import OUTBOX_FALLBACK_REPUBLISHED, OUTBOX_SLOT_LOST
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.slot_io import SlotGone, advance_slot, wal_mark
from actors.outbox.state import RelayCounts
from supervision.tree.shielding import must_complete

if TYPE_CHECKING:
    from actors.outbox.job import RelayJob

__all__ = ["enter_logical", "enter_table", "fall_back", "record_passed"]

log = structlog.get_logger("outbox_relay")

TABLE, LOGICAL = "table", "logical"
MARK_BATCH = 5000
RECORD_EVERY = 10.0  # seconds between two records of the slot's passed_xid
XID_MOD = 2**32

TableCycle = Callable[["RelayJob", RelayCounts, float], Awaitable[None]]


def read_source(conn: psycopg.Connection[Any]) -> tuple[str | None, int | None]:
    row = conn.execute(OUTBOX_QUERIES["outbox_relay_source_get"]).fetchone()
    return (None, None) if row is None else (str(row[0]), row[1])


def write_source(conn: psycopg.Connection[Any], source: str, passed_xid: int | None) -> None:
    conn.execute(OUTBOX_QUERIES["outbox_relay_source_set"],
                 {"source": source, "passed_xid": passed_xid})


def mark_passed(conn: psycopg.Connection[Any], passed_xid: int, batch: int) -> int:
    cur = conn.execute(OUTBOX_QUERIES["outbox_mark_passed"],
                       {"passed_xid": str(passed_xid % XID_MOD), "batch": batch})
    return cur.rowcount


def unpublished_passed(conn: psycopg.Connection[Any], passed_xid: int) -> bool:
    row = conn.execute(OUTBOX_QUERIES["outbox_unpublished_passed"],
                       {"passed_xid": str(passed_xid % XID_MOD)}).fetchone()
    return bool(row and row[0])


async def _recorded(job: RelayJob) -> str | None:
    progress = job.state.slot
    if progress.recorded_source is None:
        progress.recorded_source, progress.recorded_xid = await job.db.run(read_source)
    return progress.recorded_source


async def enter_table(job: RelayJob) -> int:
    """Before the table source claims: after the logical source, mark published the rows
    its slot passed; record the table source. The rows marked."""
    progress = job.state.slot
    previous = await _recorded(job)
    if previous == TABLE:
        return 0
    marked = 0
    if previous == LOGICAL and progress.recorded_xid is not None:
        while (done := await job.db.atomic(mark_passed, progress.recorded_xid,
                                           MARK_BATCH)) > 0:
            marked += done
            if done < MARK_BATCH:
                break
    await job.db.atomic(write_source, TABLE, None)
    progress.recorded_source, progress.recorded_xid = TABLE, None
    if previous is not None:
        log.warning("outbox_source_switched", to=TABLE, marked_passed=marked)
    return marked


async def fall_back(job: RelayJob, counts: RelayCounts, deadline: float, gone: SlotGone,
                    table: TableCycle) -> None:
    """The slot is missing or invalidated: record how far it had passed, enter the table
    source, and run a table cycle (its events counted as republished)."""
    OUTBOX_SLOT_LOST.set(1)
    progress = job.state.slot
    if await _recorded(job) == LOGICAL:
        log.error("outbox_slot_lost", reason=str(gone), passed_xid=progress.passed_xid)
        newest = max(progress.passed_xid or 0, progress.recorded_xid or 0) or None
        if newest != progress.recorded_xid:
            await job.db.atomic(write_source, LOGICAL, newest)
            progress.recorded_xid = newest
    await enter_table(job)
    published = counts.published
    await table(job, counts, deadline)
    OUTBOX_FALLBACK_REPUBLISHED.inc(counts.published - published)


async def enter_logical(job: RelayJob, source: LogicalSource, counts: RelayCounts,
                        deadline: float, table: TableCycle) -> bool:
    """Before the logical source reads: after the table source (or none), drain the table
    up to a WAL mark and move the slot there. False: not yet (rows of transactions before
    the mark wait; the next cycle goes on)."""
    OUTBOX_SLOT_LOST.set(0)
    if await _recorded(job) == LOGICAL:
        return True
    position, xmin = await job.db.run(wal_mark)
    failed = counts.failed
    await table(job, counts, deadline)
    if (counts.failed > failed or job.state.kafka_failures
            or await job.db.run(unpublished_passed, xmin)):
        return False
    async with must_complete():
        await job.db.atomic(advance_slot, source, position)
        await job.db.atomic(write_source, LOGICAL, xmin)
    progress = job.state.slot
    progress.recorded_source, progress.recorded_xid = LOGICAL, xmin
    progress.passed_xid = max(progress.passed_xid or 0, xmin)
    progress.recorded_at = trio.current_time()
    log.warning("outbox_source_switched", to=LOGICAL, slot=source.slot, position=position)
    return True


async def record_passed(job: RelayJob, quiet: bool) -> None:
    """After a logical cycle: record how far the slot passed (at most every
    :data:`RECORD_EVERY` seconds while events flow; after a *quiet* cycle, one that
    published nothing, at once: the relay may then idle for long)."""
    progress = job.state.slot
    xid = progress.passed_xid
    now = trio.current_time()
    if xid is None or xid == progress.recorded_xid or (
            now - progress.recorded_at < RECORD_EVERY and not quiet):
        return
    await job.db.atomic(write_source, LOGICAL, xid)
    progress.recorded_xid, progress.recorded_at = xid, now
