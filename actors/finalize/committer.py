"""The finalize committer: applies the rows' outcomes in groups of up to 64 per thread hop.

Inputs: the cycle (:class:`~actors.finalize.state.FinalizeCycle`: its fenced database, run
id, counts and relay wake-up) and :class:`RowOutcome` messages (receive channel). Outputs:
each row's transition, its finalize row, its integration and realtime outbox rows under
the status guard — a row commits whole or not at all, alone or with the rows of its group
that share its statement — plus counts, metrics, the seed's log events, a span per row,
and a wake-up of the outbox relay after each group that enqueued events. Restart type:
none — it lives for one cycle.

It waits for one outcome, then gathers more for up to ``GATHER_S`` (at most ``GROUP``;
the cycle's committers take turns to gather, so one gathers while the others commit)
and applies the group in one thread hop (``Database.atomic_each``): rows that
become or already are Available (the bulk of a drain) go through one set-based statement
and rows whose binary is Missing through another — each one transaction holding whole
rows; if the database rejects any row's data, that statement rolls back and those rows
are applied one statement each, so only the bad row is quarantined — and every other
outcome is one statement of its own.

A recording that another transaction holds (the ingest callback) is skipped, never
waited on (seed: "a recording locked by the ingest callback is skipped"): its statement
writes nothing for it and gives its finalize row the attempt back, due again from now, so
a later cycle reconciles it.

Malformed data (a value the database rejects) quarantines that row with the reason in a
separate statement; the rest of the group proceeds. Infrastructure errors end the cycle:
uncommitted rows stay Pending and are retried idempotently by the next cycle.

What cancellation does: the group being committed finishes (``atomic_each`` is a
must-complete block; after a hard stop no further row starts); outcomes still queued are
dropped — their rows keep the attempt pre-incremented at claim and come back after their
back-off.
"""

from __future__ import annotations

import enum
from functools import partial
from typing import Any

import attrs
import psycopg
import structlog
import trio

from actors.finalize.holdoff import HoldOff
from actors.finalize.messages import (
    AttemptStatus,
    BadRow,
    NotAttempted,
    RowOutcome,
    Terminal,
    Withheld,
)
from actors.finalize.metrics import (
    RF_FAILED,
    RF_QUARANTINED,
    RF_RECONCILED,
    RF_REPUBLISHED,
    RF_TRANSIENT,
    RF_VERDICTS_WITHHELD,
)
from actors.finalize.state import FinalizeCounts, FinalizeCycle
from actors.finalize.store import (
    Applied,
    fail_timeout,
    publish_available,
    quarantine,
    record_transient,
    unclaim,
    unclaim_many,
)
from actors.s3.objectstore import Fault, Found, Missing, Poison, Transient
from actors.tracing import span, tracing_enabled
from supervision.db.database import DataProblem
from supervision.jobs import Job

log = structlog.get_logger("finalize_committer")

GROUP = 64
# Up to 50 ms: at the pace of S3 (a few hundred rows/s) a 10 ms window gave groups of
# ~3 rows, and the thread crossing per group was the daemon's largest CPU cost per row
# (bench/cpu_per_row.py: 0.99 -> 0.70 ms of daemon CPU per row from 10 to 50 ms).
GATHER_S = 0.05


class EffectKind(enum.Enum):
    """Which statement a row's outcome ran."""

    AVAILABLE = "available"  # publish-available: transition, event, close
    FAILED = "failed"  # fail-timeout: Failed/Timeout, close
    TRANSIENT = "transient"  # back-off kept (or quarantined at max_attempts)
    QUARANTINED = "quarantined"  # poison or bad data
    DEFERRED = "deferred"  # the breaker opened before its HEAD: given back untouched
    WITHHELD = "withheld"  # Missing without evidence: given back untouched, due again
    # after the hold-off (actors.finalize.holdoff)
    UNCLAIMED = "unclaimed"  # a configuration fault: given back untouched (an unusable
    # Content-Type: due again after the hold-off, like a withheld row)


@attrs.frozen
class Effect:
    """What one row's statement did."""

    kind: EffectKind
    applied: Applied | None = None
    status: AttemptStatus | None = None  # the finalize row's status after it, when written
    reason: str | None = None


def apply_outcome(conn: psycopg.Connection, outcome: RowOutcome, job_run_id: str,
                  max_attempts: int, hold: HoldOff) -> Effect:
    """One row's outcome as one statement (runs in a worker thread)."""
    row, decision = outcome.row, outcome.decision
    if isinstance(decision, Found | Terminal):
        found = None if isinstance(decision, Terminal) else attrs.asdict(decision)
        (applied,) = publish_available(conn, [(row, found)], job_run_id)
        return Effect(EffectKind.AVAILABLE, applied=applied)
    if isinstance(decision, Missing):
        (applied,) = fail_timeout(conn, [row])
        return Effect(EffectKind.FAILED, applied=applied)
    if isinstance(decision, Transient):
        reason = f"s3:{decision.error}"
        status = record_transient(conn, row, reason, max_attempts)
        return Effect(EffectKind.TRANSIENT, status=status, reason=reason)
    if isinstance(decision, Poison | BadRow):
        reason = (decision.reason if isinstance(decision, BadRow)
                  else f"object:{decision.error}")
        done = quarantine(conn, row, reason)
        return Effect(EffectKind.QUARANTINED,
                      status=AttemptStatus.QUARANTINED if done else None, reason=reason)
    unclaim(conn, row, hold.due_again(outcome))
    return given_back(outcome)


def given_back(outcome: RowOutcome) -> Effect:
    """The effect of giving *outcome*'s row back untouched, by why it was."""
    if isinstance(outcome.decision, Withheld):
        return Effect(EffectKind.WITHHELD)
    return Effect(EffectKind.DEFERRED if isinstance(outcome.decision, NotAttempted)
                  else EffectKind.UNCLAIMED)


GivenBack = Withheld | NotAttempted | Fault  # decisions whose rows are given back untouched


@attrs.frozen
class OutcomeGroup:
    """Outcomes of one kind (AVAILABLE, FAILED, or given back: UNCLAIMED) applied together
    by one set-based statement."""

    kind: EffectKind
    outcomes: list[RowOutcome]


def apply_unit(conn: psycopg.Connection, unit: RowOutcome | OutcomeGroup, job_run_id: str,
               max_attempts: int, hold: HoldOff) -> Effect | list[Effect]:
    if isinstance(unit, OutcomeGroup) and unit.kind is EffectKind.AVAILABLE:
        rows = [(o.row, None if isinstance(o.decision, Terminal)
                 else attrs.asdict(o.decision)) for o in unit.outcomes]
        return [Effect(EffectKind.AVAILABLE, applied=a)
                for a in publish_available(conn, rows, job_run_id)]
    if isinstance(unit, OutcomeGroup) and unit.kind is EffectKind.UNCLAIMED:
        unclaim_many(conn, [o.row for o in unit.outcomes],
                     [hold.due_again(o) for o in unit.outcomes])
        return [given_back(o) for o in unit.outcomes]
    if isinstance(unit, OutcomeGroup):
        return [Effect(EffectKind.FAILED, applied=a)
                for a in fail_timeout(conn, [o.row for o in unit.outcomes])]
    return apply_outcome(conn, unit, job_run_id, max_attempts, hold)


def plan_units(group: list[RowOutcome]) -> list[RowOutcome | OutcomeGroup]:
    """The Available rows as one unit, the Missing ones as another, the rows given back
    untouched as a third (each only when more than one), every other outcome a unit of
    its own."""
    available = [o for o in group if isinstance(o.decision, Found | Terminal)]
    missing = [o for o in group if isinstance(o.decision, Missing)]
    back = [o for o in group if isinstance(o.decision, GivenBack)]
    units: list[RowOutcome | OutcomeGroup] = []
    for kind, outcomes in ((EffectKind.AVAILABLE, available), (EffectKind.FAILED, missing),
                           (EffectKind.UNCLAIMED, back)):
        units += [OutcomeGroup(kind, outcomes)] if len(outcomes) > 1 else outcomes
    return units + [o for o in group
                    if not isinstance(o.decision, Found | Terminal | Missing | GivenBack)]


async def run_finalize_committer(
    cycle: FinalizeCycle, inbox: trio.MemoryReceiveChannel[RowOutcome],
    gather_turn: trio.Lock | None = None,
) -> None:
    """Commit outcomes until *inbox* is closed and drained. Committers sharing
    *gather_turn* gather one at a time (one gathers while the others commit)."""
    apply = partial(apply_unit, job_run_id=cycle.job_run_id,
                    max_attempts=cycle.cfg.max_attempts, hold=HoldOff.of(cycle.cfg, cycle.as_of))
    turn = gather_turn or trio.Lock()
    # bound once per cycle: the module's lazy proxy builds a logger on every call (it
    # follows a reload's reconfiguration; this one follows it from the next cycle on)
    clog = log.bind()
    while group := await _gather(inbox, turn):
        pairs = await _commit_group(cycle, apply, group)
        await _account_group(cycle, pairs, clog)


async def _gather(inbox: trio.MemoryReceiveChannel[RowOutcome],
                  turn: trio.Lock) -> list[RowOutcome]:
    """The next group of outcomes ([] once *inbox* is closed and drained). Outcomes trickle
    in at the pace of S3: gather for up to GATHER_S so a thread hop carries a group, not a
    row (bounded delay, bounded size). One committer gathers at a time: two gathering side
    by side split the stream and each group carried half the rows (twice the thread hops
    per row)."""
    async with turn:
        try:
            group = [await inbox.receive()]
        except trio.EndOfChannel:
            return []
        with trio.move_on_after(GATHER_S):
            while len(group) < GROUP:
                try:
                    group.append(await inbox.receive())
                except trio.EndOfChannel:
                    break
    return group


async def _commit_group(cycle: FinalizeCycle, apply: Any, group: list[RowOutcome]
                        ) -> list[tuple[RowOutcome, Effect | DataProblem]]:
    """Each outcome of *group* committed, in units (:func:`plan_units`); a unit that rolled
    back whole on a data problem is committed again row by row."""
    units = plan_units(group)
    results = await cycle.db.atomic_each(apply, units)
    pairs: list[tuple[RowOutcome, Effect | DataProblem]] = []
    retry: list[RowOutcome] = []
    for unit, result in zip(units, results, strict=True):
        if isinstance(unit, OutcomeGroup):
            if isinstance(result, DataProblem):
                retry.extend(unit.outcomes)  # rolled back whole: one by one now
            else:
                assert isinstance(result, list)
                pairs.extend(zip(unit.outcomes, result, strict=True))
        else:
            assert not isinstance(result, list)
            pairs.append((unit, result))
    if retry:
        singles = await cycle.db.atomic_each(apply, retry)
        pairs.extend((o, r) for o, r in zip(retry, singles, strict=True)
                     if not isinstance(r, list))
    return pairs


async def _account_group(cycle: FinalizeCycle,
                         pairs: list[tuple[RowOutcome, Effect | DataProblem]],
                         clog: Any) -> None:
    """Counts and events of the committed rows; the relay woken when one enqueued an
    event; each malformed row quarantined with its reason."""
    malformed = []
    enqueued = False
    for outcome, effect in pairs:
        if isinstance(effect, DataProblem):
            malformed.append((outcome, f"malformed:{effect.error}"))
        else:
            _account(cycle.counts, outcome, effect, clog)
            enqueued |= effect.applied is not None and effect.applied.enqueued
    if enqueued:
        cycle.wake_relay()
    for outcome, reason in malformed:
        clog.error("item_failed", recording_id=outcome.row.recording_id, error=reason)
        if await cycle.db.atomic(quarantine, outcome.row, reason):
            _account(cycle.counts, outcome, Effect(
                EffectKind.QUARANTINED, status=AttemptStatus.QUARANTINED, reason=reason),
                clog)


def _account(counts: FinalizeCounts, outcome: RowOutcome, effect: Effect,
             log: Any = log) -> None:
    """Counts, metrics, the seed's log event and a span for one committed row."""
    if not tracing_enabled():  # no span attributes built per row for nothing
        _account_row(counts, outcome, effect, log)
        return
    row = outcome.row
    with span(f"{Job.RECORDING_FINALIZE}.row", recording_id=row.recording_id, phase=row.phase,
              attempts=row.attempts, tenant_id=row.tenant_id, outcome=effect.kind.value,
              decision=type(outcome.decision).__name__):
        _account_row(counts, outcome, effect, log)


def _account_row(counts: FinalizeCounts, outcome: RowOutcome, effect: Effect,
                 log: Any) -> None:
    row = outcome.row
    applied = effect.applied
    if applied is not None and applied.skipped_locked:
        counts.skipped_locked += 1
        log.info("recording_skipped_locked", recording_id=row.recording_id)
    elif effect.kind is EffectKind.AVAILABLE and applied is not None:
        if applied.transitioned:
            counts.reconciled += 1
            RF_RECONCILED.inc()
            decision = outcome.decision
            log.info("recording_reconciled", recording_id=row.recording_id,
                     session_id=row.session_id, attempts=row.attempts,
                     file_id=decision.file_id if isinstance(decision, Found) else None)
        elif applied.enqueued:
            counts.republished += 1
            RF_REPUBLISHED.inc()
            log.info("recording_republished", recording_id=row.recording_id)
        elif applied.closed:
            log.info("recording_already_terminal", recording_id=row.recording_id)
    elif effect.kind is EffectKind.FAILED and applied is not None:
        if applied.transitioned:
            counts.failed += 1
            RF_FAILED.inc()
            log.warning("recording_failed", recording_id=row.recording_id,
                        failure_reason="Timeout", attempts=row.attempts)
        elif applied.closed:
            log.info("recording_already_terminal", recording_id=row.recording_id)
    elif effect.kind is EffectKind.TRANSIENT:
        RF_TRANSIENT.inc()
        if effect.status is AttemptStatus.QUARANTINED:
            _quarantined(counts, row.recording_id, row.attempts, effect.reason, log)
        elif effect.status is AttemptStatus.PENDING:
            counts.transient += 1
            log.info("recording_retry_scheduled", recording_id=row.recording_id,
                     attempts=row.attempts, error=effect.reason)
    elif effect.kind is EffectKind.QUARANTINED:
        if effect.status is AttemptStatus.QUARANTINED:
            _quarantined(counts, row.recording_id, row.attempts, effect.reason, log)
    elif effect.kind is EffectKind.DEFERRED:
        counts.deferred += 1
    elif effect.kind is EffectKind.WITHHELD:
        counts.withheld += 1
        RF_VERDICTS_WITHHELD.inc()
    elif effect.kind is EffectKind.UNCLAIMED:
        counts.config_fault += 1
    else:  # pragma: no cover - every kind is handled above
        raise AssertionError(effect.kind)


def _quarantined(counts: FinalizeCounts, recording_id: str, attempts: int,
                 reason: str | None, log: Any = log) -> None:
    counts.quarantined += 1
    RF_QUARANTINED.inc()
    log.error("recording_quarantined", recording_id=recording_id, attempts=attempts,
              reason=reason)

