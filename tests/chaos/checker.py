"""The chaos invariant checker: a function over a DSN (and optionally a Kafka ledger and the
set of recordings whose object is in S3) that returns every violated invariant.

Run after the faults stopped and a quiet period. On a live database::

    python -m tests.chaos.checker --dsn postgresql://... [--kafka HOST:PORT] [--sla 30m]
        [--slot SLOT [--publication PUB]]     # the relay's logical source

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
  ``not_in_ledger`` (an event the Kafka ledger never saw: with the relay running, every
  outbox row but a dead letter, whatever its source recorded — the read-back is the
  truth for both sources; without it, the rows with ``published_at``), ``slot_unread``
  (logical source: an outbox insert the slot's confirmed position has not passed once
  the relay is quiet).
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

Duplicates are not a violation (at least once): :func:`redeliveries` counts them from the
ledger and :func:`redelivery_bound` is what a scenario's incidents allow.

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
from actors.outbox.logical_setup import LogicalSource
from actors.outbox.slot_cycle import ABOVE_SLOT_BATCHES
from supervision.durations import parse_duration
from tests.chaos.ledger import Ledger, read_ledger
from tests.chaos.sources import RelaySource, unread

# The chaos contract's invariants (the shipped auditor's, less not_quarantined, which needs
# the jobs' cycle bound the chaos limits do not carry).
INVARIANTS = (
    "lost_recording", "lost_conference", "missing_outbox", "missing_realtime", "unpublished",
    "not_in_ledger", "duplicate_outbox", "duplicate_realtime", "unexpected_outbox",
    "ledger_inconsistent", "unknown_event", "failed_with_object", "attempts_exceeded",
    "quarantine_early", "order", "slot_unread",
)

__all__ = ["INVARIANTS", "Limits", "Redeliveries", "Violation", "check", "check_delivery",
           "check_ledger", "largest_transaction", "outside_windows", "redeliveries",
           "redelivery_bound", "slot_unread", "state_digest", "summary"]


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
          limits: Limits | None = None, relay: bool = True,
          slot: LogicalSource | None = None) -> list[Violation]:
    """Every violated invariant. *ledger*: what a consumer read from Kafka (omit when the
    broker lost data, e.g. after a Tansu restart); *uploaded*: recording ids whose object
    is in S3; *relay*: whether the outbox must be fully delivered; *slot*: the logical
    source's slot, which must have passed every outbox insert."""
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
        dead = {int(r[0]) for r in conn.execute(
            "SELECT outbox_id FROM safetynet.outbox_dead_letters")}
    if ledger is not None:
        if relay:
            out += check_delivery([row[:5] for row in outbox], ledger, dead_lettered=dead)
        else:
            out += check_ledger(outbox, ledger)
    if slot is not None and relay:
        out += slot_unread(unread(dsn, RelaySource("logical", slot)))
    return out


def check_ledger(outbox: Sequence[tuple[Any, ...]], ledger: Ledger) -> list[Violation]:
    """The ledger against the outbox rows (id, topic, key, dedupe_key, payload, published):
    the shipped auditor's judgement."""
    return judge_ledger([OutboxRow(*row) for row in outbox], ledger)


def check_delivery(outbox: Sequence[tuple[Any, ...]], ledger: Ledger, *,
                   dead_lettered: Collection[int] = ()) -> list[Violation]:
    """Every outbox row (id, topic, key, dedupe_key, payload) but a dead letter delivered
    at least once, per key in outbox-id order, each event id with its row's topic, key and
    payload — judged from what Kafka holds, not from what the source recorded (the
    logical source writes no ``published_at``)."""
    gone = set(dead_lettered)
    return judge_ledger([OutboxRow(outbox_id, topic, key, dedupe_key, payload,
                                   published=outbox_id not in gone)
                         for outbox_id, topic, key, dedupe_key, payload in outbox], ledger)


def slot_unread(ids: Sequence[int]) -> list[Violation]:
    """One ``slot_unread`` violation per outbox insert the slot has not passed."""
    return [Violation("slot_unread", str(outbox_id), "past the slot's confirmed position")
            for outbox_id in ids]


@attrs.frozen
class Redeliveries:
    """Deliveries of an event id beyond its first (at least once allows them)."""

    events: int  # event ids delivered more than once
    copies: int  # deliveries beyond each event's first


def redeliveries(ledger: Ledger) -> Redeliveries:
    """How many events the ledger holds more than once (same ``event-id`` header), and
    how many copies beyond the first in all."""
    seen: dict[str, int] = {}
    for entry in ledger.entries:
        if entry.event_id:
            seen[entry.event_id] = seen.get(entry.event_id, 0) + 1
    return Redeliveries(sum(1 for n in seen.values() if n > 1),
                        sum(n - 1 for n in seen.values()))


def outside_windows(ledger: Ledger, windows: Sequence[Collection[str]]) -> list[str]:
    """The event ids delivered more than once that no crash's unacknowledged window held:
    an event the relay had recorded delivered (``published_at``, or passed by the slot)
    must never go again."""
    held = set().union(*windows) if windows else set()
    seen: dict[str, int] = {}
    for entry in ledger.entries:
        if entry.event_id:
            seen[entry.event_id] = seen.get(entry.event_id, 0) + 1
    return sorted(eid for eid, n in seen.items() if n > 1 and eid not in held)


# Per incident, the waves the table source can have delivered and not marked: the one on
# the wire and the one the marker is recording (see redelivery_bound).
TABLE_WAVES = 2


def redelivery_bound(source: str, batch_size: int, incidents: int,
                     largest_txn: int = 0) -> int:
    """What the code caps, per incident (a kill -9, a Kafka outage or blackhole, a
    terminated session, a fenced leader), of the relay's unacknowledged window: the events
    Kafka has and the relay had not yet recorded, which a restart or a later cycle sends
    again. The scenarios that crash the daemon measure the window at each crash instead
    (:meth:`tests.chaos.conftest.Run.crashed`, :func:`outside_windows`): exact, and sound
    in both sources; this constant is the bound of the others.

    * ``table``: a row goes again when Kafka acknowledged it and its ``published_at`` did
      not commit. A wave is formed from the rows in hand, at most ``2 x batch_size``
      (:class:`~actors.outbox.window.InHand`); the next wave is formed only after the
      previous one was answered, and the marker records every answer queued in one
      transaction: a wave on the wire and one being marked, ``2 x 2 x batch_size`` (the
      marker's queue could hold more waves if PostgreSQL stalled it that long).
    * ``logical``: an event goes again when Kafka acknowledged it and the slot's confirmed
      position did not pass it. Before each peek or stream read the reader waits until
      fewer than ``ROOM_BATCHES x batch_size`` events read would stay above the slot once
      it moves past the settled ones (settled or not: both go again after a crash), and
      moves it there; one read adds at most ``READ_BATCHES x batch_size`` more or one
      whole transaction (*largest_txn*: the most outbox rows one transaction inserted; the
      slot passes a transaction only once all its events are settled):
      :data:`~actors.outbox.slot_cycle.ABOVE_SLOT_BATCHES` ``x batch_size + largest_txn``.
    """
    if source == "table":
        per_incident = TABLE_WAVES * 2 * batch_size
    else:
        per_incident = ABOVE_SLOT_BATCHES * batch_size + largest_txn
    return incidents * per_incident


def largest_transaction(dsn: str) -> int:
    """The most outbox rows one transaction inserted (rows the logical source never
    updates keep their inserting transaction id)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n"
                           " FROM messenger.integration_outbox GROUP BY xmin::text) t"
                           ).fetchone()
    return int(row[0]) if row else 0


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
    parser.add_argument("--slot", help="the relay reads the logical source: its slot must"
                        " have passed every outbox insert")
    parser.add_argument("--publication", default="safetynet_outbox",
                        help="the logical source's publication (default safetynet_outbox)")
    args = parser.parse_args(argv)
    limits = Limits(sla_s=parse_duration(args.sla), max_attempts=args.max_attempts,
                    empty_room_grace_s=parse_duration(args.empty_room_grace),
                    provision_timeout_s=parse_duration(args.provision_timeout),
                    stale_live_timeout_s=parse_duration(args.stale_live_timeout),
                    slack_s=parse_duration(args.slack))
    ledger = read_ledger(args.kafka) if args.kafka else None
    slot = LogicalSource(args.slot, args.publication) if args.slot else None
    violations = check(args.dsn, ledger=ledger, limits=limits, relay=not args.no_relay,
                       slot=slot)
    for violation in violations:
        print(violation)
    if not violations:
        print("ok")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
