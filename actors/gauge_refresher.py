"""The gauge refresher: database-derived gauges from cheap queries on a timer.

Inputs: the database and a list of refresh functions, one cheap query each, that every job
declares in its own ``gauges`` module (finalize backlog and SLO counts, outbox lag and the
NOTIFY queue, reaper backlog); the app composes the list. In the daemon it runs only on
the replica that holds the ``database-scans`` lease (:mod:`actors.leases.scan_leader`): the
same numbers from every replica would only multiply the read load. Outputs: gauge values.
Scrapes never touch the database: ``/metrics`` shows the last refreshed values.
Restart type: permanent. A failed refresh is logged and retried next tick; the gauges
keep their last values (``/readyz`` reports the database itself).

What cancellation does: a refresh in flight is abandoned (it only reads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import psycopg
import structlog
import trio

from supervision.db.database import Database
from supervision.errors import InfrastructureError
from supervision.tree.ticker import Ticker

log = structlog.get_logger("gauge_refresher")

Refresh = Callable[[psycopg.Connection], None]


async def serve_gauge_refresher(
    db: Database, refreshes: Sequence[Refresh], interval: float = 5.0, *,
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
