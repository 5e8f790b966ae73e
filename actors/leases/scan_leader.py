"""The scan leader: the database-wide reads (gauges and auditor) on one replica at a time.

>>> lease = LockedJob(SCAN_LEASE, interval=5, lock_ttl=30, cycle=no_cycle)
>>> await nursery.start(serve_scan_leader, lease, dsn, partial(serve_supervisor, scans))

The gauge refresher and the auditor read the whole messenger schema (backlogs, SLO
counts, outbox lag, invariants). Run on every replica, that read load would grow with the
replica count for no new information: every replica would compute the same numbers. So
they run under a lease of their own, ``database-scans`` (a row of ``safetynet.leases``
like the jobs'; the table is keyed by the job's name, so a new name needs no migration).
Unlike a job's lease, taken per cycle, this one is *sticky*: the holder keeps it, renewed
every ``lock_ttl / 4`` by the same watchdog as a job's (:func:`actors.leases.lease.keep`),
for as long as it runs, and the
standbys try to take it every ``interval``. The holder exports the database-wide gauges
(:data:`~supervision.metrics.LEADER_GAUGES`); a standby exports none of them, so a
replica that stopped leading never shows stale values, and alerts aggregate with
``max(...)`` over whichever replica exports them (docs/operations.md).

Take-over: a leader stopping gracefully gives the lease back (a standby leads at its next
try, within ``interval``); one that died or lost its lock session frees it at once; a
frozen one loses it ``lock_ttl`` after its last renewal. Leading and stepping down are
logged (``scan_leader_elected``, ``scan_leader_stepped_down``) and shown by
``safetynet_lock_held{job="database-scans"}``.

Inputs: the lease's timing (a :class:`~actors.leases.lock_keeper.LockedJob`, whose cycle is not
used), a DSN for the lease's own session, and *work*: started (``nursery.start``
semantics) when the lease is taken, cancelled when it is lost or on shutdown. Restart
type: permanent. An unreachable database: back-off (full jitter up to ``reconnect_cap``),
standby, no crash. *work* failing is
this actor failing: the lease is given back first. A database without safetynet's schema
(the lease cannot be read) is backed off like an unreachable one: the scans only read,
and the job keepers are the ones that crash on it.

What cancellation does: *work* is cancelled (it only reads), then the lease is given back
in a shielded block (or the session closed, which frees it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import structlog
import trio

from actors.leases.lease import (
    DB_ERRORS,
    Lease,
    LockConnection,
    Loss,
    give_back,
    keep,
    reconnect_backoff,
)
from actors.leases.lock_keeper import CycleContext, LockedJob
from supervision.errors import describe
from supervision.jobs import SCAN_LEASE
from supervision.metrics import LEADER_GAUGES, LEASE_LOST, LEASE_TERM, LOCK_HELD

log = structlog.get_logger("scan_leader")

Work = Callable[..., Awaitable[Any]]  # called as work(task_status=...)


async def no_cycle(ctx: CycleContext) -> None:
    """The lease's LockedJob has no cycle: its holder runs *work* for as long as it leads."""
    raise AssertionError("the scan lease runs no cycle")


def scan_lease(interval: float = 5.0, lock_ttl: float = 30.0) -> LockedJob[None]:
    """The ``database-scans`` lease: standbys try every *interval*; a frozen leader loses
    it *lock_ttl* after its last renewal. Its session is pinged every second (a cycle's
    every 250 ms), with the keeper's timeout: held for as long as the process runs, and a
    dead session found seconds later costs nothing but a late gauge."""
    return LockedJob(SCAN_LEASE, interval, lock_ttl, no_cycle, ping_interval=1.0)


def stand_by() -> None:
    """This process exports none of the database-wide gauges until its scan leader leads:
    called when a tree is built, before its exporter starts (the scan leader alone sets
    and clears :data:`~supervision.metrics.LEADER_GAUGES`' standby)."""
    LEADER_GAUGES.standby = True


async def serve_scan_leader(
    lease: LockedJob[Any], dsn: str, work: Work, *, deadline: float | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Lead the scans whenever this process holds *lease*, stand by otherwise, until
    cancelled."""
    lock = LockConnection(dsn, deadline)
    stand_by()
    LOCK_HELD.labels(job=lease.name).set(0)
    task_status.started()
    failures = 0
    backoff = reconnect_backoff(lease)
    try:
        while True:
            try:
                held = await lock.acquire(lease)
            except (*DB_ERRORS, psycopg.Error) as exc:
                # unlike a job's keeper, a missing schema does not crash this actor: the
                # scans only read, and the jobs' keepers already report it (escalating)
                lock.discard()
                failures += 1
                log.warning("lock_connection_failed", job=lease.name, error=describe(exc),
                            failures=failures)
                await trio.sleep(backoff.delay(failures - 1))
                continue
            failures = 0
            if held is not None:
                await _lead(lease, lock, held, work)
            await trio.sleep(lease.interval)
    finally:
        LEADER_GAUGES.standby = True
        lock.discard()


async def _lead(lease: LockedJob[Any], lock: LockConnection, held: Lease, work: Work) -> None:
    """Run *work* while the watchdog keeps *held* renewed; give it back when done."""
    log.info("scan_leader_elected", job=lease.name, term=held.term,
             previous_holder=held.previous_holder, how=held.previous_state)
    LOCK_HELD.labels(job=lease.name).set(1)
    LEASE_TERM.labels(job=lease.name).set(held.term)
    LEADER_GAUGES.standby = False
    lost: Loss | None = None
    try:
        async with trio.open_nursery() as nursery:

            async def watchdog() -> None:
                nonlocal lost
                lost = await keep(lock, lease, held)
                nursery.cancel_scope.cancel()

            async def scans(task_status: trio.TaskStatus[None]) -> None:
                await work(task_status=task_status)
                nursery.cancel_scope.cancel()  # it ended on its own: no reason to lead on

            nursery.start_soon(watchdog)
            await nursery.start(scans)
    finally:
        LEADER_GAUGES.standby = True
        LOCK_HELD.labels(job=lease.name).set(0)
        with trio.CancelScope(shield=True):
            await give_back(lock, lease, held, lost)
    if lost is not None:
        LEASE_LOST.labels(job=lease.name).inc()
    log.warning("scan_leader_stepped_down", job=lease.name, term=held.term,
                reason=_reason(lost))


def _reason(lost: Loss | None) -> str:
    """The step-down's reason as logged: ``renewal_refused``, ``lock_lost:<error>`` or
    ``work_exited``."""
    if lost is None:
        return "work_exited"
    return str(lost.reason) if lost.error is None else f"{lost.reason}:{lost.error}"
