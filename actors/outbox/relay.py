"""The outbox relay: ``messenger.integration_outbox`` → Kafka, at least once, per-key order.

>>> counts = await run_relay_cycle(relay, CycleContext(Job.OUTBOX_RELAY, run_id))

Runs as a lock-keeper job (one publishing relay per fleet; a second daemon stands by),
woken in-process by the committers right after a commit, by PostgreSQL ``NOTIFY`` for
other writers (:mod:`actors.outbox.listener`), and at worst every ``poll_interval``.

A cycle connects the producer (:func:`actors.outbox.publisher.connect`: a refused
connection is a configuration fault, an unreachable broker a back-off), then drains
through a pipeline of actors over bounded memory channels, so the database work overlaps
the broker's. Each actor takes the cycle's one frozen context
(:class:`~actors.outbox.cycle.RelayCycle`: the fenced database, the configuration, the
producer, the deadline) and its own channel ends; the one mutable object they share is
the cycle's ledger (rows in hand, ids claimed and not marked, counts), each part with one
writer per direction:

    claimer ──Claim──▶ publisher ──Answered──▶ marker      published_at, attempts
      ▲ room              │ waves ≤ 1 row/key
      └── InHand ◀────────┤ (send_wave: one crossing)
                          └──DeadLetter──▶ dead letters  outbox_dead_letters

* :mod:`~actors.outbox.claimer` claims size-first batches in id order while the rows in
  hand leave room (about two claims), the next one while a wave is on the wire;
* :mod:`~actors.outbox.publisher` sends per-key waves through the producer and sorts the
  answers (acknowledged, transient, rejected, a configuration fault of a topic);
* :mod:`~actors.outbox.marker` marks acknowledged rows published, and records transient
  failures, behind the waves still going out;
* :mod:`~actors.outbox.dead_letters` is the one path by which a row leaves unpublished.

The claimer closes its channel when a claim comes back empty; the publisher then sends
what it holds and closes its own, and the marker and the dead letters finish what was
handed to them: the cycle returns once every acknowledged row is marked. At the run's
time bound, or when Kafka is down, the publisher stops and the claimer is cancelled (its
claim in flight rolls back). Every write runs under the lease's fence. After the
pipeline, retention (:mod:`actors.outbox.retention`) runs every ``retention_every``.

Inputs: the database, the producer, the relay's state. Outputs: Kafka messages with the
SPEC §4 headers, ``published_at``/``publish_attempts``/``last_error``, dead letters,
metrics, readiness. Restart type: none of its own — the lock keeper runs it per tick.
What cancellation does: a wave in flight is abandoned un-marked; those rows are sent
again later with the same ``event-id`` (at least once). Marking the acknowledged rows
must complete (after a hard stop they too are sent again).
"""

from __future__ import annotations

import math
from functools import partial

import attrs
import psycopg
import structlog
import trio

from actors.cycle_frame import cycle_frame
from actors.leases.lock_keeper import (
    CycleContext,
    CycleOutcome,
    CycleStatus,
    LockConnection,
    LockedJob,
    run_locked_cycle,
)
from actors.outbox.claimer import run_claimer
from actors.outbox.cycle import CycleLedger, RelayCycle
from actors.outbox.dead_letters import run_cycle_dead_letters
from actors.outbox.handover import enter_table
from actors.outbox.job import RelayJob
from actors.outbox.logical import run_logical_pipeline, source_of
from actors.outbox.marker import run_marker
from actors.outbox.messages import Answered, Claim, DeadLetter
from actors.outbox.publisher import connect, report_health, run_cycle_publisher
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.retention import RETENTION_BATCHES, apply_retention
from actors.outbox.slot_io import slot_idle
from actors.outbox.state import RelayCounts
from actors.outbox.window import Window
from supervision.db.database import pipelined
from supervision.errors import ConfigurationFault, InfrastructureError
from supervision.jobs import Job

__all__ = ["RelayCounts", "RelayJob", "relay_idle", "run_relay_cycle",
           "run_relay_until_drained"]

log = structlog.get_logger("outbox_relay")

ANSWERS_QUEUE = 16  # waves answered and not marked yet, before the publisher waits
DEAD_LETTERS_QUEUE = 64  # rows handed to the dead letters, before the publisher waits
IDLE_WAL_BYTES = 16 * 1024 * 1024  # logical source: WAL the slot may hold back while idle


async def run_relay_cycle(job: RelayJob, ctx: CycleContext) -> RelayCounts:
    """Publish until nothing publishable is left (or the run's time bound)."""
    if ctx.fence is not None:  # writes commit only under the lease's term
        job = attrs.evolve(job, db=job.db.fenced(ctx.fence))
    counts = RelayCounts()
    # the relay runs at every wake-up: only cycles that sent something are logged
    async with cycle_frame(Job.OUTBOX_RELAY, ctx.job_run_id, counts, log,
                           log_if=lambda: bool(counts.published or counts.failed)):
        try:
            deadline = trio.current_time() + job.max_run_duration
            if await connect(job.producer, job.state):
                if job.cfg.source == "logical":
                    await run_logical_pipeline(job, counts, deadline, _run_pipeline)
                else:
                    await enter_table(job)  # after the logical source: what it passed
                    await _run_pipeline(job, counts, deadline)
        finally:
            report_health(job.state)
    if trio.current_time() >= job.state.retention_due_at:
        if not job.cfg.retention_enabled:  # the messenger owns its outbox's retention
            job.state.retention_due_at = math.inf
        else:
            job.state.retention_due_at = trio.current_time() + job.retention_every
            if (await apply_retention(job.db, job.cfg, job.retention_batch)
                    >= RETENTION_BATCHES * job.retention_batch):
                # a backlog past retention: the next cycle goes on with it, so deletes keep
                # up with any insert rate the relay itself keeps up with
                job.state.retention_due_at = trio.current_time()
    return counts


async def _run_pipeline(job: RelayJob, counts: RelayCounts, deadline: float) -> None:
    """Claimer → publisher → marker and dead letters, until the publisher is done."""
    ledger = CycleLedger.for_config(job.cfg, counts)
    cycle = RelayCycle(job.db, job.cfg, job.producer, job.state, deadline,
                       job.max_row_bytes, ledger)
    claims_send, claims_recv = trio.open_memory_channel[Claim](0)
    answers_send, answers_recv = trio.open_memory_channel[Answered](ANSWERS_QUEUE)
    letters_send, letters_recv = trio.open_memory_channel[DeadLetter](DEAD_LETTERS_QUEUE)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_marker, cycle, answers_recv)
        nursery.start_soon(run_cycle_dead_letters, cycle, letters_recv)
        async with trio.open_nursery() as feed:
            feed.start_soon(run_claimer, cycle, claims_send)
            await run_cycle_publisher(cycle, Window(ledger.in_hand), claims_recv,
                                      answers_send, letters_send)
            feed.cancel_scope.cancel()  # the claimer stops with the publisher


async def run_relay_until_drained(
    job: RelayJob, locked: LockedJob[RelayCounts], lock: LockConnection
) -> CycleOutcome[RelayCounts]:
    """``safetynet run-once --job outbox-relay``: relay cycles under the relay's lock until
    a cycle publishes nothing; the summed counts. Kafka unreachable is an
    :class:`InfrastructureError` and a topic held by a configuration fault a
    :class:`ConfigurationFault` (rows stay unpublished), never an empty success."""
    locked = attrs.evolve(locked, cycle=partial(run_relay_cycle, job), idle=None)
    total = RelayCounts()
    while True:
        outcome = await run_locked_cycle(locked, lock)
        if outcome.status != CycleStatus.RAN or outcome.result is None:
            return outcome
        total.add(outcome.result)
        if job.state.connection_fault is not None:
            raise ConfigurationFault(f"kafka: {job.state.connection_fault}; rows stay "
                                     "unpublished")
        if job.state.kafka_failures:
            raise InfrastructureError("kafka: unreachable; rows stay unpublished")
        if outcome.result.published == 0:
            fault = job.state.fault_reason()
            if fault is not None:
                raise ConfigurationFault(f"kafka: {fault}; their rows stay unpublished")
            return CycleOutcome(CycleStatus.RAN, outcome.job_run_id, total)


@pipelined
def has_publishable(conn: psycopg.Connection) -> bool:
    row = conn.execute(OUTBOX_QUERIES["outbox_has_publishable"]).fetchone()
    return bool(row and row[0])


async def relay_idle(job: RelayJob) -> bool:
    """The relay's idle probe (:attr:`LockedJob.idle`): True when a cycle would have
    nothing to do — the producer is started, retention is not due, and no row waits to
    be published (one unlocked read on the pool, no lease). In the logical source: no
    event read and unsettled, how far the slot passed recorded (a cycle that published
    records it at most every ``RECORD_EVERY`` seconds: one quiet cycle more records it,
    or the auditor and ``status`` would count the last events as unpublished while the
    outbox is idle), no outbox id above the highest one read, and the slot holds back
    less than :data:`IDLE_WAL_BYTES` of WAL (past that a cycle moves it)."""
    if not job.producer.started or trio.current_time() >= job.state.retention_due_at:
        return False
    if job.cfg.source == "logical":
        progress = job.state.slot
        if progress.settled or progress.open_events:
            return False
        if progress.passed_xid is not None and progress.passed_xid != progress.recorded_xid:
            return False
        return bool(await job.db.run(slot_idle, source_of(job.cfg), progress.max_id,
                                     IDLE_WAL_BYTES))
    return not await job.db.run(has_publishable)
