"""The hold-off of rows given back for want of evidence (issue #36): not an attempt, but
the next HEAD waits at least backoff_base, doubling up to backoff_cap."""

from __future__ import annotations

import datetime as dt
import itertools

import attrs

from actors.finalize.holdoff import HoldOff, holds_off
from actors.finalize.messages import ClaimedRow, NotAttempted, RowOutcome, Withheld
from actors.finalize.settings import RecordingFinalizeConfig
from actors.s3.objectstore import Fault

AS_OF = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
CFG = RecordingFinalizeConfig()  # sla 30 min, base 1 min, cap 15 min
OLD_DUE = AS_OF - dt.timedelta(hours=1)


def row(overdue_s: float | None) -> ClaimedRow:
    """A reconcile row whose session ended the SLA plus *overdue_s* before AS_OF."""
    ended = (None if overdue_s is None else
             AS_OF - dt.timedelta(seconds=CFG.finalize_sla_timeout + overdue_s))
    return ClaimedRow(attempt_id="a", recording_id="r", session_kind="Direct",
                      session_id="s", attempts=3, phase="reconcile",
                      recording_status="Uploading", old_attempts=2,
                      old_next_attempt_at=OLD_DUE, session_ended_at=ended)


def test_the_delay_is_how_long_the_row_has_been_overdue_within_base_and_cap() -> None:
    """Just due: backoff_base; overdue 5 minutes: 5 minutes; overdue a day: backoff_cap;
    no session end known: backoff_base."""
    hold = HoldOff.of(CFG, AS_OF)
    assert [hold.delay(row(s)) for s in (0, 30, 300, 86400, None)] == [
        60.0, 60.0, 300.0, 900.0, 60.0]


def test_a_row_withheld_every_time_is_headed_at_most_once_per_doubling_step() -> None:
    """A row withheld at every HEAD from the moment it is due (a wrong prefix): its HEADs
    come 1, 1, 2, 4, 8 minutes apart, then every backoff_cap (15 minutes) — 8 HEADs in its
    first hour, 4 an hour after that."""
    due = AS_OF
    heads = [due]
    while heads[-1] < due + dt.timedelta(hours=3):
        now = heads[-1]
        overdue = (now - due).total_seconds()
        ended = due - dt.timedelta(seconds=CFG.finalize_sla_timeout)
        hold = HoldOff.of(CFG, now)
        heads.append(hold.due_again(RowOutcome(
            attrs.evolve(row(0), session_ended_at=ended), Withheld("no_evidence"))))
        assert (heads[-1] - now).total_seconds() == min(900.0, max(60.0, overdue))
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(heads)]
    assert gaps[:7] == [60, 60, 120, 240, 480, 900, 900]
    assert sum(h < due + dt.timedelta(hours=1) for h in heads) == 8
    hour_two = [h for h in heads if due + dt.timedelta(hours=1) <= h < due
                + dt.timedelta(hours=2)]
    assert len(hour_two) == 4


def test_only_withheld_rows_and_unusable_types_hold_off() -> None:
    """A breaker's deferral or another fault is given back due as before the claim; a
    withheld row or an unusable Content-Type after its hold-off. Neither is an attempt
    (attempts are restored by the statement, whatever the due time)."""
    hold = HoldOff.of(CFG, AS_OF)
    late = row(600)
    for decision in (NotAttempted("s3_breaker_open"), Fault("access_denied_http_403")):
        outcome = RowOutcome(late, decision)
        assert not holds_off(outcome) and hold.due_again(outcome) == OLD_DUE
    for decision in (Withheld("no_evidence_for_key_prefix"),
                     Fault("content_type_unusable:application/octet-stream")):
        outcome = RowOutcome(late, decision)
        assert holds_off(outcome)
        assert hold.due_again(outcome) == AS_OF + dt.timedelta(seconds=600)
