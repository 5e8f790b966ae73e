"""The recording-finalize job's metrics (names are the contract: SPEC §8 and the seed's
Observability table). The database-derived gauges go to the scan leader's registry."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from supervision.metrics import LEADER_GAUGES

_leader = LEADER_GAUGES.registry  # exported by the scan leader only

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
