"""The outbox listener: PostgreSQL ``LISTEN safetynet_outbox`` → wake the relay.

Inputs: a DSN for its own connection. Outputs: :meth:`Wakeup.wake` calls, one per
notification (they coalesce); ``safetynet_outbox_listener_connected`` (1 while LISTEN is
in place) and ``safetynet_outbox_listener_reconnects_total``. Restart type: permanent.

Any writer's commit to ``messenger.integration_outbox`` notifies (a statement trigger,
migration 0002), so events written by the messenger service are published in
milliseconds, not at the next poll. A connection can die silently (a network partition
sends no FIN; a stopped backend whose kernel still answers TCP): a ping every
``check_every`` seconds, bounded client-side by *deadline*, and TCP keepalives find it,
and the listener reconnects with back-off. Meanwhile the relay's ``poll_interval``
fallback keeps publishing, so a dead LISTEN never stalls anything.

Started: once ``LISTEN`` is in place, so a commit after ``nursery.start`` returns always
wakes the relay (tests rely on it instead of sleeping); or, when the first connection
fails, at once, so a database that is down at boot does not hold up the rest of the tree
(the relay's poll fallback covers it until the listener reconnects).

What cancellation does: the worker thread is told to stop and the connection is closed.
"""

from __future__ import annotations

import threading

import psycopg
import structlog
import trio

from supervision.errors import describe
from supervision.metrics import LISTENER_CONNECTED, LISTENER_RECONNECTS
from supervision.pgconn import TCP, connect
from supervision.queries import QUERIES
from supervision.wakeup import Wakeup

log = structlog.get_logger("outbox_listener")

APPLICATION_NAME = "safetynet-listen"  # how operators (and tests) find it in pg_stat_activity
DEFAULTS: dict[str, str | int] = {**TCP, "connect_timeout": 5,
                                  "application_name": APPLICATION_NAME}


def _listen(conn: psycopg.Connection, wakeup: Wakeup, token: trio.lowlevel.TrioToken,
            stop: threading.Event, check_every: float) -> None:
    """Thread body: forward notifications until *stop* or a connection failure."""
    while not stop.is_set():
        for _ in conn.notifies(timeout=check_every):
            wakeup.wake_from_thread(token)
        if not stop.is_set():
            conn.execute(QUERIES["advisory_lock_ping"], {"key": 0})  # raises if it is dead


async def serve_outbox_listener(
    dsn: str, wakeup: Wakeup, *, check_every: float = 5.0, deadline: float | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen until cancelled, reconnecting with back-off; never raises on a lost server.
    *deadline* bounds each round trip client-side (the ping of a half-open connection)."""
    started = False
    failures = 0
    listened = False  # a LISTEN was in place before: the next one is a reconnect
    LISTENER_CONNECTED.set(0)
    while True:
        stop = threading.Event()
        conn: psycopg.Connection | None = None
        try:
            conn = live = await trio.to_thread.run_sync(
                lambda: connect(dsn, deadline, **DEFAULTS), abandon_on_cancel=True)
            await trio.to_thread.run_sync(live.execute, QUERIES["outbox_listen"])
            LISTENER_CONNECTED.set(1)
            if not started:
                started = True
                task_status.started()
            if listened:
                LISTENER_RECONNECTS.inc()
                log.info("outbox_listener_reconnected", failures=failures)
            listened = True
            failures = 0
            wakeup.wake()  # catch up on anything written while we were not listening
            await trio.to_thread.run_sync(
                _listen, live, wakeup, trio.lowlevel.current_trio_token(), stop, check_every,
                abandon_on_cancel=True)
        except (psycopg.Error, OSError) as exc:
            failures += 1
            log.warning("outbox_listener_lost", error=describe(exc), failures=failures)
            if not started:
                started = True
                task_status.started()
        finally:
            LISTENER_CONNECTED.set(0)
            stop.set()
            if conn is not None:
                conn.close()
        await trio.sleep(min(15.0, 0.5 * 2 ** min(failures, 5)))
