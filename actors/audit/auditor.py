"""The auditor: the cheap (SQL-only) invariants of ``safetynet audit``, every interval.

>>> nursery.start(serve_auditor, db, audit_thresholds(cfg), cfg.audit.interval)

Inputs: the database pool and the thresholds (``[audit]``, the jobs' SLA, windows and
max_attempts). Outputs: the gauge ``safetynet_invariant_violations{invariant}`` (every
cheap invariant, 0 when it holds) and one ``invariant_violated`` warning per broken
invariant with its count and first subjects. Each run is one read-only transaction of
indexed, windowed, ``LIMIT``-ed queries (:mod:`actors.audit.invariants`), bounded by the pool's
statement timeout. In the daemon it runs only on the replica that holds the
``database-scans`` lease (:mod:`actors.leases.scan_leader`), so the audit's read load does not
grow with the replica count. Restart type: permanent. A run that fails is logged and counted
(``safetynet_audit_failed_total``); the gauge keeps its last values; the next tick retries.

What cancellation does: a run in flight is abandoned (it only reads).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import structlog
import trio

from actors.audit.invariants import CHEAP, Thresholds, Violation, judge_database, summary
from actors.audit.metrics import AUDIT_FAILED, INVARIANT_VIOLATIONS
from actors.audit.queries import AUDIT_QUERIES
from supervision.db.database import Database
from supervision.errors import InfrastructureError
from supervision.tree.ticker import Ticker

log = structlog.get_logger("auditor")
SUBJECTS_LOGGED = 5


def audit_once(conn: psycopg.Connection, thresholds: Thresholds) -> list[Violation]:
    """One read-only run of the cheap invariants (in the caller's transaction)."""
    conn.execute(AUDIT_QUERIES["audit_read_only_transaction"])
    return judge_database(conn, thresholds)


def export(violations: Sequence[Violation]) -> None:
    """Set the gauge for every cheap invariant and log each broken one."""
    for invariant, count in summary(violations, CHEAP).items():
        INVARIANT_VIOLATIONS.labels(invariant=str(invariant)).set(count)
        if count:
            subjects = [v.subject for v in violations if v.invariant == invariant]
            log.warning("invariant_violated", invariant=str(invariant), count=count,
                        subjects=subjects[:SUBJECTS_LOGGED])


async def serve_auditor(
    db: Database, thresholds: Thresholds, interval: float, *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the cheap invariants now (started once that first run is over, judged or
    not), then every *interval* seconds, until cancelled."""
    ticker = Ticker(interval)
    await ticker.wait()
    await _run(db, thresholds)
    task_status.started()
    while True:
        await ticker.wait()
        await _run(db, thresholds)


async def _run(db: Database, thresholds: Thresholds) -> None:
    try:
        violations = await db.run(audit_once, thresholds)
    except (InfrastructureError, psycopg.Error) as exc:
        AUDIT_FAILED.inc()
        log.warning("audit_failed", error=type(exc).__name__)
        return
    log.debug("audit_ran", violations=len(violations))
    export(violations)
