"""The outbox listener: started means LISTEN is in place; a dead database does not hold
up the tree; a killed or half-open LISTEN connection is replaced, and the metrics show it."""

from __future__ import annotations

import itertools
import os
import signal
import time
from functools import partial

import psycopg
import trio
from prometheus_client import REGISTRY

from actors.outbox.listener import APPLICATION_NAME, serve_outbox_listener
from supervision.dev.ports import free_ports
from supervision.tree.wakeup import Wakeup
from tests.waiting import wait_until


def insert_outbox_row(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO messenger.integration_outbox (topic, message_key, dedupe_key,"
                     " event_type, payload, headers) VALUES ('t', 'k', gen_random_uuid()::text,"
                     " 'Test', '{}', '{}')")


async def test_a_commit_right_after_start_wakes_the_relay(db_dsn: str) -> None:
    """Once nursery.start returns, LISTEN is in place: a row committed at once by another
    writer wakes the relay through NOTIFY (no sleep needed to let the listener settle)."""
    wakeup = Wakeup()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_outbox_listener, db_dsn, wakeup)
        assert await wakeup.wait(0)  # the catch-up wake of a fresh LISTEN
        await trio.to_thread.run_sync(insert_outbox_row, db_dsn)
        assert await wakeup.wait(10), "the commit's NOTIFY did not reach the relay"
        nursery.cancel_scope.cancel()


async def test_a_database_down_at_boot_does_not_hold_up_the_start() -> None:
    """No database: the listener still reports started (after its first failed connect)
    and keeps retrying in the background, never raising."""
    wakeup = Wakeup()
    dsn = f"postgresql://nobody@127.0.0.1:{free_ports(1)[0]}/none"  # nothing listens there
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_outbox_listener, dsn, wakeup)
            nursery.cancel_scope.cancel()


def listener_pid(dsn: str) -> int | None:
    """The backend of this database's LISTEN connection, found as an operator would."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database()", (APPLICATION_NAME,)).fetchone()
        return None if row is None else int(row[0])


def terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def reconnects() -> float:
    value = REGISTRY.get_sample_value("safetynet_outbox_listener_reconnects_total")
    return value or 0.0


def connected() -> float | None:
    return REGISTRY.get_sample_value("safetynet_outbox_listener_connected")


async def test_a_killed_listen_connection_reconnects_and_the_metric_shows_it(
        db_dsn: str) -> None:
    """pg_terminate_backend of the LISTEN session: the listener reconnects (counted,
    connected again), catches up with a wake-up, and NOTIFY wakes the relay again."""
    wakeup = Wakeup()
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_outbox_listener, db_dsn, wakeup)
        assert await wakeup.wait(0) and connected() == 1
        before = reconnects()
        pid = await trio.to_thread.run_sync(listener_pid, db_dsn)
        assert pid is not None
        await trio.to_thread.run_sync(terminate, db_dsn, pid)
        assert await wakeup.wait(30), "no catch-up wake-up after the reconnect"
        assert reconnects() == before + 1 and connected() == 1
        assert await trio.to_thread.run_sync(listener_pid, db_dsn) not in (None, pid)
        await trio.to_thread.run_sync(insert_outbox_row, db_dsn)
        assert await wakeup.wait(10), "the new LISTEN does not wake the relay"
        nursery.cancel_scope.cancel()


async def test_a_half_open_listen_connection_is_found_and_replaced(db_dsn: str) -> None:
    """SIGSTOP of the LISTEN backend (its kernel still answers TCP, so no keepalive
    fails): the bounded ping gives up within the deadline and the listener reconnects."""
    wakeup = Wakeup()
    deadline = 1.0
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_outbox_listener, db_dsn, wakeup, check_every=0.2,
                                    deadline=deadline))
        assert await wakeup.wait(0)
        before = reconnects()
        pid = await trio.to_thread.run_sync(listener_pid, db_dsn)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            # ping every 0.2 s, given up after 1 s, back-off 1 s: 3x that bound
            replaced = await wakeup.wait(3 * (0.2 + deadline + 1.0))
            assert replaced, "the half-open LISTEN was not replaced"
            assert reconnects() == before + 1 and connected() == 1
        finally:
            os.kill(pid, signal.SIGCONT)
        await trio.to_thread.run_sync(insert_outbox_row, db_dsn)
        assert await wakeup.wait(10), "the new LISTEN does not wake the relay"
        nursery.cancel_scope.cancel()


class CountingWakeup(Wakeup):
    """A Wakeup that records when the listener woke the relay (from its thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: list[float] = []

    def wake_from_thread(self, token: trio.lowlevel.TrioToken) -> None:
        self.at.append(time.monotonic())
        super().wake_from_thread(token)


def notify_storm(dsn: str, transactions: int, per_transaction: int) -> tuple[float, float]:
    """Any login's NOTIFY safetynet_outbox, *per_transaction* distinct ones per commit
    (identical ones would be folded by PostgreSQL); the first and last commit's times."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        first = time.monotonic()
        for n in range(transactions):
            conn.execute("SELECT pg_notify('safetynet_outbox', %s || '-' || g)"
                         " FROM generate_series(1, %s) g", (str(n), per_transaction))
        return first, time.monotonic()


async def test_a_notify_storm_costs_one_wake_up_per_min_interval(db_dsn: str) -> None:
    """40,000 notifications over 40 commits: the relay is woken at most once per
    min_interval (plus the first and the last), and once after the last commit, so the
    storm costs bounded wake-ups and no notification is lost."""
    wakeup = CountingWakeup()
    interval = 0.25
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_outbox_listener, db_dsn, wakeup,
                                    min_interval=interval))
        assert await wakeup.wait(0)  # the catch-up wake of a fresh LISTEN
        first, last = await trio.to_thread.run_sync(notify_storm, db_dsn, 40, 1000)
        await trio.to_thread.run_sync(wait_until, lambda: bool(wakeup.at) and (
            wakeup.at[-1] >= last), 10, "a wake-up after the storm's last commit")
        nursery.cancel_scope.cancel()
    during = [t for t in wakeup.at if t >= first]
    assert len(during) <= (last - first) / interval + 3, (len(during), last - first)
    gaps = [b - a for a, b in itertools.pairwise(during)]
    assert all(gap >= interval * 0.9 for gap in gaps), gaps
