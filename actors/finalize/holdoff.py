"""When a row given back for want of evidence is due again (issue #36).

>>> hold = HoldOff.of(cfg, as_of)
>>> hold.delay(row)                          # seconds until its next HEAD
120.0
>>> hold.due_again(RowOutcome(row, Withheld("no_evidence_for_key_prefix")))

A row whose Missing verdict is withheld (no evidence that its 404 means "not uploaded",
:mod:`actors.finalize.evidence`), or whose object's Content-Type is a configuration
fault, is not an attempt: its ``attempts`` stay as they were. But it is not due again at
once either — given back with its old ``next_attempt_at``, the claim took it first again
in the very next cycle, so a wrong prefix re-HEADed the same withheld rows every polling
interval and never reached the rows behind them. Its next HEAD waits as long as the row
has been overdue (since its session ended plus ``finalize_sla_timeout``), at least
``backoff_base`` and at most ``backoff_cap``: 1, 1, 2, 4, 8 minutes ... then every 15
minutes at the defaults — the delay doubles from one HEAD to the next without anything
stored, because the row's age is its step. A wrong prefix therefore costs at most one HEAD
per withheld row per step (docs/operations.md, ``RecordingFinalizeVerdictsWithheld``).

Rows already overdue come first in the claim's ``next_attempt_at`` order, so the rows of a
backlog that the cycle has not reached yet are claimed before a withheld row comes round
again: every due row is reached, in order, within about ``backlog / rows per cycle``
cycles. Pure: the database clock comes in as ``as_of`` (the cycle's AsOf).
"""

from __future__ import annotations

import datetime as dt

import attrs

from actors.finalize.evidence import CONTENT_TYPE_FAULT
from actors.finalize.messages import ClaimedRow, RowOutcome, Withheld
from actors.finalize.settings import RecordingFinalizeConfig
from actors.s3.objectstore import Fault


def holds_off(outcome: RowOutcome) -> bool:
    """Given back untouched, due again only after a hold-off: a withheld Missing verdict
    or an unusable Content-Type (not a breaker's deferral or another fault)."""
    decision = outcome.decision
    return isinstance(decision, Withheld) or (
        isinstance(decision, Fault) and decision.error.startswith(CONTENT_TYPE_FAULT))


@attrs.frozen
class HoldOff:
    as_of: dt.datetime  # the cycle's AsOf (database clock)
    sla: float  # finalize_sla_timeout
    base: float  # backoff_base: the shortest hold-off
    cap: float  # backoff_cap: the longest

    @classmethod
    def of(cls, cfg: RecordingFinalizeConfig, as_of: dt.datetime) -> HoldOff:
        return cls(as_of, cfg.finalize_sla_timeout, cfg.backoff_base, cfg.backoff_cap)

    def delay(self, row: ClaimedRow) -> float:
        """Seconds until the row's next HEAD: how long it has been overdue, clamped to
        [backoff_base, backoff_cap] (a row without a session end: backoff_base)."""
        if row.session_ended_at is None:
            return self.base
        overdue = (self.as_of - row.session_ended_at).total_seconds() - self.sla
        return min(self.cap, max(self.base, overdue))

    def due_again(self, outcome: RowOutcome) -> dt.datetime:
        """The ``next_attempt_at`` a row given back untouched gets: after its hold-off when
        :func:`holds_off`, else the one it had before the claim."""
        if holds_off(outcome):
            return self.as_of + dt.timedelta(seconds=self.delay(outcome.row))
        return outcome.row.old_next_attempt_at
