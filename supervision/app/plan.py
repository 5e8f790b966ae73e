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

from collections.abc import Callable
from typing import Any

import trio
from psycopg.rows import dict_row

from actors.envelope import TOPIC_RECORDING_AVAILABLE
from actors.finalize.evidence import gather_evidence
from actors.s3.objectstore import Fault, HeadOutcome, Transient
from actors.s3.process import open_object_store
from supervision.app.plan_items import (
    GateView,
    PlanItem,
    conference_item,
    deferred_item,
    finalize_item,
    judged_item,
    outbox_item,
    storage_down_item,
)
from supervision.app.queries import ALL_QUERIES
from supervision.app.settings import Config
from supervision.db.pgconn import connect, conninfo
from supervision.jobs import Job

__all__ = ["PlanItem", "plan"]
BREAKER_THRESHOLD = 5  # FinalizeJob's default: consecutive transient HEADs open it


def _rows(dsn: str, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with connect(dsn, None) as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(ALL_QUERIES[query], params).fetchall()


async def plan(cfg: Config, job: Job, limit: int) -> list[PlanItem]:
    # the daemon's session settings: its statement timeout, search_path pinned
    dsn = conninfo(cfg.postgres, "safetynet-plan")
    job = Job(job)  # a plain "recording-finalize" is the same job
    if job is Job.RECORDING_FINALIZE:
        return await _plan_finalize(cfg, dsn, limit)
    if job is Job.CONFERENCE_REAPER:
        cr = cfg.jobs.conference_reaper
        rows = await trio.to_thread.run_sync(_rows, dsn, "plan_conference_sessions", {
            "empty_room_grace": cr.empty_room_grace, "provision_timeout": cr.provision_timeout,
            "stale_live_timeout": cr.stale_live_timeout, "limit": limit})
        return [conference_item(row, cr) for row in rows]
    rows = await trio.to_thread.run_sync(_rows, dsn, "plan_integration_outbox",
                                         {"limit": limit})
    return [outbox_item(row) for row in rows]


class _ReadOnly:
    """What :func:`~actors.finalize.evidence.gather_evidence` needs of a database: its
    reads, one connection each, in a thread."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        def call() -> Any:
            with connect(self._dsn, None) as conn:
                return fn(conn, *args)
        return await trio.to_thread.run_sync(call)


async def _plan_finalize(cfg: Config, dsn: str, limit: int) -> list[PlanItem]:
    """The cycle's steps in its order: probe, evidence (positive canary, listing,
    operator acceptance), then each row's HEAD under the breaker (5 consecutive transient
    answers, or a fault, and the later rows are not sent), and the verdict gate's rules
    over the HEADs made. There is no cap on Missing verdicts to model."""
    rf = cfg.jobs.recording_finalize
    rows = await trio.to_thread.run_sync(_rows, dsn, "plan_finalize_attempts", {
        "sla": rf.finalize_sla_timeout, "recheck": rf.polling_interval,
        "topic": TOPIC_RECORDING_AVAILABLE, "limit": limit})
    items: list[PlanItem | None] = []
    heads: list[tuple[int, dict[str, Any], HeadOutcome]] = []
    async with open_object_store(cfg.s3) as store:
        probe = await store.probe()
        start = None
        if not isinstance(probe, Fault | Transient):
            found = await gather_evidence(_ReadOnly(dsn), store,  # type: ignore[arg-type]
                                          cfg.s3.bucket, cfg.s3.key_prefix)
            if isinstance(found, Fault | Transient):
                probe = found
            else:
                start = found
        streak, fault = 0, None
        for row in rows:
            settled = finalize_item(row, rf)
            if settled is not None:
                items.append(settled)
            elif isinstance(probe, Fault | Transient):
                items.append(storage_down_item(row, probe))
            elif fault is not None:
                items.append(storage_down_item(row, fault))
            elif streak >= BREAKER_THRESHOLD:
                items.append(deferred_item(row, BREAKER_THRESHOLD))
            else:
                head = await store.head_recording(str(row["recording_id"]))
                streak = streak + 1 if isinstance(head, Transient) else 0
                fault = head if isinstance(head, Fault) else None
                heads.append((len(items), row, head))
                items.append(None)  # judged once every HEAD is in
    gate = GateView.of(start, [head for _, _, head in heads])
    for index, row, head in heads:
        items[index] = judged_item(row, head, gate, rf, cfg.s3.key_prefix)
    return [item for item in items if item is not None]
