"""The chaos invariant checker: a function over a DSN (and optionally a Kafka ledger and the
set of recordings whose object is in S3) that returns every violated invariant.

Run after the faults stopped and a quiet period. On a live database::

    python -m tests.chaos.checker --dsn postgresql://... [--kafka HOST:PORT] [--sla 30m]

prints one line per violation and exits 1 if there is any (0 and "ok" otherwise).

The judgement is the shipped auditor's (:mod:`actors.audit.invariants`,
:mod:`actors.audit.ledger`, run by ``safetynet audit``) over every row, without its
production age bounds; this module adds the ground truth only a test has (which objects
were uploaded, a consumer ledger read from the start) and the state digest.

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
import sys
from collections.abc import Collection, Sequence
from typing import Any

import attrs
import psycopg

from actors.audit.invariants import Invariant, Thresholds, Violation, failed_sample, judge_database
from actors.audit.ledger import OutboxRow
from actors.audit.ledger import check_ledger as judge_ledger
from supervision.durations import parse_duration
from tests.chaos.ledger import Ledger, read_ledger

# The chaos contract's invariants (the shipped auditor's, less not_quarantined, which needs
# the jobs' cycle bound the chaos limits do not carry).
INVARIANTS = (
    "lost_recording", "lost_conference", "missing_outbox", "missing_realtime", "unpublished",
    "not_in_ledger", "duplicate_outbox", "duplicate_realtime", "unexpected_outbox",
    "ledger_inconsistent", "unknown_event", "failed_with_object", "attempts_exceeded",
    "quarantine_early", "order",
)

__all__ = ["INVARIANTS", "Limits", "Violation", "check", "check_ledger", "state_digest",
           "summary"]


@attrs.frozen
class Limits:
    """The daemon's configuration the invariants depend on (seconds)."""

    sla_s: float = 1800.0
    max_attempts: int = 8
    empty_room_grace_s: float = 90.0
    provision_timeout_s: float = 120.0
    stale_live_timeout_s: float = 4 * 3600.0
    slack_s: float = 0.0  # extra age before a due row counts as lost (a poll interval)

    def thresholds(self) -> Thresholds:
        """The shipped auditor's thresholds: every row, however young or old."""
        return Thresholds(**attrs.asdict(self), limit=10**9)


def check(dsn: str, *, ledger: Ledger | None = None, uploaded: Collection[str] | None = None,
          limits: Limits | None = None, relay: bool = True) -> list[Violation]:
    """Every violated invariant. *ledger*: what a consumer read from Kafka (omit when the
    broker lost data, e.g. after a Tansu restart); *uploaded*: recording ids whose object
    is in S3; *relay*: whether the outbox must be fully published."""
    th = (limits or Limits()).thresholds()
    with psycopg.connect(dsn, autocommit=True) as conn:
        out = [v for v in judge_database(conn, th)
               if v.invariant in INVARIANTS and (relay or v.invariant != "unpublished")]
        if uploaded:
            have = set(uploaded)
            out += [Violation(Invariant.FAILED_WITH_OBJECT, rid, "object exists in S3")
                    for rid in failed_sample(conn, th, 10**9) if rid in have]
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
    """The ledger against the outbox rows (id, topic, key, dedupe_key, payload, published):
    the shipped auditor's judgement."""
    return judge_ledger([OutboxRow(*row) for row in outbox], ledger)


def summary(violations: Sequence[Violation]) -> dict[str, int]:
    """Violations per invariant (every invariant listed, 0 when it holds)."""
    counts = dict.fromkeys(INVARIANTS, 0)
    for v in violations:
        counts[str(v.invariant)] = counts.get(str(v.invariant), 0) + 1
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
