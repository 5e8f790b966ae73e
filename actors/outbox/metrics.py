"""The outbox relay's metrics (SPEC §8), the listener's and the NOTIFY queue's gauge."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from supervision.metrics import LEADER_GAUGES

_leader = LEADER_GAUGES.registry  # exported by the scan leader only

# ---- outbox relay (SPEC §8)
OUTBOX_PUBLISHED = Counter(
    "safetynet_outbox_published", "Outbox rows acknowledged by Kafka and marked published.")
OUTBOX_PUBLISH_FAILED = Counter(
    "safetynet_outbox_publish_failed", "Outbox sends that failed.", ["kind"])
OUTBOX_DEAD_LETTERED = Counter(
    "safetynet_outbox_dead_lettered", "Outbox rows rejected permanently by Kafka.")
OUTBOX_UNPUBLISHED = Gauge(
    "safetynet_outbox_unpublished", "Outbox rows waiting to be published.", registry=_leader)
OUTBOX_OLDEST_AGE = Gauge(
    "safetynet_outbox_oldest_unpublished_age_seconds",
    "Age of the oldest outbox row waiting to be published.", registry=_leader)
OUTBOX_DELIVERY = Histogram(
    "safetynet_outbox_delivery_seconds",
    "From the commit of an event's transaction to Kafka's acknowledgement (logical source: "
    "the decoded BEGIN's commit time; table source: created_at, on the database clock).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
             120.0, 300.0, 900.0, 3600.0))
OUTBOX_REPLICATION_LAG = Gauge(
    "safetynet_outbox_replication_lag_bytes",
    "Logical source: bytes of WAL the relay's replication slot retains (from its restart "
    "position to the server's current one).", registry=_leader)
OUTBOX_SLOT_CONFIRMED = Gauge(
    "safetynet_outbox_slot_confirmed_lsn_bytes",
    "Logical source: the slot's confirmed position (bytes since 0/0); flat while the slot "
    "does not advance.", registry=_leader)
OUTBOX_SLOT_LOST = Gauge(
    "safetynet_outbox_slot_lost",
    "Logical source: 1 while the relay's replication slot is missing or PostgreSQL "
    "invalidated it (wal_status lost): the relay reads the table instead.", registry=_leader)
OUTBOX_FALLBACK_REPUBLISHED = Counter(
    "safetynet_outbox_fallback_republished",
    "Logical source: events published again from the table after the slot was lost or "
    "dropped (duplicates, same event-id).")
LISTENER_CONNECTED = Gauge(
    "safetynet_outbox_listener_connected",
    "1 while the outbox listener's LISTEN is in place (else the relay polls).")
LISTENER_RECONNECTS = Counter(
    "safetynet_outbox_listener_reconnects",
    "Times the outbox listener's LISTEN was back in place after its connection was lost.")
OUTBOX_BLOCKED_KEYS = Gauge(
    "safetynet_outbox_blocked_keys",
    "Message keys held back behind a dead-lettered row (needs an operator).",
    registry=_leader)


# ---- PostgreSQL (issue 28): the NOTIFY queue the outbox trigger and the listener share
NOTIFY_QUEUE_USAGE = Gauge(
    "safetynet_pg_notification_queue_usage",
    "pg_notification_queue_usage(): the fraction (0-1) of PostgreSQL's NOTIFY queue in use. "
    "A listener that stops consuming fills it; full, every NOTIFY (and so every committing "
    "transaction of the outbox trigger) fails.", registry=_leader)
