"""The chaos invariant checker: a function over a DSN (and optionally a Kafka ledger and the
set of recordings whose object is in S3) that returns every violated invariant.

Run after the faults stopped and a quiet period. On a live database::

    python -m tests.chaos.checker --dsn postgresql://... [--kafka HOST:PORT] [--sla 30m]

prints one line per violation and exits 1 if there is any (0 and "ok" otherwise).

Invariants (the names are what a violation's ``invariant`` says):

* lost: ``lost_recording`` (non-terminal recording whose session ended more than the SLA
  ago and whose finalize row is not Quarantined), ``lost_conference`` (a conference that is
  due for a reaper phase still Provisioning/Active), ``missing_outbox`` (Available
  recording / Ended-by-reaper conference without its integration row),
  ``missing_realtime`` (terminal without its realtime row), ``unpublished``,
  ``not_in_ledger`` (a published event id the Kafka ledger never saw).
* duplicated: ``duplicate_outbox`` (> 1 row per topic + dedupe key),
  ``duplicate_realtime`` (> 1 realtime row per terminal recording/conference),
  ``unexpected_outbox`` (an event for a recording/conference not in the state it
  announces: Failed conference, non-Available recording), ``ledger_inconsistent`` (one
  event id with different topic/key/payload, or differing from its outbox row),
  ``unknown_event`` (an event id on the topic that no outbox row has).
* wrong verdict: ``failed_with_object`` (a recording whose object is in S3 is Failed).
* bounded: ``attempts_exceeded`` (attempts > max_attempts), ``quarantine_early``
  (quarantined for an s3 error with attempts != max_attempts), ``order`` (per topic + key,
  the first delivery of each event is not in outbox-id order).

``state_digest(dsn)`` fingerprints every row the jobs may touch, for the "403 / missing
bucket mutate nothing and consume no attempt" invariant: compare before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import Any

import attrs
import psycopg

from actors.finalize_store import TOPIC_RECORDING_AVAILABLE, event_id
from actors.reaper_messages import TOPIC_CONFERENCE_ENDED
from supervision.durations import parse_duration
from tests.chaos.ledger import Ledger, read_ledger

INVARIANTS = (
    "lost_recording", "lost_conference", "missing_outbox", "missing_realtime", "unpublished",
    "not_in_ledger", "duplicate_outbox", "duplicate_realtime", "unexpected_outbox",
    "ledger_inconsistent", "unknown_event", "failed_with_object", "attempts_exceeded",
    "quarantine_early", "order",
)


@attrs.frozen
class Violation:
    invariant: str
    subject: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.invariant}: {self.subject} {self.detail}".rstrip()


@attrs.frozen
class Limits:
    """The daemon's configuration the invariants depend on (seconds)."""

    sla_s: float = 1800.0
    max_attempts: int = 8
    empty_room_grace_s: float = 90.0
    provision_timeout_s: float = 120.0
    stale_live_timeout_s: float = 4 * 3600.0
    slack_s: float = 0.0  # extra age before a due row counts as lost (a poll interval)


# (invariant, query returning (subject, detail)); %(x)s are Limits fields
_SQL: list[tuple[str, str]] = [
    ("lost_recording", """
        SELECT r.id::text, r.status || ' finalize=' || coalesce(a.status, 'none')
        FROM messenger.call_recordings r
        LEFT JOIN messenger.recording_finalize_attempts a ON a.recording_id = r.id
        LEFT JOIN messenger.call_sessions cs
               ON r.session_kind = 'Direct' AND cs.id = r.session_id
        LEFT JOIN messenger.conference_sessions cf
               ON r.session_kind = 'Conference' AND cf.id = r.session_id
        WHERE r.status IN ('Pending', 'Recording', 'Uploading')
          AND coalesce(a.status, '') <> 'Quarantined'
          AND coalesce(cs.ended_at, cf.ended_at)
              < now() - (%(sla_s)s + %(slack_s)s) * interval '1 second'"""),
    ("lost_conference", """
        SELECT id::text, status FROM messenger.conference_sessions c
        WHERE (c.status = 'Provisioning' AND c.created_at
                 < now() - (%(provision_timeout_s)s + %(slack_s)s) * interval '1 second')
           OR (c.status = 'Active' AND c.active_participant_count = 0 AND c.last_activity_at
                 < now() - (%(empty_room_grace_s)s + %(slack_s)s) * interval '1 second')
           OR (c.status = 'Active' AND c.last_activity_at
                 < now() - (%(stale_live_timeout_s)s + %(slack_s)s) * interval '1 second')"""),
    ("missing_outbox", """
        SELECT r.id::text, 'Available recording without call-recording-available'
        FROM messenger.call_recordings r
        JOIN messenger.recording_finalize_attempts a ON a.recording_id = r.id
        WHERE r.status = 'Available' AND NOT EXISTS (
            SELECT 1 FROM messenger.integration_outbox o
            WHERE o.topic = %(rec_topic)s AND o.dedupe_key = r.id::text)
        UNION ALL
        SELECT c.id::text, 'Ended conference without conference-ended'
        FROM messenger.conference_sessions c
        WHERE c.status = 'Ended' AND c.end_reason IN ('EmptyTimeout', 'Timeout')
          AND NOT EXISTS (SELECT 1 FROM messenger.integration_outbox o
                          WHERE o.topic = %(conf_topic)s AND o.dedupe_key = c.id::text)"""),
    ("unexpected_outbox", """
        SELECT o.dedupe_key, 'event for a ' || coalesce(r.status, 'missing') || ' recording'
        FROM messenger.integration_outbox o
        LEFT JOIN messenger.call_recordings r ON r.id::text = o.dedupe_key
        WHERE o.topic = %(rec_topic)s AND r.status IS DISTINCT FROM 'Available'
        UNION ALL
        SELECT o.dedupe_key, 'event for a ' || coalesce(c.status, 'missing') || ' conference'
        FROM messenger.integration_outbox o
        LEFT JOIN messenger.conference_sessions c ON c.id::text = o.dedupe_key
        WHERE o.topic = %(conf_topic)s AND c.status IS DISTINCT FROM 'Ended'"""),
    ("missing_realtime", """
        SELECT r.id::text, r.status || ' recording without its realtime row'
        FROM messenger.call_recordings r
        JOIN messenger.recording_finalize_attempts a ON a.recording_id = r.id
        WHERE a.status = 'Done' AND r.status IN ('Available', 'Failed')
          AND NOT EXISTS (SELECT 1 FROM messenger.realtime_outbox t
                          WHERE t.reference_id = r.id AND t.kind = 'Recording' || r.status)
        UNION ALL
        SELECT c.id::text, c.status || ' conference without its realtime row'
        FROM messenger.conference_sessions c
        WHERE c.end_reason IN ('EmptyTimeout', 'Timeout', 'Error')
          AND NOT EXISTS (SELECT 1 FROM messenger.realtime_outbox t
                          WHERE t.reference_id = c.id AND t.session_kind = 'Conference')"""),
    ("duplicate_outbox", """
        SELECT topic || '/' || dedupe_key, count(*)::text || ' rows'
        FROM messenger.integration_outbox GROUP BY topic, dedupe_key HAVING count(*) > 1"""),
    ("duplicate_realtime", """
        SELECT reference_id::text, count(*)::text || ' realtime rows'
        FROM messenger.realtime_outbox
        WHERE kind IN ('RecordingAvailable', 'RecordingFailed', 'ConferenceEnded',
                       'ConferenceSignal')
        GROUP BY reference_id HAVING count(*) > 1"""),
    ("attempts_exceeded", """
        SELECT recording_id::text, attempts::text || ' attempts'
        FROM messenger.recording_finalize_attempts WHERE attempts > %(max_attempts)s"""),
    ("quarantine_early", """
        SELECT recording_id::text, attempts::text || ' attempts: ' || last_error
        FROM messenger.recording_finalize_attempts
        WHERE status = 'Quarantined' AND last_error LIKE 's3:%%'
          AND attempts <> %(max_attempts)s"""),
]
_UNPUBLISHED = ("unpublished", """
        SELECT id::text, topic || '/' || dedupe_key
        FROM messenger.integration_outbox WHERE published_at IS NULL""")


def check(dsn: str, *, ledger: Ledger | None = None, uploaded: Collection[str] | None = None,
          limits: Limits | None = None, relay: bool = True) -> list[Violation]:
    """Every violated invariant. *ledger*: what a consumer read from Kafka (omit when the
    broker lost data, e.g. after a Tansu restart); *uploaded*: recording ids whose object
    is in S3; *relay*: whether the outbox must be fully published."""
    limits = limits or Limits()
    params = {**attrs.asdict(limits), "rec_topic": TOPIC_RECORDING_AVAILABLE,
              "conf_topic": TOPIC_CONFERENCE_ENDED}
    out: list[Violation] = []
    queries = _SQL + ([_UNPUBLISHED] if relay else [])
    with psycopg.connect(dsn, autocommit=True) as conn:
        for invariant, query in queries:
            for subject, detail in conn.execute(query, params).fetchall():
                out.append(Violation(invariant, subject, detail))
        if uploaded:
            failed = conn.execute("SELECT id::text FROM messenger.call_recordings"
                                  " WHERE status = 'Failed'").fetchall()
            have = set(uploaded)
            out += [Violation("failed_with_object", rid, "object exists in S3")
                    for (rid,) in failed if rid in have]
        outbox = conn.execute("SELECT id, topic, message_key, dedupe_key, payload,"
                              " published_at IS NOT NULL FROM messenger.integration_outbox"
                              " ORDER BY id").fetchall()
        subjects = {str(r[0]) for r in conn.execute(
            "SELECT id FROM messenger.call_recordings UNION ALL"
            " SELECT id FROM messenger.conference_sessions")} if ledger is not None else set()
    if ledger is not None:
        out += check_ledger(outbox, ledger.about(subjects))
    return out


def check_ledger(outbox: Sequence[tuple[Any, ...]], ledger: Ledger) -> list[Violation]:
    """The ledger against the outbox rows (id, topic, key, dedupe_key, payload, published)."""
    out: list[Violation] = []
    rows = {event_id(topic, dedupe): (oid, topic, key, payload, published)
            for oid, topic, key, dedupe, payload, published in outbox}
    seen = ledger.event_ids()
    out += [Violation("not_in_ledger", eid, f"outbox id {row[0]}")
            for eid, row in rows.items() if row[4] and eid not in seen]
    by_id: dict[str, list[Any]] = defaultdict(list)
    for entry in ledger.entries:
        if entry.event_id is None or entry.event_id not in rows:
            out.append(Violation("unknown_event", str(entry.event_id),
                                 f"{entry.topic}@{entry.partition}:{entry.offset}"))
            continue
        by_id[entry.event_id].append(entry)
    for eid, entries in by_id.items():
        oid, topic, key, payload, _ = rows[eid]
        variants = {(e.topic, e.key, json.dumps(e.payload, sort_keys=True)) for e in entries}
        expected = (topic, key, json.dumps(payload, sort_keys=True))
        if variants != {expected}:
            out.append(Violation("ledger_inconsistent", eid,
                                 f"outbox id {oid}: {len(variants)} variant(s) on the topic"))
    # per (topic, key): first delivery of each event, in offset order, must follow outbox ids
    first: dict[str, tuple[int, int]] = {}
    for entry in ledger.entries:
        if entry.event_id in rows:
            pos = (entry.partition, entry.offset)
            first[entry.event_id] = min(first.get(entry.event_id, pos), pos)
    per_key: dict[tuple[str, str], list[tuple[tuple[int, int], int]]] = defaultdict(list)
    for eid, pos in first.items():
        oid, topic, key, _, _ = rows[eid]
        per_key[(topic, key)].append((pos, oid))
    for (topic, key), deliveries in per_key.items():
        ids = [oid for _, oid in sorted(deliveries)]
        if ids != sorted(ids):
            out.append(Violation("order", f"{topic}/{key}", f"outbox ids in offset order {ids}"))
    return out


def summary(violations: Sequence[Violation]) -> dict[str, int]:
    """Violations per invariant (every invariant listed, 0 when it holds)."""
    counts = dict.fromkeys(INVARIANTS, 0)
    for v in violations:
        counts[v.invariant] = counts.get(v.invariant, 0) + 1
    return counts


def state_digest(dsn: str) -> str:
    """A fingerprint of every row the jobs may change (recordings, finalize rows with their
    attempts and schedule, conferences, both outboxes)."""
    digest = hashlib.sha256()
    queries = [
        "SELECT id, status, file_id, failure_reason, updated_at FROM messenger.call_recordings"
        " ORDER BY id",
        "SELECT id, status, attempts, next_attempt_at, last_error, updated_at"
        " FROM messenger.recording_finalize_attempts ORDER BY id",
        "SELECT id, status, end_reason, updated_at FROM messenger.conference_sessions"
        " ORDER BY id",
        "SELECT id, published_at FROM messenger.integration_outbox ORDER BY id",
        "SELECT id FROM messenger.realtime_outbox ORDER BY id",
    ]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for query in queries:
            for row in conn.execute(query):
                digest.update(repr(row).encode())
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.checker",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--kafka", help="bootstrap servers: also check a consumer ledger")
    parser.add_argument("--sla", default="30m", help="finalize_sla_timeout (default 30m)")
    parser.add_argument("--max-attempts", type=int, default=8)
    parser.add_argument("--empty-room-grace", default="90s")
    parser.add_argument("--provision-timeout", default="2m")
    parser.add_argument("--stale-live-timeout", default="4h")
    parser.add_argument("--slack", default="1m", help="a due row is lost only this much later")
    parser.add_argument("--no-relay", action="store_true",
                        help="the relay is not running: do not require a published outbox")
    args = parser.parse_args(argv)
    limits = Limits(sla_s=parse_duration(args.sla), max_attempts=args.max_attempts,
                    empty_room_grace_s=parse_duration(args.empty_room_grace),
                    provision_timeout_s=parse_duration(args.provision_timeout),
                    stale_live_timeout_s=parse_duration(args.stale_live_timeout),
                    slack_s=parse_duration(args.slack))
    ledger = read_ledger(args.kafka) if args.kafka else None
    violations = check(args.dsn, ledger=ledger, limits=limits, relay=not args.no_relay)
    for violation in violations:
        print(violation)
    if not violations:
        print("ok")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
