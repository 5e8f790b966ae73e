"""The recording-finalize job's database-derived gauges: backlog, oldest age, the seed's SLO
counts. Each function is one cheap query, run by the gauge refresher on the scan leader."""

from __future__ import annotations

import psycopg

from actors.finalize.metrics import (
    RF_BACKLOG,
    RF_OLDEST_AGE,
    RF_QUARANTINED_ROWS,
    RF_REPUBLISH_OVERDUE,
    RF_STUCK,
)
from actors.finalize.queries import FINALIZE_QUERIES
from actors.finalize.store import stats as finalize_stats


def refresh_finalize(conn: psycopg.Connection) -> None:
    current = finalize_stats(conn)
    RF_BACKLOG.set(current.backlog)
    RF_OLDEST_AGE.set(current.oldest_age_seconds)



def refresh_recording_slo(conn: psycopg.Connection, sla: float, interval: float) -> None:
    row = conn.execute(FINALIZE_QUERIES["slo_recordings"], {"sla": sla, "interval": interval}
                       ).fetchone()
    assert row is not None
    RF_STUCK.set(int(row[0]))
    RF_REPUBLISH_OVERDUE.set(int(row[1]))
    RF_QUARANTINED_ROWS.set(int(row[2]))
