"""Outbox retention: deletes published rows, and old dead letters, in small batches.

>>> removed = await apply_retention(job.db, job.cfg, batch=1000)

Inputs: the database, ``outbox_relay.retention`` and ``dead_letter_retention``. Outputs:
published rows older than ``retention`` deleted (in the logical source also the rows its
slot has passed, as recorded by :mod:`actors.outbox.handover`, through
``ix_outbox_created``), and dead letters older than
``dead_letter_retention`` deleted with their rows (never one that still blocks later rows
of its key: releasing a key is an operator's decision); the ``outbox_retention_deleted``
and ``outbox_dead_letters_purged`` log lines. Restart type: none — the relay's cycle runs
it every ``retention_every`` after its pipeline (``retention_enabled = false``: never, the
messenger owns its outbox's retention).

A small batch per transaction (short locks, bounded WAL), at most *max_batches* of each
per call: the cycle goes on with a backlog past retention at its next run.

What cancellation does: the batch in flight commits or rolls back whole; nothing else is
in flight.
"""

from __future__ import annotations

import psycopg
import structlog

from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.settings import OutboxRelayConfig
from supervision.db.database import Database

log = structlog.get_logger("outbox_retention")

RETENTION_BATCHES = 20  # retention batches per cycle at most


def delete_published(conn: psycopg.Connection, retention: float, limit: int) -> int:
    return conn.execute(OUTBOX_QUERIES["outbox_delete_published_before"],
                        {"retention": retention, "limit": limit}).rowcount


def delete_passed(conn: psycopg.Connection, retention: float, limit: int) -> int:
    """Logical source: delete up to *limit* rows older than *retention* seconds that the
    slot has passed (the recorded ``passed_xid``; none recorded: none)."""
    row = conn.execute(OUTBOX_QUERIES["outbox_relay_source_get"]).fetchone()
    if row is None or row[0] != "logical" or row[1] is None:
        return 0
    return conn.execute(OUTBOX_QUERIES["outbox_delete_passed_before"], {
        "retention": retention, "limit": limit,
        "passed_xid": str(int(row[1]) % 2**32)}).rowcount


def purge_dead_letters(conn: psycopg.Connection, retention: float, limit: int) -> list[int]:
    """Delete up to *limit* dead letters older than *retention* seconds with their outbox
    rows (not those that still block later rows of their key); the purged ids."""
    return [int(r[0]) for r in conn.execute(OUTBOX_QUERIES["outbox_dead_letters_purge"], {
        "retention": retention, "limit": limit}).fetchall()]


async def apply_retention(db: Database, cfg: OutboxRelayConfig, batch: int,
                          max_batches: int = RETENTION_BATCHES) -> int:
    """Delete published rows older than ``outbox_relay.retention``, and dead letters older
    than ``outbox_relay.dead_letter_retention`` with their rows, *batch* rows per
    transaction, at most *max_batches* of each; how many rows went."""
    deleted = purged = 0
    deletes = [delete_published] + ([delete_passed] if cfg.source == "logical" else [])
    for delete in deletes:
        for _ in range(max_batches):
            n = await db.atomic(delete, cfg.retention, batch)
            deleted += n
            if n < batch:
                break
    for _ in range(max_batches):
        ids = await db.atomic(purge_dead_letters, cfg.dead_letter_retention, batch)
        purged += len(ids)
        if len(ids) < batch:
            break
    if deleted:
        log.info("outbox_retention_deleted", rows=deleted, retention_s=cfg.retention)
    if purged:
        log.info("outbox_dead_letters_purged", rows=purged,
                 retention_s=cfg.dead_letter_retention)
    return deleted + purged
