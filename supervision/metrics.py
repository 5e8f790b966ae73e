"""The runtime's Prometheus metrics (leases, restarts, schema, config faults) and the two
collectors every job reports through (names are part of the contract).

Each job declares its own metrics in its package (``actors/<job>/metrics.py``).

Exposition is prometheus-client's own (:func:`prometheus_client.generate_latest`), served by
the metrics exporter actor; nothing here formats text by hand. prometheus-client adds the
``_total`` suffix to counters: ``Counter("x_reconciled")`` is exported as
``x_reconciled_total``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class LeaderGauges(Collector):
    """The database-wide gauges (backlogs, SLO counts, outbox lag, invariant violations,
    the NOTIFY queue): one replica at a time scans for them (the holder of the
    ``database-scans`` lease, :mod:`actors.leases.scan_leader`), and a standby exports none of
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

REGISTRY.register(LEADER_GAUGES)
REGISTRY.register(LAST_CYCLES)
