"""Leases with fencing on real PostgreSQL (issue #14): a frozen holder is replaced without
any session killed, and whatever it writes after it lost its term is rejected."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import structlog
import trio

from actors.leases.lease import Lease, LockConnection, lock_key
from actors.leases.lock_keeper import CycleContext, CycleStatus, LockedJob, run_locked_cycle
from supervision.db.database import DataProblem, Fence, open_database, pipelined
from supervision.db.queries import QUERIES
from supervision.errors import LeaseLost
from supervision.metrics import FENCED_WRITES, LEASE_LOST


def make_job(name: str, cycle: object = None, *, ttl: float = 30.0) -> LockedJob[Any]:
    return LockedJob(name, interval=0.2, lock_ttl=ttl, cycle=cycle,  # type: ignore[arg-type]
                     first_delay=0, ping_interval=0.05, ping_timeout=0.5)


def sql(dsn: str, query: str, *params: object) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(query, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def expire(dsn: str, job: str) -> None:
    """The holder's lease runs out (as when it is frozen past its TTL)."""
    sql(dsn, "UPDATE safetynet.leases SET expires_at = clock_timestamp() WHERE job = %s", job)


def advisory_holders(dsn: str, job: str) -> list[int]:
    return [r[0] for r in sql(dsn, QUERIES["advisory_lock_holders"].replace(
        "%(key)s", str(lock_key(job))))]


def write(conn: psycopg.Connection, tag: str) -> None:
    conn.execute("INSERT INTO t (tag) VALUES (%s)", (tag,))


def tags(dsn: str) -> list[str]:
    return [r[0] for r in sql(dsn, "SELECT tag FROM t ORDER BY tag")]


async def retry_acquire(lock: LockConnection, job: LockedJob[Any]) -> Lease:
    """Try every 50 ms, as a keeper's ticks would, for at most 5 s."""
    with trio.fail_after(5):
        for _ in range(100):
            lease = await lock.acquire(job)
            if lease is not None:
                return lease
            await trio.sleep(0.05)
    raise AssertionError("the lease was never free")


@pytest.fixture
def table(db_dsn: str) -> str:
    sql(db_dsn, "CREATE TABLE t (tag text CHECK (tag <> 'bad'))")
    return db_dsn


async def test_frozen_holder_is_replaced_once_its_lease_expires_without_killing_its_session(
        db_dsn: str) -> None:
    """A holder that stops renewing (frozen) keeps its session and its advisory lock; a
    standby takes the lease once it expires, with a new term, and runs without the lock."""
    job = make_job("t-frozen", ttl=1.0)
    frozen, standby = LockConnection(db_dsn), LockConnection(db_dsn)
    first = await frozen.acquire(job)
    assert first is not None and first.term == 1
    assert await standby.acquire(job) is None  # live holder, live session
    second = await retry_acquire(standby, job)
    assert second.term == 2 and second.previous_holder == frozen.holder
    assert second.previous_state == "expired"
    assert advisory_holders(db_dsn, "t-frozen") != []  # still the frozen one's session
    frozen.discard()
    standby.discard()


async def test_a_holder_whose_session_ended_loses_its_lease_at_once(db_dsn: str) -> None:
    """The holder's lock session ends (killed, or the process died): its lease is free long
    before its TTL, so a crash costs no take-over delay; the take-over is logged."""
    ran: list[int] = []

    async def cycle(ctx: CycleContext) -> None:
        assert ctx.fence is not None
        ran.append(ctx.fence.term)

    job = make_job("t-gone", cycle, ttl=300.0)
    gone, standby = LockConnection(db_dsn), LockConnection(db_dsn)
    assert await gone.acquire(job) is not None
    gone.discard()
    with structlog.testing.capture_logs() as logs, trio.fail_after(5):
        for _ in range(100):  # as a keeper's ticks would
            if (await run_locked_cycle(job, standby)).status is CycleStatus.RAN:
                break
            await trio.sleep(0.05)
    assert ran == [2]
    (taken,) = [e for e in logs if e["event"] == "lease_taken_over"]
    assert (taken["how"], taken["previous_holder"]) == ("session_gone", gone.holder)
    standby.discard()


async def lost_and_live_terms(table: str, name: str
                              ) -> tuple[LockConnection, LockConnection, Lease, Lease]:
    """Two lock connections: the first held *name*'s lease until it expired, the second
    took it over (a higher term). Returns both and both leases (lost, live)."""
    job = make_job(name, ttl=30.0)
    old, new = LockConnection(table), LockConnection(table)
    lease = await old.acquire(job)
    assert lease is not None
    expire(table, name)
    taken = await new.acquire(job)
    assert taken is not None
    return old, new, lease, taken


async def test_write_under_a_lost_term_is_rejected_by_the_fence_and_counted(
        table: str) -> None:
    """The old holder wakes after a take-over: its transaction rolls back (LeaseLost),
    nothing of it is written, the rejection is counted; the new term writes."""
    old, new, lease, taken = await lost_and_live_terms(table, "t-fence")
    before = FENCED_WRITES.labels(job="t-fence")._value.get()
    async with open_database(table, size=2) as db:
        with pytest.raises(LeaseLost):
            await db.fenced(lease.fence).atomic(write, "late")
        with pytest.raises(LeaseLost):
            await db.fenced(lease.fence).atomic_each(write, ["late-1", "late-2"])
        await db.fenced(taken.fence).atomic(write, "current")
    assert tags(table) == ["current"]
    assert FENCED_WRITES.labels(job="t-fence")._value.get() == before + 2
    old.discard()
    new.discard()


@pipelined
def write_pipelined(conn: psycopg.Connection, tag: str) -> list[str]:
    """A write in pipeline mode that reads its result back (fetch, not rowcount)."""
    cur = conn.execute("INSERT INTO t (tag) VALUES (%s) RETURNING tag", (tag,))
    return [r[0] for r in cur.fetchall()]


@pipelined
def write_blind(conn: psycopg.Connection, tag: str) -> None:
    """A write in pipeline mode that fetches nothing: BEGIN to COMMIT in one round trip."""
    conn.execute("INSERT INTO t (tag) VALUES (%s)", (tag,))


async def test_pipelined_writes_under_a_lost_term_are_rejected_by_the_fence(
        table: str) -> None:
    """Pipeline mode sends the fence and the statements behind it together: under a lost
    term the fence still raises first (LeaseLost), nothing is written, the rejection is
    counted; under the live term both kinds of write commit and return their results."""
    old, new, lease, taken = await lost_and_live_terms(table, "t-fence-pipelined")
    before = FENCED_WRITES.labels(job="t-fence-pipelined")._value.get()
    async with open_database(table, size=2) as db:
        with pytest.raises(LeaseLost):
            await db.fenced(lease.fence).atomic(write_pipelined, "late")
        with pytest.raises(LeaseLost):
            await db.fenced(lease.fence).atomic(write_blind, "late-blind")
        assert await db.fenced(taken.fence).atomic(write_pipelined, "current") == ["current"]
        await db.fenced(taken.fence).atomic(write_blind, "current-blind")
    assert tags(table) == ["current", "current-blind"]
    assert FENCED_WRITES.labels(job="t-fence-pipelined")._value.get() == before + 2
    old.discard()
    new.discard()


async def test_take_over_waits_for_a_fenced_transaction_in_flight(table: str) -> None:
    """A fenced transaction of the live term holds the lease row: even once the lease
    expired, nobody takes it until that transaction ended, so every write of a term
    commits before the next term starts."""
    job = make_job("t-inflight", ttl=30.0)
    holder, standby = LockConnection(table), LockConnection(table)
    lease = await holder.acquire(job)
    assert lease is not None
    with psycopg.connect(table) as conn:  # a transaction, left open
        Fence("t-inflight", lease.term).check(conn)
        write(conn, "in-flight")
        expire(table, "t-inflight")
        assert await standby.acquire(job) is None
        conn.commit()
    taken = await standby.acquire(job)
    assert taken is not None and taken.term == lease.term + 1
    assert tags(table) == ["in-flight"]
    holder.discard()
    standby.discard()


async def test_fenced_items_commit_together_and_a_bad_one_is_found_alone(table: str) -> None:
    """Fenced atomic_each: one transaction behind the fence; an item the database rejects
    sends each item through a fenced transaction of its own, and only that item fails."""
    job = make_job("t-each")
    lock = LockConnection(table)
    lease = await lock.acquire(job)
    assert lease is not None
    async with open_database(table, size=1) as db:
        results = await db.fenced(lease.fence).atomic_each(write, ["a", "bad", "c"])
    assert [isinstance(r, DataProblem) for r in results] == [False, True, False]
    assert tags(table) == ["a", "c"]
    lock.discard()


async def test_refused_renewal_cancels_the_cycle_and_logs_lease_lost(db_dsn: str) -> None:
    """Another daemon took the lease while a cycle ran: the next renewal is refused, the
    cycle is cancelled at once, and the keeper steps down with `lease_lost`."""
    started = trio.Event()
    finished: list[bool] = []

    async def cycle(ctx: CycleContext) -> None:
        started.set()
        await trio.sleep(60)
        finished.append(True)

    job = make_job("t-renew", cycle, ttl=0.4)  # renewed every 0.1 s
    holder, standby = LockConnection(db_dsn), LockConnection(db_dsn)
    lost_before = LEASE_LOST.labels(job="t-renew")._value.get()
    outcome = None
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            async def run() -> None:
                nonlocal outcome
                outcome = await run_locked_cycle(job, holder)

            nursery.start_soon(run)
            await started.wait()
            expire(db_dsn, "t-renew")
            assert await standby.acquire(job) is not None
    assert outcome is not None and outcome.status is CycleStatus.LEASE_LOST
    assert finished == []
    assert [e["reason"] for e in logs if e["event"] == "lease_lost"] == ["renewal_refused"]
    assert LEASE_LOST.labels(job="t-renew")._value.get() == lost_before + 1
    holder.discard()
    standby.discard()


async def test_fenced_write_in_a_cycle_steps_down_with_lease_lost(table: str) -> None:
    """A write the cycle makes after a take-over (before any renewal noticed it) is rejected
    by the fence: the cycle ends with `lease_lost` and nothing of it is written."""
    started, go = trio.Event(), trio.Event()

    async with open_database(table, size=2) as db:
        async def cycle(ctx: CycleContext) -> None:
            started.set()
            await go.wait()
            await db.fenced(ctx.fence).atomic(write, "stale")

        job = make_job("t-stale", cycle, ttl=30.0)
        holder, standby = LockConnection(table), LockConnection(table)
        outcome = None
        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                async def run() -> None:
                    nonlocal outcome
                    outcome = await run_locked_cycle(job, holder)

                nursery.start_soon(run)
                await started.wait()
                expire(table, "t-stale")
                assert await standby.acquire(job) is not None
                go.set()
    assert outcome is not None and outcome.status is CycleStatus.LEASE_LOST
    assert [e["reason"] for e in logs if e["event"] == "lease_lost"] == [
        "fenced_write_rejected"]
    assert tags(table) == []
    holder.discard()
    standby.discard()


async def test_a_cycle_that_ends_gives_the_lease_back(db_dsn: str) -> None:
    """After a cycle, the lease is released (another daemon's next tick takes it at once)
    and so is the advisory lock."""

    async def cycle(ctx: CycleContext) -> None:
        assert ctx.fence is not None and ctx.fence.job == "t-release"

    job = make_job("t-release", cycle, ttl=300.0)
    first, second = LockConnection(db_dsn), LockConnection(db_dsn)
    outcome = await run_locked_cycle(job, first)
    assert outcome.status is CycleStatus.RAN
    assert advisory_holders(db_dsn, "t-release") == []
    with structlog.testing.capture_logs() as logs:
        outcome = await run_locked_cycle(job, second)
    assert outcome.status is CycleStatus.RAN
    lease = await first.acquire(job)
    assert lease is not None and lease.term == 3 and lease.previous_state == "released"
    assert "lease_taken_over" not in [e["event"] for e in logs]  # given back, not taken
    first.discard()
    second.discard()
