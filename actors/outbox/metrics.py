"""The outbox relay's metrics (SPEC §8), the listener's and the NOTIFY queue's gauge."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

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
