"""Bounded waits on PostgreSQL: every daemon connection carries statement_timeout,
lock_timeout and idle_in_transaction_session_timeout; a row held by another session fails
fast as DatabaseBusy; a backend that stops answering is given up within the client
deadline and its transaction rolls back. Bounds are asserted loosely (3x)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
import trio

from actors.leases.lease import LockConnection
from actors.leases.lock_keeper import CycleContext, LockedJob, serve_lock_keeper
from supervision.app.settings import Config
from supervision.db.database import open_database
from supervision.db.pgconn import client_deadline, conninfo
from supervision.errors import DatabaseBusy, InfrastructureError
from tests.conftest import make_config

BOUNDS = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")


@pytest.fixture
def cfg(db_dsn: str) -> Config:
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)")
        conn.execute("INSERT INTO public.t (id) VALUES (1), (2)")
    return make_config(db_dsn, postgres={"statement_timeout": "1s", "lock_timeout": "300ms",
                                         "idle_in_transaction_session_timeout": "7s"})


def show_bounds(conn: psycopg.Connection) -> dict[str, str]:
    return {name: str(conn.execute(f"SHOW {name}").fetchone()[0])  # type: ignore[index]
            for name in BOUNDS}


@contextmanager
def row_held_by_messenger(dsn: str, row_id: int) -> Iterator[None]:
    """Another session (the messenger service) holds *row_id* locked until the block ends."""
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM public.t WHERE id = %s FOR UPDATE", (row_id,))
        yield
        holder.rollback()


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The backend *pid* is SIGSTOPped (its kernel still answers TCP) until the block ends."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def bump(conn: psycopg.Connection, row_id: int) -> int:
    return conn.execute("UPDATE public.t SET n = n + 1 WHERE id = %s", (row_id,)).rowcount


def n_of(dsn: str, row_id: int) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return int(conn.execute("SELECT n FROM public.t WHERE id = %s", (row_id,)).fetchone()[0])  # type: ignore[index]


async def test_pool_and_lock_connections_carry_the_configured_bounds(cfg: Config) -> None:
    """The pool's and the lock keeper's sessions run with the [postgres] bounds."""
    expected = {"statement_timeout": "1s", "lock_timeout": "300ms",
                "idle_in_transaction_session_timeout": "7s"}
    async with open_database(conninfo(cfg.postgres, "safetynet"),
                             deadline=client_deadline(cfg.postgres)) as db:
        assert await db.run(show_bounds) == expected
    lock = LockConnection(conninfo(cfg.postgres, "safetynet-lock"), client_deadline(cfg.postgres))
    try:
        conn = await lock.ensure()
        assert await trio.to_thread.run_sync(show_bounds, conn) == expected
    finally:
        lock.discard()


async def test_a_row_held_by_the_messenger_fails_fast_as_busy_and_others_commit(
        cfg: Config, db_dsn: str) -> None:
    """A row another session holds makes its statement give up after lock_timeout
    (DatabaseBusy: tried again later), while other rows commit meanwhile."""
    async with open_database(conninfo(cfg.postgres, "safetynet"),
                             deadline=client_deadline(cfg.postgres)) as db:
        with row_held_by_messenger(db_dsn, 1):
            with trio.fail_after(3 * cfg.postgres.lock_timeout + 2):
                with pytest.raises(DatabaseBusy):
                    await db.atomic(bump, 1)
            assert await db.atomic(bump, 2) == 1
        assert await db.atomic(bump, 1) == 1, "once released, the row is written"
    assert await trio.to_thread.run_sync(n_of, db_dsn, 1) == 1


def bump_then_stop_own_backend(conn: psycopg.Connection) -> None:
    bump(conn, 1)
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    os.kill(pid, signal.SIGSTOP)
    try:
        conn.execute("SELECT 1")  # never answered: the backend is stopped
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_a_stopped_backend_is_given_up_within_the_deadline_and_rolls_back(
        cfg: Config, db_dsn: str) -> None:
    """SIGSTOP of the backend mid-transaction: statement_timeout cannot fire and the
    kernel still answers TCP, yet the unit of work fails within the client deadline, its
    write is rolled back and the pool goes on with a fresh connection."""
    deadline = client_deadline(cfg.postgres)
    async with open_database(conninfo(cfg.postgres, "safetynet"), deadline=deadline) as db:
        with trio.fail_after(3 * deadline):
            with pytest.raises(InfrastructureError, match="did not answer"):
                await db.atomic(bump_then_stop_own_backend)
        assert await db.atomic(bump, 2) == 1, "the pool replaced the dead connection"
    assert await trio.to_thread.run_sync(n_of, db_dsn, 1) == 0, "the write rolled back"


async def test_a_stopped_lock_backend_is_given_up_within_the_deadline(cfg: Config) -> None:
    """The lock connection's own queries are bounded the same way: a stopped backend is
    an error within the deadline (the keeper then discards the session), not a hung thread."""
    deadline = client_deadline(cfg.postgres)
    lock = LockConnection(conninfo(cfg.postgres, "safetynet-lock"), deadline)
    try:
        conn = await lock.ensure()
        pid = conn.info.backend_pid
        with stopped(pid), trio.fail_after(3 * deadline), \
                pytest.raises(psycopg.OperationalError, match="did not answer"):
            await trio.to_thread.run_sync(conn.execute, "SELECT 1")
        assert conn.closed
    finally:
        lock.discard()


async def test_the_messenger_dsn_options_win_over_the_configured_bounds(db_dsn: str) -> None:
    """A -c setting written in the DSN's own options overrides the [postgres] key."""
    dsn = psycopg.conninfo.make_conninfo(db_dsn, options="-c lock_timeout=2s")
    cfg = make_config(dsn)
    async with open_database(conninfo(cfg.postgres, "safetynet")) as db:
        bounds = await db.run(show_bounds)
    assert bounds["lock_timeout"] == "2s" and bounds["statement_timeout"] == "20s"



async def test_a_cycle_that_hits_lock_timeout_is_tried_again_not_crashed(
        cfg: Config, db_dsn: str) -> None:
    """The keeper takes DatabaseBusy as "try later": it backs off and its next cycle writes
    the row once the messenger let go; the keeper never raises."""
    outcomes: list[str] = []
    done = trio.Event()
    async with open_database(conninfo(cfg.postgres, "safetynet"),
                             deadline=client_deadline(cfg.postgres)) as db:

        async def cycle(ctx: CycleContext) -> None:
            try:
                await db.atomic(bump, 1)
            except DatabaseBusy:
                outcomes.append("busy")
                released.set()
                raise
            outcomes.append("written")
            done.set()

        released = trio.Event()
        job = LockedJob("bounded-waits", interval=0.1, lock_ttl=30.0, cycle=cycle,
                        first_delay=0, reconnect_base=0.1)
        async with trio.open_nursery() as nursery:
            with row_held_by_messenger(db_dsn, 1):
                await nursery.start(serve_lock_keeper, job, db_dsn)
                with trio.fail_after(10):
                    await released.wait()  # a cycle failed busy; the messenger lets go
            with trio.fail_after(10):
                await done.wait()  # the same keeper, still running, wrote it later
            nursery.cancel_scope.cancel()
    assert outcomes[0] == "busy" and outcomes[-1] == "written"
    assert await trio.to_thread.run_sync(n_of, db_dsn, 1) == 1
