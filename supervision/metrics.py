"""Every Prometheus metric safetynet exports, declared once (names are part of the contract).

Exposition is prometheus-client's own (:func:`prometheus_client.generate_latest`), served by
the metrics exporter actor; nothing here formats text by hand. prometheus-client adds the
``_total`` suffix to counters: ``Counter("x_reconciled")`` is exported as
``x_reconciled_total``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class LeaderGauges(Collector):
    """The database-wide gauges (backlogs, SLO counts, outbox lag, invariant violations,
    the NOTIFY queue): one replica at a time scans for them (the holder of the
    ``database-scans`` lease, :mod:`actors.scan_leader`), and a standby exports none of
    them, so a replica that stopped leading never shows stale values. Exported unless
    ``standby`` is set (a process that runs no scan leader, e.g. a test, exports them)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.standby = False

    def collect(self) -> Iterable[Metric]:
        return [] if self.standby else list(self.registry.collect())

    def describe(self) -> Iterable[Metric]:
        return list(self.registry.collect())


class LastCycles(Collector):
    """Each job's last cycle in this process: its counts (the figures ``run-once`` prints,
    ``duration_ms`` included) as ``safetynet_last_cycle{job,outcome}``, and when it ended
    with which status as ``safetynet_last_cycle_end_timestamp_seconds{job,status}``.
    :func:`actors.cycle_frame.cycle_frame` records them at every cycle end; a cycle
    replaces its job's previous figures whole, so no count of an older cycle lingers."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, float, dict[str, float]]] = {}

    def record(self, job: str, status: str, figures: Mapping[str, object]) -> None:
        self._last[job] = (status, time.time(), {
            k: float(v) for k, v in figures.items()
            if isinstance(v, int | float) and not isinstance(v, bool)})

    def collect(self) -> Iterable[Metric]:
        counts = GaugeMetricFamily(
            "safetynet_last_cycle", "The counts of the job's last cycle in this process "
            "(as run-once prints them).", labels=["job", "outcome"])
        ended = GaugeMetricFamily(
            "safetynet_last_cycle_end_timestamp_seconds", "When the job's last cycle in "
            "this process ended (Unix time), labelled with its status.",
            labels=["job", "status"])
        for job, (status, at, figures) in sorted(list(self._last.items())):
            for outcome, value in figures.items():
                counts.add_metric([job, outcome], value)
            ended.add_metric([job, status], at)
        return [counts, ended]


LEADER_GAUGES = LeaderGauges()
LAST_CYCLES = LastCycles()
_leader = LEADER_GAUGES.registry

# ---- supervision (SPEC §8)
ACTOR_RESTARTS = Counter(
    "safetynet_actor_restarts", "Restarts of a supervised actor.", ["actor"])
LOCK_HELD = Gauge(
    "safetynet_lock_held", "1 while this process holds the job's lease (and, when it could "
    "take it, the advisory lock).", ["job"])
LEASE_TERM = Gauge(
    "safetynet_lease_term", "The term of the job's lease this process last held.", ["job"])
LEASE_LOST = Counter(
    "safetynet_lease_lost", "Cycles that lost their lease mid-cycle (renewal refused or a "
    "fenced write rejected) and stepped down.", ["job"])
FENCED_WRITES = Counter(
    "safetynet_fenced_writes_rejected", "Transactions rolled back by the lease fence: "
    "written under a term that was no longer live.", ["job"])
JOB_PAUSED = Gauge(
    "safetynet_job_paused", "1 while the job is paused (`safetynet pause`): no replica "
    "takes its lease or runs its cycles until `safetynet resume`.", ["job"])
SCHEMA_AHEAD = Gauge(
    "safetynet_schema_migrations_ahead", "Migrations in the database's ledger this build does "
    "not know (a newer release migrated it): it runs, expand/contract keeps it working.")
SCHEMA_MISSING_INDEXES = Gauge(
    "safetynet_schema_missing_indexes", "Recommended messenger indexes with no VALID "
    "equivalent (`safetynet check-schema` prints the DDL): queries work, slower.")
SCHEMA_BROKEN = Gauge(
    "safetynet_schema_contract_broken", "1 while the job's messenger columns break the "
    "contract (`safetynet check-schema`): the job does not run.", ["job"])
CONFIG_FAULT = Gauge(
    "safetynet_config_fault", "1 while a dependency is misconfigured (readiness is 503).",
    ["component"])

# ---- recording-finalize (seed: Observability)
RF_BACKLOG = Gauge(
    "messenger_recording_finalize_backlog",
    "Pending recording finalize rows (exact up to 10,000, beyond: the planner's estimate).",
    registry=_leader)
RF_OLDEST_AGE = Gauge(
    "messenger_recording_finalize_oldest_age_seconds",
    "now - min(created_at) of the Pending finalize rows.", registry=_leader)
RF_RECONCILED = Counter(
    "messenger_recording_finalize_reconciled", "Recordings reconciled to Available.")
RF_FAILED = Counter(
    "messenger_recording_finalize_failed", "Recordings failed with Timeout (no binary).")
RF_REPUBLISHED = Counter(
    "messenger_recording_finalize_republished",
    "Available recordings whose missing event was enqueued again.")
RF_QUARANTINED = Counter(
    "messenger_recording_finalize_quarantined", "Finalize rows quarantined (poison).")
RF_RUNS = Counter(
    "messenger_recording_finalize_run", "Recording finalize cycles run.", ["status"])
RF_CYCLE_DURATION = Histogram(
    "messenger_recording_finalize_cycle_duration_seconds",
    "Duration of one recording finalize cycle.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180, 300))
RF_TRANSIENT = Counter(
    "safetynet_recording_finalize_transient",
    "Transient object-storage failures during reconcile (row rescheduled).")
RF_STUCK = Gauge(
    "safetynet_recording_finalize_stuck",
    "Recordings non-terminal past finalize_sla_timeout + polling_interval (SLO: 0);"
    " counted up to 1,000.", registry=_leader)
RF_REPUBLISH_OVERDUE = Gauge(
    "safetynet_recording_finalize_republish_overdue",
    "Available recordings still waiting for their event past one interval (SLO: 0).",
    registry=_leader)
RF_QUARANTINED_ROWS = Gauge(
    "safetynet_recording_finalize_quarantined_rows",
    "Finalize rows in quarantine now (runbook: inspect last_error, requeue).", registry=_leader)
RF_REDRIVEN = Counter(
    "safetynet_recording_finalize_redriven",
    "Quarantined finalize rows requeued by themselves once object storage was healthy "
    "for redrive_after (self-healing quarantine).")
RF_VERDICTS_WITHHELD = Counter(
    "safetynet_recording_finalize_verdicts_withheld",
    "Missing verdicts held back for want of evidence that the 404 means \"not uploaded\" "
    "(rows given back untouched; `safetynet accept-missing` when the incident is genuine).")
S3_BREAKER_OPEN = Gauge(
    "safetynet_s3_breaker_open",
    "1 while the object-storage outage breaker stops claiming reconcile work.")
S3_WORKER_STARTS = Counter(
    "safetynet_s3_worker_starts",
    "S3 worker processes started (the first one, then one per restart after a crash).")

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

# ---- conference-reaper (seed: Observability)
CR_RUNS = Counter(
    "messenger_conf_reaper_run", "Conference reaper cycles run.", ["status"])
CR_CYCLE_DURATION = Histogram(
    "messenger_conf_reaper_cycle_duration_seconds",
    "Duration of one conference reaper cycle.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
CR_ITEMS = Counter(
    "messenger_conf_reaper_items",
    "Conferences made terminal, by outcome (empty_timeout, provision_failed, stale_timeout).",
    ["outcome"])
CR_ACTIVE_BACKLOG = Gauge(
    "messenger_conf_reaper_active_backlog",
    "Active (Provisioning/Active) conferences whose window is exceeded.", registry=_leader)
CR_SKIP_LOCKED = Counter(
    "messenger_conf_reaper_skip_locked",
    "Due conferences skipped because another transaction held them.")
CR_ERRORS = Counter(
    "messenger_conf_reaper_errors",
    "Poison conferences left active (guard rejected, or outcome could not be built).")
CR_POISONED = Gauge(
    "safetynet_conf_reaper_poisoned",
    "Poison conferences held out of the reaper's claim (still active; see safetynet status).")
RECORDER_STOP_FAILED = Counter(
    "safetynet_recorder_stop_failed",
    "Recorder stop signals that failed (http_status, timeout, connection, tls, error, abandoned).",
    ["reason"])

# ---- invariant auditor (issue #18)
INVARIANT_VIOLATIONS = Gauge(
    "safetynet_invariant_violations",
    "Violations of each invariant the auditor found in its last run (SQL-only invariants, "
    "over audit.window; saturates at audit.max_violations). Runbook: safetynet audit.",
    ["invariant"], registry=_leader)
AUDIT_FAILED = Counter(
    "safetynet_audit_failed", "Auditor runs that could not judge (the database did not "
    "answer in time); the gauge keeps its last values.")

# ---- PostgreSQL (issue 28): the NOTIFY queue the outbox trigger and the listener share
NOTIFY_QUEUE_USAGE = Gauge(
    "safetynet_pg_notification_queue_usage",
    "pg_notification_queue_usage(): the fraction (0-1) of PostgreSQL's NOTIFY queue in use. "
    "A listener that stops consuming fills it; full, every NOTIFY (and so every committing "
    "transaction of the outbox trigger) fails.", registry=_leader)

REGISTRY.register(LEADER_GAUGES)
REGISTRY.register(LAST_CYCLES)
