"""What ``safetynet plan`` says about one row: its decision and why, from the row the dry
run's query returned and the thresholds of the configuration. Pure functions (no I/O), so
each wording is unit-tested; :mod:`supervision.app.plan` runs the queries and the HEADs.

>>> conference_item(row, cfg.jobs.conference_reaper).why
'empty room, last seen 1m35s ago > empty_room_grace 1m30s'

Every "why" that rests on a window shows the age it measured (on the database clock, when
the query ran) next to the threshold it was compared with, under the setting's name.
"""

from __future__ import annotations

import enum
from typing import Any, TypeAlias

import attrs

from actors.finalize.evidence import (
    CONTENT_TYPE_FAULT,
    CONTENT_TYPE_FAULT_MIN,
    NO_EVIDENCE,
    Evidence,
)
from actors.finalize.messages import BadRow, ClaimPhase, NotAttempted, Terminal, Withheld
from actors.finalize.messages import Decision as RowDecision
from actors.finalize.settings import RecordingFinalizeConfig
from actors.reaper.messages import PhaseName
from actors.reaper.settings import ConferenceReaperConfig
from actors.s3.objectstore import Fault, Found, Missing, Poison, Transient
from supervision.durations import format_duration


class PlanPhase(enum.StrEnum):
    """The plan's phases beyond the claims' own (:class:`ClaimPhase`, :class:`PhaseName`)."""

    REPUBLISH = "republish"  # a terminal Available recording without its event
    PUBLISH = "publish"  # an unpublished outbox row


Phase: TypeAlias = ClaimPhase | PhaseName | PlanPhase


class Decision(enum.StrEnum):
    """What the next cycle would do with a row (``safetynet plan``'s decision column)."""

    # recording-finalize
    QUARANTINE = "quarantine"
    RESCHEDULE = "reschedule (not an attempt)"
    REPUBLISH = "enqueue event, close row"
    CLOSE = "close row"
    AVAILABLE = "Available + event"
    FAILED = "Failed/Timeout"
    RETRY = "retry after back-off"
    WITHHELD = "withheld (given back untouched)"
    DEFERRED = "deferred (given back untouched)"
    CONFIG_FAULT = "nothing (configuration fault)"
    STORAGE_DOWN = "nothing (object storage down)"
    SKIPPED_LOCKED = "skipped (held by another transaction)"
    PAUSED = "nothing (job paused)"
    # conference-reaper
    EMPTY_ROOM = "Ended/EmptyTimeout + conference-ended event"
    EMPTY_ROOM_STOP = "Ended/EmptyTimeout + conference-ended event + recorder stop signal"
    PROVISION_TIMEOUT = "Failed/Error, no event"
    PROVISION_TIMEOUT_STOP = "Failed/Error, no event + recorder stop signal"
    STALE_LIVE = "Ended/Timeout + conference-ended event"
    STALE_LIVE_STOP = "Ended/Timeout + conference-ended event + recorder stop signal"
    HELD_POISON = "held back (poison)"
    # outbox-relay
    HELD = "held"
    SEND = "send to Kafka"


@attrs.frozen
class PlanItem:
    id: str
    phase: Phase
    decision: Decision
    why: str


def age(seconds: float) -> str:
    """A measured age, coarse as a person reads it: ``45s``, ``2m05s``, ``2h03m``,
    ``3d04h`` (truncated to whole units; negative ages, a clock ahead, as ``-``)."""
    sign, whole = ("-", int(-seconds)) if seconds < 0 else ("", int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        text = f"{days}d{hours:02d}h"
    elif hours:
        text = f"{hours}h{minutes:02d}m"
    elif minutes:
        text = f"{minutes}m{secs:02d}s"
    else:
        text = f"{secs}s"
    return sign + text


def compared(what: str, seconds: float, setting: str, threshold: float) -> str:
    """``<what> <age> ago <op> <setting> <threshold>``, op the comparison that holds."""
    op = ">" if seconds > threshold else "=" if seconds == threshold else "<"
    return f"{what} {age(seconds)} ago {op} {setting} {format_duration(threshold)}"


# -- recording-finalize ---------------------------------------------------------------

RECONCILE = ClaimPhase.RECONCILE

def finalize_item(row: dict[str, Any], cfg: RecordingFinalizeConfig) -> PlanItem | None:
    """The decision for a row the claim's classification settles without S3 (poison,
    wait, terminal); None for a row to reconcile (its HEAD decides)."""
    rid, phase = str(row["recording_id"]), ClaimPhase(row["phase"])
    if phase is ClaimPhase.POISON:
        return PlanItem(rid, phase, Decision.QUARANTINE, str(row["poison_reason"]))
    if phase is ClaimPhase.WAIT:
        why = ("session not ended" if row["session_ended_at"] is None else
               compared("session ended", row["ended_s"], "finalize_sla_timeout",
                        cfg.finalize_sla_timeout))
        return PlanItem(rid, phase, Decision.RESCHEDULE, why)
    if phase is ClaimPhase.TERMINAL:
        if row["recording_status"] == "Available" and not row["has_event"]:
            return PlanItem(rid, PlanPhase.REPUBLISH, Decision.REPUBLISH,
                            "Available without its event")
        return PlanItem(rid, phase, Decision.CLOSE, f"already {row['recording_status']}")
    return None


def _sla(row: dict[str, Any], cfg: RecordingFinalizeConfig) -> str:
    return compared("session ended", row["ended_s"], "finalize_sla_timeout",
                    cfg.finalize_sla_timeout)


def reconcile_item(row: dict[str, Any], head: Any, cfg: RecordingFinalizeConfig) -> PlanItem:
    """The decision for a row to reconcile, given what the HEAD of its object returned."""
    rid, sla = str(row["recording_id"]), _sla(row, cfg)
    if isinstance(head, Found):
        return PlanItem(rid, RECONCILE, Decision.AVAILABLE,
                        f"{sla}; binary found ({head.size_bytes} bytes, {head.format})")
    if isinstance(head, Missing):
        return PlanItem(rid, RECONCILE, Decision.FAILED, f"{sla}; no binary")
    if isinstance(head, Poison):
        return PlanItem(rid, RECONCILE, Decision.QUARANTINE, f"object:{head.error}")
    if isinstance(head, Fault):
        return PlanItem(rid, RECONCILE, Decision.CONFIG_FAULT, head.error)
    attempt = f"attempt {row['attempts'] + 1} of max_attempts {cfg.max_attempts}"
    if row["attempts"] + 1 >= cfg.max_attempts:
        return PlanItem(rid, RECONCILE, Decision.QUARANTINE, f"s3:{head.error}; {attempt}")
    return PlanItem(rid, RECONCILE, Decision.RETRY, f"s3:{head.error}; {attempt}")


def decided_item(row: dict[str, Any], decision: RowDecision, evidence: Evidence | None,
                 cfg: RecordingFinalizeConfig, key_prefix: str, hold_s: float) -> PlanItem:
    """A reconcile row's decision as the cycle's own verdict gate gave it (replayed over
    the rows in claim order, :mod:`supervision.app.plan_finalize`): *evidence* is what
    its batch was judged with, *hold_s* how long a row given back would be held off."""
    rid, sla = str(row["recording_id"]), _sla(row, cfg)
    held_off = f"next HEAD in {format_duration(hold_s)} (not an attempt)"
    if isinstance(decision, Withheld):
        return PlanItem(rid, RECONCILE, Decision.WITHHELD,
                        f"{sla}; no binary, but {NO_EVIDENCE}: no known recording found,"
                        f" none listed under {key_prefix!r}, no object found; {held_off}")
    if isinstance(decision, Missing):
        return PlanItem(rid, RECONCILE, Decision.FAILED,
                        f"{sla}; no binary (evidence: {evidence})")
    if isinstance(decision, NotAttempted):
        return PlanItem(rid, RECONCILE, Decision.DEFERRED,
                        f"breaker open ({decision.reason}) in this claim batch or before it")
    if isinstance(decision, Fault) and decision.error.startswith(CONTENT_TYPE_FAULT):
        return PlanItem(rid, RECONCILE, Decision.CONFIG_FAULT,
                        f"{decision.error}: at least {CONTENT_TYPE_FAULT_MIN} objects, none"
                        f" with a usable Content-Type; {held_off}")
    assert not isinstance(decision, Terminal | BadRow)
    return reconcile_item(row, decision, cfg)


def skipped_item(row: dict[str, Any]) -> PlanItem:
    """A row the run would skip: it, or its recording, is held by another transaction."""
    what = "finalize row" if row["held"] else "recording"
    return PlanItem(str(row["recording_id"]), ClaimPhase(row["phase"]),
                    Decision.SKIPPED_LOCKED, f"{what} held by another transaction right now")


def paused_item(row: dict[str, Any], pause: dict[str, Any]) -> PlanItem:
    """A due row while the job is paused (``safetynet pause``): no cycle runs."""
    why = f"job paused by {pause['paused_by']} since {pause['paused_at']}"
    if pause["reason"]:
        why += f": {pause['reason']}"
    return PlanItem(str(row["recording_id"]), ClaimPhase(row["phase"]), Decision.PAUSED, why)


def storage_down_item(row: dict[str, Any], probe: Fault | Transient) -> PlanItem:
    """A row to reconcile while the cycle's probe says storage is unusable: no HEAD."""
    what = Decision.CONFIG_FAULT if isinstance(probe, Fault) else Decision.STORAGE_DOWN
    return PlanItem(str(row["recording_id"]), ClaimPhase(row["phase"]), what, probe.error)


# -- conference-reaper ----------------------------------------------------------------

# by phase, then whether the recorder is told to stop
_CONFERENCE_DECISIONS = {
    PhaseName.EMPTY_ROOM: (Decision.EMPTY_ROOM, Decision.EMPTY_ROOM_STOP),
    PhaseName.PROVISION_TIMEOUT: (Decision.PROVISION_TIMEOUT, Decision.PROVISION_TIMEOUT_STOP),
    PhaseName.STALE_LIVE: (Decision.STALE_LIVE, Decision.STALE_LIVE_STOP),
}


def conference_item(row: dict[str, Any], cfg: ConferenceReaperConfig) -> PlanItem:
    """A due conference: its phase's transition, with the window it exceeded."""
    cid, phase = str(row["id"]), PhaseName(row["phase"])
    decision = _CONFERENCE_DECISIONS[phase][bool(row["recording_active"])]
    if phase is PhaseName.EMPTY_ROOM:
        why = compared("empty room, last seen", row["idle_s"], "empty_room_grace",
                       cfg.empty_room_grace)
    elif phase is PhaseName.PROVISION_TIMEOUT:
        why = compared("provisioning since", row["age_s"], "provision_timeout",
                       cfg.provision_timeout)
    else:
        why = (compared("last activity", row["idle_s"], "stale_live_timeout",
                        cfg.stale_live_timeout)
               + f" ({row['active_participant_count']} participant(s) on record)")
    if row["poison_held"]:
        return PlanItem(cid, phase, Decision.HELD_POISON,
                        f"{row['poison_reason']}; retried after {row['poison_retry_at']}")
    return PlanItem(cid, phase, decision, why)


# -- outbox-relay ---------------------------------------------------------------------

def outbox_item(row: dict[str, Any]) -> PlanItem:
    """An unpublished outbox row: sent, or held behind a dead letter (with its age)."""
    oid = str(row["id"])
    if row["held_by"] is not None:
        if row["held_by"] == row["id"]:
            why = f"dead-lettered {age(row['held_for_s'])} ago: {row['held_reason']}"
        else:
            why = (f"key blocked behind dead letter {row['held_by']} for "
                   f"{age(row['held_for_s'])}: {row['held_reason']}")
        return PlanItem(oid, PlanPhase.PUBLISH, Decision.HELD, why)
    why = (f"{row['topic']} key {row['message_key']}, unpublished for {age(row['age_s'])}, "
           f"attempts {row['publish_attempts']}")
    if row["last_error"]:
        why += f", last error: {row['last_error']}"
    return PlanItem(oid, PlanPhase.PUBLISH, Decision.SEND, why)
