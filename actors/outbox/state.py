"""What the outbox relay remembers between cycles (in memory; a restart just retries).

>>> retries = RowRetries()
>>> retries.failed(42, now=10.0, delay=0.5)   # row 42 waits until 10.5
>>> retries.keep_only({7, 8})                 # 42 is no longer pending: forgotten

Memory stays bounded by what is pending: a row's back-off is forgotten once the row is
acknowledged, and at every claim for each row that is no longer among the claimed ones
(dead-lettered, published by another relay, deleted). A row forgotten while still
pending — claimed elsewhere for a moment — is merely retried without waiting, as after a
restart. Topic faults are bounded by the topics in use.
"""

from __future__ import annotations

import random
from collections.abc import Collection

import attrs


def backoff(failures: int) -> float:
    """Exponential back-off with full jitter in [d/2, d], capped at 30 s."""
    delay = min(30.0, 0.25 * 2.0 ** min(failures - 1, 10))
    return float(delay * random.uniform(0.5, 1.0))


@attrs.frozen
class Retry:
    due_at: float
    failures: int


@attrs.define
class RowRetries:
    """Per-row back-off after a transient failure, keyed by outbox id."""

    _rows: dict[int, Retry] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self._rows)

    def due_at(self, outbox_id: int) -> float:
        retry = self._rows.get(outbox_id)
        return 0.0 if retry is None else retry.due_at

    def failed(self, outbox_id: int, now: float, delay: float | None = None) -> int:
        """Record one more failure; the row waits *delay* (default: :func:`backoff`).
        Returns the row's failure count."""
        failures = (self._rows[outbox_id].failures if outbox_id in self._rows else 0) + 1
        wait = backoff(failures) if delay is None else delay
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
    per-row back-off, faulted topics."""

    kafka_failures: int = 0
    kafka_retry_at: float = 0.0
    rows: RowRetries = attrs.field(factory=RowRetries)
    topic_faults: dict[str, TopicFault] = attrs.field(factory=dict)
    connection_fault: str | None = None  # the broker refuses the connection (TLS, SASL)
    retention_due_at: float = 0.0

    def held_topics(self, now: float) -> list[str]:
        """Topics in a configuration fault whose next try is not due yet."""
        return sorted(t for t, fault in self.topic_faults.items() if fault.retry_at > now)

    def topic_failed(self, topic: str, reason: str, now: float) -> TopicFault:
        previous = self.topic_faults.get(topic)
        failures = (previous.failures if previous else 0) + 1
        fault = TopicFault(reason, failures, now + backoff(failures))
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
