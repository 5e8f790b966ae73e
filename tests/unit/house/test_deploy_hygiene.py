"""Deploy hygiene for the long run (issue 36, item 9): the Kubernetes NetworkPolicies
(default deny, then each component's peers), the console as its own read-only
Deployment and Service, and the systemd unit's sandbox as `systemd-analyze security`
scores it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.unit.house.test_deploy import (
    UNIT,
    check_config,
    daemon_config,
    pod,
    resources,
    secret_of,
    stand_in_files,
)


def policy(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = resources()[("NetworkPolicy", name)]["spec"]
    return spec


def selects(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    return bool(spec["podSelector"]["matchLabels"].items() <= labels.items())


def ports(rules: list[dict[str, Any]]) -> set[tuple[int | str, str]]:
    return {(p["port"], p["protocol"]) for rule in rules for p in rule["ports"]}


DNS = {(53, "UDP"), (53, "TCP")}


def test_network_policies_deny_by_default_and_let_each_component_reach_its_peers_only(
        ) -> None:
    """A default-deny policy (both directions, no rule) selects every pod safetynet runs;
    each component's policy opens exactly: the daemon, its metrics port in and
    PostgreSQL, Kafka (the ConfigMap's brokers' port), S3 and the media stack (https)
    and DNS out; the migration Job, PostgreSQL and DNS out; the console, its port in and
    PostgreSQL and DNS out. The S3 rule reaches no private address."""
    workloads = {name: doc["spec"]["template"]["metadata"]["labels"]
                 for (kind, name), doc in resources().items() if kind in ("Deployment", "Job")}
    assert set(workloads) == {"safetynet", "safetynet-console", "safetynet-migrate"}
    deny = policy("safetynet-default-deny")
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny and "egress" not in deny
    allow = {"safetynet": "safetynet-daemon", "safetynet-console": "safetynet-console",
             "safetynet-migrate": "safetynet-migrate"}
    for workload, labels in workloads.items():
        assert selects(deny, labels), workload
        spec = policy(allow[workload])
        assert selects(spec, labels) and set(spec["policyTypes"]) == {"Ingress", "Egress"}
    config = daemon_config()
    kafka = {int(b.rpartition(":")[2]) for b in config["kafka"]["bootstrap_servers"].split(",")}
    assert config["s3"]["endpoint_url"].startswith("https://")
    assert config["media"]["base_url"].startswith("https://")
    daemon = policy("safetynet-daemon")
    assert ports(daemon["egress"]) == {(5432, "TCP"), *((p, "TCP") for p in kafka),
                                       (443, "TCP"), *DNS}
    assert ports(daemon["ingress"]) == {("metrics", "TCP")}
    (public,) = [rule for rule in daemon["egress"] if "ipBlock" in rule["to"][0]]
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(
        public["to"][0]["ipBlock"]["except"])
    migrate = policy("safetynet-migrate")
    assert ports(migrate["egress"]) == {(5432, "TCP"), *DNS} and "ingress" not in migrate
    console = policy("safetynet-console")
    assert ports(console["egress"]) == {(5432, "TCP"), *DNS}
    assert ports(console["ingress"]) == {("http", "TCP")}


def test_console_is_its_own_read_only_deployment_and_service(tmp_path: Path) -> None:
    """`safetynet console` runs in a Deployment of its own with the daemon's image and
    hardening, read-only (allow_actions = false) as the read-only role of a Secret of
    its own; its Service selects its pods only; its TOML passes check-config with the
    secret files it names."""
    found = resources()
    deployment, service = (found[("Deployment", "safetynet-console")],
                           found[("Service", "safetynet-console")])
    spec = deployment["spec"]["template"]["spec"]
    (container,), (run,) = spec["containers"], pod("Deployment")["containers"]
    assert container["args"][0] == "console" and container["image"] == run["image"]
    assert container["securityContext"] == run["securityContext"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    text = found[("ConfigMap", "safetynet-console-config")]["data"]["console.toml"]
    assert tomllib.loads(text)["console"]["allow_actions"] is False
    assert {secret_of(spec, container, v["value"]) for v in container["env"]} == {
        ("safetynet-console", "postgres-dsn"), ("safetynet-console", "password-hash")}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert not service["spec"]["selector"].items() <= found[("Deployment", "safetynet")][
        "spec"]["template"]["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    config = tmp_path / "console.toml"
    config.write_text(text)
    proc = check_config(config, stand_in_files(tmp_path, container))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert tomllib.loads(proc.stdout)["console"]["listen"].rpartition(":")[2] == str(
        next(p["containerPort"] for p in container["ports"]))


# `systemd-analyze security` of the unit: 3.2 before SystemCallFilter=@system-service,
# ProtectProc=invisible and ProcSubset=pid, 1.7 with them (systemd 252, Debian 12); a
# change that loosens the sandbox past this fails.
EXPOSURE_MAX = 2.0


def test_systemd_unit_exposure_score_stays_low(tmp_path: Path) -> None:
    """`systemd-analyze security --offline=true` scores the unit's sandbox below
    :data:`EXPOSURE_MAX` (0 = fully locked down, 10 = fully exposed)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed (Debian's systemd package)")
    unit = tmp_path / "safetynet.service"
    unit.write_text(UNIT.read_text().replace("/opt/safetynet/venv/bin/safetynet",
                                             sys.executable))
    proc = subprocess.run([analyze, "security", "--offline=true", "--no-pager", str(unit)],
                          capture_output=True, text=True, check=False)
    if "--offline" in proc.stderr:
        pytest.skip(f"this systemd-analyze cannot score a unit file offline: {proc.stderr}")
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout)
    assert found, proc.stdout + proc.stderr
    assert float(found.group(1)) < EXPOSURE_MAX, proc.stdout
