"""The commit-or-rollback primitive on real PostgreSQL: all of a block's writes or none,
whichever await point the cancellation hits."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest
import trio
import trio.lowlevel

from supervision.db.database import open_database
from supervision.errors import InfrastructureError
from supervision.tree.shielding import StopGuard, WorkAbandoned, guarded_by

WRITES = 3


def setup_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (batch uuid, n int)")


def count(dsn: str, batch: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM t WHERE batch = %s", (batch,)).fetchone()
        assert row is not None
        return int(row[0])


def busy_backends(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
                           " AND query LIKE '%%pg_sleep%%' AND pid <> pg_backend_pid()"
                           ).fetchone()
        assert row is not None
        return int(row[0])


def wait_until_idle(dsn: str) -> None:
    """The abandoned worker's statement is cancelled server-side; wait for that backend."""
    deadline = time.monotonic() + 10
    while busy_backends(dsn):
        assert time.monotonic() < deadline, "the cancelled statement is still running"
        time.sleep(0.05)


def three_writes(conn: psycopg.Connection, batch: str, stop_at: int,
                 trigger: trio.lowlevel.TrioToken, stop: object) -> None:
    """Insert WRITES rows; at point *stop_at* trigger the stop, then hit a slow statement
    (the 'await point' where the cancellation lands)."""
    for n in range(WRITES + 1):
        if n == stop_at:
            trio.from_thread.run_sync(stop, trio_token=trigger)  # type: ignore[arg-type]
            conn.execute("SELECT pg_sleep(0.3)")
        if n < WRITES:
            conn.execute("INSERT INTO t (batch, n) VALUES (%s, %s)", (batch, n))


@pytest.mark.parametrize("stop_at", range(WRITES + 1))
async def test_soft_cancel_at_any_point_commits_every_write(db_dsn: str, stop_at: int) -> None:
    """A soft cancel (SIGTERM, lost sibling) lets the block finish: all writes commit."""
    await trio.to_thread.run_sync(setup_table, db_dsn)
    batch = str(uuid.uuid4())
    async with open_database(db_dsn, size=2) as db:
        with trio.CancelScope() as scope:
            await db.atomic(three_writes, batch, stop_at, trio.lowlevel.current_trio_token(),
                            scope.cancel)
            await trio.lowlevel.checkpoint()
            raise AssertionError("the cancel must land right after the block")
    assert scope.cancelled_caught
    assert await trio.to_thread.run_sync(count, db_dsn, batch) == WRITES


@pytest.mark.parametrize("stop_at", range(WRITES + 1))
async def test_hard_stop_at_any_point_rolls_back_every_write(db_dsn: str, stop_at: int) -> None:
    """A hard stop (grace expired, second signal) aborts the block: no write survives."""
    await trio.to_thread.run_sync(setup_table, db_dsn)
    batch = str(uuid.uuid4())
    guard = StopGuard()
    async with open_database(db_dsn, size=2) as db:
        with guarded_by(guard), pytest.raises(WorkAbandoned):
            await db.atomic(three_writes, batch, stop_at, trio.lowlevel.current_trio_token(),
                            guard.hard_stop)
        await trio.to_thread.run_sync(wait_until_idle, db_dsn)
    assert await trio.to_thread.run_sync(count, db_dsn, batch) == 0


async def test_error_inside_the_block_rolls_back_every_write(db_dsn: str) -> None:
    """An exception in the unit of work undoes its writes and reaches the caller."""
    await trio.to_thread.run_sync(setup_table, db_dsn)
    batch = str(uuid.uuid4())

    def fails_midway(conn: psycopg.Connection) -> None:
        conn.execute("INSERT INTO t (batch, n) VALUES (%s, 1)", (batch,))
        raise ValueError("bad row")

    async with open_database(db_dsn, size=1) as db:
        with pytest.raises(ValueError, match="bad row"):
            await db.atomic(fails_midway)
    assert await trio.to_thread.run_sync(count, db_dsn, batch) == 0


async def test_unreachable_database_is_an_infrastructure_error() -> None:
    """Connection failures surface as InfrastructureError without the password."""
    dsn = "postgresql://u:hunter2@127.0.0.1:1/x"
    async with open_database(dsn, size=1, connect_timeout=1) as db:
        with pytest.raises(InfrastructureError) as info:
            await db.run(lambda conn: conn.execute("SELECT 1"))
    assert "hunter2" not in str(info.value)
