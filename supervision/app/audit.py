"""``safetynet audit``: every invariant that can be judged from live data, read-only.

>>> report = run_audit(cfg, window_s=86400, kafka=True)
>>> report.exit_code            # 0 clean, 2 a violation, 1 could not judge (some part)
2
>>> [str(v) for v in report.violations]
['unpublished: 812 pin.messenger.call-recording-available.v1/3f0c… unpublished for 913s']

Three parts, each bounded, each judged or reported as not judged:

* the SQL invariants of :mod:`actors.audit.invariants` on a read-only session
  (``default_transaction_read_only``) with the daemon's statement/lock timeouts
  (:func:`supervision.db.pgconn.conninfo`) and its client-side deadline;
* ``failed_with_object``: at most ``audit.s3_sample`` recent Failed recordings HEADed
  through the S3 worker, at most ``audit.s3_rate`` per second;
* with ``kafka=True``, the topics read from the offsets of the window's start to their
  current end (at most ``audit.kafka_max_messages``, ``audit.kafka_max_bytes``,
  ``audit.kafka_timeout``) and judged
  against the outbox by :func:`actors.audit.ledger.check_ledger`.

The window never reaches back beyond ``outbox_relay.retention`` (less a margin for the
Kafka read): a published row pruned by retention is neither missing nor "unknown".

The thresholds the invariants compare with (:func:`audit_thresholds`) read every job's
section, so they are made here, in the composition root, for this verb, the auditor actor
of the tree and the console alike: the audit job imports no other job's settings.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import attrs
import psycopg
import trio
from psycopg.rows import dict_row

from actors.audit.invariants import (
    CHEAP,
    KAFKA,
    Invariant,
    Thresholds,
    Violation,
    failed_sample,
    judge_database,
    summary,
)
from actors.audit.ledger import TOPICS, Ledger, OutboxRow, check_ledger, read_window
from actors.audit.queries import AUDIT_QUERIES
from actors.s3.objectstore import Found, Missing, Poison
from actors.s3.process import open_object_store
from supervision.app.settings import Config
from supervision.db.pgconn import client_deadline, connect, conninfo
from supervision.errors import SafetynetError

EXIT_CLEAN, EXIT_UNJUDGED, EXIT_VIOLATED = 0, 1, 2
KAFKA_MARGIN_S = 600.0  # the read starts this much inside the retention horizon
CLOCK_MARGIN_S = 300.0  # producer vs database clock: a row published this near the
                        # window's start is not required on the topic


@attrs.frozen
class Report:
    violations: list[Violation]
    judged: list[Invariant]
    unjudged: list[str]  # one line per part that could not be judged, with why

    @property
    def exit_code(self) -> int:
        if self.violations:
            return EXIT_VIOLATED
        return EXIT_UNJUDGED if self.unjudged else EXIT_CLEAN

    def as_json(self) -> dict[str, Any]:
        return {"exit": self.exit_code,
                "violations": [v.as_json() for v in self.violations],
                "counts": {str(k): n for k, n in summary(self.violations, self.judged).items()},
                "unjudged": self.unjudged}


def audit_thresholds(cfg: Config, window_s: float | None = None) -> Thresholds:
    """The auditor's thresholds from the configuration: ``[audit]`` and what the
    invariants compare with in the other jobs' sections (the finalize SLA and attempts,
    the reaper's windows, the cycles' polling, the outbox retention). Made here, where
    every job's section is known: the audit job imports no other job."""
    rf, cr, audit = cfg.jobs.recording_finalize, cfg.jobs.conference_reaper, cfg.audit
    return Thresholds(
        sla_s=rf.finalize_sla_timeout, max_attempts=rf.max_attempts,
        empty_room_grace_s=cr.empty_room_grace, provision_timeout_s=cr.provision_timeout,
        stale_live_timeout_s=cr.stale_live_timeout,
        slack_s=max(rf.polling_interval, cr.polling_interval),
        cycle_s=rf.lock_ttl + rf.polling_interval,
        window_s=audit.window if window_s is None else window_s,
        retention_s=cfg.outbox_relay.retention, grace_s=audit.grace,
        relay_lag_s=audit.relay_lag, limit=audit.max_violations)


def run_audit(cfg: Config, window_s: float, kafka: bool) -> Report:
    """Judge every invariant over the last *window_s* seconds (bounded by retention)."""
    th = audit_thresholds(cfg, window_s)
    violations: list[Violation] = []
    judged: list[Invariant] = []
    unjudged: list[str] = []
    try:
        with connect(conninfo(cfg.postgres, "safetynet-audit"),
                     client_deadline(cfg.postgres)) as conn:
            conn.execute(AUDIT_QUERIES["audit_read_only"])
            violations += judge_database(conn, th)
            judged += CHEAP
            failed = failed_sample(conn, th, cfg.audit.s3_sample)
            now_row = conn.execute(AUDIT_QUERIES["audit_db_now"]).fetchone()
    except psycopg.Error as exc:
        return Report(violations, judged, [f"postgres: {type(exc).__name__}"])
    assert now_row is not None
    db_now: dt.datetime = now_row[0]
    with_object, s3_problem = trio.run(_head_sample, cfg, failed)
    violations += [Violation(Invariant.FAILED_WITH_OBJECT, rid, "object exists in S3")
                   for rid in with_object]
    if s3_problem:
        unjudged.append(f"failed_with_object: {s3_problem}")
    else:
        judged.append(Invariant.FAILED_WITH_OBJECT)
    if kafka:
        kafka_violations, kafka_problem = _judge_kafka(cfg, th, db_now)
        violations += kafka_violations
        if kafka_problem:
            unjudged.append(f"kafka: {kafka_problem}")
        else:
            judged += KAFKA
    return Report(violations, judged, unjudged)


async def _head_sample(cfg: Config, recording_ids: list[str]) -> tuple[list[str], str]:
    """The ids whose object exists, and why the sample could not be judged ('' if it was);
    at most ``audit.s3_rate`` HEADs per second."""
    if not recording_ids:
        return [], ""
    found: list[str] = []
    pause = 1.0 / cfg.audit.s3_rate
    try:
        async with open_object_store(cfg.s3) as store:
            for rid in recording_ids:
                outcome = await store.head_recording(rid)
                if isinstance(outcome, Found | Poison):
                    found.append(rid)
                elif not isinstance(outcome, Missing):
                    return found, f"HEAD {rid}: {outcome.error}"
                await trio.sleep(pause)
    except (SafetynetError, OSError) as exc:
        return found, f"s3: {type(exc).__name__}"
    return found, ""


def _judge_kafka(cfg: Config, th: Thresholds, db_now: dt.datetime
                 ) -> tuple[list[Violation], str]:
    from aiokafka.errors import KafkaError

    window = min(th.window_s, th.retention_s - KAFKA_MARGIN_S)
    if window <= 0:
        return [], "outbox_relay.retention is too short for a Kafka window"
    since_ms = int((db_now.timestamp() - window) * 1000)
    try:
        read = asyncio.run(read_window(cfg.kafka, TOPICS, since_ms,
                                       max_messages=cfg.audit.kafka_max_messages,
                                       timeout_s=cfg.audit.kafka_timeout,
                                       max_bytes=cfg.audit.kafka_max_bytes))
    except (KafkaError, OSError, TimeoutError) as exc:
        return [], f"{type(exc).__name__}: {exc}"
    if not read.complete:
        return [], read.why
    try:
        rows = outbox_rows(cfg, read.ledger, window, db_now)
    except psycopg.Error as exc:
        return [], f"postgres: {type(exc).__name__}"
    return check_ledger(rows, read.ledger), ""


def outbox_rows(cfg: Config, ledger: Ledger, window: float, read_at: dt.datetime
                ) -> list[OutboxRow]:
    """The outbox rows the topic read is compared with: those of the events read, and every
    row written in the window (plus a margin); ``judged`` marks the rows published inside the
    window the read covers."""
    params = {**Thresholds().params(), "subjects": sorted(ledger.subjects()),
              "window": window + CLOCK_MARGIN_S,
              "judged": max(0.0, window - CLOCK_MARGIN_S), "read_at": read_at}
    with connect(conninfo(cfg.postgres, "safetynet-audit"), client_deadline(cfg.postgres)
                 ) as conn, conn.cursor(row_factory=dict_row) as cur:
        cur.execute(AUDIT_QUERIES["audit_read_only"])
        return [OutboxRow(r["id"], r["topic"], r["message_key"], r["dedupe_key"], r["payload"],
                          r["published"], bool(r["judged"]))
                for r in cur.execute(AUDIT_QUERIES["audit_outbox_by_subjects"], params)]
