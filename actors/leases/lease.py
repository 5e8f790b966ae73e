"""A lease: taken, renewed, given back and fenced, on its own database session.

>>> lock = LockConnection(dsn)
>>> held = await lock.acquire(job)  # None while another live holder has it
>>> loss = await keep(lock, job, held)  # returns only once the lease is lost
>>> await give_back(lock, job, held, loss)

This is where a lease is taken: the lock keeper (one lease per cycle of a job) and the
scan leader (one sticky lease for the database-wide reads) both hold theirs through
this module. A lease is a row of ``safetynet.leases`` (migration 0005): a term that
grows with every new holder, valid ``lock_ttl`` on the database clock. Next to it, the
job's advisory lock is taken when free, so ``pg_locks`` still shows the leader and a
replica of the release before leases (which leads by the advisory lock alone) cannot lead
meanwhile; every session of this era also holds a shared lease-era marker lock, by which
such an older replica is told apart (docs/operations.md, rolling upgrade).

The session is dedicated (advisory locks are session-level) and used from worker threads
one call at a time; every round trip is bounded. Closing it (``discard``) ends the session
and so frees every advisory lock at once, and a lease whose holder's session is gone is
taken over at the next try. :func:`keep` pings the session and renews the lease every
``lock_ttl / 4``; it returns why the lease was lost (the renewal refused: this holder
froze past its TTL and another took it; or the session died). The fencing token is the
term: a :class:`~supervision.db.database.Fence` makes writes commit only while it is live.

What cancellation does: :func:`keep` is cancelled between round trips (a round trip in
flight is abandoned in its thread); callers give the lease back in a shielded block.
"""

from __future__ import annotations

import enum
import hashlib
import os
import socket
import uuid
from typing import Any, Protocol

import attrs
import psycopg
import structlog
import trio

from actors.leases.pause import JobPause
from supervision.db.database import Fence
from supervision.db.pgconn import connect
from supervision.db.queries import QUERIES
from supervision.tree.backoff import Backoff

log = structlog.get_logger("lease")


def lock_key(job: str) -> int:
    """A stable signed 64-bit advisory lock key for *job*."""
    digest = hashlib.sha256(f"safetynet:{job}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# Held shared by every lease-era lock session (advisory_lock_mark_lease_era): an advisory
# lock holder without it is a replica of the release before leases, which leads by the
# advisory lock alone.
LEASE_ERA_MARKER = lock_key("lease-era")

# a server or a connection failing: back off and try again. A missing schema (a
# ProgrammingError) is not one of them: it crashes the keeper, which escalates.
DB_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, OSError, trio.TooSlowError)


class LeaseTiming(Protocol):
    """What taking and keeping a lease needs to know (a ``LockedJob`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def lock_ttl(self) -> float: ...

    @property
    def ping_interval(self) -> float: ...

    @property
    def ping_timeout(self) -> float: ...

    @property
    def reconnect_base(self) -> float: ...

    @property
    def reconnect_cap(self) -> float: ...


def reconnect_backoff(timing: LeaseTiming) -> Backoff:
    """The wait after a lease session failed: full jitter up to ``reconnect_cap``."""
    return Backoff(base=timing.reconnect_base, cap=timing.reconnect_cap)


class PreviousState(enum.StrEnum):
    """How the lease was left by its previous holder (``lease_acquire``'s text)."""

    RELEASED = "released"  # given back at the end of a cycle (or never held)
    EXPIRED = "expired"  # not renewed within lock_ttl: its holder froze or died
    SESSION_GONE = "session_gone"  # still valid, but its holder's session ended


class LossReason(enum.StrEnum):
    """Why :func:`keep` stopped holding a lease."""

    RENEWAL_REFUSED = "renewal_refused"  # the term is no longer live: another holder leads
    LOCK_LOST = "lock_lost"  # the lease's session died or stopped answering


@attrs.frozen
class Loss:
    """A lost lease: why, and the driver's error class when the session failed."""

    reason: LossReason
    error: str | None = None


@attrs.frozen
class Lease:
    """A lease this process holds: the job, its term, and whom it took it from."""

    job: str
    term: int
    previous_holder: str | None = None
    previous_state: PreviousState = PreviousState.RELEASED
    advisory: bool = False  # this session also holds the job's advisory lock

    @property
    def fence(self) -> Fence:
        return Fence(self.job, self.term)


def holder_name() -> str:
    """Who holds a lease, as operators read it: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LockConnection:
    """The lease's own connection (advisory locks are session-level), used only from
    worker threads one call at a time; ``discard`` ends the session and so every
    advisory lock."""

    def __init__(self, dsn: str, deadline: float | None = None,
                 holder: str | None = None) -> None:
        self.dsn = dsn
        self.deadline = deadline  # client-side bound of a round trip (supervision.db.pgconn)
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

    async def pause(self, job: LeaseTiming) -> JobPause | None:
        """*job*'s pause, when it is paused."""
        row = await self.fetch("job_pauses_get", {"job": job.name}, limit=5.0)
        return None if row is None else JobPause(row[0], row[1], row[2])

    async def acquire(self, job: LeaseTiming) -> Lease | None:
        """Take *job*'s lease (and its advisory lock when free); None when it is held."""
        key = lock_key(job.name)
        got_lock = await self.query("advisory_lock_try", key, limit=5.0)
        if not got_lock and not await self.older_leader(job):
            # the holder may have let go between the two: an older replica ending its
            # cycle. Try again, or this lease would go without the lock, and that
            # replica's next try would take it beside us (two leaders until a renewal)
            got_lock = await self.query("advisory_lock_try", key, limit=5.0)
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
                await self.query("advisory_lock_release", key, limit=2.0, connect=False)
            return None
        return Lease(job.name, int(row[0]), row[1], PreviousState(str(row[2])),
                     bool(got_lock))

    async def older_leader(self, job: LeaseTiming, *, connect: bool = True) -> bool:
        """Whether a replica of the advisory-lock release (before leases) holds *job*'s
        advisory lock: rolling upgrade from it, that replica leads."""
        row = await self.fetch("advisory_lock_older_holders",
                               {"key": lock_key(job.name), "marker": LEASE_ERA_MARKER},
                               limit=5.0, connect=connect)
        return bool(row and row[0])

    async def renew(self, job: LeaseTiming, lease: Lease, limit: float) -> bool:
        """Extend the lease by ``lock_ttl``; False when its term is no longer live, or
        when, holding the lease without the advisory lock, a replica of the release before
        leases took that lock meanwhile (it leads: this one steps down)."""
        if not lease.advisory and await self.older_leader(job, connect=False):
            log.warning("lease_yielded_to_older_release", job=job.name)
            return False
        row = await self.fetch("lease_renew", {"job": job.name, "term": lease.term,
                                               "ttl": job.lock_ttl}, limit, connect=False)
        return row is not None

    async def ping(self, job: LeaseTiming, limit: float) -> None:
        """One round trip on the lease's session (never a fresh one)."""
        await self.query("advisory_lock_ping", lock_key(job.name), limit=limit,
                         connect=False)

    async def release(self, job: LeaseTiming, lease: Lease) -> None:
        await self.fetch("lease_release", {"job": job.name, "term": lease.term}, 2.0,
                         connect=False)
        if lease.advisory:
            await self.query("advisory_lock_release", lock_key(job.name), limit=2.0,
                             connect=False)

    def discard(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()  # ends the session: the server releases every lock it held


async def keep(lock: LockConnection, job: LeaseTiming, lease: Lease) -> Loss:
    """Ping the lease's session every ``ping_interval`` and renew the lease every
    ``lock_ttl / 4`` until either fails; how it was lost."""
    renew_every = max(job.ping_interval, job.lock_ttl / 4)
    renewed_at = trio.current_time()
    while True:
        await trio.sleep(job.ping_interval)
        try:
            if trio.current_time() - renewed_at >= renew_every:
                if not await lock.renew(job, lease, limit=job.ping_timeout):
                    return Loss(LossReason.RENEWAL_REFUSED)
                renewed_at = trio.current_time()
            else:
                await lock.ping(job, limit=job.ping_timeout)
        except DB_ERRORS as exc:
            return Loss(LossReason.LOCK_LOST, type(exc).__name__)


async def give_back(lock: LockConnection, job: LeaseTiming, lease: Lease,
                    loss: Loss | None) -> None:
    """Release the lease (a standby takes it at its next try); a dead session, or one
    that fails to release, is closed instead (which frees it)."""
    if loss is not None and loss.reason is LossReason.LOCK_LOST:
        lock.discard()
        return
    try:
        await lock.release(job, lease)
    except DB_ERRORS:
        lock.discard()
