"""``safetynet plan --job J``: what the next cycle would do, without changing anything.

For recording-finalize it replays the next cycle read-only — the claim's selection and
phase decision, the probe and evidence, the HEADs through the run's own reconciler,
breaker and verdict gate, claim batch by claim batch (:mod:`supervision.app.plan_finalize`);
for the conference reaper it lists the due
conferences by phase (``safetynet.conference_phase``, the windows' one definition); for the
relay, the next rows and whether a dead letter holds them. Nothing is locked or written:
on a first deployment against a production database this is how an operator sees what
the daemon is about to do, and why (the ages and thresholds compared:
:mod:`supervision.app.plan_items`).
"""

from __future__ import annotations

import trio

from supervision.app.plan_finalize import plan_finalize, query_rows
from supervision.app.plan_items import PlanItem, conference_item, outbox_item
from supervision.app.settings import Config
from supervision.db.pgconn import conninfo
from supervision.jobs import Job

__all__ = ["PlanItem", "plan"]


async def plan(cfg: Config, job: Job, limit: int) -> list[PlanItem]:
    # the daemon's session settings: its statement timeout, search_path pinned
    dsn = conninfo(cfg.postgres, "safetynet-plan")
    job = Job(job)  # a plain "recording-finalize" is the same job
    if job is Job.RECORDING_FINALIZE:
        return await plan_finalize(cfg, dsn, limit)
    if job is Job.CONFERENCE_REAPER:
        cr = cfg.jobs.conference_reaper
        rows = await trio.to_thread.run_sync(query_rows, dsn, "plan_conference_sessions", {
            "empty_room_grace": cr.empty_room_grace, "provision_timeout": cr.provision_timeout,
            "stale_live_timeout": cr.stale_live_timeout, "limit": limit})
        return [conference_item(row, cr) for row in rows]
    rows = await trio.to_thread.run_sync(query_rows, dsn, "plan_integration_outbox",
                                         {"limit": limit})
    return [outbox_item(row) for row in rows]
