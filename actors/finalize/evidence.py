"""Evidence before verdicts (issue #25): a 404 is "not uploaded" only when the cycle can
show that the configuration points where the binaries are.

>>> start = await gather_evidence(db, store, "bucket", "call-recordings/")
>>> gate = VerdictGate(evidence=start)      # Evidence | None
>>> for outcome in gate.judge(row, head):   # in the reconcilers, per HEAD
...     await to_commit.send(outcome)
>>> held = gate.close(breaker_open=False)  # after the last HEAD of the cycle

Evidence, cheapest first, checked once per cycle:

* ``known_recording_found`` — the positive canary (:mod:`actors.finalize.canary`) found a
  recording known to exist;
* ``recordings_listed`` — one ListObjectsV2 under ``s3.key_prefix`` (``delimiter=/``,
  20 keys) shows a key named like a recording (``{prefix}{uuid}``): works on a fresh
  install with no Done row yet. AccessDenied (``s3:ListBucket`` not granted) is logged
  (``evidence_list_refused``) and the other signals decide; the grant is recommended;
* ``object_found`` — a HEAD of this very cycle found an object (any row's, good metadata
  or not) where the HEADs look;
* ``operator_accepted`` — ``safetynet accept-missing`` for this bucket and prefix, until
  the time it names (an operator who checked that the incident is genuine).

:class:`VerdictGate` holds the Missing outcomes that arrive while there is none, and lets
them through — every one, no cap — the moment evidence appears; nothing else waits on it,
so a found row is never slowed. What is still held when the cycle's last HEAD is done is
**withheld**: given back untouched (no attempt spent, due again), ``withheld`` in the
counts, readiness 503 (``s3_evidence: no_evidence_for_key_prefix``) and the
``RecordingFinalizeVerdictsWithheld`` alert.

The same gate applies the seed's content-type rule: a Content-Type that maps to no format
(``application/octet-stream``, none at all) quarantines that row — unless the cycle found
no object with a usable one. Those rows are held like Missing ones; a usable object
releases them (one odd object stays per-row poison); at the cycle's end, at least
:data:`CONTENT_TYPE_FAULT_MIN` of them and no usable object make a configuration fault
(``s3_content_type: content_type_unusable:<type>``): nothing quarantined, the rows given
back untouched, readiness 503, ``ConfigurationFault``. Fewer than that are poison each.

What cancellation does: held rows are dropped with the cycle; like every claimed row not
committed, they keep the attempt pre-incremented at claim and come back after their
back-off.
"""

from __future__ import annotations

import enum

import attrs
import psycopg
import structlog

from actors.finalize.canary import check_known_present
from actors.finalize.messages import ClaimedRow, NotAttempted, RowOutcome, Withheld
from actors.finalize.queries import FINALIZE_QUERIES
from actors.s3.objectstore import Fault, Found, HeadOutcome, Missing, ObjectStore, Poison, Transient
from supervision.db.database import Database

log = structlog.get_logger("finalize_evidence")

NO_EVIDENCE = "no_evidence_for_key_prefix"
CONTENT_TYPE_FAULT = "content_type_unusable"
CONTENT_TYPE_FAULT_MIN = 3  # "at least a few" unusable objects and no usable one: config


class Evidence(enum.StrEnum):
    """Why this cycle may read a 404 as "not uploaded"."""

    KNOWN_RECORDING_FOUND = "known_recording_found"
    RECORDINGS_LISTED = "recordings_listed"
    OBJECT_FOUND = "object_found"
    OPERATOR_ACCEPTED = "operator_accepted"


@attrs.frozen
class Acceptance:
    """An operator's ``safetynet accept-missing`` in force."""

    accepted_until: object
    accepted_by: str
    reason: str


def acceptance(conn: psycopg.Connection, bucket: str, key_prefix: str) -> Acceptance | None:
    row = conn.execute(FINALIZE_QUERIES["missing_verdict_acceptances_active"],
                       {"bucket": bucket, "key_prefix": key_prefix}).fetchone()
    return None if row is None else Acceptance(*row)


async def gather_evidence(db: Database, store: ObjectStore, bucket: str, key_prefix: str
                          ) -> Evidence | Transient | Fault | None:
    """The evidence the cycle starts with (None: none yet), or the canary's fault or
    transient answer (which stop or narrow the cycle as before)."""
    canary = await check_known_present(db, store)
    if isinstance(canary, Transient | Fault):
        return canary
    if canary is not None:
        return Evidence.KNOWN_RECORDING_FOUND
    listed = await store.list_recordings()
    if isinstance(listed, Found):
        return Evidence.RECORDINGS_LISTED
    if isinstance(listed, Fault):  # most likely s3:ListBucket not granted
        log.warning("evidence_list_refused", error=listed.error)
    elif isinstance(listed, Transient):
        log.info("evidence_list_unavailable", error=listed.error)
    accepted = await db.run(acceptance, bucket, key_prefix)
    if accepted is not None:
        log.warning("missing_verdicts_accepted_by_operator",
                    accepted_until=str(accepted.accepted_until),
                    accepted_by=accepted.accepted_by, reason=accepted.reason)
        return Evidence.OPERATOR_ACCEPTED
    return None


def unusable_type(outcome: HeadOutcome) -> bool:
    """An object whose Content-Type names no recording format (or is missing)."""
    return isinstance(outcome, Poison) and outcome.error.startswith("content_type_")


def usable_type(outcome: HeadOutcome) -> bool:
    """An object whose Content-Type was read as a format (its other metadata aside)."""
    return isinstance(outcome, Found) or (
        isinstance(outcome, Poison) and outcome.error.startswith(("duration_", "content_length_")))


@attrs.define
class VerdictGate:
    """One cycle's judgement of Missing verdicts and unusable Content-Types."""

    evidence: Evidence | None = None
    usable_types: bool = False  # an object of this cycle had a usable Content-Type
    held_missing: list[ClaimedRow] = attrs.Factory(list)
    held_types: list[RowOutcome] = attrs.Factory(list)
    withheld: int = 0  # set by close()
    types_fault: str | None = None  # set by close()

    def judge(self, row: ClaimedRow, outcome: HeadOutcome) -> list[RowOutcome]:
        """What goes to the committers now: this row's outcome unless it must wait, and
        the held rows it releases."""
        released: list[RowOutcome] = []
        if isinstance(outcome, Found | Poison) and not outcome_unreadable(outcome):
            if self.evidence is None:  # an object where the HEADs look: they are right
                self.evidence = Evidence.OBJECT_FOUND
                released += [RowOutcome(r, Missing()) for r in self.held_missing]
                self.held_missing.clear()
            if usable_type(outcome) and not self.usable_types:
                self.usable_types = True
                released += self.held_types
                self.held_types.clear()
        if isinstance(outcome, Missing) and self.evidence is None:
            self.held_missing.append(row)
        elif unusable_type(outcome) and not self.usable_types:
            self.held_types.append(RowOutcome(row, outcome))
        else:
            released.insert(0, RowOutcome(row, outcome))
        return released

    def close(self, breaker_open: bool) -> list[RowOutcome]:
        """The held rows, once no HEAD of the cycle is left: Missing ones withheld;
        unusable types a configuration fault from :data:`CONTENT_TYPE_FAULT_MIN` on, else
        poison each. When the breaker opened, every held row is deferred instead: the
        store was not answering well enough to judge."""
        out: list[RowOutcome] = []
        for row in self.held_missing:
            out.append(RowOutcome(row, NotAttempted("s3_breaker_open") if breaker_open
                                  else Withheld(NO_EVIDENCE)))
        if not breaker_open:
            self.withheld = len(self.held_missing)
        self.held_missing = []
        if breaker_open:  # the cycle stopped short: judge these rows next time
            out += [RowOutcome(o.row, NotAttempted("s3_breaker_open")) for o in self.held_types]
        elif len(self.held_types) >= CONTENT_TYPE_FAULT_MIN:
            first = self.held_types[0].decision
            assert isinstance(first, Poison)
            kind = first.error.removeprefix("content_type_").removeprefix("unknown:")
            self.types_fault = f"{CONTENT_TYPE_FAULT}:{kind}"
            out += [RowOutcome(o.row, Fault(self.types_fault)) for o in self.held_types]
        else:
            out += self.held_types
        self.held_types = []
        return out


def outcome_unreadable(outcome: HeadOutcome) -> bool:
    """A response the worker could not read proves nothing about where objects are."""
    return isinstance(outcome, Poison) and outcome.error.startswith("response_unreadable")
