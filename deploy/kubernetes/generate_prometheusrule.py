"""Writes deploy/kubernetes/prometheusrule.yaml from config/prometheus/alerts.yml.

    python deploy/kubernetes/generate_prometheusrule.py           # rewrite the manifest
    python deploy/kubernetes/generate_prometheusrule.py --check   # exit 1 when it is stale

The rule groups are the rule file's, unchanged (one source of truth: promtool's unit
tests in tests/unit/house/alert_tests/ test exactly what the operator loads); the manifest
only wraps them in a PrometheusRule. tests/unit/house/test_deploy.py fails when the
committed manifest differs from what this prints.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "config" / "prometheus" / "alerts.yml"
MANIFEST = ROOT / "deploy" / "kubernetes" / "prometheusrule.yaml"
HEADER = """\
# GENERATED from config/prometheus/alerts.yml by deploy/kubernetes/generate_prometheusrule.py;
# do not edit: change the rule file and run the script (a test compares the two).
# Prometheus Operator loads it when the Prometheus' ruleSelector matches these labels.
"""


def manifest(alerts: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "safetynet", "labels": {"app.kubernetes.io/name": "safetynet"}},
        "spec": {"groups": alerts["groups"]},
    }


def render() -> str:
    alerts = yaml.safe_load(ALERTS.read_text())
    body = yaml.safe_dump(manifest(alerts), sort_keys=False, width=1000,
                          allow_unicode=True)
    return HEADER + body


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if MANIFEST.read_text() != text:
            print(f"{MANIFEST.relative_to(ROOT)} is stale: run {Path(__file__).name}",
                  file=sys.stderr)
            return 1
        return 0
    MANIFEST.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
