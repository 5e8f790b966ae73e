"""The lock keeper on real PostgreSQL: single runner, hand-over, TTL, release."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psycopg
import pytest
import structlog
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from actors.leases.lease import LockConnection, lock_key
from actors.leases.lock_keeper import (
    CycleContext,
    CycleStatus,
    LockedJob,
    run_locked_cycle,
    serve_lock_keeper,
)
from supervision.app.pauses import pause_job, resume_job
from supervision.db.database import open_database
from supervision.db.migrate import install_demo
from supervision.db.queries import QUERIES
from supervision.dev.postgres import PostgresServer
from supervision.metrics import JOB_PAUSED, LOCK_HELD
from tests.faults import FaultProxy, open_fault_proxy
from tests.waiting import wait_until


def holders(dsn: str, job: str) -> list[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return [r[0] for r in conn.execute(QUERIES["advisory_lock_holders"],
                                           {"key": lock_key(job)}).fetchall()]


def make_job(name: str, cycle: object, *, ttl: float = 30.0) -> LockedJob:
    return LockedJob(name, interval=0.2, lock_ttl=ttl, cycle=cycle,  # type: ignore[arg-type]
                     first_delay=0, ping_interval=0.1, ping_timeout=0.5)


async def test_second_keeper_skips_while_the_first_holds_the_lock(db_dsn: str) -> None:
    """Two keepers, one job: exactly one runs a cycle; the other skips (skipped_locked)."""
    inside = trio.Event()
    release = trio.Event()
    ran: list[str] = []

    async def cycle(ctx: CycleContext) -> None:
        ran.append(ctx.job_run_id)
        inside.set()
        await release.wait()

    job = make_job("test-single", cycle)
    first, second = LockConnection(db_dsn), LockConnection(db_dsn)
    outcomes = []
    async with trio.open_nursery() as nursery:
        async def run_first() -> None:
            outcomes.append(await run_locked_cycle(job, first))

        nursery.start_soon(run_first)
        await inside.wait()
        assert LOCK_HELD.labels(job="test-single")._value.get() == 1
        skipped = await run_locked_cycle(job, second)
        assert len(await trio.to_thread.run_sync(holders, db_dsn, "test-single")) == 1
        release.set()
    assert skipped.status == "skipped_locked"
    assert [o.status for o in outcomes] == ["ran"]
    assert len(ran) == 1
    assert await trio.to_thread.run_sync(holders, db_dsn, "test-single") == []
    assert LOCK_HELD.labels(job="test-single")._value.get() == 0
    first.discard()
    second.discard()


async def test_killing_the_lock_session_cancels_the_cycle_and_hands_over(db_dsn: str) -> None:
    """pg_terminate_backend on the holder: its cycle is cancelled within a second and the
    standby takes the lock on its next tick."""
    inside = trio.Event()
    cancelled_after: list[float] = []

    async def cycle(ctx: CycleContext) -> None:
        inside.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled_after.append(trio.current_time())

    job = make_job("test-handover", cycle)
    holder, standby = LockConnection(db_dsn), LockConnection(db_dsn)
    async with trio.open_nursery() as nursery:
        results = []

        async def run_holder() -> None:
            results.append(await run_locked_cycle(job, holder))

        nursery.start_soon(run_holder)
        await inside.wait()
        (pid,) = await trio.to_thread.run_sync(holders, db_dsn, "test-handover")
        with psycopg.connect(db_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        killed_at = trio.current_time()
    assert results[0].status == "lost_lock"
    assert results[0].error is not None  # the driver's error class, for run-once's message
    assert cancelled_after[0] - killed_at < 1.0

    took_over = []

    async def standby_cycle(ctx: CycleContext) -> str:
        took_over.append(ctx.job_run_id)
        return "ok"

    outcome = await run_locked_cycle(make_job("test-handover", standby_cycle), standby)
    assert outcome.status == "ran" and took_over
    standby.discard()


async def test_cycle_overrunning_lock_ttl_is_cancelled_and_lock_released(db_dsn: str) -> None:
    """A cycle longer than lock_ttl is cancelled at the TTL; the lock is released."""
    finished = []

    async def endless(ctx: CycleContext) -> None:
        await trio.sleep(60)
        finished.append(True)

    lock = LockConnection(db_dsn)
    started = trio.current_time()
    outcome = await run_locked_cycle(make_job("test-ttl", endless, ttl=0.5), lock)
    assert outcome.status == "overran"
    assert trio.current_time() - started == pytest.approx(0.5, abs=0.4)
    assert finished == []
    assert await trio.to_thread.run_sync(holders, db_dsn, "test-ttl") == []
    lock.discard()


async def test_keeper_runs_cycles_on_its_interval_and_releases_on_cancel(db_dsn: str) -> None:
    """serve_lock_keeper runs a cycle per tick; cancelling it leaves no lock held."""
    runs: list[str] = []
    three = trio.Event()

    async def cycle(ctx: CycleContext) -> None:
        runs.append(ctx.job_run_id)
        if len(runs) == 3:
            three.set()
        await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        await nursery.start(serve_lock_keeper, make_job("test-ticks", cycle), db_dsn)
        with trio.fail_after(10):
            await three.wait()
        nursery.cancel_scope.cancel()
    assert len(set(runs)) == len(runs) >= 3, "each cycle has its own job_run_id"
    assert await trio.to_thread.run_sync(holders, db_dsn, "test-ticks") == []


async def test_keeper_reconnects_after_the_database_was_unreachable(db_dsn: str) -> None:
    """A keeper that cannot connect backs off and keeps trying; it never crashes."""
    runs: list[str] = []
    ok = trio.Event()

    async def cycle(ctx: CycleContext) -> None:
        runs.append(ctx.job_run_id)
        ok.set()

    bad = LockedJob("test-reconnect", 0.1, 5, cycle, first_delay=0, reconnect_base=0.05)
    with trio.move_on_after(1.0):
        await serve_lock_keeper(bad, "postgresql://nobody@127.0.0.1:1/x?connect_timeout=1")
    assert runs == []
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_lock_keeper, bad, db_dsn)
        with trio.fail_after(10):
            await ok.wait()
        nursery.cancel_scope.cancel()
    assert runs


OUTAGE_S = 1.5  # PostgreSQL stopped this long (a sleep that IS the injected fault)
SLOW_S = 2.5  # the lock session answers 1 s late this long (the injected fault)


@contextlib.asynccontextmanager
async def lock_behind_proxy(db_dsn: str) -> AsyncIterator[tuple[FaultProxy, LockConnection]]:
    """A lock connection to *db_dsn* through a fault proxy (faults off until set)."""
    async with open_fault_proxy("127.0.0.1", int(str(conninfo_to_dict(db_dsn)["port"]))) as proxy:
        yield proxy, LockConnection(make_conninfo(db_dsn, port=proxy.port))


def default_timing(name: str, cycle: Callable[[CycleContext], Awaitable[str]]
                   ) -> LockedJob[str]:
    """A job with the keeper's default ping interval and timeout (make_job's are tight)."""
    return LockedJob(name, interval=0.2, lock_ttl=30.0, cycle=cycle, first_delay=0)


async def test_a_lock_session_answering_late_under_load_keeps_its_lease(db_dsn: str) -> None:
    """Pings answered 1 s late (a server or a host under load) are no lost lock: with the
    default ping timeout the cycle runs to its end. (A 0.75 s limit made a 2,000-row cycle
    of the suite end with lost_lock (TooSlowError); the fence, not this limit, keeps a
    lost holder's writes out.)"""
    ran: list[str] = []
    async with lock_behind_proxy(db_dsn) as (proxy, lock):

        async def cycle(ctx: CycleContext) -> str:
            proxy.faults.latency = 1.0  # from the next answer on, the lock session's too
            await trio.sleep(SLOW_S)  # pings every 0.25 s: two or more answered late
            proxy.faults.latency = 0.0
            ran.append(ctx.job_run_id)
            return "done"

        outcome = await run_locked_cycle(default_timing("test-slow-session", cycle), lock)
    assert (outcome.status, outcome.result, ran) == (CycleStatus.RAN, "done",
                                                      [outcome.job_run_id])


async def test_a_lock_session_that_stops_answering_is_lost_within_the_ping_timeout(
        db_dsn: str) -> None:
    """The other half: a lock session that never answers again (a half-open connection)
    is a lost lock within one ping interval and the default ping timeout (5 s); the
    cycle is cancelled."""
    cancelled = trio.Event()
    async with lock_behind_proxy(db_dsn) as (proxy, lock):

        async def cycle(ctx: CycleContext) -> str:
            proxy.faults.blackhole = True
            try:
                await trio.sleep_forever()
            finally:
                cancelled.set()

        job = default_timing("test-silent-session", cycle)
        started = trio.current_time()
        outcome = await run_locked_cycle(job, lock)
        took = trio.current_time() - started
    assert (outcome.status, cancelled.is_set()) == (CycleStatus.LOST_LOCK, True)
    assert job.ping_timeout <= took < job.lock_ttl / 2, took  # the timeout, not the TTL


async def test_keeper_rides_out_a_postgres_outage_without_crashing(
        own_stack_dir: Path) -> None:
    """PostgreSQL stopped under a running keeper: cycles fail and back off (no crash, no
    restart), and resume by themselves when the server is back."""
    server = PostgresServer(own_stack_dir)
    await trio.to_thread.run_sync(server.start)
    await trio.to_thread.run_sync(install_demo, server.dsn)  # the leases table
    runs: list[str] = []
    try:
        async with open_database(server.dsn, size=1, connect_timeout=1) as db:

            async def cycle(ctx: CycleContext) -> None:
                await db.run(lambda conn: conn.execute("SELECT 1"))
                runs.append(ctx.job_run_id)

            job = LockedJob("test-outage", 0.1, 5, cycle, first_delay=0, ping_interval=0.1,
                            reconnect_base=0.05, reconnect_cap=0.5)
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_lock_keeper, job, server.dsn)
                await trio.to_thread.run_sync(wait_until, lambda: len(runs) >= 2, 10, "runs")
                await trio.to_thread.run_sync(server.stop)
                await trio.sleep(OUTAGE_S)  # the fault window: cycles fail while it is down
                before = len(runs)
                await trio.to_thread.run_sync(server.start)
                await trio.to_thread.run_sync(
                    wait_until, lambda: len(runs) >= before + 2, 20, "cycles after restart")
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(server.stop)


async def test_paused_job_takes_no_lease_runs_no_cycle_and_logs_once_per_pause(
        db_dsn: str) -> None:
    """While `safetynet pause` holds the job, ticks skip (skipped_paused) without taking
    the lease or running the cycle, log cycle_skipped_paused once (not per tick) and show
    safetynet_job_paused 1; after resume the next tick runs the cycle (job_resumed once)."""
    ran: list[str] = []

    async def cycle(ctx: CycleContext) -> None:
        ran.append(ctx.job_run_id)

    job = make_job("test-paused", cycle)
    lock = LockConnection(db_dsn)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        pause_job(conn, "test-paused", "maintenance", "tester@host")
        (session_user,) = conn.execute("SELECT session_user::text").fetchone() or ("",)
        with structlog.testing.capture_logs() as logs:
            paused = [(await run_locked_cycle(job, lock)).status for _ in range(3)]
            assert JOB_PAUSED.labels(job="test-paused")._value.get() == 1
            leases = conn.execute(QUERIES["leases_list"]).fetchall()
            assert resume_job(conn, "test-paused") is not None
            resumed = [(await run_locked_cycle(job, lock)).status for _ in range(2)]
    assert paused == [CycleStatus.SKIPPED_PAUSED] * 3
    assert [row[0] for row in leases] == []  # no lease was ever taken for it
    assert resumed == [CycleStatus.RAN] * 2 and len(ran) == 2
    skipped = [e for e in logs if e["event"] == "cycle_skipped_paused"]
    assert [(e["job"], e["reason"], e["paused_by"]) for e in skipped] == [
        ("test-paused", "maintenance", f"tester@host [db:{session_user}]")]
    assert [e["job"] for e in logs if e["event"] == "job_resumed"] == ["test-paused"]
    assert JOB_PAUSED.labels(job="test-paused")._value.get() == 0
    lock.discard()
