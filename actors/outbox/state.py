"""What the outbox relay remembers between cycles (in memory; a restart just retries),
and what one cycle counts.

>>> retries = RowRetries()
>>> retries.failed(42, now=10.0, delay=0.5)   # row 42 waits until 10.5
>>> retries.keep_only({7, 8})                 # 42 is no longer pending: forgotten

Every wait is drawn from :data:`RELAY_BACKOFF` (:class:`supervision.tree.backoff.Backoff`, full
jitter): the n-th consecutive failure of a row, of a topic or of Kafka as a whole waits
a time drawn from ``[0, min(30 s, 0.25 s x 2**(n-1))]``, so relays that failed together
do not retry together.

Memory stays bounded by what is pending: a row's back-off is forgotten once the row is
acknowledged, and at the end of every cycle whose claims caught up for each row no claim
of the cycle returned (dead-lettered, published by another relay, deleted). A row
forgotten while still pending — claimed elsewhere for a moment — is merely retried
without waiting, as after a restart. Topic faults are bounded by the topics in use.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection

import attrs

from actors.outbox.slot import SlotProgress
from supervision.tree.backoff import Backoff

RELAY_BACKOFF = Backoff(base=0.25, cap=30.0)


# upper bounds (ms) of the commit-to-ack latency buckets; one more bucket holds the rest
ACK_BUCKETS_MS = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)


@attrs.define
class AckLatency:
    """From a row's commit (its ``created_at``) to the broker's acknowledgement, marked:
    the largest and the count per bucket of :data:`ACK_BUCKETS_MS`."""

    max_ms: int = 0
    buckets: list[int] = attrs.field(factory=lambda: [0] * (len(ACK_BUCKETS_MS) + 1))

    def observe(self, latencies_ms: Collection[int]) -> None:
        for ms in latencies_ms:
            self.max_ms = max(self.max_ms, ms)
            self.buckets[bisect.bisect_left(ACK_BUCKETS_MS, ms)] += 1

    def add(self, other: AckLatency) -> None:
        self.max_ms = max(self.max_ms, other.max_ms)
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


@attrs.define
class RelayCounts:
    """One cycle's counts (``safetynet run-once --job outbox-relay`` prints them)."""

    published: int = 0
    failed: int = 0
    duration_ms: int = 0
    # commit-to-ack latency of the published rows (the console's charts, not the JSON)
    acks: AckLatency = attrs.field(factory=lambda: AckLatency())

    def as_json(self) -> dict[str, int]:
        return {"published": self.published, "failed": self.failed,
                "duration_ms": self.duration_ms}

    def add(self, other: RelayCounts) -> None:
        self.published += other.published
        self.failed += other.failed
        self.duration_ms += other.duration_ms
        self.acks.add(other.acks)


@attrs.frozen
class Retry:
    due_at: float
    failures: int


@attrs.define
class RowRetries:
    """Per-row back-off after a transient failure, keyed by outbox id."""

    _rows: dict[int, Retry] = attrs.field(factory=dict)
    policy: Backoff = RELAY_BACKOFF

    def __len__(self) -> int:
        return len(self._rows)

    def due_at(self, outbox_id: int) -> float:
        retry = self._rows.get(outbox_id)
        return 0.0 if retry is None else retry.due_at

    def failed(self, outbox_id: int, now: float, delay: float | None = None) -> int:
        """Record one more failure; the row waits *delay* (default: drawn from the
        policy for its failure count). Returns the row's failure count."""
        failures = (self._rows[outbox_id].failures if outbox_id in self._rows else 0) + 1
        wait = self.policy.delay(failures - 1) if delay is None else delay
        self._rows[outbox_id] = Retry(now + wait, failures)
        return failures

    def forget(self, outbox_id: int) -> None:
        self._rows.pop(outbox_id, None)

    def keep_only(self, pending: Collection[int]) -> int:
        """Forget every row not in *pending*; how many were forgotten."""
        gone = [outbox_id for outbox_id in self._rows if outbox_id not in pending]
        for outbox_id in gone:
            del self._rows[outbox_id]
        return len(gone)


@attrs.frozen
class TopicFault:
    reason: str
    failures: int
    retry_at: float


@attrs.define
class RelayState:
    """The relay's memory: Kafka-wide back-off (an outage or a refused connection),
    per-row back-off, faulted topics, and (logical source) what was read and settled
    above the slot's position."""

    kafka_failures: int = 0
    kafka_retry_at: float = 0.0
    rows: RowRetries = attrs.field(factory=RowRetries)
    topic_faults: dict[str, TopicFault] = attrs.field(factory=dict)
    connection_fault: str | None = None  # the broker refuses the connection (TLS, SASL)
    retention_due_at: float = 0.0
    policy: Backoff = RELAY_BACKOFF
    slot: SlotProgress = attrs.field(factory=SlotProgress)  # the logical source's reading

    def kafka_failed(self, now: float) -> float:
        """One more consecutive failure to reach Kafka: the next try waits; how long."""
        self.kafka_failures += 1
        delay = self.policy.delay(self.kafka_failures - 1)
        self.kafka_retry_at = now + delay
        return delay

    def held_topics(self, now: float) -> list[str]:
        """Topics in a configuration fault whose next try is not due yet."""
        return sorted(t for t, fault in self.topic_faults.items() if fault.retry_at > now)

    def topic_failed(self, topic: str, reason: str, now: float) -> TopicFault:
        previous = self.topic_faults.get(topic)
        failures = (previous.failures if previous else 0) + 1
        fault = TopicFault(reason, failures, now + self.policy.delay(failures - 1))
        self.topic_faults[topic] = fault
        return fault

    def forget_settled(self, pending: Collection[int], topics: Collection[str],
                       now: float) -> None:
        """After a claim of the rows *pending* (of *topics*): drop the back-off of every
        other row, and the fault of a topic that was due for a retry but has no row."""
        self.rows.keep_only(pending)
        for topic, fault in list(self.topic_faults.items()):
            if fault.retry_at <= now and topic not in topics:
                del self.topic_faults[topic]

    def fault_reason(self) -> str | None:
        """One line for readiness: a refused connection, else the faulted topics and
        their reasons."""
        if self.connection_fault is not None:
            return self.connection_fault
        if not self.topic_faults:
            return None
        return "; ".join(f"topic {topic}: {fault.reason}"
                         for topic, fault in sorted(self.topic_faults.items()))
