"""The per-minute rollup the console's charts read (``safetynet.job_minutes``, migration
0016): one row per job per minute, safetynet's own, so the pictures survive restarts and
read the same on every replica.

>>> LockedJob(..., record=partial(record_tick, db))            # the lock keepers' ticks
>>> refreshes.append(partial(record_backlogs, keep_s=KEEP_S))  # the scan leader's

Two writers, each one upsert (named SQL, ``supervision/db/sql/queries/job_minutes.sql``),
never a row per event:

* :func:`record_tick`: a lock keeper, at the end of a tick that ran a cycle (or whose lease
  changed hands, or after the keeper started), adds the cycle's non-zero counts by name,
  the relay's published rows and commit-to-ack latency, the keeper's (re)starts and the
  lease changes to its job's row of the current minute (the database's clock).
* :func:`record_backlogs`: the scan leader's gauge refresher, after the gauges, writes
  each job's backlog and oldest age (what the gauges just read: no query of the
  messenger's tables of its own) and deletes the rows past :data:`KEEP_S`.

A failed write never fails a cycle: it is logged (``rollup_write_failed``) and counted
(``safetynet_rollup_write_failures_total``); the minute just misses those figures.
"""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
import trio
from prometheus_client import Counter

from actors.leases.lock_keeper import CycleStatus, TickFigures
from supervision.db.database import Database
from supervision.db.queries import QUERIES
from supervision.errors import InfrastructureError
from supervision.jobs import Job
from supervision.metrics import LEADER_GAUGES

log = structlog.get_logger("rollup")

KEEP_S = 8 * 24 * 3600  # eight days: the 24-hour charts, and a week to compare with
WRITE_LIMIT_S = 2.0  # a rollup write that takes longer is abandoned (the cycle goes on)
BUCKETS = 10  # the relay's latency buckets (actors.outbox.state.ACK_BUCKETS_MS, + the rest)
# the counts kept, a column each: every job's verdicts by outcome (the relay's published
# and failed rows among them)
OUTCOMES = ("reconciled", "republished", "failed", "quarantined", "withheld", "config_fault",
            "empty_timeout", "provision_failed", "stale_timeout", "errors", "published")
FAILED_TICKS = frozenset({CycleStatus.OVERRAN, CycleStatus.INFRASTRUCTURE_ERROR})
# each job's backlog and oldest-age gauges (the scan leader's), by their exported names
BACKLOG_GAUGES: dict[str, tuple[str, str | None]] = {
    Job.RECORDING_FINALIZE: ("messenger_recording_finalize_backlog",
                             "messenger_recording_finalize_oldest_age_seconds"),
    Job.CONFERENCE_REAPER: ("messenger_conf_reaper_active_backlog", None),
    Job.OUTBOX_RELAY: ("safetynet_outbox_unpublished",
                       "safetynet_outbox_oldest_unpublished_age_seconds"),
}

ROLLUP_FAILURES = Counter(
    "safetynet_rollup_write_failures",
    "Writes of the per-minute rollup (the console's charts) that failed; the cycles go on.",
    ["writer"])


def tick_params(tick: TickFigures) -> dict[str, Any]:
    """The parameters of ``job_minutes_add`` for *tick*: the counts of :data:`OUTCOMES`
    its cycle's result carries (the others, such as ``transient``, are not charted)."""
    result = tick.result
    figures = result.as_json() if result is not None and hasattr(result, "as_json") else {}
    params: dict[str, Any] = {name: int(figures.get(name, 0) or 0) for name in OUTCOMES}
    params["failed_ticks"] = int(tick.status in FAILED_TICKS)
    acks = getattr(result, "acks", None)
    params.update({
        "job": str(tick.job), "cycles": int(result is not None),
        "ack_ms_max": int(getattr(acks, "max_ms", 0) or 0),
        "ack_ms_buckets": list(getattr(acks, "buckets", None) or [0] * BUCKETS),
        "restarts": tick.restarts, "lease_changes": tick.lease_changes})
    return params


def _add(conn: psycopg.Connection, params: dict[str, Any]) -> None:
    conn.execute(QUERIES["job_minutes_add"], params)


async def record_tick(db: Database, tick: TickFigures) -> None:
    """Add *tick* to its job's minute; never raises (but a cancellation)."""
    try:
        with trio.fail_after(WRITE_LIMIT_S):
            await db.run(_add, tick_params(tick))
    except (InfrastructureError, psycopg.Error, trio.TooSlowError, ValueError) as exc:
        ROLLUP_FAILURES.labels(writer="cycle").inc()
        log.warning("rollup_write_failed", writer="cycle", job=str(tick.job),
                    error=type(exc).__name__)


def backlog_params() -> dict[str, list[Any]]:
    """Each job's backlog and oldest age as the gauges hold them (a job whose gauges were
    not read yet is left out; an age it has none of is None)."""
    registry = LEADER_GAUGES.registry
    jobs: list[str] = []
    backlogs: list[int | None] = []
    ages: list[float | None] = []
    for job, (backlog, oldest) in BACKLOG_GAUGES.items():
        value = registry.get_sample_value(backlog)
        age = registry.get_sample_value(oldest) if oldest is not None else None
        if value is None and age is None:
            continue  # not read yet (or the job is off): no row for it
        jobs.append(str(job))
        backlogs.append(None if value is None else int(value))
        ages.append(age)
    return {"jobs": jobs, "backlogs": backlogs, "ages": ages}


def record_backlogs(conn: psycopg.Connection, keep_s: float = KEEP_S) -> None:
    """A refresh of the gauge refresher (after the gauges): the backlogs into the current
    minute, the rows past *keep_s* deleted. Its failure is the refresher's (logged, tried
    again next tick), and counted here."""
    try:
        params = backlog_params()
        if params["jobs"]:
            conn.execute(QUERIES["job_minutes_backlogs"], params)
        conn.execute(QUERIES["job_minutes_prune"], {"keep_s": keep_s})
    except psycopg.Error:
        ROLLUP_FAILURES.labels(writer="scan_leader").inc()
        raise
