"""The outbox listener: PostgreSQL ``LISTEN safetynet_outbox`` → wake the relay.

Inputs: a DSN for its own connection. Outputs: :meth:`Wakeup.wake` calls, at most one
per *min_interval* (``outbox_relay.notify_min_interval``): any login may ``NOTIFY
safetynet_outbox``, and a storm of them (88,912 in 10 s, issue #26) woke the relay for
each. The first notification after a quiet spell wakes the relay at once; those that
follow within *min_interval* are coalesced into one wake-up at its end, so none is lost
and a storm costs at most one wake-up per interval. ``safetynet_outbox_listener_connected``
(1 while LISTEN is in place) and ``safetynet_outbox_listener_reconnects_total``.
Restart type: permanent.

Any writer's commit to ``messenger.integration_outbox`` notifies (a statement trigger,
migration 0002), so events written by the messenger service are published in
milliseconds, not at the next poll. A connection can die silently (a network partition
sends no FIN; a stopped backend whose kernel still answers TCP): a ping every
``check_every`` seconds, bounded client-side by *deadline*, and TCP keepalives find it,
and the listener reconnects with back-off (:data:`RECONNECT`, full jitter: a wait drawn
from ``[0, min(15 s, 0.5 s x 2^failures)]``). Meanwhile the relay's ``poll_interval``
fallback keeps publishing, so a dead LISTEN never stalls anything.

Started: once ``LISTEN`` is in place, so a commit after ``nursery.start`` returns always
wakes the relay (tests rely on it instead of sleeping); or, when the first connection
fails, at once, so a database that is down at boot does not hold up the rest of the tree
(the relay's poll fallback covers it until the listener reconnects).

What cancellation does: the worker thread is told to stop and the connection is closed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial

import psycopg
import structlog
import trio

from actors.outbox.metrics import LISTENER_CONNECTED, LISTENER_RECONNECTS
from actors.outbox.queries import OUTBOX_QUERIES
from supervision.db.pgconn import TCP, connect
from supervision.db.queries import QUERIES
from supervision.errors import describe
from supervision.tree.backoff import Backoff
from supervision.tree.wakeup import Wakeup

log = structlog.get_logger("outbox_listener")

APPLICATION_NAME = "safetynet-listen"  # how operators (and tests) find it in pg_stat_activity
DEFAULTS: dict[str, str | int] = {**TCP, "connect_timeout": 5,
                                  "application_name": APPLICATION_NAME}
RECONNECT = Backoff(base=0.5, cap=15.0)
"""The wait before reconnecting after the n-th consecutive failure (full jitter)."""


def _listen(conn: psycopg.Connection, wake: Callable[[], None], stop: threading.Event,
            check_every: float, min_interval: float = 0.0) -> None:
    """Thread body: forward notifications as wake-ups, at most one per *min_interval*,
    until *stop* or a connection failure; ping every *check_every* seconds."""
    clock = time.monotonic
    quiet_until = 0.0  # no wake-up before this; a notification meanwhile is pending
    pending = False
    next_ping = clock() + check_every
    while not stop.is_set():
        now = clock()
        limit = min(next_ping, quiet_until) if pending else next_ping
        was_pending = pending
        for _ in conn.notifies(timeout=max(0.0, limit - now)):
            now = clock()
            if now >= quiet_until:
                wake()
                quiet_until, pending = now + min_interval, False
            else:
                pending = True
                if not was_pending:
                    break  # wait again, this time only until the quiet interval ends
        now = clock()
        if pending and now >= quiet_until:
            wake()
            quiet_until, pending = now + min_interval, False
        if not stop.is_set() and now >= next_ping:
            conn.execute(QUERIES["advisory_lock_ping"], {"key": 0})  # raises if it is dead
            next_ping = clock() + check_every


async def serve_outbox_listener(
    dsn: str, wakeup: Wakeup, *, check_every: float = 5.0, deadline: float | None = None,
    min_interval: float = 0.0, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen until cancelled, reconnecting with back-off; never raises on a lost server.
    *deadline* bounds each round trip client-side (the ping of a half-open connection);
    wake-ups come at most one per *min_interval*."""
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
            await trio.to_thread.run_sync(live.execute, OUTBOX_QUERIES["outbox_listen"])
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
                _listen, live, partial(wakeup.wake_from_thread,
                                       trio.lowlevel.current_trio_token()),
                stop, check_every, min_interval, abandon_on_cancel=True)
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
        await trio.sleep(RECONNECT.delay(failures))
