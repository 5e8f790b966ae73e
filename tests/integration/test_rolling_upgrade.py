"""Rolling upgrade from the advisory-lock release (before migration 0005) to the lease era
(issue 28): a lease-era daemon never leads while an older replica holds the job's
advisory lock.

The older replica is played by a session doing exactly what commit 31dc1f7's lock keeper
does: `SELECT pg_try_advisory_lock(lock_key(job))` on a connection named
``safetynet-lock`` (that commit's advisory_locks.sql and lock_key are byte-identical to
today's, :data:`OLD_TRY`), holding it for its cycle, then `pg_advisory_unlock`.
"""

from __future__ import annotations

from typing import Any

import psycopg
import trio

from actors.lock_keeper import (
    CycleContext,
    CycleStatus,
    LockConnection,
    LockedJob,
    lock_key,
    run_locked_cycle,
)

# 31dc1f7:supervision/sql/queries/advisory_locks.sql, advisory_lock_try and _release
OLD_TRY = "SELECT pg_try_advisory_lock(%s)"
OLD_RELEASE = "SELECT pg_advisory_unlock(%s)"


def make_job(name: str, cycle: object = None, *, ttl: float = 30.0) -> LockedJob[Any]:
    return LockedJob(name, interval=0.2, lock_ttl=ttl, cycle=cycle,  # type: ignore[arg-type]
                     first_delay=0, ping_interval=0.05, ping_timeout=0.5)


def old_replica(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True, application_name="safetynet-lock")


async def test_lease_era_keeper_skips_while_an_older_replica_holds_the_advisory_lock(
        db_dsn: str) -> None:
    """While the old replica holds the lock (its cycle), the new keeper takes no lease and
    runs nothing; once it lets go, the new keeper leads, and then the old one cannot."""
    ran: list[int] = []

    async def cycle(ctx: CycleContext) -> None:
        ran.append(1)

    job = make_job("t-rolling", cycle)
    key = lock_key(job.name)
    new = LockConnection(db_dsn)
    with old_replica(db_dsn) as old:
        assert old.execute(OLD_TRY, (key,)).fetchone() == (True,)
        for _ in range(5):
            outcome = await run_locked_cycle(job, new)
            assert outcome.status is CycleStatus.SKIPPED_LOCKED
        assert ran == []
        with psycopg.connect(db_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM safetynet.leases WHERE job = %s "
                                "AND holder <> ''", (job.name,)).fetchone() == (0,)
        old.execute(OLD_RELEASE, (key,))
        assert (await run_locked_cycle(job, new)).status is CycleStatus.RAN
        assert ran == [1]
        lease = await new.acquire(job)
        assert lease is not None and lease.advisory
        assert old.execute(OLD_TRY, (key,)).fetchone() == (False,)  # the new one leads
        await new.release(job, lease)
    new.discard()


async def test_leader_without_the_advisory_lock_yields_when_an_older_replica_takes_it(
        db_dsn: str) -> None:
    """A lease-era leader that took over from a frozen lease-era holder (which kept the
    advisory lock) leads without the lock; if that session ends and an older replica
    takes the lock, the leader's next renewal fails: it steps down, no two leaders."""
    job = make_job("t-rolling-yield", ttl=1.0)
    key = lock_key(job.name)
    frozen, standby = LockConnection(db_dsn), LockConnection(db_dsn)
    assert await frozen.acquire(job) is not None
    lease = None
    with trio.fail_after(5):
        while lease is None:  # the frozen holder's lease runs out; its lock stays
            await trio.sleep(0.1)
            lease = await standby.acquire(job)
    assert not lease.advisory
    assert await standby.renew(job, lease, 2.0)
    frozen.discard()  # its session ends: the advisory lock is free
    with old_replica(db_dsn) as old:
        assert old.execute(OLD_TRY, (key,)).fetchone() == (True,)
        assert not await standby.renew(job, lease, 2.0)
    standby.discard()
