"""The conference-reaper job's metrics (names are the contract: the seed's Observability)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from supervision.metrics import LEADER_GAUGES

_leader = LEADER_GAUGES.registry  # exported by the scan leader only

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
