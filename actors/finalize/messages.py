"""Messages of the recording-finalize job (frozen attrs; never tuples or dicts).

claimer --ClaimedRow--> s3 reconciler pool --RowOutcome--> committer
claimer --RowOutcome (terminal, poison: no S3 needed)-----> committer
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import TypeAlias

import attrs

from actors.s3.objectstore import Fault, Found, Missing, Poison, Transient


class ClaimPhase(enum.StrEnum):
    """What the claim statement decided for a due row (``phase`` in its result; the same
    decision is made in ``plan_finalize_attempts``)."""

    RECONCILE = "reconcile"  # session ended past the SLA: HEAD the object
    TERMINAL = "terminal"  # recording Available/Failed already: republish if needed, close
    POISON = "poison"  # no verdict possible (recording or session missing ...): quarantine
    WAIT = "wait"  # session live or inside the SLA: rescheduled, not an attempt, never sent


class AttemptStatus(enum.StrEnum):
    """``messenger.recording_finalize_attempts.status`` (SPEC §2)."""

    PENDING = "Pending"
    DONE = "Done"
    QUARANTINED = "Quarantined"


@attrs.frozen
class ClaimedRow:
    """A finalize row claimed for this cycle (attempts already pre-incremented)."""

    attempt_id: str
    recording_id: str
    session_kind: str
    session_id: str
    attempts: int
    phase: ClaimPhase = attrs.field(converter=ClaimPhase)
    recording_status: str | None
    old_attempts: int
    old_next_attempt_at: dt.datetime
    tenant_id: str | None = None
    poison_reason: str | None = None  # phase poison: why no verdict is possible
    session_ended_at: dt.datetime | None = None  # when its session ended (reconcile rows)
    batch: int = 0  # which claim of the cycle took it (0, 1, ...): the verdict gate's unit


@attrs.frozen
class Terminal:
    """The recording is Available or Failed already: republish if unpublished, close."""


@attrs.frozen
class BadRow:
    """No verdict is possible and waiting would never end: the finalize row points at no
    recording, the recording at no session or an unknown session_kind, or the session ended
    far in the future. Poison: quarantined with *reason* as last_error."""

    reason: str


@attrs.frozen
class NotAttempted:
    """The breaker opened before this row's HEAD was sent: give the row back untouched."""

    reason: str


@attrs.frozen
class Withheld:
    """A Missing verdict without evidence that the 404 means "not uploaded" (*reason*):
    give the row back untouched (not an attempt); a later cycle judges it again."""

    reason: str


Decision: TypeAlias = (Found | Missing | Transient | Fault | Poison | Terminal | BadRow
                       | NotAttempted | Withheld)


@attrs.frozen
class RowOutcome:
    row: ClaimedRow
    decision: Decision
