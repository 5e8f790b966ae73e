"""Values of the conference-reaper job (frozen attrs; never tuples or dicts).

    PHASES (in order) ──reap_phase──▶ PhaseResult (Reaped..., ItemFailed...)
    cycle ──StopRecording──▶ recorder-signal sender ──StopOutcome

A :class:`Phase` is plain data: which claim query selects it, which transition it makes,
whether it emits ``conference-ended`` and which realtime row it writes.
"""

from __future__ import annotations

import enum
from typing import LiteralString

import attrs

from supervision.jobs import Job

SOURCE = f"safetynet.{Job.CONFERENCE_REAPER}"


class PhaseName(enum.StrEnum):
    """A reaper phase's name (logs, spans, ``plan``; ``safetynet.conference_phase``'s text)."""

    EMPTY_ROOM = "empty-room"  # Active, nobody in the room past empty_room_grace
    PROVISION_TIMEOUT = "provision-timeout"  # Provisioning past provision_timeout
    STALE_LIVE = "stale-live"  # Active, no activity past stale_live_timeout


@attrs.frozen
class Phase:
    name: PhaseName
    outcome: str  # empty_timeout | provision_failed | stale_timeout (counts, metric label)
    claim_query: LiteralString
    from_status: str
    to_status: str
    end_reason: str
    emits_event: bool  # Provisioning -> Failed publishes no conference-ended
    realtime_kind: str


EMPTY_ROOM = Phase(PhaseName.EMPTY_ROOM, "empty_timeout", "conference_sessions_claim_empty_room",
                   "Active", "Ended", "EmptyTimeout", True, "ConferenceEnded")
PROVISION_TIMEOUT = Phase(PhaseName.PROVISION_TIMEOUT, "provision_failed",
                          "conference_sessions_claim_provision_timeout",
                          "Provisioning", "Failed", "Error", False, "ConferenceSignal")
STALE_LIVE = Phase(PhaseName.STALE_LIVE, "stale_timeout", "conference_sessions_claim_stale_live",
                   "Active", "Ended", "Timeout", True, "ConferenceEnded")
PHASES = (EMPTY_ROOM, PROVISION_TIMEOUT, STALE_LIVE)


@attrs.frozen
class Reaped:
    """A conference this phase made terminal (committed with its outbox rows)."""

    conference_id: str
    chat_id: str
    deal_id: str
    tenant_id: str | None
    status: str
    end_reason: str
    duration_seconds: int | None
    active_recordings: tuple[str, ...]
    enqueued: bool  # its conference-ended row was written by this transaction


@attrs.frozen
class ItemFailed:
    """A poison conference: its guard rejected it or its outcome could not be built.
    Nothing of it was written; it stays active and comes back next cycle."""

    conference_id: str
    error: str
    tenant_id: str | None = None


@attrs.frozen
class PhaseResult:
    phase: Phase
    claimed: int
    skipped_locked: int
    reaped: tuple[Reaped, ...]
    failed: tuple[ItemFailed, ...]
    fallback: bool  # the set-based statement failed; rows were reaped one by one

    @property
    def enqueued(self) -> int:
        return sum(1 for r in self.reaped if r.enqueued)


@attrs.frozen
class StopRecording:
    """Ask the media stack to stop a recorder (best-effort, after the commit)."""

    recording_id: str
    conference_id: str


@attrs.frozen
class StopOutcome:
    request: StopRecording
    done: bool  # 2xx, 404 or 409
    detail: str  # the HTTP status, or timeout / connection / abandoned
