"""``safetynet plan --job J``: what the next cycle would do, without changing anything.

For recording-finalize it runs the claim's selection and phase decision read-only and
HEADs each object that a reconcile would HEAD; for the conference reaper it lists the due
conferences by phase; for the relay, the next rows and whether they are held. Nothing is
locked or written: on a first deployment against a production database this is how an
operator sees what the daemon is about to do, and why.
"""

from __future__ import annotations

from typing import Any

import attrs
import psycopg
import trio
from psycopg.rows import dict_row

from actors.finalize_store import TOPIC_RECORDING_AVAILABLE
from actors.s3.objectstore import Fault, Found, Missing, Poison, Transient
from actors.s3.process import open_object_store
from supervision.config import Config
from supervision.queries import QUERIES


@attrs.frozen
class PlanItem:
    id: str
    phase: str
    decision: str
    why: str


def _rows(dsn: str, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn, \
            conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(QUERIES[query], params).fetchall()


async def plan(cfg: Config, job: str, limit: int) -> list[PlanItem]:
    dsn = cfg.postgres.dsn.reveal()
    if job == "recording-finalize":
        return await _plan_finalize(cfg, dsn, limit)
    if job == "conference-reaper":
        cr = cfg.jobs.conference_reaper
        rows = await trio.to_thread.run_sync(_rows, dsn, "plan_conference_sessions", {
            "empty_room_grace": cr.empty_room_grace, "provision_timeout": cr.provision_timeout,
            "stale_live_timeout": cr.stale_live_timeout, "limit": limit})
        decisions = {"empty-room": ("Ended/EmptyTimeout + conference-ended event",
                                    "Active, nobody in it past empty_room_grace"),
                     "provision-timeout": ("Failed/Error, no event",
                                           "Provisioning past provision_timeout"),
                     "stale-live": ("Ended/Timeout + conference-ended event",
                                    "no activity past stale_live_timeout")}
        items = []
        for row in rows:
            decision, why = decisions[row["phase"]]
            if row["poison_held"]:
                decision = "held back (poison)"
                why = f"{row['poison_reason']}; retried after {row['poison_retry_at']}"
            elif row["recording_active"]:
                decision += " + recorder stop signal"
            items.append(PlanItem(str(row["id"]), row["phase"], decision, why))
        return items
    rows = await trio.to_thread.run_sync(_rows, dsn, "plan_integration_outbox",
                                         {"limit": limit})
    return [PlanItem(str(r["id"]), "publish",
                     "held" if r["held"] else "send to Kafka",
                     "key blocked behind a dead letter" if r["held"] else
                     f"{r['topic']} key {r['message_key']}, attempts {r['publish_attempts']}")
            for r in rows]


async def _plan_finalize(cfg: Config, dsn: str, limit: int) -> list[PlanItem]:
    rf = cfg.jobs.recording_finalize
    rows = await trio.to_thread.run_sync(_rows, dsn, "plan_finalize_attempts", {
        "sla": rf.finalize_sla_timeout, "recheck": rf.polling_interval,
        "topic": TOPIC_RECORDING_AVAILABLE, "limit": limit})
    items = []
    async with open_object_store(cfg.s3) as store:
        probe = await store.probe()
        for row in rows:
            rid, phase = str(row["recording_id"]), row["phase"]
            if phase == "poison":
                items.append(PlanItem(rid, phase, "quarantine", row["poison_reason"]))
            elif phase == "wait":
                why = ("session not ended" if row["session_ended_at"] is None
                       else "session ended less than finalize_sla_timeout ago")
                items.append(PlanItem(rid, phase, "reschedule (not an attempt)", why))
            elif phase == "terminal":
                if row["recording_status"] == "Available" and not row["has_event"]:
                    items.append(PlanItem(rid, "republish", "enqueue event, close row",
                                          "Available without its event"))
                else:
                    items.append(PlanItem(rid, phase, "close row",
                                          f"already {row['recording_status']}"))
            elif isinstance(probe, Fault):
                items.append(PlanItem(rid, phase, "nothing (configuration fault)",
                                      probe.error))
            elif isinstance(probe, Transient):
                items.append(PlanItem(rid, phase, "nothing (object storage down)",
                                      probe.error))
            else:
                items.append(_reconcile_item(rid, row, await store.head_recording(rid),
                                             rf.max_attempts))
    return items


def _reconcile_item(rid: str, row: dict[str, Any], head: Any, max_attempts: int) -> PlanItem:
    if isinstance(head, Found):
        return PlanItem(rid, "reconcile", "Available + event",
                        f"binary found ({head.size_bytes} bytes, {head.format})")
    if isinstance(head, Missing):
        return PlanItem(rid, "reconcile", "Failed/Timeout", "no binary after the SLA")
    if isinstance(head, Poison):
        return PlanItem(rid, "reconcile", "quarantine", f"object:{head.error}")
    if isinstance(head, Fault):
        return PlanItem(rid, "reconcile", "nothing (configuration fault)", head.error)
    if row["attempts"] + 1 >= max_attempts:
        return PlanItem(rid, "reconcile", "quarantine", f"s3:{head.error} at max_attempts")
    return PlanItem(rid, "reconcile", "retry after back-off", f"s3:{head.error}")
