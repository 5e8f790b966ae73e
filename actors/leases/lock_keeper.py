"""The lock keeper: single-runner leadership for one job, one cycle per tick.

>>> job = LockedJob("recording-finalize", interval=60, lock_ttl=300, cycle=finalize_cycle)
>>> await nursery.start(serve_lock_keeper, job, dsn)

Inputs: the job (its interval, its lock TTL and the coroutine that runs one cycle) and a
DSN for a *dedicated* connection (the lease's session, and advisory locks are
session-level). Outputs: the job's cycles, run only while this process holds the job's
lease, ``safetynet_lock_held{job}``, ``safetynet_lease_term{job}`` and
``safetynet_lease_lost_total{job}`` and ``safetynet_job_paused{job}``. Restart type:
permanent.

A paused job (``safetynet pause``: a row in ``safetynet.job_pauses``, migration 0006) is
checked right before the lease would be taken: while paused, no lease is taken and no
cycle runs (a cycle already running finishes); ``cycle_skipped_paused`` is logged once
per pause, ``job_resumed`` once the row is gone.

A job with an idle probe (the relay: is anything publishable?) asks it on every tick
that was not woken, right after the pause check: when it finds nothing to do, the tick
is skipped without taking the lease (``skipped_idle``, not logged), so an idle daemon
does one cheap read per tick instead of a lease, a fenced claim and a release.

Each tick: take the job's lease (``safetynet.leases``, migration 0005; a new term, valid
``lock_ttl`` on the database clock) and, next to it, the advisory lock when it is free (so
``pg_locks`` still shows the leader, and a replica of the advisory-lock release before
leases cannot lead meanwhile). Held by a live holder → the cycle is skipped. So is a tick
that finds the advisory lock held by a session without the lease-era marker (a shared
advisory lock every lock session of this era holds): an older replica leads by that lock
alone, during a rolling upgrade; a leader that holds only the lease steps down at its next
renewal if such a replica takes the lock (docs/operations.md, rolling upgrade). Then the
cycle runs in a nested nursery inside a scope bounded by
``lock_ttl``, with a :class:`~supervision.database.Fence` of its term in its context: the
cycle's writes commit only while the term is live. A watchdog pings the lock connection
every ``ping_interval`` and renews the lease every ``lock_ttl / 4``; when the connection
dies or the renewal is refused (another daemon took the lease: this one was frozen past
its TTL), the cycle's scope is cancelled at once, and a write already in flight is
rejected by the fence (``LeaseLost``). Either way the keeper logs ``lease_lost`` or
``lock_lost``, steps down and tries again at its next tick.

A frozen holder cannot hold on: its lease expires ``lock_ttl`` after its last renewal and
a standby takes it at its next tick, with no session killed by hand. A holder whose lock
session ended (killed, or the process died) loses the lease at once.

What cancellation does: the cycle is cancelled like any other work (in-flight
``must_complete`` blocks finish), then the lease and the lock are released in a shielded
block; if that fails, closing the connection ends the session (the lease then expires or
is taken over because its session is gone).
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import psycopg
import structlog
import trio

from supervision.database import Fence
from supervision.errors import InfrastructureError, LeaseLost, describe
from supervision.metrics import JOB_PAUSED, LEASE_LOST, LEASE_TERM, LOCK_HELD
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
    SKIPPED_PAUSED = "skipped_paused"  # the job is paused (safetynet pause): no lease taken
    SKIPPED_IDLE = "skipped_idle"  # the job's idle probe found nothing to do: no lease taken
    NO_CONNECTION = "no_connection"  # the lock connection could not be opened
    LOST_LOCK = "lost_lock"  # the lock session died mid-cycle; the cycle was cancelled
    LEASE_LOST = "lease_lost"  # another daemon took the lease over; the cycle stepped down
    OVERRAN = "overran"  # the cycle hit lock_ttl and was cancelled
    INFRASTRUCTURE_ERROR = "infrastructure_error"  # a server went away mid-cycle


def lock_key(job: str) -> int:
    """A stable signed 64-bit advisory lock key for *job*."""
    digest = hashlib.sha256(f"safetynet:{job}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Held shared by every lease-era lock session (advisory_lock_mark_lease_era): an advisory
# lock holder without it is a replica of the release before leases, which leads by the
# advisory lock alone.
LEASE_ERA_MARKER = lock_key("lease-era")


@attrs.frozen
class CycleContext:
    """What a cycle gets from the keeper."""

    job: str
    job_run_id: str
    fence: Fence | None = None  # the lease's term: the cycle's writes commit only under it


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
    # when set, a tick that was not woken asks it first; True (nothing to do) skips the
    # tick without taking the lease. An unlocked read on the pool, so an idle job does no
    # lease traffic; a failing probe counts as "not idle" (the cycle then meets the fault)
    idle: Callable[[], Awaitable[bool]] | None = None

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


@attrs.frozen
class Lease:
    """A lease this process holds: the job, its term, and whom it took it from."""

    job: str
    term: int
    previous_holder: str | None = None
    previous_state: str = "released"  # released | expired | session_gone
    advisory: bool = False  # this session also holds the job's advisory lock

    @property
    def fence(self) -> Fence:
        return Fence(self.job, self.term)


@attrs.frozen
class JobPause:
    """A row of ``safetynet.job_pauses``: the job is paused on every replica."""

    reason: str | None
    paused_at: dt.datetime  # the database clock
    paused_by: str


def holder_name() -> str:
    """Who holds a lease, as operators read it: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LockConnection:
    """The keeper's own connection (the lease's session; advisory locks are
    session-level), used only from worker threads one call at a time; ``discard`` ends
    the session and so every advisory lock."""

    def __init__(self, dsn: str, deadline: float | None = None,
                 holder: str | None = None) -> None:
        self.dsn = dsn
        self.deadline = deadline  # client-side bound of a round trip (supervision.pgconn)
        self.holder = holder or holder_name()
        self.conn: psycopg.Connection | None = None
        self.failures = 0
        self.pause_logged: JobPause | None = None  # the pause cycle_skipped_paused named
        self.older_logged = False  # cycle_skipped_older_release_leads said once per episode

    async def ensure(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            def open_session() -> psycopg.Connection:
                conn = connect(self.dsn, self.deadline, connect_timeout=5,
                               application_name="safetynet-lock")
                conn.execute(QUERIES["lease_session_setup"])
                conn.execute(QUERIES["advisory_lock_mark_lease_era"],
                             {"marker": LEASE_ERA_MARKER})
                return conn

            self.conn = await trio.to_thread.run_sync(open_session, abandon_on_cancel=True)
        return self.conn

    async def fetch(self, name: str, params: dict[str, Any], limit: float, *,
                    connect: bool = True) -> tuple[Any, ...] | None:
        """Run a lock or lease query, its first row; with ``connect=False`` a lost
        connection is an error, never a fresh session (a new session holds nothing)."""
        if connect:
            conn = await self.ensure()
        elif self.conn is None or self.conn.closed:
            raise psycopg.OperationalError("lock connection is closed")
        else:
            conn = self.conn

        def call() -> tuple[Any, ...] | None:
            cur = conn.execute(QUERIES[name], params)
            return cur.fetchone() if cur.description is not None else None

        with trio.fail_after(limit):
            return await trio.to_thread.run_sync(call, abandon_on_cancel=True)

    async def query(self, name: str, key: int, limit: float, *, connect: bool = True) -> Any:
        """An advisory-lock query on *key*: its single value."""
        row = await self.fetch(name, {"key": key}, limit, connect=connect)
        return row[0] if row else None

    async def pause(self, job: LockedJob[Any]) -> JobPause | None:
        """*job*'s pause, when it is paused."""
        row = await self.fetch("job_pauses_get", {"job": job.name}, limit=5.0)
        return None if row is None else JobPause(row[0], row[1], row[2])

    async def acquire(self, job: LockedJob[Any]) -> Lease | None:
        """Take *job*'s lease (and its advisory lock when free); None when it is held."""
        got_lock = await self.query("advisory_lock_try", job.key, limit=5.0)
        if not got_lock and await self.older_leader(job):
            if not self.older_logged:
                log.warning("cycle_skipped_older_release_leads", job=job.name)
                self.older_logged = True
            return None
        self.older_logged = False
        row = await self.fetch("lease_acquire", {"job": job.name, "holder": self.holder,
                                                 "ttl": job.lock_ttl}, limit=5.0)
        if row is None:
            if got_lock:
                await self.query("advisory_lock_release", job.key, limit=2.0, connect=False)
            return None
        return Lease(job.name, int(row[0]), row[1], str(row[2]), bool(got_lock))

    async def older_leader(self, job: LockedJob[Any], *, connect: bool = True) -> bool:
        """Whether a replica of the advisory-lock release (before leases) holds *job*'s
        advisory lock: rolling upgrade from it, that replica leads."""
        row = await self.fetch("advisory_lock_older_holders",
                               {"key": job.key, "marker": LEASE_ERA_MARKER}, limit=5.0,
                               connect=connect)
        return bool(row and row[0])

    async def renew(self, job: LockedJob[Any], lease: Lease, limit: float) -> bool:
        """Extend the lease by ``lock_ttl``; False when its term is no longer live, or
        when, holding the lease without the advisory lock, a replica of the release before
        leases took that lock meanwhile (it leads: this one steps down)."""
        if not lease.advisory and await self.older_leader(job, connect=False):
            log.warning("lease_yielded_to_older_release", job=job.name)
            return False
        row = await self.fetch("lease_renew", {"job": job.name, "term": lease.term,
                                               "ttl": job.lock_ttl}, limit, connect=False)
        return row is not None

    async def release(self, job: LockedJob[Any], lease: Lease) -> None:
        await self.fetch("lease_release", {"job": job.name, "term": lease.term}, 2.0,
                         connect=False)
        if lease.advisory:
            await self.query("advisory_lock_release", job.key, limit=2.0, connect=False)

    def discard(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()  # ends the session: the server releases every lock it held


# a server or a connection failing: back off and try again. A missing schema (a
# ProgrammingError) is not one of them: it crashes the keeper, which escalates.
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError, trio.TooSlowError)


async def run_locked_cycle(job: LockedJob[R], lock: LockConnection, *,
                           probe: bool = True) -> CycleOutcome[R]:
    """One tick: take the lease, cycle under the TTL with the watchdog, give it back.
    With *probe* (a tick that was not woken), the job's idle probe may skip it first."""
    idle = False
    try:
        pause = await lock.pause(job)
        if pause is None and probe and job.idle is not None:
            idle = await _idle(job)
        lease = await lock.acquire(job) if pause is None and not idle else None
    except DB_ERRORS as exc:
        lock.discard()
        lock.failures += 1
        log.warning("lock_connection_failed", job=job.name, error=describe(exc),
                    failures=lock.failures)
        return CycleOutcome(CycleStatus.NO_CONNECTION, error=describe(exc))
    lock.failures = 0
    JOB_PAUSED.labels(job=job.name).set(0 if pause is None else 1)
    if pause is not None:
        if pause != lock.pause_logged:
            log.info("cycle_skipped_paused", job=job.name, reason=pause.reason,
                     paused_by=pause.paused_by, paused_at=pause.paused_at.isoformat())
            lock.pause_logged = pause
        return CycleOutcome(CycleStatus.SKIPPED_PAUSED)
    if lock.pause_logged is not None:
        log.info("job_resumed", job=job.name)
        lock.pause_logged = None
    if idle:
        return CycleOutcome(CycleStatus.SKIPPED_IDLE)
    if lease is None:
        log.info("cycle_skipped_locked", job=job.name)
        return CycleOutcome(CycleStatus.SKIPPED_LOCKED)

    run_id = str(uuid.uuid4())
    LOCK_HELD.labels(job=job.name).set(1)
    LEASE_TERM.labels(job=job.name).set(lease.term)
    if lease.previous_state != "released" and lease.previous_holder not in (None, lock.holder):
        # the previous holder did not give it back: it froze past its TTL, or it is gone
        log.warning("lease_taken_over", job=job.name, term=lease.term,
                    previous_holder=lease.previous_holder, how=lease.previous_state)
    lost: CycleStatus | None = None
    result: R | None = None
    try:
        with structlog.contextvars.bound_contextvars(job=job.name, job_run_id=run_id):
            try:
                async with trio.open_nursery() as nursery:
                    with trio.move_on_after(job.lock_ttl) as ttl_scope:

                        async def watchdog() -> None:
                            nonlocal lost
                            lost = await _watch(job, lock, lease)
                            ttl_scope.cancel()

                        nursery.start_soon(watchdog)
                        result = await job.cycle(
                            CycleContext(job.name, run_id, lease.fence))
                    nursery.cancel_scope.cancel()
            except* LeaseLost as group:
                lost = CycleStatus.LEASE_LOST
                log.error("lease_lost", term=lease.term, reason="fenced_write_rejected",
                          error=str(group.exceptions[0])[:200])
            if lost is CycleStatus.LEASE_LOST:
                LEASE_LOST.labels(job=job.name).inc()
            if ttl_scope.cancelled_caught and lost is None:
                log.error("cycle_overran", lock_ttl_s=job.lock_ttl)
    finally:
        LOCK_HELD.labels(job=job.name).set(0)
        with trio.CancelScope(shield=True):
            await _release(job, lock, lease, lost)
    if lost is not None:
        return CycleOutcome(lost, run_id)
    if ttl_scope.cancelled_caught:
        return CycleOutcome(CycleStatus.OVERRAN, run_id)
    return CycleOutcome(CycleStatus.RAN, run_id, result)


async def _idle(job: LockedJob[Any]) -> bool:
    assert job.idle is not None
    try:
        return await job.idle()
    except InfrastructureError:
        return False


async def _watch(job: LockedJob[Any], lock: LockConnection, lease: Lease) -> CycleStatus:
    """Ping the lock session and renew the lease until one fails; how it failed."""
    renew_every = max(job.ping_interval, job.lock_ttl / 4)
    renewed_at = trio.current_time()
    while True:
        await trio.sleep(job.ping_interval)
        try:
            if trio.current_time() - renewed_at >= renew_every:
                if not await lock.renew(job, lease, limit=job.ping_timeout):
                    log.error("lease_lost", term=lease.term, reason="renewal_refused")
                    return CycleStatus.LEASE_LOST
                renewed_at = trio.current_time()
            else:
                await lock.query("advisory_lock_ping", job.key, limit=job.ping_timeout,
                                 connect=False)
        except DB_ERRORS as exc:
            log.error("lock_lost", error=type(exc).__name__)
            return CycleStatus.LOST_LOCK


async def _release(job: LockedJob[Any], lock: LockConnection, lease: Lease,
                   lost: CycleStatus | None) -> None:
    if lost is CycleStatus.LOST_LOCK:
        lock.discard()
        return
    try:
        await lock.release(job, lease)
    except DB_ERRORS:
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
    JOB_PAUSED.labels(job=job.name).set(0)
    task_status.started()
    failed_cycles = 0
    try:
        while True:
            woken = job.wakeup is not None and await job.wakeup.wait(ticker.delay())
            if not woken:
                await ticker.wait()
            try:
                outcome = await run_locked_cycle(job, lock, probe=not woken)
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
