"""How should the Trio daemon talk to PostgreSQL?  A benchmark (not a test).

It measures one "per-row outcome transaction" (UPDATE rec, UPDATE attempt, INSERT outbox ON
CONFLICT DO NOTHING, COMMIT; parameterised SQL) over N fresh rows per variant, sequential rows
on ONE connection unless stated:

  A   plain sync psycopg, no Trio (baseline)
  B   Trio + sync psycopg, one trio.to_thread.run_sync per row transaction (CapacityLimiter 1)
  C   Trio + psycopg AsyncConnection through trio-asyncio, one aio_as_trio call per row
  C2  as C, but crossing the bridge per statement (3 statements + commit)
  D   sync psycopg, the same work as ONE statement with data-modifying CTEs (autocommit)
  E   B with 4 connections driven by 4 Trio tasks (CapacityLimiter 4)
  F   B with 20 rows per transaction, each row in its own SAVEPOINT

Then, for B, the cancellation behaviour of a thread running "SELECT pg_sleep(2)" + INSERT when
the Trio scope is cancelled after 0.1 s: soft (abandon_on_cancel=False: Trio waits, the
transaction commits) and hard (the cancellation also calls conn.cancel_safe(): the server
aborts the statement, the thread gets QueryCanceled and rolls back).

It starts its own PostgreSQL (supervision.dev.postgres.PostgresServer: loopback TCP, fsync and
synchronous_commit off, so commits are cheap and the numbers mostly show round trips and
bridge overhead) and always stops it.  Run:

    .venv/bin/python bench/pg_bridge.py [--rows N]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# trio_asyncio first: it monkeypatches asyncio.get_running_loop, which psycopg.waiting binds at
# import time; imported after psycopg, AsyncConnection fails with "no running event loop".
# (Through supervision.tree.compat, as the daemon does: trio-asyncio alone fails on Python 3.14.)
from supervision.tree.compat import import_trio_asyncio  # isort: skip

trio_asyncio = import_trio_asyncio()

import psycopg  # noqa: E402
import trio  # noqa: E402
from psycopg.types.json import Jsonb  # noqa: E402

from supervision.dev.postgres import PostgresServer  # noqa: E402

SCHEMA = """
CREATE TABLE rec (id uuid PRIMARY KEY, status varchar(16) NOT NULL, file_id text,
                  updated_at timestamptz NOT NULL);
CREATE TABLE attempt (id uuid PRIMARY KEY, recording_id uuid NOT NULL UNIQUE,
                      status varchar(16) NOT NULL DEFAULT 'Pending',
                      attempts int NOT NULL DEFAULT 0, updated_at timestamptz NOT NULL);
CREATE TABLE outbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL,
                     dedupe_key text NOT NULL, payload jsonb NOT NULL, UNIQUE (topic, dedupe_key));
"""
UPDATE_REC = ("UPDATE rec SET status = 'Available', file_id = %(file)s, updated_at = now()"
              " WHERE id = %(id)s AND status IN ('Recording', 'Uploading')")
UPDATE_ATTEMPT = ("UPDATE attempt SET status = 'Done', updated_at = now()"
                  " WHERE recording_id = %(id)s")
INSERT_OUTBOX = ("INSERT INTO outbox (topic, dedupe_key, payload)"
                 " VALUES ('recording.available', %(key)s, %(payload)s) ON CONFLICT DO NOTHING")
CTE = f"WITH r AS ({UPDATE_REC}), a AS ({UPDATE_ATTEMPT}) {INSERT_OUTBOX}"
Conn = psycopg.Connection[Any]
AConn = psycopg.AsyncConnection[Any]


def row_params(rid: uuid.UUID) -> dict[str, Any]:
    key = str(rid)
    return {"id": rid, "file": f"file-{key}", "key": key,
            "payload": Jsonb({"recording_id": key, "file_id": f"file-{key}"})}


def row_tx(conn: Conn, rid: uuid.UUID) -> None:
    """One row, one transaction: BEGIN, 3 statements, COMMIT (5 round trips)."""
    params = row_params(rid)
    with conn.transaction():
        for sql in (UPDATE_REC, UPDATE_ATTEMPT, INSERT_OUTBOX):
            conn.execute(sql, params)


def row_cte(conn: Conn, rid: uuid.UUID) -> None:
    """The same work as one autocommitted statement (1 round trip)."""
    conn.execute(CTE, row_params(rid))


def group_tx(conn: Conn, rids: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """Many rows, one transaction; a failing row only rolls back its own SAVEPOINT."""
    failed = []
    with conn.transaction():
        for rid in rids:
            try:
                row_tx(conn, rid)  # nested conn.transaction() == SAVEPOINT ... RELEASE
            except psycopg.Error:
                failed.append(rid)
    return failed


async def row_tx_async(aconn: AConn, rid: uuid.UUID) -> None:
    params = row_params(rid)
    async with aconn.transaction():
        for sql in (UPDATE_REC, UPDATE_ATTEMPT, INSERT_OUTBOX):
            await aconn.execute(sql, params)


async def in_thread(limiter: trio.CapacityLimiter, fn: Callable[..., Any], *args: Any,
                    cancel_conn: Conn | None = None) -> Any:
    """Run a blocking transaction in a worker thread; Trio always waits for it to finish
    (soft cancel).  With cancel_conn, a Trio cancellation also sends PostgreSQL a cancel
    request for the statement running on that connection (hard stop)."""
    if cancel_conn is None:
        return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=False)
    conn, finished = cancel_conn, False

    async def cancel_on_cancel() -> None:
        try:
            await trio.sleep_forever()
        finally:
            if not finished:  # cancelled from outside while the thread still runs
                with trio.CancelScope(shield=True):  # default limiter: ours is held by fn
                    await trio.to_thread.run_sync(conn.cancel_safe)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_on_cancel)
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=limiter,
                                                 abandon_on_cancel=False)
        finally:
            finished = True
            nursery.cancel_scope.cancel()


# --- variants: each returns the seconds it took for all rows --------------------------------

def var_sync(dsn: str, ids: list[uuid.UUID], work: Callable[[Conn, uuid.UUID], None]) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        for rid in ids:
            work(conn, rid)
        return time.perf_counter() - t0


def var_threads(dsn: str, ids: list[uuid.UUID], conns: int = 1, group: int = 1) -> float:
    connections = [psycopg.connect(dsn, autocommit=True) for _ in range(conns)]
    limiter = trio.CapacityLimiter(conns)

    async def worker(conn: Conn, rids: list[uuid.UUID]) -> None:
        for i in range(0, len(rids), group):
            if group == 1:
                await in_thread(limiter, row_tx, conn, rids[i])
            else:
                assert not await in_thread(limiter, group_tx, conn, rids[i:i + group])

    async def main() -> float:
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for n, conn in enumerate(connections):
                nursery.start_soon(worker, conn, ids[n::conns])
        return time.perf_counter() - t0

    try:
        return trio.run(main)
    finally:
        for conn in connections:
            conn.close()


def var_aio(dsn: str, ids: list[uuid.UUID], per_statement: bool = False) -> float:
    aio = trio_asyncio.aio_as_trio

    async def main() -> float:
        async with trio_asyncio.open_loop():
            aconn = await aio(psycopg.AsyncConnection.connect)(dsn, autocommit=not per_statement)
            try:
                t0 = time.perf_counter()
                for rid in ids:
                    if not per_statement:
                        await aio(row_tx_async)(aconn, rid)
                        continue
                    params = row_params(rid)  # implicit BEGIN on the first execute
                    for sql in (UPDATE_REC, UPDATE_ATTEMPT, INSERT_OUTBOX):
                        await aio(aconn.execute)(sql, params)
                    await aio(aconn.commit)()
                return time.perf_counter() - t0
            finally:
                await aio(aconn.close)()

    return trio.run(main)


VARIANTS: list[tuple[str, str, Callable[[str, list[uuid.UUID]], float]]] = [
    ("A", "sync psycopg, no Trio", lambda d, i: var_sync(d, i, row_tx)),
    ("B", "Trio to_thread per row tx", var_threads),
    ("C", "trio-asyncio AsyncConnection, 1 crossing/row", var_aio),
    ("C2", "trio-asyncio, 1 crossing/statement (4/row)", lambda d, i: var_aio(d, i, True)),
    ("D", "sync, one CTE statement per row", lambda d, i: var_sync(d, i, row_cte)),
    ("E", "B x 4 connections/tasks (limiter 4)", lambda d, i: var_threads(d, i, conns=4)),
    ("F", "B, 20 rows/tx, SAVEPOINT per row", lambda d, i: var_threads(d, i, group=20)),
]


def seed(conn: Conn, n: int) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    with conn.transaction():
        conn.execute("INSERT INTO rec SELECT i, 'Recording', NULL, now()"
                     " FROM unnest(%s::uuid[]) AS t(i)", (ids,))
        conn.execute("INSERT INTO attempt (id, recording_id, updated_at)"
                     " SELECT gen_random_uuid(), i, now() FROM unnest(%s::uuid[]) AS t(i)", (ids,))
    conn.execute("VACUUM ANALYZE rec, attempt")
    return ids


def check_done(conn: Conn, ids: list[uuid.UUID]) -> None:
    keys = [str(i) for i in ids]
    row = conn.execute(
        "SELECT (SELECT count(*) FROM rec WHERE id = ANY(%s) AND status = 'Available'),"
        " (SELECT count(*) FROM attempt WHERE recording_id = ANY(%s) AND status = 'Done'),"
        " (SELECT count(*) FROM outbox WHERE dedupe_key = ANY(%s))", (ids, ids, keys)).fetchone()
    assert row == (len(ids),) * 3, f"incomplete work: {row} of {len(ids)}"


def cancel_demo(dsn: str, hard: bool) -> tuple[float, str]:
    """Cancel the Trio scope 0.1 s into a 2 s transaction; return (seconds, what happened)."""
    key, outcome = f"cancel-{uuid.uuid4()}", []

    def slow_tx(conn: Conn) -> None:
        try:
            with conn.transaction():
                conn.execute("SELECT pg_sleep(2)")
                conn.execute("INSERT INTO outbox (topic, dedupe_key, payload)"
                             " VALUES ('cancel-test', %s, '{}')", (key,))
            outcome.append("thread finished")
        except psycopg.errors.QueryCanceled:
            outcome.append("QueryCanceled in thread, rolled back")

    with psycopg.connect(dsn, autocommit=True) as conn:
        async def main() -> None:
            with trio.move_on_after(0.1):
                await in_thread(trio.CapacityLimiter(1), slow_tx, conn,
                                cancel_conn=conn if hard else None)

        t0 = time.perf_counter()
        trio.run(main)
        elapsed = time.perf_counter() - t0
        found = conn.execute("SELECT count(*) FROM outbox WHERE dedupe_key = %s", (key,))
        committed = found.fetchone() == (1,)
    return elapsed, f"{outcome[0]}; row {'COMMITTED' if committed else 'absent'}"


def run(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        print(admin.execute("SELECT version()").fetchone()[0].split(" on ")[0],  # type: ignore[index]
              f"| psycopg {psycopg.__version__} (libpq {psycopg.pq.version()}) | trio"
              f" {trio.__version__} | trio-asyncio {trio_asyncio.__version__} | rows={rows}")
        admin.execute(SCHEMA)
        var_sync(dsn, seed(admin, min(rows, 500)), row_tx)  # warm-up, not reported
        results = []
        for name, label, variant in VARIANTS:
            ids = seed(admin, rows)
            seconds = variant(dsn, ids)
            check_done(admin, ids)
            results.append((name, label, seconds))
    base = rows / results[0][2]
    print(f"\n{'':3}{'variant':46}{'seconds':>8}{'rows/s':>9}{'vs A':>7}{'ms/row':>8}")
    for name, label, seconds in results:
        rate = rows / seconds
        print(f"{name:3}{label:46}{seconds:8.2f}{rate:9.0f}{rate / base:6.2f}x"
              f"{1000 * seconds / rows:8.3f}")
    print("\nB cancellation, Trio scope cancelled after 0.1 s of SELECT pg_sleep(2) + INSERT:")
    for hard, label in ((False, "soft: abandon_on_cancel=False"),
                        (True, "hard: + conn.cancel_safe()")):
        seconds, what = cancel_demo(dsn, hard)
        print(f"  {label:32} returned after {seconds:5.2f} s: {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000, help="rows per variant (default 3000)")
    args = parser.parse_args()
    base_dir = Path(tempfile.mkdtemp(prefix="pg_bridge-"))
    server = PostgresServer(base_dir)
    try:
        server.start()
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE pg_bridge")
        run(server.dsn_for("pg_bridge"), args.rows)
    finally:
        server.stop()
        shutil.rmtree(base_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
