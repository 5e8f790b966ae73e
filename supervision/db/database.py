"""PostgreSQL from Trio: synchronous psycopg in worker threads, one transaction per call.

>>> async with open_database(dsn, size=4) as db:
...     n = await db.atomic(mark_done, row_id)   # mark_done(conn, row_id) runs in a thread

Why threads and not psycopg's AsyncConnection over trio-asyncio: the whole transaction
crosses into a thread once, while the asyncio bridge pays per statement; measured in
``bench/pg_bridge.py`` (see docs/benchmarks.md) the thread design is clearly faster. A unit of work
is a plain function ``fn(conn, *args)`` that runs inside ``conn.transaction()``: it
commits when *fn* returns and rolls back when it raises.

Fencing: ``db.fenced(Fence(job, term))`` is the same pool whose :meth:`Database.atomic`
and :meth:`Database.atomic_each` first call ``safetynet.lease_fence`` inside the
transaction (migration 0005): a transaction written under a term that is no longer live
rolls back and raises :class:`~supervision.errors.LeaseLost`. Reads (:meth:`Database.run`)
are not fenced.

Round trips: a unit of work marked :func:`pipelined` runs in psycopg's pipeline mode, so
``BEGIN``, the fence and its statements travel together up to its first fetch, and
``COMMIT`` with whatever follows it (a claim: 2 round trips instead of 4; a write that
fetches nothing: 1). The fence is still the first statement of the transaction: when it
raises, the server skips the rest and the transaction rolls back. Only for functions that
read results through ``fetch*()`` (``rowcount`` is not known before a sync).

What cancellation does: :meth:`Database.atomic` runs under
:func:`~supervision.tree.shielding.must_complete`, so a soft cancel waits for the transaction
to commit or roll back; a hard stop sends PostgreSQL a cancel request, the statement in
flight fails, and the transaction rolls back. :meth:`Database.run` is for reads and
non-critical writes: cancelling it abandons the thread (which finishes in the background,
and the cancel request makes that quick).
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Concatenate, ParamSpec, TypeVar

import attrs
import psycopg
import psycopg_pool
import trio

from supervision.db.pgconn import bounded_class, with_defaults
from supervision.db.queries import QUERIES
from supervision.errors import DatabaseBusy, InfrastructureError, LeaseLost
from supervision.metrics import FENCED_WRITES
from supervision.tree.shielding import WorkAbandoned, current_guard, must_complete

P = ParamSpec("P")
T = TypeVar("T")
Item = TypeVar("Item")
Work = Callable[Concatenate[psycopg.Connection, P], T]


LEASE_LOST_SQLSTATE = "SN001"  # raised by safetynet.lease_fence


@attrs.frozen
class Fence:
    """The lease a cycle writes under: its transactions commit only while *term* is the
    live term of *job*."""

    job: str
    term: int

    def check(self, conn: psycopg.Connection) -> None:
        conn.execute(QUERIES["lease_fence"], {"job": self.job, "term": self.term})


@attrs.frozen
class DataProblem:
    """The database rejected one item's data (a value out of range, a constraint)."""

    error: str


class _InFlight:
    """The connection a worker thread is using, so Trio can send a cancel request."""

    def __init__(self) -> None:
        self.conn: psycopg.Connection | None = None
        self.aborted = False  # checked by the worker right before COMMIT

    def abort(self) -> None:
        self.aborted = True
        conn = self.conn
        if conn is not None:
            threading.Thread(target=_cancel_quietly, args=(conn,), daemon=True).start()


def _cancel_quietly(conn: psycopg.Connection) -> None:
    with contextlib.suppress(psycopg.Error, OSError):  # already gone: nothing to cancel
        conn.cancel_safe(timeout=5.0)


class _IdleCheck:
    """Check a pooled connection on checkout only when it sat idle for a while: a busy
    connection has just proven itself, and a check is a full round trip."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._returned: weakref.WeakKeyDictionary[psycopg.Connection, float] = (
            weakref.WeakKeyDictionary())

    def check(self, conn: psycopg.Connection) -> None:
        if time.monotonic() - self._returned.get(conn, 0.0) > self.after_s:
            psycopg_pool.ConnectionPool.check_connection(conn)

    def returned(self, conn: psycopg.Connection) -> None:
        self._returned[conn] = time.monotonic()


class Database:
    """A small pool of synchronous connections driven from Trio worker threads."""

    def __init__(self, dsn: str, *, size: int = 4, name: str = "safetynet",
                 connect_timeout: float = 5.0, deadline: float | None = None) -> None:
        idle = _IdleCheck(after_s=2.0)
        # *dsn* wins over these defaults (see supervision.db.pgconn.conninfo for the daemon's)
        conninfo = with_defaults(dsn, application_name=name,
                                 connect_timeout=max(2, math.ceil(connect_timeout)))
        self._pool = psycopg_pool.ConnectionPool(
            conninfo, min_size=1, max_size=size, open=False, name=name,
            timeout=connect_timeout, check=idle.check, reset=idle.returned,
            connection_class=bounded_class(deadline), kwargs={"autocommit": True},
        )
        self._limiter = trio.CapacityLimiter(size)
        self.fence: Fence | None = None
        self.conninfo = conninfo  # what a direct connection (a diagnosis) would use

    def fenced(self, fence: Fence | None) -> Database:
        """This pool, its writes fenced by *fence* (``None``: not fenced)."""
        view = copy.copy(self)
        view.fence = fence
        return view

    async def open(self) -> None:
        """Start the pool; connections are made in the background (no wait for the server)."""
        await trio.to_thread.run_sync(lambda: self._pool.open(wait=False))

    async def close(self) -> None:
        await trio.to_thread.run_sync(self._pool.close)

    async def atomic(self, fn: Work[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(conn, *args)`` as one transaction that commits whole or not at all."""
        async with must_complete():
            return await self._call(
                _in_transaction(fn, self.fence, *args, **kwargs), shielded=True)

    async def atomic_each(self, fn: Callable[[psycopg.Connection, Item], T],
                          items: Sequence[Item]) -> list[T | DataProblem]:
        """``fn(conn, item)`` for each item, each its own transaction, in one thread hop.

        *fn* must issue exactly one statement: it runs in autocommit, where a statement is
        a transaction of its own (no BEGIN/COMMIT round trips), so each item commits whole
        or not at all. An item whose data the database rejects yields its
        :class:`DataProblem` and the others go on; a connection failure raises
        :class:`InfrastructureError` (items before it are committed, the rest are not).
        Fenced, the items run as one transaction behind the fence (the fence has to share
        a transaction with what it guards); when one item's data is rejected that
        transaction rolls back and each item runs again in a fenced transaction of its own.
        What cancellation does: as :meth:`atomic`, per item — after a hard stop no further
        item starts.
        """
        fence = self.fence

        def one(conn: psycopg.Connection, in_flight: _InFlight, item: Item
                ) -> T | DataProblem:
            if in_flight.aborted:
                raise WorkAbandoned()
            try:
                if fence is None:
                    return fn(conn, item)
                with conn.transaction():
                    fence.check(conn)
                    result = fn(conn, item)
                    if in_flight.aborted:
                        raise WorkAbandoned()
                    return result
            except (psycopg.DataError, psycopg.IntegrityError) as exc:
                return DataProblem(type(exc).__name__)

        def each(conn: psycopg.Connection, in_flight: _InFlight) -> list[T | DataProblem]:
            if fence is not None and len(items) > 1:
                try:
                    with conn.transaction():
                        fence.check(conn)
                        together: list[T | DataProblem] = []
                        for item in items:
                            if in_flight.aborted:
                                raise WorkAbandoned()
                            together.append(fn(conn, item))
                        if in_flight.aborted:
                            raise WorkAbandoned()
                        return together
                except (psycopg.DataError, psycopg.IntegrityError):
                    pass  # rolled back whole: find the culprit one item at a time
            return [one(conn, in_flight, item) for item in items]

        async with must_complete():
            return await self._call(each, shielded=True)

    async def run(self, fn: Work[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Like :meth:`atomic` but cancellable at once (for reads and idempotent writes)."""
        return await self._call(_in_transaction(fn, None, *args, **kwargs),
                                shielded=False)

    async def _call(self, unit: Callable[[psycopg.Connection, _InFlight], T],
                    shielded: bool) -> T:
        in_flight = _InFlight()

        def work() -> T:
            try:
                with self._pool.connection() as conn:
                    in_flight.conn = conn
                    try:
                        return unit(conn, in_flight)
                    finally:
                        in_flight.conn = None
            except psycopg.errors.LockNotAvailable as exc:
                raise DatabaseBusy(f"postgres: {_first_line(exc)}") from exc
            except (psycopg.OperationalError, psycopg.InterfaceError,
                    psycopg_pool.PoolTimeout) as exc:
                raise InfrastructureError(
                    f"postgres: {type(exc).__name__}: {_first_line(exc)}") from exc
            except psycopg.Error as exc:  # the fence (its SQLSTATE is no known class)
                if exc.sqlstate != LEASE_LOST_SQLSTATE:
                    raise
                if self.fence is not None:
                    FENCED_WRITES.labels(job=self.fence.job).inc()
                raise LeaseLost(f"postgres: {_first_line(exc)}") from exc

        with current_guard().on_hard_stop(in_flight.abort):
            if shielded:
                # Inside must_complete: the shield keeps soft cancels out; a hard stop
                # cancels this scope, and abandoning the thread is safe because the
                # cancel request above rolls its transaction back.
                return await trio.to_thread.run_sync(
                    work, limiter=self._limiter, abandon_on_cancel=True)
            try:
                return await trio.to_thread.run_sync(
                    work, limiter=self._limiter, abandon_on_cancel=True)
            except trio.Cancelled:
                in_flight.abort()
                raise


PIPELINED = "__safetynet_pipelined__"


def pipelined(fn: Callable[P, T]) -> Callable[P, T]:
    """Mark a unit of work as safe for psycopg's pipeline mode: it reads what its
    statements return only through ``fetch*()`` (never ``rowcount``). Its transaction
    then needs fewer round trips (see the module docstring)."""
    setattr(fn, PIPELINED, True)
    return fn


def _in_transaction(fn: Work[P, T], fence: Fence | None, *args: P.args,
                    **kwargs: P.kwargs) -> Callable[[psycopg.Connection, _InFlight], T]:
    pipeline = getattr(fn, PIPELINED, False)

    def unit(conn: psycopg.Connection, in_flight: _InFlight) -> T:
        with conn.pipeline() if pipeline else contextlib.nullcontext(), conn.transaction():
            if fence is not None:
                fence.check(conn)
            result = fn(conn, *args, **kwargs)
            if in_flight.aborted:  # a cancel request may land between statements:
                raise WorkAbandoned()  # never commit then
            return result

    return unit


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@asynccontextmanager
async def open_database(dsn: str, *, size: int = 4, name: str = "safetynet",
                        connect_timeout: float = 5.0, deadline: float | None = None,
                        ) -> AsyncIterator[Database]:
    """A :class:`Database` that is closed on every exit path; *deadline* bounds each round
    trip client-side (:class:`supervision.db.pgconn.BoundedConnection`)."""
    db = Database(dsn, size=size, name=name, connect_timeout=connect_timeout,
                  deadline=deadline)
    await db.open()
    try:
        yield db
    finally:
        with trio.CancelScope(shield=True):
            await db.close()
