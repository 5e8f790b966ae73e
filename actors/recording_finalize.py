"""One cycle of the recording-finalize job (seed: RecordingFinalizeRetryJob).

>>> counts = await run_finalize_cycle(job, CycleContext("recording-finalize", run_id))

Runs inside the lock keeper's scope while it holds the job's advisory lock:

    probe bucket + object path + objects known to exist ──fault──▶ readiness 503, alert,
         │ transient ─▶ breaker open: claim only rows that need no HEAD      claim nothing
         ▼
    claimer ──ClaimedRow──▶ S3 reconciler pool (2 x s3.concurrency) ──RowOutcome──▶ committers
      (claims of batch_size rows, the next one while the pool works the last)
        └──────────────RowOutcome (terminal, poison)───────────────────────────▶

After a green probe, rows quarantined for an object-storage failure are requeued once S3
has been healthy for ``redrive_after`` (:mod:`actors.finalize_redrive`, one batch per
cycle, claimed by this same cycle); what the cycle saw of S3 is recorded at the probe and
after the pipeline. AsOf is the database clock, read once. The claimer ends the pipeline
when nothing is due, at ``max_run_duration``, or when the breaker opens; closing its
channels drains the pool and then the committers, so the cycle returns only after every
claimed row has been committed (or, when cancelled, each row committed or rolled back
whole). At most ``max_failed_per_cycle`` Missing verdicts are given per cycle; past that
the claimer stops and later Missing rows are given back untouched (``withheld``, alert).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs
import structlog
import trio

from actors.cycle_frame import RunStatus, cycle_frame
from actors.finalize_canary import check_known_present
from actors.finalize_claimer import run_finalize_claimer
from actors.finalize_committer import run_finalize_committer
from actors.finalize_messages import ClaimedRow, RowOutcome
from actors.finalize_redrive import observe_s3, redrive_quarantined
from actors.finalize_state import Breaker, FinalizeCounts, VerdictBudget
from actors.finalize_store import db_now
from actors.gauge_refresher import refresh_finalize
from actors.lock_keeper import CycleContext
from actors.s3.objectstore import Fault, Found, ObjectStore, Transient
from actors.s3_reconciler import pool_size, run_s3_reconciler
from supervision.config import RecordingFinalizeConfig
from supervision.database import Database
from supervision.health import HEALTH
from supervision.metrics import (
    RF_CYCLE_DURATION,
    RF_RUNS,
    S3_BREAKER_OPEN,
)
from supervision.wakeup import no_wakeup

log = structlog.get_logger("recording_finalize")
JOB = "recording-finalize"


@attrs.frozen
class FinalizeJob:
    cfg: RecordingFinalizeConfig
    concurrency: int
    db: Database
    store: ObjectStore
    wake_relay: Callable[[], None] = no_wakeup
    breaker_threshold: int = 5
    committers: int = 2


async def run_finalize_cycle(job: FinalizeJob, ctx: CycleContext) -> FinalizeCounts:
    """Drain what is due now; return the cycle's counts."""
    if ctx.fence is not None:  # writes commit only under the lease's term
        job = attrs.evolve(job, db=job.db.fenced(ctx.fence))
    counts = FinalizeCounts()
    async with cycle_frame(JOB, ctx.job_run_id, counts, log, RF_RUNS, RF_CYCLE_DURATION,
                           after=partial(refresh_gauges, job.db)) as frame:
        deadline = trio.current_time() + job.cfg.max_run_duration
        as_of = await job.db.run(db_now)
        log.info("cycle_started", as_of=as_of.isoformat())
        probe = await job.store.probe()
        if isinstance(probe, Found):
            probe = await check_known_present(job.db, job.store)
        breaker = Breaker(job.breaker_threshold)
        budget = VerdictBudget(job.cfg.max_failed_per_cycle)
        if isinstance(probe, Fault):
            HEALTH.set_fault("s3", probe.error)
            log.error("config_fault", component="s3", error=probe.error)
            frame.status = RunStatus.CONFIG_FAULT
            await observe_s3(job.db, job.cfg, healthy=False)
            return counts
        HEALTH.clear_fault("s3")
        s3_down = isinstance(probe, Transient)
        if isinstance(probe, Transient):
            log.warning("s3_unavailable", error=probe.error)
        S3_BREAKER_OPEN.set(1 if s3_down else 0)
        if await observe_s3(job.db, job.cfg, healthy=not s3_down):
            await redrive_quarantined(job.db, job.cfg, as_of, counts)

        pool, size = pool_size(job.concurrency), job.cfg.batch_size
        # a whole claim fits in the pool's queue: the next claim runs while it is worked
        rows_send, rows_recv = trio.open_memory_channel[ClaimedRow](size)
        outcomes_send, outcomes_recv = trio.open_memory_channel[RowOutcome](
            job.cfg.batch_size)
        # the originals close right after the spawns: only the workers' clones stay open
        gather_turn = trio.Lock()  # committers gather in turn, commit side by side
        async with trio.open_nursery() as nursery, rows_recv, outcomes_recv:
            for _ in range(job.committers):
                nursery.start_soon(partial(
                    run_finalize_committer, job.db, job.cfg, ctx.job_run_id, counts,
                    outcomes_recv.clone(), job.wake_relay, gather_turn))
            for _ in range(pool):
                nursery.start_soon(run_s3_reconciler, job.store, breaker, budget,
                                   rows_recv.clone(), outcomes_send.clone())
            nursery.start_soon(partial(
                run_finalize_claimer, job.db, job.cfg, as_of, deadline, breaker, budget,
                counts, s3_down, rows_send, outcomes_send, size))
        if breaker.fault is not None:
            HEALTH.set_fault("s3", breaker.fault)
            log.error("config_fault", component="s3", error=breaker.fault)
        elif breaker.open and not s3_down:
            log.warning("s3_breaker_opened", consecutive_transient=breaker.threshold)
        await observe_s3(job.db, job.cfg, healthy=not s3_down and breaker.healthy)
        if budget.withheld:
            log.error("missing_verdicts_withheld", failed=budget.missing,
                      withheld=budget.withheld, limit=budget.limit)
    return counts


async def refresh_gauges(db: Database) -> None:
    """Backlog and oldest age right after a cycle (the refresher keeps them current)."""
    await db.run(refresh_finalize)
