"""The outbox relay: ``messenger.integration_outbox`` → Kafka, at least once, per-key order.

>>> counts = await run_relay_cycle(relay, CycleContext("outbox-relay", run_id))

Runs as a lock-keeper job (one publishing relay per fleet; a second daemon stands by),
woken in-process by the committers right after a commit, by PostgreSQL ``NOTIFY`` for
other writers (:mod:`actors.outbox_listener`), and at worst every ``poll_interval``.

A cycle drains: claim the next unpublished rows in id order (short transaction, ``SKIP
LOCKED``), send them in *waves* — each wave holds at most one row per key, so a later row
of a key is never sent before an earlier one was acknowledged — and mark ``published_at``
only for rows the broker acknowledged. A row that failed transiently keeps its place: it
and every later row of its key wait for a back-off. A row rejected permanently (too large,
invalid topic) is dead-lettered and logged with its id; it blocks its key only when later
rows of that key were already waiting (then ``safetynet_outbox_blocked_keys`` alerts).
When Kafka itself is unreachable, nothing is marked, the relay backs off with jitter,
readiness stays 200 and ``safetynet_outbox_oldest_unpublished_age_seconds`` grows.

Inputs: the database, the producer, the relay's state. Outputs: Kafka messages with the
SPEC §4 headers, ``published_at``/``publish_attempts``/``last_error``, metrics.
What cancellation does: a wave in flight is abandoned un-marked; those rows are sent again
later with the same ``event-id`` (at least once). Marking is a must-complete transaction.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs
import psycopg
import structlog
import trio
from psycopg.rows import dict_row

from actors.finalize_store import event_id
from actors.kafka_producer import KafkaProducer, OutMessage, SendResult
from actors.lock_keeper import (
    CycleContext,
    CycleOutcome,
    CycleStatus,
    LockConnection,
    LockedJob,
    run_locked_cycle,
)
from supervision.config import OutboxRelayConfig
from supervision.database import Database
from supervision.errors import InfrastructureError
from supervision.metrics import (
    OUTBOX_DEAD_LETTERED,
    OUTBOX_PUBLISH_FAILED,
    OUTBOX_PUBLISHED,
)
from supervision.queries import QUERIES
from supervision.tracing import span

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


@attrs.define
class RelayState:
    """What the relay remembers between cycles (in memory; a restart just retries)."""

    kafka_failures: int = 0
    kafka_retry_at: float = 0.0
    row_retry_at: dict[int, float] = attrs.field(factory=dict)
    row_failures: dict[int, int] = attrs.field(factory=dict)
    retention_due_at: float = 0.0

    def backoff(self, failures: int) -> float:
        """Exponential back-off with full jitter in [d/2, d], capped at 30 s."""
        delay = min(30.0, 0.25 * 2.0 ** min(failures - 1, 10))
        return float(delay * random.uniform(0.5, 1.0))


@attrs.frozen
class RelayJob:
    cfg: OutboxRelayConfig
    db: Database
    producer: KafkaProducer
    state: RelayState = attrs.field(factory=RelayState)
    max_run_duration: float = 30.0
    retention_every: float = 300.0  # how often published rows past retention are deleted
    retention_batch: int = 1000


@attrs.frozen
class Row:
    id: int
    topic: str
    message_key: str
    message: OutMessage


def claim_batch(conn: psycopg.Connection, batch_size: int) -> list[Row]:
    with conn.cursor(row_factory=dict_row) as cur:
        records = cur.execute(QUERIES["outbox_claim_batch"],
                              {"batch_size": batch_size}).fetchall()
    return [_row(rec) for rec in records]


def _row(rec: dict[str, Any]) -> Row:
    headers = dict(rec["headers"] or {})
    headers.setdefault("event-type", rec["event_type"])
    if "event-id" not in headers:  # writers other than safetynet may leave it out
        headers["event-id"] = event_id(rec["topic"], rec["dedupe_key"])
    headers.setdefault("content-type", "application/json")
    value = rec["payload"].encode()
    message = OutMessage(
        outbox_id=rec["id"], topic=rec["topic"], key=rec["message_key"].encode(), value=value,
        headers=tuple((k, str(v).encode()) for k, v in headers.items()),
    )
    return Row(rec["id"], rec["topic"], rec["message_key"], message)


def mark_published(conn: psycopg.Connection, ids: list[int]) -> None:
    conn.execute(QUERIES["outbox_mark_published"], {"ids": ids})


def mark_failed(conn: psycopg.Connection, ids: list[int], error: str) -> None:
    conn.execute(QUERIES["outbox_mark_failed"], {"ids": ids, "last_error": error[:512]})


def dead_letter(conn: psycopg.Connection, outbox_id: int, reason: str) -> bool:
    """Dead-letter the row; True when it now blocks later rows of its key."""
    rec = conn.execute(QUERIES["outbox_dead_letter"],
                       {"id": outbox_id, "reason": reason[:512]}).fetchone()
    return bool(rec and rec[0])


def waves(rows: Sequence[Row], now: float, retry_at: dict[int, float]) -> list[list[Row]]:
    """Split *rows* (id order) into waves of at most one row per key, in id order.

    A row still in its back-off holds back itself and every later row of its key."""
    held: set[tuple[str, str]] = set()
    depth: dict[tuple[str, str], int] = {}
    out: list[list[Row]] = []
    for row in rows:
        key = (row.topic, row.message_key)
        if key in held or retry_at.get(row.id, 0.0) > now:
            held.add(key)
            continue
        level = depth.get(key, 0)
        depth[key] = level + 1
        while len(out) <= level:
            out.append([])
        out[level].append(row)
    return out


async def run_relay_cycle(job: RelayJob, ctx: CycleContext) -> RelayCounts:
    """Publish until nothing publishable is left (or the run's time bound)."""
    with span("outbox-relay.cycle", job_run_id=ctx.job_run_id) as cycle_span:
        counts = await _drain(job)
        cycle_span.set_attributes(counts.as_json())
    if trio.current_time() >= job.state.retention_due_at:
        job.state.retention_due_at = trio.current_time() + job.retention_every
        await apply_retention(job)
    return counts


async def run_relay_until_drained(
    job: RelayJob, locked: LockedJob[RelayCounts], lock: LockConnection
) -> CycleOutcome[RelayCounts]:
    """``safetynet run-once --job outbox-relay``: relay cycles under the relay's lock until
    a cycle publishes nothing; the summed counts. Kafka unreachable is an
    :class:`InfrastructureError` (rows stay unpublished), not an empty success."""
    locked = attrs.evolve(locked, cycle=partial(run_relay_cycle, job))
    total = RelayCounts()
    while True:
        outcome = await run_locked_cycle(locked, lock)
        if outcome.status != CycleStatus.RAN or outcome.result is None:
            return outcome
        total.add(outcome.result)
        if job.state.kafka_failures:
            raise InfrastructureError("kafka: unreachable; rows stay unpublished")
        if outcome.result.published == 0:
            return CycleOutcome(CycleStatus.RAN, outcome.job_run_id, total)


def delete_published(conn: psycopg.Connection, retention: float, limit: int) -> int:
    return conn.execute(QUERIES["outbox_delete_published_before"],
                        {"retention": retention, "limit": limit}).rowcount


async def apply_retention(job: RelayJob, max_batches: int = 20) -> int:
    """Delete published rows older than ``outbox_relay.retention``, a small batch per
    transaction (short locks, bounded WAL), at most *max_batches* per call."""
    deleted = 0
    for _ in range(max_batches):
        n = await job.db.atomic(delete_published, job.cfg.retention, job.retention_batch)
        deleted += n
        if n < job.retention_batch:
            break
    if deleted:
        log.info("outbox_retention_deleted", rows=deleted,
                 retention_s=job.cfg.retention)
    return deleted


async def _drain(job: RelayJob) -> RelayCounts:
    started = trio.current_time()
    counts = RelayCounts()
    state = job.state
    try:
        if trio.current_time() < state.kafka_retry_at:
            return counts
        if not job.producer.started:
            try:
                await job.producer.start()
            except Exception as exc:  # broker unreachable: back off, never crash-loop
                _kafka_down(state, exc)
                return counts
        while trio.current_time() - started < job.max_run_duration:
            rows = await job.db.atomic(claim_batch, job.cfg.batch_size)
            plan = waves(rows, trio.current_time(), state.row_retry_at)
            if not any(plan):
                break
            if not await _publish(job, plan, counts):
                break
        return counts
    finally:
        counts.duration_ms = int((trio.current_time() - started) * 1000)
        if counts.published or counts.failed:
            log.info("relay_cycle_completed", **counts.as_json())


async def _publish(job: RelayJob, plan: list[list[Row]], counts: RelayCounts) -> bool:
    """Send the waves in order, then mark what the broker acknowledged (one transaction
    per batch); False when Kafka looks down (stop draining)."""
    state = job.state
    blocked: set[tuple[str, str]] = set()
    acked: list[int] = []
    kafka_down = False
    try:
        for wave in plan:
            wave = [row for row in wave if (row.topic, row.message_key) not in blocked]
            if not wave:
                continue
            results = await job.producer.send_wave([row.message for row in wave])
            by_id = {row.id: row for row in wave}
            wave_acked = [r.outbox_id for r in results if r.ok]
            acked.extend(wave_acked)
            failures = [r for r in results if not r.ok]
            for result in failures:
                row = by_id[result.outbox_id]
                blocked.add((row.topic, row.message_key))
                await _record_failure(job, row, result)
                counts.failed += 1
            transient = [r for r in failures if not r.permanent]
            if transient and not wave_acked:
                _kafka_down(state, RuntimeError(transient[0].error or "send failed"))
                kafka_down = True
                break
    finally:
        if acked:  # only acknowledged rows; also when the waves were cut short
            await job.db.atomic(mark_published, acked)
            counts.published += len(acked)
            OUTBOX_PUBLISHED.inc(len(acked))
            for outbox_id in acked:
                state.row_retry_at.pop(outbox_id, None)
                state.row_failures.pop(outbox_id, None)
    if kafka_down:
        return False
    state.kafka_failures = 0
    return True


async def _record_failure(job: RelayJob, row: Row, result: SendResult) -> None:
    state = job.state
    error = f"kafka:{result.error}"
    OUTBOX_PUBLISH_FAILED.labels(kind="permanent" if result.permanent else "transient").inc()
    if result.permanent:
        blocks = await job.db.atomic(dead_letter, row.id, error)
        OUTBOX_DEAD_LETTERED.inc()
        log.error("outbox_row_dead_lettered", outbox_id=row.id, topic=row.topic,
                  error=error, blocks_key=blocks)
        return
    await job.db.atomic(mark_failed, [row.id], error)
    attempts = state.row_failures.get(row.id, 0) + 1
    state.row_failures[row.id] = attempts
    state.row_retry_at[row.id] = trio.current_time() + state.backoff(attempts)
    log.warning("outbox_publish_failed", outbox_id=row.id, topic=row.topic, error=error)


def _kafka_down(state: RelayState, exc: BaseException) -> None:
    state.kafka_failures += 1
    delay = state.backoff(state.kafka_failures)
    state.kafka_retry_at = trio.current_time() + delay
    log.warning("kafka_unavailable", error=type(exc).__name__, failures=state.kafka_failures,
                retry_in_s=round(delay, 2))
