"""The outbox listener: started means LISTEN is in place; a dead database does not hold
up the tree."""

from __future__ import annotations

import psycopg
import trio

from actors.outbox_listener import serve_outbox_listener
from supervision.dev.stack import free_ports
from supervision.wakeup import Wakeup


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
