"""The invariants safetynet promises, judged from live data (``safetynet audit`` and the
auditor actor; the chaos checker judges with the same code).

>>> th = audit_thresholds(cfg)   # supervision.app.audit; or Thresholds(...) in tests
>>> violations = judge_database(conn, th)             # the cheap, SQL-only invariants
>>> [str(v) for v in violations]
['missing_outbox: 3f0c… Available recording without call-recording-available']

Each query of ``actors/audit/sql/audit.sql`` returns the facts of suspect rows in a
bounded, indexed window; the ``judge_*`` functions here (pure) name the invariants those
facts break. The Kafka invariants are in :mod:`actors.audit.ledger`; the S3 one
(``failed_with_object``) needs HEADs and is judged by ``safetynet audit`` only.

Production-safe by construction: every query is read-only, bounded by ``LIMIT`` and by a
window (``Thresholds.window_s``, never beyond the outbox retention: a pruned row is not a
violation), and a transition younger than ``grace_s`` (an unpublished row younger than
``relay_lag_s``) is not judged yet.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import psycopg
from psycopg.rows import dict_row

from actors.audit.queries import AUDIT_QUERIES
from actors.envelope import TOPIC_CONFERENCE_ENDED, TOPIC_RECORDING_AVAILABLE

FOREVER = 100 * 365 * 86400.0  # a window that holds every row (the chaos checker's)


class Invariant(enum.StrEnum):
    # lost
    LOST_RECORDING = "lost_recording"        # non-terminal past the SLA (rows past the SLO)
    LOST_CONFERENCE = "lost_conference"      # still Provisioning/Active past its window
    MISSING_OUTBOX = "missing_outbox"        # a terminal transition without its event
    MISSING_REALTIME = "missing_realtime"    # a terminal transition without its realtime row
    UNPUBLISHED = "unpublished"              # an outbox row unpublished past the relay lag
    NOT_IN_LEDGER = "not_in_ledger"          # published, but not on the topic
    # duplicated
    DUPLICATE_OUTBOX = "duplicate_outbox"    # > 1 outbox row per topic + dedupe key
    DUPLICATE_REALTIME = "duplicate_realtime"
    UNEXPECTED_OUTBOX = "unexpected_outbox"  # an outbox row without its transition
    LEDGER_INCONSISTENT = "ledger_inconsistent"
    UNKNOWN_EVENT = "unknown_event"          # on the topic, in no outbox row
    # wrong verdict
    FAILED_WITH_OBJECT = "failed_with_object"
    # bounded
    ATTEMPTS_EXCEEDED = "attempts_exceeded"
    NOT_QUARANTINED = "not_quarantined"      # every attempt used, still Pending
    QUARANTINE_EARLY = "quarantine_early"    # an s3 quarantine before max_attempts
    ORDER = "order"                          # per key, published out of outbox-id order


# judged by SQL alone: what the auditor actor runs and exports
CHEAP = (Invariant.LOST_RECORDING, Invariant.LOST_CONFERENCE, Invariant.MISSING_OUTBOX,
         Invariant.MISSING_REALTIME, Invariant.UNPUBLISHED, Invariant.DUPLICATE_OUTBOX,
         Invariant.DUPLICATE_REALTIME, Invariant.UNEXPECTED_OUTBOX,
         Invariant.ATTEMPTS_EXCEEDED, Invariant.NOT_QUARANTINED, Invariant.QUARANTINE_EARLY)
KAFKA = (Invariant.NOT_IN_LEDGER, Invariant.LEDGER_INCONSISTENT, Invariant.UNKNOWN_EVENT,
         Invariant.ORDER)


@attrs.frozen
class Violation:
    invariant: Invariant
    subject: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.invariant}: {self.subject} {self.detail}".rstrip()

    def as_json(self) -> dict[str, str]:
        return {"invariant": str(self.invariant), "subject": self.subject,
                "detail": self.detail}


@attrs.frozen
class Thresholds:
    """What the invariants compare ages and counts with (seconds)."""

    sla_s: float = 1800.0
    max_attempts: int = 8
    empty_room_grace_s: float = 90.0
    provision_timeout_s: float = 120.0
    stale_live_timeout_s: float = 4 * 3600.0
    slack_s: float = 0.0       # extra age before a due row counts as lost (a poll interval)
    cycle_s: float = 0.0       # a claimed row gets this long to be quarantined
    window_s: float = FOREVER  # how far back transitions and outbox rows are judged
    retention_s: float = FOREVER  # outbox retention: older rows may be pruned
    grace_s: float = 0.0       # a transition younger than this is not judged
    relay_lag_s: float = 0.0   # an unpublished row younger than this is not judged
    limit: int = 1000          # violations per query at most

    def params(self) -> dict[str, Any]:
        return {"sla": self.sla_s, "max_attempts": self.max_attempts,
                "empty_room_grace": self.empty_room_grace_s,
                "provision_timeout": self.provision_timeout_s,
                "stale_live_timeout": self.stale_live_timeout_s, "slack": self.slack_s,
                "cycle": self.cycle_s, "window": self.window_s,
                "retention": self.retention_s, "grace": self.grace_s,
                "relay_lag": self.relay_lag_s, "limit": self.limit,
                "rec_topic": TOPIC_RECORDING_AVAILABLE, "conf_topic": TOPIC_CONFERENCE_ENDED}


# ------------------------------------------------------------------ pure judging of facts

def judge_recording(row: dict[str, Any], max_attempts: int) -> list[Violation]:
    """A recently terminal recording: id, status, finalize_status, attempts, has_outbox,
    own_realtime, realtime_rows."""
    rid, status, finalize = row["id"], row["status"], row["finalize_status"]
    out = []
    if status == "Available" and finalize is not None and not row["has_outbox"]:
        out.append(Violation(Invariant.MISSING_OUTBOX, rid,
                             "Available recording without call-recording-available"))
    if finalize == "Done" and row["own_realtime"] == 0:
        out.append(Violation(Invariant.MISSING_REALTIME, rid,
                             f"{status} recording without its realtime row"))
    if row["realtime_rows"] > 1:
        out.append(Violation(Invariant.DUPLICATE_REALTIME, rid,
                             f"{row['realtime_rows']} realtime rows"))
    if row["attempts"] is not None and row["attempts"] > max_attempts:
        out.append(Violation(Invariant.ATTEMPTS_EXCEEDED, rid,
                             f"{row['attempts']} attempts > {max_attempts}"))
    return out


def judge_conference(row: dict[str, Any]) -> list[Violation]:
    """A recently terminal conference: id, status, end_reason, has_outbox, realtime_rows,
    terminal_rows."""
    cid, status, reason = row["id"], row["status"], row["end_reason"]
    out = []
    if status == "Ended" and reason in ("EmptyTimeout", "Timeout") and not row["has_outbox"]:
        out.append(Violation(Invariant.MISSING_OUTBOX, cid,
                             "Ended conference without conference-ended"))
    if reason in ("EmptyTimeout", "Timeout", "Error") and row["realtime_rows"] == 0:
        out.append(Violation(Invariant.MISSING_REALTIME, cid,
                             f"{status} conference without its realtime row"))
    if row["terminal_rows"] > 1:
        out.append(Violation(Invariant.DUPLICATE_REALTIME, cid,
                             f"{row['terminal_rows']} realtime rows"))
    return out


def judge_outbox_row(row: dict[str, Any]) -> list[Violation]:
    """A recent outbox row: id, topic, dedupe_key, subject_status, same_key."""
    expected = "Available" if row["topic"] == TOPIC_RECORDING_AVAILABLE else "Ended"
    noun = "recording" if expected == "Available" else "conference"
    out = []
    if row["subject_status"] != expected:
        out.append(Violation(Invariant.UNEXPECTED_OUTBOX, row["dedupe_key"],
                             f"event for a {row['subject_status'] or 'missing'} {noun}"))
    if row["same_key"] > 1:
        out.append(Violation(Invariant.DUPLICATE_OUTBOX, f"{row['topic']}/{row['dedupe_key']}",
                             f"{row['same_key']} rows"))
    return out


def judge_attempts(row: dict[str, Any], max_attempts: int) -> list[Violation]:
    """An open finalize row: id (its recording), status, attempts, last_error, settled."""
    rid, status, attempts = row["id"], row["status"], row["attempts"]
    out = []
    if attempts > max_attempts:
        out.append(Violation(Invariant.ATTEMPTS_EXCEEDED, rid,
                             f"{attempts} attempts > {max_attempts}"))
    elif status == "Pending" and attempts >= max_attempts and row["settled"]:
        out.append(Violation(Invariant.NOT_QUARANTINED, rid,
                             f"{attempts} attempts used, still Pending"))
    if (status == "Quarantined" and row["last_error"].startswith("s3:")
            and attempts != max_attempts):
        out.append(Violation(Invariant.QUARANTINE_EARLY, rid,
                             f"{attempts} attempts: {row['last_error']}"))
    return out


def dedupe(violations: Iterable[Violation]) -> list[Violation]:
    """Each (invariant, subject) once, in first-seen order (a doubled outbox key shows on
    each of its rows)."""
    seen: dict[tuple[Invariant, str], Violation] = {}
    for v in violations:
        seen.setdefault((v.invariant, v.subject), v)
    return list(seen.values())


def summary(violations: Sequence[Violation],
            invariants: Iterable[Invariant] = Invariant) -> dict[Invariant, int]:
    """Violations per invariant (each of *invariants* listed, 0 when it holds)."""
    counts = dict.fromkeys(invariants, 0)
    for v in violations:
        counts[v.invariant] = counts.get(v.invariant, 0) + 1
    return counts


# ------------------------------------------------------------------ the SQL-only invariants

def judge_database(conn: psycopg.Connection, th: Thresholds) -> list[Violation]:
    """Every cheap invariant over *conn* (read-only, bounded; see the module docstring)."""
    params = th.params()
    out: list[Violation] = []
    with conn.cursor(row_factory=dict_row) as cur:
        for row in cur.execute(AUDIT_QUERIES["audit_recordings_active"], params).fetchall():
            out.append(Violation(Invariant.LOST_RECORDING, row["id"],
                                 f"{row['status']} finalize={row['finalize_status']}, session"
                                 f" ended {row['ended_seconds_ago']}s ago"))
        for row in cur.execute(AUDIT_QUERIES["audit_conferences_active"], params).fetchall():
            out.append(Violation(Invariant.LOST_CONFERENCE, row["id"], row["status"]))
        for row in cur.execute(AUDIT_QUERIES["audit_recordings_terminal"], params).fetchall():
            out += judge_recording(row, th.max_attempts)
        for row in cur.execute(AUDIT_QUERIES["audit_conferences_terminal"], params).fetchall():
            out += judge_conference(row)
        for row in cur.execute(AUDIT_QUERIES["audit_outbox_recent"], params).fetchall():
            out += judge_outbox_row(row)
        for row in cur.execute(AUDIT_QUERIES["audit_outbox_unpublished"], params).fetchall():
            out.append(Violation(Invariant.UNPUBLISHED, str(row["id"]),
                                 f"{row['topic']}/{row['dedupe_key']}"
                                 f" unpublished for {row['age_seconds']}s"))
        for row in cur.execute(AUDIT_QUERIES["audit_finalize_attempts_open"], params).fetchall():
            out += judge_attempts(row, th.max_attempts)
    return dedupe(out)


def failed_sample(conn: psycopg.Connection, th: Thresholds, limit: int) -> list[str]:
    """The most recent Failed recordings in the window, at most *limit*."""
    params = {**th.params(), "window": min(th.window_s, th.retention_s), "limit": limit}
    return [str(r[0]) for r in conn.execute(AUDIT_QUERIES["audit_recordings_failed_sample"],
                                            params).fetchall()]
