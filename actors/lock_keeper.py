"""The lock keeper: single-runner leadership for one job, one cycle per tick.

>>> job = LockedJob("recording-finalize", interval=60, lock_ttl=300, cycle=finalize_cycle)
>>> await nursery.start(serve_lock_keeper, job, dsn)

Inputs: the job (its interval, its lock TTL and the coroutine that runs one cycle) and a
DSN for a *dedicated* connection (advisory locks are session-level). Outputs: the job's
cycles, run only while this process holds the job's PostgreSQL advisory lock, and
``safetynet_lock_held{job}``. Restart type: permanent.

Each tick: take the lock without waiting (held elsewhere → the cycle is skipped); run the
cycle in a nested nursery inside a scope bounded by ``lock_ttl``; release the lock. While
the cycle runs, a watchdog pings the lock connection every ``ping_interval``; when the
connection dies or stops answering (``pg_terminate_backend``, a network partition) the
lock is gone, so the cycle's scope is cancelled at once: nothing new is committed after
the loss is seen, and the row in flight commits or rolls back whole. The keeper then
reconnects with back-off.

What cancellation does: the cycle is cancelled like any other work (in-flight
``must_complete`` blocks finish), then the lock is released in a shielded block; if the
release fails, closing the connection releases it server-side.
"""

from __future__ import annotations

import enum
import hashlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import psycopg
import structlog
import trio

from supervision.errors import InfrastructureError, describe
from supervision.metrics import LOCK_HELD
from supervision.pgconn import connect
from supervision.queries import QUERIES
from supervision.ticker import Ticker
from supervision.wakeup import Wakeup

log = structlog.get_logger("lock_keeper")

R = TypeVar("R")


class CycleStatus(enum.StrEnum):
    """How one tick of a lock keeper went."""

    RAN = "ran"
    SKIPPED_LOCKED = "skipped_locked"  # another process holds the job's lock
    NO_CONNECTION = "no_connection"  # the lock connection could not be opened
    LOST_LOCK = "lost_lock"  # the lock session died mid-cycle; the cycle was cancelled
    OVERRAN = "overran"  # the cycle hit lock_ttl and was cancelled
    INFRASTRUCTURE_ERROR = "infrastructure_error"  # a server went away mid-cycle


def lock_key(job: str) -> int:
    """A stable signed 64-bit advisory lock key for *job*."""
    digest = hashlib.sha256(f"safetynet:{job}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@attrs.frozen
class CycleContext:
    """What a cycle gets from the keeper."""

    job: str
    job_run_id: str


@attrs.frozen
class LockedJob(Generic[R]):
    """One job under a lock keeper: its timing and the coroutine that runs one cycle."""

    name: str
    interval: float
    lock_ttl: float
    cycle: Callable[[CycleContext], Awaitable[R]]
    first_delay: float = 0.5
    ping_interval: float = 0.25
    ping_timeout: float = 0.75
    reconnect_base: float = 0.5
    reconnect_cap: float = 15.0
    wakeup: Wakeup | None = None  # when set, a wake-up starts the next cycle early

    @property
    def key(self) -> int:
        return lock_key(self.name)


@attrs.frozen
class CycleOutcome(Generic[R]):
    """How one tick went; ``result`` is the cycle's own result when it ran."""

    status: CycleStatus
    job_run_id: str | None = None
    result: R | None = None
    error: str | None = None  # why, for NO_CONNECTION (the driver's first line)


class LockConnection:
    """The keeper's own connection (advisory locks are session-level), used only from
    worker threads one call at a time; ``discard`` ends the session and so every lock."""

    def __init__(self, dsn: str, deadline: float | None = None) -> None:
        self.dsn = dsn
        self.deadline = deadline  # client-side bound of a round trip (supervision.pgconn)
        self.conn: psycopg.Connection | None = None
        self.failures = 0

    async def ensure(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.conn = await trio.to_thread.run_sync(
                lambda: connect(self.dsn, self.deadline, connect_timeout=5,
                                application_name="safetynet-lock"),
                abandon_on_cancel=True)
        return self.conn

    async def query(self, name: str, key: int, limit: float, *, connect: bool = True) -> Any:
        """Run a lock query; with ``connect=False`` a lost connection is an error, never a
        fresh session (a new session does not hold the lock)."""
        if connect:
            conn = await self.ensure()
        elif self.conn is None or self.conn.closed:
            raise psycopg.OperationalError("lock connection is closed")
        else:
            conn = self.conn

        def call() -> Any:
            row = conn.execute(QUERIES[name], {"key": key}).fetchone()
            return row[0] if row else None

        with trio.fail_after(limit):
            return await trio.to_thread.run_sync(call, abandon_on_cancel=True)

    def discard(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()  # ends the session: the server releases every lock it held


async def run_locked_cycle(job: LockedJob[R], lock: LockConnection) -> CycleOutcome[R]:
    """One tick: lock, cycle under the TTL with the watchdog, unlock."""
    try:
        got = await lock.query("advisory_lock_try", job.key, limit=5.0)
    except (psycopg.Error, OSError, trio.TooSlowError) as exc:
        lock.discard()
        lock.failures += 1
        log.warning("lock_connection_failed", job=job.name, error=describe(exc),
                    failures=lock.failures)
        return CycleOutcome(CycleStatus.NO_CONNECTION, error=describe(exc))
    lock.failures = 0
    if not got:
        log.info("cycle_skipped_locked", job=job.name)
        return CycleOutcome(CycleStatus.SKIPPED_LOCKED)

    run_id = str(uuid.uuid4())
    LOCK_HELD.labels(job=job.name).set(1)
    lost = False
    result: R | None = None
    try:
        with structlog.contextvars.bound_contextvars(job=job.name, job_run_id=run_id):
            async with trio.open_nursery() as nursery:
                with trio.move_on_after(job.lock_ttl) as ttl_scope:

                    async def watchdog() -> None:
                        nonlocal lost
                        while True:
                            await trio.sleep(job.ping_interval)
                            try:
                                await lock.query("advisory_lock_ping", job.key,
                                                 limit=job.ping_timeout, connect=False)
                            except (psycopg.Error, OSError, trio.TooSlowError) as exc:
                                lost = True
                                log.error("lock_lost", error=type(exc).__name__)
                                ttl_scope.cancel()
                                return

                    nursery.start_soon(watchdog)
                    result = await job.cycle(CycleContext(job.name, run_id))
                nursery.cancel_scope.cancel()
            if ttl_scope.cancelled_caught and not lost:
                log.error("cycle_overran", lock_ttl_s=job.lock_ttl)
    finally:
        LOCK_HELD.labels(job=job.name).set(0)
        with trio.CancelScope(shield=True):
            await _release(job, lock, lost)
    if lost:
        return CycleOutcome(CycleStatus.LOST_LOCK, run_id)
    if ttl_scope.cancelled_caught:
        return CycleOutcome(CycleStatus.OVERRAN, run_id)
    return CycleOutcome(CycleStatus.RAN, run_id, result)


async def _release(job: LockedJob[Any], lock: LockConnection, lost: bool) -> None:
    if lost:
        lock.discard()
        return
    try:
        await lock.query("advisory_lock_release", job.key, limit=2.0, connect=False)
    except (psycopg.Error, OSError, trio.TooSlowError):
        lock.discard()


async def serve_lock_keeper(
    job: LockedJob[Any], dsn: str, *, deadline: float | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run *job*'s cycles under its advisory lock until cancelled; *deadline* bounds each
    round trip of the lock connection client-side."""
    lock = LockConnection(dsn, deadline)
    ticker = Ticker(job.interval, job.first_delay)
    LOCK_HELD.labels(job=job.name).set(0)
    task_status.started()
    failed_cycles = 0
    try:
        while True:
            if job.wakeup is None or not await job.wakeup.wait(ticker.delay()):
                await ticker.wait()
            try:
                outcome = await run_locked_cycle(job, lock)
            except* InfrastructureError as group:
                # A server went away mid-cycle: the row in flight rolled back; back off and
                # try again rather than crash-loop (bugs still crash and restart the keeper).
                failed_cycles += 1
                log.warning("cycle_failed", job=job.name, failures=failed_cycles,
                            error=str(group.exceptions[0])[:200])
                outcome = CycleOutcome(CycleStatus.INFRASTRUCTURE_ERROR)
            else:
                failed_cycles = 0
            no_connection = outcome.status == CycleStatus.NO_CONNECTION
            failures = lock.failures if no_connection else failed_cycles
            if failures:
                delay = min(job.reconnect_cap, job.reconnect_base * 2 ** (failures - 1))
                await trio.sleep(delay)
    finally:
        lock.discard()
