"""The relay as a job: what every cycle of it runs with (its configuration, database,
producer and the relay's memory between cycles), whichever source it reads."""

from __future__ import annotations

import attrs

from actors.kafka.producer import MAX_REQUEST_SIZE, KafkaProducer
from actors.outbox.settings import OutboxRelayConfig
from actors.outbox.state import RelayState
from supervision.db.database import Database


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
    # the logical source's stream: the DSN of its replication connection (None: peeks only)
    stream_dsn: str | None = attrs.field(default=None, repr=False)
