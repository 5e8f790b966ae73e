"""The invariant auditor's metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from supervision.metrics import LEADER_GAUGES

_leader = LEADER_GAUGES.registry  # exported by the scan leader only

# ---- invariant auditor (issue #18)
INVARIANT_VIOLATIONS = Gauge(
    "safetynet_invariant_violations",
    "Violations of each invariant the auditor found in its last run (SQL-only invariants, "
    "over audit.window; saturates at audit.max_violations). Runbook: safetynet audit.",
    ["invariant"], registry=_leader)
AUDIT_FAILED = Counter(
    "safetynet_audit_failed", "Auditor runs that could not judge (the database did not "
    "answer in time); the gauge keeps its last values.")
