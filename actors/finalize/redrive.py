"""Self-healing quarantine of recording-finalize (issue #18): the redrive.

>>> if await observe_s3(job.db, job.cfg, healthy=True):   # healthy for redrive_after
...     await redrive_quarantined(job.db, job.cfg, as_of, counts)

Runs inside the recording-finalize cycle, under its lease (the cycle's fenced database),
so one runner at a time. A finalize row quarantined because a *dependency* failed — its
``last_error`` is one of :data:`DEPENDENCY_REASONS` (``s3:*``: a transient HEAD class such
as ``s3:http_503_SlowDown``, ``s3:Timeout``, or ``s3:s3_worker_exited``) — is requeued
(Pending, attempts 0, due now) once object storage has been healthy for
``redrive_after``, at most ``redrive_max`` times per row (counted durably in
``safetynet.finalize_redrives``), at most ``batch_size`` rows per cycle. Poison and bad
data (``object:*``, ``malformed:*``, ``recording_missing``, ``session_*``) stay
quarantined until a person acts (``safetynet requeue``, which also forgets the count).

Healthy is what the cycles see, kept in ``safetynet.dependency_health`` so every replica
shares one history: each cycle observes object storage twice, at its probe (the bucket,
the canary key and objects known to exist) and after its pipeline (breaker never opened,
no transient HEAD). Any unhealthy observation restarts the clock; so does a gap longer
than ``lock_ttl + 2 x polling_interval`` with no observation at all (nobody watched).

Each redriven row is logged (``recording_redriven``: recording_id, reason, redrives) and
counted (``safetynet_recording_finalize_redriven_total``).
"""

from __future__ import annotations

import datetime as dt

import attrs
import psycopg
import structlog

from actors.finalize.metrics import RF_REDRIVEN
from actors.finalize.queries import FINALIZE_QUERIES
from actors.finalize.settings import RecordingFinalizeConfig
from actors.finalize.state import FinalizeCounts
from supervision.db.database import Database

log = structlog.get_logger("finalize_redrive")

S3 = "s3"  # safetynet.dependency_health.dependency of object storage
# last_error LIKE patterns of quarantines that belong to a dependency, not to the row:
# every transient HEAD class (finalize_committer writes "s3:<class>"), s3_worker_exited
# included. Poison writes "object:*", bad data "malformed:*" or the claim's poison reason.
DEPENDENCY_REASONS = ("s3:%",)
PRUNE_LIMIT = 1000


@attrs.frozen
class Redriven:
    """A quarantined row requeued by the redrive."""

    attempt_id: str
    recording_id: str
    reason: str
    redrives: int  # how many times this row has been redriven, this one included


def observe_health(conn: psycopg.Connection, dependency: str, healthy: bool,
                   healthy_for: float, max_gap: float) -> bool:
    """Record one observation; True when healthy for at least *healthy_for* seconds."""
    row = conn.execute(FINALIZE_QUERIES["dependency_health_observe"], {
        "dependency": dependency, "healthy": healthy, "healthy_for": healthy_for,
        "max_gap": max_gap}).fetchone()
    assert row is not None
    return bool(row[0])


def requeue_batch(conn: psycopg.Connection, cfg: RecordingFinalizeConfig,
                  as_of: dt.datetime) -> list[Redriven]:
    """One bounded batch of redrives (and a bounded prune of stale counts)."""
    conn.execute(FINALIZE_QUERIES["finalize_redrives_prune"], {"limit": PRUNE_LIMIT})
    rows = conn.execute(FINALIZE_QUERIES["finalize_redrives_requeue"], {
        "reasons": list(DEPENDENCY_REASONS), "redrive_max": cfg.redrive_max,
        "batch_size": cfg.batch_size, "as_of": as_of}).fetchall()
    return [Redriven(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows]


async def observe_s3(db: Database, cfg: RecordingFinalizeConfig, healthy: bool) -> bool:
    """Record what this cycle saw of object storage; True when the redrive is due."""
    max_gap = cfg.lock_ttl + 2 * cfg.polling_interval
    return await db.atomic(observe_health, S3, healthy, cfg.redrive_after, max_gap)


async def redrive_quarantined(db: Database, cfg: RecordingFinalizeConfig,
                              as_of: dt.datetime, counts: FinalizeCounts) -> int:
    """Requeue one batch of dependency-quarantined rows; how many were requeued."""
    if cfg.redrive_max == 0:
        return 0
    redriven = await db.atomic(requeue_batch, cfg, as_of)
    for row in redriven:
        log.info("recording_redriven", recording_id=row.recording_id, reason=row.reason,
                 redrives=row.redrives)
    RF_REDRIVEN.inc(len(redriven))
    counts.redriven += len(redriven)
    return len(redriven)
