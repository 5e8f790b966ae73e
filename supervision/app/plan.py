"""``safetynet plan --job J``: what the next cycle would do, without changing anything.

For recording-finalize it runs the claim's selection and phase decision read-only and
HEADs each object that a reconcile would HEAD; for the conference reaper it lists the due
conferences by phase (``safetynet.conference_phase``, the windows' one definition); for the
relay, the next rows and whether a dead letter holds them. Nothing is locked or written:
on a first deployment against a production database this is how an operator sees what
the daemon is about to do, and why (the ages and thresholds compared:
:mod:`supervision.app.plan_items`).
"""

from __future__ import annotations

from typing import Any

import trio
from psycopg.rows import dict_row

from actors.finalize_store import TOPIC_RECORDING_AVAILABLE
from actors.s3.objectstore import Fault, Transient
from actors.s3.process import open_object_store
from supervision.app.plan_items import (
    PlanItem,
    conference_item,
    finalize_item,
    outbox_item,
    reconcile_item,
    storage_down_item,
)
from supervision.config import Config
from supervision.pgconn import connect, conninfo
from supervision.queries import QUERIES

__all__ = ["PlanItem", "plan"]


def _rows(dsn: str, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with connect(dsn, None) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(QUERIES[query], params).fetchall()


async def plan(cfg: Config, job: str, limit: int) -> list[PlanItem]:
    # the daemon's session settings: its statement timeout, search_path pinned
    dsn = conninfo(cfg.postgres, "safetynet-plan")
    if job == "recording-finalize":
        return await _plan_finalize(cfg, dsn, limit)
    if job == "conference-reaper":
        cr = cfg.jobs.conference_reaper
        rows = await trio.to_thread.run_sync(_rows, dsn, "plan_conference_sessions", {
            "empty_room_grace": cr.empty_room_grace, "provision_timeout": cr.provision_timeout,
            "stale_live_timeout": cr.stale_live_timeout, "limit": limit})
        return [conference_item(row, cr) for row in rows]
    rows = await trio.to_thread.run_sync(_rows, dsn, "plan_integration_outbox",
                                         {"limit": limit})
    return [outbox_item(row) for row in rows]


async def _plan_finalize(cfg: Config, dsn: str, limit: int) -> list[PlanItem]:
    rf = cfg.jobs.recording_finalize
    rows = await trio.to_thread.run_sync(_rows, dsn, "plan_finalize_attempts", {
        "sla": rf.finalize_sla_timeout, "recheck": rf.polling_interval,
        "topic": TOPIC_RECORDING_AVAILABLE, "limit": limit})
    items = []
    async with open_object_store(cfg.s3) as store:
        probe = await store.probe()
        for row in rows:
            settled = finalize_item(row, rf)
            if settled is not None:
                items.append(settled)
            elif isinstance(probe, Fault | Transient):
                items.append(storage_down_item(row, probe))
            else:
                items.append(reconcile_item(
                    row, await store.head_recording(str(row["recording_id"])), rf))
    return items
