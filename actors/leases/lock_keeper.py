"""The lock keeper: single-runner leadership for one job, one cycle per tick.

>>> job = LockedJob(Job.RECORDING_FINALIZE, interval=60, lock_ttl=300, cycle=finalize_cycle)
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

Each tick: take the job's lease (:mod:`actors.leases.lease`, where every lease is taken;
``safetynet.leases``, migration 0005; a new term, valid
``lock_ttl`` on the database clock) and, next to it, the advisory lock when it is free (so
``pg_locks`` still shows the leader, and a replica of the advisory-lock release before
leases cannot lead meanwhile). Held by a live holder → the cycle is skipped. So is a tick
that finds the advisory lock held by a session without the lease-era marker (a shared
advisory lock every lock session of this era holds): an older replica leads by that lock
alone, during a rolling upgrade; a leader that holds only the lease steps down at its next
renewal if such a replica takes the lock (docs/operations.md, rolling upgrade). Then the
cycle runs in a nested nursery inside a scope bounded by
``lock_ttl``, with a :class:`~supervision.db.database.Fence` of its term in its context: the
cycle's writes commit only while the term is live. A watchdog pings the lock connection
every ``ping_interval`` and renews the lease every ``lock_ttl / 4``; when the connection
dies or the renewal is refused (another daemon took the lease: this one was frozen past
its TTL), the cycle's scope is cancelled at once, and a write already in flight is
rejected by the fence (``LeaseLost``). Either way the keeper logs ``lease_lost`` or
``lock_lost``, steps down and tries again at its next tick. A tick that could not reach
the database, or whose cycle met a server going away, is followed by a back-off
(:class:`~supervision.tree.backoff.Backoff`, full jitter up to ``reconnect_cap``), so replicas
that lost PostgreSQL together do not come back in lockstep.

A frozen holder cannot hold on: its lease expires ``lock_ttl`` after its last renewal and
a standby takes it at its next tick, with no session killed by hand. A holder whose lock
session ended (killed, or the process died) loses the lease at once.

What cancellation does: the cycle is cancelled like any other work (in-flight
``must_complete`` blocks finish), then the lease and the lock are released in a shielded
block; if that fails, closing the connection ends the session (the lease then expires or
is taken over because its session is gone).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import structlog
import trio

from actors.leases.lease import (
    DB_ERRORS,
    Lease,
    LockConnection,
    Loss,
    LossReason,
    PreviousState,
    give_back,
    keep,
    lock_key,
    reconnect_backoff,
)
from supervision.db.database import Fence
from supervision.errors import InfrastructureError, LeaseLost, describe, first_leaf
from supervision.jobs import LeaseName
from supervision.metrics import JOB_PAUSED, LEASE_LOST, LEASE_TERM, LOCK_HELD
from supervision.tree.backoff import Backoff
from supervision.tree.ticker import Ticker
from supervision.tree.wakeup import Wakeup

__all__ = ["CycleContext", "CycleOutcome", "CycleStatus", "LockConnection", "LockedJob",
           "TickFigures", "run_locked_cycle", "serve_lock_keeper"]

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


@attrs.frozen
class CycleContext:
    """What a cycle gets from the keeper."""

    job: LeaseName
    job_run_id: str
    fence: Fence | None = None  # the lease's term: the cycle's writes commit only under it


@attrs.frozen
class LockedJob(Generic[R]):
    """One job under a lock keeper: its timing and the coroutine that runs one cycle."""

    name: LeaseName
    interval: float
    lock_ttl: float
    cycle: Callable[[CycleContext], Awaitable[R]]
    first_delay: float = 0.5
    ping_interval: float = 0.25
    # a ping not answered in time is a dead session: the cycle is cancelled. Generous, as
    # every other query of the lock session: a late answer (a loaded server or host) is
    # no lost lock, and the fence, not this limit, keeps a lost holder's writes out
    # (0.75 s dropped a 2,000-row cycle of the suite under load)
    ping_timeout: float = 5.0
    reconnect_base: float = 0.5
    reconnect_cap: float = 15.0
    wakeup: Wakeup | None = None  # when set, a wake-up starts the next cycle early
    # when set, a tick that was not woken asks it first; True (nothing to do) skips the
    # tick without taking the lease. An unlocked read on the pool, so an idle job does no
    # lease traffic; a failing probe counts as "not idle" (the cycle then meets the fault)
    idle: Callable[[], Awaitable[bool]] | None = None
    # when set, called after each tick that ran a cycle, took the lease over, lost it, or
    # follows a (re)start of the keeper: the per-minute rollup (actors/rollup.py); it
    # must not raise
    record: Callable[[TickFigures], Awaitable[None]] | None = None

    @property
    def key(self) -> int:
        return lock_key(self.name)

    @property
    def reconnect(self) -> Backoff:
        """The wait after failed ticks: full jitter up to ``reconnect_cap``."""
        return reconnect_backoff(self)


@attrs.frozen
class CycleOutcome(Generic[R]):
    """How one tick went; ``result`` is the cycle's own result when it ran."""

    status: CycleStatus
    job_run_id: str | None = None
    result: R | None = None
    error: str | None = None  # why: NO_CONNECTION's driver line, LOST_LOCK's error class
    took_over: bool = False  # the lease was taken from another holder that did not give it


@attrs.frozen
class TickFigures:
    """What a tick adds to its job's minute: the cycle's result (when it ran), how the
    tick went, the keeper's (re)starts since the last record, and lease changes."""

    job: LeaseName
    status: CycleStatus
    result: Any = None
    restarts: int = 0
    lease_changes: int = 0


_LEASE_CHANGED = frozenset({CycleStatus.LEASE_LOST, CycleStatus.LOST_LOCK})
# the ticks worth a record: a cycle ran (or tried to), or the lease changed hands
_RECORDED = _LEASE_CHANGED | {CycleStatus.RAN, CycleStatus.OVERRAN,
                              CycleStatus.INFRASTRUCTURE_ERROR}


async def _record(job: LockedJob[Any], outcome: CycleOutcome[Any], restarts: int) -> int:
    """The tick's figures to *job*'s recorder when there is something to add; the
    restarts still to record (0 once recorded)."""
    changes = int(outcome.took_over) + int(outcome.status in _LEASE_CHANGED)
    if job.record is None or not (outcome.status in _RECORDED or changes or restarts):
        return restarts
    await job.record(TickFigures(job.name, outcome.status, outcome.result, restarts, changes))
    return 0


async def run_locked_cycle(job: LockedJob[R], lock: LockConnection, *,
                           probe: bool = True) -> CycleOutcome[R]:
    """One tick: take the lease, cycle under the TTL with the watchdog, give it back.
    With *probe* (a tick that was not woken), the job's idle probe may skip it first."""
    taken = await _take_lease(job, lock, probe)
    if isinstance(taken, CycleOutcome):
        return taken
    lease = taken
    run_id = str(uuid.uuid4())
    LOCK_HELD.labels(job=job.name).set(1)
    LEASE_TERM.labels(job=job.name).set(lease.term)
    took_over = _log_take_over(job, lock, lease)
    watch = _Watch(job, lock, lease)
    try:
        with structlog.contextvars.bound_contextvars(job=job.name, job_run_id=run_id):
            result = await watch.run_cycle(run_id)
    finally:
        LOCK_HELD.labels(job=job.name).set(0)
        with trio.CancelScope(shield=True):
            await give_back(lock, job, lease, watch.loss)
    return attrs.evolve(watch.outcome(run_id, result), took_over=took_over)


async def _take_lease(job: LockedJob[R], lock: LockConnection,
                      probe: bool) -> Lease | CycleOutcome[R]:
    """The tick's lease, or why the tick ends here: the lock connection failed, the job
    is paused, the idle probe found nothing to do, or another process holds the lease."""
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
    return lease


def _log_take_over(job: LockedJob[Any], lock: LockConnection, lease: Lease) -> bool:
    """The previous holder did not give the lease back: it froze past its TTL, or is gone
    (True, logged)."""
    taken_over = lease.previous_state is not PreviousState.RELEASED
    if taken_over and lease.previous_holder not in (None, lock.holder):
        log.warning("lease_taken_over", job=job.name, term=lease.term,
                    previous_holder=lease.previous_holder, how=lease.previous_state)
        return True
    return False


@attrs.define
class _Watch(Generic[R]):
    """One cycle under its lease: the cycle in a scope bounded by ``lock_ttl``, beside the
    watchdog that keeps the lease and cancels the scope the moment it is lost."""

    job: LockedJob[R]
    lock: LockConnection
    lease: Lease
    lost: CycleStatus | None = None
    loss: Loss | None = None
    overran: bool = False

    async def run_cycle(self, run_id: str) -> R | None:
        result: R | None = None
        try:
            async with trio.open_nursery() as nursery:
                with trio.move_on_after(self.job.lock_ttl) as ttl_scope:
                    nursery.start_soon(self.watchdog, ttl_scope)
                    result = await self.job.cycle(
                        CycleContext(self.job.name, run_id, self.lease.fence))
                nursery.cancel_scope.cancel()
        except* LeaseLost as group:
            self.lost = CycleStatus.LEASE_LOST
            log.error("lease_lost", term=self.lease.term, reason="fenced_write_rejected",
                      error=describe(first_leaf(group, LeaseLost))[:200])
        if self.lost is CycleStatus.LEASE_LOST:
            LEASE_LOST.labels(job=self.job.name).inc()
        self.overran = ttl_scope.cancelled_caught
        if self.overran and self.lost is None:
            log.error("cycle_overran", lock_ttl_s=self.job.lock_ttl)
        return result

    async def watchdog(self, ttl_scope: trio.CancelScope) -> None:
        self.loss = await keep(self.lock, self.job, self.lease)
        if self.loss.reason is LossReason.RENEWAL_REFUSED:
            log.error("lease_lost", term=self.lease.term, reason=self.loss.reason)
            self.lost = CycleStatus.LEASE_LOST
        else:
            log.error("lock_lost", error=self.loss.error)
            self.lost = CycleStatus.LOST_LOCK
        ttl_scope.cancel()

    def outcome(self, run_id: str, result: R | None) -> CycleOutcome[R]:
        if self.lost is not None:  # the driver's error class when the session failed
            return CycleOutcome(self.lost, run_id,
                                error=self.loss.error if self.loss is not None else None)
        if self.overran:
            return CycleOutcome(CycleStatus.OVERRAN, run_id)
        return CycleOutcome(CycleStatus.RAN, run_id, result)


async def _idle(job: LockedJob[Any]) -> bool:
    assert job.idle is not None
    try:
        return await job.idle()
    except InfrastructureError:
        return False


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
    restarts = 1  # this start: recorded with the first tick worth a record
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
                            error=describe(first_leaf(group, InfrastructureError))[:200])
                outcome = CycleOutcome(CycleStatus.INFRASTRUCTURE_ERROR)
            else:
                failed_cycles = 0
            restarts = await _record(job, outcome, restarts)
            no_connection = outcome.status == CycleStatus.NO_CONNECTION
            failures = lock.failures if no_connection else failed_cycles
            if failures:
                await trio.sleep(job.reconnect.delay(failures - 1))
    finally:
        lock.discard()
