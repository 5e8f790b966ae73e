"""Evidence before verdicts (issue #25): a 404 is "not uploaded" only when the cycle can
show that the configuration points where the binaries are.

>>> start = await gather_evidence(db, store, "bucket", "call-recordings/")
>>> gate = VerdictGate(evidence=start)      # Evidence | None
>>> gate.open_batch(0, 100)                 # the claimer, before sending a claim's rows
>>> for outcome in gate.judge(row, head):   # in the reconcilers, per HEAD
...     await to_commit.send(outcome)
>>> rest = gate.close(breaker_open=False)  # after the last HEAD of the cycle

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
so a found row is never slowed. It judges claim batch by claim batch: a batch's rows get
the evidence of the cycle's start, of their own batch and of the batches claimed before
it — never of a later one. Once a batch's last HEAD is in (and every batch before it is
closed), what it still holds is **withheld**: given back without spending an attempt,
due again after a hold-off (:mod:`actors.finalize.holdoff`: at least ``backoff_base``,
as long as the row has been overdue, at most ``backoff_cap``), ``withheld`` in the
counts, readiness 503 (``s3_evidence: no_evidence_for_key_prefix``) and the
``RecordingFinalizeVerdictsWithheld`` alert. So held rows live no longer than their batch
(and the few batches in flight before it); a found row later in the backlog gives its
own batch and every later one the evidence, and the next cycle's positive canary (that
recording, Available now) gives it to every row. Because no verdict depends on how far
the cycle gets or on the order in which concurrent HEADs answer (the outage breaker's
count of consecutive failures aside), ``safetynet plan`` replays this very gate over the
rows in claim order and predicts the run.

The same gate applies the seed's content-type rule: a Content-Type that maps to no format
(``application/octet-stream``, none at all) quarantines that row once an object with a
usable one was found in its batch or before it (one odd object: per-row poison). Until
then those rows are held like Missing ones, and a usable object releases them; when their batch
closes, at least :data:`CONTENT_TYPE_FAULT_MIN` of them in the cycle so far and no usable
object make a configuration fault (``s3_content_type: content_type_unusable:<type>``):
nothing quarantined, the rows given back untouched with the same hold-off as withheld
ones, readiness 503, ``ConfigurationFault``. Fewer than that are poison each.

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


def unusable_type(outcome: HeadOutcome | NotAttempted) -> bool:
    """An object whose Content-Type names no recording format (or is missing)."""
    return isinstance(outcome, Poison) and outcome.error.startswith("content_type_")


def usable_type(outcome: HeadOutcome) -> bool:
    """An object whose Content-Type was read as a format (its other metadata aside)."""
    return isinstance(outcome, Found) or (
        isinstance(outcome, Poison) and outcome.error.startswith(("duration_", "content_length_")))


@attrs.define
class _Batch:
    """The reconcile rows of one claim, as the gate sees them."""

    expected: int | None = None  # rows the claimer sent to the reconcilers (None: unknown)
    judged: int = 0
    found: bool = False  # an object of this batch proves where the HEADs look
    usable: bool = False  # an object of this batch had a usable Content-Type
    unusable: int = 0  # objects of this batch whose Content-Type names no format
    held_missing: list[ClaimedRow] = attrs.Factory(list)
    held_types: list[RowOutcome] = attrs.Factory(list)

    @property
    def complete(self) -> bool:
        return self.expected is not None and self.judged >= self.expected


@attrs.define
class VerdictGate:
    """One cycle's judgement of Missing verdicts and unusable Content-Types, claim batch by
    claim batch (``row.batch``): what a batch's rows are judged with is the cycle's start
    evidence and what its own HEADs and those of the batches before it found — never what
    a later batch finds, so the verdicts do not depend on how far the cycle gets or on the
    order in which concurrent HEADs answer (``safetynet plan`` replays the same gate)."""

    evidence: Evidence | None = None  # at the start; OBJECT_FOUND once an object is found
    usable_types: bool = False  # an object of this cycle had a usable Content-Type
    withheld: int = 0  # rows given back as Withheld so far
    types_fault: str | None = None  # set when rows are given back for their Content-Type
    _start: Evidence | None = attrs.field(default=None, init=False)
    _batches: dict[int, _Batch] = attrs.field(factory=dict, init=False)
    _next: int = attrs.field(default=0, init=False)  # the first batch not yet closed
    _found_from: int | None = attrs.field(default=None, init=False)  # first batch with one
    _usable_from: int | None = attrs.field(default=None, init=False)
    _unusable_through: int = attrs.field(default=0, init=False)  # in the closed batches
    _breaker_from: int | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._start = self.evidence

    @property
    def held(self) -> int:
        """Rows held right now (those of the batches not yet closed)."""
        return sum(len(b.held_missing) + len(b.held_types) for b in self._batches.values())

    def open_batch(self, batch: int, rows: int) -> list[RowOutcome]:
        """The claimer sent *rows* rows of claim *batch* to the reconcilers (before the
        first of them); what that closes (an empty batch closes at once)."""
        self._batch(batch).expected = rows
        return self._close_complete()

    def judge(self, row: ClaimedRow, outcome: HeadOutcome | NotAttempted,
              breaker_open: bool = False) -> list[RowOutcome]:
        """What goes to the committers now: this row's outcome unless it must wait, the
        held rows it releases, and the batches it completes. *breaker_open*: the breaker
        is open once this outcome is recorded."""
        batch, k = self._batch(row.batch), row.batch
        if breaker_open and self._breaker_from is None:
            self._breaker_from = k
        released: list[RowOutcome] = []
        if isinstance(outcome, Found | Poison) and not outcome_unreadable(outcome):
            batch.found = True
            self.evidence = self.evidence or Evidence.OBJECT_FOUND
            if self._found_from is None or k < self._found_from:
                self._found_from = k
                released += self._release_missing(k)
            if usable_type(outcome):
                batch.usable = self.usable_types = True
                if self._usable_from is None or k < self._usable_from:
                    self._usable_from = k
                    released += self._release_types(k)
        if isinstance(outcome, Missing) and not self._evidence_for(k):
            batch.held_missing.append(row)
        elif unusable_type(outcome):
            batch.unusable += 1
            if self._usable_from is not None and self._usable_from <= k:
                released.insert(0, RowOutcome(row, outcome))
            else:
                batch.held_types.append(RowOutcome(row, outcome))
        else:
            released.insert(0, RowOutcome(row, outcome))
        batch.judged += 1
        return released + self._close_complete()

    def close(self, breaker_open: bool) -> list[RowOutcome]:
        """Every batch still open, in order, once no HEAD of the cycle is left (rows of an
        unfinished batch held until now: a cancelled or unit-test cycle)."""
        if breaker_open and self._breaker_from is None:
            self._breaker_from = self._next
        out: list[RowOutcome] = []
        for k in sorted(self._batches):
            out += self._close_batch(k)
        return out

    def _batch(self, k: int) -> _Batch:
        if k not in self._batches:
            self._batches[k] = _Batch()
        return self._batches[k]

    def _evidence_for(self, k: int) -> bool:
        return self._start is not None or (self._found_from is not None
                                           and self._found_from <= k)

    def _release_missing(self, k: int) -> list[RowOutcome]:
        out: list[RowOutcome] = []
        for j, batch in self._batches.items():
            if j >= k:
                out += [RowOutcome(r, Missing()) for r in batch.held_missing]
                batch.held_missing = []
        return out

    def _release_types(self, k: int) -> list[RowOutcome]:
        out: list[RowOutcome] = []
        for j, batch in self._batches.items():
            if j >= k:
                out += batch.held_types
                batch.held_types = []
        return out

    def _close_complete(self) -> list[RowOutcome]:
        out: list[RowOutcome] = []
        while self._next in self._batches and self._batches[self._next].complete:
            out += self._close_batch(self._next)
        return out

    def _close_batch(self, k: int) -> list[RowOutcome]:
        """What batch *k*'s held rows become, every batch before it closed: deferred when
        the breaker opened in it or before (the store was not answering well enough to
        judge); else its 404s withheld, and its unusable types a configuration fault once
        the cycle has met :data:`CONTENT_TYPE_FAULT_MIN` of them with no usable one,
        poison each before that."""
        batch = self._batches.pop(k)
        self._next = k + 1
        self._unusable_through += batch.unusable
        held = [RowOutcome(r, Withheld(NO_EVIDENCE)) for r in batch.held_missing]
        types = batch.held_types
        if self._breaker_from is not None and self._breaker_from <= k:
            return [RowOutcome(o.row, NotAttempted("s3_breaker_open")) for o in held + types]
        self.withheld += len(held)
        if types and self._unusable_through >= CONTENT_TYPE_FAULT_MIN:
            first = types[0].decision
            assert isinstance(first, Poison)
            kind = first.error.removeprefix("content_type_").removeprefix("unknown:")
            self.types_fault = f"{CONTENT_TYPE_FAULT}:{kind}"
            types = [RowOutcome(o.row, Fault(self.types_fault)) for o in types]
        return held + types


def outcome_unreadable(outcome: HeadOutcome) -> bool:
    """A response the worker could not read proves nothing about where objects are."""
    return isinstance(outcome, Poison) and outcome.error.startswith("response_unreadable")
