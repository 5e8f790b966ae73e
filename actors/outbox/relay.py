"""The outbox relay: ``messenger.integration_outbox`` → Kafka, at least once, per-key order.

>>> counts = await run_relay_cycle(relay, CycleContext("outbox-relay", run_id))

Runs as a lock-keeper job (one publishing relay per fleet; a second daemon stands by),
woken in-process by the committers right after a commit, by PostgreSQL ``NOTIFY`` for
other writers (:mod:`actors.outbox.listener`), and at worst every ``poll_interval``.

A cycle drains: claim the next unpublished rows in id order (short transaction, ``SKIP
LOCKED``), send them in *waves* — each wave holds at most one row per key, so a later row
of a key is never sent before an earlier one was acknowledged — and mark ``published_at``
only for rows the broker acknowledged. The database work overlaps the broker's: the next
claim runs while a wave is on the wire, and acknowledged rows are marked while the next
waves go out. A row that failed transiently keeps its place: it
and every later row of its key wait for a back-off. A row rejected permanently (too large,
invalid topic) or malformed (``payload``/``headers`` not what :mod:`actors.outbox.rows`
accepts) is dead-lettered and logged with its id and reason; it blocks its key only when
later rows of that key were already waiting (then ``safetynet_outbox_blocked_keys``
alerts). When Kafka itself is unreachable, nothing is marked, the relay backs off with
jitter, readiness stays 200 and ``safetynet_outbox_oldest_unpublished_age_seconds`` grows.
When the broker refuses *us* — the connection (an untrusted certificate, rejected SASL
credentials: :mod:`actors.kafka.security`) or a topic (authorization, the topic does not
exist) — that is a configuration fault: no row is dead-lettered or charged an attempt, the
rows wait (all of them, or that topic's out of the claim) with back-off, readiness is 503
(``safetynet_config_fault{component="kafka"}`` alerts) and publishing resumes by itself
once a retry succeeds.

Inputs: the database, the producer, the relay's state. Outputs: Kafka messages with the
SPEC §4 headers, ``published_at``/``publish_attempts``/``last_error``, metrics.
What cancellation does: a wave in flight is abandoned un-marked; those rows are sent again
later with the same ``event-id`` (at least once). Marking the acknowledged rows must
complete (after a hard stop they too are sent again).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import attrs
import psycopg
import structlog
import trio

from actors.cycle_frame import cycle_frame
from actors.kafka.producer import MAX_REQUEST_SIZE, Delivery, KafkaProducer, SendResult
from actors.leases.lock_keeper import (
    CycleContext,
    CycleOutcome,
    CycleStatus,
    LockConnection,
    LockedJob,
    run_locked_cycle,
)
from actors.outbox.metrics import OUTBOX_DEAD_LETTERED, OUTBOX_PUBLISH_FAILED, OUTBOX_PUBLISHED
from actors.outbox.queries import OUTBOX_QUERIES
from actors.outbox.rows import Key, Malformed, Row, next_wave, parse_claimed
from actors.outbox.state import RelayState, backoff
from supervision.config import OutboxRelayConfig
from supervision.database import Database, pipelined
from supervision.errors import ConfigurationFault, InfrastructureError
from supervision.health import HEALTH
from supervision.shielding import must_complete

log = structlog.get_logger("outbox_relay")


@attrs.define
class RelayCounts:
    published: int = 0
    failed: int = 0
    duration_ms: int = 0

    def as_json(self) -> dict[str, int]:
        return attrs.asdict(self)

    def add(self, other: RelayCounts) -> None:
        self.published += other.published
        self.failed += other.failed
        self.duration_ms += other.duration_ms


RETENTION_BATCHES = 20  # retention batches per cycle at most


@attrs.frozen
class RelayJob:
    cfg: OutboxRelayConfig
    db: Database
    producer: KafkaProducer
    state: RelayState = attrs.field(factory=RelayState)
    max_run_duration: float = 30.0
    retention_every: float = 300.0  # how often published rows past retention are deleted
    retention_batch: int = 1000
    max_row_bytes: int = MAX_REQUEST_SIZE  # a larger row is dead-lettered unread


MAX_ROW_BYTES = MAX_REQUEST_SIZE  # the producer's: no larger row is ever sent


@attrs.frozen
class Claim:
    """What one claim took: its rows in id order (up to the byte cap), and how many rows
    it locked before the cap (more than ``len(rows)``: the cap cut it, more are waiting)."""

    rows: list[Row | Malformed]
    locked: int


@pipelined
def claim_batch(conn: psycopg.Connection, batch_size: int,
                held_topics: Sequence[str] = (), after_id: int = 0,
                skip: Sequence[int] = (), *, max_bytes: int = 16 * 1024 * 1024,
                max_row_bytes: int = MAX_ROW_BYTES) -> Claim:
    """The next rows to send: at most *batch_size*, their payloads together at most about
    *max_bytes* (the first row always comes); a row over *max_row_bytes* comes without
    its payload, as :class:`Malformed` (dead-lettered unread)."""
    records = conn.execute(OUTBOX_QUERIES["outbox_claim_batch"],
                           {"batch_size": batch_size, "held_topics": list(held_topics),
                            "after_id": after_id, "skip": list(skip),
                            "max_bytes": max_bytes, "max_row_bytes": max_row_bytes}
                           ).fetchall()
    locked = int(records[0][-1]) if records else 0
    return Claim([parse_claimed(rec, max_row_bytes) for rec in records], locked)


@pipelined
def mark_published(conn: psycopg.Connection, ids: list[int]) -> None:
    conn.execute(OUTBOX_QUERIES["outbox_mark_published"], {"ids": ids})


def mark_failed(conn: psycopg.Connection, ids: list[int], error: str) -> None:
    conn.execute(OUTBOX_QUERIES["outbox_mark_failed"], {"ids": ids, "last_error": error[:512]})


def dead_letter(conn: psycopg.Connection, outbox_id: int, reason: str) -> bool:
    """Dead-letter the row; True when it now blocks later rows of its key."""
    rec = conn.execute(OUTBOX_QUERIES["outbox_dead_letter"],
                       {"id": outbox_id, "reason": reason[:512]}).fetchone()
    return bool(rec and rec[0])


async def run_relay_cycle(job: RelayJob, ctx: CycleContext) -> RelayCounts:
    """Publish until nothing publishable is left (or the run's time bound)."""
    if ctx.fence is not None:  # writes commit only under the lease's term
        job = attrs.evolve(job, db=job.db.fenced(ctx.fence))
    counts = RelayCounts()
    # the relay runs at every wake-up: only cycles that sent something are logged
    async with cycle_frame("outbox-relay", ctx.job_run_id, counts, log,
                           log_if=lambda: bool(counts.published or counts.failed)):
        try:
            await _drain(job, counts)
        finally:
            _report_health(job.state)
    if trio.current_time() >= job.state.retention_due_at:
        if not job.cfg.retention_enabled:  # the messenger owns its outbox's retention
            job.state.retention_due_at = math.inf
        else:
            job.state.retention_due_at = trio.current_time() + job.retention_every
            if await apply_retention(job) >= RETENTION_BATCHES * job.retention_batch:
                # a backlog past retention: the next cycle goes on with it, so deletes keep
                # up with any insert rate the relay itself keeps up with
                job.state.retention_due_at = trio.current_time()
    return counts


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
    be published (one unlocked read on the pool, no lease)."""
    if not job.producer.started or trio.current_time() >= job.state.retention_due_at:
        return False
    return not await job.db.run(has_publishable)


def delete_published(conn: psycopg.Connection, retention: float, limit: int) -> int:
    return conn.execute(OUTBOX_QUERIES["outbox_delete_published_before"],
                        {"retention": retention, "limit": limit}).rowcount


def purge_dead_letters(conn: psycopg.Connection, retention: float, limit: int) -> list[int]:
    """Delete up to *limit* dead letters older than *retention* seconds with their outbox
    rows (not those that still block later rows of their key); the purged ids."""
    return [int(r[0]) for r in conn.execute(OUTBOX_QUERIES["outbox_dead_letters_purge"], {
        "retention": retention, "limit": limit}).fetchall()]


async def apply_retention(job: RelayJob, max_batches: int = RETENTION_BATCHES) -> int:
    """Delete published rows older than ``outbox_relay.retention``, and dead letters older
    than ``outbox_relay.dead_letter_retention`` with their rows, a small batch per
    transaction (short locks, bounded WAL), at most *max_batches* of each per call."""
    deleted = purged = 0
    for _ in range(max_batches):
        n = await job.db.atomic(delete_published, job.cfg.retention, job.retention_batch)
        deleted += n
        if n < job.retention_batch:
            break
    for _ in range(max_batches):
        ids = await job.db.atomic(purge_dead_letters, job.cfg.dead_letter_retention,
                                  job.retention_batch)
        purged += len(ids)
        if len(ids) < job.retention_batch:
            break
    if deleted:
        log.info("outbox_retention_deleted", rows=deleted,
                 retention_s=job.cfg.retention)
    if purged:
        log.info("outbox_dead_letters_purged", rows=purged,
                 retention_s=job.cfg.dead_letter_retention)
    return deleted + purged


async def _drain(job: RelayJob, counts: RelayCounts) -> None:
    started = trio.current_time()
    state = job.state
    if trio.current_time() < state.kafka_retry_at:
        return
    if not job.producer.started:
        try:
            await job.producer.start()
        except ConfigurationFault as exc:  # TLS or SASL refused: the operator must act
            _connection_fault(state, str(exc))
            return
        except Exception as exc:  # broker unreachable: back off, never crash-loop
            # a refusal seen before stays until a connection succeeds (no flapping)
            _kafka_down(state, type(exc).__name__)
            return
        state.connection_fault, state.kafka_failures = None, 0
    try:
        async with trio.open_nursery() as nursery:
            await _Drain(job, counts, nursery).run(started)
    except BaseExceptionGroup as group:  # one failure: raise it as it is
        leaves = group.exceptions
        if len(leaves) == 1 and not isinstance(leaves[0], BaseExceptionGroup):
            raise leaves[0] from None
        raise


@attrs.define
class _Drain:
    """One cycle's drain. The next claim runs while the waves of the rows already claimed
    are sent, and acknowledged rows are marked while the next waves go out, so the
    database round trips overlap the broker's. Per-key order holds: a wave is formed
    only after the previous one was answered, from the rows of the window (claimed, not
    sent) in id order, at most one per key; a key with a row not acknowledged in this
    cycle is held, and its later rows wait for a later cycle. The drain ends when a claim
    finds nothing and every claimed row was sent (or at the run's time bound)."""

    job: RelayJob
    counts: RelayCounts
    nursery: trio.Nursery
    window: list[Row] = attrs.field(factory=list)  # claimed, not sent yet, in id order
    held: set[Key] = attrs.field(factory=set)
    faulted: set[str] = attrs.field(factory=set)  # topics refused in this cycle
    after_id: int = 0  # the last id claimed in this cycle
    full: bool = False  # the last claim was full: a backlog, claim after after_id
    unsettled: set[int] = attrs.field(factory=set)  # claimed in this cycle, not marked
    claimed: bool = False  # the last claim returned rows: claim again (a trickle goes on)
    claiming: trio.Event | None = None  # set when the claim in flight is done
    claimed_ids: set[int] = attrs.field(factory=set)
    claimed_topics: set[str] = attrs.field(factory=set)
    unmarked: list[int] = attrs.field(factory=list)  # acknowledged, not marked yet
    marking: bool = False

    async def run(self, started: float) -> None:
        job = self.job
        batch_size = job.cfg.batch_size
        self._start_claim()
        while trio.current_time() - started < job.max_run_duration:
            if self.claiming is not None and not self.window:
                await self.claiming.wait()
            if self.faulted:
                self.window = [row for row in self.window if row.topic not in self.faulted]
            wave, self.window = next_wave(self.window, self.held, trio.current_time(),
                                          job.state.rows.due_at)
            # keep up to two claims in hand: a wave takes one row per key, so a larger
            # window makes larger waves when keys repeat (fewer waves, crossings, marks);
            # in bytes too, so memory stays bounded by claim_max_bytes (issue #26)
            if (self.claiming is None and self.claimed and len(self.window) < 2 * batch_size
                    and _bytes(self.window) < job.cfg.claim_max_bytes):
                self._start_claim()  # runs while this wave is on the wire
            if not wave:
                if self.claiming is None:
                    break
                continue
            if not await self._send(wave):
                return
        else:
            return  # the run's time bound: the back-off of unclaimed rows is kept
        if self.claiming is None and not self.claimed:  # everything pending was seen
            job.state.forget_settled(self.claimed_ids, self.claimed_topics,
                                     trio.current_time())

    def _start_claim(self) -> None:
        self.claiming = trio.Event()
        self.nursery.start_soon(self._claim, self.claiming)

    async def _claim(self, done: trio.Event) -> None:
        job = self.job
        try:
            # behind a backlog: after the last claimed id; caught up: from the start,
            # without the rows this cycle has in hand (a row committed late is not lost)
            after, skip = (self.after_id, ()) if self.full else (0, sorted(self.unsettled))
            claim = await job.db.atomic(claim_batch, job.cfg.batch_size,
                                        job.state.held_topics(trio.current_time()),
                                        after, skip, max_bytes=job.cfg.claim_max_bytes,
                                        max_row_bytes=job.max_row_bytes)
            claimed = claim.rows
            self.claimed = bool(claimed)
            # a backlog: the claim was full, or its byte cap cut it short
            self.full = claim.locked >= job.cfg.batch_size or claim.locked > len(claimed)
            self.unsettled.update(row.id for row in claimed)
            if claimed:
                self.after_id = max(self.after_id, *(row.id for row in claimed))
            self.claimed_ids.update(row.id for row in claimed)
            self.claimed_topics.update(row.topic for row in claimed)
            self.window.extend(await _dead_letter_malformed(job, claimed, self.counts,
                                                            self.held))
        finally:
            self.claiming = None
            done.set()

    async def _send(self, wave: list[Row]) -> bool:
        """Send one wave and sort out its answers; False when Kafka looks down."""
        job, state = self.job, self.job.state
        results = await job.producer.send_wave([row.message for row in wave])
        by_id = {row.id: row for row in wave}
        acked: list[int] = []
        transient: str | None = None
        for result in results:
            row = by_id[result.outbox_id]
            if result.delivery is Delivery.ACKED:
                acked.append(row.id)
                state.rows.forget(row.id)
                state.topic_faults.pop(row.topic, None)
            elif result.delivery is Delivery.FAULT:
                if row.topic not in self.faulted:
                    self.faulted.add(row.topic)
                    _topic_fault(state, row.topic, result.error or "refused")
            else:
                if result.delivery is Delivery.TRANSIENT:
                    transient = transient or result.error or "send failed"
                if await _record_failure(job, row, result):
                    self.held.add((row.topic, row.message_key))
                self.counts.failed += 1
        if acked:
            self.unmarked.extend(acked)
            if not self.marking:
                self.marking = True
                self.nursery.start_soon(self._mark)
        if transient and not acked:
            _kafka_down(state, transient)
            return False
        state.kafka_failures = 0
        return True

    async def _mark(self) -> None:
        """Mark every acknowledged row, one transaction at a time, until none is left
        (must complete: rows the broker has are marked, also when the cycle is
        cancelled; after a hard stop they are sent again later)."""
        try:
            async with must_complete():
                while self.unmarked:
                    ids, self.unmarked = self.unmarked, []
                    await self.job.db.atomic(mark_published, ids)
                    self.unsettled.difference_update(ids)
                    self.counts.published += len(ids)
                    OUTBOX_PUBLISHED.inc(len(ids))
        finally:
            self.marking = False


def _bytes(rows: Sequence[Row]) -> int:
    return sum(len(row.message.value) for row in rows)


def _report_health(state: RelayState) -> None:
    reason = state.fault_reason()
    if reason is None:
        HEALTH.clear_fault("kafka")
    else:
        HEALTH.set_fault("kafka", reason)


async def _dead_letter_malformed(job: RelayJob, claimed: Sequence[Row | Malformed],
                                 counts: RelayCounts, held: set[Key]) -> list[Row]:
    """Dead-letter the malformed rows; the sendable rows, without the rows of a key now
    blocked behind a dead letter (added to *held*)."""
    rows: list[Row] = []
    for row in claimed:
        key = (row.topic, row.message_key)
        if key in held:
            continue
        if isinstance(row, Row):
            rows.append(row)
            continue
        blocks = await job.db.atomic(dead_letter, row.id, row.reason)
        OUTBOX_DEAD_LETTERED.inc()
        counts.failed += 1
        log.error("outbox_row_dead_lettered", outbox_id=row.id, topic=row.topic,
                  error=row.reason, blocks_key=blocks)
        if blocks:
            held.add(key)
    return rows


def _topic_fault(state: RelayState, topic: str, error: str) -> None:
    """The broker refuses us for *topic*: its rows wait untouched, readiness is 503."""
    fault = state.topic_failed(topic, f"kafka:{error}", trio.current_time())
    HEALTH.set_fault("kafka", state.fault_reason() or fault.reason)
    log.error("config_fault", component="kafka", topic=topic, error=fault.reason,
              retry_in_s=round(fault.retry_at - trio.current_time(), 2))


async def _record_failure(job: RelayJob, row: Row, result: SendResult) -> bool:
    """Record a row the broker did not take; True when its key must wait (a transient
    failure, or a dead letter with later rows of the key behind it)."""
    error = f"kafka:{result.error}"
    permanent = result.delivery is Delivery.REJECTED
    OUTBOX_PUBLISH_FAILED.labels(kind="permanent" if permanent else "transient").inc()
    if permanent:
        blocks = await job.db.atomic(dead_letter, row.id, error)
        OUTBOX_DEAD_LETTERED.inc()
        log.error("outbox_row_dead_lettered", outbox_id=row.id, topic=row.topic,
                  error=error, blocks_key=blocks)
        return blocks
    await job.db.atomic(mark_failed, [row.id], error)
    job.state.rows.failed(row.id, trio.current_time())
    log.warning("outbox_publish_failed", outbox_id=row.id, topic=row.topic, error=error)
    return True


def _connection_fault(state: RelayState, reason: str) -> None:
    """The broker refuses the connection: every row waits untouched, readiness is 503;
    the connection is tried again with the Kafka-wide back-off."""
    state.connection_fault = reason
    state.kafka_failures += 1
    delay = backoff(state.kafka_failures)
    state.kafka_retry_at = trio.current_time() + delay
    HEALTH.set_fault("kafka", reason)
    log.error("config_fault", component="kafka", error=reason, retry_in_s=round(delay, 2))


def _kafka_down(state: RelayState, error: str) -> None:
    state.kafka_failures += 1
    delay = backoff(state.kafka_failures)
    state.kafka_retry_at = trio.current_time() + delay
    log.warning("kafka_unavailable", error=error, failures=state.kafka_failures,
                retry_in_s=round(delay, 2))
