"""Rolling upgrade from the advisory-lock release (before migration 0005) to the lease era
(issue 28): a lease-era daemon never leads while an older replica holds the job's
advisory lock.

The last test runs the real older release: commit 31dc1f7 built into a wheel and
installed with --no-deps beside today's daemon (skipped in a clone without that commit, and on
Python 3.14, where that release cannot start).
The first two play the older replica with a session doing exactly what that commit's
lock keeper does: `SELECT pg_try_advisory_lock(lock_key(job))` on a connection named
``safetynet-lock`` (its advisory_locks.sql and lock_key are byte-identical to today's,
:data:`OLD_TRY`), holding it for its cycle, then `pg_advisory_unlock`. Without the
lease-era marker check, the last test finds overlapping cycles at once.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import tomli_w
import trio

from actors.leases.lease import LockConnection, lock_key
from actors.leases.lock_keeper import CycleContext, CycleStatus, LockedJob, run_locked_cycle
from supervision.dev.ports import free_ports
from tests.integration.app.test_shutdown import events, start_daemon
from tests.messenger import insert_conference
from tests.releases import release_site
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]

# 31dc1f7:supervision/db/sql/queries/advisory_locks.sql, advisory_lock_try and _release
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


async def test_an_older_replica_letting_go_between_try_and_check_leaves_the_lock_to_us(
        db_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The older replica holds the lock at the new keeper's try and lets it go (its cycle
    ends) before the keeper asks who holds it: the keeper takes the lock with the lease,
    so the replica's next try fails. Taking the lease without the lock would let that
    try succeed: two leaders until the keeper's next renewal (a rolling upgrade's
    reaper cycles overlapped by 44 ms once, under load)."""
    job = make_job("t-rolling-race")
    key = lock_key(job.name)
    new = LockConnection(db_dsn)
    with old_replica(db_dsn) as old:
        assert old.execute(OLD_TRY, (key,)).fetchone() == (True,)
        check = LockConnection.older_leader
        let_go: list[int] = []

        async def racing(self: LockConnection, job: Any, *, connect: bool = True) -> bool:
            if not let_go:  # the replica's cycle ends right after the keeper's try
                let_go.append(1)
                old.execute(OLD_RELEASE, (key,))
            return await check(self, job, connect=connect)

        monkeypatch.setattr(LockConnection, "older_leader", racing)
        lease = await new.acquire(job)
        assert let_go and lease is not None
        assert lease.advisory, "the keeper holds the advisory lock with its lease"
        assert old.execute(OLD_TRY, (key,)).fetchone() == (False,), "one leader"
        await new.release(job, lease)
    new.discard()


OLD_COMMIT = "31dc1f7"


@pytest.fixture(scope="module")
def old_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The advisory-lock release (commit 31dc1f7), built into a wheel and installed with
    --no-deps into a directory of its own (its dependencies are this venv's)."""
    if sys.version_info >= (3, 14):
        pytest.skip(f"commit {OLD_COMMIT} imports trio-asyncio without supervision.compat, "
                    "so it cannot start on Python 3.14: no replica of it runs there")
    return release_site(OLD_COMMIT, tmp_path_factory.mktemp("old-release"))


def reaper_only(path: Path, dsn: str) -> Path:
    path.write_text(tomli_w.dumps({
        "postgres": {"dsn": dsn},
        "jobs": {"recording_finalize": {"enabled": False},
                 "conference_reaper": {"polling_interval": "100ms"}},
        "outbox_relay": {"enabled": False},
        "http": {"listen": f"127.0.0.1:{free_ports(1)[0]}"},
        "logging": {"format": "json"},
    }))
    return path


def cycles(log: Path) -> list[tuple[dt.datetime, dt.datetime]]:
    """The reaper's cycles in *log*: (cycle_started, cycle_completed) times."""
    out, start = [], None
    for e in events(log):
        if e.get("event") == "cycle_started" and e.get("job") == "conference-reaper":
            start = dt.datetime.fromisoformat(str(e["timestamp"]))
        elif (e.get("event") == "cycle_completed" and e.get("job") == "conference-reaper"
              and start is not None):
            out.append((start, dt.datetime.fromisoformat(str(e["timestamp"]))))
            start = None
    return out


def test_old_release_beside_todays_daemon_never_leads_at_the_same_time(
        old_release: Path, db_dsn: str, tmp_path: Path) -> None:
    """The 31dc1f7 release (advisory lock only) and today's daemon run the conference
    reaper side by side on one database with due rooms: both complete cycles, and no cycle
    of one overlaps a cycle of the other (no two leaders)."""
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        for _ in range(300):
            insert_conference(conn, status="Active", last_activity_ago=7200)
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(old_release)}
    with old_log.open("wb") as out:
        old = subprocess.Popen(
            [sys.executable, "-c", "from supervision.cli import main; main()", "run", "-c",
             str(reaper_only(tmp_path / "old.toml", db_dsn))],  # that release's entry point
            cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    new = start_daemon(reaper_only(tmp_path / "new.toml", db_dsn), new_log)
    try:
        wait_until(lambda: len(cycles(old_log)) >= 8 and len(cycles(new_log)) >= 8, 90,
                   "eight reaper cycles from each release")
        # more cycles from each, conferences arriving meanwhile
        with psycopg.connect(db_dsn, autocommit=True) as conn:
            for _ in range(100):
                insert_conference(conn, status="Active", last_activity_ago=7200)
        seen = len(cycles(old_log)), len(cycles(new_log))
        wait_until(lambda: len(cycles(old_log)) >= seen[0] + 8
                   and len(cycles(new_log)) >= seen[1] + 8, 90, "eight more of each")
    finally:
        for proc in (old, new):
            proc.terminate()
        for proc in (old, new):
            proc.wait(timeout=15)
    olds, news = cycles(old_log), cycles(new_log)
    overlaps = [(a, b) for a in olds for b in news if a[0] < b[1] and b[0] < a[1]]
    assert overlaps == [], overlaps[:3]
    with psycopg.connect(db_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM messenger.conference_sessions "
                            "WHERE status = 'Active'").fetchone() == (0,)
