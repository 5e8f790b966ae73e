"""One cycle of the conference-reaper job (seed: ConferenceRoomReaperJob).

>>> job = ReaperJob(cfg.jobs.conference_reaper, cfg.media, db, http, wake_relay)
>>> counts = await run_reaper_cycle(job, CycleContext(Job.CONFERENCE_REAPER, run_id))

Runs inside the lock keeper's scope while it holds the job's advisory lock:

    AsOf = SELECT now()          (once per cycle: the database clock, never the host's)
    empty-room ─▶ provision-timeout ─▶ stale-live      one transaction per phase
        │ then: StopRecording per running recorder of the rooms closed (and committed)
        ▼
    recorder-signal sender (≤ 8 concurrent POSTs, each ≤ media.timeout, all of them
    ≤ 1.5 x media.timeout) ─▶ media stack

The stops go out after the last phase rather than between phases: their HTTP work would
otherwise compete for the interpreter with the phases' transactions (measured in the
bench: it stretched each phase), and the whole fan-out then has one simple bound.

Each phase claims at most ``batch_size`` due conferences through ``ix_conf_active`` with
``FOR UPDATE SKIP LOCKED`` and, in the same transaction, makes them terminal and writes
their ``conference-ended`` outbox row (not for Provisioning → Failed) and realtime row; a
conference a phase made terminal is out of every later phase (status guard). Backlog
beyond ``batch_size`` is taken by the next cycles.

Set-based, with a per-row fallback: a phase is two statements (the claim, then one
data-modifying CTE for the whole batch: transitions, payloads built in SQL with the
participants and recordings, outbox and realtime rows), so a batch costs a handful of
round trips whatever its size; ``bench/conference_reaper.py`` measures it against the
plain SQL of the same writes. The batch statement runs in a SAVEPOINT; if it fails on the
data of some row, the savepoint rolls back and every claimed conference is retried on its
own in its own SAVEPOINT — the slow path only for a batch that holds a poison row.

Poison: a conference the guard rejects — an Active room with ``started_at`` after AsOf
(its duration would be negative: a writer's clock ran ahead) — or whose outcome cannot
be written — e.g. a ``started_at`` of 0001-01-01 (a default ``DateTimeOffset`` leaked by a
writer), whose duration does not fit ``duration_seconds``. Either is logged
(``item_failed``), counted (``errors``, ``messenger_conf_reaper_errors_total``), left
active, and remembered with its reason in ``safetynet.conference_poison`` (same
transaction): the claims pass over it for ``polling_interval x 2^failures`` (at most
``poison_backoff_cap``), and a full batch that held poison is claimed again at once, so
poison never starves a phase. ``safetynet status`` lists it, ``safetynet requeue
<conference id>`` releases it (retried next cycle); the rest of the batch commits. Infrastructure
failure rolls the phase's batch back whole and ends the cycle with the error (stops for
the batches committed before it are still sent).

Observability: ``cycle_started`` / ``batch_selected`` / ``conference_reaped`` /
``item_failed`` / ``cycle_completed`` with the seed's fields, the
``messenger_conf_reaper_*`` metrics, and spans: ``conference-reaper.cycle`` >
``conference-reaper.batch`` (per phase) > ``conference-reaper.item`` (per conference,
recorded after its commit). A phase's logs, counts and item spans are produced in a task
that overlaps the next phase's transaction.

What cancellation does: the phase in flight commits or rolls back whole
(``Database.atomic`` is a must-complete block; a hard stop makes PostgreSQL roll it back),
later phases do not start, row locks end with their transaction. Stop signals still in
flight are dropped (best-effort; recording-finalize is the safety net for recordings).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs
import httpx
import structlog
import trio

from actors.cycle_frame import cycle_frame
from actors.envelope import db_now
from actors.leases.lock_keeper import CycleContext
from actors.reaper.messages import PHASES, PhaseResult, StopRecording
from actors.reaper.metrics import (
    CR_ACTIVE_BACKLOG,
    CR_CYCLE_DURATION,
    CR_ERRORS,
    CR_ITEMS,
    CR_POISONED,
    CR_RUNS,
    CR_SKIP_LOCKED,
)
from actors.reaper.recorder_signal import RecorderSignal, run_recorder_signal
from actors.reaper.settings import ConferenceReaperConfig
from actors.reaper.store import active_backlog, poisoned_count, prune_poison, reap_phase
from actors.tracing import span
from supervision.config import MediaConfig
from supervision.db.database import Database
from supervision.jobs import Job
from supervision.tree.wakeup import no_wakeup

log = structlog.get_logger("conference_reaper")
JOB = Job.CONFERENCE_REAPER


@attrs.define
class ReaperCounts:
    """SPEC §7's run-once JSON for conference-reaper."""

    empty_timeout: int = 0
    provision_failed: int = 0
    stale_timeout: int = 0
    skipped_locked: int = 0
    errors: int = 0
    duration_ms: int = 0

    def as_json(self) -> dict[str, int]:
        return attrs.asdict(self)


@attrs.frozen
class ReaperJob:
    cfg: ConferenceReaperConfig
    media: MediaConfig
    db: Database
    http: httpx.AsyncClient  # see actors.reaper.recorder_signal.open_media_client
    wake_relay: Callable[[], None] = no_wakeup
    stop_concurrency: int = 8


async def run_reaper_cycle(job: ReaperJob, ctx: CycleContext) -> ReaperCounts:
    """Run the three phases once; return the cycle's counts."""
    if ctx.fence is not None:  # writes commit only under the lease's term
        job = attrs.evolve(job, db=job.db.fenced(ctx.fence))
    counts = ReaperCounts()
    async with cycle_frame(JOB, ctx.job_run_id, counts, log, CR_RUNS,
                           CR_CYCLE_DURATION, after=partial(refresh_backlog, job.db, job.cfg)):
        deadline = trio.current_time() + job.cfg.max_run_duration
        as_of = await job.db.run(db_now)
        log.info("cycle_started", as_of=as_of.isoformat())
        await job.db.run(prune_poison)
        stops: list[StopRecording] = []
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            try:
                pending = list(PHASES)
                while pending:
                    phase = pending[0]
                    # A stop requested during the previous batch (which the shield let
                    # commit) is honoured here, before the next storage access.
                    await trio.lowlevel.checkpoint_if_cancelled()
                    if trio.current_time() >= deadline:
                        log.warning("cycle_deadline_reached", phase=phase.name)
                        break
                    with span(f"{JOB}.batch", phase=phase.name) as batch:
                        result = await job.db.atomic(reap_phase, phase, job.cfg, as_of,
                                                     ctx.job_run_id)
                        batch.set_attributes({
                            "claimed": result.claimed, "reaped": len(result.reaped),
                            "failed": len(result.failed), "fallback": result.fallback,
                            "skipped_locked": result.skipped_locked})
                        if result.enqueued:
                            job.wake_relay()
                        # logs, counts and item spans overlap the next phase's transaction
                        # (the task has no checkpoint: it runs whole even if cancelled)
                        nursery.start_soon(_report, result, counts)
                    stops.extend(StopRecording(recording_id, reaped.conference_id)
                                 for reaped in result.reaped
                                 for recording_id in reaped.active_recordings)
                    if not _claim_again(result, job.cfg.batch_size):
                        pending.pop(0)
            except Exception as exc:  # batches already committed still get their stops
                failure = exc
        if stops:
            await _signal_recorders(job, stops)
        if failure is not None:
            raise failure
    return counts


def _claim_again(result: PhaseResult, batch_size: int) -> bool:
    """A full batch that held poison: the phase claims again at once. The poison it just
    remembered is out of the claim now, so poison costs its phase a round trip, not a
    cycle; every repeat remembers at least one more, and the deadline bounds it too."""
    return bool(result.failed) and result.claimed >= batch_size


async def _signal_recorders(job: ReaperJob, stops: list[StopRecording]) -> None:
    """The stop fan-out, once the phases are done (so it never competes with their
    transactions): at most ``stop_concurrency`` at a time, 1.5 x ``media.timeout`` in all."""
    send, receive = trio.open_memory_channel[StopRecording](len(stops))
    async with send:
        for request in stops:
            send.send_nowait(request)
    await run_recorder_signal(RecorderSignal(job.media, job.http), receive,
                                concurrency=job.stop_concurrency)


async def _report(result: PhaseResult, counts: ReaperCounts) -> None:
    phase = result.phase
    counts.skipped_locked += result.skipped_locked
    CR_SKIP_LOCKED.inc(result.skipped_locked)
    if result.claimed or result.skipped_locked:
        log.info("batch_selected", phase=phase.name, count=result.claimed,
                 skipped_locked=result.skipped_locked, fallback=result.fallback)
    setattr(counts, phase.outcome, getattr(counts, phase.outcome) + len(result.reaped))
    CR_ITEMS.labels(outcome=phase.outcome).inc(len(result.reaped))
    for item in result.reaped:
        with span(f"{JOB}.item", conference_id=item.conference_id,
                  phase=phase.name, tenant_id=item.tenant_id, outcome=phase.outcome):
            log.info("conference_reaped", phase=phase.name, conference_id=item.conference_id,
                     chat_id=item.chat_id, deal_id=item.deal_id, status=item.status,
                     end_reason=item.end_reason, duration_seconds=item.duration_seconds)
    for failed in result.failed:
        counts.errors += 1
        CR_ERRORS.inc()
        with span(f"{JOB}.item", conference_id=failed.conference_id,
                  phase=phase.name, tenant_id=failed.tenant_id, outcome="item_failed",
                  error=failed.error):
            log.error("item_failed", phase=phase.name, conference_id=failed.conference_id,
                      error=failed.error)


async def refresh_backlog(db: Database, cfg: ConferenceReaperConfig) -> None:
    """``messenger_conf_reaper_active_backlog`` and ``safetynet_conf_reaper_poisoned``,
    from two cheap queries."""
    try:
        backlog = await db.run(active_backlog, cfg)
        poisoned = await db.run(poisoned_count)
    except Exception:  # a gauge refresh must never fail a cycle
        return
    CR_ACTIVE_BACKLOG.set(backlog)
    CR_POISONED.set(poisoned)
