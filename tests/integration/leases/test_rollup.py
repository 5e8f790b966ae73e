"""The per-minute rollup the console's charts read (issue 38, item 1; migration 0016): the
lock keepers add each tick to their job's minute, the scan leader writes the backlogs and
prunes, and a failed write never fails a cycle."""

from __future__ import annotations

from functools import partial
from typing import Any

import psycopg
import trio

from actors.finalize.state import FinalizeCounts
from actors.leases.lease import LockConnection
from actors.leases.lock_keeper import (
    CycleContext,
    CycleStatus,
    LockedJob,
    TickFigures,
    serve_lock_keeper,
)
from actors.outbox.state import RelayCounts
from actors.rollup import ROLLUP_FAILURES, record_backlogs, record_tick
from supervision.db.database import open_database
from supervision.jobs import Job
from supervision.metrics import LEADER_GAUGES


def rows(dsn: str, job: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor(
            row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute("SELECT * FROM safetynet.job_minutes WHERE job = %s ORDER BY minute",
                           (job,)).fetchall()


async def test_ticks_of_one_minute_add_up_in_one_row(db_dsn: str) -> None:
    """Two finalize cycles and a relay cycle: one row per job, the counts summed by name
    (zeros and durations left out), the relay's latency buckets summed bucket by bucket."""
    first = FinalizeCounts(reconciled=3, quarantined=1, duration_ms=40)
    second = FinalizeCounts(reconciled=2, withheld=5, duration_ms=10)
    relay = RelayCounts(published=4)
    relay.acks.observe([10, 60, 70, 40_000])
    async with open_database(db_dsn, size=1) as db:
        for counts in (first, second):
            await record_tick(db, TickFigures(Job.RECORDING_FINALIZE, CycleStatus.RAN, counts,
                                              restarts=1 if counts is first else 0))
        await record_tick(db, TickFigures(Job.OUTBOX_RELAY, CycleStatus.RAN, relay,
                                          lease_changes=1))
    [rf] = await trio.to_thread.run_sync(rows, db_dsn, Job.RECORDING_FINALIZE)
    assert rf["cycles"] == 2 and rf["restarts"] == 1 and rf["lease_changes"] == 0
    assert (rf["reconciled"], rf["quarantined"], rf["withheld"]) == (5, 1, 5)
    assert rf["republished"] == rf["published"] == rf["failed_ticks"] == 0
    assert rf["backlog"] is None
    [out] = await trio.to_thread.run_sync(rows, db_dsn, Job.OUTBOX_RELAY)
    assert out["published"] == 4 and out["lease_changes"] == 1
    assert out["ack_ms_max"] == 40_000
    assert out["ack_ms_buckets"] == [1, 2, 0, 0, 0, 0, 0, 0, 0, 1]


async def test_a_failed_rollup_write_is_counted_and_never_raises(db_dsn: str) -> None:
    """The table gone (a database not migrated yet): the tick's write fails, is counted,
    and the caller goes on."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE safetynet.job_minutes")
    before = ROLLUP_FAILURES.labels(writer="cycle")._value.get()
    async with open_database(db_dsn, size=1) as db:
        await record_tick(db, TickFigures(Job.CONFERENCE_REAPER, CycleStatus.RAN, None))
    assert ROLLUP_FAILURES.labels(writer="cycle")._value.get() == before + 1


async def test_the_keeper_records_its_cycles_and_its_start(db_dsn: str) -> None:
    """A keeper with a recorder: its cycles' counts land in its job's minute, and its start
    is counted once."""
    done = trio.Event()
    runs: list[int] = []

    async def cycle(ctx: CycleContext) -> FinalizeCounts:
        runs.append(1)
        if len(runs) == 4:  # the third cycle's record is written before the fourth runs
            done.set()
        return FinalizeCounts(republished=1)

    async with open_database(db_dsn, size=1) as db:
        job = LockedJob(Job.RECORDING_FINALIZE, 0.1, 30, cycle, first_delay=0,
                        record=partial(record_tick, db))
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_lock_keeper, job, db_dsn)
            with trio.fail_after(10):
                await done.wait()
            nursery.cancel_scope.cancel()
    found = await trio.to_thread.run_sync(rows, db_dsn, Job.RECORDING_FINALIZE)
    assert sum(r["cycles"] for r in found) == sum(r["republished"] for r in found) >= 3
    assert sum(r["restarts"] for r in found) == 1


def test_backlogs_keep_the_minutes_largest_and_old_minutes_are_pruned(db_dsn: str) -> None:
    """The scan leader's write: the largest backlog of the minute stays, a job whose gauge
    was never read is left NULL, and a row past retention is deleted."""
    from actors.finalize.metrics import RF_BACKLOG, RF_OLDEST_AGE
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO safetynet.job_minutes (job, minute) VALUES "
                     "('recording-finalize', date_trunc('minute', now()) - interval '9 days')")
        RF_BACKLOG.set(120)
        RF_OLDEST_AGE.set(30.5)
        record_backlogs(conn)
        RF_BACKLOG.set(80)
        record_backlogs(conn)
    assert LEADER_GAUGES.registry.get_sample_value(
        "messenger_recording_finalize_backlog") == 80
    [rf] = rows(db_dsn, Job.RECORDING_FINALIZE)
    assert rf["backlog"] == 120 and rf["oldest_age_s"] == 30.5
    assert rf["cycles"] == rf["reconciled"] == 0


async def test_a_lease_taken_over_from_a_frozen_holder_is_one_lease_change(
        db_dsn: str) -> None:
    """A holder stops renewing; a keeper takes its expired lease over: that tick records
    one lease change (and the keeper's start), the ticks after it none."""
    done = trio.Event()
    runs: list[int] = []

    async def cycle(ctx: CycleContext) -> FinalizeCounts:
        runs.append(1)
        if len(runs) == 3:
            done.set()
        return FinalizeCounts()

    async with open_database(db_dsn, size=1) as db:
        job = LockedJob(Job.CONFERENCE_REAPER, 0.1, 1.0, cycle, first_delay=0,
                        record=partial(record_tick, db))
        frozen = LockConnection(db_dsn)
        assert await frozen.acquire(job) is not None  # then it never renews
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_lock_keeper, job, db_dsn)
            with trio.fail_after(15):
                await done.wait()
            nursery.cancel_scope.cancel()
        frozen.discard()
    found = await trio.to_thread.run_sync(rows, db_dsn, Job.CONFERENCE_REAPER)
    assert sum(r["lease_changes"] for r in found) == 1
    assert sum(r["restarts"] for r in found) == 1
    assert sum(r["cycles"] for r in found) >= 2
