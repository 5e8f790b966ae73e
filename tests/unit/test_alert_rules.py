"""Shipped alert rules and dashboard: valid, and built only on metrics safetynet exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import prometheus_client
import pytest
import yaml

import supervision.app.tree  # noqa: F401  (imports every actor, registering every metric)

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "config" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "config" / "grafana" / "safetynet.json"
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "deriv", "by", "without", "and",
    "or", "unless", "on", "ignoring", "histogram_quantile", "le", "outcome", "actor",
    "component", "job", "status", "kind", "offset", "bool", "clamp_min", "abs", "irate",
    "topk", "time", "vector", "absent", "labels", "summary", "severity",
}


def exported_names() -> set[str]:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",)}
    names = set()
    for family in prometheus_client.REGISTRY.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)  # labelled: none until used
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
    return names


def metric_names(expr: str) -> set[str]:
    expr = re.sub(r'"[^"]*"', "", expr)  # label values
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    tokens = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_:]*", expr))
    return {t for t in tokens if t not in PROMQL_WORDS and ":" not in t}


def rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_alert_rules_pass_promtool() -> None:
    """promtool accepts the rule file (Debian's prometheus package provides it)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed: .ci/run installs Debian's prometheus package")
    proc = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_rule_uses_only_exported_metrics() -> None:
    """A typo in a metric name would make an alert silently never fire."""
    exported = exported_names()
    recorded = {str(r["record"]) for r in rules() if "record" in r}
    for rule in rules():
        expr = str(rule["expr"])
        used = metric_names(expr)
        via_records = set(re.findall(r"[a-zA-Z_]+:[a-zA-Z0-9_:]+", re.sub(r"\[[^\]]*\]", "", expr)))
        assert used or via_records, rule
        assert used <= exported, (rule.get("alert") or rule.get("record"), used - exported)
        assert via_records <= recorded, via_records - recorded


def test_both_seeds_alerts_are_present() -> None:
    """Each row of the seeds' Alerts tables has a rule, plus the outbox lag."""
    alerts = {str(r["alert"]) for r in rules() if "alert" in r}
    assert {
        "RecordingFinalizeNotRunning", "RecordingFinalizeFailedRateHigh",
        "RecordingFinalizeQuarantined", "RecordingFinalizeOldestAgeGrowing",
        "RecordingFinalizeBacklogHigh", "ConferenceReaperNotRunning",
        "ConferenceReaperBacklogHigh", "ConferenceProvisionFailedRateHigh",
        "ConferenceReaperErrors", "OutboxLagHigh",
    } <= alerts


def test_every_alert_has_a_runbook_section_in_the_operations_doc() -> None:
    """The runbook link of each alert lands on a heading of that name in
    docs/operations.md."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    headings = {h.strip().lower() for h in re.findall(r"^#{2,5} (.+)$", doc, re.MULTILINE)}
    for rule in rules():
        if "alert" in rule:
            path, anchor = str(rule["annotations"]["runbook"]).split("#", 1)  # type: ignore[index]
            assert path == "docs/operations.md"
            assert anchor == str(rule["alert"]).lower()
            assert anchor in headings, f"operations.md has no runbook section for {rule['alert']}"


def test_dashboard_is_valid_and_queries_exported_metrics() -> None:
    """The Grafana dashboard parses and every panel query uses exported metrics."""
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 8
    for expr in exprs:
        assert metric_names(expr) <= exported, expr
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("backlog", "cycle duration", "outcomes", "restarts", "outbox"):
        assert topic in titles
