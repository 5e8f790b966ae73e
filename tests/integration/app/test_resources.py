"""The shared resources outlive the work that uses them: a cancellation from outside
closes them only once that work has unwound (its shielded commits included)."""

from __future__ import annotations

import psycopg
import trio

from supervision.app.resources import open_resource_set
from supervision.db.database import pipelined
from tests.conftest import make_config

# an observation window: nothing may close the pool while the shielded work runs this long
UNWINDING_S = 0.2


@pipelined
def select_one(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


async def test_an_outer_cancel_closes_the_pool_only_after_the_body_has_unwound(
        db_dsn: str) -> None:
    """A cancel scope around the resources and a cycle (a test's deadline, the daemon's
    hard stop): the cycle's shielded work still finds the pool open; the holders used to
    close it as soon as the cancellation reached them ("the pool 'safetynet' is already
    closed" in a committer's must-complete commit)."""
    cfg = make_config(db_dsn)
    answers: list[int] = []
    with trio.CancelScope() as outside:
        async with open_resource_set(cfg) as shared:
            db = shared.resources(cfg).db
            answers.append(await db.atomic(select_one))
            outside.cancel()  # once the set is open and used, whatever the machine's speed
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):  # as a must-complete commit does
                    await trio.sleep(UNWINDING_S)  # the holders have seen the cancel by now
                    answers.append(await db.atomic(select_one))
    assert outside.cancelled_caught
    assert answers == [1, 1]
