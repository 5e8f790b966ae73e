"""The gauge refresher: database-derived gauges from cheap queries on a timer.

Inputs: the database and a list of refresh functions (one query each: finalize backlog and
oldest age, outbox unpublished/oldest/blocked keys, reaper backlog, the server's NOTIFY
queue usage). In the daemon it runs only on the replica that holds the ``database-scans``
lease (:mod:`actors.scan_leader`): the same numbers from every replica would only
multiply the read load. Outputs: gauge
values. Scrapes never touch the database: ``/metrics`` shows the last refreshed values.
Restart type: permanent. A failed refresh is logged and retried next tick; the gauges
keep their last values (``/readyz`` reports the database itself).

What cancellation does: a refresh in flight is abandoned (it only reads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import psycopg
import structlog
import trio

from actors.finalize_store import stats as finalize_stats
from actors.reaper_store import active_backlog
from supervision.config import ConferenceReaperConfig
from supervision.database import Database
from supervision.errors import InfrastructureError
from supervision.metrics import (
    CR_ACTIVE_BACKLOG,
    NOTIFY_QUEUE_USAGE,
    OUTBOX_BLOCKED_KEYS,
    OUTBOX_OLDEST_AGE,
    OUTBOX_UNPUBLISHED,
    RF_BACKLOG,
    RF_OLDEST_AGE,
    RF_QUARANTINED_ROWS,
    RF_REPUBLISH_OVERDUE,
    RF_STUCK,
)
from supervision.queries import QUERIES
from supervision.ticker import Ticker

log = structlog.get_logger("gauge_refresher")

Refresh = Callable[[psycopg.Connection], None]


def refresh_finalize(conn: psycopg.Connection) -> None:
    current = finalize_stats(conn)
    RF_BACKLOG.set(current.backlog)
    RF_OLDEST_AGE.set(current.oldest_age_seconds)


def refresh_outbox(conn: psycopg.Connection) -> None:
    row = conn.execute(QUERIES["outbox_stats"]).fetchone()
    assert row is not None
    OUTBOX_UNPUBLISHED.set(int(row[0]))
    OUTBOX_OLDEST_AGE.set(float(row[1]))
    OUTBOX_BLOCKED_KEYS.set(int(row[2]))


def refresh_recording_slo(conn: psycopg.Connection, sla: float, interval: float) -> None:
    row = conn.execute(QUERIES["slo_recordings"], {"sla": sla, "interval": interval}
                       ).fetchone()
    assert row is not None
    RF_STUCK.set(int(row[0]))
    RF_REPUBLISH_OVERDUE.set(int(row[1]))
    RF_QUARANTINED_ROWS.set(int(row[2]))


def refresh_reaper_backlog(conn: psycopg.Connection, cfg: ConferenceReaperConfig) -> None:
    CR_ACTIVE_BACKLOG.set(active_backlog(conn, cfg))


def refresh_notification_queue(conn: psycopg.Connection) -> None:
    row = conn.execute(QUERIES["notification_queue_usage"]).fetchone()
    assert row is not None
    NOTIFY_QUEUE_USAGE.set(float(row[0]))


DEFAULT_REFRESHES: tuple[Refresh, ...] = (refresh_finalize, refresh_outbox,
                                          refresh_notification_queue)


async def serve_gauge_refresher(
    db: Database, refreshes: Sequence[Refresh] = DEFAULT_REFRESHES, interval: float = 5.0, *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Refresh every gauge now, then every *interval* seconds, until cancelled."""
    ticker = Ticker(interval)
    task_status.started()
    while True:
        await ticker.wait()
        refreshed = 0
        for refresh in refreshes:
            try:
                with trio.fail_after(max(1.0, interval)):
                    await db.run(refresh)
                refreshed += 1
            except (InfrastructureError, psycopg.Error, trio.TooSlowError) as exc:
                log.warning("gauge_refresh_failed", gauge=getattr(refresh, "__name__", "?"),
                            error=type(exc).__name__)
        log.debug("gauges_refreshed", refreshed=refreshed, of=len(refreshes))
