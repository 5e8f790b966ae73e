"""Shipped alert rules and dashboard: valid, built only on metrics safetynet exports, and
each alert proven (by promtool's rule unit tests) to fire in its failure."""

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

ROOT = Path(__file__).resolve().parents[3]
ALERTS = ROOT / "config" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "config" / "grafana" / "safetynet.json"
ALERT_TESTS = sorted((Path(__file__).parent / "alert_tests").glob("*.yml"))
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "deriv", "by", "without", "and",
    "or", "unless", "on", "ignoring", "histogram_quantile", "le", "outcome", "actor",
    "component", "job", "status", "kind", "offset", "bool", "clamp_min", "abs", "irate",
    "topk", "time", "vector", "absent", "labels", "summary", "severity", "invariant",
    "max_over_time", "changes",
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
    expr = re.sub(r"\boffset\s+\d+[smhdwy]", "offset", expr)  # an offset's duration
    tokens = set(re.findall(r"[a-zA-Z_][a-zA-Z0-9_:]*", expr))
    return {t for t in tokens if t not in PROMQL_WORDS and ":" not in t}


def rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_cases() -> list[dict[str, object]]:
    """Every ``alert_rule_test`` entry of the promtool unit tests, with its test case."""
    cases = []
    for path in ALERT_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert [(path.parent / f).resolve() for f in doc["rule_files"]] == [ALERTS], path
        for test in doc["tests"]:
            cases += [{**case, "test": test} for case in test["alert_rule_test"]]
    return cases


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed: .ci/run installs Debian's prometheus package")
    return found


def test_alert_rules_pass_promtool() -> None:
    """promtool accepts the rule file (Debian's prometheus package provides it)."""
    proc = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_fires_in_its_failure_under_promtool() -> None:
    """promtool's rule unit tests pass: each alert fires (with its labels and
    annotations) on series that show its failure, and stays quiet where stated."""
    proc = subprocess.run([promtool(), "test", "rules", *map(str, ALERT_TESTS)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_promtool_case_where_it_fires() -> None:
    """No alert of the rule file is left without a unit test that expects it to fire."""
    alerts = {str(r["alert"]) for r in rules() if "alert" in r}
    firing = {str(c["alertname"]) for c in alert_cases() if c["exp_alerts"]}
    assert alerts - firing == set(), "alerts without a promtool case that makes them fire"
    assert firing <= alerts


def test_not_running_alerts_fire_when_the_daemon_is_gone() -> None:
    """Each *NotRunning alert also fires with no series at all (absent()), and a case
    proves it on series that went stale, as a dead daemon's do."""
    for rule in rules():
        name = str(rule.get("alert", ""))
        if not name.endswith("NotRunning"):
            continue
        assert "absent(" in str(rule["expr"]), name
        dead = [c for c in alert_cases() if c["alertname"] == name and c["exp_alerts"]
                and any("stale" in s["values"]
                        for s in c["test"]["input_series"])]
        assert dead, f"{name}: no promtool case with a stale (dead) daemon"


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
            path, anchor = str(rule["annotations"]["runbook"]).split("#", 1)
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
